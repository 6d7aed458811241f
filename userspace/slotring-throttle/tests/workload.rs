//! The workload tree, exactly on a `ManualClock`: priorities, weights,
//! caps, in-flight limits, hand-over, the timekeeper, live changes, CPU
//! slots, and a test for every rejection.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use slotring_throttle::{
    ManualClock, NANO_PER_TOKEN, Permit, Request, Resource, WorkloadError, WorkloadScheduler,
    WorkloadSpec, WorkloadTree,
};

const MS: u64 = 1_000_000;

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Waiter {
    req: Request,
    count: Arc<Count>,
    waker: Waker,
}

impl Waiter {
    fn new(req: Request) -> Self {
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        Self { req, count, waker }
    }

    fn poll(&mut self) -> Poll<Result<Permit<'static>, WorkloadError>> {
        self.req.poll(&mut Context::from_waker(&self.waker))
    }

    fn woken(&self) -> usize {
        self.count.0.load(Ordering::SeqCst)
    }

    /// Poll, expecting it to queue.
    fn queue(mut self) -> Self {
        assert!(self.poll().is_pending(), "expected to queue");
        self
    }

    fn ready(&mut self) -> Permit<'static> {
        match self.poll() {
            Poll::Ready(r) => r.expect("granted"),
            Poll::Pending => panic!("still queued"),
        }
    }
}

fn tree(specs: Vec<WorkloadSpec>) -> WorkloadTree {
    WorkloadTree::new(specs).expect("a valid tree")
}

fn sched(t: &WorkloadTree, clock: &Arc<ManualClock>, tau: Duration) -> WorkloadScheduler {
    WorkloadScheduler::builder(t, Resource::Io)
        .clock(clock.clone())
        .tau(tau)
        .build()
        .unwrap()
}

fn tok(n: i128) -> i128 {
    n * NANO_PER_TOKEN
}

#[test]
fn a_user_request_overtakes_queued_background_and_waits_one_request_at_most() {
    // 1000 bytes/s at the root; background at priority 1, users at 0.
    let t = tree(vec![
        WorkloadSpec::new("all").max_bytes_per_second(1000),
        WorkloadSpec::new("user").parent("all"),
        WorkloadSpec::new("background").parent("all").priority(1),
    ]);
    let clock = Arc::new(ManualClock::new(0));
    let s = sched(&t, &clock, Duration::ZERO);
    let bg = s.workload("background").unwrap();
    let user = s.workload("user").unwrap();
    // The full bucket, then one request into debt: both lock-free.
    let p = bg.try_acquire(1000).unwrap().expect("the burst");
    assert!(!p.waited());
    let p2 = bg.try_acquire(100).unwrap().expect("takes it into debt");
    assert_eq!(s.cap_tokens_nano("all").unwrap(), Some(tok(-100)));
    assert!(bg.try_acquire(100).unwrap().is_none(), "the debt binds");
    let mut b1 = Waiter::new(bg.request(100)).queue();
    let mut b2 = Waiter::new(bg.request(100)).queue();
    assert_eq!(b1.req.retry_after(), Some(Duration::from_millis(100)));
    assert_eq!(b2.req.retry_after(), None, "one timekeeper");
    let mut u = Waiter::new(user.request(100)).queue();
    // 100 ms later the debt is paid: the timekeeper's re-poll serves the
    // user first, whatever came first.
    clock.advance(100 * MS);
    assert!(b1.poll().is_pending());
    assert_eq!(u.woken(), 1, "the user's turn came");
    let up = u.ready();
    assert!(up.waited());
    assert_eq!(up.delay_ns(), 0);
    assert_eq!(s.cap_tokens_nano("all").unwrap(), Some(tok(-100)));
    clock.advance(100 * MS);
    drop(b1.ready());
    clock.advance(100 * MS);
    assert!(b2.poll().is_ready(), "b2 timed the next debt once b1 left");
    drop((p, p2));
}

#[test]
fn within_the_horizon_requests_are_booked_with_their_delay() {
    let t = tree(vec![
        WorkloadSpec::new("all").max_bytes_per_second(1000),
        WorkloadSpec::new("q").parent("all"),
    ]);
    let clock = Arc::new(ManualClock::new(0));
    let s = sched(&t, &clock, Duration::from_millis(250));
    let q = s.workload("q").unwrap();
    let _ = q.try_acquire(1000).unwrap().unwrap();
    // Debt 0, then 200 bytes = 200 ms, then 400 > 250 ms: queue.
    assert_eq!(q.try_acquire(200).unwrap().unwrap().delay_ns(), 0);
    assert_eq!(q.try_acquire(200).unwrap().unwrap().delay_ns(), 200 * MS);
    assert!(q.try_acquire(1).unwrap().is_none());
    let mut w = Waiter::new(q.request(1)).queue();
    assert_eq!(w.req.retry_after(), Some(Duration::from_millis(150)));
    clock.advance(150 * MS);
    let p = w.ready();
    assert_eq!(
        p.delay_ns(),
        250 * MS,
        "booked until the debt before it ends"
    );
}

#[test]
fn weights_share_three_to_one_inside_one_priority() {
    let t = tree(vec![
        WorkloadSpec::new("all").max_io_requests(1),
        WorkloadSpec::new("a").parent("all").weight(3),
        WorkloadSpec::new("b").parent("all").weight(1),
    ]);
    let clock = Arc::new(ManualClock::new(0));
    let s = sched(&t, &clock, Duration::ZERO);
    let (a, b) = (s.workload("a").unwrap(), s.workload("b").unwrap());
    let mut held = a.try_acquire(100).unwrap().unwrap();
    let mut wa: Vec<Waiter> = (0..40)
        .map(|_| Waiter::new(a.request(100)).queue())
        .collect();
    let mut wb: Vec<Waiter> = (0..40)
        .map(|_| Waiter::new(b.request(100)).queue())
        .collect();
    let mut served = [0, 0];
    for _ in 0..40 {
        drop(held);
        let ia = wa.iter().position(|w| w.woken() > 0);
        let ib = wb.iter().position(|w| w.woken() > 0);
        held = match (ia, ib) {
            (Some(i), None) => {
                served[0] += 1;
                wa.remove(i).ready()
            }
            (None, Some(i)) => {
                served[1] += 1;
                wb.remove(i).ready()
            }
            other => panic!("exactly one grant per completion, got {other:?}"),
        };
    }
    assert_eq!(served, [30, 10]);
}

#[test]
fn a_customer_with_one_query_gets_half_against_one_with_eight() {
    let mut specs = vec![
        WorkloadSpec::new("all").max_io_requests(1),
        WorkloadSpec::new("A").parent("all"),
        WorkloadSpec::new("B").parent("all"),
        WorkloadSpec::new("A0").parent("A"),
    ];
    for i in 0..8 {
        specs.push(WorkloadSpec::new(format!("B{i}")).parent("B"));
    }
    let t = tree(specs);
    let clock = Arc::new(ManualClock::new(0));
    let s = sched(&t, &clock, Duration::ZERO);
    let a0 = s.workload("A0").unwrap();
    let bs: Vec<_> = (0..8)
        .map(|i| s.workload(&format!("B{i}")).unwrap())
        .collect();
    let mut held = Some(a0.try_acquire(10).unwrap().unwrap());
    let mut waiters: Vec<(bool, Waiter)> = (0..16)
        .map(|_| (true, Waiter::new(a0.request(10)).queue()))
        .collect();
    for b in &bs {
        for _ in 0..2 {
            waiters.push((false, Waiter::new(b.request(10)).queue()));
        }
    }
    let mut a_share = 0;
    for _ in 0..16 {
        held.take();
        let i = waiters.iter().position(|(_, w)| w.woken() > 0).unwrap();
        let (is_a, mut w) = waiters.remove(i);
        a_share += usize::from(is_a);
        held = Some(w.ready());
    }
    assert_eq!(a_share, 8, "A's one query gets half the disk");
}

#[test]
fn a_cap_limits_even_an_idle_disk_and_its_sibling_is_not_slowed() {
    let t = tree(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("scan")
            .parent("all")
            .max_bytes_per_second(100)
            .max_burst_bytes(50),
        WorkloadSpec::new("q").parent("all"),
    ]);
    let clock = Arc::new(ManualClock::new(0));
    let s = sched(&t, &clock, Duration::ZERO);
    let (scan, q) = (s.workload("scan").unwrap(), s.workload("q").unwrap());
    assert!(scan.try_acquire(50).unwrap().is_some());
    assert!(scan.try_acquire(10).unwrap().is_some(), "into debt");
    assert!(
        scan.try_acquire(10).unwrap().is_none(),
        "alone on the disk, still capped"
    );
    let mut w = Waiter::new(scan.request(10)).queue();
    for _ in 0..5 {
        assert!(q.try_acquire(1 << 30).unwrap().is_some(), "q is not capped");
    }
    assert_eq!(w.req.retry_after(), Some(Duration::from_millis(100)));
    clock.advance(100 * MS);
    drop(w.ready());
}

#[test]
fn in_flight_requests_never_exceed_the_limit_and_a_completion_hands_over() {
    let t = tree(vec![
        WorkloadSpec::new("all")
            .max_io_requests(2)
            .max_bytes_inflight(300),
        WorkloadSpec::new("q").parent("all"),
    ]);
    let clock = Arc::new(ManualClock::new(0));
    let s = sched(&t, &clock, Duration::ZERO);
    let q = s.workload("q").unwrap();
    let p1 = q.try_acquire(200).unwrap().unwrap();
    assert!(
        q.try_acquire(200).unwrap().is_none(),
        "200 + 200 > 300 bytes"
    );
    let mut w1 = Waiter::new(q.request(200)).queue();
    let mut w2 = Waiter::new(q.request(50)).queue();
    assert_eq!(
        w1.req.retry_after(),
        None,
        "no cap: woken by the completion"
    );
    assert_eq!(s.in_flight("all").unwrap(), (1, 200));
    assert_eq!(w2.woken(), 0, "FIFO within the leaf: w2 waits behind w1");
    p1.complete();
    assert_eq!(w1.woken(), 1);
    let p2 = w1.ready();
    assert_eq!(w2.woken(), 1, "50 more fit beside 200");
    let p3 = w2.ready();
    assert_eq!(s.in_flight("all").unwrap(), (2, 250));
    assert!(
        q.try_acquire(1).unwrap().is_none(),
        "two requests in flight"
    );
    drop((p2, p3));
    assert_eq!(s.in_flight("all").unwrap(), (0, 0));
    let big = q
        .try_acquire(1000)
        .unwrap()
        .expect("alone, larger than the limit");
    assert!(q.try_acquire(1).unwrap().is_none());
    drop(big);
}

#[test]
fn a_dropped_queued_request_hands_its_turn_on_and_charges_nothing() {
    let t = tree(vec![
        WorkloadSpec::new("all").max_bytes_per_second(1000),
        WorkloadSpec::new("q").parent("all"),
    ]);
    let clock = Arc::new(ManualClock::new(0));
    let s = sched(&t, &clock, Duration::ZERO);
    let q = s.workload("q").unwrap();
    let _ = q.try_acquire(1100).unwrap().unwrap();
    let w1 = Waiter::new(q.request(300)).queue();
    let mut w2 = Waiter::new(q.request(100)).queue();
    assert!(w1.req.retry_after().is_some(), "w1 times the debt");
    assert_eq!(w2.req.retry_after(), None);
    drop(w1);
    assert_eq!(w2.woken(), 1, "the timekeeper's role passed to w2");
    assert!(w2.poll().is_pending());
    assert_eq!(w2.req.retry_after(), Some(Duration::from_millis(100)));
    assert_eq!(s.queued(), 1);
    assert_eq!(
        s.cap_tokens_nano("all").unwrap(),
        Some(tok(-100)),
        "w1 charged nothing"
    );
    clock.advance(100 * MS);
    drop(w2.ready());
    assert_eq!(s.cap_tokens_nano("all").unwrap(), Some(tok(-100)));
}

#[test]
fn strict_priority_serves_every_queued_high_request_first() {
    let t = tree(vec![
        WorkloadSpec::new("all").max_io_requests(1),
        WorkloadSpec::new("hi").parent("all").priority(-5),
        WorkloadSpec::new("lo").parent("all").priority(7),
    ]);
    let clock = Arc::new(ManualClock::new(0));
    let s = sched(&t, &clock, Duration::ZERO);
    let (hi, lo) = (s.workload("hi").unwrap(), s.workload("lo").unwrap());
    let mut held = lo.try_acquire(1).unwrap().unwrap();
    let mut los: Vec<Waiter> = (0..3).map(|_| Waiter::new(lo.request(1)).queue()).collect();
    let mut his: Vec<Waiter> = (0..3).map(|_| Waiter::new(hi.request(1)).queue()).collect();
    let mut order = String::new();
    for _ in 0..6 {
        drop(held);
        if let Some(i) = his.iter().position(|w| w.woken() > 0) {
            order.push('h');
            held = his.remove(i).ready();
        } else {
            let i = los.iter().position(|w| w.woken() > 0).unwrap();
            order.push('l');
            held = los.remove(i).ready();
        }
    }
    assert_eq!(order, "hhhlll");
}

#[test]
fn a_child_back_from_idle_catches_up_by_its_share_of_tau_only() {
    // 1000 B/s (a burst that never binds), τ = 100 ms: a credit of 100
    // bytes, split by Σw = 2, so b may start 50 bytes of virtual time
    // behind a's last start. One request in flight at a time.
    let t = tree(vec![
        WorkloadSpec::new("all")
            .max_bytes_per_second(1000)
            .max_burst_bytes(1 << 40)
            .max_io_requests(1),
        WorkloadSpec::new("a").parent("all"),
        WorkloadSpec::new("b").parent("all"),
    ]);
    let clock = Arc::new(ManualClock::new(0));
    let s = sched(&t, &clock, Duration::from_millis(100));
    let (a, b) = (s.workload("a").unwrap(), s.workload("b").unwrap());
    let mut held = Some(a.try_acquire(100).unwrap().unwrap());
    let mut was: Vec<Waiter> = (0..20)
        .map(|_| Waiter::new(a.request(100)).queue())
        .collect();
    let next = |ws: &mut Vec<Waiter>, held: &mut Option<Permit<'_>>| {
        held.take();
        let i = ws.iter().position(|w| w.woken() > 0)?;
        *held = Some(ws.remove(i).ready());
        Some(())
    };
    // a alone for ten requests: its start tags 0, 100, …, 900.
    for _ in 0..10 {
        next(&mut was, &mut held).unwrap();
    }
    let mut wbs: Vec<Waiter> = (0..10)
        .map(|_| Waiter::new(b.request(100)).queue())
        .collect();
    let mut order = String::new();
    for _ in 0..8 {
        held.take();
        if let Some(i) = was.iter().position(|w| w.woken() > 0) {
            order.push('a');
            held = Some(was.remove(i).ready());
        } else {
            let i = wbs.iter().position(|w| w.woken() > 0).unwrap();
            order.push('b');
            held = Some(wbs.remove(i).ready());
        }
    }
    // b starts at 900 − 50 = 850 against a's 1000: half a request ahead,
    // then they alternate; never ten turns in a row for its idle time.
    assert_eq!(order, "bbababab");
}

#[test]
fn cpu_slots_share_by_weight_under_max_concurrent_threads() {
    let t = tree(vec![
        WorkloadSpec::new("all").max_concurrent_threads(2),
        WorkloadSpec::new("a").parent("all").weight(2),
        WorkloadSpec::new("b")
            .parent("all")
            .max_concurrent_threads(1),
    ]);
    let s = WorkloadScheduler::builder(&t, Resource::CpuSlots)
        .clock(Arc::new(ManualClock::new(0)))
        .build()
        .unwrap();
    let (a, b) = (s.workload("a").unwrap(), s.workload("b").unwrap());
    let b1 = b.try_acquire(1).unwrap().expect("a slot");
    assert!(b.try_acquire(1).unwrap().is_none(), "b's own limit");
    let a1 = a.try_acquire(1).unwrap().expect("the second slot");
    assert!(a.try_acquire(1).unwrap().is_none(), "the root's limit");
    let mut wb = Waiter::new(b.request(1)).queue();
    let mut wa = Waiter::new(a.request(1)).queue();
    drop(a1);
    assert_eq!(wb.woken(), 0, "b still holds its one slot");
    let a2 = wa.ready();
    drop(b1);
    let b2 = wb.ready();
    drop(a2);
    assert_eq!(
        s.in_flight("all").unwrap(),
        (1, 0),
        "slots are counted, not bytes"
    );
    assert_eq!(s.in_flight("b").unwrap(), (1, 0));
    drop(b2);
}

#[test]
fn counters_count_every_grant_once_across_threads_and_waits() {
    let t = tree(vec![
        WorkloadSpec::new("all").max_concurrent_threads(1 << 20),
        WorkloadSpec::new("q")
            .parent("all")
            .max_concurrent_threads(1 << 20),
    ]);
    let clock = Arc::new(ManualClock::new(0));
    let s = WorkloadScheduler::builder(&t, Resource::CpuSlots)
        .clock(clock.clone())
        .build()
        .unwrap();
    let q = s.workload("q").unwrap();
    // Lock-free grants from 4 threads at once: each thread adds to its own
    // shard, and the snapshot sums them, none lost.
    std::thread::scope(|sc| {
        for _ in 0..4 {
            sc.spawn(|| {
                for _ in 0..5_000 {
                    let p = q.try_acquire(1).unwrap().expect("a slot");
                    assert!(!p.waited());
                }
            });
        }
    });
    for name in ["all", "q"] {
        let c = s.counters_of(name).unwrap();
        assert_eq!((c.requests, c.bytes), (20_000, 20_000), "{name}");
        assert_eq!(c.wait_histogram[0], 20_000, "{name}: none waited");
        assert!(c.peak_in_flight_requests <= 4, "{name}: one slot a thread");
        assert_eq!(c.in_flight_requests, 0, "{name}");
    }
    // A grant after a wait of 3 µs lands in its bucket (below 4 µs) beside
    // the shards' count.
    s.update(&tree(vec![
        WorkloadSpec::new("all").max_concurrent_threads(1),
        WorkloadSpec::new("q")
            .parent("all")
            .max_concurrent_threads(1 << 20),
    ]))
    .unwrap();
    let held = q.try_acquire(1).unwrap().expect("the one slot");
    let mut w = Waiter::new(q.request(1)).queue();
    clock.advance(3_000);
    drop(held);
    let p = w.ready();
    assert!(p.waited());
    for name in ["all", "q"] {
        let c = s.counters_of(name).unwrap();
        assert_eq!((c.requests, c.bytes), (20_002, 20_002), "{name}");
        assert_eq!(c.wait_histogram[0], 20_001, "{name}");
        assert_eq!(c.wait_histogram[2], 1, "{name}: 3 µs < 4 µs");
    }
}

#[test]
fn a_blocking_acquire_waits_for_the_completion() {
    let t = tree(vec![
        WorkloadSpec::new("all").max_io_requests(1),
        WorkloadSpec::new("q").parent("all"),
    ]);
    let s = WorkloadScheduler::new(&t, Resource::Io).unwrap();
    let q = s.workload("q").unwrap();
    let held = q.acquire(1).unwrap();
    let q2 = q.clone();
    let h = std::thread::spawn(move || q2.acquire(1).map(|p| p.waited()));
    while s.queued() == 0 {
        std::thread::yield_now();
    }
    drop(held);
    assert!(h.join().unwrap().unwrap(), "it queued, then got the place");
}

// Live changes.

#[test]
fn a_live_change_of_weights_and_caps_keeps_queued_requests_and_charges() {
    let specs = |wa: u32, rate: u64| {
        vec![
            WorkloadSpec::new("all").max_bytes_per_second(rate),
            WorkloadSpec::new("a").parent("all").weight(wa),
            WorkloadSpec::new("b").parent("all"),
        ]
    };
    let clock = Arc::new(ManualClock::new(0));
    let s = sched(&tree(specs(1, 1000)), &clock, Duration::ZERO);
    let (a, b) = (s.workload("a").unwrap(), s.workload("b").unwrap());
    let _ = a.try_acquire(1200).unwrap().unwrap();
    let mut wa = Waiter::new(a.request(100)).queue();
    let mut wb = Waiter::new(b.request(100)).queue();
    // Halve the rate, same one-second burst: the 200 bytes of debt stay and
    // now take 400 ms.
    s.update(&tree(specs(5, 500))).unwrap();
    assert_eq!(s.cap_tokens_nano("all").unwrap(), Some(tok(-200)));
    assert_eq!(s.queued(), 2);
    clock.advance(399 * MS);
    assert!(wa.poll().is_pending() && wb.poll().is_pending());
    clock.advance(MS);
    let ready = [wa.poll().is_ready(), wb.poll().is_ready()];
    assert_eq!(
        ready,
        [true, false],
        "one request per debt; a first (weight 5)"
    );
    // A new burst duration: a new bucket with the same debt.
    s.update(&tree(vec![
        WorkloadSpec::new("all")
            .max_bytes_per_second(500)
            .max_burst_bytes(100),
        WorkloadSpec::new("a").parent("all"),
        WorkloadSpec::new("b").parent("all"),
    ]))
    .unwrap();
    assert_eq!(s.cap_tokens_nano("all").unwrap(), Some(tok(-100)));
    assert_eq!(s.queued(), 1);
}

#[test]
fn removing_a_busy_workload_is_refused_and_changes_nothing() {
    let t = tree(vec![
        WorkloadSpec::new("all").max_io_requests(1),
        WorkloadSpec::new("a").parent("all"),
        WorkloadSpec::new("b").parent("all"),
    ]);
    let s = sched(&t, &Arc::new(ManualClock::new(0)), Duration::ZERO);
    let a = s.workload("a").unwrap();
    let held = a.try_acquire(1).unwrap().unwrap();
    let mut w = Waiter::new(a.request(1)).queue();
    let without_a = tree(vec![
        WorkloadSpec::new("all").max_io_requests(1),
        WorkloadSpec::new("b").parent("all"),
    ]);
    assert_eq!(
        s.update(&without_a),
        Err(WorkloadError::Busy {
            node: "a".into(),
            queued: 1,
            change: "removing it"
        })
    );
    assert_eq!(s.tree(), t, "nothing changed");
    let with_child = tree(vec![
        WorkloadSpec::new("all").max_io_requests(1),
        WorkloadSpec::new("a").parent("all"),
        WorkloadSpec::new("a1").parent("a"),
        WorkloadSpec::new("b").parent("all"),
    ]);
    assert!(matches!(
        s.update(&with_child),
        Err(WorkloadError::Busy {
            change: "giving it children",
            ..
        })
    ));
    drop(held);
    let p = w.ready();
    // Idle now (one in flight): removal drains; new requests are refused.
    s.update(&without_a).unwrap();
    assert_eq!(
        a.try_acquire(1).unwrap_err(),
        WorkloadError::Removed { node: "a".into() }
    );
    assert!(matches!(
        a.request(1).poll(&mut Context::from_waker(Waker::noop())),
        Poll::Ready(Err(WorkloadError::Removed { .. }))
    ));
    let b = s.workload("b").unwrap();
    assert!(
        b.try_acquire(1).unwrap().is_none(),
        "a's request still holds the root"
    );
    drop(p);
    assert!(
        b.try_acquire(1).unwrap().is_some(),
        "its completion gave the place back"
    );
}

#[test]
fn a_live_change_cannot_move_a_workload() {
    let t = tree(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("x").parent("all"),
        WorkloadSpec::new("q").parent("all"),
    ]);
    let s = sched(&t, &Arc::new(ManualClock::new(0)), Duration::ZERO);
    let moved = tree(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("x").parent("all"),
        WorkloadSpec::new("q").parent("x"),
    ]);
    assert_eq!(
        s.update(&moved),
        Err(WorkloadError::Reparent {
            node: "q".into(),
            from: "all".into(),
            to: "x".into()
        })
    );
}

// Rejections: each names the workload and the value.

fn rejects(specs: Vec<WorkloadSpec>) -> WorkloadError {
    WorkloadTree::new(specs).expect_err("must be refused")
}

#[test]
fn a_cycle_is_refused() {
    let e = rejects(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("a").parent("b"),
        WorkloadSpec::new("b").parent("a"),
    ]);
    assert!(
        matches!(&e, WorkloadError::Cycle { cycle, .. } if cycle.len() == 3),
        "{e:?}"
    );
    assert!(e.to_string().contains("a -> b -> a") || e.to_string().contains("b -> a -> b"));
    let selfish = rejects(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("s").parent("s"),
    ]);
    assert_eq!(
        selfish,
        WorkloadError::Cycle {
            node: "s".into(),
            cycle: vec!["s".into(), "s".into()]
        }
    );
}

#[test]
fn an_unknown_parent_is_refused() {
    assert_eq!(
        rejects(vec![
            WorkloadSpec::new("all"),
            WorkloadSpec::new("q").parent("nope")
        ]),
        WorkloadError::UnknownParent {
            node: "q".into(),
            parent: "nope".into()
        }
    );
}

#[test]
fn a_weight_of_zero_or_too_large_is_refused() {
    for w in [0, slotring_throttle::WORKLOAD_MAX_WEIGHT + 1] {
        assert_eq!(
            rejects(vec![
                WorkloadSpec::new("all"),
                WorkloadSpec::new("q").parent("all").weight(w)
            ]),
            WorkloadError::Weight {
                node: "q".into(),
                weight: w,
                max: slotring_throttle::WORKLOAD_MAX_WEIGHT
            }
        );
    }
}

#[test]
fn a_cap_of_zero_is_refused_for_every_setting() {
    type Set = fn(WorkloadSpec) -> WorkloadSpec;
    let cases: [(&str, Set); 6] = [
        ("max_bytes_per_second", |s| s.max_bytes_per_second(0)),
        ("max_burst_bytes", |s| {
            s.max_bytes_per_second(1).max_burst_bytes(0)
        }),
        ("max_iops", |s| s.max_iops(0)),
        ("max_io_requests", |s| s.max_io_requests(0)),
        ("max_bytes_inflight", |s| s.max_bytes_inflight(0)),
        ("max_concurrent_threads", |s| s.max_concurrent_threads(0)),
    ];
    for (setting, set) in cases {
        let e = rejects(vec![
            WorkloadSpec::new("all"),
            set(WorkloadSpec::new("q").parent("all")),
        ]);
        assert_eq!(
            e,
            WorkloadError::ZeroCap {
                node: "q".into(),
                setting
            }
        );
        assert_eq!(
            e.to_string(),
            format!("workload `q`: {setting} = 0 (leave it out for no limit)")
        );
    }
}

#[test]
fn a_rate_beyond_the_exact_range_is_refused() {
    let too = slotring_throttle::MAX_RATE + 1;
    assert_eq!(
        rejects(vec![WorkloadSpec::new("all").max_iops(too)]),
        WorkloadError::CapTooLarge {
            node: "all".into(),
            setting: "max_iops",
            value: too,
            max: slotring_throttle::MAX_RATE
        }
    );
}

#[test]
fn a_burst_without_a_rate_is_refused() {
    assert_eq!(
        rejects(vec![WorkloadSpec::new("all").max_burst_bytes(5)]),
        WorkloadError::BurstWithoutRate {
            node: "all".into(),
            burst: 5
        }
    );
}

#[test]
fn duplicate_names_are_refused() {
    assert_eq!(
        rejects(vec![
            WorkloadSpec::new("all"),
            WorkloadSpec::new("q").parent("all"),
            WorkloadSpec::new("q").parent("all"),
        ]),
        WorkloadError::Duplicate { node: "q".into() }
    );
    assert_eq!(
        rejects(vec![WorkloadSpec::new("")]),
        WorkloadError::EmptyName
    );
}

#[test]
fn a_priority_out_of_range_is_refused() {
    for p in [i64::MIN, -32_769, 32_768, i64::MAX] {
        assert_eq!(
            rejects(vec![
                WorkloadSpec::new("all"),
                WorkloadSpec::new("q").parent("all").priority(p)
            ]),
            WorkloadError::Priority {
                node: "q".into(),
                priority: p,
                min: -32_768,
                max: 32_767
            }
        );
    }
    assert!(
        WorkloadTree::new(vec![
            WorkloadSpec::new("all"),
            WorkloadSpec::new("lo").parent("all").priority(-32_768),
            WorkloadSpec::new("hi").parent("all").priority(32_767),
        ])
        .is_ok(),
        "the ends of the range are accepted"
    );
}

#[test]
fn a_tree_has_exactly_one_root_and_bounded_depth() {
    assert_eq!(
        rejects(vec![WorkloadSpec::new("a"), WorkloadSpec::new("b")]),
        WorkloadError::MultipleRoots {
            first: "a".into(),
            second: "b".into()
        }
    );
    assert_eq!(rejects(vec![]), WorkloadError::NoRoot);
    let mut chain = vec![WorkloadSpec::new("n0")];
    for i in 1..=slotring_throttle::WORKLOAD_MAX_DEPTH {
        chain.push(WorkloadSpec::new(format!("n{i}")).parent(format!("n{}", i - 1)));
    }
    assert!(matches!(
        rejects(chain),
        WorkloadError::TooDeep {
            depth: 65,
            max: 64,
            ..
        }
    ));
}

#[test]
fn requests_enter_known_leaves_only_and_tau_is_bounded() {
    let t = tree(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("q").parent("all"),
    ]);
    let s = WorkloadScheduler::new(&t, Resource::Io).unwrap();
    assert_eq!(
        s.workload("nope").unwrap_err(),
        WorkloadError::Unknown {
            node: "nope".into()
        }
    );
    assert_eq!(
        s.workload("all").unwrap_err(),
        WorkloadError::NotALeaf { node: "all".into() }
    );
    assert!(matches!(
        WorkloadScheduler::builder(&t, Resource::Io)
            .tau(Duration::from_secs(61))
            .build(),
        Err(WorkloadError::Tau { .. })
    ));
}
