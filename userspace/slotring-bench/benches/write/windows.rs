//! The 100 ms windows of a run, as the device saw them (`WINDOW`), and
//! what the suite reads from them: the peak rate, the seconds the device
//! itself held the writers back, fio's start-up.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use slotring_uring::{RealSyscalls, Syscalls, UringFile};

use crate::device::{DevWrites, sectors_written};
use crate::{BURST, MIB, WINDOW, limit_rate};

/// What one 100 ms window saw.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Window {
    /// Bytes the measured device wrote.
    pub(crate) dev: u64,
    /// Write requests the measured device completed (their mean size tells
    /// 256 KiB pieces from the filesystem's small journal and metadata
    /// writes in `SLOTRING_WRITE_DEBUG`).
    pub(crate) dev_ios: u64,
    /// Milliseconds the measured device's completed write requests took,
    /// summed (see [`DevWrites::ms`]).
    pub(crate) dev_ms: u64,
    /// Bytes the host disk wrote (the same as `dev` without a loop device).
    pub(crate) host: u64,
    /// Dirty + writeback bytes of the run's files (cachestat).
    pub(crate) dirty: u64,
    /// The window's real length, s (the sampler can wake late on a loaded
    /// machine; a rate is bytes over the real length).
    pub(crate) secs: f64,
}

pub(crate) fn dirty_bytes(files: &[Arc<UringFile>]) -> u64 {
    files
        .iter()
        .map(|f| {
            RealSyscalls
                .cachestat(f.file().as_raw_fd(), 0, 0)
                .map_or(0, |c| (c.nr_dirty + c.nr_writeback) * 4096)
        })
        .sum()
}

/// Samples windows until `stop`.
pub(crate) fn sampler(
    dev: PathBuf,
    host: PathBuf,
    files: Arc<Mutex<Vec<Arc<UringFile>>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<Window>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut prev = (DevWrites::read(&dev), sectors_written(&host));
        let start = Instant::now();
        let mut last = start;
        let mut k = 1;
        while !stop.load(Ordering::Relaxed) {
            let next = start + WINDOW * k;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            let now = (DevWrites::read(&dev), sectors_written(&host));
            let at = Instant::now();
            let dirty = dirty_bytes(&files.lock().unwrap());
            out.push(Window {
                dev: now.0.bytes - prev.0.bytes,
                dev_ios: now.0.ios - prev.0.ios,
                dev_ms: now.0.ms - prev.0.ms,
                host: now.1 - prev.1,
                dirty,
                secs: (at - last).as_secs_f64(),
            });
            prev = now;
            last = at;
            // A late wake-up starts the next window from now, not in a
            // catch-up burst of short windows.
            k = u32::try_from((at - start).as_nanos() / WINDOW.as_nanos() + 1).unwrap_or(u32::MAX);
        }
        out
    })
}

/// Seconds of the first `until_s` of the run (the writing) in which the
/// device could not have taken the limit from writers that keep
/// `in_flight` bytes on their way to it: windows whose mean write latency
/// (the device's own, `/sys/block/<dev>/stat`) exceeds `in_flight / limit`
/// (by Little's law, such a device completes less than the limit), and
/// windows in which it completed no write at all (counted from the first
/// window that completed one: before it the writers were starting). There
/// the device held the writers back, whatever paced them.
pub(crate) fn device_held_s(windows: &[Window], until_s: f64, in_flight: u64) -> f64 {
    let budget_ms = in_flight as f64 / limit_rate() as f64 * 1000.0;
    let mut end = 0.0;
    let mut held = 0.0;
    let mut started = false;
    for w in windows {
        end += w.secs;
        if end > until_s {
            break;
        }
        started |= w.dev_ios > 0;
        let slow = w.dev_ios == 0 || w.dev_ms as f64 / w.dev_ios as f64 > budget_ms;
        if started && slow {
            held += w.secs;
        }
    }
    held
}

/// The leading windows in which the device completed no write: fio
/// starting (a process and its set-up, 0.3 s), not the limit's time (its
/// writes reach the device as it issues them). Whole windows: up to one
/// window of start-up is still charged to fio. Not for ours: our span
/// starts as our writers do, and an unpaced writer's first bytes reach the
/// device only at the kernel's flush.
pub(crate) fn start_up_s(windows: &[Window]) -> f64 {
    windows
        .iter()
        .take_while(|w| w.dev_ios == 0)
        .map(|w| w.secs)
        .sum()
}

/// The highest window rate over the limit: bytes over the window's real
/// length (at least the nominal 100 ms: a short window is not a burst).
pub(crate) fn peak(windows: &[Window], pick: fn(&Window) -> u64) -> f64 {
    let burst = limit_rate() as f64 * BURST.as_secs_f64();
    windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            // The first window may legitimately carry the bucket's burst.
            let b = pick(w) as f64;
            let b = if i == 0 { (b - burst).max(0.0) } else { b };
            b / w.secs.max(WINDOW.as_secs_f64()) / limit_rate() as f64
        })
        .fold(0.0, f64::max)
}

/// `SLOTRING_WRITE_DEBUG`: (MiB, write requests, mean write latency in ms)
/// of the measured device and MiB of the host disk, per window.
pub(crate) fn debug_windows(what: &str, windows: &[Window]) {
    if std::env::var_os("SLOTRING_WRITE_DEBUG").is_none() {
        return;
    }
    let mib = |b: u64| (b as f64 / MIB as f64 * 10.0).round() / 10.0;
    let per: Vec<(f64, u64, f64, f64)> = windows
        .iter()
        .map(|w| {
            let ms = w.dev_ms as f64 / w.dev_ios.max(1) as f64;
            (
                mib(w.dev),
                w.dev_ios,
                (ms * 10.0).round() / 10.0,
                mib(w.host),
            )
        })
        .collect();
    eprintln!(
        "{what}: (device MiB, device write requests, their mean latency ms, host disk MiB) \
         per window {per:?}"
    );
}
