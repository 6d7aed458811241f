//! Weighted fair sharing of one throttler between tenants: the pure order,
//! [`FairQueue`].
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
//! The order is kept by a [`FairQueue`] (no clock, no waiting); a
//! throttler's gate (the `fair_gate` module) queues requests in it and lets
//! them reach the bucket in its order.
//!
//! # Forgetting tenants
//!
//! A queue forgets a tenant once it is idle and its finish tag lies at or
//! below `V` (it then returns with the full catch-up bound, which it could
//! have had anyway), so ten thousand short-lived tenants cost memory only
//! while they wait.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use crate::error::ThrottleError;
use crate::tenant::Tenant;

/// The default catch-up bound `τ` (Seastar's 5 ms).
pub const DEFAULT_TAU: Duration = Duration::from_millis(5);
/// The largest accepted catch-up bound.
pub const MAX_TAU: Duration = Duration::from_secs(60);

/// Virtual units per token at weight 1.
const SCALE: u128 = 1 << 16;

/// A waiting request's place in a [`FairQueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueTicket(u64);

/// The request a [`FairQueue`] lets go next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueDispatch {
    /// The request.
    pub ticket: QueueTicket,
    /// The tenant's id ([`Tenant::id`]).
    pub tenant: u64,
    /// Its cost, tokens.
    pub cost: u64,
}

#[derive(Debug)]
struct Pending {
    ticket: QueueTicket,
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
    heads: BTreeMap<(u128, QueueTicket), u64>,
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
    pub fn push(&mut self, tenant: &Tenant, cost: u64, rate: u64) -> QueueTicket {
        let ticket = QueueTicket(self.seq);
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
    pub fn peek(&self) -> Option<QueueTicket> {
        self.heads.keys().next().map(|&(_, t)| t)
    }

    /// Remove and return the request that goes next; `V` moves to its tag.
    pub fn pop(&mut self) -> Option<QueueDispatch> {
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
        Some(QueueDispatch {
            ticket,
            tenant: id,
            cost: p.cost,
        })
    }

    /// Take `ticket` of `tenant` out of the order without dispatching it in
    /// turn (its caller stopped waiting: its `max_block` ran out). `V` does
    /// not move; the tenant's later requests keep their tags, so it gives up
    /// the place, never gains one. Returns whether the ticket was queued.
    pub fn remove(&mut self, tenant: &Tenant, ticket: QueueTicket) -> bool {
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
