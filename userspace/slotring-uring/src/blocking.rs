//! The blocking front end ([`UringEngine`]), the `pread` fallback
//! ([`PreadEngine`]) and the trait they share ([`IoEngine`]).
//!
//! # CPU leases
//!
//! A thread that holds a CPU slot parks its lease
//! ([`park_current_lease`]) exactly while it waits on a throttle timeout,
//! and never while the kernel moves data for it (ClickHouse parks around
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
//! timeout anyway and is parked the same way. IO without a throttle delay
//! (page-cache hits, NOWAIT probes and misses, unthrottled reads and
//! writes) parks nothing. The ticket API ([`UringEngine::submit_read`],
//! [`UringEngine::wait`], [`UringEngine::wait_any`]) never parks and keeps
//! every wait linked; the tokio [`crate::AsyncEngine`] parks nothing either
//! (a task holds no thread).

use std::sync::Arc;
use std::time::Duration;

use slotring_throttle::{
    LeaseParked, NANO_PER_TOKEN, ThrottlePtr, park_current_lease, sleep_abs_monotonic,
};

use crate::core::{Core, Policy, Submit};
use crate::counters::UringCounters;
use crate::error::{BufResult, UringError};
use crate::file::{NowaitMode, UringFile};
use crate::sys::{RealSyscalls, SetupParams, SlotId, Syscalls};

/// Ring size, setup flags and policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    /// SQ entries (a power of two is used by the kernel).
    pub entries: u32,
    /// CQ entries (0 = twice `entries`).
    pub cq_entries: u32,
    /// `IORING_SETUP_SQPOLL` with this idle time (ms). A loss on 2 vCPUs.
    pub sqpoll_idle_ms: Option<u32>,
    /// `IORING_SETUP_COOP_TASKRUN`.
    pub coop_taskrun: bool,
    /// `IORING_SETUP_SINGLE_ISSUER` (then only the creating thread may submit).
    pub single_issuer: bool,
    /// `IORING_SETUP_DEFER_TASKRUN` (needs `single_issuer`; blocking front end only).
    pub defer_taskrun: bool,
    /// Detection and guard switches.
    pub policy: Policy,
}

impl Default for RingConfig {
    fn default() -> Self {
        Self {
            entries: 256,
            cq_entries: 0,
            sqpoll_idle_ms: None,
            coop_taskrun: false,
            single_issuer: false,
            defer_taskrun: false,
            policy: Policy::default(),
        }
    }
}

impl RingConfig {
    pub(crate) fn setup(&self) -> Result<SetupParams, UringError> {
        if self.entries == 0 || self.entries > 32_768 {
            return Err(UringError::Invalid {
                what: "ring entries",
                value: u64::from(self.entries),
            });
        }
        if self.defer_taskrun && !self.single_issuer {
            return Err(UringError::InvalidFlags {
                what: "defer_taskrun without single_issuer",
                flags: format!(
                    "defer_taskrun={} single_issuer={}",
                    self.defer_taskrun, self.single_issuer
                ),
            });
        }
        Ok(SetupParams {
            entries: self.entries,
            cq_entries: self.cq_entries,
            sqpoll_idle_ms: self.sqpoll_idle_ms,
            coop_taskrun: self.coop_taskrun,
            single_issuer: self.single_issuer,
            defer_taskrun: self.defer_taskrun,
        })
    }
}

/// Throttled positional IO, blocking style. Both engines implement it, so a
/// caller never has to special-case a kernel without io_uring.
pub trait IoEngine: Send {
    /// Read up to `buf.len()` bytes at `offset` into `buf`, charged to
    /// `throttle` (each level waits at most `max_block`). Returns the bytes
    /// read (fewer only at EOF) and the buffer.
    fn read_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> BufResult<usize, Vec<u8>>;

    /// Write all of `buf` at `offset`, charged to `throttle`.
    fn write_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> BufResult<usize, Vec<u8>>;

    /// A snapshot of the counters.
    fn counters(&self) -> UringCounters;

    /// `"io_uring"` or `"pread"`.
    fn kind(&self) -> &'static str;
}

/// The io_uring engine if the kernel lets us have one; otherwise the `pread`
/// engine and the reason io_uring could not be used.
pub fn open_engine(cfg: &RingConfig) -> (Box<dyn IoEngine>, Option<UringError>) {
    open_engine_with(cfg, &|| Box::new(RealSyscalls))
}

/// [`open_engine`] with every syscall of either engine going through a seam
/// made by `sys`.
pub fn open_engine_with(
    cfg: &RingConfig,
    sys: &dyn Fn() -> Box<dyn Syscalls>,
) -> (Box<dyn IoEngine>, Option<UringError>) {
    match UringEngine::with_syscalls(cfg, sys()) {
        Ok(e) => (Box::new(e), None),
        Err(err) => (
            Box::new(PreadEngine::with_syscalls(cfg.policy, sys())),
            Some(err),
        ),
    }
}

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
/// lease is parked exactly while it waits on a throttle timeout (see the
/// module docs).
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
    core: Core,
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
        Self::with_syscalls(cfg, Box::new(RealSyscalls))
    }

    /// A ring whose every syscall goes through `sys` (fault injection).
    pub fn with_syscalls(cfg: &RingConfig, sys: Box<dyn Syscalls>) -> Result<Self, UringError> {
        Ok(Self {
            core: Core::new(sys, &cfg.setup()?, cfg.policy)?,
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
        let s = Submit::new(false, file, offset, throttle, max_block, false);
        Ticket(self.core.submit(s, buf))
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
        let s = Submit::new(true, file, offset, throttle, max_block, false);
        Ticket(self.core.submit(s, buf))
    }

    /// Submit queued SQEs without waiting and advance what completed.
    pub fn submit_pending(&mut self) -> Result<(), UringError> {
        self.core.turn(false)
    }

    /// Wait for `t` to finish and collect it.
    ///
    /// Fails with [`UringError::Ticket`] if `t` was abandoned (nobody may
    /// collect it: the engine frees it at its last CQE) or is not live
    /// (already collected, e.g. by [`UringEngine::wait_any`]).
    pub fn wait(&mut self, t: Ticket) -> Result<Completion, UringError> {
        loop {
            // Checked on every round: an abandoned request is released by
            // the reap inside `turn`, after which nothing is owed and
            // `turn(true)` would no longer block.
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
            self.core.turn(true)?;
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
            self.core.turn(true)?;
        }
    }

    /// Collect a finished request without blocking.
    pub fn poll_any(&mut self) -> Result<Option<Completion>, UringError> {
        if let Some(c) = self.try_collect() {
            return Ok(Some(c));
        }
        self.core.turn(false)?;
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
        self.core.cancel(t.0, false);
    }

    /// Cancel `t` and forget it: its buffer is freed by the engine once the
    /// last CQE of its chain arrives (what dropping an async future does).
    pub fn abandon(&mut self, t: Ticket) {
        self.core.cancel(t.0, true);
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
                self.core.release_staged(t.0, lease.is_none());
            } else if self.core.waiting_on_timeout(t.0) {
                if lease.is_none() {
                    lease = self.park_for_wait();
                }
            } else {
                // The IO is queued or in flight: take the lease back before
                // the kernel copies anything on this thread.
                lease = None;
            }
            if let Err(e) = self.core.turn(true) {
                break Err(e);
            }
        };
        drop(lease);
        match outcome {
            Ok((result, buf)) => (result, buf),
            Err(e) => {
                // The ring failed: the buffer stays with the engine (the
                // kernel may still write it) and is freed at the request's
                // last CQE, or when the engine drops; it is never handed out.
                self.core.cancel(t.0, true);
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
        let s = Submit::new(false, file, offset, throttle, max_block, true);
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
        let s = Submit::new(true, file, offset, throttle, max_block, true);
        self.run_one(s, buf)
    }

    fn counters(&self) -> UringCounters {
        self.core.counters()
    }

    fn kind(&self) -> &'static str {
        "io_uring"
    }
}

/// The fallback engine: `preadv2(RWF_NOWAIT)` then `pread` (ClickHouse's
/// method), charging after the read and sleeping with the CPU lease parked.
pub struct PreadEngine {
    sys: Box<dyn Syscalls>,
    policy: Policy,
    counters: UringCounters,
}

impl std::fmt::Debug for PreadEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreadEngine")
            .field("policy", &self.policy)
            .finish()
    }
}

impl PreadEngine {
    /// On the real kernel.
    pub fn new(policy: Policy) -> Self {
        Self::with_syscalls(policy, Box::new(RealSyscalls))
    }

    /// Every syscall through `sys`.
    pub fn with_syscalls(policy: Policy, sys: Box<dyn Syscalls>) -> Self {
        Self {
            sys,
            policy,
            counters: UringCounters::default(),
        }
    }

    fn guard_engaged(throttle: &ThrottlePtr, len: usize) -> bool {
        let need = len as i128 * NANO_PER_TOKEN;
        let mut engaged = false;
        throttle.visit(&mut |th| {
            if th.limits_block_device_bandwidth() && th.max_speed() > 0 && th.tokens_nano() < need {
                engaged = true;
            }
        });
        engaged
    }

    /// Read `buf[from..]` at `offset + from` without NOWAIT until full or EOF.
    fn read_rest(
        &mut self,
        fd: i32,
        buf: &mut [u8],
        mut done: usize,
        offset: u64,
    ) -> Result<usize, UringError> {
        while done < buf.len() {
            match self
                .sys
                .preadv2(fd, &mut buf[done..], offset + done as u64, 0)
            {
                Ok(0) => break,
                Ok(n) => {
                    done += n;
                    if done < buf.len() {
                        self.counters.short_reads += 1;
                    }
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) => {
                    self.counters.resubmits += 1;
                }
                Err(source) => {
                    return Err(UringError::Io {
                        op: "read",
                        offset: offset + done as u64,
                        len: (buf.len() - done) as u64,
                        source,
                    });
                }
            }
        }
        Ok(done)
    }

    fn read_inner(
        &mut self,
        file: &Arc<UringFile>,
        buf: &mut [u8],
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> Result<usize, UringError> {
        let fd = file.fd();
        let len = buf.len();
        if len == 0 {
            return Ok(0);
        }
        let cares = self.policy.detect_page_cache
            && !file.is_direct()
            && throttle.is_some_and(|t| t.ignores_page_cache_reads());
        let mut from_cache = 0usize;
        let mut all_cached = false;
        if cares {
            match file.nowait_mode() {
                NowaitMode::Memory => all_cached = true,
                NowaitMode::Unsupported => {}
                NowaitMode::Probe => {
                    let t = throttle.expect("cares implies a throttle");
                    if self.policy.disk_rate_guard && Self::guard_engaged(t, len) {
                        self.counters.cachestat_checks += 1;
                        all_cached = self.sys.cachestat(fd, offset, len as u64).is_ok_and(|st| {
                            st.nr_cache >= (offset + len as u64).div_ceil(4096) - offset / 4096
                        });
                    } else {
                        loop {
                            match self.sys.preadv2(fd, buf, offset, libc::RWF_NOWAIT) {
                                Ok(n) => {
                                    from_cache = n;
                                    if n > 0 && n < len {
                                        self.counters.nowait_misses += 1;
                                    }
                                    break;
                                }
                                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                                    self.counters.nowait_misses += 1;
                                    break;
                                }
                                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                                    self.counters.resubmits += 1;
                                }
                                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                                    let mem = self.sys.fs_is_memory(fd).unwrap_or(false);
                                    file.set_nowait_mode(if mem {
                                        NowaitMode::Memory
                                    } else {
                                        NowaitMode::Unsupported
                                    });
                                    all_cached = mem;
                                    break;
                                }
                                Err(source) => {
                                    return Err(UringError::Io {
                                        op: "read",
                                        offset,
                                        len: len as u64,
                                        source,
                                    });
                                }
                            }
                        }
                        if from_cache == 0 && file.size_hint() <= offset {
                            // EAGAIN on an empty range may just be EOF.
                            all_cached = false;
                        }
                    }
                }
            }
        }
        let done = self.read_rest(fd, buf, from_cache, offset)?;
        let (pc, disk) = if all_cached {
            (done, 0)
        } else {
            (from_cache, done - from_cache)
        };
        if pc > 0 {
            self.counters.page_cache_hits += 1;
            self.counters.page_cache_bytes += pc as u64;
        }
        self.charge(throttle, max_block, pc as u64, disk as u64)?;
        self.counters.reads += 1;
        self.counters.read_bytes += done as u64;
        Ok(done)
    }

    fn charge(
        &mut self,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
        pc: u64,
        disk: u64,
    ) -> Result<(), UringError> {
        let Some(t) = throttle else { return Ok(()) };
        let mut delay = 0;
        if pc > 0 {
            delay = t.reserve(pc, max_block, 0, true)?.delay_ns;
        }
        if disk > 0 {
            delay = t.reserve(disk, max_block, delay, false)?.delay_ns;
        }
        if delay > 0 {
            self.counters.waits_submitted += 1;
            self.counters.wait_us += delay / 1_000;
            let _lease = park_current_lease();
            sleep_abs_monotonic(delay).map_err(|e| UringError::Ring {
                what: "clock_nanosleep",
                source: std::io::Error::from(e),
            })?;
        }
        Ok(())
    }
}

impl IoEngine for PreadEngine {
    fn read_at(
        &mut self,
        file: &Arc<UringFile>,
        mut buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> BufResult<usize, Vec<u8>> {
        let r = self.read_inner(file, &mut buf, offset, throttle, max_block);
        (r, buf)
    }

    fn write_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> BufResult<usize, Vec<u8>> {
        let mut done = 0;
        while done < buf.len() {
            match self
                .sys
                .pwrite(file.fd(), &buf[done..], offset + done as u64)
            {
                Ok(0) => {
                    let e = UringError::Io {
                        op: "write",
                        offset: offset + done as u64,
                        len: (buf.len() - done) as u64,
                        source: std::io::Error::from(std::io::ErrorKind::WriteZero),
                    };
                    return (Err(e), buf);
                }
                Ok(n) => {
                    done += n;
                    if done < buf.len() {
                        self.counters.short_reads += 1;
                    }
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) => {
                    self.counters.resubmits += 1;
                }
                Err(source) => {
                    let e = UringError::Io {
                        op: "write",
                        offset: offset + done as u64,
                        len: (buf.len() - done) as u64,
                        source,
                    };
                    return (Err(e), buf);
                }
            }
        }
        file.grow_to(offset + done as u64);
        if let Err(e) = self.charge(throttle, max_block, 0, done as u64) {
            return (Err(e), buf);
        }
        self.counters.writes += 1;
        self.counters.write_bytes += done as u64;
        (Ok(done), buf)
    }

    fn counters(&self) -> UringCounters {
        self.counters
    }

    fn kind(&self) -> &'static str {
        "pread"
    }
}
