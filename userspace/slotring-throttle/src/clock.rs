//! Time, injected.
//!
//! A throttler is only correct if time moves forward. [`MonotonicClock`] reads
//! `CLOCK_MONOTONIC_RAW`, which the kernel never steps (NTP neither steps nor
//! slews it); where that clock is missing it falls back to `CLOCK_MONOTONIC`
//! clamped to the previous reading, as ClickHouse's `clock_gettime_ns_adjusted`
//! does. [`ManualClock`] (feature `test-util`) makes tests exact and instant:
//! sleeping on it advances it.

use std::fmt::Debug;

use nix::errno::Errno;
use nix::sys::time::TimeSpec;
use nix::time::{ClockId, ClockNanosleepFlags, clock_gettime, clock_nanosleep};

use crate::sync::{AtomicU64, Ordering};

/// A source of monotonic nanoseconds, and the way to wait on it.
///
/// Contract: `now_ns` never returns less than a value it returned before (to
/// any thread). The throttler stays sound if a clock breaks this (a step back
/// is treated as "no time has passed", never as a negative refill), but its
/// accounting is only exact for clocks that keep it.
pub trait Clock: Send + Sync + Debug {
    /// Nanoseconds on this clock's timeline.
    fn now_ns(&self) -> u64;

    /// Whether the source itself guarantees the contract (like
    /// `CLOCK_MONOTONIC_RAW`). When `false`, a throttler clamps every reading
    /// to the largest one it has seen, as ClickHouse's
    /// `clock_gettime_ns_adjusted` does.
    fn never_steps_back(&self) -> bool {
        false
    }

    /// Block the calling thread until `now_ns() >= deadline_ns`.
    ///
    /// The default translates the remaining time into an absolute
    /// `CLOCK_MONOTONIC` deadline and loops on
    /// `clock_nanosleep(TIMER_ABSTIME)`, so a signal (`EINTR`) never shortens
    /// the wait: the loop resumes with the same deadline.
    fn sleep_until(&self, deadline_ns: u64) -> Result<(), Errno> {
        // One absolute sleep almost always suffices; the loop covers a clock
        // whose rate differs from CLOCK_MONOTONIC's (RAW is not slewed by NTP).
        loop {
            let now = self.now_ns();
            if deadline_ns <= now {
                return Ok(());
            }
            sleep_abs_monotonic(deadline_ns - now)?;
        }
    }
}

/// Sleep `remaining_ns` from now against an absolute `CLOCK_MONOTONIC` deadline.
pub fn sleep_abs_monotonic(remaining_ns: u64) -> Result<(), Errno> {
    let start = clock_gettime(ClockId::CLOCK_MONOTONIC)?;
    let deadline = timespec_ns(start).saturating_add(remaining_ns);
    let ts = TimeSpec::from_duration(std::time::Duration::from_nanos(deadline));
    loop {
        match clock_nanosleep(
            ClockId::CLOCK_MONOTONIC,
            ClockNanosleepFlags::TIMER_ABSTIME,
            &ts,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A `TimeSpec` as nanoseconds (saturating; monotonic clocks are never negative).
pub(crate) fn timespec_ns(ts: TimeSpec) -> u64 {
    let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec()).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// The production clock: `CLOCK_MONOTONIC_RAW`, or clamped `CLOCK_MONOTONIC`.
#[derive(Debug)]
pub struct MonotonicClock {
    raw: bool,
    clamp: ClampState,
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl MonotonicClock {
    /// Probe for `CLOCK_MONOTONIC_RAW` once; fall back to clamped `CLOCK_MONOTONIC`.
    pub fn new() -> Self {
        Self {
            raw: clock_gettime(ClockId::CLOCK_MONOTONIC_RAW).is_ok(),
            clamp: ClampState::new(),
        }
    }

    /// Whether this clock reads `CLOCK_MONOTONIC_RAW` (no clamp needed).
    pub fn is_raw(&self) -> bool {
        self.raw
    }

    /// The process-wide instance used by throttlers built without a clock.
    pub fn shared() -> std::sync::Arc<dyn Clock> {
        static SHARED: std::sync::OnceLock<std::sync::Arc<MonotonicClock>> =
            std::sync::OnceLock::new();
        SHARED
            .get_or_init(|| std::sync::Arc::new(MonotonicClock::new()))
            .clone()
    }
}

impl Clock for MonotonicClock {
    fn never_steps_back(&self) -> bool {
        // RAW by the kernel's guarantee; the fallback by its own clamp.
        true
    }

    fn now_ns(&self) -> u64 {
        if self.raw {
            // The kernel guarantees CLOCK_MONOTONIC_RAW never goes backwards;
            // the probe in `new` proved the call works, and it has no other
            // failure mode for a valid clock id.
            clock_gettime(ClockId::CLOCK_MONOTONIC_RAW).map_or(0, timespec_ns)
        } else {
            let now = clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, timespec_ns);
            self.clamp.clamp(now)
        }
    }
}

/// "Never step back": the largest reading so far wins.
///
/// Memory ordering: the value is a plain maximum with no data attached, so
/// `Relaxed` suffices; `fetch_max` makes the maximum exact under races.
#[derive(Debug)]
pub struct ClampState {
    last: AtomicU64,
}

impl Default for ClampState {
    fn default() -> Self {
        Self::new()
    }
}

impl ClampState {
    /// A clamp that has seen nothing yet.
    pub fn new() -> Self {
        Self {
            last: AtomicU64::new(0),
        }
    }

    /// `max(reading, every earlier reading)`.
    pub fn clamp(&self, reading: u64) -> u64 {
        let prev = self.last.fetch_max(reading, Ordering::Relaxed);
        prev.max(reading)
    }
}

/// A clock that only moves when told to; sleeping on it advances it.
///
/// `set_ns` may move it backwards on purpose, to test how callers survive a
/// stepping clock; it does not claim [`Clock::never_steps_back`], so
/// throttlers clamp its readings.
#[cfg(any(feature = "test-util", test, loom))]
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

#[cfg(any(feature = "test-util", test, loom))]
impl ManualClock {
    /// A clock reading `start_ns`.
    pub fn new(start_ns: u64) -> Self {
        Self {
            now: AtomicU64::new(start_ns),
        }
    }

    /// Move forward by `ns` (saturating at `u64::MAX`, like every reading).
    pub fn advance(&self, ns: u64) {
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_add(ns))
            });
    }

    /// Set the reading (may step back).
    pub fn set_ns(&self, ns: u64) {
        self.now.store(ns, Ordering::SeqCst);
    }
}

#[cfg(any(feature = "test-util", test, loom))]
impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn sleep_until(&self, deadline_ns: u64) -> Result<(), Errno> {
        self.now.fetch_max(deadline_ns, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamp_never_steps_back() {
        let c = ClampState::new();
        assert_eq!(c.clamp(100), 100);
        assert_eq!(c.clamp(90), 100, "a step back returns the previous reading");
        assert_eq!(c.clamp(130), 130);
    }

    #[test]
    fn monotonic_clock_is_monotonic() {
        let c = MonotonicClock::new();
        assert!(c.is_raw(), "Linux has CLOCK_MONOTONIC_RAW");
        let mut prev = c.now_ns();
        for _ in 0..10_000 {
            let now = c.now_ns();
            assert!(now >= prev);
            prev = now;
        }
    }

    #[test]
    fn manual_clock_sleep_advances() {
        let c = ManualClock::new(10);
        c.sleep_until(50).unwrap();
        assert_eq!(c.now_ns(), 50);
        c.sleep_until(20).unwrap();
        assert_eq!(
            c.now_ns(),
            50,
            "sleeping to a past deadline does not move it"
        );
    }

    #[test]
    fn real_sleep_reaches_deadline() {
        let c = MonotonicClock::new();
        let deadline = c.now_ns() + 2_000_000;
        c.sleep_until(deadline).unwrap();
        assert!(
            c.now_ns() >= deadline,
            "an absolute sleep never returns early"
        );
    }
}
