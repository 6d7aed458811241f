//! [`ThreadIo`]: IO that a thread does itself, in blocking syscalls
//! through the seam — every request of the `pread` engine
//! ([`crate::PreadEngine`]: ClickHouse's method, `preadv2(RWF_NOWAIT)`, then
//! `pread` for the rest, charging after the read with the policy of
//! `policy.rs` and sleeping with the CPU lease parked), and the paced writes
//! that a thread of the ring's engines does itself.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Wake, Waker};
use std::time::Duration;

use slotring_throttle::{
    InFlightHold, Source, ThrottlePtr, park_current_lease, sleep_abs_monotonic,
};

use crate::counters::UringCounters;
use crate::engine::CANCEL_POLL;
use crate::error::UringError;
use crate::file::UringFile;
use crate::policy::{self, Charge, Op, Policy, WRITEBACK_PIECE};
use crate::route::Plan;
use crate::sys::{Syscalls, monotonic_now_ns};
use crate::writeback_cap::CapHold;

/// Wakes a thread parked for room under a writeback cap.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Where the bytes of a read came from, as far as detection could tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    /// The first `n` bytes from the page cache (a NOWAIT read), the rest
    /// from the device.
    CachedPrefix(usize),
    /// All of it from memory (a memory filesystem, or a fully cached range
    /// per `cachestat(2)`).
    Memory,
}

/// IO that the calling thread does itself, in blocking syscalls through
/// the seam: every request of a [`PreadEngine`](crate::PreadEngine), the paced writes of
/// the ring's blocking front end ([`crate::UringEngine`]), whose caller
/// waits anyway (a paced piece on the ring costs an io-wq worker's sleeps
/// and wake-ups: ext4's buffered write has no async path, and
/// `IORING_OP_SYNC_FILE_RANGE` always runs on io-wq), and, on tokio's
/// blocking pool, the paced writes of [`crate::SharedEngine`] and every
/// request of its fallback.
pub(crate) struct ThreadIo<'a> {
    pub(crate) sys: &'a mut dyn Syscalls,
    pub(crate) policy: Policy,
    pub(crate) counters: &'a mut UringCounters,
    /// Set when nobody waits for the request any more (the async front
    /// end's future was dropped, or the flag of
    /// [`IoEngine::cancel_paced_writes_on`](crate::IoEngine::cancel_paced_writes_on)
    /// was set): a paced write books no further piece, and its waits look
    /// at it every [`CANCEL_POLL`]. Read with `Relaxed`: it carries no
    /// data, and a late look costs at most one slice of a wait.
    pub(crate) cancel: Option<&'a AtomicBool>,
}

impl ThreadIo<'_> {
    /// Move the rest of a `len`-byte `op` at `offset`, from `done` on:
    /// `call(sys, done)` makes one `preadv2`/`pwrite` of what remains. Stops
    /// when all is moved or, reading, at EOF; retries `EINTR`/`EAGAIN`.
    fn transfer(
        &mut self,
        op: Op,
        offset: u64,
        len: usize,
        mut done: usize,
        mut call: impl FnMut(&mut dyn Syscalls, usize) -> io::Result<usize>,
    ) -> Result<usize, UringError> {
        while done < len {
            let failed = |source| UringError::Io {
                op,
                offset: offset + done as u64,
                len: (len - done) as u64,
                source,
            };
            match call(&mut *self.sys, done) {
                Ok(0) if op == Op::Read => break,
                Ok(0) => return Err(failed(io::Error::from(io::ErrorKind::WriteZero))),
                Ok(n) => {
                    done += n;
                    if done < len {
                        self.counters.short_reads += 1;
                    }
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) => {
                    self.counters.resubmits += 1;
                }
                Err(source) => return Err(failed(source)),
            }
        }
        Ok(done)
    }

    /// One `RWF_NOWAIT` read of `buf` at `offset` (ClickHouse's probe).
    fn probe(
        &mut self,
        file: &UringFile,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<Served, UringError> {
        let fd = file.fd();
        let len = buf.len();
        loop {
            match self.sys.preadv2(fd, buf, offset, libc::RWF_NOWAIT) {
                Ok(n) => {
                    if n > 0 && n < len {
                        self.counters.nowait_misses += 1;
                    }
                    return Ok(Served::CachedPrefix(n));
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    self.counters.nowait_misses += 1;
                    return Ok(Served::CachedPrefix(0));
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    self.counters.resubmits += 1;
                }
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    let mode = policy::after_nowait_unsupported(self.sys.fs_is_memory(fd));
                    file.set_nowait_mode(mode);
                    return Ok(match Charge::from(mode) {
                        Charge::PageCache => Served::Memory,
                        Charge::Device | Charge::Probe => Served::CachedPrefix(0),
                    });
                }
                Err(source) => {
                    return Err(UringError::Io {
                        op: Op::Read,
                        offset,
                        len: len as u64,
                        source,
                    });
                }
            }
        }
    }

    /// Read up to `buf.len()` bytes at `offset`, charged after the read as
    /// `plan` says (a probe settled by `cachestat` for a throttle that
    /// takes turns or under the disk-rate guard, else by a `RWF_NOWAIT`
    /// read); the bytes read (fewer only at EOF).
    pub(crate) fn read(
        &mut self,
        plan: Plan,
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
        let served = match plan.charge {
            Charge::Device => Served::CachedPrefix(0),
            Charge::PageCache => Served::Memory,
            Charge::Probe
                if policy::routed_by_cachestat(throttle)
                    || self.policy.guard_engaged(throttle, len as u64) =>
            {
                self.counters.cachestat_checks += 1;
                // Only the bytes before EOF can be cached: `cachestat`
                // counts no page past it.
                let span = file.before_eof(self.sys, offset, len as u64);
                let stat = self.sys.cachestat(fd, offset, span);
                match policy::cachestat_charge(stat, offset, span) {
                    Charge::PageCache => Served::Memory,
                    Charge::Device | Charge::Probe => Served::CachedPrefix(0),
                }
            }
            Charge::Probe => match self.probe(file, buf, offset)? {
                // At or past the known end (where even a memory file
                // answers nothing), nothing is charged as page cache.
                Served::Memory if file.size_hint() <= offset => Served::CachedPrefix(0),
                served => served,
            },
        };
        let from_cache = match served {
            Served::CachedPrefix(n) => n,
            Served::Memory => 0,
        };
        // A throttle whose turn may wait for completions (a workload) is
        // charged the rest before it is read, and holds its places over
        // the read; bytes it was charged past the end go back.
        let turn =
            throttle.filter(|t| t.takes_turns() && matches!(served, Served::CachedPrefix(_)));
        let ahead = match turn {
            Some(_) => ((len - from_cache) as u64)
                .min(file.size_hint().saturating_sub(offset + from_cache as u64)),
            None => 0,
        };
        let hold = if ahead > 0 {
            let (delay, hold) = policy::book_held(turn, ahead, Source::Device, max_block, 0)?;
            self.sleep(delay)?;
            hold
        } else {
            InFlightHold::none()
        };
        // The rest without NOWAIT, until full or EOF.
        let done = self.transfer(Op::Read, offset, len, from_cache, |sys, done| {
            sys.preadv2(fd, &mut buf[done..], offset + done as u64, 0)
        })?;
        hold.release();
        let (pc, mut disk) = match served {
            Served::Memory => (done, 0),
            Served::CachedPrefix(n) => (n, done - n),
        };
        if let Some(t) = turn {
            t.refund_page_cache_read(ahead.saturating_sub(disk as u64));
            disk = 0;
        }
        if pc > 0 {
            self.counters.page_cache_hits += 1;
            self.counters.page_cache_bytes += pc as u64;
        }
        self.charge(throttle, max_block, pc as u64, disk as u64)?;
        self.counters.reads += 1;
        self.counters.read_bytes += done as u64;
        Ok(done)
    }

    /// Book `pc` page-cache bytes, then `disk` device bytes after them, and
    /// sleep the total delay with the CPU lease parked.
    fn charge(
        &mut self,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
        pc: u64,
        disk: u64,
    ) -> Result<(), UringError> {
        let (delay, _) = Self::book(throttle, max_block, pc, disk)?;
        self.sleep(delay)
    }

    /// Book `pc` page-cache bytes, then `disk` device bytes after them; the
    /// total delay (ns) and the in-flight places the device bytes hold.
    fn book(
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
        pc: u64,
        disk: u64,
    ) -> Result<(u64, InFlightHold), UringError> {
        let delay = policy::book(throttle, pc, Source::PageCache, max_block, 0)?;
        Ok(policy::book_held(
            throttle,
            disk,
            Source::Device,
            max_block,
            delay,
        )?)
    }

    /// Sleep `delay` ns with the CPU lease parked (counted as a wait).
    fn sleep(&mut self, delay: u64) -> Result<(), UringError> {
        if delay > 0 {
            self.counters.waits_submitted += 1;
            self.counters.wait_us += delay / 1_000;
            let _lease = park_current_lease();
            sleep_abs_monotonic(delay).map_err(clock_failed)?;
        }
        Ok(())
    }

    /// [`ThreadIo::sleep`] for a paced piece: with a cancel flag, in slices
    /// of at most [`CANCEL_POLL`] that end the sleep once it is set (the
    /// caller then stops: a piece whose wait was cut short is never
    /// written, so the rate holds). The lease stays parked throughout.
    fn sleep_unless_cancelled(&mut self, delay: u64) -> Result<(), UringError> {
        let Some(cancel) = self.cancel else {
            return self.sleep(delay);
        };
        if delay == 0 {
            return Ok(());
        }
        self.counters.waits_submitted += 1;
        self.counters.wait_us += delay / 1_000;
        let deadline = monotonic_now_ns().saturating_add(delay);
        let slice = u64::try_from(CANCEL_POLL.as_nanos()).unwrap_or(u64::MAX);
        let _lease = park_current_lease();
        while !cancel.load(Ordering::Relaxed) {
            let left = deadline.saturating_sub(monotonic_now_ns());
            if left == 0 {
                break;
            }
            sleep_abs_monotonic(left.min(slice)).map_err(clock_failed)?;
        }
        Ok(())
    }

    /// `pwrite` all of `buf` at `offset`. A paced write (`plan`'s
    /// [`Writeback::Paced`](crate::policy::Writeback::Paced)) goes in pieces of at most [`WRITEBACK_PIECE`]
    /// bytes, each charged (and waiting for its turn) before its `pwrite`,
    /// then taking its room under the caps, and followed by the start of its
    /// writeback (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), by waiting for
    /// the device to complete the oldest piece while more than
    /// [`Policy::writeback_depth`] are on their way (`sys::WRITEBACK_FLAGS`);
    /// it returns once the device has every piece, as the ring's paced
    /// write does. Otherwise the whole buffer is
    /// one piece, charged after its `pwrite` as the reads are. A failure
    /// names the file, the offset reached and the bytes written before it
    /// (which are counted in `write_bytes`). A paced write whose `cancel`
    /// is set stops before its next piece's `pwrite` (looked at before the
    /// piece is booked, when its turn has come, and when it has its room
    /// and its pacer's slot), waits for the device to complete the pieces
    /// it wrote, and ends as [`UringError::Cancelled`] (its pieces count in
    /// `paced_bytes`, none in `write_bytes`: nobody is told of them, as for
    /// a cancelled request on the ring; a piece booked and then not written
    /// keeps its booking, as on the ring).
    pub(crate) fn write(
        &mut self,
        plan: Plan,
        file: &Arc<UringFile>,
        buf: &[u8],
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> Result<usize, UringError> {
        let fd = file.fd();
        let paced = plan.paced();
        let in_memory = plan.charge == Charge::PageCache;
        let piece = if paced {
            WRITEBACK_PIECE as usize
        } else {
            buf.len().max(1)
        };
        let depth = self.policy.writeback_depth.get() as usize;
        // Paced: room under the writeback caps of the chain's block-device
        // throttlers, held from before a piece's `pwrite` until the device
        // has completed it (given back on every way out: drop).
        let mut cap = if paced {
            CapHold::for_chain(self.policy, throttle)
        } else {
            CapHold::default()
        };
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        // Charged before its `pwrite`: a paced piece, and every piece for a
        // throttle whose turn may wait for completions (a workload).
        let turns = throttle.is_some_and(|t| t.takes_turns());
        let before = paced || turns;
        // The in-flight places of each piece charged before its `pwrite`
        // (by its end), kept until the device has it (paced) or the
        // `pwrite` returned.
        let mut holds: VecDeque<(usize, InFlightHold)> = VecDeque::new();
        // Paced: the request's bytes before this offset are on the device.
        let mut landed = 0;
        // Paced: (end, start time) of each piece whose writeback was
        // started and not yet waited for, oldest first (`writeback_us`).
        let mut started = VecDeque::new();
        let mut done = 0;
        while done < buf.len() {
            if paced {
                self.stop_if_cancelled(fd, offset, (landed, done, 0), &mut started, &mut cap)?;
            }
            let end = (done + piece).min(buf.len());
            // What the piece is charged (a write moves all of it or fails).
            let n = (end - done) as u64;
            let (pc, disk) = if in_memory { (n, 0) } else { (0, n) };
            // A paced piece goes as the ring's does (`RingCore::issue_paced`):
            // charged, and waiting for its turn in the bucket, before its
            // `pwrite` (its size is known), holding no room; then it takes
            // its room under the caps; then it passes the catch-up pacer,
            // so that pieces whose turns passed while the device held the
            // writers back go out spaced, not at once. Charged after its
            // `pwrite` (as a read is), or paced before its room, eight
            // writers put up to half as much again as the limit into a
            // 100 ms window after a stall of the device.
            if before && turns && landed < done {
                // A turn may wait for in-flight places this thread's own
                // pieces hold, which only it completes: land them first.
                landed = self.land(fd, offset, (landed, done), &mut started, &mut cap);
                holds.clear();
            }
            if before {
                let hold = Self::book(throttle, max_block, pc, disk)
                    .and_then(|(delay, hold)| self.sleep_unless_cancelled(delay).map(|()| hold))
                    .map_err(|e| self.wrote_before(done, e))?;
                holds.push_back((end, hold));
                self.stop_if_cancelled(fd, offset, (landed, done, 0), &mut started, &mut cap)?;
            }
            while !cap.try_acquire((end - done) as u64, &waker) {
                self.counters.writeback_cap_waits += 1;
                if landed < done {
                    // Our own pieces hold room: complete them first.
                    landed = self.land(fd, offset, (landed, done), &mut started, &mut cap);
                    while holds.front().is_some_and(|&(e, _)| e <= landed) {
                        holds.pop_front();
                    }
                    continue;
                }
                // Another request's writeback completes and wakes us
                // (registered under the cap's lock, and an unpark before
                // the park is kept: no lost wake-up); with a cancel flag,
                // it is looked at every `CANCEL_POLL` meanwhile.
                if self.cancel.is_some() {
                    {
                        let _lease = park_current_lease();
                        std::thread::park_timeout(CANCEL_POLL);
                    }
                    self.stop_if_cancelled(fd, offset, (landed, done, 0), &mut started, &mut cap)?;
                } else {
                    let _lease = park_current_lease();
                    std::thread::park();
                }
            }
            if paced {
                let delay = cap.pace(0, n);
                self.sleep_unless_cancelled(delay)
                    .map_err(|e| self.wrote_before(done, e))?;
                // Dropped while it waited for room or for the pacer: the
                // room taken for this piece goes back unused.
                self.stop_if_cancelled(fd, offset, (landed, done, n), &mut started, &mut cap)?;
            }
            let moved = self.transfer(Op::Write, offset, end, done, |sys, at| {
                sys.pwrite(fd, &buf[at..end], offset + at as u64)
            });
            let end = match moved {
                Ok(end) => end,
                Err(e) => {
                    // What the failing piece moved before its error is in
                    // the file too: `transfer` names its offset.
                    let written = match &e {
                        UringError::Io { offset: at, .. } => at - offset,
                        _ => done as u64,
                    };
                    let source = match e {
                        UringError::Io { source, .. } => source,
                        other => return Err(other),
                    };
                    file.grow_to(offset + written);
                    self.counters.write_bytes += written;
                    return Err(UringError::write(
                        file,
                        offset,
                        buf.len() as u64,
                        written,
                        source,
                    ));
                }
            };
            file.grow_to(offset + end as u64);
            if paced {
                self.counters.paced_bytes += n;
                let dirty = (end - landed) as u64;
                self.counters.dirty_high_water_bytes =
                    self.counters.dirty_high_water_bytes.max(dirty);
                // Pacing is no durability promise: a refused writeback
                // leaves the pages to the kernel's flush, and a write error
                // reaches fsync.
                match self.sys.sync_file_range(fd, offset + done as u64, n, false) {
                    Ok(()) => {
                        self.counters.writeback_submissions += 1;
                        started.push_back((end, monotonic_now_ns()));
                    }
                    Err(_) => self.counters.writeback_errors += 1,
                }
                // The oldest pieces beyond the depth (all of them at the
                // end) must be on the device before the writer goes on.
                let keep = if end == buf.len() {
                    0
                } else {
                    (depth - 1) * piece
                };
                let upto = end.saturating_sub(keep).max(landed);
                landed = self.land(fd, offset, (landed, upto), &mut started, &mut cap);
            } else {
                landed = end;
            }
            while holds.front().is_some_and(|&(e, _)| e <= landed) {
                holds.pop_front();
            }
            done = end;
            if !before {
                self.charge(throttle, max_block, pc, disk)
                    .map_err(|e| self.wrote_before(done, e))?;
            }
        }
        self.counters.writes += 1;
        self.counters.write_bytes += done as u64;
        Ok(done)
    }

    /// Wait for the device to complete the request's bytes in `from..to`
    /// (relative to `offset`; pieces whose writeback was started), then
    /// give back their room under the caps. Returns `to`: the bytes before
    /// it are on the device (or, if the wait failed, left to the kernel's
    /// flush, counted in `writeback_errors`).
    fn land(
        &mut self,
        fd: std::os::fd::RawFd,
        offset: u64,
        (from, to): (usize, usize),
        started: &mut VecDeque<(usize, u64)>,
        cap: &mut CapHold,
    ) -> usize {
        if to > from {
            let len = (to - from) as u64;
            let waited = self
                .sys
                .sync_file_range(fd, offset + from as u64, len, true);
            self.writebacks_waited(started, to, waited.is_ok());
            if waited.is_err() {
                self.counters.writeback_errors += 1;
            }
            cap.release(len);
        }
        to
    }

    /// If the paced write was cancelled: the room it took for a piece it
    /// will not write (`unused` bytes) goes back, its bytes `landed..done`
    /// still on their way to the device land first (their room is given
    /// back only once the device has them, as on every other way), and it
    /// ends as [`UringError::Cancelled`].
    fn stop_if_cancelled(
        &mut self,
        fd: std::os::fd::RawFd,
        offset: u64,
        (landed, done, unused): (usize, usize, u64),
        started: &mut VecDeque<(usize, u64)>,
        cap: &mut CapHold,
    ) -> Result<(), UringError> {
        if !self.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Ok(());
        }
        cap.release(unused);
        self.land(fd, offset, (landed, done), started, cap);
        self.counters.cancellations += 1;
        Err(UringError::Cancelled)
    }

    /// A write that fails after its first `done` bytes (all in the file)
    /// counts them and fails with `e`.
    fn wrote_before(&mut self, done: usize, e: UringError) -> UringError {
        self.counters.write_bytes += done as u64;
        e
    }

    /// The wait for the request's bytes up to `upto` returned (`ok`: the
    /// device completed them): the pieces it covered leave `started`, and
    /// their time since their writeback started counts in `writeback_us`.
    fn writebacks_waited(&mut self, started: &mut VecDeque<(usize, u64)>, upto: usize, ok: bool) {
        let now = monotonic_now_ns();
        while let Some(&(end, at)) = started.front() {
            if end > upto {
                break;
            }
            started.pop_front();
            if ok {
                self.counters.writeback_us += now.saturating_sub(at) / 1000;
            }
        }
    }
}

/// A failed `clock_nanosleep`.
fn clock_failed(e: nix::errno::Errno) -> UringError {
    UringError::Ring {
        what: "clock_nanosleep",
        source: io::Error::from(e),
    }
}
