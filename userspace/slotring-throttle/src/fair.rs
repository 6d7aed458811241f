//! Weighted fair sharing of one throttler between tenants.
//!
//! # The model
//!
//! A [`Throttler`](crate::Throttler)'s bucket stays the one hard limit: every
//! request, with or without a tenant, is charged there exactly once, so the
//! token-bucket bound (`charged ≤ burst + rate·T + one request` over any
//! window) holds for the total and *a fortiori* for every tenant. Fairness
//! only decides the **order** in which waiting requests reach the bucket.
//!
//! The order is start-time fair queueing (SFQ, Goyal et al.; the discipline
//! of Seastar's `fair_queue` and ClickHouse's scheduler `fair` node) over
//! [`Tenant`]s with integer weights:
//!
//! * virtual time is in units of `token / weight` (scaled by 2¹⁶, exact
//!   integers); `V` is the start tag of the request dispatched last;
//! * a request of cost `L` from tenant `t` (weight `w_t`, last finish tag
//!   `F_t`) gets `S = max(F_t, V − τ_v)` and `F_t ← S + L/w_t`; each tenant's
//!   requests keep their arrival order;
//! * the waiting request with the smallest `S` (ties: arrival order) goes
//!   next: it is charged to the bucket once the bookings already there end
//!   within `τ` (the *booking horizon*), so a request arriving with a
//!   smaller tag overtakes every queued one and waits behind at most `τ` of
//!   booked requests (plus the one that crosses it), while the hand-over
//!   from one sleeper to the next never leaves the bucket idle.
//!
//! While tenants are backlogged, each receives `rate · w_t / Σw` (SFQ's bound:
//! any two backlogged tenants' normalised service differs by at most
//! `L_max/w_i + L_max/w_j`). The discipline is work-conserving: the bucket is
//! the only thing that makes anyone wait, so a tenant that stops sending
//! leaves its share to the others at the next dispatch.
//!
//! **Catch-up bound.** A tenant returning from idle starts at `V − τ_v`,
//! never earlier, where `τ_v = τ · rate / Σw` (Σw over the tenants then
//! waiting, itself included): it may run ahead of the others by at most its
//! own share of `τ` seconds of the rate — never a burst of its idle time
//! (Seastar's `tau`, default 5 ms).
//!
//! # Scope
//!
//! The order applies wherever a tenant is current on the calling thread
//! ([`Tenant::enter`], or the tenant of the thread's current CPU lease):
//! [`crate::Throttle::throttle`] takes its turn, then waits as today; and
//! [`crate::Throttle::reserve`] (the io_uring and pread engines) takes its
//! turn, then books, so the delay it returns — the deadline of the ring's
//! timeout SQE — is the fair one. Taking a turn waits (CPU lease parked)
//! only while other requests queue or the bookings run more than `τ` ahead;
//! alone, a tenant never waits for a turn and every wait is today's. An
//! async runtime thread must not have a tenant current (its reservation
//! could block the runtime).
//!
//! # The async turn
//!
//! Async code takes the same turn without blocking:
//! [`crate::AsyncReserve`] (with its tenant named explicitly: a task moves
//! between threads) polled through [`crate::Throttle::poll_reserve`]. The
//! gate queues wakers, not threads: a queued request's waker is stored under
//! the gate's mutex and woken when the request becomes the head; the head
//! that waits only for the bookings to come within `τ` is told when to
//! re-poll (the crate has no timers). A blocked thread queues a waker that
//! unparks it, so threads and tasks wait in one order. Dropping a queued
//! request takes it out of the order and wakes the next; it was never
//! charged, so no token is lost or created.
//!
//! # Bad input
//!
//! A weight of 0 or above [`MAX_WEIGHT`] is a typed error. A tenant handle may
//! be used on any number of throttlers: each keeps its own tags for it (by
//! the handle's process-unique id), so it is fair separately at each. Dropping
//! a handle does not cancel requests already waiting (they hold a clone);
//! a throttler forgets a tenant once it is idle and its finish tag lies
//! at or below `V` (it then returns with the full catch-up bound, which it
//! could have had anyway), so ten thousand
//! short-lived tenants cost memory only while they wait.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};

use crate::sync::AtomicU64;
use std::task::{Poll, Waker};
use std::time::Duration;

use crate::error::ThrottleError;

/// The largest tenant weight.
pub const MAX_WEIGHT: u32 = 1 << 16;
/// The default catch-up bound `τ` (Seastar's 5 ms).
pub const DEFAULT_TAU: Duration = Duration::from_millis(5);
/// The largest accepted catch-up bound.
pub const MAX_TAU: Duration = Duration::from_secs(60);

/// Virtual units per token at weight 1.
const SCALE: u128 = 1 << 16;

static NEXT_ID: StdAtomicU64 = StdAtomicU64::new(1);

/// A tenant's shared state. Aligned to 128 bytes (two cache lines, the
/// unit the adjacent-line prefetcher moves) so that two tenants' counters,
/// each bumped by its own threads on every charge, never share a line with
/// each other or with a neighbouring allocation (a gate's hints, a bucket).
#[derive(Debug)]
#[repr(align(128))]
struct TenantInner {
    /// Tokens charged as this tenant, summed over throttler levels.
    charged: AtomicU64,
    /// Waits booked for it, ns, summed over throttler levels.
    wait_ns: AtomicU64,
    id: u64,
    weight: u32,
    name: String,
    /// The cells of the scopes alive now ([`Tenant::enter`]); a reader sums
    /// them with `charged`/`wait_ns` under this lock, and a scope that ends
    /// moves its cell's values into those under it.
    cells: std::sync::Mutex<Vec<Arc<ScopeCell>>>,
}

/// What one thread charged as a tenant while it had the tenant entered:
/// written only by that thread, with a plain load and store (no locked
/// instruction: ~10 ns less per charge here), read by anyone.
///
/// Memory ordering: statistics, all `Relaxed`. The single writer makes
/// load-then-store exact; the scope's end runs on the writer's own thread,
/// so it reads every value it wrote, and it moves them under the tenant's
/// lock, which readers also take: a reader counts each byte exactly once.
#[derive(Debug)]
#[repr(align(128))]
struct ScopeCell {
    charged: AtomicU64,
    wait_ns: AtomicU64,
}

impl ScopeCell {
    fn new() -> Self {
        Self {
            charged: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
        }
    }

    /// Add as the only writer (saturating).
    #[inline]
    fn add_owned(&self, amount: u64, wait_ns: u64) {
        let c = self.charged.load(StdOrdering::Relaxed);
        self.charged
            .store(c.saturating_add(amount), StdOrdering::Relaxed);
        if wait_ns > 0 {
            let w = self.wait_ns.load(StdOrdering::Relaxed);
            self.wait_ns
                .store(w.saturating_add(wait_ns), StdOrdering::Relaxed);
        }
    }
}

/// A party sharing throttlers by weight (a query, a user, a workload).
/// Cheap to clone; clones are the same tenant.
#[derive(Debug, Clone)]
pub struct Tenant(Arc<TenantInner>);

impl Tenant {
    /// A tenant of `weight` (1..=[`MAX_WEIGHT`]).
    pub fn new(name: impl Into<String>, weight: u32) -> Result<Self, ThrottleError> {
        let name = name.into();
        if weight == 0 || weight > MAX_WEIGHT {
            return Err(ThrottleError::TenantWeight {
                name,
                weight,
                max: MAX_WEIGHT,
            });
        }
        Ok(Self(Arc::new(TenantInner {
            id: NEXT_ID.fetch_add(1, StdOrdering::Relaxed),
            weight,
            name,
            charged: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            cells: std::sync::Mutex::new(Vec::new()),
        })))
    }

    /// Tokens charged as this tenant, summed over every throttler level that
    /// charged it (for a single-level disk throttler: its disk bytes).
    /// Saturates at `u64::MAX`.
    pub fn charged(&self) -> u64 {
        self.sum(|c| &c.charged, &self.0.charged)
    }

    /// Time its requests waited (booked), ns, summed like
    /// [`Tenant::charged`].
    pub fn wait_ns(&self) -> u64 {
        self.sum(|c| &c.wait_ns, &self.0.wait_ns)
    }

    /// `base` plus the live scopes' cells, under the lock a scope's end
    /// takes to move its cell into `base`.
    fn sum(&self, field: impl Fn(&ScopeCell) -> &AtomicU64, base: &AtomicU64) -> u64 {
        let cells = self.cells();
        cells.iter().fold(base.load(StdOrdering::Relaxed), |t, c| {
            t.saturating_add(field(c).load(StdOrdering::Relaxed))
        })
    }

    fn cells(&self) -> std::sync::MutexGuard<'_, Vec<Arc<ScopeCell>>> {
        // Nothing panics while the lock is held.
        self.0
            .cells
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Count one charge on the shared statistics (relaxed, saturating,
    /// never fails): the path for a tenant that is not entered on the
    /// calling thread (a lease's, an async request's).
    #[inline]
    pub(crate) fn record(&self, amount: u64, wait_ns: u64) {
        crate::count::add_saturating(&self.0.charged, amount);
        crate::count::add_saturating(&self.0.wait_ns, wait_ns);
    }

    /// Count one charge as the calling thread's current tenant: into the
    /// entered scope's own cell, else on the lease tenant's shared
    /// statistics; nothing without a current tenant.
    #[inline]
    pub(crate) fn record_current(amount: u64, wait_ns: u64) {
        let done = CURRENT
            .try_with(|c| match c.borrow().as_ref() {
                Some(e) => {
                    e.cell.add_owned(amount, wait_ns);
                    true
                }
                None => false,
            })
            .unwrap_or(false);
        if !done && let Some(t) = crate::park::lease_tenant() {
            t.record(amount, wait_ns);
        }
    }

    /// The process-unique id of this tenant.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The weight.
    pub fn weight(&self) -> u32 {
        self.0.weight
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Make this the calling thread's current tenant until the guard drops:
    /// every throttler the thread waits on then charges it as this tenant.
    /// Guards nest; dropping one restores the tenant that was current before.
    /// A tenant entered here takes precedence over the tenant of the
    /// thread's current CPU lease (see [`crate::LeaseHook::current_tenant`]).
    pub fn enter(&self) -> TenantScope {
        let cell = Arc::new(ScopeCell::new());
        self.cells().push(cell.clone());
        let prev = CURRENT.with(|c| {
            c.borrow_mut().replace(Entered {
                tenant: self.clone(),
                cell: cell.clone(),
            })
        });
        TenantScope {
            prev,
            tenant: self.clone(),
            cell,
            _not_send: PhantomData,
        }
    }

    /// The calling thread's current tenant, if any: the one entered with
    /// [`Tenant::enter`], else the one its current CPU lease carries.
    pub fn current() -> Option<Tenant> {
        CURRENT
            .try_with(|c| c.borrow().as_ref().map(|e| e.tenant.clone()))
            .ok()
            .flatten()
            .or_else(crate::park::lease_tenant)
    }

    /// Whether the calling thread has a current tenant (no clone).
    pub(crate) fn has_current() -> bool {
        CURRENT.try_with(|c| c.borrow().is_some()).unwrap_or(false)
            || crate::park::has_lease_tenant()
    }
}

/// The tenant entered on a thread, with the scope's own statistics cell.
#[derive(Debug)]
struct Entered {
    tenant: Tenant,
    cell: Arc<ScopeCell>,
}

thread_local! {
    static CURRENT: RefCell<Option<Entered>> = const { RefCell::new(None) };
}

/// While alive, a tenant is current on this thread; see [`Tenant::enter`].
#[must_use = "the tenant is current only while this guard lives"]
#[derive(Debug)]
pub struct TenantScope {
    prev: Option<Entered>,
    tenant: Tenant,
    cell: Arc<ScopeCell>,
    _not_send: PhantomData<*const ()>,
}

impl Drop for TenantScope {
    fn drop(&mut self) {
        let prev = self.prev.take();
        let _ = CURRENT.try_with(|c| *c.borrow_mut() = prev);
        // Move the cell's values to the shared statistics and forget it,
        // under the lock readers take (see `ScopeCell`).
        let mut cells = self.tenant.cells();
        crate::count::add_saturating(
            &self.tenant.0.charged,
            self.cell.charged.load(StdOrdering::Relaxed),
        );
        crate::count::add_saturating(
            &self.tenant.0.wait_ns,
            self.cell.wait_ns.load(StdOrdering::Relaxed),
        );
        cells.retain(|c| !Arc::ptr_eq(c, &self.cell));
    }
}

/// A waiting request's place in a [`FairQueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(u64);

/// The request a [`FairQueue`] lets go next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatch {
    /// The request.
    pub ticket: Ticket,
    /// The tenant's id ([`Tenant::id`]).
    pub tenant: u64,
    /// Its cost, tokens.
    pub cost: u64,
}

#[derive(Debug)]
struct Pending {
    ticket: Ticket,
    start: u128,
    cost: u64,
}

#[derive(Debug)]
struct TenantState {
    weight: u32,
    finish: u128,
    queue: VecDeque<Pending>,
}

/// The pure fair order (no clock, no waiting): start-time fair queueing with
/// a catch-up bound. See the module docs for the model.
#[derive(Debug)]
pub struct FairQueue {
    tau_ns: u64,
    v: u128,
    seq: u64,
    tenants: HashMap<u64, TenantState>,
    /// `(start tag, ticket) → tenant` for the head of every backlogged tenant.
    heads: BTreeMap<(u128, Ticket), u64>,
    active_weight: u64,
    pending: usize,
    pops_since_sweep: usize,
}

impl FairQueue {
    /// An empty queue with catch-up bound `tau` (at most [`MAX_TAU`]).
    pub fn new(tau: Duration) -> Result<Self, ThrottleError> {
        if tau > MAX_TAU {
            return Err(ThrottleError::TauTooLarge {
                tau_ns: tau.as_nanos(),
                max_ns: MAX_TAU.as_nanos(),
            });
        }
        Ok(Self {
            tau_ns: u64::try_from(tau.as_nanos()).unwrap_or(u64::MAX),
            v: 0,
            seq: 0,
            tenants: HashMap::new(),
            heads: BTreeMap::new(),
            active_weight: 0,
            pending: 0,
            pops_since_sweep: 0,
        })
    }

    /// `τ_v` at `rate` tokens/s for a total waiting weight `weight_sum`.
    fn tau_v(&self, rate: u64, weight_sum: u64) -> u128 {
        let num = u128::from(self.tau_ns)
            .saturating_mul(u128::from(rate))
            .saturating_mul(SCALE);
        num / (1_000_000_000 * u128::from(weight_sum.max(1)))
    }

    /// Queue a request of `cost` tokens from `tenant` on a throttler of
    /// `rate` tokens/s (which scales the catch-up bound).
    pub fn push(&mut self, tenant: &Tenant, cost: u64, rate: u64) -> Ticket {
        let ticket = Ticket(self.seq);
        self.seq += 1;
        let w = tenant.weight();
        let idle = self
            .tenants
            .get(&tenant.id())
            .is_none_or(|s| s.queue.is_empty());
        let weight_sum = self.active_weight + if idle { u64::from(w) } else { 0 };
        let floor = self.v.saturating_sub(self.tau_v(rate, weight_sum));
        let st = self.tenants.entry(tenant.id()).or_insert(TenantState {
            weight: w,
            finish: 0,
            queue: VecDeque::new(),
        });
        let start = st.finish.max(floor);
        st.finish = start + u128::from(cost) * SCALE / u128::from(w);
        st.queue.push_back(Pending {
            ticket,
            start,
            cost,
        });
        if idle {
            self.heads.insert((start, ticket), tenant.id());
            self.active_weight += u64::from(w);
        }
        self.pending += 1;
        ticket
    }

    /// The request that goes next, without removing it.
    pub fn peek(&self) -> Option<Ticket> {
        self.heads.keys().next().map(|&(_, t)| t)
    }

    /// Remove and return the request that goes next; `V` moves to its tag.
    pub fn pop(&mut self) -> Option<Dispatch> {
        let ((start, ticket), id) = self.heads.pop_first()?;
        let st = self
            .tenants
            .get_mut(&id)
            .expect("a head belongs to a tenant");
        let p = st.queue.pop_front().expect("a head is queued");
        debug_assert_eq!(p.ticket, ticket);
        match st.queue.front() {
            Some(next) => {
                self.heads.insert((next.start, next.ticket), id);
            }
            None => self.active_weight -= u64::from(st.weight),
        }
        self.v = self.v.max(start);
        self.pending -= 1;
        // Sweep once per max(64, tenants) dispatches: amortised O(1).
        self.pops_since_sweep += 1;
        if self.pops_since_sweep >= self.tenants.len().max(64) {
            self.sweep();
        }
        Some(Dispatch {
            ticket,
            tenant: id,
            cost: p.cost,
        })
    }

    /// Take `ticket` of `tenant` out of the order without dispatching it in
    /// turn (its caller stopped waiting: its `max_block` ran out). `V` does
    /// not move; the tenant's later requests keep their tags, so it gives up
    /// the place, never gains one. Returns whether the ticket was queued.
    pub fn remove(&mut self, tenant: &Tenant, ticket: Ticket) -> bool {
        let id = tenant.id();
        let Some(st) = self.tenants.get_mut(&id) else {
            return false;
        };
        let Some(pos) = st.queue.iter().position(|p| p.ticket == ticket) else {
            return false;
        };
        let p = st.queue.remove(pos).expect("the position was just found");
        if pos == 0 {
            self.heads.remove(&(p.start, p.ticket));
            match st.queue.front() {
                Some(next) => {
                    self.heads.insert((next.start, next.ticket), id);
                }
                None => self.active_weight -= u64::from(st.weight),
            }
        }
        self.pending -= 1;
        true
    }

    /// Forget idle tenants whose finish tag lies at or below `V`. Such a
    /// tenant returns at `V − τ_v`, where keeping it would have given
    /// `max(F_t, V − τ_v)`: at most the catch-up bound it may have anyway.
    fn sweep(&mut self) {
        let v = self.v;
        self.tenants
            .retain(|_, s| !s.queue.is_empty() || s.finish > v);
        self.pops_since_sweep = 0;
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.pending
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// Tenants this queue currently keeps state for.
    pub fn tenants(&self) -> usize {
        self.tenants.len()
    }

    /// The sum of the weights of the tenants with waiting requests.
    pub fn active_weight(&self) -> u64 {
        self.active_weight
    }
}

#[derive(Debug)]
struct GateState {
    queue: FairQueue,
    /// The wakers of the queued requests that are not being polled now.
    wakers: HashMap<Ticket, Waker>,
}

impl GateState {
    /// Wake the request that goes next, so it can check its turn.
    fn wake_head(&mut self) {
        if let Some(head) = self.queue.peek()
            && let Some(waker) = self.wakers.remove(&head)
        {
            waker.wake();
        }
    }
}

/// A request's place at one throttler's fair gate: the *async turn*. The
/// state is an enum: `Idle` (not queued: before the first poll, or after its
/// turn) or `Queued` (a ticket in the gate's [`FairQueue`], holding the
/// gate). Dropping a queued waiter takes its ticket out of the order and
/// wakes the new head, so a cancelled request hands its turn on: nothing
/// was charged for it (a charge happens only at the turn), so no token is
/// lost or created, and the queue never waits for a request that is gone.
#[derive(Debug, Default)]
pub(crate) struct Waiter(WaiterState);

#[derive(Debug, Default)]
enum WaiterState {
    #[default]
    Idle,
    Queued {
        gate: Arc<GateShared>,
        ticket: Ticket,
        tenant: Tenant,
        /// For the head: the clock time at which the bookings come within
        /// the horizon (nothing wakes it then; its owner re-polls).
        retry_at: Option<u64>,
    },
}

impl Waiter {
    /// When the head of the queue may re-poll (clock ns), if it is the head
    /// and waits only for time.
    pub(crate) fn retry_at(&self) -> Option<u64> {
        match &self.0 {
            WaiterState::Queued { retry_at, .. } => *retry_at,
            WaiterState::Idle => None,
        }
    }

    /// Whether this waiter holds a place in a queue.
    pub(crate) fn is_queued(&self) -> bool {
        matches!(self.0, WaiterState::Queued { .. })
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let WaiterState::Queued {
            gate,
            ticket,
            tenant,
            ..
        } = std::mem::take(&mut self.0)
        {
            gate.cancel(&tenant, ticket);
        }
    }
}

/// What a request asks of a gate: its tenant, its cost in the fair order,
/// and the rate that cost drains at (which scales the catch-up bound).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Turn<'a> {
    pub(crate) tenant: &'a Tenant,
    pub(crate) cost: u64,
    pub(crate) rate: u64,
}

/// A waker that unparks a blocked thread: the blocking path queues at the
/// same gate as the async one, with this as its waker.
#[derive(Debug)]
struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// The fair order at one throttler: tenants' requests queue in a
/// [`FairQueue`] and reach the bucket in its order. The next request is
/// charged once the bookings already in the bucket end within the *booking
/// horizon* `τ` (the catch-up bound: one parameter, "how far ahead of the
/// fair order anything may run"), so a request arriving ahead in the order
/// waits behind at most `τ` of others' bookings, and the hand-over from one
/// request to the next never idles the bucket. Bookings are tracked by their
/// end (`booked_until`), not by their callers, so a booking made for
/// [`crate::Throttle::reserve`] (whose caller waits elsewhere, e.g. in a
/// timeout SQE) holds the horizon exactly like a sleeping caller.
///
/// One queue serves both kinds of caller: a request queues a
/// [`core::task::Waker`] ([`FairGate::poll_enter`]); a blocked thread's waker
/// unparks it ([`FairGate::enter`]), an async task's wakes the task.
///
/// # Memory ordering
///
/// `queued` and `booked_until` are hints for the lock-free fast path
/// (`Acquire` loads; `booked_until` only grows, by `fetch_max`): a caller
/// that finds nobody queued and the bookings within `τ` charges the bucket at
/// once, which is what the fair order would do; two such callers racing may
/// both book, running ahead by one request each (bounded by the number of
/// threads, never losing or creating a token). Everything that decides the
/// order, every waker registration and every charge of a queued caller
/// happens under the mutex, so a wake-up cannot be lost: a waker is stored
/// and the head re-checked under the same lock that the hand-over takes;
/// tokens are charged only by the bucket, exactly once per request.
#[derive(Debug)]
pub(crate) struct FairGate {
    shared: Arc<GateShared>,
}

/// Aligned to 128 bytes: the hints the fast path reads on every charge do
/// not share a line with anybody else's writes.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct GateShared {
    /// Set once by [`FairGate::release`]: nobody waits for a turn any more.
    released: crate::sync::AtomicBool,
    queued: crate::sync::AtomicU64,
    booked_until: crate::sync::AtomicU64,
    horizon_ns: u64,
    state: crate::sync::Mutex<GateState>,
}

impl GateShared {
    /// Take a cancelled request out of the order and hand its turn on.
    fn cancel(&self, tenant: &Tenant, ticket: Ticket) {
        let mut st = crate::sync::lock(&self.state);
        st.wakers.remove(&ticket);
        if st.queue.remove(tenant, ticket) {
            self.queued.fetch_sub(1, crate::sync::Ordering::AcqRel);
        }
        st.wake_head();
    }
}

impl FairGate {
    pub(crate) fn new(tau: Duration) -> Result<Self, ThrottleError> {
        Ok(Self {
            shared: Arc::new(GateShared {
                released: crate::sync::AtomicBool::new(false),
                queued: crate::sync::AtomicU64::new(0),
                booked_until: crate::sync::AtomicU64::new(0),
                horizon_ns: u64::try_from(tau.as_nanos()).unwrap_or(u64::MAX),
                state: crate::sync::Mutex::new(GateState {
                    queue: FairQueue::new(tau)?,
                    wakers: HashMap::new(),
                }),
            }),
        })
    }

    /// Whether a caller at `now` may charge at once: nobody queued and the
    /// bookings end within the horizon.
    #[inline]
    pub(crate) fn open(&self, now: u64) -> bool {
        use crate::sync::Ordering;
        let g = &*self.shared;
        g.queued.load(Ordering::Acquire) == 0
            && g.booked_until.load(Ordering::Acquire) <= now.saturating_add(g.horizon_ns)
            || g.released.load(Ordering::Acquire)
    }

    /// Record a booking that ends at `deadline`.
    #[inline]
    pub(crate) fn booked(&self, deadline: u64) {
        let b = &self.shared.booked_until;
        // Read first: the common case (an earlier booking already ends
        // later) then writes nothing to the shared line.
        if b.load(crate::sync::Ordering::Acquire) < deadline {
            b.fetch_max(deadline, crate::sync::Ordering::AcqRel);
        }
    }

    /// Poll for this request's turn. The first poll queues it (`waiter`
    /// becomes `Queued`); at its turn `charge` runs at the clock reading
    /// `now()`, under the lock so that charges follow the fair order, the
    /// waiter becomes `Idle` again and the next request is woken. `charge`
    /// returns the booking's end (clock ns); the result is `now()` at the
    /// turn and what `charge` returned. While it is not its turn, `waker` is
    /// stored to be woken when it may be; the head that waits only for the
    /// bookings to come within the horizon is not woken (time passes
    /// without an event): its owner re-polls at [`Waiter::retry_at`].
    ///
    /// Once the gate is [released](FairGate::release), a queued request
    /// leaves the queue and charges at once, out of order (the tokens are
    /// still charged exactly once).
    pub(crate) fn poll_enter<T>(
        &self,
        waker: &Waker,
        waiter: &mut Waiter,
        req: Turn<'_>,
        now: &dyn Fn() -> u64,
        charge: impl FnOnce(u64) -> Result<(u64, T), ThrottleError>,
    ) -> Poll<Result<(u64, T), ThrottleError>> {
        use crate::sync::Ordering;
        let Turn { tenant, cost, rate } = req;
        let g = &*self.shared;
        let mut st = crate::sync::lock(&g.state);
        let ticket = match &waiter.0 {
            WaiterState::Queued { ticket, gate, .. } => {
                debug_assert!(Arc::ptr_eq(gate, &self.shared), "one waiter per gate");
                *ticket
            }
            WaiterState::Idle => {
                g.queued.fetch_add(1, Ordering::AcqRel);
                let ticket = st.queue.push(tenant, cost, rate);
                waiter.0 = WaiterState::Queued {
                    gate: self.shared.clone(),
                    ticket,
                    tenant: tenant.clone(),
                    retry_at: None,
                };
                ticket
            }
        };
        let t = now();
        let head = st.queue.peek() == Some(ticket);
        let until = g.booked_until.load(Ordering::Acquire);
        let turn = head && until <= t.saturating_add(g.horizon_ns);
        if turn || g.released.load(Ordering::Acquire) {
            if turn {
                st.queue.pop();
            } else {
                st.queue.remove(tenant, ticket);
            }
            st.wakers.remove(&ticket);
            // Leave the queue without the drop's cancellation.
            waiter.0 = WaiterState::Idle;
            let charged = charge(t);
            if let Ok((end, _)) = &charged {
                self.booked(*end);
            }
            g.queued.fetch_sub(1, Ordering::AcqRel);
            st.wake_head();
            return Poll::Ready(charged.map(|(_, v)| (t, v)));
        }
        match st.wakers.get_mut(&ticket) {
            Some(w) if w.will_wake(waker) => {}
            Some(w) => w.clone_from(waker),
            None => {
                st.wakers.insert(ticket, waker.clone());
            }
        }
        if let WaiterState::Queued { retry_at, .. } = &mut waiter.0 {
            *retry_at = head.then(|| until.saturating_sub(g.horizon_ns));
        }
        Poll::Pending
    }

    /// Block the calling thread (its CPU lease parked) for this caller's
    /// turn, then charge: [`FairGate::poll_enter`] with a waker that unparks
    /// the thread. The head sleeps until the bookings come within the
    /// horizon (a time on the throttler's clock, which cannot wake it: a
    /// clock that jumps, like a test's manual one, is noticed at the next
    /// timeout or wake-up); the others until they become the head.
    pub(crate) fn enter<T>(
        &self,
        req: Turn<'_>,
        now: &dyn Fn() -> u64,
        charge: impl FnOnce(u64) -> Result<(u64, T), ThrottleError>,
    ) -> Result<(u64, T), ThrottleError> {
        let _parked = crate::park::park_current_lease();
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut waiter = Waiter::default();
        let mut charge = Some(charge);
        loop {
            let once = |t| charge.take().expect("charged only at the turn")(t);
            if let Poll::Ready(r) = self.poll_enter(&waker, &mut waiter, req, now, once) {
                return r;
            }
            match waiter.retry_at() {
                Some(at) => std::thread::park_timeout(Duration::from_nanos(
                    at.saturating_sub(now()).clamp(10_000, 1_000_000_000),
                )),
                None => std::thread::park(),
            }
        }
    }

    /// Give up the fair order for good (a service shutting down): every
    /// queued caller charges at once, out of order, and later callers do not
    /// queue. Tokens are still charged exactly once; the bucket's own waits
    /// (bounded by `max_block`) are unaffected.
    pub(crate) fn release(&self) {
        self.shared
            .released
            .store(true, crate::sync::Ordering::Release);
        let mut st = crate::sync::lock(&self.shared.state);
        for (_, waker) in st.wakers.drain() {
            waker.wake();
        }
    }

    /// Requests queued.
    pub(crate) fn queued(&self) -> usize {
        crate::sync::lock(&self.shared.state).queue.len()
    }
}
