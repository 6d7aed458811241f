//! Per-workload counters: what each workload was charged, how long its
//! requests queued, and how many it had in flight at most, kept with the
//! node's shared state (so a permit granted before a live change counts on
//! the same workload after it) and read as a plain snapshot
//! ([`WorkloadScheduler::counters`]). Every count is a relaxed atomic
//! added to where the request is granted or refunded, never under a lock
//! of its own; a snapshot is consistent per counter, not across them.
//!
//! # Memory ordering
//!
//! Every count is `Relaxed`: it orders nothing else and nothing else reads
//! it to decide anything. A grant without a wait adds to the shard of the
//! thread that makes it (`NodeCounters`). An exclusive shard has one
//! writer, its thread, which adds by a load and a store (nothing races
//! them); the shared shard takes atomic read-modify-writes, so none is lost
//! however many threads share it. A snapshot's sum of the shards is at
//! least every add that happened before it began (each shard only grows,
//! so successive snapshots never go back). What only a dispatch writes (a waited grant's bytes and wait
//! bucket) is written under the scheduler's lock, which orders its writers
//! and under which a snapshot reads it: a load and a store, no RMW.

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

/// A node's grants that did not wait (wait-histogram bucket 0), one shard
/// of them, alone on its pair of cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    bytes: AtomicU64,
    requests: AtomicU64,
}

/// A node's counters (see the module docs). A grant that did not wait (the
/// lock-free path's every grant) is added to one of `shards`, the calling
/// thread's ([`Claim`]): threads granting through one workload at once
/// write lines of their own instead of contending on one (a statistic
/// costs no cache-line transfer), and a thread that holds an exclusive
/// shard adds without a locked instruction. Grants that waited (made
/// under the scheduler's lock, their only writer) go to `bytes` and their
/// bucket of `waits`.
/// A snapshot sums the shards into `bytes` and bucket 0; the requests
/// granted are the sum of the buckets.
/// `bytes` first (`repr(C)`): the node's shared state puts it on the line
/// a dispatch already writes.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct NodeCounters {
    bytes: AtomicU64,
    shards: Box<[Shard]>,
    waits: [AtomicU64; WAIT_BUCKETS],
    refunded_bytes: AtomicU64,
}

/// The exclusive shards per node: one per CPU, at most 8. Each node has
/// one more, shared by the threads beyond them.
fn exclusive_shards() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .clamp(1, 8)
    })
}

/// A thread's shard number. One below [`exclusive_shards`] is held by one
/// live thread at a time (taken when the thread first grants, given back
/// when it exits), so that thread is the only writer of that shard of every
/// node; the threads beyond share the last one.
#[cfg(not(loom))]
struct Claim(usize);

/// Exclusive shard numbers: how many were ever handed out, and those given
/// back.
#[cfg(not(loom))]
static CLAIMS: std::sync::Mutex<(usize, Vec<usize>)> = std::sync::Mutex::new((0, Vec::new()));

#[cfg(not(loom))]
impl Claim {
    fn take() -> Self {
        let n = exclusive_shards();
        let mut c = CLAIMS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = c.1.pop() {
            return Claim(i);
        }
        if c.0 < n {
            c.0 += 1;
            return Claim(c.0 - 1);
        }
        Claim(n)
    }
}

#[cfg(not(loom))]
impl Drop for Claim {
    fn drop(&mut self) {
        if self.0 < exclusive_shards() {
            let mut c = CLAIMS.lock().unwrap_or_else(|p| p.into_inner());
            c.1.push(self.0);
        }
    }
}

/// The calling thread's shard (see [`Claim`]).
#[cfg(not(loom))]
fn shard_index() -> usize {
    thread_local! {
        static MINE: Claim = Claim::take();
    }
    // A grant made while the thread's locals are torn down (its claim
    // given back) goes to the shared shard.
    MINE.try_with(|m| m.0).unwrap_or(exclusive_shards())
}

/// Under loom every thread takes the shared shard: a claim is process
/// state that outlives a model's execution, and loom requires every
/// execution to repeat the operations of the one before. (An exclusive
/// shard's one writer has nothing to race; `tests/workload.rs` counts
/// exactly across threads.)
#[cfg(loom)]
fn shard_index() -> usize {
    exclusive_shards()
}

impl Default for NodeCounters {
    fn default() -> Self {
        Self {
            bytes: AtomicU64::new(0),
            shards: (0..=exclusive_shards()).map(|_| Shard::default()).collect(),
            waits: std::array::from_fn(|_| AtomicU64::new(0)),
            refunded_bytes: AtomicU64::new(0),
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
        match bucket(wait_ns) {
            0 => self.granted_in(shard_index(), cost),
            k => {
                self.bytes.fetch_add(cost, Ordering::Relaxed);
                self.waits[k].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A grant of `cost` without a wait, by the thread whose shard is
    /// `shard`: an exclusive shard has that thread for its only writer (a
    /// load and a store, no locked RMW); the shared one takes RMWs.
    fn granted_in(&self, shard: usize, cost: u64) {
        let s = &self.shards[shard];
        if shard + 1 < self.shards.len() {
            let b = s.bytes.load(Ordering::Relaxed);
            s.bytes.store(b.wrapping_add(cost), Ordering::Relaxed);
            let r = s.requests.load(Ordering::Relaxed);
            s.requests.store(r + 1, Ordering::Relaxed);
        } else {
            s.bytes.fetch_add(cost, Ordering::Relaxed);
            s.requests.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// [`NodeCounters::granted`] by a dispatch, under the scheduler's lock
    /// (`_locked`: its state, which lives only inside the lock). `bytes`
    /// and the buckets above 0 are written only under that lock, so they
    /// take a load and a store, not a locked read-modify-write; bucket 0
    /// (a wait under 1 µs) goes to a shard, which lock-free grants share.
    pub(crate) fn granted_locked(
        &self,
        cost: u64,
        wait_ns: u64,
        _locked: &super::scheduler::State,
    ) {
        match bucket(wait_ns) {
            0 => self.granted(cost, 0),
            k => {
                let b = self.bytes.load(Ordering::Relaxed);
                self.bytes.store(b.wrapping_add(cost), Ordering::Relaxed);
                let w = self.waits[k].load(Ordering::Relaxed);
                self.waits[k].store(w + 1, Ordering::Relaxed);
            }
        }
    }

    /// `n` bytes charged went back (a page-cache read found after its
    /// charge; a request granted whose caller never saw the permit).
    pub(crate) fn refunded(&self, n: u64) {
        self.refunded_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// The cost granted and the wait histogram, shards summed in.
    fn totals(&self) -> (u64, [u64; WAIT_BUCKETS]) {
        let mut waits: [u64; WAIT_BUCKETS] =
            std::array::from_fn(|k| self.waits[k].load(Ordering::Relaxed));
        let mut bytes = self.bytes.load(Ordering::Relaxed);
        for s in self.shards.iter() {
            bytes = bytes.wrapping_add(s.bytes.load(Ordering::Relaxed));
            waits[0] += s.requests.load(Ordering::Relaxed);
        }
        (bytes, waits)
    }
}

/// Record a grant of `cost` after `wait_ns` on every node of `path`.
pub(crate) fn granted(path: &[std::sync::Arc<NodeShared>], cost: u64, wait_ns: u64) {
    if bucket(wait_ns) == 0 {
        let shard = shard_index();
        for n in path {
            n.counters.granted_in(shard, cost);
        }
    } else {
        for n in path {
            n.counters.granted(cost, wait_ns);
        }
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
                let (bytes, wait_histogram) = c.totals();
                Some(WorkloadCounters {
                    name: spec.name.clone(),
                    parent: spec.parent.clone(),
                    bytes,
                    requests: wait_histogram.iter().sum(),
                    refunded_bytes: c.refunded_bytes.load(Ordering::Relaxed),
                    queued: n.queued.load(Ordering::SeqCst),
                    in_flight_requests,
                    in_flight_bytes,
                    peak_in_flight_requests: n.inflight.peak_requests(),
                    wait_histogram,
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
