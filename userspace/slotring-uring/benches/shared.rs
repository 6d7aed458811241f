//! `cargo xtask bench shared`: how the `Send` async handle (`SharedEngine`)
//! should reach the task's `Waker`, measured side by side in one run on
//! page-cache-hot 64 KiB reads (where the front end's overhead shows; a
//! cold read is dominated by the disk):
//!
//! * shared rings (1, or one per worker) with the reactor pump or with a
//!   reaper thread, on tokio's multi-thread runtime (2 workers);
//! * the current-thread `LocalEngine`, one runtime + ring per thread
//!   (thread-per-core);
//! * `tokio::fs` style: `pread` on the blocking pool (what a service does
//!   without us).
//!
//! Writes `target/bench/shared.json`. Nothing here asserts a wall time.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};
use slotring_benchkit::{Report, disk_dir, median, percentile};
use slotring_throttle::{MAX_RATE, ThrottlePtr, Throttler, UNLIMITED_BLOCK};
use slotring_uring::{LocalEngine, Reaper, RingConfig, SharedConfig, SharedEngine, UringFile};

const FILE_LEN: usize = 64 << 20;
const CHUNK: usize = 64 << 10;
const WORKERS: usize = 2;
const TASKS: usize = 64;
const READS_PER_TASK: usize = 400;
const ROUNDS: usize = 5;

fn make_file(path: &Path) -> Arc<UringFile> {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap();
    let block: Vec<u8> = (0..1 << 20).map(|j: usize| (j * 7) as u8).collect();
    for _ in 0..FILE_LEN >> 20 {
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
    let f = UringFile::new(f).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < FILE_LEN as u64 {
        off += f.file().read_at(&mut buf, off).unwrap() as u64;
    }
    f
}

fn cpu_s() -> f64 {
    let u = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(u.user_time()) + t(u.system_time())
}

/// A block-device throttler that never blocks but makes page-cache detection
/// run (as in a real server).
fn disk_throttle() -> ThrottlePtr {
    Arc::new(
        Throttler::builder(MAX_RATE)
            .limits_block_device_bandwidth(true)
            .build()
            .unwrap(),
    )
}

/// One measurement: reads/s, CPU µs per read, p99 latency µs.
struct Run {
    rps: f64,
    cpu_us: f64,
    p99_us: f64,
}

fn offset(task: usize, i: usize) -> u64 {
    (((task * 7919 + i * 104_729) * CHUNK) % FILE_LEN) as u64
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .unwrap()
}

fn shared_run(f: &Arc<UringFile>, reaper: Reaper, rings: usize) -> Run {
    let rt = multi_thread();
    rt.block_on(async {
        let e = SharedEngine::new(&SharedConfig {
            ring: RingConfig::default(),
            rings,
            reaper,
            ..SharedConfig::default()
        })
        .unwrap();
        let t = disk_throttle();
        let (c0, t0) = (cpu_s(), Instant::now());
        let mut hs = Vec::new();
        for task in 0..TASKS {
            let (e, f, t) = (e.clone(), f.clone(), t.clone());
            hs.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(READS_PER_TASK);
                let mut buf = vec![0u8; CHUNK];
                for i in 0..READS_PER_TASK {
                    let s = Instant::now();
                    let (r, b) = e
                        .read_at(&f, buf, offset(task, i), Some(&t), UNLIMITED_BLOCK)
                        .await;
                    assert_eq!(r.unwrap(), CHUNK);
                    buf = b;
                    lat.push(s.elapsed().as_secs_f64() * 1e6);
                }
                lat
            }));
        }
        let mut lat = Vec::new();
        for h in hs {
            lat.extend(h.await.unwrap());
        }
        finish(t0, c0, &mut lat)
    })
}

fn finish(t0: Instant, c0: f64, lat: &mut [f64]) -> Run {
    let n = (TASKS * READS_PER_TASK) as f64;
    Run {
        rps: n / t0.elapsed().as_secs_f64(),
        cpu_us: (cpu_s() - c0) * 1e6 / n,
        p99_us: percentile(lat, 99.0),
    }
}

/// Thread-per-core: one current-thread runtime and one `LocalEngine` per
/// thread, the tasks split between them.
fn per_thread_run(f: &Arc<UringFile>) -> Run {
    let (c0, t0) = (cpu_s(), Instant::now());
    let threads: Vec<_> = (0..WORKERS)
        .map(|w| {
            let f = f.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async {
                    let e = LocalEngine::new(&RingConfig::default()).unwrap();
                    let t = disk_throttle();
                    let mut hs = Vec::new();
                    for task in (w..TASKS).step_by(WORKERS) {
                        let (e, f, t) = (e.clone(), f.clone(), t.clone());
                        hs.push(tokio::task::spawn_local(async move {
                            let mut lat = Vec::with_capacity(READS_PER_TASK);
                            let mut buf = vec![0u8; CHUNK];
                            for i in 0..READS_PER_TASK {
                                let s = Instant::now();
                                let (r, b) = e
                                    .read_at(&f, buf, offset(task, i), Some(&t), UNLIMITED_BLOCK)
                                    .await;
                                assert_eq!(r.unwrap(), CHUNK);
                                buf = b;
                                lat.push(s.elapsed().as_secs_f64() * 1e6);
                            }
                            lat
                        }));
                    }
                    let mut lat = Vec::new();
                    for h in hs {
                        lat.extend(h.await.unwrap());
                    }
                    lat
                })
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in threads {
        lat.extend(t.join().unwrap());
    }
    finish(t0, c0, &mut lat)
}

/// What `tokio::fs` does: each read is a `pread` on the blocking pool.
fn blocking_pool_run(f: &Arc<UringFile>) -> Run {
    let rt = multi_thread();
    rt.block_on(async {
        let (c0, t0) = (cpu_s(), Instant::now());
        let mut hs = Vec::new();
        for task in 0..TASKS {
            let f = f.clone();
            hs.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(READS_PER_TASK);
                let mut buf = vec![0u8; CHUNK];
                for i in 0..READS_PER_TASK {
                    let s = Instant::now();
                    let f2 = f.clone();
                    let off = offset(task, i);
                    buf = tokio::task::spawn_blocking(move || {
                        assert_eq!(f2.file().read_at(&mut buf, off).unwrap(), CHUNK);
                        buf
                    })
                    .await
                    .unwrap();
                    lat.push(s.elapsed().as_secs_f64() * 1e6);
                }
                lat
            }));
        }
        let mut lat = Vec::new();
        for h in hs {
            lat.extend(h.await.unwrap());
        }
        finish(t0, c0, &mut lat)
    })
}

struct RemoveOnDrop(PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn main() {
    let mut report = Report::new("shared");
    let path = disk_dir().join(format!("slotring-shared-bench-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(path.clone());
    let f = make_file(&path);
    type Variant<'a> = (&'a str, &'a str, Box<dyn Fn() -> Run + 'a>);
    let variants: Vec<Variant<'_>> = vec![
        (
            "reactor_1ring",
            "SharedEngine, 1 ring, reactor pump (multi-thread, 2 workers)",
            Box::new(|| shared_run(&f, Reaper::Reactor, 1)),
        ),
        (
            "reactor_2rings",
            "SharedEngine, a ring per worker, reactor pump",
            Box::new(|| shared_run(&f, Reaper::Reactor, WORKERS)),
        ),
        (
            "thread_1ring",
            "SharedEngine, 1 ring, reaper thread",
            Box::new(|| shared_run(&f, Reaper::Thread, 1)),
        ),
        (
            "thread_2rings",
            "SharedEngine, a ring per worker, a reaper thread each",
            Box::new(|| shared_run(&f, Reaper::Thread, WORKERS)),
        ),
        (
            "per_thread",
            "LocalEngine, a current-thread runtime + ring per thread (thread-per-core)",
            Box::new(|| per_thread_run(&f)),
        ),
        (
            "blocking_pool",
            "pread on tokio's blocking pool (what tokio::fs does)",
            Box::new(|| blocking_pool_run(&f)),
        ),
    ];
    let mut results: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = vec![Default::default(); variants.len()];
    // Interleaved rounds: background load on the shared machine hits every
    // variant alike.
    for _ in 0..ROUNDS {
        for (i, (_, _, run)) in variants.iter().enumerate() {
            let r = run();
            results[i].0.push(r.rps);
            results[i].1.push(r.cpu_us);
            results[i].2.push(r.p99_us);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let base = median(&mut results[variants.len() - 1].0.clone());
    for (i, (key, note, _)) in variants.iter().enumerate() {
        let rps = median(&mut results[i].0);
        report.put(&format!("hot_rps_{key}"), rps, note);
        report.put(
            &format!("hot_cpu_us_per_read_{key}"),
            median(&mut results[i].1),
            "CPU µs per read",
        );
        report.put(
            &format!("hot_p99_us_{key}"),
            median(&mut results[i].2),
            "read latency p99, µs",
        );
        report.put(
            &format!("hot_rps_ratio_{key}"),
            rps / base,
            "× the blocking pool",
        );
    }
    report.finish().expect("write the report");
}
