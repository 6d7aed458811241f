//! [`ControlShared`], the handle on a control's scheduler state, and a held
//! slot's claim on it.
//!
//! [`ControlShared`] is what a control, its allocations and their slots all point
//! to: the mutex-protected [`SchedulerState`] and the statistics that the lock-free
//! `try_acquire` bumps. [`SlotState`] is the accounting half of an acquired
//! slot: whether it counts against the budget and whether it is parked; it
//! parks and unparks through the scheduler state and releases the slot when dropped.
//! Both sit below the lease machinery (`lease.rs`) and the slot type
//! (`slot.rs`), which only move a `SlotState` around.

use std::time::Instant;

use slotring_throttle::LeaseState;

use crate::scheduler_state::{
    AllocShared, Gauges, LockFreeRelease, SchedulerState, release_lock_free,
};
use crate::sync::{Arc, AtomicU64, Condvar, Mutex, MutexGuard, Ordering, lock};

/// State shared by a control, its allocations and their slots.
#[derive(Debug)]
pub(crate) struct ControlShared {
    pub(crate) state: Mutex<SchedulerState>,
    /// Statistics bumped by lock-free `try_acquire` (`Relaxed`: independent counts).
    pub(crate) slots_acquired: AtomicU64,
    pub(crate) slots_acquired_nc: AtomicU64,
    /// The scheduler state's `yield_needed` (the same atomic): yields still wanted.
    /// `should_yield`'s fast path is one `Relaxed` load of it (see
    /// `AcquiredSlot::should_yield` for why `Relaxed` suffices).
    pub(crate) yield_needed: Arc<AtomicU64>,
    /// The scheduler state's `cur` and `waiters` (the same atomics), for
    /// the lock-free release.
    pub(crate) gauges: Arc<Gauges>,
}

impl ControlShared {
    pub(crate) fn lock(&self) -> StateGuard<'_> {
        StateGuard(Some(lock(&self.state)))
    }
}

/// The scheduler state's mutex held: on drop it releases the mutex, then
/// makes the wake-ups the critical section owed (see the
/// `scheduler_state` module's "Wake-ups").
pub(crate) struct StateGuard<'a>(Option<MutexGuard<'a, SchedulerState>>);

impl StateGuard<'_> {
    /// Make the owed wake-ups (the mutex is still held: a waiter that is
    /// about to block itself makes them first).
    fn wake_now(&mut self) {
        if let Some(g) = self.0.as_mut() {
            wake(std::mem::take(&mut g.wakes));
        }
    }

    /// Block on `cv` (the allocation's), releasing the mutex while
    /// waiting, up to `timeout` if given.
    pub(crate) fn wait(mut self, cv: &Condvar, timeout: Option<std::time::Duration>) -> Self {
        self.wake_now();
        let g = self.0.take().expect("a held guard");
        let g = match timeout {
            None => cv.wait(g).unwrap_or_else(|p| p.into_inner()),
            Some(t) => match cv.wait_timeout(g, t) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            },
        };
        StateGuard(Some(g))
    }
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = SchedulerState;
    fn deref(&self) -> &SchedulerState {
        self.0.as_ref().expect("a held guard")
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut SchedulerState {
        self.0.as_mut().expect("a held guard")
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let Some(mut g) = self.0.take() else { return };
        let wakes = std::mem::take(&mut g.wakes);
        drop(g);
        wake(wakes);
    }
}

/// Make `wakes`: all of an allocation's blocked acquirers, or one.
fn wake(wakes: Vec<(Arc<AllocShared>, bool)>) {
    for (a, all) in wakes {
        if all {
            a.cv.notify_all();
        } else {
            a.cv.notify_one();
        }
    }
}

/// What a competing slot needs to answer `should_yield`: the control (for
/// the fast-path hint and the mutex) and its allocation (its holdings). Kept
/// by the slot itself, not in its `SlotState`, so it stays at hand while the
/// state sits on the thread's lease stack.
#[derive(Debug)]
pub(crate) struct Yielder {
    pub(crate) shared: Arc<ControlShared>,
    pub(crate) alloc: Arc<AllocShared>,
}

impl Yielder {
    /// One `Relaxed` load; the mutex only while yields are wanted.
    pub(crate) fn should_yield(&self) -> bool {
        if self.shared.yield_needed.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.shared.lock().should_yield(&self.alloc)
    }
}

/// The accounting half of an acquired slot.
#[derive(Debug, Default)]
pub(crate) struct SlotState {
    pub(crate) shared: Option<Arc<ControlShared>>,
    /// The allocation it was granted to (competing slots): its holdings
    /// and owed yields are kept up to date by park, unpark and release.
    pub(crate) alloc: Option<Arc<AllocShared>>,
    pub(crate) competing: bool,
    pub(crate) parked: bool,
    /// The allocation's tenant: throttlers charge a thread's IO to it while
    /// this slot is the thread's current lease.
    pub(crate) tenant: Option<slotring_throttle::Tenant>,
    /// Since when it counts in its workload's slot time (a competing,
    /// unparked slot of an allocation in a workload tree).
    counting_since: Option<Instant>,
}

impl SlotState {
    pub(crate) fn new(
        shared: Option<Arc<ControlShared>>,
        alloc: Option<Arc<AllocShared>>,
        competing: bool,
    ) -> Self {
        let mut s = Self {
            shared,
            alloc,
            competing,
            parked: false,
            tenant: None,
            counting_since: None,
        };
        s.start_counting();
        s
    }

    /// Count slot time from now, if the slot counts in a workload (a
    /// competing slot of an allocation in a workload tree).
    fn start_counting(&mut self) {
        if self.competing && self.alloc.as_ref().is_some_and(|a| a.workload.is_some()) {
            self.counting_since = Some(Instant::now());
        }
    }

    /// Add the time since `counting_since` to its workload's slot time
    /// (a statistic: `Relaxed`), and stop counting.
    fn stop_counting(&mut self) {
        let (Some(since), Some(w)) = (
            self.counting_since.take(),
            self.alloc.as_ref().and_then(|a| a.workload.as_ref()),
        ) else {
            return;
        };
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        w.slot_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub(crate) fn park(&mut self) -> bool {
        let Some(shared) = &self.shared else {
            return false;
        };
        if self.parked {
            return false;
        }
        shared.lock().park(self.alloc.as_ref(), self.competing);
        self.parked = true;
        self.stop_counting();
        true
    }

    pub(crate) fn unpark(&mut self) {
        let Some(shared) = &self.shared else { return };
        if !self.parked {
            return;
        }
        shared.lock().unpark(self.alloc.as_ref(), self.competing);
        self.parked = false;
        self.start_counting();
    }

    pub(crate) fn lease_state(&self) -> LeaseState {
        if self.parked {
            LeaseState::Parked
        } else {
            LeaseState::Running
        }
    }
}

impl Drop for SlotState {
    /// Release the slot: lock-free when nothing queues (see the
    /// `scheduler_state::lock_free` module), under the mutex otherwise.
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        self.stop_counting();
        if let (true, false, Some(a)) = (self.competing, self.parked, &self.alloc) {
            match release_lock_free(&shared.gauges, &shared.yield_needed, a) {
                LockFreeRelease::Done => return,
                LockFreeRelease::Schedule => {
                    shared.lock().released_lock_free();
                    return;
                }
                LockFreeRelease::Refused => {}
            }
        }
        shared
            .lock()
            .release(self.alloc.as_ref(), self.competing, self.parked);
    }
}
