//! What a second Ctrl-C must still undo.
//!
//! The first SIGINT/SIGTERM sets the stop flag and the run winds down in
//! at most a few hundred milliseconds (every wait of the workload looks at
//! the flag). A second one exits at once, from the signal thread, after
//! running every cleanup registered here: removing the data file this run
//! created (checked by device and inode) and the pins of the BPF instance.
//! Whoever owns a resource registers its cleanup while it owns it and drops
//! the [`Registered`] token before releasing the resource the normal way,
//! so a cleanup never acts on something already handed back. Each cleanup
//! says what it did, and the abort message is made of those words only: a
//! command that owns nothing (`verify`, `stats`) or a kept data file is
//! never said to have been removed.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

type Cleanup = Box<dyn FnMut() -> Option<String> + Send>;

static CLEANUPS: Mutex<Vec<(u64, Cleanup)>> = Mutex::new(Vec::new());
/// Token ids; only uniqueness matters (`Relaxed`).
static NEXT: AtomicU64 = AtomicU64::new(0);

fn cleanups() -> std::sync::MutexGuard<'static, Vec<(u64, Cleanup)>> {
    CLEANUPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A registered cleanup; dropping it unregisters the cleanup (without
/// running it).
#[derive(Debug)]
#[must_use = "the cleanup is unregistered when the token drops"]
pub struct Registered(u64);

impl Drop for Registered {
    fn drop(&mut self) {
        cleanups().retain(|(id, _)| *id != self.0);
    }
}

/// Register `f` to run if the process aborts (second Ctrl-C) while the
/// token lives; `f` says what it did (`None`: nothing worth saying).
pub fn register(f: impl FnMut() -> Option<String> + Send + 'static) -> Registered {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    cleanups().push((id, Box::new(f)));
    Registered(id)
}

/// Run every registered cleanup, newest first, and unregister them: the
/// abort path, just before the process exits. What they did, in that
/// order.
pub fn run_all() -> Vec<String> {
    let mut all = std::mem::take(&mut *cleanups());
    all.iter_mut().rev().filter_map(|(_, f)| f()).collect()
}

/// The abort line for a second `sig`: "aborted", and what the cleanups
/// said they did.
pub fn message(sig: impl std::fmt::Display, done: &[String]) -> String {
    if done.is_empty() {
        format!("slotring: {sig} again, aborted")
    } else {
        format!("slotring: {sig} again, aborted ({})", done.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU32;

    use super::*;

    #[test]
    fn only_live_registrations_run_newest_first() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let ran = Arc::new(AtomicU32::new(0));
        let (o1, o2, r) = (order.clone(), order.clone(), ran.clone());
        let a = register(move || {
            o1.lock().unwrap().push("a");
            Some("did a".into())
        });
        let b = register(move || {
            o2.lock().unwrap().push("b");
            None
        });
        let gone = register(move || {
            r.fetch_add(1, Ordering::Relaxed);
            Some("gone".into())
        });
        drop(gone);
        assert_eq!(run_all(), ["did a"]);
        assert_eq!(*order.lock().unwrap(), ["b", "a"]);
        assert_eq!(ran.load(Ordering::Relaxed), 0);
        // Run once: the list is empty afterwards.
        assert!(run_all().is_empty());
        assert_eq!(order.lock().unwrap().len(), 2);
        drop((a, b));
    }

    #[test]
    fn the_message_claims_only_what_was_done() {
        assert_eq!(message("SIGINT", &[]), "slotring: SIGINT again, aborted");
        assert_eq!(
            message("SIGTERM", &["removed x".into(), "kept y".into()]),
            "slotring: SIGTERM again, aborted (removed x; kept y)"
        );
    }
}
