//! proptest: random operations on allocations in a workload tree against a
//! plainly written reference scheduler.
//!
//! The tree is fixed in shape, its settings random (and changed live):
//!
//! ```text
//! all (max?)
//! ├ fg (priority, weight, max?)
//! │ ├ q1 (weight, max?)
//! │ └ q2
//! ├ bg (priority, max?)
//! └ etl (weight)
//! ```
//!
//! The reference decides every grant by recursion over the tree: a node is
//! eligible while it holds fewer than its limit and it has a waiter or an
//! eligible child; from the root, the eligible child of the lowest
//! priority, then the lowest virtual count (floored at its priority's
//! virtual time; counts in sixths, exact for weights 1 to 3), then the
//! first defined; at a leaf, the waiter with the fewest allocated, first
//! come among equals (max-min fair). After every step every workload's
//! held and borrowed slots, every allocation's grants and the global
//! counts must equal the reference's, and on every node whose limit was
//! never lowered `held − borrowed ≤ max_concurrent_threads` (as globally
//! `cur − borrowed ≤ max`; a lowered limit takes nothing back).
//!
//! A checkpoint (`should_yield`) of a slot must answer what the reference
//! answers for priority preemption: yes while no slot is borrowed globally,
//! some workload holding a slot is outranked, and the slot's own leaf is:
//! at a node of its path where neither that node nor an ancestor has
//! borrowed, a sibling branch of strictly lower priority value is
//! eligible. A yes is kept at once (the slot is dropped, its allocation
//! asks for it again) and counted in its leaf's `preemptions`. Before
//! any holder is asked, while a preemption is wanted, the slots granted
//! to outranked allocations and not yet acquired are taken back, newest
//! allocation first, and counted the same way.

use std::collections::HashMap;

use proptest::prelude::*;
use slotring_slots::{AcquiredSlot, Allocation, ConcurrencyControl, SlotLease};
use slotring_throttle::{WorkloadSpec, WorkloadTree};

/// The tree's settings.
#[derive(Debug, Clone, Copy)]
struct Cfg {
    all_max: Option<u64>,
    fg_max: Option<u64>,
    q1_max: Option<u64>,
    bg_max: Option<u64>,
    fg_priority: i64,
    bg_priority: i64,
    fg_weight: u32,
    q1_weight: u32,
    etl_weight: u32,
}

fn max_opt() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![Just(None), (1..4u64).prop_map(Some)]
}

fn cfg() -> impl Strategy<Value = Cfg> {
    (
        (max_opt(), max_opt(), max_opt(), max_opt()),
        (0..2i64, 0..2i64),
        (1..4u32, 1..4u32, 1..4u32),
    )
        .prop_map(|((a, f, q, b), (pf, pb), (wf, wq, we))| Cfg {
            all_max: a,
            fg_max: f,
            q1_max: q,
            bg_max: b,
            fg_priority: pf,
            bg_priority: pb,
            fg_weight: wf,
            q1_weight: wq,
            etl_weight: we,
        })
}

fn spec(c: &Cfg) -> WorkloadTree {
    let with_max = |s: WorkloadSpec, m: Option<u64>| match m {
        Some(m) => s.max_concurrent_threads(m),
        None => s,
    };
    WorkloadTree::new(vec![
        with_max(WorkloadSpec::new("all"), c.all_max),
        with_max(
            WorkloadSpec::new("fg")
                .parent("all")
                .priority(c.fg_priority)
                .weight(c.fg_weight),
            c.fg_max,
        ),
        with_max(
            WorkloadSpec::new("q1").parent("fg").weight(c.q1_weight),
            c.q1_max,
        ),
        WorkloadSpec::new("q2").parent("fg"),
        with_max(
            WorkloadSpec::new("bg")
                .parent("all")
                .priority(c.bg_priority),
            c.bg_max,
        ),
        WorkloadSpec::new("etl").parent("all").weight(c.etl_weight),
    ])
    .unwrap()
}

/// A limit kept, raised, lifted or lowered.
fn change(old: Option<u64>, step: u8) -> Option<u64> {
    match (old, step) {
        (old, 0) => old,
        (Some(m), 1) => Some(m + 1),
        (Some(m), 3) => Some(m.saturating_sub(1).max(1)),
        (None, 3) => Some(1),
        _ => None,
    }
}

/// Whether `new` is a lower limit than `old` (`None`: no limit).
fn lowered(old: Option<u64>, new: Option<u64>) -> bool {
    new.unwrap_or(u64::MAX) < old.unwrap_or(u64::MAX)
}

#[derive(Debug, Clone)]
enum Op {
    Allocate { leaf: usize, max: u64 },
    TryAcquire(usize),
    DropSlot(usize),
    Park(usize),
    Unpark(usize),
    DropAlloc(usize),
    Change { steps: [u8; 4], other: Cfg },
    Checkpoint(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4usize, 1..5u64).prop_map(|(leaf, max)| Op::Allocate { leaf, max }),
        6 => any::<usize>().prop_map(Op::TryAcquire),
        4 => any::<usize>().prop_map(Op::DropSlot),
        2 => any::<usize>().prop_map(Op::Park),
        2 => any::<usize>().prop_map(Op::Unpark),
        1 => any::<usize>().prop_map(Op::DropAlloc),
        3 => any::<usize>().prop_map(Op::Checkpoint),
        1 => (proptest::array::uniform4(0..4u8), cfg())
            .prop_map(|(steps, other)| Op::Change { steps, other }),
    ]
}

// ---- the reference ----------------------------------------------------

const NAMES: [&str; 6] = ["all", "fg", "q1", "q2", "bg", "etl"];
const LEAVES: [usize; 4] = [2, 3, 4, 5];
/// Virtual counts in sixths: `6 / w` is exact for weights 1 to 3.
const SIXTHS: u128 = 6;

#[derive(Debug, Default, Clone)]
struct RNode {
    parent: Option<usize>,
    children: Vec<usize>,
    priority: i64,
    weight: u32,
    max: Option<u64>,
    held: u64,
    borrowed: u64,
    vr: u128,
    /// Among the children: each priority's virtual time.
    time: HashMap<i64, u128>,
    preemptions: u64,
}

#[derive(Debug)]
struct RAlloc {
    leaf: usize,
    max: u64,
    allocated: u64,
    granted: u64,
    seq: usize,
    waiting: bool,
}

#[derive(Debug)]
struct RSlot {
    /// Its allocation's index.
    alloc: usize,
    leaf: usize,
    parked: bool,
}

#[derive(Debug)]
struct Reference {
    nodes: Vec<RNode>,
    allocs: Vec<Option<RAlloc>>,
    cur: u64,
    borrowed: u64,
    limit: u64,
}

impl Reference {
    fn new(c: &Cfg, limit: u64) -> Self {
        let parents = [None, Some(0), Some(1), Some(1), Some(0), Some(0)];
        let mut nodes: Vec<RNode> = parents
            .iter()
            .map(|&parent| RNode {
                parent,
                weight: 1,
                ..RNode::default()
            })
            .collect();
        for (i, p) in parents.iter().enumerate() {
            if let Some(p) = p {
                nodes[*p].children.push(i);
            }
        }
        let mut r = Self {
            nodes,
            allocs: Vec::new(),
            cur: 0,
            borrowed: 0,
            limit,
        };
        r.configure(c);
        r
    }

    fn configure(&mut self, c: &Cfg) {
        let n = &mut self.nodes;
        n[0].max = c.all_max;
        (n[1].max, n[1].priority, n[1].weight) = (c.fg_max, c.fg_priority, c.fg_weight);
        (n[2].max, n[2].weight) = (c.q1_max, c.q1_weight);
        (n[4].max, n[4].priority) = (c.bg_max, c.bg_priority);
        n[5].weight = c.etl_weight;
        for node in n.iter_mut() {
            node.borrowed = node
                .borrowed
                .min(node.held.saturating_sub(node.max.unwrap_or(u64::MAX)));
        }
        self.schedule();
    }

    fn path(&self, leaf: usize) -> Vec<usize> {
        std::iter::successors(Some(leaf), |&n| self.nodes[n].parent).collect()
    }

    fn room(&self, n: usize) -> bool {
        self.nodes[n].held < self.nodes[n].max.unwrap_or(u64::MAX)
    }

    /// The max-min fair waiter at `n`, if any.
    fn first_waiter(&self, n: usize) -> Option<usize> {
        self.allocs
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.as_ref().map(|a| (i, a)))
            .filter(|(_, a)| a.waiting && a.leaf == n)
            .min_by_key(|(_, a)| (a.allocated, a.seq))
            .map(|(i, _)| i)
    }

    fn eligible(&self, n: usize) -> bool {
        self.room(n)
            && (self.first_waiter(n).is_some()
                || self.nodes[n].children.iter().any(|&c| self.eligible(c)))
    }

    fn start(&self, parent: usize, c: usize) -> u128 {
        let p = self.nodes[c].priority;
        let time = self.nodes[parent].time.get(&p).copied().unwrap_or(0);
        self.nodes[c].vr.max(time)
    }

    fn pick(&mut self) -> Option<usize> {
        if !self.eligible(0) {
            return None;
        }
        let mut n = 0;
        loop {
            if let Some(a) = self.first_waiter(n) {
                return Some(a);
            }
            let c = self.nodes[n]
                .children
                .iter()
                .copied()
                .filter(|&c| self.eligible(c))
                .min_by_key(|&c| (self.nodes[c].priority, self.start(n, c)))
                .expect("an eligible inner node has an eligible child");
            let start = self.start(n, c);
            let p = self.nodes[c].priority;
            self.nodes[n].time.insert(p, start);
            self.nodes[c].vr = start + SIXTHS / u128::from(self.nodes[c].weight);
            n = c;
        }
    }

    fn schedule(&mut self) {
        while self.cur < self.limit {
            let Some(a) = self.pick() else { break };
            let leaf = {
                let a = self.allocs[a].as_mut().unwrap();
                a.allocated += 1;
                a.granted += 1;
                a.waiting = a.allocated < a.max;
                a.leaf
            };
            self.cur += 1;
            for n in self.path(leaf) {
                self.nodes[n].held += 1;
            }
        }
    }

    fn uncount(&mut self, leaf: usize, k: u64) {
        for n in self.path(leaf) {
            let node = &mut self.nodes[n];
            node.held -= k;
            node.borrowed = node
                .borrowed
                .min(node.held.saturating_sub(node.max.unwrap_or(u64::MAX)));
        }
        self.cur -= k;
        self.borrowed = self.borrowed.min(self.cur.saturating_sub(self.limit));
        self.schedule();
    }

    /// Whether `n` or an ancestor has borrowed.
    fn repays(&self, n: usize) -> bool {
        self.path(n).iter().any(|&m| self.nodes[m].borrowed > 0)
    }

    /// Whether a waiting allocation outranks `n`: at some node of its path
    /// with no borrow there or above, a sibling branch of a lower priority
    /// value is eligible.
    fn outranked(&self, n: usize) -> bool {
        let path = self.path(n);
        path.windows(2).any(|w| {
            let (c, p) = (w[0], w[1]);
            !self.repays(p)
                && self.nodes[p].children.iter().any(|&s| {
                    s != c && self.eligible(s) && self.nodes[s].priority < self.nodes[c].priority
                })
        })
    }

    /// Whether a checkpoint of an unparked slot of `leaf` is told to yield.
    fn preempts(&self, leaf: usize) -> bool {
        let holder_outranked =
            (1..self.nodes.len()).any(|n| self.nodes[n].held > 0 && self.outranked(n));
        self.borrowed == 0 && holder_outranked && self.outranked(leaf)
    }

    /// While a preemption is wanted, take back the granted, unacquired
    /// slots of outranked allocations, newest first, each then wanted
    /// again and its slot granted by the rule.
    fn revoke_unacquired(&mut self) {
        loop {
            let wanted = self.borrowed == 0
                && (1..self.nodes.len()).any(|n| self.nodes[n].held > 0 && self.outranked(n));
            if !wanted {
                return;
            }
            let victim = self
                .allocs
                .iter()
                .enumerate()
                .filter_map(|(i, a)| a.as_ref().map(|a| (i, a)))
                .filter(|(_, a)| a.granted > 0 && self.outranked(a.leaf))
                .max_by_key(|(_, a)| a.seq)
                .map(|(i, _)| i);
            let Some(v) = victim else { return };
            let a = self.allocs[v].as_mut().unwrap();
            a.granted -= 1;
            a.allocated -= 1;
            a.waiting = a.allocated < a.max;
            let leaf = a.leaf;
            self.nodes[leaf].preemptions += 1;
            self.uncount(leaf, 1);
        }
    }

    fn unpark(&mut self, leaf: usize) {
        for n in self.path(leaf) {
            let node = &mut self.nodes[n];
            if node.held >= node.max.unwrap_or(u64::MAX) {
                node.borrowed += 1;
            }
            node.held += 1;
        }
        if self.cur >= self.limit {
            self.borrowed += 1;
        }
        self.cur += 1;
    }
}

// ---- the run ----------------------------------------------------------

fn run(first: Cfg, ops: Vec<Op>, limit: u64) -> Result<(), TestCaseError> {
    let mut c = first;
    let cc = ConcurrencyControl::with_workloads(&spec(&c));
    cc.set_max_concurrency(limit);
    let mut r = Reference::new(&c, limit);
    let mut allocs: Vec<Option<Allocation>> = vec![];
    let mut slots: Vec<(AcquiredSlot, RSlot)> = vec![];
    let mut ever_lowered: Vec<&str> = vec![];
    let live = |allocs: &Vec<Option<Allocation>>, i: usize| {
        let ids: Vec<usize> = (0..allocs.len()).filter(|&j| allocs[j].is_some()).collect();
        (!ids.is_empty()).then(|| ids[i % ids.len()])
    };
    for op in ops {
        match op {
            Op::Allocate { leaf, max } => {
                let leaf = LEAVES[leaf];
                allocs.push(Some(cc.allocate_in(NAMES[leaf], 0, max).unwrap()));
                r.allocs.push(Some(RAlloc {
                    leaf,
                    max,
                    allocated: 0,
                    granted: 0,
                    seq: r.allocs.len(),
                    waiting: true,
                }));
                r.schedule();
            }
            Op::TryAcquire(i) => {
                if let Some(a) = live(&allocs, i) {
                    let real = allocs[a].as_ref().unwrap().try_acquire();
                    let ra = r.allocs[a].as_mut().unwrap();
                    prop_assert_eq!(real.is_some(), ra.granted > 0);
                    if let Some(s) = real {
                        ra.granted -= 1;
                        let leaf = ra.leaf;
                        slots.push((
                            s,
                            RSlot {
                                alloc: a,
                                leaf,
                                parked: false,
                            },
                        ));
                    }
                }
            }
            Op::DropSlot(i) if !slots.is_empty() => {
                let (s, rs) = slots.swap_remove(i % slots.len());
                drop(s);
                if !rs.parked {
                    r.uncount(rs.leaf, 1);
                }
            }
            Op::Park(i) if !slots.is_empty() => {
                let k = i % slots.len();
                let (s, rs) = &mut slots[k];
                prop_assert_eq!(s.park(), !rs.parked);
                if !rs.parked {
                    rs.parked = true;
                    let leaf = rs.leaf;
                    r.uncount(leaf, 1);
                }
            }
            Op::Unpark(i) if !slots.is_empty() => {
                let k = i % slots.len();
                let (s, rs) = &mut slots[k];
                s.unpark();
                if rs.parked {
                    rs.parked = false;
                    let leaf = rs.leaf;
                    r.unpark(leaf);
                }
            }
            Op::DropAlloc(i) => {
                if let Some(a) = live(&allocs, i) {
                    allocs[a] = None;
                    let ra = r.allocs[a].take().unwrap();
                    r.uncount(ra.leaf, ra.granted);
                }
            }
            Op::Checkpoint(i) if !slots.is_empty() => {
                let k = i % slots.len();
                let (s, rs) = &slots[k];
                let want = !rs.parked && r.preempts(rs.leaf);
                prop_assert_eq!(s.should_yield(), want, "a checkpoint of {}", NAMES[rs.leaf]);
                if want {
                    // The promise is kept at once: released, and wanted again
                    // by its allocation if that is still live.
                    let (s, rs) = slots.swap_remove(k);
                    drop(s);
                    r.nodes[rs.leaf].preemptions += 1;
                    if let Some(ra) = r.allocs[rs.alloc].as_mut() {
                        ra.allocated -= 1;
                        ra.waiting = ra.allocated < ra.max;
                    }
                    r.uncount(rs.leaf, 1);
                }
            }
            Op::Change { steps, other } => {
                let new = Cfg {
                    all_max: change(c.all_max, steps[0]),
                    fg_max: change(c.fg_max, steps[1]),
                    q1_max: change(c.q1_max, steps[2]),
                    bg_max: change(c.bg_max, steps[3]),
                    ..other
                };
                for (node, old, new) in [
                    ("all", c.all_max, new.all_max),
                    ("fg", c.fg_max, new.fg_max),
                    ("q1", c.q1_max, new.q1_max),
                    ("bg", c.bg_max, new.bg_max),
                ] {
                    if lowered(old, new) {
                        ever_lowered.push(node);
                    }
                }
                c = new;
                cc.set_workloads(&spec(&c)).unwrap();
                r.configure(&c);
            }
            _ => {}
        }
        r.revoke_unacquired();
        check(&cc, &r, &allocs, &ever_lowered)?;
    }
    drop(slots);
    drop(allocs);
    let idle = cc
        .workloads()
        .iter()
        .all(|w| w.held == 0 && w.borrowed == 0);
    prop_assert!(idle, "nothing leaked: {:?}", cc.workloads());
    Ok(())
}

fn check(
    cc: &ConcurrencyControl,
    r: &Reference,
    allocs: &[Option<Allocation>],
    ever_lowered: &[&str],
) -> Result<(), TestCaseError> {
    for w in cc.workloads() {
        let i = NAMES.iter().position(|&n| n == w.name).unwrap();
        let n = &r.nodes[i];
        prop_assert_eq!((w.held, w.borrowed), (n.held, n.borrowed), "{}", w.name);
        prop_assert_eq!(w.preemptions, n.preemptions, "{}", w.name);
        prop_assert_eq!(w.max_concurrent_threads, n.max);
        let max = w.max_concurrent_threads.unwrap_or(u64::MAX);
        if !ever_lowered.contains(&w.name.as_str()) {
            prop_assert!(w.held - w.borrowed <= max, "{:?}", w);
        }
    }
    for (a, ra) in allocs.iter().zip(&r.allocs) {
        if let (Some(a), Some(ra)) = (a, ra) {
            prop_assert_eq!(a.granted(), ra.granted);
            prop_assert_eq!(a.is_requesting(), ra.waiting);
        }
    }
    let k = cc.counters();
    prop_assert_eq!((k.cur_concurrency, k.borrowed), (r.cur, r.borrowed));
    prop_assert!(k.cur_concurrency - k.borrowed <= k.max_concurrency);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(
                "proptest-regressions/workloads_model.txt",
            ),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn matches_the_reference_scheduler(
        first in cfg(),
        ops in proptest::collection::vec(op(), 1..80),
        limit in 1..6u64,
    ) {
        run(first, ops, limit)?;
    }
}
