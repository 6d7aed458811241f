//! Time, injected.
//!
//! A throttler is only correct if time moves forward. [`MonotonicClock`]
//! reads, in order of preference:
//!
//! 1. the CPU's time-stamp counter, scaled to nanoseconds ([`quanta`], the
//!    clock governor uses), when the kernel itself keeps time with it
//!    (`current_clocksource` is `tsc`): the kernel switches away from the
//!    TSC at boot or at run time when it finds it unstable or unsynchronised
//!    between CPUs, so "the kernel uses it" is the test that it is monotonic
//!    across CPUs. A reading costs ~11 ns against ~30 ns for
//!    `clock_gettime(CLOCK_MONOTONIC_RAW)` through the vDSO on this class of
//!    machine (`cargo xtask bench throttle`, `clock_*` keys), and with two
//!    threads charging one bucket the slower read roughly doubles the cost
//!    of a charge (the bucket's line is idle for longer between transfers);
//! 2. `CLOCK_MONOTONIC_RAW`, which the kernel never steps (NTP neither steps
//!    nor slews it);
//! 3. `CLOCK_MONOTONIC` clamped to the previous reading, as ClickHouse's
//!    `clock_gettime_ns_adjusted` does.
//!
//! The scaled TSC runs at the rate its calibration against
//! `CLOCK_MONOTONIC` measured (quanta calibrates until its mean error is
//! under 10 ns, at most 200 ms, once per process); waits translate a
//! remaining duration, never an absolute reading, to the kernel's clocks, so
//! the two timelines never need to agree to the nanosecond.
//! [`ManualClock`] (feature `test-util`) makes tests exact and instant:
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

/// Where a [`MonotonicClock`] reads its time (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSource {
    /// The time-stamp counter, scaled to nanoseconds (the kernel's own
    /// clocksource is `tsc`).
    Tsc,
    /// `clock_gettime(CLOCK_MONOTONIC_RAW)`.
    MonotonicRaw,
    /// `clock_gettime(CLOCK_MONOTONIC)`, clamped to the largest reading.
    ClampedMonotonic,
}

/// The production clock: the scaled TSC where the kernel keeps time with it,
/// else `CLOCK_MONOTONIC_RAW`, else clamped `CLOCK_MONOTONIC`.
#[derive(Debug)]
pub struct MonotonicClock {
    source: Source,
    clamp: ClampState,
}

/// The reading behind a [`MonotonicClock`].
#[derive(Debug)]
enum Source {
    /// `base_ns + scaled(raw − base_raw)`: nanoseconds on a timeline that
    /// starts at the `CLOCK_MONOTONIC_RAW` reading taken with `base_raw`.
    Tsc {
        clock: quanta::Clock,
        base_raw: u64,
        base_ns: u64,
    },
    Raw,
    Clamped,
}

/// Whether the kernel keeps time with the TSC (so it found it invariant and
/// synchronised between CPUs), from sysfs; `false` on any doubt.
fn kernel_uses_tsc() -> bool {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .is_ok_and(|s| s.trim() == "tsc")
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl MonotonicClock {
    /// Choose the source once (see the module docs): the scaled TSC where
    /// the kernel's clocksource is `tsc`, else `CLOCK_MONOTONIC_RAW` if it
    /// answers, else clamped `CLOCK_MONOTONIC`.
    pub fn new() -> Self {
        let raw = clock_gettime(ClockId::CLOCK_MONOTONIC_RAW).ok();
        let source = match raw {
            Some(_) if kernel_uses_tsc() => {
                let clock = quanta::Clock::new();
                let base_raw = clock.raw();
                let base_ns = clock_gettime(ClockId::CLOCK_MONOTONIC_RAW).map_or(0, timespec_ns);
                Source::Tsc {
                    clock,
                    base_raw,
                    base_ns,
                }
            }
            Some(_) => Source::Raw,
            None => Source::Clamped,
        };
        Self {
            source,
            clamp: ClampState::new(),
        }
    }

    /// `CLOCK_MONOTONIC_RAW` (or its clamped fallback), never the TSC: for
    /// comparing the sources side by side.
    pub fn without_tsc() -> Self {
        let source = if clock_gettime(ClockId::CLOCK_MONOTONIC_RAW).is_ok() {
            Source::Raw
        } else {
            Source::Clamped
        };
        Self {
            source,
            clamp: ClampState::new(),
        }
    }

    /// Where this clock reads its time.
    pub fn source(&self) -> ClockSource {
        match self.source {
            Source::Tsc { .. } => ClockSource::Tsc,
            Source::Raw => ClockSource::MonotonicRaw,
            Source::Clamped => ClockSource::ClampedMonotonic,
        }
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
        // RAW by the kernel's guarantee; the TSC because the kernel keeps
        // time with it only while it is synchronised (a reading taken on
        // another CPU a few ns "earlier", as an unserialised read allows,
        // is what any reading taken before a CAS loop already is, and the
        // bucket treats it as no time passed); the fallback by its clamp.
        true
    }

    fn now_ns(&self) -> u64 {
        match &self.source {
            Source::Tsc {
                clock,
                base_raw,
                base_ns,
            } => base_ns.saturating_add(clock.delta_as_nanos(*base_raw, clock.raw())),
            // The kernel guarantees CLOCK_MONOTONIC_RAW never goes
            // backwards; the probe in `new` proved the call works, and it
            // has no other failure mode for a valid clock id.
            Source::Raw => clock_gettime(ClockId::CLOCK_MONOTONIC_RAW).map_or(0, timespec_ns),
            Source::Clamped => {
                let now = clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, timespec_ns);
                self.clamp.clamp(now)
            }
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
        for c in [MonotonicClock::new(), MonotonicClock::without_tsc()] {
            let mut prev = c.now_ns();
            for _ in 0..10_000 {
                let now = c.now_ns();
                assert!(now >= prev, "{:?} stepped back", c.source());
                prev = now;
            }
        }
        assert_eq!(
            MonotonicClock::without_tsc().source(),
            ClockSource::MonotonicRaw,
            "Linux has CLOCK_MONOTONIC_RAW"
        );
        assert_eq!(
            MonotonicClock::new().source() == ClockSource::Tsc,
            kernel_uses_tsc(),
            "the TSC is used exactly where the kernel keeps time with it"
        );
    }

    #[test]
    fn the_tsc_keeps_the_kernels_time() {
        // Both sources measure the same 50 ms sleep to within 0.1 %
        // (50 µs): a scale wrong by more than that would show here.
        // Each TSC reading is bracketed by two RAW ones less than 10 µs
        // apart (a preempted bracket is retried), so a pair's skew is
        // under 10 µs whatever the machine's load.
        let tsc = MonotonicClock::new();
        let raw = MonotonicClock::without_tsc();
        let pair = || loop {
            let before = raw.now_ns();
            let t = tsc.now_ns();
            let after = raw.now_ns();
            if after - before < 10_000 {
                return (t as i64, (before / 2 + after / 2) as i64);
            }
        };
        let (t0, r0) = pair();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (t1, r1) = pair();
        let (dt, dr) = (t1 - t0, r1 - r0);
        assert!(
            (dt - dr).abs() < 50_000 + 2 * 10_000,
            "{:?} measured {dt} ns where CLOCK_MONOTONIC_RAW measured {dr} ns",
            tsc.source()
        );
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
