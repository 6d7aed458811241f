//! The report's workload section (`slotring run --workloads FILE`): the
//! tree, which leaves the queries entered, and what each workload was
//! given of the disk and of the CPU slots.

use std::fmt;

use serde::Serialize;
use slotring::slots::WorkloadSlots;
use slotring::throttle::{
    WORKLOAD_WAIT_BUCKETS, WorkloadCounters, WorkloadSpec, workload_wait_bucket_bound,
};

use crate::config::RootCap;

/// The workload tree over the run: the disk's reads and the CPU slots.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkloadsReport {
    /// The workloads file.
    pub file: String,
    /// The leaf the short queries entered.
    pub queries: String,
    /// The leaf the scans entered.
    pub scans: String,
    /// Where the root's byte cap came from.
    pub root_cap: RootCap,
    /// The root's byte cap, bytes/s (`None`: unlimited).
    pub root_bytes_per_s: Option<u64>,
    /// One entry per workload, the tree's order (parents first).
    pub io: Vec<WorkloadIoReport>,
    /// Each workload's CPU slots, the tree's order (empty when the tree
    /// schedules no slots).
    pub cpu: Vec<WorkloadCpuReport>,
}

/// One workload's CPU slots. Counts of a workload cover its subtree.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkloadCpuReport {
    /// Its name.
    pub name: String,
    /// Its `max_concurrent_threads` (`None`: no limit).
    pub max_concurrent_threads: Option<u64>,
    /// Slot time, seconds: how long its competing slots counted, unparked
    /// (a fair scheduler's `min` slot counts nowhere).
    pub slot_s: f64,
    /// Its share of the root's slot time, percent.
    pub share_pct: f64,
    /// Slots granted through it.
    pub grants: u64,
    /// Yields its holders promised because a waiting workload of higher
    /// priority outranked it.
    pub preemptions: u64,
}

impl WorkloadCpuReport {
    /// The entries of a control's workloads `all` (parents first, so the
    /// first is the root, whose slot time is every slot's).
    pub fn of_tree(all: &[WorkloadSlots]) -> Vec<Self> {
        let root_ns = all.first().map_or(0, |w| w.slot_ns);
        all.iter()
            .map(|w| Self {
                name: w.name.clone(),
                max_concurrent_threads: w.max_concurrent_threads,
                slot_s: w.slot_ns as f64 / 1e9,
                share_pct: 100.0 * w.slot_ns as f64 / root_ns.max(1) as f64,
                grants: w.grants,
                preemptions: w.preemptions,
            })
            .collect()
    }
}

/// One workload's share of the disk. Counts of a workload cover its subtree.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkloadIoReport {
    /// Its name.
    pub name: String,
    /// Its parent (`None`: the root).
    pub parent: Option<String>,
    /// Its priority among its siblings (lower first).
    pub priority: i64,
    /// Its weight among its siblings of one priority.
    pub weight: u32,
    /// Its own byte cap, bytes/s (`None`: none).
    pub max_bytes_per_second: Option<u64>,
    /// Bytes granted, less those refunded (reads found cached after their
    /// charge): what reached the disk.
    pub bytes: u64,
    /// Bytes refunded.
    pub refunded_bytes: u64,
    /// Requests granted.
    pub requests: u64,
    /// `bytes` over the run, bytes/s.
    pub bytes_per_s: f64,
    /// Its share of the root's bytes, percent.
    pub share_pct: f64,
    /// Requests queued when the run ended.
    pub queued_at_end: u64,
    /// The most requests it had in flight at once, where it limits them
    /// (`max_io_requests`; 0 elsewhere).
    pub in_flight_peak: u64,
    /// The median wait for a turn, seconds: the upper bound of its
    /// histogram bucket (`None`: no request, or in the last bucket, above
    /// about 1 s).
    pub wait_p50_s: Option<f64>,
    /// The 99th percentile wait, seconds, as `wait_p50_s`.
    pub wait_p99_s: Option<f64>,
}

/// The nearest-rank `q` quantile of a wait histogram, as its bucket's upper
/// bound (`None`: empty, or in the last, unbounded bucket).
pub fn wait_quantile(h: &[u64; WORKLOAD_WAIT_BUCKETS], q: f64) -> Option<f64> {
    let n: u64 = h.iter().sum();
    if n == 0 {
        return None;
    }
    // The rank of the quantile, 1-based: ceil(q·n), at least 1.
    let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
    let mut seen = 0u64;
    for (k, &c) in h.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return workload_wait_bucket_bound(k).map(|d| d.as_secs_f64());
        }
    }
    None
}

impl WorkloadIoReport {
    /// Workload `c` (settings `spec`) over `elapsed_s` seconds, of a tree
    /// whose root moved `root_bytes` (net of refunds).
    pub fn new(c: &WorkloadCounters, spec: &WorkloadSpec, root_bytes: u64, elapsed_s: f64) -> Self {
        let bytes = c.bytes.saturating_sub(c.refunded_bytes);
        Self {
            name: c.name.clone(),
            parent: c.parent.clone(),
            priority: spec.priority,
            weight: spec.weight,
            max_bytes_per_second: spec.max_bytes_per_second,
            bytes,
            refunded_bytes: c.refunded_bytes,
            requests: c.requests,
            bytes_per_s: bytes as f64 / elapsed_s.max(1e-9),
            share_pct: 100.0 * bytes as f64 / root_bytes.max(1) as f64,
            queued_at_end: c.queued,
            in_flight_peak: c.peak_in_flight_requests,
            wait_p50_s: wait_quantile(&c.wait_histogram, 0.50),
            wait_p99_s: wait_quantile(&c.wait_histogram, 0.99),
        }
    }
}

fn wait(s: Option<f64>, requests: u64) -> String {
    match s {
        Some(s) if s < 1e-3 => format!("<={:.0}us", s * 1e6),
        Some(s) => format!("<={:.1}ms", s * 1e3),
        None if requests == 0 => "-".into(),
        None => ">1s".into(),
    }
}

impl fmt::Display for WorkloadsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: f64| b / f64::from(1u32 << 20);
        let cap = match (self.root_bytes_per_s, self.root_cap) {
            (None, _) => "unlimited".to_owned(),
            (Some(b), RootCap::File) => format!("{:.1} MiB/s from the file", mib(b as f64)),
            (Some(b), _) => format!("{:.1} MiB/s from max_local_read_bandwidth", mib(b as f64)),
        };
        writeln!(
            f,
            "\nworkloads ({}): the disk's reads by the tree, root cap {cap}; short queries enter `{}`, scans `{}`",
            self.file, self.queries, self.scans
        )?;
        writeln!(
            f,
            "  {:<16} {:<12} {:>4} {:>4} {:>10} {:>9} {:>6} {:>9} {:>6} {:>5} {:>10} {:>10}",
            "workload",
            "parent",
            "prio",
            "wt",
            "MiB",
            "MiB/s",
            "share",
            "requests",
            "queued",
            "peak",
            "wait p50",
            "wait p99"
        )?;
        for w in &self.io {
            writeln!(
                f,
                "  {:<16} {:<12} {:>4} {:>4} {:>10.1} {:>9.2} {:>5.1}% {:>9} {:>6} {:>5} {:>10} {:>10}",
                w.name,
                w.parent.as_deref().unwrap_or("-"),
                w.priority,
                w.weight,
                mib(w.bytes as f64),
                mib(w.bytes_per_s),
                w.share_pct,
                w.requests,
                w.queued_at_end,
                w.in_flight_peak,
                wait(w.wait_p50_s, w.requests),
                wait(w.wait_p99_s, w.requests),
            )?;
        }
        if self.cpu.is_empty() {
            return Ok(());
        }
        writeln!(
            f,
            "\nworkloads' CPU slots: the same tree schedules them, in the same leaves"
        )?;
        writeln!(
            f,
            "  {:<16} {:>8} {:>10} {:>6} {:>9} {:>11}",
            "workload", "max thr", "slot-s", "share", "grants", "preemptions"
        )?;
        for w in &self.cpu {
            let max = w
                .max_concurrent_threads
                .map_or_else(|| "-".to_owned(), |m| m.to_string());
            writeln!(
                f,
                "  {:<16} {:>8} {:>10.2} {:>5.1}% {:>9} {:>11}",
                w.name, max, w.slot_s, w.share_pct, w.grants, w.preemptions
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_quantiles_are_their_buckets_upper_bounds() {
        let mut h = [0u64; WORKLOAD_WAIT_BUCKETS];
        assert_eq!(wait_quantile(&h, 0.5), None);
        // 98 without a wait (< 1 µs), one of [512, 1024) µs, one over 1 s.
        h[0] = 98;
        h[10] = 1;
        h[WORKLOAD_WAIT_BUCKETS - 1] = 1;
        assert_eq!(wait_quantile(&h, 0.5), Some(1e-6));
        assert_eq!(wait_quantile(&h, 0.98), Some(1e-6));
        assert_eq!(wait_quantile(&h, 0.99), Some(1024e-6));
        assert_eq!(wait_quantile(&h, 1.0), None, "the last bucket has no bound");
        assert_eq!(
            (wait(Some(1024e-6), 1), wait(None, 1), wait(None, 0)),
            ("<=1.0ms".into(), ">1s".into(), "-".into())
        );
    }

    #[test]
    fn a_workloads_cpu_entry_is_its_slot_time_and_its_share_of_the_roots() {
        let w = |name: &str, parent: Option<&str>, slot_ns: u64, grants: u64| WorkloadSlots {
            name: name.into(),
            parent: parent.map(Into::into),
            max_concurrent_threads: (name == "background").then_some(2),
            held: 0,
            borrowed: 0,
            parked: 0,
            allocations: 0,
            grants,
            borrows: 0,
            preemptions: u64::from(name == "background") * 7,
            wake_yields: 0,
            slot_ns,
        };
        let cpu = WorkloadCpuReport::of_tree(&[
            w("all", None, 4_000_000_000, 12),
            w("user", Some("all"), 1_000_000_000, 9),
            w("background", Some("all"), 3_000_000_000, 3),
        ]);
        let got: Vec<_> = cpu
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.max_concurrent_threads,
                    c.slot_s,
                    c.share_pct,
                    c.grants,
                    c.preemptions,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("all", None, 4.0, 100.0, 12, 0),
                ("user", None, 1.0, 25.0, 9, 0),
                ("background", Some(2), 3.0, 75.0, 3, 7),
            ]
        );
        assert!(WorkloadCpuReport::of_tree(&[]).is_empty());
        // The text: the disk's table, then the CPU's, apart.
        let r = WorkloadsReport {
            file: "w.toml".into(),
            queries: "user".into(),
            scans: "background".into(),
            root_cap: RootCap::None,
            root_bytes_per_s: None,
            io: Vec::new(),
            cpu,
        };
        let text = r.to_string();
        let cpu_table = text.split("\nworkloads' CPU slots").nth(1).expect(&text);
        assert!(
            cpu_table
                .contains("  background              2       3.00  75.0%         3           7\n"),
            "{text}"
        );
        let no_cpu = WorkloadsReport {
            cpu: Vec::new(),
            ..r
        };
        assert!(!no_cpu.to_string().contains("CPU slots"));
    }

    #[test]
    fn a_workload_is_its_bytes_net_of_refunds_and_its_share_of_the_root() {
        let mut wait_histogram = [0u64; WORKLOAD_WAIT_BUCKETS];
        wait_histogram[3] = 4;
        let c = WorkloadCounters {
            name: "background".into(),
            parent: Some("all".into()),
            bytes: 3 << 20,
            requests: 4,
            refunded_bytes: 1 << 20,
            queued: 2,
            in_flight_requests: 0,
            in_flight_bytes: 0,
            peak_in_flight_requests: 3,
            wait_histogram,
        };
        let spec = WorkloadSpec::new("background")
            .parent("all")
            .priority(1)
            .max_bytes_per_second(1 << 20);
        let r = WorkloadIoReport::new(&c, &spec, 8 << 20, 2.0);
        assert_eq!(
            (r.bytes, r.refunded_bytes, r.requests),
            (2 << 20, 1 << 20, 4)
        );
        assert_eq!((r.bytes_per_s, r.share_pct), (f64::from(1u32 << 20), 25.0));
        assert_eq!(
            (r.priority, r.weight, r.max_bytes_per_second),
            (1, 1, Some(1 << 20))
        );
        assert_eq!((r.queued_at_end, r.in_flight_peak), (2, 3));
        assert_eq!((r.wait_p50_s, r.wait_p99_s), (Some(8e-6), Some(8e-6)));
    }
}
