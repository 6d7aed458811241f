//! The adaptive effective budget and `should_yield`, deterministically.

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

#[test]
fn a_running_non_competing_slot_takes_its_room_from_the_effective_budget() {
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(4);
    cc.set_effective_budget(2);
    // Two scans with one slot each fill the effective budget of 2.
    let (s1, s2) = (cc.allocate(0, 1).unwrap(), cc.allocate(0, 1).unwrap());
    let (a, b) = (s1.try_acquire().unwrap(), s2.try_acquire().unwrap());
    s1.set_max(4).unwrap();
    s2.set_max(4).unwrap();
    assert!(s1.try_acquire().is_none() && s2.try_acquire().is_none());
    // A short query's non-competing slot is granted at once and runs: the
    // competing slots get 1, so exactly one scan (the first to reach its
    // checkpoint; with more holders than slots every fair share is 0) yields.
    let short = cc.allocate(1, 1).unwrap();
    let mut q = short.try_acquire().expect("never refused");
    assert!(!q.is_competing());
    assert_eq!(cc.effective_budget(), 2, "the budget itself is unchanged");
    assert!(b.should_yield());
    assert!(!a.should_yield(), "exactly one yield");
    drop(b);
    assert_eq!(cc.counters().yields, 1);
    assert!(
        s2.try_acquire().is_none(),
        "s2 waits while the short query runs"
    );
    // A parked non-competing slot does not count: its room goes back.
    assert!(slotring_slots::SlotLease::park(&mut q));
    let b = s2
        .try_acquire()
        .expect("granted the room of the parked slot");
    slotring_slots::SlotLease::unpark(&mut q);
    assert!(a.should_yield() || b.should_yield());
    drop(a);
    // The short query ends: its room goes back to the waiting scan.
    drop(q);
    drop(short);
    let a = s1
        .try_acquire()
        .expect("granted when the short query ended");
    assert!(!a.should_yield() && !b.should_yield());
    // The static budget keeps ClickHouse's rule: non-competing slots never count.
    cc.set_max_concurrency(2);
    cc.set_effective_budget(UNLIMITED);
    let short = cc.allocate(1, 1).unwrap();
    let q = short.try_acquire().unwrap();
    assert!(!a.should_yield() && !b.should_yield());
    drop((a, b, q));
}
