//! The `Send + Sync + Clone` async front end: [`SharedEngine`], for tasks
//! spawned with `tokio::spawn` on the multi-thread runtime.
//!
//! # Design
//!
//! A few rings ([`SharedConfig::rings`], by default one per CPU), each a
//! [`Core`] behind a `std::sync::Mutex` (held only for a non-blocking reap +
//! submit, never across an `await`). A request goes to the ring of the
//! worker thread that submits it (a thread-local index assigned round-robin
//! on first use), so on the multi-thread runtime each worker mostly submits
//! to its own ring and the mutexes are uncontended; a task that migrates to
//! another worker keeps polling its request's ring.
//!
//! Completions reach the task's `Waker` in one of two ways
//! ([`Reaper`]), both measured in `cargo xtask bench uring` (see
//! ARCHITECTURE.md for the numbers):
//!
//! * [`Reaper::Reactor`] (the default): an eventfd registered with the ring
//!   and watched by tokio's reactor through `AsyncFd`, as in
//!   [`crate::AsyncEngine`]: whichever waiting request polled last holds the
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
//! # Without io_uring
//!
//! [`SharedEngine::open`] falls back to the `pread` engine on tokio's
//! blocking pool (the same charging policy, `policy.rs`, through
//! [`PreadEngine`]) and returns the reason io_uring could not be used, once.
//!
//! # Cancellation
//!
//! Dropping a read's future cancels it: the request becomes `Ignored` in its
//! ring, and its buffer stays with the ring until the last CQE of its chain
//! arrives (see `core.rs`). On the pread fallback the blocking call runs to
//! its end and its buffer is dropped with it.
//!
//! # Memory ordering
//!
//! The only atomic is the counter that hands out thread indices
//! (`Relaxed`: any distinct value will do). Everything else a ring shares
//! is behind its mutex.

use std::future::{Future, poll_fn};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};
use slotring_throttle::{Tenant, ThrottlePtr};
use tokio::io::unix::AsyncFd;

use crate::core::{Core, PreIoWait, Submit};
use crate::counters::UringCounters;
use crate::engine::{IoEngine, RingConfig};
use crate::error::{BufResult, UringError};
use crate::file::UringFile;
use crate::policy::{Op, Policy};
use crate::pread::PreadEngine;
use crate::sys::{RealSyscalls, SlotId, Syscalls, async_eventfd};

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
}

impl Default for SharedConfig {
    fn default() -> Self {
        Self {
            ring: RingConfig::default(),
            rings: 0,
            reaper: Reaper::Reactor,
        }
    }
}

impl SharedConfig {
    fn ring_count(&self) -> usize {
        match self.rings {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }
}

/// Makes the syscall seam of each ring and of each fallback read.
type SysFactory = Arc<dyn Fn() -> Box<dyn Syscalls> + Send + Sync>;

/// Throttled positional IO from any tokio task: `Send + Sync + Clone`, its
/// futures are `Send`. Same semantics as [`crate::AsyncEngine`] (owned
/// buffers handed back with the result, the throttle chain folded into one
/// timeout SQE, `RWF_NOWAIT` page-cache detection, the disk-rate guard,
/// cancellation by drop), on a few shared rings, or on the `pread` engine
/// on tokio's blocking pool where io_uring is unavailable.
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
/// charged piece by piece inside the ring).
#[derive(Clone)]
pub struct SharedEngine {
    backend: Backend,
    tenant: Option<Tenant>,
}

#[derive(Clone)]
enum Backend {
    Uring(Arc<[Arc<Shard>]>),
    Pread(Arc<PreadPool>),
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
            Err(err @ UringError::Unavailable { .. }) => {
                let pool = PreadPool {
                    policy: cfg.ring.policy,
                    sys,
                    counters: Mutex::new(UringCounters::default()),
                };
                Ok((
                    Self {
                        backend: Backend::Pread(Arc::new(pool)),
                        tenant: None,
                    },
                    Some(err),
                ))
            }
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
            tenant: None,
        })
    }

    /// The same engine (same rings), whose reads are charged as `tenant`
    /// (see "Tenants" above). Cheap: clone one per query or per user.
    pub fn with_tenant(&self, tenant: Tenant) -> Self {
        Self {
            backend: self.backend.clone(),
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
            Backend::Pread(_) => "pread",
        }
    }

    /// Number of rings (0 on the pread fallback).
    pub fn rings(&self) -> usize {
        match &self.backend {
            Backend::Uring(s) => s.len(),
            Backend::Pread(_) => 0,
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

    /// Write all of `buf` at `offset`, charged to `throttle`.
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
        let backend = self.backend.clone();
        let (file, throttle) = (file.clone(), throttle.cloned());
        let tenant = self.tenant.clone().filter(|_| op == Op::Read);
        async move {
            match backend {
                Backend::Uring(shards) => {
                    let s = match (&tenant, &throttle) {
                        (Some(tenant), Some(t)) => {
                            let len = buf.len() as u64;
                            let source = shards[thread_index() % shards.len()]
                                .lock()
                                .core
                                .prebook_source(op, &file, offset, len, t);
                            let booked = crate::tokio::fair_booking(
                                t,
                                tenant,
                                &file,
                                (buf.len(), offset),
                                source,
                                max_block,
                            )
                            .await;
                            match booked {
                                Ok(delay) => Submit::new(
                                    op,
                                    &file,
                                    offset,
                                    None,
                                    max_block,
                                    PreIoWait::Linked,
                                )
                                .prebooked(delay),
                                Err(e) => return (Err(e.into()), buf),
                            }
                        }
                        _ => Submit::new(
                            op,
                            &file,
                            offset,
                            throttle.as_ref(),
                            max_block,
                            PreIoWait::Linked,
                        ),
                    };
                    // The ring of the worker that submits (after the turn,
                    // which the task may have waited for on another one).
                    let shard = shards[thread_index() % shards.len()].clone();
                    shard.run(s, buf).await
                }
                Backend::Pread(pool) => {
                    pool.run(op, file, buf, offset, throttle, max_block, tenant)
                        .await
                }
            }
        }
    }

    /// The counters of every ring (or of the fallback), summed.
    pub fn counters(&self) -> UringCounters {
        match &self.backend {
            Backend::Uring(shards) => shards.iter().map(|s| s.lock().core.counters()).sum(),
            Backend::Pread(pool) => *pool.counters.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Requests not yet collected, including dropped ones still owed CQEs (0
    /// on the fallback).
    pub fn in_flight(&self) -> usize {
        match &self.backend {
            Backend::Uring(shards) => shards.iter().map(|s| s.lock().core.in_flight()).sum(),
            Backend::Pread(_) => 0,
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

/// A stable small index of the calling thread, handed out round-robin.
fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i)
}

/// One ring and how its completions are announced.
struct Shard {
    state: Mutex<ShardState>,
    wake: Wake,
}

struct ShardState {
    core: Core,
    /// The request whose waker the eventfd registration holds
    /// ([`Reaper::Reactor`]).
    pump: Option<SlotId>,
}

enum Wake {
    Reactor(AsyncFd<EventFd>),
    /// The reaper thread's eventfd (blocking); written once more on drop to
    /// let the thread see the shard is gone.
    Thread(Arc<EventFd>),
}

impl Shard {
    fn new(
        sys: Box<dyn Syscalls>,
        setup: &crate::sys::SetupParams,
        policy: Policy,
        reaper: Reaper,
    ) -> Result<Arc<Self>, UringError> {
        let mut core = Core::new(sys, setup, policy)?;
        let efd_failed = |source| UringError::Ring {
            what: "eventfd",
            source,
        };
        let wake = match reaper {
            Reaper::Reactor => Wake::Reactor(async_eventfd().map_err(efd_failed)?),
            Reaper::Thread => Wake::Thread(Arc::new(
                EventFd::from_flags(EfdFlags::EFD_CLOEXEC)
                    .map_err(|e| efd_failed(std::io::Error::from(e)))?,
            )),
        };
        let fd = match &wake {
            Wake::Reactor(a) => a.get_ref().as_raw_fd(),
            Wake::Thread(e) => e.as_raw_fd(),
        };
        core.register_eventfd(fd)?;
        let shard = Arc::new(Self {
            state: Mutex::new(ShardState { core, pump: None }),
            wake,
        });
        if let Wake::Thread(efd) = &shard.wake {
            let (efd, weak) = (efd.clone(), Arc::downgrade(&shard));
            std::thread::Builder::new()
                .name("slotring-reaper".into())
                .spawn(move || {
                    // Ends when the shard is gone (its drop writes the
                    // eventfd once more) or the eventfd fails.
                    while efd.read().is_ok() {
                        let Some(shard) = weak.upgrade() else { break };
                        // A failed flush is seen by the next poll of a
                        // waiting request, which fails it.
                        let _ = shard.lock().core.flush();
                    }
                })
                .map_err(|source| UringError::Ring {
                    what: "spawn the reaper thread",
                    source,
                })?;
        }
        Ok(shard)
    }

    fn lock(&self) -> MutexGuard<'_, ShardState> {
        // A panic while holding the lock leaves the core consistent enough
        // to free buffers only at their last CQE; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn run(self: Arc<Self>, s: Submit, buf: Vec<u8>) -> BufResult<usize, Vec<u8>> {
        let id = self.lock().core.submit(s, buf);
        let mut guard = CancelOnDrop {
            shard: &self,
            id,
            armed: true,
        };
        let out = poll_fn(|cx| self.poll_req(id, cx)).await;
        guard.armed = false;
        self.hand_off(&mut self.lock(), id);
        out
    }

    fn poll_req(&self, id: SlotId, cx: &mut Context<'_>) -> Poll<BufResult<usize, Vec<u8>>> {
        let mut st = self.lock();
        loop {
            if let Some(done) = st.core.poll_progress(id, cx.waker()) {
                return Poll::Ready(done);
            }
            let Wake::Reactor(efd) = &self.wake else {
                // The reaper thread reaps after the next CQE and wakes us.
                return Poll::Pending;
            };
            // Under the lock: the pump and the registration change together.
            st.pump = Some(id);
            match crate::core::poll_eventfd(efd, cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => {
                    st.core.ignore(id);
                    return Poll::Ready((Err(e), Vec::new()));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// If `id` held the eventfd registration (or nobody does), pass it to a
    /// waiting request by waking it.
    fn hand_off(&self, st: &mut ShardState, id: SlotId) {
        if matches!(self.wake, Wake::Reactor(_)) && (st.pump == Some(id) || st.pump.is_none()) {
            st.pump = None;
            st.core.wake_one_waiting(id);
        }
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        if let Wake::Thread(efd) = &self.wake {
            // Wake the reaper thread so it sees the shard is gone.
            let _ = efd.write(1);
        }
    }
}

struct CancelOnDrop<'a> {
    shard: &'a Arc<Shard>,
    id: SlotId,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut st = self.shard.lock();
            st.core.ignore(self.id);
            let _ = st.core.flush();
            self.shard.hand_off(&mut st, self.id);
        }
    }
}

/// The fallback: each IO is one [`PreadEngine`] call on tokio's blocking
/// pool (the same charging policy as the ring; its throttle sleeps park the
/// blocking thread, which holds no CPU lease).
struct PreadPool {
    policy: Policy,
    sys: SysFactory,
    counters: Mutex<UringCounters>,
}

impl PreadPool {
    #[expect(
        clippy::too_many_arguments,
        reason = "the request's fields, as SharedEngine::run passes them"
    )]
    async fn run(
        self: Arc<Self>,
        op: Op,
        file: Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<ThrottlePtr>,
        max_block: Duration,
        tenant: Option<Tenant>,
    ) -> BufResult<usize, Vec<u8>> {
        let pool = self.clone();
        let job = tokio::task::spawn_blocking(move || {
            // A blocking-pool thread may block for its turn: the tenant is
            // current on it for this call only.
            let _tenant = tenant.as_ref().map(Tenant::enter);
            let mut e = PreadEngine::on(pool.policy, (pool.sys)());
            let out = match op {
                Op::Read => e.read_at(&file, buf, offset, throttle.as_ref(), max_block),
                Op::Write => e.write_at(&file, buf, offset, throttle.as_ref(), max_block),
            };
            let mut c = pool.counters.lock().unwrap_or_else(|p| p.into_inner());
            *c += e.counters();
            out
        });
        match job.await {
            Ok(out) => out,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down; the blocking call keeps its buffer.
            Err(_) => (Err(UringError::Cancelled), Vec::new()),
        }
    }
}

/// Throttled positional IO from async code, whichever front end serves it:
/// [`SharedEngine`] (any task, `Send` futures) or [`crate::AsyncEngine`]
/// (one per thread, for thread-per-core runtimes, where it takes no lock).
/// Code generic over it runs on either.
pub trait AsyncIo {
    /// Read up to `buf.len()` bytes at `offset`, charged to `throttle`;
    /// the bytes read (fewer only at EOF) and the buffer. Dropping the
    /// future cancels the request.
    fn read_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>>;

    /// Write all of `buf` at `offset`, charged to `throttle`.
    fn write_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>>;

    /// A snapshot of the counters.
    fn counters(&self) -> UringCounters;
}

impl AsyncIo for SharedEngine {
    fn read_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>> {
        SharedEngine::read_at(self, file, buf, offset, throttle, max_block)
    }

    fn write_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>> {
        SharedEngine::write_at(self, file, buf, offset, throttle, max_block)
    }

    fn counters(&self) -> UringCounters {
        SharedEngine::counters(self)
    }
}

impl AsyncIo for crate::AsyncEngine {
    fn read_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>> {
        crate::AsyncEngine::read_at(self, file, buf, offset, throttle, max_block)
    }

    fn write_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>> {
        crate::AsyncEngine::write_at(self, file, buf, offset, throttle, max_block)
    }

    fn counters(&self) -> UringCounters {
        crate::AsyncEngine::counters(self)
    }
}
