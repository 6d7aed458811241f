//! The waiter lists of one queue ([`LeafQueue`]) and the grant loop that
//! serves them.
//!
//! A queue holds the three schedulers' lists: round robin and fair round
//! robin as circular doubly-linked lists threaded through the allocation
//! slab (`prev` / `next`), max-min fair as an ordered set. Without a
//! workload tree there is one queue (index 0); with one, every workload
//! has its own, at the index of its node, and allocations wait in their
//! leaf's. [`SchedulerState::schedule`] asks the tree which queue the next
//! slot goes to (the only queue without a tree) and grants it there to the
//! first waiter of the first non-empty list, in the order of
//! [`SchedulerState::scheduling_order`] (the active scheduler last). Since
//! a grant never adds to a list, granting one slot at a time this way is
//! the same sequence as running each list until it is empty or the budget
//! is full.

use std::collections::BTreeSet;

use super::{NIL, SchedulerState};
use crate::scheduler::Scheduler;
use crate::sync::{Ordering, fence};

/// A circular waiter list (round robin, fair round robin): its cursor (the
/// next allocation to serve) and length; the links live in the slab.
#[derive(Debug, Default)]
pub(super) struct CircularWaiters {
    cursor: Option<u32>,
    len: usize,
}

/// One queue's waiter lists (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct LeafQueue {
    circular: [CircularWaiters; 2],
    mmf: BTreeSet<(u64, u64, u32)>,
    /// Allocations waiting here, over the three lists.
    pub(crate) len: u64,
}

impl SchedulerState {
    fn circular_insert(&mut self, q: usize, r: usize, id: u32) {
        match self.queues[q].circular[r].cursor {
            None => {
                let st = self.st_mut(id);
                st.prev = id;
                st.next = id;
                self.queues[q].circular[r].cursor = Some(id);
            }
            Some(c) => {
                let p = self.st(c).prev;
                self.st_mut(p).next = id;
                self.st_mut(c).prev = id;
                let st = self.st_mut(id);
                st.prev = p;
                st.next = c;
            }
        }
        self.queues[q].circular[r].len += 1;
    }

    fn circular_remove(&mut self, q: usize, r: usize, id: u32) {
        let (p, n) = {
            let st = self.st(id);
            (st.prev, st.next)
        };
        let list = &mut self.queues[q].circular[r];
        if list.len == 1 {
            list.cursor = None;
        } else {
            if list.cursor == Some(id) {
                list.cursor = Some(n);
            }
            self.st_mut(p).next = n;
            self.st_mut(n).prev = p;
        }
        self.queues[q].circular[r].len -= 1;
        let st = self.st_mut(id);
        st.prev = NIL;
        st.next = NIL;
    }

    /// Put `id` in its scheduler's list of its queue.
    pub(super) fn add_waiter(&mut self, id: u32) {
        let (kind, key, q) = {
            let st = self.st_mut(id);
            debug_assert!(!st.in_waiters);
            st.in_waiters = true;
            (st.kind, (st.allocated, st.seq, id), st.queue)
        };
        match kind {
            Scheduler::MaxMinFair => {
                self.queues[q].mmf.insert(key);
            }
            k => self.circular_insert(q, k.index(), id),
        }
        self.queues[q].len += 1;
        // Published before any read of the lock-free releases that decides
        // a grant: the fence pairs with the release's (see the `lock_free`
        // module).
        self.gauges.waiters.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Take `id` out of its list.
    pub(super) fn remove_waiter(&mut self, id: u32) {
        let (kind, key, q) = {
            let st = self.st_mut(id);
            debug_assert!(st.in_waiters);
            st.in_waiters = false;
            (st.kind, (st.allocated, st.seq, id), st.queue)
        };
        match kind {
            Scheduler::MaxMinFair => {
                let removed = self.queues[q].mmf.remove(&key);
                debug_assert!(removed);
            }
            k => self.circular_remove(q, k.index(), id),
        }
        self.left_queue(q);
    }

    /// One allocation left queue `q` (its `in_waiters` already cleared).
    fn left_queue(&mut self, q: usize) {
        self.queues[q].len -= 1;
        self.gauges.waiters.fetch_sub(1, Ordering::Relaxed);
    }

    /// Grant one competing slot (already counted in `cur`) to `id`; returns
    /// whether it still wants more.
    fn grant(&mut self, id: u32) -> bool {
        let shared = self.st(id).shared.clone();
        self.held_add(&shared, 1);
        let st = self.st_mut(id);
        st.allocated += 1;
        st.shared.granted.fetch_add(1, Ordering::Relaxed);
        let wants_more = st.allocated < st.limit;
        if st.blocked > 0 {
            // The last grant it will get (`!wants_more`): one blocked
            // acquirer takes it, the others must wake to return
            // `Exhausted` (or they would sleep forever).
            let a = st.shared.clone();
            self.wakes.push((a, !wants_more));
        }
        wants_more
    }

    /// The order in which a queue's lists are served: the active
    /// scheduler's last, so that waiters created under another one are
    /// never stranded.
    fn scheduling_order(&self) -> [Scheduler; 3] {
        match self.scheduler {
            Scheduler::RoundRobin => [
                Scheduler::FairRoundRobin,
                Scheduler::MaxMinFair,
                Scheduler::RoundRobin,
            ],
            Scheduler::FairRoundRobin => [
                Scheduler::RoundRobin,
                Scheduler::MaxMinFair,
                Scheduler::FairRoundRobin,
            ],
            Scheduler::MaxMinFair => [
                Scheduler::RoundRobin,
                Scheduler::FairRoundRobin,
                Scheduler::MaxMinFair,
            ],
        }
    }

    /// Grant free capacity while some waiter may take it: the tree (if
    /// any) names the queue of each slot, the queue's lists its taker.
    pub(crate) fn schedule(&mut self) {
        while self.waiters() > 0 && self.cur() < self.limit() {
            let q = match &mut self.tree {
                None => 0,
                Some(tree) => {
                    let queues = &self.queues;
                    match tree.pick(|n| queues[n].len > 0) {
                        Some(q) => q,
                        None => break,
                    }
                }
            };
            self.clamp_borrowed();
            self.cur += 1;
            self.grant_in(q);
        }
    }

    /// Grant one slot to the next waiter of queue `q` (not empty).
    fn grant_in(&mut self, q: usize) {
        for s in self.scheduling_order() {
            match s {
                Scheduler::MaxMinFair => {
                    let Some(&key) = self.queues[q].mmf.first() else {
                        continue;
                    };
                    let (allocated, seq, id) = key;
                    if self.grant(id) {
                        // Insert the new key before removing the old one, so a
                        // set of one never frees and reallocates its node.
                        self.queues[q].mmf.insert((allocated + 1, seq, id));
                    } else {
                        self.st_mut(id).in_waiters = false;
                        self.left_queue(q);
                    }
                    self.queues[q].mmf.remove(&key);
                    return;
                }
                k => {
                    let r = k.index();
                    let Some(id) = self.queues[q].circular[r].cursor else {
                        continue;
                    };
                    if self.grant(id) {
                        self.queues[q].circular[r].cursor = Some(self.st(id).next);
                    } else {
                        self.circular_remove(q, r, id);
                        self.st_mut(id).in_waiters = false;
                        self.left_queue(q);
                    }
                    return;
                }
            }
        }
        debug_assert!(false, "grant_in on an empty queue {q}");
    }
}
