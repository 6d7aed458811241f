//! [`AsyncReserve`]: one request's async turn through a chain of throttles.

use std::task::{Context, Poll};
use std::time::Duration;

use crate::error::ThrottleError;
use crate::fair_gate::Waiter;
use crate::hold::InFlightHold;
use crate::tenant::Tenant;
use crate::throttle::{Reservation, Source, Throttle};

/// A [`Throttle::reserve`] in the fair order that never blocks: the state of
/// one request's async turn through a chain of throttlers. Build it with the
/// request's tenant (carried explicitly: a task migrates between threads,
/// so the thread's current tenant means nothing to it), poll it with
/// [`AsyncReserve::poll`] until ready, then wait the returned delay (e.g. in
/// a timeout SQE). Knows nothing of any runtime: a queued request is woken
/// through its [`core::task::Waker`]; only the head of a queue that waits for
/// the bookings to come within `τ` needs a timer, for
/// [`AsyncReserve::retry_after`].
///
/// Dropping it while queued takes the request out of the order and wakes
/// the next one: the levels already charged stay charged (their bookings
/// happened), the level it queued at charges nothing.
#[derive(Debug)]
pub struct AsyncReserve {
    pub(crate) tenant: Option<Tenant>,
    pub(crate) amount: u64,
    pub(crate) max_block: Duration,
    pub(crate) source: Source,
    /// The delay booked so far (from the last level's turn).
    pub(crate) acc: Reservation,
    /// Levels charged.
    pub(crate) done: usize,
    /// The level being visited in this poll.
    pub(crate) cursor: usize,
    /// The current level's place in its queue.
    pub(crate) waiter: Waiter,
    /// When the current level was first polled (its clock).
    pub(crate) call_ns: Option<u64>,
    pub(crate) retry_in_ns: Option<u64>,
    /// A [`Workload`](crate::Workload) level's queued request (dropping it
    /// hands its turn on and charges nothing).
    pub(crate) request: Option<crate::workload::Request>,
    /// The in-flight places the levels gave (see [`AsyncReserve::take_hold`]).
    pub(crate) hold: InFlightHold,
}

impl AsyncReserve {
    /// A reservation of `amount` tokens from `source`, as `tenant` (none:
    /// first-come, exactly [`Throttle::reserve`] without a tenant), each
    /// level waiting at most `max_block`, `after_ns` after levels booked
    /// before.
    pub fn new(
        tenant: Option<Tenant>,
        amount: u64,
        max_block: Duration,
        after_ns: u64,
        source: Source,
    ) -> Self {
        Self {
            tenant,
            amount,
            max_block,
            source,
            acc: Reservation {
                delay_ns: after_ns,
                blocked: false,
            },
            done: 0,
            cursor: 0,
            waiter: Waiter::default(),
            call_ns: None,
            retry_in_ns: None,
            request: None,
            hold: InFlightHold::none(),
        }
    }

    /// Poll the reservation on `throttle`. Ready with the total delay, which
    /// runs from this return; `Pending` while a level's fair turn has not
    /// come. Poll it on the same throttle until ready.
    pub fn poll(
        &mut self,
        throttle: &dyn Throttle,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Reservation, ThrottleError>> {
        self.cursor = 0;
        self.retry_in_ns = None;
        throttle.poll_reserve(cx, self)
    }

    /// After a `Pending` poll: whether the request is the head of a queue
    /// that waits only for time, and how long from that poll to re-poll
    /// (nothing wakes it). `None`: it is woken when it may go.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_in_ns.map(Duration::from_nanos)
    }

    /// Once ready: the in-flight places the request holds until its IO
    /// completes ([`Throttle::reserve_held`]'s hold); empty before, and
    /// after it was taken.
    pub fn take_hold(&mut self) -> InFlightHold {
        std::mem::take(&mut self.hold)
    }

    /// The tenant.
    pub fn tenant(&self) -> Option<&Tenant> {
        self.tenant.as_ref()
    }

    /// Whether the level visited now is the one to charge (earlier levels
    /// are done; later ones come after it). For [`Throttle::poll_reserve`]
    /// implementations: call once per level, in the chain's order, and skip
    /// the level when it returns `false`.
    pub fn visit_level(&mut self) -> bool {
        let me = self.cursor;
        self.cursor += 1;
        me == self.done
    }

    /// Record the level just visited as charged, with the reservation it
    /// returned (its delay includes the levels before it).
    pub fn level_done(&mut self, r: Reservation) {
        self.acc = Reservation {
            delay_ns: r.delay_ns,
            blocked: self.acc.blocked || r.blocked,
        };
        self.next_level();
    }

    /// Move on to the next level (the current one is charged).
    pub(crate) fn next_level(&mut self) {
        self.done += 1;
        self.call_ns = None;
        debug_assert!(!self.waiter.is_queued());
    }
}
