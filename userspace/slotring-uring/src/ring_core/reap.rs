//! The turns of the ring: submit what is queued, wait when something is
//! owed, reap every CQE, and move its request on to its next
//! [`Lifecycle`] state.

use std::io;

use super::{Lifecycle, Owed, Owner, RingCore, io_failed, timeout_failed};
use crate::error::UringError;
use crate::policy::Op;
use crate::sys::{Cqe, IoKind, SlotId, Tag};

impl RingCore {
    /// Submit what is queued; reap and advance every request, without
    /// waiting.
    pub(crate) fn submit_and_reap(&mut self) -> Result<(), UringError> {
        self.turn(0, || {})
    }

    /// Submit what is queued; wait for one completion if anything is owed;
    /// reap and advance every request.
    pub(crate) fn wait_and_reap(&mut self) -> Result<(), UringError> {
        self.wait_and_reap_after(|| {})
    }

    /// [`RingCore::wait_and_reap`], calling `woke` as soon as `io_uring_enter`
    /// returns, before anything is reaped (the blocking front end unparks
    /// its CPU lease there: processing the CQEs is the thread's own work).
    pub(crate) fn wait_and_reap_after(&mut self, woke: impl FnOnce()) -> Result<(), UringError> {
        let want = u32::from(self.ring.total_outstanding() > 0);
        self.turn(want, woke)
    }

    pub(super) fn turn(&mut self, want: u32, woke: impl FnOnce()) -> Result<(), UringError> {
        let entered = self.ring.enter(want);
        woke();
        match entered {
            Ok(_) => {}
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR) => {}
                // Back-pressure: the CQ (or overflow list) must be drained first.
                Some(libc::EBUSY | libc::EAGAIN) => self.counters.resubmits += 1,
                _ => {
                    return Err(UringError::Ring {
                        what: "io_uring_enter",
                        source: e,
                    });
                }
            },
        }
        self.reap();
        Ok(())
    }

    #[cfg(feature = "tokio")]
    /// Reap what completed and submit everything queued, without waiting
    /// (async front end). Reaping can queue SQEs (the rest of a short read,
    /// a miss's retry, a page-cache wait), so this repeats until a reap
    /// queues nothing: a task must not sleep on the eventfd while a
    /// request's next SQE sits unsubmitted (its eventfd edge may already
    /// have been drained, and nothing else would submit it).
    pub(crate) fn flush(&mut self) -> Result<(), UringError> {
        // Each round submits what the previous reap queued; a request queues
        // at most one follow-up per CQE, so this ends. The bound only guards
        // against a kernel that keeps refusing submissions (then the CQEs it
        // wants reaped raise the eventfd and the next poll continues).
        for _ in 0..64 {
            self.reap();
            if !self.ring.has_unsubmitted() && !self.ring.cq_overflow_flag() {
                break;
            }
            self.submit_and_reap()?;
        }
        Ok(())
    }

    /// Reap every available CQE and advance the state machines.
    pub(crate) fn reap(&mut self) {
        let mut cqes = std::mem::take(&mut self.cqes);
        loop {
            cqes.clear();
            self.ring.reap(&mut cqes);
            if cqes.is_empty() {
                break;
            }
            for c in &cqes {
                self.on_cqe(*c);
            }
        }
        self.cqes = cqes;
    }

    pub(super) fn on_cqe(&mut self, c: Cqe) {
        let Some(id) = self.ring.id_at(c.slot) else {
            return;
        };
        self.time_writeback(id, c);
        let advanced = match c.tag {
            Tag::Cancel => Ok(()),
            Tag::Wait => self.on_wait(id, c.res),
            Tag::PostWait => {
                self.on_post_wait(id);
                Ok(())
            }
            Tag::Io => self.on_io(id, c.res),
            Tag::Writeback => self.on_writeback(id, c.res),
            Tag::CapWait => self.on_cap_wait(id),
            Tag::TurnWait => self.on_turn_wait(id),
        };
        if let Err(e) = advanced {
            self.finish(id, Err(e));
        }
        let quiet = self.ring.outstanding(id) == 0;
        let Some(r) = self.ring.data_mut(id) else {
            return;
        };
        if quiet && matches!(r.state, Lifecycle::Completed(_)) {
            // Nothing of it is in flight any more: its written bytes are
            // the device's or the kernel flusher's now.
            self.dirty_unsubmitted -= std::mem::take(&mut r.unsynced);
            r.cap.release_all();
            // The operation is over: its in-flight places go back.
            r.holds.clear();
        }
        if matches!(r.owner, Owner::Ignored) {
            self.release_if_quiet(id);
        } else if quiet && matches!(r.state, Lifecycle::Completed(_)) {
            // A finished request becomes collectable only at the last CQE of
            // its chain (which may come after the one that finished it).
            if let Some(w) = r.owner.waker().and_then(Option::take) {
                w.wake();
            }
        }
    }

    /// The timeout in front of an IO completed with `res`. An expiry
    /// (`-ETIME`, or 0) lets the IO go: a standalone one queues it now, a
    /// linked one has released it in the kernel. Any other answer when we
    /// asked for no cancel means the wait did not happen: a standalone one
    /// fails the request, a linked one makes the kernel fail its IO with
    /// `-ECANCELED`, and the request reports the timeout's error, not a
    /// cancellation.
    pub(super) fn on_wait(&mut self, id: SlotId, res: i32) -> Result<(), UringError> {
        let r = self.req(id);
        let cancel = r.owner.cancel_requested();
        let expired = res == -libc::ETIME || res == 0;
        match r.state {
            Lifecycle::Held { io, .. } => {
                if cancel || res == -libc::ECANCELED {
                    return Err(UringError::Cancelled);
                }
                if !expired {
                    return Err(timeout_failed(-res));
                }
                if io.kind == IoKind::PacedWrite {
                    return self.issue_paced(id, io);
                }
                let io = if io.kind == IoKind::NowaitRead {
                    self.refund_cached(id);
                    self.req(id).next_io(IoKind::Read)
                } else {
                    io
                };
                self.queue(
                    id,
                    Lifecycle::Io {
                        io,
                        owed: Owed::Nothing,
                    },
                )
            }
            Lifecycle::Pacing { io, .. } => {
                if cancel || res == -libc::ECANCELED {
                    return Err(UringError::Cancelled);
                }
                if !expired {
                    return Err(timeout_failed(-res));
                }
                self.queue(
                    id,
                    Lifecycle::Io {
                        io,
                        owed: Owed::Nothing,
                    },
                )
            }
            Lifecycle::Linked { io, .. } => {
                r.state = if expired || cancel {
                    Lifecycle::Io {
                        io,
                        owed: Owed::Nothing,
                    }
                } else {
                    Lifecycle::WaitFailed { io, errno: -res }
                };
                Ok(())
            }
            Lifecycle::WaitDecides if expired || cancel => Err(UringError::Cancelled),
            Lifecycle::WaitDecides => Err(timeout_failed(-res)),
            // Finished already (or past this wait).
            _ => Ok(()),
        }
    }

    /// The timeout after a page-cache charge expired (or was cancelled).
    pub(super) fn on_post_wait(&mut self, id: SlotId) {
        let r = self.req(id);
        if !matches!(r.state, Lifecycle::PostWait { .. }) {
            return;
        }
        let result = if r.owner.cancel_requested() {
            Err(UringError::Cancelled)
        } else {
            Ok(r.done)
        };
        self.finish(id, result);
    }

    pub(super) fn on_io(&mut self, id: SlotId, res: i32) -> Result<(), UringError> {
        let r = self.req(id);
        let cancel = r.owner.cancel_requested();
        // `first`: the probe that decides the charge; a NOWAIT read in any
        // other state is a re-probe after a booked wait.
        let (io, owed, first) = match r.state {
            Lifecycle::Probing { io } => (io, Owed::Nothing, true),
            Lifecycle::Io { io, owed } => (io, owed, false),
            Lifecycle::Linked { .. } if res == -libc::ECANCELED && !cancel => {
                // Its wait's CQE is still to come: whether the wait failed
                // decides the outcome (`on_wait`).
                r.state = Lifecycle::WaitDecides;
                return Ok(());
            }
            Lifecycle::Linked { io, .. } => (io, Owed::Nothing, false),
            Lifecycle::WaitFailed { errno, .. } if res == -libc::ECANCELED => {
                return Err(timeout_failed(errno));
            }
            Lifecycle::WaitFailed { io, .. } => (io, Owed::Nothing, false),
            // Finished already.
            _ => return Ok(()),
        };
        if res == -libc::ECANCELED {
            return Err(UringError::Cancelled);
        }
        let probing = io.kind == IoKind::NowaitRead;
        if res == -libc::EINTR || (res == -libc::EAGAIN && !probing) {
            if cancel {
                return Err(UringError::Cancelled);
            }
            self.counters.resubmits += 1;
            let again = if first {
                Lifecycle::Probing { io }
            } else {
                Lifecycle::Io { io, owed }
            };
            return self.queue(id, again);
        }
        if probing && first {
            return self.on_probe(id, io, res);
        }
        if probing {
            return self.on_reprobe(id, io, res);
        }
        let r = self.req(id);
        if res < 0 {
            return Err(match r.op {
                Op::Write => r.write_failed(io::Error::from_raw_os_error(-res)),
                Op::Read => io_failed(io, res),
            });
        }
        let n = res as usize;
        if n == 0 {
            if r.op == Op::Write {
                return Err(r.write_failed(io::Error::from(io::ErrorKind::WriteZero)));
            }
            // EOF.
            return self.io_done(id, owed);
        }
        r.done += n;
        if r.op == Op::Write {
            r.file.grow_to(r.offset + r.done as u64);
        }
        if io.kind == IoKind::PacedWrite {
            self.piece_written(id, n as u64);
        }
        let r = self.req(id);
        if r.done < r.len {
            if cancel {
                return Err(UringError::Cancelled);
            }
            if r.paced && r.done >= r.booked {
                return self.next_piece(id);
            }
            let io = r.next_io(r.io_kind());
            self.counters.short_reads += 1;
            return self.queue(id, Lifecycle::Io { io, owed });
        }
        self.io_done(id, owed)
    }

    pub(super) fn io_done(&mut self, id: SlotId, owed: Owed) -> Result<(), UringError> {
        let done = self.req(id).done;
        match owed {
            Owed::PageCache => {
                let d = self.charge_page_cache(id, done as u64)?;
                self.complete_after(id, d)
            }
            Owed::Nothing => {
                self.finish(id, Ok(done));
                Ok(())
            }
        }
    }
}
