//! CPU leases: park/unpark accounting, borrowing, the thread's current lease,
//! the nesting-safe park guard, the observer hook and the throttler seam.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use slotring_slots::{
    ConcurrencyControl, CpuLeaseParkGuard, LeaseState, Scheduler, SlotLease, SlotsCounters,
    current_lease_state, install_lease_hook,
};
use slotring_throttle::{Clock, LeaseObserver, Throttle, Throttler, UNLIMITED_BLOCK};

fn cc(limit: u64, s: Scheduler) -> ConcurrencyControl {
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(limit);
    cc.set_scheduler(s);
    cc
}

fn check_invariant(c: &SlotsCounters) {
    assert!(c.cur_concurrency - c.borrowed <= c.max_concurrency, "{c:?}");
    assert!(
        c.borrowed <= c.cur_concurrency.saturating_sub(c.max_concurrency),
        "{c:?}"
    );
}

// ---- the observer: records this thread's lease states --------------------

thread_local! {
    static SEEN: RefCell<Vec<LeaseState>> = const { RefCell::new(Vec::new()) };
}

struct Recorder;

impl LeaseObserver for Recorder {
    fn on_lease_state(&self, state: LeaseState) {
        SEEN.with(|s| s.borrow_mut().push(state));
    }
}

static RECORDER: Recorder = Recorder;

fn observed() -> Vec<LeaseState> {
    // The first caller installs it; later calls find it installed.
    let _ = slotring_throttle::install_lease_observer(&RECORDER);
    SEEN.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

#[test]
fn park_frees_capacity_and_unpark_borrows() {
    for s in Scheduler::ALL {
        let cc = cc(2, s);
        let a = cc.allocate(0, 2).unwrap();
        let mut s0 = a.try_acquire().unwrap();
        let s1 = a.try_acquire().unwrap();
        let b = cc.allocate(0, 1).unwrap();
        assert_eq!(b.granted(), 0);

        assert!(s0.park(), "{s}");
        assert!(!s0.park(), "already parked");
        let c = cc.counters();
        assert_eq!(
            (c.parks, c.parked, c.cur_concurrency),
            (1, 1, 2),
            "{s}: b got the capacity"
        );
        let b0 = b.try_acquire().expect("the parked capacity was granted");

        s0.unpark(); // the budget is full: borrow
        let c = cc.counters();
        assert_eq!(
            (c.unparks, c.parked, c.unpark_borrows, c.borrowed),
            (1, 0, 1, 1),
            "{s}"
        );
        assert_eq!(c.cur_concurrency, 3);
        check_invariant(&c);
        s0.unpark(); // not parked: a no-op
        assert_eq!(cc.counters().unparks, 1);

        let waiter = cc.allocate(0, 1).unwrap();
        drop(b0); // repays the borrow: the capacity is withheld
        let c = cc.counters();
        assert_eq!((c.cur_concurrency, c.borrowed), (2, 0), "{s}");
        assert_eq!(
            waiter.granted(),
            0,
            "{s}: the next released capacity repaid the borrow"
        );
        check_invariant(&c);
        drop(s1);
        assert_eq!(waiter.granted(), 1, "{s}: then capacity flows again");
        drop((s0, a, b, waiter));
        let c = cc.counters();
        assert_eq!(
            (c.cur_concurrency, c.borrowed, c.parked, c.waiters),
            (0, 0, 0, 0),
            "{s}"
        );
    }
}

#[test]
fn borrow_is_forgiven_when_the_budget_grows() {
    let cc = cc(1, Scheduler::MaxMinFair);
    let a = cc.allocate(0, 2).unwrap();
    let mut s0 = a.try_acquire().unwrap();
    assert!(s0.park());
    let s1 = a.try_acquire().unwrap();
    s0.unpark();
    assert_eq!(cc.counters().borrowed, 1);
    cc.set_max_concurrency(2);
    let c = cc.counters();
    assert_eq!(
        (c.borrowed, c.cur_concurrency),
        (0, 2),
        "the overshoot is now within budget"
    );
    drop((s0, s1));
    assert_eq!(cc.counters().cur_concurrency, 0);
}

#[test]
fn dropping_a_parked_slot_releases_nothing_twice() {
    for s in Scheduler::ALL {
        let cc = cc(1, s);
        let a = cc.allocate(0, 1).unwrap();
        let mut slot = a.try_acquire().unwrap();
        assert!(slot.park());
        assert!(slot.is_parked());
        let b = cc.allocate(0, 1).unwrap();
        let held = b.try_acquire().unwrap();
        drop(slot);
        let c = cc.counters();
        assert_eq!((c.cur_concurrency, c.parked), (1, 0), "{s}");
        drop(held);
        assert_eq!(cc.counters().cur_concurrency, 0);
    }
}

#[test]
fn non_competing_slots_park_without_moving_capacity() {
    for s in [Scheduler::FairRoundRobin, Scheduler::MaxMinFair] {
        let cc = cc(1, s);
        let a = cc.allocate(1, 1).unwrap();
        let mut slot = a.try_acquire().unwrap();
        assert!(!slot.is_competing());
        assert!(slot.park());
        let c = cc.counters();
        assert_eq!((c.parks, c.parked, c.cur_concurrency), (1, 1, 0), "{s}");
        slot.unpark();
        let c = cc.counters();
        assert_eq!(
            (c.unparks, c.parked, c.unpark_borrows, c.cur_concurrency),
            (1, 0, 0, 0)
        );
    }
}

#[test]
fn park_guard_is_nesting_safe_and_observed() {
    let _ = observed();
    let cc = cc(4, Scheduler::MaxMinFair);
    {
        let g = CpuLeaseParkGuard::new();
        assert!(!g.parked(), "no current lease: nothing to park");
    }
    let a = cc.allocate(0, 1).unwrap();
    let mut slot = a.try_acquire().unwrap();
    assert_eq!(current_lease_state(), LeaseState::NotHolding);
    {
        let cur = slot.make_current();
        assert_eq!(cur.slot_id(), 0);
        assert_eq!(current_lease_state(), LeaseState::Running);
        {
            let outer = CpuLeaseParkGuard::new();
            assert!(outer.parked());
            assert_eq!(current_lease_state(), LeaseState::Parked);
            {
                let inner = CpuLeaseParkGuard::new();
                assert!(!inner.parked(), "only the outermost guard parks");
            }
            assert_eq!(
                current_lease_state(),
                LeaseState::Parked,
                "inner drop did not unpark"
            );
            assert_eq!(cc.counters().cur_concurrency, 0);
        }
        assert_eq!(current_lease_state(), LeaseState::Running);
        let c = cc.counters();
        assert_eq!((c.parks, c.unparks, c.cur_concurrency), (1, 1, 1));
        {
            // Again, to see the pair of states reported a second time.
            let _outer = CpuLeaseParkGuard::new();
            let _inner = CpuLeaseParkGuard::new();
        }
        assert_eq!(cc.counters().unparks, 2);
    }
    assert_eq!(current_lease_state(), LeaseState::NotHolding);
    assert!(!slot.is_parked(), "the state came back to the slot");
    assert_eq!(
        observed(),
        [
            LeaseState::Running,
            LeaseState::Parked,
            LeaseState::Running,
            LeaseState::Parked,
            LeaseState::Running,
            LeaseState::NotHolding
        ]
    );
    drop(slot);
    assert_eq!(cc.counters().cur_concurrency, 0);
}

#[test]
fn nested_current_leases_restore_the_previous() {
    let _ = observed();
    let cc = cc(4, Scheduler::RoundRobin);
    let a = cc.allocate(0, 2).unwrap();
    let mut s0 = a.try_acquire().unwrap();
    let mut s1 = a.try_acquire().unwrap();
    {
        let _c0 = s0.make_current();
        let g = CpuLeaseParkGuard::new();
        assert!(g.parked());
        {
            let _c1 = s1.make_current();
            assert_eq!(current_lease_state(), LeaseState::Running);
        }
        assert_eq!(
            current_lease_state(),
            LeaseState::Parked,
            "back to the parked outer lease"
        );
        drop(g);
    }
    assert_eq!(
        observed(),
        [
            LeaseState::Running,
            LeaseState::Parked,
            LeaseState::Running,
            LeaseState::Parked,
            LeaseState::Running,
            LeaseState::NotHolding
        ]
    );
    drop((s0, s1));
    assert_eq!(cc.counters().cur_concurrency, 0);
}

#[test]
fn a_leaked_current_lease_is_released_at_thread_exit() {
    let cc = cc(1, Scheduler::MaxMinFair);
    let a = cc.allocate(0, 1).unwrap();
    let mut slot = a.try_acquire().unwrap();
    // Not a scoped thread: `join` must wait for the thread-local destructors.
    std::thread::spawn(move || {
        std::mem::forget(slot.make_current());
        drop(slot); // its state lives in the thread-local now
    })
    .join()
    .unwrap();
    let c = cc.counters();
    assert_eq!(
        (c.cur_concurrency, c.parked),
        (0, 0),
        "released exactly once"
    );
}

/// A clock whose `sleep_until` blocks until the test opens a gate, so the
/// test can look at the counters while a throttled thread is asleep.
#[derive(Debug, Default)]
struct GateClock {
    now: AtomicU64,
    state: Mutex<(bool, bool)>, // (sleeping, gate open)
    cv: Condvar,
}

impl Clock for GateClock {
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
    fn sleep_until(&self, deadline_ns: u64) -> Result<(), nix::errno::Errno> {
        let mut st = self.state.lock().unwrap();
        st.0 = true;
        self.cv.notify_all();
        while !st.1 {
            st = self.cv.wait(st).unwrap();
        }
        self.now.fetch_max(deadline_ns, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn a_blocking_throttler_wait_parks_the_current_lease() {
    let cc = cc(1, Scheduler::MaxMinFair);
    assert!(install_lease_hook(), "our hook is the installed one");
    assert!(slotring_throttle::lease_hook_installed());
    let clock = Arc::new(GateClock::default());
    let throttler = Throttler::builder(1000)
        .clock(clock.clone())
        .build()
        .unwrap();
    let a = cc.allocate(0, 1).unwrap();
    let mut slot = a.acquire().unwrap();
    let b = cc.allocate(0, 1).unwrap();
    assert_eq!(b.granted(), 0, "the budget of 1 is held");
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            let _ = observed();
            let _cur = slot.make_current();
            // 1000 tokens of burst: 3000 tokens leave a 2 s debt to sleep off.
            let waited = throttler.throttle(3000, UNLIMITED_BLOCK).unwrap();
            assert_eq!(current_lease_state(), LeaseState::Running);
            (waited, observed())
        });
        let mut st = clock.state.lock().unwrap();
        while !st.0 {
            st = clock.cv.wait(st).unwrap();
        }
        // The thread is asleep inside the throttler.
        let c = cc.counters();
        assert_eq!(
            (c.parks, c.unparks, c.parked, c.cur_concurrency),
            (1, 0, 1, 1),
            "{c:?}"
        );
        let b0 = b
            .try_acquire()
            .expect("the parked lease's capacity went to the waiter");
        st.1 = true;
        clock.cv.notify_all();
        drop(st);
        let (waited, seen) = t.join().unwrap();
        assert!(waited);
        assert_eq!(
            seen,
            [LeaseState::Running, LeaseState::Parked, LeaseState::Running]
        );
        let c = cc.counters();
        assert_eq!(
            (c.unparks, c.unpark_borrows, c.borrowed, c.cur_concurrency),
            (1, 1, 1, 2)
        );
        check_invariant(&c);
        drop(b0);
    });
    assert_eq!(
        clock.now_ns(),
        2_000_000_000,
        "slept exactly the deficit on the clock"
    );
    drop(slot);
    let c = cc.counters();
    assert_eq!((c.cur_concurrency, c.borrowed, c.parked), (0, 0, 0));
}

/// Current-lease guards dropped out of order: each guard gives its own
/// state back to its own slot, the observer always hears the state of the
/// lease that is current, and every slot is released exactly once (a guard
/// that popped whatever is on top of the stack would give `B`'s guard `C`'s
/// state, and `A`'s drop would release `B` while it is still current).
#[test]
fn current_leases_dropped_out_of_order_keep_their_own_state() {
    let _ = observed();
    let cc = cc(8, Scheduler::MaxMinFair);
    let a = cc.allocate(0, 3).unwrap();
    let mut sa = a.try_acquire().unwrap();
    let mut sb = a.try_acquire().unwrap();
    let mut sc = a.try_acquire().unwrap();
    let cur = |cc: &ConcurrencyControl| cc.counters().cur_concurrency;
    assert_eq!(cur(&cc), 3);

    let ga = sa.make_current();
    let gb = sb.make_current();
    drop(ga); // out of order: B stays current, nothing is released
    assert_eq!(current_lease_state(), LeaseState::Running);
    assert_eq!(cur(&cc), 3, "A's guard released nothing");
    {
        // The current lease is B's: parking it moves B's capacity.
        let g = CpuLeaseParkGuard::new();
        assert!(g.parked());
        assert_eq!(cur(&cc), 2);
    }
    assert_eq!(cur(&cc), 3);
    let gc = sc.make_current();
    {
        let g = CpuLeaseParkGuard::new();
        assert!(g.parked(), "C is current");
        drop(gb); // out of order again: C stays current (and parked)
        assert_eq!(current_lease_state(), LeaseState::Parked);
        assert_eq!(cur(&cc), 2);
    }
    assert_eq!(current_lease_state(), LeaseState::Running);
    assert_eq!(cur(&cc), 3);
    drop(gc);
    assert_eq!(current_lease_state(), LeaseState::NotHolding);
    assert_eq!(
        observed(),
        [
            LeaseState::Running,    // A current
            LeaseState::Running,    // B current
            LeaseState::Parked,     // B parked
            LeaseState::Running,    // B unparked
            LeaseState::Running,    // C current
            LeaseState::Parked,     // C parked
            LeaseState::Running,    // C unparked
            LeaseState::NotHolding, // C's guard: nothing current
        ]
    );

    // Every slot has its own state back: each parks its own capacity and
    // releases exactly one slot.
    for (i, mut s) in [sa, sb, sc].into_iter().enumerate() {
        let before = cur(&cc);
        assert!(s.park(), "slot {i} holds its state");
        assert_eq!(cur(&cc), before - 1, "slot {i} parked its own capacity");
        s.unpark();
        drop(s);
        assert_eq!(cur(&cc), before - 1, "slot {i} released once");
    }
    let c = cc.counters();
    assert_eq!(
        (c.cur_concurrency, c.parked, c.borrowed),
        (0, 0, 0),
        "{c:?}"
    );
}

/// A park guard outliving the current-lease guard it parked must not touch
/// the lease that reuses the stack position: the parked slot gets its state
/// back parked, and the next current lease is neither unparked nor reported.
#[test]
fn a_park_guard_outliving_its_lease_leaves_the_next_one_alone() {
    let _ = observed();
    let cc = cc(8, Scheduler::MaxMinFair);
    let a = cc.allocate(0, 2).unwrap();
    let mut s0 = a.try_acquire().unwrap();
    let mut s1 = a.try_acquire().unwrap();
    let g0 = s0.make_current();
    let park = CpuLeaseParkGuard::new();
    assert!(park.parked());
    drop(g0);
    assert!(s0.is_parked(), "its state came back parked");
    let g1 = s1.make_current();
    drop(park); // must not unpark or report anything about s1
    assert_eq!(current_lease_state(), LeaseState::Running);
    let c = cc.counters();
    assert_eq!((c.cur_concurrency, c.parked, c.unparks), (1, 1, 0), "{c:?}");
    drop(g1);
    assert_eq!(
        observed(),
        [
            LeaseState::Running,    // s0 current
            LeaseState::Parked,     // s0 parked
            LeaseState::NotHolding, // s0's guard
            LeaseState::Running,    // s1 current
            LeaseState::NotHolding, // s1's guard
        ]
    );
    s0.unpark();
    drop((s0, s1));
    let c = cc.counters();
    assert_eq!(
        (c.cur_concurrency, c.parked, c.borrowed),
        (0, 0, 0),
        "{c:?}"
    );
}
