//! [`FairGate`]: the fair order at one throttler, for blocked threads and
//! async tasks alike.
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

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use crate::error::ThrottleError;
use crate::fair_queue::{FairQueue, QueueTicket};
use crate::tenant::Tenant;

#[derive(Debug)]
struct GateState {
    queue: FairQueue,
    /// The wakers of the queued requests that are not being polled now.
    wakers: HashMap<QueueTicket, Waker>,
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
        ticket: QueueTicket,
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
    fn cancel(&self, tenant: &Tenant, ticket: QueueTicket) {
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
        let waker = crate::wait::current_thread_waker();
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
