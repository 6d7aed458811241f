//! The lock-free core: a token bucket kept as GCRA virtual time in exact
//! integer fixed point.
//!
//! # The arithmetic
//!
//! ClickHouse's bucket (`Throttler::throttleImpl` in
//! `src/Common/Throttler.cpp`), with the refill capped first (see the crate
//! docs), is `tokens = min(burst, tokens + rate·dt) − amount`.
//! Keep the tokens in *nano-tokens* (1 token = 10⁹ units) and time in
//! nanoseconds: then a refill is `rate · dt_ns` units and a charge is
//! `amount · 10⁹` units, both exact integers. GCRA folds `(tokens, prev)` into
//! one number, the theoretical arrival time `tat`, in the same units
//! (`tat = rate·prev_ns − tokens`), so that
//!
//! * tokens available at `now` = `min(burst_u, rate·now_ns − tat)`;
//! * a charge is `tat ← max(tat, rate·now_ns − burst_u) + amount·10⁹`.
//!
//! By induction this equals that arithmetic *exactly* (no rounding
//! at all, not even the one nanosecond of virtual time we allow ourselves in
//! the docs): the only rounding anywhere is the wait, `ceil(deficit / rate)`
//! nanoseconds, computed from the exact deficit. A proptest checks every step
//! against a straightforward mutex implementation of that formula.
//!
//! # Ranges
//!
//! * rate ≤ [`MAX_RATE`] = 2⁴⁶−1 tokens/s (≈ 70 TB/s), so `rate·now_ns` < 2¹¹⁰
//!   for any `u64` clock reading;
//! * `tat` is kept modulo 2¹¹² and compared with wrapping signed differences,
//!   which are exact while they stay below 2¹¹¹ — guaranteed by the rate bound
//!   and by refusing debts above [`MAX_DEBT_NANO`] = 2¹⁰⁰ nano-tokens
//!   (≈ 1.27·10²¹ tokens) with a typed error;
//! * any `u64` amount is one exact charge (`2⁶⁴·10⁹ < 2⁹⁴`), and the running
//!   total never matters (only differences do), so 2⁶⁴ bytes at 100 GB/s are
//!   as exact as the first byte.
//!
//! # Concurrency and memory ordering
//!
//! The whole bucket state is one 128-bit word: `[tag:16 | tat:112]`, updated
//! by compare-and-swap (`cmpxchg16b`). The rate lives in a second word
//! `cfg = [tag:16 | rate:48]`. A charge loads `cfg` (Acquire), then `word`
//! (Acquire), and proceeds only if their tags agree; its CAS on `word`
//! succeeds only if neither `tat` nor the tag moved, so a charge is always
//! computed with the rate that belongs to the state it replaces.
//! `set_rate` (serialised by a mutex) converts the state under a new tag by
//! CAS, then publishes `cfg` with Release: a charge that sees the new `cfg`
//! therefore sees the converted word; one that sees the old `cfg` either sees
//! the old word (and its CAS fails if the conversion landed) or the new tag
//! (and retries). Success is `AcqRel` so successive charges are ordered; no
//! other data hangs off the word. A failed CAS returns the word it found with
//! `Acquire`, exactly what a fresh load would give, so a charge retries from
//! that value (tag checked again) without reloading. The tag wraps after 65,536 rate changes;
//! a stale charge could only be confused if that many changes happened during
//! one of its iterations *and* `tat` returned to the identical 112-bit value.

use crate::sync::{AtomicU64, AtomicU128, Mutex, Ordering, backoff, lock};

/// Nano-tokens per token.
const NANO: u128 = 1_000_000_000;
const TAT_BITS: u32 = 112;
const TAT_MASK: u128 = (1u128 << TAT_BITS) - 1;
const RATE_BITS: u32 = 48;
const RATE_MASK: u64 = (1u64 << RATE_BITS) - 1;

/// The largest supported rate, tokens per second.
pub const MAX_RATE: u64 = (1u64 << 46) - 1;
/// The largest debt (and burst) kept exact, in nano-tokens.
pub const MAX_DEBT_NANO: u128 = 1u128 << 100;

/// Signed difference `a − b` of two 112-bit wrapping values.
fn sdiff(a: u128, b: u128) -> i128 {
    let d = a.wrapping_sub(b) & TAT_MASK;
    // Sign-extend bit 111.
    ((d << (128 - TAT_BITS)) as i128) >> (128 - TAT_BITS)
}

fn pack_cfg(tag: u16, rate: u64) -> u64 {
    (u64::from(tag) << RATE_BITS) | rate
}

fn unpack_cfg(cfg: u64) -> (u16, u64) {
    ((cfg >> RATE_BITS) as u16, cfg & RATE_MASK)
}

fn pack_word(tag: u16, tat: u128) -> u128 {
    (u128::from(tag) << TAT_BITS) | (tat & TAT_MASK)
}

fn word_tag(w: u128) -> u16 {
    (w >> TAT_BITS) as u16
}

/// Why a bucket operation was refused (mapped to [`crate::ThrottleError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BucketError {
    /// The debt after the charge, in nano-tokens.
    Debt(u128),
    RateTooLarge,
    BurstTooLarge,
}

/// The outcome of one charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charged {
    /// Tokens left after the charge, nano-tokens (negative = debt).
    pub(crate) tokens_nano: i128,
    /// `ceil(debt / rate)` in ns: the exact time until the bucket is back at zero.
    pub(crate) wait_ns: u64,
    /// The rate the charge was computed with (0 = unlimited).
    pub(crate) rate: u64,
}

/// The state `word`, the only field a charge writes, has two cache lines
/// to itself (the unit the adjacent-line prefetcher moves); `cfg`, which
/// every charge reads and only a rate change writes, lives on the next
/// line, where it stays valid in every core's cache. Under contention
/// exactly one line moves between cores per charge, and only at the load
/// and CAS of `word` (the throttler's count is striped per thread unless a
/// lifetime limit reads it: see the `count` module). Measured with two
/// threads on one no-wait throttler: reading `cfg` from the word's line
/// before the clock read cost a second transfer of that line per charge.
#[repr(C, align(128))]
#[derive(Debug)]
pub(crate) struct Bucket {
    word: Line<AtomicU128>,
    cfg: AtomicU64,
    burst_ns: u64,
    change: Mutex<()>,
}

/// A value alone in two cache lines.
#[repr(align(128))]
#[derive(Debug)]
struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

fn check(rate: u64, burst_ns: u64) -> Result<(), BucketError> {
    if rate > MAX_RATE {
        return Err(BucketError::RateTooLarge);
    }
    if u128::from(rate) * u128::from(burst_ns) > MAX_DEBT_NANO {
        return Err(BucketError::BurstTooLarge);
    }
    Ok(())
}

fn wait_for(tokens_nano: i128, rate: u64) -> u64 {
    if tokens_nano >= 0 || rate == 0 {
        return 0;
    }
    let debt = tokens_nano.unsigned_abs();
    let r = u128::from(rate);
    u64::try_from(debt.div_ceil(r)).unwrap_or(u64::MAX)
}

impl Bucket {
    /// A full bucket at `now_ns`.
    pub(crate) fn new(rate: u64, burst_ns: u64, now_ns: u64) -> Result<Self, BucketError> {
        check(rate, burst_ns)?;
        let r = u128::from(rate);
        let tat = (u128::from(now_ns) * r).wrapping_sub(r * u128::from(burst_ns));
        Ok(Self {
            word: Line(AtomicU128::new(pack_word(0, tat))),
            cfg: AtomicU64::new(pack_cfg(0, rate)),
            burst_ns,
            change: Mutex::new(()),
        })
    }

    pub(crate) fn rate(&self) -> u64 {
        unpack_cfg(self.cfg.load(Ordering::Acquire)).1
    }

    pub(crate) fn burst_ns(&self) -> u64 {
        self.burst_ns
    }

    /// Tokens available at `now_ns` (capped at the burst), nano-tokens.
    pub(crate) fn tokens_nano(&self, now_ns: u64) -> i128 {
        let mut spins = 0;
        loop {
            let (tag, rate) = unpack_cfg(self.cfg.load(Ordering::Acquire));
            let w = self.word.load(Ordering::Acquire);
            if word_tag(w) != tag {
                backoff(&mut spins);
                continue;
            }
            if rate == 0 {
                // Unlimited: the tokens are frozen where the rate change left them.
                return sdiff(0, w & TAT_MASK);
            }
            return available(w & TAT_MASK, rate, self.burst_ns, now_ns);
        }
    }

    /// Refill to `now_ns`, capped at the burst, then subtract `amount`.
    pub(crate) fn charge(&self, amount: u64, now_ns: u64) -> Result<Charged, BucketError> {
        let cost = u128::from(amount) * NANO;
        let mut spins = 0;
        'cfg: loop {
            let (tag, rate) = unpack_cfg(self.cfg.load(Ordering::Acquire));
            if rate == 0 {
                return Ok(Charged {
                    tokens_nano: 0,
                    wait_ns: 0,
                    rate: 0,
                });
            }
            // Everything that does not depend on the state is computed
            // before the state's line is touched, so the line is held for
            // as few instructions as possible between its load and the CAS.
            let r = u128::from(rate);
            let now_u = u128::from(now_ns) * r;
            let burst_u = r * u128::from(self.burst_ns);
            let mut w = self.word.load(Ordering::Acquire);
            loop {
                if word_tag(w) != tag {
                    backoff(&mut spins);
                    continue 'cfg;
                }
                let tat = w & TAT_MASK;
                // max(tat, now − burst): the refill, capped at the burst. A
                // clock that stepped back only makes `now_u` smaller: never
                // a negative refill.
                let base = if sdiff(now_u, tat) > burst_u as i128 {
                    now_u.wrapping_sub(burst_u)
                } else {
                    tat
                };
                let new_tat = base.wrapping_add(cost) & TAT_MASK;
                let tokens_nano = sdiff(now_u, new_tat);
                if tokens_nano < 0 && tokens_nano.unsigned_abs() > MAX_DEBT_NANO {
                    return Err(BucketError::Debt(tokens_nano.unsigned_abs()));
                }
                // A failed CAS returns the word it found (with the line
                // held): retry from that instead of loading it again. Its
                // tag is checked like a loaded one's.
                match self.word.compare_exchange_weak(
                    w,
                    pack_word(tag, new_tat),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        return Ok(Charged {
                            tokens_nano,
                            wait_ns: wait_for(tokens_nano, rate),
                            rate,
                        });
                    }
                    // Another charge won: retry at once. No pause here
                    // (a `pause` costs ~140 cycles on recent cores, more
                    // than the retry); `backoff` is only for waiting out a
                    // rate change (the tag check above).
                    Err(found) => w = found,
                }
            }
        }
    }

    /// Refill to `now_ns`, capped at the burst, then give back `amount`
    /// tokens, never past the burst. In tokens that is
    /// `min(burst, min(burst, tokens + rate·dt) + amount)`; in virtual time
    /// `tat ← max(max(tat, now − burst) − amount, now − burst)`, exact like
    /// a charge. Returns the nano-tokens actually given back (less than
    /// `amount·10⁹` where the burst caps them). While unlimited (rate 0)
    /// the bucket is frozen and nothing is given back, as nothing was
    /// charged.
    ///
    /// Memory ordering: as a charge (Acquire loads of `cfg` then `word`,
    /// tags compared, `AcqRel` CAS), so a refund and a charge are ordered
    /// like two charges and a rate change converts a state that includes
    /// the refund or makes its CAS fail.
    pub(crate) fn refund(&self, amount: u64, now_ns: u64) -> u128 {
        let back = u128::from(amount) * NANO;
        let mut spins = 0;
        loop {
            let (tag, rate) = unpack_cfg(self.cfg.load(Ordering::Acquire));
            if rate == 0 || back == 0 {
                return 0;
            }
            let w = self.word.load(Ordering::Acquire);
            if word_tag(w) != tag {
                backoff(&mut spins);
                continue;
            }
            let tat = w & TAT_MASK;
            let r = u128::from(rate);
            let full =
                (u128::from(now_ns) * r).wrapping_sub(r * u128::from(self.burst_ns)) & TAT_MASK;
            // Tokens below the burst: room = tat − (now − burst) if positive.
            let room = sdiff(tat, full);
            if room <= 0 {
                // Full already (after the capped refill): nothing fits.
                return 0;
            }
            let given = back.min(room as u128);
            let new_tat = tat.wrapping_sub(given) & TAT_MASK;
            match self.word.compare_exchange_weak(
                w,
                pack_word(tag, new_tat),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return given,
                Err(_) => backoff(&mut spins),
            }
        }
    }

    /// Change the rate at `now_ns`, keeping the tokens in the bucket (capped at
    /// the new burst, as the next refill would cap them).
    pub(crate) fn set_rate(&self, new_rate: u64, now_ns: u64) -> Result<(), BucketError> {
        check(new_rate, self.burst_ns)?;
        let _serial = lock(&self.change);
        let (tag, old_rate) = unpack_cfg(self.cfg.load(Ordering::Acquire));
        if new_rate == old_rate {
            return Ok(());
        }
        let new_tag = tag.wrapping_add(1);
        loop {
            let w = self.word.load(Ordering::Acquire);
            let tat = w & TAT_MASK;
            // While unlimited, the bucket neither refills nor drains (as in
            // ClickHouse, where `tokens` is untouched while `max_speed == 0`).
            let tokens = if old_rate == 0 {
                sdiff(0, tat)
            } else {
                available(tat, old_rate, self.burst_ns, now_ns)
            };
            let new_tat = if new_rate == 0 {
                0u128.wrapping_sub(tokens as u128)
            } else {
                let cap = (u128::from(new_rate) * u128::from(self.burst_ns)) as i128;
                let t = tokens.min(cap);
                (u128::from(now_ns) * u128::from(new_rate)).wrapping_sub(t as u128)
            };
            if self
                .word
                .compare_exchange_weak(
                    w,
                    pack_word(new_tag, new_tat),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                break;
            }
        }
        self.cfg
            .store(pack_cfg(new_tag, new_rate), Ordering::Release);
        Ok(())
    }
}

fn available(tat: u128, rate: u64, burst_ns: u64, now_ns: u64) -> i128 {
    let r = u128::from(rate);
    let burst_u = (r * u128::from(burst_ns)) as i128;
    sdiff(u128::from(now_ns) * r, tat).min(burst_u)
}

impl BucketError {
    pub(crate) fn debt_tokens(d: u128) -> u128 {
        d / NANO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn sdiff_wraps() {
        assert_eq!(sdiff(5, 3), 2);
        assert_eq!(sdiff(3, 5), -2);
        assert_eq!(sdiff(0, TAT_MASK), 1);
        assert_eq!(sdiff(TAT_MASK, 0), -1);
    }

    #[test]
    fn starts_full_and_charges_exactly() {
        let b = Bucket::new(100, S, 0).unwrap();
        assert_eq!(b.tokens_nano(0), 100 * NANO as i128);
        let c = b.charge(150, 0).unwrap();
        assert_eq!(c.tokens_nano, -50 * NANO as i128);
        assert_eq!(c.wait_ns, S / 2, "50 tokens of debt at 100/s is 0.5 s");
    }

    #[test]
    fn rate_change_keeps_tokens() {
        let b = Bucket::new(100, S, 0).unwrap();
        b.charge(40, 0).unwrap();
        b.set_rate(1000, 0).unwrap();
        assert_eq!(b.tokens_nano(0), 60 * NANO as i128);
        b.set_rate(0, 0).unwrap();
        assert_eq!(
            b.charge(1_000_000, 5 * S).unwrap().wait_ns,
            0,
            "unlimited never waits"
        );
        b.set_rate(10, 10 * S).unwrap();
        assert_eq!(
            b.tokens_nano(10 * S),
            10 * NANO as i128,
            "60 tokens, capped at the new burst"
        );
    }

    #[test]
    fn a_refund_gives_tokens_back_but_never_past_the_burst() {
        let b = Bucket::new(100, S, 0).unwrap();
        b.charge(150, 0).unwrap();
        assert_eq!(b.refund(30, 0), 30 * NANO, "all of it fits");
        assert_eq!(b.tokens_nano(0), -20 * NANO as i128);
        // Half a second later 50 tokens have come back (30 in total); a
        // refund of 100 fills the bucket to its burst of 100 and no more.
        assert_eq!(b.refund(100, S / 2), 70 * NANO);
        assert_eq!(b.tokens_nano(S / 2), 100 * NANO as i128);
        assert_eq!(b.refund(1, S / 2), 0, "a full bucket takes nothing");
        // Long idle: the refill is capped first, so a refund adds nothing.
        assert_eq!(b.refund(5, 10 * S), 0);
        assert_eq!(b.charge(100, 10 * S).unwrap().tokens_nano, 0);
        // Unlimited: nothing was charged, nothing is given back.
        b.set_rate(0, 10 * S).unwrap();
        assert_eq!(b.refund(5, 10 * S), 0);
    }

    #[test]
    fn limits_are_typed() {
        assert_eq!(
            Bucket::new(MAX_RATE + 1, S, 0).unwrap_err(),
            BucketError::RateTooLarge
        );
        assert_eq!(
            Bucket::new(MAX_RATE, u64::MAX, 0).unwrap_err(),
            BucketError::BurstTooLarge
        );
        let b = Bucket::new(1, S, 0).unwrap();
        let mut err = None;
        for _ in 0..100 {
            if let Err(e) = b.charge(u64::MAX, 0) {
                err = Some(e);
                break;
            }
        }
        assert!(
            matches!(err, Some(BucketError::Debt(_))),
            "debt beyond 2^100 is refused"
        );
        // The refused charge changed nothing: the bucket still answers.
        assert!(b.tokens_nano(0) < 0);
    }
}
