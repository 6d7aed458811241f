//! Priority preemption of CPU slots (see the `workloads` module docs): a
//! holder's `should_yield` says yes, once at a time, while a waiting
//! workload outranks its own, and no otherwise.

use slotring_slots::{AcquiredSlot, Allocation, ConcurrencyControl, SlotLease, WorkloadSlots};
use slotring_throttle::{WorkloadSpec, WorkloadTree};

fn node(cc: &ConcurrencyControl, name: &str) -> WorkloadSlots {
    cc.workloads()
        .into_iter()
        .find(|w| w.name == name)
        .unwrap_or_else(|| panic!("no workload {name}"))
}

/// A control of budget `budget` over `specs`.
fn control(budget: u64, specs: Vec<WorkloadSpec>) -> ConcurrencyControl {
    let cc = ConcurrencyControl::with_workloads(&WorkloadTree::new(specs).unwrap());
    cc.set_max_concurrency(budget);
    cc
}

/// `all` over `user` at priority 0 and `bg` at priority 1.
fn user_and_background() -> Vec<WorkloadSpec> {
    vec![
        WorkloadSpec::new("all"),
        WorkloadSpec::new("user").parent("all").priority(0),
        WorkloadSpec::new("bg").parent("all").priority(1),
    ]
}

/// Every slot `a` can take now.
fn take_all(a: &Allocation) -> Vec<AcquiredSlot> {
    std::iter::from_fn(|| a.try_acquire()).collect()
}

#[test]
fn a_waiting_higher_priority_preempts_one_holder_at_a_time() {
    let cc = control(2, user_and_background());
    let bg = cc.allocate_in("bg", 0, 2).unwrap();
    let mut held = take_all(&bg);
    assert_eq!(held.len(), 2);
    assert!(held.iter().all(|s| !s.should_yield()), "nothing waits");

    let user = cc.allocate_in("user", 0, 2).unwrap();
    assert!(user.try_acquire().is_none(), "the budget is full");
    assert!(held[0].should_yield(), "a priority-0 waiter outranks bg");
    assert!(
        !held[1].should_yield(),
        "one preemption at a time: the promised one frees the slot"
    );
    assert_eq!(node(&cc, "bg").preemptions, 1);

    // The promise is kept: the freed slot goes to the user, and bg asks
    // for it again.
    drop(held.remove(0));
    let first = user.try_acquire().expect("the preempted slot went to user");
    assert!(bg.is_requesting(), "the preempted allocation wants it back");
    // The user still wants one: the next preemption is wanted now.
    assert!(held[0].should_yield());
    drop(held.remove(0));
    let second = user.try_acquire().expect("the second went to user too");
    assert_eq!(node(&cc, "bg").preemptions, 2);
    assert!(!first.should_yield() && !second.should_yield());

    // The user's slots come back to bg when it is done.
    drop((first, second));
    assert_eq!(take_all(&bg).len(), 2);
}

#[test]
fn equal_priorities_lower_priorities_and_capped_waiters_preempt_nothing() {
    // Weights share one priority: a grant is the only lever, no yield.
    let cc = control(
        1,
        vec![
            WorkloadSpec::new("all"),
            WorkloadSpec::new("a").parent("all").weight(3),
            WorkloadSpec::new("b").parent("all").weight(1),
        ],
    );
    let b = cc.allocate_in("b", 0, 1).unwrap();
    let held = b.try_acquire().unwrap();
    let _a = cc.allocate_in("a", 0, 1).unwrap();
    assert!(!held.should_yield(), "a weight is no priority");
    drop(held);

    // A priority-1 waiter never preempts a priority-0 holder.
    let cc = control(1, user_and_background());
    let user = cc.allocate_in("user", 0, 1).unwrap();
    let held = user.try_acquire().unwrap();
    let _bg = cc.allocate_in("bg", 0, 1).unwrap();
    assert!(!held.should_yield(), "bg does not outrank user");
    drop(held);

    // A waiter held back by its own workload's cap gains nothing from
    // bg's slot: no preemption.
    let mut specs = user_and_background();
    specs[1] = WorkloadSpec::new("user")
        .parent("all")
        .priority(0)
        .max_concurrent_threads(1);
    let cc = control(2, specs);
    let user = cc.allocate_in("user", 0, 2).unwrap();
    let mine = user.try_acquire().unwrap();
    let bg = cc.allocate_in("bg", 0, 1).unwrap();
    let theirs = bg.try_acquire().unwrap();
    assert!(user.is_requesting(), "user wants a second slot");
    assert!(!theirs.should_yield(), "user's own cap holds it back");
    assert_eq!(node(&cc, "bg").preemptions, 0);
    drop((mine, theirs));
}

#[test]
fn an_outranked_branch_is_preempted_at_the_level_where_it_is_outranked() {
    // `gold` (priority 0) over `q1`, `silver` (priority 1) over `etl`:
    // the priorities differ above the leaves, which share one.
    let cc = control(
        1,
        vec![
            WorkloadSpec::new("all"),
            WorkloadSpec::new("gold").parent("all").priority(0),
            WorkloadSpec::new("silver").parent("all").priority(1),
            WorkloadSpec::new("q1").parent("gold"),
            WorkloadSpec::new("etl").parent("silver"),
        ],
    );
    let etl = cc.allocate_in("etl", 0, 1).unwrap();
    let held = etl.try_acquire().unwrap();
    let q1 = cc.allocate_in("q1", 0, 1).unwrap();
    assert!(held.should_yield(), "gold outranks silver");
    drop(held);
    let got = q1.try_acquire().expect("the slot went to gold's query");
    assert!(!got.should_yield());
    assert_eq!(node(&cc, "etl").preemptions, 1);
}

#[test]
fn a_parked_holder_is_not_preempted_and_an_unparked_one_is() {
    let cc = control(1, user_and_background());
    let bg = cc.allocate_in("bg", 0, 1).unwrap();
    let mut slot = bg.try_acquire().unwrap();
    assert!(slot.park());
    // The park freed the budget: the user is granted at once, nothing to
    // preempt.
    let user = cc.allocate_in("user", 0, 2).unwrap();
    let got = user.try_acquire().expect("the parked slot's capacity");
    assert!(user.is_requesting(), "user waits for a second slot");
    assert!(!slot.should_yield(), "a parked slot never yields");
    // Unparked, it borrows over the budget: its release would repay the
    // borrow, not free a slot for the user, so no preemption.
    slot.unpark();
    assert!(
        !slot.should_yield(),
        "a borrowed slot's release frees nothing"
    );
    // The user's release repays the borrow; now bg holds the budget that
    // the user waits for: it is preempted.
    drop(got);
    assert!(slot.should_yield());
    drop(slot);
    assert!(user.try_acquire().is_some());
    assert_eq!(node(&cc, "bg").preemptions, 1);
}

#[test]
fn a_preemption_made_with_the_budget_exceeded_is_the_excess_yield() {
    // The budget shrinks below the holders and a priority-0 waiter
    // arrives: the excess yields are what is wanted (one per slot over),
    // and the slots they free go to the waiter by priority.
    let cc = control(2, user_and_background());
    let bg = cc.allocate_in("bg", 0, 2).unwrap();
    let mut held = take_all(&bg);
    let user = cc.allocate_in("user", 0, 1).unwrap();
    cc.set_max_concurrency(1);
    let yes: Vec<bool> = held.iter().map(AcquiredSlot::should_yield).collect();
    assert_eq!(yes, [true, false], "the excess of one, promised once");
    assert_eq!(node(&cc, "bg").preemptions, 0, "an excess yield");
    drop(held.remove(0));
    // One slot left for a budget of one: the user waits for it, and it is
    // a preemption again.
    assert!(user.try_acquire().is_none());
    assert!(held[0].should_yield());
    drop(held.remove(0));
    assert!(user.try_acquire().is_some());
    assert_eq!(node(&cc, "bg").preemptions, 1);
}

#[test]
fn a_slot_granted_and_not_yet_acquired_is_taken_back_without_a_checkpoint() {
    let cc = control(2, user_and_background());
    let bg = cc.allocate_in("bg", 0, 2).unwrap();
    let running = bg.try_acquire().unwrap();
    assert_eq!(bg.granted(), 1, "one granted slot not acquired yet");
    // The user arrives: bg's unacquired slot is taken back at once and
    // granted to the user; no holder is asked.
    let user = cc.allocate_in("user", 0, 1).unwrap();
    let got = user.try_acquire().expect("the slot bg had not taken");
    assert!(bg.try_acquire().is_none(), "taken back");
    assert!(bg.is_requesting(), "bg wants it again");
    assert_eq!(node(&cc, "bg").preemptions, 1);
    assert!(
        !running.should_yield(),
        "the user is served: nothing to ask"
    );
    drop(got);
    let again = bg.try_acquire().expect("back to bg once the user left");
    drop((running, again));
}

#[test]
fn a_round_robin_min_slot_is_never_taken_back() {
    // Round robin grants `min` unconditionally: it is not revoked, and
    // the holder is asked at its checkpoint instead.
    let cc = control(1, user_and_background());
    cc.set_scheduler(slotring_slots::Scheduler::RoundRobin);
    let bg = cc.allocate_in("bg", 1, 1).unwrap();
    let user = cc.allocate_in("user", 0, 1).unwrap();
    let slot = bg.try_acquire().expect("the min slot stays bg's");
    assert!(user.try_acquire().is_none());
    assert!(slot.should_yield(), "asked at the checkpoint instead");
    drop(slot);
    assert!(user.try_acquire().is_some());
}

/// Block a thread in `a.acquire()` (once some acquirer has waited, which
/// only this thread can), run `release` to grant it a slot, and return
/// its workload's wake-up yields once the thread has its slot.
fn wake_yields_of_a_blocked_acquire(
    cc: &ConcurrencyControl,
    a: Allocation,
    workload: &str,
    release: impl FnOnce(),
) -> u64 {
    std::thread::scope(|s| {
        let t = s.spawn(move || {
            let slot = a.acquire().expect("granted once the holder releases");
            drop(slot);
        });
        while cc.counters().waiting_us == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        release();
        t.join().unwrap();
    });
    node(cc, workload).wake_yields
}

#[test]
fn a_thread_that_can_be_outranked_gives_its_cpu_once_when_it_wakes_with_a_slot() {
    let cc = control(1, user_and_background());
    let user = cc.allocate_in("user", 0, 1).unwrap();
    let held = user.try_acquire().unwrap();
    let bg = cc.allocate_in("bg", 0, 1).unwrap();
    let n = wake_yields_of_a_blocked_acquire(&cc, bg, "bg", move || drop(held));
    assert_eq!(n, 1, "bg has a sibling of lower priority value");
    assert_eq!(node(&cc, "user").wake_yields, 0);
}

#[test]
fn a_thread_nobody_can_outrank_never_yields_and_neither_does_one_that_did_not_block() {
    // user (priority 0) blocks behind bg's slot and wakes with it.
    let cc = control(1, user_and_background());
    let bg = cc.allocate_in("bg", 0, 1).unwrap();
    let held = bg.try_acquire().unwrap();
    let user = cc.allocate_in("user", 0, 1).unwrap();
    let n = wake_yields_of_a_blocked_acquire(&cc, user, "user", move || drop(held));
    assert_eq!(n, 0, "nothing has a lower priority value than user");

    // An acquire that finds its slot granted never blocks, so never yields.
    let bg2 = cc.allocate_in("bg", 0, 1).unwrap();
    drop(bg2.acquire().unwrap());
    assert_eq!(node(&cc, "bg").wake_yields, 0);
}

#[test]
fn a_leaf_outranked_through_an_ancestor_yields_on_its_wake_up() {
    // batch (priority 1) beside user (0); inside batch, `first` is at
    // priority 0 among its siblings, yet batch itself can be outranked.
    let cc = control(
        1,
        vec![
            WorkloadSpec::new("all"),
            WorkloadSpec::new("user").parent("all").priority(0),
            WorkloadSpec::new("batch").parent("all").priority(1),
            WorkloadSpec::new("first").parent("batch").priority(0),
            WorkloadSpec::new("second").parent("batch").priority(1),
        ],
    );
    let user = cc.allocate_in("user", 0, 1).unwrap();
    let held = user.try_acquire().unwrap();
    let first = cc.allocate_in("first", 0, 1).unwrap();
    let n = wake_yields_of_a_blocked_acquire(&cc, first, "first", move || drop(held));
    assert_eq!(n, 1);
    assert_eq!(node(&cc, "batch").wake_yields, 0, "counted at the leaf");
}
