//! Multi-threaded stress: random `set_max`, ClickHouse's `MultipleThreads`
//! (1,000 queries, 8 at a time, up to 4 threads each, live limit changes),
//! with parking mixed in. Every run must end with nothing leaked.

use std::sync::atomic::{AtomicUsize, Ordering};

use slotring_slots::{
    AcquiredSlot, Allocation, ConcurrencyControl, CpuLeaseParkGuard, Scheduler, SlotLease,
};

/// A tiny xorshift generator (deterministic per seed, no dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn assert_budget_whole(cc: &ConcurrencyControl, limit: u64) {
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
    let probe = cc.allocate(0, limit).unwrap();
    let all: Vec<_> = std::iter::from_fn(|| probe.try_acquire()).collect();
    assert_eq!(all.len() as u64, limit, "the whole budget is free");
}

#[test]
fn random_set_max_from_eight_threads() {
    for s in Scheduler::ALL {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(8);
        cc.set_scheduler(s);
        std::thread::scope(|sc| {
            for t in 0..8u64 {
                let cc = &cc;
                sc.spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((t + 1) * 0x1234_5678));
                    let a = cc.allocate(rng.below(2), 4).unwrap();
                    let mut held: Vec<AcquiredSlot> = vec![];
                    for _ in 0..200 {
                        a.set_max(1 + rng.below(12)).unwrap();
                        while let Some(slot) = a.try_acquire() {
                            held.push(slot);
                        }
                        match rng.below(4) {
                            0 => held.clear(),
                            1 => {
                                held.pop();
                            }
                            2 => {
                                if let Some(s) = held.last_mut()
                                    && s.park()
                                {
                                    std::thread::yield_now();
                                    s.unpark();
                                }
                            }
                            _ => std::thread::yield_now(),
                        }
                    }
                });
            }
        });
        assert_budget_whole(&cc, 8);
    }
}

fn run_query(cc: &ConcurrencyControl, max_threads: u64, seed: u64) {
    let slots = cc.allocate(1, max_threads).unwrap();
    // Graceful shutdown: the scope joins every thread, including ones
    // spawned by other query threads while it was joining.
    std::thread::scope(|sc| spawn_threads(sc, &slots, seed));
}

fn spawn_threads<'scope>(
    sc: &'scope std::thread::Scope<'scope, '_>,
    slots: &'scope Allocation,
    seed: u64,
) {
    while let Some(mut slot) = slots.try_acquire() {
        let n = slot.slot_id();
        sc.spawn(move || {
            let mut rng = Rng(seed.wrapping_mul(31).wrapping_add(n) | 1);
            let _cur = slot.make_current();
            for _ in 0..1 + rng.below(8) {
                if rng.below(3) == 0 {
                    let _parked = CpuLeaseParkGuard::new(); // a "non-CPU wait"
                    std::thread::yield_now();
                }
                std::thread::yield_now(); // "work"
                spawn_threads(sc, slots, seed.wrapping_add(n + 1)); // upscale
            }
        });
    }
}

#[test]
fn multiple_threads_thousand_queries() {
    const TOTAL: usize = 1000;
    const CONCURRENT: usize = 8;
    const LIMIT: u64 = 16;
    for s in Scheduler::ALL {
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(LIMIT);
        cc.set_scheduler(s);
        let started = AtomicUsize::new(0);
        let finished = AtomicUsize::new(0);
        let mut rng = Rng(0xDEAD_BEEF ^ s as u64);
        std::thread::scope(|sc| {
            while started.load(Ordering::SeqCst) < TOTAL {
                while started.load(Ordering::SeqCst)
                    < (finished.load(Ordering::SeqCst) + CONCURRENT).min(TOTAL)
                {
                    let max_threads = 1 + rng.below(4);
                    let seed = rng.next();
                    let (cc, finished) = (&cc, &finished);
                    sc.spawn(move || {
                        run_query(cc, max_threads, seed);
                        finished.fetch_add(1, Ordering::SeqCst);
                    });
                    started.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::yield_now();
                // Emulate configuration updates.
                cc.set_max_concurrency(LIMIT - (started.load(Ordering::SeqCst) % 3) as u64);
            }
        });
        cc.set_max_concurrency(LIMIT);
        let c = cc.counters();
        assert!(
            c.slots_acquired_non_competing + c.slots_acquired >= TOTAL as u64,
            "{s}: {c:?}"
        );
        assert_eq!(c.parks, c.unparks, "{s}");
        assert_budget_whole(&cc, LIMIT);
    }
}
