//! [`RingWait`]: a [`WaitStrategy`] that waits on an io_uring ring instead
//! of `clock_nanosleep`, for throttle waits that do not go through an
//! engine (a caller throttling network bytes with `Throttler::throttle`).
//!
//! Each thread that waits gets its own small ring (two entries, created on
//! its first wait, dropped with the thread). The ring is made (with the
//! thread's first submission, see `LendingRing::new`) before the caller's lease is
//! parked: a parked wait holds only the wait. A wait converts the remaining
//! time on the throttler's clock into an absolute `CLOCK_MONOTONIC`
//! deadline, parks the caller's CPU lease, and sleeps in `io_uring_enter`
//! until it: by default on an absolute `IORING_OP_TIMEOUT` SQE
//! ([`RingWaitConfig::enter_timeout`] `false`), or with no SQE, on the
//! enter's own absolute `EXT_ARG` timeout. Neither hrtimer has timer slack
//! (`io_uring/timeout.c` starts it with `hrtimer_start`, `io_uring/wait.c`
//! with `hrtimer_set_expires_range_ns(.., 0)`), which is what a ring wait
//! saves over a nanosleep's 50 µs default slack; the rest of the overshoot
//! is the machine's wake-up latency, common to both. Every configuration
//! is measured side by side by `cargo xtask bench wait`. If the clock (`CLOCK_MONOTONIC_RAW`, which NTP does
//! not slew) still reads short of the deadline after the ring's wait, the
//! rest is waited on the ring too (a nanosleep would add its slack).
//!
//! Where a thread cannot have a ring (io_uring disabled, seccomp, an old
//! kernel, `RLIMIT_MEMLOCK`), the wait falls back to the clock's own
//! `clock_nanosleep`, and the reason is recorded and printed once per
//! process ([`RingWait::fallback_reason`]).

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nix::errno::Errno;
use slotring_throttle::{Clock, WaitStrategy, park_current_lease};

use crate::error::UringError;
use crate::sys::{
    Cqe, LendingRing, RealSyscalls, SetupParams, SysFactory, Syscalls, monotonic_now_ns,
};

/// How a [`RingWait`] waits. The default ([`RingWaitConfig::DEFAULT`]) is
/// the configuration that overshoots least in `cargo xtask bench wait`: the
/// enter's own timeout, woken 20 µs early
/// ([`RingWaitConfig::advance`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingWaitConfig {
    /// Sleep on `io_uring_enter`'s absolute `EXT_ARG` timeout (no SQE; the
    /// hrtimer wakes the task directly) instead of an `IORING_OP_TIMEOUT`
    /// SQE (whose expiry posts its CQE through task work). Kernel 6.12+
    /// (`IORING_ENTER_ABS_TIMER`); where the kernel refuses it, the
    /// thread's waits use the SQE.
    pub enter_timeout: bool,
    /// Set the thread's ring up with `IORING_SETUP_COOP_TASKRUN`.
    pub coop_taskrun: bool,
    /// Set the thread's ring up with `IORING_SETUP_SINGLE_ISSUER |
    /// IORING_SETUP_DEFER_TASKRUN` (the ring is only ever the thread's own).
    pub defer_taskrun: bool,
    /// Wake this long before the deadline and wait the rest on the clock,
    /// spinning, with the lease unparked (zero: no spin). The spin lasts
    /// only what the wake-up was faster than this: its CPU cost is
    /// reported by `cargo xtask bench wait`.
    pub advance: Duration,
}

/// How much earlier than the deadline the default configuration wakes:
/// less than the median wake-up latency without timer slack that
/// `cargo xtask bench wait` reports, so the spin after it is usually
/// nothing and at most this long.
pub const DEFAULT_ADVANCE: Duration = Duration::from_micros(20);

impl RingWaitConfig {
    /// The default: [`RingWaitConfig::enter_timeout`], woken 20 µs early
    /// ([`RingWaitConfig::advance`]), on a plain ring.
    pub const DEFAULT: Self = Self {
        enter_timeout: true,
        coop_taskrun: false,
        defer_taskrun: false,
        advance: DEFAULT_ADVANCE,
    };

    /// The `IORING_OP_TIMEOUT` SQE on a plain ring, no advance (what the
    /// default is measured against in `cargo xtask bench wait`).
    pub const TIMEOUT_SQE: Self = Self {
        enter_timeout: false,
        coop_taskrun: false,
        defer_taskrun: false,
        advance: Duration::ZERO,
    };

    fn setup(&self) -> SetupParams {
        SetupParams {
            entries: 2,
            cq_entries: 0,
            sqpoll_idle_ms: None,
            coop_taskrun: self.coop_taskrun,
            single_issuer: self.defer_taskrun,
            defer_taskrun: self.defer_taskrun,
        }
    }
}

/// Waits on a per-thread ring, lease parked; falls back to
/// `clock_nanosleep` (see the module docs).
#[derive(Clone)]
pub struct RingWait {
    sys: SysFactory,
    cfg: RingWaitConfig,
}

impl std::fmt::Debug for RingWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingWait")
            .field("cfg", &self.cfg)
            .field("fallback_reason", &Self::fallback_reason())
            .finish()
    }
}

/// A thread's ring and the set-up it was made with.
struct ThreadRing {
    setup: SetupParams,
    ring: Result<LendingRing<()>, ()>,
}

thread_local! {
    /// This thread's ring, or why it has none.
    static RING: RefCell<Option<ThreadRing>> = const { RefCell::new(None) };
    /// The kernel refused an absolute enter timeout on this thread: its
    /// waits use the timeout SQE.
    static NO_ENTER_TIMEOUT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

static FALLBACK: OnceLock<String> = OnceLock::new();

impl Default for RingWaitConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl RingWait {
    /// A ring wait on the real kernel, default configuration; fails (naming
    /// why) if this thread cannot set up a ring, so the caller can keep
    /// `clock_nanosleep` and say so.
    pub fn new() -> Result<Self, UringError> {
        Self::with_config(RingWaitConfig::default())
    }

    /// A ring wait configured by `cfg` (the bench measures each choice).
    pub fn with_config(cfg: RingWaitConfig) -> Result<Self, UringError> {
        Self::on(
            Arc::new(|| -> Box<dyn Syscalls> { Box::new(RealSyscalls) }),
            cfg,
        )
    }

    /// Configured by `cfg`, every ring syscall through a seam made by `sys`
    /// (feature `test-util`: fault injection). The calling thread's ring is
    /// made now.
    #[cfg(feature = "test-util")]
    pub fn with_syscalls(
        sys: Arc<dyn Fn() -> Box<dyn Syscalls> + Send + Sync>,
        cfg: RingWaitConfig,
    ) -> Result<Self, UringError> {
        Self::on(sys, cfg)
    }

    fn on(sys: SysFactory, cfg: RingWaitConfig) -> Result<Self, UringError> {
        let w = Self { sys, cfg };
        // Probe on this thread: the ring is kept for its waits.
        w.prepare(true).map_err(UringError::unavailable)?;
        Ok(w)
    }

    /// Why some thread's waits fell back to `clock_nanosleep`, if any did.
    pub fn fallback_reason() -> Option<&'static str> {
        FALLBACK.get().map(String::as_str)
    }

    /// Make this thread's ring if it has none (or one of another set-up);
    /// `LendingRing::new` also makes the thread's first submission (a NOP). Called
    /// with the caller's lease running, so that a parked wait holds only
    /// the wait (both are one-time costs of their own). `Err` with why when
    /// the thread cannot have a ring (remembered: a wait does not try again,
    /// a new `RingWait` (`retry`) does).
    fn prepare(&self, retry: bool) -> Result<(), std::io::Error> {
        let setup = self.cfg.setup();
        RING.with(|cell| {
            let mut cell = cell.borrow_mut();
            match cell.as_ref() {
                Some(t) if t.setup == setup && (t.ring.is_ok() || !retry) => {
                    return match &t.ring {
                        Ok(_) => Ok(()),
                        Err(()) => Err(std::io::Error::other("no ring on this thread")),
                    };
                }
                _ => {}
            }
            let ring = LendingRing::new((self.sys)(), &setup);
            let failed = ring
                .as_ref()
                .err()
                .map(|e| std::io::Error::new(e.kind(), e.to_string()));
            *cell = Some(ThreadRing {
                setup,
                ring: ring.map_err(drop),
            });
            failed.map_or(Ok(()), Err)
        })
    }

    /// Record (and say once) why this thread's waits fall back.
    fn fall_back(e: std::io::Error) {
        let why = UringError::unavailable(e);
        let msg = match std::error::Error::source(&why) {
            Some(os) => format!("{why}: {os}"),
            None => why.to_string(),
        };
        if FALLBACK.set(msg).is_ok() {
            eprintln!(
                "slotring-uring: throttle waits fall back to clock_nanosleep: {}",
                FALLBACK.get().map_or("", String::as_str)
            );
        }
    }

    /// Wait on this thread's ring (made by [`RingWait::prepare`]) until the
    /// absolute `CLOCK_MONOTONIC` deadline `target_ns`. `Err(())` if the
    /// thread has no ring.
    fn ring_wait(&self, target_ns: u64) -> Result<(), ()> {
        let setup = self.cfg.setup();
        RING.with(|cell| {
            let mut cell = cell.borrow_mut();
            let Some(ThreadRing { ring: Ok(ring), .. }) =
                cell.as_mut().filter(|t| t.setup == setup)
            else {
                return Err(());
            };
            if self.cfg.enter_timeout && !NO_ENTER_TIMEOUT.get() {
                loop {
                    match ring.wait_until(target_ns) {
                        Ok(()) => return Ok(()),
                        Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                        // Before 6.12: no IORING_ENTER_ABS_TIMER.
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                            NO_ENTER_TIMEOUT.set(true);
                            break;
                        }
                        Err(_) => return Err(()),
                    }
                }
            }
            let id = ring.alloc(Vec::new(), ());
            if ring.push_post_wait(id, target_ns).is_err() {
                let _ = ring.take(id);
                return Err(());
            }
            let mut cqes: Vec<Cqe> = Vec::with_capacity(2);
            while ring.outstanding(id) > 0 {
                match ring.enter(1) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                        ) => {}
                    // The timeout stays owned by the ring (its drop waits for
                    // the CQE); the caller sleeps the rest on the clock.
                    Err(_) => return Err(()),
                }
                cqes.clear();
                ring.reap(&mut cqes);
            }
            let _ = ring.take(id);
            Ok(())
        })
    }
}

impl WaitStrategy for RingWait {
    fn wait_until(&self, clock: &dyn Clock, deadline_ns: u64) -> Result<(), Errno> {
        let now = clock.now_ns();
        if deadline_ns <= now {
            return Ok(());
        }
        let advance = u64::try_from(self.cfg.advance.as_nanos()).unwrap_or(u64::MAX);
        // The ring first, running: see `prepare`.
        let ready = self.prepare(false).map_err(Self::fall_back).is_ok();
        {
            let _parked = park_current_lease();
            if !ready {
                return clock.sleep_until(deadline_ns);
            }
            let mut now = now;
            // A clock that still reads short of the deadline after the
            // ring's wait (its rate differs slightly from CLOCK_MONOTONIC's,
            // e.g. RAW against NTP's slew) waits the rest on the ring as
            // well: a nanosleep would add its timer slack. Only a ring
            // failure falls back to sleeping on the clock.
            while now.saturating_add(advance) < deadline_ns {
                let target = monotonic_now_ns().saturating_add(deadline_ns - now - advance);
                if self.ring_wait(target).is_err() {
                    return clock.sleep_until(deadline_ns);
                }
                now = clock.now_ns();
            }
        }
        // What is left of the advance, running (the lease is back).
        while clock.now_ns() < deadline_ns {
            std::hint::spin_loop();
        }
        Ok(())
    }
}
