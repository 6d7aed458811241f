//! A leaf workload as a `Throttle` (the seam every IO engine uses), exactly
//! on a `ManualClock`: the hold keeps in-flight places until it drops, the
//! async turn queues and hands over, page-cache bytes charge nothing, a
//! refund reaches every cap of the path, and a dropped queued turn charges
//! nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use slotring_throttle::{
    AsyncReserve, ManualClock, NANO_PER_TOKEN, Resource, Source, ThrottlePtr, UNLIMITED_BLOCK,
    WorkloadScheduler, WorkloadSpec, WorkloadTree,
};

#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn disk(clock: &Arc<ManualClock>) -> WorkloadScheduler {
    let tree = WorkloadTree::new(vec![
        WorkloadSpec::new("all")
            .max_bytes_per_second(1000)
            .max_io_requests(1),
        WorkloadSpec::new("user").parent("all").priority(0),
        WorkloadSpec::new("background")
            .parent("all")
            .priority(1)
            .max_bytes_per_second(500),
    ])
    .unwrap();
    WorkloadScheduler::builder(&tree, Resource::Io)
        .clock(clock.clone())
        .tau(Duration::ZERO)
        .build()
        .unwrap()
}

fn tok(n: i128) -> i128 {
    n * NANO_PER_TOKEN
}

fn turn(amount: u64, source: Source) -> AsyncReserve {
    AsyncReserve::new(None, amount, UNLIMITED_BLOCK, 0, source)
}

#[test]
fn the_hold_keeps_the_place_until_it_drops_and_hands_it_to_the_queued_turn() {
    let clock = Arc::new(ManualClock::new(0));
    let s = disk(&clock);
    let user: ThrottlePtr = Arc::new(s.workload("user").unwrap());
    assert!(user.takes_turns() && user.ignores_page_cache_reads());
    let (r, hold) = user
        .reserve_held(100, UNLIMITED_BLOCK, 0, Source::Device)
        .unwrap();
    assert_eq!(r.delay_ns, 0, "a full bucket: no delay");
    assert!(!hold.is_empty());
    assert_eq!(s.in_flight("all").unwrap(), (1, 0));
    let count = Arc::new(Count::default());
    let waker = Waker::from(count.clone());
    let mut cx = Context::from_waker(&waker);
    let mut second = turn(100, Source::Device);
    assert!(
        second.poll(user.as_ref(), &mut cx).is_pending(),
        "max_io_requests = 1: the turn waits for the completion"
    );
    assert_eq!(s.queued_at("user").unwrap(), 1);
    assert_eq!(count.0.load(Ordering::SeqCst), 0);
    hold.release();
    assert_eq!(count.0.load(Ordering::SeqCst), 1, "the completion woke it");
    let Poll::Ready(Ok(_)) = second.poll(user.as_ref(), &mut cx) else {
        panic!("granted after the completion");
    };
    let hold = second.take_hold();
    assert!(!hold.is_empty() && second.take_hold().is_empty());
    assert_eq!(s.in_flight("all").unwrap(), (1, 0));
    drop(hold);
    assert_eq!(s.in_flight("all").unwrap(), (0, 0));
    assert_eq!(
        s.cap_tokens_nano("all").unwrap(),
        Some(tok(800)),
        "both charged their bytes"
    );
    let c = s.counters_of("all").unwrap();
    assert_eq!((c.bytes, c.requests, c.queued), (200, 2, 0));
    assert_eq!(c.peak_in_flight_requests, 1, "never above max_io_requests");
    assert_eq!(
        c.wait_histogram.iter().sum::<u64>(),
        2,
        "one wait per grant"
    );
    assert_eq!(
        s.counters_of("background").unwrap().requests,
        0,
        "a sibling is not charged"
    );
    assert_eq!(s.counters().len(), 3, "one entry per workload");
}

#[test]
fn page_cache_bytes_charge_nothing_and_a_refund_reaches_every_cap() {
    let clock = Arc::new(ManualClock::new(0));
    let s = disk(&clock);
    let bg: ThrottlePtr = Arc::new(s.workload("background").unwrap());
    let (r, hold) = bg
        .reserve_held(300, UNLIMITED_BLOCK, 7, Source::PageCache)
        .unwrap();
    assert_eq!((r.delay_ns, r.blocked), (7, false));
    assert!(hold.is_empty(), "a hit takes no place");
    assert!(!bg.throttle_page_cache_read(300, UNLIMITED_BLOCK).unwrap());
    assert_eq!(s.cap_tokens_nano("all").unwrap(), Some(tok(1000)));
    let (_, hold) = bg
        .reserve_held(300, UNLIMITED_BLOCK, 0, Source::Device)
        .unwrap();
    assert_eq!(s.cap_tokens_nano("all").unwrap(), Some(tok(700)));
    assert_eq!(s.cap_tokens_nano("background").unwrap(), Some(tok(200)));
    bg.refund_page_cache_read(200);
    assert_eq!(s.counters_of("all").unwrap().refunded_bytes, 200);
    assert_eq!(s.cap_tokens_nano("all").unwrap(), Some(tok(900)));
    assert_eq!(s.cap_tokens_nano("background").unwrap(), Some(tok(400)));
    bg.refund_page_cache_read(10_000);
    assert_eq!(
        s.cap_tokens_nano("background").unwrap(),
        Some(tok(500)),
        "never past the burst"
    );
    drop(hold);
}

#[test]
fn a_dropped_queued_turn_charges_nothing_and_hands_its_turn_on() {
    let clock = Arc::new(ManualClock::new(0));
    let s = disk(&clock);
    let user: ThrottlePtr = Arc::new(s.workload("user").unwrap());
    let (_, hold) = user
        .reserve_held(1000, UNLIMITED_BLOCK, 0, Source::Device)
        .unwrap();
    let waker = Waker::from(Arc::new(Count::default()));
    let mut cx = Context::from_waker(&waker);
    let mut queued = turn(100, Source::Device);
    assert!(queued.poll(user.as_ref(), &mut cx).is_pending());
    let count = Arc::new(Count::default());
    let behind_waker = Waker::from(count.clone());
    let mut behind = turn(50, Source::Device);
    assert!(
        behind
            .poll(user.as_ref(), &mut Context::from_waker(&behind_waker))
            .is_pending()
    );
    drop(hold);
    clock.advance(1_000_000_000);
    drop(queued);
    assert_eq!(s.queued_at("user").unwrap(), 0, "the dropped turn left");
    assert!(
        count.0.load(Ordering::SeqCst) >= 1,
        "its turn was handed on"
    );
    let Poll::Ready(Ok(_)) = behind.poll(user.as_ref(), &mut Context::from_waker(&behind_waker))
    else {
        panic!("the one behind goes");
    };
    assert_eq!(
        s.cap_tokens_nano("all").unwrap(),
        Some(tok(950)),
        "1000 refilled in 1 s; the dropped 100 charged nothing, the 50 did"
    );
}

#[test]
fn the_blocking_reserve_waits_for_the_completion_of_another_thread() {
    let clock = Arc::new(ManualClock::new(0));
    let s = disk(&clock);
    let user: ThrottlePtr = Arc::new(s.workload("user").unwrap());
    let (_, hold) = user
        .reserve_held(10, UNLIMITED_BLOCK, 0, Source::Device)
        .unwrap();
    let u = user.clone();
    let t = std::thread::spawn(move || {
        let (r, h) = u.reserve_held(10, UNLIMITED_BLOCK, 0, Source::Device)?;
        drop(h);
        Ok::<_, slotring_throttle::ThrottleError>(r.blocked)
    });
    while s.queued_at("user").unwrap() == 0 {
        std::thread::yield_now();
    }
    assert!(!t.is_finished(), "queued behind the place held");
    drop(hold);
    assert!(t.join().unwrap().unwrap(), "it waited for its turn");
    assert_eq!(s.in_flight("all").unwrap(), (0, 0));
}
