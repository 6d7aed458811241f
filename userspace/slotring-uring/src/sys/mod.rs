//! The single unsafe boundary of this crate.
//!
//! Two things live here and nowhere else, each in a file of its own:
//!
//! * [`Syscalls`] (`syscalls.rs`), the one seam through which every syscall of the engines
//!   passes (`io_uring_setup`, `io_uring_enter`, `io_uring_register`,
//!   `preadv2`, `pwrite`, `sync_file_range`, `cachestat`, `fstat`,
//!   `ioctl(BLKGETSIZE64)`, `fstatfs`) and through which every completion result is read. Tests
//!   replace it to inject faults. It is not part of the public API: the
//!   crate's non-default feature `test-util` re-exports it (with
//!   [`RealSyscalls`], [`SetupParams`], [`CacheStat`] and `io_uring::IoUring`)
//!   for this crate's own integration tests and benchmark, which drive the
//!   real kernel through a seam that injects faults or counts syscalls.
//! * [`LendingRing`] (`lending_ring.rs`), the owner of the io_uring instance *and* of every buffer and
//!   timespec the kernel may touch. An SQE can only point into memory this
//!   module owns, and that memory is handed back ([`LendingRing::take`]) only once
//!   the last CQE of its slot has been reaped. This is the invariant that
//!   makes every `unsafe` block below sound: **a buffer in flight belongs to
//!   the ring until its completion arrives**, whatever happened to the future
//!   or request that lent it. Dropping a `LendingRing` with IO in flight cancels it
//!   and waits for every outstanding CQE before the memory is released.

#[cfg(feature = "tokio")]
use std::io;

mod lending_ring;
mod syscalls;

#[cfg(feature = "test-util")]
pub use lending_ring::WARM_UP_USER_DATA;
pub(crate) use lending_ring::{Cqe, IoKind, IoSqe, LendingRing, SlotId, Tag};
pub use syscalls::{CacheStat, RealSyscalls, SetupParams, Syscalls};

/// Makes the syscall seam of each ring, thread or blocking-pool call that
/// needs one.
pub(crate) type SysFactory = std::sync::Arc<dyn Fn() -> Box<dyn Syscalls> + Send + Sync>;

/// The current CLOCK_MONOTONIC time in ns (what absolute io_uring timeouts use).
pub(crate) fn monotonic_now_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    (ts.tv_sec() as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec() as u64)
}

/// A non-blocking eventfd registered with the current tokio reactor.
#[cfg(feature = "tokio")]
pub(crate) fn async_eventfd() -> io::Result<tokio::io::unix::AsyncFd<nix::sys::eventfd::EventFd>> {
    use nix::sys::eventfd::{EfdFlags, EventFd};
    let efd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
    // SAFETY: `EventFd` owns its descriptor, which therefore stays open and
    // unchanged (`as_raw_fd` always returns it) until the `AsyncFd` drops it.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(efd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}
