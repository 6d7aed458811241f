//! A leaf [`Workload`] as a [`Throttle`]: what lets every IO engine that
//! takes a throttle schedule its requests by the tree.
//!
//! # What a request is charged
//!
//! A device request of `n` bytes is one request of cost `n` at the leaf:
//! its bytes and one IO to every cap on its path, one in-flight place (and
//! its bytes) on every node that limits them ([`Throttle::reserve_held`]
//! returns them as the [`InFlightHold`] the engine keeps until the IO's
//! last completion). A request's turn may wait for another's completion,
//! so the workload [`takes turns`](Throttle::takes_turns): an engine polls
//! it ([`Throttle::poll_reserve`], which queues the request in its leaf
//! with the caller's waker) instead of blocking a thread that reaps
//! completions.
//!
//! # The page-cache rule: only misses are charged
//!
//! A workload divides a disk: it skips page-cache bytes
//! ([`Throttle::ignores_page_cache_reads`] is `true`, so the engines detect
//! hits). A read known to be a hit ([`Source::PageCache`]) charges nothing
//! and takes no place. A read charged as a miss that the engine finds
//! cached after its wait ([`Throttle::refund_page_cache_read`]) gives its
//! bytes back to every byte cap on its path (never past a bucket's burst);
//! its IO stays counted (the engine issued one) and its places are held
//! until it completes, as for any request.
//!
//! `max_block` does not apply: a workload's wait is its turn in the tree
//! plus at most τ of booking.

use std::task::{Context, Poll};
use std::time::Duration;

use super::scheduler::Workload;
use crate::async_reserve::AsyncReserve;
use crate::error::ThrottleError;
use crate::hold::InFlightHold;
use crate::throttle::{Reservation, Source, Throttle};
use crate::throttler::Throttler;

impl Throttle for Workload {
    /// Wait for the turn and the booked delay (CPU lease parked); the
    /// in-flight places are given back on return (a caller whose IO comes
    /// after uses [`Throttle::reserve_held`] and keeps the hold).
    fn throttle(&self, amount: u64, max_block: Duration) -> Result<bool, ThrottleError> {
        let (r, hold) = self.reserve_held(amount, max_block, 0, Source::Device)?;
        if r.delay_ns > 0 {
            let _parked = crate::park::park_current_lease();
            std::thread::sleep(Duration::from_nanos(r.delay_ns));
        }
        drop(hold);
        Ok(r.blocked)
    }

    fn throttle_page_cache_read(&self, _: u64, _: Duration) -> Result<bool, ThrottleError> {
        Ok(false)
    }

    fn ignores_page_cache_reads(&self) -> bool {
        true
    }

    fn takes_turns(&self) -> bool {
        true
    }

    /// [`Throttle::reserve_held`] without the hold: the places are given
    /// back at once.
    fn reserve(
        &self,
        amount: u64,
        max_block: Duration,
        after_ns: u64,
        source: Source,
    ) -> Result<Reservation, ThrottleError> {
        Ok(self.reserve_held(amount, max_block, after_ns, source)?.0)
    }

    /// The turn, the calling thread blocked (CPU lease parked) while the
    /// request queues. The caps are charged at the turn; the delay is
    /// `after_ns` plus the booking's own (each later than the other, so
    /// never earlier than either level allows).
    fn reserve_held(
        &self,
        amount: u64,
        _: Duration,
        after_ns: u64,
        source: Source,
    ) -> Result<(Reservation, InFlightHold), ThrottleError> {
        if source == Source::PageCache || amount == 0 {
            return Ok((Self::nothing(after_ns), InFlightHold::none()));
        }
        let p = self.acquire(amount)?;
        Ok((Self::booked(after_ns, &p), p.into()))
    }

    fn refund_page_cache_read(&self, amount: u64) {
        self.refund_bytes(amount);
    }

    /// The turn without blocking: the request queues in its leaf with
    /// `cx`'s waker (the head that times the caps' debts re-polls after
    /// [`AsyncReserve::retry_after`]); ready, the places are in
    /// [`AsyncReserve::take_hold`]. Dropping `op` while it queues hands the
    /// turn on and charges nothing.
    fn poll_reserve(
        &self,
        cx: &mut Context<'_>,
        op: &mut AsyncReserve,
    ) -> Poll<Result<Reservation, ThrottleError>> {
        if !op.visit_level() {
            return Poll::Ready(Ok(op.acc));
        }
        let after_ns = op.acc.delay_ns;
        if op.source == Source::PageCache || op.amount == 0 {
            op.level_done(Self::nothing(after_ns));
            return Poll::Ready(Ok(op.acc));
        }
        let req = op.request.get_or_insert_with(|| self.request(op.amount));
        match req.poll(cx) {
            Poll::Pending => {
                op.retry_in_ns = req
                    .retry_after()
                    .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
                Poll::Pending
            }
            Poll::Ready(out) => {
                op.request = None;
                let p = out?;
                op.level_done(Self::booked(after_ns, &p));
                op.hold = p.into();
                Poll::Ready(Ok(op.acc))
            }
        }
    }

    /// No [`Throttler`] in a workload (its statistics are its own).
    fn visit(&self, _: &mut dyn FnMut(&Throttler)) {}
}

impl Workload {
    fn nothing(after_ns: u64) -> Reservation {
        Reservation {
            delay_ns: after_ns,
            blocked: false,
        }
    }

    fn booked(after_ns: u64, p: &super::Permit<'_>) -> Reservation {
        Reservation {
            delay_ns: after_ns.saturating_add(p.delay_ns()),
            blocked: p.waited() || p.delay_ns() > 0,
        }
    }

    /// `amount` bytes charged to this workload turned out not to reach the
    /// disk: give them back to every byte cap on its path (never past a
    /// bucket's burst).
    pub fn refund_bytes(&self, amount: u64) {
        let inner = &self.inner;
        let now = inner.sched.now();
        for n in inner.path.iter() {
            n.bytes.refund(amount, now);
            n.counters.refunded(amount);
        }
    }
}
