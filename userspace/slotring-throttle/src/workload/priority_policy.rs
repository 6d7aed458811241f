//! The priority policy (ClickHouse's `PriorityPolicy`, Seastar's priority
//! classes): strict order between siblings of different priorities.
//!
//! # Model
//!
//! A node's children are grouped by priority, each group a
//! `FairLevel` (the `fair_policy` module). The next request comes from
//! the group of the lowest priority value that has an active child; lower
//! groups are served only when every higher one has nothing eligible (no
//! queued request, or all of them blocked by their own caps or in-flight
//! limits). That is the starvation rule: strict priority, whose bound is the
//! higher groups' own constraints. A lower group receives at least what the
//! parent is given minus the caps of the higher groups, and nothing beyond
//! that while they stay backlogged. A guarantee for background work is
//! therefore stated as a cap on the foreground (e.g. user queries capped at
//! 90% leave background at least 10%), deterministically, instead of a
//! random draw that delays the foreground (RocksDB's fairness of 10 makes a
//! user request wait behind background work one refill in ten).

use std::collections::BTreeMap;

use super::fair_policy::{FairLevel, HeapPos};

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct PriorityPolicy {
    levels: BTreeMap<i16, FairLevel>,
    active_levels: usize,
}

impl PriorityPolicy {
    /// The level of `priority`, created empty.
    pub(crate) fn level(&mut self, priority: i16) -> &mut FairLevel {
        self.levels.entry(priority).or_default()
    }

    /// Install a level (building a tree).
    pub(crate) fn insert_level(&mut self, priority: i16, level: FairLevel) {
        self.levels.insert(priority, level);
    }

    /// The levels, in priority order.
    pub(crate) fn levels(&self) -> impl Iterator<Item = (i16, &FairLevel)> {
        self.levels.iter().map(|(&p, l)| (p, l))
    }

    /// Activate child `id` at `priority` (see [`FairLevel::activate`]).
    pub(crate) fn activate(
        &mut self,
        priority: i16,
        id: usize,
        vr: &mut u128,
        credit: u128,
        pos: &mut HeapPos,
    ) {
        let l = self.levels.entry(priority).or_default();
        if l.is_empty() {
            self.active_levels += 1;
        }
        l.activate(id, vr, credit, pos);
    }

    /// Deactivate child `id` at `priority`.
    pub(crate) fn deactivate(&mut self, priority: i16, id: usize, vr: u128, pos: &mut HeapPos) {
        let l = self.levels.entry(priority).or_default();
        l.deactivate(id, vr, pos);
        if l.is_empty() {
            self.active_levels -= 1;
        }
    }

    /// Child `id` at `priority` served (see [`FairLevel::served`]).
    #[allow(
        clippy::too_many_arguments,
        reason = "FairLevel::served's arguments and the level's priority: a struct of them would be built and torn apart on every dispatch"
    )]
    pub(crate) fn served(
        &mut self,
        priority: i16,
        id: usize,
        vr: &mut u128,
        cost: u64,
        weight: u32,
        still_active: bool,
        pos: &mut HeapPos,
    ) {
        let l = self.levels.entry(priority).or_default();
        l.served(id, vr, cost, weight, still_active, pos);
        if l.is_empty() {
            self.active_levels -= 1;
        }
    }

    /// The child that goes next: the first of the lowest active priority.
    pub(crate) fn first(&self) -> Option<usize> {
        if self.active_levels == 0 {
            return None;
        }
        self.levels.values().find_map(FairLevel::first)
    }

    /// Whether some child is active.
    pub(crate) fn has_active(&self) -> bool {
        self.active_levels > 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::workload::fair_policy::NOWHERE;

    #[test]
    fn the_lower_value_goes_first_and_the_next_only_when_it_is_empty() {
        let mut p = PriorityPolicy::default();
        p.level(0).weight_sum = 1;
        p.level(1).weight_sum = 1;
        let mut pos = vec![NOWHERE; 8];
        let (mut hi, mut lo) = (0u128, 0u128);
        p.activate(1, 7, &mut lo, 0, &mut pos);
        assert_eq!(p.first(), Some(7));
        p.activate(0, 3, &mut hi, 0, &mut pos);
        assert_eq!(
            p.first(),
            Some(3),
            "priority 0 before 1, whatever came first"
        );
        p.served(0, 3, &mut hi, 10, 1, false, &mut pos);
        assert_eq!(p.first(), Some(7));
        p.deactivate(1, 7, lo, &mut pos);
        assert!(!p.has_active());
        assert_eq!(p.first(), None);
    }
}
