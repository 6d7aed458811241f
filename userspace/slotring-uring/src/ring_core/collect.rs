//! The owner's side of a request: what the front ends call about it —
//! release a staged wait, cancel or abandon it, leave a waker, collect it
//! once its chain is quiet.

#[cfg(feature = "tokio")]
use std::task::Waker;

use super::{Lifecycle, Owner, Release, RingCore, Taken};
use crate::error::UringError;
use crate::sys::{IoKind, SlotId, Tag};

impl RingCore {
    /// Whether `id` has a booked pre-IO wait that is not queued yet (only
    /// requests submitted with [`PreIoWait::Staged`](super::PreIoWait::Staged)).
    pub(crate) fn has_staged_wait(&self, id: SlotId) -> bool {
        self.ring
            .data(id)
            .is_some_and(|r| matches!(r.state, Lifecycle::Staged { .. }))
    }

    /// Queue the staged wait of `id` as `how` says. A failure finishes the
    /// request with it.
    pub(crate) fn release_staged(&mut self, id: SlotId, how: Release) {
        let Some(&Lifecycle::Staged { deadline_ns, io }) = self.ring.data(id).map(|r| &r.state)
        else {
            return;
        };
        let next = match how {
            // A paced piece takes its room under the caps at the expiry.
            Release::Linked if io.kind != IoKind::PacedWrite => {
                Lifecycle::Linked { io, deadline_ns }
            }
            Release::Linked | Release::Standalone => Lifecycle::Held { io, deadline_ns },
        };
        if let Err(e) = self.queue(id, next) {
            self.finish(id, Err(e));
        }
    }

    /// Whether the only thing `id` waits for now is a throttle timeout (a
    /// pre-IO wait queued standalone, or a page-cache charge's wait after
    /// the IO) or its workload's turn: no IO of it is queued or in flight.
    pub(crate) fn waiting_on_timeout(&self, id: SlotId) -> bool {
        self.ring.data(id).is_some_and(|r| {
            matches!(
                r.state,
                Lifecycle::Held { .. }
                    | Lifecycle::Pacing { .. }
                    | Lifecycle::PostWait { .. }
                    | Lifecycle::WaitDecides
                    | Lifecycle::Turn
            )
        })
    }

    /// Ask the kernel to cancel the request; its owner still collects it.
    /// Its buffer stays with the ring until the last CQE of its chain
    /// arrives.
    pub(crate) fn cancel(&mut self, id: SlotId) {
        let Some(r) = self.ring.data_mut(id) else {
            return;
        };
        if matches!(r.state, Lifecycle::Completed(_)) {
            return;
        }
        let Owner::Waiting(waker) = &mut r.owner else {
            return;
        };
        r.owner = Owner::Cancelling(waker.take());
        self.cancel_in_flight(id);
    }

    /// Cancel the request and forget it: nobody collects it, and the ring
    /// frees it at the last CQE of its chain.
    pub(crate) fn ignore(&mut self, id: SlotId) {
        let Some(r) = self.ring.data_mut(id) else {
            return;
        };
        let cancelled = std::mem::replace(&mut r.owner, Owner::Ignored).cancel_requested();
        if matches!(r.state, Lifecycle::Completed(_)) {
            self.completed.retain(|&c| c != id);
            self.release_if_quiet(id);
        } else if !cancelled {
            self.cancel_in_flight(id);
        }
    }

    /// Cancel what `id` has in flight (or, staged, finish it at once).
    pub(super) fn cancel_in_flight(&mut self, id: SlotId) {
        let tags: &[Tag] = match self.req(id).state {
            Lifecycle::Staged { .. } => {
                // Nothing of it reached the ring.
                self.finish(id, Err(UringError::Cancelled));
                return;
            }
            Lifecycle::Probing { .. } | Lifecycle::Io { .. } | Lifecycle::WaitFailed { .. } => {
                &[Tag::Io]
            }
            Lifecycle::Linked { .. } => &[Tag::Wait, Tag::Io],
            Lifecycle::Held { .. } | Lifecycle::Pacing { .. } | Lifecycle::WaitDecides => {
                &[Tag::Wait]
            }
            Lifecycle::PostWait { .. } => &[Tag::PostWait],
            Lifecycle::Syncing => &[Tag::Writeback],
            Lifecycle::Capped { .. } => &[Tag::CapWait],
            Lifecycle::Turn => &[Tag::CapWait, Tag::TurnWait],
            Lifecycle::Starting | Lifecycle::Completed(_) => return,
        };
        // On failure the chain still completes on its own; only the hurry
        // is lost.
        let _ = self.ring.push_cancel(id, tags);
    }

    /// Whether the request finished.
    pub(crate) fn is_done(&self, id: SlotId) -> bool {
        self.ring
            .data(id)
            .is_some_and(|r| matches!(r.state, Lifecycle::Completed(_)))
    }

    #[cfg(feature = "tokio")]
    /// Set the waker woken when the request finishes.
    pub(crate) fn set_waker(&mut self, id: SlotId, w: &Waker) {
        if let Some(slot) = self.ring.data_mut(id).and_then(|r| r.owner.waker())
            && !slot.as_ref().is_some_and(|x| x.will_wake(w))
        {
            *slot = Some(w.clone());
        }
    }

    #[cfg(feature = "tokio")]
    /// Wake one waiting request other than `except` (to hand over the
    /// eventfd registration).
    pub(crate) fn wake_one_waiting(&mut self, except: SlotId) {
        for id in self.ring.live() {
            if id == except {
                continue;
            }
            if let Some(r) = self.ring.data_mut(id)
                && !matches!(r.state, Lifecycle::Completed(_))
                && let Some(w) = r.owner.waker().and_then(Option::take)
            {
                w.wake();
                return;
            }
        }
    }

    #[cfg(feature = "tokio")]
    /// One poll of request `id` by an async front end: reap and submit
    /// until quiet (what this reap queues must reach the kernel before the
    /// task sleeps), then its result if it is done, else register `waker`.
    /// A ring that fails gives the request up to the engine (its buffer may
    /// still be written by the kernel) and returns the error.
    pub(crate) fn poll_progress(
        &mut self,
        id: SlotId,
        waker: &Waker,
    ) -> Option<crate::error::BufResult<usize, Vec<u8>>> {
        if let Err(e) = self.flush() {
            self.ignore(id);
            return Some((Err(e), Vec::new()));
        }
        if let Some((result, buf, _)) = self.take(id) {
            return Some((result, buf));
        }
        self.set_waker(id, waker);
        None
    }

    /// Collect a finished request whose chain is quiet: the result, the buffer
    /// and the last booked deadline. `None` if not yet collectable.
    pub(crate) fn take(&mut self, id: SlotId) -> Option<Taken> {
        if !self.is_done(id) || self.ring.outstanding(id) > 0 {
            return None;
        }
        let (buf, req) = self.ring.take(id)?;
        self.completed.retain(|&c| c != id);
        let Lifecycle::Completed(result) = req.state else {
            unreachable!("checked by is_done");
        };
        Some((result, buf, req.deadline_ns))
    }

    #[cfg(feature = "tokio")]
    /// One line per live request (diagnostics).
    pub(crate) fn dump(&self) -> String {
        let mut out = String::new();
        for id in self.ring.live() {
            let r = self.ring.data(id).expect("live");
            out += &format!(
                "{id:?} {:?} owner={:?} outstanding={} done={}/{}\n",
                r.state,
                r.owner,
                self.ring.outstanding(id),
                r.done,
                r.len
            );
        }
        out
    }

    /// Why `id` cannot be collected by its owner, if it cannot: released
    /// (collected, or an abandoned request freed at its last CQE), or
    /// abandoned (it will be freed, never handed out).
    pub(crate) fn uncollectable(&self, id: SlotId) -> Option<&'static str> {
        match self.ring.data(id) {
            None => Some("not live (collected, or abandoned and released)"),
            Some(r) if matches!(r.owner, Owner::Ignored) => Some("abandoned"),
            Some(_) => None,
        }
    }
}
