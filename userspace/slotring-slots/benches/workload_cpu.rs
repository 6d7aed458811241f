//! `cargo xtask bench workload`, its CPU part: CPU slots scheduled by a
//! workload tree, with real threads doing real CPU work on this machine's
//! cores. Adds its keys to `target/bench/workload.json`.
//!
//! The budget is the number of cores, both as the global budget and as the
//! root's `max_concurrent_threads`. A bench thread runs tasks, each one
//! allocation of one slot: allocate in its workload, `acquire` (blocking),
//! spin a fixed number of iterations (calibrated at start to the wanted
//! time on an idle core), drop the slot and the allocation.
//!
//! * `wl_cpu_share_pct`: workloads `a` (weight 2) and `b` (weight 1) at
//!   one priority, each with four threads per core running 1 ms tasks
//!   for [`SHARE_RUN`]; each thread sums the time its slots were held
//!   (acquire's return to the drop, clipped to the run's window) per
//!   workload; the key is `a`'s % of the total. `wl_cpu_grants_ratio_a_b`
//!   is the tree's own count of grants, `a` over `b`. Four threads per
//!   core keep a waiter in each workload: with fewer, all of a
//!   workload's threads are at times between tasks or granted and not yet
//!   on a core, the tree sees it return from idle at its level's virtual
//!   time, and its lead is lost (the grants fall below 2:1).
//! * `wl_cpu_short_p99_ms`: a short query (0.5 ms task) every
//!   [`SHORT_EVERY`] in workload `short` at priority 0, its latency from
//!   the allocation to the drop, beside four threads per core of 1 ms
//!   tasks in workload `bg` at priority 1 that keep every slot taken;
//!   p99 over [`SHORT_RUN`]. A background task checks
//!   `AcquiredSlot::should_yield` after every [`CHECKPOINT_EVERY`] of its
//!   work, as a CPU-bound holder does between units of work, and when told
//!   to, releases its slot and waits for it again: the tree preempts it
//!   while a short query waits, or takes back a slot granted to a
//!   background thread that has not acquired it yet
//!   (`wl_cpu_preemptions_per_s` counts both).
//!   `wl_cpu_short_p99_ms_no_checkpoint` is the same with background tasks
//!   that never check (a slot acquired then goes back only at a task's end),
//!   `wl_cpu_short_p99_ms_flat` the same with no tree (every allocation
//!   plain, `max_min_fair`: the baseline; its checks never say yes), and
//!   `wl_cpu_short_p99_ms_alone` the short queries in the tree with no
//!   background, and `wl_cpu_short_p99_ms_busy_cores` the same while one
//!   plain thread per other core spins outside any slot: the cores are as
//!   busy as the tree keeps them (the background holds the other slots),
//!   with nothing to schedule, so it is the floor a work-conserving tree can
//!   reach on this machine (a busy sibling core stretches the query's work
//!   in the host). Each latency is split in three parts, and each part's
//!   p99 is a key: `wl_cpu_short_wait_p99_ms` (`_flat`), the wait for a
//!   slot (the allocation to acquire's return: what the slot scheduler
//!   decides); `wl_cpu_short_work_p99_ms` (`_alone`), the 0.5 ms of work,
//!   wall time (stretched when the kernel runs another thread on the
//!   query's core); and `wl_cpu_short_release_p99_ms` (`_alone`), the drop
//!   of the slot (long when the background thread it is handed to is
//!   woken onto the query's core and runs before the query's thread
//!   returns from the wake-up). `wl_cpu_short_slowest_pct_{wait,work,release}`
//!   say, of the tree's queries slower than 1.2 × the alone p99, in what %
//!   each part was the largest. `wl_cpu_bg_held_p99_ms` the p99 of the
//!   background's 1 ms tasks' holds beside them in the tree, stretched by
//!   the kernel's sharing of the cores: the one release a query at the
//!   higher priority waits for.
//!
//! The short queries also compete with the background threads for the
//! cores in the kernel: with every slot taken, a short query waits for a
//! slot's release (the next checkpoint of a preempted task, or without
//! checkpoints a 1 ms task ending), then runs while the other slots'
//! threads run too.
//!
//! Each of [`ROUNDS`] rounds runs the share, then the short queries in the
//! tree, flat, alone and beside busy cores (alternating, so that the machine's load falls on
//! all alike); every key is the median over rounds.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use slotring_benchkit::{Report, median, percentile};
use slotring_slots::{Allocation, ConcurrencyControl, Scheduler};
use slotring_throttle::{WorkloadSpec, WorkloadTree};

/// Rounds of every measurement (each key is their median).
const ROUNDS: usize = 5;
/// One share run.
const SHARE_RUN: Duration = Duration::from_secs(3);
/// One run of short queries.
const SHORT_RUN: Duration = Duration::from_secs(4);
/// A CPU-bound task.
const UNIT: Duration = Duration::from_millis(1);
/// A short query's task.
const SHORT_WORK: Duration = Duration::from_micros(500);
/// A short query's period.
const SHORT_EVERY: Duration = Duration::from_millis(10);
/// A background task's work between two checks of `should_yield`.
const CHECKPOINT_EVERY: Duration = Duration::from_micros(50);

/// Spin `iters` iterations of a dependent multiply-add.
fn spin(iters: u64) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..iters {
        x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
    }
    black_box(x);
}

/// Iterations of [`spin`] per nanosecond: the fastest of several timed
/// spins (the least disturbed by the machine's other work).
fn calibrate() -> f64 {
    const N: u64 = 2_000_000;
    spin(N);
    (0..9)
        .map(|_| {
            let t = Instant::now();
            spin(N);
            N as f64 / t.elapsed().as_nanos() as f64
        })
        .fold(0.0, f64::max)
}

/// Iterations of [`spin`] that take `d` on an idle core.
fn iters_for(per_ns: f64, d: Duration) -> u64 {
    (per_ns * d.as_nanos() as f64).round() as u64
}

/// Nanoseconds of `[from, to]` inside `[start, end]`.
fn clipped_ns(from: Instant, to: Instant, start: Instant, end: Instant) -> u64 {
    let (a, b) = (from.max(start), to.min(end));
    b.saturating_duration_since(a).as_nanos() as u64
}

/// Where a task allocates: a leaf of the control's tree, or (no tree)
/// plainly.
fn allocate(cc: &ConcurrencyControl, workload: Option<&str>) -> Allocation {
    match workload {
        Some(w) => cc.allocate_in(w, 0, 1),
        None => cc.allocate(0, 1),
    }
    .expect("an allocation of one slot")
}

/// One task: allocate, acquire, spin `iters`, release. Returns when the
/// slot was acquired and released.
fn task(cc: &ConcurrencyControl, workload: Option<&str>, iters: u64) -> (Instant, Instant) {
    let a = allocate(cc, workload);
    let slot = a.acquire().expect("a slot of a live allocation");
    let got = Instant::now();
    spin(iters);
    drop(slot);
    (got, Instant::now())
}

/// One background task: as [`task`], checking `should_yield` after every
/// `chunk` iterations (with `chunk` 0: never); told to yield, it releases
/// the slot and waits for it again. Returns when the slot was first
/// acquired and when the task's work was done.
fn checkpointed_task(
    cc: &ConcurrencyControl,
    workload: Option<&str>,
    iters: u64,
    chunk: u64,
) -> (Instant, Instant) {
    if chunk == 0 {
        return task(cc, workload, iters);
    }
    let a = allocate(cc, workload);
    let mut slot = a.acquire().expect("a slot of a live allocation");
    let got = Instant::now();
    let mut left = iters;
    while left > 0 {
        let n = left.min(chunk);
        spin(n);
        left -= n;
        if left > 0 && slot.should_yield() {
            drop(slot);
            slot = a.acquire().expect("the preempted allocation's slot back");
        }
    }
    drop(slot);
    (got, Instant::now())
}

/// A control with the budget `cores` and (with `specs`) the tree of
/// `specs` under the root `all`, capped at `cores`.
fn control(cores: u64, specs: Option<Vec<WorkloadSpec>>) -> ConcurrencyControl {
    let cc = match specs {
        Some(children) => {
            let mut all = vec![WorkloadSpec::new("all").max_concurrent_threads(cores)];
            all.extend(children.into_iter().map(|s| s.parent("all")));
            ConcurrencyControl::with_workloads(&WorkloadTree::new(all).expect("a valid tree"))
        }
        None => ConcurrencyControl::new(),
    };
    cc.set_max_concurrency(cores);
    cc.set_scheduler(Scheduler::MaxMinFair);
    cc
}

/// The grants through `name` so far.
fn grants(cc: &ConcurrencyControl, name: &str) -> u64 {
    cc.workloads()
        .into_iter()
        .find(|w| w.name == name)
        .unwrap_or_else(|| panic!("no workload {name}"))
        .grants
}

/// One share run: `(a's % of the held slot-time, a's grants / b's)`.
fn share_round(cores: u64, unit: u64) -> (f64, f64) {
    let cc = control(
        cores,
        Some(vec![
            WorkloadSpec::new("a").weight(2),
            WorkloadSpec::new("b").weight(1),
        ]),
    );
    // Threads per workload (see the module docs).
    let per = 4 * cores as usize;
    let held = [AtomicU64::new(0), AtomicU64::new(0)];
    // One window for every thread, once all are started.
    let start = Instant::now() + Duration::from_millis(20);
    let end = start + SHARE_RUN;
    std::thread::scope(|s| {
        for (i, w) in ["a", "b"].into_iter().enumerate() {
            for _ in 0..per {
                let (cc, held) = (&cc, &held);
                s.spawn(move || {
                    std::thread::sleep(start.saturating_duration_since(Instant::now()));
                    let mut ns = 0;
                    while Instant::now() < end {
                        let (got, done) = task(cc, Some(w), unit);
                        ns += clipped_ns(got, done, start, end);
                    }
                    held[i].fetch_add(ns, Ordering::Relaxed);
                });
            }
        }
    });
    let (a, b) = (
        held[0].load(Ordering::Relaxed) as f64,
        held[1].load(Ordering::Relaxed) as f64,
    );
    let ratio = grants(&cc, "a") as f64 / grants(&cc, "b") as f64;
    (100.0 * a / (a + b), ratio)
}

/// How the short queries run.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// In `short` (priority 0), beside `bg` (priority 1), whose tasks
    /// check `should_yield`.
    Tree,
    /// As `Tree`, with background tasks that never check.
    TreeNoCheckpoint,
    /// No tree: short and background allocations plain, `max_min_fair`.
    Flat,
    /// In the tree, with no background.
    Alone,
    /// In the tree, with no background in it, while `cores - 1` plain
    /// threads spin outside any slot: every other core busy, as the tree
    /// keeps it (the background holds the other slots), with nothing to
    /// schedule. The floor of a work-conserving tree on this machine.
    BusyCores,
}

/// One short query's latency and its three parts, in ms.
#[derive(Clone, Copy, Debug)]
struct Query {
    /// The allocation to the slot's drop.
    lat: f64,
    /// The allocation to acquire's return.
    wait: f64,
    /// The work, wall time.
    work: f64,
    /// The slot's drop.
    release: f64,
}

/// One short query: allocate, acquire, spin `iters`, release; timed.
fn short_query(cc: &ConcurrencyControl, workload: Option<&str>, iters: u64) -> Query {
    let asked = Instant::now();
    let a = allocate(cc, workload);
    let slot = a.acquire().expect("a slot of a live allocation");
    let got = Instant::now();
    spin(iters);
    let worked = Instant::now();
    drop(slot);
    let done = Instant::now();
    let ms = |from: Instant, to: Instant| (to - from).as_secs_f64() * 1e3;
    Query {
        lat: ms(asked, done),
        wait: ms(asked, got),
        work: ms(got, worked),
        release: ms(worked, done),
    }
}

/// One run of short queries, in ms.
struct ShortRun {
    /// Each query, timed.
    queries: Vec<Query>,
    /// Each background task's slot hold (acquire's return to the drop):
    /// how far the kernel stretched the 1 ms tasks the queries wait for.
    bg_held: Vec<f64>,
    /// Preemptions of the background per second of the run.
    preemptions_per_s: f64,
}

/// One run of short queries beside (or without) the background.
fn short_round(mode: Mode, cores: u64, unit: u64, short: u64, chunk: u64) -> ShortRun {
    let tree = || {
        Some(vec![
            WorkloadSpec::new("short").priority(0),
            WorkloadSpec::new("bg").priority(1),
        ])
    };
    let (cc, short_in, bg_in, bg_threads) = match mode {
        Mode::Tree | Mode::TreeNoCheckpoint => {
            (control(cores, tree()), Some("short"), Some("bg"), 4 * cores)
        }
        Mode::Flat => (control(cores, None), None, None, 4 * cores),
        Mode::Alone => (control(cores, tree()), Some("short"), None, 0),
        Mode::BusyCores => (control(cores, tree()), Some("short"), None, 0),
    };
    let spinners = match mode {
        Mode::BusyCores => cores.saturating_sub(1),
        _ => 0,
    };
    let chunk = match mode {
        Mode::TreeNoCheckpoint => 0,
        _ => chunk,
    };
    let stop = AtomicBool::new(false);
    let mut queries = Vec::new();
    let mut bg_held = Vec::new();
    std::thread::scope(|s| {
        let bg: Vec<_> = (0..bg_threads)
            .map(|_| {
                let (cc, stop) = (&cc, &stop);
                s.spawn(move || {
                    let mut held = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let (got, done) = checkpointed_task(cc, bg_in, unit, chunk);
                        held.push((done - got).as_secs_f64() * 1e3);
                    }
                    held
                })
            })
            .collect();
        for _ in 0..spinners {
            let stop = &stop;
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    spin(chunk.max(1));
                }
            });
        }
        // Let the background take every slot first.
        std::thread::sleep(Duration::from_millis(50));
        let end = Instant::now() + SHORT_RUN;
        let mut next = Instant::now();
        while next < end {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            queries.push(short_query(&cc, short_in, short));
            next = (next + SHORT_EVERY).max(Instant::now());
        }
        stop.store(true, Ordering::Relaxed);
        for t in bg {
            bg_held.extend(t.join().expect("a background thread"));
        }
    });
    let mut preemptions_per_s = 0.0;
    if short_in.is_some() {
        assert_eq!(
            grants(&cc, "short"),
            queries.len() as u64,
            "every short query was granted through its workload"
        );
        let bg = cc.workloads().into_iter().find(|w| w.name == "bg");
        let preempted = bg.map_or(0, |w| w.preemptions);
        preemptions_per_s = preempted as f64 / SHORT_RUN.as_secs_f64();
    }
    ShortRun {
        queries,
        bg_held,
        preemptions_per_s,
    }
}

/// One mode's per-round numbers, ms.
#[derive(Default)]
struct Short {
    p99: Vec<f64>,
    p50: Vec<f64>,
    wait_p99: Vec<f64>,
    work_p99: Vec<f64>,
    release_p99: Vec<f64>,
    /// Every round's queries (for the split of the slowest).
    queries: Vec<Query>,
    /// The background tasks' hold, p99 per round.
    bg_held_p99: Vec<f64>,
    /// The last round's background hold, max (for the log).
    bg_held_max: f64,
    /// Preemptions per second, per round.
    preemptions_per_s: Vec<f64>,
}

impl Short {
    /// Run a round of `mode` and record it.
    fn round(&mut self, mode: Mode, cores: u64, unit: u64, short: u64, chunk: u64) {
        let mut run = short_round(mode, cores, unit, short, chunk);
        self.preemptions_per_s.push(run.preemptions_per_s);
        let part = |f: fn(&Query) -> f64| run.queries.iter().map(f).collect::<Vec<_>>();
        let (mut lat, mut wait) = (part(|q| q.lat), part(|q| q.wait));
        let (mut work, mut release) = (part(|q| q.work), part(|q| q.release));
        self.p99.push(percentile(&mut lat, 99.0));
        self.p50.push(median(&mut lat));
        self.wait_p99.push(percentile(&mut wait, 99.0));
        self.work_p99.push(percentile(&mut work, 99.0));
        self.release_p99.push(percentile(&mut release, 99.0));
        self.queries.extend(run.queries);
        self.bg_held_p99.push(percentile(&mut run.bg_held, 99.0));
        self.bg_held_max = percentile(&mut run.bg_held, 100.0);
    }

    /// The last round, for the log.
    fn last(&self) -> String {
        let l = |v: &[f64]| v.last().copied().unwrap_or(f64::NAN);
        let bg = match l(&self.bg_held_p99) {
            0.0 => String::new(),
            p99 => format!(
                " (background tasks held p99 {p99:.3} max {:.3})",
                self.bg_held_max
            ),
        };
        format!(
            "p99 {:.3} p50 {:.3} wait p99 {:.3} work p99 {:.3} release p99 {:.3}{bg} preemptions/s {:.0}",
            l(&self.p99),
            l(&self.p50),
            l(&self.wait_p99),
            l(&self.work_p99),
            l(&self.release_p99),
            l(&self.preemptions_per_s),
        )
    }

    /// Of the queries slower than `over` ms, the % in which the wait, the
    /// work and the release (in that order) was the largest part.
    fn slowest_split(&self, over: f64) -> [f64; 3] {
        let slow: Vec<&Query> = self.queries.iter().filter(|q| q.lat > over).collect();
        let mut n = [0usize; 3];
        for q in &slow {
            let parts = [q.wait, q.work, q.release];
            let largest = (0..3)
                .max_by(|&a, &b| parts[a].total_cmp(&parts[b]))
                .expect("three parts");
            n[largest] += 1;
        }
        n.map(|c| 100.0 * c as f64 / slow.len().max(1) as f64)
    }
}

fn main() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let per_ns = calibrate();
    let unit = iters_for(per_ns, UNIT);
    let short = iters_for(per_ns, SHORT_WORK);
    let chunk = iters_for(per_ns, CHECKPOINT_EVERY).max(1);
    eprintln!(
        "workload_cpu: {cores} cores, budget {cores}; {unit} iterations per 1 ms task, {short} per short query, a check every {chunk}"
    );
    let (mut share, mut ratio) = (vec![], vec![]);
    let (mut tree, mut flat, mut alone) = (Short::default(), Short::default(), Short::default());
    let (mut unchecked, mut busy) = (Short::default(), Short::default());
    for round in 0..ROUNDS {
        let (s, g) = share_round(cores, unit);
        share.push(s);
        ratio.push(g);
        tree.round(Mode::Tree, cores, unit, short, chunk);
        unchecked.round(Mode::TreeNoCheckpoint, cores, unit, short, chunk);
        flat.round(Mode::Flat, cores, unit, short, chunk);
        alone.round(Mode::Alone, cores, unit, short, chunk);
        busy.round(Mode::BusyCores, cores, unit, short, chunk);
        eprintln!(
            "  round {round}: share {s:.1} %, grants {g:.3}; short ms: tree {}; no checks {}; flat {}; alone {}; other cores spinning {}",
            tree.last(),
            unchecked.last(),
            flat.last(),
            alone.last(),
            busy.last()
        );
    }
    let mut r = Report::adding_to("workload");
    r.put(
        "wl_cpu_share_pct",
        median(&mut share),
        "%; weight 2 vs 1, held slot-time of 1 ms tasks, budget = cores; goal 67 +- 3",
    );
    r.put(
        "wl_cpu_grants_ratio_a_b",
        median(&mut ratio),
        "the tree's grants, weight 2 over weight 1",
    );
    let tree_p99 = median(&mut tree.p99);
    let alone_p99 = median(&mut alone.p99);
    r.put(
        "wl_cpu_short_p99_ms",
        tree_p99,
        "ms; 0.5 ms queries at priority 0 beside 1 ms tasks at 1 saturating the budget, checking should_yield every 50 us",
    );
    r.put(
        "wl_cpu_short_p99_ms_no_checkpoint",
        median(&mut unchecked.p99),
        "ms; the same beside background tasks that never check should_yield",
    );
    r.put(
        "wl_cpu_preemptions_per_s",
        median(&mut tree.preemptions_per_s),
        "background slots preempted for the short queries, per s",
    );
    r.put(
        "wl_cpu_short_p99_ms_alone",
        alone_p99,
        "ms; the same queries with no background",
    );
    r.put(
        "wl_cpu_short_p99_ms_flat",
        median(&mut flat.p99),
        "ms; the same beside the background with no tree, max_min_fair (baseline)",
    );
    let busy_p99 = median(&mut busy.p99);
    r.put(
        "wl_cpu_short_p99_ms_busy_cores",
        busy_p99,
        "ms; the same queries with no background while plain threads spin on the other cores (no slots): the machine's floor for a work-conserving tree",
    );
    r.put(
        "wl_cpu_short_work_p99_ms_busy_cores",
        median(&mut busy.work_p99),
        "ms; of them, the 0.5 ms of work, wall time, p99",
    );
    r.put(
        "wl_cpu_short_p99_over_busy_cores",
        tree_p99 / busy_p99,
        "ratio; wl_cpu_short_p99_ms over the floor",
    );
    r.put(
        "wl_cpu_short_p99_over_alone",
        tree_p99 / alone_p99,
        "ratio; goal <= 1.2",
    );
    r.put(
        "wl_cpu_short_wait_p99_ms",
        median(&mut tree.wait_p99),
        "ms; of wl_cpu_short_p99_ms's queries, the wait for a slot, p99",
    );
    r.put(
        "wl_cpu_short_work_p99_ms",
        median(&mut tree.work_p99),
        "ms; of wl_cpu_short_p99_ms's queries, the 0.5 ms of work, wall time, p99",
    );
    r.put(
        "wl_cpu_short_work_p99_ms_alone",
        median(&mut alone.work_p99),
        "ms; the same with no background",
    );
    r.put(
        "wl_cpu_short_release_p99_ms",
        median(&mut tree.release_p99),
        "ms; of wl_cpu_short_p99_ms's queries, the drop of the slot (handed to a background thread), p99",
    );
    r.put(
        "wl_cpu_short_release_p99_ms_alone",
        median(&mut alone.release_p99),
        "ms; the same with no background (no thread to hand it to)",
    );
    let [wait_pct, work_pct, release_pct] = tree.slowest_split(1.2 * alone_p99);
    for (key, pct, part) in [
        ("wl_cpu_short_slowest_pct_wait", wait_pct, "the wait"),
        ("wl_cpu_short_slowest_pct_work", work_pct, "the work"),
        (
            "wl_cpu_short_slowest_pct_release",
            release_pct,
            "the release",
        ),
    ] {
        r.put(
            key,
            pct,
            &format!("%; of the tree's queries slower than 1.2 x the alone p99 (every round), those whose largest part was {part}"),
        );
    }
    r.put(
        "wl_cpu_bg_held_p99_ms",
        median(&mut tree.bg_held_p99),
        "ms; beside them, the background's 1 ms tasks' slot hold, p99 (the one release a query waits for)",
    );
    r.put(
        "wl_cpu_short_wait_p99_ms_flat",
        median(&mut flat.wait_p99),
        "ms; the same with no tree",
    );
    r.finish().expect("write the workload report");
}
