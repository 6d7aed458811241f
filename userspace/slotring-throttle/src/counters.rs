//! Per-throttler statistics.
//!
//! [`ThrottleCounters`] is the plain `#[repr(C)]` snapshot that later layers
//! copy into BPF maps and Prometheus, defined by one field list
//! ([`slotring_counters::counter_set!`]); the live values are atomics.
//!
//! Memory ordering: every counter is an independent statistic that orders
//! nothing else, so all updates and reads are `Relaxed`. A snapshot is not an
//! atomic cut across counters.

use crate::sync::{AtomicU64, Ordering};

slotring_counters::counter_set! {
    /// A snapshot of one throttler's counters. Plain `u64`s, C layout (the
    /// BPF `struct throttle_stats` is a name followed by these fields); one
    /// Prometheus series per throttler, labelled with its name.
    pub struct ThrottleCounters, prefix = "slotring_throttler" {
        /// In tokens over the throttler's life (ClickHouse's `count`).
        counter amount => "bytes": "Bytes charged to the throttler.",
        counter page_cache_amount => "page_cache_bytes": "Page-cache bytes this block-device throttler did not charge.",
        /// In microseconds.
        counter(us) wait_us => "wait_seconds": "Time waited (or booked to wait) on the throttler.",
        counter waits: "Waits (or booked waits) on the throttler.",
        gauge block_count => "blocked": "Threads blocked in the throttler now.",
        /// Tokens/s at snapshot time.
        gauge max_speed => "max_bytes_per_second": "Configured rate of the throttler (0 = unlimited).",
    }
}

#[derive(Debug, Default)]
pub(crate) struct LiveCounters {
    pub(crate) page_cache_amount: AtomicU64,
    pub(crate) wait_ns: AtomicU64,
    pub(crate) waits: AtomicU64,
    pub(crate) block_count: AtomicU64,
}

impl LiveCounters {
    pub(crate) fn record_wait(&self, ns: u64) {
        self.wait_ns.fetch_add(ns, Ordering::Relaxed);
        self.waits.fetch_add(1, Ordering::Relaxed);
    }
}

/// RAII increment of `block_count` for the duration of a wait.
pub(crate) struct Blocked<'a>(&'a AtomicU64);

impl<'a> Blocked<'a> {
    pub(crate) fn new(c: &'a AtomicU64) -> Self {
        c.fetch_add(1, Ordering::Relaxed);
        Self(c)
    }
}

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
