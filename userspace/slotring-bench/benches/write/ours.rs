//! Our runs: writers through one of slotring-uring's front ends (or the
//! tokio baseline), each at its share of the limit, measured by the
//! sampler and the meters until every byte is on the device.

use std::num::NonZeroU32;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slotring_throttle::{ThrottlePtr, Throttler, UNLIMITED_BLOCK};
use slotring_uring::{
    IoEngine, PacedWrites, Policy, PreadEngine, RealSyscalls, RingConfig, SharedConfig,
    SharedEngine, Syscalls, UringCounters, UringEngine, UringFile,
};
use tokio::io::AsyncWriteExt;

use crate::device::{Stall, fresh_disk, stall_on};
use crate::meter::{KworkerMeter, cpu_s, machine_cpu_s};
use crate::windows::{debug_windows, device_held_s, dirty_bytes, peak, sampler};
use crate::{BURST, CELL, CHUNK, GIB, MIB, PIECE, TOTAL, WINDOW, limit_rate};

/// The writeback cap of our runs: the default, or `SLOTRING_WRITE_CAP_MS`
/// (0: off, only the per-request depth), to compare settings.
pub(crate) fn cap_setting() -> Option<Duration> {
    match std::env::var("SLOTRING_WRITE_CAP_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
        None => Policy::default().writeback_cap,
    }
}

/// The catch-up of our runs: the default, or
/// `SLOTRING_WRITE_CATCH_UP_PERMILLE` (0: forfeit what the bucket collected
/// while the device held the writers back).
pub(crate) fn catch_up_setting() -> u32 {
    std::env::var("SLOTRING_WRITE_CATCH_UP_PERMILLE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(Policy::default().writeback_catch_up_permille)
}

/// One run's numbers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) peak_ratio: f64,
    pub(crate) host_peak_ratio: f64,
    pub(crate) rate_error_pct: f64,
    pub(crate) throughput_ratio: f64,
    /// The rate error over the time the device allowed: without
    /// [`Run::held_s`].
    pub(crate) rate_error_pct_unheld: f64,
    /// The throughput over the time the device allowed.
    pub(crate) throughput_ratio_unheld: f64,
    pub(crate) dirty_mb_max: f64,
    /// The process's CPU (io-wq included) until its writers end, and the
    /// kernel workers' (the flusher, the loop device) until every byte is
    /// on the device.
    pub(crate) cpu_s_per_gb: f64,
    /// The process's alone.
    pub(crate) process_cpu_s_per_gb: f64,
    pub(crate) machine_cpu_s_per_gb: f64,
    pub(crate) drain_s: f64,
    /// [`device_held_s`] with the writeback cap in flight.
    pub(crate) held_s: f64,
}

/// Which front end the writers write through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writer {
    /// `UringEngine::write_at` (blocking; a paced write in the writer's
    /// own thread): the bench's own.
    Blocking,
    /// `SharedEngine::write_at` from a tokio task, its paced writes where
    /// it says.
    Shared(PacedWrites),
    /// The ring's own paced path, through the ticket API.
    Tickets,
    /// The `pread` engine.
    Pread,
    /// The baseline for the async front end: what a tokio service writes
    /// without slotring. `tokio::fs::File` from a task, a `governor`
    /// limiter (the writers' one, 100 ms of burst) awaited per 256 KiB
    /// piece, and, paced, `sync_file_range` with our flags on tokio's
    /// blocking pool after each piece (as RocksDB's `bytes_per_sync` does
    /// in its own thread): two hand-offs per piece.
    TokioFs,
}

impl Writer {
    /// `SLOTRING_WRITE_ENGINE` (quick runs): `ring` (the ticket API),
    /// `shared`, `shared-ring`, `pread`, `tokio-fs`; otherwise the blocking
    /// front end.
    pub(crate) fn from_env() -> Self {
        match std::env::var("SLOTRING_WRITE_ENGINE").as_deref() {
            Ok("ring") => Writer::Tickets,
            Ok("shared") => Writer::Shared(PacedWrites::default()),
            Ok("shared-ring") => Writer::Shared(PacedWrites::Ring),
            Ok("pread") => Writer::Pread,
            Ok("tokio-fs") => Writer::TokioFs,
            _ => Writer::Blocking,
        }
    }
}

/// The baseline's limiter (`governor`'s direct one).
type Governor = governor::DefaultDirectRateLimiter;

/// What every writer of a run does: the same settings, its own file.
#[derive(Debug, Clone, Copy)]
struct Job {
    writer: Writer,
    policy: Policy,
    paced: bool,
    /// The writers' request size.
    chunk: usize,
    /// Bytes each writer writes.
    share: u64,
    /// The run's start (a writer reports its end from it).
    t0: Instant,
}

impl Job {
    /// Write the share into `f` through the writer's front end; when the
    /// writer ended (from the run's start) and its engine's counters.
    fn write(
        self,
        f: &Arc<UringFile>,
        limit: &ThrottlePtr,
        governor: &Governor,
    ) -> (Duration, UringCounters) {
        let cfg = RingConfig {
            policy: self.policy,
            ..RingConfig::default()
        };
        let buf = vec![0x5a; self.chunk];
        match self.writer {
            Writer::Tickets => {
                let mut e = UringEngine::new(&cfg).unwrap();
                self.requests(buf, |buf, off| {
                    let t = e.submit_write(f, buf, off, Some(limit), UNLIMITED_BLOCK);
                    let c = e.wait(t).unwrap();
                    (c.result.unwrap() as u64, c.buf)
                });
                (self.t0.elapsed(), e.counters())
            }
            Writer::Shared(paced_writes) => self.shared(cfg, paced_writes, f, limit, buf),
            Writer::TokioFs => self.tokio_fs(f, governor, buf),
            Writer::Blocking | Writer::Pread => {
                let mut e: Box<dyn IoEngine> = if self.writer == Writer::Pread {
                    Box::new(PreadEngine::new(self.policy))
                } else {
                    Box::new(UringEngine::new(&cfg).unwrap())
                };
                self.requests(buf, |buf, off| {
                    let (r, b) = e.write_at(f, buf, off, Some(limit), UNLIMITED_BLOCK);
                    (r.unwrap() as u64, b)
                });
                (self.t0.elapsed(), e.counters())
            }
        }
    }

    /// Write the share in requests of `buf`'s size: `one(buf, off)` writes
    /// one at `off` and returns the bytes written and the buffer.
    fn requests(self, mut buf: Vec<u8>, mut one: impl FnMut(Vec<u8>, u64) -> (u64, Vec<u8>)) {
        let mut off = 0;
        while off < self.share {
            let (n, b) = one(buf, off);
            off += n;
            buf = b;
        }
    }

    /// [`Writer::Shared`], in a current-thread runtime of its own.
    fn shared(
        self,
        cfg: RingConfig,
        paced_writes: PacedWrites,
        f: &Arc<UringFile>,
        limit: &ThrottlePtr,
        mut buf: Vec<u8>,
    ) -> (Duration, UringCounters) {
        let rt = current_thread_runtime();
        rt.block_on(async move {
            let e = SharedEngine::new(&SharedConfig {
                ring: cfg,
                rings: 1,
                paced_writes,
                ..SharedConfig::default()
            })
            .unwrap();
            let mut off = 0;
            while off < self.share {
                let (r, b) = e.write_at(f, buf, off, Some(limit), UNLIMITED_BLOCK).await;
                off += r.unwrap() as u64;
                buf = b;
            }
            (self.t0.elapsed(), e.counters())
        })
    }

    /// [`Writer::TokioFs`], in a current-thread runtime of its own.
    fn tokio_fs(
        self,
        f: &Arc<UringFile>,
        governor: &Governor,
        buf: Vec<u8>,
    ) -> (Duration, UringCounters) {
        let rt = current_thread_runtime();
        let std_file = f.file().try_clone().unwrap();
        rt.block_on(async move {
            let mut file = tokio::fs::File::from_std(std_file);
            let cells = NonZeroU32::new((PIECE / CELL) as u32).expect("a piece");
            let mut off = 0;
            while off < self.share {
                for piece in buf.chunks(PIECE as usize) {
                    governor.until_n_ready(cells).await.unwrap();
                    file.write_all(piece).await.unwrap();
                    if self.paced {
                        // The write has returned (tokio::fs writes on the
                        // pool): its pages are dirty. Now their writeback.
                        file.flush().await.unwrap();
                        let fd = f.file().as_raw_fd();
                        let len = piece.len() as u64;
                        tokio::task::spawn_blocking(move || {
                            RealSyscalls.sync_file_range(fd, off, len, true)
                        })
                        .await
                        .unwrap()
                        .unwrap();
                    }
                    off += piece.len() as u64;
                }
            }
            file.flush().await.unwrap();
            (self.t0.elapsed(), UringCounters::default())
        })
    }
}

/// A writer's own tokio runtime (current-thread, IO and time enabled).
fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// What the writers' engines saw, over all of them.
#[derive(Debug, Default)]
struct Joined {
    /// When the last writer ended, s from the run's start.
    write_s: f64,
    /// The highest engine's dirty high-water mark.
    high_water: u64,
    cap_waits: u64,
    writeback_us: u64,
    writebacks: u64,
}

impl Joined {
    fn of(handles: Vec<std::thread::JoinHandle<(Duration, UringCounters)>>) -> Self {
        let mut j = Joined::default();
        for h in handles {
            let (el, wb) = h.join().unwrap();
            j.write_s = j.write_s.max(el.as_secs_f64());
            j.high_water = j.high_water.max(wb.dirty_high_water_bytes);
            j.cap_waits += wb.writeback_cap_waits;
            j.writeback_us += wb.writeback_us;
            j.writebacks += wb.writeback_submissions;
        }
        j
    }
}

/// The writers' limit, a block-device throttler at the limit with
/// [`BURST`].
fn disk_throttler() -> Arc<Throttler> {
    Arc::new(
        Throttler::builder(limit_rate())
            .burst(BURST)
            .limits_block_device_bandwidth(true)
            .name("disk")
            .build()
            .unwrap(),
    )
}

/// The baseline's limiter, shared by its writers as the throttler is:
/// cells of 64 KiB, the same rate and burst.
fn baseline_limiter() -> Arc<Governor> {
    let cells = u32::try_from(limit_rate() / CELL).expect("rate in cells fits");
    let burst = (limit_rate() as f64 * BURST.as_secs_f64() / CELL as f64) as u32;
    let q = governor::Quota::per_second(NonZeroU32::new(cells).expect("a cell a second"))
        .allow_burst(NonZeroU32::new(burst.max((PIECE / CELL) as u32)).expect("a piece"));
    Arc::new(governor::RateLimiter::direct(q))
}

/// `writers` files in `dir`, created empty.
fn open_files(dir: &Path, writers: usize, paced: bool) -> (Vec<PathBuf>, Vec<Arc<UringFile>>) {
    let paths: Vec<PathBuf> = (0..writers)
        .map(|i| dir.join(format!("w{i}-{}", u8::from(paced))))
        .collect();
    let files = paths
        .iter()
        .map(|p| {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(p)
                .unwrap();
            UringFile::new(f).unwrap()
        })
        .collect();
    (paths, files)
}

/// One run. Its machine CPU includes the neighbours' (printed beforehand as
/// the machine's busy rate while nothing of ours runs): compare it on a
/// quiet machine.
pub(crate) fn run(
    dir: &Path,
    dev: &Path,
    host: &Path,
    paced: bool,
    writers: usize,
    writer: Writer,
    stall: Option<Stall>,
) -> Run {
    let throttler = disk_throttler();
    let limit: ThrottlePtr = throttler.clone();
    let governor = baseline_limiter();
    let policy = Policy {
        pace_writeback: paced,
        writeback_cap: cap_setting(),
        writeback_catch_up_permille: catch_up_setting(),
        ..Policy::default()
    };
    // SLOTRING_WRITE_CHUNK_KIB: the writers' request size (a debugging aid;
    // default 1 MiB).
    let chunk = std::env::var("SLOTRING_WRITE_CHUNK_KIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(CHUNK, |k| k << 10);
    let (paths, files) = open_files(dir, writers, paced);
    let shared = Arc::new(Mutex::new(files.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let s = sampler(dev.to_path_buf(), host.to_path_buf(), shared, stop.clone());
    let cpu0 = cpu_s();
    let machine0 = machine_cpu_s();
    let kworkers = KworkerMeter::start();
    let t0 = Instant::now();
    let stalled = stall.map(|s| s.start(dir));
    let job = Job {
        writer,
        policy,
        paced,
        chunk,
        share: TOTAL / writers as u64,
        t0,
    };
    let handles: Vec<_> = files
        .iter()
        .cloned()
        .map(|f| {
            let (limit, governor) = (limit.clone(), governor.clone());
            std::thread::spawn(move || job.write(&f, &limit, &governor))
        })
        .collect();
    let joined = Joined::of(handles);
    let write_s = joined.write_s;
    if let Some(h) = stalled {
        h.join().unwrap();
    }
    let cap_high = slotring_uring::writeback_high_water(&throttler).unwrap_or(0);
    let cpu = cpu_s() - cpu0;
    // Until every byte is on the device (bounded: the kernel's own flush
    // takes up to dirty_expire + one writeback interval).
    let t_written = Instant::now();
    while dirty_bytes(&files) > 0 && t_written.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(WINDOW);
    let drained_s = t0.elapsed().as_secs_f64();
    let machine = machine_cpu_s() - machine0;
    stop.store(true, Ordering::Relaxed);
    let kworker = kworkers.seconds();
    let windows = s.join().unwrap();
    debug_windows(&format!("paced={paced} writers={writers}"), &windows);
    drop(files);
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    let disk_total: u64 = windows.iter().map(|w| w.dev).sum();
    let expected = limit_rate() as f64 * drained_s;
    // What the run had under writeback at most (the cap, or a piece).
    let held_s = device_held_s(&windows, write_s, cap_high.max(PIECE));
    let allowed = limit_rate() as f64 * (drained_s - held_s);
    let r = Run {
        peak_ratio: peak(&windows, |w| w.dev),
        host_peak_ratio: peak(&windows, |w| w.host),
        rate_error_pct: (disk_total as f64 - expected).abs() / expected * 100.0,
        throughput_ratio: TOTAL as f64 / write_s / limit_rate() as f64,
        rate_error_pct_unheld: (disk_total as f64 - allowed).abs() / allowed * 100.0,
        throughput_ratio_unheld: TOTAL as f64 / (write_s - held_s) / limit_rate() as f64,
        dirty_mb_max: windows.iter().map(|w| w.dirty).max().unwrap_or(0) as f64 / MIB as f64,
        cpu_s_per_gb: (cpu + kworker) / (TOTAL as f64 / GIB as f64),
        process_cpu_s_per_gb: cpu / (TOTAL as f64 / GIB as f64),
        machine_cpu_s_per_gb: machine / (TOTAL as f64 / GIB as f64),
        drain_s: drained_s - write_s,
        held_s,
    };
    print_run(&r, paced, writers, writer, &joined, cap_high);
    r
}

/// One line per run: its numbers and what its engines saw.
fn print_run(r: &Run, paced: bool, writers: usize, writer: Writer, j: &Joined, cap_high: u64) {
    let cap_waits = j.cap_waits;
    eprintln!(
        "  {:<10} {writers} writer(s){}: peak {:.2}x (disk incl. neighbours {:.2}x), \
         rate error {:.2} %, throughput {:.3}, dirty max {:.1} MiB (engine high-water \
         {:.2} MiB; under writeback at once {:.2} MiB, cap waits {cap_waits}), {:.3} CPU s/GiB \
         (process {:.3} + kernel workers; machine, until on the device: {:.3}), written in {:.1} s, \
         on the device {:.1} s later{}",
        if paced { "paced" } else { "pagecache" },
        match writer {
            Writer::Blocking => String::new(),
            w => format!(" ({w:?})"),
        },
        r.peak_ratio,
        r.host_peak_ratio,
        r.rate_error_pct,
        r.throughput_ratio,
        r.dirty_mb_max,
        j.high_water as f64 / MIB as f64,
        cap_high as f64 / MIB as f64,
        r.cpu_s_per_gb,
        r.process_cpu_s_per_gb,
        r.machine_cpu_s_per_gb,
        j.write_s,
        r.drain_s,
        // Unpaced writers wait for no device: nothing held them.
        if paced {
            format!(
                "; the device held the writers {:.1} s (writeback latency per piece {:.2} ms; \
                 over the time it allowed: throughput {:.3}, rate error {:.2} %)",
                r.held_s,
                j.writeback_us as f64 / 1000.0 / j.writebacks.max(1) as f64,
                r.throughput_ratio_unheld,
                r.rate_error_pct_unheld
            )
        } else {
            String::new()
        }
    );
}

/// One [`run`] on a fresh filesystem (a loop device's, unless `on_loop` is
/// false): the runs are compared with one another (CPU above all), so none
/// inherits another's state.
pub(crate) fn fresh_run(
    host: &Path,
    host_stat: &Path,
    paced: bool,
    writers: usize,
    on_loop: bool,
) -> Run {
    fresh_run_of(
        host,
        host_stat,
        paced,
        writers,
        on_loop,
        Writer::Blocking,
        None,
    )
}

pub(crate) fn fresh_run_of(
    host: &Path,
    host_stat: &Path,
    paced: bool,
    writers: usize,
    on_loop: bool,
    writer: Writer,
    stall: Option<Stall>,
) -> Run {
    let (disk, dir, dev_stat) = fresh_disk(host, on_loop);
    let stall = stall_on(disk.as_ref(), stall);
    let r = run(&dir, &dev_stat, host_stat, paced, writers, writer, stall);
    drop(disk);
    r
}
