//! The tree under the scheduler's lock: an arena of workload nodes, each a
//! leaf queue or a priority policy over fair levels, behind its cap and
//! in-flight constraints (ClickHouse's unified node:
//! `cap → in-flight → priority → fair[p] → children`), and the dispatch
//! that pulls the next request from the root.
//!
//! # Activity
//!
//! A node is *active* when requests queue in its subtree, its own
//! constraints admit one now (its caps' debts end within τ, its in-flight
//! counts have room) and, for an inner node, some child is active. A parent's
//! fair levels hold exactly its active children. Every event that can change
//! a node's activity re-settles the path from it to the root: a push, a
//! dispatch (its charges, its in-flight places), a cancellation, a
//! completion, and time — a node blocked by a cap sleeps in a set ordered by
//! the clock reading at which its debt ends within τ, and every operation
//! first wakes the sleepers whose time has come. So a dispatch walks one
//! path down (first active child at each level), never scans blocked ones,
//! and costs `O(depth · log siblings)`.
//!
//! A node blocked by its in-flight bytes was blocked for the request its
//! subtree offered; a push into the subtree, a cancellation or a child's
//! change of activity may change that request, so each wakes it to be tried
//! again (each failed try blocks the node that refused, so a dispatch round
//! ends).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::fair_policy::{FairLevel, NOWHERE};
use super::inflight::Places;
use super::leaf_queue::{LeafQueue, Pending};
use super::node::{NodeShared, cap_error};
use super::priority_policy::PriorityPolicy;
use super::spec::{WorkloadSpec, WorkloadTree};
use super::{Resource, WorkloadError};
use crate::sync::Ordering;

/// A path from a leaf up to the root (the leaf first), on the stack.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chain {
    at: [u32; super::MAX_DEPTH],
    len: usize,
}

impl Chain {
    fn new() -> Self {
        Self {
            at: [0; super::MAX_DEPTH],
            len: 0,
        }
    }

    fn push(&mut self, i: usize) {
        self.at[self.len] = i as u32;
        self.len += 1;
    }

    /// The nodes, leaf first.
    pub(crate) fn as_slice(&self) -> &[u32] {
        &self.at[..self.len]
    }

    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.as_slice().iter().map(|&i| i as usize)
    }

    fn reverse(&mut self) {
        self.at[..self.len].reverse();
    }
}

/// Why a node with queued requests cannot give one now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blocked {
    Open,
    /// A cap's debt ends within τ at this clock reading.
    Cap(u64),
    /// Its in-flight limits have no room for what its subtree offers.
    InFlight,
}

/// A node's state under the lock that every push and dispatch through it
/// reads or writes, laid out (`repr(C)`) in one 128-byte-aligned pair of
/// cache lines (Intel's adjacent-line prefetcher moves the pair
/// together): a request's way through a leaf touches nothing else of the
/// leaf under the lock, whatever the number of leaves. The first line holds
/// what decides its activity and its fair order; the second its queue
/// (whose first request is inline: a leaf with one request queued touches
/// no allocation). What an inner node keeps for its children is in
/// [`Children`], apart.
#[derive(Debug)]
#[repr(C, align(128))]
struct NodeCore {
    /// Virtual runtime in the parent's fair level.
    vr: u128,
    shared: Arc<NodeShared>,
    /// Requests queued in the subtree.
    backlog: u64,
    /// The parent's index ([`NO_PARENT`]: the root).
    parent: u32,
    weight: u32,
    priority: i16,
    /// Whether it is in its parent's fair level (active).
    in_parent: bool,
    leaf: bool,
    /// Whether it has a cap or an in-flight limit (else it never blocks,
    /// and its shared state need not be read to know it).
    constrained: bool,
    blocked: Blocked,
    queue: LeafQueue,
}

// The layout above holds: one pair of lines, the queue on the second.
const _: () = assert!(std::mem::size_of::<NodeCore>() == 128);
const _: () = assert!(std::mem::offset_of!(NodeCore, queue) == 64);

/// [`NodeCore::parent`] of the root.
const NO_PARENT: u32 = u32::MAX;

impl NodeCore {
    fn parent(&self) -> Option<usize> {
        (self.parent != NO_PARENT).then_some(self.parent as usize)
    }
}

/// What a node keeps for its children (empty at a leaf).
#[derive(Debug, Default)]
struct Children {
    policy: PriorityPolicy,
    /// Catch-up credit of the children, tokens: τ at the tightest byte cap
    /// at or above this node.
    credit: u128,
}

/// A request the dispatch let go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dispatched {
    pub(crate) id: u64,
    /// The leaf's index.
    pub(crate) leaf: usize,
    pub(crate) outcome: Result<Booked, WorkloadError>,
}

/// What a dispatched request holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Booked {
    pub(crate) cost: u64,
    /// ns from the dispatch until the caps' debts before it end (≤ τ).
    pub(crate) delay_ns: u64,
    /// The in-flight places taken along the path (the leaf is node 0).
    pub(crate) places: Places,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Tree {
    nodes: Vec<NodeCore>,
    /// Each node's [`Children`], by index.
    children: Vec<Children>,
    by_name: HashMap<String, usize>,
    sleeping: BTreeSet<(u64, usize)>,
    /// Each node's place in its parent's fair heap (`fair_policy`).
    heap_pos: Vec<u32>,
    tau_ns: u64,
    resource: Resource,
}

fn priority_of(spec: &WorkloadSpec) -> i16 {
    // Validated against PRIORITIES, which fits i16.
    i16::try_from(spec.priority).expect("priority validated")
}

impl Tree {
    /// Build `spec` at `now`, or change `old` into it (a live change):
    /// workloads keep their shared state, queues, virtual runtimes and their
    /// levels' virtual times by name. Nothing changes unless all of it can.
    pub(crate) fn build(
        spec: &WorkloadTree,
        resource: Resource,
        tau_ns: u64,
        now: u64,
        old: Option<&mut Tree>,
    ) -> Result<Tree, WorkloadError> {
        if let Some(old) = &old {
            old.check_change(spec)?;
        }
        let specs = spec.specs();
        let mut by_name = HashMap::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            by_name.insert(s.name.clone(), i);
        }
        // Everything fallible first: the shared state of new workloads.
        let mut fresh = Vec::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            let existing = old
                .as_ref()
                .and_then(|o| o.by_name.get(&s.name).map(|&j| o.nodes[j].shared.clone()));
            match existing {
                Some(sh) => fresh.push((sh, false)),
                None => fresh.push((
                    Arc::new(NodeShared::new(s, resource, spec.is_leaf(&s.name), i, now)?),
                    true,
                )),
            }
        }
        for ((sh, new), s) in fresh.iter().zip(specs) {
            if !new {
                sh.change(s, resource, now)?;
            }
        }
        // A removed workload's shared state lives on in its permits still
        // out, which give their places back to it.
        let mut old_nodes: HashMap<String, (NodeCore, Children)> = HashMap::new();
        if let Some(o) = old {
            for (n, c) in o.nodes.drain(..).zip(o.children.drain(..)) {
                if !by_name.contains_key(&n.shared.name) {
                    n.shared.removed.store(true, Ordering::SeqCst);
                }
                old_nodes.insert(n.shared.name.clone(), (n, c));
            }
        }
        let mut nodes: Vec<NodeCore> = Vec::with_capacity(specs.len());
        let mut children: Vec<Children> = Vec::with_capacity(specs.len());
        // Each node's tightest byte cap at or above it, tokens/s
        // (`u128::MAX`: none).
        let mut tightest: Vec<u128> = Vec::with_capacity(specs.len());
        for (i, (s, (shared, _))) in specs.iter().zip(fresh).enumerate() {
            let leaf = spec.is_leaf(&s.name);
            shared.leaf.store(leaf, Ordering::SeqCst);
            shared.index.store(i as u64, Ordering::Relaxed);
            let prev = old_nodes.remove(&s.name);
            let mut policy = PriorityPolicy::default();
            if let Some((_, c)) = &prev {
                for (prio, l) in c.policy.levels() {
                    policy.insert_level(prio, FairLevel::with_v(l.v()));
                }
            }
            let parent = s.parent.as_ref().map(|p| by_name[p.as_str()]);
            let rate = shared.bytes.rate();
            let above = parent.map_or(u128::MAX, |p: usize| tightest[p]);
            let tight = rate.map_or(above, |r| above.min(u128::from(r)));
            tightest.push(tight);
            let credit = if tight == u128::MAX {
                0
            } else {
                tight * u128::from(tau_ns) / 1_000_000_000
            };
            children.push(Children { policy, credit });
            let constrained =
                shared.bytes.present() || shared.ops.present() || shared.inflight.limited();
            nodes.push(NodeCore {
                shared,
                // Fewer than 2³² workloads: a spec's names index a Vec.
                parent: parent.map_or(NO_PARENT, |p| {
                    u32::try_from(p).expect("fewer than 2³² workloads")
                }),
                priority: priority_of(s),
                weight: s.weight,
                vr: prev.as_ref().map_or(0, |(p, _)| p.vr),
                in_parent: false,
                leaf,
                queue: prev.map(|(p, _)| p.queue).unwrap_or_default(),
                backlog: 0,
                blocked: Blocked::Open,
                constrained,
            });
        }
        for n in &nodes {
            if let Some(p) = n.parent() {
                children[p].policy.level(n.priority).weight_sum += u64::from(n.weight);
            }
        }
        let mut t = Tree {
            nodes,
            children,
            by_name,
            sleeping: BTreeSet::new(),
            heap_pos: vec![NOWHERE; specs.len()],
            tau_ns,
            resource,
        };
        // Backlogs from the queues, children before parents.
        for i in (0..t.nodes.len()).rev() {
            let own = t.nodes[i].queue.len() as u64;
            t.nodes[i].backlog += own;
            let b = t.nodes[i].backlog;
            t.nodes[i].shared.queued.store(b, Ordering::SeqCst);
            if let Some(p) = t.nodes[i].parent() {
                t.nodes[p].backlog += b;
            }
        }
        for i in (0..t.nodes.len()).rev() {
            if t.nodes[i].backlog > 0 {
                t.refresh(i, now);
            }
        }
        for i in (0..t.nodes.len()).rev() {
            if t.nodes[i].backlog > 0 {
                t.settle(i);
            }
        }
        Ok(t)
    }

    /// Refuse a live change that would lose queued requests or move a
    /// workload (see [`WorkloadError::Busy`], [`WorkloadError::Reparent`]).
    fn check_change(&self, spec: &WorkloadTree) -> Result<(), WorkloadError> {
        for n in &self.nodes {
            let name = &n.shared.name;
            match spec.get(name) {
                None if n.backlog > 0 => {
                    return Err(WorkloadError::Busy {
                        node: name.clone(),
                        queued: n.backlog,
                        change: "removing it",
                    });
                }
                None => {}
                Some(s) => {
                    let from = n.parent().map(|p| self.nodes[p].shared.name.clone());
                    if s.parent != from {
                        return Err(WorkloadError::Reparent {
                            node: name.clone(),
                            from: from.unwrap_or_default(),
                            to: s.parent.clone().unwrap_or_default(),
                        });
                    }
                    if n.leaf && !n.queue.is_empty() && !spec.is_leaf(name) {
                        return Err(WorkloadError::Busy {
                            node: name.clone(),
                            queued: n.queue.len() as u64,
                            change: "giving it children",
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The node called `name`.
    pub(crate) fn find(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The shared state of node `i`.
    pub(crate) fn shared(&self, i: usize) -> &Arc<NodeShared> {
        &self.nodes[i].shared
    }

    /// The nodes from `leaf` up to the root, leaf first (a walk of the
    /// parent links: nothing built).
    pub(crate) fn ancestry(&self, leaf: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(leaf), |&i| self.nodes[i].parent())
    }

    /// The path from `leaf` to the root.
    pub(crate) fn path(&self, leaf: usize) -> Chain {
        let mut p = Chain::new();
        let mut at = Some(leaf);
        while let Some(i) = at {
            p.push(i);
            at = self.nodes[i].parent();
        }
        p
    }

    fn is_active(&self, i: usize) -> bool {
        let n = &self.nodes[i];
        n.backlog > 0
            && n.blocked == Blocked::Open
            && if n.leaf {
                !n.queue.is_empty()
            } else {
                self.children[i].policy.has_active()
            }
    }

    /// The child of node `i` that goes next (none at a leaf, whose
    /// children's state is not read).
    fn first_child(&self, i: usize) -> Option<usize> {
        if self.nodes[i].leaf {
            return None;
        }
        self.children[i].policy.first()
    }

    /// Re-evaluate node `i`'s constraints at `now`.
    fn refresh(&mut self, i: usize, now: u64) {
        let tau = self.tau_ns;
        let n = &self.nodes[i];
        if !n.constrained {
            return self.set_blocked(i, Blocked::Open);
        }
        let cap = match (
            n.shared.bytes.eligible_at(now, tau),
            n.shared.ops.eligible_at(now, tau),
        ) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).max(b.unwrap_or(0))),
        };
        let blocked = match cap {
            Some(at) => Blocked::Cap(at),
            None if !n.shared.inflight.may_admit() => Blocked::InFlight,
            None => Blocked::Open,
        };
        self.set_blocked(i, blocked);
    }

    fn set_blocked(&mut self, i: usize, b: Blocked) {
        if let Blocked::Cap(at) = self.nodes[i].blocked {
            self.sleeping.remove(&(at, i));
        }
        if let Blocked::Cap(at) = b {
            self.sleeping.insert((at, i));
        }
        self.nodes[i].blocked = b;
    }

    /// Bring the fair levels on the path from `i` to the root in line with
    /// the nodes' activity.
    fn settle(&mut self, mut i: usize) {
        loop {
            let a = self.is_active(i);
            let Some(p) = self.nodes[i].parent() else {
                return;
            };
            if a != self.nodes[i].in_parent {
                let (prio, mut vr) = (self.nodes[i].priority, self.nodes[i].vr);
                let c = &mut self.children[p];
                if a {
                    c.policy
                        .activate(prio, i, &mut vr, c.credit, &mut self.heap_pos);
                } else {
                    c.policy.deactivate(prio, i, vr, &mut self.heap_pos);
                }
                self.nodes[i].vr = vr;
                self.nodes[i].in_parent = a;
                // What the parent's subtree offers next changed: if its
                // in-flight bytes refused the old offer, try the new one.
                if self.nodes[p].blocked == Blocked::InFlight {
                    self.nodes[p].blocked = Blocked::Open;
                    if !self.nodes[p].shared.inflight.may_admit() {
                        self.nodes[p].blocked = Blocked::InFlight;
                    }
                }
            }
            i = p;
        }
    }

    /// Wake the cap sleepers whose debt ends within τ at `now`.
    pub(crate) fn wake(&mut self, now: u64) {
        while let Some(&(at, i)) = self.sleeping.first() {
            if at > now {
                return;
            }
            self.sleeping.remove(&(at, i));
            self.nodes[i].blocked = Blocked::Open;
            self.refresh(i, now);
            self.settle(i);
        }
    }

    /// The earliest clock reading at which a sleeping cap wakes.
    pub(crate) fn next_wake(&self) -> Option<u64> {
        self.sleeping.first().map(|&(at, _)| at)
    }

    /// Queue request `id` of `cost` at `leaf`.
    pub(crate) fn push(&mut self, leaf: usize, id: u64, cost: u64, now: u64) {
        self.wake(now);
        self.nodes[leaf].queue.push(Pending { id, cost });
        let mut at = Some(leaf);
        while let Some(i) = at {
            at = self.nodes[i].parent();
            let n = &mut self.nodes[i];
            n.backlog += 1;
            n.shared.queued.fetch_add(1, Ordering::SeqCst);
            // Constraints are evaluated after the count is published (see
            // the `inflight` module's memory ordering). A node its request
            // count blocks stays blocked whatever is pushed (only a
            // completion frees it); one its bytes block is tried again, the
            // request offered may have changed.
            if n.backlog == 1
                || (n.blocked == Blocked::InFlight && n.shared.inflight.limits_bytes())
            {
                self.refresh(i, now);
            }
        }
        self.settle(leaf);
    }

    /// Take queued request `id` out of `leaf`; whether it was queued.
    pub(crate) fn cancel(&mut self, leaf: usize, id: u64, now: u64) -> bool {
        self.wake(now);
        if self.nodes[leaf].queue.remove(id).is_none() {
            return false;
        }
        for i in self.path(leaf).iter() {
            let n = &mut self.nodes[i];
            n.backlog -= 1;
            n.shared.dequeued();
            if n.backlog == 0 {
                self.set_blocked(i, Blocked::Open);
            } else if n.blocked == Blocked::InFlight {
                self.refresh(i, now);
            }
        }
        self.settle(leaf);
        true
    }

    /// In-flight places came back on `nodes` (a completion).
    pub(crate) fn released(&mut self, nodes: impl Iterator<Item = usize>, now: u64) {
        self.wake(now);
        for i in nodes {
            if self.nodes[i].backlog > 0 && self.nodes[i].blocked == Blocked::InFlight {
                self.refresh(i, now);
                self.settle(i);
            }
        }
    }

    /// Let the next eligible request go at `now`, if any: charge it along its
    /// path and take its in-flight places.
    pub(crate) fn dispatch(&mut self, now: u64) -> Option<Dispatched> {
        self.wake(now);
        'select: loop {
            if !self.is_active(0) {
                return None;
            }
            let mut path = Chain::new();
            path.push(0);
            let mut n = 0;
            while let Some(c) = self.first_child(n) {
                path.push(c);
                n = c;
            }
            path.reverse();
            let leaf = n;
            let req = self.nodes[leaf]
                .queue
                .front()
                .expect("an active leaf queues");
            // In-flight places first: they can be given back without a trace.
            let mut places = Places::default();
            for (k, i) in path.iter().enumerate() {
                if !self.nodes[i].constrained {
                    continue;
                }
                let f = &self.nodes[i].shared.inflight;
                if !f.limited() {
                    continue;
                }
                if let Some(taken) = f.try_acquire(req.cost) {
                    places.set(k, taken);
                } else {
                    self.give_back(&path, places, req.cost);
                    self.set_blocked(i, Blocked::InFlight);
                    self.settle(i);
                    continue 'select;
                }
            }
            // Then the caps, each charged and checked, refunded if a later
            // one refuses.
            let mut delay_ns = 0;
            // Bit `k` of each: that cap of the `k`-th node was charged.
            let mut charged = (0u64, 0u64);
            for (k, i) in path.iter().enumerate() {
                if !self.nodes[i].constrained {
                    continue;
                }
                for ops in [false, true] {
                    let sh = &self.nodes[i].shared;
                    let (cap, cost) = if ops {
                        (&sh.ops, 1)
                    } else {
                        (&sh.bytes, req.cost)
                    };
                    match cap.admit(cost, now, self.tau_ns) {
                        Ok(super::cap::Admit::Charged { delay_ns: d }) => {
                            delay_ns = delay_ns.max(d);
                            if ops {
                                charged.1 |= 1 << k;
                            } else {
                                charged.0 |= 1 << k;
                            }
                        }
                        Ok(super::cap::Admit::Refused { eligible_at }) => {
                            self.refund(&path, charged, req.cost, now);
                            self.give_back(&path, places, req.cost);
                            let at = match self.nodes[i].blocked {
                                Blocked::Cap(a) => a.max(eligible_at),
                                _ => eligible_at,
                            };
                            self.set_blocked(i, Blocked::Cap(at));
                            self.settle(i);
                            continue 'select;
                        }
                        Err(e) => {
                            let err = cap_error(&self.nodes[i].shared.name, e, cost);
                            self.refund(&path, charged, req.cost, now);
                            self.give_back(&path, places, req.cost);
                            self.cancel(leaf, req.id, now);
                            return Some(Dispatched {
                                id: req.id,
                                leaf,
                                outcome: Err(err),
                            });
                        }
                    }
                }
            }
            self.nodes[leaf].queue.pop();
            for i in path.iter() {
                let n = &mut self.nodes[i];
                n.backlog -= 1;
                n.shared.dequeued();
                if n.backlog == 0 {
                    self.set_blocked(i, Blocked::Open);
                } else {
                    self.refresh(i, now);
                }
            }
            for w in path.as_slice().windows(2) {
                let (c, p) = (w[0] as usize, w[1] as usize);
                let a = self.is_active(c);
                let (prio, weight, mut vr) = (
                    self.nodes[c].priority,
                    self.nodes[c].weight,
                    self.nodes[c].vr,
                );
                self.children[p].policy.served(
                    prio,
                    c,
                    &mut vr,
                    req.cost,
                    weight,
                    a,
                    &mut self.heap_pos,
                );
                self.nodes[c].vr = vr;
                self.nodes[c].in_parent = a;
            }
            return Some(Dispatched {
                id: req.id,
                leaf,
                outcome: Ok(Booked {
                    cost: req.cost,
                    delay_ns,
                    places,
                }),
            });
        }
    }

    fn give_back(&self, path: &Chain, places: Places, cost: u64) {
        for (k, i) in path.iter().enumerate() {
            self.nodes[i].shared.inflight.release(cost, places.get(k));
        }
    }

    fn refund(&self, path: &Chain, (bytes, ops): (u64, u64), cost: u64, now: u64) {
        for (k, i) in path.iter().enumerate() {
            let sh = &self.nodes[i].shared;
            if bytes & (1 << k) != 0 {
                sh.bytes.refund(cost, now);
            }
            if ops & (1 << k) != 0 {
                sh.ops.refund(1, now);
            }
        }
    }

    /// Requests queued in the whole tree.
    pub(crate) fn queued(&self) -> u64 {
        self.nodes[0].backlog
    }

    /// Every queued request and its leaf (to re-point waiters after a
    /// live change).
    pub(crate) fn pending(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.queue.iter().map(move |p| (p.id, i)))
    }

    /// The resource this tree schedules.
    pub(crate) fn resource(&self) -> Resource {
        self.resource
    }

    /// Requests queued at node `i`'s subtree.
    pub(crate) fn backlog(&self, i: usize) -> u64 {
        self.nodes[i].backlog
    }
}
