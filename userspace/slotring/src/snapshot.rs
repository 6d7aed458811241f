//! Plain snapshots of every counter slotring keeps: what `/metrics`, the
//! pinned-map reader and the `slotring` command's report are built from.
//!
//! A [`Snapshot`] holds the `#[repr(C)]` counter structs of the other crates
//! (one [`ThrottleCounters`] per named throttler, [`SlotsCounters`],
//! [`UringCounters`]) and, when the kernel probes are attached, a
//! [`KernelSnapshot`]; with an adaptive budget loop, its
//! [`AdaptiveCounters`]. Snapshots are values: building metrics from them never
//! touches a live throttler, slot budget or ring.
//!
//! Each counter struct is described field by field through [`CounterSet`]
//! (name, metric name, help, counter or gauge, unit), so a report or an
//! exporter can walk every counter without naming one; counter structs sum
//! with `+` and `sum()` (one engine's counters over many engines, …).

pub use slotring_counters::{CounterSet, Field, Kind, Unit};
use slotring_slots::{AdaptiveCounters, SlotsCounters};
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
}

/// The most workloads exported one series each (a tree comes from a
/// configuration file, so its names are bounded by the file; this bounds a
/// file of any size).
pub const WORKLOAD_SERIES: usize = 64;
/// The name of the series that sums the leaf workloads not exported by name.
pub const OTHER_WORKLOADS: &str = "other";

/// The workloads `/metrics` shows: the first `n` of `all` (the tree's
/// order, parents before children, so a workload shown has its ancestors
/// shown) other than one named [`OTHER_WORKLOADS`], then, if any leaf is
/// left out, one [`OTHER_WORKLOADS`] entry summing the leaves left out.
/// Only leaves are summed: a node's counts cover its subtree and every
/// request enters one leaf, so nothing is counted twice (its in-flight
/// counts are the leaves' own, where they limit them; its peak the largest
/// of theirs).
pub fn bounded_workloads(all: &[WorkloadCounters], n: usize) -> Vec<WorkloadCounters> {
    let mut shown: Vec<WorkloadCounters> = Vec::new();
    let mut other: Option<WorkloadCounters> = None;
    let is_leaf = |w: &WorkloadCounters| {
        !all.iter()
            .any(|c| c.parent.as_deref() == Some(w.name.as_str()))
    };
    for w in all {
        if shown.len() < n && w.name != OTHER_WORKLOADS {
            shown.push(w.clone());
            continue;
        }
        if !is_leaf(w) {
            continue;
        }
        let o = other.get_or_insert_with(|| WorkloadCounters {
            name: OTHER_WORKLOADS.to_owned(),
            ..WorkloadCounters::default()
        });
        o.bytes = o.bytes.saturating_add(w.bytes);
        o.requests = o.requests.saturating_add(w.requests);
        o.refunded_bytes = o.refunded_bytes.saturating_add(w.refunded_bytes);
        o.queued = o.queued.saturating_add(w.queued);
        o.in_flight_requests = o.in_flight_requests.saturating_add(w.in_flight_requests);
        o.in_flight_bytes = o.in_flight_bytes.saturating_add(w.in_flight_bytes);
        o.peak_in_flight_requests = o.peak_in_flight_requests.max(w.peak_in_flight_requests);
        for (a, b) in o.wait_histogram.iter_mut().zip(&w.wait_histogram) {
            *a = a.saturating_add(*b);
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
        assert!(bounded_workloads(&[], 4).is_empty());
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
