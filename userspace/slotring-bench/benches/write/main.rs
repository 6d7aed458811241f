//! `cargo xtask bench write`: throttled writes as the disk sees them. Paced
//! writeback (ours: `UringEngine::write_at`, which writes a paced write in
//! the writer's own thread, and one writer through the async
//! `SharedEngine`, its paced writes on tokio's blocking pool, in each
//! round; `SLOTRING_WRITE_ENGINE=ring|shared|shared-ring|pread` in quick
//! runs measures the ring's own path through the ticket API, the shared
//! front end either way, or the `pread` engine) and the
//! charge-at-page-cache behaviour (the same engine
//! with pacing off: what ClickHouse's `max_local_write_bandwidth` does) side
//! by side, one writer and eight, three rounds of a paced and an unpaced
//! run each, 1 GiB per run at a 32 MiB/s limit, in 100 ms windows of
//! `/sys/block/<dev>/stat`; fio runs `O_DIRECT` at the same rate, and
//! three rounds of buffered writes paced by its own `sync_file_range` (our
//! flags, in its own thread), unpaced, and unpaced through io_uring: what
//! pacing costs the kernel itself, against which ours is measured
//! (`write_pacing_cpu_vs_fio`). The async front end runs paced and
//! unpaced in each round, beside its own baseline: what a tokio service
//! writes without slotring, `tokio::fs` with a `governor` limiter and
//! `sync_file_range` on the blocking pool after each piece
//! (`SLOTRING_WRITE_ENGINE=tokio-fs` in quick runs). The throughput and the
//! rate error are also reported over the time the device allowed
//! (`*_unheld`: without the seconds in which the device itself held the
//! writers below the limit, `device_held_s`). Then ours and fio once more
//! under a hold the kernel makes, the same for both (`STALL`: the
//! filesystem frozen with `fsfreeze` for 3 s; `SLOTRING_WRITE_STALL` in
//! quick runs): what each does with the lost time (`write_stall_*`,
//! `fio_write_stall_*`). Writes `target/bench/write.json`. Nothing here
//! asserts a wall time.
//!
//! The device measured: as root, an ext4 image on the real disk, attached
//! with `losetup --direct-io=on` (its requests go straight to the disk as
//! direct IO) and mounted; its own `/sys/block/loopN/stat` counts only what
//! this benchmark's filesystem sends, while the disk's (`vda`) also counts
//! the other work on the shared machine (its share is measured and
//! reported as `write_noise_peak_ratio`, and the disk's own peaks are
//! printed beside ours). Without root it measures the disk itself.
//!
//! The parts: `device.rs` (the loop device, its stat file, the stall),
//! `windows.rs` (the 100 ms sampler and what is read from its windows),
//! `meter.rs` (CPU), `ours.rs` (our runs), `fio.rs` (fio's), `suite.rs`
//! (the full suite's runs, in their order), `keys.rs` (the JSON's keys from
//! them), `quick.rs` (`SLOTRING_WRITE_QUICK`'s runs).

use std::time::{Duration, Instant};

use slotring_benchkit::{Report, disk_dir};

use crate::device::{fresh_disk, run_cmd, sectors_written, stat_of};
use crate::meter::machine_cpu_s;

mod device;
mod fio;
mod keys;
mod meter;
mod ours;
mod quick;
mod suite;
mod windows;

pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const GIB: u64 = 1 << 30;
pub(crate) const LIMIT: u64 = 32 * MIB;

/// The writers' limit: [`LIMIT`], or in quick runs
/// `SLOTRING_WRITE_LIMIT_MIB` (a debugging aid: what pacing costs per GiB
/// depends on the rate, since a piece's cost does).
pub(crate) fn limit_rate() -> u64 {
    static L: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *L.get_or_init(|| {
        std::env::var_os("SLOTRING_WRITE_QUICK")
            .and(std::env::var("SLOTRING_WRITE_LIMIT_MIB").ok())
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(LIMIT, |m| m * MIB)
    })
}
pub(crate) const TOTAL: u64 = GIB;
pub(crate) const CHUNK: usize = MIB as usize;
pub(crate) const WINDOW: Duration = Duration::from_millis(100);
pub(crate) const BURST: Duration = Duration::from_millis(100);
/// Rounds (a paced and an unpaced run each) per writer count.
pub(crate) const ROUNDS: usize = 3;
/// A paced write's piece (and fio's block size).
pub(crate) const PIECE: u64 = 256 << 10;
/// The `governor` baseline counts cells of this many bytes (its `n` is a
/// `u32`).
pub(crate) const CELL: u64 = 64 << 10;

/// The neighbours' share: the host disk's peak 100 ms write rate over the
/// limit while we write nothing, 3 s; printed beside the machine's busy
/// CPU meanwhile.
fn neighbours(host_stat: &std::path::Path) -> f64 {
    let machine0 = machine_cpu_s();
    let noise = {
        let mut prev = sectors_written(host_stat);
        let mut peak = 0u64;
        for _ in 0..30 {
            std::thread::sleep(WINDOW);
            let now = sectors_written(host_stat);
            peak = peak.max(now - prev);
            prev = now;
        }
        peak as f64 / (limit_rate() as f64 * WINDOW.as_secs_f64())
    };
    let idle_cpu = (machine_cpu_s() - machine0) / 3.0;
    eprintln!("machine busy while we run nothing (the neighbours'): {idle_cpu:.3} CPU s/s");
    noise
}

fn main() {
    let host = disk_dir();
    let host_stat = stat_of(&host);
    let (loop_disk, _dir, dev_stat) = fresh_disk(&host, true);
    eprintln!(
        "device {} (host disk {}); uptime: {}",
        dev_stat.display(),
        host_stat.display(),
        run_cmd("uptime", &[]).unwrap_or_default()
    );
    let noise = neighbours(&host_stat);
    let t0 = Instant::now();
    // SLOTRING_WRITE_QUICK: a debugging aid; the report is not written.
    if let Ok(which) = std::env::var("SLOTRING_WRITE_QUICK") {
        quick::run(&which, &host, &host_stat, loop_disk);
        return;
    }
    // The stall runs need the runs' own filesystem (a loop device's).
    let can_stall = loop_disk.is_some();
    drop(loop_disk);
    let runs = suite::measure(&host, &host_stat, can_stall);
    let mut report = Report::new("write");
    keys::put(&mut report, &runs, noise);
    eprintln!("write suite took {:.1} s", t0.elapsed().as_secs_f64());
    report.finish().expect("write the report");
}
