//! # slotring-throttle
//!
//! ClickHouse's token-bucket `Throttler` (`src/Common/Throttler.{h,cpp}`; see
//! `ARCHITECTURE.md`), rebuilt to be exact and lock-free:
//!
//! * `tokens = min(burst, tokens + rate·elapsed) − amount`, in exact integer
//!   nano-tokens (no float drift), kept as GCRA virtual time in one 128-bit
//!   atomic word, so the no-wait path never serialises callers behind a mutex;
//! * a wait of exactly `ceil(deficit / rate)`, capped by `max_block`,
//!   performed by a [`WaitStrategy`] — by default an absolute-deadline sleep
//!   that parks the caller's CPU lease through a [`LeaseHook`];
//! * parent chains, [`ThrottlerArray`]s, a lifetime limit with a typed error,
//!   page-cache reads not charged to block-device limits, an injected
//!   [`Clock`] that never steps back.
//!
//! One deliberate difference from ClickHouse's code: it applies the `min`
//! *after* subtracting (`min(burst, tokens + rate·dt − amount)`), so after a
//! long idle a single request larger than the burst passes free and leaves
//! the bucket full — an unbounded burst that defeats the purpose of
//! `max_burst` (one second's worth of tokens). We cap the refill first, so the
//! burst stays bounded (see the test
//! `clickhouse_min_after_subtract_is_an_unbounded_burst`).
//!
//! This crate knows nothing of io_uring, tokio, BPF or Prometheus.
//!
//! ```
//! use std::time::Duration;
//! use slotring_throttle::{Throttle, Throttler};
//!
//! let t = Throttler::new(100 << 20).unwrap(); // 100 MiB/s, bucket starts full
//! let waited = t.throttle(4096, Duration::from_millis(100)).unwrap();
//! assert!(!waited);
//! ```
#![forbid(unsafe_code)]

mod array;
mod async_reserve;
mod bucket;
mod builder;
mod clock;
mod count;
mod counters;
mod error;
mod fair_gate;
mod fair_queue;
mod hold;
mod park;
mod sync;
mod tenant;
mod throttle;
mod throttler;
mod wait;
pub mod workload;

pub use array::{ThrottlerArray, add_throttler};
pub use async_reserve::AsyncReserve;
pub use bucket::{MAX_DEBT_NANO, MAX_RATE};
pub use builder::ThrottlerBuilder;
#[cfg(any(feature = "test-util", test, loom))]
pub use clock::ManualClock;
pub use clock::{ClampState, Clock, ClockSource, MonotonicClock, sleep_abs_monotonic};
pub use counters::ThrottleCounters;
pub use error::ThrottleError;
pub use fair_queue::{DEFAULT_TAU, FairQueue, MAX_TAU, QueueDispatch, QueueTicket};
pub use hold::InFlightHold;
pub use park::{
    LeaseHook, LeaseObserver, LeaseParked, LeaseState, install_lease_hook, install_lease_observer,
    lease_hook_installed, notify_lease_state, park_current_lease,
};
pub use tenant::{MAX_WEIGHT, Tenant, TenantScope};
pub use throttle::{Reservation, Source, Throttle, ThrottlePtr, UNLIMITED_BLOCK};
pub use throttler::Throttler;
pub use wait::{BlockingWait, WaitStrategy, default_wait, install_default_wait};
pub use workload::{
    DEFAULT_TAU as WORKLOAD_DEFAULT_TAU, MAX_DEPTH as WORKLOAD_MAX_DEPTH,
    MAX_WEIGHT as WORKLOAD_MAX_WEIGHT, PRIORITIES as WORKLOAD_PRIORITIES, Permit, Request,
    Resource, WAIT_BUCKETS as WORKLOAD_WAIT_BUCKETS, Workload, WorkloadCounters, WorkloadError,
    WorkloadScheduler, WorkloadSchedulerBuilder, WorkloadSpec, WorkloadTree,
    wait_bucket_bound as workload_wait_bucket_bound,
};

/// Nano-tokens per token: [`Throttler::tokens_nano`] is in these units.
pub const NANO_PER_TOKEN: i128 = 1_000_000_000;
