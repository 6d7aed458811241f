//! [`Throttler`]: ClickHouse's `Throttler`, with an exact lock-free bucket.

use std::any::Any;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::async_reserve::AsyncReserve;
use crate::bucket::{Bucket, BucketError, MAX_DEBT_NANO};
use crate::builder::{ThrottlerBuilder, map_cfg_err};
use crate::clock::{ClampState, Clock};
use crate::count::Count;
use crate::counters::{Blocked, LiveCounters, ThrottleCounters};
use crate::error::ThrottleError;
use crate::fair_gate::{FairGate, Turn};
use crate::sync::Ordering;
use crate::tenant::Tenant;
use crate::throttle::{Reservation, Source, Throttle, ThrottlePtr};
use crate::wait::WaitStrategy;

/// A token bucket with a one-second burst, a parent chain, a lifetime limit
/// and page-cache awareness. See the crate docs.
#[derive(Debug)]
pub struct Throttler {
    pub(crate) bucket: Bucket,
    /// The lifetime count (exact when `limit` reads it, else striped).
    pub(crate) count: Count,
    pub(crate) live: LiveCounters,
    pub(crate) limit: u64,
    pub(crate) limit_message: String,
    pub(crate) parent: Option<ThrottlePtr>,
    pub(crate) block_device: bool,
    pub(crate) clock: Arc<dyn Clock>,
    /// Present when the clock may step back: readings are clamped to the max.
    pub(crate) clamp: Option<ClampState>,
    pub(crate) wait: Arc<dyn WaitStrategy>,
    pub(crate) name: String,
    /// The fair order among waiting tenants (see the `fair_gate` module).
    pub(crate) gate: FairGate,
    /// The operations bucket (one token per charge), if limited.
    pub(crate) ops: Option<Bucket>,
    /// State other layers keep per throttler ([`Throttler::attachment`]).
    pub(crate) attachments: std::sync::Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
}

/// What one level decided, before any waiting.
struct Decision {
    wait_ns: u64,
}

/// A charge taken in the fair order.
struct FairCharge {
    /// When the caller's turn came (clock ns).
    turn_ns: u64,
    /// From the turn to the end of this level's wait.
    delay_ns: u64,
    /// This level's own wait.
    wait_ns: u64,
}

impl Throttler {
    /// A throttler of `max_speed` tokens/s (0 = unlimited) with defaults.
    pub fn new(max_speed: u64) -> Result<Self, ThrottleError> {
        Self::builder(max_speed).build()
    }

    /// Start building a throttler of `max_speed` tokens/s (0 = unlimited).
    pub fn builder(max_speed: u64) -> ThrottlerBuilder {
        ThrottlerBuilder::new(max_speed)
    }

    /// The throttler's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configured rate, tokens/s (0 = unlimited).
    pub fn max_speed(&self) -> u64 {
        self.bucket.rate()
    }

    /// The operations limit, requests/s (0 = none); see
    /// [`ThrottlerBuilder::max_ops`].
    pub fn max_ops(&self) -> u64 {
        self.ops.as_ref().map_or(0, Bucket::rate)
    }

    /// Change the operations limit at run time (keeping its tokens, as
    /// [`Throttler::set_max_speed`] does). Only a throttler built with an
    /// operations limit has one; 0 makes it unlimited.
    pub fn set_max_ops(&self, ops: u64) -> Result<(), ThrottleError> {
        match &self.ops {
            Some(b) => b
                .set_rate(ops, self.now())
                .map_err(|e| map_cfg_err(e, ops, b.burst_ns())),
            None if ops == 0 => Ok(()),
            None => Err(ThrottleError::NoOpsLimit {
                name: self.name.clone(),
                ops,
            }),
        }
    }

    /// Whether any bucket here limits (so waits, and fairness, can happen).
    fn limited(&self) -> bool {
        self.max_speed() > 0 || self.max_ops() > 0
    }

    /// A request's cost in the fair order, and the rate that cost drains at:
    /// bytes at the byte rate, or, with an operations limit, the time the
    /// request occupies the two limits (`bytes/rate + 1/ops`, in ns; Seastar's
    /// normalised cost).
    fn fair_cost(&self, amount: u64) -> (u64, u64) {
        let (rate, ops) = (self.max_speed(), self.max_ops());
        if ops == 0 {
            return (amount, rate);
        }
        let bytes_ns = if rate == 0 {
            0
        } else {
            u128::from(amount) * 1_000_000_000 / u128::from(rate)
        };
        let ns = bytes_ns + 1_000_000_000 / u128::from(ops);
        (u64::try_from(ns).unwrap_or(u64::MAX), 1_000_000_000)
    }

    /// The burst, as a duration of `max_speed`.
    pub fn burst(&self) -> Duration {
        Duration::from_nanos(self.bucket.burst_ns())
    }

    /// The clock reading this throttler computes with: never less than an
    /// earlier one (clamped unless the clock guarantees it).
    fn now(&self) -> u64 {
        let raw = self.clock.now_ns();
        match &self.clamp {
            Some(c) => c.clamp(raw),
            None => raw,
        }
    }

    /// This throttler's attachment of type `T`, created with `T::default()`
    /// on first use: state that another layer keeps per throttler (the
    /// io_uring engine's writeback cap of a block-device throttler) without
    /// this crate knowing what it is. One per type; it lives as long as the
    /// throttler, so two throttlers never share one.
    pub fn attachment<T: Any + Send + Sync + Default>(&self) -> Arc<T> {
        let mut all = self.attachments();
        for a in all.iter() {
            if let Ok(t) = a.clone().downcast::<T>() {
                return t;
            }
        }
        let t = Arc::new(T::default());
        all.push(t.clone());
        t
    }

    fn attachments(&self) -> std::sync::MutexGuard<'_, Vec<Arc<dyn Any + Send + Sync>>> {
        // Nothing panics while it is held.
        self.attachments
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// This throttler's attachment of type `T`, if one was created.
    pub fn attachment_if_any<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.attachments()
            .iter()
            .find_map(|a| a.clone().downcast::<T>().ok())
    }

    /// The parent, if any.
    pub fn parent(&self) -> Option<&ThrottlePtr> {
        self.parent.as_ref()
    }

    /// Change the rate at run time, keeping the tokens in the bucket (capped
    /// at the new burst). 0 makes it unlimited.
    pub fn set_max_speed(&self, max_speed: u64) -> Result<(), ThrottleError> {
        self.bucket
            .set_rate(max_speed, self.now())
            .map_err(|e| map_cfg_err(e, max_speed, self.bucket.burst_ns()))
    }

    /// Tokens in the bucket now (capped at the burst), in nano-tokens (10⁻⁹).
    pub fn tokens_nano(&self) -> i128 {
        self.bucket.tokens_nano(self.now())
    }

    /// The lifetime count of charged tokens, saturating at `u64::MAX` (a
    /// statistic: with no lifetime limit it never fails a charge).
    pub fn count(&self) -> u64 {
        self.count.load()
    }

    /// Whether this throttler limits a block device.
    pub fn limits_block_device_bandwidth(&self) -> bool {
        self.block_device
    }

    /// The clock this throttler reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> ThrottleCounters {
        ThrottleCounters {
            amount: self.count(),
            page_cache_amount: self.live.page_cache_amount.load(Ordering::Relaxed),
            wait_us: self.live.wait_ns.load(Ordering::Relaxed) / 1_000,
            waits: self.live.waits.load(Ordering::Relaxed),
            block_count: self.live.block_count.load(Ordering::Relaxed),
            max_speed: self.max_speed(),
        }
    }

    /// Charge this level only, at `now_ns`, and decide the wait (capped by
    /// `max_block`). Pure: nothing waits here.
    fn charge_level(
        &self,
        amount: u64,
        max_block: Duration,
        now_ns: u64,
    ) -> Result<Decision, ThrottleError> {
        // The bucket first: a refused charge (debt out of range) changes
        // nothing, not even the count, which can no longer fail.
        let charged = self.bucket.charge(amount, now_ns).map_err(|e| match e {
            BucketError::Debt(d) => ThrottleError::DebtOverflow {
                name: self.name.clone(),
                debt_tokens: BucketError::debt_tokens(d),
                max_tokens: BucketError::debt_tokens(MAX_DEBT_NANO),
            },
            other => map_cfg_err(other, self.max_speed(), self.bucket.burst_ns()),
        })?;
        let mut wait_ns = if charged.rate > 0 && charged.tokens_nano < 0 {
            charged.wait_ns
        } else {
            0
        };
        if let Some(ops) = &self.ops {
            // One operation; its debt is at most one token per charge, far
            // below the exact range, so this never fails after the bytes.
            let op = ops.charge(1, now_ns).map_err(|e| match e {
                BucketError::Debt(d) => ThrottleError::DebtOverflow {
                    name: self.name.clone(),
                    debt_tokens: BucketError::debt_tokens(d),
                    max_tokens: BucketError::debt_tokens(MAX_DEBT_NANO),
                },
                other => map_cfg_err(other, ops.rate(), ops.burst_ns()),
            })?;
            if op.rate > 0 && op.tokens_nano < 0 {
                wait_ns = wait_ns.max(op.wait_ns);
            }
        }
        // The lifetime count (ClickHouse's `count`) is a statistic: it never
        // fails a charge, and past 2⁶⁴ it stays at `u64::MAX` ("at least
        // 2⁶⁴ − 1"; ClickHouse's `count += amount` wraps, and a wrapped count
        // could slip back under a lifetime limit). It is exact (`Some`)
        // exactly when a limit is set (see the `count` module). A saturated
        // count has passed every limit (none lies above u64::MAX), also
        // `limit = u64::MAX`, which `count > limit` misses.
        if let Some(count) = self.count.add(amount)
            && self.limit != 0
            && (count > self.limit || count == u64::MAX)
        {
            return Err(ThrottleError::LimitExceeded {
                name: self.name.clone(),
                limit: self.limit,
                count,
                message: self.limit_message.clone(),
            });
        }
        let max_block_ns = u64::try_from(max_block.as_nanos()).unwrap_or(u64::MAX);
        Ok(Decision {
            wait_ns: wait_ns.min(max_block_ns),
        })
    }

    /// ClickHouse's `throttle`: charge here at once, wait for this level's
    /// deficit, then the parent (the first-come path, without a tenant).
    fn throttle_first_come(&self, amount: u64, max_block: Duration) -> Result<bool, ThrottleError> {
        let now = self.now();
        let d = self.charge_level(amount, max_block, now)?;
        let block = d.wait_ns > 0;
        if block {
            self.perform_wait(now, d.wait_ns)?;
        }
        let parent_block = match &self.parent {
            Some(p) => p.throttle(amount, max_block)?,
            None => false,
        };
        Ok(block || parent_block)
    }

    /// Charge `amount` as the calling thread's current tenant: wait for its
    /// fair turn at the bucket, then charge and wait as usual; then the parent.
    fn throttle_fair(&self, amount: u64, max_block: Duration) -> Result<bool, ThrottleError> {
        let f = self.charge_fair(amount, max_block, 0)?;
        let block = f.wait_ns > 0;
        if block {
            self.perform_wait(f.turn_ns, f.delay_ns)?;
        }
        let parent_block = match &self.parent {
            Some(p) => p.throttle(amount, max_block)?,
            None => false,
        };
        Ok(block || parent_block)
    }

    /// Take the calling thread's tenant's fair turn at this level, then
    /// charge this level at `max(turn, call + after_ns)` (the end of the
    /// delay booked below, as [`Throttle::reserve`] does). Waits only while
    /// other tenants' requests queue here or the bookings run more than `τ`
    /// ahead.
    fn charge_fair(
        &self,
        amount: u64,
        max_block: Duration,
        after_ns: u64,
    ) -> Result<FairCharge, ThrottleError> {
        let call = self.now();
        let tenant = if self.gate.open(call) {
            None
        } else {
            Tenant::current()
        };
        let Some(tenant) = tenant else {
            let f = self.charge_open(amount, max_block, after_ns, call)?;
            Tenant::record_current(amount, f.wait_ns);
            return Ok(f);
        };
        let (cost, rate) = self.fair_cost(amount);
        let charge = |turn| self.charge_at(amount, max_block, call.saturating_add(after_ns), turn);
        let turn = Turn {
            tenant: &tenant,
            cost,
            rate,
        };
        let (_, f) = self.gate.enter(turn, &|| self.now(), charge)?;
        tenant.record(amount, f.wait_ns.saturating_add(f.turn_ns - call));
        Ok(f)
    }

    /// Charge this level at `max(turn, below_end)`; the booking's end and
    /// the charge.
    fn charge_at(
        &self,
        amount: u64,
        max_block: Duration,
        below_end: u64,
        turn: u64,
    ) -> Result<(u64, FairCharge), ThrottleError> {
        let at = turn.max(below_end);
        let wait_ns = self.charge_level(amount, max_block, at)?.wait_ns;
        let end = at.saturating_add(wait_ns);
        Ok((
            end,
            FairCharge {
                turn_ns: turn,
                delay_ns: end - turn,
                wait_ns,
            },
        ))
    }

    /// The gate is open at `call`: charge at once, recording the booking.
    fn charge_open(
        &self,
        amount: u64,
        max_block: Duration,
        after_ns: u64,
        call: u64,
    ) -> Result<FairCharge, ThrottleError> {
        let (end, f) = self.charge_at(amount, max_block, call.saturating_add(after_ns), call)?;
        if end > call {
            self.gate.booked(end);
        }
        Ok(f)
    }

    /// One level of [`Throttle::poll_reserve`].
    fn poll_level(
        &self,
        cx: &mut Context<'_>,
        op: &mut AsyncReserve,
    ) -> Poll<Result<(), ThrottleError>> {
        if op.source == Source::PageCache && self.block_device {
            self.live
                .page_cache_amount
                .fetch_add(op.amount, Ordering::Relaxed);
            return Poll::Ready(Ok(()));
        }
        let after_ns = op.acc.delay_ns;
        let f = match op.tenant.clone() {
            Some(tenant) if self.limited() => {
                let call = *op.call_ns.get_or_insert_with(|| self.now());
                let f = if !op.waiter.is_queued() && self.gate.open(call) {
                    self.charge_open(op.amount, op.max_block, after_ns, call)
                        .map(|f| (f, call))
                } else {
                    let (cost, rate) = self.fair_cost(op.amount);
                    let (amount, max_block) = (op.amount, op.max_block);
                    let charge = |turn| {
                        self.charge_at(amount, max_block, call.saturating_add(after_ns), turn)
                    };
                    let turn = Turn {
                        tenant: &tenant,
                        cost,
                        rate,
                    };
                    match self.gate.poll_enter(
                        cx.waker(),
                        &mut op.waiter,
                        turn,
                        &|| self.now(),
                        charge,
                    ) {
                        Poll::Pending => {
                            op.retry_in_ns =
                                op.waiter.retry_at().map(|at| at.saturating_sub(self.now()));
                            return Poll::Pending;
                        }
                        Poll::Ready(r) => r.map(|(turn, f)| (f, turn)),
                    }
                };
                match f {
                    Ok((f, turn)) => {
                        tenant.record(op.amount, f.wait_ns.saturating_add(turn - call));
                        f
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            _ => {
                // First-come, exactly as `reserve` without a tenant.
                let now = self.now();
                let wait_ns = match self.charge_level(
                    op.amount,
                    op.max_block,
                    now.saturating_add(after_ns),
                ) {
                    Ok(d) => d.wait_ns,
                    Err(e) => return Poll::Ready(Err(e)),
                };
                FairCharge {
                    turn_ns: now,
                    delay_ns: after_ns.saturating_add(wait_ns),
                    wait_ns,
                }
            }
        };
        if f.wait_ns > 0 {
            self.live.record_wait(f.wait_ns);
        }
        op.acc = Reservation {
            delay_ns: f.delay_ns,
            blocked: op.acc.blocked || f.wait_ns > 0,
        };
        Poll::Ready(Ok(()))
    }

    /// Throttle as `tenant` (see [`Tenant::enter`]): the wait is taken in the
    /// fair order among the tenants waiting here and at every ancestor.
    pub fn throttle_as(
        &self,
        tenant: &Tenant,
        amount: u64,
        max_block: Duration,
    ) -> Result<bool, ThrottleError> {
        let _scope = tenant.enter();
        self.throttle(amount, max_block)
    }

    /// Give up the fair order between tenants for good, e.g. when the
    /// service stops: callers queued for their turn charge at once, out of
    /// order, and later callers do not queue. Tokens are still charged
    /// exactly once; waits on the bucket itself stay bounded by `max_block`.
    /// Ancestors keep their own order (release them too if they are shared
    /// only by what is stopping).
    pub fn release_fair_queue(&self) {
        self.gate.release();
    }

    /// Requests waiting in the fair queue (not counting the one booked).
    pub fn fair_queued(&self) -> usize {
        self.gate.queued()
    }

    /// Wait `wait_ns` from `start_ns` through the wait strategy.
    fn perform_wait(&self, start_ns: u64, wait_ns: u64) -> Result<(), ThrottleError> {
        let _blocked = Blocked::new(&self.live.block_count);
        self.live.record_wait(wait_ns);
        self.wait
            .wait_until(self.clock.as_ref(), start_ns.saturating_add(wait_ns))
            .map_err(|errno| ThrottleError::Wait {
                name: self.name.clone(),
                errno,
            })
    }
}

impl Throttle for Throttler {
    fn throttle(&self, amount: u64, max_block: Duration) -> Result<bool, ThrottleError> {
        if Tenant::has_current() && self.limited() {
            return self.throttle_fair(amount, max_block);
        }
        self.throttle_first_come(amount, max_block)
    }

    fn throttle_page_cache_read(
        &self,
        amount: u64,
        max_block: Duration,
    ) -> Result<bool, ThrottleError> {
        if !self.block_device {
            return self.throttle(amount, max_block);
        }
        self.live
            .page_cache_amount
            .fetch_add(amount, Ordering::Relaxed);
        // This throttler does not account the read, but a parent still can.
        match &self.parent {
            Some(p) => p.throttle_page_cache_read(amount, max_block),
            None => Ok(false),
        }
    }

    fn ignores_page_cache_reads(&self) -> bool {
        (self.block_device && self.max_speed() > 0)
            || self
                .parent
                .as_ref()
                .is_some_and(|p| p.ignores_page_cache_reads())
    }

    fn reserve(
        &self,
        amount: u64,
        max_block: Duration,
        after_ns: u64,
        source: Source,
    ) -> Result<Reservation, ThrottleError> {
        let mut wait_ns = 0;
        let mut delay_ns = after_ns;
        if source == Source::PageCache && self.block_device {
            self.live
                .page_cache_amount
                .fetch_add(amount, Ordering::Relaxed);
        } else if Tenant::has_current() && self.limited() {
            // A tenant's booking is made in the fair order (the caller's
            // turn may take a wait, lease parked); the delay runs from now.
            let f = self.charge_fair(amount, max_block, after_ns)?;
            if f.wait_ns > 0 {
                self.live.record_wait(f.wait_ns);
            }
            wait_ns = f.wait_ns;
            delay_ns = f.delay_ns;
        } else {
            let now = self.now().saturating_add(after_ns);
            wait_ns = self.charge_level(amount, max_block, now)?.wait_ns;
            if wait_ns > 0 {
                self.live.record_wait(wait_ns);
            }
            delay_ns = after_ns.saturating_add(wait_ns);
        }
        let here = Reservation {
            delay_ns,
            blocked: wait_ns > 0,
        };
        match &self.parent {
            Some(p) => {
                let up = p.reserve(amount, max_block, here.delay_ns, source)?;
                Ok(Reservation {
                    delay_ns: up.delay_ns,
                    blocked: here.blocked || up.blocked,
                })
            }
            None => Ok(here),
        }
    }

    fn refund_page_cache_read(&self, amount: u64) {
        if self.block_device {
            // What the burst caps is kept (it was waited for already). The
            // counters stay monotonic (they are Prometheus counters): the
            // lifetime count keeps the charge, the refund is counted with
            // the page-cache bytes.
            let _ = self.bucket.refund(amount, self.now());
            self.live
                .page_cache_amount
                .fetch_add(amount, Ordering::Relaxed);
        }
        if let Some(p) = &self.parent {
            p.refund_page_cache_read(amount);
        }
    }

    fn poll_reserve(
        &self,
        cx: &mut Context<'_>,
        op: &mut AsyncReserve,
    ) -> Poll<Result<Reservation, ThrottleError>> {
        if op.visit_level() {
            match self.poll_level(cx, op) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => op.next_level(),
            }
        }
        match &self.parent {
            Some(p) => p.poll_reserve(cx, op),
            None => Poll::Ready(Ok(op.acc)),
        }
    }

    fn visit(&self, f: &mut dyn FnMut(&Throttler)) {
        f(self);
        if let Some(p) = &self.parent {
            p.visit(f);
        }
    }
}
