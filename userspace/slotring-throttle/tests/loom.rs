//! Loom model of the lock-free path: concurrent charges and a concurrent
//! rate change always end in a state some serial order produces.
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p slotring-throttle --test loom`.
#![cfg(loom)]

use std::sync::Arc;
use std::time::Duration;

use slotring_throttle::{ManualClock, NANO_PER_TOKEN, Throttle, ThrottleError, Throttler};

fn tok(n: i128) -> i128 {
    n * NANO_PER_TOKEN
}

#[test]
fn concurrent_charges_are_linearizable() {
    loom::model(|| {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let t = Arc::new(Throttler::builder(100).clock(clock).build().unwrap());
        let handles: Vec<_> = [30u64, 50]
            .into_iter()
            .map(|amount| {
                let t = t.clone();
                loom::thread::spawn(move || t.throttle(amount, Duration::ZERO).unwrap())
            })
            .collect();
        for h in handles {
            assert!(!h.join().unwrap());
        }
        assert_eq!(t.tokens_nano(), tok(20), "both charges landed exactly once");
        assert_eq!(t.count(), 80);
    });
}

#[test]
fn charge_racing_a_rate_change_matches_a_serial_order() {
    loom::model(|| {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let t = Arc::new(Throttler::builder(100).clock(clock).build().unwrap());
        let charger = {
            let t = t.clone();
            loom::thread::spawn(move || t.throttle(70, Duration::ZERO).unwrap())
        };
        let changer = {
            let t = t.clone();
            loom::thread::spawn(move || t.set_max_speed(50).unwrap())
        };
        charger.join().unwrap();
        changer.join().unwrap();
        // charge then change: min(100 − 70, 50) = 30; change then charge:
        // min(100, 50) − 70 = −20. Nothing else is possible.
        let tokens = t.tokens_nano();
        assert!(tokens == tok(30) || tokens == tok(-20), "tokens = {tokens}");
        assert_eq!(t.max_speed(), 50);
    });
}

#[test]
fn the_lifetime_count_saturates_never_wraps_nor_fails() {
    // No lifetime limit: both charges land whatever the interleaving (the
    // CAS loop's `saturating_add`), and no update is lost on the way up.
    loom::model(|| {
        let t = Arc::new(
            Throttler::builder(0)
                .clock(Arc::new(ManualClock::new(1)))
                .build()
                .unwrap(),
        );
        t.throttle(u64::MAX - 100, Duration::ZERO).unwrap();
        let hs: Vec<_> = [60u64, 70]
            .into_iter()
            .map(|amount| {
                let t = t.clone();
                loom::thread::spawn(move || t.throttle(amount, Duration::ZERO))
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), Ok(false), "a statistic never fails");
        }
        assert_eq!(t.count(), u64::MAX);
    });
}

#[test]
fn the_charge_that_saturates_the_count_exceeds_a_max_limit() {
    // `limit = u64::MAX`: whichever charge saturates the count is the one
    // refused, with the count it saw; the other fits below the limit.
    loom::model(|| {
        let t = Arc::new(
            Throttler::builder(0)
                .clock(Arc::new(ManualClock::new(1)))
                .limit(u64::MAX, "Limit.")
                .build()
                .unwrap(),
        );
        t.throttle(u64::MAX - 100, Duration::ZERO).unwrap();
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let t = t.clone();
                loom::thread::spawn(move || t.throttle(60, Duration::ZERO))
            })
            .collect();
        let results: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let refused: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(
            matches!(
                refused[..],
                [ThrottleError::LimitExceeded {
                    count: u64::MAX,
                    ..
                }]
            ),
            "{results:?}"
        );
        assert_eq!(t.count(), u64::MAX);
    });
}

#[test]
fn a_refund_racing_a_charge_matches_a_serial_order() {
    loom::model(|| {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let t = Arc::new(
            Throttler::builder(100)
                .clock(clock)
                .limits_block_device_bandwidth(true)
                .build()
                .unwrap(),
        );
        // 100 − 90 = 10 tokens left before the race.
        t.throttle(90, Duration::ZERO).unwrap();
        let charger = {
            let t = t.clone();
            loom::thread::spawn(move || t.throttle(40, Duration::ZERO).unwrap())
        };
        let refunder = {
            let t = t.clone();
            loom::thread::spawn(move || t.refund_page_cache_read(95))
        };
        charger.join().unwrap();
        refunder.join().unwrap();
        // charge then refund: min(100, 10 − 40 + 95) = 65; refund then
        // charge: min(100, 10 + 95) − 40 = 60. Nothing else is possible.
        let tokens = t.tokens_nano();
        assert!(tokens == tok(65) || tokens == tok(60), "tokens = {tokens}");
        // The count nets the refund, never below zero: 90 + 40 − 95 = 35, or
        // 90 − 95 → 0, then + 40.
        let count = t.count();
        assert!(count == 35 || count == 40, "count = {count}");
    });
}
