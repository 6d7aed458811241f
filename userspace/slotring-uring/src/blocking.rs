//! The blocking front end ([`UringEngine`]), the `pread` fallback
//! ([`PreadEngine`]) and the trait they share ([`IoEngine`]).

use std::sync::Arc;
use std::time::Duration;

use slotring_throttle::{NANO_PER_TOKEN, ThrottlePtr, park_current_lease, sleep_abs_monotonic};

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
            return Err(UringError::Invalid {
                what: "defer_taskrun without single_issuer",
                value: 1,
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
/// costs a timeout SQE, not a thread.
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
        let s = Submit {
            write: false,
            file: file.clone(),
            offset,
            throttle: throttle.cloned(),
            max_block,
        };
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
        let s = Submit {
            write: true,
            file: file.clone(),
            offset,
            throttle: throttle.cloned(),
            max_block,
        };
        Ticket(self.core.submit(s, buf))
    }

    /// Submit queued SQEs without waiting and advance what completed.
    pub fn submit_pending(&mut self) -> Result<(), UringError> {
        self.core.turn(false)
    }

    /// Wait for `t` to finish and collect it.
    pub fn wait(&mut self, t: Ticket) -> Result<Completion, UringError> {
        if !self.core.is_live(t.0) {
            return Err(UringError::Invalid {
                what: "ticket",
                value: u64::from(t.0.index),
            });
        }
        loop {
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

    fn run(&mut self, t: Ticket, throttled: bool) -> BufResult<usize, Vec<u8>> {
        // The CPU lease is parked from submission to completion of a
        // throttled request: the thread waits in the kernel, not on a CPU.
        let _lease = throttled.then(park_current_lease);
        match self.wait(t) {
            Ok(c) => (c.result, c.buf),
            // The ring failed: the buffer stays with the engine (it may still
            // be written by the kernel) and is freed when the engine drops.
            Err(e) => (Err(e), Vec::new()),
        }
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
        let t = self.submit_read(file, buf, offset, throttle, max_block);
        self.run(t, throttle.is_some())
    }

    fn write_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> BufResult<usize, Vec<u8>> {
        let t = self.submit_write(file, buf, offset, throttle, max_block);
        self.run(t, throttle.is_some())
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
