//! [`Syscalls`]: the one seam through which every syscall of the engines
//! passes, and through which every completion result is read; the real
//! kernel's ([`RealSyscalls`]) are its default methods.

use std::io;
use std::os::fd::RawFd;

use io_uring::{IoUring, types};

/// The `sync_file_range(2)` flags of a paced write's writeback: start the
/// writeback of the piece and wait for the device to complete it (not a
/// flush of the device cache nor of metadata: no durability), so the piece
/// reaches the disk inside its booked time instead of in the block layer's
/// clumps: with `SYNC_FILE_RANGE_WRITE` alone, a 100 ms window of the disk
/// holds up to twice the limit (`cargo xtask bench write`).
pub(crate) const WRITEBACK_FLAGS: libc::c_uint = libc::SYNC_FILE_RANGE_WAIT_BEFORE
    | libc::SYNC_FILE_RANGE_WRITE
    | libc::SYNC_FILE_RANGE_WAIT_AFTER;

/// `cachestat(2)` is syscall 451 on every 64-bit Linux architecture we build for.
const SYS_CACHESTAT: libc::c_long = 451;
/// `BLKGETSIZE64` = `_IOR(0x12, 114, size_t)` (the same on x86_64 and aarch64).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// `io_uring_setup` configuration (see [`crate::RingConfig`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupParams {
    /// SQ entries.
    pub entries: u32,
    /// CQ entries (0 = kernel default, twice `entries`).
    pub cq_entries: u32,
    /// `IORING_SETUP_SQPOLL` with this idle time in ms.
    pub sqpoll_idle_ms: Option<u32>,
    /// `IORING_SETUP_COOP_TASKRUN`.
    pub coop_taskrun: bool,
    /// `IORING_SETUP_SINGLE_ISSUER`.
    pub single_issuer: bool,
    /// `IORING_SETUP_DEFER_TASKRUN` (requires `single_issuer`).
    pub defer_taskrun: bool,
}

/// What `cachestat(2)` reports for a byte range.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStat {
    /// Pages of the range in the page cache.
    pub nr_cache: u64,
    /// Dirty pages.
    pub nr_dirty: u64,
    /// Pages under writeback.
    pub nr_writeback: u64,
    /// Pages evicted.
    pub nr_evicted: u64,
    /// Pages recently evicted.
    pub nr_recently_evicted: u64,
}

/// The syscall seam (aya-style): every syscall the engines make goes through
/// one of these methods. The defaults are the real syscalls; a test overrides
/// a method to inject a fault and delegates the rest.
pub trait Syscalls: Send + 'static {
    /// `io_uring_setup` + mmap of the rings.
    fn io_uring_setup(&mut self, p: &SetupParams) -> io::Result<IoUring> {
        let mut b = IoUring::builder();
        if p.cq_entries != 0 {
            b.setup_cqsize(p.cq_entries);
        }
        if let Some(idle) = p.sqpoll_idle_ms {
            b.setup_sqpoll(idle);
        }
        if p.coop_taskrun {
            b.setup_coop_taskrun();
        }
        if p.single_issuer {
            b.setup_single_issuer();
        }
        if p.defer_taskrun {
            b.setup_defer_taskrun();
        }
        b.build(p.entries)
    }

    /// `io_uring_enter(ring, to_submit, min_complete, flags, NULL, 0)`.
    fn io_uring_enter(
        &mut self,
        ring: &IoUring,
        to_submit: u32,
        min_complete: u32,
        flags: u32,
    ) -> io::Result<usize> {
        // SAFETY: no argument pointer is passed (arg = NULL, size 0); the SQEs
        // the kernel consumes were written by `LendingRing::push_*`, and each points
        // only into memory owned by a `LendingRing` slot that stays alive until its
        // CQE is reaped (the module invariant).
        unsafe {
            ring.submitter()
                .enter::<libc::sigset_t>(to_submit, min_complete, flags, None)
        }
    }

    /// `io_uring_enter(ring, 0, 1, GETEVENTS | EXT_ARG | ABS_TIMER, {ts})`:
    /// wait for one CQE or until the absolute `CLOCK_MONOTONIC` time
    /// `deadline_ns` (no SQE; kernel 6.12+). `ETIME` is the deadline passing.
    fn io_uring_wait_until(&mut self, ring: &IoUring, deadline_ns: u64) -> io::Result<usize> {
        let ts = types::Timespec::new()
            .sec(deadline_ns / 1_000_000_000)
            .nsec((deadline_ns % 1_000_000_000) as u32);
        let args = types::SubmitArgs::new().timespec(&ts);
        ring.submitter()
            .submit_with_args_and_flags(1, &args, io_uring::EnterFlags::ABS_TIMER)
    }

    #[cfg(feature = "tokio")]
    /// `io_uring_register(IORING_REGISTER_EVENTFD)`: signal `efd` on every CQE.
    fn io_uring_register_eventfd(&mut self, ring: &IoUring, efd: RawFd) -> io::Result<()> {
        ring.submitter().register_eventfd(efd)
    }

    /// Every completion passes here before the engine sees it; tests rewrite
    /// `res` to inject `-EINTR`, `-EAGAIN`, short reads or `-ECANCELED`.
    fn completion(&mut self, _user_data: u64, _res: &mut i32) {}

    /// How many free SQ entries to report (tests shrink it to force "SQ full").
    fn sq_room(&mut self, real: usize) -> usize {
        real
    }

    /// `preadv2(fd, [buf], off, flags)`.
    fn preadv2(&mut self, fd: RawFd, buf: &mut [u8], off: u64, flags: i32) -> io::Result<usize> {
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let off =
            libc::off_t::try_from(off).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `iov` describes exactly `buf`, which is exclusively borrowed
        // for the duration of this synchronous call.
        let r = unsafe { libc::preadv2(fd, &iov, 1, off, flags) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    /// `pwrite(fd, buf, off)`.
    fn pwrite(&mut self, fd: RawFd, buf: &[u8], off: u64) -> io::Result<usize> {
        let off =
            libc::off_t::try_from(off).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `buf` is borrowed for the duration of this synchronous call
        // and the kernel only reads `buf.len()` bytes from it.
        let r = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), off) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    /// `sync_file_range(2)` of the range (paced writeback in the caller's
    /// thread, `thread_io::ThreadIo`; no flush, no durability): with `complete` false,
    /// `SYNC_FILE_RANGE_WRITE` starts the writeback of its dirty pages; with
    /// `complete` true, [`WRITEBACK_FLAGS`] writes back what is dirty and
    /// waits until the device has completed the whole range.
    fn sync_file_range(&mut self, fd: RawFd, off: u64, len: u64, complete: bool) -> io::Result<()> {
        let off = libc::off64_t::try_from(off)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let len = libc::off64_t::try_from(len)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let flags = if complete {
            WRITEBACK_FLAGS
        } else {
            libc::SYNC_FILE_RANGE_WRITE
        };
        // SAFETY: no memory is passed; the kernel validates `fd` (a bad one
        // is `EBADF`, not UB).
        let r = unsafe { libc::sync_file_range(fd, off, len, flags) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// `cachestat(fd, {off, len}, &out, 0)` (Linux 6.5+; `ENOSYS` before).
    fn cachestat(&mut self, fd: RawFd, off: u64, len: u64) -> io::Result<CacheStat> {
        let range: [u64; 2] = [off, len];
        let mut out = [0u64; 5];
        // SAFETY: `range` is a valid `struct cachestat_range` (two u64) and
        // `out` a writable `struct cachestat` (five u64), both alive for the
        // duration of this synchronous call.
        let r = unsafe { libc::syscall(SYS_CACHESTAT, fd, range.as_ptr(), out.as_mut_ptr(), 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(CacheStat {
            nr_cache: out[0],
            nr_dirty: out[1],
            nr_writeback: out[2],
            nr_evicted: out[3],
            nr_recently_evicted: out[4],
        })
    }

    /// The size that bounds reads of `fd`, or `None` when it has none.
    ///
    /// A regular file answers its `st_size` (`fstat`); a block device its
    /// capacity (`ioctl(BLKGETSIZE64)`: its `st_size` is 0). Anything else
    /// (character devices such as `/dev/zero`, pipes, sockets) has no size
    /// that bounds a read — its `st_size` is 0 too — so `None`: the engines
    /// then trim nothing and charge every byte asked for.
    fn file_size(&mut self, fd: RawFd) -> io::Result<Option<u64>> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `st` is writable memory of the size `fstat` fills; the
        // kernel validates `fd` (a bad one is `EBADF`, not UB).
        let r = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fstat` returned 0, so it initialised `st`.
        let st = unsafe { st.assume_init() };
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Ok(Some(u64::try_from(st.st_size).unwrap_or(0))),
            libc::S_IFBLK => {
                let mut bytes: u64 = 0;
                // SAFETY: BLKGETSIZE64 writes one u64 through its argument,
                // which points at `bytes`, alive and exclusively borrowed for
                // the duration of this synchronous call.
                let r = unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, &raw mut bytes) };
                if r < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(Some(bytes))
            }
            _ => Ok(None),
        }
    }

    /// Whether the file lives in memory (tmpfs/ramfs), via `fstatfs`.
    fn fs_is_memory(&mut self, fd: RawFd) -> io::Result<bool> {
        let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
        // SAFETY: as for `fstat` above.
        let r = unsafe { libc::fstatfs(fd, st.as_mut_ptr()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fstatfs` returned 0, so it initialised `st`.
        let st = unsafe { st.assume_init() };
        #[allow(
            clippy::unnecessary_cast,
            reason = "f_type's type differs across architectures"
        )]
        let magic = st.f_type as i64;
        Ok(magic == TMPFS_MAGIC || magic == RAMFS_MAGIC)
    }
}

/// The real kernel, no overrides.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealSyscalls;

impl Syscalls for RealSyscalls {}
