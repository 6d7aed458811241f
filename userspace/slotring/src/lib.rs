//! # slotring
//!
//! The facade of the slotring workspace: what a storage service embeds. (The
//! `slotring` command lives in the `slotring-cli` crate; nothing of it —
//! clap, the workload, the report — reaches a service through this crate.)
//!
//! * Re-exports, each behind a feature of the same name (all default):
//!   [`throttle`] (`slotring-throttle`: ClickHouse's `Throttler`, exact and
//!   lock-free), [`slots`] (`slotring-slots`: CPU slots, three schedulers,
//!   parkable leases), [`uring`] (`slotring-uring`: throttled IO through
//!   io_uring with page-cache detection and timeout-SQE waits), [`bpf`]
//!   (`slotring-bpf`: the kernel proof that parked threads cost nothing, and
//!   stats in pinned BPF maps).
//! * [`snapshot`] (with `slots` and `uring`): plain snapshots of every
//!   counter, what metrics and reports are built from.
//! * [`install_ring_wait`] (with `uring`): throttle waits on a per-thread
//!   io_uring ring where io_uring is available.
//! * [`pinned`] (with `bpf`): read the pinned maps of any process that
//!   embeds slotring with probes.
//! * [`metrics`] (feature `prometheus`, off by default): Prometheus families
//!   from snapshots, and [`metrics::SlotringCollector`] to register into the
//!   service's own `prometheus::Registry`.
//!
//! Embedding the three mechanisms in a storage service — a block-device
//! read throttler, one query's CPU slot allocation, and the io_uring engine
//! that charges reads to the throttler and parks the thread's CPU lease while
//! it waits:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use slotring::slots::ConcurrencyControl;
//! use slotring::throttle::{Throttle, ThrottlePtr, Throttler};
//! use slotring::uring::{RingConfig, UringFile, open_engine};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Server-wide: 100 MiB/s from the block device, 4 CPU slots.
//! let disk: ThrottlePtr = Arc::new(
//!     Throttler::builder(100 << 20)
//!         .name("local_read")
//!         .limits_block_device_bandwidth(true)
//!         .build()?,
//! );
//! let cpu = ConcurrencyControl::new();
//! cpu.set_max_concurrency(4);
//!
//! // One query: at least 1, at most 2 threads.
//! let query = cpu.allocate(1, 2)?;
//! let mut slot = query.acquire()?;
//! let _running = slot.make_current(); // this thread's CPU lease
//!
//! // io_uring if the kernel allows it, pread otherwise (and why).
//! let (mut engine, why_not_uring) = open_engine(&RingConfig::default());
//! if let Some(e) = why_not_uring {
//!     eprintln!("using {}: {e}", engine.kind());
//! }
//! let path = std::env::temp_dir().join(format!("slotring-doc-{}", std::process::id()));
//! std::fs::write(&path, vec![7u8; 64 << 10])?;
//! let file = UringFile::new(std::fs::File::open(&path)?)?;
//! let (n, buf) = engine.read_at(&file, vec![0; 64 << 10], 0, Some(&disk), Duration::from_secs(1));
//! assert_eq!(n?, 64 << 10);
//! assert!(buf.iter().all(|&b| b == 7));
//! // Page-cache hits are not charged to a block-device throttler.
//! let c = engine.counters();
//! assert_eq!(c.read_bytes, 64 << 10);
//! std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

#[cfg(feature = "bpf")]
pub use slotring_bpf as bpf;
#[cfg(feature = "slots")]
pub use slotring_slots as slots;
#[cfg(feature = "throttle")]
pub use slotring_throttle as throttle;
#[cfg(feature = "uring")]
pub use slotring_uring as uring;

#[cfg(feature = "prometheus")]
pub mod metrics;

/// Install the ring-timeout wait ([`uring::RingWait`]) as the process-wide
/// default wait of `slotring-throttle`; call once at start-up, before
/// building throttlers. Throttle waits that do not go through an engine (a
/// plain [`throttle::Throttle::throttle`], e.g. on network bytes) then wait
/// on a per-thread io_uring ring ([`uring::RingWait`]: `io_uring_enter`'s
/// absolute timeout, woken 20 µs early and the rest spun) with the CPU lease
/// parked, instead of `clock_nanosleep`: the ring's wake-up has no timer
/// slack and overshoots less (`cargo xtask bench throttle`,
/// `wait_overshoot_us_p50_ring`; every variant in `cargo xtask bench wait`).
///
/// Returns why not, where io_uring is unavailable (the waits keep
/// `clock_nanosleep`; say it once). Installing twice changes nothing.
#[cfg(feature = "uring")]
pub fn install_ring_wait() -> Option<uring::UringError> {
    match uring::RingWait::new() {
        Ok(w) => {
            throttle::install_default_wait(std::sync::Arc::new(w));
            None
        }
        Err(e) => Some(e),
    }
}
#[cfg(feature = "bpf")]
pub mod pinned;
#[cfg(all(feature = "slots", feature = "uring"))]
pub mod snapshot;

/// The README's examples, compiled and run as this crate's doctests so that
/// the first code a newcomer copies cannot drift from the API.
#[cfg(all(doctest, feature = "slots", feature = "uring"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
