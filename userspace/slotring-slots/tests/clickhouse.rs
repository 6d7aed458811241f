//! ClickHouse's `ConcurrencyControl` test scenarios (gtest_concurrency_control
//! and the contracts documented in `src/Common/ISlotControl.h`), rewritten for
//! every scheduler they apply to.

use std::collections::VecDeque;
use std::time::Duration;

use slotring_slots::{
    AcquiredSlot, Allocation, ConcurrencyControl, GrantedAllocation, Scheduler, SlotAllocation,
    SlotsError, UNLIMITED,
};

use Scheduler::{FairRoundRobin as Frr, MaxMinFair as Mmf, RoundRobin as Rr};

fn cc(limit: u64, s: Scheduler) -> ConcurrencyControl {
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(limit);
    cc.set_scheduler(s);
    cc
}

fn drain(a: &Allocation) -> Vec<AcquiredSlot> {
    std::iter::from_fn(|| a.try_acquire()).collect()
}

fn ids(v: &[AcquiredSlot]) -> Vec<u64> {
    v.iter().map(AcquiredSlot::slot_id).collect()
}

/// Nothing held: the budget is whole and nobody waits.
fn assert_idle(cc: &ConcurrencyControl) {
    let c = cc.counters();
    assert_eq!(
        (
            c.cur_concurrency,
            c.waiters,
            c.allocations,
            c.parked,
            c.borrowed
        ),
        (0, 0, 0, 0, 0),
        "{c:?}"
    );
}

#[test]
fn defaults() {
    let cc = ConcurrencyControl::new();
    assert_eq!(cc.max_concurrency(), UNLIMITED);
    assert_eq!(cc.scheduler(), Mmf);
    assert_eq!(cc.fair_share(), UNLIMITED);
    assert_eq!(cc.counters().max_concurrency, u64::MAX);
    cc.set_max_concurrency(0);
    assert_eq!(cc.max_concurrency(), 1, "0 is clamped to 1");
    cc.set_max_concurrency(UNLIMITED);
    assert_eq!(cc.max_concurrency(), UNLIMITED);
    assert!(std::ptr::eq(
        ConcurrencyControl::global(),
        ConcurrencyControl::global()
    ));
}

#[test]
fn scheduler_names() {
    for s in Scheduler::ALL {
        assert_eq!(s.name().parse::<Scheduler>().unwrap(), s);
        assert_eq!(s.to_string(), s.name());
    }
    let err = "fifo".parse::<Scheduler>().unwrap_err();
    assert_eq!(
        err,
        SlotsError::UnknownScheduler {
            value: "fifo".into()
        }
    );
    assert!(err.to_string().contains("`fifo`"), "{err}");
}

#[test]
fn max_concurrency_from_settings_as_clickhouse() {
    let f = ConcurrencyControl::max_concurrency_from_settings;
    assert_eq!(f(0, 2, 16), 32, "default: twice the cores");
    assert_eq!(f(10, 2, 16), 10, "the smaller wins");
    assert_eq!(f(100, 2, 16), 32);
    assert_eq!(f(0, 0, 16), UNLIMITED, "both zero: unlimited");
    assert_eq!(f(7, 0, 16), 7);
    assert_eq!(f(0, 2, 0), UNLIMITED, "ratio × 0 cores is ignored");
    assert_eq!(
        f(0, u64::MAX, 2),
        UNLIMITED,
        "saturating product equals unlimited: ignored"
    );
}

#[test]
fn fair_share() {
    let cc = cc(32, Mmf);
    let held: Vec<_> = (0..7).map(|_| cc.allocate(0, 1).unwrap()).collect();
    assert_eq!(cc.fair_share(), 4, "32 / (7 + 1)");
    drop(held);
    assert_eq!(cc.fair_share(), 32);
    cc.set_max_concurrency(2);
    let held: Vec<_> = (0..10).map(|_| cc.allocate(0, 1).unwrap()).collect();
    assert_eq!(cc.fair_share(), 1, "never below 1");
    drop(held);
}

#[test]
fn min_above_max_is_a_typed_error() {
    let cc = cc(10, Rr);
    assert_eq!(
        cc.allocate(3, 2).unwrap_err(),
        SlotsError::MinAboveMax { min: 3, max: 2 }
    );
    assert_idle(&cc);
}

#[test]
fn unlimited() {
    for s in Scheduler::ALL {
        let cc = cc(UNLIMITED, s);
        let a = cc.allocate(0, 100_500).unwrap();
        let acquired = drain(&a);
        assert_eq!(acquired.len(), 100_500, "{s}");
        assert_eq!(acquired.last().unwrap().slot_id(), 100_499);
        assert!(!a.is_requesting());
    }
}

#[test]
fn fifo() {
    for s in Scheduler::ALL {
        let cc = cc(1, s);
        let allocations: Vec<_> = (0..42).map(|_| cc.allocate(0, 1).unwrap()).collect();
        for i in 0..42 {
            let mut holder = None;
            for (j, a) in allocations.iter().enumerate() {
                let slot = a.try_acquire();
                if i == j {
                    holder = Some(slot.expect("fifo order"));
                } else {
                    assert!(slot.is_none(), "{s}: allocation {j} granted in round {i}");
                }
            }
            drop(holder); // the next allocation gets it
        }
        drop(allocations);
        assert_idle(&cc);
    }
}

#[test]
fn round_robin_oversubscribes() {
    let cc = cc(10, Rr);
    let allocations: Vec<_> = (0..10).map(|_| cc.allocate(1, 2).unwrap()).collect();
    let mut slots = vec![];
    for a in &allocations[..5] {
        slots.extend(drain(a));
    }
    assert_eq!(
        ids(&slots),
        [0, 1, 0, 1, 0, 1, 0, 1, 0, 1],
        "normal: two slots each"
    );
    for a in &allocations[5..] {
        slots.extend(drain(a));
        assert_eq!(a.granted(), 0, "oversubscription: only min");
    }
    assert_eq!(slots.len(), 15);
    assert_eq!(
        cc.counters().cur_concurrency,
        15,
        "min slots count: 15 > 10"
    );
}

#[test]
fn fair_schedulers_never_oversubscribe() {
    for s in [Frr, Mmf] {
        let cc = cc(10, s);
        let allocations: Vec<_> = (0..10).map(|_| cc.allocate(1, 2).unwrap()).collect();
        let held: Vec<Vec<_>> = allocations.iter().map(drain).collect();
        assert!(
            held.iter().all(|h| h.len() == 2),
            "{s}: min is free, the second fits"
        );
        assert_eq!(cc.counters().cur_concurrency, 10);
        drop(held);

        let cc = self::cc(5, s);
        let allocations: Vec<_> = (0..10).map(|_| cc.allocate(1, 2).unwrap()).collect();
        let held: Vec<Vec<_>> = allocations.iter().map(drain).collect();
        let sizes: Vec<_> = held.iter().map(Vec::len).collect();
        assert_eq!(sizes, [2, 2, 2, 2, 2, 1, 1, 1, 1, 1], "{s}");
        let c = cc.counters();
        assert_eq!(c.cur_concurrency, 5, "{s}: the budget is never exceeded");
        assert_eq!(c.slots_acquired_non_competing, 10);
        assert_eq!(c.slots_acquired, 5);
    }
}

#[test]
fn release_unacquired_slots() {
    for s in Scheduler::ALL {
        let cc = cc(10, s);
        {
            let _allocations: Vec<_> = (0..10).map(|_| cc.allocate(1, 2).unwrap()).collect();
        }
        assert_idle(&cc);
        let a = cc.allocate(0, 20).unwrap();
        assert_eq!(drain(&a).len(), 10, "{s}");
    }
}

#[test]
fn destroy_not_fully_allocated_allocation() {
    for (s, expect) in [(Rr, 10), (Frr, 15), (Mmf, 15)] {
        let cc = cc(10, s);
        for _ in 0..3 {
            let a = cc.allocate(5, 20).unwrap();
            let acquired = drain(&a);
            assert_eq!(acquired.len(), expect, "{s}: min + the budget");
            assert!(a.is_requesting());
        }
        assert_idle(&cc);
    }
}

#[test]
fn destroy_allocation_before_slots() {
    for (s, expect) in [(Rr, 10), (Frr, 15), (Mmf, 15)] {
        let cc = cc(10, s);
        for _ in 0..3 {
            let a = cc.allocate(5, 20).unwrap();
            let acquired = drain(&a);
            assert_eq!(acquired.len(), expect, "{s}");
            drop(a); // the slots outlive it
            assert_eq!(cc.counters().cur_concurrency, 10);
            assert_eq!(cc.counters().allocations, 0);
            drop(acquired);
            assert_idle(&cc);
        }
    }
}

#[test]
fn released_slots_are_granted_back_to_the_same_allocation() {
    for s in Scheduler::ALL {
        let cc = cc(3, s);
        let a = cc.allocate(0, 10).unwrap();
        let mut acquired: VecDeque<_> = drain(&a).into();
        assert_eq!(ids(acquired.make_contiguous()), [0, 1, 2]);
        acquired.clear();
        acquired.extend(drain(&a));
        assert_eq!(ids(acquired.make_contiguous()), [3, 4, 5]);
        acquired.pop_back();
        acquired.extend(drain(&a));
        assert_eq!(ids(acquired.make_contiguous()), [3, 4, 6]);
        acquired.pop_front();
        acquired.extend(drain(&a));
        assert_eq!(ids(acquired.make_contiguous()), [4, 6, 7]);
        acquired.clear();
        acquired.extend(drain(&a));
        assert_eq!(
            ids(acquired.make_contiguous()),
            [8, 9],
            "{s}: max is a lifetime total"
        );
        assert!(!a.is_requesting());
    }
}

#[test]
fn fair_granting_alternates() {
    for s in Scheduler::ALL {
        let cc = cc(3, s);
        // Occupy the whole budget (min counts only under round robin).
        let busy = if s == Rr {
            cc.allocate(3, 3)
        } else {
            cc.allocate(0, 3)
        }
        .unwrap();
        let a = [0; 3].map(|_| cc.allocate(0, 10).unwrap());
        assert!(a.iter().all(|a| a.granted() == 0));
        drop(busy);
        for round in 0..10 {
            let _held: Vec<_> = a
                .iter()
                .map(|a| {
                    let slot = a
                        .try_acquire()
                        .unwrap_or_else(|| panic!("{s} round {round}"));
                    assert!(
                        a.try_acquire().is_none(),
                        "{s} round {round}: exactly one each"
                    );
                    slot
                })
                .collect();
        }
    }
}

#[test]
fn live_set_max_concurrency() {
    for (s, expect) in [(Rr, 10), (Frr, 15), (Mmf, 15)] {
        let cc = cc(10, s);
        let a = cc.allocate(5, 30).unwrap();
        let mut acquired = drain(&a);
        assert_eq!(acquired.len(), expect, "{s}");
        cc.set_max_concurrency(15);
        acquired.extend(drain(&a));
        assert_eq!(
            acquired.len(),
            expect + 5,
            "{s}: new capacity is granted at once"
        );
        cc.set_max_concurrency(5);
        acquired.clear();
        acquired.extend(drain(&a));
        assert_eq!(acquired.len(), 5, "{s}");
    }
}

#[test]
fn new_capacity_split_equally_under_round_robin() {
    for s in [Rr, Frr] {
        let cc = cc(5, s);
        let a = cc.allocate(0, 30).unwrap();
        let mut held = drain(&a);
        assert_eq!(held.len(), 5);
        let b = cc.allocate(0, 30).unwrap();
        assert!(a.try_acquire().is_none());
        cc.set_max_concurrency(15); // 10 new slots: 5 and 5
        let more_a = drain(&a);
        let more_b = drain(&b);
        assert_eq!((more_a.len(), more_b.len()), (5, 5), "{s}");
        held.clear();
    }
}

#[test]
fn new_capacity_goes_to_the_fewest_under_max_min_fair() {
    let cc = cc(5, Mmf);
    let a = cc.allocate(0, 30).unwrap();
    let _held = drain(&a);
    let b = cc.allocate(0, 30).unwrap();
    cc.set_max_concurrency(15); // b has 0, a has 5: b gets 5 first, then they alternate
    let more_a = drain(&a);
    let more_b = drain(&b);
    assert_eq!(
        (more_a.len(), more_b.len()),
        (3, 7),
        "a wins ties: it came first"
    );
}

#[test]
fn max_min_fair_prioritises_the_minimum() {
    let cc = cc(4, Mmf);
    let long = cc.allocate(0, 16).unwrap();
    let mut long_slots = drain(&long);
    assert_eq!(long_slots.len(), 4);
    let short = cc.allocate(0, 2).unwrap();
    let later = cc.allocate(0, 2).unwrap();
    long_slots.pop();
    assert_eq!(
        short.granted(),
        1,
        "the released slot goes to a query with 0"
    );
    long_slots.pop();
    assert_eq!(
        later.granted(),
        1,
        "FIFO among equals: then the later one with 0"
    );
    long_slots.pop();
    assert_eq!(
        (short.granted(), later.granted(), long.granted()),
        (2, 1, 0)
    );
    long_slots.pop();
    assert_eq!(
        (short.granted(), later.granted(), long.granted()),
        (2, 2, 0)
    );
    drop(short);
    drop(later);
    assert_eq!(long.granted(), 4, "the long query gets the budget back");

    // Round robin, same story: the long query keeps its turn in the rotation.
    let cc = self::cc(4, Rr);
    let long = cc.allocate(0, 16).unwrap();
    let mut long_slots = drain(&long);
    let short = cc.allocate(0, 2).unwrap();
    long_slots.pop();
    long_slots.pop();
    assert_eq!(
        (short.granted(), long.granted()),
        (1, 1),
        "rotation, not minimum"
    );
}

#[test]
fn allocate_one_one_does_not_hoard() {
    for s in [Frr, Mmf] {
        let cc = cc(2, s);
        let small: Vec<_> = (0..10).map(|_| cc.allocate(1, 1).unwrap()).collect();
        let held: Vec<_> = small.iter().map(|a| a.try_acquire().unwrap()).collect();
        assert!(held.iter().all(|s| !s.is_competing()));
        assert!(small.iter().all(|a| !a.is_requesting()));
        assert_eq!(cc.counters().cur_concurrency, 0, "{s}");
        let big = cc.allocate(0, 2).unwrap();
        assert_eq!(drain(&big).len(), 2, "{s}: the whole budget is still there");
    }
    let cc = cc(2, Rr);
    let small: Vec<_> = (0..10).map(|_| cc.allocate(1, 1).unwrap()).collect();
    assert_eq!(
        cc.counters().cur_concurrency,
        10,
        "round robin: min slots count"
    );
    let big = cc.allocate(0, 2).unwrap();
    assert_eq!(big.granted(), 0);
    drop(small);
    assert_eq!(big.granted(), 2);
}

#[test]
fn allocate_one_n_drains_n() {
    for s in Scheduler::ALL {
        let cc = cc(64, s);
        let a = cc.allocate(1, 16).unwrap();
        let slots = drain(&a);
        assert_eq!(ids(&slots), (0..16).collect::<Vec<_>>(), "{s}");
        assert!(!a.is_requesting());
    }
}

#[test]
fn set_max_grow_from_saturated_triggers_grants() {
    for s in Scheduler::ALL {
        let cc = cc(10, s);
        let a = cc.allocate(0, 2).unwrap();
        assert_eq!(a.granted(), 2);
        assert!(!a.is_requesting(), "{s}: saturated");
        a.set_max(5).unwrap();
        assert_eq!(a.granted(), 5, "{s}: grow re-inserts and schedules at once");
        assert!(!a.is_requesting());
        assert_eq!(cc.counters().slots_delayed, 0, "capacity was free");
    }
}

#[test]
fn set_max_grow_and_shrink() {
    for s in Scheduler::ALL {
        let cc = cc(4, s);
        let a = cc.allocate(0, 10).unwrap();
        let mut held = drain(&a);
        assert_eq!(held.len(), 4);
        let c0 = cc.counters();
        assert_eq!((c0.slots_delayed, c0.queries_delayed), (6, 1), "{s}");
        assert!(a.is_requesting());

        a.set_max(2).unwrap(); // shrink below what is held: nothing reclaimed
        assert!(!a.is_requesting(), "{s}");
        assert_eq!(cc.counters().cur_concurrency, 4);
        let before = cc.counters();
        a.set_max(2).unwrap(); // idempotent
        assert_eq!(cc.counters(), before);
        held.pop();
        assert_eq!(a.granted(), 0, "{s}: shrink stops future grants");
        let b = cc.allocate(0, 1).unwrap();
        assert_eq!(b.granted(), 1, "the freed slot goes elsewhere");

        // Grow again while saturated: baseline max(old 2, allocated 4) = 4.
        a.set_max(6).unwrap();
        let c = cc.counters();
        assert_eq!(
            c.slots_delayed,
            6 + 2,
            "{s}: only the 2 beyond what was allocated"
        );
        assert_eq!(c.queries_delayed, 1, "{s}: never counted twice");
        assert!(a.is_requesting());

        assert_eq!(a.set_max(0).unwrap_err(), SlotsError::ZeroMax);
    }
}

#[test]
fn exact_delayed_counters() {
    for (s, delayed) in [(Rr, 90), (Frr, 89), (Mmf, 89)] {
        let cc = cc(10, s);
        let a = cc.allocate(1, 100).unwrap();
        let c = cc.counters();
        assert_eq!((c.slots_delayed, c.queries_delayed), (delayed, 1), "{s}");
        assert_eq!(
            c.slots_granted, 1,
            "{s}: only `min` is granted unconditionally"
        );
        a.set_max(200).unwrap(); // grow an already-counted allocation while saturated
        let c = cc.counters();
        assert_eq!(
            (c.slots_delayed, c.queries_delayed),
            (delayed + 100, 1),
            "{s}"
        );
        let b = cc.allocate(0, 1).unwrap();
        assert_eq!(
            cc.counters().queries_delayed,
            2,
            "another query hitting the wall"
        );
        drop(b);
        let cc = self::cc(10, s);
        let _fits = cc.allocate(1, 11).unwrap();
        let c = cc.counters();
        assert_eq!(
            (c.slots_delayed, c.queries_delayed),
            (u64::from(s == Rr), u64::from(s == Rr)),
            "{s}: round robin's min takes one of the 10"
        );
    }
}

#[test]
fn granted_allocation_counts_nothing() {
    let cc = cc(1, Mmf);
    let g = GrantedAllocation::new(3);
    let mut slots: Vec<_> = std::iter::from_fn(|| g.try_acquire()).collect();
    assert_eq!(ids(&slots), [0, 1, 2]);
    assert!(g.try_acquire().is_none());
    assert!(!g.is_requesting());
    assert_eq!(
        g.acquire().unwrap_err(),
        SlotsError::Exhausted {
            allocated: 3,
            max: 3
        }
    );
    use slotring_slots::SlotLease;
    assert!(!slots[0].park(), "nothing to park");
    assert_idle(&cc);
    assert_eq!(cc.counters().slots_granted, 0);
}

#[test]
fn set_scheduler_never_strands_a_waiter() {
    let cc = cc(1, Rr);
    let holder = cc.allocate(0, 1).unwrap();
    let h = holder.try_acquire().unwrap();
    let rr = cc.allocate(0, 1).unwrap();
    cc.set_scheduler(Frr);
    let frr = cc.allocate(0, 1).unwrap();
    cc.set_scheduler(Mmf);
    let mmf = cc.allocate(0, 1).unwrap();
    assert_eq!(cc.counters().waiters, 3);
    drop(h);
    let s1 = rr
        .try_acquire()
        .expect("the round robin waiter is served under max_min_fair");
    drop(s1);
    let s2 = frr.try_acquire().expect("then the fair round robin one");
    drop(s2);
    let s3 = mmf.try_acquire().expect("then the max-min fair one");
    drop(s3);
    drop((holder, rr, frr, mmf));
    assert_idle(&cc);
}

#[test]
fn blocking_acquire() {
    let cc = cc(1, Mmf);
    let holder = cc.allocate(0, 1).unwrap();
    let h = holder.try_acquire().unwrap();
    let a = cc.allocate(0, 1).unwrap();
    assert_eq!(
        a.acquire_timeout(Duration::from_millis(5)).unwrap_err(),
        SlotsError::Timeout {
            timeout: Duration::from_millis(5)
        }
    );
    std::thread::scope(|s| {
        let t = s.spawn(|| a.acquire().map(|s| s.slot_id()));
        // Release once the waiter is (very likely) blocked; correct either way.
        std::thread::sleep(Duration::from_millis(5));
        drop(h);
        assert_eq!(t.join().unwrap(), Ok(0));
    });
    assert!(
        cc.counters().wait_us >= 5_000,
        "the timed-out wait lasted at least 5 ms"
    );
    assert_eq!(
        a.acquire().unwrap_err(),
        SlotsError::Exhausted {
            allocated: 1,
            max: 1
        },
        "nothing granted, not requesting: would wait forever"
    );

    // free() from another thread cancels a blocked acquire.
    let c = cc.allocate(0, 1).unwrap();
    let _held_c = c.try_acquire().unwrap();
    let b = cc.allocate(0, 1).unwrap();
    std::thread::scope(|s| {
        let t = s.spawn(|| b.acquire().map(|s| s.slot_id()));
        std::thread::sleep(Duration::from_millis(5));
        b.free();
        assert_eq!(t.join().unwrap(), Err(SlotsError::Freed));
    });
    assert_eq!(b.set_max(3).unwrap_err(), SlotsError::Freed);
    assert!(b.try_acquire().is_none());
    b.free(); // idempotent
}

#[test]
fn free_returns_granted_and_stops_requesting() {
    for s in Scheduler::ALL {
        let cc = cc(4, s);
        let a = cc.allocate(1, 10).unwrap();
        let held = a.try_acquire().unwrap();
        assert!(a.is_requesting());
        a.free();
        assert!(!a.is_requesting());
        assert_eq!(a.granted(), 0);
        let c = cc.counters();
        assert_eq!(c.allocations, 0);
        assert_eq!(c.cur_concurrency, u64::from(held.is_competing()), "{s}");
        drop(held);
        drop(a);
        assert_idle(&cc);
    }
}

/// Liveness watchdog for the lost-wake-up tests below (not a timing
/// assertion: a correct wake-up answers at once; on expiry the test frees the
/// allocation, which cancels the lost wait with `Freed`, and fails).
const WATCHDOG: Duration = Duration::from_secs(30);

/// A blocked `acquire` whose allocation stops requesting (`set_max` shrinks
/// it to what it already has) can never be served: it must wake and return
/// `Exhausted`, under every scheduler (without that wake-up it sleeps
/// forever and `acquire_timeout` reports `Timeout`).
#[test]
fn set_max_shrink_wakes_a_blocked_acquire_with_exhausted() {
    for s in Scheduler::ALL {
        for timed in [false, true] {
            let cc = cc(1, s);
            let holder = cc.allocate(0, 1).unwrap();
            let h = holder.try_acquire();
            let a = cc.allocate(1, 3).unwrap();
            let min = a.try_acquire().expect("the min slot");
            assert!(a.try_acquire().is_none(), "{s}: the budget is full");
            assert!(a.is_requesting(), "{s}");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::scope(|sc| {
                sc.spawn(|| {
                    let r = if timed {
                        // Longer than the watchdog: only a wake-up answers in time.
                        a.acquire_timeout(4 * WATCHDOG)
                    } else {
                        a.acquire()
                    };
                    tx.send(r.map(|s| s.slot_id())).unwrap();
                });
                // Shrink once the acquirer is (very likely) blocked; the
                // answer is the same if it is not yet.
                std::thread::sleep(Duration::from_millis(20));
                a.set_max(1).unwrap();
                assert!(!a.is_requesting(), "{s}");
                let got = rx.recv_timeout(WATCHDOG);
                if got.is_err() {
                    a.free(); // unblock the lost waiter so the scope can end
                }
                assert_eq!(
                    got,
                    Ok(Err(SlotsError::Exhausted {
                        allocated: u64::from(!s.min_is_non_competing()),
                        max: 1
                    })),
                    "{s} (timed: {timed}): the acquirer was not woken by the shrink"
                );
            });
            drop((min, h, a, holder));
            assert_idle(&cc);
        }
    }
}

/// Two acquirers blocked on one allocation that wants one more slot: the
/// grant that saturates it serves one and must wake the other with
/// `Exhausted` (a `notify_one` there leaves it asleep forever).
#[test]
fn saturating_grant_wakes_every_blocked_acquire() {
    for s in Scheduler::ALL {
        let cc = cc(1, s);
        let holder = cc.allocate(0, 1).unwrap();
        let h = holder.try_acquire().unwrap();
        let a = cc.allocate(0, 1).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|sc| {
            for _ in 0..2 {
                let tx = tx.clone();
                let a = &a;
                sc.spawn(move || {
                    // Hold a won slot until the test has both answers.
                    let r = a.acquire();
                    tx.send(r.as_ref().map(|s| s.slot_id()).map_err(Clone::clone))
                        .unwrap();
                    r
                });
            }
            std::thread::sleep(Duration::from_millis(20));
            drop(h);
            let mut got: Vec<_> = (0..2).map(|_| rx.recv_timeout(WATCHDOG)).collect();
            if got.iter().any(Result::is_err) {
                a.free();
            }
            got.sort_by_key(|r| format!("{r:?}"));
            assert_eq!(
                got,
                [
                    Ok(Err(SlotsError::Exhausted {
                        allocated: 1,
                        max: 1
                    })),
                    Ok(Ok(0)),
                ],
                "{s}: exactly one served, the other told it is exhausted"
            );
        });
        drop((a, holder));
        assert_idle(&cc);
    }
}
