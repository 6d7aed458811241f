//! [`ThrottlerBuilder`]: a [`Throttler`]'s configuration, checked when it is
//! built.

use std::sync::Arc;
use std::time::Duration;

use crate::bucket::{Bucket, BucketError};
use crate::clock::{ClampState, Clock, MonotonicClock};
use crate::count::Count;
use crate::counters::LiveCounters;
use crate::error::ThrottleError;
use crate::fair_gate::FairGate;
use crate::fair_queue::DEFAULT_TAU;
use crate::throttle::ThrottlePtr;
use crate::throttler::Throttler;
use crate::wait::{BlockingWait, WaitStrategy, default_wait};

/// Builder for [`Throttler`]; see [`Throttler::builder`].
#[derive(Debug)]
pub struct ThrottlerBuilder {
    max_speed: u64,
    parent: Option<ThrottlePtr>,
    limit: u64,
    limit_message: String,
    burst: Duration,
    block_device: bool,
    clock: Option<Arc<dyn Clock>>,
    wait: Option<Arc<dyn WaitStrategy>>,
    name: String,
    tau: Duration,
    max_ops: u64,
}

impl ThrottlerBuilder {
    /// The defaults of [`Throttler::builder`].
    pub(crate) fn new(max_speed: u64) -> Self {
        Self {
            max_speed,
            parent: None,
            limit: 0,
            limit_message: String::from("Limit exceeded."),
            burst: Duration::from_secs(1),
            block_device: false,
            clock: None,
            wait: None,
            name: String::from("throttler"),
            tau: DEFAULT_TAU,
            max_ops: 0,
        }
    }

    /// Also limit operations: at most `ops` requests per second (0 = no
    /// limit), with the same burst duration. Every charge at this level is
    /// one operation; a request waits until both the bytes and the
    /// operations bucket allow it (cgroup `io.max` riops, Firecracker's ops
    /// bucket).
    pub fn max_ops(mut self, ops: u64) -> Self {
        self.max_ops = ops;
        self
    }

    /// The catch-up bound `τ` for tenants returning from idle (default
    /// [`DEFAULT_TAU`], at most [`crate::MAX_TAU`]); see [`Tenant`](crate::Tenant).
    pub fn tau(mut self, tau: Duration) -> Self {
        self.tau = tau;
        self
    }

    /// Chain to `parent`: every charge here is also charged there.
    pub fn parent(mut self, parent: ThrottlePtr) -> Self {
        self.parent = Some(parent);
        self
    }

    /// Fail with [`ThrottleError::LimitExceeded`] once the lifetime count
    /// exceeds `limit` (0 = no limit); `message` starts the error text. The
    /// count saturates at `u64::MAX`, which counts as exceeding any limit.
    pub fn limit(mut self, limit: u64, message: impl Into<String>) -> Self {
        self.limit = limit;
        self.limit_message = message.into();
        self
    }

    /// The burst as a duration of `max_speed` (default 1 s, ClickHouse's
    /// `default_burst_seconds`). Kept as a duration so that
    /// [`Throttler::set_max_speed`] scales it like ClickHouse does.
    pub fn burst(mut self, burst: Duration) -> Self {
        self.burst = burst;
        self
    }

    /// Mark this throttler as a block-device limit: page-cache reads skip it.
    pub fn limits_block_device_bandwidth(mut self, yes: bool) -> Self {
        self.block_device = yes;
        self
    }

    /// Use `clock` instead of the shared [`MonotonicClock`].
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Perform waits with `wait` instead of the default: the process-wide
    /// [`default_wait`] for a throttler on the shared [`MonotonicClock`],
    /// [`BlockingWait`] (which sleeps on the clock) for one with an injected
    /// clock.
    pub fn wait_strategy(mut self, wait: Arc<dyn WaitStrategy>) -> Self {
        self.wait = Some(wait);
        self
    }

    /// A name for errors and statistics.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Build the throttler with a full bucket.
    pub fn build(self) -> Result<Throttler, ThrottleError> {
        // An installed default wait knows only the real monotonic time; an
        // injected clock is waited on by its own `sleep_until`.
        let wait = match (self.wait, &self.clock) {
            (Some(w), _) => w,
            (None, None) => default_wait(),
            (None, Some(_)) => Arc::new(BlockingWait),
        };
        let clock = self.clock.unwrap_or_else(MonotonicClock::shared);
        let burst_ns = u64::try_from(self.burst.as_nanos()).unwrap_or(u64::MAX);
        let bucket = Bucket::new(self.max_speed, burst_ns, clock.now_ns())
            .map_err(|e| map_cfg_err(e, self.max_speed, burst_ns))?;
        let ops = if self.max_ops > 0 {
            Some(
                Bucket::new(self.max_ops, burst_ns, clock.now_ns())
                    .map_err(|e| map_cfg_err(e, self.max_ops, burst_ns))?,
            )
        } else {
            None
        };
        Ok(Throttler {
            attachments: std::sync::Mutex::new(Vec::new()),
            ops,
            gate: FairGate::new(self.tau)?,
            clamp: (!clock.never_steps_back()).then(ClampState::new),
            bucket,
            count: Count::new(self.limit != 0),
            live: LiveCounters::default(),
            limit: self.limit,
            limit_message: self.limit_message,
            parent: self.parent,
            block_device: self.block_device,
            clock,
            wait,
            name: self.name,
        })
    }
}

/// The error of a bucket configuration that `rate` and `burst_ns` make.
pub(crate) fn map_cfg_err(e: BucketError, rate: u64, burst_ns: u64) -> ThrottleError {
    match e {
        BucketError::RateTooLarge => ThrottleError::RateTooLarge {
            rate,
            max: crate::bucket::MAX_RATE,
        },
        BucketError::BurstTooLarge | BucketError::Debt(_) => {
            ThrottleError::BurstTooLarge { burst_ns, rate }
        }
    }
}
