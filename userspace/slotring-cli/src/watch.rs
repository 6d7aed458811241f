//! How long `slotring verify` watches its target: the window ends at its
//! length, on the first SIGINT/SIGTERM, or as soon as the target exits,
//! whichever comes first, looked at every [`WATCH_SLICE`].

use std::time::{Duration, Instant};

/// The longest the window goes without looking at the stop flag and the
/// target.
pub const WATCH_SLICE: Duration = Duration::from_millis(50);

/// The longest `--window` (as `run --duration`).
pub const MAX_WINDOW: Duration = Duration::from_secs(3600);

/// Why the window ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It ran its whole length.
    Full,
    /// The first signal: the verdict covers the time watched so far.
    Stopped(Duration),
    /// The target exited (or its pid now names another process) after this
    /// long: nothing to judge.
    TargetGone(Duration),
}

/// Wait out `window`, ending early when `stopping()` or when
/// `target_alive()` says no; both are looked at before every slice.
pub fn watch(
    window: Duration,
    stopping: &dyn Fn() -> bool,
    target_alive: &dyn Fn() -> bool,
) -> Ended {
    let start = Instant::now();
    loop {
        let so_far = start.elapsed();
        if stopping() {
            return Ended::Stopped(so_far);
        }
        if !target_alive() {
            return Ended::TargetGone(so_far);
        }
        if so_far >= window {
            return Ended::Full;
        }
        std::thread::sleep((window - so_far).min(WATCH_SLICE));
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn the_window_ends_at_its_length_on_stop_and_when_the_target_goes() {
        assert_eq!(
            watch(Duration::from_millis(20), &|| false, &|| true),
            Ended::Full
        );
        // An hour-long window, ended by the third look at the flag (the
        // test would take an hour if the flag were not looked at).
        let looks = Cell::new(0);
        let stopping = || {
            looks.set(looks.get() + 1);
            looks.get() >= 3
        };
        let ended = watch(MAX_WINDOW, &stopping, &|| true);
        assert!(
            matches!(ended, Ended::Stopped(d) if d < MAX_WINDOW),
            "{ended:?}"
        );
        let looks = Cell::new(0);
        let alive = || {
            looks.set(looks.get() + 1);
            looks.get() < 2
        };
        let ended = watch(MAX_WINDOW, &|| false, &alive);
        assert!(
            matches!(ended, Ended::TargetGone(d) if d < MAX_WINDOW),
            "{ended:?}"
        );
        // Stopping wins over a target that is gone at the same look.
        assert!(matches!(
            watch(MAX_WINDOW, &|| true, &|| false),
            Ended::Stopped(_)
        ));
    }
}
