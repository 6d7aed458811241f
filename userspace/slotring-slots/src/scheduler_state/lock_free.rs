//! The lock-free release: a competing slot dropped while nothing queues
//! gives its place back with atomics only.
//!
//! # When
//!
//! A release needs the state mutex only for what it may have to decide:
//! a waiter to hand the place to, a promised yield to keep, or the last
//! slot of an allocation (the count of holding allocations changes). So
//! it goes lock-free when no allocation waits (`waiters == 0`), no yield
//! is wanted (`yield_needed == 0`), its allocation owes none (`owed ==
//! 0`) and still holds another slot (`held > 1`, taken down by a CAS that
//! never reaches 0). It then lowers its allocation's `held`, every
//! workload's `held` on its path (the `parent` links of the workload's
//! identity, fixed for its life) and `cur`. Borrows need no work: the
//! borrowed counts are read as `min(borrowed, overshoot)`, so a release
//! that lowers the overshoot repays a borrow by itself, and the state
//! stores that minimum before every raise of a count.
//!
//! # No lost hand-over
//!
//! After lowering the counts the release reads `waiters` again. A waiter
//! that queues meanwhile does so under the mutex: it raises `waiters`,
//! then reads `cur` and the workloads' `held` to decide the grant. All of
//! these are `SeqCst`, so in their single total order either the waiter's
//! reads come after the release's decrements (it sees the room and is
//! granted), or the release's second read comes after the waiter's
//! increment (the release takes the mutex and schedules). The loom model
//! `lock_free_release_races_a_new_waiter_under_a_capped_parent` checks it.
//!
//! # Races with the other checks
//!
//! A yield promised under the mutex while a lock-free release runs was
//! decided on a `cur` that the release then lowers: the slow path of
//! `should_yield` recomputes the hint from the current count first, so at
//! most a promise made in the same instant as the release counts it
//! (that release linearises after the promise). A `set_workloads` cannot
//! remove or move a workload that still counts the slot (see the
//! `workloads` module), so the path a release walks stays the tree's.

use super::AllocShared;
use crate::sync::{AtomicU64, Ordering};

/// The two counts the lock-free release reads and writes; the state
/// changes them under the mutex with the same `SeqCst` operations.
#[derive(Debug, Default)]
pub(crate) struct Gauges {
    /// Competing slots counted against the budget.
    pub(crate) cur: AtomicU64,
    /// Allocations in a waiter list.
    pub(crate) waiters: AtomicU64,
}

/// What [`release_lock_free`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockFreeRelease {
    /// Nothing: the release must take the mutex.
    Refused,
    /// The slot is released.
    Done,
    /// The slot is released, and a waiter appeared meanwhile: take the
    /// mutex to hand the capacity on
    /// (`SchedulerState::released_lock_free`).
    Schedule,
}

/// Release a competing, unparked slot of `a` without the lock, if the
/// module docs' conditions hold.
pub(crate) fn release_lock_free(
    gauges: &Gauges,
    yield_needed: &AtomicU64,
    a: &AllocShared,
) -> LockFreeRelease {
    if gauges.waiters.load(Ordering::SeqCst) != 0
        || yield_needed.load(Ordering::Relaxed) != 0
        || a.owed.load(Ordering::Relaxed) != 0
    {
        return LockFreeRelease::Refused;
    }
    if a.held
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
            (h > 1).then(|| h - 1)
        })
        .is_err()
    {
        return LockFreeRelease::Refused;
    }
    let mut node = a.workload.as_deref();
    while let Some(w) = node {
        w.held.fetch_sub(1, Ordering::SeqCst);
        node = w.parent.as_deref();
    }
    gauges.cur.fetch_sub(1, Ordering::SeqCst);
    if gauges.waiters.load(Ordering::SeqCst) != 0 {
        LockFreeRelease::Schedule
    } else {
        LockFreeRelease::Done
    }
}
