//! How a request takes its turn on the ring in a throttle that
//! [`takes turns`](slotring_throttle::Throttle::takes_turns) (a leaf
//! `Workload`): without blocking the thread that reaps the ring, whose
//! completions are what may end the wait.
//!
//! A request charged before its IO (a read, a miss, each piece of a paced
//! write) polls its turn ([`slotring_throttle::AsyncReserve`]) with the
//! ring's doorbell as its waker. Granted at once (nothing queues: the
//! scheduler's lock-free path), it goes on exactly as a booking on a
//! `Throttler` does, its delay in the same timeout SQE. Otherwise it waits
//! in [`Lifecycle::Turn`], its request queued in the workload's leaf, with
//! a `POLL_ADD` on the doorbell ([`Tag::CapWait`]: the dispatch that grants
//! it rings the doorbell from whichever thread completes, cancels or
//! changes the tree) and, when it times the caps' debts, a standalone
//! timeout ([`Tag::TurnWait`]) to re-poll at. Each answer re-polls it.
//!
//! # The in-flight hold
//!
//! The places the turn gave ([`InFlightHold`]) are the request's, kept in
//! its state with the buffer: a read's (or an unpaced write's) until its
//! last CQE, a paced piece's until its writeback's CQE (so one request
//! holds at most `writeback_depth` places; a next piece's turn may wait
//! for the writebacks of its own, which the ring reaps). A request whose owner is gone keeps them until its
//! last CQE, like its buffer: an operation in flight is the ring's until
//! then. A request cancelled while queued drops its turn there, which
//! hands it on and charges nothing.
//!
//! [`InFlightHold`]: slotring_throttle::InFlightHold

use std::task::{Context, Poll, Waker};

use slotring_throttle::{AsyncReserve, Source};

use super::{Lifecycle, RingCore, sq_full};
use crate::error::UringError;
use crate::sys::{SlotId, Tag, monotonic_now_ns};

impl RingCore {
    /// Start `id`'s turn for `amount` device bytes, `after_ns` after what
    /// is booked already: the delay its IO waits from now, or `None` if it
    /// queues (then it is in [`Lifecycle::Turn`] and goes on at a re-poll).
    pub(super) fn take_turn(
        &mut self,
        id: SlotId,
        amount: u64,
        after_ns: u64,
    ) -> Result<Option<u64>, UringError> {
        let r = self.req(id);
        r.turn = Some(AsyncReserve::new(
            None,
            amount,
            r.max_block,
            after_ns,
            Source::Device,
        ));
        self.poll_turn(id)
    }

    /// Poll `id`'s turn: the delay once granted (its hold kept), else wait.
    fn poll_turn(&mut self, id: SlotId) -> Result<Option<u64>, UringError> {
        let waker = Waker::from(self.doorbell()?);
        let r = self.req(id);
        let throttle = r.throttle.clone().expect("a turn is taken on a throttle");
        let op = r.turn.as_mut().expect("a turn is pending");
        match op.poll(throttle.as_ref(), &mut Context::from_waker(&waker)) {
            Poll::Ready(out) => {
                let hold = op.take_hold();
                r.turn = None;
                let booked = out?;
                r.holds.push_back(hold);
                Ok(Some(booked.delay_ns))
            }
            Poll::Pending => {
                let retry = op.retry_after();
                self.set_state(id, Lifecycle::Turn);
                let fd = self.doorbell()?.fd();
                let r = self.req(id);
                if r.cap_polls == 0 {
                    let full = self.ring.push_cap_wait(id, fd);
                    self.counters.sq_full += full.map_err(sq_full)?;
                    self.req(id).cap_polls += 1;
                }
                if let Some(after) = retry
                    && !self.req(id).turn_timer
                {
                    let at = monotonic_now_ns()
                        .saturating_add(u64::try_from(after.as_nanos()).unwrap_or(u64::MAX));
                    let full = self.ring.push_turn_wait(id, at);
                    self.counters.sq_full += full.map_err(sq_full)?;
                    self.req(id).turn_timer = true;
                }
                Ok(None)
            }
        }
    }

    /// The turn timer of `id` fired (or was cancelled).
    pub(super) fn on_turn_wait(&mut self, id: SlotId) -> Result<(), UringError> {
        self.req(id).turn_timer = false;
        self.retry_turn(id)
    }

    /// A [`Lifecycle::Turn`] request polls its turn again (the doorbell
    /// rang, or its timer fired). Granted, it cancels what it still has
    /// armed and goes on to its IO; cancel asked, it drops its turn (which
    /// hands it on and charges nothing) and ends at its last CQE.
    pub(super) fn retry_turn(&mut self, id: SlotId) -> Result<(), UringError> {
        let r = self.req(id);
        if !matches!(r.state, Lifecycle::Turn) {
            return Ok(());
        }
        if r.owner.cancel_requested() {
            r.turn = None;
            return if r.cap_polls == 0 && !r.turn_timer {
                Err(UringError::Cancelled)
            } else {
                Ok(())
            };
        }
        let Some(delay) = self.poll_turn(id)? else {
            return Ok(());
        };
        let r = self.req(id);
        let armed: &[Tag] = match (r.cap_polls > 0, r.turn_timer) {
            (true, true) => &[Tag::CapWait, Tag::TurnWait],
            (true, false) => &[Tag::CapWait],
            (false, true) => &[Tag::TurnWait],
            (false, false) => &[],
        };
        if !armed.is_empty() {
            // On failure they complete on their own (a ring of the
            // doorbell, the timer's expiry) and only count then.
            let _ = self.ring.push_cancel(id, armed);
        }
        self.io_after_booking(id, delay)
    }
}
