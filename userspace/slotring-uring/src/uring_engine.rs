//! The blocking front end of the ring: [`UringEngine`].
//!
//! # CPU leases
//!
//! A thread that holds a CPU slot parks its lease
//! ([`park_current_lease`]) exactly while it waits on a throttle timeout
//! (or, writing a paced write in its own thread, see "Paced writes", its
//! piece's turn or room under the writeback cap), and never while the
//! kernel moves data for it (ClickHouse parks around
//! the throttler's sleep, never around the `pread`). This matters because a
//! read linked behind a timeout is issued by the kernel as task work *in the
//! waiting thread's context*, inside its `io_uring_enter`: the page-cache
//! copy and the faults on the buffer run on that thread. Parked across the
//! copy, a thread would burn `rate / copy bandwidth` of the parked time on
//! a CPU it has given away.
//!
//! So [`IoEngine::read_at`]/[`IoEngine::write_at`] of a [`UringEngine`]
//! decide when a request books a wait *before* its IO:
//!
//! * **Lease parked** (a hook is installed, the thread has a current lease,
//!   and this request is the only one the engine holds): the absolute
//!   timeout goes out *standalone*; the thread waits for its CQE parked,
//!   unparks, and only then submits the IO and waits for it. Cost: one
//!   more `io_uring_enter` (a few µs) per throttled IO, for lease holders
//!   only, and a userspace wake-up between the deadline and the IO.
//! * **No lease** (`park_current_lease()` reports `parked() == false`,
//!   which costs a thread-local look-up, or no hook at all: one atomic
//!   load) or other requests in flight (whose linked IO could run on this
//!   thread while parked): the timeout is linked to the IO
//!   (`IOSQE_IO_LINK` + `IORING_TIMEOUT_ETIME_SUCCESS`) and the kernel
//!   issues the IO at the deadline with no userspace wake-up in between.
//!
//! A wait *after* the IO (the charge of a page-cache hit) is a standalone
//! timeout anyway and is parked the same way, and so is a wait for a
//! workload's turn (`Lifecycle::Turn`: nothing of the request is on the
//! ring but its re-poll timeout, and the turn comes with another request's
//! completion, which wakes the thread through the doorbell). IO without a throttle delay
//! (page-cache hits, NOWAIT probes and misses, unthrottled reads and
//! writes) parks nothing. The ticket API ([`UringEngine::submit_read`],
//! [`UringEngine::wait`], [`UringEngine::wait_any`]) never parks and keeps
//! every wait linked; the tokio [`crate::LocalEngine`] parks nothing either
//! (a task holds no thread).
//!
//! # Paced writes
//!
//! A paced write through [`IoEngine::write_at`] (a throttled buffered
//! write on a disk filesystem, [`crate::Policy::pace_writeback`]) is done
//! by the calling thread itself, in blocking `pwrite` and
//! `sync_file_range(2)` calls through the ring's syscall seam, exactly as
//! the [`PreadEngine`] does it (the same code: a piece waits for its turn,
//! takes room under the writeback cap, passes the catch-up pacer, is
//! written, and its writeback is started and waited for beyond the
//! depth), when the ring holds no other request (whose completions this
//! thread would not reap meanwhile). The caller waits for the write
//! either way; on the ring each piece would cost an io-wq worker two
//! sleeps and wake-ups (ext4's buffered write has no async path, so its
//! copy is punted to io-wq, and `IORING_OP_SYNC_FILE_RANGE` always runs
//! there) and the caller three. The lease is parked during a piece's turn
//! and while it waits for room under the writeback cap (another request's
//! writeback must complete), and held during the copy and the device's
//! writeback of its own pieces. A write longer than the ring takes in one
//! request goes to the ring and fails there, whatever is in flight. The
//! ticket API and [`crate::LocalEngine`] keep the ring's paced path
//! (linked write and writeback SQEs): they never block their caller's
//! thread on IO. [`crate::SharedEngine`] runs the same `ThreadIo` code on
//! tokio's blocking pool (see its module docs).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use slotring_throttle::{LeaseParked, ThrottlePtr, park_current_lease};

use crate::counters::UringCounters;
use crate::engine::{IoEngine, RingConfig};
use crate::error::{BufResult, UringError};
use crate::file::UringFile;
use crate::policy::Op;
#[cfg(doc)]
use crate::pread_engine::PreadEngine;
use crate::ring_core::{PreIoWait, Release, RingCore, Submit};
use crate::route::{self, Offer, Route};
use crate::sys::{RealSyscalls, SlotId, Syscalls};

/// Names a submitted request of a [`UringEngine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(pub(crate) SlotId);

/// A finished request.
#[derive(Debug)]
pub struct Completion {
    /// Which request.
    pub ticket: Ticket,
    /// Bytes transferred, or why not.
    pub result: Result<usize, UringError>,
    /// The buffer, handed back.
    pub buf: Vec<u8>,
    /// Absolute `CLOCK_MONOTONIC` deadline (ns) of the last throttle wait
    /// booked for the request, if any.
    pub deadline_ns: Option<u64>,
}

/// The blocking front end: the calling thread submits and waits in
/// `io_uring_enter`. Many requests may be in flight from one thread
/// ([`UringEngine::submit_read`] + [`UringEngine::wait_any`]); a throttle wait
/// costs a timeout SQE, not a thread. Through [`IoEngine`], the caller's CPU
/// lease is parked exactly while it waits on a throttle timeout, and a
/// paced write is done in the calling thread itself (see the module docs).
///
/// # Dropping
///
/// Dropping the engine cancels every request still held and waits for each
/// CQE owed before freeing a buffer. A request started with
/// [`UringEngine::submit_read`]/[`UringEngine::submit_write`] whose SQEs
/// were never submitted (no [`UringEngine::submit_pending`], `wait*` or
/// `poll_any` since) is already published in the submission ring, which
/// cannot take it back: the drop's `io_uring_enter` submits it ahead of its
/// cancel. If the kernel completes it inline (a buffered write, a
/// page-cache read) it **does happen**; if it has to wait (a throttle
/// timeout in front of it, a disk read gone async) the cancel stops it.
/// [`UringEngine::cancel`] before the drop changes nothing here (its
/// `ASYNC_CANCEL` also goes out behind the IO): an unthrottled
/// `submit_*` is a commitment to issue the IO.
pub struct UringEngine {
    core: RingCore,
    /// Cancels the paced writes done in the caller's thread
    /// ([`IoEngine::cancel_paced_writes_on`]).
    cancel: Option<Arc<AtomicBool>>,
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine")
            .field("ring_fd", &self.core.ring_fd())
            .finish()
    }
}

impl UringEngine {
    /// A ring with `cfg`, on the real kernel.
    pub fn new(cfg: &RingConfig) -> Result<Self, UringError> {
        Self::on(cfg, Box::new(RealSyscalls))
    }

    /// A ring whose every syscall goes through `sys` (feature `test-util`:
    /// fault injection).
    #[cfg(feature = "test-util")]
    pub fn with_syscalls(cfg: &RingConfig, sys: Box<dyn Syscalls>) -> Result<Self, UringError> {
        Self::on(cfg, sys)
    }

    pub(crate) fn on(cfg: &RingConfig, sys: Box<dyn Syscalls>) -> Result<Self, UringError> {
        Ok(Self {
            core: RingCore::new(sys, &cfg.setup()?, cfg.policy)?,
            cancel: None,
        })
    }

    /// Start a read of `buf.len()` bytes at `offset`. The buffer belongs to
    /// the engine until the request is collected.
    pub fn submit_read(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> Ticket {
        self.ticket(Op::Read, file, buf, offset, throttle, max_block)
    }

    /// Start a write of `buf` at `offset`.
    pub fn submit_write(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> Ticket {
        self.ticket(Op::Write, file, buf, offset, throttle, max_block)
    }

    /// A request of the ticket API: always the ring ([`Route::Ring`]), its
    /// waits linked to its IO.
    fn ticket(
        &mut self,
        op: Op,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> Ticket {
        let route = route::route(
            self.core.policy(),
            Offer::RING,
            op,
            file,
            throttle,
            buf.len(),
        );
        let s = Submit::new(
            route.plan(),
            op,
            file,
            offset,
            throttle,
            max_block,
            PreIoWait::Linked,
        );
        Ticket(self.core.submit(s, buf))
    }

    /// Submit queued SQEs without waiting and advance what completed.
    pub fn submit_pending(&mut self) -> Result<(), UringError> {
        self.core.submit_and_reap()
    }

    /// Wait for `t` to finish and collect it.
    ///
    /// Fails with [`UringError::Ticket`] if `t` was abandoned (nobody may
    /// collect it: the engine frees it at its last CQE) or is not live
    /// (already collected, e.g. by [`UringEngine::wait_any`]).
    pub fn wait(&mut self, t: Ticket) -> Result<Completion, UringError> {
        loop {
            // Checked on every round: an abandoned request is released by
            // the reap inside `wait_and_reap`, after which nothing is owed
            // and it would no longer block.
            if let Some(why) = self.core.uncollectable(t.0) {
                return Err(UringError::Ticket {
                    index: t.0.index,
                    generation: t.0.generation,
                    why,
                });
            }
            if let Some((result, buf, deadline_ns)) = self.core.take(t.0) {
                return Ok(Completion {
                    ticket: t,
                    result,
                    buf,
                    deadline_ns,
                });
            }
            self.core.wait_and_reap()?;
        }
    }

    /// Wait for any request to finish and collect it; `None` when nothing is
    /// in flight.
    pub fn wait_any(&mut self) -> Result<Option<Completion>, UringError> {
        loop {
            if let Some(c) = self.try_collect() {
                return Ok(Some(c));
            }
            if self.core.in_flight() == 0 {
                return Ok(None);
            }
            self.core.wait_and_reap()?;
        }
    }

    /// Collect a finished request without blocking.
    pub fn poll_any(&mut self) -> Result<Option<Completion>, UringError> {
        if let Some(c) = self.try_collect() {
            return Ok(Some(c));
        }
        self.core.submit_and_reap()?;
        Ok(self.try_collect())
    }

    fn try_collect(&mut self) -> Option<Completion> {
        for i in 0..self.core.completed.len() {
            let id = self.core.completed[i];
            if let Some((result, buf, deadline_ns)) = self.core.take(id) {
                return Some(Completion {
                    ticket: Ticket(id),
                    result,
                    buf,
                    deadline_ns,
                });
            }
        }
        None
    }

    /// Ask the kernel to cancel `t` (`ASYNC_CANCEL` on its chain). The request
    /// still finishes (usually with [`UringError::Cancelled`]; a buffered read
    /// already under way may complete with data) and must be collected.
    pub fn cancel(&mut self, t: Ticket) {
        self.core.cancel(t.0);
    }

    /// Cancel `t` and forget it: its buffer is freed by the engine once the
    /// last CQE of its chain arrives (what dropping an async future does).
    pub fn abandon(&mut self, t: Ticket) {
        self.core.ignore(t.0);
    }

    /// Requests not yet collected (including abandoned ones still owed CQEs).
    pub fn in_flight(&self) -> usize {
        self.core.in_flight()
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> UringCounters {
        self.core.counters()
    }

    /// Submit one request whose pre-IO waits are staged, and drive it to
    /// completion, parking the CPU lease exactly while it waits on a
    /// throttle timeout.
    fn run_one(&mut self, s: Submit, buf: Vec<u8>) -> BufResult<usize, Vec<u8>> {
        let t = Ticket(self.core.submit(s, buf));
        let mut lease: Option<LeaseParked> = None;
        let outcome = loop {
            if let Some((result, buf, _)) = self.core.take(t.0) {
                break Ok((result, buf));
            }
            if self.core.has_staged_wait(t.0) {
                // One extra io_uring_enter for a lease holder: the timeout
                // alone now, the IO once its CQE is in and we are unparked.
                // Without a lease, the kernel-linked chain.
                if lease.is_none() {
                    lease = self.park_for_wait();
                }
                let how = if lease.is_some() {
                    Release::Standalone
                } else {
                    Release::Linked
                };
                self.core.release_staged(t.0, how);
            } else if self.core.waiting_on_timeout(t.0) {
                if lease.is_none() {
                    lease = self.park_for_wait();
                }
            } else {
                // The IO is queued or in flight: take the lease back before
                // the kernel copies anything on this thread.
                lease = None;
            }
            // A parked lease is taken back the moment the wait returns:
            // reaping the CQEs is this thread's own work, and only the wait
            // in the kernel belongs to the parked interval. (A wake-up that
            // was not the timeout's CQE parks again on the next turn.)
            let woke = || drop(lease.take());
            if let Err(e) = self.core.wait_and_reap_after(woke) {
                break Err(e);
            }
        };
        match outcome {
            Ok((result, buf)) => (result, buf),
            Err(e) => {
                // The ring failed: the buffer stays with the engine (the
                // kernel may still write it) and is freed at the request's
                // last CQE, or when the engine drops; it is never handed out.
                self.core.ignore(t.0);
                (Err(e), Vec::new())
            }
        }
    }

    /// Park the calling thread's CPU lease for a throttle wait of the only
    /// request the engine holds. `None` if nothing was parked (no hook, no
    /// current lease, or other requests held, whose linked IO the kernel
    /// could run on this thread during the wait).
    fn park_for_wait(&self) -> Option<LeaseParked> {
        if self.core.in_flight() != 1 {
            return None;
        }
        let g = park_current_lease();
        g.parked().then_some(g)
    }
}

impl IoEngine for UringEngine {
    fn read_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> BufResult<usize, Vec<u8>> {
        // A read always takes the ring (`Route::Ring`); only a write
        // is offered this thread.
        let route = route::route(
            self.core.policy(),
            Offer::RING,
            Op::Read,
            file,
            throttle,
            buf.len(),
        );
        let plan = route.plan();
        let s = Submit::new(
            plan,
            Op::Read,
            file,
            offset,
            throttle,
            max_block,
            PreIoWait::Staged,
        );
        self.run_one(s, buf)
    }

    fn write_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> BufResult<usize, Vec<u8>> {
        // A paced write is done by this thread itself, as the `pread`
        // engine does it, when nothing else is in flight on the ring (whose
        // completions this thread would not reap meanwhile). See the module
        // docs, "Paced writes".
        let offer = Offer {
            paced_thread: self.core.in_flight() == 0,
            ..Offer::RING
        };
        let plan = match route::route(
            self.core.policy(),
            offer,
            Op::Write,
            file,
            throttle,
            buf.len(),
        ) {
            Route::PacedThread(plan) => {
                let cancel = self.cancel.clone();
                let mut io = self.core.thread_io();
                io.cancel = cancel.as_deref();
                let r = io.write(plan, file, &buf, offset, throttle, max_block);
                return (r, buf);
            }
            other => other.plan(),
        };
        let s = Submit::new(
            plan,
            Op::Write,
            file,
            offset,
            throttle,
            max_block,
            PreIoWait::Staged,
        );
        self.run_one(s, buf)
    }

    fn counters(&self) -> UringCounters {
        self.core.counters()
    }

    fn kind(&self) -> &'static str {
        "io_uring"
    }

    fn cancel_paced_writes_on(&mut self, flag: Arc<AtomicBool>) -> bool {
        self.cancel = Some(flag);
        true
    }
}
