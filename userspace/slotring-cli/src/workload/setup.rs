//! Everything a run needs before its first query: the data directory and
//! file, the throttlers, the CPU slot budget and the kernel probes.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::ProgressBar;
use slotring::bpf::{AdaptiveBudget, BpfConfig, Owner, SlotringBpf};
use slotring::slots::{AdaptiveConfig, ConcurrencyControl};
use slotring::throttle::{ThrottlePtr, Throttler, WorkloadTree};
use slotring::uring::{UringError, UringFile};

use super::RunError;
use super::engines::Engines;
use crate::config::RunConfig;

/// The longest a single read or write waits on a throttle level inside the
/// engine: a longer debt is waited out before the next IO, by
/// [`super::waits::pay_debt`], which looks at the stop condition.
pub(super) const MAX_BLOCK: Duration = Duration::from_millis(100);

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

/// The data directory and the data file this run created in it.
///
/// The file is created with `O_EXCL` (a fresh name when the first is
/// taken: nothing that was there is ever opened for writing) and
/// remembered by device and inode; on drop (also on error and Ctrl-C) it is
/// removed unless kept, and only if the path still names that same file.
/// Directories `prepare` had to create are removed again when empty; no
/// other directory is ever removed. A second Ctrl-C runs the same file
/// removal from the signal thread ([`crate::abort`]).
pub(super) struct DataDir {
    /// The data file.
    pub path: PathBuf,
    /// The directory's filesystem.
    pub filesystem: Filesystem,
    file: Option<File>,
    id: FileId,
    keep: bool,
    /// The directories this run created, outermost first.
    created: Vec<PathBuf>,
    abort: Option<crate::abort::Registered>,
}

/// A file's identity: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(m: &std::fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// Remove `path` if it is still the file `id` (not following a symlink).
/// `Ok(false)`: something else is there now, left alone.
fn remove_if_same(path: &Path, id: FileId) -> std::io::Result<bool> {
    let m = std::fs::symlink_metadata(path)?;
    if FileId::of(&m) != id {
        return Ok(false);
    }
    std::fs::remove_file(path)?;
    Ok(true)
}

/// How many names `prepare` tries before giving up.
const NAME_TRIES: u32 = 100;

impl DataDir {
    /// Create the directory (`dir`, or [`default_dir`]) if missing, saying
    /// so, and a fresh data file in it; warn when its reads would be memory.
    pub fn prepare(cfg: &RunConfig) -> Result<Self, RunError> {
        let dir = cfg.dir.clone().unwrap_or_else(default_dir);
        let dir_err = |source| RunError::Dir {
            path: dir.clone(),
            source,
        };
        let created = create_missing(&dir).map_err(dir_err)?;
        if !created.is_empty() {
            eprintln!(
                "slotring: creating data directory {} (removed at the end if empty)",
                dir.display()
            );
        }
        let mut this = Self {
            path: PathBuf::new(),
            filesystem: Filesystem {
                name: String::new(),
                in_memory: false,
            },
            file: None,
            id: FileId { dev: 0, ino: 0 },
            keep: cfg.keep,
            created,
            abort: None,
        };
        // From here on, dropping `this` removes what it created.
        let meta = std::fs::metadata(&dir).map_err(dir_err)?;
        if !meta.is_dir() {
            return Err(dir_err(std::io::ErrorKind::NotADirectory.into()));
        }
        this.filesystem = Filesystem::of(&dir);
        if this.filesystem.in_memory {
            eprintln!(
                "slotring: warning: {} is on {}: its reads are memory, not disk (use --dir on a real disk)",
                dir.display(),
                this.filesystem.name
            );
        }
        let me = Owner::current().map_err(|source| RunError::DataFile {
            path: PathBuf::from("/proc/self/stat"),
            op: "read (this run's start time, for the data file's name)",
            source,
        })?;
        remove_stale_data_files(&dir, &meta, &me);
        for n in 0..NAME_TRIES {
            let path = dir.join(data_file_name(&me, n));
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
            {
                Ok(f) => {
                    let m = f.metadata().map_err(|source| RunError::DataFile {
                        path: path.clone(),
                        op: "fstat",
                        source,
                    })?;
                    this.id = FileId::of(&m);
                    this.path = path;
                    this.file = Some(f);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => {
                    return Err(RunError::DataFile {
                        path,
                        op: "create",
                        source,
                    });
                }
            }
        }
        if this.file.is_none() {
            return Err(RunError::DataFile {
                path: dir.join(format!("slotring-data-{}.{}-*.bin", me.pid, me.start_time)),
                op: "create",
                source: std::io::ErrorKind::AlreadyExists.into(),
            });
        }
        eprintln!(
            "slotring: data file {} ({})",
            this.path.display(),
            if this.keep {
                "kept afterwards"
            } else {
                "removed at the end"
            }
        );
        let (path, id) = (this.path.clone(), this.id);
        this.abort = Some(if this.keep {
            crate::abort::register(move || Some(format!("data file {} kept", path.display())))
        } else {
            crate::abort::register(move || match remove_if_same(&path, id) {
                Ok(true) => Some(format!("data file {} removed", path.display())),
                Ok(false) => Some(format!(
                    "not removing {}: it is no longer this run's data file",
                    path.display()
                )),
                Err(e) => Some(format!("removing data file {}: {e}", path.display())),
            })
        });
        Ok(this)
    }

    /// The created data file, open for reading and writing (once).
    pub fn take_file(&mut self) -> Option<File> {
        self.file.take()
    }

    /// The data file's size now, by its path, if it is still this run's
    /// file.
    pub fn size_now(&self) -> Option<u64> {
        let m = std::fs::symlink_metadata(&self.path).ok()?;
        (FileId::of(&m) == self.id).then_some(m.len())
    }
}

/// The `n`th name `owner`'s run tries for its data file:
/// `slotring-data-PID.START.bin`, then `slotring-data-PID.START-N.bin`
/// (`START`: the process's start time, `/proc/PID/stat` field 22). The
/// name records, atomically with the file's creation (`O_EXCL`), which run
/// made it, by the same proof that pins use.
fn data_file_name(owner: &Owner, n: u32) -> String {
    let (pid, start) = (owner.pid, owner.start_time);
    if n == 0 {
        format!("slotring-data-{pid}.{start}.bin")
    } else {
        format!("slotring-data-{pid}.{start}-{n}.bin")
    }
}

/// The run a [`data_file_name`] names (`None`: not such a name).
fn data_file_owner(name: &str) -> Option<Owner> {
    let rest = name.strip_prefix("slotring-data-")?.strip_suffix(".bin")?;
    let (pid, rest) = rest.split_once('.')?;
    let start = match rest.split_once('-') {
        Some((start, n)) => {
            n.parse::<u32>().ok().filter(|n| *n > 0)?;
            start
        }
        None => rest,
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(pid) && digits(start)).then_some(())?;
    Some(Owner {
        pid: pid.parse().ok()?,
        start_time: start.parse().ok()?,
    })
}

/// Why a file named as a dead run's data file is not that run's (and is
/// left alone), or `None` when it is: a regular file (not a symbolic
/// link), on the directory's device (not mounted over the name), with one
/// link, owned by this user, mode 0600, as `prepare` creates it.
fn not_a_dead_runs_file(m: &std::fs::Metadata, dir: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let uid = nix::unistd::geteuid().as_raw();
    if !m.file_type().is_file() {
        Some("it is not a regular file".into())
    } else if m.dev() != dir.dev() {
        Some("it is on another device than its directory".into())
    } else if m.nlink() != 1 {
        Some(format!("it has {} links", m.nlink()))
    } else if m.uid() != uid {
        Some(format!("it belongs to uid {}, not {uid}", m.uid()))
    } else if m.permissions().mode() & 0o7777 != 0o600 {
        Some(format!(
            "its mode is {:o}, not 600",
            m.permissions().mode() & 0o7777
        ))
    } else {
        None
    }
}

/// Remove the data files in `dir` (whose metadata is `dir_meta`) that runs
/// killed with `kill -9` left: named by [`data_file_name`] for a process
/// that is provably gone (no such pid, or the pid now has another start
/// time) and, by [`not_a_dead_runs_file`], as that run created it. Each
/// removal is said on stderr, and so is each such name left alone. The
/// file is checked by its path just before the unlink, which names the
/// same file unless someone renames over it in between (in a directory
/// only they and this user can write to).
fn remove_stale_data_files(dir: &Path, dir_meta: &std::fs::Metadata, me: &Owner) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(owner) = name.to_str().and_then(data_file_owner) else {
            continue;
        };
        if owner.pid == me.pid || !owner.liveness().is_stale() {
            continue;
        }
        let path = e.path();
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if let Some(why) = not_a_dead_runs_file(&m, dir_meta) {
            eprintln!(
                "slotring: leaving {}: named as the data file of process {} (gone), but {why}",
                path.display(),
                owner.pid
            );
            continue;
        }
        match remove_if_same(&path, FileId::of(&m)) {
            Ok(true) => eprintln!(
                "slotring: removed stale data file {} (its run, process {}, is gone)",
                path.display(),
                owner.pid
            ),
            Ok(false) => {}
            Err(e) => eprintln!(
                "slotring: warning: removing the stale data file {}: {e}",
                path.display()
            ),
        }
    }
}

/// Create `dir` and its missing ancestors; returns the ones created,
/// outermost first (none when `dir` exists, whatever it is).
fn create_missing(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    for d in dir.ancestors().filter(|d| !d.as_os_str().is_empty()) {
        match std::fs::symlink_metadata(d) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(d.to_owned()),
            Err(e) => return Err(e),
        }
    }
    let mut created = Vec::new();
    for d in missing.into_iter().rev() {
        match std::fs::create_dir(&d) {
            Ok(()) => created.push(d),
            // Someone else made it meanwhile: theirs, not ours.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                remove_empty(&created);
                return Err(e);
            }
        }
    }
    Ok(created)
}

/// Remove the directories in `created` (outermost first) that are empty,
/// innermost first.
fn remove_empty(created: &[PathBuf]) {
    for d in created.iter().rev() {
        if std::fs::remove_dir(d).is_err() {
            eprintln!(
                "slotring: keeping data directory {} (not empty)",
                d.display()
            );
            break;
        }
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        // Unregister first: the abort path must not act on a file this
        // drop is about to handle.
        drop(self.abort.take());
        drop(self.file.take());
        if !self.keep && !self.path.as_os_str().is_empty() {
            match remove_if_same(&self.path, self.id) {
                Ok(true) => {}
                Ok(false) => eprintln!(
                    "slotring: not removing {}: it is no longer the data file this run created",
                    self.path.display()
                ),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => eprintln!(
                    "slotring: warning: removing the data file {}: {e}",
                    self.path.display()
                ),
            }
        }
        remove_empty(&self.created);
    }
}

/// The burst of `local_write`: 100 ms of its rate, so that the disk should
/// see the write limit over any 100 ms window (the engine paces the
/// writeback to it).
pub(super) const WRITE_BURST: Duration = Duration::from_millis(100);

/// The block-device throttlers `local_read` and `local_write`.
pub(super) fn throttlers(cfg: &RunConfig) -> Result<(Arc<Throttler>, Arc<Throttler>), RunError> {
    let build = |name: &'static str, option: &'static str, rate: u64, burst: Option<Duration>| {
        let b = Throttler::builder(rate)
            .name(name)
            .limits_block_device_bandwidth(true);
        let b = match burst {
            Some(burst) => b.burst(burst),
            None => b,
        };
        b.build()
            .map(Arc::new)
            .map_err(|source| RunError::Throttler {
                option,
                name,
                source,
            })
    };
    Ok((
        build(
            "local_read",
            "max-local-read-bandwidth",
            cfg.max_local_read_bandwidth,
            None,
        )?,
        build(
            "local_write",
            "max-local-write-bandwidth",
            cfg.max_local_write_bandwidth,
            Some(WRITE_BURST),
        )?,
    ))
}

/// The CPU slot budget from ClickHouse's settings and this machine's cores,
/// scheduled by the run's workload tree when there is one (`tree`: every
/// allocation then enters a leaf of it, see `disk_workloads`).
pub(super) fn slots(cfg: &RunConfig, tree: Option<&WorkloadTree>) -> ConcurrencyControl {
    let cc = tree.map_or_else(ConcurrencyControl::new, ConcurrencyControl::with_workloads);
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
/// load), and the lease observer that mirrors lease states to them; with
/// the token of their pins' removal on abort ([`abort_unpins`]), to drop
/// before them.
pub(super) fn probes(cfg: &RunConfig) -> (Option<SlotringBpf>, Option<crate::abort::Registered>) {
    if !cfg.probes {
        return (None, None);
    }
    let pin_dir_existed = cfg.pin_dir.exists();
    let b = match SlotringBpf::load(BpfConfig {
        pin_dir: cfg.pin_dir.clone(),
        ..BpfConfig::default()
    }) {
        Ok(b) => b,
        Err(e) => {
            eprintln!(
                "slotring: running without kernel probes: {}",
                crate::error_chain(&e)
            );
            SlotringBpf::degraded(e)
        }
    };
    for dir in b.removed_stale() {
        eprintln!(
            "slotring: removed stale pins {} (their process is gone)",
            dir.display()
        );
    }
    let abort = abort_unpins(&b, cfg, pin_dir_existed);
    slotring::bpf::install_lease_observer();
    (Some(b), abort)
}

/// Register the removal of `bpf`'s pins for the abort path (a second
/// Ctrl-C exits without dropping the instance): its pinned files, then its
/// instance's pin directory and the pin root if this run created it
/// (`pin_dir_existed` is whether the configured root existed before the
/// load), each only when empty. Unpinned, the
/// programs and maps go with the process. Drop the token before `bpf`.
fn abort_unpins(
    bpf: &SlotringBpf,
    cfg: &RunConfig,
    pin_dir_existed: bool,
) -> Option<crate::abort::Registered> {
    let (dir, pins) = bpf.pins();
    let dir = dir?.to_owned();
    let pins = pins.to_vec();
    // The instance's own directory; the root too when this run created it
    // (each only when empty).
    let mut dirs = vec![dir.clone()];
    if dir != cfg.pin_dir && !pin_dir_existed {
        dirs.push(cfg.pin_dir.clone());
    }
    if dir == cfg.pin_dir && pin_dir_existed {
        dirs.clear();
    }
    Some(crate::abort::register(move || {
        let removed = pins
            .iter()
            .filter(|p| std::fs::remove_file(p).is_ok())
            .count();
        for d in &dirs {
            let _ = std::fs::remove_dir(d);
        }
        Some(format!(
            "pins removed from {} ({removed} of {})",
            dir.display(),
            pins.len()
        ))
    }))
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
/// turn readahead off. Every wait looks at `stop`: a bucket's debt is paid
/// in slices ([`super::waits::pay_debt`]), and the engine's paced write
/// looks at the flag at each of its waits (its pieces' turns, the catch-up
/// pacer, room under the writeback cap), whatever the write limit.
pub(super) fn create_data_file(
    cfg: &RunConfig,
    f: File,
    path: &Path,
    write: &Arc<Throttler>,
    engines: &Engines,
    stop: &Arc<AtomicBool>,
    bar: &ProgressBar,
) -> Result<Arc<UringFile>, RunError> {
    let failed = |op: &'static str| {
        move |source| RunError::DataFile {
            path: path.to_owned(),
            op,
            source,
        }
    };
    let file = UringFile::new(f).map_err(failed("open"))?;
    let write_ptr: ThrottlePtr = write.clone();
    let stopping = || stop.load(Ordering::Relaxed);
    let (id, mut engine) = engines.open();
    // Both of the library's engines honour the flag.
    let honoured = engine.cancel_paced_writes_on(stop.clone());
    debug_assert!(honoured, "{} ignores the stop flag", engine.kind());
    let interrupted = || RunError::Interrupted {
        path: path.to_owned(),
    };
    let chunk = 1usize << 20;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; chunk];
    let mut off = 0u64;
    while off < cfg.file_size {
        super::waits::pay_debt(write, &stopping);
        if stopping() {
            return Err(interrupted());
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
        let (r, b) = engine.write_at(&file, buf, off, Some(&write_ptr), MAX_BLOCK);
        buf = b;
        let written = match r {
            Ok(n) => n,
            Err(UringError::Cancelled) => return Err(interrupted()),
            Err(source) => {
                return Err(RunError::DataFileWrite {
                    path: path.to_owned(),
                    offset: off,
                    source,
                });
            }
        };
        off += written as u64;
        bar.set_position(off);
        // `/metrics` and the BPF maps show the engine's counters as the
        // file grows.
        engines.record(id, engine.counters());
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
