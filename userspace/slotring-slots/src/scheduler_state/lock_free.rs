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
//! never reaches 0). It then adds one to the `released` count of every
//! workload on its path (the `parent` links of the workload's identity,
//! fixed for its life) and of the budget ([`Gauges::released`]). Whoever
//! reads a count subtracts its `released`; the mutex folds it back (one
//! swap, when it is not 0), so the locked paths keep plain counts and pay
//! no read-modify-write for the lock-free one. Borrows need no work: the
//! borrowed counts are read as `min(borrowed, overshoot)`, so a release
//! that lowers the overshoot repays a borrow by itself, and the state
//! stores that minimum before every raise of a count or lowering of a
//! limit.
//!
//! # No lost hand-over
//!
//! After adding to `released` the release issues a `SeqCst` fence and
//! reads `waiters` again. A waiter queues under the mutex: it adds to
//! `waiters`, issues a `SeqCst` fence, and only then reads the counts
//! (and so the `released` ones) that decide its grant. Of the two fences,
//! whichever comes first in their single total order makes its side's
//! write visible to the other side's read: either the waiter sees the
//! freed place and is granted, or the release sees the waiter and takes
//! the mutex to schedule (`SchedulerState::released_lock_free`). The
//! pairing is on fences, not on `SeqCst` accesses, because loom checks
//! fences exactly and models `SeqCst` accesses as `AcqRel`; the loom
//! model `lock_free_release_races_a_new_waiter_under_a_capped_parent`
//! deadlocks without either fence.
//!
//! # Races with the other checks
//!
//! A yield promised under the mutex while a lock-free release runs was
//! decided on a count that the release then lowers: the slow path of
//! `should_yield` recomputes the hint from the current count first, so at
//! most a promise made in the same instant as the release counts it
//! (that release linearises after the promise). A `set_workloads` cannot
//! remove or move a workload that still counts the slot (see the
//! `workloads` module), so the path a release walks stays the tree's.

use super::AllocShared;
use crate::sync::{AtomicU64, Ordering, fence};

/// The two counts the lock-free release writes and reads.
#[derive(Debug, Default)]
pub(crate) struct Gauges {
    /// Slots released lock-free and not yet folded into the state's `cur`
    /// (which subtracts it on every read).
    pub(crate) released: AtomicU64,
    /// Allocations in a waiter list (changed under the mutex).
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
    if gauges.waiters.load(Ordering::Relaxed) != 0
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
        w.released.fetch_add(1, Ordering::Relaxed);
        node = w.parent.as_deref();
    }
    gauges.released.fetch_add(1, Ordering::Relaxed);
    // Pairs with the fence after a waiter's `waiters + 1` (module docs).
    fence(Ordering::SeqCst);
    if gauges.waiters.load(Ordering::Relaxed) != 0 {
        LockFreeRelease::Schedule
    } else {
        LockFreeRelease::Done
    }
}
