//! The data directory's block device, watched in 100 ms windows of
//! `/sys/dev/block/<dev>/stat` while the data file is written: what the
//! disk itself wrote, next to the write limit.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The `/sys/dev/block/<major>:<minor>/stat` of the block device `dir`
/// lives on, if it has one (a partition has its own).
pub(super) fn block_stat(dir: &Path) -> Option<PathBuf> {
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
pub(super) struct DiskPeak {
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

    pub(super) fn start(stat: PathBuf, burst: u64) -> Self {
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
    pub(super) fn finish(mut self) -> (f64, f64) {
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
