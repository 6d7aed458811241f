//! `slotring run`: the embedded default workload.
//!
//! 1. Create the data file (default 1 GiB) with the IO engine, charged to
//!    the `local_write` throttler (64 MiB/s by default; the engine paces the
//!    writeback to it), `fsync` it and drop it from the page cache, so that
//!    scans read from the disk; `disk` watches what the block device wrote
//!    meanwhile.
//! 2. Start `scans` scan queries, each an allocation of up to
//!    `scan_threads` CPU slots with one thread per slot. A thread acquires a
//!    slot, makes it its current CPU lease, and for one `slot_quantum` reads
//!    the file sequentially (`read_size` per read) through the engine,
//!    charged to the block-device `local_read` throttler, doing
//!    `cpu_work_per_read` of CPU work between reads; then it gives the slot
//!    back and asks for one more (`set_max(+1)`), so the scheduler decides
//!    who runs next. While a read waits (throttle timeout SQE and the IO),
//!    the engine parks the lease: its slot stops counting and may go to a
//!    waiter. With `--workloads FILE` the reads are scheduled by the
//!    file's tree instead of `local_read`, and so are the CPU slots
//!    (`disk_workloads`: scans enter one leaf, short queries another).
//! 3. Every `short_query_interval` a short query starts: one slot, four
//!    64 KiB reads of the file's first 16 MiB (soon page-cache hits, which
//!    the block-device throttler does not charge) with CPU work between.
//! 4. A sampler records rates and slots per query every 100 ms, publishes
//!    the counters to the BPF maps and to `/metrics`, and drives the
//!    progress bars. At the end the kernel verifies the parked threads.
//!    `/metrics` is served from before step 1: while the data file is
//!    created, a publisher thread publishes the same counters (no query,
//!    no tenant yet) every 100 ms.
//!
//! Who owns what: `setup` makes everything the run needs before a query
//! starts (data directory and file, throttlers, CPU slots, probes);
//! `engines` opens one IO engine per query thread and sums their
//! counters; `workers` holds the state the query threads share and runs
//! them; `sampler` is the only reader of their statistics while they run
//! (the timeline, `/metrics`, the BPF maps, `progress`); `disk_workloads`
//! is the disk's workload tree when there is one; `assemble` turns
//! what is left at the end into the [`Report`]; `counters` is where
//! individual counter fields are listed.

mod assemble;
mod counters;
mod disk;
mod disk_workloads;
mod engines;
mod progress;
mod sampler;
mod setup;
mod waits;
mod workers;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use slotring::bpf::{RunqProbe, SlotringBpf};
use slotring::slots::SlotsError;
use slotring::throttle::ThrottleError;
use slotring::uring::UringError;

use crate::config::RunConfig;
use crate::report::{DataFile, DiskWrites, Report};

pub use setup::default_dir;
pub use waits::STOP_BOUND;
pub use workers::cpu_work;

/// What can stop `slotring run`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The data directory is unusable.
    #[error("data directory {path}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Creating, syncing or evicting the data file failed.
    #[error("data file {path}: {op}")]
    DataFile {
        /// The file.
        path: PathBuf,
        /// What failed (`create`, `fsync`, …).
        op: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// Writing the data file failed.
    #[error("data file {path}: write at {offset}")]
    DataFileWrite {
        /// The file.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// The engine's error.
        source: UringError,
    },
    /// Ctrl-C while the data file was being created.
    #[error("data file {path}: interrupted while creating")]
    Interrupted {
        /// The file.
        path: PathBuf,
    },
    /// A throttler refused a setting (a bad setting: exit code 2).
    #[error("--{option}: throttler {name} refuses the value")]
    Throttler {
        /// The option that set it.
        option: &'static str,
        /// The throttler.
        name: &'static str,
        /// Why.
        source: ThrottleError,
    },
    /// The disk's workload tree was refused (a bad setting: exit code 2).
    #[error("--workloads: the disk's workload tree")]
    Workloads {
        /// Why.
        source: slotring::throttle::WorkloadError,
    },
    /// A scan query's slot allocation was refused.
    #[error("allocating the CPU slots of scan {scan}")]
    Slots {
        /// The scan (1-based).
        scan: u32,
        /// Why.
        source: SlotsError,
    },
    /// The adaptive budget's configuration was refused.
    #[error("configuring the adaptive CPU slot budget")]
    Adaptive {
        /// Why.
        source: SlotsError,
    },
    /// A query thread could not be started.
    #[error("spawning thread {name}")]
    Spawn {
        /// The thread's name.
        name: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Period of the sampler (timeline, metrics, BPF publication, progress).
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(100);

/// Options that are not settings: how the run is presented and stopped,
/// and the workload tree of its reads.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Show progress bars on stderr (hidden anyway when it is not a terminal).
    pub progress: bool,
    /// Set to stop early (Ctrl-C); the report is still produced.
    pub stop: Arc<AtomicBool>,
    /// Allow `/metrics` on a non-loopback address.
    pub allow_remote: bool,
    /// The disk's workload tree (`--workloads`): the queries' reads are
    /// scheduled by it instead of `local_read`.
    pub workloads: Option<crate::config::IoWorkloads>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run the workload and build the report. Blocks for about `cfg.duration`
/// (plus creating the data file).
pub fn run(cfg: &RunConfig, opts: &RunOptions) -> Result<Report, RunError> {
    let stop = opts.stop.clone();
    let stopping = || stop.load(Ordering::Relaxed);
    let mut data = setup::DataDir::prepare(cfg)?;
    let (read, write) = setup::throttlers(cfg)?;
    let disk = opts
        .workloads
        .as_ref()
        .map(disk_workloads::DiskWorkloads::new)
        .transpose()?;
    let cc = setup::slots(cfg, disk.as_ref().map(disk_workloads::DiskWorkloads::tree));
    // `/metrics` from here on: the data file's paced write is throttled IO
    // worth watching too.
    let published = sampler::Published::default();
    let server = cfg
        .listen
        .and_then(|addr| published.serve(addr, opts.allow_remote));
    // Kernel probes before any query thread reports a lease state.
    let (bpf, unpin_on_abort) = setup::probes(cfg);
    let mut adaptive = setup::adaptive_budget(cfg, &cc, bpf.as_ref())?;
    // The running leases' run-queue share over the whole run, static or
    // adaptive (for the report).
    let mut runq = bpf.as_ref().map(SlotringBpf::runq_probe);
    if let Some(p) = runq.as_mut() {
        let _ = p.sample();
    }
    let mut progress = progress::Progress::new(opts.progress);
    let engines = engines::Engines::new(cfg.engine);

    // 1. The data file, and what the disk wrote meanwhile (the neighbours'
    // share sampled just before), with the counters published meanwhile.
    let source = sampler::Source {
        read: &read,
        write: &write,
        bpf: bpf.as_ref(),
        adaptive: adaptive.as_ref(),
        disk: disk.as_ref(),
        cc: &cc,
    };
    // Set once the file is written: it carries no data (`Relaxed`).
    let created = AtomicBool::new(false);
    let (file, stat, disk_sampler, neighbours, t_create) = std::thread::scope(|s| {
        let publisher = std::thread::Builder::new()
            .name("publish".into())
            .spawn_scoped(s, || {
                published.until(&source, &engines, &|| {
                    created.load(Ordering::Relaxed) || stopping()
                });
            });
        if let Err(e) = &publisher {
            eprintln!("slotring: not publishing while the data file is created: {e}");
        }
        let stat = data.path.parent().and_then(disk::block_stat);
        let neighbours = stat.as_ref().map(|s| {
            let noise = disk::DiskPeak::start(s.clone(), 0);
            waits::sleep_until(Instant::now() + Duration::from_millis(400), &stopping);
            noise.finish().0
        });
        let write_burst_bytes =
            (setup::WRITE_BURST.as_secs_f64() * cfg.max_local_write_bandwidth as f64) as u64;
        let disk_sampler = stat
            .as_ref()
            .map(|s| disk::DiskPeak::start(s.clone(), write_burst_bytes));
        let t_create = Instant::now();
        let file = setup::create_data_file(
            cfg,
            data.take_file().expect("prepare created the data file"),
            &data.path,
            &write,
            &engines,
            &stop,
            &progress.data_file(cfg.file_size),
        );
        created.store(true, Ordering::Relaxed);
        (file, stat, disk_sampler, neighbours, t_create)
    });
    let file = file?;
    let create_s = t_create.elapsed().as_secs_f64();
    let write_debt_at_end = counters::debt_now(&write);
    let disk_writes = match (stat, disk_sampler, neighbours) {
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

    // 2. Queries, watched by the sampler, which serves /metrics meanwhile.
    let start = Instant::now();
    let cpu0 = setup::process_cpu_s();
    let live = Arc::new(
        workers::Live::new(
            cfg.clone(),
            start,
            stop.clone(),
            file,
            read.clone(),
            cc.clone(),
            engines,
        )
        .with_workloads(disk),
    );
    progress.start_queries(cfg.duration);
    let workers = workers::start(&live, &mut progress)?;

    // 3. The sampler runs on this thread until every query thread is done.
    let mut sampler = sampler::Sampler::new(
        &live,
        &write,
        bpf.as_ref(),
        adaptive.as_ref(),
        &progress,
        published,
    );
    sampler.run_until_stopping();
    workers.join();
    let elapsed = start.elapsed().as_secs_f64();
    let read_debt_at_end = counters::debt_now(&read);
    let cpu_s = setup::process_cpu_s() - cpu0;
    sampler.sample();
    let sampled = sampler.finish();
    progress.finish();
    let metrics_addr = server.as_ref().map(|s| s.addr().to_string());
    drop(server);

    // 4. Report.
    let runq = runq.as_mut().and_then(RunqProbe::sample);
    let adaptive = adaptive.as_mut().map(|a| {
        a.stop();
        a.status()
    });
    let kernel = assemble::kernel_report(bpf.as_ref(), cfg.probes);
    drop(unpin_on_abort);
    drop(bpf); // detaches the probes and removes the pins
    let data_file = DataFile {
        path: data.path.display().to_string(),
        size_bytes: cfg.file_size,
        size_at_end_bytes: data.size_now(),
        filesystem: data.filesystem.name.clone(),
        create_s,
        kept: cfg.keep,
        disk_writes,
    };
    let interrupted = stop.load(Ordering::Relaxed);
    drop(data); // removes the data file unless kept
    Ok(assemble::report(assemble::Finished {
        live: &live,
        elapsed_s: elapsed,
        interrupted,
        data_file,
        read: &read,
        write: &write,
        read_debt_at_end,
        write_debt_at_end,
        sampled,
        kernel,
        cpu_s,
        metrics_addr,
        runq,
        adaptive,
    }))
}
