//! The CPU slot budget's statistics: [`SlotsCounters`] (re-exported as
//! `slotring_slots::SlotsCounters`) and the adaptive budget loop's
//! [`AdaptiveCounters`] (`slotring_slots::AdaptiveCounters`).

/// `max_concurrency` when the budget is unlimited (and `fair_share()` then).
pub const UNLIMITED: u64 = u64::MAX;

crate::counter_set! {
    /// A snapshot of a `slotring_slots::ConcurrencyControl`'s counters and gauges.
    ///
    /// Plain `u64`s in C layout (later exported through BPF maps). Counters are
    /// monotonic over the control's life; gauges are current values. The
    /// snapshot is taken under the state mutex, so every field except
    /// `slots_acquired` / `slots_acquired_non_competing` (lock-free, `Relaxed`)
    /// is one consistent cut.
    pub struct SlotsCounters, prefix = "slotring_slots" {
        /// ClickHouse's `ConcurrencyControlSlotsGranted`; as there, grants made
        /// by the schedulers are not counted here.
        counter slots_granted => "granted": "Slots granted unconditionally (the min of every allocation).",
        /// At `allocate` and on `set_max` growth (`ConcurrencyControlSlotsDelayed`).
        counter slots_delayed => "delayed": "Slots wanted but not available when asked for.",
        /// `ConcurrencyControlSlotsAcquired`.
        counter slots_acquired => "acquired": "Competing slots acquired.",
        /// `ConcurrencyControlSlotsAcquiredNonCompeting`.
        counter slots_acquired_non_competing => "acquired_non_competing": "Non-competing (min) slots acquired under the fair schedulers.",
        /// `ConcurrencyControlQueriesDelayed`.
        counter queries_delayed: "Allocations (queries) that hit the capacity wall, once each.",
        /// Microseconds blocked in `acquire` (`ConcurrencyControlWaitMicroseconds`).
        counter(us) wait_us => "wait_seconds": "Time spent blocked waiting for a slot.",
        /// Successful parks (`ConcurrencyControlParks`).
        counter parks => "lease_parks": "CPU lease parks.",
        /// `ConcurrencyControlUnparks`.
        counter unparks => "lease_unparks": "CPU lease unparks.",
        counter unpark_borrows => "lease_unpark_borrows": "Unparks that found the budget full and borrowed a slot.",
        /// [`UNLIMITED`] when unlimited.
        gauge(unlimited) max_concurrency => "max": "The CPU slot budget (0 = unlimited).",
        gauge cur_concurrency => "in_use": "Competing slots counted against the budget now (granted or acquired, not parked).",
        gauge allocations: "Live slot allocations (queries).",
        /// In some scheduler's waiter list.
        gauge waiters: "Allocations waiting for slots.",
        gauge parked => "leases_parked": "Acquired slots whose CPU lease is parked now.",
        /// The part of `cur_concurrency` above `max_concurrency` that unparks caused.
        gauge borrowed: "Slots borrowed by unparks and not yet repaid.",
        /// `min(max_concurrency, adaptive budget)`: what scheduling obeys now
        /// ([`UNLIMITED`] when both are unlimited).
        gauge(unlimited) budget_effective: "The effective CPU slot budget: max_concurrency or the adaptive budget below it (0 = unlimited).",
        /// Made by releases after `AcquiredSlot::should_yield` said yes.
        counter yields: "Slots released because should_yield asked their holder to (the budget shrank).",
        /// The integral over time of the blocked `acquire` calls: it grows
        /// while they wait (unlike `wait_us`, added when a wait ends), so the
        /// difference of two snapshots is the slot wait of that interval
        /// (the adaptive budget's waiter signal).
        counter(us) waiting_us => "waiting_seconds": "Time spent blocked waiting for a slot, accrued while waiting (waits still in progress included).",
    }
}

crate::counter_set! {
    /// The adaptive budget loop's state and the controller's inputs (kept by
    /// whoever runs the loop, e.g. `slotring_bpf::AdaptiveBudget`; plain
    /// numbers). The effective budget itself is
    /// [`SlotsCounters::budget_effective`] (`slotring_slots_budget_effective`).
    pub struct AdaptiveCounters, prefix = "slotring_slots_adaptive" {
        gauge adaptive => "enabled": "1 while the CPU slot budget is adaptive (probes live), 0 while static.",
        gauge(unlimited) budget: "The budget the controller chose last (0 = unlimited: static and unlimited).",
        /// In basis points (1/100 %).
        gauge runq_share_bp => "runq_share_basis_points": "Run-queue share of running leases in the last window, in 1/100 %.",
        counter(us) runq_us => "runq_seconds": "Run-queue time of running leases seen by the controller.",
        counter(us) on_cpu_us => "oncpu_seconds": "On-CPU time of running leases seen by the controller.",
        counter(us) slot_wait_us => "slot_wait_seconds": "Slot wait of blocked acquirers seen by the controller (the cost of a step down).",
        counter windows: "Windows the controller evaluated.",
        counter downs: "Windows that lowered the budget (or held it at the floor) for run-queue delay.",
        counter ups: "Windows that raised the budget by one slot.",
        counter probe_losses: "Times the kernel probes went away mid-run (the budget went static).",
    }
}

impl AdaptiveCounters {
    /// `runq / (runq + on-CPU)` over the loop's life, percent (0 when empty).
    pub fn runq_share_pct(&self) -> f64 {
        let t = self.runq_us as f64 + self.on_cpu_us as f64;
        if t > 0.0 {
            self.runq_us as f64 * 100.0 / t
        } else {
            0.0
        }
    }
}
