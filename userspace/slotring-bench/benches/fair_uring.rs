//! `cargo xtask bench fair`, its io_uring part: the fair suite's tenants
//! through the async path — 64 `tokio::spawn` tasks as tenant A (or
//! first-come) and one as B, reading 1 MiB at random offsets through one
//! `SharedEngine` and one 64 MiB/s throttler, from a file under `/var/tmp`
//! evicted before and every 250 ms during each run, each task's engine
//! handle carrying its tenant. slotring-throttle's `fair` bench measures
//! the threaded runs and writes `target/bench/fair.json` first; this one
//! adds `fair_share_b_pct_async` to it (slotring-throttle knows nothing of
//! io_uring).

use std::fs::File;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
use slotring_benchkit::{DataFile, Report};
use slotring_throttle::{Tenant, ThrottlePtr, Throttler, UNLIMITED_BLOCK};
use slotring_uring::{SharedConfig, SharedEngine, UringFile};

const MIB: u64 = 1 << 20;
const RATE: u64 = 64 * MIB;
const FILE_SIZE: u64 = 512 * MIB;

/// The suite's disk throttler.
fn throttler() -> Arc<Throttler> {
    Arc::new(Throttler::builder(RATE).name("disk").build().unwrap())
}

/// 64 tasks as tenant A (or first-come) and one as B on a multi-thread
/// runtime (2 workers), each reading 1 MiB at random offsets through one
/// `SharedEngine` and the 64 MiB/s throttler; B's share of the bytes
/// completed in the window from 2 s to 7 s.
fn async_share_b(data: &DataFile, fair: bool) -> f64 {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let file =
        UringFile::new(File::open(&data.path).expect("open the data file")).expect("UringFile");
    rt.block_on(async {
        let t: ThrottlePtr = throttler();
        let engine = SharedEngine::new(&SharedConfig::default()).expect("io_uring");
        let (a, b) = (Tenant::new("a", 1).unwrap(), Tenant::new("b", 1).unwrap());
        let bytes = Arc::new([
            std::sync::atomic::AtomicU64::new(0),
            std::sync::atomic::AtomicU64::new(0),
        ]);
        let phase = Arc::new(std::sync::atomic::AtomicU8::new(0)); // 0 warm, 1 measure, 2 stop
        let mut tasks = vec![];
        for i in 0..=64u64 {
            let who = usize::from(i == 64);
            let e = if fair {
                engine.with_tenant([&a, &b][who].clone())
            } else {
                engine.clone()
            };
            let (t, bytes, phase, file) = (t.clone(), bytes.clone(), phase.clone(), file.clone());
            tasks.push(tokio::spawn(async move {
                let req = MIB as usize;
                let mut buf = vec![0u8; req];
                let mut x = 0x2545_f491_4f6c_dd1du64 ^ (i << 32);
                while phase.load(Ordering::Relaxed) < 2 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let off = (x % (FILE_SIZE / MIB)) * MIB;
                    let (r, back) = e.read_at(&file, buf, off, Some(&t), UNLIMITED_BLOCK).await;
                    buf = back;
                    let n = r.expect("read");
                    if phase.load(Ordering::Relaxed) == 1 {
                        bytes[who].fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }));
        }
        // The evictor, as in the threaded runs.
        let evictor = {
            let (phase, f) = (phase.clone(), data.file.try_clone().expect("dup"));
            tokio::task::spawn_blocking(move || {
                while phase.load(Ordering::Relaxed) < 2 {
                    let _ = posix_fadvise(f.as_fd(), 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
                    std::thread::sleep(Duration::from_millis(250));
                }
            })
        };
        tokio::time::sleep(Duration::from_secs(2)).await;
        phase.store(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(5)).await;
        phase.store(2, Ordering::Relaxed);
        for h in tasks {
            h.await.expect("task");
        }
        evictor.await.expect("evictor");
        let (a, b) = (
            bytes[0].load(Ordering::Relaxed) as f64,
            bytes[1].load(Ordering::Relaxed) as f64,
        );
        100.0 * b / (a + b)
    })
}

fn main() {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("fair_uring: loadavg before: {}", load.trim());
    let data = DataFile::create(
        PathBuf::from(format!(
            "/var/tmp/slotring-fair-uring-{}.dat",
            std::process::id()
        )),
        FILE_SIZE,
    );
    let mut r = Report::adding_to("fair");
    let fair_async = async_share_b(&data, true);
    let fifo_async = async_share_b(&data, false);
    r.put(
        "fair_share_b_pct_async",
        fair_async,
        "B (1 task) vs A (64 tasks) through SharedEngine, equal weights, fair; goal 50 +- 2",
    );
    eprintln!("  (context) the same async run first-come: B {fifo_async:.1}%");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("fair_uring: loadavg after: {}", load.trim());
    let path = r.finish().expect("write the report");
    eprintln!("wrote {}", path.display());
}
