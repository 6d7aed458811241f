//! Per-throttler statistics.
//!
//! [`ThrottleCounters`] is the plain `#[repr(C)]` snapshot that later layers
//! copy into BPF maps and Prometheus, defined by one field list in
//! `slotring-counters` (with every other counter set, so that `slotring-bpf`
//! mirrors them all from one place); the live values, kept here, are atomics.
//!
//! Memory ordering: every counter is an independent statistic that orders
//! nothing else, so all updates and reads are `Relaxed`. A snapshot is not an
//! atomic cut across counters.

use crate::sync::{AtomicU64, Ordering};

pub use slotring_counters::throttle::ThrottleCounters;

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
