//! The ring core: one ring and a state machine per request ([`RingCore`]),
//! shared by every front end that uses a ring (`UringEngine`, the per-thread
//! and the shared async engines). Safe code; all memory lent to the kernel is
//! owned by [`LendingRing`] (`sys`).
//!
//! Each request is a [`Lifecycle`] (what the ring is doing for it, each
//! state holding exactly what is valid in it: the SQE in flight, the
//! deadline of its timeout, the error a failed link will report, the
//! result) and an [`Owner`] (who collects it, tokio-uring's `Waiting` /
//! `Ignored`). A request whose owner is gone keeps its buffer until the last
//! CQE of its chain and is freed then. [`Lifecycle`] is the one description
//! of a request's life; the files of this module are its transitions, one
//! job each:
//!
//! * this file: the state, a request's start ([`RingCore::submit`]), the
//!   charge before an IO ([`RingCore::charge_then_io`]) and its end
//!   ([`RingCore::finish`]);
//! * `reads.rs`: how a read is charged — the `RWF_NOWAIT` probe, the
//!   disk-rate guard, the page-cache charge and the refunds;
//! * `pacing.rs`: how a paced write reaches the disk — its pieces, the
//!   writeback cap's room and doorbell, the catch-up pacer, the writebacks;
//! * `reap.rs`: the turns of the ring — submit, wait, reap, and what each
//!   CQE does to its request;
//! * `collect.rs`: the owner's side — staged waits, cancel, abandon,
//!   wakers, collecting a finished request.
//!
//! What is charged is decided before a request gets here, by the policy of
//! `policy.rs` through `route.rs` (which also lists every stop of every
//! route, this module's included); this module decides only how the ring
//! carries it out.
//!
//! # A wait before the IO
//!
//! A request charged before its IO ([`Charge::Device`], and a probe's miss)
//! books the whole chain with [`Throttle::reserve`], which returns the sum
//! of every level's wait (a parent is charged at the time its child's wait
//! would end, an array member at the time the previous member's wait would
//! end, so each keeps its own rate). That delay becomes **one** absolute
//! `IORING_OP_TIMEOUT` linked to the IO (`IOSQE_IO_LINK` +
//! `IORING_TIMEOUT_ETIME_SUCCESS`: expiry continues the chain like a hard
//! link, a cancel breaks it); the kernel issues the IO at the deadline. A
//! request submitted with [`PreIoWait::Staged`] (the blocking
//! `read_at`/`write_at`) keeps the booked wait staged instead, and the front
//! end queues it with [`RingCore::release_staged`]: linked as above, or
//! standalone with the IO held back until the timeout's CQE, so that a
//! thread that parked its CPU lease for the wait has unparked before the
//! kernel copies data on it (the IO then goes out with the next
//! `io_uring_enter`).
//!
//! [`Throttle::reserve`]: slotring_throttle::Throttle::reserve

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use slotring_throttle::{AsyncReserve, InFlightHold, Source, ThrottlePtr};

use crate::counters::UringCounters;
use crate::error::UringError;
use crate::file::UringFile;
use crate::policy::{self, Charge, Op, Policy, WRITEBACK_PIECE};
use crate::route::Plan;
use crate::sys::{
    Cqe, IoKind, IoSqe, LendingRing, SetupParams, SlotId, Syscalls, monotonic_now_ns,
};
use crate::thread_io::ThreadIo;
use crate::writeback_cap::CapHold;
use pacing::Doorbell;

mod collect;
mod pacing;
mod reads;
mod reap;
mod turns;

/// Largest single SQE transfer we issue.
pub(crate) const MAX_IO: usize = 1 << 30;

/// How a throttle wait booked before a request's IO goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreIoWait {
    /// Linked to the IO at once: the kernel issues the IO at the deadline.
    Linked,
    /// Staged for the front end, which queues it with
    /// [`RingCore::release_staged`] (the blocking `read_at`/`write_at`, which
    /// may park a CPU lease for the wait).
    Staged,
}

/// How [`RingCore::release_staged`] queues a staged wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// As one chain with its IO (the kernel issues the IO at the deadline,
    /// inside whatever `io_uring_enter` is waiting then).
    Linked,
    /// As a standalone timeout; the IO is held back until the timeout's CQE
    /// and goes out with the *next* `io_uring_enter`.
    Standalone,
}

/// What is still owed on the IO's bytes when it completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owed {
    /// Nothing: charged before the IO (or nothing to charge).
    Nothing,
    /// Known to be served from memory: charge the bytes as page cache when
    /// the IO completes.
    PageCache,
}

/// Where a request is in the ring. Each state holds exactly what is valid
/// in it; what is in flight follows from the state.
#[derive(Debug)]
enum Lifecycle {
    /// Being started: nothing queued yet.
    Starting,
    /// Queued for its turn in a workload (`turns.rs`): a doorbell
    /// `POLL_ADD` and maybe a re-poll timeout are in flight; its IO is
    /// built when the turn comes.
    Turn,
    /// A pre-IO wait is booked but not queued ([`PreIoWait::Staged`]).
    Staged {
        /// Absolute `CLOCK_MONOTONIC` deadline of the wait.
        deadline_ns: u64,
        /// The IO it delays.
        io: IoSqe,
    },
    /// A `RWF_NOWAIT` probe is in flight; its bytes count among the probes
    /// in flight ([`RingCore::probe_bytes`]).
    Probing {
        /// The probe.
        io: IoSqe,
    },
    /// A timeout heading a chain and the IO linked behind it are in flight.
    Linked {
        /// The IO.
        io: IoSqe,
        /// The timeout's deadline.
        deadline_ns: u64,
    },
    /// A standalone timeout is in flight; its IO is queued at its CQE.
    Held {
        /// The IO held back.
        io: IoSqe,
        /// The timeout's deadline.
        deadline_ns: u64,
    },
    /// The IO is in flight, nothing in front of it.
    Io {
        /// The IO.
        io: IoSqe,
        /// What is owed when it completes.
        owed: Owed,
    },
    /// A paced write's piece is written, and [`Policy::writeback_depth`]
    /// writebacks of its pieces are in flight (the device completing them):
    /// the next piece is booked at the next writeback CQE, so a request
    /// never has more pieces dirty and not yet on the device.
    Syncing,
    /// A paced write's piece is booked and its turn has come, but the
    /// writeback cap of its block-device throttlers has no room (see
    /// `writeback_cap.rs`): nothing of it is written; a `POLL_ADD` on the ring's
    /// doorbell eventfd is in flight ([`Tag::CapWait`](crate::sys::Tag::CapWait)), rung when any
    /// request of any engine releases room on one of its caps; then the
    /// piece tries again.
    Capped {
        /// The piece's write.
        io: IoSqe,
    },
    /// A paced write's piece holds its room under the writeback caps and
    /// waits, in a standalone timeout, for the slot the catch-up pacer
    /// gave it (`writeback_cap.rs`: only after the device held the writers back);
    /// its write goes out at the timeout's CQE.
    Pacing {
        /// The piece's write.
        io: IoSqe,
        /// The timeout's deadline.
        deadline_ns: u64,
    },
    /// The IO is in flight, but the timeout heading its chain failed (not
    /// `ETIME`, no cancel asked): the kernel fails the IO with `-ECANCELED`,
    /// and the request reports the timeout's error.
    WaitFailed {
        /// The IO.
        io: IoSqe,
        /// The timeout's errno.
        errno: i32,
    },
    /// The linked IO completed `-ECANCELED`, uncancelled by us, before its
    /// timeout's CQE: that CQE decides how the request ends.
    WaitDecides,
    /// The IO is done; a standalone timeout for its page-cache charge is in
    /// flight.
    PostWait {
        /// The timeout's deadline.
        deadline_ns: u64,
    },
    /// Finished. CQEs of its chain may still be owed; it is collectable (or,
    /// ignored, freed) only once they are in.
    Completed(Result<usize, UringError>),
}

/// Who collects a request.
#[derive(Debug)]
enum Owner {
    /// The submitter, woken through the waker (if it left one) when the
    /// request can be collected.
    Waiting(Option<Waker>),
    /// The submitter, who asked the kernel to cancel the request; it still
    /// collects it.
    Cancelling(Option<Waker>),
    /// Nobody (a dropped future, an abandoned ticket): the request ends as a
    /// cancellation and is freed at the last CQE of its chain.
    Ignored,
}

impl Owner {
    fn cancel_requested(&self) -> bool {
        !matches!(self, Owner::Waiting(_))
    }

    fn waker(&mut self) -> Option<&mut Option<Waker>> {
        match self {
            Owner::Waiting(w) | Owner::Cancelling(w) => Some(w),
            Owner::Ignored => None,
        }
    }
}

/// Per-request state.
pub(crate) struct Req {
    op: Op,
    file: Arc<UringFile>,
    offset: u64,
    len: usize,
    /// Bytes transferred so far.
    done: usize,
    throttle: Option<ThrottlePtr>,
    max_block: Duration,
    pre_io_wait: PreIoWait,
    /// Absolute `CLOCK_MONOTONIC` deadline of the last wait booked,
    /// reported with the result.
    deadline_ns: Option<u64>,
    /// [`Writeback::Paced`](crate::policy::Writeback::Paced): booked and
    /// issued in pieces, each write linked
    /// to the writeback of what the request has written.
    paced: bool,
    /// Paced writes: the end (within the request) of the bytes booked so
    /// far; a piece is issued up to it and the next is booked from it.
    booked: usize,
    /// Paced writes: the writebacks (one linked behind each piece's write)
    /// whose CQE is not in yet.
    writebacks: u32,
    /// Paced writes: bytes written whose writeback no successful (or
    /// failed, hence the kernel's) `SYNC_FILE_RANGE` has taken yet.
    unsynced: u64,
    /// Paced writes: the bytes this request holds under the writeback caps
    /// of its block-device throttlers (its pieces booked and not yet
    /// completed by the device); given back at each writeback's CQE, and
    /// whatever is left when the request goes quiet or is freed.
    cap: CapHold,
    /// `POLL_ADD`s on the doorbell ([`Tag::CapWait`](crate::sys::Tag::CapWait)) whose CQE is not in.
    cap_polls: u32,
    /// Paced writes: when each write CQE whose writeback's CQE is not in
    /// yet was reaped, oldest first (see [`RingCore::time_writeback`]).
    written_at: VecDeque<u64>,
    /// A read routed by probing the page cache ([`Charge::Probe`]) that has
    /// issued no `RWF_NOWAIT` read yet (`cachestat` routed it: a throttle
    /// that takes turns, or the disk-rate guard): after a throttle wait its
    /// IO is a re-probe (see
    /// [`RingCore::on_reprobe`]). A probe that misses clears it: it may have
    /// started the read-in itself.
    reprobe: bool,
    /// A turn queued in a workload (`turns.rs`): dropped, it hands the
    /// turn on and charges nothing.
    turn: Option<AsyncReserve>,
    /// Whether the re-poll timeout of the turn ([`Tag::TurnWait`](crate::sys::Tag::TurnWait)) is in flight.
    turn_timer: bool,
    /// The in-flight places its turns gave, oldest first: kept until the
    /// last CQE (a paced piece's, until its writeback's CQE).
    holds: VecDeque<InFlightHold>,
    owner: Owner,
    state: Lifecycle,
}

/// A collected request: result, buffer, last booked deadline.
pub(crate) type Taken = (Result<usize, UringError>, Vec<u8>, Option<u64>);

/// A request to start.
pub(crate) struct Submit {
    op: Op,
    file: Arc<UringFile>,
    offset: u64,
    throttle: Option<ThrottlePtr>,
    max_block: Duration,
    pre_io_wait: PreIoWait,
    /// A delay already booked for the whole request (a tenant's turn taken
    /// by the front end, see `async_wait::fair_turn`), from submission.
    prebooked_ns: u64,
    /// How it is charged ([`crate::route::route`]).
    plan: Plan,
}

impl Submit {
    /// An `op` on `file` at `offset`, charged to `throttle` as `plan` says.
    pub(crate) fn new(
        plan: Plan,
        op: Op,
        file: &Arc<UringFile>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
        pre_io_wait: PreIoWait,
    ) -> Self {
        Self {
            op,
            file: file.clone(),
            offset,
            throttle: throttle.cloned(),
            max_block,
            pre_io_wait,
            prebooked_ns: 0,
            plan,
        }
    }

    #[cfg(feature = "tokio")]
    /// The request was booked in its tenant's fair turn already (with no
    /// throttle left to charge here): its IO waits `delay_ns` from now, in
    /// the same timeout SQE a charge here would have produced.
    pub(crate) fn prebooked(mut self, delay_ns: u64) -> Self {
        self.prebooked_ns = delay_ns;
        self
    }
}

/// The ring and the state of its requests, shared by every front end on a
/// ring.
pub(crate) struct RingCore {
    ring: LendingRing<Req>,
    policy: Policy,
    counters: UringCounters,
    /// Bytes of the `RWF_NOWAIT` probes in flight (every [`Lifecycle::Probing`]).
    probe_bytes: u64,
    /// Bytes paced writes have put in the page cache whose writeback is
    /// not started yet (the sum of every request's `unsynced`).
    dirty_unsubmitted: u64,
    cqes: Vec<Cqe>,
    pub(crate) completed: VecDeque<SlotId>,
    /// Rung by a writeback cap's release (created on first use; declared
    /// after `ring`, so it outlives every `POLL_ADD` on it: the ring's drop
    /// waits for their CQEs first).
    doorbell: Option<Arc<Doorbell>>,
}

fn sq_full(source: io::Error) -> UringError {
    UringError::Ring {
        what: "io_uring_enter (SQ full)",
        source,
    }
}

impl RingCore {
    pub(crate) fn new(
        sys: Box<dyn Syscalls>,
        p: &SetupParams,
        policy: Policy,
    ) -> Result<Self, UringError> {
        let ring = LendingRing::new(sys, p).map_err(UringError::unavailable)?;
        Ok(Self {
            ring,
            policy,
            counters: UringCounters::default(),
            probe_bytes: 0,
            dirty_unsubmitted: 0,
            cqes: Vec::new(),
            completed: VecDeque::new(),
            doorbell: None,
        })
    }

    pub(crate) fn ring_fd(&self) -> i32 {
        self.ring.fd()
    }

    #[cfg(feature = "tokio")]
    pub(crate) fn register_eventfd(&mut self, efd: i32) -> Result<(), UringError> {
        self.ring
            .register_eventfd(efd)
            .map_err(|source| UringError::Ring {
                what: "io_uring_register(EVENTFD)",
                source,
            })
    }

    pub(crate) fn counters(&self) -> UringCounters {
        let mut c = self.counters;
        c.cq_overflows = self.ring.overflows_seen();
        c
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.ring.live_count()
    }

    /// The ring's policy (what its front end routes requests by).
    pub(crate) fn policy(&self) -> Policy {
        self.policy
    }

    /// The calling thread's own blocking IO, through this ring's syscall
    /// seam, policy and counters.
    pub(crate) fn thread_io(&mut self) -> ThreadIo<'_> {
        ThreadIo {
            sys: self.ring.sys(),
            policy: self.policy,
            counters: &mut self.counters,
            cancel: None,
        }
    }

    /// Start a request; the buffer is the ring's until the request is taken.
    pub(crate) fn submit(&mut self, s: Submit, buf: Vec<u8>) -> SlotId {
        let (prebooked_ns, plan) = (s.prebooked_ns, s.plan);
        let req = Req {
            op: s.op,
            file: s.file,
            offset: s.offset,
            len: buf.len(),
            done: 0,
            throttle: s.throttle,
            max_block: s.max_block,
            pre_io_wait: s.pre_io_wait,
            deadline_ns: None,
            paced: false,
            booked: 0,
            writebacks: 0,
            unsynced: 0,
            cap: CapHold::default(),
            cap_polls: 0,
            written_at: VecDeque::new(),
            reprobe: false,
            turn: None,
            turn_timer: false,
            holds: VecDeque::new(),
            owner: Owner::Waiting(None),
            state: Lifecycle::Starting,
        };
        let id = self.ring.alloc(buf, req);
        if let Err(e) = self.start(id, plan, prebooked_ns) {
            self.finish(id, Err(e));
        }
        id
    }

    fn req(&mut self, id: SlotId) -> &mut Req {
        self.ring.data_mut(id).expect("live request")
    }

    fn start(&mut self, id: SlotId, plan: Plan, prebooked_ns: u64) -> Result<(), UringError> {
        let len = self.req(id).len;
        if len == 0 {
            self.finish(id, Ok(0));
            return Ok(());
        }
        if len > MAX_IO {
            return Err(UringError::Invalid {
                what: "request length",
                value: len as u64,
            });
        }
        if plan.paced() {
            let policy = self.policy;
            let r = self.req(id);
            r.paced = true;
            r.cap = CapHold::for_chain(policy, r.throttle.as_ref());
        }
        match plan.charge {
            Charge::Device => self.charge_then_io(id, prebooked_ns),
            Charge::PageCache => self.known_hit_io(id),
            Charge::Probe => self.start_probe(id),
        }
    }

    /// Replace the state of `id`, keeping [`RingCore::probe_bytes`] in step.
    fn set_state(&mut self, id: SlotId, next: Lifecycle) {
        let r = self.ring.data_mut(id).expect("live request");
        if let Lifecycle::Probing { io } = &next {
            self.probe_bytes += u64::from(io.len);
        }
        if let Lifecycle::Probing { io } = std::mem::replace(&mut r.state, next) {
            self.probe_bytes -= u64::from(io.len);
        }
    }

    /// Enter `next` and queue what is in flight in it.
    fn queue(&mut self, id: SlotId, next: Lifecycle) -> Result<(), UringError> {
        let full = match next {
            Lifecycle::Probing { io } | Lifecycle::Io { io, .. } => self.ring.push_io(id, io, None),
            Lifecycle::Linked { io, deadline_ns } => self.ring.push_io(id, io, Some(deadline_ns)),
            Lifecycle::Held { deadline_ns, .. } | Lifecycle::Pacing { deadline_ns, .. } => {
                self.ring.push_wait(id, deadline_ns)
            }
            Lifecycle::PostWait { deadline_ns } => self.ring.push_post_wait(id, deadline_ns),
            Lifecycle::Staged { .. } => Ok(0),
            Lifecycle::Starting
            | Lifecycle::Turn
            | Lifecycle::WaitFailed { .. }
            | Lifecycle::WaitDecides
            | Lifecycle::Syncing
            | Lifecycle::Capped { .. }
            | Lifecycle::Completed(_) => unreachable!("{next:?} is entered on a CQE, not queued"),
        };
        // A paced write goes out only from `Io` (its wait is never linked:
        // `RingCore::issue_paced`), with its writeback linked behind it.
        let paced = matches!(next, Lifecycle::Io { io, .. } if io.kind == IoKind::PacedWrite);
        // Entered even if the push failed: the caller then finishes the
        // request, which leaves the state (and its probe bytes) for good.
        self.set_state(id, next);
        self.counters.sq_full += full.map_err(sq_full)?;
        if paced {
            self.req(id).writebacks += 1;
        }
        Ok(())
    }

    /// Bytes of the remaining range that lie before EOF (refreshing the size
    /// hint when the range crosses it); for a paced write, its next piece.
    fn chargeable(&mut self, id: SlotId) -> u64 {
        let (file, pos, rem, op) = {
            let r = self.req(id);
            (
                r.file.clone(),
                r.offset + r.done as u64,
                (r.len - r.done) as u64,
                r.op,
            )
        };
        if op == Op::Write {
            if self.req(id).paced {
                return rem.min(WRITEBACK_PIECE);
            }
            return rem;
        }
        file.before_eof(self.ring.sys(), pos, rem)
    }

    /// Charge the remaining bytes as device IO (booked `after_ns` from now)
    /// and queue the IO, behind one timeout if a wait results.
    fn charge_then_io(&mut self, id: SlotId, after_ns: u64) -> Result<(), UringError> {
        let amount = self.chargeable(id);
        let r = self.req(id);
        if r.paced {
            r.booked = r.done + amount as usize;
        }
        let delay = if amount > 0 && r.throttle.as_ref().is_some_and(|t| t.takes_turns()) {
            match self.take_turn(id, amount, after_ns)? {
                Some(delay) => delay,
                None => return Ok(()),
            }
        } else {
            policy::book(
                r.throttle.as_ref(),
                amount,
                Source::Device,
                r.max_block,
                after_ns,
            )?
        };
        self.io_after_booking(id, delay)
    }

    /// The remaining bytes of `id` are booked, its IO to wait `delay` ns
    /// from now: queue it, behind one timeout if it waits.
    fn io_after_booking(&mut self, id: SlotId, delay: u64) -> Result<(), UringError> {
        let r = self.req(id);
        // A read that waits re-probes the page cache when the wait ends
        // (another reader may have brought its bytes in meanwhile).
        let kind = if delay > 0 && r.reprobe {
            IoKind::NowaitRead
        } else {
            r.io_kind()
        };
        let (io, pre_io_wait) = (r.next_io(kind), r.pre_io_wait);
        let next = match (self.book_wait(id, delay), pre_io_wait) {
            // A paced piece takes its room under the caps when its turn
            // comes, not while it waits for it.
            (None, _) if io.kind == IoKind::PacedWrite => return self.issue_paced(id, io),
            (None, _) => Lifecycle::Io {
                io,
                owed: Owed::Nothing,
            },
            // The front end decides how this wait goes out.
            (Some(deadline_ns), PreIoWait::Staged) => Lifecycle::Staged { deadline_ns, io },
            // A re-probe waits standalone: at its expiry `cachestat` tells
            // what another reader has brought in (or is reading in) meanwhile
            // (`RingCore::on_wait`), before any read of ours touches the range.
            // So does a paced piece: at its expiry it takes its room under
            // the writeback caps (`RingCore::issue_paced`), which no kernel link
            // can do.
            (Some(deadline_ns), PreIoWait::Linked)
                if matches!(io.kind, IoKind::NowaitRead | IoKind::PacedWrite) =>
            {
                Lifecycle::Held { io, deadline_ns }
            }
            (Some(deadline_ns), PreIoWait::Linked) => Lifecycle::Linked { io, deadline_ns },
        };
        self.queue(id, next)
    }

    fn book_wait(&mut self, id: SlotId, delay_ns: u64) -> Option<u64> {
        if delay_ns == 0 {
            return None;
        }
        let deadline = monotonic_now_ns().saturating_add(delay_ns);
        self.counters.waits_submitted += 1;
        self.counters.wait_us += delay_ns / 1_000;
        self.req(id).deadline_ns = Some(deadline);
        Some(deadline)
    }

    /// Complete now, or after a standalone wait for a page-cache charge.
    fn complete_after(&mut self, id: SlotId, delay_ns: u64) -> Result<(), UringError> {
        match self.book_wait(id, delay_ns) {
            None => {
                let done = self.req(id).done;
                self.finish(id, Ok(done));
                Ok(())
            }
            Some(deadline_ns) => self.queue(id, Lifecycle::PostWait { deadline_ns }),
        }
    }

    fn finish(&mut self, id: SlotId, result: Result<usize, UringError>) {
        let Some(r) = self.ring.data_mut(id) else {
            return;
        };
        if matches!(r.state, Lifecycle::Completed(_)) {
            return;
        }
        // A request nobody will collect ended as a cancellation, whatever
        // the kernel managed to do before the cancel reached it.
        let result = match r.owner {
            Owner::Ignored => Err(UringError::Cancelled),
            Owner::Waiting(_) | Owner::Cancelling(_) => result,
        };
        match (&result, r.op) {
            (Ok(n), Op::Write) => {
                self.counters.writes += 1;
                self.counters.write_bytes += *n as u64;
            }
            // What a failed write had written is in the file: accounted.
            (Err(UringError::Write { written, .. }), _) => {
                self.counters.write_bytes += *written;
            }
            (Ok(n), Op::Read) => {
                self.counters.reads += 1;
                self.counters.read_bytes += *n as u64;
            }
            (Err(UringError::Cancelled), _) => self.counters.cancellations += 1,
            (Err(_), _) => {}
        }
        if let Some(w) = r.owner.waker().and_then(Option::take) {
            w.wake();
        }
        let ignored = matches!(r.owner, Owner::Ignored);
        self.set_state(id, Lifecycle::Completed(result));
        if ignored {
            self.release_if_quiet(id);
        } else {
            self.completed.push_back(id);
        }
    }

    fn release_if_quiet(&mut self, id: SlotId) {
        if self.is_done(id) && self.ring.outstanding(id) == 0 {
            // Dropping the buffer here is the only place an ignored
            // request's memory is freed.
            let _ = self.ring.take(id);
        }
    }
}

impl Req {
    /// The rest of the request (of a paced write: the rest of the piece
    /// booked) as one SQE of `kind`.
    fn next_io(&self, kind: IoKind) -> IoSqe {
        let end = if kind == IoKind::PacedWrite {
            self.booked
        } else {
            self.len
        };
        IoSqe {
            fd: self.file.fd(),
            kind,
            start: self.done,
            len: (end - self.done) as u32,
            offset: self.offset + self.done as u64,
        }
    }

    /// The SQE kind of this request's plain IO.
    fn io_kind(&self) -> IoKind {
        if self.paced {
            IoKind::PacedWrite
        } else {
            IoKind::plain(self.op)
        }
    }

    /// The write failed with `source` after `done` bytes.
    fn write_failed(&self, source: io::Error) -> UringError {
        UringError::write(
            &self.file,
            self.offset,
            self.len as u64,
            self.done as u64,
            source,
        )
    }
}

/// A throttle timeout that neither expired nor was cancelled by us.
fn timeout_failed(errno: i32) -> UringError {
    UringError::Ring {
        what: "throttle timeout",
        source: io::Error::from_raw_os_error(errno),
    }
}

/// `io` completed with the error `res`.
fn io_failed(io: IoSqe, res: i32) -> UringError {
    UringError::Io {
        op: io.kind.op(),
        offset: io.offset,
        len: u64::from(io.len),
        source: io::Error::from_raw_os_error(-res),
    }
}
