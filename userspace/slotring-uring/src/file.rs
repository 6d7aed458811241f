//! [`UringFile`]: a file plus what the engines learned about it.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use crate::sys::{RealSyscalls, Syscalls};
use nix::fcntl::{FcntlArg, OFlag, PosixFadviseAdvice, fcntl, posix_fadvise};

/// [`UringFile::size_hint`] of a file whose reads no size bounds.
pub const SIZE_UNBOUNDED: u64 = u64::MAX;

/// How many evictions [`UringFile::make_cold`] makes, 1 ms apart, before it
/// reports the pages that stay cached: a second's worth.
const MAKE_COLD_TRIES: u32 = 1000;

/// How page-cache detection treats a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NowaitMode {
    /// Probe reads with `RWF_NOWAIT` (the default).
    Probe = 0,
    /// The filesystem answered `EOPNOTSUPP` and is disk-backed: every read is
    /// charged as a disk read (never under-charge a block device).
    Unsupported = 1,
    /// The filesystem answered `EOPNOTSUPP` and keeps its pages in memory
    /// (tmpfs/ramfs): every read is a page-cache read.
    Memory = 2,
}

/// A file served by the engines. Remembers, per file, whether `RWF_NOWAIT`
/// works, whether it is `O_DIRECT`, and a size hint used to tell EOF from a
/// short read and to avoid charging bytes beyond EOF. Only regular files
/// and block devices have such a size; for anything else (character
/// devices, pipes, sockets) the hint is "unbounded" and no charge is
/// trimmed.
///
/// Memory ordering: the fields are independent hints that order nothing
/// else; all accesses are `Relaxed`.
#[derive(Debug)]
pub struct UringFile {
    file: File,
    direct: bool,
    in_memory: bool,
    mode: AtomicU8,
    size_hint: AtomicU64,
}

impl UringFile {
    /// Wrap `file` (one `fcntl(F_GETFL)`, one `fstat` and one `fstatfs`,
    /// plus `ioctl(BLKGETSIZE64)` for a block device).
    pub fn new(file: File) -> io::Result<Arc<Self>> {
        let flags = fcntl(file.as_fd(), FcntlArg::F_GETFL).map_err(io::Error::from)?;
        let direct = OFlag::from_bits_truncate(flags).contains(OFlag::O_DIRECT);
        let size = RealSyscalls
            .file_size(file.as_raw_fd())?
            .unwrap_or(SIZE_UNBOUNDED);
        // A filesystem that cannot be asked counts as disk-backed: a block
        // device is never under-charged.
        let in_memory = RealSyscalls.fs_is_memory(file.as_raw_fd()).unwrap_or(false);
        Ok(Arc::new(Self {
            file,
            direct,
            in_memory,
            mode: AtomicU8::new(NowaitMode::Probe as u8),
            size_hint: AtomicU64::new(size),
        }))
    }

    /// The file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether the file was opened with `O_DIRECT` (no detection then).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Whether the file lives on a memory filesystem (tmpfs/ramfs), per
    /// `fstatfs` when it was wrapped: its writes never reach a disk.
    pub fn in_memory(&self) -> bool {
        self.in_memory
    }

    /// The file's path as the kernel names it now (`/proc/self/fd`), or
    /// `fd N` when it has none; for error messages.
    pub fn name(&self) -> String {
        std::fs::read_link(format!("/proc/self/fd/{}", self.fd()))
            .map_or_else(|_| format!("fd {}", self.fd()), |p| p.display().to_string())
    }

    /// What detection learned about this file.
    pub fn nowait_mode(&self) -> NowaitMode {
        match self.mode.load(Ordering::Relaxed) {
            0 => NowaitMode::Probe,
            1 => NowaitMode::Unsupported,
            _ => NowaitMode::Memory,
        }
    }

    pub(crate) fn set_nowait_mode(&self, m: NowaitMode) {
        self.mode.store(m as u8, Ordering::Relaxed);
    }

    /// The last known size ([`SIZE_UNBOUNDED`] for a file without one:
    /// character devices, pipes, sockets).
    pub fn size_hint(&self) -> u64 {
        self.size_hint.load(Ordering::Relaxed)
    }

    /// Record a fresh [`Syscalls::file_size`] answer (`None`: unbounded).
    pub(crate) fn note_size(&self, size: Option<u64>) {
        self.size_hint
            .store(size.unwrap_or(SIZE_UNBOUNDED), Ordering::Relaxed);
    }

    /// Of the `len` bytes at `pos`, those before EOF, asking `sys` for the
    /// size when the range crosses the known one. Only a file with a size
    /// (regular, block device) has an EOF to trim at; for the rest the hint
    /// is [`SIZE_UNBOUNDED`] and nothing is trimmed.
    pub(crate) fn before_eof(&self, sys: &mut dyn Syscalls, pos: u64, len: u64) -> u64 {
        if pos.saturating_add(len) > self.size_hint()
            && let Ok(size) = sys.file_size(self.fd())
        {
            self.note_size(size);
        }
        len.min(self.size_hint().saturating_sub(pos))
    }

    pub(crate) fn grow_to(&self, end: u64) {
        self.size_hint.fetch_max(end, Ordering::Relaxed);
    }

    /// Drop the file's clean pages from the page cache
    /// (`posix_fadvise(POSIX_FADV_DONTNEED)`), e.g. to make it cold in tests.
    pub fn evict(&self) -> io::Result<()> {
        posix_fadvise(
            self.file.as_fd(),
            0,
            0,
            PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
        .map_err(io::Error::from)
    }

    /// Make the file cold: [`evict`](Self::evict) it until `cachestat(2)`
    /// counts none of its pages in the page cache. The kernel skips a page
    /// that something holds at that moment (another CPU's LRU batch, a
    /// reclaim or access scan), so one eviction can leave pages behind; this
    /// asks again, 1 ms apart, up to 1,000 times. Dirty pages and pages
    /// under writeback are not dropped: the file's data is synced first
    /// when `cachestat` counts any. Without `cachestat` (before Linux 6.5)
    /// one eviction is all it does.
    ///
    /// Errors: the eviction's, the sync's or `cachestat`'s; `ResourceBusy`,
    /// naming the pages still cached (and of them dirty or under
    /// writeback), when they stay (a page mapped by `mmap(2)` does); at
    /// once for a file known to keep its pages in memory (tmpfs).
    pub fn make_cold(&self) -> io::Result<()> {
        let mut last = None;
        for k in 0..MAKE_COLD_TRIES {
            if k > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.evict()?;
            let st = match RealSyscalls.cachestat(self.fd(), 0, 0) {
                Ok(st) if st.nr_cache == 0 => return Ok(()),
                Ok(st) => st,
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => return Ok(()),
                Err(e) => return Err(e),
            };
            last = Some(st);
            if self.in_memory() {
                break;
            }
            if st.nr_dirty + st.nr_writeback > 0 {
                self.file.sync_data()?;
            }
        }
        let st = last.unwrap_or_default();
        Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!(
                "{} pages of fd {} stay in the page cache ({} dirty, {} under writeback)",
                st.nr_cache,
                self.fd(),
                st.nr_dirty,
                st.nr_writeback
            ),
        ))
    }

    /// Disable readahead for this file (`POSIX_FADV_RANDOM`), so that the disk
    /// reads exactly what is asked.
    pub fn advise_random(&self) -> io::Result<()> {
        posix_fadvise(
            self.file.as_fd(),
            0,
            0,
            PosixFadviseAdvice::POSIX_FADV_RANDOM,
        )
        .map_err(io::Error::from)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
