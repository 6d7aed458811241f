//! The counters snapshot, defined by one field list
//! ([`slotring_counters::counter_set!`]).

/// `max_concurrency` when the budget is unlimited (and `fair_share()` then).
pub const UNLIMITED: u64 = u64::MAX;

slotring_counters::counter_set! {
    /// A snapshot of a [`crate::ConcurrencyControl`]'s counters and gauges.
    ///
    /// Plain `u64`s in C layout (later exported through BPF maps). Counters are
    /// monotonic over the control's life; gauges are current values. The
    /// snapshot is taken under the core mutex, so every field except
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
    }
}
