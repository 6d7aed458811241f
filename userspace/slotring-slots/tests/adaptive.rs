//! The adaptive effective budget and `should_yield`, deterministically; the
//! waiter signal `waiting_us` (lower bounds on real waits).

use std::time::Duration;

use slotring_slots::{ConcurrencyControl, Scheduler, UNLIMITED};

#[test]
fn a_shrink_asks_only_the_allocation_above_its_fair_share() {
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(4);
    let big = cc.allocate(0, 3).unwrap();
    let small = cc.allocate(0, 1).unwrap();
    let mut b: Vec<_> = std::iter::from_fn(|| big.try_acquire()).collect();
    let s = small.try_acquire().unwrap();
    assert_eq!(b.len(), 3);
    assert!(b.iter().all(|x| !x.should_yield()), "within the budget");
    cc.set_effective_budget(2);
    assert_eq!(cc.effective_budget(), 2);
    assert_eq!(cc.max_concurrency(), 4, "the user's ceiling is unchanged");
    // Two holders, fair share 1: `small` keeps its one slot; `big` yields 2.
    assert!(!s.should_yield());
    assert!(b[0].should_yield());
    assert!(b[1].should_yield());
    assert!(!b[2].should_yield(), "the excess (2) is already promised");
    b.drain(..2).for_each(drop);
    let c = cc.counters();
    assert_eq!((c.yields, c.cur_concurrency, c.budget_effective), (2, 2, 2));
    assert!(big.is_requesting(), "big wants its slots again");
    assert!(big.try_acquire().is_none(), "but waits for a grant");
    // The budget grows back: big is granted at once.
    cc.set_effective_budget(UNLIMITED);
    assert_eq!(cc.effective_budget(), 4);
    assert_eq!(big.granted(), 2);
    drop((b, s));
}

#[test]
fn never_zero_and_the_static_budget_never_yields() {
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(2);
    cc.set_effective_budget(0);
    assert_eq!(cc.effective_budget(), 1, "0 is clamped to 1");
    cc.set_effective_budget(UNLIMITED);
    let a = cc.allocate(0, 2).unwrap();
    let x = a.try_acquire().unwrap();
    let mut y = a.try_acquire().unwrap();
    // A borrow over the budget is repaid by withholding, not by yields.
    cc.set_scheduler(Scheduler::MaxMinFair);
    assert!(slotring_slots::SlotLease::park(&mut y));
    let b = cc.allocate(0, 1).unwrap();
    let z = b.try_acquire().unwrap();
    slotring_slots::SlotLease::unpark(&mut y);
    assert_eq!(cc.counters().borrowed, 1);
    assert!(![&x, &y, &z].iter().any(|s| s.should_yield()));
    // Non-competing slots never yield.
    cc.set_scheduler(Scheduler::FairRoundRobin);
    let nc = cc.allocate(2, 2).unwrap();
    let n0 = nc.try_acquire().unwrap();
    cc.set_effective_budget(1);
    assert!(!n0.is_competing() && !n0.should_yield());
    drop((x, y, z, n0));
}

/// `checkpoint` answers what `should_yield` answers, and gives the CPU away
/// at most once per `CPU_YIELD_INTERVAL` of checkpoints, and at least once
/// when a checkpoint comes after the interval.
#[test]
fn checkpoint_is_should_yield_plus_a_cpu_yield_per_interval() {
    use slotring_slots::CPU_YIELD_INTERVAL;
    use std::time::Instant;
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(2);
    let a = cc.allocate(0, 2).unwrap();
    let mut s0 = a.try_acquire().unwrap();
    let s1 = a.try_acquire().unwrap();
    let t = Instant::now();
    {
        let lease = s0.make_current();
        assert!(!lease.checkpoint(), "within the budget");
        assert_eq!(lease.cpu_yields(), 0, "not before the first interval");
        while t.elapsed() < 5 * CPU_YIELD_INTERVAL {
            assert!(!lease.checkpoint());
        }
        let elapsed = t.elapsed();
        let bound = (elapsed.as_nanos() / CPU_YIELD_INTERVAL.as_nanos()) as u64;
        let n = lease.cpu_yields();
        assert!((1..=bound).contains(&n), "{n} yields in {elapsed:?}");
        // Checkpoints further apart than the interval (an IO-bound holder)
        // restart it and never yield.
        let before = lease.cpu_yields();
        for _ in 0..3 {
            std::thread::sleep(CPU_YIELD_INTERVAL * 2);
            assert!(!lease.checkpoint());
        }
        assert_eq!(lease.cpu_yields(), before, "gaps longer than the interval");
        cc.set_effective_budget(1);
        assert!(
            lease.checkpoint(),
            "the budget shrank: one of the two yields"
        );
    }
    drop(s1);
}

#[test]
fn waiting_us_accrues_while_acquirers_are_blocked_and_stops_after() {
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(1);
    let holder = cc.allocate(0, 1).unwrap();
    let h = holder.try_acquire().unwrap();
    let a = cc.allocate(0, 1).unwrap();
    let waiting = || cc.counters().waiting_us;
    assert_eq!(waiting(), 0, "nothing blocked yet");
    std::thread::scope(|s| {
        let t = s.spawn(|| a.acquire().map(|s| s.slot_id()));
        let t0 = std::time::Instant::now();
        while waiting() == 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "never blocked");
            std::thread::yield_now();
        }
        // In progress: the wait is counted before it ends (wait_us is not).
        let w0 = waiting();
        std::thread::sleep(Duration::from_millis(20));
        let c = cc.counters();
        assert!(c.waiting_us >= w0 + 20_000, "{} after {w0}", c.waiting_us);
        assert_eq!(c.wait_us, 0, "wait_us is added when the wait ends");
        drop(h);
        assert_eq!(t.join().unwrap(), Ok(0));
    });
    // Ended: it stops growing, and it is the wait that wait_us saw.
    let c = cc.counters();
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(waiting(), c.waiting_us, "no blocked acquirer, no growth");
    assert!(c.waiting_us >= 20_000 && c.waiting_us <= c.wait_us, "{c:?}");
}
