//! The counters snapshot.

/// `max_concurrency` when the budget is unlimited (and `fair_share()` then).
pub const UNLIMITED: u64 = u64::MAX;

/// A snapshot of a [`crate::ConcurrencyControl`]'s counters and gauges.
///
/// Plain `u64`s in C layout (later exported through BPF maps). Counters are
/// monotonic over the control's life; gauges are current values. The
/// snapshot is taken under the core mutex, so every field except
/// `slots_acquired` / `slots_acquired_non_competing` (lock-free, `Relaxed`)
/// is one consistent cut.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SlotsCounters {
    /// Slots granted unconditionally: the `min` of every `allocate`
    /// (ClickHouse's `ConcurrencyControlSlotsGranted`; as there, grants made
    /// by the schedulers are not counted here).
    pub slots_granted: u64,
    /// Slots wanted but not available when asked for, at `allocate` and on
    /// `set_max` growth (`ConcurrencyControlSlotsDelayed`).
    pub slots_delayed: u64,
    /// Competing slots acquired (`ConcurrencyControlSlotsAcquired`).
    pub slots_acquired: u64,
    /// Non-competing (`min`) slots acquired under the fair schedulers
    /// (`ConcurrencyControlSlotsAcquiredNonCompeting`).
    pub slots_acquired_non_competing: u64,
    /// Allocations that hit the capacity wall, at most once each
    /// (`ConcurrencyControlQueriesDelayed`).
    pub queries_delayed: u64,
    /// Microseconds spent blocked in `acquire` (`ConcurrencyControlWaitMicroseconds`).
    pub wait_us: u64,
    /// Successful lease parks (`ConcurrencyControlParks`).
    pub parks: u64,
    /// Unparks (`ConcurrencyControlUnparks`).
    pub unparks: u64,
    /// Unparks that found the budget full and borrowed a slot.
    pub unpark_borrows: u64,
    /// Gauge: the budget ([`UNLIMITED`] when unlimited).
    pub max_concurrency: u64,
    /// Gauge: competing slots currently counted (granted or acquired, not parked).
    pub cur_concurrency: u64,
    /// Gauge: live allocations.
    pub allocations: u64,
    /// Gauge: allocations in some scheduler's waiter list.
    pub waiters: u64,
    /// Gauge: acquired slots currently parked.
    pub parked: u64,
    /// Gauge: borrowed slots not yet repaid (part of `cur_concurrency` above
    /// `max_concurrency` that unparks caused).
    pub borrowed: u64,
}
