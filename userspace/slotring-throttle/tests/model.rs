//! Property tests: the lock-free bucket against a straightforward mutex
//! implementation of the arithmetic of ClickHouse's `Throttler::throttleImpl`
//! (`src/Common/Throttler.cpp`; exact integers), and the
//! token-bucket bound over every window.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use slotring_throttle::{Clock, ManualClock, NANO_PER_TOKEN, Throttle, Throttler};

const SEC: u64 = 1_000_000_000;

/// ClickHouse's bucket, refill capped first, behind a mutex, in nano-tokens.
struct Reference {
    inner: Mutex<(i128, u64, u64)>, // tokens, prev_ns, rate
    burst_ns: u64,
}

impl Reference {
    fn new(rate: u64, burst_ns: u64, now: u64) -> Self {
        let tokens = i128::from(rate) * i128::from(burst_ns);
        Self {
            inner: Mutex::new((tokens, now, rate)),
            burst_ns,
        }
    }

    fn refill(&self, st: &mut (i128, u64, u64), now: u64) {
        let now = now.max(st.1);
        if st.2 > 0 {
            let burst = i128::from(st.2) * i128::from(self.burst_ns);
            st.0 = (st.0 + i128::from(st.2) * i128::from(now - st.1)).min(burst);
        }
        st.1 = now;
    }

    /// Charge; return the wait in ns (uncapped).
    fn charge(&self, amount: u64, now: u64) -> u64 {
        let mut st = self.inner.lock().unwrap();
        self.refill(&mut st, now);
        if st.2 == 0 {
            return 0;
        }
        st.0 -= i128::from(amount) * NANO_PER_TOKEN;
        if st.0 >= 0 {
            0
        } else {
            (-st.0 as u128)
                .div_ceil(u128::from(st.2))
                .min(u128::from(u64::MAX)) as u64
        }
    }

    fn set_rate(&self, rate: u64, now: u64) {
        let mut st = self.inner.lock().unwrap();
        self.refill(&mut st, now);
        st.2 = rate;
        if rate > 0 {
            st.0 = st.0.min(i128::from(rate) * i128::from(self.burst_ns));
        }
    }

    /// Give back `amount` (a page-cache refund), never past the burst.
    fn refund(&self, amount: u64, now: u64) {
        let mut st = self.inner.lock().unwrap();
        self.refill(&mut st, now);
        if st.2 > 0 {
            let burst = i128::from(st.2) * i128::from(self.burst_ns);
            st.0 = (st.0 + i128::from(amount) * NANO_PER_TOKEN).min(burst);
        }
    }

    fn tokens(&self, now: u64) -> i128 {
        let mut st = self.inner.lock().unwrap();
        self.refill(&mut st, now);
        st.0
    }
}

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Throttle {
        amount: u64,
        max_block_ns: u64,
    },
    /// Charge `millis` milliseconds' worth of the current rate (at least 1 token).
    ThrottleRel {
        millis: u64,
        max_block_ns: u64,
    },
    SetRate(u64),
    /// A page-cache refund of this many tokens.
    Refund(u64),
}

fn rate() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..100, 100u64..1_000_000, 1_000_000u64..100_000_000_000]
}

fn max_block() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 1u64..2 * SEC, Just(u64::MAX)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..3 * SEC).prop_map(Op::Advance),
        // Absolute amounts stay below 2^26 so that even at 1 token/s sixty
        // waits keep the clock far from u64::MAX (584 years of nanoseconds).
        3 => (0u64..1u64 << 26, max_block())
            .prop_map(|(amount, max_block_ns)| Op::Throttle { amount, max_block_ns }),
        3 => (0u64..5_000, max_block())
            .prop_map(|(millis, max_block_ns)| Op::ThrottleRel { millis, max_block_ns }),
        1 => prop_oneof![Just(0u64), rate()].prop_map(Op::SetRate),
        2 => (0u64..1u64 << 26).prop_map(Op::Refund),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        // Failures are saved next to this file (tests/regressions/model.txt), committed.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
        )),
        ..ProptestConfig::default()
    })]

    /// Every step: same tokens (to the nano-token), same wait, same clock.
    #[test]
    fn lock_free_bucket_matches_the_mutex_reference(
        start in 0u64..1u64 << 50,
        rate in rate(),
        burst_ms in 1u64..5_000,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let burst_ns = burst_ms * 1_000_000;
        let clock = Arc::new(ManualClock::new(start));
        // A block-device throttler, so that page-cache refunds reach its bucket.
        let ours = Throttler::builder(rate)
            .clock(clock.clone())
            .burst(Duration::from_nanos(burst_ns))
            .limits_block_device_bandwidth(true)
            .build()
            .unwrap();
        let reference = Reference::new(rate, burst_ns, start);
        for op in ops {
            match op {
                Op::Advance(ns) => clock.advance(ns),
                Op::SetRate(r) => {
                    ours.set_max_speed(r).unwrap();
                    reference.set_rate(r, clock.now_ns());
                }
                Op::Refund(amount) => {
                    ours.refund_page_cache_read(amount);
                    reference.refund(amount, clock.now_ns());
                }
                Op::Throttle { .. } | Op::ThrottleRel { .. } => {
                    let (amount, max_block_ns) = match op {
                        Op::Throttle { amount, max_block_ns } => (amount, max_block_ns),
                        Op::ThrottleRel { millis, max_block_ns } => {
                            ((ours.max_speed() * millis / 1000).max(1), max_block_ns)
                        }
                        _ => unreachable!(),
                    };
                    let before = clock.now_ns();
                    let wait = reference.charge(amount, before);
                    let expect_wait = if max_block_ns == 0 { 0 } else { wait.min(max_block_ns) };
                    let blocked = ours.throttle(amount, Duration::from_nanos(max_block_ns)).unwrap();
                    prop_assert_eq!(blocked, expect_wait > 0);
                    // A wait past the end of u64 time saturates at u64::MAX.
                    prop_assert_eq!(clock.now_ns() - before, expect_wait.min(u64::MAX - before));
                }
            }
            prop_assert_eq!(ours.tokens_nano(), reference.tokens(clock.now_ns()));
        }
    }

    /// Over any window of call start times [a, b]:
    /// charged ≤ burst + rate·(b − a) + the largest single request.
    #[test]
    fn charged_over_any_window_is_bounded(
        (rate, calls) in rate().prop_flat_map(|r| {
            (Just(r), proptest::collection::vec((1u64..=r.saturating_mul(4), 0u64..SEC), 1..80))
        }),
    ) {
        let clock = Arc::new(ManualClock::new(SEC));
        let t = Throttler::builder(rate).clock(clock.clone()).build().unwrap();
        let mut log = Vec::with_capacity(calls.len());
        for (amount, idle) in &calls {
            clock.advance(*idle);
            log.push((clock.now_ns(), *amount));
            t.throttle(*amount, slotring_throttle::UNLIMITED_BLOCK).unwrap();
        }
        let largest = i128::from(calls.iter().map(|c| c.0).max().unwrap());
        let burst = i128::from(rate) * i128::from(SEC);
        check_windows(&log, rate, burst, largest)?;
    }

    /// The same bound with page-cache refunds netted: each call's read is
    /// found partly cached when its wait ends (as the io_uring engine's
    /// re-probe finds it) and that part is given back, so over any window
    /// charged − refunded ≤ burst + rate·(b − a) + the largest request.
    #[test]
    fn charged_net_of_refunds_over_any_window_is_bounded(
        (rate, calls) in rate().prop_flat_map(|r| {
            (Just(r), proptest::collection::vec(
                (1u64..=r.saturating_mul(4), 0u64..SEC, 0u64..=100), 1..80))
        }),
    ) {
        let clock = Arc::new(ManualClock::new(SEC));
        let t = Throttler::builder(rate)
            .clock(clock.clone())
            .limits_block_device_bandwidth(true)
            .build()
            .unwrap();
        let mut log = Vec::with_capacity(calls.len());
        for (amount, idle, cached_pct) in &calls {
            clock.advance(*idle);
            let start = clock.now_ns();
            t.throttle(*amount, slotring_throttle::UNLIMITED_BLOCK).unwrap();
            // After the wait: the cached part goes back.
            let cached = amount * cached_pct / 100;
            t.refund_page_cache_read(cached);
            log.push((start, amount - cached));
        }
        let largest = i128::from(calls.iter().map(|c| c.0).max().unwrap());
        let burst = i128::from(rate) * i128::from(SEC);
        check_windows(&log, rate, burst, largest)?;
        // The counters stay monotonic: the count keeps every charge, the
        // refunds are page-cache bytes.
        let c = t.counters();
        prop_assert_eq!(c.amount, calls.iter().map(|c| c.0).sum::<u64>());
        prop_assert_eq!(
            c.page_cache_amount,
            calls.iter().map(|(a, _, p)| a * p / 100).sum::<u64>()
        );
    }
}

/// Every window of `(start ns, tokens)` calls: charged ≤ burst + rate·T + largest.
fn check_windows(
    log: &[(u64, u64)],
    rate: u64,
    burst: i128,
    largest: i128,
) -> Result<(), TestCaseError> {
    {
        for i in 0..log.len() {
            let mut sum = 0i128;
            for j in i..log.len() {
                sum += i128::from(log[j].1);
                let dt = i128::from(log[j].0 - log[i].0);
                prop_assert!(
                    sum * NANO_PER_TOKEN
                        <= burst + i128::from(rate) * dt + largest * NANO_PER_TOKEN,
                    "window {}..{}: {} tokens in {} ns at {}/s",
                    i,
                    j,
                    sum,
                    dt,
                    rate
                );
            }
        }
    }
    Ok(())
}
