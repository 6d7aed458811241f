//! The public wrappers of the budget: [`ConcurrencyControl`] and its
//! allocations ([`Allocation`], [`GrantedAllocation`], behind the
//! [`SlotAllocation`] trait). The slots they hand out are in `slot.rs`.

use std::fmt;
use std::time::{Duration, Instant};

use slotring_throttle::{Tenant, WorkloadTree};

use crate::SlotsError;
use crate::control_shared::{ControlShared, SlotState, Yielder};
use crate::scheduler::Scheduler;
use crate::scheduler_state::{AllocShared, SchedulerState};
use crate::slot::AcquiredSlot;
use crate::sync::{Arc, AtomicU64, Mutex, Ordering, take_one};
use crate::workloads::WorkloadSlots;
use crate::{SlotsCounters, UNLIMITED};

/// A global budget of CPU slots shared by allocations (ClickHouse's
/// `ConcurrencyControl`). Cloning yields another handle to the same budget.
#[derive(Clone)]
pub struct ConcurrencyControl {
    shared: Arc<ControlShared>,
}

impl fmt::Debug for ConcurrencyControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyControl")
            .field("counters", &self.counters())
            .finish()
    }
}

impl Default for ConcurrencyControl {
    fn default() -> Self {
        Self::new()
    }
}

impl ConcurrencyControl {
    /// A new, unlimited budget with the default scheduler (`max_min_fair`).
    ///
    /// Also installs this crate's lease hook into `slotring-throttle` (once
    /// per process), so blocking throttler waits park the caller's lease.
    pub fn new() -> Self {
        crate::lease::install_lease_hook();
        let state = SchedulerState::new();
        let yield_needed = state.yield_needed.clone();
        let gauges = state.gauges.clone();
        Self {
            shared: Arc::new(ControlShared {
                state: Mutex::new(state),
                slots_acquired: AtomicU64::new(0),
                slots_acquired_nc: AtomicU64::new(0),
                yield_needed,
                gauges,
            }),
        }
    }

    /// The process-wide instance (ClickHouse's `ConcurrencyControl::instance()`),
    /// unlimited until configured.
    #[cfg(not(loom))]
    pub fn global() -> &'static ConcurrencyControl {
        static GLOBAL: std::sync::OnceLock<ConcurrencyControl> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(ConcurrencyControl::new)
    }

    /// Set the budget: `0` is clamped to 1, [`UNLIMITED`] allowed. Re-runs
    /// scheduling, so waiters receive new capacity at once.
    pub fn set_max_concurrency(&self, value: u64) {
        self.shared.lock().set_max_concurrency(value);
    }

    /// The budget ([`UNLIMITED`] when unlimited).
    pub fn max_concurrency(&self) -> u64 {
        self.shared.lock().max
    }

    /// Set the effective budget below `max_concurrency` (the adaptive
    /// budget; see [`crate::BudgetController`]): scheduling then obeys
    /// `min(max_concurrency, value)`. `0` is clamped to 1; [`UNLIMITED`]
    /// returns to the static budget. A shrink takes no slot back by itself:
    /// holders above their fair share see [`AcquiredSlot::should_yield`]
    /// and release at their next checkpoint; a growth grants to waiters at
    /// once.
    pub fn set_effective_budget(&self, value: u64) {
        self.shared.lock().set_effective_budget(value);
    }

    /// What scheduling obeys now: `min(max_concurrency, effective budget)`.
    pub fn effective_budget(&self) -> u64 {
        self.shared.lock().limit()
    }

    /// ClickHouse's combination of `concurrent_threads_soft_limit_num` and
    /// `concurrent_threads_soft_limit_ratio_to_cores` (default ratio 2): the
    /// smaller of the positive ones, [`UNLIMITED`] if neither is.
    pub fn max_concurrency_from_settings(num: u64, ratio_to_cores: u64, cores: u64) -> u64 {
        let mut limit = UNLIMITED;
        if num > 0 && num < limit {
            limit = num;
        }
        if ratio_to_cores > 0 {
            let value = ratio_to_cores.saturating_mul(cores);
            if value > 0 && value < limit {
                limit = value;
            }
        }
        limit
    }

    /// Switch the scheduler for new allocations. Existing waiters keep their
    /// scheduler's list; every scheduling round runs all three lists (active
    /// last), so none is stranded.
    pub fn set_scheduler(&self, scheduler: Scheduler) {
        self.shared.lock().set_scheduler(scheduler);
    }

    /// The scheduler new allocations use.
    pub fn scheduler(&self) -> Scheduler {
        self.shared.lock().scheduler
    }

    /// `max(1, max_concurrency / (live allocations + 1))`, [`UNLIMITED`] when unlimited.
    pub fn fair_share(&self) -> u64 {
        self.shared.lock().fair_share()
    }

    /// Request between `min` and `max` slots over the allocation's life.
    ///
    /// `min` is granted at once (counting against the budget under round
    /// robin, non-competing under the fair schedulers); then free capacity is
    /// granted eagerly towards `max`, and the allocation waits for the rest.
    ///
    /// Errors: [`SlotsError::MinAboveMax`]; [`SlotsError::WorkloadRequired`]
    /// when the control has a workload tree (use
    /// [`ConcurrencyControl::allocate_in`]).
    pub fn allocate(&self, min: u64, max: u64) -> Result<Allocation, SlotsError> {
        self.allocate_at(min, max, None)
    }

    /// As [`ConcurrencyControl::allocate`], in the leaf workload named
    /// `workload` of the control's tree: its slots count against
    /// `max_concurrent_threads` of that workload and of every ancestor, and
    /// the tree decides which workload's waiter a free slot goes to (see the
    /// `workloads` module docs).
    ///
    /// Errors: [`SlotsError::NoWorkloadTree`] without a tree,
    /// [`SlotsError::UnknownWorkload`], [`SlotsError::WorkloadNotALeaf`],
    /// [`SlotsError::MinAboveMax`].
    pub fn allocate_in(
        &self,
        workload: &str,
        min: u64,
        max: u64,
    ) -> Result<Allocation, SlotsError> {
        self.allocate_at(min, max, Some(workload))
    }

    fn allocate_at(
        &self,
        min: u64,
        max: u64,
        workload: Option<&str>,
    ) -> Result<Allocation, SlotsError> {
        let (id, alloc) = self.shared.lock().allocate(min, max, workload)?;
        Ok(Allocation {
            shared: self.shared.clone(),
            id,
            alloc,
            tenant: None,
        })
    }

    /// A new, unlimited budget (as [`ConcurrencyControl::new`]) that
    /// schedules by the workload tree `tree` from the start.
    pub fn with_workloads(tree: &WorkloadTree) -> Self {
        let cc = Self::new();
        cc.set_workloads(tree)
            .expect("a control without allocations accepts any tree");
        cc
    }

    /// Schedule by `tree` from now on (a first tree, or a live change).
    /// Workloads are carried by name with their waiters, holdings and
    /// borrows; waiters that the new limits, priorities or weights let go
    /// are granted at once; a lowered limit takes nothing back.
    ///
    /// Errors (nothing changes): [`SlotsError::WorkloadBusy`] naming a
    /// workload that would be removed or given children while it has
    /// allocations, counted or parked slots; [`SlotsError::WorkloadMoved`]
    /// naming a workload given another parent; [`SlotsError::Unclassified`]
    /// for a first tree while allocations made without one live.
    pub fn set_workloads(&self, tree: &WorkloadTree) -> Result<(), SlotsError> {
        self.shared.lock().set_workloads(tree)
    }

    /// Every workload's numbers, parents first (empty without a tree).
    pub fn workloads(&self) -> Vec<WorkloadSlots> {
        self.shared.lock().workloads()
    }

    /// A snapshot of the counters and gauges.
    pub fn counters(&self) -> SlotsCounters {
        let st = self.shared.lock();
        st.snapshot(
            self.shared.slots_acquired.load(Ordering::Relaxed),
            self.shared.slots_acquired_nc.load(Ordering::Relaxed),
        )
    }
}

/// The common interface of [`Allocation`] and [`GrantedAllocation`]
/// (ClickHouse's `ISlotAllocation`).
pub trait SlotAllocation: Send + Sync {
    /// Take one already granted slot, if any. Never blocks.
    fn try_acquire(&self) -> Option<AcquiredSlot>;
    /// Take one granted slot, waiting until one is granted.
    fn acquire(&self) -> Result<AcquiredSlot, SlotsError>;
    /// Change the max (see [`Allocation::set_max`]).
    fn set_max(&self, new_max: u64) -> Result<(), SlotsError>;
    /// Return granted-unacquired slots, stop requesting, wake waiters.
    fn free(&self);
    /// Whether the allocation is in a scheduler's waiter list.
    fn is_requesting(&self) -> bool;
}

/// A request for slots from a [`ConcurrencyControl`] (one query's slots).
///
/// Dropping it frees it: granted-but-unacquired slots return to the budget.
/// Acquired slots stay valid and may outlive it.
pub struct Allocation {
    shared: Arc<ControlShared>,
    id: u32,
    alloc: Arc<AllocShared>,
    tenant: Option<Tenant>,
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocation")
            .field("id", &self.id)
            .field("granted", &self.granted())
            .finish_non_exhaustive()
    }
}

impl Allocation {
    /// Charge the IO of threads holding this allocation's slots to `tenant`:
    /// while one of its slots is a thread's current lease
    /// ([`AcquiredSlot::make_current`]), every throttler the thread waits on
    /// shares its rate fairly between this tenant and the others (see
    /// [`slotring_throttle::Tenant`]). Slots acquired before keep what they had.
    pub fn with_tenant(mut self, tenant: Tenant) -> Self {
        self.tenant = Some(tenant);
        self
    }

    /// The workload it entered ([`ConcurrencyControl::allocate_in`]), if any.
    pub fn workload(&self) -> Option<&str> {
        self.alloc.workload.as_ref().map(|w| w.name.as_str())
    }

    /// The tenant this allocation's slots carry, if any.
    pub fn tenant(&self) -> Option<&Tenant> {
        self.tenant.as_ref()
    }

    /// Take one granted slot if available (non-competing ones first). Lock-free.
    pub fn try_acquire(&self) -> Option<AcquiredSlot> {
        let competing = if take_one(&self.alloc.noncompeting) {
            self.shared
                .slots_acquired_nc
                .fetch_add(1, Ordering::Relaxed);
            false
        } else if take_one(&self.alloc.granted) {
            self.shared.slots_acquired.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            return None;
        };
        let slot_id = self.alloc.next_slot_id.fetch_add(1, Ordering::Relaxed);
        let alloc = competing.then(|| self.alloc.clone());
        let yielder = competing.then(|| Yielder {
            shared: self.shared.clone(),
            alloc: self.alloc.clone(),
        });
        let mut state = SlotState::new(Some(self.shared.clone()), alloc, competing);
        state.tenant = self.tenant.clone();
        Some(AcquiredSlot::new(slot_id, state, yielder))
    }

    /// Take one granted slot, blocking until one is granted.
    ///
    /// Errors: [`SlotsError::Freed`] if the allocation is (or gets) freed;
    /// [`SlotsError::Exhausted`] if nothing is granted and it is not
    /// requesting more (it would wait forever). A blocked call that becomes
    /// impossible is woken at once: by a `set_max` shrink that ends the
    /// request, or by the allocation's last grant going to another blocked
    /// caller.
    pub fn acquire(&self) -> Result<AcquiredSlot, SlotsError> {
        self.acquire_inner(None)
    }

    /// As [`Allocation::acquire`], giving up with [`SlotsError::Timeout`]
    /// after `timeout`. (Freeing the allocation from another thread cancels
    /// the wait with [`SlotsError::Freed`].)
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<AcquiredSlot, SlotsError> {
        self.acquire_inner(Some(timeout))
    }

    fn acquire_inner(&self, timeout: Option<Duration>) -> Result<AcquiredSlot, SlotsError> {
        if let Some(s) = self.try_acquire() {
            return Ok(s);
        }
        let start = Instant::now();
        let mut st = self.shared.lock();
        let mut blocked = false;
        let result = loop {
            if let Some(s) = self.try_acquire() {
                break Ok(s);
            }
            if st.is_freed(self.id) {
                break Err(SlotsError::Freed);
            }
            if !st.is_requesting(self.id) {
                let (allocated, max) = st.allocated_and_max(self.id);
                break Err(SlotsError::Exhausted { allocated, max });
            }
            let remaining = match timeout {
                None => None,
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(r) if !r.is_zero() => Some(r),
                    _ => break Err(SlotsError::Timeout { timeout: t }),
                },
            };
            blocked = true;
            st.blocked_delta(self.id, true);
            st = st.wait(&self.alloc.cv, remaining);
            st.blocked_delta(self.id, false);
        };
        if blocked {
            let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            st.stats.wait_us = st.stats.wait_us.saturating_add(us);
        }
        // The wake-up yield (the `workloads` module docs): after the mutex.
        let give_cpu = blocked && result.is_ok() && st.wake_yield(&self.alloc);
        drop(st);
        if give_cpu {
            std::thread::yield_now();
        }
        result
    }

    /// Change the max number of slots the allocation wants over its life.
    ///
    /// Growing past saturation re-enters the waiter list and schedules;
    /// shrinking stops future grants and reclaims nothing; `set_max(current)`
    /// is a no-op; growth beyond free capacity counts `slots_delayed` (and
    /// `queries_delayed` once per allocation). `set_max(0)` is an error.
    pub fn set_max(&self, new_max: u64) -> Result<(), SlotsError> {
        self.shared.lock().set_max(self.id, new_max)
    }

    /// Free the allocation now (dropping it does the same): granted but
    /// unacquired slots return to the budget, it leaves the waiter list, and
    /// blocked `acquire` calls return [`SlotsError::Freed`]. Idempotent.
    pub fn free(&self) {
        self.shared.lock().free(self.id);
    }

    /// Whether the allocation is in a scheduler's waiter list (for tests).
    pub fn is_requesting(&self) -> bool {
        self.shared.lock().is_requesting(self.id)
    }

    /// Slots granted but not yet acquired (competing and non-competing).
    pub fn granted(&self) -> u64 {
        self.alloc.granted.load(Ordering::Relaxed) + self.alloc.noncompeting.load(Ordering::Relaxed)
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.shared.lock().remove(self.id);
    }
}

impl SlotAllocation for Allocation {
    fn try_acquire(&self) -> Option<AcquiredSlot> {
        Allocation::try_acquire(self)
    }
    fn acquire(&self) -> Result<AcquiredSlot, SlotsError> {
        Allocation::acquire(self)
    }
    fn set_max(&self, new_max: u64) -> Result<(), SlotsError> {
        Allocation::set_max(self, new_max)
    }
    fn free(&self) {
        Allocation::free(self)
    }
    fn is_requesting(&self) -> bool {
        Allocation::is_requesting(self)
    }
}

/// The escape hatch (`use_concurrency_control = 0`): all slots are granted at
/// creation and nothing is counted anywhere.
#[derive(Debug)]
pub struct GrantedAllocation {
    total: u64,
    granted: AtomicU64,
}

impl GrantedAllocation {
    /// An allocation with `granted` slots, all granted now.
    pub fn new(granted: u64) -> Self {
        Self {
            total: granted,
            granted: AtomicU64::new(granted),
        }
    }

    /// Take one slot if any is left (`slot_id` 0, 1, 2, …).
    pub fn try_acquire(&self) -> Option<AcquiredSlot> {
        let mut v = self.granted.load(Ordering::Relaxed);
        while v > 0 {
            match self
                .granted
                .compare_exchange_weak(v, v - 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Some(AcquiredSlot::new(
                        self.total - v,
                        SlotState::new(None, None, false),
                        None,
                    ));
                }
                Err(now) => v = now,
            }
        }
        None
    }
}

impl SlotAllocation for GrantedAllocation {
    fn try_acquire(&self) -> Option<AcquiredSlot> {
        GrantedAllocation::try_acquire(self)
    }
    /// Never waits: all slots were granted at creation.
    fn acquire(&self) -> Result<AcquiredSlot, SlotsError> {
        self.try_acquire().ok_or(SlotsError::Exhausted {
            allocated: self.total,
            max: self.total,
        })
    }
    /// A no-op (the granted count is fixed), except that 0 is rejected.
    fn set_max(&self, new_max: u64) -> Result<(), SlotsError> {
        if new_max == 0 {
            Err(SlotsError::ZeroMax)
        } else {
            Ok(())
        }
    }
    fn free(&self) {
        self.granted.store(0, Ordering::Relaxed);
    }
    fn is_requesting(&self) -> bool {
        false
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use slotring_throttle::{WorkloadSpec, WorkloadTree};

    use super::ConcurrencyControl;

    /// Drop `slot` on another thread; whether it finished within `wait`.
    fn released_within(slot: crate::AcquiredSlot, wait: Duration) -> (bool, mpsc::Receiver<()>) {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            drop(slot);
            let _ = tx.send(());
        });
        (rx.recv_timeout(wait).is_ok(), rx)
    }

    #[test]
    fn a_release_with_nothing_queued_takes_no_lock_and_one_with_a_waiter_does() {
        let tree = WorkloadTree::new(vec![
            WorkloadSpec::new("all"),
            WorkloadSpec::new("x")
                .parent("all")
                .max_concurrent_threads(3),
        ])
        .unwrap();
        let cc = ConcurrencyControl::with_workloads(&tree);
        let a = cc.allocate_in("x", 0, 3).unwrap();
        let s0 = a.try_acquire().unwrap();
        let s1 = a.try_acquire().unwrap();
        let s2 = a.try_acquire().unwrap();
        let held = |cc: &ConcurrencyControl| cc.workloads()[1].held;
        {
            let _state = cc.shared.lock();
            let (done, _) = released_within(s1, Duration::from_secs(10));
            assert!(done, "nothing queues: released while the mutex is held");
        }
        assert_eq!((held(&cc), cc.counters().cur_concurrency), (2, 2));
        // A waiter: the release must take the mutex to hand its place on.
        let b = cc.allocate_in("x", 0, 2).unwrap();
        assert_eq!(b.granted(), 1, "x's freed place");
        let rx = {
            let _state = cc.shared.lock();
            let (done, rx) = released_within(s2, Duration::from_millis(50));
            assert!(!done, "a waiter: the release waits for the mutex");
            rx
        };
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(b.granted(), 2, "the released place went to the waiter");
        // The allocation's last slot changes the holders: under the mutex.
        drop(b);
        let rx = {
            let _state = cc.shared.lock();
            let (done, rx) = released_within(s0, Duration::from_millis(50));
            assert!(!done, "the last slot of its allocation");
            rx
        };
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(held(&cc), 0);
    }
}
