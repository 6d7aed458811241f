//! Per-workload counters: what each workload was charged, how long its
//! requests queued, and how many it had in flight at most, kept with the
//! node's shared state (so a permit granted before a live change counts on
//! the same workload after it) and read as a plain snapshot
//! ([`WorkloadScheduler::counters`]). Every count is a relaxed atomic
//! added to where the request is granted or refunded, never under a lock
//! of its own; a snapshot is consistent per counter, not across them.

use std::time::Duration;

use super::node::NodeShared;
use super::scheduler::WorkloadScheduler;
use crate::sync::{AtomicU64, Ordering, lock};

/// Buckets of the wait-time histogram: bucket `k < WAIT_BUCKETS - 1`
/// counts waits below `2^k` µs (bucket 0: no wait at all, or under 1 µs);
/// the last counts the rest (from about 1 s).
pub const WAIT_BUCKETS: usize = 22;

/// The upper bound of histogram bucket `k` (`None`: the last, unbounded).
pub fn wait_bucket_bound(k: usize) -> Option<Duration> {
    (k + 1 < WAIT_BUCKETS).then(|| Duration::from_micros(1 << k))
}

/// A node's counters (see the module docs).
#[derive(Debug)]
pub(crate) struct NodeCounters {
    bytes: AtomicU64,
    requests: AtomicU64,
    refunded_bytes: AtomicU64,
    waits: [AtomicU64; WAIT_BUCKETS],
}

impl Default for NodeCounters {
    fn default() -> Self {
        Self {
            bytes: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            refunded_bytes: AtomicU64::new(0),
            waits: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

fn bucket(wait_ns: u64) -> usize {
    let us = wait_ns / 1000;
    if us == 0 {
        return 0;
    }
    // `us < 2^k` for the smallest such k.
    let k = (u64::BITS - us.leading_zeros()) as usize;
    k.min(WAIT_BUCKETS - 1)
}

impl NodeCounters {
    /// A request of `cost` was granted after queueing `wait_ns`.
    pub(crate) fn granted(&self, cost: u64, wait_ns: u64) {
        self.bytes.fetch_add(cost, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.waits[bucket(wait_ns)].fetch_add(1, Ordering::Relaxed);
    }

    /// `n` bytes charged went back (a page-cache read found after its
    /// charge; a request granted whose caller never saw the permit).
    pub(crate) fn refunded(&self, n: u64) {
        self.refunded_bytes.fetch_add(n, Ordering::Relaxed);
    }
}

/// Record a grant of `cost` after `wait_ns` on every node of `path`.
pub(crate) fn granted(path: &[std::sync::Arc<NodeShared>], cost: u64, wait_ns: u64) {
    for n in path {
        n.counters.granted(cost, wait_ns);
    }
}

/// One workload's counters, as [`WorkloadScheduler::counters`] reads them.
/// Counts of a node cover its whole subtree. The default is a workload of
/// no name that was granted nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadCounters {
    /// The workload's name.
    pub name: String,
    /// Its parent (`None`: the root).
    pub parent: Option<String>,
    /// Cost granted (bytes for a disk; slots for CPU), monotonic: refunds
    /// are counted apart.
    pub bytes: u64,
    /// Requests granted.
    pub requests: u64,
    /// Bytes given back after their grant (page-cache reads found after
    /// their charge, grants never picked up).
    pub refunded_bytes: u64,
    /// Requests queued in its subtree now.
    pub queued: u64,
    /// Requests in flight through it now, where it limits them
    /// (`max_io_requests` / `max_concurrent_threads`; 0 elsewhere).
    pub in_flight_requests: u64,
    /// Bytes in flight through it now, where `max_bytes_inflight` limits
    /// them (0 elsewhere).
    pub in_flight_bytes: u64,
    /// The most requests it had in flight at once, where it limits them.
    pub peak_in_flight_requests: u64,
    /// How long its requests queued before their grant: bucket `k` by
    /// [`wait_bucket_bound`].
    pub wait_histogram: [u64; WAIT_BUCKETS],
}

impl WorkloadScheduler {
    /// Every workload's counters, in the tree's order (bounded by the tree:
    /// one entry per workload).
    pub fn counters(&self) -> Vec<WorkloadCounters> {
        let st = lock(&self.shared.state);
        st.spec
            .specs()
            .iter()
            .filter_map(|spec| {
                let n = st.tree.shared(st.tree.find(&spec.name)?);
                let c = &n.counters;
                let (in_flight_requests, in_flight_bytes) = n.inflight.counts();
                Some(WorkloadCounters {
                    name: spec.name.clone(),
                    parent: spec.parent.clone(),
                    bytes: c.bytes.load(Ordering::Relaxed),
                    requests: c.requests.load(Ordering::Relaxed),
                    refunded_bytes: c.refunded_bytes.load(Ordering::Relaxed),
                    queued: n.queued.load(Ordering::SeqCst),
                    in_flight_requests,
                    in_flight_bytes,
                    peak_in_flight_requests: n.inflight.peak_requests(),
                    wait_histogram: std::array::from_fn(|k| c.waits[k].load(Ordering::Relaxed)),
                })
            })
            .collect()
    }

    /// The counters of workload `name`.
    pub fn counters_of(&self, name: &str) -> Result<WorkloadCounters, super::WorkloadError> {
        self.counters()
            .into_iter()
            .find(|c| c.name == name)
            .ok_or_else(|| super::WorkloadError::Unknown {
                node: name.to_owned(),
            })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn waits_fall_in_power_of_two_microsecond_buckets() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(999), 0, "under 1 µs");
        assert_eq!(bucket(1_000), 1, "1 µs < 2 µs");
        assert_eq!(bucket(3_999), 2, "3 µs < 4 µs");
        assert_eq!(bucket(4_000), 3);
        assert_eq!(bucket(u64::MAX), WAIT_BUCKETS - 1);
        assert_eq!(wait_bucket_bound(2), Some(Duration::from_micros(4)));
        assert_eq!(wait_bucket_bound(WAIT_BUCKETS - 1), None);
    }
}
