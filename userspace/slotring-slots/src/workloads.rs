//! CPU slots in the workload tree: which workload's waiting allocation a
//! free slot goes to, and how many slots each workload holds.
//!
//! # The model
//!
//! A [`ConcurrencyControl`](crate::ConcurrencyControl) given a
//! [`WorkloadTree`] (`with_workloads`, `set_workloads`) schedules its slots
//! by the tree, in `slotring-throttle`'s model of
//! [`Resource::CpuSlots`](slotring_throttle::Resource::CpuSlots): an
//! allocation enters a leaf (`allocate_in`), a slot is one request, and
//! `max_concurrent_threads` is every workload's in-flight limit.
//!
//! * **Held.** A workload holds the competing slots of the allocations
//!   below it (at every level) that count against the global budget:
//!   granted and not yet acquired, or acquired and not parked (the
//!   allocation's own `held`, summed up the tree). Non-competing slots (the
//!   fair schedulers' `min`) count nowhere, as globally; round robin's
//!   `min` is granted at `allocate_in` and counts, even above a
//!   `max_concurrent_threads`, as it oversubscribes the global budget.
//! * **The grant.** While the global budget has room, a slot goes to a
//!   waiting allocation whose whole path has room (`held <
//!   max_concurrent_threads` on every node). From the root down, each node
//!   picks among its children with an eligible waiter: strict priority
//!   (the lower value first), then among one priority the child whose
//!   virtual count is lowest (ties: definition order). Within the leaf, the
//!   leaf's waiter lists decide, by the three schedulers exactly as without
//!   a tree (the active one last): the schedulers stay the policy inside a
//!   workload, and without a tree the root is the only queue.
//! * **Fairness is count fair.** A grant through a child adds `1 / weight`
//!   to its virtual count (exact integers, [`GRANT_SCALE`]); a child that
//!   comes back (from idle, or when its own limit lets it go) starts at its
//!   level's virtual time, never behind it (ClickHouse's rule, with no
//!   catch-up credit). Over a backlog, siblings of weights 2 and 1 receive
//!   grants 2:1. Counting grants rather than slot-time is the choice
//!   because a grant is the only decision the scheduler makes: it cannot
//!   take a slot back (a yield is cooperative) and does not know how long
//!   a thread will keep one, so slot-time fairness would charge a
//!   workload for its threads' past lengths with no lever to correct
//!   them, and it would put a clock read on every release. The holdings
//!   themselves are bounded exactly by `max_concurrent_threads`.
//! * **Preemption by priority.** A grant cannot be taken back, but a
//!   holder that checks [`AcquiredSlot::should_yield`](crate::AcquiredSlot::should_yield)
//!   between units of work is told to release its slot while a waiting
//!   allocation **outranks** its workload: at some node of its path a
//!   sibling branch of strictly lower priority value has a waiting
//!   allocation with room on its own side, so that the slot the holder
//!   frees (from the global budget, or from a cap the two share) would be
//!   granted there. One preemption is wanted at a time, and only while no
//!   other yield is owed or wanted and no slot is borrowed on the shared
//!   part of the path (a release there repays the borrow and frees
//!   nothing); the freed slot goes to the best waiter by the grant rule,
//!   the preempted allocation asks for it again, and the next preemption
//!   is wanted once that grant is made. Before any holder is asked, a
//!   slot granted to an outranked allocation and not yet acquired (its
//!   thread not yet running with it: woken, or between units) is taken
//!   back at once, the newest such allocation's first, with the same CAS
//!   its own `try_acquire` would take it with, so exactly one of the two
//!   gets it; the allocation wants it again. Weights never preempt: within one
//!   priority the grant is the only lever, as above. Hence a priority-0
//!   query waits for the next checkpoint of one lower-priority holder,
//!   not for the end of its work (ClickHouse's CPU-slot preemption renews
//!   every lease each quantum; here only an outranked holder is asked, so
//!   a holder nobody outranks never pays a release and a re-grant).
//!   `WorkloadSlots::preemptions` counts the yields promised.
//! * **The wake-up yield.** A thread of a workload that can be outranked
//!   (it or an ancestor has a sibling of strictly lower priority value)
//!   that blocked in `acquire` and woke with a slot gives its CPU once
//!   (`sched_yield`) before it returns. The slot it woke for was often just
//!   released by a higher-priority query, whose thread the kernel shares a
//!   core with the woken one: the woken thread slept, so it has the
//!   earlier EEVDF deadline and runs first, and the query's thread
//!   returns from its release only after that thread's slice. With the
//!   yield the releaser finishes first; on an idle core the yield returns
//!   at once (about 1 µs). A workload nobody can outrank never yields, so
//!   a priority-0 query woken for its slot runs at once. Measured in
//!   decision 0027 (`wl_cpu_short_release_p99_ms`);
//!   `WorkloadSlots::wake_yields` counts the yields.
//! * **Parking.** A parked slot stops counting against every workload on
//!   its path, so its capacity can go to a waiter below a capped node. An
//!   unpark never waits: on each node of the path it either fits (`held <
//!   max`) or borrows (`borrowed + 1`), as the global budget does.
//!   `borrowed ≤ held − max` on every node (clamped after every decrease of
//!   `held` and every change of `max`), so a workload's next release repays
//!   its borrow before it frees a place, and no grant is made below a node
//!   while `held ≥ max`. Hence the invariant, per node, at every step
//!   while its `max` is not lowered and its allocations are of the fair
//!   schedulers: **`held − borrowed ≤ max_concurrent_threads`**.
//! * **Live changes** (`set_workloads`) carry every workload by name: its
//!   waiters, holdings, borrows and virtual counts; weights, priorities,
//!   limits may change, parents may not (remove the workload, then add it
//!   under the new parent). A workload that still has allocations, counted
//!   or parked slots cannot be removed or given children (a typed error
//!   naming it); a lowered limit takes nothing back, it withholds grants.
//!
//! # Locking
//!
//! The tree lives in the scheduler state, behind its one mutex: grants,
//! parks, unparks and live changes take it, and the tree's counts rise
//! only there, in the same critical section as the global count. Two
//! things need no lock. `try_acquire` touches no node: the grant that made
//! a slot available charged its path already, so taking it is the same CAS
//! on the allocation's `granted` as without a tree. A release while
//! nothing queues adds one to each node's `released` on its path, which
//! every read of the node's `held` subtracts (both live on the workload's
//! identity, [`WorkloadRef`], whose `parent` links are the path, fixed
//! since a live change cannot move a workload);
//! see the `scheduler_state::lock_free` module for why no waiter is
//! stranded. A node's borrowed count is read as `min(borrowed, held −
//! max)`, so such a release repays a borrow with no lock either. Slot
//! time is a statistic: a slot adds its counted time to its leaf's
//! `slot_ns` (`Relaxed`) when it parks or is released, and a snapshot sums
//! the leaves up the tree.

use std::collections::HashMap;

use slotring_throttle::WorkloadTree;

use crate::sync::{Arc, AtomicU64, Ordering};
use crate::{SlotsError, UNLIMITED};

/// The virtual count of one grant at weight 1: a multiple of every weight
/// up to 16 and of every power of two up to
/// [`slotring_throttle::workload::MAX_WEIGHT`], so that such weights
/// divide it exactly.
pub const GRANT_SCALE: u128 = 720_720 << 16;

/// A workload's identity across live changes: an allocation and its slots
/// keep it, find their node through it, and the lock-free release
/// uncounts its slot along its `parent` links.
#[derive(Debug)]
pub(crate) struct WorkloadRef {
    /// The workload's name.
    pub(crate) name: String,
    /// Its parent's identity: fixed for its life (a live change cannot
    /// move a workload), so the path is known without the lock.
    pub(crate) parent: Option<Arc<WorkloadRef>>,
    /// Slots counted against it, gross of `released`: written only under
    /// the state mutex (a load and a store: no read-modify-write).
    held: AtomicU64,
    /// Slots released lock-free and not yet folded into `held` (see the
    /// `scheduler_state::lock_free` module).
    pub(crate) released: AtomicU64,
    /// Its node's index in the current tree (written under the state mutex).
    index: AtomicU64,
    /// Nanoseconds its allocations' competing slots counted here (a leaf's
    /// own; a statistic, `Relaxed`), added when a slot parks or is released.
    pub(crate) slot_ns: AtomicU64,
}

impl WorkloadRef {
    /// Its node's index (read under the state mutex).
    pub(crate) fn index(&self) -> usize {
        self.index.load(Ordering::Relaxed) as usize
    }

    /// Slots counted against it: `held` less the lock-free releases.
    fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed) - self.released.load(Ordering::Relaxed)
    }

    /// Change the count by `+up − down`, folding in the lock-free releases
    /// (under the state mutex).
    fn change(&self, up: u64, down: u64) {
        let mut gross = self.held.load(Ordering::Relaxed);
        if self.released.load(Ordering::Relaxed) != 0 {
            gross -= self.released.swap(0, Ordering::Relaxed);
        }
        debug_assert!(
            gross + up >= down,
            "{} held {gross} + {up} < {down}",
            self.name
        );
        self.held.store(gross + up - down, Ordering::Relaxed);
    }
}

/// One workload's numbers (see [`crate::ConcurrencyControl::workloads`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadSlots {
    /// The workload's name.
    pub name: String,
    /// Its parent's name (`None`: the root), so that a reader of a
    /// snapshot knows the tree's leaves.
    pub parent: Option<String>,
    /// Its `max_concurrent_threads` (`None`: no limit).
    pub max_concurrent_threads: Option<u64>,
    /// Competing slots counted against it (see the module docs).
    pub held: u64,
    /// Of those, taken back by unparks beyond its limit.
    pub borrowed: u64,
    /// Parked slots of the allocations entered at it (a leaf).
    pub parked: u64,
    /// Live allocations entered at it (a leaf).
    pub allocations: u64,
    /// Slots granted through it, in total.
    pub grants: u64,
    /// Unparks that borrowed on it, in total.
    pub borrows: u64,
    /// Yields its holders promised because a waiting workload outranked
    /// it (the priority preemption of the module docs), in total.
    pub preemptions: u64,
    /// CPU yields its allocations' threads made as they woke with a slot
    /// (the wake-up yield of the module docs), in total.
    pub wake_yields: u64,
    /// Slot time: nanoseconds that competing slots of the allocations
    /// below it (at every level) counted against it, unparked, in total.
    /// A slot's time is added when it parks or is released, so a slot held
    /// now is not in it yet.
    pub slot_ns: u64,
}

#[derive(Debug)]
struct Node {
    id: Arc<WorkloadRef>,
    parent: Option<usize>,
    children: Vec<usize>,
    priority: i64,
    weight: u32,
    /// `max_concurrent_threads`, [`UNLIMITED`] when none.
    max: u64,
    /// Borrowed slots as last clamped: the count is
    /// `min(borrowed, held − max)` ([`Node::borrowed`]), since a lock-free
    /// release lowers `held` without the lock.
    borrowed: u64,
    parked: u64,
    allocations: u64,
    /// The virtual count of grants through it, among its siblings.
    vr: u128,
    /// Among its children: each priority's virtual time.
    levels: Vec<(i64, u128)>,
    grants: u64,
    borrows: u64,
    preemptions: u64,
    wake_yields: u64,
}

impl Node {
    fn level(&self, priority: i64) -> u128 {
        self.levels
            .iter()
            .find(|(p, _)| *p == priority)
            .map_or(0, |&(_, v)| v)
    }

    fn set_level(&mut self, priority: i64, v: u128) {
        match self.levels.iter_mut().find(|(p, _)| *p == priority) {
            Some(l) => l.1 = v,
            None => self.levels.push((priority, v)),
        }
    }

    /// The borrowed count: never above the overshoot `held − max`.
    fn borrowed(&self) -> u64 {
        self.borrowed.min(self.id.held().saturating_sub(self.max))
    }

    /// Store [`Node::borrowed`]: before every raise of `held` and every
    /// change of `max` (so that a borrow repaid by a lock-free release is
    /// not counted again when the overshoot grows), and after every
    /// decrease under the lock.
    fn clamp_borrowed(&mut self) {
        self.borrowed = self.borrowed();
    }

    /// Whether anything still counts here: allocations, counted or parked
    /// slots.
    fn busy(&self) -> bool {
        self.allocations > 0 || self.id.held() > 0 || self.parked > 0
    }
}

/// The tree of workloads a control schedules by (see the module docs).
#[derive(Debug)]
pub(crate) struct SlotTree {
    /// Parents before children (the root at 0), as the spec orders them.
    nodes: Vec<Node>,
    index: HashMap<String, usize>,
    /// Scratch for [`SlotTree::pick`]: whether a node's subtree can take a slot.
    eligible: Vec<bool>,
    /// As last computed by [`SlotTree::preemption`]: whether a waiting
    /// workload outranks the node (see the module docs).
    outranked: Vec<bool>,
    /// Scratch for [`SlotTree::preemption`]: whether a node or an
    /// ancestor has borrowed.
    repays: Vec<bool>,
    /// Whether any node's children differ in priority: without that, no
    /// workload can outrank another and [`SlotTree::preemption`] is skipped.
    has_priorities: bool,
    /// Whether a node can be outranked: it or an ancestor has a sibling of
    /// strictly lower priority value (the wake-up yield's rule).
    outrankable: Vec<bool>,
}

/// "Not in the new tree", in [`SlotTree::rebuild`]'s map.
pub(crate) const GONE: usize = usize::MAX;

impl SlotTree {
    /// Refuse a change that `old` cannot make into `spec`: a busy workload
    /// removed or given children (leaves first, so a leaf is named before
    /// its ancestors), any workload moved to another parent.
    fn check_change(old: &SlotTree, spec: &WorkloadTree) -> Result<(), SlotsError> {
        for n in old.nodes.iter().rev() {
            let name = &n.id.name;
            if let Some(new) = spec.get(name) {
                let was = n.id.parent.as_ref().map(|p| p.name.as_str());
                if new.parent.as_deref() != was {
                    let root = || "(root)".to_owned();
                    return Err(SlotsError::WorkloadMoved {
                        workload: name.clone(),
                        from: was.map_or_else(root, str::to_owned),
                        to: new.parent.clone().unwrap_or_else(root),
                    });
                }
            }
            if !n.busy() {
                continue;
            }
            let change = match spec.get(name) {
                None => "removing it",
                Some(_) if !spec.is_leaf(name) && n.children.is_empty() => "giving it children",
                Some(_) => continue,
            };
            return Err(SlotsError::WorkloadBusy {
                workload: name.clone(),
                allocations: n.allocations,
                slots: n.id.held() + n.parked,
                change,
            });
        }
        Ok(())
    }

    /// The tree of `spec`, carrying by name what `old` knows (waiters move
    /// with the map returned: old index → new index, or [`GONE`]).
    pub(crate) fn rebuild(
        old: Option<&SlotTree>,
        spec: &WorkloadTree,
    ) -> Result<(SlotTree, Vec<usize>), SlotsError> {
        if let Some(old) = old {
            Self::check_change(old, spec)?;
        }
        let mut index = HashMap::with_capacity(spec.specs().len());
        let mut nodes: Vec<Node> = Vec::with_capacity(spec.specs().len());
        for (i, s) in spec.specs().iter().enumerate() {
            let parent = s.parent.as_ref().map(|p| index[p.as_str()]);
            let was = old.and_then(|o| o.index.get(&s.name).map(|&j| &o.nodes[j]));
            let id = match was {
                Some(w) => w.id.clone(),
                None => Arc::new(WorkloadRef {
                    name: s.name.clone(),
                    parent: parent.map(|p: usize| nodes[p].id.clone()),
                    held: AtomicU64::new(0),
                    released: AtomicU64::new(0),
                    index: AtomicU64::new(0),
                    slot_ns: AtomicU64::new(0),
                }),
            };
            id.index.store(i as u64, Ordering::Relaxed);
            let mut node = Node {
                id,
                parent,
                children: Vec::new(),
                priority: s.priority,
                weight: s.weight,
                max: s.max_concurrent_threads.unwrap_or(UNLIMITED),
                // Clamped under the old limit before the new one applies.
                borrowed: was.map_or(0, Node::borrowed),
                parked: was.map_or(0, |w| w.parked),
                allocations: was.map_or(0, |w| w.allocations),
                vr: was.map_or(0, |w| w.vr),
                levels: was.map_or_else(Vec::new, |w| w.levels.clone()),
                grants: was.map_or(0, |w| w.grants),
                borrows: was.map_or(0, |w| w.borrows),
                preemptions: was.map_or(0, |w| w.preemptions),
                wake_yields: was.map_or(0, |w| w.wake_yields),
            };
            node.clamp_borrowed();
            nodes.push(node);
            if let Some(p) = parent {
                nodes[p].children.push(i);
            }
            index.insert(s.name.clone(), i);
        }
        let map = old.map_or_else(Vec::new, |o| {
            o.nodes
                .iter()
                .map(|n| index.get(&n.id.name).copied().unwrap_or(GONE))
                .collect()
        });
        let eligible = vec![false; nodes.len()];
        let outranked = vec![false; nodes.len()];
        let repays = vec![false; nodes.len()];
        let has_priorities = nodes.iter().any(|n| {
            n.children
                .windows(2)
                .any(|w| nodes[w[0]].priority != nodes[w[1]].priority)
        });
        // Parents come before children: each node's answer extends its
        // parent's.
        let mut outrankable = vec![false; nodes.len()];
        for i in 0..nodes.len() {
            if let Some(p) = nodes[i].parent {
                let lower_sibling = nodes[p]
                    .children
                    .iter()
                    .any(|&c| nodes[c].priority < nodes[i].priority);
                outrankable[i] = outrankable[p] || lower_sibling;
            }
        }
        Ok((
            SlotTree {
                nodes,
                index,
                eligible,
                outranked,
                repays,
                has_priorities,
                outrankable,
            },
            map,
        ))
    }

    /// How many workloads (queues) the tree has.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The leaf `name`, where an allocation enters; counted as a live
    /// allocation there.
    pub(crate) fn enter(&mut self, name: &str) -> Result<Arc<WorkloadRef>, SlotsError> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| SlotsError::UnknownWorkload {
                workload: name.to_owned(),
            })?;
        if !self.nodes[i].children.is_empty() {
            return Err(SlotsError::WorkloadNotALeaf {
                workload: name.to_owned(),
            });
        }
        self.nodes[i].allocations += 1;
        Ok(self.nodes[i].id.clone())
    }

    /// An allocation entered at `leaf` is freed.
    pub(crate) fn leave(&mut self, leaf: usize) {
        self.nodes[leaf].allocations -= 1;
    }

    /// `n` slots start counting at `leaf` and above.
    pub(crate) fn add(&mut self, leaf: usize, n: u64) {
        let mut at = Some(leaf);
        while let Some(i) = at {
            let node = &mut self.nodes[i];
            node.clamp_borrowed();
            node.id.change(n, 0);
            at = node.parent;
        }
    }

    /// `n` slots stop counting at `leaf` and above; borrows are repaid
    /// first (see the module docs).
    pub(crate) fn sub(&mut self, leaf: usize, n: u64) {
        let mut at = Some(leaf);
        while let Some(i) = at {
            let node = &mut self.nodes[i];
            node.id.change(0, n);
            node.clamp_borrowed();
            at = node.parent;
        }
    }

    /// A counted slot of `leaf` parks (after [`SlotTree::sub`]).
    pub(crate) fn parked(&mut self, leaf: usize) {
        self.nodes[leaf].parked += 1;
    }

    /// A parked slot of `leaf` is dropped.
    pub(crate) fn parked_dropped(&mut self, leaf: usize) {
        self.nodes[leaf].parked -= 1;
    }

    /// A parked slot of `leaf` counts again (instead of
    /// [`SlotTree::add`]): every node of the path without room borrows.
    pub(crate) fn unparked(&mut self, leaf: usize) {
        self.nodes[leaf].parked -= 1;
        let mut at = Some(leaf);
        while let Some(i) = at {
            let node = &mut self.nodes[i];
            node.clamp_borrowed();
            if node.id.held() >= node.max {
                node.borrowed += 1;
                node.borrows += 1;
            }
            node.id.change(1, 0);
            at = node.parent;
        }
    }

    /// The queue the next slot goes to, and its grant booked along the
    /// path (virtual counts, grant totals); `None` if no waiting
    /// allocation has room on its whole path. `waiting(n)`: whether
    /// allocations wait at node `n`.
    pub(crate) fn pick(&mut self, waiting: impl Fn(usize) -> bool) -> Option<usize> {
        self.mark_eligible(&waiting);
        if !self.eligible[0] {
            return None;
        }
        let mut at = 0;
        loop {
            self.nodes[at].grants += 1;
            if waiting(at) {
                return Some(at);
            }
            let node = &self.nodes[at];
            let mut best: Option<(i64, u128, usize)> = None;
            for &c in &node.children {
                if !self.eligible[c] {
                    continue;
                }
                let ch = &self.nodes[c];
                let key = (ch.priority, ch.vr.max(node.level(ch.priority)), c);
                if best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            }
            let (priority, start, c) =
                best.expect("an eligible node without waiters has an eligible child");
            self.nodes[at].set_level(priority, start);
            let child = &mut self.nodes[c];
            child.vr = start + GRANT_SCALE / u128::from(child.weight.max(1));
            at = c;
        }
    }

    /// Mark in `eligible` every node whose subtree has a waiting
    /// allocation with room on its path from that node down.
    fn mark_eligible(&mut self, waiting: &impl Fn(usize) -> bool) {
        let nodes = &self.nodes;
        let eligible = &mut self.eligible;
        for i in (0..nodes.len()).rev() {
            let n = &nodes[i];
            eligible[i] =
                n.id.held() < n.max && (waiting(i) || n.children.iter().any(|&c| eligible[c]));
        }
    }

    /// Whether a holder should be preempted: some workload that holds a
    /// slot is outranked, i.e. at some node of its path, where neither it
    /// nor an ancestor has borrowed, a sibling branch of strictly lower
    /// priority value has a waiting allocation with room on its own side
    /// (see the module docs). Records each node's
    /// outranked flag for [`SlotTree::outranked`]. O(nodes); called under
    /// the state mutex while allocations wait, after the grants, so a
    /// waiter with room on its own side waits for the global budget or
    /// for a cap shared with the outranked holder, which the holder's
    /// release frees.
    pub(crate) fn preemption(&mut self, waiting: impl Fn(usize) -> bool) -> bool {
        if !self.has_priorities {
            return false;
        }
        self.mark_eligible(&waiting);
        let mut any = false;
        self.outranked[0] = false;
        // `repays[i]`: node `i` or an ancestor has borrowed, so a release
        // below it repays that borrow instead of freeing a place there.
        self.repays[0] = self.nodes[0].borrowed() > 0;
        for i in 0..self.nodes.len() {
            let node = &self.nodes[i];
            let best = node
                .children
                .iter()
                .filter(|&&c| self.eligible[c])
                .map(|&c| self.nodes[c].priority)
                .min()
                .filter(|_| !self.repays[i]);
            let above = self.outranked[i];
            for &c in &node.children {
                let out = above || best.is_some_and(|b| b < self.nodes[c].priority);
                self.outranked[c] = out;
                self.repays[c] = self.repays[i] || self.nodes[c].borrowed() > 0;
                any |= out && self.nodes[c].id.held() > 0;
            }
        }
        any
    }

    /// Whether `leaf` was outranked at the last [`SlotTree::preemption`].
    pub(crate) fn outranked(&self, leaf: usize) -> bool {
        self.outranked[leaf]
    }

    /// Whether a thread of `leaf` that woke with a slot gives its CPU once
    /// (the module docs' wake-up yield), counted when it does.
    pub(crate) fn wake_yield(&mut self, leaf: usize) -> bool {
        let yields = self.outrankable[leaf];
        if yields {
            self.nodes[leaf].wake_yields += 1;
        }
        yields
    }

    /// A holder of `leaf` promised a preemption yield.
    pub(crate) fn preempted(&mut self, leaf: usize) {
        self.nodes[leaf].preemptions += 1;
    }

    /// Every workload's numbers, parents first.
    pub(crate) fn snapshot(&self) -> Vec<WorkloadSlots> {
        // Slot time is counted at the leaves; a node's is its subtree's.
        let mut slot_ns: Vec<u64> = self
            .nodes
            .iter()
            .map(|n| n.id.slot_ns.load(Ordering::Relaxed))
            .collect();
        for (i, n) in self.nodes.iter().enumerate().rev() {
            if let Some(p) = n.parent {
                slot_ns[p] = slot_ns[p].saturating_add(slot_ns[i]);
            }
        }
        self.nodes
            .iter()
            .zip(slot_ns)
            .map(|(n, slot_ns)| WorkloadSlots {
                name: n.id.name.clone(),
                parent: n.id.parent.as_ref().map(|p| p.name.clone()),
                max_concurrent_threads: (n.max != UNLIMITED).then_some(n.max),
                held: n.id.held(),
                borrowed: n.borrowed(),
                parked: n.parked,
                allocations: n.allocations,
                grants: n.grants,
                borrows: n.borrows,
                preemptions: n.preemptions,
                wake_yields: n.wake_yields,
                slot_ns,
            })
            .collect()
    }
}
