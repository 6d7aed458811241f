//! The device a run writes to: a fresh ext4 image on the disk behind a
//! direct-IO loop device (as root), its `/sys/block/<dev>/stat`, and the
//! hold the kernel makes on it in the stall runs (`fsfreeze`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The write side of `/sys/block/<dev>/stat` (zeros if unreadable).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DevWrites {
    /// Write requests completed (field 5).
    pub(crate) ios: u64,
    /// Bytes written (field 7, in 512-byte sectors).
    pub(crate) bytes: u64,
    /// Milliseconds write requests spent from issue to completion, summed
    /// over the requests (field 8): over a window, divided by the requests
    /// completed, the device's mean write latency.
    pub(crate) ms: u64,
}

impl DevWrites {
    pub(crate) fn read(stat: &Path) -> Self {
        let text = std::fs::read_to_string(stat).unwrap_or_default();
        let f: Vec<u64> = text
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        Self {
            ios: at(4),
            bytes: at(6) * 512,
            ms: at(7),
        }
    }
}

pub(crate) fn sectors_written(stat: &Path) -> u64 {
    DevWrites::read(stat).bytes
}

pub(crate) fn stat_of(path: &Path) -> PathBuf {
    let dev = std::fs::metadata(path).unwrap().dev();
    let (maj, min) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    PathBuf::from(format!("/sys/dev/block/{maj}:{min}/stat"))
}

pub(crate) fn run_cmd(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// An ext4 image on the disk behind a direct-IO loop device, mounted;
/// unmounted, detached and removed however the run ends.
pub(crate) struct LoopDisk {
    pub(crate) image: PathBuf,
    pub(crate) dev: Option<String>,
    pub(crate) dir: Option<PathBuf>,
}

impl LoopDisk {
    pub(crate) fn new(host: &Path) -> Result<Self, String> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut d = LoopDisk {
            image: host.join(format!("slotring-write-bench-{pid}-{n}.img")),
            dev: None,
            dir: None,
        };
        let img = d.image.display().to_string();
        run_cmd("truncate", &["-s", "3G", &img])?;
        run_cmd(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                &img,
            ],
        )?;
        d.dev = Some(run_cmd(
            "losetup",
            &["--direct-io=on", "--find", "--show", &img],
        )?);
        let dir = host.join(format!("slotring-write-bench-{pid}-{n}.mnt"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        d.dir = Some(dir.clone());
        run_cmd(
            "mount",
            &[d.dev.as_deref().unwrap(), &dir.display().to_string()],
        )?;
        Ok(d)
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.as_deref().unwrap()
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            // A stall's thaw, should its thread have been cut short.
            let _ = Command::new("fsfreeze").arg("-u").arg(dir).output();
            let _ = Command::new("umount").arg(dir).status();
            let _ = std::fs::remove_dir(dir);
        }
        if let Some(dev) = &self.dev {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

/// A hold the kernel makes, the same for ours and for fio: the run's
/// filesystem frozen (`fsfreeze -f`: every write to it, and so every
/// writer, waits in the kernel until the thaw) `hold` long from `at` after
/// the writers start. Only ever a loop device's filesystem, never the
/// host's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stall {
    pub(crate) at: Duration,
    pub(crate) hold: Duration,
}

/// The stall of the stall runs: 3 s, 8 s into a 32 s run (time enough
/// after it for a writer to make it up at the peak's bound, 1.2x, were it
/// allowed to).
pub(crate) const STALL: Stall = Stall {
    at: Duration::from_secs(8),
    hold: Duration::from_secs(3),
};

impl Stall {
    /// Freezes `dir` at `at` and thaws it `hold` later, in a thread of its
    /// own (joined by the run before it waits for the drain).
    pub(crate) fn start(self, dir: &Path) -> std::thread::JoinHandle<()> {
        let dir = dir.display().to_string();
        std::thread::spawn(move || {
            std::thread::sleep(self.at);
            if let Err(e) = run_cmd("fsfreeze", &["-f", &dir]) {
                eprintln!("  no stall: {e}");
                return;
            }
            std::thread::sleep(self.hold);
            if let Err(e) = run_cmd("fsfreeze", &["-u", &dir]) {
                eprintln!("  thaw: {e}");
            }
        })
    }

    /// `SLOTRING_WRITE_STALL` in quick runs: stall them.
    pub(crate) fn from_env() -> Option<Self> {
        std::env::var_os("SLOTRING_WRITE_STALL").map(|_| STALL)
    }
}

/// A fresh filesystem to measure on: a new loop-device image as root (none
/// of an earlier run's freed blocks, journal or writeback left behind), else
/// the host directory (always with `on_loop` false). Returns the disk (kept
/// alive by the caller), the directory to write in and the device's stat
/// file.
pub(crate) fn fresh_disk(host: &Path, on_loop: bool) -> (Option<LoopDisk>, PathBuf, PathBuf) {
    // SLOTRING_WRITE_NO_LOOP: measure on the host disk itself even as
    // root (no loop device's own per-request work; a debugging aid).
    let no_loop = !on_loop || std::env::var_os("SLOTRING_WRITE_NO_LOOP").is_some();
    let loop_disk = if nix::unistd::geteuid().is_root() && !no_loop {
        match LoopDisk::new(host) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("no loop device ({e}); measuring the disk itself");
                None
            }
        }
    } else if no_loop {
        eprintln!("measuring the disk itself (no loop device), neighbours included");
        None
    } else {
        eprintln!("not root: measuring the disk itself, neighbours included");
        None
    };
    let dir = loop_disk
        .as_ref()
        .map_or(host.to_path_buf(), |d| d.dir().to_path_buf());
    let dev_stat = stat_of(&dir);
    (loop_disk, dir, dev_stat)
}

/// `stall`, if the run's filesystem is a loop device's (a freeze of the
/// host's would hold the whole machine).
pub(crate) fn stall_on(disk: Option<&LoopDisk>, stall: Option<Stall>) -> Option<Stall> {
    if stall.is_some() && disk.is_none() {
        eprintln!("  no stall: not on a loop device");
        return None;
    }
    stall
}
