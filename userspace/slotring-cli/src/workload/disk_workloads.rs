//! The workload tree of a run with `--workloads`: the scheduler of
//! [`Resource::Io`] that replaces `local_read` for the queries' reads, the
//! two leaves the queries enter (for their reads and their CPU slots), and
//! the stop-aware wait for a cap's debt.
//!
//! # The mapping
//!
//! Every short query enters the file's `[run] queries` leaf (default
//! `user`) and every scan its `[run] scans` leaf (default `background`):
//! a read of `n` bytes is one request of cost `n` there, charged to every
//! cap on the path to the root (whose cap is `max_local_read_bandwidth`
//! unless the file gives one). Scans share their leaf in its FIFO order:
//! with a tree they carry no tenant, and per-scan disk shares are the
//! leaf's. Page-cache hits are not charged (the engines detect them for a
//! workload, as for `local_read`). The data file is written through
//! `local_write`, as without a tree.
//!
//! # CPU slots
//!
//! The same tree schedules the run's CPU slots
//! ([`ConcurrencyControl::with_workloads`](slotring::slots::ConcurrencyControl::with_workloads),
//! built by `setup::slots`): every query's allocation enters the same leaf
//! as its reads, so `max_concurrent_threads`, priorities and weights decide
//! who gets a free slot. A scan asks for `1..=width` slots, as without a
//! tree: its first slot is a `min`, which the fair schedulers grant at once
//! outside the budget, so no scan starves; the rest are the tree's. A short
//! query asks for `0..=1`: its one slot is the tree's (a `min` would bypass
//! it), so a priority-0 query is granted the next free slot and an
//! outranked scan thread holding one is told to yield at its next
//! checkpoint between reads (`AcquiredSlot::should_yield`), where it
//! releases the slot and asks for it again.
//!
//! # Stopping
//!
//! A cap's debt longer than [`MAX_BLOCK`](super::setup::MAX_BLOCK) is
//! waited out before the read, in stop slices ([`DiskWorkloads::pay_debt`]),
//! so a read never enters the tree behind a long debt once the run stops.
//! A read already queued in its leaf waits for its turn: at most one read
//! per query thread ahead of it, each at its caps' rates.

use std::time::Duration;

use slotring::slots::WorkloadSlots;
use slotring::throttle::{
    Resource, ThrottlePtr, WorkloadCounters, WorkloadScheduler, WorkloadTree,
};

use super::RunError;
use super::waits::{debt_time, wait_out};
use crate::config::{IoWorkloads, RootCap};
use crate::report::{QueryKind, WorkloadCpuReport, WorkloadIoReport, WorkloadsReport};

/// One leaf the queries enter: its throttle and the capped workloads on
/// its path (name, bytes/s), leaf first.
struct Leaf {
    name: String,
    throttle: ThrottlePtr,
    caps: Vec<(String, u64)>,
}

impl Leaf {
    fn new(
        scheduler: &WorkloadScheduler,
        tree: &WorkloadTree,
        name: &str,
    ) -> Result<Self, RunError> {
        let workload = scheduler
            .workload(name)
            .map_err(|source| RunError::Workloads { source })?;
        let mut caps = Vec::new();
        let mut at = tree.get(name);
        while let Some(spec) = at {
            if let Some(rate) = spec.max_bytes_per_second {
                caps.push((spec.name.clone(), rate));
            }
            at = spec.parent.as_deref().and_then(|p| tree.get(p));
        }
        Ok(Self {
            name: name.to_owned(),
            throttle: std::sync::Arc::new(workload),
            caps,
        })
    }
}

/// The run's disk tree (see the module docs).
pub(super) struct DiskWorkloads {
    io: IoWorkloads,
    scheduler: WorkloadScheduler,
    queries: Leaf,
    scans: Leaf,
}

impl DiskWorkloads {
    /// The scheduler of `io`'s tree and its two leaves.
    pub fn new(io: &IoWorkloads) -> Result<Self, RunError> {
        let scheduler = WorkloadScheduler::new(&io.tree, Resource::Io)
            .map_err(|source| RunError::Workloads { source })?;
        Ok(Self {
            queries: Leaf::new(&scheduler, &io.tree, &io.file.queries)?,
            scans: Leaf::new(&scheduler, &io.tree, &io.file.scans)?,
            scheduler,
            io: io.clone(),
        })
    }

    fn leaf(&self, kind: QueryKind) -> &Leaf {
        match kind {
            QueryKind::Scan => &self.scans,
            QueryKind::Short => &self.queries,
        }
    }

    /// The tree the run is scheduled by (the file's, with the root's cap
    /// settled).
    pub fn tree(&self) -> &WorkloadTree {
        &self.io.tree
    }

    /// The leaf a query of `kind` enters, for its reads and its CPU slots.
    pub fn leaf_name(&self, kind: QueryKind) -> &str {
        &self.leaf(kind).name
    }

    /// The throttle a query of `kind` reads through: its leaf.
    pub fn throttle(&self, kind: QueryKind) -> &ThrottlePtr {
        &self.leaf(kind).throttle
    }

    /// Wait, lease parked and stop-aware, while a cap on the path of
    /// `kind`'s leaf owes more than `MAX_BLOCK`; the time waited.
    pub fn pay_debt(&self, kind: QueryKind, stopping: &dyn Fn() -> bool) -> Duration {
        let leaf = self.leaf(kind);
        let debt = || {
            leaf.caps
                .iter()
                .filter_map(|(name, rate)| {
                    let tokens = self.scheduler.cap_tokens_nano(name).ok()??;
                    Some(debt_time(tokens, *rate))
                })
                .max()
                .unwrap_or(Duration::ZERO)
        };
        wait_out(&debt, stopping)
    }

    /// Every workload's counters, in the tree's order.
    pub fn counters(&self) -> Vec<WorkloadCounters> {
        self.scheduler.counters()
    }

    /// Bytes the root moved so far, net of refunds: what the tree let reach
    /// the disk.
    pub fn disk_bytes(&self) -> u64 {
        self.scheduler
            .counters_of(self.io.tree.root())
            .map_or(0, |c| c.bytes.saturating_sub(c.refunded_bytes))
    }

    /// The report's section, over `elapsed_s` seconds of queries, with the
    /// CPU slots' workloads `cpu` (the control's, parents first; empty when
    /// the tree schedules no slots).
    pub fn report(&self, elapsed_s: f64, cpu: &[WorkloadSlots]) -> WorkloadsReport {
        let root_bytes = self.disk_bytes();
        let io = self
            .counters()
            .iter()
            .filter_map(|c| {
                let spec = self.io.tree.get(&c.name)?;
                Some(WorkloadIoReport::new(c, spec, root_bytes, elapsed_s))
            })
            .collect();
        WorkloadsReport {
            file: self.io.file.path.display().to_string(),
            queries: self.queries.name.clone(),
            scans: self.scans.name.clone(),
            root_cap: self.io.root_cap,
            root_bytes_per_s: match self.io.root_cap {
                RootCap::None => None,
                _ => self.io.tree.specs()[0].max_bytes_per_second,
            },
            io,
            cpu: WorkloadCpuReport::of_tree(cpu),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Instant;

    use slotring::throttle::Source;

    use super::*;
    use crate::config::WorkloadsFile;

    #[test]
    fn a_caps_long_debt_is_waited_out_before_the_read_until_stopping() {
        let file = WorkloadsFile::parse(
            "[[workload]]\nname = \"all\"\n[[workload]]\nname = \"user\"\nparent = \"all\"\n\
             [[workload]]\nname = \"background\"\nparent = \"all\"\nmax_bytes_per_second = \"1MiB\"\n",
            Path::new("w.toml"),
        )
        .unwrap();
        let d = DiskWorkloads::new(&file.io_tree(0).unwrap()).unwrap();
        assert_eq!(
            d.pay_debt(QueryKind::Scan, &|| false),
            Duration::ZERO,
            "no debt yet"
        );
        // 10 MiB at 1 MiB/s with a 1 MiB burst: about 9 s of debt.
        d.throttle(QueryKind::Scan)
            .reserve(10 << 20, Duration::ZERO, 0, Source::Device)
            .unwrap();
        let start = Instant::now();
        let stop_at = start + Duration::from_millis(120);
        let waited = d.pay_debt(QueryKind::Scan, &|| Instant::now() >= stop_at);
        assert!(
            waited >= Duration::from_millis(120) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        // The short queries' path has no cap: nothing to wait for.
        assert_eq!(d.pay_debt(QueryKind::Short, &|| false), Duration::ZERO);
        assert_eq!(d.disk_bytes(), 10 << 20);
        let r = d.report(1.0, &[]);
        assert_eq!((r.root_cap, r.root_bytes_per_s), (RootCap::None, None));
        assert_eq!(
            r.io.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
            ["all", "user", "background"]
        );
    }
}
