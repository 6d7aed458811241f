//! Per-throttler statistics.
//!
//! [`ThrottleCounters`] is the plain `#[repr(C)]` snapshot that later layers
//! copy into BPF maps and Prometheus; the live values are atomics.
//!
//! Memory ordering: every counter is an independent statistic that orders
//! nothing else, so all updates and reads are `Relaxed`. A snapshot is not an
//! atomic cut across counters.

use crate::sync::{AtomicU64, Ordering};

/// A snapshot of one throttler's counters. Plain `u64`s, C layout.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleCounters {
    /// Tokens charged over the throttler's life (ClickHouse's `count`).
    pub amount: u64,
    /// Page-cache tokens that this block-device throttler did not charge.
    pub page_cache_amount: u64,
    /// Total time waited (or booked to wait), in microseconds.
    pub wait_us: u64,
    /// Number of waits (or booked waits).
    pub waits: u64,
    /// Threads blocked in this throttler right now (a gauge).
    pub block_count: u64,
    /// The configured rate at snapshot time, tokens/s (0 = unlimited).
    pub max_speed: u64,
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
