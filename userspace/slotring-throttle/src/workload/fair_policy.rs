//! The fair policy (ClickHouse's `FairPolicy`, Seastar's `fair_queue`
//! shares): max-min fair shares among the active children of one priority.
//!
//! # Model
//!
//! Start-time fair queueing over children. Each child `c` of weight `w_c`
//! has a virtual runtime `vr_c`: the cost served through it divided by its
//! weight, in exact integers (units of `token / 2¹⁶`, so `cost·2¹⁶ / w`
//! never rounds a request of one token to nothing). The active child with
//! the smallest `vr` goes next (ties: the lower node index, which is
//! definition order; the order tells `vr` apart up to [`VR_KEY_MAX`], a
//! yottabyte through one child at weight 1); serving a request of cost `L` through it sets the
//! level's virtual time `V ← max(V, vr_c)` and `vr_c ← vr_c + L·2¹⁶/w_c`.
//! While children stay backlogged, each receives `w_c / Σw` of what the
//! level is given, within SFQ's bound: two backlogged children's
//! normalised service differs by at most `L_max/w_i + L_max/w_j`.
//!
//! **Catch-up bound.** A child entering the set of active children (from
//! idle, or when its own constraint stops blocking it) starts at
//! `max(vr_c, V − C·2¹⁶/Σw)`, where `Σw` is the weight of all the level's
//! children and `C = τ·R` is τ seconds of the rate `R` of the tightest cap
//! at or above the parent (none: `C = 0`, ClickHouse's rule of starting at
//! `V`). So a child back from idle runs ahead of its siblings by at most its
//! own share of τ seconds of the rate, never by a burst of its idle time
//! (Seastar's `tau`). The floor uses the configured `Σw`, not the weight of
//! the children active at that instant, so it does not depend on the order
//! in which children of one event activate.

/// Virtual units per token at weight 1.
pub(crate) const SCALE: u128 = 1 << 16;

/// The virtual cost of `cost` tokens at `weight`: never 0, so a stream of
/// empty requests cannot monopolise a level (Seastar's `max(…, 1)`).
pub(crate) fn virtual_cost(cost: u64, weight: u32) -> u128 {
    (u128::from(cost) * SCALE / u128::from(weight.max(1))).max(1)
}

/// Where each child sits in its parent's heap, indexed by the child's
/// arena index (one table per tree: a node is in at most one level, its
/// parent's level of its priority). [`NOWHERE`]: in no heap.
pub(crate) type HeapPos = [u32];

/// A child in no heap.
pub(crate) const NOWHERE: u32 = u32::MAX;

/// Children of one heap node: 4, so a sift touches half the levels of a
/// binary heap and each step's children share one cache line (16-byte
/// entries). `down` spells out a step of exactly 4.
const ARITY: usize = 4;

/// The largest virtual runtime the heap tells apart: 2⁹⁶ − 1 virtual
/// units, 2⁸⁰ tokens at weight 1 (a yottabyte through one child). Beyond
/// it a child's key saturates: children past it are served in index order
/// among themselves (still each once per round), never out of the heap.
pub(crate) const VR_KEY_MAX: u128 = (1 << 96) - 1;

/// An active child: `vr` (saturated at [`VR_KEY_MAX`]) above the child's
/// index in one integer, so ordering the keys orders `(vr, index)`, the
/// lower first, in one comparison (and 4 entries share a cache line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry(u128);

impl Entry {
    fn new(vr: u128, id: usize) -> Self {
        debug_assert!(id <= u32::MAX as usize, "an arena index fits 32 bits");
        Self((vr.min(VR_KEY_MAX) << 32) | id as u128)
    }

    fn id(self) -> usize {
        (self.0 & u128::from(u32::MAX)) as usize
    }
}

/// One priority's children: the active ones in a 4-ary min-heap by
/// `(vr, index)` (Seastar's priority queue of classes by accumulated cost).
/// The next child is the root, read in O(1); serving it moves it down in
/// O(log n); a child entering or leaving moves up or down from its place,
/// which [`HeapPos`] keeps, in O(log n). Nothing allocates once the heap
/// has held its largest number of children.
#[derive(Debug, Default)]
pub(crate) struct FairLevel {
    heap: Vec<Entry>,
    v: u128,
    /// The weight of every child at this priority (active or not).
    pub(crate) weight_sum: u64,
}

impl FairLevel {
    /// Put child `id` in the set, raising `vr` to the catch-up floor for a
    /// credit of `credit` tokens.
    pub(crate) fn activate(&mut self, id: usize, vr: &mut u128, credit: u128, pos: &mut HeapPos) {
        let back = credit.saturating_mul(SCALE) / u128::from(self.weight_sum.max(1));
        *vr = (*vr).max(self.v.saturating_sub(back));
        debug_assert_eq!(pos[id], NOWHERE, "child {id} activated twice");
        let at = self.heap.len();
        self.heap.push(Entry::new(*vr, id));
        self.up(at, pos);
    }

    /// Take child `id` (at `vr`) out of the set.
    pub(crate) fn deactivate(&mut self, id: usize, vr: u128, pos: &mut HeapPos) {
        let at = pos[id];
        if at == NOWHERE {
            return;
        }
        let at = at as usize;
        debug_assert_eq!(self.heap[at], Entry::new(vr, id));
        self.remove_at(at, pos);
    }

    /// The child that goes next.
    pub(crate) fn first(&self) -> Option<usize> {
        self.heap.first().map(|e| e.id())
    }

    /// Child `id` (selected, so active, at `*vr`) served `cost` at `weight`;
    /// it stays in the set if `still_active`.
    pub(crate) fn served(
        &mut self,
        id: usize,
        vr: &mut u128,
        cost: u64,
        weight: u32,
        still_active: bool,
        pos: &mut HeapPos,
    ) {
        let at = pos[id] as usize;
        debug_assert_eq!(self.heap.get(at), Some(&Entry::new(*vr, id)));
        self.v = self.v.max(*vr);
        *vr += virtual_cost(cost, weight);
        if still_active {
            // Its key only grows: it moves down.
            self.heap[at] = Entry::new(*vr, id);
            self.down(at, pos);
        } else {
            self.remove_at(at, pos);
        }
    }

    /// Whether no child is active.
    pub(crate) fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// The level's virtual time.
    pub(crate) fn v(&self) -> u128 {
        self.v
    }

    /// A level whose virtual time starts at `v` (carried over a live change).
    pub(crate) fn with_v(v: u128) -> Self {
        Self {
            v,
            ..Self::default()
        }
    }

    fn remove_at(&mut self, at: usize, pos: &mut HeapPos) {
        let gone = self.heap.swap_remove(at);
        pos[gone.id()] = NOWHERE;
        if at < self.heap.len() {
            pos[self.heap[at].id()] = at as u32;
            // The entry moved here from the end may belong above or below.
            if at > 0 && self.heap[at] < self.heap[(at - 1) / ARITY] {
                self.up(at, pos);
            } else {
                self.down(at, pos);
            }
        }
    }

    fn up(&mut self, mut at: usize, pos: &mut HeapPos) {
        let e = self.heap[at];
        while at > 0 {
            let parent = (at - 1) / ARITY;
            let p = self.heap[parent];
            if p <= e {
                break;
            }
            self.heap[at] = p;
            pos[p.id()] = at as u32;
            at = parent;
        }
        self.heap[at] = e;
        pos[e.id()] = at as u32;
    }

    /// Move the entry at `at` down to its place. Bottom-up (Floyd): the
    /// hole first follows the smallest child to the bottom (ARITY − 1
    /// comparisons a level), then the entry rises from there: a served
    /// child's key usually belongs near the bottom, so this saves the
    /// comparison with the entry at every level on the way.
    fn down(&mut self, mut at: usize, pos: &mut HeapPos) {
        let e = self.heap[at];
        let n = self.heap.len();
        loop {
            let first = at * ARITY + 1;
            if first >= n {
                break;
            }
            let best = match self.heap.get(first..first + ARITY) {
                // A full set of children (all but the last on the way): a
                // tournament of fixed size, no loop.
                Some(&[a, b, c, d]) => {
                    let ab = usize::from(b < a);
                    let cd = 2 + usize::from(d < c);
                    let (x, y) = ([a, b][ab], [c, d][cd - 2]);
                    if y < x { cd } else { ab }
                }
                _ => {
                    let kids = &self.heap[first..n];
                    let mut best = 0;
                    for (k, c) in kids.iter().enumerate().skip(1) {
                        if *c < kids[best] {
                            best = k;
                        }
                    }
                    best
                }
            };
            let m = self.heap[first + best];
            self.heap[at] = m;
            pos[m.id()] = at as u32;
            at = first + best;
        }
        self.heap[at] = e;
        pos[e.id()] = at as u32;
        self.up(at, pos);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn weights_share_and_a_returning_child_gets_only_its_credit() {
        let mut l = FairLevel {
            weight_sum: 4,
            ..FairLevel::default()
        };
        let mut pos = vec![NOWHERE; 2];
        let (mut a, mut b) = (0u128, 0u128);
        l.activate(0, &mut a, 0, &mut pos);
        l.activate(1, &mut b, 0, &mut pos);
        let mut served = [0u64; 2];
        for _ in 0..400 {
            let id = l.first().unwrap();
            served[id] += 1;
            let (vr, w) = if id == 0 { (&mut a, 3) } else { (&mut b, 1) };
            l.served(id, vr, 100, w, true, &mut pos);
        }
        assert_eq!(served, [300, 100], "3:1 exactly over whole rounds");
        // Child 1 leaves for a long time; child 0 runs on alone.
        l.deactivate(1, b, &mut pos);
        assert_eq!(pos[1], NOWHERE);
        for _ in 0..1000 {
            l.served(0, &mut a, 100, 3, true, &mut pos);
        }
        // Back with a credit of 400 tokens: at most 400·2¹⁶/Σw below V.
        l.activate(1, &mut b, 400, &mut pos);
        assert_eq!(b, l.v() - 400 * SCALE / 4);
    }

    #[test]
    fn keys_order_by_vr_then_index_and_saturate_past_the_largest() {
        assert!(Entry::new(5, 9) < Entry::new(6, 0), "vr first");
        assert!(Entry::new(5, 1) < Entry::new(5, 2), "then the index");
        assert_eq!(Entry::new(7, 3).id(), 3);
        let huge = VR_KEY_MAX + 1000;
        assert!(Entry::new(VR_KEY_MAX - 1, 9) < Entry::new(huge, 0));
        assert!(
            Entry::new(huge, 1) < Entry::new(u128::MAX, 2),
            "past the largest key, the index decides"
        );
        assert_eq!(Entry::new(u128::MAX, 2).id(), 2);
    }

    /// One step on a level of 12 children: activate, deactivate or serve.
    #[derive(Debug, Clone)]
    enum Op {
        Activate(usize, u64),
        Deactivate(usize),
        Serve(u64, bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..12usize, 0..1000u64).prop_map(|(c, k)| Op::Activate(c, k)),
            (0..12usize).prop_map(Op::Deactivate),
            (0..5000u64, any::<bool>()).prop_map(|(c, a)| Op::Serve(c, a)),
        ]
    }

    proptest! {
        /// The heap picks exactly what an ordered set of `(vr, index)`
        /// picks (the order this module defines), under any sequence of
        /// children entering, leaving and being served.
        #[test]
        fn the_heap_picks_as_an_ordered_set_does(ops in proptest::collection::vec(op(), 1..300)) {
            let weights: Vec<u32> = (1..=12).collect();
            let mut l = FairLevel { weight_sum: weights.iter().map(|&w| u64::from(w)).sum(), ..FairLevel::default() };
            let mut pos = vec![NOWHERE; 12];
            let mut vr = [0u128; 12];
            let mut active = [false; 12];
            let mut reference: BTreeSet<(u128, usize)> = BTreeSet::new();
            let mut ref_v = 0u128;
            for op in ops {
                match op {
                    Op::Activate(c, credit) if !active[c] => {
                        let back = u128::from(credit) * SCALE / u128::from(l.weight_sum);
                        let want = vr[c].max(ref_v.saturating_sub(back));
                        l.activate(c, &mut vr[c], u128::from(credit), &mut pos);
                        prop_assert_eq!(vr[c], want);
                        reference.insert((vr[c], c));
                        active[c] = true;
                    }
                    Op::Deactivate(c) if active[c] => {
                        l.deactivate(c, vr[c], &mut pos);
                        prop_assert!(reference.remove(&(vr[c], c)));
                        active[c] = false;
                    }
                    Op::Serve(cost, stay) => {
                        let Some(&(r_vr, c)) = reference.first() else {
                            prop_assert_eq!(l.first(), None);
                            continue;
                        };
                        prop_assert_eq!(l.first(), Some(c));
                        reference.remove(&(r_vr, c));
                        ref_v = ref_v.max(r_vr);
                        l.served(c, &mut vr[c], cost, weights[c], stay, &mut pos);
                        prop_assert_eq!(vr[c], r_vr + virtual_cost(cost, weights[c]));
                        if stay {
                            reference.insert((vr[c], c));
                        } else {
                            active[c] = false;
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(l.first(), reference.first().map(|&(_, c)| c));
                prop_assert_eq!(l.v(), ref_v);
                prop_assert_eq!(l.is_empty(), reference.is_empty());
                for c in 0..12 {
                    prop_assert_eq!(pos[c] != NOWHERE, active[c], "child {}", c);
                }
            }
        }
    }
}
