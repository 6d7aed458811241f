//! The engine core: one ring, a state machine per request, shared by the
//! blocking and the async front ends. Safe code; all memory lent to the
//! kernel is owned by [`Ring`] (see `sys.rs`).
//!
//! # How a read is charged
//!
//! What is charged is the policy of `policy.rs`, shared with the `pread`
//! engine; this module decides only how the ring carries it out.
//!
//! * **[`Route::Device`]** (no throttler skips page-cache reads, a write,
//!   `O_DIRECT`, a disk filesystem without `RWF_NOWAIT`): the whole chain is
//!   charged *before* the IO with [`Throttle::reserve`], which returns the
//!   sum of every level's wait (a parent is charged at the time its child's
//!   wait would end, an array member at the time the previous member's wait
//!   would end, so each keeps its own rate). That delay becomes **one**
//!   absolute `IORING_OP_TIMEOUT` linked to the read (`IOSQE_IO_LINK` +
//!   `IORING_TIMEOUT_ETIME_SUCCESS`: expiry continues the chain like a hard
//!   link, a cancel breaks it); the kernel issues the read at the deadline.
//!   A request submitted with [`PreIoWait::Staged`] (the blocking
//!   `read_at`/`write_at`) keeps the booked wait staged instead, and the
//!   front end queues it with [`Core::release_staged`]: linked as above, or
//!   standalone with the IO held back until the timeout's CQE, so that a
//!   thread that parked its CPU lease for the wait has unparked before the
//!   kernel copies data on it (the IO then goes out with the next
//!   `io_uring_enter`).
//! * **[`Route::Probe`]**: the read is first submitted with `RWF_NOWAIT`
//!   (never with `IOSQE_ASYNC`, which defeats it). A full result is a
//!   page-cache hit, charged as [`Source::PageCache`] after the fact (a
//!   block-device level skips it, its parents charge it; a resulting wait is
//!   a standalone timeout before the request completes). `-EAGAIN` or a
//!   short result charges what remains as a device read and queues timeout +
//!   read, which go out with the next `io_uring_enter` the driver makes
//!   anyway. A read the disk-rate guard routed by `cachestat` (no
//!   `RWF_NOWAIT` read of its own yet) that has to wait looks at the page
//!   cache again when the wait ends, and what another reader brought in
//!   meanwhile is refunded to the block-device throttlers
//!   ([`Throttle::refund_page_cache_read`]), so the disk sees the limit
//!   even when many connections miss on the same ranges. On the async
//!   front ends ([`PreIoWait::Linked`]) its wait is a standalone timeout
//!   and, at its CQE, `cachestat` counts the pages present, up to date or
//!   still being read in by another reader (`Core::refund_cached`); a
//!   linked release of the blocking front end re-probes with `RWF_NOWAIT`
//!   instead (`Core::on_reprobe`, which also says why a request that
//!   probed does not look again).
//!
//! [`Throttle::refund_page_cache_read`]: slotring_throttle::Throttle::refund_page_cache_read
//! * **Guard** (the block device's instantaneous rate): while
//!   [`Policy::guard_engaged`] for this read plus every probe already in
//!   flight, the engine does not probe: it asks `cachestat(2)` and routes
//!   the read by its answer, charging before any IO.
//!
//! # How a write reaches the disk
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
//! ([`Core::issue_paced`]) it takes room under the writeback cap of its
//! block-device throttlers, shared with every other request and ring
//! (`cap.rs`), and its write goes out. Without room it stays unwritten in
//! [`Lifecycle::Capped`] until the ring's doorbell rings; after the device
//! held the writers back, the cap's catch-up pacer may hold it a little
//! longer ([`Lifecycle::Pacing`]), so that a bucket's backlog never reaches
//! the device at once. The writeback's CQE ([`Tag::Writeback`]) changes no
//! result: pacing is not durability, `fsync` stays the caller's, and a
//! failed or cancelled writeback only leaves the pages to the kernel's own
//! flush. Only the request's last CQE makes it collectable, as for any
//! chain.
//!
//! # A request's lifecycle
//!
//! Each request is a [`Lifecycle`] (what the ring is doing for it, each
//! state holding exactly what is valid in it: the SQE in flight, the
//! deadline of its timeout, the error a failed link will report, the
//! result) and an [`Owner`] (who collects it, tokio-uring's `Waiting` /
//! `Ignored`). A request whose owner is gone keeps its buffer until the last
//! CQE of its chain and is freed then.
//!
//! [`Throttle::reserve`]: slotring_throttle::Throttle::reserve

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};

use slotring_throttle::{Source, ThrottlePtr};

use crate::cap::CapHold;
use crate::counters::UringCounters;
use crate::error::UringError;
use crate::file::UringFile;
use crate::policy::{self, Op, Policy, Route, WRITEBACK_PIECE, Writeback};
use crate::pread::ThreadIo;
use crate::sys::{Cqe, IoKind, IoSqe, Ring, SetupParams, SlotId, Syscalls, Tag, monotonic_now_ns};

/// Largest single SQE transfer we issue.
const MAX_IO: usize = 1 << 30;

/// Whether a write of `len` bytes of `file` under `throttle` is one that a
/// thread may do itself ([`ThreadIo`]) instead of the ring: a paced write
/// ([`Writeback::Paced`]) of a length the ring takes (so that a write's
/// outcome never depends on the path it took). The blocking front end
/// adds "nothing else in flight" ([`Core::writes_in_thread`]); the shared
/// front end sends it to tokio's blocking pool (`shared.rs`).
pub(crate) fn paced_in_thread(
    policy: &Policy,
    file: &UringFile,
    throttle: Option<&ThrottlePtr>,
    len: usize,
) -> bool {
    len <= MAX_IO && policy.writeback(Op::Write, file, throttle) == Writeback::Paced
}

/// How a throttle wait booked before a request's IO goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreIoWait {
    /// Linked to the IO at once: the kernel issues the IO at the deadline.
    Linked,
    /// Staged for the front end, which queues it with
    /// [`Core::release_staged`] (the blocking `read_at`/`write_at`, which
    /// may park a CPU lease for the wait).
    Staged,
}

/// How [`Core::release_staged`] queues a staged wait.
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
enum Charge {
    /// Charged before the IO (or nothing to charge).
    Booked,
    /// Known to be served from memory: charge the bytes as page cache when
    /// the IO completes.
    PageCacheOnCompletion,
}

/// Where a request is in the ring. Each state holds exactly what is valid
/// in it; what is in flight follows from the state.
#[derive(Debug)]
enum Lifecycle {
    /// Being started: nothing queued yet.
    Starting,
    /// A pre-IO wait is booked but not queued ([`PreIoWait::Staged`]).
    Staged {
        /// Absolute `CLOCK_MONOTONIC` deadline of the wait.
        deadline_ns: u64,
        /// The IO it delays.
        io: IoSqe,
    },
    /// A `RWF_NOWAIT` probe is in flight; its bytes count among the probes
    /// in flight ([`Core::probe_bytes`]).
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
        charge: Charge,
    },
    /// A paced write's piece is written, and [`Policy::writeback_depth`]
    /// writebacks of its pieces are in flight (the device completing them):
    /// the next piece is booked at the next writeback CQE, so a request
    /// never has more pieces dirty and not yet on the device.
    Syncing,
    /// A paced write's piece is booked and its turn has come, but the
    /// writeback cap of its block-device throttlers has no room (see
    /// `cap.rs`): nothing of it is written; a `POLL_ADD` on the ring's
    /// doorbell eventfd is in flight ([`Tag::CapWait`]), rung when any
    /// request of any engine releases room on one of its caps; then the
    /// piece tries again.
    Capped {
        /// The piece's write.
        io: IoSqe,
    },
    /// A paced write's piece holds its room under the writeback caps and
    /// waits, in a standalone timeout, for the slot the catch-up pacer
    /// gave it (`cap.rs`: only after the device held the writers back);
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
    /// [`Writeback::Paced`]: booked and issued in pieces, each write linked
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
    /// `POLL_ADD`s on the doorbell ([`Tag::CapWait`]) whose CQE is not in.
    cap_polls: u32,
    /// Paced writes: when each write CQE whose writeback's CQE is not in
    /// yet was reaped, oldest first (see [`Core::time_writeback`]).
    written_at: VecDeque<u64>,
    /// A read routed by probing the page cache ([`Route::Probe`]) that has
    /// issued no `RWF_NOWAIT` read yet (the disk-rate guard routed it by
    /// `cachestat`): after a throttle wait its IO is a re-probe (see
    /// [`Core::on_reprobe`]). A probe that misses clears it: it may have
    /// started the read-in itself.
    reprobe: bool,
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
    /// by the front end, see `tokio::fair_booking`), from submission.
    prebooked_ns: u64,
}

impl Submit {
    /// An `op` on `file` at `offset`, charged to `throttle`.
    pub(crate) fn new(
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
        }
    }

    /// The request was booked in its tenant's fair turn already (with no
    /// throttle left to charge here): its IO waits `delay_ns` from now, in
    /// the same timeout SQE a charge here would have produced.
    pub(crate) fn prebooked(mut self, delay_ns: u64) -> Self {
        self.prebooked_ns = delay_ns;
        self
    }
}

/// The core shared by both front ends.
pub(crate) struct Core {
    ring: Ring<Req>,
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

/// The eventfd a [`Lifecycle::Capped`] request polls on the ring: a
/// writeback cap wakes it from any thread (an eventfd write), and the
/// ring's `POLL_ADD` completes inside whatever `io_uring_enter` the ring's
/// owner is waiting in.
#[derive(Debug)]
struct Doorbell(EventFd);

impl Wake for Doorbell {
    fn wake(self: Arc<Self>) {
        // Saturating the counter is impossible (one write per release);
        // a failure leaves the request to the next release.
        let _ = self.0.write(1);
    }
}

impl Doorbell {
    fn fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }

    /// Reset the counter (non-blocking: nothing to read is fine).
    fn drain(&self) {
        let _ = self.0.read();
    }
}

fn sq_full(source: io::Error) -> UringError {
    UringError::Ring {
        what: "io_uring_enter (SQ full)",
        source,
    }
}

impl Core {
    pub(crate) fn new(
        sys: Box<dyn Syscalls>,
        p: &SetupParams,
        policy: Policy,
    ) -> Result<Self, UringError> {
        let ring = Ring::new(sys, p).map_err(UringError::unavailable)?;
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

    /// Whether the blocking front end writes `len` bytes of `file` under
    /// `throttle` in its caller's own thread ([`ThreadIo`]): a paced write
    /// ([`Writeback::Paced`]), nothing else in flight (whose completions
    /// the thread would not reap meanwhile), and a length the ring takes
    /// (so that a write's outcome never depends on the path it took).
    pub(crate) fn writes_in_thread(
        &self,
        file: &UringFile,
        throttle: Option<&ThrottlePtr>,
        len: usize,
    ) -> bool {
        self.in_flight() == 0 && paced_in_thread(&self.policy, file, throttle, len)
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
        let prebooked_ns = s.prebooked_ns;
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
            owner: Owner::Waiting(None),
            state: Lifecycle::Starting,
        };
        let id = self.ring.alloc(buf, req);
        if let Err(e) = self.start(id, prebooked_ns) {
            self.finish(id, Err(e));
        }
        id
    }

    /// Where the bytes of an `op` of `len` at `off` of `file` charged to
    /// `throttle` come from, decided before submission (for a tenant's read,
    /// booked in its fair turn before the ring sees it): the route the ring
    /// would take, with a probe replaced by `cachestat(2)` (page cache only
    /// when every page is cached).
    pub(crate) fn prebook_source(
        &mut self,
        op: Op,
        file: &UringFile,
        off: u64,
        len: u64,
        throttle: &ThrottlePtr,
    ) -> Source {
        let route = match self.policy.route(op, file, Some(throttle)) {
            Route::Probe => {
                self.counters.cachestat_checks += 1;
                let stat = self.ring.sys().cachestat(file.fd(), off, len);
                policy::cachestat_route(stat, off, len)
            }
            r => r,
        };
        match route {
            Route::PageCache => Source::PageCache,
            Route::Device | Route::Probe => Source::Device,
        }
    }

    fn req(&mut self, id: SlotId) -> &mut Req {
        self.ring.data_mut(id).expect("live request")
    }

    fn start(&mut self, id: SlotId, prebooked_ns: u64) -> Result<(), UringError> {
        let (op, len, file, throttle) = {
            let r = self.req(id);
            (r.op, r.len, r.file.clone(), r.throttle.clone())
        };
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
        let paced = self.policy.writeback(op, &file, throttle.as_ref()) == Writeback::Paced;
        self.req(id).paced = paced;
        if paced {
            self.req(id).cap = CapHold::for_chain(self.policy, throttle.as_ref());
        }
        match self.policy.route(op, &file, throttle.as_ref()) {
            Route::Device => self.charge_then_io(id, prebooked_ns),
            Route::PageCache => self.known_hit_io(id),
            Route::Probe => {
                self.req(id).reprobe = op == Op::Read;
                let need = |probes: u64| probes + len as u64;
                let mut engaged = self
                    .policy
                    .guard_engaged(throttle.as_ref(), need(self.probe_bytes));
                if engaged && self.probe_bytes > 0 {
                    // Probes in flight have started disk reads that are not
                    // charged yet; a charge booked now would not see them and
                    // the disk would get both. Let them settle first (a cold
                    // NOWAIT probe answers inline, so one enter suffices).
                    // Only on this contended path does a request cost an
                    // extra enter.
                    self.submit_and_reap()?;
                    engaged = self
                        .policy
                        .guard_engaged(throttle.as_ref(), need(self.probe_bytes));
                }
                if !engaged {
                    return self.probe(id);
                }
                self.counters.cachestat_checks += 1;
                let off = self.req(id).offset;
                let stat = self.ring.sys().cachestat(file.fd(), off, len as u64);
                match policy::cachestat_route(stat, off, len as u64) {
                    Route::PageCache => self.known_hit_io(id),
                    Route::Device | Route::Probe => self.charge_then_io(id, 0),
                }
            }
        }
    }

    /// Replace the state of `id`, keeping [`Core::probe_bytes`] in step.
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
            | Lifecycle::WaitFailed { .. }
            | Lifecycle::WaitDecides
            | Lifecycle::Syncing
            | Lifecycle::Capped { .. }
            | Lifecycle::Completed(_) => unreachable!("{next:?} is entered on a CQE, not queued"),
        };
        // A paced write goes out only from `Io` (its wait is never linked:
        // `Core::issue_paced`), with its writeback linked behind it.
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

    fn probe(&mut self, id: SlotId) -> Result<(), UringError> {
        let io = self.req(id).next_io(IoKind::NowaitRead);
        self.queue(id, Lifecycle::Probing { io })
    }

    fn known_hit_io(&mut self, id: SlotId) -> Result<(), UringError> {
        let r = self.req(id);
        let io = r.next_io(IoKind::plain(r.op));
        self.queue(
            id,
            Lifecycle::Io {
                io,
                charge: Charge::PageCacheOnCompletion,
            },
        )
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
        // Only a file with a size (regular, block device) has an EOF to trim
        // at; for the rest the hint is `SIZE_UNBOUNDED` and nothing is trimmed.
        if pos.saturating_add(rem) > file.size_hint()
            && let Ok(sz) = self.ring.sys().file_size(file.fd())
        {
            file.note_size(sz);
        }
        rem.min(file.size_hint().saturating_sub(pos))
    }

    /// Charge the remaining bytes as device IO (booked `after_ns` from now)
    /// and queue the IO, behind one timeout if a wait results.
    fn charge_then_io(&mut self, id: SlotId, after_ns: u64) -> Result<(), UringError> {
        let amount = self.chargeable(id);
        let r = self.req(id);
        if r.paced {
            r.booked = r.done + amount as usize;
        }
        let delay = policy::book(
            r.throttle.as_ref(),
            amount,
            Source::Device,
            r.max_block,
            after_ns,
        )?;
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
                charge: Charge::Booked,
            },
            // The front end decides how this wait goes out.
            (Some(deadline_ns), PreIoWait::Staged) => Lifecycle::Staged { deadline_ns, io },
            // A re-probe waits standalone: at its expiry `cachestat` tells
            // what another reader has brought in (or is reading in) meanwhile
            // (`Core::on_wait`), before any read of ours touches the range.
            // So does a paced piece: at its expiry it takes its room under
            // the writeback caps (`Core::issue_paced`), which no kernel link
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

    /// The ring's doorbell (an eventfd, created on first use).
    fn doorbell(&mut self) -> Result<Arc<Doorbell>, UringError> {
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
    /// for its turn in the bucket is not under writeback, and eight writers
    /// sharing one bucket each have a piece booked ahead; counted from their
    /// booking they filled a 16 ms cap on a quiet disk and made every piece
    /// wait for the doorbell (4,100 cap waits per GiB, measured).
    fn issue_paced(&mut self, id: SlotId, io: IoSqe) -> Result<(), UringError> {
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
                    charge: Charge::Booked,
                },
            ),
            Some(deadline_ns) => self.queue(id, Lifecycle::Pacing { io, deadline_ns }),
        }
    }

    /// The piece `io` of `id` found no room under its writeback caps (its
    /// waker, the doorbell, is registered with the cap that refused): wait
    /// for the doorbell, with one `POLL_ADD` armed at a time.
    fn enter_capped(&mut self, id: SlotId, io: IoSqe) -> Result<(), UringError> {
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
    fn on_cap_wait(&mut self, id: SlotId) -> Result<(), UringError> {
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
                    && self
                        .ring
                        .data(c)
                        .is_some_and(|r| matches!(r.state, Lifecycle::Capped { .. }))
            })
            .collect();
        for c in others {
            if let Err(e) = self.retry_capped(c) {
                self.finish(c, Err(e));
            }
        }
        self.retry_capped(id)
    }

    /// A [`Lifecycle::Capped`] request tries its piece again. One that goes
    /// on with its poll still armed cancels it (the poll's CQE, rung or
    /// cancelled, then only counts); one cancelled ends at its last poll's
    /// CQE.
    fn retry_capped(&mut self, id: SlotId) -> Result<(), UringError> {
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

    /// Whether `id` has a booked pre-IO wait that is not queued yet (only
    /// requests submitted with [`PreIoWait::Staged`]).
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
    /// the IO): no IO of it is queued or in flight.
    pub(crate) fn waiting_on_timeout(&self, id: SlotId) -> bool {
        self.ring.data(id).is_some_and(|r| {
            matches!(
                r.state,
                Lifecycle::Held { .. }
                    | Lifecycle::Pacing { .. }
                    | Lifecycle::PostWait { .. }
                    | Lifecycle::WaitDecides
            )
        })
    }

    /// Charge `n` page-cache bytes now; returns the resulting delay.
    fn charge_page_cache(&mut self, id: SlotId, n: u64) -> Result<u64, UringError> {
        self.counters.page_cache_hits += 1;
        self.counters.page_cache_bytes += n;
        let r = self.req(id);
        Ok(policy::book(
            r.throttle.as_ref(),
            n,
            Source::PageCache,
            r.max_block,
            0,
        )?)
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
    fn cancel_in_flight(&mut self, id: SlotId) {
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
            Lifecycle::Starting | Lifecycle::Completed(_) => return,
        };
        // On failure the chain still completes on its own; only the hurry
        // is lost.
        let _ = self.ring.push_cancel(id, tags);
    }

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

    /// [`Core::wait_and_reap`], calling `woke` as soon as `io_uring_enter`
    /// returns, before anything is reaped (the blocking front end unparks
    /// its CPU lease there: processing the CQEs is the thread's own work).
    pub(crate) fn wait_and_reap_after(&mut self, woke: impl FnOnce()) -> Result<(), UringError> {
        let want = u32::from(self.ring.total_outstanding() > 0);
        self.turn(want, woke)
    }

    fn turn(&mut self, want: u32, woke: impl FnOnce()) -> Result<(), UringError> {
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

    fn on_cqe(&mut self, c: Cqe) {
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
    fn on_wait(&mut self, id: SlotId, res: i32) -> Result<(), UringError> {
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
                        charge: Charge::Booked,
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
                        charge: Charge::Booked,
                    },
                )
            }
            Lifecycle::Linked { io, .. } => {
                r.state = if expired || cancel {
                    Lifecycle::Io {
                        io,
                        charge: Charge::Booked,
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
    fn on_post_wait(&mut self, id: SlotId) {
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

    fn on_io(&mut self, id: SlotId, res: i32) -> Result<(), UringError> {
        let r = self.req(id);
        let cancel = r.owner.cancel_requested();
        // `first`: the probe that decides the charge; a NOWAIT read in any
        // other state is a re-probe after a booked wait.
        let (io, charge, first) = match r.state {
            Lifecycle::Probing { io } => (io, Charge::Booked, true),
            Lifecycle::Io { io, charge } => (io, charge, false),
            Lifecycle::Linked { .. } if res == -libc::ECANCELED && !cancel => {
                // Its wait's CQE is still to come: whether the wait failed
                // decides the outcome (`on_wait`).
                r.state = Lifecycle::WaitDecides;
                return Ok(());
            }
            Lifecycle::Linked { io, .. } => (io, Charge::Booked, false),
            Lifecycle::WaitFailed { errno, .. } if res == -libc::ECANCELED => {
                return Err(timeout_failed(errno));
            }
            Lifecycle::WaitFailed { io, .. } => (io, Charge::Booked, false),
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
                Lifecycle::Io { io, charge }
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
            return self.io_done(id, charge);
        }
        r.done += n;
        if r.op == Op::Write {
            r.file.grow_to(r.offset + r.done as u64);
        }
        if io.kind == IoKind::PacedWrite {
            r.unsynced += n as u64;
            self.counters.paced_bytes += n as u64;
            self.dirty_unsubmitted += n as u64;
            self.counters.dirty_high_water_bytes = self
                .counters
                .dirty_high_water_bytes
                .max(self.dirty_unsubmitted);
        }
        let r = self.req(id);
        if r.done < r.len {
            if cancel {
                return Err(UringError::Cancelled);
            }
            let depth = self.policy.writeback_depth.get();
            let r = self.req(id);
            if r.paced && r.done >= r.booked {
                // The piece is written (its writeback is linked behind it):
                // book the next one, unless `writeback_depth` pieces are
                // still on their way to the device; then the next
                // writeback's CQE books it.
                if r.writebacks >= depth {
                    self.set_state(id, Lifecycle::Syncing);
                    return Ok(());
                }
                return self.charge_then_io(id, 0);
            }
            let io = r.next_io(r.io_kind());
            self.counters.short_reads += 1;
            return self.queue(id, Lifecycle::Io { io, charge });
        }
        self.io_done(id, charge)
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
    fn time_writeback(&mut self, id: SlotId, c: Cqe) {
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
    fn on_writeback(&mut self, id: SlotId, res: i32) -> Result<(), UringError> {
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

    fn io_done(&mut self, id: SlotId, charge: Charge) -> Result<(), UringError> {
        let done = self.req(id).done;
        match charge {
            Charge::PageCacheOnCompletion => {
                let d = self.charge_page_cache(id, done as u64)?;
                self.complete_after(id, d)
            }
            Charge::Booked => {
                self.finish(id, Ok(done));
                Ok(())
            }
        }
    }

    fn on_probe(&mut self, id: SlotId, probe: IoSqe, res: i32) -> Result<(), UringError> {
        let cancel = self.req(id).owner.cancel_requested();
        // Whatever it found, this probe may have started reading the rest
        // in: a hit after the wait could be its own (see `on_reprobe`).
        self.req(id).reprobe = false;
        if res == -libc::EAGAIN {
            self.counters.nowait_misses += 1;
            if cancel {
                return Err(UringError::Cancelled);
            }
            return self.charge_then_io(id, 0);
        }
        if res == -libc::EOPNOTSUPP {
            let file = self.req(id).file.clone();
            let mode = policy::after_nowait_unsupported(self.ring.sys().fs_is_memory(file.fd()));
            file.set_nowait_mode(mode);
            if cancel {
                return Err(UringError::Cancelled);
            }
            return match Route::from(mode) {
                Route::PageCache => self.known_hit_io(id),
                Route::Device | Route::Probe => self.charge_then_io(id, 0),
            };
        }
        if res < 0 {
            return Err(io_failed(probe, res));
        }
        let r = self.req(id);
        if res == 0 {
            // At or past EOF.
            let done = r.done;
            self.finish(id, Ok(done));
            return Ok(());
        }
        let n = res as usize;
        r.done += n;
        let (done, len) = (r.done, r.len);
        let d = self.charge_page_cache(id, n as u64)?;
        if cancel {
            return Err(UringError::Cancelled);
        }
        if done == len {
            return self.complete_after(id, d);
        }
        // Short: EOF, or a partial hit (cached prefix).
        self.counters.short_reads += 1;
        if self.chargeable(id) == 0 {
            return self.complete_after(id, d);
        }
        self.counters.nowait_misses += 1;
        self.charge_then_io(id, d)
    }

    /// A read charged as a miss re-probed the page cache when its throttle
    /// wait ended (`RWF_NOWAIT`): what it found cached another reader
    /// brought in meanwhile, so the disk never reads it for us; those bytes
    /// are given back to the block-device throttlers
    /// ([`slotring_throttle::Throttle::refund_page_cache_read`]), and the
    /// rest (a miss, or past a cached prefix) is read as charged. Without
    /// the refund, at many connections the disk runs under its limit by the
    /// share of charged reads another connection served first.
    ///
    /// Only a request that issued no `RWF_NOWAIT` read before its wait
    /// re-probes (see [`Req::reprobe`]): on this kernel (6.18) a
    /// `RWF_NOWAIT` read that misses *starts reading the range in* before
    /// it answers `-EAGAIN` (16 pages of a 64 KiB miss are resident right
    /// after it, `fincore` shows), so after a probe that missed, the
    /// request's own disk read may be done by the end of its wait, and a
    /// re-probe would refund the disk read it caused.
    fn on_reprobe(&mut self, id: SlotId, io: IoSqe, res: i32) -> Result<(), UringError> {
        if self.req(id).owner.cancel_requested() {
            return Err(UringError::Cancelled);
        }
        let n = match res {
            // Still not cached (or NOWAIT refused now): the read it waited for.
            e if e == -libc::EAGAIN || e == -libc::EOPNOTSUPP => 0,
            e if e < 0 => return Err(io_failed(io, e)),
            // At or past EOF.
            0 => return self.io_done(id, Charge::Booked),
            n => n as usize,
        };
        if n > 0 {
            self.counters.page_cache_hits += 1;
            self.counters.page_cache_bytes += n as u64;
            self.req(id).done += n;
            self.refund(id, n as u64);
        }
        let r = self.req(id);
        if r.done == r.len {
            return self.io_done(id, Charge::Booked);
        }
        let io = r.next_io(IoKind::Read);
        if n > 0 {
            // A cached prefix: the rest is read as charged.
            self.counters.short_reads += 1;
        }
        self.queue(
            id,
            Lifecycle::Io {
                io,
                charge: Charge::Booked,
            },
        )
    }

    /// A re-probe's standalone wait expired and none of its own reads has
    /// touched the range yet: what `cachestat(2)` counts in the page cache
    /// now, up to date or still being read in by another reader, will not
    /// be read from the disk for this request, so it is refunded; the read
    /// that follows is plain. Exact to the page (a range that starts or ends
    /// inside a cached page may get up to that page's rest back), and
    /// unlike a `RWF_NOWAIT` re-probe it also catches another reader's
    /// read-in still in flight. A failed `cachestat` refunds nothing.
    fn refund_cached(&mut self, id: SlotId) {
        let r = self.req(id);
        let (fd, pos) = (r.file.fd(), r.offset + r.done as u64);
        let rest = self.chargeable(id);
        if rest == 0 {
            return;
        }
        self.counters.cachestat_checks += 1;
        if let Ok(st) = self.ring.sys().cachestat(fd, pos, rest) {
            let cached = policy::cached_bytes(&st, rest);
            if cached > 0 {
                self.counters.page_cache_hits += 1;
                self.counters.page_cache_bytes += cached;
                self.refund(id, cached);
            }
        }
    }

    /// Give `n` bytes charged as a disk read back to the request's
    /// block-device throttlers: they came from the page cache after all.
    fn refund(&mut self, id: SlotId, n: u64) {
        self.counters.page_cache_refund_bytes += n;
        if let Some(t) = &self.req(id).throttle {
            t.refund_page_cache_read(n);
        }
    }

    /// Whether the request finished.
    pub(crate) fn is_done(&self, id: SlotId) -> bool {
        self.ring
            .data(id)
            .is_some_and(|r| matches!(r.state, Lifecycle::Completed(_)))
    }

    /// Set the waker woken when the request finishes.
    pub(crate) fn set_waker(&mut self, id: SlotId, w: &Waker) {
        if let Some(slot) = self.ring.data_mut(id).and_then(|r| r.owner.waker())
            && !slot.as_ref().is_some_and(|x| x.will_wake(w))
        {
            *slot = Some(w.clone());
        }
    }

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

/// Wait for the ring's eventfd to signal (async front ends): on readiness
/// drain the counter, then clear readiness, so that the reap that follows
/// sees every CQE posted before, and one posted in between raises a new edge.
pub(crate) fn poll_eventfd(
    efd: &tokio::io::unix::AsyncFd<nix::sys::eventfd::EventFd>,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<Result<(), UringError>> {
    use std::task::Poll;
    match efd.poll_read_ready(cx) {
        Poll::Ready(Ok(mut g)) => {
            let _ = g.get_inner().read();
            g.clear_ready();
            Poll::Ready(Ok(()))
        }
        Poll::Ready(Err(source)) => Poll::Ready(Err(UringError::Ring {
            what: "eventfd poll",
            source,
        })),
        Poll::Pending => Poll::Pending,
    }
}
