//! The workload tree's one error type: every variant names the workload and
//! the value that failed. Being queued is not an error: it is the `Pending`
//! a request's poll returns.

/// What can go wrong building, changing or using a workload tree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    /// A workload without a name.
    #[error("a workload has an empty name")]
    EmptyName,
    /// Two workloads of one name.
    #[error("workload `{node}` is defined twice")]
    Duplicate {
        /// The name.
        node: String,
    },
    /// A parent that no workload is named after.
    #[error("workload `{node}`: parent `{parent}` is not a workload")]
    UnknownParent {
        /// The child.
        node: String,
        /// The missing parent.
        parent: String,
    },
    /// No workload without a parent (every tree has exactly one root).
    #[error("no root: every workload has a parent")]
    NoRoot,
    /// More than one workload without a parent.
    #[error("workloads `{first}` and `{second}` both have no parent (a tree has one root)")]
    MultipleRoots {
        /// The first root.
        first: String,
        /// Another root.
        second: String,
    },
    /// A chain of parents that comes back to where it started.
    #[error("workload `{node}` is its own ancestor: {}", cycle.join(" -> "))]
    Cycle {
        /// A workload on the cycle.
        node: String,
        /// The chain of parents, starting and ending at `node`.
        cycle: Vec<String>,
    },
    /// A weight of 0 or above [`super::MAX_WEIGHT`].
    #[error("workload `{node}`: weight {weight} is outside 1..={max}")]
    Weight {
        /// The workload.
        node: String,
        /// The rejected weight.
        weight: u32,
        /// The largest accepted weight.
        max: u32,
    },
    /// A priority outside [`super::PRIORITIES`].
    #[error("workload `{node}`: priority {priority} is outside {min}..={max}")]
    Priority {
        /// The workload.
        node: String,
        /// The rejected priority.
        priority: i64,
        /// The smallest accepted priority.
        min: i64,
        /// The largest accepted priority.
        max: i64,
    },
    /// A cap or limit of 0 (leave the setting out for "no limit").
    #[error("workload `{node}`: {setting} = 0 (leave it out for no limit)")]
    ZeroCap {
        /// The workload.
        node: String,
        /// The setting (ClickHouse's name).
        setting: &'static str,
    },
    /// A rate above the largest one the exact bucket represents.
    #[error("workload `{node}`: {setting} = {value} exceeds the largest supported {max}")]
    CapTooLarge {
        /// The workload.
        node: String,
        /// The setting.
        setting: &'static str,
        /// The rejected value.
        value: u64,
        /// The largest accepted value.
        max: u64,
    },
    /// `max_burst_bytes` without `max_bytes_per_second` (a burst of nothing).
    #[error("workload `{node}`: max_burst_bytes = {burst} without max_bytes_per_second")]
    BurstWithoutRate {
        /// The workload.
        node: String,
        /// The burst.
        burst: u64,
    },
    /// A tree deeper than [`super::MAX_DEPTH`] levels.
    #[error("workload `{node}` is {depth} levels deep (at most {max})")]
    TooDeep {
        /// The workload.
        node: String,
        /// Its depth (the root is level 1).
        depth: usize,
        /// The deepest accepted.
        max: usize,
    },
    /// A catch-up bound above [`crate::MAX_TAU`].
    #[error("catch-up bound tau of {tau_ns} ns exceeds the largest supported {max_ns} ns")]
    Tau {
        /// The rejected bound, ns.
        tau_ns: u128,
        /// The largest accepted bound, ns.
        max_ns: u128,
    },
    /// A name that is not a workload of this scheduler.
    #[error("no workload `{node}`")]
    Unknown {
        /// The name asked for.
        node: String,
    },
    /// A request to a workload that a live change removed.
    #[error("workload `{node}` was removed")]
    Removed {
        /// The workload.
        node: String,
    },
    /// A request to a workload that has children (requests enter leaves).
    #[error("workload `{node}` has children: requests enter leaf workloads only")]
    NotALeaf {
        /// The workload.
        node: String,
    },
    /// A live change that would drop queued requests: removing a workload,
    /// or giving children to a leaf, while requests queue there.
    #[error("workload `{node}` still has {queued} queued requests: {change} refused")]
    Busy {
        /// The workload.
        node: String,
        /// Its queued requests.
        queued: u64,
        /// What the change tried.
        change: &'static str,
    },
    /// A live change of a workload's parent (remove it, then add it under
    /// the new parent).
    #[error("workload `{node}`: a live change cannot move it from `{from}` to `{to}`")]
    Reparent {
        /// The workload.
        node: String,
        /// Its parent now.
        from: String,
        /// The parent asked for.
        to: String,
    },
    /// A charge whose debt would leave a cap's exact range (2¹⁰⁰
    /// nano-tokens). Nothing was charged.
    #[error("workload `{node}`: a charge of {cost} would leave the cap's exact range")]
    Debt {
        /// The workload whose cap refused.
        node: String,
        /// The request's cost.
        cost: u64,
    },
}
