//! The one error type of this crate. Waiting for a slot is not an error: it
//! is `None` from `try_acquire` or a blocking `acquire`.

use std::time::Duration;

/// What can go wrong when configuring the budget or using an allocation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotsError {
    /// A scheduler name other than `round_robin`, `fair_round_robin`, `max_min_fair`.
    #[error(
        "unknown CPU slot scheduler `{value}` (expected round_robin, fair_round_robin or max_min_fair)"
    )]
    UnknownScheduler {
        /// The rejected name.
        value: String,
    },
    /// `allocate(min, max)` with `min > max`.
    #[error("invalid allocation requirements: min {min} > max {max}")]
    MinAboveMax {
        /// The requested minimum.
        min: u64,
        /// The requested maximum.
        max: u64,
    },
    /// `set_max(0)`: a request for zero slots has no meaning (drop the allocation).
    #[error("set_max(0): an allocation's max must be at least 1")]
    ZeroMax,
    /// The allocation was freed (by `free()` or from another thread while waiting).
    #[error("the allocation was freed")]
    Freed,
    /// `acquire` on an allocation with nothing granted that is not requesting
    /// more: it would wait forever. Raise its max with `set_max` first.
    #[error(
        "allocation has no granted slot and is not requesting (allocated {allocated} of {max})"
    )]
    Exhausted {
        /// Slots granted to the allocation over its life (counting ones).
        allocated: u64,
        /// Its current max.
        max: u64,
    },
    /// `acquire_timeout` gave up.
    #[error("no slot was granted within {timeout:?}")]
    Timeout {
        /// The timeout that expired.
        timeout: Duration,
    },
    /// An adaptive-budget target outside `1..=99` percent (0% would never
    /// allow any wait, 100% never react).
    #[error("adaptive budget target {value}% is out of range (expected 1..=99)")]
    AdaptiveTarget {
        /// The rejected target, in percent.
        value: u32,
    },
    /// An adaptive-budget floor of 0: the budget is never 0.
    #[error("adaptive budget floor 0: the floor must be at least 1")]
    AdaptiveZeroFloor,
    /// An adaptive-budget floor above the ceiling (`max_concurrency`).
    #[error("adaptive budget floor {floor} is above the ceiling {ceiling} (max_concurrency)")]
    AdaptiveFloorAboveCeiling {
        /// The rejected floor.
        floor: u64,
        /// The ceiling.
        ceiling: u64,
    },
    /// A probe hold of 0 windows, or a maximum hold below it.
    #[error("adaptive budget hold {hold} windows (max {max_hold}): need 1 <= hold <= max")]
    AdaptiveHold {
        /// The rejected hold.
        hold: u32,
        /// The rejected maximum hold.
        max_hold: u32,
    },
    /// `allocate_in` with a name that is not a workload of the tree.
    #[error("no workload `{workload}` in the slot tree")]
    UnknownWorkload {
        /// The name asked for.
        workload: String,
    },
    /// `allocate_in` with a workload that has children (allocations enter
    /// leaves).
    #[error("workload `{workload}` has children: allocations enter leaf workloads only")]
    WorkloadNotALeaf {
        /// The workload.
        workload: String,
    },
    /// `allocate_in` on a control without a workload tree.
    #[error("allocate_in(`{workload}`): this control has no workload tree (set_workloads first)")]
    NoWorkloadTree {
        /// The workload asked for.
        workload: String,
    },
    /// `allocate` on a control with a workload tree: every allocation
    /// enters a workload.
    #[error("this control schedules by a workload tree: allocate_in(workload, min, max)")]
    WorkloadRequired,
    /// A tree change that would strand allocations or slots: removing a
    /// workload, or giving children to a leaf, that still has some.
    #[error(
        "workload `{workload}` still has {allocations} allocations and {slots} counted slots: {change} refused"
    )]
    WorkloadBusy {
        /// The workload.
        workload: String,
        /// Its live allocations.
        allocations: u64,
        /// The competing slots counted at it.
        slots: u64,
        /// What the change tried.
        change: &'static str,
    },
    /// A tree change that moves a workload to another parent (remove it,
    /// then add it under the new one): its slots' paths are fixed.
    #[error("workload `{workload}`: a live change cannot move it from `{from}` to `{to}`")]
    WorkloadMoved {
        /// The workload.
        workload: String,
        /// Its parent now (`(root)` for the root).
        from: String,
        /// The parent asked for.
        to: String,
    },
    /// A first workload tree while allocations made without one live (they
    /// belong to no workload).
    #[error("{allocations} allocations without a workload are live: a workload tree refused")]
    Unclassified {
        /// The live allocations.
        allocations: u64,
    },
    /// An adaptive-budget CPU count of 0 (the CPUs the process may use are
    /// at least 1).
    #[error("adaptive budget cpus 0: the process has at least 1 CPU")]
    AdaptiveZeroCpus,
}

#[cfg(test)]
mod tests {
    use std::error::Error;
    use std::time::Duration;

    use super::SlotsError;

    #[test]
    fn every_error_is_a_leaf_that_names_its_value() {
        // No error of this crate has a cause: each is the whole story, so a
        // printed chain shows it once and the message must carry the value.
        let cases = [
            (
                SlotsError::UnknownScheduler {
                    value: "fifo".into(),
                },
                "`fifo`",
            ),
            (SlotsError::MinAboveMax { min: 5, max: 3 }, "min 5 > max 3"),
            (SlotsError::ZeroMax, "set_max(0)"),
            (SlotsError::Freed, "freed"),
            (
                SlotsError::Exhausted {
                    allocated: 2,
                    max: 2,
                },
                "allocated 2 of 2",
            ),
            (
                SlotsError::UnknownWorkload {
                    workload: "etl".into(),
                },
                "`etl`",
            ),
            (
                SlotsError::WorkloadNotALeaf {
                    workload: "all".into(),
                },
                "`all`",
            ),
            (
                SlotsError::NoWorkloadTree {
                    workload: "etl".into(),
                },
                "`etl`",
            ),
            (
                SlotsError::WorkloadBusy {
                    workload: "etl".into(),
                    allocations: 2,
                    slots: 3,
                    change: "removing it",
                },
                "`etl` still has 2 allocations and 3 counted slots: removing it",
            ),
            (SlotsError::Unclassified { allocations: 4 }, "4 allocations"),
            (
                SlotsError::WorkloadMoved {
                    workload: "etl".into(),
                    from: "batch".into(),
                    to: "user".into(),
                },
                "`etl`: a live change cannot move it from `batch` to `user`",
            ),
            (
                SlotsError::Timeout {
                    timeout: Duration::from_millis(250),
                },
                "250ms",
            ),
        ];
        for (err, value) in cases {
            assert!(err.source().is_none(), "{err:?}");
            assert!(err.to_string().contains(value), "{err} names {value}");
        }
    }
}
