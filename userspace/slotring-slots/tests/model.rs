//! proptest: random operation sequences against a small reference model.
//!
//! The model is a second, deliberately naive implementation: round-robin
//! lists are `Vec`s with a cursor that may sit at `end` (ClickHouse's
//! `std::list` iterator, exactly), max-min fair is a linear scan for the
//! smallest `(allocated, seq)`. After every step the real counters and
//! per-allocation state must equal the model's, and the invariants hold:
//! * conservation: `cur` = competing granted-unacquired + competing acquired
//!   unparked slots (no slot lost or duplicated);
//! * no stranded waiter: `waiters > 0` ⇒ `cur ≥ max`;
//! * `borrowed ≤ cur − max` (so 0 once everything is released);
//! * budget: `cur − borrowed ≤ max` while only fair schedulers were used and
//!   `max` was never lowered;
//! * slot ids are 0, 1, 2, … per allocation;
//! * yields: `should_yield` says yes exactly while `(cur − borrowed) −
//!   budget` exceeds the yields already promised and the slot's allocation
//!   holds more than `max(1, budget / holders)` beyond its promises; a
//!   yielded slot's release makes its allocation ask for the slot again.
//!
//! "budget" is `min(max_concurrency, effective budget)` (`SetBudget` sets
//! the adaptive effective budget, 7 standing for `UNLIMITED`).

use proptest::prelude::*;
use slotring_slots::{
    AcquiredSlot, Allocation, ConcurrencyControl, Scheduler, SlotLease, SlotsCounters, UNLIMITED,
};

#[derive(Debug, Clone)]
enum Op {
    Allocate { min: u64, extra: u64 },
    SetScheduler(Scheduler),
    TryAcquire(usize),
    DropSlot(usize),
    Park(usize),
    Unpark(usize),
    SetMax(usize, u64),
    Free(usize),
    DropAlloc(usize),
    SetMaxConcurrency(u64),
    SetBudget(u64),
    ShouldYield(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let sched = prop_oneof![
        Just(Scheduler::RoundRobin),
        Just(Scheduler::FairRoundRobin),
        Just(Scheduler::MaxMinFair)
    ];
    prop_oneof![
        3 => (0..3u64, 0..5u64).prop_map(|(min, extra)| Op::Allocate { min, extra }),
        1 => sched.prop_map(Op::SetScheduler),
        6 => any::<usize>().prop_map(Op::TryAcquire),
        4 => any::<usize>().prop_map(Op::DropSlot),
        2 => any::<usize>().prop_map(Op::Park),
        2 => any::<usize>().prop_map(Op::Unpark),
        2 => (any::<usize>(), 0..8u64).prop_map(|(a, n)| Op::SetMax(a, n)),
        1 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::DropAlloc),
        1 => (0..7u64).prop_map(Op::SetMaxConcurrency),
        2 => (0..8u64).prop_map(Op::SetBudget),
        4 => any::<usize>().prop_map(Op::ShouldYield),
    ]
}

#[derive(Debug)]
struct MAlloc {
    kind: Scheduler,
    min: u64,
    max: u64,
    limit: u64,
    allocated: u64,
    granted: u64,
    nc: u64,
    seq: u64,
    freed: bool,
    counted: bool,
    in_w: bool,
    next_id: u64,
    /// Competing slots held: granted-unacquired + acquired unparked.
    held: u64,
    /// Yields promised, not yet made.
    owed: u64,
}

#[derive(Debug)]
struct MSlot {
    competing: bool,
    parked: bool,
}

/// A `std::list` with an iterator: `cursor == list.len()` is `end()`.
#[derive(Debug, Default)]
struct List {
    v: Vec<usize>,
    cursor: usize,
}

impl List {
    fn insert_before_cursor(&mut self, a: usize) {
        self.v.insert(self.cursor, a);
        self.cursor += 1;
    }
    fn erase(&mut self, a: usize) {
        let i = self.v.iter().position(|&x| x == a).expect("in list");
        self.v.remove(i);
        if i < self.cursor {
            self.cursor -= 1;
        }
    }
}

#[derive(Debug, Default)]
struct Model {
    max: u64,
    cap: u64,
    owed: u64,
    cur: u64,
    borrowed: u64,
    parked: u64,
    sched: Scheduler,
    allocs: Vec<MAlloc>, // index = creation order; never removed
    lists: [List; 2],
    next_seq: u64,
    c: SlotsCounters,
    fair_only_no_shrink: bool,
}

impl Model {
    fn limit(&self) -> u64 {
        self.max.min(self.cap)
    }
    fn available(&self) -> u64 {
        self.limit().saturating_sub(self.cur)
    }
    fn clamp(&mut self) {
        self.borrowed = self.borrowed.min(self.cur.saturating_sub(self.limit()));
    }
    fn emit(&mut self, a: usize, wanted: u64) {
        let avail = self.available();
        if wanted > avail {
            self.c.slots_delayed += wanted - avail;
            if !self.allocs[a].counted {
                self.allocs[a].counted = true;
                self.c.queries_delayed += 1;
            }
        }
    }
    fn add_waiter(&mut self, a: usize) {
        self.allocs[a].in_w = true;
        match self.allocs[a].kind {
            Scheduler::RoundRobin => self.lists[0].insert_before_cursor(a),
            Scheduler::FairRoundRobin => self.lists[1].insert_before_cursor(a),
            Scheduler::MaxMinFair => {}
        }
    }
    fn remove_waiter(&mut self, a: usize) {
        self.allocs[a].in_w = false;
        match self.allocs[a].kind {
            Scheduler::RoundRobin => self.lists[0].erase(a),
            Scheduler::FairRoundRobin => self.lists[1].erase(a),
            Scheduler::MaxMinFair => {}
        }
    }
    fn grant(&mut self, a: usize) -> bool {
        self.cur += 1;
        let m = &mut self.allocs[a];
        m.allocated += 1;
        m.granted += 1;
        m.held += 1;
        m.allocated < m.limit
    }
    fn schedule(&mut self) {
        let order = match self.sched {
            Scheduler::RoundRobin => [1, 2, 0],
            Scheduler::FairRoundRobin => [0, 2, 1],
            Scheduler::MaxMinFair => [0, 1, 2],
        };
        for s in order {
            if s == 2 {
                while self.cur < self.limit() {
                    let Some(a) = (0..self.allocs.len())
                        .filter(|&i| {
                            self.allocs[i].in_w && self.allocs[i].kind == Scheduler::MaxMinFair
                        })
                        .min_by_key(|&i| (self.allocs[i].allocated, self.allocs[i].seq))
                    else {
                        break;
                    };
                    if !self.grant(a) {
                        self.allocs[a].in_w = false;
                    }
                }
            } else {
                while self.cur < self.limit() && !self.lists[s].v.is_empty() {
                    if self.lists[s].cursor == self.lists[s].v.len() {
                        self.lists[s].cursor = 0;
                    }
                    let a = self.lists[s].v[self.lists[s].cursor];
                    if self.grant(a) {
                        self.lists[s].cursor += 1;
                    } else {
                        let cur = self.lists[s].cursor;
                        self.lists[s].v.remove(cur);
                        self.allocs[a].in_w = false;
                    }
                }
            }
        }
    }
    fn allocate(&mut self, min: u64, max: u64) -> usize {
        let kind = self.sched;
        if kind == Scheduler::RoundRobin {
            self.fair_only_no_shrink = false;
        }
        self.c.slots_granted += min;
        let (limit, allocated, granted, nc) = if kind == Scheduler::RoundRobin {
            self.cur += min;
            (max, min, min, 0)
        } else {
            (max - min, 0, 0, min)
        };
        let a = self.allocs.len();
        self.allocs.push(MAlloc {
            kind,
            min,
            max,
            limit,
            allocated,
            granted,
            nc,
            seq: self.next_seq,
            freed: false,
            counted: false,
            in_w: false,
            next_id: 0,
            held: granted,
            owed: 0,
        });
        self.next_seq += 1;
        if allocated < limit {
            self.add_waiter(a);
            self.emit(a, limit - allocated);
        }
        self.schedule();
        a
    }
    fn set_max(&mut self, a: usize, new_max: u64) {
        let m = &mut self.allocs[a];
        if m.freed || new_max == 0 || new_max == m.max {
            return;
        }
        let new_limit = if m.kind == Scheduler::RoundRobin {
            new_max
        } else {
            new_max.saturating_sub(m.min)
        };
        let old_limit = m.limit;
        let allocated = m.allocated;
        m.max = new_max;
        m.limit = new_limit;
        let (was, will) = (allocated < old_limit, allocated < new_limit);
        let mut need = false;
        if !was && will {
            self.add_waiter(a);
            need = true;
        } else if was && !will {
            self.remove_waiter(a);
        } else if was && will && new_limit > old_limit {
            need = true;
        }
        if new_limit > old_limit {
            let baseline = old_limit.max(allocated);
            if new_limit > baseline {
                self.emit(a, new_limit - baseline);
            }
        }
        if need {
            self.schedule();
        }
    }
    fn free(&mut self, a: usize) {
        if self.allocs[a].freed {
            return;
        }
        let m = &mut self.allocs[a];
        m.freed = true;
        let amount = std::mem::take(&mut m.granted);
        m.held -= amount;
        m.nc = 0;
        let in_w = m.in_w;
        self.cur -= amount;
        self.clamp();
        if in_w {
            self.remove_waiter(a);
        }
        self.schedule();
    }
    fn try_acquire(&mut self, a: usize) -> Option<(MSlot, u64)> {
        let m = &mut self.allocs[a];
        let competing = if m.nc > 0 {
            m.nc -= 1;
            self.c.slots_acquired_non_competing += 1;
            false
        } else if m.granted > 0 {
            m.granted -= 1;
            self.c.slots_acquired += 1;
            true
        } else {
            return None;
        };
        m.next_id += 1;
        Some((
            MSlot {
                competing,
                parked: false,
            },
            m.next_id - 1,
        ))
    }
    fn release(&mut self, s: &MSlot, a: usize) {
        if s.parked {
            self.parked -= 1;
        } else if s.competing {
            self.allocs[a].held -= 1;
            if self.allocs[a].owed > 0 {
                self.allocs[a].owed -= 1;
                self.owed -= 1;
                self.c.yields += 1;
                if !self.allocs[a].freed {
                    if self.allocs[a].in_w {
                        self.remove_waiter(a);
                    }
                    let m = &mut self.allocs[a];
                    m.allocated = m.allocated.saturating_sub(1);
                    if m.allocated < m.limit {
                        self.add_waiter(a);
                    }
                }
            }
            self.cur -= 1;
            self.clamp();
            self.schedule();
        }
    }
    fn park(&mut self, s: &mut MSlot, a: usize) -> bool {
        if s.parked {
            return false;
        }
        s.parked = true;
        self.parked += 1;
        self.c.parks += 1;
        if s.competing {
            self.allocs[a].held -= 1;
            self.cur -= 1;
            self.clamp();
            self.schedule();
        }
        true
    }
    fn unpark(&mut self, s: &mut MSlot, a: usize) {
        if !s.parked {
            return;
        }
        s.parked = false;
        self.parked -= 1;
        self.c.unparks += 1;
        if s.competing {
            self.allocs[a].held += 1;
            if self.cur >= self.limit() {
                self.borrowed += 1;
                self.c.unpark_borrows += 1;
            }
            self.cur += 1;
        }
    }
    fn set_max_concurrency(&mut self, v: u64) {
        let v = v.max(1);
        if v < self.max {
            self.fair_only_no_shrink = false;
        }
        self.max = v;
        self.clamp();
        self.schedule();
    }
    fn set_budget(&mut self, v: u64) {
        let old = self.limit();
        self.cap = v.max(1);
        if self.limit() < old {
            self.fair_only_no_shrink = false;
        }
        self.clamp();
        self.schedule();
    }
    fn should_yield(&mut self, s: &MSlot, a: usize) -> bool {
        if !s.competing || s.parked {
            return false;
        }
        let needed = (self.cur - self.borrowed)
            .saturating_sub(self.limit())
            .saturating_sub(self.owed);
        if needed == 0 {
            return false;
        }
        let holders = self.allocs.iter().filter(|m| m.held > 0).count() as u64;
        let fair = (self.limit() / holders.max(1)).max(1);
        let m = &mut self.allocs[a];
        if m.held.saturating_sub(m.owed) <= fair {
            return false;
        }
        m.owed += 1;
        self.owed += 1;
        true
    }
    fn expected(&self) -> SlotsCounters {
        let live = self.allocs.iter().filter(|m| !m.freed);
        SlotsCounters {
            max_concurrency: self.max,
            budget_effective: self.limit(),
            cur_concurrency: self.cur,
            allocations: live.clone().count() as u64,
            waiters: live.filter(|m| m.in_w).count() as u64,
            parked: self.parked,
            borrowed: self.borrowed,
            ..self.c
        }
    }
}

fn run(ops: Vec<Op>, limit: u64) -> Result<(), TestCaseError> {
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(limit);
    let mut m = Model {
        max: limit,
        cap: UNLIMITED,
        sched: Scheduler::MaxMinFair,
        fair_only_no_shrink: true,
        ..Model::default()
    };
    // Real allocations by model index (None once dropped); live slots in
    // parallel with their model twins and owning allocation.
    let mut allocs: Vec<Option<Allocation>> = vec![];
    let mut slots: Vec<(AcquiredSlot, MSlot, usize)> = vec![];
    let live = |allocs: &Vec<Option<Allocation>>, i: usize| {
        let ids: Vec<usize> = (0..allocs.len()).filter(|&j| allocs[j].is_some()).collect();
        (!ids.is_empty()).then(|| ids[i % ids.len()])
    };
    for op in ops {
        match op {
            Op::Allocate { min, extra } => {
                allocs.push(Some(cc.allocate(min, min + extra).unwrap()));
                m.allocate(min, min + extra);
            }
            Op::SetScheduler(s) => {
                cc.set_scheduler(s);
                m.sched = s;
                m.schedule();
            }
            Op::TryAcquire(i) => {
                if let Some(a) = live(&allocs, i) {
                    let real = allocs[a].as_ref().unwrap().try_acquire();
                    let model = m.try_acquire(a);
                    prop_assert_eq!(real.is_some(), model.is_some());
                    if let (Some(r), Some((ms, id))) = (real, model) {
                        prop_assert_eq!(r.slot_id(), id, "slot ids in grant order");
                        prop_assert_eq!(r.is_competing(), ms.competing);
                        slots.push((r, ms, a));
                    }
                }
            }
            Op::DropSlot(i) if !slots.is_empty() => {
                let (r, ms, a) = slots.swap_remove(i % slots.len());
                drop(r);
                m.release(&ms, a);
            }
            Op::Park(i) if !slots.is_empty() => {
                let n = slots.len();
                let (r, ms, a) = &mut slots[i % n];
                let parked = r.park();
                prop_assert_eq!(parked, m.park(ms, *a));
            }
            Op::Unpark(i) if !slots.is_empty() => {
                let n = slots.len();
                let (r, ms, a) = &mut slots[i % n];
                r.unpark();
                m.unpark(ms, *a);
            }
            Op::SetMax(i, n) => {
                if let Some(a) = live(&allocs, i) {
                    let res = allocs[a].as_ref().unwrap().set_max(n);
                    prop_assert_eq!(res.is_ok(), n > 0 && !m.allocs[a].freed);
                    m.set_max(a, n);
                }
            }
            Op::Free(i) => {
                if let Some(a) = live(&allocs, i) {
                    allocs[a].as_ref().unwrap().free();
                    m.free(a);
                }
            }
            Op::DropAlloc(i) => {
                if let Some(a) = live(&allocs, i) {
                    allocs[a] = None;
                    m.free(a);
                }
            }
            Op::SetMaxConcurrency(v) => {
                cc.set_max_concurrency(v);
                m.set_max_concurrency(v);
            }
            Op::SetBudget(v) => {
                let v = if v == 7 { UNLIMITED } else { v };
                cc.set_effective_budget(v);
                m.set_budget(v);
            }
            Op::ShouldYield(i) if !slots.is_empty() => {
                let n = slots.len();
                let (r, ms, a) = &slots[i % n];
                let real = r.should_yield();
                prop_assert_eq!(real, m.should_yield(ms, *a), "should_yield");
                if real {
                    // The contract: release at once, wait like any other.
                    let (r, ms, a) = slots.swap_remove(i % n);
                    drop(r);
                    m.release(&ms, a);
                }
            }
            Op::DropSlot(_) | Op::Park(_) | Op::Unpark(_) | Op::ShouldYield(_) => {}
        }
        check(&cc, &m, &allocs, &slots)?;
    }
    drop(slots);
    drop(allocs);
    let c = cc.counters();
    prop_assert_eq!(
        (c.cur_concurrency, c.borrowed, c.parked, c.waiters),
        (0, 0, 0, 0)
    );
    Ok(())
}

fn check(
    cc: &ConcurrencyControl,
    m: &Model,
    allocs: &[Option<Allocation>],
    slots: &[(AcquiredSlot, MSlot, usize)],
) -> Result<(), TestCaseError> {
    let c = cc.counters();
    prop_assert_eq!(c, m.expected());
    for (i, a) in allocs.iter().enumerate() {
        if let Some(a) = a {
            prop_assert_eq!(
                a.granted(),
                m.allocs[i].granted + m.allocs[i].nc,
                "alloc {}",
                i
            );
            prop_assert_eq!(a.is_requesting(), m.allocs[i].in_w, "alloc {}", i);
        }
    }
    // Conservation: every counted unit is a granted or a running slot.
    let granted: u64 = m.allocs.iter().map(|a| a.granted).sum();
    let running = slots
        .iter()
        .filter(|(r, _, _)| r.is_competing() && !r.is_parked())
        .count();
    prop_assert_eq!(
        c.cur_concurrency,
        granted + running as u64,
        "no slot lost or duplicated"
    );
    prop_assert_eq!(
        c.parked,
        slots.iter().filter(|(r, _, _)| r.is_parked()).count() as u64
    );
    if c.waiters > 0 {
        prop_assert!(
            c.cur_concurrency >= c.budget_effective,
            "stranded waiter: {:?}",
            c
        );
    }
    prop_assert!(c.borrowed <= c.cur_concurrency.saturating_sub(c.budget_effective));
    prop_assert!(c.budget_effective >= 1 && c.budget_effective <= c.max_concurrency);
    if m.fair_only_no_shrink {
        prop_assert!(
            c.cur_concurrency - c.borrowed <= c.budget_effective,
            "budget: {:?}",
            c
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/model.txt"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn matches_the_reference_model(ops in proptest::collection::vec(op(), 1..80), limit in 1..6u64) {
        run(ops, limit)?;
    }
}
