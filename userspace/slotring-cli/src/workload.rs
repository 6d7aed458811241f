//! `slotring run`: the embedded default workload.
//!
//! 1. Create the data file (default 1 GiB) with the IO engine, charged to
//!    the `local_write` throttler, `fsync` it and drop it from the page
//!    cache, so that scans read from the disk.
//! 2. Start `scans` scan queries, each an allocation of up to
//!    `scan_threads` CPU slots with one thread per slot. A thread acquires a
//!    slot, makes it its current CPU lease, and for one `slot_quantum` reads
//!    the file sequentially (`read_size` per read) through the engine,
//!    charged to the block-device `local_read` throttler, doing
//!    `cpu_work_per_read` of CPU work between reads; then it gives the slot
//!    back and asks for one more (`set_max(+1)`), so the scheduler decides
//!    who runs next. While a read waits (throttle timeout SQE and the IO),
//!    the engine parks the lease: its slot stops counting and may go to a
//!    waiter.
//! 3. Every `short_query_interval` a short query starts: one slot, four
//!    64 KiB reads of the file's first 16 MiB (soon page-cache hits, which
//!    the block-device throttler does not charge) with CPU work between.
//! 4. A sampler records rates and slots per query every 100 ms, publishes
//!    the counters to the BPF maps and to `/metrics`, and drives the
//!    progress bars. At the end the kernel verifies the parked threads.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use slotring::bpf::{
    AttachMode, BpfConfig, ProbeStatus, SlotringBpf, ThrottleStats, Verdict, VerifyConfig,
};
use slotring::slots::{Allocation, ConcurrencyControl, SlotsError};
use slotring::throttle::{ThrottlePtr, Throttler};
use slotring::uring::{IoEngine, PreadEngine, RingConfig, UringCounters, UringEngine, UringFile};

use crate::config::{EngineKind, RunConfig};
use crate::http::{MetricsServer, render_registry};
use crate::report::{
    DataFile, DiskWrites, FailingThread, FairnessReport, IoReport, KernelReport, ProcessReport,
    QueryReport, Report, SlotsReport, ThrottlerReport, Timeline, jain,
};
use slotring::metrics::SlotringCollector;
use slotring::pinned::{self, ThreadState};
use slotring::snapshot::{NamedThrottler, Snapshot};

/// What can stop `slotring run`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The data directory is unusable.
    #[error("data directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Creating, writing or reading the data file failed.
    #[error("data file {path}: {detail}")]
    DataFile {
        /// The file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// A throttler or slot setting was refused.
    #[error("{0}")]
    Setup(String),
}

/// Period of the sampler (timeline, metrics, BPF publication, progress).
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(100);
const SHORT_REGION: u64 = 16 << 20;
const SHORT_READ: usize = 64 << 10;
const SHORT_READS: u32 = 4;
const MAX_LIVE_SHORT: u64 = 64;
const MAX_BLOCK: Duration = Duration::from_secs(30);

/// Options that are not settings: how the run is presented and stopped.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Show progress bars on stderr (hidden anyway when it is not a terminal).
    pub progress: bool,
    /// Set to stop early (Ctrl-C); the report is still produced.
    pub stop: Arc<AtomicBool>,
    /// Allow `/metrics` on a non-loopback address.
    pub allow_remote: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct QueryState {
    id: u32,
    scan: bool,
    start: Instant,
    end: Mutex<Option<Instant>>,
    held: AtomicU64,
    reads: AtomicU64,
    bytes: AtomicU64,
    slot_wait_ns: AtomicU64,
    /// Sum of samples of `held` and number of samples while live.
    held_sum: AtomicU64,
    samples: AtomicU64,
    max_held: AtomicU64,
}

impl QueryState {
    fn new(id: u32, scan: bool) -> Arc<Self> {
        Arc::new(Self {
            id,
            scan,
            start: Instant::now(),
            end: Mutex::new(None),
            held: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            slot_wait_ns: AtomicU64::new(0),
            held_sum: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            max_held: AtomicU64::new(0),
        })
    }
    fn live(&self) -> bool {
        lock(&self.end).is_none()
    }
    fn finish(&self) {
        *lock(&self.end) = Some(Instant::now());
    }
}

/// State shared by the query threads and the sampler. Every counter is an
/// independent statistic (`Relaxed`).
struct Live {
    cfg: RunConfig,
    start: Instant,
    deadline: Instant,
    stop: Arc<AtomicBool>,
    file: Arc<UringFile>,
    read: Arc<Throttler>,
    read_ptr: ThrottlePtr,
    cc: ConcurrencyControl,
    queries: Mutex<Vec<Arc<QueryState>>>,
    engines: Mutex<HashMap<u64, UringCounters>>,
    next_engine: AtomicU64,
    query_threads: AtomicU64,
    live_short: AtomicU64,
    fallback_reason: Mutex<Option<String>>,
    engine_kind: Mutex<&'static str>,
}

impl Live {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }

    fn engine(&self) -> Box<dyn IoEngine> {
        let e: Box<dyn IoEngine> = match self.cfg.engine {
            EngineKind::Fallback => Box::new(PreadEngine::new(RingConfig::default().policy)),
            EngineKind::IoUring => match UringEngine::new(&RingConfig::default()) {
                Ok(e) => Box::new(e),
                Err(err) => {
                    let mut r = lock(&self.fallback_reason);
                    if r.is_none() {
                        eprintln!("slotring: io_uring unavailable, using pread: {err}");
                        *r = Some(err.to_string());
                    }
                    Box::new(PreadEngine::new(RingConfig::default().policy))
                }
            },
        };
        *lock(&self.engine_kind) = e.kind();
        e
    }

    fn record_engine(&self, id: u64, c: UringCounters) {
        lock(&self.engines).insert(id, c);
    }

    fn uring_total(&self) -> UringCounters {
        lock(&self.engines).values().sum()
    }
}

/// Spend about `d` of CPU hashing `buf` (the "query processing" between
/// reads). Returns the hash so the work cannot be optimised away.
pub fn cpu_work(buf: &[u8], d: Duration) -> u64 {
    let start = Instant::now();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    if buf.is_empty() {
        return h;
    }
    let mut i = 0usize;
    loop {
        for chunk in buf[i..].chunks(8).take(512) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x0100_0000_01b3);
        }
        i = (i + 4096) % buf.len();
        if start.elapsed() >= d {
            return std::hint::black_box(h);
        }
    }
}

fn fs_name(path: &Path) -> String {
    match nix::sys::statfs::statfs(path) {
        Ok(s) => match s.filesystem_type().0 {
            0x0102_1994 => "tmpfs".into(),
            0xef53 => "ext4".into(),
            0x5846_5342 => "xfs".into(),
            0x9123_683e => "btrfs".into(),
            0x794c_7630 => "overlayfs".into(),
            0x6969 => "nfs".into(),
            0x8584_58f6 => "ramfs".into(),
            other => format!("fs-magic-{other:#x}"),
        },
        Err(e) => format!("unknown ({e})"),
    }
}

/// The default data directory: `$TMPDIR`, else `/var/tmp` (on a disk on
/// most systems, unlike `/tmp` which is often tmpfs).
pub fn default_dir() -> PathBuf {
    std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"))
}

/// Removes the data file on drop unless kept (also on error and Ctrl-C).
struct DataFileGuard {
    path: PathBuf,
    keep: bool,
}

impl Drop for DataFileGuard {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn create_data_file(
    cfg: &RunConfig,
    path: &Path,
    write: &ThrottlePtr,
    live_engine: &mut dyn IoEngine,
    stop: &AtomicBool,
    bar: &ProgressBar,
) -> Result<Arc<UringFile>, RunError> {
    let err = |detail: String| RunError::DataFile {
        path: path.to_owned(),
        detail,
    };
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| err(format!("create: {e}")))?;
    let file = UringFile::new(f).map_err(|e| err(e.to_string()))?;
    let chunk = 1usize << 20;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; chunk];
    let mut off = 0u64;
    while off < cfg.file_size {
        if stop.load(Ordering::Relaxed) {
            return Err(err("interrupted while creating".into()));
        }
        let n = chunk.min((cfg.file_size - off) as usize);
        buf.resize(n, 0);
        for w in buf.chunks_mut(8) {
            // xorshift64: incompressible, cheap.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            w.copy_from_slice(&b[..w.len()]);
        }
        let (r, b) = live_engine.write_at(&file, buf, off, Some(write), MAX_BLOCK);
        buf = b;
        let written = r.map_err(|e| err(format!("write at {off}: {e}")))?;
        off += written as u64;
        bar.set_position(off);
    }
    file.file()
        .sync_all()
        .map_err(|e| err(format!("fsync: {e}")))?;
    file.evict().map_err(|e| err(format!("evict: {e}")))?;
    // No readahead: the disk reads what the queries ask for, and all of it
    // is charged (readahead would pull data in unthrottled).
    file.advise_random()
        .map_err(|e| err(format!("fadvise(RANDOM): {e}")))?;
    Ok(file)
}

/// The `/sys/dev/block/<major>:<minor>/stat` of the block device `dir`
/// lives on, if it has one (a partition has its own).
fn block_stat(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let stat = PathBuf::from(format!(
        "/sys/dev/block/{}:{}/stat",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    ));
    stat.exists().then_some(stat)
}

/// Bytes written so far per a block-device stat file (field 7, sectors).
fn sectors_written(stat: &Path) -> Option<u64> {
    std::fs::read_to_string(stat)
        .ok()?
        .split_whitespace()
        .nth(6)?
        .parse::<u64>()
        .ok()
        .map(|s| s * 512)
}

/// Samples a block device's writes in 100 ms windows on its own thread:
/// each window's rate (bytes over the window's real length, at least
/// 100 ms; `burst` bytes are taken off the first window).
/// Dropped unfinished (a failed run), it stops its thread.
struct DiskPeak {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<f64>>>,
}

impl Drop for DiskPeak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl DiskPeak {
    const WINDOW: Duration = Duration::from_millis(100);

    fn start(stat: PathBuf, burst: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut rates = Vec::new();
            let mut prev = sectors_written(&stat).unwrap_or(0);
            let mut last = Instant::now();
            let mut first = true;
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(Self::WINDOW);
                let now = sectors_written(&stat).unwrap_or(prev);
                let at = Instant::now();
                let mut bytes = now.saturating_sub(prev);
                if first {
                    bytes = bytes.saturating_sub(burst);
                    first = false;
                }
                let secs = (at - last).as_secs_f64().max(Self::WINDOW.as_secs_f64());
                rates.push(bytes as f64 / secs);
                prev = now;
                last = at;
            }
            rates
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }

    /// Stop after one more window; the peak and the median window rate.
    fn finish(mut self) -> (f64, f64) {
        std::thread::sleep(Self::WINDOW);
        self.stop.store(true, Ordering::Relaxed);
        let mut rates = self
            .handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        rates.sort_by(f64::total_cmp);
        let peak = rates.last().copied().unwrap_or(0.0);
        let median = rates.get(rates.len() / 2).copied().unwrap_or(0.0);
        (peak, median)
    }
}

fn process_cpu_s() -> f64 {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => 0.0,
    }
}

fn process_threads() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn scan_worker(
    live: Arc<Live>,
    q: Arc<QueryState>,
    alloc: Arc<Allocation>,
    cursor: Arc<AtomicU64>,
    max: Arc<AtomicU64>,
) {
    let id = live.next_engine.fetch_add(1, Ordering::Relaxed);
    let mut engine = live.engine();
    let size = live.cfg.file_size;
    let rs = live.cfg.read_size;
    let mut buf = vec![0u8; rs as usize];
    'outer: while !live.stopping() {
        let remaining = live.deadline.saturating_duration_since(Instant::now());
        // Wake up now and then to notice Ctrl-C.
        let t0 = Instant::now();
        let slot = alloc.acquire_timeout(remaining.min(Duration::from_millis(200)));
        q.slot_wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut slot = match slot {
            Ok(s) => s,
            Err(SlotsError::Timeout { .. }) => continue,
            Err(_) => break,
        };
        q.held.fetch_add(1, Ordering::Relaxed);
        {
            let _current = live.cfg.lease_parking.then(|| slot.make_current());
            let started = Instant::now();
            while started.elapsed() < live.cfg.slot_quantum {
                if live.stopping() {
                    q.held.fetch_sub(1, Ordering::Relaxed);
                    break 'outer;
                }
                let off = cursor.fetch_add(rs, Ordering::Relaxed) % size;
                let off = off.min(size.saturating_sub(rs));
                let (r, b) = engine.read_at(&live.file, buf, off, Some(&live.read_ptr), MAX_BLOCK);
                buf = b;
                if buf.len() != rs as usize {
                    buf = vec![0u8; rs as usize];
                }
                if let Ok(n) = r {
                    q.reads.fetch_add(1, Ordering::Relaxed);
                    q.bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                live.record_engine(id, engine.counters());
                cpu_work(&buf, live.cfg.cpu_work_per_read);
            }
        }
        drop(slot);
        q.held.fetch_sub(1, Ordering::Relaxed);
        // Ask for one more slot over the allocation's life.
        let m = max.fetch_add(1, Ordering::Relaxed) + 1;
        if alloc.set_max(m).is_err() {
            break;
        }
    }
    live.record_engine(id, engine.counters());
}

fn short_query(live: Arc<Live>, q: Arc<QueryState>, seed: u64) {
    let id = live.next_engine.fetch_add(1, Ordering::Relaxed);
    let run = || -> Option<()> {
        let alloc = live.cc.allocate(1, 1).ok()?;
        let t0 = Instant::now();
        let slot = alloc.acquire_timeout(Duration::from_secs(5));
        q.slot_wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut slot = slot.ok()?;
        q.held.fetch_add(1, Ordering::Relaxed);
        let mut engine = live.engine();
        {
            let _current = live.cfg.lease_parking.then(|| slot.make_current());
            let region = SHORT_REGION.min(live.cfg.file_size) / SHORT_READ as u64;
            let mut x = seed | 1;
            let mut buf = vec![0u8; SHORT_READ];
            for _ in 0..SHORT_READS {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let off = (x % region.max(1)) * SHORT_READ as u64;
                let (r, b) = engine.read_at(&live.file, buf, off, Some(&live.read_ptr), MAX_BLOCK);
                buf = b;
                if let Ok(n) = r {
                    q.reads.fetch_add(1, Ordering::Relaxed);
                    q.bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                if buf.len() != SHORT_READ {
                    buf = vec![0u8; SHORT_READ];
                }
                cpu_work(&buf, live.cfg.cpu_work_per_read / 2);
            }
        }
        live.record_engine(id, engine.counters());
        drop(slot);
        q.held.fetch_sub(1, Ordering::Relaxed);
        Some(())
    };
    let _ = run();
    q.finish();
    live.live_short.fetch_sub(1, Ordering::Relaxed);
}

/// Kernel-side outcome gathered before the BPF instance drops.
struct KernelOutcome {
    report: KernelReport,
}

fn kernel_report(bpf: Option<&SlotringBpf>, probes_wanted: bool) -> KernelOutcome {
    let Some(bpf) = bpf else {
        return KernelOutcome {
            report: KernelReport {
                attached: false,
                attach_mode: None,
                reason: Some(if probes_wanted {
                    "probes could not be loaded".into()
                } else {
                    "probes disabled (probes = false)".into()
                }),
                verdict: "unverified".into(),
                max_parked_cpu_ratio: VerifyConfig::default().max_parked_cpu_ratio,
                per_park_allowance_us: VerifyConfig::default().per_park_allowance_ns as f64 / 1e3,
                threads: 0,
                failing_tids: vec![],
                failing: vec![],
                parks: 0,
                parked_s: 0.0,
                parked_oncpu_s: 0.0,
                parked_oncpu_pct: 0.0,
                parked_runq_s: 0.0,
                unpark_wake_avg_us: 0.0,
                unpark_wake_max_us: 0.0,
                missed_events: 0,
                parked_oncpu_us_per_park: 0.0,
            },
        };
    };
    let (attached, mode, reason) = match bpf.status() {
        ProbeStatus::Attached(m) => (
            true,
            Some(match m {
                AttachMode::TpBtf => "tp_btf".to_owned(),
                AttachMode::RawTp => "raw_tp".to_owned(),
            }),
            None,
        ),
        ProbeStatus::Degraded(e) => (false, None, Some(e.to_string())),
    };
    let cfg = VerifyConfig::default();
    let tids = bpf.threads();
    let mut r = KernelReport {
        attached,
        attach_mode: mode,
        reason,
        verdict: "unverified".into(),
        max_parked_cpu_ratio: cfg.max_parked_cpu_ratio,
        per_park_allowance_us: cfg.per_park_allowance_ns as f64 / 1e3,
        threads: tids.len() as u64,
        failing_tids: vec![],
        failing: vec![],
        parks: 0,
        parked_s: 0.0,
        parked_oncpu_s: 0.0,
        parked_oncpu_pct: 0.0,
        parked_runq_s: 0.0,
        unpark_wake_avg_us: 0.0,
        unpark_wake_max_us: 0.0,
        missed_events: 0,
        parked_oncpu_us_per_park: 0.0,
    };
    match bpf.verify(&tids, cfg) {
        Ok(v) => {
            let t = &v.total;
            r.parks = t.parks;
            r.parked_s = t.parked_ns as f64 / 1e9;
            r.parked_oncpu_s = t.parked_on_cpu_ns as f64 / 1e9;
            r.parked_oncpu_pct = t.parked_cpu_ratio() * 100.0;
            r.parked_runq_s = t.parked_runq_ns as f64 / 1e9;
            r.unpark_wake_avg_us =
                t.unpark_lat_ns.checked_div(t.unpark_wakeups).unwrap_or(0) as f64 / 1e3;
            r.unpark_wake_max_us = t.unpark_lat_max_ns as f64 / 1e3;
            r.missed_events = t.missed_events;
            r.verdict = match v.verdict {
                Verdict::Pass => "pass".into(),
                Verdict::Fail { tids } => {
                    r.failing = v
                        .threads
                        .iter()
                        .filter(|t| !t.pass)
                        .take(8)
                        .map(|t| FailingThread {
                            tid: t.tid,
                            parks: t.parks,
                            parked_ms: t.parked_ns as f64 / 1e6,
                            parked_oncpu_us: t.parked_on_cpu_ns as f64 / 1e3,
                            parked_runq_us: t.parked_runq_ns as f64 / 1e3,
                        })
                        .collect();
                    r.failing_tids = tids;
                    "fail".into()
                }
                Verdict::Unverified { reason } => {
                    if r.reason.is_none() {
                        r.reason = Some(reason);
                    }
                    "unverified".into()
                }
            };
        }
        Err(e) => r.reason = Some(format!("verification failed: {e}")),
    }
    if r.attached && r.parks == 0 {
        // Nothing parked: nothing was verified (e.g. lease parking off).
        r.verdict = "unverified".into();
        r.reason = Some("no CPU lease was parked during the run".into());
    }
    r.parked_oncpu_us_per_park = if r.parks == 0 {
        0.0
    } else {
        r.parked_oncpu_s * 1e6 / r.parks as f64
    };
    KernelOutcome { report: r }
}

fn kernel_snapshot(bpf: &SlotringBpf) -> Option<slotring::snapshot::KernelSnapshot> {
    if !bpf.is_attached() {
        return None;
    }
    let now = pinned::monotonic_ns();
    let threads: Vec<ThreadState> = bpf
        .threads()
        .into_iter()
        .filter_map(|tid| {
            Some(ThreadState {
                tid,
                lease: bpf.lease_slot(tid).ok()?,
                acct: bpf.thread_acct(tid).ok()?,
            })
        })
        .collect();
    Some(pinned::kernel_from_threads(
        &threads,
        now,
        bpf.hist_park_cpu().slots,
        bpf.hist_unpark_rq().slots,
    ))
}

fn throttle_report(t: &Throttler, elapsed: f64) -> ThrottlerReport {
    let c = t.counters();
    let burst = if c.max_speed == 0 {
        0
    } else {
        (t.burst().as_secs_f64() * c.max_speed as f64) as u64
    };
    let achieved = c.amount as f64 / elapsed.max(1e-9);
    let sustained = c.amount.saturating_sub(burst) as f64 / elapsed.max(1e-9);
    let saturated = c.waits > 0;
    ThrottlerReport {
        name: t.name().to_owned(),
        configured_bytes_per_s: c.max_speed,
        burst_bytes: burst,
        charged_bytes: c.amount,
        page_cache_bytes_not_charged: c.page_cache_amount,
        achieved_bytes_per_s: achieved,
        sustained_bytes_per_s: sustained,
        rate_error_pct: (c.max_speed > 0 && saturated)
            .then(|| (sustained - c.max_speed as f64).abs() / c.max_speed as f64 * 100.0),
        saturated,
        wait_s: c.wait_us as f64 / 1e6,
        waits: c.waits,
    }
}

/// Run the workload and build the report. Blocks for about `cfg.duration`
/// (plus creating the data file).
pub fn run(cfg: &RunConfig, opts: &RunOptions) -> Result<Report, RunError> {
    let stop = opts.stop.clone();
    let dir = cfg.dir.clone().unwrap_or_else(default_dir);
    std::fs::create_dir_all(&dir).map_err(|source| RunError::Dir {
        path: dir.clone(),
        source,
    })?;
    let filesystem = fs_name(&dir);
    if filesystem == "tmpfs" || filesystem == "ramfs" {
        eprintln!(
            "slotring: warning: {} is on {filesystem}: its reads are memory, not disk (use --dir on a real disk)",
            dir.display()
        );
    }
    let path = dir.join(format!("slotring-data-{}.bin", std::process::id()));
    let guard = DataFileGuard {
        path: path.clone(),
        keep: cfg.keep,
    };

    let setup = |e: slotring::throttle::ThrottleError| RunError::Setup(e.to_string());
    let read = Arc::new(
        Throttler::builder(cfg.max_local_read_bandwidth)
            .name("local_read")
            .limits_block_device_bandwidth(true)
            .build()
            .map_err(setup)?,
    );
    // A burst of 100 ms of the rate: the disk should see the write limit
    // over any 100 ms window (the engine paces the writeback to it).
    let write_burst = Duration::from_millis(100);
    let write = Arc::new(
        Throttler::builder(cfg.max_local_write_bandwidth)
            .name("local_write")
            .burst(write_burst)
            .limits_block_device_bandwidth(true)
            .build()
            .map_err(setup)?,
    );
    let read_ptr: ThrottlePtr = read.clone();
    let write_ptr: ThrottlePtr = write.clone();

    let cc = ConcurrencyControl::new();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    cc.set_max_concurrency(ConcurrencyControl::max_concurrency_from_settings(
        cfg.concurrent_threads_soft_limit_num,
        cfg.concurrent_threads_soft_limit_ratio_to_cores,
        cores,
    ));
    cc.set_scheduler(cfg.concurrent_threads_scheduler);

    // Kernel probes (before any query thread reports a lease state).
    let bpf = if cfg.probes {
        let b = match SlotringBpf::load(BpfConfig {
            pin_dir: cfg.pin_dir.clone(),
            ..BpfConfig::default()
        }) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("slotring: running without kernel probes: {e}");
                SlotringBpf::degraded(e)
            }
        };
        slotring::bpf::install_observer();
        Some(b)
    } else {
        None
    };

    let multi = MultiProgress::with_draw_target(if opts.progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let bytes_style = ProgressStyle::with_template(
        "{prefix:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
    )
    .expect("valid template")
    .progress_chars("=> ");

    // 1. The data file.
    let create_bar = multi.add(ProgressBar::new(cfg.file_size));
    create_bar.set_style(bytes_style.clone());
    create_bar.set_prefix("data file");
    // The disk's writes while the file is created and synced, and the
    // neighbours' share just before.
    let stat = block_stat(&dir);
    let neighbours = stat.as_ref().map(|s| {
        let noise = DiskPeak::start(s.clone(), 0);
        std::thread::sleep(Duration::from_millis(400));
        noise.finish().0
    });
    let write_burst_bytes =
        (write_burst.as_secs_f64() * cfg.max_local_write_bandwidth as f64) as u64;
    let peak = stat
        .as_ref()
        .map(|s| DiskPeak::start(s.clone(), write_burst_bytes));
    let t_create = Instant::now();
    let file = {
        let engine_cfg = Live::engine_for(cfg);
        let (mut engine, reason) = engine_cfg;
        let f = create_data_file(cfg, &path, &write_ptr, engine.as_mut(), &stop, &create_bar);
        let counters = engine.counters();
        create_bar.finish_with_message("ready (cold)");
        (f?, counters, reason, engine.kind())
    };
    let (file, create_counters, early_reason, first_kind) = file;
    let create_s = t_create.elapsed().as_secs_f64();
    let disk_writes = match (stat, peak, neighbours) {
        (Some(stat), Some(sampler), Some(neighbours)) => {
            let (peak, median) = sampler.finish();
            Some(DiskWrites {
                stat: stat.display().to_string(),
                peak_bytes_per_s: peak,
                median_bytes_per_s: median,
                neighbours_peak_bytes_per_s: neighbours,
            })
        }
        _ => None,
    };

    // 2. Queries.
    let start = Instant::now();
    let cpu0 = process_cpu_s();
    let live = Arc::new(Live {
        cfg: cfg.clone(),
        start,
        deadline: start + cfg.duration,
        stop: stop.clone(),
        file,
        read: read.clone(),
        read_ptr,
        cc: cc.clone(),
        queries: Mutex::new(Vec::new()),
        engines: Mutex::new(HashMap::new()),
        next_engine: AtomicU64::new(1),
        query_threads: AtomicU64::new(0),
        live_short: AtomicU64::new(0),
        fallback_reason: Mutex::new(early_reason),
        engine_kind: Mutex::new(first_kind),
    });
    live.record_engine(0, create_counters);

    // Metrics: the sampler refreshes this snapshot; the server renders it.
    let snapshot = Arc::new(Mutex::new(Snapshot::default()));
    let server = match cfg.listen {
        Some(addr) => {
            let s = snapshot.clone();
            let registry = prometheus::Registry::new();
            registry
                .register(Box::new(SlotringCollector::new(move || lock(&s).clone())))
                .expect("a fresh registry has no clashing names");
            match MetricsServer::start(addr, opts.allow_remote, render_registry(registry)) {
                Ok(srv) => {
                    // The bound address (`--listen 127.0.0.1:0` picks a port).
                    eprintln!(
                        "slotring: serving metrics at http://{}/metrics while running",
                        srv.addr()
                    );
                    Some(srv)
                }
                Err(e) => {
                    eprintln!("slotring: not serving /metrics: {e}");
                    None
                }
            }
        }
        None => None,
    };

    let time_bar = multi.add(ProgressBar::new(cfg.duration.as_millis() as u64));
    time_bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {elapsed}/{duration} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    time_bar.set_prefix("queries");

    let mut handles: Vec<JoinHandle<()>> = Vec::new();
    let mut scan_bars = Vec::new();
    let mut next_id = 1u32;
    let mut scan_states = Vec::new();
    for i in 0..cfg.scans {
        let q = QueryState::new(next_id, true);
        next_id += 1;
        lock(&live.queries).push(q.clone());
        scan_states.push(q.clone());
        let alloc = Arc::new(
            cc.allocate(1, u64::from(cfg.scan_threads))
                .map_err(|e| RunError::Setup(e.to_string()))?,
        );
        let max = Arc::new(AtomicU64::new(u64::from(cfg.scan_threads)));
        let cursor = Arc::new(AtomicU64::new(
            (cfg.file_size / u64::from(cfg.scans)) * u64::from(i) / cfg.read_size * cfg.read_size,
        ));
        let bar = multi.add(ProgressBar::new_spinner());
        bar.set_style(
            ProgressStyle::with_template("{prefix:>12} {bytes:>10} read  {msg}")
                .expect("valid template"),
        );
        bar.set_prefix(format!("scan {}", i + 1));
        scan_bars.push(bar);
        for t in 0..cfg.scan_threads {
            let (live, q, alloc, cursor, max) = (
                live.clone(),
                q.clone(),
                alloc.clone(),
                cursor.clone(),
                max.clone(),
            );
            live.query_threads.fetch_add(1, Ordering::Relaxed);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("scan{}-{t}", i + 1))
                    .spawn(move || scan_worker(live, q, alloc, cursor, max))
                    .map_err(|e| RunError::Setup(format!("spawning a thread: {e}")))?,
            );
        }
    }

    // Short queries come from their own spawner.
    let spawner = {
        let live = live.clone();
        let mut id = next_id;
        std::thread::Builder::new()
            .name("short-spawner".into())
            .spawn(move || {
                let mut shorts = Vec::new();
                let every = live.cfg.short_query_interval;
                if every.is_zero() {
                    return shorts;
                }
                let mut next = Instant::now();
                let mut seed = 0x2545_f491_4f6c_dd1du64;
                while !live.stopping() {
                    next += every;
                    if live.live_short.load(Ordering::Relaxed) < MAX_LIVE_SHORT {
                        let q = QueryState::new(id, false);
                        id += 1;
                        lock(&live.queries).push(q.clone());
                        live.live_short.fetch_add(1, Ordering::Relaxed);
                        live.query_threads.fetch_add(1, Ordering::Relaxed);
                        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        let (l, s) = (live.clone(), seed);
                        if let Ok(h) = std::thread::Builder::new()
                            .name(format!("short{}", q.id))
                            .spawn(move || short_query(l, q, s))
                        {
                            shorts.push(h);
                        } else {
                            live.live_short.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                }
                shorts
            })
            .map_err(|e| RunError::Setup(format!("spawning a thread: {e}")))?
    };

    // 3. The sampler runs on this thread until every query thread is done.
    let mut timeline = Timeline {
        scan_slots: vec![Vec::new(); cfg.scans as usize],
        ..Timeline::default()
    };
    let mut jain_sum = 0.0;
    let mut jain_n = 0u64;
    let mut peak_threads = 0u64;
    let mut last_t = 0.0;
    let mut last_amount = read.counters().amount;
    let mut last_cache = live.uring_total().page_cache_bytes;
    let mut sample = |live: &Live, timeline: &mut Timeline| {
        let t = live.start.elapsed().as_secs_f64();
        let slots = live.cc.counters();
        let uring = live.uring_total();
        let rc = live.read.counters();
        let dt = (t - last_t).max(1e-6);
        timeline.t_s.push(t);
        timeline
            .disk_bytes_per_s
            .push((rc.amount - last_amount) as f64 / dt);
        timeline
            .page_cache_bytes_per_s
            .push(uring.page_cache_bytes.saturating_sub(last_cache) as f64 / dt);
        last_t = t;
        last_amount = rc.amount;
        last_cache = uring.page_cache_bytes;
        let queries = lock(&live.queries).clone();
        let mut short = 0;
        let mut scan_live = Vec::new();
        let mut si = 0;
        for q in &queries {
            let held = q.held.load(Ordering::Relaxed);
            if q.live() {
                q.held_sum.fetch_add(held, Ordering::Relaxed);
                q.samples.fetch_add(1, Ordering::Relaxed);
                q.max_held.fetch_max(held, Ordering::Relaxed);
            }
            if q.scan {
                timeline.scan_slots[si].push(held);
                si += 1;
                if q.live() {
                    scan_live.push(held as f64);
                }
            } else if q.live() {
                short += held;
            }
        }
        if scan_live.len() >= 2 && !live.stopping() {
            jain_sum += jain(&scan_live);
            jain_n += 1;
        }
        timeline.short_slots.push(short);
        timeline.slots_in_use.push(slots.cur_concurrency);
        timeline.leases_parked.push(slots.parked);
        peak_threads = peak_threads.max(process_threads());
        // Publish: BPF maps and /metrics.
        let throttlers = vec![
            NamedThrottler {
                name: "local_read".into(),
                counters: rc,
            },
            NamedThrottler {
                name: "local_write".into(),
                counters: write.counters(),
            },
        ];
        if let Some(b) = &bpf {
            for (i, th) in throttlers.iter().enumerate() {
                let _ = b.publish_throttle(i as u32, &ThrottleStats::new(&th.name, &th.counters));
            }
            b.publish_slots(&slots);
            b.publish_uring(&uring);
        }
        *lock(&snapshot) = Snapshot {
            throttlers,
            slots,
            uring,
            kernel: bpf.as_ref().and_then(kernel_snapshot),
        };
        time_bar.set_position((t * 1e3) as u64);
        time_bar.set_message(format!(
            "disk {:.1} MiB/s  slots {}/{}  parked {}",
            timeline.disk_bytes_per_s.last().copied().unwrap_or(0.0) / (1 << 20) as f64,
            slots.cur_concurrency,
            slots.max_concurrency,
            slots.parked
        ));
        for (bar, q) in scan_bars.iter().zip(&scan_states) {
            bar.set_position(q.bytes.load(Ordering::Relaxed));
            bar.set_message(format!("{} slots", q.held.load(Ordering::Relaxed)));
        }
    };
    loop {
        std::thread::sleep(SAMPLE_PERIOD);
        sample(&live, &mut timeline);
        if live.stopping() {
            break;
        }
    }
    // Wait for the query threads; keep sampling so /metrics stays fresh.
    for h in handles {
        while !h.is_finished() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = h.join();
    }
    for s in &scan_states {
        s.finish();
    }
    let shorts = spawner.join().unwrap_or_default();
    for h in shorts {
        let _ = h.join();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu_s = process_cpu_s() - cpu0;
    sample(&live, &mut timeline);
    time_bar.finish_with_message("done");
    for b in &scan_bars {
        b.finish();
    }
    let _ = multi.clear();
    let metrics_addr = server.as_ref().map(|s| s.addr().to_string());
    drop(server);

    // 4. Report.
    let kernel = kernel_report(bpf.as_ref(), cfg.probes).report;
    drop(bpf); // detaches the probes and removes the pins
    let slots = cc.counters();
    let uring = live.uring_total();
    let queries: Vec<QueryReport> = lock(&live.queries)
        .iter()
        .map(|q| {
            let end = lock(&q.end).unwrap_or_else(Instant::now);
            let samples = q.samples.load(Ordering::Relaxed);
            QueryReport {
                id: q.id,
                kind: if q.scan { "scan" } else { "short" }.into(),
                start_s: q.start.duration_since(start).as_secs_f64(),
                end_s: end.duration_since(start).as_secs_f64(),
                reads: q.reads.load(Ordering::Relaxed),
                bytes: q.bytes.load(Ordering::Relaxed),
                mean_slots: q.held_sum.load(Ordering::Relaxed) as f64 / samples.max(1) as f64,
                max_slots: q.max_held.load(Ordering::Relaxed),
                slot_wait_s: q.slot_wait_ns.load(Ordering::Relaxed) as f64 / 1e9,
            }
        })
        .collect();
    let scan_means: Vec<f64> = queries
        .iter()
        .filter(|q| q.kind == "scan")
        .map(|q| q.mean_slots)
        .collect();
    let interrupted = stop.load(Ordering::Relaxed);
    let kept = cfg.keep;
    drop(guard);
    Ok(Report {
        config: cfg.clone(),
        elapsed_s: elapsed,
        interrupted,
        data_file: DataFile {
            path: path.display().to_string(),
            size_bytes: cfg.file_size,
            filesystem,
            create_s,
            kept,
            disk_writes,
        },
        throttlers: vec![
            throttle_report(&read, elapsed),
            throttle_report(&write, create_s),
        ],
        io: IoReport {
            engine: lock(&live.engine_kind).to_string(),
            fallback_reason: lock(&live.fallback_reason).clone(),
            reads: uring.reads,
            read_bytes: uring.read_bytes,
            write_bytes: uring.write_bytes,
            page_cache_hits: uring.page_cache_hits,
            page_cache_bytes: uring.page_cache_bytes,
            nowait_misses: uring.nowait_misses,
            cachestat_checks: uring.cachestat_checks,
            waits: uring.waits_submitted,
            wait_s: uring.wait_us as f64 / 1e6,
        },
        slots: SlotsReport {
            max_concurrency: slots.max_concurrency,
            scheduler: cfg.concurrent_threads_scheduler.to_string(),
            lease_parking: cfg.lease_parking,
            slots_granted: slots.slots_granted,
            slots_delayed: slots.slots_delayed,
            slots_acquired: slots.slots_acquired,
            slots_acquired_non_competing: slots.slots_acquired_non_competing,
            queries_delayed: slots.queries_delayed,
            slot_wait_s: slots.wait_us as f64 / 1e6,
            parks: slots.parks,
            unparks: slots.unparks,
            unpark_borrows: slots.unpark_borrows,
            borrowed_at_end: slots.borrowed,
            in_use_at_end: slots.cur_concurrency,
        },
        fairness: FairnessReport {
            jain_scans: jain(&scan_means),
            jain_instant_mean: if jain_n == 0 {
                1.0
            } else {
                jain_sum / jain_n as f64
            },
            samples: jain_n,
        },
        queries,
        kernel,
        process: ProcessReport {
            peak_threads,
            query_threads: live.query_threads.load(Ordering::Relaxed),
            cpu_s,
        },
        metrics_addr,
        timeline,
    })
}

impl Live {
    /// The engine used to create the data file, and why io_uring was not
    /// used if it was wanted.
    fn engine_for(cfg: &RunConfig) -> (Box<dyn IoEngine>, Option<String>) {
        match cfg.engine {
            EngineKind::Fallback => (
                Box::new(PreadEngine::new(RingConfig::default().policy)),
                None,
            ),
            EngineKind::IoUring => match UringEngine::new(&RingConfig::default()) {
                Ok(e) => (Box::new(e), None),
                Err(err) => {
                    eprintln!("slotring: io_uring unavailable, using pread: {err}");
                    (
                        Box::new(PreadEngine::new(RingConfig::default().policy)),
                        Some(err.to_string()),
                    )
                }
            },
        }
    }
}
