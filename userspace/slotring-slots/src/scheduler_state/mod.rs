//! [`SchedulerState`]: the slot budget's one mutex-protected state, shared
//! by all three schedulers.
//!
//! Everything that touches the budget (`cur`, `max`, `borrowed`), the waiter
//! lists and the per-allocation bookkeeping runs inside [`SchedulerState`]'s
//! methods, called with the mutex held, with two exceptions: the
//! per-allocation `granted` / `noncompeting` counts that `try_acquire`
//! takes lock-free (see [`crate::sync::take_one`] for their memory
//! ordering), and the release of a slot while nothing queues, which takes
//! one from its allocation's `held` and counts itself in the `released`
//! counts that every read of `cur` and of its workloads' `held` subtracts
//! (the `lock_free` module: when it may, and why no hand-over is lost).
//!
//! Waiter lists (the `waiters` module): one queue without a workload tree,
//! one per workload with one (the `workloads` module picks the queue of
//! each slot); in each queue
//! * round robin and fair round robin: a circular doubly-linked list threaded
//!   through the allocation slab, with a cursor on the next allocation to
//!   serve; a new waiter is inserted just before the cursor (ClickHouse's
//!   `waiters.insert(cur_waiter, …)`), i.e. it is served last in the current
//!   rotation;
//! * max-min fair: an ordered set of `(allocated, sequence, id)`; a grant
//!   removes the first entry and re-inserts it with `allocated + 1`.
//!
//! No stranded waiters: [`SchedulerState::schedule`] grants while the
//! budget has room and some queue may take a slot, serving each queue's
//! three lists (the active scheduler's last), whichever scheduler each
//! waiter was created under. Hence after every operation: `cur < limit` ⇒
//! no waiter that its workloads' `max_concurrent_threads` let go (without a
//! tree: no waiter at all).
//!
//! Wake-ups: a blocking `acquire` waits on its allocation's condvar with the
//! state mutex (counted in `blocked`). It is owed a wake-up whenever its
//! answer can change, recorded under the mutex and made just after the
//! mutex is released (the guard's drop), so that the woken thread, often
//! placed on its waker's CPU, neither preempts a thread that holds the
//! mutex nor blocks on it at once. None is lost: the waiter checked its
//! answer under the mutex and its wait releases the mutex atomically, so
//! a change made after its check is followed by a notify while it waits.
//! Owed: one at a grant while the allocation still wants more
//! (`notify_one`: one slot, one taker); all at the last grant, a `set_max`
//! shrink that ends the request, and `free` (`notify_all`: every other
//! blocked caller must return `Exhausted` or `Freed` instead of sleeping
//! forever).
//!
//! Borrowing: `borrowed ≤ cur.saturating_sub(max)` always (it is read as
//! that minimum, and stored so before every raise of `cur`, after every
//! decrease under the mutex and every change of `max`), so it drops to 0
//! when all slots are released: no capacity is ever lost. The budget invariant
//! `cur − borrowed ≤ max` holds at every step for allocations of the fair
//! schedulers while `max` is not lowered: grants require `cur < max`, an
//! unpark either fits (`cur < max`) or raises `cur` and `borrowed` together,
//! and a release lowers `cur` by one and `borrowed` by at most one.
//!
//! Effective budget and yields: scheduling obeys `limit() = min(max, cap)`,
//! where `cap` is the adaptive effective budget (`UNLIMITED`: static). A
//! shrink takes nothing back by itself; `yield_needed = (cur − borrowed) −
//! limit − owed` (floored at 0) is how many more holders should release. A
//! holder's `should_yield` says yes only while that is positive and its
//! allocation holds (`held`: granted-unacquired plus acquired unparked
//! competing slots) more than `max(1, limit / holders)` beyond the yields
//! it already promised (`owed`); each yes is promised (`owed + 1`), so
//! exactly the excess is asked for, and the release that keeps the promise
//! makes the allocation want that slot again (`allocated − 1`, back in its
//! waiter list): the holder waits for a grant like any other. Borrowed
//! slots are not an excess to yield: borrowing is repaid by withholding.
//! With a tree, and with no excess and no promise outstanding, one more
//! yield is wanted while a waiting workload outranks a holding one (the
//! `workloads` module's preemption): `should_yield` then says yes to one
//! holder of an outranked workload, the same promise kept the same way.
//!
//! # Memory ordering
//!
//! Everything above is guarded by the one mutex, which orders it. The atomics
//! outside it are counts that publish no other data, all `Relaxed`; the one
//! pairing between a lock-free and a locked path (a release that finds no
//! waiter, a waiter that queues) is made by a `SeqCst` fence on each side
//! (see the `lock_free` module):
//! * `released` and `waiters` (the [`Gauges`]) and every workload's
//!   `released`: the lock-free release adds to `released`, the mutex
//!   folds it back and changes `waiters`; a locked reader may see a count
//!   lower than when its critical section began, never higher.
//! * `granted` / `noncompeting` (per allocation): incremented (grant) and
//!   emptied (`free`) only inside the mutex, decremented lock-free by
//!   `try_acquire` with a CAS that never goes below zero, and by a
//!   preemption's take-back inside the mutex with the same CAS (so a unit
//!   goes to exactly one of the two). Each unit is taken
//!   by exactly one RMW (single-location coherence), and the slot it becomes
//!   is later returned (inside the mutex, or by the lock-free release of
//!   counts the grant raised); the return cannot precede the grant, since
//!   the CAS read the grant's write (see [`crate::sync::take_one`]). The
//!   loom model `free_races_try_acquire` checks the take-or-return race.
//! * `next_slot_id` (per allocation): a `fetch_add`, so ids are unique; in
//!   grant order up to the interleaving of concurrent acquirers.
//! * `slots_acquired*` (per control): statistics only.
//! * `held` / `owed` (per allocation): atomics because they live in the
//!   `AllocShared` that a slot may keep after its allocation is gone;
//!   changed inside the mutex, except that the lock-free release takes one
//!   from `held` by a CAS that never leaves it at 0 (so the count of
//!   holding allocations, kept under the mutex, stays exact).
//! * `yield_needed` (per control): stored inside the mutex after every
//!   operation, loaded lock-free by `should_yield`'s fast path. It is a
//!   hint: the decision and the promise are made again inside the mutex. A
//!   stale 0 only delays a yield to a later checkpoint (the store becomes
//!   visible); a stale positive value costs one lock that answers no.

mod lock_free;
mod waiters;

use std::time::Instant;

use crate::SlotsError;
use crate::scheduler::Scheduler;
use crate::sync::{Arc, AtomicU64, Condvar, Ordering, take_one};
use crate::workloads::{GONE, SlotTree, WorkloadRef, WorkloadSlots};
use crate::{SlotsCounters, UNLIMITED};
pub(crate) use lock_free::{Gauges, LockFreeRelease, release_lock_free};
use waiters::LeafQueue;

const NIL: u32 = u32::MAX;

/// The part of an allocation that `try_acquire` reads without the state mutex.
#[derive(Debug)]
pub(crate) struct AllocShared {
    /// Granted competing slots not yet acquired.
    pub(crate) granted: AtomicU64,
    /// Non-competing (`min`) slots not yet acquired (fair schedulers).
    pub(crate) noncompeting: AtomicU64,
    /// The next `slot_id`.
    pub(crate) next_slot_id: AtomicU64,
    /// Blocking `acquire` waits here, on the state mutex.
    pub(crate) cv: Condvar,
    /// Its slab id (valid while the slab entry holds this `AllocShared`).
    id: u32,
    /// Competing slots it holds now: granted-unacquired plus acquired and
    /// not parked (changed only under the state mutex).
    pub(crate) held: AtomicU64,
    /// Yields promised by `should_yield` and not yet made (under the mutex).
    pub(crate) owed: AtomicU64,
    /// The workload it entered (with a tree): its slots count there.
    pub(crate) workload: Option<Arc<WorkloadRef>>,
}

impl AllocShared {
    fn new(id: u32, granted: u64, noncompeting: u64, workload: Option<Arc<WorkloadRef>>) -> Self {
        Self {
            granted: AtomicU64::new(granted),
            noncompeting: AtomicU64::new(noncompeting),
            next_slot_id: AtomicU64::new(0),
            cv: Condvar::new(),
            id,
            held: AtomicU64::new(0),
            owed: AtomicU64::new(0),
            workload,
        }
    }
}

#[derive(Debug)]
struct AllocState {
    kind: Scheduler,
    min: u64,
    max: u64,
    /// Competing limit: `max` (round robin) or `max − min` (fair schedulers).
    limit: u64,
    /// Competing slots granted over the allocation's life.
    allocated: u64,
    seq: u64,
    query_counted: bool,
    in_waiters: bool,
    freed: bool,
    blocked: u32,
    /// The queue it waits in: its workload's node (0 without a tree).
    queue: usize,
    prev: u32,
    next: u32,
    shared: Arc<AllocShared>,
}

/// Plain counters kept under the mutex.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) slots_granted: u64,
    pub(crate) slots_delayed: u64,
    pub(crate) queries_delayed: u64,
    pub(crate) wait_us: u64,
    pub(crate) parks: u64,
    pub(crate) unparks: u64,
    pub(crate) unpark_borrows: u64,
    pub(crate) yields: u64,
    /// `waiting_us`, in ns, up to `Blocked::since`.
    pub(crate) waiting_ns: u64,
}

/// The blocked `acquire` calls now and since when that count holds: the
/// time-weighted count `waiting_us` accrues as they wait.
#[derive(Debug, Default)]
struct Blocked {
    now: u64,
    since: Option<Instant>,
}

/// The state behind the mutex.
#[derive(Debug)]
pub(crate) struct SchedulerState {
    pub(crate) max: u64,
    /// Competing slots counted, gross of the lock-free releases not yet
    /// folded in: the count is [`SchedulerState::cur`].
    cur: u64,
    /// What the lock-free release writes and reads: its releases not yet
    /// folded into `cur`, and `waiters` (see the `lock_free` module).
    pub(crate) gauges: Arc<Gauges>,
    /// Borrowed slots as last clamped: the count is `min(borrowed, cur −
    /// limit)` ([`SchedulerState::borrowed`]).
    borrowed: u64,
    pub(crate) allocations: u64,
    pub(crate) parked: u64,
    /// The effective budget set by the adaptive controller ([`UNLIMITED`]:
    /// static). Scheduling obeys `min(max, cap)` ([`SchedulerState::limit`]).
    pub(crate) cap: u64,
    /// Allocations holding at least one competing slot (`held > 0`).
    holders: u64,
    /// Yields promised and not yet made (sum of every `owed`).
    owed: u64,
    /// Whether the yield wanted now is a priority preemption (see
    /// [`SchedulerState::refresh_yield`]).
    preempting: bool,
    /// Yields still wanted: `(cur − borrowed) − limit − owed`, floored at 0;
    /// stored after every operation (the `should_yield` fast path).
    pub(crate) yield_needed: Arc<AtomicU64>,
    pub(crate) scheduler: Scheduler,
    pub(crate) stats: Stats,
    blocked: Blocked,
    slab: Vec<Option<AllocState>>,
    free_ids: Vec<u32>,
    /// The waiter lists: one queue without a tree, one per workload (at
    /// its node's index) with one.
    queues: Vec<LeafQueue>,
    /// The workload tree, if any (see the `workloads` module).
    tree: Option<SlotTree>,
    next_seq: u64,
    /// Wake-ups owed to blocked acquirers (`true`: all of an allocation's,
    /// else one), made by the lock's guard once the mutex is released
    /// ([`crate::control_shared::StateGuard`]).
    pub(crate) wakes: Vec<(Arc<AllocShared>, bool)>,
}

impl Default for SchedulerState {
    fn default() -> Self {
        Self::new()
    }
}

impl SchedulerState {
    pub(crate) fn new() -> Self {
        Self {
            max: UNLIMITED,
            cur: 0,
            gauges: Arc::new(Gauges::default()),
            borrowed: 0,
            allocations: 0,
            parked: 0,
            cap: UNLIMITED,
            holders: 0,
            owed: 0,
            preempting: false,
            yield_needed: Arc::new(AtomicU64::new(0)),
            scheduler: Scheduler::default(),
            stats: Stats::default(),
            blocked: Blocked::default(),
            slab: Vec::new(),
            free_ids: Vec::new(),
            queues: vec![LeafQueue::default()],
            tree: None,
            next_seq: 0,
            wakes: Vec::new(),
        }
    }

    /// The budget scheduling obeys: the user's `max` or the adaptive
    /// effective budget, whichever is lower.
    pub(crate) fn limit(&self) -> u64 {
        self.max.min(self.cap)
    }

    /// Free capacity (ClickHouse's `available`).
    pub(crate) fn available(&self) -> u64 {
        self.limit().saturating_sub(self.cur())
    }

    /// Competing slots counted against the budget: `cur` less the
    /// lock-free releases since the last fold.
    pub(crate) fn cur(&self) -> u64 {
        self.cur - self.gauges.released.load(Ordering::Relaxed)
    }

    /// Fold the lock-free releases into `cur` (one swap, only when there
    /// are some).
    fn fold_released(&mut self) {
        if self.gauges.released.load(Ordering::Relaxed) != 0 {
            self.cur -= self.gauges.released.swap(0, Ordering::Relaxed);
        }
    }

    /// Allocations in a waiter list.
    pub(crate) fn waiters(&self) -> u64 {
        self.gauges.waiters.load(Ordering::Relaxed)
    }

    /// Borrowed slots: never above the overshoot `cur − limit`.
    pub(crate) fn borrowed(&self) -> u64 {
        self.borrowed.min(self.cur().saturating_sub(self.limit()))
    }

    fn st(&self, id: u32) -> &AllocState {
        self.slab[id as usize].as_ref().expect("live allocation id")
    }

    fn st_mut(&mut self, id: u32) -> &mut AllocState {
        self.slab[id as usize].as_mut().expect("live allocation id")
    }

    /// Store [`SchedulerState::borrowed`]: before every raise of `cur` and
    /// every change of the limit (so that a borrow repaid by a lock-free
    /// release is not counted again when the overshoot grows), and after
    /// every decrease and every change of the limit.
    fn clamp_borrowed(&mut self) {
        self.fold_released();
        self.borrowed = self.borrowed();
    }

    fn emit_delayed(&mut self, id: u32, wanted: u64) {
        let available = self.available();
        if wanted <= available {
            return;
        }
        self.stats.slots_delayed += wanted - available;
        let st = self.st_mut(id);
        if !st.query_counted {
            st.query_counted = true;
            self.stats.queries_delayed += 1;
        }
    }

    // ---- operations ----------------------------------------------------

    /// `allocate(min, max)` under the active scheduler, entering
    /// `workload` (a leaf of the tree; `None` without a tree).
    pub(crate) fn allocate(
        &mut self,
        min: u64,
        max: u64,
        workload: Option<&str>,
    ) -> Result<(u32, Arc<AllocShared>), SlotsError> {
        if min > max {
            return Err(SlotsError::MinAboveMax { min, max });
        }
        let workload = match (&mut self.tree, workload) {
            (None, None) => None,
            (Some(tree), Some(name)) => Some(tree.enter(name)?),
            (None, Some(name)) => {
                return Err(SlotsError::NoWorkloadTree {
                    workload: name.to_owned(),
                });
            }
            (Some(_), None) => return Err(SlotsError::WorkloadRequired),
        };
        let queue = workload.as_ref().map_or(0, |w| w.index());
        let kind = self.scheduler;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.allocations += 1;
        self.stats.slots_granted += min;
        let (limit, allocated, granted, noncompeting) = if kind.min_is_non_competing() {
            (max - min, 0, 0, min)
        } else {
            self.clamp_borrowed();
            self.cur = self.cur.saturating_add(min);
            (max, min, min, 0)
        };
        let id = match self.free_ids.pop() {
            Some(id) => id,
            None => {
                self.slab.push(None);
                u32::try_from(self.slab.len() - 1).expect("fewer than 2^32 live allocations")
            }
        };
        let shared = Arc::new(AllocShared::new(id, granted, noncompeting, workload));
        if granted > 0 {
            self.held_add(&shared, granted);
        }
        let st = AllocState {
            kind,
            min,
            max,
            limit,
            allocated,
            seq,
            query_counted: false,
            in_waiters: false,
            freed: false,
            blocked: 0,
            queue,
            prev: NIL,
            next: NIL,
            shared: shared.clone(),
        };
        self.slab[id as usize] = Some(st);
        if allocated < limit {
            self.add_waiter(id);
        }
        if limit > allocated {
            self.emit_delayed(id, limit - allocated);
        }
        self.schedule();
        self.refresh_yield();
        Ok((id, shared))
    }

    /// `setMax` exactly as the contract of `ISlotAllocation::setMax` in
    /// ClickHouse's `src/Common/ISlotControl.h`.
    pub(crate) fn set_max(&mut self, id: u32, new_max: u64) -> Result<(), SlotsError> {
        if new_max == 0 {
            return Err(SlotsError::ZeroMax);
        }
        let st = self.st_mut(id);
        if st.freed {
            return Err(SlotsError::Freed);
        }
        if new_max == st.max {
            return Ok(());
        }
        let new_limit = if st.kind.min_is_non_competing() {
            new_max.saturating_sub(st.min)
        } else {
            new_max
        };
        let old_limit = st.limit;
        let allocated = st.allocated;
        st.max = new_max;
        st.limit = new_limit;
        let was_waiter = allocated < old_limit;
        let will_be_waiter = allocated < new_limit;
        debug_assert_eq!(was_waiter, st.in_waiters);
        let mut need_schedule = false;
        if !was_waiter && will_be_waiter {
            self.add_waiter(id);
            need_schedule = true;
        } else if was_waiter && !will_be_waiter {
            self.remove_waiter(id);
            // Nothing more will be granted: blocked acquirers must wake to
            // return `Exhausted` (or take a slot granted meanwhile).
            let st = self.st(id);
            if st.blocked > 0 {
                let a = st.shared.clone();
                self.wakes.push((a, true));
            }
        } else if was_waiter && will_be_waiter && new_limit > old_limit {
            need_schedule = true;
        }
        if new_limit > old_limit {
            // `allocated > old_limit` is possible after a shrink: never underflow.
            let baseline = old_limit.max(allocated);
            if new_limit > baseline {
                self.emit_delayed(id, new_limit - baseline);
            }
        }
        if need_schedule {
            self.schedule();
        }
        self.refresh_yield();
        Ok(())
    }

    /// Cancel the allocation: return granted-unacquired slots, leave the
    /// waiter list, wake blocked acquirers. Idempotent.
    pub(crate) fn free(&mut self, id: u32) {
        let st = self.st_mut(id);
        if st.freed {
            return;
        }
        st.freed = true;
        let amount = st.shared.granted.swap(0, Ordering::Relaxed);
        st.shared.noncompeting.swap(0, Ordering::Relaxed);
        let wake = st.blocked > 0;
        let in_waiters = st.in_waiters;
        let shared = st.shared.clone();
        if wake {
            self.wakes.push((shared.clone(), true));
        }
        self.held_sub(&shared, amount);
        self.cur -= amount;
        self.clamp_borrowed();
        if in_waiters {
            self.remove_waiter(id);
        }
        if let (Some(tree), Some(w)) = (&mut self.tree, &shared.workload) {
            tree.leave(w.index());
        }
        self.allocations -= 1;
        self.schedule();
        self.refresh_yield();
    }

    /// Forget the slab entry (after `free`), when the handle drops.
    pub(crate) fn remove(&mut self, id: u32) {
        self.free(id);
        self.slab[id as usize] = None;
        self.free_ids.push(id);
    }

    pub(crate) fn is_requesting(&self, id: u32) -> bool {
        self.st(id).in_waiters
    }

    pub(crate) fn is_freed(&self, id: u32) -> bool {
        self.st(id).freed
    }

    pub(crate) fn allocated_and_max(&self, id: u32) -> (u64, u64) {
        let st = self.st(id);
        (st.allocated, st.max)
    }

    pub(crate) fn blocked_delta(&mut self, id: u32, enter: bool) {
        let st = self.st_mut(id);
        if enter {
            st.blocked += 1;
        } else {
            st.blocked -= 1;
        }
        let now = Instant::now();
        self.stats.waiting_ns = self.waiting_ns_at(now);
        let b = &mut self.blocked;
        b.now = if enter { b.now + 1 } else { b.now - 1 };
        b.since = Some(now);
    }

    /// `waiting_us` in ns at `now`: what accrued up to the last change of
    /// the blocked count, plus that count times the time since.
    fn waiting_ns_at(&self, now: Instant) -> u64 {
        let b = &self.blocked;
        let since = b.since.map_or(0, |t| {
            u64::try_from(now.saturating_duration_since(t).as_nanos()).unwrap_or(u64::MAX)
        });
        self.stats
            .waiting_ns
            .saturating_add(b.now.saturating_mul(since))
    }

    pub(crate) fn set_max_concurrency(&mut self, value: u64) {
        // A lowered limit raises the overshoot: store the borrows first.
        self.clamp_borrowed();
        self.max = value.max(1);
        self.clamp_borrowed();
        self.schedule();
        self.refresh_yield();
    }

    /// Set the adaptive effective budget (`0` → 1; [`UNLIMITED`]: static,
    /// only `max` applies). Like `set_max_concurrency`, a shrink reclaims
    /// nothing by itself: holders above their fair share are asked to yield
    /// through `should_yield`; a growth grants to waiters at once.
    pub(crate) fn set_effective_budget(&mut self, value: u64) {
        // A lowered limit raises the overshoot: store the borrows first.
        self.clamp_borrowed();
        self.cap = value.max(1);
        self.clamp_borrowed();
        self.schedule();
        self.refresh_yield();
    }

    pub(crate) fn set_scheduler(&mut self, s: Scheduler) {
        self.scheduler = s;
        self.schedule();
        self.refresh_yield();
    }

    pub(crate) fn fair_share(&self) -> u64 {
        let limit = self.limit();
        if limit == UNLIMITED {
            return UNLIMITED;
        }
        (limit / (self.allocations + 1)).max(1)
    }

    // ---- yields --------------------------------------------------------

    /// `a` counts `n` more slots: against its workloads too.
    fn held_add(&mut self, a: &AllocShared, n: u64) {
        if n == 0 {
            return;
        }
        if let (Some(tree), Some(w)) = (&mut self.tree, &a.workload) {
            tree.add(w.index(), n);
        }
        self.alloc_held_add(a, n);
    }

    /// `a` counts `n` more slots (its workloads are the caller's).
    fn alloc_held_add(&mut self, a: &AllocShared, n: u64) {
        if a.held.fetch_add(n, Ordering::Relaxed) == 0 {
            self.holders += 1;
        }
    }

    /// `a` counts `n` fewer slots: against its workloads too.
    fn held_sub(&mut self, a: &AllocShared, n: u64) {
        if n == 0 {
            return;
        }
        if let (Some(tree), Some(w)) = (&mut self.tree, &a.workload) {
            tree.sub(w.index(), n);
        }
        let before = a.held.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(before >= n, "held {before} < {n}");
        if before == n {
            self.holders -= 1;
        }
    }

    /// Store the fast-path hint: yields still wanted. Borrowed slots are
    /// repaid by withholding, not by yields. With nothing else wanted and
    /// no yield promised, one preemption is wanted while a waiting
    /// workload outranks a holding one ([`SlotTree::preemption`]): one at a
    /// time, since the slot it frees goes to the best waiter, and the next
    /// is wanted only once that grant is made.
    ///
    /// Before asking a holder, a preemption takes back a slot that an
    /// outranked allocation was granted and has not acquired
    /// ([`SchedulerState::revoke_unacquired`]): its thread is not running
    /// with it yet, so nothing waits for a checkpoint.
    fn refresh_yield(&mut self) {
        loop {
            let excess = (self.cur() - self.borrowed()).saturating_sub(self.limit());
            let needed = excess.saturating_sub(self.owed);
            self.preempting = excess == 0 && self.owed == 0 && self.preemption_wanted();
            if self.preempting && self.revoke_unacquired() {
                // The slot goes to the best waiter, which outranks the
                // one it came from: each round serves one waiter.
                self.schedule();
                continue;
            }
            self.yield_needed
                .store(needed + u64::from(self.preempting), Ordering::Relaxed);
            return;
        }
    }

    /// Take back one competing slot granted to, and not yet acquired by,
    /// an allocation of a workload that a waiting one outranks (the newest
    /// such allocation; never a round-robin `min` slot, which is granted
    /// unconditionally): it wants the slot again, as after a yield, and
    /// the taking is counted as its workload's preemption. False if there
    /// is none, or its thread took the slot first (the same CAS as
    /// `try_acquire`'s: one of them gets it; see [`crate::sync::take_one`]).
    /// Called from [`SchedulerState::refresh_yield`] after
    /// [`SlotTree::preemption`] recorded who is outranked.
    fn revoke_unacquired(&mut self) -> bool {
        let Some(tree) = &self.tree else {
            return false;
        };
        let victim = self
            .slab
            .iter()
            .flatten()
            .filter(|st| {
                !st.freed
                    && (st.kind.min_is_non_competing() || st.allocated > st.min)
                    && st.shared.granted.load(Ordering::Relaxed) > 0
                    && st
                        .shared
                        .workload
                        .as_ref()
                        .is_some_and(|w| tree.outranked(w.index()))
            })
            .max_by_key(|st| st.seq)
            .map(|st| st.shared.clone());
        let Some(a) = victim else {
            return false;
        };
        if !take_one(&a.granted) {
            return false;
        }
        self.held_sub(&a, 1);
        self.cur -= 1;
        self.clamp_borrowed();
        if let (Some(tree), Some(w)) = (&mut self.tree, &a.workload) {
            tree.preempted(w.index());
        }
        let id = a.id;
        if self.st(id).in_waiters {
            self.remove_waiter(id);
        }
        let st = self.st_mut(id);
        st.allocated -= 1;
        if st.allocated < st.limit {
            self.add_waiter(id);
        }
        true
    }

    /// Whether the thread of `a`, which blocked in `acquire` and woke with
    /// a slot, gives its CPU once before it runs: only in a workload that
    /// can be outranked (see the `workloads` module's wake-up yield);
    /// counted per workload when it does.
    pub(crate) fn wake_yield(&mut self, a: &AllocShared) -> bool {
        match (&mut self.tree, &a.workload) {
            (Some(tree), Some(w)) => tree.wake_yield(w.index()),
            _ => false,
        }
    }

    /// Whether a waiting workload outranks a holding one (only while
    /// allocations wait, with a tree, and while no slot is borrowed: a
    /// release would repay the borrow, not free a slot for the waiter).
    fn preemption_wanted(&mut self) -> bool {
        if self.waiters() == 0 || self.borrowed() > 0 {
            return false;
        }
        let queues = &self.queues;
        self.tree
            .as_mut()
            .is_some_and(|tree| tree.preemption(|n| queues[n].len > 0))
    }

    /// A competing, unparked slot of `a` is released: it makes one promised yield of its allocation, if any; the allocation
    /// then wants that slot again (`allocated − 1`) and re-enters its
    /// waiter list, so its holder waits for a grant like any other.
    fn slot_left(&mut self, a: &Arc<AllocShared>) {
        self.held_sub(a, 1);
        if a.owed.load(Ordering::Relaxed) == 0 {
            return;
        }
        a.owed.fetch_sub(1, Ordering::Relaxed);
        self.owed -= 1;
        self.stats.yields += 1;
        let id = a.id;
        let live = self
            .slab
            .get(id as usize)
            .and_then(Option::as_ref)
            .is_some_and(|st| Arc::ptr_eq(&st.shared, a) && !st.freed);
        if !live {
            return;
        }
        if self.st(id).in_waiters {
            self.remove_waiter(id);
        }
        let st = self.st_mut(id);
        st.allocated = st.allocated.saturating_sub(1);
        if st.allocated < st.limit {
            self.add_waiter(id);
        }
    }

    /// The slow path of `should_yield` for a competing, unparked slot of
    /// `a`: yes (and promise it) while yields are wanted and either `a`
    /// holds, beyond what it already promised, more than its fair share
    /// `max(1, limit / holders)` (the budget is exceeded), or the yield
    /// wanted is a preemption and `a`'s workload is outranked.
    pub(crate) fn should_yield(&mut self, a: &AllocShared) -> bool {
        // A lock-free release may have lowered `cur` since the hint was
        // stored: decide on the count now.
        self.refresh_yield();
        if self.yield_needed.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let keeps = a
            .held
            .load(Ordering::Relaxed)
            .saturating_sub(a.owed.load(Ordering::Relaxed));
        if self.preempting {
            let leaf = a.workload.as_ref().map(|w| w.index());
            let tree = self.tree.as_mut();
            match (tree, leaf) {
                (Some(tree), Some(leaf)) if keeps > 0 && tree.outranked(leaf) => {
                    tree.preempted(leaf);
                }
                _ => return false,
            }
        } else {
            let fair = (self.limit() / self.holders.max(1)).max(1);
            if keeps <= fair {
                return false;
            }
        }
        a.owed.fetch_add(1, Ordering::Relaxed);
        self.owed += 1;
        self.refresh_yield();
        true
    }

    /// An acquired slot is dropped.
    pub(crate) fn release(
        &mut self,
        alloc: Option<&Arc<AllocShared>>,
        competing: bool,
        parked: bool,
    ) {
        if parked {
            self.parked -= 1;
            if let (Some(tree), Some(w)) = (&mut self.tree, alloc.and_then(|a| a.workload.as_ref()))
            {
                tree.parked_dropped(w.index());
            }
        } else if competing {
            if let Some(a) = alloc {
                self.slot_left(a);
            }
            self.cur -= 1;
            self.clamp_borrowed();
            self.schedule();
        }
        self.refresh_yield();
    }

    /// After a lock-free release that found waiters: hand the capacity on.
    pub(crate) fn released_lock_free(&mut self) {
        self.clamp_borrowed();
        self.schedule();
        self.refresh_yield();
    }

    /// Park an acquired slot: it stops counting; its capacity may be granted.
    pub(crate) fn park(&mut self, alloc: Option<&Arc<AllocShared>>, competing: bool) {
        self.parked += 1;
        self.stats.parks += 1;
        if competing {
            if let Some(a) = alloc {
                // A park is no yield: a promise stays owed until a release.
                self.held_sub(a, 1);
                if let (Some(tree), Some(w)) = (&mut self.tree, &a.workload) {
                    tree.parked(w.index());
                }
            }
            self.cur -= 1;
            self.clamp_borrowed();
            self.schedule();
        }
        self.refresh_yield();
    }

    /// Unpark: take the slot back, borrowing if the budget is full.
    pub(crate) fn unpark(&mut self, alloc: Option<&Arc<AllocShared>>, competing: bool) {
        self.parked -= 1;
        self.stats.unparks += 1;
        if competing {
            if let Some(a) = alloc {
                if let (Some(tree), Some(w)) = (&mut self.tree, &a.workload) {
                    tree.unparked(w.index());
                }
                self.alloc_held_add(a, 1);
            }
            self.clamp_borrowed();
            if self.cur() >= self.limit() {
                self.borrowed += 1;
                self.stats.unpark_borrows += 1;
            }
            self.cur += 1;
        }
        self.refresh_yield();
    }

    /// Schedule by `spec` from now on (see the `workloads` module for what
    /// a change carries and refuses). The first tree refuses while
    /// allocations made without one live.
    pub(crate) fn set_workloads(
        &mut self,
        spec: &slotring_throttle::WorkloadTree,
    ) -> Result<(), SlotsError> {
        if self.tree.is_none() && self.allocations > 0 {
            return Err(SlotsError::Unclassified {
                allocations: self.allocations,
            });
        }
        let (tree, map) = SlotTree::rebuild(self.tree.as_ref(), spec)?;
        let mut queues: Vec<LeafQueue> = (0..tree.len()).map(|_| LeafQueue::default()).collect();
        if self.tree.is_some() {
            for (old, q) in std::mem::take(&mut self.queues).into_iter().enumerate() {
                match map[old] {
                    GONE => debug_assert_eq!(q.len, 0, "a workload with waiters is kept"),
                    new => queues[new] = q,
                }
            }
            for st in self.slab.iter_mut().flatten() {
                if let Some(w) = &st.shared.workload {
                    st.queue = w.index();
                }
            }
        }
        self.queues = queues;
        self.tree = Some(tree);
        self.schedule();
        self.refresh_yield();
        Ok(())
    }

    /// Every workload's numbers (empty without a tree).
    pub(crate) fn workloads(&self) -> Vec<WorkloadSlots> {
        self.tree.as_ref().map_or_else(Vec::new, SlotTree::snapshot)
    }

    pub(crate) fn snapshot(&self, acquired: u64, acquired_nc: u64) -> SlotsCounters {
        SlotsCounters {
            slots_granted: self.stats.slots_granted,
            slots_delayed: self.stats.slots_delayed,
            slots_acquired: acquired,
            slots_acquired_non_competing: acquired_nc,
            queries_delayed: self.stats.queries_delayed,
            wait_us: self.stats.wait_us,
            parks: self.stats.parks,
            unparks: self.stats.unparks,
            unpark_borrows: self.stats.unpark_borrows,
            max_concurrency: self.max,
            budget_effective: self.limit(),
            yields: self.stats.yields,
            waiting_us: self.waiting_ns_at(Instant::now()) / 1000,
            cur_concurrency: self.cur(),
            allocations: self.allocations,
            waiters: self.waiters(),
            parked: self.parked,
            borrowed: self.borrowed(),
        }
    }
}
