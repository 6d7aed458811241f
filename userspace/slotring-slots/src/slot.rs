//! The acquired slot: [`AcquiredSlot`] and its [`CurrentLease`] guard.
//!
//! An acquired slot is one thread's share of the budget (ClickHouse's
//! `IAcquiredSlot`) and a parkable CPU lease ([`SlotLease`]). Its accounting
//! lives in a `SlotState` (`control_shared.rs`); while the slot is the
//! thread's current lease that state sits on the thread's lease stack
//! (`lease.rs`) and the [`CurrentLease`] guard brings it back.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use slotring_throttle::notify_lease_state;

use crate::control_shared::{SlotState, Yielder};
use crate::lease::{SlotLease, install_lease_hook, push_current, take_current};

/// How often [`CurrentLease::checkpoint`] gives the CPU to other runnable
/// threads (`sched_yield`): once per millisecond of checkpoints.
///
/// Without the yield, a thread that wakes beside CPU-bound slot holders (a
/// short query beside scans) waits for the running holder's slice to end,
/// which the scheduler checks only at its next tick (4 ms at
/// `CONFIG_HZ=250`); with a yield every millisecond it runs within about
/// one interval, and a slot handed on at a quantum's end reaches its woken
/// thread on the yielding CPU sooner, so the CPUs idle less. A yield with
/// nothing else runnable returns at once (~1 µs: 0.1 % of the interval).
/// `cargo xtask bench adaptive`, workload (a), measures the short queries'
/// p99 with it (`static_short_p99_ms_cpu`, `adapt_short_p99_ms_cpu`).
pub const CPU_YIELD_INTERVAL: Duration = Duration::from_millis(1);

/// An acquired slot: held by one thread while it runs (ClickHouse's
/// `IAcquiredSlot`). Dropping it returns the slot to the global budget (not
/// to the allocation). It is also a CPU lease: see [`crate::SlotLease`] and
/// [`AcquiredSlot::make_current`].
#[must_use = "dropping an acquired slot releases it at once"]
pub struct AcquiredSlot {
    slot_id: u64,
    state: SlotState,
    /// Competing slots of an [`crate::Allocation`] only.
    yielder: Option<Yielder>,
}

impl fmt::Debug for AcquiredSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcquiredSlot")
            .field("slot_id", &self.slot_id)
            .field("competing", &self.state.competing)
            .field("parked", &self.state.parked)
            .finish()
    }
}

impl AcquiredSlot {
    /// A slot numbered `slot_id` whose accounting is `state`.
    pub(crate) fn new(slot_id: u64, state: SlotState, yielder: Option<Yielder>) -> Self {
        Self {
            slot_id,
            state,
            yielder,
        }
    }

    /// The cooperative checkpoint (ClickHouse's CPU-lease preemption,
    /// cooperatively): true while the budget is exceeded (it shrank below
    /// the competing slots in use, borrows aside) and this slot's
    /// allocation holds more than its fair share `max(1, budget / holding
    /// allocations)`, beyond the yields it already promised. A `true` is a
    /// promise: release this slot (drop it) at once and wait for a grant
    /// like any other (`Allocation::acquire`); the allocation asks for the
    /// slot again. Exactly as many holders are told to yield as the budget
    /// is exceeded by. With a workload tree it is also true, for one holder
    /// at a time, while a waiting allocation's workload outranks this
    /// slot's by priority (the `workloads` module's preemption).
    ///
    /// Cheap: one `Relaxed` atomic load while nothing needs to yield; the
    /// state mutex only while yields are wanted. Always false for
    /// non-competing and [`crate::GrantedAllocation`] slots (releasing them
    /// frees no budget) and for a parked slot.
    ///
    /// Memory ordering: the load is a hint published after every change of
    /// the budget or of the slots in use, under the mutex; the decision
    /// and the promise are made under the mutex. A stale zero only delays
    /// the yield to a later checkpoint (the store is visible eventually);
    /// a stale non-zero costs one lock that answers no.
    pub fn should_yield(&self) -> bool {
        match &self.yielder {
            Some(y) if !self.state.parked => y.should_yield(),
            _ => false,
        }
    }

    /// Unique within its allocation: 0, 1, 2, … in grant order (a query's
    /// thread number).
    pub fn slot_id(&self) -> u64 {
        self.slot_id
    }

    /// Whether the slot counts against the budget (false for fair schedulers'
    /// `min` slots and for [`crate::GrantedAllocation`] slots).
    pub fn is_competing(&self) -> bool {
        self.state.competing
    }

    /// Whether the slot is parked.
    pub fn is_parked(&self) -> bool {
        self.state.parked
    }

    /// Make this slot the calling thread's current CPU lease until the guard
    /// drops. Reports `Running` (or `Parked` if the slot is parked) to the
    /// lease observer — for every held slot, including non-competing and
    /// [`crate::GrantedAllocation`] ones: the thread is a slot-holding worker; the guard's drop reports `NotHolding` (or the state of
    /// the previous current lease). While current, park it through
    /// [`crate::CpuLeaseParkGuard`] (or any blocking `slotring-throttle` wait).
    pub fn make_current(&mut self) -> CurrentLease<'_> {
        install_lease_hook();
        let state = std::mem::take(&mut self.state);
        let competing = state.competing;
        let ls = state.lease_state();
        let (index, token) = push_current(state);
        // Keep the slot's `competing` flag readable while the state is away.
        self.state.competing = competing;
        notify_lease_state(ls);
        CurrentLease {
            slot: self,
            index,
            token,
            cpu_due: Cell::new(Instant::now() + CPU_YIELD_INTERVAL),
            last_checkpoint: Cell::new(Instant::now()),
            cpu_yields: Cell::new(0),
            _not_send: PhantomData,
        }
    }
}

impl SlotLease for AcquiredSlot {
    fn park(&mut self) -> bool {
        self.state.park()
    }
    fn unpark(&mut self) {
        self.state.unpark()
    }
}

/// While alive, its slot is the thread's current CPU lease (unless a later
/// guard made another slot current). `!Send`.
///
/// Guards may drop in any order: each takes back only its own slot's state.
/// Dropping the guard of the lease that is current makes the previous live
/// one current again; dropping any other guard changes nothing else.
#[must_use = "the slot stops being the current lease when this guard drops"]
#[derive(Debug)]
pub struct CurrentLease<'a> {
    slot: &'a mut AcquiredSlot,
    /// Its entry's position on the thread's lease stack: stable while the
    /// guard lives (only tombstones and the top entry are ever removed).
    index: usize,
    token: u64,
    /// When [`CurrentLease::checkpoint`] next gives the CPU away.
    cpu_due: Cell<Instant>,
    /// When it was last called.
    last_checkpoint: Cell<Instant>,
    /// How often it did.
    cpu_yields: Cell<u64>,
    _not_send: PhantomData<*const ()>,
}

impl CurrentLease<'_> {
    /// The current slot's id.
    pub fn slot_id(&self) -> u64 {
        self.slot.slot_id()
    }

    /// [`AcquiredSlot::should_yield`] of the current slot. To yield, drop
    /// this guard, then the slot.
    pub fn should_yield(&self) -> bool {
        self.slot.should_yield()
    }

    /// The checkpoint of a CPU-bound holder, to call between short units of
    /// work: [`Self::should_yield`] (release the slot when true), and, at
    /// most once per [`CPU_YIELD_INTERVAL`], a yield of the CPU
    /// (`sched_yield`) so that a thread waiting in this CPU's run queue — a
    /// short query that just woke — runs now instead of at the end of this
    /// thread's slice. The slot stays held; the kernel's fair share is
    /// unchanged (EEVDF moves the yielder's deadline back by one slice).
    ///
    /// The interval counts only time spent between checkpoints that follow
    /// each other within the interval: a gap longer than that (an IO wait,
    /// a parked lease, a long unit) restarts it, so an IO-bound holder,
    /// which leaves the CPU by itself, never yields here. (Yielding after
    /// every read made its own wait in the run queue the adaptive loop's
    /// input: `slotring run` fell to a budget of 1.2.)
    pub fn checkpoint(&self) -> bool {
        let now = Instant::now();
        let gap = now.saturating_duration_since(self.last_checkpoint.replace(now));
        if gap > CPU_YIELD_INTERVAL {
            self.cpu_due.set(now + CPU_YIELD_INTERVAL);
        } else if now >= self.cpu_due.get() {
            self.cpu_due.set(now + CPU_YIELD_INTERVAL);
            self.cpu_yields.set(self.cpu_yields.get() + 1);
            std::thread::yield_now();
        }
        self.should_yield()
    }

    /// How many times [`Self::checkpoint`] gave the CPU away under this
    /// guard.
    pub fn cpu_yields(&self) -> u64 {
        self.cpu_yields.get()
    }
}

impl Drop for CurrentLease<'_> {
    fn drop(&mut self) {
        // If the thread's locals are already gone, the state was released
        // with them and the slot keeps its empty one.
        let (mine, now) = take_current(self.index, self.token);
        if let Some(mine) = mine {
            self.slot.state = mine;
        }
        if let Some(now) = now {
            notify_lease_state(now);
        }
    }
}
