//! The route of a request: which code carries it out, and where the policy
//! decides how it is charged. [`route`] decides both, once per request,
//! before anything of it starts; every front end calls it, and the code
//! behind each route only carries out the [`Plan`] it is handed.
//!
//! # Where the policy decides
//!
//! * **Page cache or device** — [`Policy::charge`], in [`route`]: device
//!   bytes, page-cache bytes (a memory filesystem), or find out
//!   ([`Charge::Probe`], a buffered read charged to a chain that skips
//!   page-cache bytes). A probe is settled when the request runs: a
//!   throttle that takes turns ([`policy::routed_by_cachestat`]) or the
//!   disk-rate guard ([`Policy::guard_engaged`]) sends it to
//!   `cachestat(2)` ([`policy::cachestat_charge`]), otherwise a
//!   `RWF_NOWAIT` read answers (a filesystem that refuses it is charged by
//!   [`policy::after_nowait_unsupported`] from then on).
//! * **Paced or not** — [`Policy::writeback`], in [`route`]: a throttled
//!   buffered write on a disk filesystem is paced (pieces of
//!   [`WRITEBACK_PIECE`], each written back before the next is due).
//! * **Which cap** — `CapHold::for_chain` (`writeback_cap.rs`), when a
//!   paced write starts (`ThreadIo::write`, or `RingCore::start` for a
//!   request the ring moves bytes for): the writeback cap of every
//!   rate-limited block-device throttler of its chain, sized by
//!   [`Policy::writeback_cap_bytes`], with the catch-up pacer at
//!   [`Policy::catch_up_rate`].
//! * **How much and when** — [`policy::book`] books the bytes on the chain
//!   (the throttle crate's `reserve`), on the ring before the IO
//!   (`ring_core`), in a thread after it (`thread_io.rs`; a paced piece
//!   before its `pwrite`).
//!
//! # The routes and their stops
//!
//! A request starts at its front end's method (`uring_engine.rs`,
//! `local_engine.rs`, `shared_engine.rs`, `pread_engine.rs`), which calls
//! [`route`]; `policy.rs` is entered there, and afterwards only to settle
//! a probe and to book bytes. Then:
//!
//! **[`Route::Ring`]** — `UringEngine` (reads, writes it does not do in
//! its thread, the ticket API), `LocalEngine`, `SharedEngine`:
//!
//! 1. `SharedEngine` only: `Shard::run` (`shard.rs`), on the ring of the
//!    worker that submits.
//! 2. `RingCore::submit` (`ring_core/mod.rs`): a paced write takes its
//!    caps; then, by the plan's [`Charge`]:
//!    * device: `RingCore::charge_then_io` books the chain
//!      ([`policy::book`]; on a throttle that takes turns, a workload, it
//!      polls its turn instead, `ring_core/turns.rs`, and keeps the
//!      in-flight hold until the last CQE) and queues one timeout SQE
//!      linked to the IO (the
//!      blocking front end stages it, to park its CPU lease);
//!    * page cache: `RingCore::known_hit_io` (`ring_core/reads.rs`),
//!      charged when the IO completes;
//!    * probe: `RingCore::start_probe` (`ring_core/reads.rs`): turns or
//!      the guard, then `cachestat` or a `RWF_NOWAIT` read, settled in
//!      `RingCore::on_probe` (a miss is charged as device bytes), with the
//!      refunds of `RingCore::on_reprobe` / `RingCore::refund_cached`.
//! 3. A paced piece: `RingCore::issue_paced` (`ring_core/pacing.rs`):
//!    room under the caps or the doorbell, the pacer, then the write with
//!    its writeback linked behind it.
//! 4. Its CQEs (`ring_core/reap.rs`); the owner collects the result
//!    (`ring_core/collect.rs`).
//!
//! **[`Route::TenantRing`]** — a read with a throttle through a
//! `LocalEngine` or `SharedEngine` handle that carries a tenant (unless
//! the throttle takes turns, a workload: its turn is the ring's,
//! `ring_core/turns.rs`, in [`Route::Ring`]):
//!
//! 1. `RingCore::prebook_source` (`ring_core/reads.rs`): a probe asks
//!    `cachestat` instead.
//! 2. `async_wait::fair_turn` (`async_wait.rs`): the tenant's turn in
//!    every gate of the chain, without blocking the runtime, and its bytes
//!    booked.
//! 3. The stops of [`Route::Ring`] with [`Plan::BOOKED`]: nothing more to
//!    charge, the fair delay goes into the IO's timeout SQE.
//!
//! **[`Route::PacedThread`]** — a paced write through `UringEngine`'s
//! `IoEngine::write_at` with nothing else on its ring, or through a
//! `SharedEngine` with `PacedWrites::BlockingPool`:
//!
//! 1. `SharedEngine`: `PoolIo::paced_call` (`pool_io.rs`: inside a tokio
//!    runtime, and fewer than `at_once` paced calls running; otherwise the
//!    stops of [`Route::Ring`]), then `PoolIo::run` on the blocking pool.
//!    `UringEngine`: `RingCore::thread_io`, the ring's seam and counters.
//! 2. `ThreadIo::write` (`thread_io.rs`): it takes its caps, then per
//!    piece: [`policy::book`] and its turn (CPU lease parked) → room under
//!    the caps (`CapHold::try_acquire`, parked until a release wakes it) →
//!    the pacer (`CapHold::pace`) → `pwrite` → `sync_file_range` → beyond
//!    the depth, the device completes the oldest pieces → their room goes
//!    back.
//!
//! **[`Route::Pread`]** — every request of `PreadEngine`, and of a
//! `SharedEngine` without io_uring:
//!
//! 1. `SharedEngine` only: `PoolIo::run` (`pool_io.rs`) on tokio's
//!    blocking pool, with the tenant current there.
//! 2. `ThreadIo::read` (`thread_io.rs`): by the plan's [`Charge`]; a probe
//!    settled by `cachestat` (turns, the guard) or a `preadv2(RWF_NOWAIT)`; the
//!    rest with `pread`; the bytes booked after the read
//!    ([`policy::book`]) and the delay slept with the CPU lease parked.
//!    `ThreadIo::write`: a paced write as in [`Route::PacedThread`]; any
//!    other `pwrite`s the whole buffer, then books it.

use slotring_throttle::ThrottlePtr;

use crate::file::UringFile;
#[cfg(doc)]
use crate::policy;
#[cfg(doc)]
use crate::policy::WRITEBACK_PIECE;
use crate::policy::{Charge, Op, Policy, Writeback};
use crate::ring_core::MAX_IO;

/// What a front end offers the request it routes, besides the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    /// The engine has a ring (`false`: the `pread` fallback).
    pub(crate) ring: bool,
    /// A thread may do a paced write itself: the blocking front end's
    /// caller when nothing else is on its ring (whose completions it would
    /// not reap meanwhile), or tokio's blocking pool.
    pub(crate) paced_thread: bool,
    /// The handle carries a tenant, whose reads take its fair turn first.
    pub(crate) tenant: bool,
}

impl Offer {
    /// An engine without a ring.
    pub(crate) const PREAD: Self = Self {
        ring: false,
        paced_thread: false,
        tenant: false,
    };

    /// A ring, and nothing else: every request goes to it.
    pub(crate) const RING: Self = Self {
        ring: true,
        paced_thread: false,
        tenant: false,
    };
}

/// How a request is charged, decided by [`route`] for the code that carries
/// it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Page cache, device, or a probe ([`Policy::charge`]).
    pub(crate) charge: Charge,
    /// Paced or left to the kernel's flush ([`Policy::writeback`]).
    pub(crate) writeback: Writeback,
}

impl Plan {
    #[cfg(feature = "tokio")]
    /// A request whose chain is charged already (a tenant's read, booked
    /// in its fair turn): no detection, no pacing — the plan of an
    /// unthrottled request.
    pub(crate) const BOOKED: Self = Self {
        charge: Charge::Device,
        writeback: Writeback::Kernel,
    };

    /// Whether the request is a paced write.
    pub(crate) fn paced(self) -> bool {
        self.writeback == Writeback::Paced
    }
}

/// The way a request takes (see the module docs for every stop of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// No ring: the request is `ThreadIo`'s, in the caller's thread or on
    /// tokio's blocking pool.
    Pread(Plan),
    /// A paced write done by a thread itself (`ThreadIo::write`).
    PacedThread(Plan),
    /// The ring, which charges it.
    Ring(Plan),
    /// A tenant's read: its fair turn, booked before the ring sees it, then
    /// the ring with [`Plan::BOOKED`]; the plan says how its bytes are
    /// booked.
    TenantRing(Plan),
}

impl Route {
    /// The plan it carries.
    pub(crate) fn plan(self) -> Plan {
        match self {
            Route::Pread(p) | Route::PacedThread(p) | Route::Ring(p) | Route::TenantRing(p) => p,
        }
    }
}

/// The route and plan of an `op` of `len` bytes on `file` charged to
/// `throttle`, through a front end offering `offer`.
///
/// A paced write goes to a thread only in a length the ring takes too
/// ([`MAX_IO`]), so that a write's outcome never depends on the route it
/// took (a longer one fails on the ring).
pub(crate) fn route(
    policy: Policy,
    offer: Offer,
    op: Op,
    file: &UringFile,
    throttle: Option<&ThrottlePtr>,
    len: usize,
) -> Route {
    let plan = Plan {
        charge: policy.charge(op, file, throttle),
        writeback: policy.writeback(op, file, throttle),
    };
    if !offer.ring {
        Route::Pread(plan)
    } else if offer.paced_thread && plan.paced() && len <= MAX_IO {
        Route::PacedThread(plan)
    } else if offer.tenant && op == Op::Read && throttle.is_some_and(|t| !t.takes_turns()) {
        Route::TenantRing(plan)
    } else {
        Route::Ring(plan)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use slotring_throttle::Throttler;

    use super::*;

    /// A block-device limit: its chain skips page-cache reads.
    fn disk() -> ThrottlePtr {
        let t = Throttler::builder(1 << 20).limits_block_device_bandwidth(true);
        Arc::new(t.build().unwrap())
    }

    /// A file on a disk filesystem (`/var/tmp`), where a throttled write is
    /// paced.
    fn disk_file() -> (Arc<UringFile>, tempfile::TempDir) {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let f = std::fs::File::create(dir.path().join("f")).unwrap();
        let f = UringFile::new(f).unwrap();
        assert!(!f.in_memory(), "/var/tmp is on a disk filesystem");
        (f, dir)
    }

    const PACED: Plan = Plan {
        charge: Charge::Device,
        writeback: Writeback::Paced,
    };
    const PROBED: Plan = Plan {
        charge: Charge::Probe,
        writeback: Writeback::Kernel,
    };
    const UNTHROTTLED: Plan = Plan {
        charge: Charge::Device,
        writeback: Writeback::Kernel,
    };

    #[test]
    fn without_a_ring_every_request_is_the_threads_and_charged_as_the_policy_says() {
        let (f, _dir) = disk_file();
        let (p, t) = (Policy::default(), disk());
        let r = |op, throttle| route(p, Offer::PREAD, op, &f, throttle, 1 << 20);
        assert_eq!(r(Op::Write, Some(&t)), Route::Pread(PACED));
        assert_eq!(r(Op::Read, Some(&t)), Route::Pread(PROBED));
        assert_eq!(r(Op::Read, None), Route::Pread(UNTHROTTLED));
        // Not even a thread's offer or a tenant takes an engine without a
        // ring anywhere else.
        let all = Offer {
            ring: false,
            paced_thread: true,
            tenant: true,
        };
        assert_eq!(
            route(p, all, Op::Write, &f, Some(&t), 1 << 20),
            Route::Pread(PACED)
        );
    }

    #[test]
    fn a_paced_write_goes_to_a_thread_only_when_offered_and_the_ring_takes_its_length() {
        let (f, _dir) = disk_file();
        let (p, t) = (Policy::default(), disk());
        let thread = Offer {
            paced_thread: true,
            ..Offer::RING
        };
        let r = |offer, op, throttle, len| route(p, offer, op, &f, throttle, len);
        assert_eq!(
            r(thread, Op::Write, Some(&t), 1 << 20),
            Route::PacedThread(PACED)
        );
        assert_eq!(
            r(thread, Op::Write, Some(&t), MAX_IO),
            Route::PacedThread(PACED)
        );
        // Longer than the ring takes: the ring's route, which refuses it.
        assert_eq!(
            r(thread, Op::Write, Some(&t), MAX_IO + 1),
            Route::Ring(PACED)
        );
        // Not offered a thread (the ticket API, a busy ring).
        assert_eq!(
            r(Offer::RING, Op::Write, Some(&t), 1 << 20),
            Route::Ring(PACED)
        );
        // Not paced: unthrottled, a read, or pacing off.
        assert_eq!(
            r(thread, Op::Write, None, 1 << 20),
            Route::Ring(UNTHROTTLED)
        );
        assert_eq!(r(thread, Op::Read, Some(&t), 1 << 20), Route::Ring(PROBED));
        let off = Policy {
            pace_writeback: false,
            ..p
        };
        assert_eq!(
            route(off, thread, Op::Write, &f, Some(&t), 1 << 20),
            Route::Ring(UNTHROTTLED)
        );
    }

    #[test]
    fn only_a_tenants_throttled_read_takes_its_fair_turn_first() {
        let (f, _dir) = disk_file();
        let (p, t) = (Policy::default(), disk());
        let tenant = Offer {
            tenant: true,
            ..Offer::RING
        };
        let r = |offer, op, throttle| route(p, offer, op, &f, throttle, 1 << 20);
        assert_eq!(r(tenant, Op::Read, Some(&t)), Route::TenantRing(PROBED));
        assert_eq!(r(tenant, Op::Read, None), Route::Ring(UNTHROTTLED));
        assert_eq!(r(tenant, Op::Write, Some(&t)), Route::Ring(PACED));
        assert_eq!(r(Offer::RING, Op::Read, Some(&t)), Route::Ring(PROBED));
    }

    /// A tenant's read, booked in its turn, reaches the ring as an
    /// unthrottled request would.
    #[cfg(feature = "tokio")]
    #[test]
    fn a_booked_request_is_planned_as_an_unthrottled_one() {
        assert_eq!(Plan::BOOKED, UNTHROTTLED);
        assert!(!Plan::BOOKED.paced() && PACED.paced());
    }
}
