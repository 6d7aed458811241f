//! The concurrent scheduler: the tree's core behind one mutex, a lock-free
//! path for requests that find nothing queued on their way to the root,
//! wakers for the ones that queue, and permits that give in-flight places
//! back at completion.
//!
//! # The lock-free path
//!
//! A request at leaf `L` first reads, on every node of `L`'s path, how many
//! requests queue in that node's subtree. If none does, the fair and
//! priority order has nothing to decide, and the request takes its
//! in-flight places (compare-and-swap against each limit) and is charged to
//! each cap (the cap's own charge-then-check) without any lock. A refusal
//! anywhere gives back what was taken and the request queues under the lock.
//! Two requests racing there may both pass a `queued == 0` check that a third
//! is about to change: each overtakes at most the requests queued during its
//! own few instructions, and every limit holds regardless (the in-flight
//! limits and the caps are enforced by their own atomics).
//!
//! # Hand-over
//!
//! Whoever holds the lock pulls requests from the root while any is
//! eligible: a request that queues, a completion that finds a queue behind
//! one of its in-flight limits, a cancellation, a live change, or the
//! *timekeeper*'s re-poll. A dispatched request's charges are made at that
//! moment, its permit is left in its slot and its waker woken; its own poll
//! picks the permit up, with the delay that remains of its booking. Time
//! makes no event, so while requests wait only for caps' debts, exactly one
//! queued request (RocksDB's one thread that waits for the refill) is told
//! when to re-poll ([`Request::retry_after`]); when it leaves the queue the
//! role passes to another queued request, which is woken to take it.
//!
//! # Memory ordering
//!
//! The `queued` counts and the in-flight counts are `SeqCst` on both sides
//! (see the `inflight` module): a queuing request publishes its count before
//! it reads the limits, a completion gives its place back before it reads the
//! count, so one of them always sees the other and no wake-up is lost.
//! A dispatch or a cancellation lowers a `queued` count by a plain store
//! under the mutex (its only writer): seen late, it costs one trip through
//! the lock, never a lost wake-up. Everything else the order depends on is
//! under the mutex.

mod permit;
mod request;
mod slots;

use permit::Hold;
pub use permit::Permit;
pub use request::Request;
use request::RequestState;
use slots::Slots;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::core::{Booked, Tree};
use super::inflight::Places;
use super::node::{NodeShared, cap_error};
use super::spec::WorkloadTree;
use super::{DEFAULT_TAU, Resource, WorkloadError};
use crate::clock::{ClampState, Clock, MonotonicClock};
use crate::sync::{Mutex, Ordering, lock};

/// The wakers a locked section collects, woken once the lock is dropped:
/// the first one inline (one dispatch wakes one request; no allocation).
#[derive(Debug, Default)]
struct Wakes {
    one: Option<Waker>,
    more: Vec<Waker>,
}

impl Wakes {
    fn push(&mut self, w: Waker) {
        match self.one {
            None => self.one = Some(w),
            Some(_) => self.more.push(w),
        }
    }

    fn wake(self) {
        if let Some(w) = self.one {
            w.wake();
        }
        self.more.into_iter().for_each(Waker::wake);
    }
}

/// A queued request's place, as the dispatch leaves it.
#[derive(Debug)]
enum Slot {
    Queued {
        leaf: usize,
        waker: Option<Waker>,
        since: u64,
    },
    Granted {
        at: u64,
        booked: Booked,
    },
    Failed(Box<WorkloadError>),
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) tree: Tree,
    pub(super) spec: WorkloadTree,
    slots: Slots,
    /// The queued request told to re-poll, and when.
    timekeeper: Option<(u64, u64)>,
}

#[derive(Debug)]
pub(super) struct Shared {
    clock: Arc<dyn Clock>,
    clamp: Option<ClampState>,
    tau_ns: u64,
    /// What the tree schedules (fixed for the scheduler's life).
    resource: Resource,
    pub(super) state: Mutex<State>,
}

impl Shared {
    pub(super) fn now(&self) -> u64 {
        let t = self.clock.now_ns();
        match &self.clamp {
            Some(c) => c.clamp(t),
            None => t,
        }
    }

    /// Dispatch everything eligible at `now`; the wakers to wake once the
    /// lock is dropped.
    fn pump(st: &mut State, now: u64, wake: &mut Wakes) {
        while let Some(d) = st.tree.dispatch(now) {
            let (slot, cost) = match d.outcome {
                Ok(booked) => (Slot::Granted { at: now, booked }, Some(booked.cost)),
                Err(e) => (Slot::Failed(Box::new(e)), None),
            };
            if let Some(Slot::Queued { waker, since, leaf }) = st.slots.replace(d.id, slot) {
                if let Some(cost) = cost {
                    for j in st.tree.ancestry(leaf) {
                        let n = st.tree.shared(j);
                        n.counters
                            .granted_locked(cost, now.saturating_sub(since), st);
                    }
                }
                if let Some(w) = waker {
                    wake.push(w);
                }
            }
        }
    }

    /// Keep exactly one queued request timing the sleeping caps, preferring
    /// `me`; wake the one chosen if it is another.
    fn keep_time(st: &mut State, me: Option<u64>, wake: &mut Wakes) {
        let Some(at) = st.tree.next_wake() else {
            st.timekeeper = None;
            return;
        };
        let queued = |st: &State, id: u64| matches!(st.slots.get(id), Some(Slot::Queued { .. }));
        if let Some((t, t_at)) = st.timekeeper
            && t_at <= at
            && queued(st, t)
        {
            // It re-polls by `t_at`; when it is the one polling now, it is
            // told the new time.
            if me == Some(t) {
                st.timekeeper = Some((t, at));
            }
            return;
        }
        let chosen = match me {
            Some(id) if queued(st, id) => Some(id),
            _ => st
                .slots
                .iter()
                .find(|(_, s)| matches!(s, Slot::Queued { .. }))
                .map(|(id, _)| id),
        };
        st.timekeeper = chosen.map(|id| (id, at));
        if let Some(id) = chosen
            && Some(id) != me
            && let Some(Slot::Queued { waker: Some(w), .. }) = st.slots.get(id)
        {
            wake.push(w.clone());
        }
    }

    /// Give back the in-flight `places` taken on `path`; if a queue waits
    /// behind one of them, hand it on under the lock.
    fn release(&self, path: &[Arc<NodeShared>], places: Places, cost: u64) {
        // Each place given back, then that node's queue read (the pairing
        // the memory ordering needs is per node).
        let mut behind = false;
        for (k, n) in path.iter().enumerate() {
            let taken = places.get(k);
            if taken != 0 {
                n.inflight.release(cost, taken);
                behind |= n.queued.load(Ordering::SeqCst) > 0;
            }
        }
        if !behind {
            return;
        }
        let mut wake = Wakes::default();
        {
            let mut st = lock(&self.state);
            let now = self.now();
            let nodes = held_nodes(path, places);
            st.tree.released(nodes, now);
            Self::pump(&mut st, now, &mut wake);
            Self::keep_time(&mut st, None, &mut wake);
        }
        wake.wake();
    }
}

/// The arena indices of the nodes of `path` where `places` were held (and
/// that a live change did not remove).
fn held_nodes(path: &[Arc<NodeShared>], places: Places) -> impl Iterator<Item = usize> + '_ {
    path.iter()
        .enumerate()
        .filter(move |(k, n)| places.get(*k) != 0 && !n.removed.load(Ordering::SeqCst))
        .map(|(_, n)| n.index())
}

/// Builder for [`WorkloadScheduler`]; see [`WorkloadScheduler::builder`].
#[derive(Debug)]
pub struct WorkloadSchedulerBuilder {
    tree: WorkloadTree,
    resource: Resource,
    clock: Option<Arc<dyn Clock>>,
    tau: Duration,
}

impl WorkloadSchedulerBuilder {
    /// The clock (default: the process's [`MonotonicClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The booking horizon and catch-up bound τ (default [`DEFAULT_TAU`],
    /// at most [`crate::MAX_TAU`]).
    pub fn tau(mut self, tau: Duration) -> Self {
        self.tau = tau;
        self
    }

    /// Build it: every cap's bucket starts full.
    pub fn build(self) -> Result<WorkloadScheduler, WorkloadError> {
        if self.tau > crate::MAX_TAU {
            return Err(WorkloadError::Tau {
                tau_ns: self.tau.as_nanos(),
                max_ns: crate::MAX_TAU.as_nanos(),
            });
        }
        let clock = self.clock.unwrap_or_else(MonotonicClock::shared);
        let clamp = (!clock.never_steps_back()).then(ClampState::new);
        let tau_ns = u64::try_from(self.tau.as_nanos()).unwrap_or(u64::MAX);
        let shared = Shared {
            clamp,
            tau_ns,
            resource: self.resource,
            state: Mutex::new(State {
                tree: Tree::build(&self.tree, self.resource, tau_ns, clock.now_ns(), None)?,
                spec: self.tree,
                slots: Slots::default(),
                timekeeper: None,
            }),
            clock,
        };
        Ok(WorkloadScheduler {
            shared: Arc::new(shared),
        })
    }
}

/// One resource (a disk's bytes and IOs, or CPU slots) scheduled by a
/// workload tree. Cheap to clone; clones are the same scheduler.
#[derive(Debug, Clone)]
pub struct WorkloadScheduler {
    pub(super) shared: Arc<Shared>,
}

impl WorkloadScheduler {
    /// A scheduler of `resource` by `tree`, on the process's clock.
    pub fn new(tree: &WorkloadTree, resource: Resource) -> Result<Self, WorkloadError> {
        Self::builder(tree, resource).build()
    }

    /// A builder (clock, τ).
    pub fn builder(tree: &WorkloadTree, resource: Resource) -> WorkloadSchedulerBuilder {
        WorkloadSchedulerBuilder {
            tree: tree.clone(),
            resource,
            clock: None,
            tau: DEFAULT_TAU,
        }
    }

    /// The leaf workload `name`, where its requests enter.
    pub fn workload(&self, name: &str) -> Result<Workload, WorkloadError> {
        let st = lock(&self.shared.state);
        let i = st.tree.find(name).ok_or_else(|| WorkloadError::Unknown {
            node: name.to_owned(),
        })?;
        let node = st.tree.shared(i).clone();
        if !node.leaf.load(Ordering::SeqCst) {
            return Err(WorkloadError::NotALeaf {
                node: name.to_owned(),
            });
        }
        let chain = st.tree.path(i);
        let path = chain
            .as_slice()
            .iter()
            .map(|&j| st.tree.shared(j as usize).clone());
        Ok(Workload {
            inner: Arc::new(LeafInner {
                sched: self.shared.clone(),
                path: path.collect(),
                node,
            }),
        })
    }

    /// Change the tree live (weights, priorities, caps, in-flight limits,
    /// workloads added or removed) while requests queue: none is lost or
    /// charged twice. Refused, changing nothing, if it would remove a
    /// workload or give children to a leaf while requests queue there
    /// ([`WorkloadError::Busy`]) or move a workload to another parent
    /// ([`WorkloadError::Reparent`]). A removed workload's requests in flight
    /// complete as usual (a drain); new ones get [`WorkloadError::Removed`].
    pub fn update(&self, tree: &WorkloadTree) -> Result<(), WorkloadError> {
        let mut wake = Wakes::default();
        {
            let mut st = lock(&self.shared.state);
            let st = &mut *st;
            let now = self.shared.now();
            let resource = st.tree.resource();
            let new = Tree::build(tree, resource, self.shared.tau_ns, now, Some(&mut st.tree))?;
            st.tree = new;
            st.spec = tree.clone();
            for (id, leaf) in st.tree.pending() {
                if let Some(Slot::Queued { leaf: l, .. }) = st.slots.get_mut(id) {
                    *l = leaf;
                }
            }
            Shared::pump(st, now, &mut wake);
            Shared::keep_time(st, None, &mut wake);
        }
        wake.wake();
        Ok(())
    }

    /// The tree in force.
    pub fn tree(&self) -> WorkloadTree {
        lock(&self.shared.state).spec.clone()
    }

    /// Requests queued in the whole tree.
    pub fn queued(&self) -> u64 {
        lock(&self.shared.state).tree.queued()
    }

    /// Requests queued in `name`'s subtree.
    pub fn queued_at(&self, name: &str) -> Result<u64, WorkloadError> {
        let st = lock(&self.shared.state);
        let i = st.tree.find(name).ok_or_else(|| WorkloadError::Unknown {
            node: name.to_owned(),
        })?;
        Ok(st.tree.backlog(i))
    }

    /// Requests and bytes in flight through `name`, each counted where
    /// `name` limits it (`max_io_requests` / `max_concurrent_threads`,
    /// `max_bytes_inflight`), 0 elsewhere.
    pub fn in_flight(&self, name: &str) -> Result<(u64, u64), WorkloadError> {
        self.with_node(name, |n| n.inflight.counts())
    }

    /// Tokens in `name`'s byte cap now, nano-tokens (`None`: no cap).
    pub fn cap_tokens_nano(&self, name: &str) -> Result<Option<i128>, WorkloadError> {
        let now = self.shared.now();
        self.with_node(name, |n| n.bytes.tokens_nano(now))
    }

    fn with_node<R>(
        &self,
        name: &str,
        f: impl FnOnce(&NodeShared) -> R,
    ) -> Result<R, WorkloadError> {
        let st = lock(&self.shared.state);
        let i = st.tree.find(name).ok_or_else(|| WorkloadError::Unknown {
            node: name.to_owned(),
        })?;
        Ok(f(st.tree.shared(i)))
    }
}

#[derive(Debug)]
pub(super) struct LeafInner {
    pub(super) sched: Arc<Shared>,
    pub(super) node: Arc<NodeShared>,
    /// The leaf first, the root last (fixed: a live change never moves a
    /// workload).
    pub(super) path: Box<[Arc<NodeShared>]>,
}

/// A leaf workload of a [`WorkloadScheduler`]: where its requests enter.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct Workload {
    pub(super) inner: Arc<LeafInner>,
}

impl Workload {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.inner.node.name
    }

    fn check(&self) -> Result<(), WorkloadError> {
        let n = &self.inner.node;
        if n.removed.load(Ordering::SeqCst) {
            return Err(WorkloadError::Removed {
                node: n.name.clone(),
            });
        }
        if !n.leaf.load(Ordering::SeqCst) {
            return Err(WorkloadError::NotALeaf {
                node: n.name.clone(),
            });
        }
        Ok(())
    }

    /// The lock-free path (see the module docs): `None` if a level queues
    /// or refuses. The clock is read only if a cap is on the way (never for
    /// CPU slots).
    fn fast(&self, cost: u64) -> Result<Option<Booked>, WorkloadError> {
        let path = &self.inner.path;
        let mut clock = None;
        let sched = &self.inner.sched;
        // The leaf first: a request behind its own leaf's queue reads no
        // other node.
        if self.inner.node.queued.load(Ordering::SeqCst) != 0
            || path[1..]
                .iter()
                .any(|n| n.queued.load(Ordering::SeqCst) != 0)
        {
            return Ok(None);
        }
        let mut places = Places::default();
        for (k, n) in path.iter().enumerate() {
            // Nothing taken (and nothing to give back) where nothing limits.
            let Some(taken) = n.inflight.try_acquire(cost) else {
                self.inner.sched.release(path, places, cost);
                return Ok(None);
            };
            places.set(k, taken);
        }
        let tau = self.inner.sched.tau_ns;
        let mut delay_ns = 0;
        // Bit `k` of each: that cap of the `k`-th node was charged.
        let (mut bytes_done, mut ops_done) = (0u64, 0u64);
        // CPU slots have no caps (`Limits::of`): nothing to charge.
        if sched.resource == Resource::Io {
            for (k, n) in path.iter().enumerate() {
                for ops in [false, true] {
                    let (cap, c) = if ops { (&n.ops, 1) } else { (&n.bytes, cost) };
                    if !cap.present() {
                        continue;
                    }
                    let now = *clock.get_or_insert_with(|| sched.now());
                    match cap.admit(c, now, tau) {
                        Ok(super::cap::Admit::Charged { delay_ns: d }) => {
                            delay_ns = delay_ns.max(d);
                            *(if ops { &mut ops_done } else { &mut bytes_done }) |= 1 << k;
                        }
                        refused => {
                            for (j, m) in path.iter().enumerate() {
                                if bytes_done & (1 << j) != 0 {
                                    m.bytes.refund(cost, now);
                                }
                                if ops_done & (1 << j) != 0 {
                                    m.ops.refund(1, now);
                                }
                            }
                            self.inner.sched.release(path, places, cost);
                            return match refused {
                                Err(e) => Err(cap_error(&n.name, e, c)),
                                _ => Ok(None),
                            };
                        }
                    }
                }
            }
        }
        super::counters::granted(path, cost, 0);
        Ok(Some(Booked {
            cost,
            delay_ns,
            places,
        }))
    }

    fn permit(self, booked: Booked, delay_ns: u64, waited: bool) -> Permit<'static> {
        Permit {
            delay_ns,
            waited,
            hold: if booked.places.is_empty() {
                Hold::Nothing
            } else {
                Hold::Owned {
                    workload: self,
                    places: booked.places,
                    cost: booked.cost,
                }
            },
        }
    }

    /// A permit for `cost` if one can be had without waiting: the lock-free
    /// path when nothing queues on this workload's path (the permit then
    /// borrows the handle: no reference count is touched), else one dispatch
    /// round under the lock (a request polled once, and dropped if it would
    /// queue: it charges nothing then).
    pub fn try_acquire(&self, cost: u64) -> Result<Option<Permit<'_>>, WorkloadError> {
        self.check()?;
        if let Some(b) = self.fast(cost)? {
            return Ok(Some(Permit {
                delay_ns: b.delay_ns,
                waited: false,
                hold: if b.places.is_empty() {
                    Hold::Nothing
                } else {
                    Hold::Borrowed {
                        leaf: &self.inner,
                        places: b.places,
                        cost: b.cost,
                    }
                },
            }));
        }
        let mut r = self.request(cost);
        match r.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(p) => p.map(Some),
            Poll::Pending => Ok(None),
        }
    }

    /// A request of `cost` (bytes for a disk; 1 per CPU slot) to poll
    /// without blocking.
    pub fn request(&self, cost: u64) -> Request {
        Request {
            workload: Some(self.clone()),
            cost,
            state: RequestState::Idle,
            retry_in_ns: None,
        }
    }

    /// Wait for a permit for `cost`, the calling thread blocked (its CPU
    /// lease parked) while the request queues.
    pub fn acquire(&self, cost: u64) -> Result<Permit<'static>, WorkloadError> {
        let mut req = self.request(cost);
        let waker = crate::wait::current_thread_waker();
        let mut cx = Context::from_waker(&waker);
        if let Poll::Ready(r) = req.poll(&mut cx) {
            return r;
        }
        let _parked = crate::park::park_current_lease();
        loop {
            match req.retry_after() {
                Some(d) => std::thread::park_timeout(
                    d.clamp(Duration::from_micros(10), Duration::from_secs(1)),
                ),
                None => std::thread::park(),
            }
            if let Poll::Ready(r) = req.poll(&mut cx) {
                return r;
            }
        }
    }
}
