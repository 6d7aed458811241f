//! The leaf queue (ClickHouse's `FifoQueue`): where requests enter.
//!
//! # Model
//!
//! Requests of one leaf workload keep their arrival order. A request leaves
//! the queue at its turn (the head, dispatched) or when its caller gives up
//! (any position, removed): a removed request was never charged, and the
//! request behind it moves up, so a cancelled request hands its turn on.
//!
//! The head is kept inline and the rest behind it in a `VecDeque`: a leaf
//! with one request queued (a query's usual depth) reaches it without
//! touching an allocation of its own.

use std::collections::VecDeque;

/// A queued request: its id and its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending {
    pub(crate) id: u64,
    pub(crate) cost: u64,
}

/// See the module docs. `head` is `None` only when `rest` is empty.
#[derive(Debug, Default)]
pub(crate) struct LeafQueue {
    head: Option<Pending>,
    rest: VecDeque<Pending>,
}

impl LeafQueue {
    pub(crate) fn push(&mut self, p: Pending) {
        if self.head.is_none() {
            self.head = Some(p);
        } else {
            self.rest.push_back(p);
        }
    }

    pub(crate) fn front(&self) -> Option<Pending> {
        self.head
    }

    pub(crate) fn pop(&mut self) -> Option<Pending> {
        let head = self.head.take()?;
        self.head = self.rest.pop_front();
        Some(head)
    }

    /// Take request `id` out, wherever it is.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Pending> {
        if self.head?.id == id {
            return self.pop();
        }
        let pos = self.rest.iter().position(|p| p.id == id)?;
        self.rest.remove(pos)
    }

    pub(crate) fn len(&self) -> usize {
        usize::from(self.head.is_some()) + self.rest.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head.is_none()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.head.iter().chain(self.rest.iter())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The queue keeps what a plain `VecDeque` keeps, in its order,
        /// under any sequence of pushes, pops and removals.
        #[test]
        fn it_orders_as_a_plain_deque_does(ops in proptest::collection::vec((0..3u8, 0..8u64), 1..200)) {
            let (mut q, mut reference) = (LeafQueue::default(), VecDeque::new());
            let mut next = 0u64;
            for (op, k) in ops {
                match op {
                    0 => {
                        let p = Pending { id: next, cost: k };
                        next += 1;
                        q.push(p);
                        reference.push_back(p);
                    }
                    1 => prop_assert_eq!(q.pop(), reference.pop_front()),
                    _ => {
                        // An id queued (if any is), or one never queued.
                        let id = reference.get(k as usize).map_or(next + 1, |p: &Pending| p.id);
                        let want = reference.iter().position(|p| p.id == id).and_then(|i| reference.remove(i));
                        prop_assert_eq!(q.remove(id), want);
                    }
                }
                prop_assert_eq!(q.front(), reference.front().copied());
                prop_assert_eq!(q.len(), reference.len());
                prop_assert_eq!(q.is_empty(), reference.is_empty());
                prop_assert!(q.iter().eq(reference.iter()));
            }
        }
    }
}
