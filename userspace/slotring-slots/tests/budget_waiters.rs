//! The waiter terms of the controller's law ("What a step down costs" in
//! `slotring_slots::adaptive`), window by window with exact numbers: a
//! step down that costs more slot wait than it saves holds, a multi-slot
//! step stops where the wait outweighs it, waiters beside free CPUs that
//! cost more than the run queue count as calm, and waiters beside CPUs the
//! leases claim cost nothing.

use slotring_slots::{AdaptiveConfig, BudgetController, RunqSample, Step};

const WINDOW_NS: u64 = 100_000_000;

/// The defaults on a 2-CPU machine, ceiling `ceiling`.
fn ctl(ceiling: u64) -> BudgetController {
    BudgetController::new(AdaptiveConfig {
        cpus: 2,
        ..AdaptiveConfig::with_ceiling(ceiling)
    })
    .unwrap()
}

#[test]
fn a_step_down_costs_what_it_saves() {
    // 2 leases on 2 CPUs claiming half of them (IO between), 50% of their
    // time in the run queue: the run-queue law goes to 1 (supply 1 CPU).
    let base = RunqSample {
        runq_ns: 50_000_000,
        on_cpu_ns: 50_000_000,
        running: 2,
        waiting: true,
        wait_ns: 0,
        window_ns: WINDOW_NS,
    };
    let mut c = ctl(2);
    assert_eq!(c.update(base), Step::Down, "no waiter, no cost");
    assert_eq!(c.budget(), 1);
    // free = (1 − 100/200) × (1 − 0.5) = 0.25; excess = 50 − 50/9 = 44.4
    // ms. A slot wait whose free part per running lease exceeds it holds.
    let mut c = ctl(2);
    let wait = |ms: u64| RunqSample {
        wait_ns: ms * 1_000_000,
        ..base
    };
    // 340 ms × 0.25 / 2 = 42.5 ms < 44.4: the step is worth it.
    assert_eq!(c.clone().update(wait(340)), Step::Down);
    // 370 ms × 0.25 / 2 = 46.25 ms > 44.4: it is not.
    assert_eq!(c.update(wait(370)), Step::Hold);
    assert_eq!(c.budget(), 2);
    // The same wait beside CPUs the leases claim (200 ms of 2 CPUs) costs
    // nothing: down.
    let claimed = RunqSample {
        runq_ns: 100_000_000,
        on_cpu_ns: 100_000_000,
        wait_ns: 1_000_000_000,
        ..base
    };
    let mut c = ctl(2);
    assert_eq!(c.update(claimed), Step::Down);
    // Without a window length the waiter terms are off.
    let mut c = ctl(2);
    let unknown = RunqSample {
        window_ns: 0,
        ..wait(10_000)
    };
    assert_eq!(c.update(unknown), Step::Down);
}

#[test]
fn a_multi_slot_step_stops_where_the_wait_outweighs_it() {
    // 4 leases claiming 1 of 2 CPUs, 60% run-queue share: the run-queue
    // law goes to 2 (supply 1.6 CPUs carries 1.78 → 2 leases) in one step.
    // free = 0.5 × 0.4 = 0.2; excess = 60 − 40/9 = 55.6 ms.
    let s = |wait_ms: u64| RunqSample {
        runq_ns: 60_000_000,
        on_cpu_ns: 40_000_000,
        running: 4,
        waiting: true,
        wait_ns: wait_ms * 1_000_000,
        window_ns: WINDOW_NS,
    };
    let mut c = ctl(4);
    c.update(s(0));
    assert_eq!(c.budget(), 2, "the run-queue law alone");
    // 800 ms × 0.2 / 4 = 40 ms per slot: one slot is affordable, not two.
    let mut c = ctl(4);
    assert_eq!(c.update(s(800)), Step::Down);
    assert_eq!(c.budget(), 3);
}

#[test]
fn waiters_that_cost_more_than_the_run_queue_count_as_calm() {
    let mut c = ctl(4);
    // Down to 1 on congestion (CPUs claimed), the ignored window.
    c.update(RunqSample {
        runq_ns: 360_000_000,
        on_cpu_ns: 40_000_000,
        running: 4,
        waiting: true,
        ..RunqSample::default()
    });
    c.update(RunqSample::default());
    assert_eq!(c.budget(), 1);
    // At 1 on 2 CPUs, 20% run-queue share (above the target: not calm by
    // the share), the lease claims half the CPUs: free = 0.5 × 0.8 = 0.4.
    let s = |wait_ms: u64| RunqSample {
        runq_ns: 20_000_000,
        on_cpu_ns: 80_000_000,
        running: 1,
        waiting: true,
        wait_ns: wait_ms * 1_000_000,
        window_ns: WINDOW_NS,
    };
    // 90 ms × 0.4 / 2 = 18 ms < 20 ms of run-queue time: hold.
    for _ in 0..10 {
        assert_eq!(c.clone().update(s(90)), Step::Hold);
    }
    // 110 ms × 0.4 / 2 = 22 ms > 20 ms: calm, one slot more.
    assert_eq!(c.update(s(110)), Step::Up);
    assert_eq!(c.budget(), 2);
}
