//! The controller ([`BudgetController`]) replayed on the signals of the
//! bench's three workloads, one window per 100 ms: (c) IO-bound scans and
//! short queries, recorded; (a) CPU-bound scans and (b) a CPU hog,
//! recorded run-queue shares closed over the slot wait that CPU-bound
//! greedy scans have at each budget. Each test feeds the whole sample
//! ([`RunqSample`]: run-queue and on-CPU time, running leases, demand,
//! slot wait, window length), as the kernel loop does.

use slotring_slots::{AdaptiveConfig, BudgetController, RunqSample, Step};

const WINDOW_NS: u64 = 100_000_000;

/// The defaults on a 2-CPU machine with the bench's ceiling (2 × cores).
fn ctl() -> BudgetController {
    BudgetController::new(AdaptiveConfig {
        cpus: 2,
        ..AdaptiveConfig::with_ceiling(4)
    })
    .unwrap()
}

/// Bench (c) (`slotring run`, its IO-bound default workload: 3 scans of 4
/// threads, throttled to 64 MiB/s, parking their leases in every read's
/// wait; a short query every 100 ms) on 2 cores, ceiling 4, under the
/// run-queue law alone, one window per 100 ms from the first window with
/// accounting (the run's `/metrics` scraped every 100 ms: the growth of
/// `slotring_slots_adaptive_{runq,oncpu}_seconds_total` and
/// `slotring_slots_waiting_seconds_total`, and `slotring_slots_in_use`,
/// `slotring_slots_waiters` at its end; load average 5 from other work on
/// the machine). Per window, in units of 0.1 ms: run-queue time and
/// on-CPU time of running leases, slot wait of blocked `acquire` calls;
/// then slots in use and whether an allocation waited at its end. That law
/// went from 4 to 1 in the first window (the scans' start: 12 threads
/// runnable at once, 81% run-queue share) and stayed at 1 for the run
/// (budget mean 1.01), while in windows 1..=4 eleven scan threads waited
/// for slots (1.1 s of slot wait per 100 ms) beside idle CPU (the leases
/// claimed 0.9 of 2 CPUs), and later bursts of slot wait (17–42 ms) met
/// a budget of 1. Short queries hold a non-competing slot (`allocate(1,
/// 1)` under max-min fair): the waiters are scan threads.
const IO_BOUND: [(u64, u64, u64, u64, u8); 99] = [
    (1226, 278, 2276, 2, 1),
    (804, 414, 11025, 1, 1),
    (504, 343, 11434, 1, 1),
    (492, 444, 11003, 1, 1),
    (461, 487, 11045, 1, 1),
    (81, 306, 650, 0, 0),
    (0, 236, 0, 0, 0),
    (13, 219, 0, 0, 0),
    (0, 234, 0, 0, 0),
    (0, 222, 0, 0, 0),
    (8, 207, 0, 0, 0),
    (0, 211, 0, 0, 0),
    (1, 212, 0, 0, 0),
    (0, 215, 0, 0, 0),
    (0, 213, 0, 1, 0),
    (5, 206, 0, 0, 0),
    (6, 211, 0, 0, 0),
    (0, 197, 38, 2, 1),
    (84, 209, 172, 0, 0),
    (114, 201, 210, 0, 0),
    (16, 216, 15, 0, 0),
    (3, 205, 0, 0, 0),
    (7, 218, 0, 0, 0),
    (15, 217, 0, 0, 0),
    (0, 214, 0, 0, 0),
    (0, 217, 0, 1, 0),
    (15, 225, 0, 0, 0),
    (7, 197, 0, 0, 0),
    (1, 207, 0, 0, 0),
    (0, 207, 0, 1, 0),
    (14, 205, 0, 0, 0),
    (1, 208, 0, 0, 0),
    (0, 207, 0, 0, 0),
    (6, 224, 0, 0, 0),
    (2, 210, 0, 0, 0),
    (8, 208, 0, 0, 0),
    (20, 212, 0, 0, 0),
    (0, 224, 0, 0, 0),
    (1, 212, 0, 1, 0),
    (9, 222, 0, 0, 0),
    (101, 203, 191, 0, 0),
    (0, 218, 0, 0, 0),
    (2, 216, 0, 0, 0),
    (0, 207, 0, 1, 0),
    (12, 211, 0, 0, 0),
    (8, 216, 0, 0, 0),
    (0, 208, 0, 0, 0),
    (2, 225, 0, 0, 0),
    (2, 224, 0, 1, 0),
    (19, 210, 0, 0, 0),
    (4, 219, 0, 0, 0),
    (7, 221, 0, 0, 0),
    (17, 221, 0, 0, 0),
    (3, 215, 0, 0, 0),
    (28, 213, 0, 0, 0),
    (2, 211, 0, 1, 0),
    (0, 204, 0, 1, 0),
    (6, 215, 1, 0, 0),
    (5, 213, 0, 0, 0),
    (42, 202, 0, 0, 0),
    (25, 209, 0, 0, 0),
    (107, 209, 65, 0, 0),
    (3, 215, 0, 0, 0),
    (0, 217, 0, 1, 0),
    (2, 222, 0, 0, 0),
    (0, 212, 0, 0, 0),
    (30, 215, 8, 0, 0),
    (73, 220, 0, 1, 0),
    (3, 204, 424, 0, 0),
    (102, 223, 26, 0, 0),
    (7, 208, 0, 0, 0),
    (2, 208, 0, 0, 0),
    (0, 211, 0, 1, 0),
    (1, 215, 0, 0, 0),
    (1, 217, 0, 0, 0),
    (6, 218, 0, 0, 0),
    (6, 219, 0, 0, 0),
    (10, 211, 7, 0, 0),
    (1, 220, 0, 1, 0),
    (6, 216, 5, 0, 0),
    (1, 206, 0, 0, 0),
    (0, 215, 0, 0, 0),
    (0, 218, 0, 0, 0),
    (0, 226, 0, 0, 0),
    (14, 212, 0, 1, 0),
    (15, 202, 22, 0, 0),
    (79, 227, 0, 0, 0),
    (25, 215, 0, 0, 0),
    (0, 229, 0, 0, 0),
    (1, 228, 0, 1, 0),
    (0, 222, 0, 0, 0),
    (1, 215, 0, 0, 0),
    (0, 232, 0, 0, 0),
    (37, 208, 0, 0, 0),
    (8, 204, 0, 0, 0),
    (17, 222, 0, 0, 0),
    (0, 214, 0, 0, 0),
    (23, 215, 8, 0, 0),
    (75, 215, 0, 1, 0),
];

fn io_sample(&(runq, on_cpu, wait, running, waiting): &(u64, u64, u64, u64, u8)) -> RunqSample {
    RunqSample {
        runq_ns: runq * 100_000,
        on_cpu_ns: on_cpu * 100_000,
        running,
        waiting: waiting != 0,
        wait_ns: wait * 100_000,
        window_ns: WINDOW_NS,
    }
}

/// The budget after each window.
fn replay(c: &mut BudgetController, samples: impl IntoIterator<Item = RunqSample>) -> Vec<u64> {
    samples
        .into_iter()
        .map(|s| {
            c.update(s);
            c.budget()
        })
        .collect()
}

#[test]
fn io_bound_waiters_keep_the_budget_off_the_floor() {
    let trace = replay(&mut ctl(), IO_BOUND.iter().map(io_sample));
    // Windows where allocations queued for slots (at least 10 ms of slot
    // wait), from the third on (the first steps down on the start's real
    // congestion; the second is the ignored window after a step down).
    let queued: Vec<usize> = (2..IO_BOUND.len())
        .filter(|&i| IO_BOUND[i].2 >= 100)
        .collect();
    assert!(queued.len() >= 5, "{queued:?}");
    // A queued window may end at 1 while the probe hold of 2 runs out
    // (one isolated burst after a harmless step down), never two in a row.
    let at_floor: Vec<usize> = queued.iter().copied().filter(|&i| trace[i] == 1).collect();
    assert!(
        at_floor.windows(2).all(|w| w[1] > w[0] + 1),
        "the budget is 1 at the end of windows {at_floor:?} where allocations queued: {trace:?}"
    );
    let mean = queued.iter().map(|&i| trace[i]).sum::<u64>() as f64 / queued.len() as f64;
    assert!(
        mean >= 2.0,
        "mean budget {mean} where allocations queued: {trace:?}"
    );
    // The start's congestion (81% run-queue share, CPUs claimed) still
    // steps down at once.
    assert!(trace[0] < 4, "{trace:?}");
    assert!(trace.iter().all(|&b| (1..=4).contains(&b)), "{trace:?}");
}

/// Bench (a)'s and (b)'s scans: 3 allocations of 4 CPU-bound threads each
/// on 2 cores; `b` of the 12 run, the other `12 − b` wait in `acquire`
/// for the whole window. `pct` is the run-queue share of the running
/// leases.
fn greedy_cpu(b: u64, threads: u64, pct: u64) -> RunqSample {
    let total = WINDOW_NS * b;
    RunqSample {
        runq_ns: total * pct / 100,
        on_cpu_ns: total * (100 - pct) / 100,
        running: b,
        waiting: true,
        wait_ns: WINDOW_NS * threads.saturating_sub(b),
        window_ns: WINDOW_NS,
    }
}

/// Recorded run-queue shares (%) with `threads` greedy CPU-bound threads
/// waiting for what the budget leaves them; the budget after each window.
fn replay_greedy(pcts: &[u64], threads: u64) -> Vec<u64> {
    let mut c = ctl();
    pcts.iter()
        .map(|&pct| {
            let b = c.budget();
            c.update(greedy_cpu(b, threads, pct));
            c.budget()
        })
        .collect()
}

/// CPU-bound leases alone on 2 cores: `1 − 2 / b` of their time in the
/// run queue above 2, none at or below.
fn cpu_bound_pct(b: u64) -> u64 {
    if b <= 2 { 0 } else { 100 - 200 / b }
}

#[test]
fn cpu_bound_still_steps_down_to_the_cores_whatever_the_waiters() {
    // 10 of 12 threads waiting at 2 slots (1 s of slot wait per window):
    // the leases claim both CPUs, a waiter would only queue for one.
    let mut c = ctl();
    let mut trace = Vec::new();
    for _ in 0..200 {
        let b = c.budget();
        c.update(greedy_cpu(b, 12, cpu_bound_pct(b)));
        trace.push(c.budget());
    }
    assert_eq!(
        trace[0], 2,
        "from 4 (50% share) to the cores at once: {trace:?}"
    );
    let tail = &trace[20..];
    assert!(tail.iter().all(|&b| (2..=3).contains(&b)), "{tail:?}");
    let above = tail.iter().filter(|&&b| b == 3).count();
    assert!(
        above * 16 <= tail.len() + 16,
        "probes of 3 at most once per max hold: {tail:?}"
    );
    // Below the CPUs the waiters would run on the idle CPU: back up at once.
    let mut c = ctl();
    c.update(greedy_cpu(4, 12, 90));
    assert_eq!(c.budget(), 1);
    c.update(greedy_cpu(1, 12, 0));
    assert_eq!(c.update(greedy_cpu(1, 12, 0)), Step::Up);
}

/// Run-queue shares (%) of bench (a) on a machine loaded by other builds
/// (as `noise_from_other_processes_does_not_give_up_a_cpu` in the
/// controller's unit tests), closed over the greedy scans' slot wait.
const CPU_LOADED: [u64; 80] = [
    47, 23, 18, 26, 16, 19, 13, 13, 5, 36, 14, 30, 15, 11, 8, 9, 11, 2, 2, 34, 15, 21, 25, 26, 32,
    17, 23, 16, 25, 30, 18, 12, 10, 12, 11, 11, 18, 16, 13, 24, 15, 6, 11, 7, 2, 2, 2, 5, 33, 24,
    17, 13, 24, 31, 35, 4, 4, 5, 30, 33, 9, 5, 3, 3, 5, 2, 24, 22, 20, 18, 14, 16, 26, 28, 19, 15,
    23, 9, 16, 14,
];

#[test]
fn cpu_bound_on_a_loaded_machine_keeps_the_cores() {
    let trace = replay_greedy(&CPU_LOADED, 12);
    assert!(trace.iter().all(|&b| (2..=3).contains(&b)), "{trace:?}");
}

/// Run-queue shares (%) of running leases recorded on the kernel by
/// `slotring-bpf`'s `tests/adaptive.rs` (2 cores, ceiling 4, one
/// allocation of 4 CPU-bound workers; `stress-ng --cpu 4` from window 15
/// to 34), closed over the workers' slot wait (`4 − b` of them wait).
const HOG: [u64; 59] = [
    52, 52, 50, 10, 1, 9, 4, 3, 3, 1, 32, 50, 27, 1, 1, 68, 64, 67, 67, 68, 65, 68, 66, 60, 66, 69,
    67, 67, 57, 59, 60, 67, 57, 68, 50, 0, 0, 2, 32, 2, 1, 2, 34, 3, 0, 1, 3, 3, 34, 4, 4, 2, 5, 2,
    3, 2, 3, 3, 3,
];

#[test]
fn a_cpu_hog_drives_the_budget_to_the_floor_and_it_recovers() {
    let trace = replay_greedy(&HOG, 4);
    assert!(trace[16..=34].iter().all(|&b| b == 1), "{trace:?}");
    assert!(trace[35..=38].iter().any(|&b| b >= 2), "{trace:?}");
}
