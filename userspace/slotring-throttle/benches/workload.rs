//! `cargo xtask bench workload` (phase 1, provisional): the workload tree's
//! micro-measurements that need no disk. Writes `target/bench/workload.json`.
//!
//! * `wl_charge_ns_3level` / `wl_charge_ns_flat`: the no-wait charge (a
//!   permit taken and dropped) by 2 threads at once on one leaf of a
//!   three-level path (`all` capped → `customer` → `query`) and of a flat
//!   one (`all` capped → `query`); `wl_charge_ns_3level_3caps` caps every
//!   level; `throttler_charge_ns` is today's flat `Throttler::reserve`.
//!   The flat and three-level charges run in alternate rounds, and their
//!   goal's ratio is the median of the rounds' ratios (`paired`), so that
//!   both sides of it see the same host.
//! * `wl_push_pop_ns_10k`: one request queued and one dispatched, with
//!   10,000 leaves under one fair level, each holding a queued request: the
//!   root's in-flight limit of 1 makes every request queue, and each
//!   completion hands the place to the next in the fair order.
//!   `wl_push_pop_ns_10k_bench_overhead` is the same loop with the
//!   scheduler replaced by nothing: the bench's own share (its waker `Arc`
//!   allocated per request, its `Mutex` sink, its slab of requests), which
//!   `wl_push_pop_ns_10k` includes. `wl_push_pop_ns_10` is the same loop
//!   over 10 leaves, whose state stays in the cache: the scheduler's own
//!   work, apart from the cost of reaching 10,000 leaves' state.
//! * `mem_cold_line_ns`: the machine's floor for that cost, a load of one
//!   cache line that is not in the core's caches (a chase of dependent loads
//!   through a random cycle over 64 MiB, as lmbench's `lat_mem_rd` does). A
//!   round over 10,000 leaves reaches each one's state cold;
//!   `wl_push_pop_cold_lines_10k` is what 10,000 leaves add to 10, in such
//!   loads.
//! * `wl_grant_release_ns` / `tokio_semaphore_ns`: a CPU slot taken and
//!   given back by 2 threads at once, nothing queued (a tree with
//!   `max_concurrent_threads` at the root and the leaf), beside
//!   `tokio::sync::Semaphore::try_acquire` and its permit's drop.
//!   `wl_grant_release_ns_1level` limits the root only (one limit taken and
//!   given back, as one semaphore); `tokio_semaphore_ns_2` takes and gives
//!   back two semaphores (two limits on two lines, as the root and leaf
//!   limits are). The tree and tokio's semaphore run in alternate rounds,
//!   as the charges do.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use slotring_benchkit::{Report, median, ns_per_iter_threads, paired};
use slotring_throttle::{
    Resource, Source, Throttle, Throttler, WorkloadScheduler, WorkloadSpec, WorkloadTree,
};

const FAST: u64 = 1 << 44;
const AMOUNT: u64 = 4096;

/// Rounds of the two-thread micro-measurements: 7, or 7 pairs.
const ROUNDS: usize = 7;

/// One round of the no-wait charge on `leaf` of `tree`, per call.
fn charge_round(tree: Vec<WorkloadSpec>, leaf: &str) -> impl FnMut() -> f64 {
    let s = WorkloadScheduler::new(&WorkloadTree::new(tree).unwrap(), Resource::Io).unwrap();
    let q = s.workload(leaf).unwrap();
    move || {
        ns_per_iter_threads(1, 2, 500_000, |_| {
            let p = q.try_acquire(AMOUNT).unwrap().expect("never in debt");
            std::hint::black_box(&p);
        })
    }
}

/// The median of [`ROUNDS`] calls of `round`.
fn median_of_rounds(mut round: impl FnMut() -> f64) -> f64 {
    let mut samples: Vec<f64> = (0..ROUNDS).map(|_| round()).collect();
    median(&mut samples)
}

fn charge_ns(tree: Vec<WorkloadSpec>, leaf: &str) -> f64 {
    median_of_rounds(charge_round(tree, leaf))
}

/// Pushes the id of the request it belongs to.
struct IdWaker {
    id: u64,
    sink: Arc<Mutex<Vec<u64>>>,
}

impl Wake for IdWaker {
    fn wake(self: Arc<Self>) {
        self.sink.lock().unwrap().push(self.id);
    }
}

fn push_pop_ns(leaves: usize, iters: usize) -> f64 {
    let mut specs = vec![WorkloadSpec::new("all").max_io_requests(1)];
    specs.extend((0..leaves).map(|i| WorkloadSpec::new(format!("l{i}")).parent("all")));
    let s = WorkloadScheduler::new(&WorkloadTree::new(specs).unwrap(), Resource::Io).unwrap();
    let ws: Vec<_> = (0..leaves)
        .map(|i| s.workload(&format!("l{i}")).unwrap())
        .collect();
    let sink = Arc::new(Mutex::new(Vec::new()));
    // Ids are sequential: a slab indexed by id (the scheduler's own map is
    // what is measured, not the bench's).
    let mut waiting: Vec<Option<(slotring_throttle::Request, Waker)>> = Vec::new();
    let mut next_id = 0u64;
    let mut push = |k: usize, waiting: &mut Vec<Option<(slotring_throttle::Request, Waker)>>| {
        let id = next_id;
        next_id += 1;
        let waker = Waker::from(Arc::new(IdWaker {
            id,
            sink: sink.clone(),
        }));
        let mut r = ws[k % leaves].request(AMOUNT);
        assert!(r.poll(&mut Context::from_waker(&waker)).is_pending());
        waiting.push(Some((r, waker)));
    };
    let mut held = ws[0].try_acquire(AMOUNT).unwrap().unwrap();
    for k in 0..leaves {
        push(k, &mut waiting);
    }
    let mut samples = Vec::new();
    for round in 0..5 {
        let start = Instant::now();
        for k in 0..iters {
            push(round * iters + k, &mut waiting);
            drop(held);
            let id = sink.lock().unwrap().pop().expect("one dispatched");
            let (mut r, waker) = waiting[id as usize].take().unwrap();
            held = match r.poll(&mut Context::from_waker(&waker)) {
                Poll::Ready(p) => p.unwrap(),
                Poll::Pending => panic!("woken without its turn"),
            };
        }
        samples.push(start.elapsed().as_nanos() as f64 / iters as f64);
    }
    assert_eq!(s.queued() as usize, leaves);
    median(&mut samples)
}

/// [`push_pop_ns`]'s loop with the scheduler replaced by nothing: each
/// iteration allocates a waker and keeps it where the request would be,
/// wakes the oldest waiting one (the order a round over equal leaves
/// dispatches in) into the sink, pops the sink and takes that entry out.
fn push_pop_overhead_ns(leaves: usize, iters: usize) -> f64 {
    let sink = Arc::new(Mutex::new(Vec::new()));
    let mut waiting: Vec<Option<(u64, Waker)>> = Vec::new();
    let mut next_id = 0u64;
    let mut push = |waiting: &mut Vec<Option<(u64, Waker)>>| {
        let id = next_id;
        next_id += 1;
        let waker = Waker::from(Arc::new(IdWaker {
            id,
            sink: sink.clone(),
        }));
        waiting.push(Some((id, waker)));
    };
    for _ in 0..leaves {
        push(&mut waiting);
    }
    let mut oldest = 0usize;
    let mut samples = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..iters {
            push(&mut waiting);
            let w = waiting[oldest].as_ref().expect("waiting").1.clone();
            oldest += 1;
            w.wake();
            let id = sink.lock().unwrap().pop().expect("one woken");
            let (token, waker) = waiting[id as usize].take().unwrap();
            std::hint::black_box((token, waker));
        }
        samples.push(start.elapsed().as_nanos() as f64 / iters as f64);
    }
    median(&mut samples)
}

/// `mem_cold_line_ns`: ns per load, each load's address the value the
/// previous one read, through one random cycle over `bytes` (one `usize`
/// per 64-byte line), median of 5 rounds.
fn cold_line_ns(bytes: usize) -> f64 {
    const LINE: usize = 64 / std::mem::size_of::<usize>();
    let lines = bytes / 64;
    // A random cyclic order of the lines (Sattolo's shuffle, a fixed
    // xorshift seed): every line is visited once per cycle.
    let mut order: Vec<usize> = (0..lines).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % i as u64) as usize);
    }
    let mut next = vec![0usize; lines * LINE];
    for k in 0..lines {
        next[order[k] * LINE] = order[(k + 1) % lines] * LINE;
    }
    let loads = 2_000_000;
    let mut at = 0;
    let mut samples = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..loads {
            at = next[at];
        }
        samples.push(start.elapsed().as_nanos() as f64 / loads as f64);
    }
    std::hint::black_box(at);
    median(&mut samples)
}

/// One round of a CPU slot taken and given back, per call.
fn grant_release_round(leaf_limit: bool) -> impl FnMut() -> f64 {
    let leaf = WorkloadSpec::new("q").parent("all");
    let cpu = WorkloadScheduler::new(
        &WorkloadTree::new(vec![
            WorkloadSpec::new("all").max_concurrent_threads(1 << 20),
            if leaf_limit {
                leaf.max_concurrent_threads(1 << 20)
            } else {
                leaf
            },
        ])
        .unwrap(),
        Resource::CpuSlots,
    )
    .unwrap();
    let q = cpu.workload("q").unwrap();
    move || {
        ns_per_iter_threads(1, 2, 500_000, |_| {
            let p = q.try_acquire(1).unwrap().expect("a slot");
            std::hint::black_box(&p);
        })
    }
}

fn main() {
    let mut r = Report::new("workload");
    // The goal is a ratio: flat and three-level in alternate rounds.
    let charge = paired(
        ROUNDS,
        charge_round(
            vec![
                WorkloadSpec::new("all").max_bytes_per_second(FAST),
                WorkloadSpec::new("query").parent("all"),
            ],
            "query",
        ),
        charge_round(
            vec![
                WorkloadSpec::new("all").max_bytes_per_second(FAST),
                WorkloadSpec::new("customer").parent("all"),
                WorkloadSpec::new("query").parent("customer"),
            ],
            "query",
        ),
    );
    let three_caps = charge_ns(
        vec![
            WorkloadSpec::new("all").max_bytes_per_second(FAST),
            WorkloadSpec::new("customer")
                .parent("all")
                .max_bytes_per_second(FAST),
            WorkloadSpec::new("query")
                .parent("customer")
                .max_bytes_per_second(FAST),
        ],
        "query",
    );
    let bare = charge_ns(
        vec![
            WorkloadSpec::new("all"),
            WorkloadSpec::new("customer").parent("all"),
            WorkloadSpec::new("query").parent("customer"),
        ],
        "query",
    );
    let t = Throttler::new(FAST).unwrap();
    let throttler = ns_per_iter_threads(ROUNDS, 2, 500_000, |_| {
        std::hint::black_box(
            t.reserve(AMOUNT, Duration::ZERO, 0, Source::Device)
                .unwrap(),
        );
    });
    r.put(
        "wl_charge_ns_3level",
        charge.b,
        "no-wait permit, 2 threads, a leaf two levels under the capped root",
    );
    r.put(
        "wl_charge_ns_3level_3caps",
        three_caps,
        "the same with a cap on every level (three buckets charged)",
    );
    r.put(
        "wl_charge_ns_flat",
        charge.a,
        "no-wait permit, 2 threads, one leaf under one capped root",
    );
    r.put(
        "wl_charge_ratio_3level_flat",
        charge.ratio,
        "median of the paired rounds' wl_charge_ns_3level / wl_charge_ns_flat; goal <= 1.5",
    );
    r.put(
        "wl_charge_ns_3level_bare",
        bare,
        "the three-level path without any cap or limit (no clock read)",
    );
    r.put(
        "throttler_charge_ns",
        throttler,
        "today's flat Throttler::reserve, no wait, 2 threads",
    );
    let pp = push_pop_ns(10_000, 20_000);
    r.put(
        "wl_push_pop_ns_10k",
        pp,
        "one push and one dispatch (completion, hand-over, pick-up), 10,000 queued leaves; goal <= 500",
    );

    let pp10 = push_pop_ns(10, 20_000);
    r.put(
        "wl_push_pop_ns_10",
        pp10,
        "the same over 10 leaves, their state in the cache: the scheduler's own work",
    );
    let cold = cold_line_ns(64 << 20);
    r.put(
        "mem_cold_line_ns",
        cold,
        "one dependent load of a line not in the core's caches (random cycle over 64 MiB), ns",
    );
    r.put(
        "wl_push_pop_cold_lines_10k",
        (pp - pp10) / cold,
        "(wl_push_pop_ns_10k - wl_push_pop_ns_10) / mem_cold_line_ns: cold lines per push and dispatch",
    );
    r.put(
        "wl_push_pop_ns_10k_bench_overhead",
        push_pop_overhead_ns(10_000, 20_000),
        "the same loop without the scheduler: the bench's own share of wl_push_pop_ns_10k",
    );

    let sem = tokio::sync::Semaphore::new(1 << 20);
    // The goal is a ratio: tokio's semaphore and the tree in alternate rounds.
    let grant = paired(
        ROUNDS,
        || {
            ns_per_iter_threads(1, 2, 500_000, |_| {
                let p = sem.try_acquire().expect("a permit");
                std::hint::black_box(&p);
            })
        },
        grant_release_round(true),
    );
    let grant_1level = median_of_rounds(grant_release_round(false));
    let sem2 = tokio::sync::Semaphore::new(1 << 20);
    let tokio_2 = ns_per_iter_threads(ROUNDS, 2, 500_000, |_| {
        let p = sem.try_acquire().expect("a permit");
        let p2 = sem2.try_acquire().expect("a permit");
        std::hint::black_box((&p, &p2));
    });
    r.put(
        "wl_grant_release_ns",
        grant.b,
        "a CPU slot taken and given back, 2 threads, limits at root and leaf",
    );
    r.put(
        "tokio_semaphore_ns",
        grant.a,
        "tokio Semaphore::try_acquire + drop, 2 threads",
    );
    r.put(
        "wl_grant_release_ratio_tokio",
        grant.ratio,
        "median of the paired rounds' wl_grant_release_ns / tokio_semaphore_ns; goal <= 1.5",
    );
    r.put(
        "wl_grant_release_ns_1level",
        grant_1level,
        "the same with max_concurrent_threads at the root only (one limit)",
    );
    r.put(
        "tokio_semaphore_ns_2",
        tokio_2,
        "two tokio semaphores taken and given back, 2 threads (two limits, as root and leaf)",
    );
    let path = r.finish().expect("write the report");
    eprintln!("wrote {}", path.display());
}
