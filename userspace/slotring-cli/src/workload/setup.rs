//! Everything a run needs before its first query: the data directory and
//! file, the throttlers, the CPU slot budget and the kernel probes.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::ProgressBar;
use slotring::bpf::{AdaptiveBudget, BpfConfig, SlotringBpf};
use slotring::slots::{AdaptiveConfig, ConcurrencyControl};
use slotring::throttle::{ThrottlePtr, Throttler};
use slotring::uring::UringFile;

use super::RunError;
use super::engines::Engines;
use crate::config::RunConfig;

/// The longest a single read or write waits on a throttle level.
pub(super) const MAX_BLOCK: Duration = Duration::from_secs(30);

/// The default data directory: `$TMPDIR`, else `/var/tmp` (on a disk on
/// most systems, unlike `/tmp` which is often tmpfs).
pub fn default_dir() -> PathBuf {
    std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"))
}

/// A filesystem, by its `statfs` magic.
pub(super) struct Filesystem {
    /// `ext4`, `xfs`, `tmpfs`, … (`fs-magic-0x…` when unknown).
    pub name: String,
    /// Whether its reads are memory, not disk (tmpfs, ramfs).
    pub in_memory: bool,
}

impl Filesystem {
    fn of(path: &Path) -> Self {
        use nix::sys::statfs::{FsType, TMPFS_MAGIC};
        const RAMFS_MAGIC: FsType = FsType(0x8584_58f6);
        match nix::sys::statfs::statfs(path) {
            Ok(s) => {
                let fs = s.filesystem_type();
                let name = match fs.0 {
                    0x0102_1994 => "tmpfs".into(),
                    0xef53 => "ext4".into(),
                    0x5846_5342 => "xfs".into(),
                    0x9123_683e => "btrfs".into(),
                    0x794c_7630 => "overlayfs".into(),
                    0x6969 => "nfs".into(),
                    0x8584_58f6 => "ramfs".into(),
                    other => format!("fs-magic-{other:#x}"),
                };
                Self {
                    name,
                    in_memory: fs == TMPFS_MAGIC || fs == RAMFS_MAGIC,
                }
            }
            Err(e) => Self {
                name: format!("unknown ({e})"),
                in_memory: false,
            },
        }
    }
}

/// The data directory and the data file's path; removes the file on drop
/// unless kept (also on error and Ctrl-C).
pub(super) struct DataDir {
    /// The data file.
    pub path: PathBuf,
    /// The directory's filesystem.
    pub filesystem: Filesystem,
    keep: bool,
}

impl DataDir {
    /// Create the directory (`dir`, or [`default_dir`]) and name the data
    /// file in it; warn when its reads would be memory.
    pub fn prepare(cfg: &RunConfig) -> Result<Self, RunError> {
        let dir = cfg.dir.clone().unwrap_or_else(default_dir);
        std::fs::create_dir_all(&dir).map_err(|source| RunError::Dir {
            path: dir.clone(),
            source,
        })?;
        let filesystem = Filesystem::of(&dir);
        if filesystem.in_memory {
            eprintln!(
                "slotring: warning: {} is on {}: its reads are memory, not disk (use --dir on a real disk)",
                dir.display(),
                filesystem.name
            );
        }
        Ok(Self {
            path: dir.join(format!("slotring-data-{}.bin", std::process::id())),
            filesystem,
            keep: cfg.keep,
        })
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The burst of `local_write`: 100 ms of its rate, so that the disk should
/// see the write limit over any 100 ms window (the engine paces the
/// writeback to it).
pub(super) const WRITE_BURST: Duration = Duration::from_millis(100);

/// The block-device throttlers `local_read` and `local_write`.
pub(super) fn throttlers(cfg: &RunConfig) -> Result<(Arc<Throttler>, Arc<Throttler>), RunError> {
    let build = |name: &'static str, rate: u64, burst: Option<Duration>| {
        let b = Throttler::builder(rate)
            .name(name)
            .limits_block_device_bandwidth(true);
        let b = match burst {
            Some(burst) => b.burst(burst),
            None => b,
        };
        b.build()
            .map(Arc::new)
            .map_err(|source| RunError::Throttler { name, source })
    };
    Ok((
        build("local_read", cfg.max_local_read_bandwidth, None)?,
        build(
            "local_write",
            cfg.max_local_write_bandwidth,
            Some(WRITE_BURST),
        )?,
    ))
}

/// The CPU slot budget from ClickHouse's settings and this machine's cores.
pub(super) fn slots(cfg: &RunConfig) -> ConcurrencyControl {
    let cc = ConcurrencyControl::new();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    cc.set_max_concurrency(ConcurrencyControl::max_concurrency_from_settings(
        cfg.concurrent_threads_soft_limit_num,
        cfg.concurrent_threads_soft_limit_ratio_to_cores,
        cores,
    ));
    cc.set_scheduler(cfg.concurrent_threads_scheduler);
    cc
}

/// The eBPF probes when wanted (degraded, saying why once, when they cannot
/// load), and the lease observer that mirrors lease states to them.
pub(super) fn probes(cfg: &RunConfig) -> Option<SlotringBpf> {
    if !cfg.probes {
        return None;
    }
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
    for dir in b.removed_stale() {
        eprintln!(
            "slotring: removed stale pins {} (their process is gone)",
            dir.display()
        );
    }
    slotring::bpf::install_observer();
    Some(b)
}

/// The adaptive budget loop when `adaptive_budget` is set: it needs the
/// probes (without them the budget stays static and that is said once).
pub(super) fn adaptive_budget(
    cfg: &RunConfig,
    cc: &ConcurrencyControl,
    bpf: Option<&SlotringBpf>,
) -> Result<Option<AdaptiveBudget>, RunError> {
    if !cfg.adaptive_budget {
        return Ok(None);
    }
    let Some(b) = bpf else {
        eprintln!(
            "slotring: the CPU slot budget stays static: the eBPF probes are off (--no-probes)"
        );
        return Ok(None);
    };
    AdaptiveBudget::start(
        cc.clone(),
        b.runq_probe(),
        AdaptiveConfig::with_ceiling(cc.max_concurrency()),
        super::SAMPLE_PERIOD,
    )
    .map(Some)
    .map_err(|source| RunError::Adaptive { source })
}

/// Create the data file at `path` through an engine from `engines`,
/// charged to `write`, then `fsync` it, evict it from the page cache and
/// turn readahead off.
pub(super) fn create_data_file(
    cfg: &RunConfig,
    path: &Path,
    write: &ThrottlePtr,
    engines: &Engines,
    stop: &AtomicBool,
    bar: &ProgressBar,
) -> Result<Arc<UringFile>, RunError> {
    let failed = |op: &'static str| {
        move |source| RunError::DataFile {
            path: path.to_owned(),
            op,
            source,
        }
    };
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(failed("create"))?;
    let file = UringFile::new(f).map_err(failed("open"))?;
    let (id, mut engine) = engines.open();
    let chunk = 1usize << 20;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; chunk];
    let mut off = 0u64;
    while off < cfg.file_size {
        if stop.load(Ordering::Relaxed) {
            return Err(RunError::Interrupted {
                path: path.to_owned(),
            });
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
        let (r, b) = engine.write_at(&file, buf, off, Some(write), MAX_BLOCK);
        buf = b;
        let written = r.map_err(|source| RunError::DataFileWrite {
            path: path.to_owned(),
            offset: off,
            source,
        })?;
        off += written as u64;
        bar.set_position(off);
    }
    engines.record(id, engine.counters());
    file.file().sync_all().map_err(failed("fsync"))?;
    file.evict().map_err(failed("evict"))?;
    // No readahead: the disk reads what the queries ask for, and all of it
    // is charged (readahead would pull data in unthrottled).
    file.advise_random().map_err(failed("fadvise(RANDOM)"))?;
    bar.finish_with_message("ready (cold)");
    Ok(file)
}

/// CPU seconds (user + system) of this process so far.
pub(super) fn process_cpu_s() -> f64 {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => 0.0,
    }
}
