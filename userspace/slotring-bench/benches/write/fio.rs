//! The baseline: fio at the same limit, measured by the same sampler and
//! meters as ours.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slotring_uring::{RealSyscalls, Syscalls};

use crate::device::{Stall, run_cmd};
use crate::meter::{KworkerMeter, children_cpu_s};
use crate::windows::{debug_windows, device_held_s, peak, sampler, start_up_s};
use crate::{GIB, PIECE, WINDOW, limit_rate};

/// fio's buffered runs, 1 job, 256 KiB writes: paced by `sync_file_range`
/// after each write (our flags: wait_before, write, wait_after) in fio's
/// own thread; not paced; and not paced through io_uring (each write an
/// SQE that io-wq runs, as ours: ext4 has no async buffered write). fio
/// syncs a range before its next write, so its last piece waits for an
/// `fsync` at the end (`end_fsync`), not for the flusher's 30 s expiry.
/// (fio's io_uring engine does not run a real `sync_file_range`: its syncs
/// complete in well under a microsecond, so the paced run is `psync`.)
pub(crate) const FIO_BUFFERED: [(&str, &[&str]); 3] = [
    (
        "buffered + sync_file_range(all 3), 1 job",
        &[
            "--ioengine=psync",
            "--sync_file_range=wait_before,write,wait_after:1",
            "--end_fsync=1",
        ],
    ),
    ("buffered, 1 job", &["--ioengine=psync"]),
    ("buffered, io_uring, 1 job", &[]),
];

/// What one fio run at the limit showed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FioRun {
    pub(crate) peak_ratio: f64,
    pub(crate) host_peak_ratio: f64,
    pub(crate) rate_error_pct: f64,
    pub(crate) throughput_ratio: f64,
    /// fio's own CPU (its threads, as a waited-for child) and the kernel
    /// workers' (the flusher, the loop device), until every byte is on the
    /// device: measured as ours is.
    pub(crate) cpu_s_per_gb: f64,
    /// [`device_held_s`] with each job's block in flight.
    pub(crate) held_s: f64,
}

/// fio writing `size` bytes at the limit (split over `jobs` jobs, each at
/// its share of it, each in its own file) with `extra` options, measured
/// by the same 100 ms sampler as ours, until every byte is on the device.
#[expect(
    clippy::too_many_arguments,
    reason = "a bench helper: each is one setting of the run"
)]
pub(crate) fn fio(
    dir: &Path,
    dev: &Path,
    host: &Path,
    name: &str,
    jobs: u64,
    size: u64,
    extra: &[&str],
    stall: Option<Stall>,
) -> Result<FioRun, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = sampler(
        dev.to_path_buf(),
        host.to_path_buf(),
        Arc::new(Mutex::new(Vec::new())),
        stop.clone(),
    );
    let kworkers = KworkerMeter::start();
    let children0 = children_cpu_s();
    let t0 = Instant::now();
    let mut args = vec![
        "--name=w".to_owned(),
        format!("--directory={}", dir.display()),
        "--rw=write".to_owned(),
        format!("--bs={PIECE}"),
        "--ioengine=io_uring".to_owned(),
        "--iodepth=1".to_owned(),
        format!("--numjobs={jobs}"),
        format!("--size={}", size / jobs),
        format!("--rate={}", limit_rate() / jobs),
        "--group_reporting".to_owned(),
        "--output-format=json".to_owned(),
    ];
    args.extend(extra.iter().map(|&e| e.to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stalled = stall.map(|s| s.start(dir));
    let out = run_cmd("fio", &args);
    let written_s = t0.elapsed().as_secs_f64();
    if let Some(h) = stalled {
        h.join().unwrap();
    }
    let fio_cpu = children_cpu_s() - children0;
    // Until the kernel's flush of what fio left dirty is on the device
    // (bounded): the files are w.<job>.0.
    let files: Vec<std::fs::File> = (0..jobs)
        .filter_map(|j| std::fs::File::open(dir.join(format!("w.{j}.0"))).ok())
        .collect();
    let t = Instant::now();
    loop {
        let dirty: u64 = files
            .iter()
            .map(|f| {
                RealSyscalls
                    .cachestat(f.as_raw_fd(), 0, 0)
                    .map_or(0, |c| c.nr_dirty + c.nr_writeback)
            })
            .sum();
        if dirty == 0 || t.elapsed() > Duration::from_secs(90) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(WINDOW);
    let drained_s = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let kworker = kworkers.seconds();
    let windows = s.join().unwrap();
    debug_windows(&format!("fio {name}"), &windows);
    drop(files);
    for j in 0..jobs {
        let _ = std::fs::remove_file(dir.join(format!("w.{j}.0")));
    }
    let text = out?;
    let start = text.find('{').ok_or("no JSON from fio")?;
    let v: serde_json::Value = serde_json::from_str(&text[start..]).map_err(|e| e.to_string())?;
    if v["jobs"][0]["error"].as_i64().unwrap_or(0) != 0 {
        return Err(format!("fio failed: {}", v["jobs"][0]["error"]));
    }
    let disk_total: u64 = windows.iter().map(|w| w.dev).sum();
    let expected = limit_rate() as f64 * (drained_s - start_up_s(&windows));
    let r = FioRun {
        peak_ratio: peak(&windows, |w| w.dev),
        host_peak_ratio: peak(&windows, |w| w.host),
        rate_error_pct: (disk_total as f64 - expected).abs() / expected * 100.0,
        throughput_ratio: size as f64 / written_s / limit_rate() as f64,
        cpu_s_per_gb: (fio_cpu + kworker) / (size as f64 / GIB as f64),
        held_s: device_held_s(&windows, written_s, jobs * PIECE),
    };
    eprintln!(
        "  fio {name:<28} peak {:.2}x (disk incl. neighbours {:.2}x), rate error {:.2} %, \
         throughput {:.3}, {:.3} CPU s/GiB, on the device {:.1} s after fio ended; \
         the device held it {:.1} s",
        r.peak_ratio,
        r.host_peak_ratio,
        r.rate_error_pct,
        r.throughput_ratio,
        r.cpu_s_per_gb,
        drained_s - written_s,
        r.held_s
    );
    Ok(r)
}
