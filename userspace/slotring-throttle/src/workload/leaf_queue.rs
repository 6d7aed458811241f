//! The leaf queue (ClickHouse's `FifoQueue`): where requests enter.
//!
//! # Model
//!
//! Requests of one leaf workload keep their arrival order. A request leaves
//! the queue at its turn (the head, dispatched) or when its caller gives up
//! (any position, removed): a removed request was never charged, and the
//! request behind it moves up, so a cancelled request hands its turn on.

use std::collections::VecDeque;

/// A queued request: its id and its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending {
    pub(crate) id: u64,
    pub(crate) cost: u64,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct LeafQueue {
    q: VecDeque<Pending>,
}

impl LeafQueue {
    pub(crate) fn push(&mut self, p: Pending) {
        self.q.push_back(p);
    }

    pub(crate) fn front(&self) -> Option<Pending> {
        self.q.front().copied()
    }

    pub(crate) fn pop(&mut self) -> Option<Pending> {
        self.q.pop_front()
    }

    /// Take request `id` out, wherever it is.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Pending> {
        let pos = self.q.iter().position(|p| p.id == id)?;
        self.q.remove(pos)
    }

    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.q.iter()
    }
}
