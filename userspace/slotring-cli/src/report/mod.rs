//! The report of `slotring run`: the model, Jain's index, text and JSON.
//!
//! The same [`Report`] is printed as text and serialised as JSON
//! (`--json`); every number is measured in the run.
//! `kernel.rs` holds the kernel verdict's section, `workloads.rs` the
//! workload tree's (`--workloads`), `text.rs` the text.

mod kernel;
mod text;
mod workloads;

use std::fmt;

use serde::Serialize;
use slotring::bpf::{AttachMode, Verdict};
use slotring::slots::Scheduler;

use crate::config::{RunConfig, ser_display};

pub use kernel::*;
pub use workloads::*;

/// Jain's fairness index `(Σx)² / (n·Σx²)`: 1 when all are equal, `1/n` when
/// one takes everything. 1 for an empty or all-zero input.
pub fn jain(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sq == 0.0 {
        1.0
    } else {
        sum * sum / (n * sq)
    }
}

/// The IO engine the queries used.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// io_uring.
    IoUring,
    /// The `pread` engine (asked for, or io_uring unavailable).
    Pread,
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Engine::IoUring => "io_uring",
            Engine::Pread => "pread",
        })
    }
}

/// What a query did.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum QueryKind {
    /// A scan: up to `scan_threads` slots, sequential reads.
    Scan,
    /// A short query: one slot, a few reads.
    Short,
}

impl fmt::Display for QueryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            QueryKind::Scan => "scan",
            QueryKind::Short => "short",
        })
    }
}

/// The kernel's verdict, without its details (those are fields of
/// [`KernelReport`]; the library's [`Verdict`] carries them inside).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KernelVerdict {
    /// No parked thread had more hot episodes, or more CPU above the bounds, than it is allowed.
    Pass,
    /// Some parked thread did.
    Fail,
    /// Nothing was verified (no probes, or nothing parked).
    Unverified,
}

impl From<&Verdict> for KernelVerdict {
    fn from(v: &Verdict) -> Self {
        match v {
            Verdict::Pass => KernelVerdict::Pass,
            Verdict::Fail { .. } => KernelVerdict::Fail,
            Verdict::Unverified { .. } => KernelVerdict::Unverified,
        }
    }
}

/// `tp_btf` or `raw_tp`.
pub fn attach_mode_name(m: AttachMode) -> &'static str {
    match m {
        AttachMode::TpBtf => "tp_btf",
        AttachMode::RawTp => "raw_tp",
    }
}

fn ser_attach_mode<S: serde::Serializer>(m: &Option<AttachMode>, s: S) -> Result<S::Ok, S::Error> {
    match m {
        Some(m) => s.serialize_some(attach_mode_name(*m)),
        None => s.serialize_none(),
    }
}

/// The data file.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DataFile {
    /// Path (removed after the run unless `keep`).
    pub path: String,
    /// Size, bytes.
    pub size_bytes: u64,
    /// Filesystem type (`ext4`, `xfs`, `tmpfs`, …).
    pub filesystem: String,
    /// Seconds spent creating it.
    pub create_s: f64,
    /// Its size just before removal, when the path still named the file
    /// this run created (`None`: gone or replaced).
    pub size_at_end_bytes: Option<u64>,
    /// Whether it was kept.
    pub kept: bool,
    /// What the block device wrote while the data file was created and
    /// synced (`None` without a block device: tmpfs, network filesystems).
    pub disk_writes: Option<DiskWrites>,
}

/// A block device's writes in 100 ms windows of `/sys/block/<dev>/stat`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DiskWrites {
    /// The stat file read.
    pub stat: String,
    /// The highest window rate while the data file was written, bytes/s
    /// (the first window less the write limit's burst).
    pub peak_bytes_per_s: f64,
    /// The median window rate over the same windows, bytes/s (what the
    /// disk wrote most of the time; on a shared disk the peak may be a
    /// neighbour's).
    pub median_bytes_per_s: f64,
    /// The highest window rate in the 500 ms before, while we wrote
    /// nothing: the neighbours' share, bytes/s.
    pub neighbours_peak_bytes_per_s: f64,
}

/// One throttler: achieved vs configured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ThrottlerReport {
    /// Name.
    pub name: String,
    /// Configured rate, bytes/s (0 = unlimited).
    pub configured_bytes_per_s: u64,
    /// Bucket size (initial burst), bytes.
    pub burst_bytes: u64,
    /// Bytes charged.
    pub charged_bytes: u64,
    /// Page-cache bytes this block-device throttler did not charge.
    pub page_cache_bytes_not_charged: u64,
    /// `charged / elapsed`.
    pub achieved_bytes_per_s: f64,
    /// `(charged − burst − debt at the end) / elapsed`: the rate the
    /// bucket was paid at, sustained.
    pub sustained_bytes_per_s: f64,
    /// The bucket's debt when the phase ended: tokens of IO admitted ahead
    /// of its booked time (at most one read per query thread, each after a
    /// wait capped at 100 ms) that the run, stopping on time, did not wait
    /// out.
    pub debt_at_end_bytes: u64,
    /// `|sustained − configured| / configured × 100`, when limited and the
    /// demand kept the bucket in debt (`None` otherwise).
    pub rate_error_pct: Option<f64>,
    /// Whether the demand exceeded the limit (some request waited).
    pub saturated: bool,
    /// Time waited or booked, seconds.
    pub wait_s: f64,
    /// Waits.
    pub waits: u64,
}

/// The IO engine.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IoReport {
    /// `io_uring` or `pread`.
    pub engine: Engine,
    /// Why io_uring was not used, if it was asked for and not used.
    pub fallback_reason: Option<String>,
    /// Reads.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written (creating the data file).
    pub write_bytes: u64,
    /// Reads detected as page-cache hits.
    pub page_cache_hits: u64,
    /// Bytes detected as page-cache hits.
    pub page_cache_bytes: u64,
    /// RWF_NOWAIT misses.
    pub nowait_misses: u64,
    /// cachestat checks of the disk-rate guard.
    pub cachestat_checks: u64,
    /// Throttle waits booked by the engine.
    pub waits: u64,
    /// Booked wait, seconds.
    pub wait_s: f64,
    /// Reads that failed (the engine returned an error).
    pub read_errors: u64,
    /// Reads that ended before the data file's expected end (it got
    /// shorter during the run).
    pub short_reads: u64,
    /// The first failed read and its cause.
    pub first_read_error: Option<String>,
}

impl IoReport {
    /// Whether some read failed or came back short: the run did not read
    /// what it measured.
    pub fn reads_failed(&self) -> bool {
        self.read_errors > 0 || self.short_reads > 0
    }
}

/// CPU slots.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SlotsReport {
    /// The budget.
    pub max_concurrency: u64,
    /// The scheduler.
    #[serde(serialize_with = "ser_display")]
    pub scheduler: Scheduler,
    /// Whether leases were parked during IO waits.
    pub lease_parking: bool,
    /// Slots granted unconditionally.
    pub slots_granted: u64,
    /// Slots delayed.
    pub slots_delayed: u64,
    /// Competing slots acquired.
    pub slots_acquired: u64,
    /// Non-competing slots acquired.
    pub slots_acquired_non_competing: u64,
    /// Queries delayed.
    pub queries_delayed: u64,
    /// Time blocked waiting for slots, seconds (sum over threads).
    pub slot_wait_s: f64,
    /// Lease parks.
    pub parks: u64,
    /// Lease unparks.
    pub unparks: u64,
    /// Unparks that borrowed a slot.
    pub unpark_borrows: u64,
    /// Slots still borrowed at the end (0 when nothing leaked).
    pub borrowed_at_end: u64,
    /// Slots in use at the end (0 when nothing leaked).
    pub in_use_at_end: u64,
}

/// One query.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueryReport {
    /// Query number.
    pub id: u32,
    /// `scan` or `short`.
    pub kind: QueryKind,
    /// Start, seconds since the run started.
    pub start_s: f64,
    /// End, seconds since the run started.
    pub end_s: f64,
    /// Reads.
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Mean slots held while the query was live (time average of samples).
    pub mean_slots: f64,
    /// Most slots held at a sample.
    pub max_slots: u64,
    /// Time its threads were blocked waiting for a slot, seconds.
    pub slot_wait_s: f64,
    /// Threads (max slots) of a scan.
    pub threads: Option<u32>,
    /// Bytes charged to the disk throttler as this query's tenant (scans).
    pub disk_bytes: Option<u64>,
    /// Its share of the scans' disk bytes, percent.
    pub disk_share_pct: Option<f64>,
    /// Its fair share of the disk throttler (its weight over the scans'
    /// weights), percent.
    pub fair_share_pct: Option<f64>,
}

/// Fairness between the scan queries.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FairnessReport {
    /// Jain's index of the scans' mean slots held over the run.
    pub jain_scans: f64,
    /// Mean over samples of Jain's index of the scans' slots at that sample.
    pub jain_instant_mean: f64,
    /// Samples taken.
    pub samples: u64,
}

/// Sampled series (one point per sample) for the plot.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Timeline {
    /// Sample times, seconds since start.
    pub t_s: Vec<f64>,
    /// Rate charged to the block-device throttler (with `--workloads`, to
    /// the tree's root, net of refunds) in the interval, bytes/s.
    pub disk_bytes_per_s: Vec<f64>,
    /// Page-cache bytes/s in the interval.
    pub page_cache_bytes_per_s: Vec<f64>,
    /// Slots held by each scan query at each sample.
    pub scan_slots: Vec<Vec<u64>>,
    /// Slots held by all short queries at each sample.
    pub short_slots: Vec<u64>,
    /// Disk read rate of each scan query (bytes/s charged as its tenant) in
    /// each interval.
    pub scan_disk_bytes_per_s: Vec<Vec<f64>>,
    /// `slotring_slots_in_use` at each sample.
    pub slots_in_use: Vec<u64>,
    /// Parked leases at each sample.
    pub leases_parked: Vec<u64>,
    /// The effective CPU slot budget at each sample
    /// (`slotring_slots_budget_effective`: adaptive, or `max_concurrency`).
    pub budget: Vec<u64>,
    /// The disk's workloads (`--workloads`; empty without), the tree's order.
    pub workloads: Vec<String>,
    /// Each workload's read rate in each interval (bytes/s granted, net of
    /// refunds), as `workloads`.
    pub workload_bytes_per_s: Vec<Vec<f64>>,
    /// The CPU slots' workloads (`--workloads`; empty without), the tree's
    /// order.
    pub slot_workloads: Vec<String>,
    /// CPU slots held in each of them at each sample (competing slots
    /// counted against the workload, at every level), as `slot_workloads`.
    pub workload_slots: Vec<Vec<u64>>,
}

/// Latency percentiles of a kind of query, milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LatencyReport {
    /// Queries measured.
    pub count: u64,
    /// Median, ms.
    pub p50: f64,
    /// 99th percentile, ms.
    pub p99: f64,
}

/// The CPU slot budget: static or adaptive, and the controller's input.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BudgetReport {
    /// Whether the adaptive budget was asked for (`adaptive_budget`).
    pub adaptive_budget: bool,
    /// `adaptive`, `static`, `static (no kernel probes)`, or adaptive until
    /// the probes went away.
    pub mode: String,
    /// `max_concurrency`: the ceiling.
    pub ceiling: u64,
    /// Mean effective budget over the samples.
    pub budget_mean: f64,
    /// Lowest effective budget sampled.
    pub budget_min: u64,
    /// Highest effective budget sampled.
    pub budget_max: u64,
    /// Run-queue share of running leases over the run, percent (kernel
    /// accounting; NaN without probes), static or adaptive.
    pub runq_share_pct: f64,
    /// Slots released because `should_yield` asked.
    pub yields: u64,
    /// Controller windows evaluated.
    pub windows: u64,
    /// Times the probes went away mid-run.
    pub probe_losses: u64,
}

/// Process-level resource use.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessReport {
    /// Most threads alive at a sample.
    pub peak_threads: u64,
    /// Threads created for queries over the run.
    pub query_threads: u64,
    /// CPU seconds (user + system) of the whole process during the queries.
    pub cpu_s: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// Settings used.
    pub config: RunConfig,
    /// Wall time of the query phase, seconds.
    pub elapsed_s: f64,
    /// Whether the run was interrupted (Ctrl-C).
    pub interrupted: bool,
    /// The data file.
    pub data_file: DataFile,
    /// Per throttler (without `local_read` when a workload tree
    /// schedules the reads).
    pub throttlers: Vec<ThrottlerReport>,
    /// The workload tree (the disk's reads and the CPU slots), with
    /// `--workloads`.
    pub workloads: Option<WorkloadsReport>,
    /// The engine.
    pub io: IoReport,
    /// CPU slots.
    pub slots: SlotsReport,
    /// Fairness.
    pub fairness: FairnessReport,
    /// Per query.
    pub queries: Vec<QueryReport>,
    /// Kernel verdict.
    pub kernel: KernelReport,
    /// Process.
    pub process: ProcessReport,
    /// The `/metrics` address served during the run.
    pub metrics_addr: Option<String>,
    /// Short query latency (start to end).
    pub short_latency_ms: LatencyReport,
    /// The CPU slot budget over the run.
    pub adaptive: BudgetReport,
    /// Sampled series.
    pub timeline: Timeline,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index() {
        assert_eq!(jain(&[1.0, 1.0, 1.0]), 1.0);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        // (3+2+2)^2 / (3 * (9+4+4)) = 49/51
        assert!((jain(&[3.0, 2.0, 2.0]) - 49.0 / 51.0).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
        assert_eq!(jain(&[0.0, 0.0]), 1.0);
    }

    #[test]
    fn enums_serialise_as_their_names() {
        fn s<T: Serialize>(v: T) -> String {
            serde_json::to_string(&v).unwrap()
        }
        assert_eq!(s(Engine::IoUring), "\"io_uring\"");
        assert_eq!(s(Engine::Pread), "\"pread\"");
        assert_eq!(s(QueryKind::Scan), "\"scan\"");
        assert_eq!(s(QueryKind::Short), "\"short\"");
        assert_eq!(s(KernelVerdict::Pass), "\"pass\"");
        assert_eq!(s(KernelVerdict::Fail), "\"fail\"");
        assert_eq!(s(KernelVerdict::Unverified), "\"unverified\"");
        assert_eq!(format!("{:<6}|", QueryKind::Scan), "scan  |");
        #[derive(Serialize)]
        struct Fields {
            #[serde(serialize_with = "ser_attach_mode")]
            mode: Option<AttachMode>,
            #[serde(serialize_with = "ser_attach_mode")]
            none: Option<AttachMode>,
            #[serde(serialize_with = "ser_display")]
            scheduler: Scheduler,
        }
        let f = Fields {
            mode: Some(AttachMode::RawTp),
            none: None,
            scheduler: Scheduler::FairRoundRobin,
        };
        assert_eq!(
            s(f),
            r#"{"mode":"raw_tp","none":null,"scheduler":"fair_round_robin"}"#
        );
    }
}
