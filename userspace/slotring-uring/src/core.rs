//! The engine core: one ring, a state machine per request, shared by the
//! blocking and the async front ends. Safe code; all memory lent to the
//! kernel is owned by [`Ring`] (see `sys.rs`).
//!
//! # How a read is charged
//!
//! * **No throttler cares about page-cache reads** (or the file is
//!   `O_DIRECT`): the whole chain is charged *before* the IO with
//!   [`Throttle::reserve`], which returns the sum of every level's wait (a
//!   parent is charged at the time its child's wait would end, an array
//!   member at the time the previous member's wait would end, so each keeps
//!   its own rate). That delay becomes **one** absolute `IORING_OP_TIMEOUT`
//!   linked to the read (`IOSQE_IO_LINK` + `IORING_TIMEOUT_ETIME_SUCCESS`:
//!   expiry continues the chain like a hard link, a cancel breaks it); the
//!   kernel issues the read at the deadline. A request submitted with
//!   `stage_waits` (the blocking `read_at`/`write_at`) keeps the booked
//!   wait staged instead, and the front end queues it with
//!   [`Core::release_staged`]: linked as above, or standalone with the IO
//!   held back until the timeout's CQE, so that a thread that parked its
//!   CPU lease for the wait has unparked before the kernel copies data on
//!   it (the IO then goes out with the next `io_uring_enter`).
//! * **Detection on**: the read is first submitted with `RWF_NOWAIT` (never
//!   with `IOSQE_ASYNC`, which defeats it). A full result is a page-cache hit,
//!   charged with `page_cache = true` after the fact (a block-device level
//!   skips it, its parents charge it; a resulting wait is a standalone timeout
//!   before the request completes). `-EAGAIN` or a short result charges what
//!   remains as a disk read and queues timeout + plain read, which go out
//!   with the next `io_uring_enter` the driver makes anyway.
//! * **Guard** (the block device's instantaneous rate): a NOWAIT miss starts
//!   its disk read at once, uncharged. So while a block-device bucket in the
//!   chain holds fewer tokens than this read plus every probe already in
//!   flight, the engine does not probe: it asks `cachestat(2)` (no side
//!   effect) and, unless the range is fully cached, charges before any IO.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use slotring_throttle::{NANO_PER_TOKEN, ThrottlePtr};

use crate::counters::UringCounters;
use crate::error::UringError;
use crate::file::{NowaitMode, UringFile};
use crate::sys::{Cqe, IoSqe, Ring, SetupParams, SlotId, Syscalls, Tag, monotonic_now_ns};

/// Largest single SQE transfer we issue.
const MAX_IO: usize = 1 << 30;

/// Engine policy switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Detect page-cache hits with `RWF_NOWAIT` when a throttler cares.
    pub detect_page_cache: bool,
    /// Bound the block device's instantaneous rate (cachestat instead of a
    /// NOWAIT probe while the block-device bucket cannot cover the probes).
    pub disk_rate_guard: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            detect_page_cache: true,
            disk_rate_guard: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Probe,
    Io,
    PostWait,
    Done,
}

/// Per-request state.
pub(crate) struct Req {
    write: bool,
    file: Arc<UringFile>,
    offset: u64,
    len: usize,
    done: usize,
    throttle: Option<ThrottlePtr>,
    max_block: Duration,
    phase: Phase,
    /// The read went out without NOWAIT but is known to be served from
    /// memory: charge it as a page-cache read when it completes.
    hit_known: bool,
    last_io: Option<IoSqe>,
    probe_bytes: u64,
    wait_in_flight: bool,
    io_in_flight: bool,
    post_in_flight: bool,
    cancel_requested: bool,
    /// Nobody will collect the result: release at the last CQE.
    orphan: bool,
    result: Option<Result<usize, UringError>>,
    waker: Option<Waker>,
    /// Absolute CLOCK_MONOTONIC deadline of the last wait booked.
    pub(crate) deadline_ns: Option<u64>,
    /// Pre-IO waits are staged for the front end to queue
    /// ([`Core::release_staged`]) instead of being linked at once.
    stage_waits: bool,
    /// A booked pre-IO wait (deadline) and the IO it delays, not queued yet.
    staged: Option<(u64, IoSqe)>,
    /// The IO behind a standalone pre-IO wait in flight: queued when the
    /// wait's CQE arrives.
    held_io: Option<IoSqe>,
    /// A linked wait failed with this errno (not `ETIME`, no cancel asked):
    /// the kernel cancels its IO, and the request reports this error.
    link_wait_errno: Option<i32>,
    /// The linked IO completed `-ECANCELED`, uncancelled by us, before its
    /// wait's CQE: that CQE decides how the request ends.
    link_io_cancelled: bool,
}

/// A collected request: result, buffer, last booked deadline.
pub(crate) type Taken = (Result<usize, UringError>, Vec<u8>, Option<u64>);

/// A request to start.
pub(crate) struct Submit {
    pub(crate) write: bool,
    pub(crate) file: Arc<UringFile>,
    pub(crate) offset: u64,
    pub(crate) throttle: Option<ThrottlePtr>,
    pub(crate) max_block: Duration,
    /// Stage pre-IO waits for [`Core::release_staged`] (the blocking
    /// front end's `read_at`/`write_at`, which may park a CPU lease).
    pub(crate) stage_waits: bool,
}

impl Submit {
    /// A request for `file` at `offset`, charged to `throttle`.
    pub(crate) fn new(
        write: bool,
        file: &Arc<UringFile>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
        stage_waits: bool,
    ) -> Self {
        Self {
            write,
            file: file.clone(),
            offset,
            throttle: throttle.cloned(),
            max_block,
            stage_waits,
        }
    }
}

/// The core shared by both front ends.
pub(crate) struct Core {
    ring: Ring<Req>,
    policy: Policy,
    counters: UringCounters,
    probe_bytes: u64,
    cqes: Vec<Cqe>,
    pub(crate) completed: VecDeque<SlotId>,
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
            cqes: Vec::new(),
            completed: VecDeque::new(),
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

    /// Start a request; the buffer is the ring's until the request is taken.
    pub(crate) fn submit(&mut self, s: Submit, buf: Vec<u8>) -> SlotId {
        let len = buf.len();
        let req = Req {
            write: s.write,
            file: s.file,
            offset: s.offset,
            len,
            done: 0,
            throttle: s.throttle,
            max_block: s.max_block,
            phase: Phase::Io,
            hit_known: false,
            last_io: None,
            probe_bytes: 0,
            wait_in_flight: false,
            io_in_flight: false,
            post_in_flight: false,
            cancel_requested: false,
            orphan: false,
            result: None,
            waker: None,
            deadline_ns: None,
            stage_waits: s.stage_waits,
            staged: None,
            held_io: None,
            link_wait_errno: None,
            link_io_cancelled: false,
        };
        let id = self.ring.alloc(buf, req);
        if let Err(e) = self.start(id) {
            self.finish(id, Err(e));
        }
        id
    }

    fn req(&mut self, id: SlotId) -> &mut Req {
        self.ring.data_mut(id).expect("live request")
    }

    fn start(&mut self, id: SlotId) -> Result<(), UringError> {
        let (write, len, file, throttle) = {
            let r = self.req(id);
            (r.write, r.len, r.file.clone(), r.throttle.clone())
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
        if write {
            return self.charge_then_io(id, 0);
        }
        let cares = self.policy.detect_page_cache
            && !file.is_direct()
            && throttle
                .as_ref()
                .is_some_and(|t| t.ignores_page_cache_reads());
        if !cares {
            return self.charge_then_io(id, 0);
        }
        match file.nowait_mode() {
            NowaitMode::Memory => self.known_hit_io(id),
            NowaitMode::Unsupported => self.charge_then_io(id, 0),
            NowaitMode::Probe => {
                let mut engaged =
                    self.policy.disk_rate_guard && self.guard_engaged(throttle.as_ref(), len);
                if engaged && self.probe_bytes > 0 {
                    // Probes in flight have started disk reads that are not
                    // charged yet; a charge booked now would not see them and
                    // the disk would get both. Let them settle first (a cold
                    // NOWAIT probe answers inline, so one enter suffices).
                    // Only on this contended path does a request cost an
                    // extra enter.
                    self.turn(false)?;
                    engaged = self.guard_engaged(throttle.as_ref(), len);
                }
                if engaged {
                    self.counters.cachestat_checks += 1;
                    let (off, fd) = {
                        let r = self.req(id);
                        (r.offset, r.file.fd())
                    };
                    let cached = match self.ring.sys().cachestat(fd, off, len as u64) {
                        Ok(st) => st.nr_cache >= pages_spanned(off, len as u64),
                        Err(_) => false,
                    };
                    if cached {
                        self.known_hit_io(id)
                    } else {
                        self.charge_then_io(id, 0)
                    }
                } else {
                    self.probe(id)
                }
            }
        }
    }

    /// Whether some block-device bucket in the chain cannot cover this read
    /// plus the probes already in flight.
    fn guard_engaged(&self, throttle: Option<&ThrottlePtr>, len: usize) -> bool {
        let Some(t) = throttle else { return false };
        let need = i128::from(self.probe_bytes + len as u64) * NANO_PER_TOKEN;
        let mut engaged = false;
        t.visit(&mut |th| {
            if th.limits_block_device_bandwidth() && th.max_speed() > 0 && th.tokens_nano() < need {
                engaged = true;
            }
        });
        engaged
    }

    fn probe(&mut self, id: SlotId) -> Result<(), UringError> {
        let r = self.req(id);
        let rem = r.len - r.done;
        let io = IoSqe {
            fd: r.file.fd(),
            write: false,
            start: r.done,
            len: rem as u32,
            offset: r.offset + r.done as u64,
            nowait: true,
        };
        r.phase = Phase::Probe;
        r.probe_bytes = rem as u64;
        self.probe_bytes += rem as u64;
        self.push_io(id, io, None)
    }

    fn known_hit_io(&mut self, id: SlotId) -> Result<(), UringError> {
        let r = self.req(id);
        r.hit_known = true;
        let io = r.next_io();
        r.phase = Phase::Io;
        self.push_io(id, io, None)
    }

    /// Bytes of the remaining range that lie before EOF (refreshing the size
    /// hint when the range crosses it).
    fn chargeable(&mut self, id: SlotId) -> u64 {
        let (file, pos, rem, write) = {
            let r = self.req(id);
            (
                r.file.clone(),
                r.offset + r.done as u64,
                (r.len - r.done) as u64,
                r.write,
            )
        };
        if write {
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

    /// Charge the remaining bytes as disk IO (booked `after_ns` from now) and
    /// queue the IO behind one linked timeout if a wait results.
    fn charge_then_io(&mut self, id: SlotId, after_ns: u64) -> Result<(), UringError> {
        let amount = self.chargeable(id);
        let (throttle, max_block) = {
            let r = self.req(id);
            (r.throttle.clone(), r.max_block)
        };
        let mut delay = after_ns;
        if let Some(t) = throttle
            && amount > 0
        {
            delay = t.reserve(amount, max_block, after_ns, false)?.delay_ns;
        }
        let io = {
            let r = self.req(id);
            r.phase = Phase::Io;
            r.next_io()
        };
        let wait = self.book_wait(id, delay);
        self.push_io(id, io, wait)
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

    fn push_io(&mut self, id: SlotId, io: IoSqe, wait: Option<u64>) -> Result<(), UringError> {
        if let Some(deadline) = wait {
            let r = self.req(id);
            if r.stage_waits {
                // The front end decides how this wait goes out.
                r.staged = Some((deadline, io));
                return Ok(());
            }
        }
        self.push_now(id, io, wait)
    }

    /// Queue `io`, linked behind a timeout to `wait` if given.
    fn push_now(&mut self, id: SlotId, io: IoSqe, wait: Option<u64>) -> Result<(), UringError> {
        let full = self
            .ring
            .push_io(id, io, wait)
            .map_err(|source| UringError::Ring {
                what: "io_uring_enter (SQ full)",
                source,
            })?;
        self.counters.sq_full += full;
        let r = self.req(id);
        r.last_io = Some(io);
        r.io_in_flight = true;
        r.wait_in_flight = wait.is_some();
        Ok(())
    }

    /// Whether `id` has a booked pre-IO wait that is not queued yet (only
    /// requests submitted with `stage_waits`).
    pub(crate) fn has_staged_wait(&self, id: SlotId) -> bool {
        self.ring
            .data(id)
            .is_some_and(|r| r.phase != Phase::Done && r.staged.is_some())
    }

    /// Queue the staged wait of `id`: `linked`, as one chain with its IO
    /// (the kernel issues the IO at the deadline, inside whatever
    /// `io_uring_enter` is waiting then); otherwise as a standalone timeout,
    /// the IO held back until the timeout's CQE and queued then, so that it
    /// goes out with the *next* `io_uring_enter` — after the front end has
    /// unparked the CPU lease. A failure finishes the request with it.
    pub(crate) fn release_staged(&mut self, id: SlotId, linked: bool) {
        let Some((deadline, io)) = self
            .ring
            .data_mut(id)
            .filter(|r| r.phase != Phase::Done)
            .and_then(|r| r.staged.take())
        else {
            return;
        };
        let res = if linked {
            self.push_now(id, io, Some(deadline))
        } else {
            self.push_held(id, io, deadline)
        };
        if let Err(e) = res {
            self.finish(id, Err(e));
        }
    }

    /// Queue a standalone wait until `deadline`; `io` follows its CQE.
    fn push_held(&mut self, id: SlotId, io: IoSqe, deadline: u64) -> Result<(), UringError> {
        let full = self
            .ring
            .push_wait(id, deadline)
            .map_err(|source| UringError::Ring {
                what: "io_uring_enter (SQ full)",
                source,
            })?;
        self.counters.sq_full += full;
        let r = self.req(id);
        r.wait_in_flight = true;
        r.held_io = Some(io);
        Ok(())
    }

    /// The standalone wait in front of `io` completed with `res`.
    fn on_held_wait(&mut self, id: SlotId, io: IoSqe, res: i32) -> Result<(), UringError> {
        let r = self.req(id);
        if r.phase == Phase::Done {
            return Ok(());
        }
        if r.cancel_requested || res == -libc::ECANCELED {
            return Err(UringError::Cancelled);
        }
        // An expired timeout answers -ETIME; anything else means the wait
        // did not happen and the IO must not run early.
        if res != -libc::ETIME && res != 0 {
            return Err(timeout_failed(-res));
        }
        self.push_io(id, io, None)
    }

    /// The timeout heading a linked chain completed with `res`. An expiry
    /// (`-ETIME`, or 0) continues the chain. Any other answer when we asked
    /// for no cancel means the wait failed and the kernel fails the linked
    /// IO with `-ECANCELED`: the request reports the timeout's error, not a
    /// cancellation.
    fn on_linked_wait(&mut self, id: SlotId, res: i32) -> Result<(), UringError> {
        let r = self.req(id);
        if r.phase == Phase::Done {
            return Ok(());
        }
        if res != -libc::ETIME && res != 0 && !r.cancel_requested {
            r.link_wait_errno = Some(-res);
            if r.link_io_cancelled {
                return Err(timeout_failed(-res));
            }
        } else if r.link_io_cancelled {
            return Err(UringError::Cancelled);
        }
        Ok(())
    }

    /// Whether the only thing `id` waits for now is a throttle timeout (a
    /// pre-IO wait queued standalone, or a page-cache charge's wait after
    /// the IO): no IO of it is queued or in flight.
    pub(crate) fn waiting_on_timeout(&self, id: SlotId) -> bool {
        self.ring.data(id).is_some_and(|r| {
            r.phase != Phase::Done
                && r.staged.is_none()
                && !r.io_in_flight
                && (r.wait_in_flight || r.post_in_flight)
        })
    }

    /// Charge `n` page-cache bytes now; returns the resulting delay.
    fn charge_page_cache(&mut self, id: SlotId, n: u64) -> Result<u64, UringError> {
        self.counters.page_cache_hits += 1;
        self.counters.page_cache_bytes += n;
        let (throttle, max_block) = {
            let r = self.req(id);
            (r.throttle.clone(), r.max_block)
        };
        match throttle {
            Some(t) if n > 0 => Ok(t.reserve(n, max_block, 0, true)?.delay_ns),
            _ => Ok(0),
        }
    }

    /// Complete now, or after a standalone wait for a page-cache charge.
    fn complete_after(&mut self, id: SlotId, delay_ns: u64) -> Result<(), UringError> {
        match self.book_wait(id, delay_ns) {
            None => {
                let done = self.req(id).done;
                self.finish(id, Ok(done));
                Ok(())
            }
            Some(deadline) => {
                self.req(id).phase = Phase::PostWait;
                let full =
                    self.ring
                        .push_post_wait(id, deadline)
                        .map_err(|source| UringError::Ring {
                            what: "io_uring_enter (SQ full)",
                            source,
                        })?;
                self.counters.sq_full += full;
                self.req(id).post_in_flight = true;
                Ok(())
            }
        }
    }

    fn finish(&mut self, id: SlotId, result: Result<usize, UringError>) {
        let Some(r) = self.ring.data_mut(id) else {
            return;
        };
        if r.phase == Phase::Done {
            return;
        }
        r.phase = Phase::Done;
        r.staged = None;
        r.held_io = None;
        // A request nobody will collect ended as a cancellation, whatever
        // the kernel managed to do before the cancel reached it.
        let result = if r.orphan {
            Err(UringError::Cancelled)
        } else {
            result
        };
        if r.probe_bytes > 0 {
            self.probe_bytes -= r.probe_bytes;
            r.probe_bytes = 0;
        }
        match &result {
            Ok(n) if r.write => {
                self.counters.writes += 1;
                self.counters.write_bytes += *n as u64;
            }
            Ok(n) => {
                self.counters.reads += 1;
                self.counters.read_bytes += *n as u64;
            }
            Err(UringError::Cancelled) => self.counters.cancellations += 1,
            Err(_) => {}
        }
        r.result = Some(result);
        if let Some(w) = r.waker.take() {
            w.wake();
        }
        if r.orphan {
            self.release_if_quiet(id);
        } else {
            self.completed.push_back(id);
        }
    }

    fn release_if_quiet(&mut self, id: SlotId) {
        let done = self.ring.data(id).is_some_and(|r| r.phase == Phase::Done);
        if done && self.ring.outstanding(id) == 0 {
            // Dropping the buffer here is the only place an orphan's memory is freed.
            let _ = self.ring.take(id);
        }
    }

    /// Ask the kernel to cancel the request. Its buffer stays with the ring
    /// until the last CQE of its chain arrives.
    pub(crate) fn cancel(&mut self, id: SlotId, orphan: bool) {
        let Some(r) = self.ring.data_mut(id) else {
            return;
        };
        if orphan {
            r.orphan = true;
            r.waker = None;
        }
        if r.phase == Phase::Done {
            if orphan {
                self.completed.retain(|&c| c != id);
                self.release_if_quiet(id);
            }
            return;
        }
        if r.cancel_requested {
            return;
        }
        r.cancel_requested = true;
        if r.staged.take().is_some() {
            // Nothing of it reached the ring.
            self.finish(id, Err(UringError::Cancelled));
            return;
        }
        let mut tags = Vec::with_capacity(3);
        if r.wait_in_flight {
            tags.push(Tag::Wait);
        }
        if r.io_in_flight {
            tags.push(Tag::Io);
        }
        if r.post_in_flight {
            tags.push(Tag::PostWait);
        }
        if let Err(source) = self.ring.push_cancel(id, &tags) {
            // The chain still completes on its own; only the hurry is lost.
            let _ = source;
        }
    }

    /// Submit what is queued; wait for one completion if `wait` and anything
    /// is owed; reap and advance every request.
    pub(crate) fn turn(&mut self, wait: bool) -> Result<(), UringError> {
        let want = u32::from(wait && self.ring.total_outstanding() > 0);
        match self.ring.enter(want) {
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
            self.turn(false)?;
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
        let r = self.req(id);
        match c.tag {
            Tag::Cancel => {}
            Tag::Wait => {
                r.wait_in_flight = false;
                let res = match r.held_io.take() {
                    Some(io) => self.on_held_wait(id, io, c.res),
                    None => self.on_linked_wait(id, c.res),
                };
                if let Err(e) = res {
                    self.finish(id, Err(e));
                }
            }
            Tag::PostWait => {
                r.post_in_flight = false;
                if r.phase == Phase::PostWait {
                    let res = if r.cancel_requested {
                        Err(UringError::Cancelled)
                    } else {
                        Ok(r.done)
                    };
                    self.finish(id, res);
                }
            }
            Tag::Io => {
                r.io_in_flight = false;
                if let Err(e) = self.on_io(id, c.res) {
                    self.finish(id, Err(e));
                }
            }
        }
        if self.ring.data(id).is_some_and(|r| r.orphan) {
            self.release_if_quiet(id);
        } else if self.ring.outstanding(id) == 0 {
            // A finished request becomes collectable only at the last CQE of
            // its chain (which may come after the one that finished it).
            if let Some(r) = self.ring.data_mut(id)
                && r.phase == Phase::Done
                && let Some(w) = r.waker.take()
            {
                w.wake();
            }
        }
    }

    fn on_io(&mut self, id: SlotId, res: i32) -> Result<(), UringError> {
        let r = self.req(id);
        let phase = r.phase;
        if phase == Phase::Done {
            return Ok(());
        }
        if res == -libc::ECANCELED {
            if let Some(errno) = r.link_wait_errno {
                return Err(timeout_failed(errno));
            }
            if !r.cancel_requested && r.wait_in_flight {
                // Linked behind a wait whose CQE is still to come (only a
                // linked wait is in flight together with its IO): whether
                // the wait failed decides the outcome (`on_linked_wait`).
                r.link_io_cancelled = true;
                return Ok(());
            }
            return Err(UringError::Cancelled);
        }
        if phase == Phase::Probe {
            let pb = std::mem::take(&mut r.probe_bytes);
            self.probe_bytes -= pb;
        }
        let cancel = self.req(id).cancel_requested;
        let resubmit = res == -libc::EINTR || (res == -libc::EAGAIN && phase != Phase::Probe);
        if resubmit {
            if cancel {
                return Err(UringError::Cancelled);
            }
            self.counters.resubmits += 1;
            let io = self.req(id).last_io.expect("an IO completed");
            if phase == Phase::Probe {
                self.req(id).probe_bytes = u64::from(io.len);
                self.probe_bytes += u64::from(io.len);
            }
            return self.push_io(id, io, None);
        }
        if phase == Phase::Probe {
            return self.on_probe(id, res);
        }
        let r = self.req(id);
        if res < 0 {
            let io = r.last_io.expect("an IO completed");
            return Err(UringError::Io {
                op: if r.write { "write" } else { "read" },
                offset: io.offset,
                len: u64::from(io.len),
                source: io::Error::from_raw_os_error(-res),
            });
        }
        let n = res as usize;
        if n == 0 {
            if r.write {
                return Err(UringError::Io {
                    op: "write",
                    offset: r.offset + r.done as u64,
                    len: (r.len - r.done) as u64,
                    source: io::Error::from(io::ErrorKind::WriteZero),
                });
            }
            // EOF.
            return self.io_done(id);
        }
        r.done += n;
        if r.write {
            r.file.grow_to(r.offset + r.done as u64);
        }
        if r.done < r.len {
            if cancel {
                return Err(UringError::Cancelled);
            }
            self.counters.short_reads += 1;
            let io = self.req(id).next_io();
            return self.push_io(id, io, None);
        }
        self.io_done(id)
    }

    fn io_done(&mut self, id: SlotId) -> Result<(), UringError> {
        let r = self.req(id);
        if r.hit_known {
            let n = r.done as u64;
            let d = self.charge_page_cache(id, n)?;
            return self.complete_after(id, d);
        }
        let done = r.done;
        self.finish(id, Ok(done));
        Ok(())
    }

    fn on_probe(&mut self, id: SlotId, res: i32) -> Result<(), UringError> {
        let cancel = self.req(id).cancel_requested;
        if res == -libc::EAGAIN {
            self.counters.nowait_misses += 1;
            if cancel {
                return Err(UringError::Cancelled);
            }
            return self.charge_then_io(id, 0);
        }
        if res == -libc::EOPNOTSUPP {
            let file = self.req(id).file.clone();
            let memory = self.ring.sys().fs_is_memory(file.fd()).unwrap_or(false);
            file.set_nowait_mode(if memory {
                NowaitMode::Memory
            } else {
                NowaitMode::Unsupported
            });
            if cancel {
                return Err(UringError::Cancelled);
            }
            return if memory {
                self.known_hit_io(id)
            } else {
                self.charge_then_io(id, 0)
            };
        }
        let r = self.req(id);
        if res < 0 {
            let io = r.last_io.expect("a probe completed");
            return Err(UringError::Io {
                op: "read",
                offset: io.offset,
                len: u64::from(io.len),
                source: io::Error::from_raw_os_error(-res),
            });
        }
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
        if done == len || cancel {
            if cancel {
                return Err(UringError::Cancelled);
            }
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

    /// Whether the request finished.
    pub(crate) fn is_done(&self, id: SlotId) -> bool {
        self.ring.data(id).is_some_and(|r| r.phase == Phase::Done)
    }

    /// Set the waker woken when the request finishes.
    pub(crate) fn set_waker(&mut self, id: SlotId, w: &Waker) {
        if let Some(r) = self.ring.data_mut(id)
            && !r.waker.as_ref().is_some_and(|x| x.will_wake(w))
        {
            r.waker = Some(w.clone());
        }
    }

    /// Wake every waiting request (to hand over the eventfd registration).
    pub(crate) fn wake_one_waiting(&mut self, except: SlotId) {
        for id in self.ring.live() {
            if id == except {
                continue;
            }
            if let Some(r) = self.ring.data_mut(id)
                && r.phase != Phase::Done
                && !r.orphan
                && let Some(w) = r.waker.take()
            {
                w.wake();
                return;
            }
        }
    }

    /// Collect a finished request whose chain is quiet: the result, the buffer
    /// and the last booked deadline. `None` if not yet collectable.
    pub(crate) fn take(&mut self, id: SlotId) -> Option<Taken> {
        if !self.is_done(id) || self.ring.outstanding(id) > 0 {
            return None;
        }
        let (buf, req) = self.ring.take(id)?;
        self.completed.retain(|&c| c != id);
        let result = req.result.unwrap_or(Err(UringError::Cancelled));
        Some((result, buf, req.deadline_ns))
    }

    /// One line per live request (diagnostics).
    pub(crate) fn dump(&self) -> String {
        let mut out = String::new();
        for id in self.ring.live() {
            let r = self.ring.data(id).unwrap();
            out += &format!(
                "{:?} phase={:?} orphan={} cancel={} waker={} io={} wait={} post={} staged={} held={} outst={} done={}/{}\n",
                id,
                r.phase,
                r.orphan,
                r.cancel_requested,
                r.waker.is_some(),
                r.io_in_flight,
                r.wait_in_flight,
                r.post_in_flight,
                r.staged.is_some(),
                r.held_io.is_some(),
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
            Some(r) if r.orphan => Some("abandoned"),
            Some(_) => None,
        }
    }
}

impl Req {
    fn next_io(&self) -> IoSqe {
        IoSqe {
            fd: self.file.fd(),
            write: self.write,
            start: self.done,
            len: (self.len - self.done) as u32,
            offset: self.offset + self.done as u64,
            nowait: false,
        }
    }
}

/// A throttle timeout that neither expired nor was cancelled by us.
fn timeout_failed(errno: i32) -> UringError {
    UringError::Ring {
        what: "throttle timeout",
        source: io::Error::from_raw_os_error(errno),
    }
}

/// Pages of `[off, off + len)`.
fn pages_spanned(off: u64, len: u64) -> u64 {
    const PAGE: u64 = 4096;
    if len == 0 {
        return 0;
    }
    (off + len).div_ceil(PAGE) - off / PAGE
}
