//! [`RingWait`]: a [`WaitStrategy`] that waits on an io_uring timeout SQE
//! instead of `clock_nanosleep`, for throttle waits that do not go through
//! an engine (a caller throttling network bytes with `Throttler::throttle`).
//!
//! Each thread that waits gets its own small ring (two entries, created on
//! its first wait, dropped with the thread). A wait converts the remaining
//! time on the throttler's clock into an absolute `CLOCK_MONOTONIC`
//! deadline, pushes one `IORING_OP_TIMEOUT` (`IORING_TIMEOUT_ABS`), parks
//! the caller's CPU lease, and waits for its CQE in `io_uring_enter`. If the
//! clock (`CLOCK_MONOTONIC_RAW`, which NTP does not slew) still reads short
//! of the deadline, the rest is waited on the ring too (a nanosleep would
//! add its timer slack, 50 µs by default). Measured in `cargo xtask
//! bench throttle` (`wait_overshoot_us_p50_ring` beside the nanosleep's
//! `wait_overshoot_us_p50`).
//!
//! Where a thread cannot have a ring (io_uring disabled, seccomp, an old
//! kernel, `RLIMIT_MEMLOCK`), the wait falls back to the clock's own
//! `clock_nanosleep`, and the reason is recorded and printed once per
//! process ([`RingWait::fallback_reason`]).

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use nix::errno::Errno;
use slotring_throttle::{Clock, WaitStrategy, park_current_lease};

use crate::error::UringError;
use crate::sys::{Cqe, RealSyscalls, Ring, SetupParams, Syscalls, monotonic_now_ns};

/// Makes the syscall seam of a thread's ring.
type SysFactory = Arc<dyn Fn() -> Box<dyn Syscalls> + Send + Sync>;

/// Waits on a per-thread ring's absolute timeout SQE, lease parked; falls
/// back to `clock_nanosleep` (see the module docs).
#[derive(Clone)]
pub struct RingWait {
    sys: SysFactory,
}

impl std::fmt::Debug for RingWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingWait")
            .field("fallback_reason", &Self::fallback_reason())
            .finish()
    }
}

thread_local! {
    /// This thread's ring, or why it has none.
    static RING: RefCell<Option<Result<Ring<()>, ()>>> = const { RefCell::new(None) };
}

static FALLBACK: OnceLock<String> = OnceLock::new();

fn setup() -> SetupParams {
    SetupParams {
        entries: 2,
        cq_entries: 0,
        sqpoll_idle_ms: None,
        coop_taskrun: false,
        single_issuer: false,
        defer_taskrun: false,
    }
}

impl RingWait {
    /// A ring wait on the real kernel; fails (naming why) if this thread
    /// cannot set up a ring, so the caller can keep `clock_nanosleep` and
    /// say so.
    pub fn new() -> Result<Self, UringError> {
        Self::on(Arc::new(|| -> Box<dyn Syscalls> { Box::new(RealSyscalls) }))
    }

    /// Every ring syscall through a seam made by `sys` (feature
    /// `test-util`: fault injection). The calling thread's ring is made now.
    #[cfg(feature = "test-util")]
    pub fn with_syscalls(
        sys: Arc<dyn Fn() -> Box<dyn Syscalls> + Send + Sync>,
    ) -> Result<Self, UringError> {
        Self::on(sys)
    }

    fn on(sys: SysFactory) -> Result<Self, UringError> {
        let w = Self { sys };
        // Probe on this thread: the ring is kept for its waits.
        RING.with(|r| {
            let mut r = r.borrow_mut();
            match r.as_ref() {
                Some(Ok(_)) => Ok(()),
                _ => match Ring::new((w.sys)(), &setup()) {
                    Ok(ring) => {
                        *r = Some(Ok(ring));
                        Ok(())
                    }
                    Err(e) => Err(UringError::unavailable(e)),
                },
            }
        })?;
        Ok(w)
    }

    /// Why some thread's waits fell back to `clock_nanosleep`, if any did.
    pub fn fallback_reason() -> Option<&'static str> {
        FALLBACK.get().map(String::as_str)
    }

    /// Wait on this thread's ring until the absolute `CLOCK_MONOTONIC`
    /// deadline `target_ns`. `Err(())` if the thread has no ring.
    fn ring_wait(&self, target_ns: u64) -> Result<(), ()> {
        RING.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Some(Ring::new((self.sys)(), &setup()).map_err(|e| {
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
                }));
            }
            let Some(Ok(ring)) = cell.as_mut() else {
                return Err(());
            };
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
        let _parked = park_current_lease();
        let mut now = now;
        // A clock that still reads short of the deadline after the ring's
        // timeout (its rate differs slightly from CLOCK_MONOTONIC's, e.g.
        // RAW against NTP's slew) waits the rest on the ring as well: a
        // nanosleep would add its timer slack. Only a ring failure falls
        // back to sleeping on the clock.
        while now < deadline_ns {
            let target = monotonic_now_ns().saturating_add(deadline_ns - now);
            if self.ring_wait(target).is_err() {
                return clock.sleep_until(deadline_ns);
            }
            now = clock.now_ns();
        }
        Ok(())
    }
}
