//! How a paced write reaches the disk on the ring: its pieces, their room
//! under the writeback cap (and the doorbell that says room is back), the
//! catch-up pacer, and the writeback linked behind each piece.
//!
//! A write that [`Policy::writeback`] paces ([`Writeback::Paced`]: a
//! throttled buffered write on a disk filesystem) is charged and issued in
//! pieces of at most [`WRITEBACK_PIECE`] bytes: each piece is booked on the
//! chain on its own (so a large write waits between its pieces instead of
//! dirtying everything at once) and goes out as [`IoKind::PacedWrite`], the
//! write linked to an `IORING_OP_SYNC_FILE_RANGE(WAIT_BEFORE | WRITE |
//! WAIT_AFTER)` of what the request has written so far: the kernel starts
//! the writeback as soon as the piece is in the page cache and an io-wq
//! worker waits for the device to complete it, so the disk receives the
//! bytes at the pace the throttle allows instead of at the flusher's times.
//! The next piece is booked when the throttle allows it and fewer than
//! [`Policy::writeback_depth`] of the request's pieces are still on their
//! way to the device; otherwise at the next writeback's CQE
//! ([`Lifecycle::Syncing`] in between): so a request never has more pieces
//! dirty and not yet on the device, and a device slower than the limit
//! holds the writer back. A piece waits for its turn in the bucket in a
//! standalone timeout ([`Lifecycle::Held`]), holding nothing; at its expiry
//! ([`RingCore::issue_paced`]) it takes room under the writeback cap of its
//! block-device throttlers, shared with every other request and ring
//! (`writeback_cap.rs`), and its write goes out. Without room it stays unwritten in
//! [`Lifecycle::Capped`] until the ring's doorbell rings; after the device
//! held the writers back, the cap's catch-up pacer may hold it a little
//! longer ([`Lifecycle::Pacing`]), so that a bucket's backlog never reaches
//! the device at once. The writeback's CQE ([`Tag::Writeback`]) changes no
//! result: pacing is not durability, `fsync` stays the caller's, and a
//! failed or cancelled writeback only leaves the pages to the kernel's own
//! flush. Only the request's last CQE makes it collectable, as for any
//! chain.
//!
//! [`Policy::writeback`]: crate::policy::Policy::writeback
//! [`Policy::writeback_depth`]: crate::policy::Policy::writeback_depth
//! [`Writeback::Paced`]: crate::policy::Writeback::Paced
//! [`IoKind::PacedWrite`]: crate::sys::IoKind::PacedWrite

use std::io;
use std::sync::Arc;
use std::task::{Wake, Waker};

use nix::sys::eventfd::{EfdFlags, EventFd};

use super::{Lifecycle, Owed, RingCore, sq_full};
use crate::error::UringError;
use crate::policy::WRITEBACK_PIECE;
use crate::sys::{Cqe, IoSqe, SlotId, Tag, monotonic_now_ns};

/// The eventfd a [`Lifecycle::Capped`] or [`Lifecycle::Turn`] request
/// polls on the ring: a writeback cap or a workload's dispatch wakes it
/// from any thread (an eventfd write), and the
/// ring's `POLL_ADD` completes inside whatever `io_uring_enter` the ring's
/// owner is waiting in.
#[derive(Debug)]
pub(super) struct Doorbell(EventFd);

impl Wake for Doorbell {
    fn wake(self: Arc<Self>) {
        // Saturating the counter is impossible (one write per release);
        // a failure leaves the request to the next release.
        let _ = self.0.write(1);
    }
}

impl Doorbell {
    pub(super) fn fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }

    /// Reset the counter (non-blocking: nothing to read is fine).
    fn drain(&self) {
        let _ = self.0.read();
    }
}

impl RingCore {
    /// The ring's doorbell (an eventfd, created on first use).
    pub(super) fn doorbell(&mut self) -> Result<Arc<Doorbell>, UringError> {
        if let Some(d) = &self.doorbell {
            return Ok(d.clone());
        }
        let efd =
            EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC).map_err(|e| {
                UringError::Ring {
                    what: "eventfd (the writeback cap's doorbell)",
                    source: io::Error::from(e),
                }
            })?;
        let d = Arc::new(Doorbell(efd));
        self.doorbell = Some(d.clone());
        Ok(d)
    }

    /// A paced piece's turn has come (its bucket wait is over, or it had
    /// none): it takes room under its block-device throttlers' writeback
    /// caps, then its write (with the writeback linked behind it) goes out,
    /// at once or, after the device held the writers back, in the slot the
    /// catch-up pacer gives it. Without room it waits for the doorbell,
    /// booked and unwritten.
    ///
    /// Room is taken here and not when the piece is booked: a piece waiting
    /// for its turn in the bucket is not under writeback. Writers sharing
    /// one bucket each have a piece booked ahead; counted from their
    /// booking, eight of them fill a 16 ms cap on a quiet disk with pieces
    /// that are not on their way to it, and every piece waits for the
    /// doorbell.
    pub(super) fn issue_paced(&mut self, id: SlotId, io: IoSqe) -> Result<(), UringError> {
        let bytes = u64::from(io.len);
        if self.req(id).cap.is_capped() {
            let waker = Waker::from(self.doorbell()?);
            if !self.req(id).cap.try_acquire(bytes, &waker) {
                return self.enter_capped(id, io);
            }
        }
        let delay = self.req(id).cap.pace(0, bytes);
        match self.book_wait(id, delay) {
            None => self.queue(
                id,
                Lifecycle::Io {
                    io,
                    owed: Owed::Nothing,
                },
            ),
            Some(deadline_ns) => self.queue(id, Lifecycle::Pacing { io, deadline_ns }),
        }
    }

    /// The piece `io` of `id` found no room under its writeback caps (its
    /// waker, the doorbell, is registered with the cap that refused): wait
    /// for the doorbell, with one `POLL_ADD` armed at a time.
    pub(super) fn enter_capped(&mut self, id: SlotId, io: IoSqe) -> Result<(), UringError> {
        let fd = self.doorbell()?.fd();
        self.counters.writeback_cap_waits += 1;
        self.set_state(id, Lifecycle::Capped { io });
        if self.req(id).cap_polls == 0 {
            let full = self.ring.push_cap_wait(id, fd);
            self.counters.sq_full += full.map_err(sq_full)?;
            self.req(id).cap_polls += 1;
        }
        Ok(())
    }

    /// A doorbell `POLL_ADD` of `id` completed (rung, or cancelled). The
    /// doorbell is drained, so every capped request of this ring tries
    /// again now (their own polls would not fire for this ring).
    pub(super) fn on_cap_wait(&mut self, id: SlotId) -> Result<(), UringError> {
        let r = self.req(id);
        r.cap_polls = r.cap_polls.saturating_sub(1);
        if let Some(d) = &self.doorbell {
            d.drain();
        }
        let others: Vec<SlotId> = self
            .ring
            .live()
            .into_iter()
            .filter(|&c| {
                c != id
                    && self.ring.data(c).is_some_and(|r| {
                        matches!(r.state, Lifecycle::Capped { .. } | Lifecycle::Turn)
                    })
            })
            .collect();
        for c in others {
            if let Err(e) = self.retry_rung(c) {
                self.finish(c, Err(e));
            }
        }
        self.retry_rung(id)
    }

    /// A request that waits for the doorbell tries again: a capped piece
    /// its room, a queued turn its turn.
    fn retry_rung(&mut self, id: SlotId) -> Result<(), UringError> {
        if matches!(self.req(id).state, Lifecycle::Turn) {
            self.retry_turn(id)
        } else {
            self.retry_capped(id)
        }
    }

    /// A [`Lifecycle::Capped`] request tries its piece again. One that goes
    /// on with its poll still armed cancels it (the poll's CQE, rung or
    /// cancelled, then only counts); one cancelled ends at its last poll's
    /// CQE.
    pub(super) fn retry_capped(&mut self, id: SlotId) -> Result<(), UringError> {
        let r = self.req(id);
        let Lifecycle::Capped { io } = r.state else {
            return Ok(());
        };
        if r.owner.cancel_requested() {
            return if r.cap_polls == 0 {
                Err(UringError::Cancelled)
            } else {
                Ok(())
            };
        }
        let armed = r.cap_polls > 0;
        self.issue_paced(id, io)?;
        if armed && !matches!(self.req(id).state, Lifecycle::Capped { .. }) {
            // On failure the poll completes at the next ring of the
            // doorbell instead.
            let _ = self.ring.push_cancel(id, &[Tag::CapWait]);
        }
        Ok(())
    }

    /// `n` bytes of a paced piece of `id` are written: they are dirty,
    /// and not yet under writeback, until its writeback's CQE.
    pub(super) fn piece_written(&mut self, id: SlotId, n: u64) {
        self.req(id).unsynced += n;
        self.counters.paced_bytes += n;
        self.dirty_unsubmitted += n;
        self.counters.dirty_high_water_bytes = self
            .counters
            .dirty_high_water_bytes
            .max(self.dirty_unsubmitted);
    }

    /// The piece booked of `id` is written (its writeback is linked behind
    /// it): book the next one, unless `writeback_depth` pieces are still on
    /// their way to the device; then the next writeback's CQE books it.
    pub(super) fn next_piece(&mut self, id: SlotId) -> Result<(), UringError> {
        let depth = self.policy.writeback_depth.get();
        if self.req(id).writebacks >= depth {
            self.set_state(id, Lifecycle::Syncing);
            return Ok(());
        }
        self.charge_then_io(id, 0)
    }

    /// Time a paced write's writebacks (`writeback_us`): from the reap of
    /// a piece's write CQE to the reap of its writeback's, summed over the
    /// writebacks that succeeded.
    ///
    /// Every IO SQE of a paced request is a write with exactly one
    /// `SYNC_FILE_RANGE` linked behind it, and each of the two posts one
    /// CQE (a failed or short write cancels the writeback: `-ECANCELED`),
    /// the write's first; so each writeback CQE takes the oldest write time
    /// left. Writebacks may complete out of order; the pairing then
    /// differs, but while they succeed the sum does not.
    pub(super) fn time_writeback(&mut self, id: SlotId, c: Cqe) {
        if !matches!(c.tag, Tag::Io | Tag::Writeback) {
            return;
        }
        let Some(r) = self.ring.data_mut(id).filter(|r| r.paced) else {
            return;
        };
        let now = monotonic_now_ns();
        if c.tag == Tag::Io {
            r.written_at.push_back(now);
        } else if let Some(at) = r.written_at.pop_front()
            && c.res >= 0
        {
            self.counters.writeback_us += now.saturating_sub(at) / 1000;
        }
    }

    /// The `SYNC_FILE_RANGE` behind a paced write completed with `res`. Its
    /// result decides nothing about the request's: a writeback done
    /// (`res == 0`) or refused (an error: the pages stay the kernel's to
    /// flush, and a real write error reaches the caller's `fsync`) ends the
    /// request's unsubmitted dirty bytes; one cancelled by a short write
    /// leaves them to the continuation's writeback, unless the request is
    /// over. Its CQE is what a [`Lifecycle::Syncing`] request waits for:
    /// the next piece is booked now (or, cancel asked, the request ends).
    pub(super) fn on_writeback(&mut self, id: SlotId, res: i32) -> Result<(), UringError> {
        let r = self.req(id);
        r.writebacks = r.writebacks.saturating_sub(1);
        let syncing = matches!(r.state, Lifecycle::Syncing);
        if res == -libc::ECANCELED && !syncing && !matches!(r.state, Lifecycle::Completed(_)) {
            return Ok(());
        }
        // One piece's bytes (the oldest's, or a continued piece's whole:
        // its writeback covers the piece); whatever is left when the
        // request's last CQE is in is settled then (in `on_cqe`).
        let unsynced = r.unsynced.min(WRITEBACK_PIECE);
        r.unsynced -= unsynced;
        // The piece is on the device (or left to the kernel's flush): its
        // room under the caps goes to the next piece of any request.
        r.cap.release(WRITEBACK_PIECE);
        // So are its in-flight places (the oldest piece's hold: pieces
        // differ in bytes only at the request's end).
        drop(r.holds.pop_front());
        let cancel = r.owner.cancel_requested();
        self.dirty_unsubmitted -= unsynced;
        match res {
            0.. => self.counters.writeback_submissions += 1,
            e if e == -libc::ECANCELED => {}
            _ => self.counters.writeback_errors += 1,
        }
        if !syncing {
            return Ok(());
        }
        if cancel {
            return Err(UringError::Cancelled);
        }
        self.charge_then_io(id, 0)
    }
}
