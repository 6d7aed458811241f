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
//! The counts are `SeqCst`, paired with the node's `queued` count (its
//! increments and reads also `SeqCst`): a request that queues increments
//! `queued`, then reads the counts; a completion decrements a count, then
//! reads `queued`. In any
//! interleaving one of them sees the other (Dekker), so either the queuing
//! request finds the room, or the completion finds the queue and takes the
//! scheduler's lock to hand the room on: no wake-up is lost.

use crate::sync::{AtomicU64, Ordering};

/// "No limit".
const NONE: u64 = u64::MAX;

/// The in-flight places one request took along its path: two bits per
/// node (the leaf is node 0): bit `2k` its request count, bit `2k + 1` its
/// bytes. A place is taken only in a dimension that has a limit, and given
/// back exactly as taken, whatever a live change did to the limits since.
///
/// Two words of 32 nodes each, not one `u128`: 8-byte aligned, so what
/// carries it (a queued request's slot) packs into one cache line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Places([u64; 2]);

impl Places {
    pub(crate) fn set(&mut self, k: usize, taken: u8) {
        self.0[k / 32] |= u64::from(taken & 3) << (2 * (k % 32));
    }

    pub(crate) fn get(self, k: usize) -> u8 {
        ((self.0[k / 32] >> (2 * (k % 32))) & 3) as u8
    }

    pub(crate) fn is_empty(self) -> bool {
        self.0 == [0, 0]
    }
}

/// The counts, alone on their line: the lock-free path writes them, and
/// reads the limits (and the node's other fields) from lines nobody writes.
#[derive(Debug)]
#[repr(align(128))]
struct Counts {
    reqs: AtomicU64,
    bytes: AtomicU64,
    /// The most `reqs` ever held (a statistic: it orders nothing).
    peak_reqs: AtomicU64,
}

/// See the module docs. The counts first, on their own line; the limits
/// after them, on a line only a live change writes.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct InFlight {
    counts: Counts,
    max_reqs: AtomicU64,
    max_bytes: AtomicU64,
}

impl InFlight {
    pub(crate) fn new(max_reqs: Option<u64>, max_bytes: Option<u64>) -> Self {
        Self {
            counts: Counts {
                reqs: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                peak_reqs: AtomicU64::new(0),
            },
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

    /// Whether `max_bytes_inflight` is set.
    #[inline]
    pub(crate) fn limits_bytes(&self) -> bool {
        self.max_bytes.load(Ordering::Relaxed) != NONE
    }

    /// Change the limits; the counts stay (requests in flight keep their
    /// places and give them back at completion).
    pub(crate) fn set_limits(&self, max_reqs: Option<u64>, max_bytes: Option<u64>) {
        self.max_reqs
            .store(max_reqs.unwrap_or(NONE), Ordering::SeqCst);
        self.max_bytes
            .store(max_bytes.unwrap_or(NONE), Ordering::SeqCst);
    }

    /// Take a place for a request of `cost` bytes, if it fits: the
    /// dimensions taken (see [`Places`]; 0 where nothing limits), `None` if
    /// refused.
    pub(crate) fn try_acquire(&self, cost: u64) -> Option<u8> {
        let max_r = self.max_reqs.load(Ordering::SeqCst);
        let max_b = self.max_bytes.load(Ordering::SeqCst);
        let mut taken = 0;
        if max_r != NONE {
            let before = self
                .counts
                .reqs
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| {
                    (r < max_r).then_some(r + 1)
                })
                .ok()?;
            // The peak only grows: a read first keeps the steady state (no
            // new peak) free of a second read-modify-write. `SeqCst` costs
            // what `Relaxed` does on x86 (a plain load; the RMW is locked
            // either way), and loom 0.7 trips its own assertion on a relaxed
            // load beside a relaxed RMW of one atomic (tokio-rs/loom#252).
            if before + 1 > self.counts.peak_reqs.load(Ordering::SeqCst) {
                self.counts
                    .peak_reqs
                    .fetch_max(before + 1, Ordering::SeqCst);
            }
            taken |= 1;
        }
        if max_b != NONE {
            let fits = self
                .counts
                .bytes
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                    (b == 0 || b.saturating_add(cost) <= max_b).then_some(b.saturating_add(cost))
                });
            if fits.is_err() {
                self.release(cost, taken);
                return None;
            }
            taken |= 2;
        }
        Some(taken)
    }

    /// Give back what [`InFlight::try_acquire`] took.
    pub(crate) fn release(&self, cost: u64, taken: u8) {
        if taken & 1 != 0 {
            self.counts.reqs.fetch_sub(1, Ordering::SeqCst);
        }
        if taken & 2 != 0 {
            self.counts.bytes.fetch_sub(cost, Ordering::SeqCst);
        }
    }

    /// Whether some request could fit now (a necessary condition: the
    /// exact test is [`InFlight::try_acquire`] with the request's cost).
    pub(crate) fn may_admit(&self) -> bool {
        self.counts.reqs.load(Ordering::SeqCst) < self.max_reqs.load(Ordering::SeqCst) && {
            let b = self.counts.bytes.load(Ordering::SeqCst);
            b == 0 || b <= self.max_bytes.load(Ordering::SeqCst)
        }
    }

    /// Requests and bytes in flight now (each counted where it is limited).
    /// The most requests held at once (where limited).
    pub(crate) fn peak_requests(&self) -> u64 {
        self.counts.peak_reqs.load(Ordering::Relaxed)
    }

    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.counts.reqs.load(Ordering::SeqCst),
            self.counts.bytes.load(Ordering::SeqCst),
        )
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn requests_never_exceed_the_limit_and_bytes_fit_or_run_alone() {
        let f = InFlight::new(Some(2), Some(100));
        assert_eq!(f.try_acquire(60), Some(3));
        assert_eq!(f.try_acquire(50), None, "60 + 50 > 100");
        assert_eq!(f.try_acquire(40), Some(3));
        assert_eq!(f.try_acquire(0), None, "two requests in flight already");
        f.release(60, 3);
        f.release(40, 3);
        assert_eq!(f.counts(), (0, 0));
        assert_eq!(f.try_acquire(500), Some(3), "alone, larger than the limit");
        assert_eq!(f.try_acquire(1), None);
        assert!(!f.may_admit(), "500 bytes in flight: nothing more fits");
        let mut p = Places::default();
        assert!(p.is_empty());
        p.set(0, 1);
        p.set(31, 2);
        p.set(32, 3);
        p.set(63, 1);
        assert_eq!(
            [p.get(0), p.get(1), p.get(31), p.get(32), p.get(63)],
            [1, 0, 2, 3, 1]
        );
        assert!(!p.is_empty());
        let only_reqs = InFlight::new(Some(1), None);
        assert_eq!(only_reqs.try_acquire(7), Some(1), "bytes are not counted");
        assert_eq!(only_reqs.counts(), (1, 0));
    }
}
