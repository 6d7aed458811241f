//! `cargo xtask bench slots`: hot paths against a `tokio::sync::Semaphore`
//! baseline, grants with 10,000 waiters, park/unpark, and a deterministic
//! fairness simulation of the case behind ClickHouse's `max_min_fair`
//! scheduler (`src/Common/ConcurrencyControl.cpp`: a long query holding 16
//! slots, short queries arriving, budget 32) under every scheduler; and
//! the same hot paths in a workload tree (`wl_*`).

use std::hint::black_box;

use std::cell::RefCell;

use slotring_benchkit::{Report, median, ns_per_iter, ns_per_iter_threads, percentile};
use slotring_slots::{AcquiredSlot, Allocation, ConcurrencyControl, Scheduler, SlotLease};
use slotring_throttle::{WorkloadSpec, WorkloadTree};

const ROUNDS: usize = 15;

fn cc(limit: u64, s: Scheduler) -> ConcurrencyControl {
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(limit);
    cc.set_scheduler(s);
    cc
}

/// Drop the held slot (granted back to the same allocation) and acquire it.
fn grant_release_ns() -> f64 {
    let cc = cc(1, Scheduler::MaxMinFair);
    let a = cc.allocate(0, u64::MAX).unwrap();
    let mut slot = Some(a.try_acquire().unwrap());
    ns_per_iter(ROUNDS, 200_000, || {
        drop(slot.take());
        slot = Some(a.try_acquire().expect("granted back"));
    })
}

/// `all` (a limit no run reaches) over `batch` (`batch_max`) over the leaf `q`.
fn wl_cc(batch_max: u64) -> ConcurrencyControl {
    ConcurrencyControl::with_workloads(
        &WorkloadTree::new(vec![
            WorkloadSpec::new("all").max_concurrent_threads(1 << 40),
            WorkloadSpec::new("batch")
                .parent("all")
                .max_concurrent_threads(batch_max),
            WorkloadSpec::new("q").parent("batch"),
        ])
        .unwrap(),
    )
}

/// As [`grant_release_ns`], with the budget unlimited and the workload
/// `batch` capped at 1: each release hands the place, through the tree, to
/// the allocation that wants it again (under the mutex: it waits).
fn wl_grant_release_ns() -> f64 {
    let cc = wl_cc(1);
    let a = cc.allocate_in("q", 0, u64::MAX).unwrap();
    let mut slot = Some(a.try_acquire().unwrap());
    ns_per_iter(ROUNDS, 200_000, || {
        drop(slot.take());
        slot = Some(a.try_acquire().expect("granted back"));
    })
}

/// Granted slots per allocation in [`wl_take_release_ns_2t`].
const BATCH: u64 = 4096;

/// Two threads, each taking a granted slot of its own allocation in `q`
/// and dropping it: nothing queues, so both are lock-free (the mutex only
/// for the allocation's last slot and the next allocation, once per
/// [`BATCH`]).
fn wl_take_release_ns_2t() -> f64 {
    thread_local! {
        static ALLOC: RefCell<Option<Allocation>> = const { RefCell::new(None) };
    }
    let cc = wl_cc(1 << 30);
    ns_per_iter_threads(ROUNDS, 2, 200_000, |_| {
        ALLOC.with(|a| {
            let mut a = a.borrow_mut();
            let slot = match a.as_ref().and_then(Allocation::try_acquire) {
                Some(s) => s,
                None => {
                    let fresh = cc.allocate_in("q", 0, BATCH).unwrap();
                    let s = fresh.try_acquire().expect("granted at once");
                    *a = Some(fresh);
                    s
                }
            };
            drop(black_box(slot));
        });
    })
}

fn tokio_semaphore_ns_2t() -> f64 {
    let sem = tokio::sync::Semaphore::new(1 << 20);
    ns_per_iter_threads(ROUNDS, 2, 200_000, |_| {
        let p = sem.try_acquire().expect("a permit");
        drop(black_box(p));
    })
}

fn tokio_semaphore_ns() -> f64 {
    let sem = tokio::sync::Semaphore::new(1);
    ns_per_iter(ROUNDS, 200_000, || {
        let p = sem.try_acquire().expect("uncontended");
        drop(black_box(p));
    })
}

fn allocate_ns() -> f64 {
    let cc = cc(64, Scheduler::MaxMinFair);
    ns_per_iter(ROUNDS, 100_000, || {
        let a = cc.allocate(1, 4).unwrap();
        let s = a.try_acquire().expect("min slot");
        drop(black_box(s));
        drop(a);
    })
}

/// Per grant with `n` waiting allocations: drop the held slot, the scheduler
/// hands it to the next waiter, acquire it there.
fn grant_ns_with_waiters(s: Scheduler, n: usize) -> f64 {
    let cc = cc(1, s);
    let allocs: Vec<Allocation> = (0..n).map(|_| cc.allocate(0, u64::MAX).unwrap()).collect();
    let holder = allocs
        .iter()
        .position(|a| a.granted() == 1)
        .expect("one got the budget");
    let mut slot = Some(allocs[holder].try_acquire().unwrap());
    // Find who is served next, then the order is sequential (checked below).
    drop(slot.take());
    let mut next = allocs
        .iter()
        .position(|a| a.granted() == 1)
        .expect("granted on");
    slot = Some(allocs[next].try_acquire().unwrap());
    assert_eq!(cc.counters().waiters, n as u64);
    ns_per_iter(ROUNDS, 20_000, || {
        drop(slot.take());
        next = (next + 1) % n;
        slot = Some(allocs[next].try_acquire().expect("sequential grant order"));
    })
}

fn park_unpark_ns() -> f64 {
    let cc = cc(64, Scheduler::MaxMinFair);
    let a = cc.allocate(0, 1).unwrap();
    let mut s = a.try_acquire().unwrap();
    ns_per_iter(ROUNDS, 200_000, || {
        assert!(s.park());
        s.unpark();
    })
}

// ---- fairness simulation ---------------------------------------------------

/// A query in the simulation.
struct Query {
    alloc: Allocation,
    /// Held slots, each with the tick its work unit ends.
    held: Vec<(AcquiredSlot, u64)>,
    /// Most slots it can use at once.
    width: usize,
    /// Lengths of the work units not yet started; `None`: endless (the long query).
    units: Option<Vec<u64>>,
    /// Duration if every unit started on arrival.
    ideal: u64,
    /// Slots acquired over its life (to express demand through `set_max`).
    acquired: u64,
    max: u64,
    arrived: u64,
    first_extra: Option<u64>,
}

impl Query {
    /// Tell the allocation how many slots it can still use, as a lifetime max.
    fn restate(&mut self) {
        let want = (self.acquired + (self.demand() - self.held.len()) as u64).max(1);
        if want != self.max {
            self.alloc.set_max(want).unwrap();
            self.max = want;
        }
    }

    fn demand(&self) -> usize {
        let more = self.units.as_ref().map_or(usize::MAX, Vec::len);
        self.width.min(self.held.len().saturating_add(more))
    }

    fn done(&self) -> bool {
        self.units.as_ref().is_some_and(Vec::is_empty) && self.held.is_empty()
    }
}

/// A fixed 64-bit LCG (deterministic runs).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    /// A work unit: 5 to 15 ticks, 10 on average.
    fn unit(&mut self) -> u64 {
        5 + self.next() % 11
    }
}

struct SimResult {
    wait_p50: f64,
    wait_p99: f64,
    /// Jain's index of the short queries' normalized service (ideal / actual
    /// duration): 1 when every short query is slowed down equally.
    jain: f64,
    /// Time-averaged Jain's index of the slots held by the present queries
    /// against the instantaneous max-min fair (water-filling) split.
    jain_share: f64,
}

/// Max-min fair (water-filling) shares of `capacity` for `demands`.
fn water_fill(demands: &[f64], capacity: f64) -> Vec<f64> {
    let mut share = vec![0.0; demands.len()];
    let mut left = capacity;
    let mut open: Vec<usize> = (0..demands.len()).filter(|&i| demands[i] > 0.0).collect();
    while left > 1e-9 && !open.is_empty() {
        let each = left / open.len() as f64;
        let mut next = vec![];
        for &i in &open {
            let give = each.min(demands[i] - share[i]);
            share[i] += give;
            left -= give;
            if demands[i] - share[i] > 1e-9 {
                next.push(i);
            }
        }
        if next.len() == open.len() {
            break; // everyone took a full equal share
        }
        open = next;
    }
    share
}

/// Budget 32. A long query holds 16 slots and wants all 32 (endless); short
/// queries arrive, one every 2 ticks on average (4 work units, up to 4 wide).
/// Every work unit takes 5 to 15 ticks. Every query expresses its demand like
/// a pipeline does: `set_max(acquired so far + slots it could still use)`.
/// Deterministic: virtual ticks and a fixed LCG, no sleeping. Reports the
/// short queries' wait for their first slot beyond `min` (p50, p99), Jain's
/// index of their normalized service (ideal / actual duration), and the
/// time-averaged Jain's index of the slots held against the max-min fair
/// (water-filling) split of the same number of slots between the same demands.
fn simulate(s: Scheduler) -> SimResult {
    const BUDGET: u64 = 32;
    const TICKS: u64 = 20_000;
    let cc = cc(BUDGET, s);
    let long = cc.allocate(1, 17).unwrap();
    let mut queries = vec![Query {
        alloc: long,
        held: vec![],
        width: 32,
        units: None,
        ideal: 0,
        acquired: 0,
        max: 17,
        arrived: 0,
        first_extra: Some(0),
    }];
    let mut rng = Lcg(0x2545_F491_4F6C_DD1D);
    let mut waits = vec![];
    let mut service = vec![];
    let mut jains = vec![];
    for tick in 0..TICKS {
        // Work units end: each query releases those slots (the scheduler
        // re-grants each at once) and its threads ask again (`set_max`).
        for q in &mut queries {
            q.held.retain(|(_, end)| *end > tick);
            q.restate();
        }
        // Short queries arrive: one every 2 ticks on average.
        if rng.next().is_multiple_of(2) {
            let units: Vec<u64> = (0..4).map(|_| rng.unit()).collect();
            queries.push(Query {
                alloc: cc.allocate(1, 4).unwrap(),
                held: vec![],
                width: 4,
                ideal: units.iter().copied().max().unwrap_or(1),
                units: Some(units),
                acquired: 0,
                max: 4,
                arrived: tick,
                first_extra: None,
            });
        }
        // Threads pick up granted slots and start work units; then each query
        // re-states its demand (which may grant more at once: twice).
        for _ in 0..2 {
            for q in &mut queries {
                while q.held.len() < q.demand() {
                    let Some(slot) = q.alloc.try_acquire() else {
                        break;
                    };
                    if slot.slot_id() >= 1 {
                        q.first_extra.get_or_insert(tick);
                    }
                    q.acquired += 1;
                    let unit = match &mut q.units {
                        Some(u) => u.pop().expect("demand counts units"),
                        None => rng.unit(),
                    };
                    q.held.push((slot, tick + unit));
                }
                q.restate();
            }
        }
        // Fairness over the present queries against the max-min fair ideal.
        if queries.len() >= 2 {
            let demands: Vec<f64> = queries.iter().map(|q| q.demand() as f64).collect();
            let capacity: f64 = queries.iter().map(|q| q.held.len() as f64).sum();
            let ideal = water_fill(&demands, capacity);
            let x: Vec<f64> = queries
                .iter()
                .zip(&ideal)
                .filter(|(_, i)| **i > 1e-9)
                .map(|(q, i)| q.held.len() as f64 / i)
                .collect();
            let sum: f64 = x.iter().sum();
            let sq: f64 = x.iter().map(|v| v * v).sum();
            if sq > 0.0 {
                jains.push(sum * sum / (x.len() as f64 * sq));
            }
        }
        // Finished short queries leave (their allocation is dropped).
        queries.retain(|q| {
            let done = q.done();
            if done {
                waits.push(q.first_extra.map_or(f64::NAN, |t| (t - q.arrived) as f64));
                service.push(q.ideal as f64 / (tick - q.arrived) as f64);
            }
            !done
        });
    }
    waits.retain(|w| !w.is_nan());
    let jain_share = jains.iter().sum::<f64>() / jains.len().max(1) as f64;
    let sum: f64 = service.iter().sum();
    let sq: f64 = service.iter().map(|v| v * v).sum();
    let jain = sum * sum / (service.len() as f64 * sq);
    SimResult {
        wait_p50: median(&mut waits.clone()),
        wait_p99: percentile(&mut waits, 99.0),
        jain,
        jain_share,
    }
}

fn main() {
    let mut r = Report::new("slots");
    let grant_release = grant_release_ns();
    let tokio = tokio_semaphore_ns();
    r.put(
        "grant_release_ns",
        grant_release,
        "ns; drop + re-grant + acquire, uncontended",
    );
    r.put(
        "tokio_semaphore_ns",
        tokio,
        "ns; tokio Semaphore try_acquire + drop (baseline)",
    );
    r.put(
        "grant_release_over_tokio",
        grant_release / tokio,
        "ratio; goal <= 1.5",
    );
    r.put(
        "wl_grant_release_ns",
        wl_grant_release_ns(),
        "ns; as grant_release_ns, handed on through a workload capped at 1",
    );
    let wl_2t = wl_take_release_ns_2t();
    let tokio_2t = tokio_semaphore_ns_2t();
    r.put(
        "wl_take_release_ns_2t",
        wl_2t,
        "ns; try_acquire + lock-free release in a workload tree, 2 threads",
    );
    r.put(
        "tokio_semaphore_ns_2t",
        tokio_2t,
        "ns; tokio Semaphore try_acquire + drop, 2 threads (baseline)",
    );
    r.put("wl_take_release_2t_over_tokio", wl_2t / tokio_2t, "ratio");
    r.put(
        "allocate_ns",
        allocate_ns(),
        "ns; allocate(1,4) + first acquire + drop",
    );
    r.put(
        "mmf_grant_ns_10k",
        grant_ns_with_waiters(Scheduler::MaxMinFair, 10_000),
        "ns/grant; goal <= 300",
    );
    r.put(
        "rr_grant_ns_10k",
        grant_ns_with_waiters(Scheduler::RoundRobin, 10_000),
        "ns/grant",
    );
    r.put(
        "frr_grant_ns_10k",
        grant_ns_with_waiters(Scheduler::FairRoundRobin, 10_000),
        "ns/grant",
    );
    r.put(
        "park_unpark_ns",
        park_unpark_ns(),
        "ns; park + unpark, no waiters",
    );
    for (s, key) in [
        (Scheduler::MaxMinFair, "mmf"),
        (Scheduler::FairRoundRobin, "frr"),
        (Scheduler::RoundRobin, "rr"),
    ] {
        let res = simulate(s);
        r.put(
            &format!("short_wait_p50_{key}"),
            res.wait_p50,
            "ticks; short query's first extra slot",
        );
        r.put(&format!("short_wait_p99_{key}"), res.wait_p99, "ticks");
        let goal = if key == "mmf" { "; goal >= 0.99" } else { "" };
        r.put(
            &format!("jain_{key}"),
            res.jain,
            &format!("Jain, short queries' service{goal}"),
        );
        r.put(
            &format!("jain_share_{key}"),
            res.jain_share,
            "Jain, held vs max-min fair split",
        );
    }
    r.finish().expect("write the bench JSON");
}
