//! Plain snapshots of every counter slotring keeps: what `/metrics`, the
//! pinned-map reader and the `slotring` command's report are built from.
//!
//! A [`Snapshot`] holds the `#[repr(C)]` counter structs of the other crates
//! (one [`ThrottleCounters`] per named throttler, [`SlotsCounters`],
//! [`UringCounters`]) and, when the kernel probes are attached, a
//! [`KernelSnapshot`]; with an adaptive budget loop, its
//! [`AdaptiveCounters`]; with workload trees, the disk's
//! [`WorkloadCounters`] and the CPU slots' [`WorkloadSlots`]. Snapshots are values: building metrics from them never
//! touches a live throttler, slot budget or ring.
//!
//! Each counter struct is described field by field through [`CounterSet`]
//! (name, metric name, help, counter or gauge, unit), so a report or an
//! exporter can walk every counter without naming one; counter structs sum
//! with `+` and `sum()` (one engine's counters over many engines, …).

pub use slotring_counters::{CounterSet, Field, Kind, Unit};
use slotring_slots::{AdaptiveCounters, SlotsCounters, WorkloadSlots};
use slotring_throttle::{ThrottleCounters, WorkloadCounters};
use slotring_uring::UringCounters;

/// Buckets of the kernel's exp2 histograms (`slotring_bpf::abi::HIST_SLOTS`).
pub const HIST_BUCKETS: usize = 40;

/// The segments of a parked episode, as the `segment` label names them:
/// on CPU before its first real sleep, between its sleeps, after its last
/// wake-up (the model is in `slotring_bpf`'s `verify` module).
pub const SEGMENTS: [&str; 3] = ["pre_sleep", "between_sleeps", "post_wake"];

/// One named throttler's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamedThrottler {
    /// The throttler's name (the `throttler` label).
    pub name: String,
    /// Its counters.
    pub counters: ThrottleCounters,
}

/// What the kernel probes measured, summed over the traced threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSnapshot {
    /// Threads registered with the probes (live or exited).
    pub threads: u64,
    /// Threads whose lease is parked right now.
    pub leases_parked: u64,
    /// Parks seen by the lease mirror.
    pub parks: u64,
    /// Wall ns with a lease parked (from the threads' lease clocks).
    pub parked_ns: u64,
    /// On-CPU ns while parked (exact, from the kernel's per-task counters).
    pub parked_oncpu_ns: u64,
    /// Run-queue ns while parked.
    pub parked_runq_ns: u64,
    /// On-CPU ns while holding a running (unparked) lease.
    pub running_oncpu_ns: u64,
    /// Context-switch events BPF never saw (time stays exact).
    pub missed_events: u64,
    /// Parked episodes that ended (one per park).
    pub episodes: u64,
    /// Of those, episodes over a bound of the kernel's per-episode rule.
    pub hot_episodes: u64,
    /// On-CPU ns per segment ([`SEGMENTS`]), summed over the episodes.
    pub segment_oncpu_ns: [u64; 3],
    /// Episodes hot in each segment.
    pub segment_hot: [u64; 3],
    /// exp2 histogram (ns) of on-CPU time per parked episode.
    pub hist_park_cpu: [u64; HIST_BUCKETS],
    /// exp2 histograms (ns) of each segment ([`SEGMENTS`]), one sample per
    /// episode that has it.
    pub hist_segments: [[u64; HIST_BUCKETS]; 3],
    /// exp2 histogram (ns) of run-queue latency at unpark.
    pub hist_unpark_rq: [u64; HIST_BUCKETS],
}

impl Default for KernelSnapshot {
    fn default() -> Self {
        Self {
            threads: 0,
            leases_parked: 0,
            parks: 0,
            parked_ns: 0,
            parked_oncpu_ns: 0,
            parked_runq_ns: 0,
            running_oncpu_ns: 0,
            missed_events: 0,
            episodes: 0,
            hot_episodes: 0,
            segment_oncpu_ns: [0; 3],
            segment_hot: [0; 3],
            hist_park_cpu: [0; HIST_BUCKETS],
            hist_segments: [[0; HIST_BUCKETS]; 3],
            hist_unpark_rq: [0; HIST_BUCKETS],
        }
    }
}

/// Everything `/metrics` shows, as plain numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Named throttlers.
    pub throttlers: Vec<NamedThrottler>,
    /// The CPU slot budget's counters.
    pub slots: SlotsCounters,
    /// The IO engines' counters (summed over engines).
    pub uring: UringCounters,
    /// Kernel measurements; `None` when the probes are not attached.
    pub kernel: Option<KernelSnapshot>,
    /// Tenants sharing the throttlers (any number: exporters keep the top
    /// [`TENANT_SERIES`] by bytes and sum the rest, see [`top_tenants`]).
    pub tenants: Vec<TenantStat>,
    /// The adaptive budget loop and its inputs; `None` when no loop runs
    /// (static budget by choice, or a reader of pinned maps).
    pub adaptive: Option<AdaptiveCounters>,
    /// The disk's workloads, in their tree's order
    /// ([`slotring_throttle::WorkloadScheduler::counters`]; empty without
    /// a tree). Exporters keep [`WORKLOAD_SERIES`] of them, see
    /// [`bounded_workloads`].
    pub workloads: Vec<WorkloadCounters>,
    /// The CPU slots' workloads, parents first
    /// ([`slotring_slots::ConcurrencyControl::workloads`]; empty without a
    /// tree), bounded by [`bounded_workloads`] as the disk's are.
    pub cpu_workloads: Vec<WorkloadSlots>,
}

/// The most workloads exported one series each (a tree comes from a
/// configuration file, so its names are bounded by the file; this bounds a
/// file of any size).
pub const WORKLOAD_SERIES: usize = 64;
/// The name of the series that sums the leaf workloads not exported by name.
pub const OTHER_WORKLOADS: &str = "other";

/// One workload's numbers in a snapshot (the disk's [`WorkloadCounters`],
/// the CPU slots' [`WorkloadSlots`]): what [`bounded_workloads`] needs to
/// keep the first ones and sum the leaves left out.
pub trait WorkloadSeries: Clone {
    /// The workload's name (the `workload` label).
    fn name(&self) -> &str;
    /// Its parent's name (`None`: the root).
    fn parent(&self) -> Option<&str>;
    /// The [`OTHER_WORKLOADS`] entry before any leaf is added: no parent,
    /// every count 0, no limit.
    fn other() -> Self;
    /// Add the counts of `leaf`, a leaf left out, to this
    /// [`OTHER_WORKLOADS`] entry (saturating): sums, except that a peak is
    /// the largest of the leaves'.
    fn add_leaf(&mut self, leaf: &Self);
}

impl WorkloadSeries for WorkloadCounters {
    fn name(&self) -> &str {
        &self.name
    }

    fn parent(&self) -> Option<&str> {
        self.parent.as_deref()
    }

    fn other() -> Self {
        Self {
            name: OTHER_WORKLOADS.to_owned(),
            ..Self::default()
        }
    }

    fn add_leaf(&mut self, w: &Self) {
        self.bytes = self.bytes.saturating_add(w.bytes);
        self.requests = self.requests.saturating_add(w.requests);
        self.refunded_bytes = self.refunded_bytes.saturating_add(w.refunded_bytes);
        self.queued = self.queued.saturating_add(w.queued);
        self.in_flight_requests = self.in_flight_requests.saturating_add(w.in_flight_requests);
        self.in_flight_bytes = self.in_flight_bytes.saturating_add(w.in_flight_bytes);
        self.peak_in_flight_requests = self.peak_in_flight_requests.max(w.peak_in_flight_requests);
        for (a, b) in self.wait_histogram.iter_mut().zip(&w.wait_histogram) {
            *a = a.saturating_add(*b);
        }
    }
}

impl WorkloadSeries for WorkloadSlots {
    fn name(&self) -> &str {
        &self.name
    }

    fn parent(&self) -> Option<&str> {
        self.parent.as_deref()
    }

    fn other() -> Self {
        Self {
            name: OTHER_WORKLOADS.to_owned(),
            ..Self::default()
        }
    }

    fn add_leaf(&mut self, w: &Self) {
        self.held = self.held.saturating_add(w.held);
        self.borrowed = self.borrowed.saturating_add(w.borrowed);
        self.parked = self.parked.saturating_add(w.parked);
        self.allocations = self.allocations.saturating_add(w.allocations);
        self.grants = self.grants.saturating_add(w.grants);
        self.borrows = self.borrows.saturating_add(w.borrows);
        self.preemptions = self.preemptions.saturating_add(w.preemptions);
        self.wake_yields = self.wake_yields.saturating_add(w.wake_yields);
        self.slot_ns = self.slot_ns.saturating_add(w.slot_ns);
    }
}

/// The workloads `/metrics` shows, of either kind: the first `n` of `all`
/// (the tree's order, parents before children, so a workload shown has its
/// ancestors shown) other than one named [`OTHER_WORKLOADS`], then, if any
/// leaf is left out, one [`OTHER_WORKLOADS`] entry summing the leaves left
/// out. Only leaves are summed: a node's counts cover its subtree and every
/// request enters one leaf, so nothing is counted twice (its in-flight
/// counts are the leaves' own, where they limit them; its peak the largest
/// of theirs).
pub fn bounded_workloads<W: WorkloadSeries>(all: &[W], n: usize) -> Vec<W> {
    let mut shown: Vec<W> = Vec::new();
    let mut other: Option<W> = None;
    let is_leaf = |w: &W| !all.iter().any(|c| c.parent() == Some(w.name()));
    for w in all {
        if shown.len() < n && w.name() != OTHER_WORKLOADS {
            shown.push(w.clone());
            continue;
        }
        if is_leaf(w) {
            other.get_or_insert_with(W::other).add_leaf(w);
        }
    }
    shown.extend(other);
    shown
}

/// The most tenants exported one series each; the rest are summed into one
/// series named [`OTHER_TENANTS`], so the label cardinality stays bounded
/// however many queries run.
pub const TENANT_SERIES: usize = 10;
/// The name of the series that sums the tenants outside the top ones.
pub const OTHER_TENANTS: &str = "other";

/// One tenant's share of the throttlers (see [`slotring_throttle::Tenant`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantStat {
    /// The tenant's name (the `tenant` label).
    pub name: String,
    /// Tokens (bytes) charged as the tenant, summed over throttler levels.
    pub charged: u64,
    /// Time its requests waited, ns.
    pub wait_ns: u64,
}

impl TenantStat {
    /// The statistics of `tenant` now.
    pub fn of(tenant: &slotring_throttle::Tenant) -> Self {
        Self {
            name: tenant.name().to_owned(),
            charged: tenant.charged(),
            wait_ns: tenant.wait_ns(),
        }
    }
}

/// The `n` tenants with the most bytes (ties: by name), then, if any are
/// left, one [`OTHER_TENANTS`] entry summing them (saturating).
pub fn top_tenants(all: &[TenantStat], n: usize) -> Vec<TenantStat> {
    let mut sorted: Vec<&TenantStat> = all.iter().collect();
    sorted.sort_by(|a, b| b.charged.cmp(&a.charged).then_with(|| a.name.cmp(&b.name)));
    let mut out: Vec<TenantStat> = sorted.iter().take(n).map(|t| (*t).clone()).collect();
    if sorted.len() > n {
        let mut other = TenantStat {
            name: OTHER_TENANTS.to_owned(),
            ..TenantStat::default()
        };
        for t in &sorted[n..] {
            other.charged = other.charged.saturating_add(t.charged);
            other.wait_ns = other.wait_ns.saturating_add(t.wait_ns);
        }
        out.push(other);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(name: &str, parent: Option<&str>, bytes: u64) -> WorkloadCounters {
        let mut wait_histogram = [0; slotring_throttle::WORKLOAD_WAIT_BUCKETS];
        wait_histogram[3] = 1;
        WorkloadCounters {
            name: name.into(),
            parent: parent.map(Into::into),
            bytes,
            requests: 1,
            refunded_bytes: 0,
            queued: 2,
            in_flight_requests: 0,
            in_flight_bytes: 0,
            peak_in_flight_requests: bytes,
            wait_histogram,
        }
    }

    #[test]
    fn bounded_workloads_keep_the_first_and_sum_the_leaves_left_out() {
        // all -> a -> a0..a3 (leaves), all -> b (leaf).
        let mut all = vec![
            workload("all", None, 1111),
            workload("a", Some("all"), 1110),
            workload("b", Some("all"), 1),
        ];
        for (i, bytes) in [10u64, 100, 1000].into_iter().enumerate() {
            all.push(workload(&format!("a{i}"), Some("a"), bytes));
        }
        let names = |v: &[WorkloadCounters]| v.iter().map(|w| w.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            names(&bounded_workloads(&all, 10)),
            ["all", "a", "b", "a0", "a1", "a2"]
        );
        let four = bounded_workloads(&all, 4);
        assert_eq!(names(&four), ["all", "a", "b", "a0", "other"]);
        let other = &four[4];
        assert_eq!((other.bytes, other.requests, other.queued), (1100, 2, 4));
        assert_eq!(other.peak_in_flight_requests, 1000);
        assert_eq!(other.wait_histogram[3], 2);
        // An inner node left out is not summed (its leaves are).
        let two = bounded_workloads(&all, 2);
        assert_eq!(names(&two), ["all", "a", "other"]);
        assert_eq!(
            two[2].bytes, 1111,
            "b and a0..a2: every leaf left out, once"
        );
        // A workload named `other` is never a series of its own name.
        let named = vec![workload("all", None, 5), workload("other", Some("all"), 5)];
        let shown = bounded_workloads(&named, 10);
        assert_eq!(names(&shown), ["all", "other"]);
        assert_eq!(shown[1].parent, None, "the sum of the leaves left out");
        assert!(bounded_workloads::<WorkloadCounters>(&[], 4).is_empty());
    }

    #[test]
    fn bounded_cpu_workloads_sum_the_leaves_left_out_and_no_inner_node() {
        let w = |name: &str, parent: Option<&str>, n: u64| WorkloadSlots {
            name: name.into(),
            parent: parent.map(Into::into),
            max_concurrent_threads: Some(4),
            held: n,
            borrowed: n,
            parked: n,
            allocations: n,
            grants: n,
            borrows: n,
            preemptions: n,
            wake_yields: n,
            slot_ns: n,
        };
        // all -> a -> a0, a1 (leaves), all -> b (leaf); a node's counts
        // cover its subtree.
        let all = vec![
            w("all", None, 111),
            w("a", Some("all"), 110),
            w("b", Some("all"), 1),
            w("a0", Some("a"), 10),
            w("a1", Some("a"), 100),
        ];
        let names = |v: &[WorkloadSlots]| v.iter().map(|w| w.name.clone()).collect::<Vec<_>>();
        assert_eq!(bounded_workloads(&all, 5), all, "all fit: no `other`");
        let two = bounded_workloads(&all, 2);
        assert_eq!(names(&two), ["all", "a", "other"]);
        assert_eq!(
            two[2],
            WorkloadSlots {
                name: "other".into(),
                parent: None,
                max_concurrent_threads: None,
                ..w("", None, 111)
            },
            "b, a0 and a1, once each, in every count"
        );
    }

    #[test]
    fn a_controls_cpu_workloads_name_their_parents_so_other_sums_its_leaves() {
        use slotring_slots::{ConcurrencyControl, Scheduler};
        use slotring_throttle::{WorkloadSpec, WorkloadTree};
        let tree = WorkloadTree::new(vec![
            WorkloadSpec::new("all"),
            WorkloadSpec::new("a").parent("all"),
            WorkloadSpec::new("b").parent("all"),
            WorkloadSpec::new("a0").parent("a"),
            WorkloadSpec::new("a1").parent("a"),
        ])
        .unwrap();
        let cc = ConcurrencyControl::with_workloads(&tree);
        // Round robin: every slot competes, so each grant is the tree's.
        cc.set_scheduler(Scheduler::RoundRobin);
        let allocs: Vec<_> = [("a0", 1), ("a1", 2), ("b", 3)]
            .into_iter()
            .map(|(leaf, n)| cc.allocate_in(leaf, 0, n).unwrap())
            .collect();
        let all = cc.workloads();
        let parents: Vec<_> = all
            .iter()
            .map(|w| (w.name.as_str(), w.parent.as_deref()))
            .collect();
        assert_eq!(
            parents,
            [
                ("all", None),
                ("a", Some("all")),
                ("b", Some("all")),
                ("a0", Some("a")),
                ("a1", Some("a")),
            ]
        );
        let two = bounded_workloads(&all, 2);
        assert_eq!(
            two.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
            ["all", "a", "other"]
        );
        assert_eq!(
            (
                two[0].grants,
                two[2].grants,
                two[2].held,
                two[2].allocations
            ),
            (6, 6, 6, 3),
            "other: b, a0 and a1, not a"
        );
        drop(allocs);
    }

    #[test]
    fn top_tenants_bound_the_series_and_lose_nothing() {
        let all: Vec<TenantStat> = (0..10_000u64)
            .map(|i| TenantStat {
                name: format!("q{i}"),
                charged: i,
                wait_ns: 1,
            })
            .collect();
        let top = top_tenants(&all, 3);
        let names: Vec<&str> = top.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["q9999", "q9998", "q9997", "other"]);
        let total: u64 = top.iter().map(|t| t.charged).sum();
        assert_eq!(total, (0..10_000u64).sum::<u64>(), "other sums the rest");
        assert_eq!(top[3].wait_ns, 9_997);
        assert_eq!(
            top_tenants(&all[..2], 3).len(),
            2,
            "no `other` when all fit"
        );
    }
}
