//! The seam between computing a wait (pure) and performing it.
//!
//! [`BlockingWait`] is the default: park the caller's CPU lease, then sleep to
//! an absolute deadline on the throttler's clock. The io_uring engine does not
//! wait here at all: it calls [`crate::Throttle::reserve`] and turns the
//! returned delay into a timeout SQE; an async runtime can do the same with
//! its timer.
//!
//! A process may install another default ([`install_default_wait`], e.g. the
//! io_uring crate's ring-timeout wait, which the facade installs where
//! io_uring is available); throttlers built afterwards on the production
//! clock use it. This crate only holds the slot: it knows nothing of what
//! is installed.

use std::fmt::Debug;
use std::sync::{Arc, OnceLock};

use nix::errno::Errno;

use crate::clock::Clock;
use crate::park::park_current_lease;

/// Performs a wait that the arithmetic has already decided on.
pub trait WaitStrategy: Send + Sync + Debug {
    /// Return once `clock.now_ns() >= deadline_ns`.
    fn wait_until(&self, clock: &dyn Clock, deadline_ns: u64) -> Result<(), Errno>;
}

/// Park the CPU lease, then sleep on the clock (absolute deadline, EINTR-proof).
#[derive(Debug, Default, Clone, Copy)]
pub struct BlockingWait;

impl WaitStrategy for BlockingWait {
    fn wait_until(&self, clock: &dyn Clock, deadline_ns: u64) -> Result<(), Errno> {
        let _parked = park_current_lease();
        clock.sleep_until(deadline_ns)
    }
}

static DEFAULT_WAIT: OnceLock<Arc<dyn WaitStrategy>> = OnceLock::new();

/// Install the process-wide default wait for throttlers built from now on
/// without [`crate::ThrottlerBuilder::wait_strategy`] and without an injected
/// clock. Returns `false` (and changes nothing) if one was already installed.
pub fn install_default_wait(wait: Arc<dyn WaitStrategy>) -> bool {
    DEFAULT_WAIT.set(wait).is_ok()
}

/// The installed default wait, or [`BlockingWait`].
pub fn default_wait() -> Arc<dyn WaitStrategy> {
    DEFAULT_WAIT
        .get()
        .cloned()
        .unwrap_or_else(|| Arc::new(BlockingWait))
}

/// A waker that unparks the calling thread: a blocking caller queues where
/// an async one does (a fair gate, a workload's leaf) with this as its
/// waker, and parks until it is woken.
pub(crate) fn current_thread_waker() -> std::task::Waker {
    std::task::Waker::from(std::sync::Arc::new(ThreadWaker(std::thread::current())))
}

#[derive(Debug)]
struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.unpark();
    }
}
