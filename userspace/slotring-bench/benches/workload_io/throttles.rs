//! The throttles the bench hands the engines besides ours: [`Turns`],
//! which remembers when a request's turn came, and [`RocksDbThrottle`],
//! the RocksDB limiter port at one priority.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use slotring_benchkit::rocksdb_limiter::{IoPriority, RocksDbRateLimiter};
use slotring_throttle::{
    AsyncReserve, InFlightHold, Reservation, Source, Throttle, ThrottleError, ThrottlePtr,
    Throttler,
};

use crate::lock;

/// A throttle that remembers when the last device charge's turn came: the
/// instant its reservation returned plus the delay it booked (when the
/// engine's timeout lets the IO go to the device). Only the user reader
/// wraps its throttle in it.
#[derive(Debug)]
pub(crate) struct Turns {
    inner: ThrottlePtr,
    last: Mutex<Option<Instant>>,
}

impl Turns {
    pub(crate) fn new(inner: ThrottlePtr) -> Arc<Self> {
        Arc::new(Self {
            inner,
            last: Mutex::new(None),
        })
    }

    fn note(&self, r: &Reservation) {
        *lock(&self.last) = Some(Instant::now() + Duration::from_nanos(r.delay_ns));
    }

    /// The last turn since the previous call.
    pub(crate) fn take(&self) -> Option<Instant> {
        lock(&self.last).take()
    }
}

impl Throttle for Turns {
    fn throttle(&self, amount: u64, max_block: Duration) -> Result<bool, ThrottleError> {
        let waited = self.inner.throttle(amount, max_block)?;
        *lock(&self.last) = Some(Instant::now());
        Ok(waited)
    }

    fn throttle_page_cache_read(
        &self,
        amount: u64,
        max_block: Duration,
    ) -> Result<bool, ThrottleError> {
        self.inner.throttle_page_cache_read(amount, max_block)
    }

    fn ignores_page_cache_reads(&self) -> bool {
        self.inner.ignores_page_cache_reads()
    }

    fn reserve(
        &self,
        amount: u64,
        max_block: Duration,
        after_ns: u64,
        source: Source,
    ) -> Result<Reservation, ThrottleError> {
        let r = self.inner.reserve(amount, max_block, after_ns, source)?;
        if source == Source::Device {
            self.note(&r);
        }
        Ok(r)
    }

    fn refund_page_cache_read(&self, amount: u64) {
        self.inner.refund_page_cache_read(amount);
    }

    fn takes_turns(&self) -> bool {
        self.inner.takes_turns()
    }

    fn reserve_held(
        &self,
        amount: u64,
        max_block: Duration,
        after_ns: u64,
        source: Source,
    ) -> Result<(Reservation, InFlightHold), ThrottleError> {
        let (r, hold) = self
            .inner
            .reserve_held(amount, max_block, after_ns, source)?;
        if source == Source::Device {
            self.note(&r);
        }
        Ok((r, hold))
    }

    /// The engine polls the device charges only (a hit is never a turn).
    fn poll_reserve(
        &self,
        cx: &mut Context<'_>,
        op: &mut AsyncReserve,
    ) -> Poll<Result<Reservation, ThrottleError>> {
        let p = self.inner.poll_reserve(cx, op);
        if let Poll::Ready(Ok(r)) = &p {
            self.note(r);
        }
        p
    }

    fn visit(&self, f: &mut dyn FnMut(&Throttler)) {
        self.inner.visit(f);
    }
}

/// The RocksDB limiter port as a throttle: a charge blocks in its
/// `Request` at one priority (the engine calls it in the reader's own
/// thread, one request per thread) and books no delay.
#[derive(Debug)]
pub(crate) struct RocksDbThrottle {
    pub(crate) limiter: Arc<RocksDbRateLimiter>,
    pub(crate) pri: IoPriority,
}

impl Throttle for RocksDbThrottle {
    fn throttle(&self, amount: u64, _: Duration) -> Result<bool, ThrottleError> {
        self.limiter
            .request(i64::try_from(amount).unwrap_or(i64::MAX), self.pri);
        Ok(false)
    }

    fn reserve(
        &self,
        amount: u64,
        max_block: Duration,
        after_ns: u64,
        _: Source,
    ) -> Result<Reservation, ThrottleError> {
        self.throttle(amount, max_block)?;
        Ok(Reservation {
            delay_ns: after_ns,
            blocked: false,
        })
    }

    fn visit(&self, _: &mut dyn FnMut(&Throttler)) {}
}
