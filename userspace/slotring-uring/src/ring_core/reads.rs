//! How the ring charges a read: the `RWF_NOWAIT` probe, the disk-rate
//! guard, the page-cache charge after the IO, and the refunds of bytes
//! another reader brought in.
//!
//! * **[`Charge::Probe`]**: the read is first submitted with `RWF_NOWAIT`
//!   (never with `IOSQE_ASYNC`, which defeats it). A full result is a
//!   page-cache hit, charged as [`Source::PageCache`] after the fact (a
//!   block-device level skips it, its parents charge it; a resulting wait is
//!   a standalone timeout before the request completes). `-EAGAIN` or a
//!   short result charges what remains as a device read and queues timeout +
//!   read, which go out with the next `io_uring_enter` the driver makes
//!   anyway. A read routed by `cachestat` (turns or the guard; no
//!   `RWF_NOWAIT` read of its own yet) that has to wait looks at the page
//!   cache again when the wait ends, and what another reader brought in
//!   meanwhile is refunded to the block-device throttlers
//!   ([`Throttle::refund_page_cache_read`]), so the disk sees the limit
//!   even when many connections miss on the same ranges. On the async
//!   front ends ([`PreIoWait::Linked`]) its wait is a standalone timeout
//!   and, at its CQE, `cachestat` counts the pages present, up to date or
//!   still being read in by another reader ([`RingCore::refund_cached`]); a
//!   linked release of the blocking front end re-probes with `RWF_NOWAIT`
//!   instead ([`RingCore::on_reprobe`], which also says why a request that
//!   probed does not look again).
//! * **Guard** (the block device's instantaneous rate): while
//!   [`Policy::guard_engaged`] for this read plus every probe already in
//!   flight, the engine does not probe: it asks `cachestat(2)` and routes
//!   the read by its answer, charging before any IO ([`RingCore::start_probe`]).
//! * **Turns** (a workload's read): never probed, since a probe that misses
//!   has the device read the range at once, ahead of the turn; `cachestat`
//!   routes it and a miss reaches the device only when its turn comes
//!   ([`routed_by_cachestat`]).
//! * **[`Charge::PageCache`]** (a memory filesystem): read without a probe,
//!   every byte charged as page cache when the IO completes.
//!
//! [`Throttle::refund_page_cache_read`]: slotring_throttle::Throttle::refund_page_cache_read
//! [`Policy::guard_engaged`]: crate::policy::Policy::guard_engaged
//! [`routed_by_cachestat`]: crate::policy::routed_by_cachestat
//! [`PreIoWait::Linked`]: super::PreIoWait::Linked

use slotring_throttle::Source;

use super::{Lifecycle, Owed, RingCore, io_failed};
use crate::error::UringError;
#[cfg(feature = "tokio")]
use crate::file::UringFile;
use crate::policy::{self, Charge, Op};
use crate::sys::{IoKind, IoSqe, SlotId};

impl RingCore {
    #[cfg(feature = "tokio")]
    /// Where the bytes of a read of `len` at `off` of `file` that `charge`
    /// says how to charge come from, decided before submission (a tenant's
    /// read, booked in its fair turn before the ring sees it,
    /// [`Route::TenantRing`](crate::route::Route::TenantRing)): a probe is
    /// replaced by `cachestat(2)` (page cache only when every page is
    /// cached).
    pub(crate) fn prebook_source(
        &mut self,
        charge: Charge,
        file: &UringFile,
        off: u64,
        len: u64,
    ) -> Source {
        let charge = match charge {
            Charge::Probe => {
                self.counters.cachestat_checks += 1;
                let stat = self.ring.sys().cachestat(file.fd(), off, len);
                policy::cachestat_charge(stat, off, len)
            }
            c => c,
        };
        match charge {
            Charge::PageCache => Source::PageCache,
            Charge::Device | Charge::Probe => Source::Device,
        }
    }

    pub(super) fn probe(&mut self, id: SlotId) -> Result<(), UringError> {
        let io = self.req(id).next_io(IoKind::NowaitRead);
        self.queue(id, Lifecycle::Probing { io })
    }

    pub(super) fn known_hit_io(&mut self, id: SlotId) -> Result<(), UringError> {
        let r = self.req(id);
        let io = r.next_io(IoKind::plain(r.op));
        self.queue(
            id,
            Lifecycle::Io {
                io,
                owed: Owed::PageCache,
            },
        )
    }

    /// Start a read routed to [`Charge::Probe`]: probe with `RWF_NOWAIT`,
    /// unless its throttle takes turns or the disk-rate guard is engaged for
    /// it and the probes in flight; then `cachestat(2)` routes it and it is
    /// charged before any IO.
    pub(super) fn start_probe(&mut self, id: SlotId) -> Result<(), UringError> {
        let (op, len, file, throttle) = {
            let r = self.req(id);
            (r.op, r.len, r.file.clone(), r.throttle.clone())
        };
        self.req(id).reprobe = op == Op::Read;
        let need = |probes: u64| probes + len as u64;
        let routed = policy::routed_by_cachestat(throttle.as_ref());
        let mut engaged = routed
            || self
                .policy
                .guard_engaged(throttle.as_ref(), need(self.probe_bytes));
        if engaged && !routed && self.probe_bytes > 0 {
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
        // Only the bytes before EOF can be cached: `cachestat` counts no
        // page past it.
        let span = self.chargeable(id);
        let stat = self.ring.sys().cachestat(file.fd(), off, span);
        match policy::cachestat_charge(stat, off, span) {
            Charge::PageCache => self.known_hit_io(id),
            Charge::Device | Charge::Probe => self.charge_then_io(id, 0),
        }
    }

    /// Charge `n` page-cache bytes now; returns the resulting delay.
    pub(super) fn charge_page_cache(&mut self, id: SlotId, n: u64) -> Result<u64, UringError> {
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

    pub(super) fn on_probe(
        &mut self,
        id: SlotId,
        probe: IoSqe,
        res: i32,
    ) -> Result<(), UringError> {
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
            return match Charge::from(mode) {
                Charge::PageCache => self.known_hit_io(id),
                Charge::Device | Charge::Probe => self.charge_then_io(id, 0),
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
    /// re-probes (see [`Req::reprobe`](super::Req::reprobe)): a
    /// `RWF_NOWAIT` read that misses may *start reading the range in*
    /// before it answers `-EAGAIN` (Linux 6.18 does: part of a 64 KiB miss
    /// is resident right after it), so after a probe that missed, the
    /// request's own disk read may be done by the end of its wait, and a
    /// re-probe would refund the disk read it caused.
    pub(super) fn on_reprobe(&mut self, id: SlotId, io: IoSqe, res: i32) -> Result<(), UringError> {
        if self.req(id).owner.cancel_requested() {
            return Err(UringError::Cancelled);
        }
        let n = match res {
            // Still not cached (or NOWAIT refused now): the read it waited for.
            e if e == -libc::EAGAIN || e == -libc::EOPNOTSUPP => 0,
            e if e < 0 => return Err(io_failed(io, e)),
            // At or past EOF.
            0 => return self.io_done(id, Owed::Nothing),
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
            return self.io_done(id, Owed::Nothing);
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
                owed: Owed::Nothing,
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
    pub(super) fn refund_cached(&mut self, id: SlotId) {
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
    pub(super) fn refund(&mut self, id: SlotId, n: u64) {
        self.counters.page_cache_refund_bytes += n;
        if let Some(t) = &self.req(id).throttle {
            t.refund_page_cache_read(n);
        }
    }
}
