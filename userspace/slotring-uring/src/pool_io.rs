//! Calls on tokio's blocking pool for a [`SharedEngine`]: its paced writes
//! ([`PacedWrites::BlockingPool`]) and, where io_uring is unavailable, every
//! request, each done by [`ThreadIo`] in one pool thread.
//!
//! # Memory ordering
//!
//! A blocking call's cancel flag is `Relaxed` (it carries no data; a late
//! look costs one piece). The count of blocking calls is decremented with
//! `Release` after the call's counters are merged and its room under the
//! writeback caps is given back, and read with `Acquire`
//! ([`SharedEngine::in_flight`]), so that whoever sees it reach zero sees
//! those too.
//!
//! [`SharedEngine`]: crate::SharedEngine
//! [`SharedEngine::in_flight`]: crate::SharedEngine::in_flight

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slotring_throttle::{Tenant, ThrottlePtr};

use crate::counters::UringCounters;
use crate::error::{BufResult, UringError};
use crate::file::UringFile;
use crate::policy::{Op, Policy};
use crate::route::Plan;
use crate::shared_engine::{PacedWrites, SharedConfig};
use crate::sys::SysFactory;
use crate::thread_io::ThreadIo;

/// Calls on tokio's blocking pool (`thread_io::ThreadIo`, the `pread` engine's
/// code, with the same charging policy as the rings): the paced writes, and
/// every request on the fallback. Its throttle sleeps park the pool thread,
/// which holds no CPU lease.
pub(crate) struct PoolIo {
    policy: Policy,
    paced_writes: PacedWrites,
    sys: SysFactory,
    pub(crate) counters: Mutex<UringCounters>,
    /// Calls counted from before their spawn until they return or are
    /// dropped unrun (see "Memory ordering").
    pub(crate) running: AtomicUsize,
}

/// A request for the pool, taken by value (its future borrows nothing).
pub(crate) struct PoolRequest {
    pub(crate) op: Op,
    pub(crate) file: Arc<UringFile>,
    pub(crate) buf: Vec<u8>,
    pub(crate) offset: u64,
    pub(crate) throttle: Option<ThrottlePtr>,
    pub(crate) max_block: Duration,
}

/// One call counted in [`PoolIo::running`], from before its spawn until it
/// returns or is dropped unrun (a runtime shutting down): the token that
/// [`PoolIo::run`] takes.
pub(crate) struct Call(Arc<PoolIo>);

impl Drop for Call {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Release);
    }
}

/// Sets a blocking call's cancel flag when its future goes (dropped, or
/// done: a call that has returned no longer looks).
struct CancelFlag(Arc<AtomicBool>);

impl Drop for CancelFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl PoolIo {
    pub(crate) fn new(cfg: &SharedConfig, sys: SysFactory) -> Self {
        Self {
            policy: cfg.ring.policy,
            paced_writes: cfg.paced_writes,
            sys,
            counters: Mutex::new(UringCounters::default()),
            running: AtomicUsize::new(0),
        }
    }

    /// A call on the fallback (every request, however many).
    pub(crate) fn call(self: &Arc<Self>) -> Call {
        self.running.fetch_add(1, Ordering::Relaxed);
        Call(self.clone())
    }

    /// The policy of the engine's requests.
    pub(crate) fn policy(&self) -> Policy {
        self.policy
    }

    /// Whether paced writes may run here ([`PacedWrites::BlockingPool`]):
    /// what the engine offers a paced write ([`Route::PacedThread`]).
    ///
    /// [`Route::PacedThread`]: crate::route::Route::PacedThread
    pub(crate) fn takes_paced_writes(&self) -> bool {
        matches!(self.paced_writes, PacedWrites::BlockingPool { .. })
    }

    /// A call for a paced write, if this pool runs one now: polled inside a
    /// tokio runtime, and fewer than `at_once` such calls running.
    pub(crate) fn paced_call(self: &Arc<Self>) -> Option<Call> {
        let PacedWrites::BlockingPool { at_once } = self.paced_writes else {
            return None;
        };
        tokio::runtime::Handle::try_current().ok()?;
        self.running
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < at_once).then_some(n + 1)
            })
            .ok()?;
        Some(Call(self.clone()))
    }

    /// Add one call's counters: each counter summed, the high-water mark
    /// of dirty bytes the highest of any call's (one paced write's; calls
    /// at once are not added up).
    fn merge(&self, c: UringCounters) {
        let mut all = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let high = all.dirty_high_water_bytes.max(c.dirty_high_water_bytes);
        *all += c;
        all.dirty_high_water_bytes = high;
    }

    /// Run request `r` as `plan` says in one pool thread (`tenant` current
    /// there), counted by `call` until it returns.
    pub(crate) async fn run(
        call: Call,
        plan: Plan,
        r: PoolRequest,
        tenant: Option<Tenant>,
    ) -> BufResult<usize, Vec<u8>> {
        let PoolRequest {
            op,
            file,
            mut buf,
            offset,
            throttle,
            max_block,
        } = r;
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        let job = tokio::task::spawn_blocking(move || {
            let pool = &call.0;
            // A blocking-pool thread may block for its turn: the tenant is
            // current on it for this call only.
            let _tenant = tenant.as_ref().map(Tenant::enter);
            let mut sys = (pool.sys)();
            let mut counters = UringCounters::default();
            let mut io = ThreadIo {
                sys: sys.as_mut(),
                policy: pool.policy,
                counters: &mut counters,
                cancel: Some(&flag),
            };
            let out = match op {
                Op::Read => io.read(plan, &file, &mut buf, offset, throttle.as_ref(), max_block),
                Op::Write => io.write(plan, &file, &buf, offset, throttle.as_ref(), max_block),
            };
            pool.merge(counters);
            // `call` is dropped (Release) after the merge above.
            (out, buf)
        });
        let _cancel = CancelFlag(cancel);
        match job.await {
            Ok(out) => out,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down: the call never ran, and its
            // buffer went with it.
            Err(_) => (Err(UringError::Cancelled), Vec::new()),
        }
    }
}
