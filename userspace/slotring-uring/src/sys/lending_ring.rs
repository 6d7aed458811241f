//! [`LendingRing`]: an io_uring instance and the slots whose memory it
//! lends to the kernel — each slot's buffer and timespec, handed back
//! ([`LendingRing::take`]) only once the last CQE of the slot is reaped.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{IoUring, cqueue, opcode, squeue, types};

use super::syscalls::{SetupParams, Syscalls, WRITEBACK_FLAGS};
use crate::policy::{Op, WRITEBACK_PIECE};

const IORING_ENTER_GETEVENTS: u32 = 1;
const IORING_ENTER_SQ_WAKEUP: u32 = 2;

/// What a slot's SQE is for (the low [`TAG_BITS`] bits of `user_data`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tag {
    /// The read or write.
    Io = 0,
    /// A throttle wait before the IO (linked to it, or standalone with the
    /// IO held back until its CQE).
    Wait = 1,
    /// An `ASYNC_CANCEL`.
    Cancel = 2,
    /// A standalone timeout after the IO (a page-cache charge's wait).
    PostWait = 3,
    /// The `IORING_OP_SYNC_FILE_RANGE` linked behind a paced write
    /// ([`IoKind::PacedWrite`]).
    Writeback = 4,
    /// A paced write's piece waiting for room under the writeback cap of
    /// its block-device throttlers: an `IORING_OP_POLL_ADD(POLLIN)` on the
    /// ring's doorbell eventfd, which a cap's release rings.
    CapWait = 5,
    /// A standalone timeout after which a request queued for its turn in a
    /// workload re-polls it (the one that times the caps' debts).
    TurnWait = 6,
}

/// Bits of `user_data` that hold the [`Tag`]; the slot index is above them.
pub(crate) const TAG_BITS: u32 = 3;

/// `user_data` of the NOP a new ring submits ([`LendingRing::warm_up`]): slot
/// index `u32::MAX` (never allocated: slots are numbered from 0 and a ring
/// never holds 2³² of them), tag [`Tag::Cancel`] (whose CQE advances no
/// request).
pub const WARM_UP_USER_DATA: u64 = ((u32::MAX as u64) << TAG_BITS) | Tag::Cancel as u64;

impl Tag {
    fn from_bits(b: u64) -> Tag {
        match b & ((1 << TAG_BITS) - 1) {
            0 => Tag::Io,
            1 => Tag::Wait,
            2 => Tag::Cancel,
            3 => Tag::PostWait,
            4 => Tag::Writeback,
            5 => Tag::CapWait,
            _ => Tag::TurnWait,
        }
    }
}

/// Identifies a slot of a [`LendingRing`] (index + generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SlotId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

fn user_data(index: u32, tag: Tag) -> u64 {
    (u64::from(index) << TAG_BITS) | tag as u64
}

struct Slot<T> {
    generation: u32,
    /// The memory the kernel may read or write while `outstanding > 0`.
    buf: Vec<u8>,
    /// Kept boxed so that its address survives a reallocation of `slots`.
    ts: Box<types::Timespec>,
    /// SQEs pushed whose CQE has not been reaped yet.
    outstanding: u32,
    data: Option<T>,
}

/// The opcode of an IO SQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IoKind {
    /// `IORING_OP_READ`.
    Read,
    /// `IORING_OP_READ` with `RWF_NOWAIT`: a page-cache probe. Never
    /// `IOSQE_ASYNC`, which silently defeats it.
    NowaitRead,
    /// `IORING_OP_WRITE`.
    Write,
    /// `IORING_OP_WRITE` with `IOSQE_IO_LINK` to an
    /// `IORING_OP_SYNC_FILE_RANGE([`WRITEBACK_FLAGS`])` ([`Tag::Writeback`])
    /// over the piece the write belongs to: the kernel
    /// starts the writeback of what the write dirtied as soon as it
    /// completes (paced writeback; a short or failed write cancels it).
    PacedWrite,
}

impl IoKind {
    /// The plain read or write of `op`.
    pub(crate) fn plain(op: Op) -> Self {
        match op {
            Op::Read => IoKind::Read,
            Op::Write => IoKind::Write,
        }
    }

    /// Whether it reads or writes.
    pub(crate) fn op(self) -> Op {
        match self {
            IoKind::Read | IoKind::NowaitRead => Op::Read,
            IoKind::Write | IoKind::PacedWrite => Op::Write,
        }
    }
}

/// An IO SQE's description (the buffer is the slot's own).
#[derive(Debug, Clone, Copy)]
pub(crate) struct IoSqe {
    pub(crate) fd: RawFd,
    pub(crate) kind: IoKind,
    /// Byte range of the slot's buffer.
    pub(crate) start: usize,
    pub(crate) len: u32,
    pub(crate) offset: u64,
}

/// Where a timeout SQE stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimeoutRole {
    /// At the head of a link (`IORING_TIMEOUT_ETIME_SUCCESS`: its expiry
    /// continues the chain, a cancel breaks it).
    LinkHead,
    /// Alone: its CQE is all that follows.
    Standalone,
}

/// An io_uring instance plus the slab of slots whose memory it lends to the
/// kernel. `T` is the engine's per-request state.
pub(crate) struct LendingRing<T> {
    ring: IoUring,
    sys: Box<dyn Syscalls>,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    /// SQEs pushed but not yet submitted.
    unsubmitted: u32,
    sqpoll: bool,
    overflow_seen: u64,
}

/// A reaped completion.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cqe {
    pub(crate) slot: u32,
    pub(crate) tag: Tag,
    pub(crate) res: i32,
}

impl<T> LendingRing<T> {
    /// Set up a ring through `sys`.
    ///
    /// The new ring submits one NOP and waits for it ([`LendingRing::warm_up`]),
    /// so that the creating thread's one-time io_uring set-up is paid here
    /// rather than inside the first real request (often a throttled read
    /// whose thread has parked its CPU lease).
    pub(crate) fn new(mut sys: Box<dyn Syscalls>, p: &SetupParams) -> io::Result<Self> {
        let ring = sys.io_uring_setup(p)?;
        let mut ring = Self {
            sqpoll: ring.params().is_setup_sqpoll(),
            ring,
            sys,
            slots: Vec::new(),
            free: Vec::new(),
            unsubmitted: 0,
            overflow_seen: 0,
        };
        ring.warm_up();
        Ok(ring)
    }

    /// Submit one `IORING_OP_NOP` ([`WARM_UP_USER_DATA`]) and wait for its
    /// CQE, through the seam. A thread's first io_uring submission sets up
    /// its io_uring task context (a few hundred µs under memory pressure);
    /// done here, the first real request does not pay it. Best
    /// effort: if the enter fails, the NOP rides the next enter and its CQE
    /// is dropped by [`LendingRing::reap`]'s callers like any unknown slot's (no
    /// slot has its index), and the failure, if it lasts, is reported with
    /// its cause by the first real request.
    fn warm_up(&mut self) {
        let nop = opcode::Nop::new().build().user_data(WARM_UP_USER_DATA);
        {
            let mut sq = self.ring.submission();
            // SAFETY: a NOP points at no memory.
            if unsafe { sq.push(&nop) }.is_err() {
                return;
            }
        }
        self.unsubmitted += 1;
        if self.enter(1).is_ok() {
            let mut sink = Vec::new();
            self.reap(&mut sink);
        }
    }

    /// The syscall seam.
    pub(crate) fn sys(&mut self) -> &mut dyn Syscalls {
        self.sys.as_mut()
    }

    #[cfg(feature = "tokio")]
    /// Register `efd` to be signalled on every CQE.
    pub(crate) fn register_eventfd(&mut self, efd: RawFd) -> io::Result<()> {
        self.sys.io_uring_register_eventfd(&self.ring, efd)
    }

    /// Take a slot for `buf` and `data`.
    pub(crate) fn alloc(&mut self, buf: Vec<u8>, data: T) -> SlotId {
        if let Some(index) = self.free.pop() {
            let s = &mut self.slots[index as usize];
            s.generation = s.generation.wrapping_add(1);
            s.buf = buf;
            s.data = Some(data);
            s.outstanding = 0;
            SlotId {
                index,
                generation: s.generation,
            }
        } else {
            let index = u32::try_from(self.slots.len()).expect("fewer than 2^32 slots");
            self.slots.push(Slot {
                generation: 0,
                buf,
                ts: Box::new(types::Timespec::new()),
                outstanding: 0,
                data: Some(data),
            });
            SlotId {
                index,
                generation: 0,
            }
        }
    }

    fn slot(&self, id: SlotId) -> Option<&Slot<T>> {
        self.slots
            .get(id.index as usize)
            .filter(|s| s.generation == id.generation && s.data.is_some())
    }

    /// The request state of a live slot.
    pub(crate) fn data(&self, id: SlotId) -> Option<&T> {
        self.slot(id).and_then(|s| s.data.as_ref())
    }

    /// The request state of a live slot.
    pub(crate) fn data_mut(&mut self, id: SlotId) -> Option<&mut T> {
        self.slots
            .get_mut(id.index as usize)
            .filter(|s| s.generation == id.generation)
            .and_then(|s| s.data.as_mut())
    }

    /// The id of the live slot at `index`.
    pub(crate) fn id_at(&self, index: u32) -> Option<SlotId> {
        let s = self.slots.get(index as usize)?;
        s.data.as_ref().map(|_| SlotId {
            index,
            generation: s.generation,
        })
    }

    /// Ids of every live slot.
    pub(crate) fn live(&self) -> Vec<SlotId> {
        (0..self.slots.len() as u32)
            .filter_map(|i| self.id_at(i))
            .collect()
    }

    /// Number of live slots.
    pub(crate) fn live_count(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// CQEs still owed to slot `id`.
    pub(crate) fn outstanding(&self, id: SlotId) -> u32 {
        self.slot(id).map_or(0, |s| s.outstanding)
    }

    /// Total CQEs owed.
    pub(crate) fn total_outstanding(&self) -> u64 {
        self.slots.iter().map(|s| u64::from(s.outstanding)).sum()
    }

    /// Release slot `id`, returning its buffer and state — only when no CQE is
    /// owed any more (otherwise `None` and nothing changes).
    pub(crate) fn take(&mut self, id: SlotId) -> Option<(Vec<u8>, T)> {
        let s = self.slots.get_mut(id.index as usize)?;
        if s.generation != id.generation || s.outstanding != 0 || s.data.is_none() {
            return None;
        }
        let data = s.data.take()?;
        let buf = std::mem::take(&mut s.buf);
        self.free.push(id.index);
        Some((buf, data))
    }

    fn sq_capacity(&mut self) -> usize {
        // SAFETY: see `room`: no other `SubmissionQueue` is alive.
        let sq = unsafe { self.ring.submission_shared() };
        sq.capacity()
    }

    fn room(&mut self) -> usize {
        let real = {
            // SAFETY: `submission_shared` requires that no other
            // `SubmissionQueue` of this ring is alive; this `LendingRing` is the only
            // user and the queue is dropped at the end of this block.
            let sq = unsafe { self.ring.submission_shared() };
            sq.capacity() - sq.len()
        };
        self.sys.sq_room(real)
    }

    /// Make room for `n` SQEs, submitting if the SQ is full. Returns the number
    /// of times the SQ was found full.
    fn reserve_sq(&mut self, n: usize) -> io::Result<u64> {
        let mut full = 0;
        while self.room() < n {
            full += 1;
            // Submit only (CQEs are left for the engine to reap; with
            // FEAT_NODROP an overflowing CQ keeps them in the kernel).
            match self.enter(0) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                    ) => {}
                Err(e) => return Err(e),
            }
            if full > 1_000_000 {
                return Err(io::Error::other(format!(
                    "submission queue stays full: {n} entries needed, {} free of {} \
                     after {full} submit attempts",
                    self.room(),
                    self.sq_capacity()
                )));
            }
        }
        Ok(full)
    }

    fn push_entries(&mut self, id: SlotId, entries: &[squeue::Entry]) -> io::Result<u64> {
        let full = self.reserve_sq(entries.len())?;
        {
            let mut sq = self.ring.submission();
            // SAFETY: every entry points only into `self.slots[id]` (its
            // buffer, or its boxed timespec), which is not released before
            // the CQE of each entry is reaped (`outstanding` is raised below
            // and `take` refuses while it is non-zero; `Drop` waits for all).
            unsafe { sq.push_multiple(entries) }.map_err(|_| {
                io::Error::other(format!(
                    "submission queue full after making room for {} entries",
                    entries.len()
                ))
            })?;
        }
        let s = &mut self.slots[id.index as usize];
        s.outstanding += entries.len() as u32;
        self.unsubmitted += entries.len() as u32;
        Ok(full)
    }

    fn io_entry(&mut self, id: SlotId, io: IoSqe) -> io::Result<squeue::Entry> {
        let s = self
            .slots
            .get_mut(id.index as usize)
            .filter(|s| s.generation == id.generation && s.data.is_some())
            .ok_or_else(|| {
                io::Error::other(format!(
                    "IO on released slot {} (generation {})",
                    id.index, id.generation
                ))
            })?;
        let end = io
            .start
            .checked_add(io.len as usize)
            .filter(|&e| e <= s.buf.len());
        if end.is_none() {
            return Err(io::Error::other(format!(
                "IO range {}+{} outside its buffer of {}",
                io.start,
                io.len,
                s.buf.len()
            )));
        }
        let ptr = s.buf[io.start..].as_mut_ptr();
        let ud = user_data(id.index, Tag::Io);
        let fd = types::Fd(io.fd);
        Ok(match io.kind {
            IoKind::Write | IoKind::PacedWrite => opcode::Write::new(fd, ptr, io.len)
                .offset(io.offset)
                .build()
                .user_data(ud),
            IoKind::Read | IoKind::NowaitRead => {
                let flags = if io.kind == IoKind::NowaitRead {
                    libc::RWF_NOWAIT
                } else {
                    0
                };
                // Never IOSQE_ASYNC here: it silently defeats RWF_NOWAIT.
                opcode::Read::new(fd, ptr, io.len)
                    .offset(io.offset)
                    .rw_flags(flags)
                    .build()
                    .user_data(ud)
            }
        })
    }

    /// An absolute timeout SQE.
    fn timeout_entry(
        &mut self,
        id: SlotId,
        deadline_ns: u64,
        tag: Tag,
        role: TimeoutRole,
    ) -> squeue::Entry {
        let s = &mut self.slots[id.index as usize];
        *s.ts = types::Timespec::new()
            .sec(deadline_ns / 1_000_000_000)
            .nsec((deadline_ns % 1_000_000_000) as u32);
        let ts: *const types::Timespec = &*s.ts;
        let flags = match role {
            TimeoutRole::LinkHead => types::TimeoutFlags::ABS | types::TimeoutFlags::ETIME_SUCCESS,
            TimeoutRole::Standalone => types::TimeoutFlags::ABS,
        };
        opcode::Timeout::new(ts)
            .flags(flags)
            .build()
            .user_data(user_data(id.index, tag))
    }

    /// Queue an IO, optionally behind an absolute CLOCK_MONOTONIC timeout
    /// linked to it (expiry continues the chain). Returns how often the SQ was found full.
    pub(crate) fn push_io(
        &mut self,
        id: SlotId,
        io: IoSqe,
        wait_until: Option<u64>,
    ) -> io::Result<u64> {
        let e = self.io_entry(id, io)?;
        if io.kind == IoKind::PacedWrite {
            // The whole piece this SQE belongs to (pieces start at
            // multiples of WRITEBACK_PIECE within the request; `start` is
            // the request's bytes before this SQE): a continued short write
            // also covers the piece's first part, whose own writeback its
            // shortness cancelled. Already clean pages cost nothing.
            let before = io.start as u64 % WRITEBACK_PIECE;
            let from = io.offset - before;
            let len = u32::try_from(before + u64::from(io.len)).unwrap_or(u32::MAX);
            let wb = opcode::SyncFileRange::new(types::Fd(io.fd), len)
                .offset(from)
                .flags(WRITEBACK_FLAGS)
                .build()
                .user_data(user_data(id.index, Tag::Writeback));
            let e = e.flags(squeue::Flags::IO_LINK);
            return match wait_until {
                Some(deadline) => {
                    let t = self
                        .timeout_entry(id, deadline, Tag::Wait, TimeoutRole::LinkHead)
                        .flags(squeue::Flags::IO_LINK);
                    self.push_entries(id, &[t, e, wb])
                }
                None => self.push_entries(id, &[e, wb]),
            };
        }
        match wait_until {
            Some(deadline) => {
                // ETIME_SUCCESS: an expired wait keeps the chain going (as a
                // hard link would); a *cancelled* wait fails it, so the
                // linked IO completes with -ECANCELED instead of running
                // early. A hard link would ignore the cancel and issue the IO
                // at once.
                let t = self
                    .timeout_entry(id, deadline, Tag::Wait, TimeoutRole::LinkHead)
                    .flags(squeue::Flags::IO_LINK);
                self.push_entries(id, &[t, e])
            }
            None => self.push_entries(id, &[e]),
        }
    }

    /// Queue a standalone absolute timeout.
    pub(crate) fn push_post_wait(&mut self, id: SlotId, deadline_ns: u64) -> io::Result<u64> {
        let t = self.timeout_entry(id, deadline_ns, Tag::PostWait, TimeoutRole::Standalone);
        self.push_entries(id, &[t])
    }

    /// Queue a standalone absolute timeout in front of an IO that is held
    /// back until its CQE (not linked: the engine queues the IO itself).
    pub(crate) fn push_wait(&mut self, id: SlotId, deadline_ns: u64) -> io::Result<u64> {
        let t = self.timeout_entry(id, deadline_ns, Tag::Wait, TimeoutRole::Standalone);
        self.push_entries(id, &[t])
    }

    /// Queue a standalone absolute timeout after which a request queued for
    /// its workload turn re-polls it, tagged [`Tag::TurnWait`].
    pub(crate) fn push_turn_wait(&mut self, id: SlotId, deadline_ns: u64) -> io::Result<u64> {
        let t = self.timeout_entry(id, deadline_ns, Tag::TurnWait, TimeoutRole::Standalone);
        self.push_entries(id, &[t])
    }

    /// Queue a one-shot `POLL_ADD(POLLIN)` on `fd` (the core's doorbell
    /// eventfd), tagged [`Tag::CapWait`]. It points at no memory of ours.
    pub(crate) fn push_cap_wait(&mut self, id: SlotId, fd: RawFd) -> io::Result<u64> {
        let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(user_data(id.index, Tag::CapWait));
        self.push_entries(id, &[e])
    }

    /// Queue `ASYNC_CANCEL`s for the slot's IO and its wait.
    pub(crate) fn push_cancel(&mut self, id: SlotId, tags: &[Tag]) -> io::Result<u64> {
        let entries: Vec<squeue::Entry> = tags
            .iter()
            .map(|&t| {
                opcode::AsyncCancel::new(user_data(id.index, t))
                    .build()
                    .user_data(user_data(id.index, Tag::Cancel))
            })
            .collect();
        self.push_entries(id, &entries)
    }

    /// Whether the kernel flagged a CQ overflow (with `FEAT_NODROP` it keeps
    /// the completions and flushes them at the next `GETEVENTS` enter).
    pub(crate) fn cq_overflow_flag(&mut self) -> bool {
        // SAFETY: see `room`: no other `SubmissionQueue` is alive.
        let sq = unsafe { self.ring.submission_shared() };
        sq.cq_overflow()
    }

    /// Overflow episodes observed so far.
    pub(crate) fn overflows_seen(&self) -> u64 {
        self.overflow_seen
    }

    /// Submit what is queued and wait for at least `want` completions
    /// (through the seam). Retries `EINTR`; `EBUSY`/`EAGAIN` are returned so
    /// the caller can reap first.
    pub(crate) fn enter(&mut self, want: u32) -> io::Result<usize> {
        let overflow = self.cq_overflow_flag();
        if overflow {
            self.overflow_seen += 1;
        }
        let mut flags = 0;
        if want > 0 || overflow {
            flags |= IORING_ENTER_GETEVENTS;
        }
        if self.sqpoll {
            // SAFETY: see `room`.
            let sq = unsafe { self.ring.submission_shared() };
            if sq.need_wakeup() {
                flags |= IORING_ENTER_SQ_WAKEUP;
            }
        }
        let to_submit = self.unsubmitted;
        let r = self.sys.io_uring_enter(&self.ring, to_submit, want, flags);
        match r {
            Ok(n) => {
                self.unsubmitted = self.unsubmitted.saturating_sub(n as u32);
                if self.sqpoll {
                    self.unsubmitted = 0;
                }
                Ok(n)
            }
            Err(e) => Err(e),
        }
    }

    /// Sleep in `io_uring_enter` until the absolute `CLOCK_MONOTONIC` time
    /// `deadline_ns` (an EXT_ARG timeout, no SQE), through the seam. `Ok`
    /// once the deadline passed (`ETIME`) or a CQE arrived; `EINTR` and
    /// other errors are the caller's.
    pub(crate) fn wait_until(&mut self, deadline_ns: u64) -> io::Result<()> {
        match self.sys.io_uring_wait_until(&self.ring, deadline_ns) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(()),
            Err(e) => Err(e),
        }
    }

    #[cfg(feature = "tokio")]
    /// Whether SQEs are waiting to be submitted.
    pub(crate) fn has_unsubmitted(&self) -> bool {
        self.unsubmitted > 0
    }

    /// Pop every available CQE (each through the seam), lowering `outstanding`.
    pub(crate) fn reap(&mut self, out: &mut Vec<Cqe>) {
        let cq = self.ring.completion();
        for c in cq {
            let c: cqueue::Entry = c;
            let ud = c.user_data();
            let mut res = c.result();
            self.sys.completion(ud, &mut res);
            let slot = (ud >> TAG_BITS) as u32;
            if let Some(s) = self.slots.get_mut(slot as usize) {
                s.outstanding = s.outstanding.saturating_sub(1);
            }
            out.push(Cqe {
                slot,
                tag: Tag::from_bits(ud),
                res,
            });
        }
    }

    /// The ring's fd.
    pub(crate) fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

/// Dropping a ring cancels what is in flight and waits for every CQE owed.
///
/// SQEs that were queued but never submitted (a `submit_*` not followed by
/// any `io_uring_enter`, or a miss's retry queued by the last reap) are
/// already published in the SQ ring (the tail is shared with the kernel and
/// the `io-uring` crate offers no way to take it back), so the first
/// `io_uring_enter` below submits them together with the cancels pushed
/// behind them. A request the kernel completes inline at submission (a
/// buffered write, a page-cache read) therefore *does happen* before its
/// cancel is seen; one that must wait (a timeout-delayed chain, a disk read
/// that goes async) is cancelled. Callers that must not issue a queued IO
/// have to cancel and collect it before dropping the engine.
impl<T> Drop for LendingRing<T> {
    fn drop(&mut self) {
        // Nothing the kernel may still write to is freed before its CQE.
        let ids: Vec<SlotId> = self
            .live()
            .into_iter()
            .filter(|&id| self.outstanding(id) > 0)
            .collect();
        for id in ids {
            let _ = self.push_cancel(
                id,
                &[
                    Tag::Wait,
                    Tag::Io,
                    Tag::PostWait,
                    Tag::CapWait,
                    Tag::TurnWait,
                ],
            );
        }
        let mut sink = Vec::new();
        let mut spins = 0u32;
        while self.slots.iter().any(|s| s.outstanding > 0) {
            match self.enter(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN)) => {}
                Err(_) => {
                    spins += 1;
                    if spins > 1000 {
                        // The ring cannot be entered any more: leak the memory
                        // rather than free what the kernel may still write.
                        for s in &mut self.slots {
                            if s.outstanding > 0 {
                                std::mem::forget(std::mem::take(&mut s.buf));
                                std::mem::forget(std::mem::replace(
                                    &mut s.ts,
                                    Box::new(types::Timespec::new()),
                                ));
                            }
                        }
                        return;
                    }
                }
            }
            sink.clear();
            self.reap(&mut sink);
        }
    }
}
