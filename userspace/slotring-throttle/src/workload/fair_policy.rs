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
//! definition order); serving a request of cost `L` through it sets the
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

use std::collections::BTreeSet;

/// Virtual units per token at weight 1.
pub(crate) const SCALE: u128 = 1 << 16;

/// The virtual cost of `cost` tokens at `weight`: never 0, so a stream of
/// empty requests cannot monopolise a level (Seastar's `max(…, 1)`).
pub(crate) fn virtual_cost(cost: u64, weight: u32) -> u128 {
    (u128::from(cost) * SCALE / u128::from(weight.max(1))).max(1)
}

/// One priority's children: the active ones ordered by `(vr, index)`.
#[derive(Debug, Default)]
pub(crate) struct FairLevel {
    active: BTreeSet<(u128, usize)>,
    v: u128,
    /// The weight of every child at this priority (active or not).
    pub(crate) weight_sum: u64,
}

impl FairLevel {
    /// Put child `id` in the set, raising `vr` to the catch-up floor for a
    /// credit of `credit` tokens.
    pub(crate) fn activate(&mut self, id: usize, vr: &mut u128, credit: u128) {
        let back = credit.saturating_mul(SCALE) / u128::from(self.weight_sum.max(1));
        *vr = (*vr).max(self.v.saturating_sub(back));
        self.active.insert((*vr, id));
    }

    /// Take child `id` (at `vr`) out of the set.
    pub(crate) fn deactivate(&mut self, id: usize, vr: u128) {
        self.active.remove(&(vr, id));
    }

    /// The child that goes next.
    pub(crate) fn first(&self) -> Option<usize> {
        self.active.first().map(|&(_, id)| id)
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
    ) {
        self.active.remove(&(*vr, id));
        self.v = self.v.max(*vr);
        *vr += virtual_cost(cost, weight);
        if still_active {
            self.active.insert((*vr, id));
        }
    }

    /// Whether no child is active.
    pub(crate) fn is_empty(&self) -> bool {
        self.active.is_empty()
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
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn weights_share_and_a_returning_child_gets_only_its_credit() {
        let mut l = FairLevel {
            weight_sum: 4,
            ..FairLevel::default()
        };
        let (mut a, mut b) = (0u128, 0u128);
        l.activate(0, &mut a, 0);
        l.activate(1, &mut b, 0);
        let mut served = [0u64; 2];
        for _ in 0..400 {
            let id = l.first().unwrap();
            served[id] += 1;
            let (vr, w) = if id == 0 { (&mut a, 3) } else { (&mut b, 1) };
            l.served(id, vr, 100, w, true);
        }
        assert_eq!(served, [300, 100], "3:1 exactly over whole rounds");
        // Child 1 leaves for a long time; child 0 runs on alone.
        l.deactivate(1, b);
        for _ in 0..1000 {
            l.served(0, &mut a, 100, 3, true);
        }
        // Back with a credit of 400 tokens: at most 400·2¹⁶/Σw below V.
        l.activate(1, &mut b, 400);
        assert_eq!(b, l.v() - 400 * SCALE / 4);
    }
}
