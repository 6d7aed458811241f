//! The cap constraint (ClickHouse's `ThrottlerConstraint`,
//! `bandwidth_limit`): an exact token bucket of the node's own, the crate's
//! [`Bucket`] (GCRA in integer nano-tokens, one 128-bit atomic word).
//!
//! # Model
//!
//! A node with `max_bytes_per_second = r` and `max_burst_bytes = b` (default
//! one second of `r`) owns a bucket of rate `r` and size `b`; `max_iops`
//! adds a second bucket charged one token per request. Every request
//! dispatched through the node is charged to both at its turn, so over any
//! window of `T` seconds the subtree moves at most `b + r·(T + τ)` bytes plus
//! one request: the bucket bound, shifted by the booking horizon `τ`.
//!
//! A cap is **non-work-conserving**: it limits an idle disk too. A node
//! whose bucket would still be in debt `τ` from now is *ineligible*: it
//! leaves its parent's set of active children until its debt ends within
//! `τ`, and its children share (by their priorities and weights) exactly
//! what it lets through. The request that takes the bucket into debt goes
//! (ClickHouse's rule: a request larger than the burst is never stuck); the
//! next one waits for the debt. A request admitted while the debt ends
//! within `τ` is told to wait until it ends (its *delay*, at most `τ`, the
//! deadline of an engine's timeout SQE): the next booking is made before the
//! previous one's time is up, so the hand-over never idles the device
//! (the booking horizon of the crate's flat `FairGate`).
//!
//! # Charge, then check
//!
//! A request is charged first and checked with the exact "tokens before
//! the charge" the bucket returns; a refused charge is refunded at the same
//! clock reading, which the bucket gives back exactly (it is in debt, so
//! its burst never caps the refund). Two racing charges are therefore each
//! judged on their own linearised state: a cap never admits past its
//! horizon, and a refused request leaves no trace.
//!
//! # Live changes
//!
//! A change of the rate alone keeps the bucket (the bucket's own
//! `set_rate`, which keeps the tokens). A change of the burst's duration, or
//! adding or removing a cap, installs a new bucket: the old one is marked
//! retired and frozen (`set_rate(0)`, which the bucket linearises against
//! every charge), its tokens move to the new one (exact to one token: the
//! bucket takes whole-token charges), and the cell is swapped. A charge that
//! lands on the old bucket before the freeze is in the tokens moved; one
//! after it charges nothing (a frozen bucket is unlimited), sees the bucket
//! retired and retries on the new one. No charge is lost or made twice.
//!
//! # Memory ordering
//!
//! Two flags publish a live change to charges that run without the
//! scheduler's lock. `retired` is stored with `Release` before the old
//! bucket is frozen, and loaded with `Acquire` where the bucket answered as
//! a frozen one (a charge at rate 0, a refund that came back short): one
//! that sees it set knows the tokens moved to the new bucket, so a charge
//! retries there and a refund is made there, and neither counts the frozen
//! bucket's answer. `present` is stored with `Release` after a new bucket
//! is in the cell and before an old one leaves it, and loaded with
//! `Acquire` by a charge that decides whether to look at the cell: one that
//! reads `true` finds the bucket the store published; one that reads
//! `false` is ordered before the cap existed or after it was gone. The
//! bucket's own word and the cell's swap carry the rest (see `Bucket` and
//! the `swap` module).

use std::sync::Arc;

use super::swap::SwapCell;
use crate::bucket::{Bucket, BucketError};
use crate::sync::{AtomicBool, Ordering, backoff};

const NANO: i128 = 1_000_000_000;

/// A cap's settings: rate (tokens/s) and burst (tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CapSpec {
    pub(crate) rate: u64,
    pub(crate) burst: u64,
}

impl CapSpec {
    /// The bucket keeps its size as a duration at its rate, whole ns:
    /// `floor(burst·10⁹ / rate)`, at most one ns of the rate (one token at
    /// 1 GB/s) below the burst asked for.
    fn burst_ns(self) -> u64 {
        let ns = u128::from(self.burst) * 1_000_000_000 / u128::from(self.rate.max(1));
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

#[derive(Debug)]
struct CapBucket {
    bucket: Bucket,
    spec: CapSpec,
    retired: AtomicBool,
}

/// The outcome of offering a request to a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Charged; the request may start after `delay_ns` (≤ τ).
    Charged {
        /// ns from the charge until the debt before it ends.
        delay_ns: u64,
    },
    /// Not charged: the debt ends more than τ from now; eligible again at
    /// this clock reading.
    Refused {
        /// Clock ns at which the debt ends within τ.
        eligible_at: u64,
    },
}

/// See the module docs. No cap: always admits and charges nothing.
#[derive(Debug)]
pub(crate) struct Cap {
    cell: SwapCell<CapBucket>,
    /// Whether the cell holds a bucket: lets an uncapped node's charge skip
    /// the cell. Set after a bucket is stored, cleared before one is
    /// removed, so a charge that reads `false` lands before the cap exists
    /// or after it is gone.
    present: AtomicBool,
}

/// `ceil(debt / rate)` for a debt in nano-tokens.
fn ns_for(debt_nano: i128, rate: u64) -> u64 {
    if debt_nano <= 0 || rate == 0 {
        return 0;
    }
    u64::try_from(debt_nano.unsigned_abs().div_ceil(u128::from(rate))).unwrap_or(u64::MAX)
}

impl Cap {
    pub(crate) fn new(spec: Option<CapSpec>, now: u64) -> Result<Self, BucketError> {
        let b = spec.map(|s| Self::bucket(s, now)).transpose()?;
        Ok(Self {
            present: AtomicBool::new(b.is_some()),
            cell: SwapCell::new(b.map(Arc::new)),
        })
    }

    fn bucket(spec: CapSpec, now: u64) -> Result<CapBucket, BucketError> {
        Ok(CapBucket {
            bucket: Bucket::new(spec.rate, spec.burst_ns(), now)?,
            spec,
            retired: AtomicBool::new(false),
        })
    }

    /// The cap's rate, if any.
    pub(crate) fn rate(&self) -> Option<u64> {
        self.cell.with(|b| b.map(|b| b.spec.rate))
    }

    /// Whether there is a cap (a hint: see `present`).
    #[inline]
    pub(crate) fn present(&self) -> bool {
        self.present.load(Ordering::Acquire)
    }

    /// Charge `cost` at `now` if the debt before it ends within `tau_ns`.
    pub(crate) fn admit(&self, cost: u64, now: u64, tau_ns: u64) -> Result<Admit, BucketError> {
        if !self.present.load(Ordering::Acquire) {
            return Ok(Admit::Charged { delay_ns: 0 });
        }
        let mut spins = 0;
        loop {
            let r = self.cell.with(|b| {
                let Some(b) = b else {
                    return Some(Ok(Admit::Charged { delay_ns: 0 }));
                };
                let c = match b.bucket.charge(cost, now) {
                    Ok(c) => c,
                    Err(e) => return Some(Err(e)),
                };
                if c.rate == 0 {
                    // Frozen by a live change: the charge did nothing.
                    debug_assert!(b.retired.load(Ordering::Acquire));
                    return None;
                }
                let before = c.tokens_nano + i128::from(cost) * NANO;
                let horizon = i128::from(c.rate) * i128::from(tau_ns);
                if before + horizon >= 0 {
                    return Some(Ok(Admit::Charged {
                        delay_ns: ns_for(-before, c.rate),
                    }));
                }
                let eligible_at = now.saturating_add(ns_for(-(before + horizon), c.rate));
                if b.bucket.refund(cost, now) < u128::from(cost) * NANO as u128
                    && b.retired.load(Ordering::Acquire)
                {
                    // Frozen between the charge and the refund: the charge
                    // moved to the new bucket, so must the refund.
                    self.refund_after_retire(cost, now);
                }
                Some(Ok(Admit::Refused { eligible_at }))
            });
            match r {
                Some(r) => return r,
                None => backoff(&mut spins),
            }
        }
    }

    /// Give back a charge (a later level refused the request, or its permit
    /// was never picked up), never past the burst.
    pub(crate) fn refund(&self, cost: u64, now: u64) {
        let short = self.cell.with(|b| match b {
            // Short because the bucket was frozen by a live change (a full
            // bucket also takes less, and then nothing more is owed).
            Some(b) => {
                b.bucket.refund(cost, now) < u128::from(cost) * NANO as u128
                    && b.retired.load(Ordering::Acquire)
            }
            None => false,
        });
        if short {
            self.refund_after_retire(cost, now);
        }
    }

    fn refund_after_retire(&self, cost: u64, now: u64) {
        let mut spins = 0;
        loop {
            let done = self.cell.with(|b| match b {
                Some(b) if b.retired.load(Ordering::Acquire) => false,
                Some(b) => {
                    b.bucket.refund(cost, now);
                    true
                }
                None => true,
            });
            if done {
                return;
            }
            backoff(&mut spins);
        }
    }

    /// `None` if a request at `now` would be admitted, else the clock
    /// reading from which it would be.
    pub(crate) fn eligible_at(&self, now: u64, tau_ns: u64) -> Option<u64> {
        if !self.present() {
            return None;
        }
        self.cell.with(|b| {
            let b = b?;
            let rate = b.bucket.rate();
            if rate == 0 {
                return None;
            }
            let t = b.bucket.tokens_nano(now) + i128::from(rate) * i128::from(tau_ns);
            (t < 0).then(|| now.saturating_add(ns_for(-t, rate)))
        })
    }

    /// Tokens in the bucket at `now`, nano-tokens (`None`: no cap).
    pub(crate) fn tokens_nano(&self, now: u64) -> Option<i128> {
        self.cell.with(|b| b.map(|b| b.bucket.tokens_nano(now)))
    }

    /// Apply a live change at `now` (see the module docs). Called under the
    /// scheduler's lock, so changes are serialised.
    pub(crate) fn change(&self, spec: Option<CapSpec>, now: u64) -> Result<(), BucketError> {
        let old = self.cell.with(|b| b.cloned());
        match (&old, spec) {
            (None, None) => return Ok(()),
            (Some(o), Some(s)) if o.spec == s => return Ok(()),
            (Some(o), Some(s)) if o.spec.burst_ns() == s.burst_ns() => {
                o.bucket.set_rate(s.rate, now)?;
                return Ok(());
            }
            _ => {}
        }
        let new = spec.map(|s| Self::bucket(s, now)).transpose()?;
        if let Some(o) = &old {
            o.retired.store(true, Ordering::Release);
            o.bucket.set_rate(0, now)?;
            if let Some(n) = &new {
                let full = i128::from(n.spec.rate) * i128::from(n.spec.burst_ns());
                let keep = o.bucket.tokens_nano(now).min(full);
                let missing = (full - keep) as u128;
                let whole = missing.div_ceil(NANO as u128);
                let mut left = whole;
                while left > 0 {
                    let step = u64::try_from(left).unwrap_or(u64::MAX);
                    n.bucket.charge(step, now)?;
                    left -= u128::from(step);
                }
            }
        }
        let some = new.is_some();
        if !some {
            self.present.store(false, Ordering::Release);
        }
        self.cell.store(new.map(Arc::new));
        if some {
            self.present.store(true, Ordering::Release);
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn cap(rate: u64, burst: u64) -> Cap {
        Cap::new(Some(CapSpec { rate, burst }), 0).unwrap()
    }

    #[test]
    fn the_request_that_takes_it_into_debt_goes_the_next_waits_for_the_debt() {
        let c = cap(100, 100);
        assert_eq!(c.admit(150, 0, 0).unwrap(), Admit::Charged { delay_ns: 0 });
        // 50 tokens of debt at 100/s: eligible again in 0.5 s.
        assert_eq!(
            c.admit(1, 0, 0).unwrap(),
            Admit::Refused { eligible_at: S / 2 }
        );
        assert_eq!(
            c.tokens_nano(0),
            Some(-50 * NANO),
            "the refusal was refunded"
        );
        assert_eq!(c.eligible_at(0, 0), Some(S / 2));
        assert_eq!(c.eligible_at(S / 2, 0), None);
    }

    #[test]
    fn within_the_horizon_a_request_is_booked_with_its_delay() {
        let c = cap(100, 100);
        c.admit(110, 0, 0).unwrap();
        // 10 tokens of debt end in 100 ms: within a 200 ms horizon.
        assert_eq!(
            c.admit(10, 0, S / 5).unwrap(),
            Admit::Charged { delay_ns: S / 10 }
        );
        // Now 20 tokens of debt: 200 ms, still within it; then 300 ms is not.
        assert_eq!(
            c.admit(10, 0, S / 5).unwrap(),
            Admit::Charged { delay_ns: S / 5 }
        );
        assert_eq!(
            c.admit(10, 0, S / 5).unwrap(),
            Admit::Refused {
                eligible_at: S / 10
            }
        );
    }

    #[test]
    fn a_live_change_keeps_the_debt() {
        let c = cap(100, 100);
        c.admit(150, 0, 0).unwrap();
        // Same burst duration (1 s): the bucket keeps its state.
        c.change(
            Some(CapSpec {
                rate: 200,
                burst: 200,
            }),
            0,
        )
        .unwrap();
        assert_eq!(c.tokens_nano(0), Some(-50 * NANO));
        // Another duration: a new bucket with the same 50 tokens of debt.
        c.change(
            Some(CapSpec {
                rate: 200,
                burst: 50,
            }),
            0,
        )
        .unwrap();
        assert_eq!(c.tokens_nano(0), Some(-50 * NANO));
        assert_eq!(c.eligible_at(0, 0), Some(S / 4));
        // Removed: admits everything.
        c.change(None, 0).unwrap();
        assert_eq!(
            c.admit(1 << 40, 0, 0).unwrap(),
            Admit::Charged { delay_ns: 0 }
        );
        // Added back: starts full.
        c.change(
            Some(CapSpec {
                rate: 10,
                burst: 10,
            }),
            0,
        )
        .unwrap();
        assert_eq!(c.tokens_nano(0), Some(10 * NANO));
    }
}
