//! loom models of the races between acquire, release, park, unpark, set_max,
//! free and scheduler switches. Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p slotring-slots --test loom`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use slotring_slots::{
    ConcurrencyControl, CpuLeaseParkGuard, Scheduler, SlotLease, SlotsCounters, SlotsError,
};
use slotring_throttle::{WorkloadSpec, WorkloadTree};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b.check(f);
}

/// `all` over `user` at priority 0 and `bg` at priority 1.
fn user_over_background() -> ConcurrencyControl {
    ConcurrencyControl::with_workloads(
        &WorkloadTree::new(vec![
            WorkloadSpec::new("all"),
            WorkloadSpec::new("user").parent("all").priority(0),
            WorkloadSpec::new("bg").parent("all").priority(1),
        ])
        .unwrap(),
    )
}

fn idle(c: SlotsCounters) {
    assert_eq!(
        (c.cur_concurrency, c.borrowed, c.parked, c.waiters),
        (0, 0, 0, 0),
        "nothing leaked: {c:?}"
    );
}

/// A release races a blocking acquire on another allocation: the waiter is
/// always woken with the slot (no lost wake-up), nothing leaks.
#[test]
fn release_wakes_blocking_acquire() {
    model(|| {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(1);
        let a = cc.allocate(0, 1).unwrap();
        let s = a.try_acquire().unwrap();
        let b = Arc::new(cc.allocate(0, 1).unwrap());
        let b2 = b.clone();
        let t = thread::spawn(move || b2.acquire().map(|s| s.slot_id()));
        drop(s);
        assert_eq!(t.join().unwrap(), Ok(0));
        drop((a, b));
        idle(cc.counters());
    });
}

/// Park/unpark of one lease races a waiter's acquire and release: the
/// waiter gets the parked capacity or the released one; borrows are repaid.
#[test]
fn park_unpark_races_a_waiter() {
    model(|| {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(1);
        let a = cc.allocate(0, 1).unwrap();
        let mut s = a.try_acquire().unwrap();
        let b = Arc::new(cc.allocate(0, 1).unwrap());
        let b2 = b.clone();
        let cc2 = cc.clone();
        let t = thread::spawn(move || {
            let slot = b2.acquire().unwrap();
            let c = cc2.counters();
            assert!(c.cur_concurrency - c.borrowed <= c.max_concurrency, "{c:?}");
            drop(slot);
        });
        assert!(s.park());
        s.unpark();
        let c = cc.counters();
        assert!(c.cur_concurrency - c.borrowed <= c.max_concurrency, "{c:?}");
        drop(s); // if the waiter is still blocked, this release wakes it
        t.join().unwrap();
        drop((a, b));
        idle(cc.counters());
    });
}

/// The thread-local guard path (what the throttler hook uses) on two threads.
#[test]
fn park_guards_on_two_threads() {
    model(|| {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(1);
        cc.set_scheduler(Scheduler::FairRoundRobin);
        let a = Arc::new(cc.allocate(0, 2).unwrap());
        let mut s = a.try_acquire().unwrap();
        let a2 = a.clone();
        let t = thread::spawn(move || {
            // Gets the capacity only if the other lease is parked meanwhile.
            if let Some(mut s2) = a2.try_acquire() {
                let _cur = s2.make_current();
                let _g = CpuLeaseParkGuard::new();
            }
        });
        {
            let _cur = s.make_current();
            let g = CpuLeaseParkGuard::new();
            assert!(g.parked());
        }
        t.join().unwrap();
        drop(s);
        drop(a);
        let c = cc.counters();
        assert_eq!(c.parks, c.unparks);
        idle(c);
    });
}

/// set_max growth races a release and a lock-free try_acquire.
#[test]
fn set_max_races_release() {
    model(|| {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(2);
        let a = Arc::new(cc.allocate(0, 1).unwrap());
        let s = a.try_acquire().unwrap();
        let other = cc.allocate(0, 1).unwrap();
        let o = other.try_acquire().unwrap();
        let a2 = a.clone();
        let t = thread::spawn(move || {
            a2.set_max(2).unwrap();
            a2.try_acquire()
        });
        drop(o);
        let got = t.join().unwrap();
        // The growth is granted from the free capacity at once either way.
        assert!(got.is_some() || a.granted() == 1);
        drop((s, got, other));
        drop(a);
        idle(cc.counters());
    });
}

/// free() races a lock-free try_acquire: the granted slot is either taken or
/// returned to the budget, never both, never lost.
#[test]
fn free_races_try_acquire() {
    model(|| {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(1);
        let a = Arc::new(cc.allocate(0, 1).unwrap());
        assert_eq!(a.granted(), 1);
        let a2 = a.clone();
        let t = thread::spawn(move || a2.try_acquire());
        a.free();
        let got = t.join().unwrap();
        assert_eq!(cc.counters().cur_concurrency, u64::from(got.is_some()));
        drop(got);
        drop(a);
        idle(cc.counters());
    });
}

/// A scheduler switch races a release: the waiter created under the old
/// scheduler is still served.
#[test]
fn scheduler_switch_strands_nobody() {
    model(|| {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(1);
        cc.set_scheduler(Scheduler::RoundRobin);
        let holder = cc.allocate(0, 1).unwrap();
        let s = holder.try_acquire().unwrap();
        let w = Arc::new(cc.allocate(0, 1).unwrap());
        let cc2 = cc.clone();
        let t = thread::spawn(move || cc2.set_scheduler(Scheduler::MaxMinFair));
        drop(s);
        t.join().unwrap();
        assert_eq!(w.granted(), 1);
        drop((holder, w));
        idle(cc.counters());
    });
}

/// Three-way race: a budget change, a park/unpark/release of one lease and a
/// blocked waiter. The waiter is always served; borrows are always repaid.
#[test]
fn budget_change_races_park_and_waiter() {
    model(|| {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(1);
        let a = cc.allocate(0, 1).unwrap();
        let mut s = a.try_acquire().unwrap();
        let b = Arc::new(cc.allocate(0, 1).unwrap());
        let b2 = b.clone();
        let waiter = thread::spawn(move || b2.acquire().map(|s| s.slot_id()));
        let cc2 = cc.clone();
        let admin = thread::spawn(move || cc2.set_max_concurrency(2));
        if s.park() {
            s.unpark();
        }
        let c = cc.counters();
        assert!(
            c.borrowed <= c.cur_concurrency.saturating_sub(c.max_concurrency),
            "{c:?}"
        );
        drop(s);
        admin.join().unwrap();
        assert_eq!(waiter.join().unwrap(), Ok(0));
        drop((a, b));
        idle(cc.counters());
    });
}

/// A `set_max` shrink that ends the request races a blocked acquire: the
/// acquirer is always woken and told `Exhausted` (a shrink that leaves the
/// waiter list without waking it is a lost wake-up).
#[test]
fn set_max_shrink_wakes_blocked_acquire() {
    model(|| {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(1);
        cc.set_scheduler(Scheduler::RoundRobin);
        // Round robin counts the min slot: the budget is full after it.
        let a = Arc::new(cc.allocate(1, 3).unwrap());
        let min = a.try_acquire().unwrap();
        assert!(a.is_requesting());
        let a2 = a.clone();
        let t = thread::spawn(move || a2.acquire().map(|s| s.slot_id()));
        a.set_max(1).unwrap();
        assert_eq!(
            t.join().unwrap(),
            Err(SlotsError::Exhausted {
                allocated: 1,
                max: 1
            })
        );
        drop(min);
        drop(a);
        idle(cc.counters());
    });
}

/// Two acquirers block on an allocation that wants one more slot; the
/// release that grants it races them. One gets the slot, the other is woken
/// with `Exhausted` (a `notify_one` there leaves it asleep forever).
#[test]
fn saturating_grant_wakes_every_blocked_acquire() {
    model(|| {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(1);
        let holder = cc.allocate(0, 1).unwrap();
        let h = holder.try_acquire().unwrap();
        let a = Arc::new(cc.allocate(0, 1).unwrap());
        let ts: Vec<_> = (0..2)
            .map(|_| {
                let a = a.clone();
                thread::spawn(move || a.acquire().map(|s| s.slot_id()))
            })
            .collect();
        drop(h);
        let mut got: Vec<_> = ts.into_iter().map(|t| t.join().unwrap()).collect();
        got.sort_by_key(Result::is_err);
        assert_eq!(
            got,
            [
                Ok(0),
                Err(SlotsError::Exhausted {
                    allocated: 1,
                    max: 1
                })
            ]
        );
        drop((holder, a));
        idle(cc.counters());
    });
}

/// The adaptive budget shrinks (2 → 1) while two holders of one allocation
/// pass their `should_yield` checkpoints: whatever the interleaving, exactly
/// one of them is told to yield (the excess), the allocation asks for the
/// slot again, and the released capacity reaches it once the other holder
/// leaves. Nothing leaks.
#[test]
fn budget_shrink_makes_exactly_the_excess_yield() {
    model(|| {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(2);
        let a = cc.allocate(0, 2).unwrap();
        let s0 = a.try_acquire().unwrap();
        let s1 = a.try_acquire().unwrap();
        let cc2 = cc.clone();
        let admin = thread::spawn(move || cc2.set_effective_budget(1));
        let holder = thread::spawn(move || {
            if s1.should_yield() {
                drop(s1);
                None
            } else {
                Some(s1)
            }
        });
        let mut kept = Vec::new();
        let mut yields = 0;
        if s0.should_yield() {
            drop(s0);
            yields += 1;
        } else {
            kept.push(s0);
        }
        admin.join().unwrap();
        match holder.join().unwrap() {
            Some(s) => kept.push(s),
            None => yields += 1,
        }
        // Both checkpoints may have run before the shrink: check again now.
        kept.retain(|s| {
            !s.should_yield() || {
                yields += 1;
                false
            }
        });
        assert_eq!(yields, 1, "exactly the excess yields");
        assert_eq!(kept.len(), 1);
        assert!(!kept[0].should_yield(), "the fair share stays");
        let c = cc.counters();
        assert_eq!((c.yields, c.budget_effective, c.cur_concurrency), (1, 1, 1));
        assert!(a.is_requesting(), "the yielded slot is wanted again");
        drop(kept);
        let again = a
            .try_acquire()
            .expect("granted to the yielder's allocation");
        drop(again);
        drop(a);
        idle(cc.counters());
    });
}

/// A holder told to yield releases and blocks in `acquire` while the budget
/// grows back (1 → 2) on another thread: it is always granted (no lost
/// wake-up), whichever comes first.
#[test]
fn yielded_holder_is_granted_when_the_budget_grows() {
    model(|| {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(2);
        let a = Arc::new(cc.allocate(0, 2).unwrap());
        let s0 = a.try_acquire().unwrap();
        let s1 = a.try_acquire().unwrap();
        cc.set_effective_budget(1);
        assert!(s1.should_yield());
        let a2 = a.clone();
        let yielder = thread::spawn(move || {
            drop(s1);
            a2.acquire().map(|s| s.slot_id())
        });
        let cc2 = cc.clone();
        let admin = thread::spawn(move || cc2.set_effective_budget(2));
        admin.join().unwrap();
        assert_eq!(yielder.join().unwrap(), Ok(2));
        assert!(!s0.should_yield());
        drop(s0);
        drop(a);
        idle(cc.counters());
    });
}

/// `all` with `p` (max_concurrent_threads `max`) over the leaves `x` and `y`.
fn capped_parent(max: u64) -> ConcurrencyControl {
    let tree = WorkloadTree::new(vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("p")
            .parent("all")
            .max_concurrent_threads(max),
        WorkloadSpec::new("x").parent("p"),
        WorkloadSpec::new("y").parent("p"),
    ])
    .unwrap();
    ConcurrencyControl::with_workloads(&tree)
}

/// `p`'s slots, borrows aside, never above its limit; what it holds.
fn p_within(cc: &ConcurrencyControl) -> u64 {
    let p = cc.workloads().into_iter().find(|w| w.name == "p").unwrap();
    let max = p.max_concurrent_threads.unwrap();
    assert!(p.held - p.borrowed <= max, "{p:?}");
    p.held
}

/// A release in workload `x` races a blocking acquire in its sibling `y`
/// and a lock-free `try_acquire` in `x`, under their parent's limit of 1
/// (the global budget is unlimited): the freed place is granted once, to
/// `y` (x had the last grant), the blocked acquirer wakes with it, and `p`
/// never holds two.
#[test]
fn release_in_one_workload_grants_its_sibling_under_a_capped_parent() {
    model(|| {
        let cc = capped_parent(1);
        let x = cc.allocate_in("x", 0, 2).unwrap();
        let s = x.try_acquire().unwrap();
        let y = Arc::new(cc.allocate_in("y", 0, 1).unwrap());
        assert_eq!(y.granted(), 0, "p is full");
        let y2 = y.clone();
        let cc2 = cc.clone();
        let t = thread::spawn(move || {
            let slot = y2.acquire().unwrap();
            assert_eq!(p_within(&cc2), 1);
            slot // kept until x has looked
        });
        drop(s);
        // Races the grant to y: x has nothing granted whichever comes first.
        assert!(x.try_acquire().is_none());
        p_within(&cc);
        let slot = t.join().unwrap();
        assert_eq!(slot.slot_id(), 0);
        drop(slot);
        assert_eq!(x.granted(), 1, "y's release goes back to x");
        drop((x, y));
        assert_eq!(p_within(&cc), 0);
        idle(cc.counters());
    });
}

/// A park and unpark in `x` race a waiter's acquire and release in `y`
/// under the capped parent: the waiter gets the parked place or the
/// released one, the unpark borrows when `y` holds the place, and every
/// borrow is repaid.
#[test]
fn park_in_one_workload_races_a_waiter_in_another_under_a_capped_parent() {
    model(|| {
        let cc = capped_parent(1);
        let x = cc.allocate_in("x", 0, 1).unwrap();
        let mut s = x.try_acquire().unwrap();
        let y = Arc::new(cc.allocate_in("y", 0, 1).unwrap());
        let y2 = y.clone();
        let cc2 = cc.clone();
        let t = thread::spawn(move || {
            let slot = y2.acquire().unwrap();
            p_within(&cc2);
            drop(slot);
        });
        assert!(s.park());
        s.unpark();
        p_within(&cc);
        drop(s); // if y still waits, this release hands it the place
        t.join().unwrap();
        drop((x, y));
        assert_eq!(p_within(&cc), 0);
        let p = cc.workloads().into_iter().find(|w| w.name == "p").unwrap();
        assert_eq!(p.borrowed, 0, "{p:?}");
        idle(cc.counters());
    });
}

/// The lock-free release (nothing queues when it starts) races a new
/// allocation in the sibling workload, which queues behind the parent's
/// limit of 2 under the mutex: either the new allocation sees the freed
/// place, or the release sees it queued and hands the place on; the
/// blocking acquire always returns, and `p` never holds three.
#[test]
fn lock_free_release_races_a_new_waiter_under_a_capped_parent() {
    model(|| {
        let cc = capped_parent(2);
        let x = cc.allocate_in("x", 0, 2).unwrap();
        let s0 = x.try_acquire().unwrap();
        let s1 = x.try_acquire().unwrap();
        assert!(!x.is_requesting());
        let cc2 = cc.clone();
        let t = thread::spawn(move || {
            let y = cc2.allocate_in("y", 0, 1).unwrap();
            let slot = y.acquire().unwrap();
            assert_eq!(p_within(&cc2), 2);
            drop(slot);
            drop(y);
        });
        drop(s1);
        p_within(&cc);
        t.join().unwrap();
        assert_eq!(p_within(&cc), 1);
        drop(s0);
        drop(x);
        assert_eq!(p_within(&cc), 0);
        idle(cc.counters());
    });
}

/// A priority-0 query arrives and blocks in `acquire` while two
/// priority-1 holders of the whole budget pass a `should_yield`
/// checkpoint (the first of them possibly before the query arrives, so
/// the kept slots check once more afterwards): whatever the
/// interleaving, exactly one holder is preempted (one preemption is wanted
/// at a time, and the query is granted only a released slot), its release
/// wakes the blocked query, and the preempted allocation asks for its slot
/// again and gets it back once the query leaves. Nothing leaks.
#[test]
fn a_waiting_priority_preempts_exactly_one_holder_and_is_granted() {
    model(|| {
        let cc = user_over_background();
        cc.set_max_concurrency(2);
        let bg = cc.allocate_in("bg", 0, 2).unwrap();
        let s0 = bg.try_acquire().unwrap();
        let s1 = bg.try_acquire().unwrap();
        // A checkpoint: a slot told to yield is released at once.
        let check = |slot: slotring_slots::AcquiredSlot| {
            if slot.should_yield() {
                drop(slot);
                None
            } else {
                Some(slot)
            }
        };
        let holder = thread::spawn(move || check(s1));
        let q = Arc::new(cc.allocate_in("user", 0, 1).unwrap());
        let q2 = q.clone();
        let user = thread::spawn(move || {
            let slot = q2.acquire().expect("granted the preempted slot");
            drop(slot);
        });
        let mut kept: Vec<_> = [check(s0), holder.join().unwrap()]
            .into_iter()
            .flatten()
            .collect();
        let mut preempted = 2 - kept.len();
        // The query is queued now: a kept slot checks again.
        if preempted == 0 {
            kept.retain(|s| {
                preempted == 1 || !s.should_yield() || {
                    preempted += 1;
                    false
                }
            });
        }
        assert_eq!(preempted, 1, "exactly one preempted");
        user.join().unwrap();
        let w = cc.workloads();
        let bg_node = w.iter().find(|w| w.name == "bg").unwrap();
        assert_eq!(bg_node.preemptions, 1);
        assert!(
            kept.iter().all(|s| !s.should_yield()),
            "nothing outranks bg any more"
        );
        drop(kept);
        let again = bg
            .try_acquire()
            .expect("the preempted slot, wanted again, granted back once the query left");
        drop(again);
        drop((bg, q));
        idle(cc.counters());
    });
}

/// A priority-0 query arrives while a priority-1 allocation's thread
/// takes the slot it was granted: either the thread takes it first (and
/// the query waits for the holder's checkpoint) or the arrival takes it
/// back (and the thread finds nothing, wanting it again); never both,
/// never neither. Nothing leaks.
#[test]
fn taking_back_an_unacquired_grant_races_its_acquire() {
    model(|| {
        let cc = user_over_background();
        cc.set_max_concurrency(1);
        let bg = Arc::new(cc.allocate_in("bg", 0, 1).unwrap());
        let bg2 = bg.clone();
        let taker = thread::spawn(move || bg2.try_acquire());
        let user = cc.allocate_in("user", 0, 1).unwrap();
        let theirs = taker.join().unwrap();
        let mine = user.try_acquire();
        assert!(
            theirs.is_some() != mine.is_some(),
            "the one slot went to exactly one"
        );
        let w = cc.workloads();
        let bg_node = w.iter().find(|w| w.name == "bg").unwrap();
        match &theirs {
            Some(slot) => {
                assert_eq!(bg_node.preemptions, 0);
                assert!(slot.should_yield(), "the query waits for bg's checkpoint");
            }
            None => {
                assert_eq!(bg_node.preemptions, 1);
                assert!(bg.is_requesting(), "the taken-back slot is wanted again");
            }
        }
        drop((theirs, mine, user));
        drop(bg);
        idle(cc.counters());
    });
}
