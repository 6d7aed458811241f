//! [`Throttle`]: ClickHouse's `IThrottler`, the interface every throttle
//! implements, with what it books ([`Reservation`]) and where the bytes came
//! from ([`Source`]).

use std::fmt::Debug;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::async_reserve::AsyncReserve;
use crate::error::ThrottleError;
use crate::hold::InFlightHold;
use crate::throttler::Throttler;

/// "Block as long as the deficit requires" (ClickHouse's `unlimited_block_ns`).
pub const UNLIMITED_BLOCK: Duration = Duration::MAX;

/// A shared throttle (a [`Throttler`], a [`ThrottlerArray`](crate::ThrottlerArray), or your own).
pub type ThrottlePtr = Arc<dyn Throttle>;

/// The booked outcome of [`Throttle::reserve`]: charge now, wait later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reservation {
    /// How long after the call the caller may proceed, in ns on the throttlers'
    /// clocks: the sum of every level's wait, each level charged at the time
    /// the previous level's wait ends.
    pub delay_ns: u64,
    /// Whether any level had to wait.
    pub blocked: bool,
}

/// Where the bytes charged by [`Throttle::reserve`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Read from or written to the device (or possibly so): every throttler
    /// charges them.
    Device,
    /// Copied from the OS page cache: a throttler that limits a block device
    /// skips them (and counts them as page-cache bytes); its parents and
    /// every other throttler charge them.
    PageCache,
}

/// ClickHouse's `IThrottler`.
pub trait Throttle: Send + Sync + Debug {
    /// Charge `amount` tokens here and in every ancestor, waiting where a
    /// bucket is in debt (at most `max_block` per level). Returns whether any
    /// level waited.
    fn throttle(&self, amount: u64, max_block: Duration) -> Result<bool, ThrottleError>;

    /// Charge `amount` tokens that were copied from the OS page cache: a
    /// throttler that limits a block device skips them and passes them on to
    /// its parent; every other throttler charges them as usual.
    fn throttle_page_cache_read(
        &self,
        amount: u64,
        max_block: Duration,
    ) -> Result<bool, ThrottleError> {
        self.throttle(amount, max_block)
    }

    /// Whether some throttler in this chain would skip page-cache reads
    /// (so that detecting them is worth its cost).
    fn ignores_page_cache_reads(&self) -> bool {
        false
    }

    /// Charge like [`Throttle::throttle`] (or, for [`Source::PageCache`], like
    /// [`Throttle::throttle_page_cache_read`]) but *do not wait*: return the
    /// total delay instead. `after_ns` is the delay already booked by levels
    /// below; this level is charged at `now + after_ns`, exactly as if the
    /// caller had already waited that long. Waits are recorded in the
    /// counters as booked.
    ///
    /// Without a current [`Tenant`](crate::Tenant) this never waits. With one, a
    /// [`Throttler`] first takes the tenant's turn in its fair order (which
    /// waits, CPU lease parked, only while other tenants' requests queue
    /// there or its bookings run more than `τ` ahead), then books; the
    /// returned delay runs from the return.
    fn reserve(
        &self,
        amount: u64,
        max_block: Duration,
        after_ns: u64,
        source: Source,
    ) -> Result<Reservation, ThrottleError>;

    /// `amount` tokens charged earlier as [`Source::Device`] turned out to
    /// be copied from the OS page cache (a read found cached when its
    /// throttle wait ended, brought in meanwhile by another reader): give
    /// them back where a page-cache read is not charged. A throttler that
    /// limits a block device returns them to its bucket (never past its
    /// burst, so the bound "charged ≤ burst + rate·T + one request" holds
    /// with refunds netted) and counts them as page-cache bytes (its
    /// lifetime count, a monotonic counter, keeps the charge); its parents
    /// and every other throttler keep them, as they would have charged a
    /// page-cache read. Never fails and never waits. The default keeps
    /// everything (a custom throttle that does not distinguish sources).
    fn refund_page_cache_read(&self, amount: u64) {
        let _ = amount;
    }

    /// Whether a request's turn here may wait for another request's
    /// *completion* (an in-flight limit), not only for time or for other
    /// requests' turns. An IO engine then never blocks a thread that reaps
    /// completions in [`Throttle::reserve`]: it polls the turn
    /// ([`AsyncReserve`]) and keeps the [`InFlightHold`] it gives with the
    /// operation until its last completion. A
    /// [`Workload`](crate::Workload) does; the default does not.
    fn takes_turns(&self) -> bool {
        false
    }

    /// [`Throttle::reserve`], keeping what the request holds until its IO
    /// completes: the in-flight places of a throttle that limits them (a
    /// [`Workload`](crate::Workload)), given back when the returned hold
    /// drops. The default holds nothing.
    fn reserve_held(
        &self,
        amount: u64,
        max_block: Duration,
        after_ns: u64,
        source: Source,
    ) -> Result<(Reservation, InFlightHold), ThrottleError> {
        let r = self.reserve(amount, max_block, after_ns, source)?;
        Ok((r, InFlightHold::none()))
    }

    /// [`Throttle::reserve`] without blocking, as the tenant `op` carries
    /// (the *async turn*): poll until ready. Where this tenant must wait for
    /// its fair turn at a level, the request queues there with
    /// `cx.waker()` and the call returns `Pending`; it is woken when it may
    /// go, except the head that waits only for time, which re-polls after
    /// [`AsyncReserve::retry_after`]. Dropping `op` while it is queued hands
    /// the turn on. Call it through [`AsyncReserve::poll`].
    ///
    /// The default (for throttles of your own) is one step that calls
    /// [`Throttle::reserve`]: first-come, and it must not block.
    fn poll_reserve(
        &self,
        cx: &mut Context<'_>,
        op: &mut AsyncReserve,
    ) -> Poll<Result<Reservation, ThrottleError>> {
        let _ = cx;
        if op.visit_level() {
            match self.reserve(op.amount, op.max_block, op.acc.delay_ns, op.source) {
                Ok(r) => op.level_done(r),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(op.acc))
    }

    /// Call `f` on every [`Throttler`] in this chain (for statistics export).
    fn visit(&self, f: &mut dyn FnMut(&Throttler));
}
