//! The in-flight constraint (ClickHouse's `SemaphoreConstraint`,
//! `inflight_limit`): requests and bytes submitted through a workload and
//! not yet complete.
//!
//! # Model
//!
//! A request takes its place on every limited node of its path when it is
//! dispatched and gives it back when it completes (its [`super::Permit`]
//! drops), whatever happened to the IO. A node admits a request while
//!
//! * fewer than `max_io_requests` are in flight: never more, under any
//!   interleaving (a compare-and-swap against the limit);
//! * its bytes fit: `in_flight + cost <= max_bytes_inflight`, or no bytes
//!   are in flight (a request larger than the limit runs with no other bytes
//!   beside it rather than never; empty requests may). ClickHouse admits
//!   while `in_flight < max`, which lets the bytes exceed the limit by any
//!   request at any time; here only that one request can.
//!
//! A node that refuses is *blocked* until a completion (or a change of what
//! its subtree offers next): it leaves its parent's set of active children,
//! and its siblings are served meanwhile (work-conserving otherwise).
//!
//! # Memory ordering
//!
//! The counts are `SeqCst`, paired with the node's `queued` count (also
//! `SeqCst`): a request that queues increments `queued`, then reads the
//! counts; a completion decrements a count, then reads `queued`. In any
//! interleaving one of them sees the other (Dekker), so either the queuing
//! request finds the room, or the completion finds the queue and takes the
//! scheduler's lock to hand the room on: no wake-up is lost.

use crate::sync::{AtomicU64, Ordering};

/// "No limit".
const NONE: u64 = u64::MAX;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct InFlight {
    reqs: AtomicU64,
    bytes: AtomicU64,
    max_reqs: AtomicU64,
    max_bytes: AtomicU64,
}

impl InFlight {
    pub(crate) fn new(max_reqs: Option<u64>, max_bytes: Option<u64>) -> Self {
        Self {
            reqs: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            max_reqs: AtomicU64::new(max_reqs.unwrap_or(NONE)),
            max_bytes: AtomicU64::new(max_bytes.unwrap_or(NONE)),
        }
    }

    /// Whether either limit is set.
    #[inline]
    pub(crate) fn limited(&self) -> bool {
        self.max_reqs.load(Ordering::Relaxed) != NONE
            || self.max_bytes.load(Ordering::Relaxed) != NONE
    }

    /// Change the limits; the counts stay (requests in flight keep their
    /// places and give them back at completion).
    pub(crate) fn set_limits(&self, max_reqs: Option<u64>, max_bytes: Option<u64>) {
        self.max_reqs
            .store(max_reqs.unwrap_or(NONE), Ordering::SeqCst);
        self.max_bytes
            .store(max_bytes.unwrap_or(NONE), Ordering::SeqCst);
    }

    /// Take a place for a request of `cost` bytes, if it fits.
    pub(crate) fn try_acquire(&self, cost: u64) -> bool {
        let max_r = self.max_reqs.load(Ordering::SeqCst);
        let max_b = self.max_bytes.load(Ordering::SeqCst);
        if self
            .reqs
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| {
                (r < max_r).then_some(r + 1)
            })
            .is_err()
        {
            return false;
        }
        if self
            .bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                (b == 0 || b.saturating_add(cost) <= max_b).then_some(b.saturating_add(cost))
            })
            .is_err()
        {
            self.reqs.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Give a place back.
    pub(crate) fn release(&self, cost: u64) {
        self.reqs.fetch_sub(1, Ordering::SeqCst);
        self.bytes.fetch_sub(cost, Ordering::SeqCst);
    }

    /// Whether some request could fit now (a necessary condition: the
    /// exact test is [`InFlight::try_acquire`] with the request's cost).
    pub(crate) fn may_admit(&self) -> bool {
        self.reqs.load(Ordering::SeqCst) < self.max_reqs.load(Ordering::SeqCst) && {
            let b = self.bytes.load(Ordering::SeqCst);
            b == 0 || b <= self.max_bytes.load(Ordering::SeqCst)
        }
    }

    /// Requests and bytes in flight now.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.reqs.load(Ordering::SeqCst),
            self.bytes.load(Ordering::SeqCst),
        )
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn requests_never_exceed_the_limit_and_bytes_fit_or_run_alone() {
        let f = InFlight::new(Some(2), Some(100));
        assert!(f.try_acquire(60));
        assert!(!f.try_acquire(50), "60 + 50 > 100");
        assert!(f.try_acquire(40));
        assert!(!f.try_acquire(0), "two requests in flight already");
        f.release(60);
        f.release(40);
        assert_eq!(f.counts(), (0, 0));
        assert!(f.try_acquire(500), "alone, a request larger than the limit goes");
        assert!(!f.try_acquire(1));
        assert!(!f.may_admit(), "500 bytes in flight: nothing more fits");
    }
}
