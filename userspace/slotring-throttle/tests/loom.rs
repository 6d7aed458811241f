//! Loom models of the lock-free path (concurrent charges and a concurrent
//! rate change always end in a state some serial order produces) and of the
//! fair gate's async turn (hand-over on cancellation, release).
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p slotring-throttle --test loom`.
#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use slotring_throttle::{
    AsyncReserve, ManualClock, NANO_PER_TOKEN, Reservation, Source, Tenant, Throttle,
    ThrottleError, Throttler, UNLIMITED_BLOCK,
};

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
        // The counters stay monotonic: the count keeps both charges, the
        // refund is page-cache bytes.
        assert_eq!(t.count(), 130);
        assert_eq!(t.counters().page_cache_amount, 95);
    });
}

/// Wakes a thread blocked in [`block_on`] through loom's `Notify`, so a
/// lost wake-up is a deadlock the model reports.
struct Unpark(loom::sync::Notify);

impl std::task::Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.notify();
    }
}

/// Poll `f` until ready, sleeping on loom's `Notify` between polls.
fn block_on<F: Future>(f: F) -> F::Output {
    let unpark = Arc::new(Unpark(loom::sync::Notify::new()));
    let waker = Waker::from(unpark.clone());
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(&waker)) {
            return v;
        }
        unpark.0.wait();
    }
}

/// The async turn as a future for [`block_on`]: the head that
/// waits only for time re-polls (a timer, yielding to the model) instead of
/// waiting for a wake-up; every other request waits for its waker.
struct Turn {
    t: Arc<Throttler>,
    r: AsyncReserve,
}

impl Turn {
    fn new(t: &Arc<Throttler>, tenant: &Tenant, amount: u64) -> Self {
        Self {
            t: t.clone(),
            r: AsyncReserve::new(
                Some(tenant.clone()),
                amount,
                UNLIMITED_BLOCK,
                0,
                Source::Device,
            ),
        }
    }
}

impl Future for Turn {
    type Output = Reservation;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reservation> {
        let this = self.get_mut();
        match this.r.poll(this.t.as_ref(), cx) {
            Poll::Ready(r) => Poll::Ready(r.unwrap()),
            Poll::Pending => {
                if this.r.retry_after().is_some() {
                    loom::thread::yield_now();
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
        }
    }
}

const SEC: u64 = 1_000_000_000;

/// 100 tokens/s, no burst, no catch-up: one request of 100 books a second,
/// and the next request's turn comes when that booking ends.
fn gate() -> (Arc<ManualClock>, Arc<Throttler>) {
    let clock = Arc::new(ManualClock::new(SEC));
    let t = Arc::new(
        Throttler::builder(100)
            .clock(clock.clone())
            .burst(Duration::ZERO)
            .tau(Duration::ZERO)
            .build()
            .unwrap(),
    );
    (clock, t)
}

#[test]
fn a_dropped_request_hands_its_turn_on_without_losing_a_wake_up() {
    // b is queued at the head; c queues (behind b, or as the head if b is
    // already gone) while b's request is dropped and the clock reaches the
    // end of a's booking. c must be woken (no lost wake-up: loom reports a
    // deadlock otherwise), take its turn exactly then, and b's request must
    // cost nothing.
    loom::model(|| {
        let (clock, t) = gate();
        let [a, b, c] = ["a", "b", "c"].map(|n| Tenant::new(n, 1).unwrap());
        let booked = block_on(Turn::new(&t, &a, 100));
        assert_eq!(booked.delay_ns, SEC);
        let mut x = Turn::new(&t, &b, 100);
        let noop = Waker::noop();
        assert!(
            Pin::new(&mut x)
                .poll(&mut Context::from_waker(noop))
                .is_pending()
        );
        let th = {
            let (t, c) = (t.clone(), c.clone());
            loom::thread::spawn(move || block_on(Turn::new(&t, &c, 100)))
        };
        drop(x);
        clock.advance(SEC);
        let r = th.join().unwrap();
        assert_eq!(r.delay_ns, SEC, "c charged at the end of a's booking");
        assert_eq!(t.count(), 200, "b's dropped request was never charged");
        assert_eq!(b.charged(), 0);
        assert_eq!(t.fair_queued(), 0, "nothing stuck in the queue");
    });
}

#[test]
fn releasing_the_queue_lets_every_waiter_go_exactly_once() {
    // A waiter queued behind a booking while the queue is released: it
    // leaves the queue, charges once, whatever the interleaving.
    loom::model(|| {
        let (_clock, t) = gate();
        let [a, b] = ["a", "b"].map(|n| Tenant::new(n, 1).unwrap());
        block_on(Turn::new(&t, &a, 100));
        let th = {
            let (t, b) = (t.clone(), b.clone());
            loom::thread::spawn(move || block_on(Turn::new(&t, &b, 100)))
        };
        t.release_fair_queue();
        th.join().unwrap();
        assert_eq!(t.count(), 200);
        assert_eq!(t.fair_queued(), 0);
    });
}
