//! The `Send + Sync + Clone` async front end: [`SharedEngine`], for tasks
//! spawned with `tokio::spawn` on the multi-thread runtime.
//!
//! # Design
//!
//! A few rings ([`SharedConfig::rings`], by default one per CPU), each a
//! `RingCore` behind a `std::sync::Mutex` (held only for a non-blocking
//! reap + submit, never across an `await`). A request goes to the ring of the
//! worker thread that submits it (a thread-local index assigned round-robin
//! on first use), so on the multi-thread runtime each worker mostly submits
//! to its own ring and the mutexes are uncontended; a task that migrates to
//! another worker keeps polling its request's ring.
//!
//! Completions reach the task's `Waker` in one of two ways
//! ([`Reaper`]), both measured side by side by `cargo xtask bench uring`:
//!
//! * [`Reaper::Reactor`] (the default): an eventfd registered with the ring
//!   and watched by tokio's reactor through `AsyncFd`, as in
//!   [`crate::LocalEngine`]: whichever waiting request polled last holds the
//!   eventfd's read registration (the "pump"), reaps for everybody when it
//!   fires and wakes the requests it completed; a pump that finishes or is
//!   dropped hands the duty to another waiting request by waking it. The
//!   pump and the registration change together under the ring's mutex, so
//!   exactly one waiting request is registered at any time. No thread of
//!   our own.
//! * [`Reaper::Thread`]: one thread per ring blocks on the eventfd and reaps;
//!   tasks only submit and sleep. One more thread per ring and a
//!   cross-thread wake-up per completion.
//!
//! # Paced writes
//!
//! A paced write (a throttled buffered write on a disk filesystem, with
//! [`crate::Policy::pace_writeback`] on) goes, by default
//! ([`PacedWrites::BlockingPool`]), to tokio's blocking pool, where one
//! thread does what the blocking front end does in its caller's thread
//! (`thread_io::ThreadIo`): it sleeps for each piece's turn, `pwrite`s it,
//! starts its writeback with `sync_file_range(2)`, and waits for the device
//! at the writeback depth. On the ring the same write costs an io-wq worker
//! two sleeps and wake-ups per piece and the task a wake-up more (ext4 has
//! no async buffered write, so io_uring runs the copy on io-wq anyway, and
//! `IORING_OP_SYNC_FILE_RANGE` always runs there; `cargo xtask bench write`
//! measures both ways). The price is a pool thread held for the
//! write's whole life, its turns included, and a handoff per request. So
//! at most `at_once` paced writes of an engine run on the pool (tokio's
//! pool has 512 threads by default, shared with the application's own
//! blocking work); those beyond it, and any polled outside a tokio runtime,
//! take the ring's path, as all do with [`PacedWrites::Ring`]. Unpaced
//! writes and all reads stay on the rings.
//!
//! # Without io_uring
//!
//! [`SharedEngine::open`] falls back to the `pread` engine's code on tokio's
//! blocking pool (the same charging policy, `policy.rs`), for every request,
//! and returns the reason io_uring could not be used, once.
//!
//! # Cancellation
//!
//! Dropping a request's future cancels it. On a ring the request becomes
//! `Ignored`, and its buffer stays with the ring until the last CQE of its
//! chain arrives (see `ring_core`). On the blocking pool the call keeps its
//! buffer until it returns: a paced write writes no piece after the drop
//! beyond the one it may be writing (it looks before each piece is booked,
//! after its turn, and after its room and pacer), waits for the device to
//! complete what it wrote, and counts as a cancellation; any other call
//! runs to its end and counts as done, as does a paced write dropped after
//! its last look. [`SharedEngine::in_flight`] counts such calls until they
//! return.
//!
//! # Where the parts live
//!
//! This file holds the engine and its configuration; `shard.rs` one ring
//! behind its mutex and its reaper, `pool_io.rs` the calls on tokio's
//! blocking pool, `async_io.rs` the [`AsyncIo`] trait both async engines
//! implement.
//!
//! [`AsyncIo`]: crate::AsyncIo

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use slotring_throttle::{Tenant, ThrottlePtr};

use crate::async_wait::fair_turn;
use crate::counters::UringCounters;
use crate::engine::RingConfig;
use crate::error::{BufResult, UringError};
use crate::file::UringFile;
use crate::policy::Op;
use crate::pool_io::{PoolIo, PoolRequest};
use crate::ring_core::{PreIoWait, Submit};
use crate::route::{self, Offer, Route};
use crate::shard::{Shard, thread_index};
use crate::sys::{RealSyscalls, SysFactory, Syscalls};

/// How completions reach the waiting tasks (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reaper {
    /// The waiting request that polled last watches the ring's eventfd
    /// through tokio's reactor and reaps for everybody. No extra thread.
    #[default]
    Reactor,
    /// A thread per ring blocks on the eventfd and reaps.
    Thread,
}

/// Configuration of a [`SharedEngine`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedConfig {
    /// Each ring's size, flags and policy (`defer_taskrun` is refused: its
    /// completions would never raise the eventfd).
    pub ring: RingConfig,
    /// How many rings (0 = one per CPU, as `available_parallelism` says).
    pub rings: usize,
    /// How completions reach the tasks.
    pub reaper: Reaper,
    /// Where paced writes run (see the module docs, "Paced writes").
    pub paced_writes: PacedWrites,
}

/// Where a [`SharedEngine`] runs a paced write (see the module docs). On
/// the fallback (no io_uring) every request is a blocking-pool call,
/// whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacedWrites {
    /// On tokio's blocking pool, in one thread that sleeps for each piece's
    /// turn and writes it back itself: the CPU of a thread doing its own
    /// pacing, a pool thread held for the write's life. At most `at_once`
    /// of the engine's paced writes at a time (and only when polled inside
    /// a tokio runtime); the others take the ring's path.
    BlockingPool {
        /// How many paced writes may hold a pool thread at once.
        at_once: usize,
    },
    /// On the ring: each piece's turn a timeout SQE, its write and
    /// writeback linked SQEs on io-wq. No thread held while waiting; more
    /// CPU per piece.
    Ring,
}

impl PacedWrites {
    /// The default `at_once` of [`PacedWrites::BlockingPool`]: an eighth
    /// of tokio's default blocking pool.
    pub const DEFAULT_AT_ONCE: usize = 64;
}

impl Default for PacedWrites {
    fn default() -> Self {
        PacedWrites::BlockingPool {
            at_once: Self::DEFAULT_AT_ONCE,
        }
    }
}

impl Default for SharedConfig {
    fn default() -> Self {
        Self {
            ring: RingConfig::default(),
            rings: 0,
            reaper: Reaper::Reactor,
            paced_writes: PacedWrites::default(),
        }
    }
}

impl SharedConfig {
    pub(crate) fn ring_count(&self) -> usize {
        match self.rings {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }
}

/// Throttled positional IO from any tokio task: `Send + Sync + Clone`, its
/// futures are `Send`. Same semantics as [`crate::LocalEngine`] (owned
/// buffers handed back with the result, the throttle chain folded into one
/// timeout SQE, `RWF_NOWAIT` page-cache detection, the disk-rate guard,
/// cancellation by drop), on a few shared rings; its paced writes on
/// tokio's blocking pool by default ([`PacedWrites`]), and every request
/// there, in the `pread` engine's code, where io_uring is unavailable (see
/// the module docs for both, and for what a drop does there).
///
/// # Tenants
///
/// [`SharedEngine::with_tenant`] gives a handle whose reads are charged as a
/// [`Tenant`] in the fair order of every throttler they reach. The tenant is
/// carried by the handle, not by the thread: a task migrates between worker
/// threads, and a worker runs many tenants' tasks, so the thread's current
/// tenant ([`Tenant::enter`]) means nothing here and is not consulted. The
/// turn is taken without blocking the runtime ([`slotring_throttle::AsyncReserve`]:
/// the task's waker queues in each gate), before the read is submitted; the
/// read's bytes (trimmed at the known end of the file) are then booked and
/// the fair delay goes into the read's timeout SQE. Where the ring would
/// probe for page-cache hits (`RWF_NOWAIT`), the booking asks
/// `cachestat(2)` instead (the ring's own fallback under its disk-rate
/// guard): a read whose pages are all cached is booked as page-cache bytes,
/// any other as device bytes. Writes stay first-come (a paced write is
/// charged piece by piece, on the blocking pool or inside the ring).
#[derive(Clone)]
pub struct SharedEngine {
    backend: Backend,
    /// The blocking pool's calls: paced writes, and every request on the
    /// fallback.
    pool: Arc<PoolIo>,
    tenant: Option<Tenant>,
}

#[derive(Clone)]
enum Backend {
    Uring(Arc<[Arc<Shard>]>),
    /// No ring: every request is a blocking-pool call.
    Pread,
}

impl std::fmt::Debug for SharedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedEngine")
            .field("kind", &self.kind())
            .field("rings", &self.rings())
            .finish()
    }
}

impl SharedEngine {
    /// Rings per `cfg` on the real kernel; fails if io_uring is unavailable
    /// (see [`SharedEngine::open`] for the fallback). With
    /// [`Reaper::Reactor`] it must be called within a tokio runtime with IO
    /// enabled.
    pub fn new(cfg: &SharedConfig) -> Result<Self, UringError> {
        Self::uring(cfg, &real_syscalls())
    }

    /// io_uring if the kernel lets us have it; otherwise `pread` on tokio's
    /// blocking pool and the reason io_uring could not be used (say it
    /// once). An invalid configuration is an error either way.
    pub fn open(cfg: &SharedConfig) -> Result<(Self, Option<UringError>), UringError> {
        Self::open_on(cfg, real_syscalls())
    }

    /// [`SharedEngine::open`] with every syscall of either engine going
    /// through a seam made by `sys` (feature `test-util`: fault injection).
    #[cfg(feature = "test-util")]
    pub fn open_with(
        cfg: &SharedConfig,
        sys: Arc<dyn Fn() -> Box<dyn Syscalls> + Send + Sync>,
    ) -> Result<(Self, Option<UringError>), UringError> {
        Self::open_on(cfg, sys)
    }

    fn open_on(
        cfg: &SharedConfig,
        sys: SysFactory,
    ) -> Result<(Self, Option<UringError>), UringError> {
        match Self::uring(cfg, &sys) {
            Ok(e) => Ok((e, None)),
            Err(err @ UringError::Unavailable { .. }) => Ok((
                Self {
                    backend: Backend::Pread,
                    pool: Arc::new(PoolIo::new(cfg, sys)),
                    tenant: None,
                },
                Some(err),
            )),
            Err(e) => Err(e),
        }
    }

    fn uring(cfg: &SharedConfig, sys: &SysFactory) -> Result<Self, UringError> {
        if cfg.ring.defer_taskrun {
            // Deferred completions are posted only inside a GETEVENTS enter,
            // so the eventfd would never fire.
            return Err(UringError::InvalidFlags {
                what: "defer_taskrun on the async front end",
                flags: format!(
                    "defer_taskrun={} single_issuer={}",
                    cfg.ring.defer_taskrun, cfg.ring.single_issuer
                ),
            });
        }
        if cfg.ring.single_issuer {
            // Tasks on any worker submit to a ring.
            return Err(UringError::InvalidFlags {
                what: "single_issuer on the shared front end",
                flags: format!("single_issuer={}", cfg.ring.single_issuer),
            });
        }
        let setup = cfg.ring.setup()?;
        let shards = (0..cfg.ring_count())
            .map(|_| Shard::new(sys(), &setup, cfg.ring.policy, cfg.reaper))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            backend: Backend::Uring(shards.into()),
            pool: Arc::new(PoolIo::new(cfg, sys.clone())),
            tenant: None,
        })
    }

    /// The same engine (same rings), whose reads are charged as `tenant`
    /// (see "Tenants" above). Cheap: clone one per query or per user.
    pub fn with_tenant(&self, tenant: Tenant) -> Self {
        Self {
            backend: self.backend.clone(),
            pool: self.pool.clone(),
            tenant: Some(tenant),
        }
    }

    /// The tenant its reads are charged as, if any.
    pub fn tenant(&self) -> Option<&Tenant> {
        self.tenant.as_ref()
    }

    /// `"io_uring"` or `"pread"`.
    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Uring(_) => "io_uring",
            Backend::Pread => "pread",
        }
    }

    /// Number of rings (0 on the pread fallback).
    pub fn rings(&self) -> usize {
        match &self.backend {
            Backend::Uring(s) => s.len(),
            Backend::Pread => 0,
        }
    }

    /// Read up to `buf.len()` bytes at `offset`, charged to `throttle`
    /// (each level waits at most `max_block`). Returns the bytes read (fewer
    /// only at EOF) and the buffer. Dropping the future cancels the request;
    /// the buffer then stays with the ring until the last CQE of its chain.
    pub fn read_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>> + Send + 'static {
        self.run(Op::Read, file, buf, offset, throttle, max_block)
    }

    /// Write all of `buf` at `offset`, charged to `throttle`. A paced write
    /// runs where [`SharedConfig::paced_writes`] says; it returns once the
    /// device has every byte of it (pacing is no durability promise:
    /// `fsync` stays the caller's). Dropping the future cancels it (see the
    /// module docs, "Cancellation").
    pub fn write_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>> + Send + 'static {
        self.run(Op::Write, file, buf, offset, throttle, max_block)
    }

    fn run(
        &self,
        op: Op,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>> + Send + 'static {
        // Everything is taken by value now, so the future borrows nothing.
        let (backend, pool) = (self.backend.clone(), self.pool.clone());
        let (file, throttle) = (file.clone(), throttle.cloned());
        let tenant = self.tenant.clone().filter(|_| op == Op::Read);
        async move {
            let offer = match &backend {
                Backend::Pread => Offer::PREAD,
                Backend::Uring(_) => Offer {
                    ring: true,
                    paced_thread: pool.takes_paced_writes(),
                    tenant: tenant.is_some(),
                },
            };
            let len = buf.len();
            let route = route::route(pool.policy(), offer, op, &file, throttle.as_ref(), len);
            let shards = match backend {
                Backend::Uring(shards) => shards,
                Backend::Pread => {
                    let (call, plan) = (pool.call(), route.plan());
                    let r = PoolRequest {
                        op,
                        file,
                        buf,
                        offset,
                        throttle,
                        max_block,
                    };
                    return PoolIo::run(call, plan, r, tenant).await;
                }
            };
            let s = match (route, &tenant, &throttle) {
                (Route::PacedThread(plan), ..) => match pool.paced_call() {
                    Some(call) => {
                        let r = PoolRequest {
                            op,
                            file,
                            buf,
                            offset,
                            throttle,
                            max_block,
                        };
                        return PoolIo::run(call, plan, r, None).await;
                    }
                    // No pool thread for it now: the ring's route.
                    None => Submit::new(
                        plan,
                        op,
                        &file,
                        offset,
                        throttle.as_ref(),
                        max_block,
                        PreIoWait::Linked,
                    ),
                },
                (Route::TenantRing(plan), Some(tenant), Some(t)) => {
                    let source = shards[thread_index() % shards.len()]
                        .lock()
                        .core
                        .prebook_source(plan.charge, &file, offset, len as u64);
                    match fair_turn(t, tenant, &file, (len, offset), source, max_block).await {
                        Ok(s) => s,
                        Err(e) => return (Err(e.into()), buf),
                    }
                }
                (route, ..) => Submit::new(
                    route.plan(),
                    op,
                    &file,
                    offset,
                    throttle.as_ref(),
                    max_block,
                    PreIoWait::Linked,
                ),
            };
            // The ring of the worker that submits (after the turn, which
            // the task may have waited for on another one).
            let shard = shards[thread_index() % shards.len()].clone();
            shard.run(s, buf).await
        }
    }

    /// The counters of every ring and of the blocking pool's calls, summed
    /// (a blocking call's counters join when it returns).
    pub fn counters(&self) -> UringCounters {
        let pool = *self.pool.counters.lock().unwrap_or_else(|p| p.into_inner());
        match &self.backend {
            Backend::Uring(shards) => pool + shards.iter().map(|s| s.lock().core.counters()).sum(),
            Backend::Pread => pool,
        }
    }

    /// Requests not yet collected, including dropped ones still owed CQEs,
    /// and blocking-pool calls not yet returned (dropped ones included).
    pub fn in_flight(&self) -> usize {
        let pool = self.pool.running.load(Ordering::Acquire);
        match &self.backend {
            Backend::Uring(shards) => {
                pool + shards
                    .iter()
                    .map(|s| s.lock().core.in_flight())
                    .sum::<usize>()
            }
            Backend::Pread => pool,
        }
    }

    /// Reap, advance and submit on every ring without waiting (e.g. to
    /// retire dropped requests).
    pub fn poll_progress(&self) -> Result<(), UringError> {
        if let Backend::Uring(shards) = &self.backend {
            for s in shards.iter() {
                let mut st = s.lock();
                st.core.submit_and_reap()?;
                st.core.flush()?;
            }
        }
        Ok(())
    }
}

/// The real kernel's syscalls, for every ring and fallback read.
fn real_syscalls() -> SysFactory {
    Arc::new(|| -> Box<dyn Syscalls> { Box::new(RealSyscalls) })
}
