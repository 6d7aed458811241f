//! Workload classes: one tree of priorities, weights, caps and in-flight
//! limits for disk bytes, IOs and CPU slots.
//!
//! # The model
//!
//! ClickHouse's workload scheduler (`CREATE RESOURCE` / `CREATE WORKLOAD`,
//! `src/Common/Scheduler/Nodes`) in Seastar's `fair_queue` terms. A
//! [`WorkloadTree`] names workloads, each under a parent, with ClickHouse's
//! settings ([`WorkloadSpec`]); a [`WorkloadScheduler`] schedules one
//! [`Resource`] by it. Each workload is a node made of small pieces, each
//! with its own model in its own file:
//!
//! ```text
//!   cap (max_bytes_per_second + max_burst_bytes, max_iops)     cap.rs
//!    └ in-flight (max_io_requests, max_bytes_inflight)         inflight.rs
//!       └ priority (strict between siblings, lower first)      priority_policy.rs
//!          └ fair[p] (weights among siblings of priority p)    fair_policy.rs
//!             └ children … or, at a leaf, the FIFO queue       leaf_queue.rs
//! ```
//!
//! * **Leaves** are where requests enter (a query, a customer's query,
//!   "compaction"). A request is charged along its path to the root: its
//!   bytes and one IO to every cap on the way, one in-flight place (and its
//!   bytes) on every node with an in-flight limit, held until it completes.
//! * **Priority** is strict between siblings: the lower value is served
//!   first, and a lower priority only when every higher one has nothing
//!   eligible.
//! * **Weight** is a max-min fair share among siblings of one priority
//!   (start-time fair queueing on virtual runtimes, exact integers). While
//!   backlogged, a child receives `w / Σw` of what its parent is given.
//! * **Catch-up bound.** A child that becomes active again (after idle, or
//!   when its own constraint lets it go) starts no further back than its
//!   share of τ seconds of the tightest cap above it (Seastar's `tau`):
//!   never a burst of its idle time.
//! * **A cap** is an exact bucket of the node's own (the crate's `Bucket`). It
//!   is non-work-conserving: a capped node is ineligible while its debt ends
//!   more than τ from now, even on an idle disk, and its children share,
//!   by their priorities and weights, exactly what it lets through. The
//!   request that takes a bucket into debt goes; the next waits for it.
//! * **In-flight limits** count requests and bytes submitted and not yet
//!   complete: requests never exceed `max_io_requests`; bytes never exceed
//!   `max_bytes_inflight`, except that one request larger than it runs
//!   with no other bytes in flight. The completion (the [`Permit`] dropping) gives the places back
//!   and hands them to whoever queues behind them.
//! * **Work-conserving otherwise**: only a cap or an in-flight limit makes a
//!   request wait. When nothing binds, every request goes at once; when
//!   something binds, the next request comes from the highest priority, then
//!   the fairest child, among the subtrees it does not bind.
//!
//! **The root** is a workload like the others; its cap is where a
//! throttler's limit goes (one exact bucket for the whole resource).
//!
//! **Booking horizon τ.** A request is dispatched once every cap on its path
//! would have paid its debt within τ; its [`Permit`] carries the delay until
//! then, which an IO engine waits as a timeout SQE, so the next booking is
//! made before the previous one's time is up and the device never idles at
//! a hand-over (the crate's flat `FairGate` does the same). It bounds how far
//! background work can be booked ahead of a user request: behind a cap, a
//! priority-0 request waits at most one request of lower priority plus τ
//! (behind an in-flight limit, until the first completion). Default
//! [`DEFAULT_TAU`] = 1 ms: Seastar's 5 ms would let a 64 MiB/s background
//! scan put 5 ms in front of every user read.
//!
//! **Starvation.** Strict priority, with the higher priorities' own caps as
//! the bound: a lower priority receives at least its parent's share minus
//! the caps of its higher-priority siblings. We chose it over RocksDB's
//! fairness draw (one refill in ten serves low priority first) because the
//! draw makes the foreground pay for the background's guarantee at random,
//! in its tail latency, while a cap on the foreground states the same
//! guarantee exactly and costs the foreground nothing until it is reached.
//!
//! **Dropping** a queued [`Request`] hands its turn on and charges nothing.
//! **Live changes** ([`WorkloadScheduler::update`]) keep every queued request
//! and every charge (see the `cap` module for a cap's change).
//!
//! # CPU slots
//!
//! [`Resource::CpuSlots`] schedules the same tree for CPU slots: a request
//! is one slot (cost 1), `max_concurrent_threads` is its in-flight limit,
//! and a permit is the slot, given back when it drops. Priorities and
//! weights decide which workload's waiting thread gets a freed slot.
//!
//! # The lock-free path
//!
//! A request whose path has nothing queued takes its in-flight places and
//! its caps' charges with atomics only (see the `scheduler` module): no
//! lock when no level queues. The fair order counts the service it decides:
//! such a request is not added to its workload's virtual runtime (nothing
//! competed with it), and when requests queue again every child starts
//! within the catch-up bound of its siblings.
//!
//! ```
//! use slotring_throttle::{Resource, WorkloadScheduler, WorkloadSpec, WorkloadTree};
//!
//! let tree = WorkloadTree::new(vec![
//!     WorkloadSpec::new("all").max_bytes_per_second(64 << 20),
//!     WorkloadSpec::new("user").parent("all").priority(0),
//!     WorkloadSpec::new("background")
//!         .parent("all")
//!         .priority(1)
//!         .max_bytes_per_second(32 << 20),
//! ])
//! .unwrap();
//! let disk = WorkloadScheduler::new(&tree, Resource::Io).unwrap();
//! let user = disk.workload("user").unwrap();
//! let permit = user.acquire(256 << 10).unwrap(); // a 256 KiB read
//! assert!(!permit.waited());
//! ```

mod cap;
mod core;
mod counters;
mod error;
mod fair_policy;
mod inflight;
mod leaf_queue;
mod node;
mod priority_policy;
mod scheduler;
mod spec;
mod swap;
mod throttle_seam;

use std::ops::RangeInclusive;
use std::time::Duration;

pub use counters::{WAIT_BUCKETS, WorkloadCounters, wait_bucket_bound};
pub use error::WorkloadError;
pub use scheduler::{Permit, Request, Workload, WorkloadScheduler, WorkloadSchedulerBuilder};
pub use spec::{WorkloadSpec, WorkloadTree};

/// The accepted priorities (lower is served first).
pub const PRIORITIES: RangeInclusive<i64> = -32_768..=32_767;
/// The largest weight.
pub const MAX_WEIGHT: u32 = 1 << 16;
/// The deepest tree: the root is level 1.
pub const MAX_DEPTH: usize = 64;
/// The default booking horizon and catch-up bound τ (see the module docs).
pub const DEFAULT_TAU: Duration = Duration::from_millis(1);

/// What a scheduler's tree divides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    /// A disk: a request costs its bytes and one IO; caps are
    /// `max_bytes_per_second`/`max_burst_bytes` and `max_iops`, in-flight
    /// limits `max_io_requests` and `max_bytes_inflight`.
    Io,
    /// CPU slots: a request is one slot; `max_concurrent_threads` is the
    /// in-flight limit; no caps.
    CpuSlots,
}
