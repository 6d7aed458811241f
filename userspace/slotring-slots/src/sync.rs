//! The loom facade: the same code runs on `std` primitives and, under
//! `RUSTFLAGS="--cfg loom"`, on loom's model-checked ones.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Lock a mutex, treating poisoning as harmless: every critical section in
/// this crate leaves the scheduler state consistent before anything can panic (the only
/// panics are internal-invariant assertions, after which nothing is trusted).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Take one unit from a counter if it is positive (a CAS loop).
///
/// Memory ordering: the counters this is used on (`granted`,
/// `noncompeting`) are pure counts; nothing else is published through them.
/// Every increment happens inside the state mutex, and every unit taken is
/// later returned inside the state mutex. Coherence of the single atomic
/// location already forbids the return's critical section from preceding the
/// grant's (the CAS reads the grant's write, so the grant cannot happen after
/// it), so `Relaxed` suffices.
pub(crate) fn take_one(c: &AtomicU64) -> bool {
    let mut v = c.load(Ordering::Relaxed);
    while v > 0 {
        match c.compare_exchange_weak(v, v - 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => v = now,
        }
    }
    false
}
