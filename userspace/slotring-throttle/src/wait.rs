//! The seam between computing a wait (pure) and performing it.
//!
//! [`BlockingWait`] is the default: park the caller's CPU lease, then sleep to
//! an absolute deadline on the throttler's clock. The io_uring engine does not
//! wait here at all: it calls [`crate::Throttle::reserve`] and turns the
//! returned delay into a timeout SQE; an async runtime can do the same with
//! its timer.

use std::fmt::Debug;

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
