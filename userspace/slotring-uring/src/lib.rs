//! # slotring-uring
//!
//! Throttled file IO through io_uring: every read and write at an offset is
//! charged to a [`Throttle`](slotring_throttle::Throttle) chain; a throttle
//! wait is an absolute `IORING_OP_TIMEOUT` linked to the IO it delays (no
//! thread, no nanosleep, no CPU slot) — or, for a caller that parks a CPU
//! lease, a standalone timeout followed by the IO once the lease is back
//! (see the `uring_engine` module docs); page-cache hits are detected on the
//! ring with `RWF_NOWAIT` and charged only to throttlers that count them; a
//! guard keeps NOWAIT misses from bursting the block device.
//!
//! Front ends: [`UringEngine`] (blocking, the caller waits in
//! `io_uring_enter`; through [`IoEngine`] its CPU lease is parked exactly
//! while it waits on a throttle (a timeout, or in its own thread a paced
//! piece's turn or room under the writeback cap), never while the kernel
//! copies its data; many requests per thread via
//! [`UringEngine::submit_read`]/[`UringEngine::wait_any`]),
//! [`LocalEngine`] (tokio, eventfd + `AsyncFd`, one per thread) and
//! [`SharedEngine`] (`Send + Sync + Clone`, for any task on the
//! multi-thread runtime). [`PreadEngine`] serves the
//! same [`IoEngine`] trait where io_uring is unavailable
//! ([`open_engine`] picks and names the cause). Every engine charges by one
//! policy (`policy.rs`): what counts as page cache, when the disk-rate guard
//! asks `cachestat(2)` instead of probing, what a filesystem without
//! `RWF_NOWAIT` is charged as. `route.rs` decides, for each request, which
//! code carries it out and how the policy charges it, and lists every stop
//! of each route.
//!
//! A throttled buffered write on a disk filesystem reaches the disk at the
//! throttled pace: it is booked and issued in pieces of 256 KiB, each
//! followed at once by its writeback, completed by the device (on the ring
//! an `IORING_OP_SYNC_FILE_RANGE(WAIT_BEFORE | WRITE | WAIT_AFTER)` linked
//! to the write; in [`PreadEngine`], and in a [`UringEngine`]'s
//! [`IoEngine::write_at`] when its ring holds nothing else, `pwrite` and
//! `sync_file_range(2)` in the caller's own thread, and in a
//! [`SharedEngine`] the same on tokio's blocking pool by default,
//! [`PacedWrites`]), at most
//! [`Policy::writeback_depth`] pieces of a request on their way to the
//! device, so the kernel does not flush it later in a burst; `O_DIRECT` needs no pacing and tmpfs has no disk
//! (see `policy.rs`). Pacing promises no durability: `fsync` stays the
//! caller's. A failed write is [`UringError::Write`], naming the file, the
//! offset reached and the bytes written before it.
//!
//! The only `unsafe` code is in `sys`: the syscall seam every syscall
//! passes through and the ring that owns every buffer lent to the kernel
//! until its last CQE arrives. See the module docs of `ring_core` for how a
//! request moves through the ring.
//!
//! # Features
//!
//! * `tokio` (on by default): the async front ends — [`LocalEngine`],
//!   [`SharedEngine`] (its [`SharedConfig`], [`Reaper`], [`PacedWrites`])
//!   and the [`AsyncIo`] trait they share — and with them the dependency on
//!   tokio. Without it the crate is the blocking engines, [`open_engine`]
//!   and [`RingWait`], and builds no tokio.
//! * `test-util` (off by default): exposes the syscall seam —
//!   `Syscalls`, `RealSyscalls`, `SetupParams`, `CacheStat`, `IoUring` and
//!   the `with_syscalls` constructors, `open_engine_with` — so that this
//!   crate's integration tests can inject faults into the real kernel's
//!   answers and its benchmark can count syscalls. It is not an API to
//!   build on.
//!
//! ```
//! use std::sync::Arc;
//! use slotring_throttle::{ThrottlePtr, Throttler, UNLIMITED_BLOCK};
//! use slotring_uring::{RingConfig, UringFile, open_engine};
//!
//! let path = std::env::temp_dir().join(format!("slotring-uring-doc-{}", std::process::id()));
//! std::fs::write(&path, b"hello, ring").unwrap();
//! let file = UringFile::new(std::fs::File::open(&path).unwrap()).unwrap();
//! let disk: ThrottlePtr = Arc::new(
//!     Throttler::builder(100 << 20).limits_block_device_bandwidth(true).build().unwrap(),
//! );
//! // io_uring if the kernel allows it, else pread with the reason why not.
//! let (mut engine, why_not_uring) = open_engine(&RingConfig::default());
//! if let Some(e) = why_not_uring {
//!     eprintln!("using pread: {e}");
//! }
//! let (n, buf) = engine.read_at(&file, vec![0; 64], 0, Some(&disk), UNLIMITED_BLOCK);
//! assert_eq!(&buf[..n.unwrap()], b"hello, ring");
//! std::fs::remove_file(&path).unwrap();
//! ```
#![cfg_attr(
    not(feature = "tokio"),
    doc = "\n[`LocalEngine`]: #features\n[`SharedEngine`]: #features\n[`SharedConfig`]: #features\n[`Reaper`]: #features\n[`PacedWrites`]: #features\n[`AsyncIo`]: #features"
)]
#![deny(unsafe_code)]

#[cfg(feature = "tokio")]
mod async_io;
#[cfg(feature = "tokio")]
mod async_wait;
mod counters;
mod engine;
mod error;
mod file;
#[cfg(feature = "tokio")]
mod local_engine;
mod policy;
#[cfg(feature = "tokio")]
mod pool_io;
mod pread_engine;
mod ring_core;
mod ring_wait;
mod route;
#[cfg(feature = "tokio")]
mod shard;
#[cfg(feature = "tokio")]
mod shared_engine;
#[allow(
    unsafe_code,
    reason = "the io_uring boundary: SQEs point into memory the ring owns; every block has a SAFETY comment"
)]
mod sys;
mod thread_io;
mod uring_engine;
mod writeback_cap;

#[cfg(feature = "tokio")]
pub use crate::async_io::AsyncIo;
pub use crate::counters::UringCounters;
#[cfg(feature = "test-util")]
pub use crate::engine::open_engine_with;
pub use crate::engine::{CANCEL_POLL, IoEngine, RingConfig, open_engine};
pub use crate::error::{BufResult, UringError};
pub use crate::file::{NowaitMode, SIZE_UNBOUNDED, UringFile};
#[cfg(feature = "tokio")]
pub use crate::local_engine::LocalEngine;
pub use crate::policy::{Op, Policy};
pub use crate::pread_engine::PreadEngine;
pub use crate::ring_wait::{RingWait, RingWaitConfig};
#[cfg(feature = "tokio")]
pub use crate::shared_engine::{PacedWrites, Reaper, SharedConfig, SharedEngine};
#[cfg(feature = "test-util")]
pub use crate::sys::{CacheStat, RealSyscalls, SetupParams, Syscalls, WARM_UP_USER_DATA};
pub use crate::uring_engine::{Completion, Ticket, UringEngine};
pub use crate::writeback_cap::{writeback_high_water, writeback_in_flight};

/// Re-exported so seam implementations can name the ring type.
#[cfg(feature = "test-util")]
pub use io_uring::IoUring;
