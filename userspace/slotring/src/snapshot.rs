//! Plain snapshots of every counter slotring keeps: what `/metrics`, the
//! pinned-map reader and the `slotring` command's report are built from.
//!
//! A [`Snapshot`] holds the `#[repr(C)]` counter structs of the other crates
//! (one [`ThrottleCounters`] per named throttler, [`SlotsCounters`],
//! [`UringCounters`]) and, when the kernel probes are attached, a
//! [`KernelSnapshot`]. Snapshots are values: building metrics from them never
//! touches a live throttler, slot budget or ring.
//!
//! Each counter struct is described field by field through [`CounterSet`]
//! (name, metric name, help, counter or gauge, unit), so a report or an
//! exporter can walk every counter without naming one; counter structs sum
//! with `+` and `sum()` (one engine's counters over many engines, …).

pub use slotring_counters::{CounterSet, Field, Kind, Unit};
use slotring_slots::SlotsCounters;
use slotring_throttle::ThrottleCounters;
use slotring_uring::UringCounters;

/// Buckets of the kernel's exp2 histograms (`slotring_bpf::abi::HIST_SLOTS`).
pub const HIST_BUCKETS: usize = 40;

/// One named throttler's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamedThrottler {
    /// The throttler's name (the `throttler` label).
    pub name: String,
    /// Its counters.
    pub counters: ThrottleCounters,
}

/// What the kernel probes measured, summed over the traced threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSnapshot {
    /// Threads registered with the probes (live or exited).
    pub threads: u64,
    /// Threads whose lease is parked right now.
    pub leases_parked: u64,
    /// Parks seen by the lease mirror.
    pub parks: u64,
    /// Wall ns with a lease parked (from the threads' lease clocks).
    pub parked_ns: u64,
    /// On-CPU ns while parked (exact, from the kernel's per-task counters).
    pub parked_oncpu_ns: u64,
    /// Run-queue ns while parked.
    pub parked_runq_ns: u64,
    /// On-CPU ns while holding a running (unparked) lease.
    pub running_oncpu_ns: u64,
    /// Context-switch events BPF never saw (time stays exact).
    pub missed_events: u64,
    /// exp2 histogram (ns) of on-CPU time per parked episode.
    pub hist_park_cpu: [u64; HIST_BUCKETS],
    /// exp2 histogram (ns) of run-queue latency at unpark.
    pub hist_unpark_rq: [u64; HIST_BUCKETS],
}

impl Default for KernelSnapshot {
    fn default() -> Self {
        Self {
            threads: 0,
            leases_parked: 0,
            parks: 0,
            parked_ns: 0,
            parked_oncpu_ns: 0,
            parked_runq_ns: 0,
            running_oncpu_ns: 0,
            missed_events: 0,
            hist_park_cpu: [0; HIST_BUCKETS],
            hist_unpark_rq: [0; HIST_BUCKETS],
        }
    }
}

/// Everything `/metrics` shows, as plain numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Named throttlers.
    pub throttlers: Vec<NamedThrottler>,
    /// The CPU slot budget's counters.
    pub slots: SlotsCounters,
    /// The IO engines' counters (summed over engines).
    pub uring: UringCounters,
    /// Kernel measurements; `None` when the probes are not attached.
    pub kernel: Option<KernelSnapshot>,
}
