//! A workload's state that the lock-free path reads and writes: its caps,
//! its in-flight counts and how many requests queue in its subtree. Shared
//! (`Arc`) between the scheduler's core, the workload handles and the
//! permits, and carried by name across live changes, so a permit granted
//! before a change gives its place back to the same counts after it.

use super::cap::{Cap, CapSpec};
use super::counters::NodeCounters;
use super::inflight::InFlight;
use super::spec::WorkloadSpec;
use super::{Resource, WorkloadError};
use crate::bucket::BucketError;
use crate::sync::{AtomicBool, AtomicU64, Ordering};

/// See the module docs. Laid out in this order (`repr(C)`), so that what
/// the lock-free path only reads never shares a cache line with what it
/// writes, and a dispatch under the lock finds what it writes on the line it
/// already holds. The first line: `queued`, the flags and the counters'
/// head (the cost granted after a wait), all written only under the
/// scheduler's lock (or by a live change) and read by every request; a
/// dispatch writes `queued` and the cost granted there together. Then the
/// rest of the counters (the wait histogram, the pointer to the per-thread
/// shards that the lock-free path writes: the `counters` module), the caps
/// (read-only pointers to their buckets), and the in-flight counts,
/// 128-byte aligned on lines of their own (written by every request through
/// a limit here). Aligned to 128 bytes (a pair of lines, which Intel's
/// adjacent-line prefetcher moves together): one workload's lines never
/// share with another's.
#[derive(Debug)]
#[repr(C, align(128))]
pub(crate) struct NodeShared {
    /// Requests queued in this node's subtree, written only under the
    /// scheduler's lock: incremented `SeqCst` (see the `inflight` module's
    /// memory ordering), decremented by [`NodeShared::dequeued`].
    pub(crate) queued: AtomicU64,
    /// Set by the live change that removes the workload.
    pub(crate) removed: AtomicBool,
    /// Whether requests may enter here (no children).
    pub(crate) leaf: AtomicBool,
    /// This node's index in the core's arena (written under the lock).
    pub(crate) index: AtomicU64,
    /// What it was charged (`counters.rs`).
    pub(crate) counters: NodeCounters,
    pub(crate) name: String,
    pub(crate) bytes: Cap,
    pub(crate) ops: Cap,
    pub(crate) inflight: InFlight,
}

/// What a spec asks of one resource.
pub(crate) struct Limits {
    pub(crate) bytes: Option<CapSpec>,
    pub(crate) ops: Option<CapSpec>,
    pub(crate) max_reqs: Option<u64>,
    pub(crate) max_bytes: Option<u64>,
}

impl Limits {
    pub(crate) fn of(spec: &WorkloadSpec, resource: Resource) -> Self {
        match resource {
            Resource::Io => Self {
                bytes: spec.max_bytes_per_second.map(|rate| CapSpec {
                    rate,
                    burst: spec.max_burst_bytes.unwrap_or(rate),
                }),
                ops: spec.max_iops.map(|rate| CapSpec { rate, burst: rate }),
                max_reqs: spec.max_io_requests,
                max_bytes: spec.max_bytes_inflight,
            },
            Resource::CpuSlots => Self {
                bytes: None,
                ops: None,
                max_reqs: spec.max_concurrent_threads,
                max_bytes: None,
            },
        }
    }
}

pub(crate) fn cap_error(node: &str, e: BucketError, cost: u64) -> WorkloadError {
    match e {
        BucketError::Debt(_) => WorkloadError::Debt {
            node: node.to_owned(),
            cost,
        },
        // Rates are validated against MAX_RATE and bursts are one-second or
        // byte-sized: the bucket's range refusal names the setting.
        BucketError::RateTooLarge | BucketError::BurstTooLarge => WorkloadError::CapTooLarge {
            node: node.to_owned(),
            setting: "max_burst_bytes",
            value: cost,
            max: crate::MAX_RATE,
        },
    }
}

impl NodeShared {
    pub(crate) fn new(
        spec: &WorkloadSpec,
        resource: Resource,
        leaf: bool,
        index: usize,
        now: u64,
    ) -> Result<Self, WorkloadError> {
        let l = Limits::of(spec, resource);
        let burst = spec.max_burst_bytes.unwrap_or(0);
        Ok(Self {
            name: spec.name.clone(),
            queued: AtomicU64::new(0),
            inflight: InFlight::new(l.max_reqs, l.max_bytes),
            bytes: Cap::new(l.bytes, now).map_err(|e| cap_error(&spec.name, e, burst))?,
            ops: Cap::new(l.ops, now).map_err(|e| cap_error(&spec.name, e, burst))?,
            removed: AtomicBool::new(false),
            leaf: AtomicBool::new(leaf),
            index: AtomicU64::new(index as u64),
            counters: NodeCounters::default(),
        })
    }

    /// Apply `spec`'s limits (a live change, under the scheduler's lock).
    pub(crate) fn change(
        &self,
        spec: &WorkloadSpec,
        resource: Resource,
        now: u64,
    ) -> Result<(), WorkloadError> {
        let l = Limits::of(spec, resource);
        let burst = spec.max_burst_bytes.unwrap_or(0);
        self.bytes
            .change(l.bytes, now)
            .map_err(|e| cap_error(&spec.name, e, burst))?;
        self.ops
            .change(l.ops, now)
            .map_err(|e| cap_error(&spec.name, e, burst))?;
        self.inflight.set_limits(l.max_reqs, l.max_bytes);
        Ok(())
    }

    /// One request fewer queued in the subtree: a dispatch or a
    /// cancellation, under the scheduler's lock, `queued`'s only writer.
    /// A load and a store, not a read-modify-write: only an increment pairs
    /// with a completion (the `inflight` module's memory ordering), and a
    /// decrement another thread sees late costs it at most a trip through
    /// the lock (a request that takes the locked path, a completion that
    /// finds nothing queued behind it).
    pub(crate) fn dequeued(&self) {
        let q = self.queued.load(Ordering::Relaxed);
        self.queued.store(q - 1, Ordering::Release);
    }

    pub(crate) fn index(&self) -> usize {
        self.index.load(Ordering::Relaxed) as usize
    }
}
