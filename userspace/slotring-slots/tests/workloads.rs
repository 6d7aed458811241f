//! CPU slots in the workload tree: priorities, weights, `max_concurrent_threads`
//! at every level, parking and borrowing per workload, live changes and the
//! typed errors (see the `workloads` module docs).

use slotring_slots::{
    AcquiredSlot, Allocation, ConcurrencyControl, Scheduler, SlotLease, SlotsError, WorkloadSlots,
};
use slotring_throttle::{WorkloadSpec, WorkloadTree};

fn tree(specs: Vec<WorkloadSpec>) -> WorkloadTree {
    WorkloadTree::new(specs).unwrap()
}

fn node(cc: &ConcurrencyControl, name: &str) -> WorkloadSlots {
    cc.workloads()
        .into_iter()
        .find(|w| w.name == name)
        .unwrap_or_else(|| panic!("no workload {name}"))
}

/// Every node holds what its limit allows, borrows aside.
fn assert_within_limits(cc: &ConcurrencyControl) {
    for w in cc.workloads() {
        let max = w.max_concurrent_threads.unwrap_or(u64::MAX);
        assert!(w.held - w.borrowed <= max, "{w:?}");
    }
}

/// `all` over workloads of no settings, each `(name, parent)`.
fn named(edges: &[(&str, &str)]) -> WorkloadTree {
    let mut specs = vec![WorkloadSpec::new("all")];
    specs.extend(edges.iter().map(|(n, p)| WorkloadSpec::new(*n).parent(*p)));
    tree(specs)
}

/// The refusal of a change that removes `etl` while it has `allocations`
/// and `slots`.
fn removing_busy_etl(allocations: u64, slots: u64) -> Result<(), SlotsError> {
    Err(SlotsError::WorkloadBusy {
        workload: "etl".into(),
        allocations,
        slots,
        change: "removing it",
    })
}

/// `all` over the one leaf `x`, whose max_concurrent_threads is `m`.
fn x_capped(m: u64) -> WorkloadTree {
    tree(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("x")
            .parent("all")
            .max_concurrent_threads(m),
    ])
}

/// `all` (budget-wide) with `hi` at priority 0 and `lo` at priority 1.
fn two_priorities() -> WorkloadTree {
    tree(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("hi").parent("all").priority(0),
        WorkloadSpec::new("lo").parent("all").priority(1),
    ])
}

#[test]
fn priority_zero_beats_one_on_every_freed_slot() {
    let cc = ConcurrencyControl::with_workloads(&two_priorities());
    cc.set_max_concurrency(1);
    let holder = cc.allocate_in("lo", 0, 1).unwrap();
    let mut slot = holder.try_acquire().unwrap();
    // The low-priority waiter queues first: priority, not arrival, decides.
    let lo = cc.allocate_in("lo", 0, 10).unwrap();
    let hi = cc.allocate_in("hi", 0, 3).unwrap();
    for _ in 0..3 {
        drop(slot);
        assert!(
            lo.try_acquire().is_none(),
            "a freed slot went to priority 1"
        );
        slot = hi.try_acquire().expect("priority 0 takes the freed slot");
    }
    assert!(!hi.is_requesting());
    drop(slot);
    let _lo_slot = lo.try_acquire().expect("priority 1 once 0 wants nothing");
    assert_eq!(node(&cc, "hi").grants, 3);
    assert_eq!(node(&cc, "lo").grants, 2, "the holder's slot and one more");
}

#[test]
fn weights_two_to_one_give_two_to_one_grants_over_a_backlog() {
    let cc = ConcurrencyControl::with_workloads(&tree(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("a").parent("all").weight(2),
        WorkloadSpec::new("b").parent("all").weight(1),
    ]));
    cc.set_max_concurrency(1);
    let a = cc.allocate_in("a", 0, 1000).unwrap();
    let b = cc.allocate_in("b", 0, 1000).unwrap();
    let mut slot = a.try_acquire().expect("the first slot");
    let mut order = String::new();
    for _ in 0..300 {
        drop(slot);
        slot = match (a.try_acquire(), b.try_acquire()) {
            (Some(s), None) => {
                order.push('a');
                s
            }
            (None, Some(s)) => {
                order.push('b');
                s
            }
            other => panic!("one freed slot, one grant: {other:?}"),
        };
    }
    assert_eq!(order.matches('a').count(), 200, "{order}");
    assert_eq!(order.matches('b').count(), 100, "{order}");
    // 2:1 in every window of three grants, not only on average.
    for w in order.as_bytes().chunks(3) {
        assert_eq!(w.iter().filter(|&&c| c == b'b').count(), 1, "{order}");
    }
}

#[test]
fn max_concurrent_threads_caps_a_leaf_and_a_parent() {
    let cc = ConcurrencyControl::with_workloads(&tree(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("batch")
            .parent("all")
            .max_concurrent_threads(3),
        WorkloadSpec::new("x")
            .parent("batch")
            .max_concurrent_threads(2),
        WorkloadSpec::new("y").parent("batch"),
        WorkloadSpec::new("user").parent("all"),
    ]));
    let x = cc.allocate_in("x", 0, 10).unwrap();
    let xs: Vec<AcquiredSlot> = std::iter::from_fn(|| x.try_acquire()).collect();
    assert_eq!(xs.len(), 2, "x's own limit, with the budget unlimited");
    let y = cc.allocate_in("y", 0, 10).unwrap();
    let ys: Vec<AcquiredSlot> = std::iter::from_fn(|| y.try_acquire()).collect();
    assert_eq!(ys.len(), 1, "batch's limit of 3 leaves y one slot");
    let user = cc.allocate_in("user", 0, 5).unwrap();
    assert_eq!(user.granted(), 5, "a sibling of batch is not capped by it");
    assert_eq!(node(&cc, "batch").held, 3);
    assert_eq!(node(&cc, "all").held, 8);
    assert!(x.is_requesting() && y.is_requesting());
    // A freed slot under batch goes back under batch, to y (x is at its own
    // limit after the next grant too) or x; never beyond 3.
    drop(xs);
    assert_eq!(x.granted() + y.granted(), 2, "two places freed under batch");
    assert_eq!(node(&cc, "batch").held, 3);
    assert_within_limits(&cc);
    drop(ys);
    assert_within_limits(&cc);
}

#[test]
fn a_parked_slot_stops_counting_and_an_unpark_borrows_then_repays() {
    let cc = ConcurrencyControl::with_workloads(&x_capped(1));
    let first = cc.allocate_in("x", 0, 1).unwrap();
    let mut s1 = first.try_acquire().unwrap();
    let waiter = cc.allocate_in("x", 0, 2).unwrap();
    assert_eq!(waiter.granted(), 0, "x is full");
    assert!(s1.park());
    // Parked, s1 counts nowhere: its place goes to the waiter at once.
    assert_eq!(node(&cc, "x").held, 1);
    let s2 = waiter.try_acquire().expect("the parked slot's place");
    s1.unpark();
    let x = node(&cc, "x");
    assert_eq!((x.held, x.borrowed, x.borrows), (2, 1, 1), "{x:?}");
    assert_within_limits(&cc);
    // The next release repays the borrow: the waiter wants one more and
    // must not get it.
    drop(s2);
    let x = node(&cc, "x");
    assert_eq!((x.held, x.borrowed), (1, 0), "{x:?}");
    assert_eq!(waiter.granted(), 0, "a release that repays grants nothing");
    drop(s1);
    assert_eq!(waiter.granted(), 1, "the next release frees a place");
}

#[test]
fn the_schedulers_decide_inside_a_workload() {
    let cc = ConcurrencyControl::with_workloads(&x_capped(1));
    cc.set_scheduler(Scheduler::MaxMinFair);
    let a = cc.allocate_in("x", 0, 10).unwrap();
    let mut slot = a.try_acquire().unwrap();
    let b = cc.allocate_in("x", 0, 10).unwrap();
    let c = cc.allocate_in("x", 0, 10).unwrap();
    // max_min_fair: each freed slot to the waiter with the fewest allocated.
    let mut got = Vec::new();
    for _ in 0..4 {
        drop(slot);
        let who: Vec<(usize, AcquiredSlot)> = [&a, &b, &c]
            .iter()
            .enumerate()
            .filter_map(|(i, al)| al.try_acquire().map(|s| (i, s)))
            .collect();
        assert_eq!(who.len(), 1);
        let (i, s) = who.into_iter().next().unwrap();
        got.push(i);
        slot = s;
    }
    assert_eq!(
        got,
        [1, 2, 0, 1],
        "b and c (0 each) before a (1), then FIFO"
    );
}

#[test]
fn live_changes_of_weight_priority_and_max_lose_no_waiter() {
    let specs = |lo_prio: i64, x_max: u64, a_weight: u32| {
        tree(vec![
            WorkloadSpec::new("all"),
            WorkloadSpec::new("x")
                .parent("all")
                .max_concurrent_threads(x_max)
                .weight(a_weight),
            WorkloadSpec::new("lo").parent("all").priority(lo_prio),
        ])
    };
    let cc = ConcurrencyControl::with_workloads(&specs(1, 1, 1));
    cc.set_max_concurrency(2);
    let x: Vec<Allocation> = (0..3).map(|_| cc.allocate_in("x", 0, 1).unwrap()).collect();
    let lo: Vec<Allocation> = (0..3)
        .map(|_| cc.allocate_in("lo", 0, 1).unwrap())
        .collect();
    let granted = |v: &[Allocation]| v.iter().map(Allocation::granted).sum::<u64>();
    assert_eq!((granted(&x), granted(&lo)), (1, 1), "x is capped at 1");
    // Raise x's limit and put lo first: x's granted slot, not acquired
    // yet, is taken back for lo (the preemption of an unacquired grant);
    // every waiter is kept, x's among them again.
    cc.set_workloads(&specs(-1, 3, 4)).unwrap();
    assert_eq!((granted(&x), granted(&lo)), (0, 2), "taken back for lo");
    let waiting = || cc.counters().waiters;
    assert_eq!(waiting(), 4, "every waiter kept");
    assert_eq!(node(&cc, "x").preemptions, 1);
    // Freed slots now go to lo (priority -1) while it waits, then to x.
    let mut held: Vec<AcquiredSlot> = x
        .iter()
        .chain(&lo)
        .filter_map(|a| a.try_acquire())
        .collect();
    assert_eq!(held.len(), 2);
    drop(held.pop());
    assert_eq!((granted(&x), granted(&lo)), (0, 1), "priority changed live");
    drop(held.pop());
    assert_eq!((granted(&x), granted(&lo)), (1, 1), "lo has no waiter left");
    held.extend(lo.iter().filter_map(|a| a.try_acquire()));
    drop(held.drain(..));
    assert_eq!(
        (granted(&x), granted(&lo)),
        (2, 0),
        "x's raised limit lets two through"
    );
    assert_eq!(waiting(), 1, "x's third waits for the budget");
}

#[test]
fn a_raised_max_grants_at_once_and_a_lowered_one_withholds() {
    let cc = ConcurrencyControl::with_workloads(&x_capped(1));
    let a = cc.allocate_in("x", 0, 4).unwrap();
    assert_eq!(a.granted(), 1);
    cc.set_workloads(&x_capped(3)).unwrap();
    assert_eq!(a.granted(), 3, "waiters take the new room at once");
    let slots: Vec<AcquiredSlot> = std::iter::from_fn(|| a.try_acquire()).collect();
    cc.set_workloads(&x_capped(1)).unwrap();
    assert_eq!(node(&cc, "x").held, 3, "a lowered limit takes nothing back");
    drop(slots);
    assert_eq!(a.granted(), 1, "grants resume below the lowered limit");
}

#[test]
fn removing_or_splitting_a_busy_workload_is_a_typed_error_naming_it() {
    let full = named(&[("etl", "all"), ("user", "all")]);
    let without_etl = named(&[("user", "all")]);
    let etl_split = named(&[("etl", "all"), ("etl_a", "etl"), ("user", "all")]);
    let cc = ConcurrencyControl::with_workloads(&full);
    let a = cc.allocate_in("etl", 0, 2).unwrap();
    let slot = a.try_acquire().unwrap();
    assert_eq!(cc.set_workloads(&without_etl), removing_busy_etl(1, 2));
    assert!(matches!(
        cc.set_workloads(&etl_split),
        Err(SlotsError::WorkloadBusy { ref workload, change: "giving it children", .. }) if workload == "etl"
    ));
    assert_eq!(node(&cc, "etl").held, 2, "a refused change changes nothing");
    drop(a);
    // The allocation is gone but its slot still counts at etl.
    assert_eq!(cc.set_workloads(&without_etl), removing_busy_etl(0, 1));
    drop(slot);
    cc.set_workloads(&without_etl).unwrap();
    assert_eq!(
        cc.workloads()
            .iter()
            .map(|w| w.name.as_str())
            .collect::<Vec<_>>(),
        ["all", "user"]
    );
}

#[test]
fn unknown_or_inner_workloads_and_missing_trees_are_typed_errors() {
    let cc = ConcurrencyControl::with_workloads(&two_priorities());
    assert_eq!(
        cc.allocate_in("etl", 0, 1).unwrap_err(),
        SlotsError::UnknownWorkload {
            workload: "etl".into()
        }
    );
    assert_eq!(
        cc.allocate_in("all", 0, 1).unwrap_err(),
        SlotsError::WorkloadNotALeaf {
            workload: "all".into()
        }
    );
    assert_eq!(cc.allocate(0, 1).unwrap_err(), SlotsError::WorkloadRequired);
    assert_eq!(cc.counters().allocations, 0, "nothing was allocated");
    let a = cc.allocate_in("hi", 0, 1).unwrap();
    assert_eq!(a.workload(), Some("hi"));

    let plain = ConcurrencyControl::new();
    assert_eq!(
        plain.allocate_in("hi", 0, 1).unwrap_err(),
        SlotsError::NoWorkloadTree {
            workload: "hi".into()
        }
    );
    let unclassified = plain.allocate(0, 1).unwrap();
    assert_eq!(unclassified.workload(), None);
    assert_eq!(
        plain.set_workloads(&two_priorities()),
        Err(SlotsError::Unclassified { allocations: 1 })
    );
    drop(unclassified);
    plain.set_workloads(&two_priorities()).unwrap();
    assert!(plain.allocate_in("lo", 0, 1).is_ok());
}

#[test]
fn a_parked_slot_keeps_its_workload_and_a_move_is_a_typed_error() {
    let two = named(&[("batch", "all"), ("etl", "batch"), ("user", "all")]);
    let cc = ConcurrencyControl::with_workloads(&two);
    let a = cc.allocate_in("etl", 0, 1).unwrap();
    let mut slot = a.try_acquire().unwrap();
    assert!(slot.park());
    drop(a);
    let without_etl = named(&[("batch", "all"), ("user", "all")]);
    // Nothing counts at etl, but its parked slot will again.
    assert_eq!(cc.set_workloads(&without_etl), removing_busy_etl(0, 1));
    let moved = named(&[("batch", "all"), ("user", "all"), ("etl", "user")]);
    assert_eq!(
        cc.set_workloads(&moved),
        Err(SlotsError::WorkloadMoved {
            workload: "etl".into(),
            from: "batch".into(),
            to: "user".into(),
        })
    );
    slot.unpark();
    assert_eq!(node(&cc, "batch").held, 1, "counted on its path again");
    drop(slot);
    assert_eq!(node(&cc, "batch").held, 0);
    cc.set_workloads(&without_etl).unwrap();
}

#[test]
fn a_borrow_repaid_by_a_lock_free_release_stays_repaid_when_the_limit_drops() {
    let cc = ConcurrencyControl::with_workloads(&x_capped(2));
    let a = cc.allocate_in("x", 0, 2).unwrap();
    let mut s0 = a.try_acquire().unwrap();
    let s1 = a.try_acquire().unwrap();
    assert!(s0.park());
    let b = cc.allocate_in("x", 0, 1).unwrap();
    let sb = b.try_acquire().expect("the parked place");
    s0.unpark();
    let x = node(&cc, "x");
    assert_eq!((x.held, x.borrowed), (3, 1));
    // Nothing queues and `a` keeps s0: this release takes no lock, and
    // repays the borrow by lowering the overshoot.
    drop(s1);
    assert_eq!(cc.counters().waiters, 0);
    let x = node(&cc, "x");
    assert_eq!((x.held, x.borrowed), (2, 0));
    // A lower limit raises the overshoot; the repaid borrow stays repaid.
    cc.set_workloads(&x_capped(1)).unwrap();
    let x = node(&cc, "x");
    assert_eq!((x.held, x.borrowed), (2, 0), "{x:?}");
    drop((s0, sb));
}

#[test]
fn slot_time_counts_unparked_slots_at_their_leaf_and_every_ancestor() {
    use std::time::{Duration, Instant};
    let cc = ConcurrencyControl::with_workloads(&tree(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("etl").parent("all"),
        WorkloadSpec::new("q").parent("etl"),
        WorkloadSpec::new("idle").parent("all"),
    ]));
    let ns = |cc: &ConcurrencyControl, w: &str| Duration::from_nanos(node(cc, w).slot_ns);
    let a = cc.allocate_in("q", 0, 1).unwrap();
    // Held 30 ms: at least that, once released (not before).
    let slot = a.try_acquire().unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(ns(&cc, "q"), Duration::ZERO, "added at the release");
    drop(slot);
    let held = ns(&cc, "q");
    assert!(held >= Duration::from_millis(30), "{held:?}");
    assert_eq!((ns(&cc, "etl"), ns(&cc, "all")), (held, held));
    assert_eq!(ns(&cc, "idle"), Duration::ZERO);
    drop(a);

    // Parked 100 ms: that time is not counted. Everything counted lies
    // between the acquire and the release, outside the park.
    let a = cc.allocate_in("q", 0, 1).unwrap();
    let start = Instant::now();
    let mut slot = a.try_acquire().unwrap();
    assert!(slot.park());
    std::thread::sleep(Duration::from_millis(100));
    slot.unpark();
    drop(slot);
    let counted = ns(&cc, "q") - held;
    assert!(
        counted <= start.elapsed() - Duration::from_millis(100),
        "{counted:?} counted with 100 ms parked of {:?}",
        start.elapsed()
    );
}
