//! The report of `slotring run`: the model, Jain's index, text and JSON.
//!
//! The same [`Report`] is printed as text and serialised as JSON
//! (`--json`); every number is measured in the run.

use std::fmt;

use serde::Serialize;
use slotring::bpf::{
    AttachMode, EpisodeRule, HotEpisode, ParkedWindow, ThreadReport, Verdict, VerifyConfig,
    hot_names,
};
use slotring::slots::Scheduler;

use crate::config::{RunConfig, ser_display};

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
    /// No parked thread had more hot episodes than it is allowed.
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
    /// Rate charged to the block-device throttler in the interval, bytes/s.
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

/// The kernel's verdict on parked threads.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KernelReport {
    /// Whether the eBPF probes were attached.
    pub attached: bool,
    /// `tp_btf` or `raw_tp` when attached.
    #[serde(serialize_with = "ser_attach_mode")]
    pub attach_mode: Option<AttachMode>,
    /// Why not, when not attached.
    pub reason: Option<String>,
    /// `pass`, `fail` or `unverified`.
    pub verdict: KernelVerdict,
    /// The rule the verdict applied.
    pub rule: RuleReport,
    /// Threads verified.
    pub threads: u64,
    /// Threads over the rule.
    pub failing_tids: Vec<u32>,
    /// Details of (up to 8 of) the threads over the rule.
    pub failing: Vec<FailingThread>,
    /// Lease parks seen by the kernel mirror.
    pub parks: u64,
    /// Wall time parked, seconds (sum over threads).
    pub parked_s: f64,
    /// On-CPU while parked, seconds.
    pub parked_oncpu_s: f64,
    /// `parked_oncpu / parked × 100`: the raw ratio, a diagnostic beside
    /// the verdict (no part of the rule).
    pub parked_oncpu_pct: f64,
    /// Run-queue while parked, seconds.
    pub parked_runq_s: f64,
    /// Mean wake-up latency at unpark, µs.
    pub unpark_wake_avg_us: f64,
    /// Largest wake-up latency at unpark, µs.
    pub unpark_wake_max_us: f64,
    /// Switch events BPF missed (time stays exact).
    pub missed_events: u64,
    /// On-CPU µs while parked, per park.
    pub parked_oncpu_us_per_park: f64,
    /// Where the parked on-CPU time went, over every thread.
    pub segments: SegmentReport,
}

/// The per-episode rule and the per-thread tolerance, with the names of
/// the constants they come from (`slotring_bpf`'s `verify.rs`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct RuleReport {
    /// Bound on the on-CPU time before an episode's first sleep, µs
    /// (`PRE_SLEEP_BOUND`).
    pub pre_sleep_us: f64,
    /// Bound on the on-CPU time between its sleeps, % of its wait
    /// (`BETWEEN_SLEEPS_FRACTION`).
    pub between_sleeps_pct_of_wait: f64,
    /// Base bound on the on-CPU time after its last wake-up, µs
    /// (`POST_WAKE_BOUND`).
    pub post_wake_us: f64,
    /// Plus this % of the sleep before it (`POST_WAKE_FRACTION`).
    pub post_wake_pct_of_sleep: f64,
    /// Hot episodes a thread may have (`TOLERATED_HOT_EPISODES`).
    pub tolerated_hot_episodes: u64,
    /// Plus this % of its episodes (`TOLERATED_HOT_FRACTION`).
    pub tolerated_hot_pct: f64,
    /// On-CPU time above the bounds a thread may spend, % of its parked
    /// time (`TOLERATED_EXCESS_FRACTION`).
    pub tolerated_excess_pct: f64,
}

impl RuleReport {
    /// The rule the programs apply and the tolerance of `cfg`.
    pub fn new(rule: &EpisodeRule, cfg: &VerifyConfig) -> Self {
        Self {
            pre_sleep_us: rule.pre_sleep_ns as f64 / 1e3,
            between_sleeps_pct_of_wait: rule.between_ppm as f64 / 1e4,
            post_wake_us: rule.post_wake_ns as f64 / 1e3,
            post_wake_pct_of_sleep: rule.post_wake_ppm as f64 / 1e4,
            tolerated_hot_episodes: cfg.tolerated_hot_episodes,
            tolerated_hot_pct: cfg.tolerated_hot_fraction * 100.0,
            tolerated_excess_pct: cfg.tolerated_excess_fraction * 100.0,
        }
    }
}

impl fmt::Display for RuleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "an episode is hot when on CPU > {:.0} us before its first sleep (PRE_SLEEP_BOUND), > {:.2}% of its wait between sleeps (BETWEEN_SLEEPS_FRACTION), or > {:.0} us (POST_WAKE_BOUND) + {:.2}% of the sleep before it (POST_WAKE_FRACTION) after the wake; a thread fails with more than {} (TOLERATED_HOT_EPISODES) + {:.2}% (TOLERATED_HOT_FRACTION) of its episodes hot, or more than {:.2}% (TOLERATED_EXCESS_FRACTION) of its parked time on CPU above those bounds",
            self.pre_sleep_us,
            self.between_sleeps_pct_of_wait,
            self.post_wake_us,
            self.post_wake_pct_of_sleep,
            self.tolerated_hot_episodes,
            self.tolerated_hot_pct,
            self.tolerated_excess_pct
        )
    }
}

/// Where parked on-CPU time went: per segment of the parked episodes.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct SegmentReport {
    /// Episodes that ended (one per park).
    pub episodes: u64,
    /// Episodes whose figures are an even share of one on-CPU interval.
    pub episodes_split: u64,
    /// Real sleeps while parked.
    pub sleeps: u64,
    /// Hot episodes (ended hot, or open and hot so far).
    pub hot_episodes: u64,
    /// Mean on-CPU before the first sleep, µs per episode.
    pub pre_sleep_us_mean: f64,
    /// Mean on-CPU between sleeps, µs per episode.
    pub between_sleeps_us_mean: f64,
    /// Mean on-CPU after the last wake-up, µs per episode.
    pub post_wake_us_mean: f64,
    /// Largest pre-sleep segment, µs.
    pub pre_sleep_max_us: f64,
    /// Largest between-sleeps total of an episode, µs.
    pub between_sleeps_max_us: f64,
    /// Largest post-wake segment, µs.
    pub post_wake_max_us: f64,
    /// Episodes hot before the sleep.
    pub hot_pre_sleep: u64,
    /// Episodes hot between sleeps.
    pub hot_between_sleeps: u64,
    /// Episodes hot after the wake.
    pub hot_post_wake: u64,
    /// On-CPU time of the hot episodes above their bounds, µs.
    pub above_bounds_us: f64,
}

impl From<&ParkedWindow> for SegmentReport {
    fn from(w: &ParkedWindow) -> Self {
        let s = &w.segments;
        let mean = |ns: u64| {
            if s.episodes == 0 {
                0.0
            } else {
                ns as f64 / 1e3 / s.episodes as f64
            }
        };
        Self {
            episodes: s.episodes,
            episodes_split: s.episodes_split,
            sleeps: s.sleeps,
            hot_episodes: w.hot_episodes(),
            pre_sleep_us_mean: mean(s.pre_sleep_ns),
            between_sleeps_us_mean: mean(s.between_sleeps_ns),
            post_wake_us_mean: mean(s.post_wake_ns),
            pre_sleep_max_us: s.pre_sleep_max_ns as f64 / 1e3,
            between_sleeps_max_us: s.between_sleeps_max_ns as f64 / 1e3,
            post_wake_max_us: s.post_wake_max_ns as f64 / 1e3,
            hot_pre_sleep: s.hot_pre_sleep,
            hot_between_sleeps: s.hot_between_sleeps,
            hot_post_wake: s.hot_post_wake,
            above_bounds_us: w.hot_excess_ns() as f64 / 1e3,
        }
    }
}

impl fmt::Display for SegmentReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} episodes, {} sleeps; on CPU per episode: {:.1} us before the sleep, {:.1} us between sleeps, {:.1} us after the wake (largest {:.1} / {:.1} / {:.1} us); {} hot ({} before the sleep, {} between sleeps, {} after the wake), {:.1} us on CPU above the bounds",
            self.episodes,
            self.sleeps,
            self.pre_sleep_us_mean,
            self.between_sleeps_us_mean,
            self.post_wake_us_mean,
            self.pre_sleep_max_us,
            self.between_sleeps_max_us,
            self.post_wake_max_us,
            self.hot_episodes,
            self.hot_pre_sleep,
            self.hot_between_sleeps,
            self.hot_post_wake,
            self.above_bounds_us
        )
    }
}

/// One hot episode of a failing thread.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HotEpisodeReport {
    /// The segments over their bounds, e.g. `pre-sleep` or
    /// `pre-sleep+post-wake`.
    pub over: String,
    /// Wall time parked, ms.
    pub wait_ms: f64,
    /// Real sleeps.
    pub sleeps: u64,
    /// The sleep before the post-wake segment, ms.
    pub last_sleep_ms: f64,
    /// On-CPU before the first sleep, µs.
    pub pre_sleep_us: f64,
    /// On-CPU between sleeps, µs.
    pub between_sleeps_us: f64,
    /// On-CPU after the last wake-up, µs.
    pub post_wake_us: f64,
    /// Episodes this entry stands for (> 1: split evenly from one on-CPU
    /// interval).
    pub count: u64,
}

impl From<&HotEpisode> for HotEpisodeReport {
    fn from(e: &HotEpisode) -> Self {
        Self {
            over: hot_names(e.hot),
            wait_ms: e.wait_ns as f64 / 1e6,
            sleeps: e.sleeps,
            last_sleep_ms: e.last_sleep_ns as f64 / 1e6,
            pre_sleep_us: e.pre_sleep_ns as f64 / 1e3,
            between_sleeps_us: e.between_sleeps_ns as f64 / 1e3,
            post_wake_us: e.post_wake_ns as f64 / 1e3,
            count: e.count,
        }
    }
}

/// A thread with more hot episodes than it is allowed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailingThread {
    /// Thread id.
    pub tid: u32,
    /// Its parks.
    pub parks: u64,
    /// Wall time parked, ms.
    pub parked_ms: f64,
    /// On-CPU while parked, µs.
    pub parked_oncpu_us: f64,
    /// Run-queue while parked, µs.
    pub parked_runq_us: f64,
    /// Hot episodes it was allowed.
    pub tolerated_hot_episodes: u64,
    /// On-CPU time of its hot episodes above their bounds, µs.
    pub above_bounds_us: f64,
    /// What it was allowed of that, µs.
    pub tolerated_above_bounds_us: f64,
    /// Its segments.
    pub segments: SegmentReport,
    /// Its last hot episodes, oldest first.
    pub hot: Vec<HotEpisodeReport>,
}

impl FailingThread {
    /// The report of `t`.
    pub fn new(t: &ThreadReport) -> Self {
        let p = &t.parked;
        Self {
            tid: t.tid,
            parks: p.parks,
            parked_ms: p.parked_ns as f64 / 1e6,
            parked_oncpu_us: p.on_cpu_ns as f64 / 1e3,
            parked_runq_us: p.runq_ns as f64 / 1e3,
            tolerated_hot_episodes: p.tolerated,
            above_bounds_us: p.hot_excess_ns() as f64 / 1e3,
            tolerated_above_bounds_us: p.tolerated_excess_ns as f64 / 1e3,
            segments: SegmentReport::from(p),
            hot: t.hot.iter().map(HotEpisodeReport::from).collect(),
        }
    }
}

impl fmt::Display for HotEpisodeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} hot: waited {:.3} ms, {} sleeps (last {:.3} ms); on CPU {:.1} us before the sleep, {:.1} us between sleeps, {:.1} us after the wake{}",
            self.over,
            self.wait_ms,
            self.sleeps,
            self.last_sleep_ms,
            self.pre_sleep_us,
            self.between_sleeps_us,
            self.post_wake_us,
            if self.count > 1 {
                format!(" (each of {} episodes of one on-CPU interval)", self.count)
            } else {
                String::new()
            }
        )
    }
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
    /// Per throttler.
    pub throttlers: Vec<ThrottlerReport>,
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

fn mib(b: f64) -> f64 {
    b / (1 << 20) as f64
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(
            f,
            "slotring run: {:.1} s{}, {} scans x {} threads + short queries every {:?}, engine {}",
            self.elapsed_s,
            if self.interrupted {
                " (interrupted)"
            } else {
                ""
            },
            c.scans,
            c.scan_threads,
            c.short_query_interval,
            self.io.engine
        )?;
        if let Some(r) = &self.io.fallback_reason {
            writeln!(f, "  io_uring not used: {r}")?;
        }
        writeln!(
            f,
            "data file: {} ({:.0} MiB on {}{})",
            self.data_file.path,
            mib(self.data_file.size_bytes as f64),
            self.data_file.filesystem,
            if self.data_file.kept {
                ", kept"
            } else {
                ", removed"
            }
        )?;
        if let Some(end) = self.data_file.size_at_end_bytes
            && end != self.data_file.size_bytes
        {
            writeln!(
                f,
                "  the data file was {end} bytes at the end, not {}",
                self.data_file.size_bytes
            )?;
        }
        if let Some(d) = &self.data_file.disk_writes {
            let write_limit = self.config.max_local_write_bandwidth;
            writeln!(
                f,
                "  disk writes while creating it, 100 ms windows: peak {:.1} MiB/s, median {:.1} MiB/s \
                 (limit {}; neighbours' peak before: {:.1} MiB/s; {})",
                mib(d.peak_bytes_per_s),
                mib(d.median_bytes_per_s),
                if write_limit == 0 {
                    "unlimited".to_owned()
                } else {
                    format!("{:.1} MiB/s", mib(write_limit as f64))
                },
                mib(d.neighbours_peak_bytes_per_s),
                d.stat
            )?;
        }
        writeln!(f, "\nthrottlers (achieved vs configured):")?;
        writeln!(
            f,
            "  {:<12} {:>12} {:>12} {:>12} {:>9} {:>14} {:>9}",
            "name", "configured", "achieved", "sustained", "error", "page cache", "waited"
        )?;
        for t in &self.throttlers {
            let conf = if t.configured_bytes_per_s == 0 {
                "unlimited".to_owned()
            } else {
                format!("{:.1} MiB/s", mib(t.configured_bytes_per_s as f64))
            };
            let err = t
                .rate_error_pct
                .map_or("-".to_owned(), |e| format!("{e:.2}%"));
            writeln!(
                f,
                "  {:<12} {:>12} {:>7.1} MiB/s {:>6.1} MiB/s {:>9} {:>10.1} MiB {:>8.2}s",
                t.name,
                conf,
                mib(t.achieved_bytes_per_s),
                mib(t.sustained_bytes_per_s),
                err,
                mib(t.page_cache_bytes_not_charged as f64),
                t.wait_s
            )?;
        }
        writeln!(
            f,
            "  page-cache bytes not charged to the disk: {:.1} MiB ({} hits, {} NOWAIT misses, {} cachestat checks)",
            mib(self.io.page_cache_bytes as f64),
            self.io.page_cache_hits,
            self.io.nowait_misses,
            self.io.cachestat_checks
        )?;
        writeln!(
            f,
            "  reads: {} ({:.1} MiB), throttle waits booked: {} ({:.2} s)",
            self.io.reads,
            mib(self.io.read_bytes as f64),
            self.io.waits,
            self.io.wait_s
        )?;
        if self.io.reads_failed() {
            writeln!(
                f,
                "  FAILED READS: {} errors, {} short reads (end of file before {:.0} MiB){}",
                self.io.read_errors,
                self.io.short_reads,
                mib(self.data_file.size_bytes as f64),
                self.io
                    .first_read_error
                    .as_ref()
                    .map_or(String::new(), |e| format!("; first error: {e}"))
            )?;
        }
        let s = &self.slots;
        writeln!(
            f,
            "\nCPU slots: budget {} ({}), lease parking {}",
            s.max_concurrency,
            s.scheduler,
            if s.lease_parking { "on" } else { "off" }
        )?;
        writeln!(
            f,
            "  granted {}  delayed {}  acquired {} (+{} non-competing)  queries delayed {}  slot waits {:.2} s",
            s.slots_granted,
            s.slots_delayed,
            s.slots_acquired,
            s.slots_acquired_non_competing,
            s.queries_delayed,
            s.slot_wait_s
        )?;
        writeln!(
            f,
            "  parks {}  unparks {}  borrows {}  (at end: in use {}, borrowed {})",
            s.parks, s.unparks, s.unpark_borrows, s.in_use_at_end, s.borrowed_at_end
        )?;
        writeln!(
            f,
            "\nslots held per query over time (Jain's index of the scans: {:.4}; per-sample mean {:.4}; {} samples):",
            self.fairness.jain_scans, self.fairness.jain_instant_mean, self.fairness.samples
        )?;
        writeln!(
            f,
            "  {:<6} {:>4} {:>7} {:>8} {:>8} {:>10} {:>6} {:>9} {:>9} {:>10} {:>6}",
            "query",
            "id",
            "threads",
            "start",
            "end",
            "mean slots",
            "max",
            "MiB read",
            "slot wait",
            "disk share",
            "fair"
        )?;
        let pct = |v: Option<f64>| v.map_or("-".to_owned(), |p| format!("{p:.1}%"));
        let shorts: Vec<&QueryReport> = self
            .queries
            .iter()
            .filter(|q| q.kind == QueryKind::Short)
            .collect();
        for q in self.queries.iter().filter(|q| q.kind == QueryKind::Scan) {
            writeln!(
                f,
                "  {:<6} {:>4} {:>7} {:>7.2}s {:>7.2}s {:>10.2} {:>6} {:>9.1} {:>8.2}s {:>10} {:>6}",
                q.kind,
                q.id,
                q.threads.map_or("-".to_owned(), |t| t.to_string()),
                q.start_s,
                q.end_s,
                q.mean_slots,
                q.max_slots,
                mib(q.bytes as f64),
                q.slot_wait_s,
                pct(q.disk_share_pct),
                pct(q.fair_share_pct)
            )?;
        }
        if !shorts.is_empty() {
            let n = shorts.len() as f64;
            let lat: f64 = shorts.iter().map(|q| q.end_s - q.start_s).sum::<f64>() / n;
            let wait: f64 = shorts.iter().map(|q| q.slot_wait_s).sum::<f64>() / n;
            writeln!(
                f,
                "  {} short queries: mean duration {:.1} ms (p50 {:.1} ms, p99 {:.1} ms), mean slot wait {:.2} ms",
                shorts.len(),
                lat * 1e3,
                self.short_latency_ms.p50,
                self.short_latency_ms.p99,
                wait * 1e3
            )?;
        }
        let b = &self.adaptive;
        writeln!(
            f,
            "\nCPU slot budget: {} (ceiling {}): mean {:.2}, min {}, max {}; run-queue share of running leases {:.1}%; {} yields, {} controller windows{}",
            b.mode,
            b.ceiling,
            b.budget_mean,
            b.budget_min,
            b.budget_max,
            b.runq_share_pct,
            b.yields,
            b.windows,
            if b.probe_losses > 0 {
                format!(", probes lost {} times", b.probe_losses)
            } else {
                String::new()
            }
        )?;
        let k = &self.kernel;
        writeln!(f, "\nkernel verdict on parked threads:")?;
        if k.attached {
            writeln!(
                f,
                "  probes attached ({}); {} threads, {} parks, parked {:.2} s, on-CPU while parked {:.3} ms (raw ratio {:.4}%, a diagnostic), run-queue while parked {:.3} ms",
                k.attach_mode.map_or("?", attach_mode_name),
                k.threads,
                k.parks,
                k.parked_s,
                k.parked_oncpu_s * 1e3,
                k.parked_oncpu_pct,
                k.parked_runq_s * 1e3
            )?;
            writeln!(f, "  segments: {}", k.segments)?;
            writeln!(
                f,
                "  on-CPU per park {:.1} us; wake-up at unpark: mean {:.1} us, max {:.1} us; missed switch events {}",
                k.parked_oncpu_us_per_park,
                k.unpark_wake_avg_us,
                k.unpark_wake_max_us,
                k.missed_events
            )?;
        } else {
            writeln!(
                f,
                "  no probes: {}",
                k.reason.as_deref().unwrap_or("disabled")
            )?;
        }
        writeln!(f, "  rule: {}", k.rule)?;
        for t in &k.failing {
            writeln!(
                f,
                "  thread {} over the rule: {} of {} episodes hot (allowed {}), {:.1} us on CPU above the bounds (allowed {:.1} us); parked {:.3} ms in {} parks, {:.1} us of it on CPU, {:.1} us in the run queue",
                t.tid,
                t.segments.hot_episodes,
                t.segments.episodes,
                t.tolerated_hot_episodes,
                t.above_bounds_us,
                t.tolerated_above_bounds_us,
                t.parked_ms,
                t.parks,
                t.parked_oncpu_us,
                t.parked_runq_us
            )?;
            writeln!(f, "    segments: {}", t.segments)?;
            for e in &t.hot {
                writeln!(f, "    {e}")?;
            }
        }
        let verdict = match k.verdict {
            KernelVerdict::Pass => {
                "PASS: no parked thread had more hot episodes than it is allowed".to_owned()
            }
            KernelVerdict::Fail => format!(
                "FAIL: {} of {} threads used CPU while parked in more episodes than they are allowed (tids {:?}{})",
                k.failing_tids.len(),
                k.threads,
                &k.failing_tids[..k.failing_tids.len().min(6)],
                if k.failing_tids.len() > 6 {
                    ", …"
                } else {
                    ""
                }
            ),
            KernelVerdict::Unverified => format!(
                "UNVERIFIED ({})",
                k.reason.as_deref().unwrap_or("no probes")
            ),
        };
        writeln!(f, "  verdict: {verdict}")?;
        writeln!(
            f,
            "\nprocess: {:.2} CPU s, peak {} threads ({} query threads created)",
            self.process.cpu_s, self.process.peak_threads, self.process.query_threads
        )?;
        if let Some(a) = &self.metrics_addr {
            writeln!(f, "metrics were served at http://{a}/metrics")?;
        }
        Ok(())
    }
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
