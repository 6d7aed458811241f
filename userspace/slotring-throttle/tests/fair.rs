//! Fair sharing between tenants: exact schedules on a `ManualClock`, the
//! blocking gate's order with real threads, bad input.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use slotring_throttle::{
    Clock, FairQueue, MAX_TAU, MAX_WEIGHT, ManualClock, Source, Tenant, Throttle, ThrottleError,
    Throttler, UNLIMITED_BLOCK, WaitStrategy,
};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_000 * SEC;
const MIB: u64 = 1 << 20;

/// A deterministic run of the gate's discipline: one booking at a time,
/// every stream re-issues the moment its request's wait ends (IO takes no
/// time). Returns bytes per tenant id and the elapsed clock time.
struct Sim {
    clock: Arc<ManualClock>,
    throttler: Throttler,
    queue: FairQueue,
    /// ticket → (tenant, cost)
    owner: HashMap<slotring_throttle::QueueTicket, (Tenant, u64)>,
    bytes: HashMap<u64, u64>,
}

impl Sim {
    fn new(rate: u64, burst: Duration, tau: Duration) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let throttler = Throttler::builder(rate)
            .clock(clock.clone())
            .burst(burst)
            .build()
            .unwrap();
        Self {
            clock,
            throttler,
            queue: FairQueue::new(tau).unwrap(),
            owner: HashMap::new(),
            bytes: HashMap::new(),
        }
    }

    fn issue(&mut self, t: &Tenant, cost: u64) {
        let ticket = self.queue.push(t, cost, self.throttler.max_speed());
        self.owner.insert(ticket, (t.clone(), cost));
    }

    /// Dispatch one request: charge the bucket, wait, return its tenant.
    fn step(&mut self) -> (Tenant, u64) {
        let d = self.queue.pop().expect("something waits");
        let (t, cost) = self.owner.remove(&d.ticket).unwrap();
        assert_eq!((d.tenant, d.cost), (t.id(), cost));
        let r = self
            .throttler
            .reserve(cost, UNLIMITED_BLOCK, 0, Source::Device)
            .unwrap();
        self.clock.advance(r.delay_ns);
        *self.bytes.entry(t.id()).or_default() += cost;
        (t, cost)
    }

    /// `n` dispatches, each stream re-issuing at once.
    fn run(&mut self, n: usize) {
        for _ in 0..n {
            let (t, cost) = self.step();
            self.issue(&t, cost);
        }
    }

    fn bytes(&self, t: &Tenant) -> u64 {
        self.bytes.get(&t.id()).copied().unwrap_or(0)
    }
}

#[test]
fn sixty_four_streams_against_one_share_equally_to_the_byte() {
    let mut s = Sim::new(64 * MIB, Duration::ZERO, Duration::from_millis(5));
    let a = Tenant::new("a", 1).unwrap();
    let b = Tenant::new("b", 1).unwrap();
    for _ in 0..64 {
        s.issue(&a, MIB);
    }
    s.issue(&b, MIB);
    s.run(1000);
    assert_eq!(s.bytes(&a), 500 * MIB);
    assert_eq!(s.bytes(&b), 500 * MIB, "one stream gets half, not 1/65");
    assert_eq!(
        s.clock.now_ns() - T0,
        1000 * MIB * SEC / (64 * MIB),
        "work-conserving: exactly the rate, no idle gaps"
    );
    assert_eq!(s.throttler.count(), 1000 * MIB, "every byte charged once");
}

#[test]
fn first_come_bucket_gives_the_single_stream_one_sixty_fifth() {
    // The baseline the fair order fixes: FIFO order of the same streams.
    let clock = Arc::new(ManualClock::new(T0));
    let t = Throttler::builder(64 * MIB)
        .clock(clock.clone())
        .burst(Duration::ZERO)
        .build()
        .unwrap();
    let mut fifo: std::collections::VecDeque<char> = std::iter::repeat_n('a', 64).collect();
    fifo.push_back('b');
    let mut b = 0;
    for _ in 0..650 {
        let who = fifo.pop_front().unwrap();
        let r = t.reserve(MIB, UNLIMITED_BLOCK, 0, Source::Device).unwrap();
        clock.advance(r.delay_ns);
        b += u64::from(who == 'b');
        fifo.push_back(who);
    }
    assert_eq!(b, 10, "b gets 1 request in 65");
}

#[test]
fn weights_three_to_one_share_75_25_to_the_byte() {
    let mut s = Sim::new(64 * MIB, Duration::from_secs(1), Duration::from_millis(5));
    let a = Tenant::new("a", 3).unwrap();
    let b = Tenant::new("b", 1).unwrap();
    for _ in 0..8 {
        s.issue(&a, 4096);
        s.issue(&b, 4096);
    }
    s.run(4000);
    assert_eq!(s.bytes(&a), 3000 * 4096);
    assert_eq!(s.bytes(&b), 1000 * 4096);
}

#[test]
fn unequal_costs_share_bytes_not_requests() {
    let mut s = Sim::new(MIB, Duration::ZERO, Duration::ZERO);
    let a = Tenant::new("a", 1).unwrap();
    let b = Tenant::new("b", 1).unwrap();
    s.issue(&a, 4096);
    s.issue(&b, 64 * 1024);
    // 16 of a's 4 KiB requests per one of b's 64 KiB requests.
    s.run(17 * 100);
    assert_eq!(s.bytes(&a), s.bytes(&b));
}

#[test]
fn an_idle_tenant_leaves_its_share_at_once() {
    let mut s = Sim::new(1_024_000, Duration::ZERO, Duration::from_millis(5));
    let a = Tenant::new("a", 1).unwrap();
    let b = Tenant::new("b", 1).unwrap();
    s.issue(&a, 1024);
    s.issue(&b, 1024);
    s.run(100);
    // b stops: its last request is dispatched and not re-issued.
    let start = s.clock.now_ns();
    let before = s.bytes(&a);
    for _ in 0..200 {
        let (t, cost) = s.step();
        if t.id() == a.id() {
            s.issue(&t, cost);
        }
    }
    let a_bytes = s.bytes(&a) - before;
    let elapsed = s.clock.now_ns() - start;
    // Everything after b's last request is a's, at the full rate.
    assert_eq!(a_bytes + s.bytes(&b) - 50 * 1024, 200 * 1024);
    assert_eq!(elapsed, 200 * SEC / 1000, "1 ms per request: the full rate");
}

/// Run `a` alone for a while, then let `b` return; count b's bytes served
/// before the first of a's requests issued after b's return.
fn idle_return_excess(tau: Duration, rate: u64, cost: u64) -> u64 {
    let mut s = Sim::new(rate, Duration::ZERO, tau);
    let a = Tenant::new("a", 1).unwrap();
    let b = Tenant::new("b", 1).unwrap();
    s.issue(&b, cost);
    for _ in 0..4 {
        s.issue(&a, cost);
    }
    assert_eq!(s.step().0.id(), b.id());
    // b goes idle for a long time while a runs alone.
    for _ in 0..10_000 {
        let (t, c) = s.step();
        assert_eq!(t.id(), a.id());
        s.issue(&t, c);
    }
    // b returns with many requests at once (a burst of its idle time would
    // be ~10,000 of them).
    for _ in 0..10_000 {
        s.issue(&b, cost);
    }
    let mut a_seen = 0;
    let mut b_ahead = 0u64;
    let mut b_total = 0;
    for _ in 0..2_000 {
        let (t, c) = s.step();
        if t.id() == a.id() {
            a_seen += 1;
            s.issue(&t, c);
        } else {
            b_total += cost;
        }
        // a still had 4 queued at older tags; count b's lead once a has
        // gone as often as b in equal shares would allow.
        b_ahead = b_ahead.max(b_total.saturating_sub(a_seen * cost));
    }
    b_ahead
}

#[test]
fn return_from_idle_catches_up_at_most_tau() {
    let rate = 64 * MIB;
    let cost = 4096;
    let none = idle_return_excess(Duration::ZERO, rate, cost);
    assert!(none <= 4 * cost, "no catch-up with tau 0: {none}");
    let tau = Duration::from_millis(5);
    let excess = idle_return_excess(tau, rate, cost);
    // Its share (1/2) of tau at the rate, plus a's queued requests and one
    // request of rounding.
    let bound = rate * 5 / 1000 / 2;
    assert!(excess > bound / 2, "some catch-up is granted: {excess}");
    assert!(
        excess <= bound + 5 * cost,
        "catch-up {excess} exceeds tau's share {bound}"
    );
    // And never the idle time: 10,000 requests' worth.
    assert!(excess < 100 * cost);
}

#[test]
fn bad_weights_are_typed_errors() {
    assert!(matches!(
        Tenant::new("zero", 0),
        Err(ThrottleError::TenantWeight { weight: 0, .. })
    ));
    let e = Tenant::new("huge", MAX_WEIGHT + 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "tenant `huge`: weight {} is outside 1..={MAX_WEIGHT}",
            MAX_WEIGHT + 1
        )
    );
    assert_eq!(Tenant::new("max", MAX_WEIGHT).unwrap().weight(), MAX_WEIGHT);
    assert!(matches!(
        Throttler::builder(1)
            .tau(MAX_TAU + Duration::from_nanos(1))
            .build(),
        Err(ThrottleError::TauTooLarge { .. })
    ));
}

#[test]
fn extreme_weights_still_share_by_weight() {
    let mut s = Sim::new(MIB, Duration::ZERO, Duration::ZERO);
    let big = Tenant::new("big", MAX_WEIGHT).unwrap();
    let small = Tenant::new("small", 1).unwrap();
    s.issue(&big, 1);
    s.issue(&small, 1);
    s.run(usize::try_from(MAX_WEIGHT).unwrap() * 2 + 2);
    assert_eq!(s.bytes(&big), 2 * u64::from(MAX_WEIGHT));
    assert_eq!(s.bytes(&small), 2, "weight 1 is never starved");
}

#[test]
fn ten_thousand_tenants_share_and_are_forgotten_when_idle() {
    let mut s = Sim::new(100 * MIB, Duration::ZERO, Duration::from_millis(5));
    let tenants: Vec<Tenant> = (0..10_000)
        .map(|i| Tenant::new(format!("q{i}"), 1 + i % 4).unwrap())
        .collect();
    for t in &tenants {
        s.issue(t, 4096);
    }
    assert_eq!(s.queue.tenants(), 10_000);
    for _ in 0..10_000 {
        s.step();
    }
    assert!(s.queue.is_empty());
    for t in &tenants {
        assert_eq!(s.bytes(t), 4096, "each served once, none lost");
    }
    // Idle tenants whose tags V has passed are forgotten.
    let a = Tenant::new("a", 1).unwrap();
    s.issue(&a, 4096);
    s.run(10_200);
    assert!(s.queue.tenants() < 100, "{} kept", s.queue.tenants());
    assert_eq!(s.throttler.count(), 20_200 * 4096);
}

#[test]
fn one_handle_on_two_queues_has_separate_tags() {
    let a = Tenant::new("a", 1).unwrap();
    let b = Tenant::new("b", 1).unwrap();
    let mut q1 = FairQueue::new(Duration::ZERO).unwrap();
    let mut q2 = FairQueue::new(Duration::ZERO).unwrap();
    for _ in 0..100 {
        q1.push(&a, 10, 1000);
    }
    // On q2, a has no history from q1: it starts level with b.
    let b2 = q2.push(&b, 10, 1000);
    let a2 = q2.push(&a, 10, 1000);
    assert_eq!(q2.pop().unwrap().ticket, b2);
    assert_eq!(q2.pop().unwrap().ticket, a2);
    assert_eq!(q1.len(), 100);
}

/// A wait strategy that records who waits and holds every waiter until the
/// test lets it go, then advances the manual clock to its deadline.
#[derive(Debug, Default)]
struct Gated {
    state: Mutex<(Vec<String>, usize)>, // (order of waiters, permits)
    cv: Condvar,
}

impl Gated {
    fn waiting(&self) -> usize {
        self.state.lock().unwrap().0.len()
    }
    fn release_one(&self) {
        self.state.lock().unwrap().1 += 1;
        self.cv.notify_all();
    }
    fn order(&self) -> Vec<String> {
        self.state.lock().unwrap().0.clone()
    }
}

impl WaitStrategy for Gated {
    fn wait_until(&self, clock: &dyn Clock, deadline_ns: u64) -> Result<(), Errno> {
        let who = Tenant::current().map_or_else(|| "-".to_owned(), |t| t.name().to_owned());
        let mut st = self.state.lock().unwrap();
        st.0.push(who);
        while st.1 == 0 {
            st = self.cv.wait(st).unwrap();
        }
        st.1 -= 1;
        clock.sleep_until(deadline_ns)
    }
}

fn spin_until(what: &str, f: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_waiting_tenant_overtakes_another_tenants_queue_in_blocking_waits() {
    let clock = Arc::new(ManualClock::new(T0));
    let gated = Arc::new(Gated::default());
    let t = Arc::new(
        Throttler::builder(1000)
            .clock(clock.clone())
            .burst(Duration::ZERO)
            .wait_strategy(gated.clone())
            .build()
            .unwrap(),
    );
    let a = Tenant::new("a", 1).unwrap();
    let b = Tenant::new("b", 1).unwrap();
    let spawn = |tenant: &Tenant| {
        let (t, tenant) = (t.clone(), tenant.clone());
        std::thread::spawn(move || t.throttle_as(&tenant, 10, UNLIMITED_BLOCK).unwrap())
    };
    let mut threads = vec![spawn(&a)];
    spin_until("a's first request books", || gated.waiting() == 1);
    for n in 1..5 {
        threads.push(spawn(&a));
        spin_until("a queues", || t.fair_queued() == n);
    }
    gated.release_one();
    spin_until("a's second request books", || gated.waiting() == 2);
    // b arrives behind three queued requests of a, and its handle is dropped
    // by the caller while the request waits (the request holds a clone).
    threads.push(spawn(&b));
    drop(b);
    spin_until("b queues", || t.fair_queued() == 4);
    for n in 3..=6 {
        gated.release_one();
        spin_until("the next one books", || gated.waiting() == n);
    }
    gated.release_one();
    for th in threads {
        assert!(th.join().unwrap(), "every request waited");
    }
    assert_eq!(
        gated.order(),
        ["a", "a", "b", "a", "a", "a"],
        "b goes right after the booking in progress, not after a's queue"
    );
    assert_eq!(t.count(), 60, "every request charged exactly once");
    assert_eq!(t.fair_queued(), 0);
    assert_eq!(clock.now_ns() - T0, 60 * SEC / 1000, "at the rate exactly");
}

#[test]
fn a_released_queue_lets_every_waiter_charge_at_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let gated = Arc::new(Gated::default());
    let t = Arc::new(
        Throttler::builder(1000)
            .clock(clock.clone())
            .burst(Duration::ZERO)
            .wait_strategy(gated.clone())
            .build()
            .unwrap(),
    );
    let a = Tenant::new("a", 1).unwrap();
    let b = Tenant::new("b", 1).unwrap();
    let spawn = |tenant: &Tenant, amount: u64, max_block: Duration| {
        let (t, tenant) = (t.clone(), tenant.clone());
        std::thread::spawn(move || t.throttle_as(&tenant, amount, max_block).unwrap())
    };
    // a books one second ahead, far past the horizon: the gate closes.
    let mut threads = vec![spawn(&a, 1000, UNLIMITED_BLOCK)];
    spin_until("a's first request books", || gated.waiting() == 1);
    threads.push(spawn(&a, 10, UNLIMITED_BLOCK));
    spin_until("a queues", || t.fair_queued() == 1);
    threads.push(spawn(&b, 10, UNLIMITED_BLOCK));
    spin_until("b queues", || t.fair_queued() == 2);
    // Their turns would come only when a's booking ends within the horizon
    // (~1 s on a clock that does not move); released, both charge at once.
    t.release_fair_queue();
    spin_until("both leave the queue and book", || gated.waiting() == 3);
    assert_eq!(t.fair_queued(), 0);
    // Later callers do not queue either.
    threads.push(spawn(&b, 10, UNLIMITED_BLOCK));
    spin_until("a late caller books at once", || gated.waiting() == 4);
    for _ in 0..4 {
        gated.release_one();
    }
    clock.advance(2 * SEC);
    for th in threads {
        th.join().unwrap();
    }
    assert_eq!(t.count(), 1030, "every request charged exactly once");
    assert_eq!(t.fair_queued(), 0);
}

#[test]
fn without_a_tenant_waits_are_first_come_to_the_nanosecond() {
    let c1 = Arc::new(ManualClock::new(T0));
    let c2 = Arc::new(ManualClock::new(T0));
    let plain = Throttler::builder(3).clock(c1.clone()).build().unwrap();
    let fair = Throttler::builder(3).clock(c2.clone()).build().unwrap();
    let a = Tenant::new("a", 7).unwrap();
    for amount in [4, 1, 0, 5, 2] {
        plain.throttle(amount, UNLIMITED_BLOCK).unwrap();
        // A lone tenant never queues: the same waits.
        fair.throttle_as(&a, amount, UNLIMITED_BLOCK).unwrap();
        assert_eq!(c1.now_ns(), c2.now_ns());
    }
    assert_eq!(
        c1.now_ns() - T0,
        3 * SEC,
        "9 tokens beyond the burst at 3/s"
    );
}

#[test]
fn parents_are_charged_as_the_same_tenant() {
    let clock = Arc::new(ManualClock::new(T0));
    let parent: Arc<dyn Throttle> = Arc::new(
        Throttler::builder(100)
            .clock(clock.clone())
            .name("parent")
            .build()
            .unwrap(),
    );
    let child = Throttler::builder(1000)
        .clock(clock.clone())
        .parent(parent.clone())
        .build()
        .unwrap();
    let a = Tenant::new("a", 1).unwrap();
    assert!(child.throttle_as(&a, 150, UNLIMITED_BLOCK).unwrap());
    assert_eq!(clock.now_ns() - T0, SEC / 2, "the parent's deficit");
    let mut counts = Vec::new();
    child.visit(&mut |t| counts.push(t.count()));
    assert_eq!(counts, [150, 150]);
    assert_eq!(a.charged(), 300, "charged at both levels");
    assert_eq!(a.wait_ns(), SEC / 2, "the parent's wait");
    assert!(Tenant::current().is_none(), "the scope ended");
}

mod model {
    use super::*;
    use proptest::prelude::*;
    use slotring_throttle::NANO_PER_TOKEN;

    /// `(grant time, tenant index, amount)`: checks the token-bucket bound
    /// over every window of grant times, for `filter`ed entries.
    fn check_windows(
        log: &[(u64, usize, u64)],
        filter: impl Fn(usize) -> bool,
        rate: u64,
        burst_ns: u64,
    ) -> Result<(), TestCaseError> {
        let log: Vec<_> = log.iter().filter(|e| filter(e.1)).collect();
        let Some(largest) = log.iter().map(|e| e.2).max() else {
            return Ok(());
        };
        let burst = i128::from(rate) * i128::from(burst_ns);
        for i in 0..log.len() {
            let mut sum = 0i128;
            for j in i..log.len() {
                sum += i128::from(log[j].2);
                let dt = i128::from(log[j].0 - log[i].0);
                prop_assert!(
                    sum * NANO_PER_TOKEN
                        <= burst + i128::from(rate) * dt + i128::from(largest) * NANO_PER_TOKEN,
                    "window {}..{}: {} tokens in {} ns at {}/s",
                    i,
                    j,
                    sum,
                    dt,
                    rate
                );
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 128,
            // Failures are saved next to this file (tests/regressions/fair.txt), committed.
            failure_persistence: Some(Box::new(
                proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
            )),
            ..ProptestConfig::default()
        })]

        /// Random arrivals of up to five weighted tenants through the fair
        /// order and the bucket: nothing is lost or charged twice, and over
        /// any window of grant times, charged ≤ burst + rate·T + the largest
        /// request, per tenant and in total.
        #[test]
        fn fair_order_never_exceeds_the_bucket(
            rate in 1u64..=1 << 30,
            burst_ms in 0u64..2_000,
            tau_us in 0u64..10_000,
            weights in proptest::collection::vec(1u32..=8, 1..=5),
            arrivals in proptest::collection::vec((0usize..5, 1u64..=4096, 0u64..SEC / 4), 1..100),
        ) {
            let clock = Arc::new(ManualClock::new(T0));
            let burst_ns = burst_ms * 1_000_000;
            let t = Throttler::builder(rate)
                .clock(clock.clone())
                .burst(Duration::from_nanos(burst_ns))
                .build()
                .unwrap();
            let mut q = FairQueue::new(Duration::from_micros(tau_us)).unwrap();
            let tenants: Vec<Tenant> = weights
                .iter()
                .enumerate()
                .map(|(i, w)| Tenant::new(format!("t{i}"), *w).unwrap())
                .collect();
            // Amounts scale with the rate so that waits happen.
            let arrivals: Vec<(usize, u64, u64)> = arrivals
                .into_iter()
                .map(|(i, a, gap)| (i % tenants.len(), (a * rate / 1024).max(1), gap))
                .collect();
            let mut next = 0;
            let mut at = T0;
            let mut owner = HashMap::new();
            let mut log = Vec::new();
            while next < arrivals.len() || !q.is_empty() {
                let due = next < arrivals.len() && at + arrivals[next].2 <= clock.now_ns();
                if due || (q.is_empty() && next < arrivals.len()) {
                    let (i, amount, gap) = arrivals[next];
                    at += gap;
                    if at > clock.now_ns() {
                        clock.set_ns(at);
                    }
                    let ticket = q.push(&tenants[i], amount, rate);
                    prop_assert!(owner.insert(ticket, (i, amount)).is_none());
                    next += 1;
                    continue;
                }
                let d = q.pop().unwrap();
                let (i, amount) = owner.remove(&d.ticket).expect("dispatched once");
                prop_assert_eq!((d.tenant, d.cost), (tenants[i].id(), amount));
                let r = t.reserve(amount, UNLIMITED_BLOCK, 0, Source::Device).unwrap();
                clock.advance(r.delay_ns);
                log.push((clock.now_ns(), i, amount));
            }
            prop_assert!(owner.is_empty(), "every request dispatched");
            let total: u64 = arrivals.iter().map(|a| a.1).sum();
            prop_assert_eq!(t.count(), total, "charged exactly once");
            check_windows(&log, |_| true, rate, burst_ns)?;
            for i in 0..tenants.len() {
                check_windows(&log, |j| j == i, rate, burst_ns)?;
            }
        }
    }
}

#[test]
fn bookings_run_ahead_of_the_fair_order_by_at_most_tau() {
    let clock = Arc::new(ManualClock::new(T0));
    let gated = Arc::new(Gated::default());
    let t = Arc::new(
        Throttler::builder(1000)
            .clock(clock.clone())
            .burst(Duration::ZERO)
            .tau(Duration::from_millis(5))
            .wait_strategy(gated.clone())
            .build()
            .unwrap(),
    );
    let a = Tenant::new("a", 1).unwrap();
    let mut threads = vec![];
    // Each request is 1 ms of the rate. The bookings end at 1, 2, …, 6 ms:
    // the sixth starts when 5 ms are booked (≤ τ), the seventh would run
    // 6 ms ahead and queues.
    for n in 1..=7 {
        let (t2, a) = (t.clone(), a.clone());
        threads.push(std::thread::spawn(move || {
            t2.throttle_as(&a, 1, UNLIMITED_BLOCK).unwrap()
        }));
        if n <= 6 {
            spin_until("books", || gated.waiting() == n);
        } else {
            spin_until("queues", || t.fair_queued() == 1);
        }
    }
    assert_eq!(gated.waiting(), 6, "the seventh waits for the horizon");
    for _ in 0..7 {
        gated.release_one();
    }
    for th in threads {
        assert!(th.join().unwrap());
    }
    assert_eq!(t.count(), 7);
    assert_eq!(clock.now_ns() - T0, 7 * SEC / 1000, "exactly the rate");
}

#[test]
fn reservations_are_booked_in_the_fair_order() {
    // The io_uring engine books with `reserve` and waits in a timeout SQE:
    // a tenant's reservation waits (lease parked) only for its turn.
    let clock = Arc::new(ManualClock::new(T0));
    let t = Arc::new(
        Throttler::builder(1000)
            .clock(clock.clone())
            .burst(Duration::ZERO)
            .build()
            .unwrap(),
    );
    let a = Tenant::new("a", 1).unwrap();
    let b = Tenant::new("b", 1).unwrap();
    let done = Arc::new(Mutex::new(Vec::<(String, u64)>::new()));
    let spawn = |tenant: &Tenant| {
        let (t, tenant, done) = (t.clone(), tenant.clone(), done.clone());
        std::thread::spawn(move || {
            let _s = tenant.enter();
            let r = t.reserve(10, UNLIMITED_BLOCK, 0, Source::Device).unwrap();
            done.lock()
                .unwrap()
                .push((tenant.name().to_owned(), r.delay_ns));
        })
    };
    let n_done = || done.lock().unwrap().len();
    // a's first booking goes at once: 10 ms.
    let mut threads = vec![spawn(&a)];
    spin_until("a1 books", || n_done() == 1);
    // a's next four queue (the bookings run 10 ms ahead, more than τ = 5 ms).
    for n in 1..=4 {
        threads.push(spawn(&a));
        spin_until("a queues", || t.fair_queued() == n);
    }
    clock.advance(10 * SEC / 1000);
    spin_until("a2 books", || n_done() == 2);
    // b arrives behind a's three queued requests.
    threads.push(spawn(&b));
    spin_until("b queues", || t.fair_queued() == 4);
    for n in 3..=6 {
        clock.advance(10 * SEC / 1000);
        spin_until("the next books", || n_done() == n);
    }
    for th in threads {
        th.join().unwrap();
    }
    let done = done.lock().unwrap().clone();
    let order: Vec<&str> = done.iter().map(|d| d.0.as_str()).collect();
    assert_eq!(order, ["a", "a", "b", "a", "a", "a"]);
    assert!(
        done.iter().all(|d| d.1 == 10 * SEC / 1000),
        "each booked at its turn, 10 ms of the rate: {done:?}"
    );
    assert_eq!(t.count(), 60);
}

/// A tenant's statistics while threads enter and leave it and readers read:
/// every read is at most the final total and never less than the previous
/// read, and once every scope has ended the totals are exact (each thread's
/// scope keeps its own cell; its end moves the cell into the tenant).
#[test]
fn tenant_statistics_are_exact_across_scopes_and_monotone_while_read() {
    let t = Arc::new(Throttler::new(slotring_throttle::MAX_RATE).unwrap());
    let tenant = Tenant::new("q", 1).unwrap();
    let (threads, scopes, charges, amount) = (4u64, 50u64, 100u64, 4096u64);
    let total = threads * scopes * charges * amount;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (tenant, done) = (tenant.clone(), done.clone());
        std::thread::spawn(move || {
            let mut last = 0;
            let mut reads = 0u64;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let now = tenant.charged();
                assert!(now >= last, "a read went back: {now} after {last}");
                assert!(now <= total, "a read counted a byte twice: {now} > {total}");
                last = now;
                reads += 1;
            }
            reads
        })
    };
    let writers: Vec<_> = (0..threads)
        .map(|_| {
            let (t, tenant) = (t.clone(), tenant.clone());
            std::thread::spawn(move || {
                for _ in 0..scopes {
                    let _s = tenant.enter();
                    for _ in 0..charges {
                        t.throttle(amount, Duration::ZERO).unwrap();
                    }
                    // Inside the scope the thread's own charges are visible.
                    assert!(tenant.charged() >= charges * amount);
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    assert!(reader.join().unwrap() > 0);
    assert_eq!(tenant.charged(), total);
    assert_eq!(t.count(), total, "the striped count sums every thread");
    // Nested scopes of the same tenant on one thread keep separate cells.
    let before = tenant.charged();
    {
        let _outer = tenant.enter();
        t.throttle(1, Duration::ZERO).unwrap();
        {
            let _inner = tenant.enter();
            t.throttle(10, Duration::ZERO).unwrap();
        }
        t.throttle(100, Duration::ZERO).unwrap();
        assert_eq!(tenant.charged(), before + 111);
    }
    assert_eq!(tenant.charged(), before + 111);
}
