//! The async front end on tokio: an eventfd registered with the ring
//! (`IORING_REGISTER_EVENTFD`, *not* the `_ASYNC` variant, which does not
//! signal the completions of cold reads that io-wq finishes) and watched
//! through [`AsyncFd`]. No helper thread and no driver task: whichever
//! waiting future polled last owns the eventfd registration and reaps for
//! everybody; when it finishes or is dropped it hands the duty to another
//! waiting future by waking it.
//!
//! One engine per thread (tokio current-thread runtime or a `LocalSet`): the
//! engine is `!Send`, so its ring takes no lock and a completion wakes no
//! other thread (a ring shared by the multi-thread runtime's workers costs
//! cross-thread wake-ups; [`crate::SharedEngine`] keeps one per worker, and
//! `cargo xtask bench shared` compares the two).

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use nix::sys::eventfd::EventFd;
use slotring_throttle::{Tenant, ThrottlePtr};
use tokio::io::unix::AsyncFd;

use crate::async_wait::fair_turn;
use crate::counters::UringCounters;
use crate::engine::RingConfig;
use crate::error::{BufResult, UringError};
use crate::file::UringFile;
use crate::policy::{Op, Policy};
use crate::ring_core::{PreIoWait, RingCore, Submit};
use crate::route::{self, Offer, Route};
use crate::sys::{RealSyscalls, SlotId, Syscalls, async_eventfd};

struct Inner {
    core: RefCell<RingCore>,
    efd: AsyncFd<EventFd>,
    /// The request whose waker the eventfd registration currently holds.
    pump: Cell<Option<SlotId>>,
}

/// Throttled IO from async tasks. A waiting request holds no thread, so it
/// parks nothing.
#[derive(Clone)]
pub struct LocalEngine {
    inner: Rc<Inner>,
    /// The tenant its reads are charged as ([`LocalEngine::with_tenant`]).
    tenant: Option<Tenant>,
}

impl std::fmt::Debug for LocalEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEngine")
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl LocalEngine {
    /// A ring with `cfg` on the real kernel. Must be called within a tokio
    /// runtime with IO enabled.
    pub fn new(cfg: &RingConfig) -> Result<Self, UringError> {
        Self::on(cfg, Box::new(RealSyscalls))
    }

    /// Every syscall through `sys` (feature `test-util`: fault injection).
    #[cfg(feature = "test-util")]
    pub fn with_syscalls(cfg: &RingConfig, sys: Box<dyn Syscalls>) -> Result<Self, UringError> {
        Self::on(cfg, sys)
    }

    fn on(cfg: &RingConfig, sys: Box<dyn Syscalls>) -> Result<Self, UringError> {
        if cfg.defer_taskrun {
            // Deferred completions are posted only inside a GETEVENTS enter,
            // so the eventfd would never fire for a task parked in the reactor.
            return Err(UringError::InvalidFlags {
                what: "defer_taskrun on the async front end",
                flags: format!(
                    "defer_taskrun={} single_issuer={}",
                    cfg.defer_taskrun, cfg.single_issuer
                ),
            });
        }
        let mut core = RingCore::new(sys, &cfg.setup()?, cfg.policy)?;
        let efd = async_eventfd().map_err(|source| UringError::Ring {
            what: "eventfd + AsyncFd",
            source,
        })?;
        core.register_eventfd(std::os::fd::AsRawFd::as_raw_fd(efd.get_ref()))?;
        Ok(Self {
            inner: Rc::new(Inner {
                core: RefCell::new(core),
                efd,
                pump: Cell::new(None),
            }),
            tenant: None,
        })
    }

    /// The same engine (same ring), whose reads are charged as `tenant` in
    /// the fair order of every throttler they reach (see
    /// [`crate::SharedEngine::with_tenant`] for what that means and costs).
    pub fn with_tenant(&self, tenant: Tenant) -> Self {
        Self {
            inner: self.inner.clone(),
            tenant: Some(tenant),
        }
    }

    /// The tenant its reads are charged as, if any.
    pub fn tenant(&self) -> Option<&Tenant> {
        self.tenant.as_ref()
    }

    /// Read up to `buf.len()` bytes at `offset`. Dropping the future cancels
    /// the request; the buffer then stays with the engine until the last CQE
    /// of its chain arrives.
    pub async fn read_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> BufResult<usize, Vec<u8>> {
        let offer = Offer {
            tenant: self.tenant.is_some(),
            ..Offer::RING
        };
        let s = match (
            route::route(self.policy(), offer, Op::Read, file, throttle, buf.len()),
            &self.tenant,
            throttle,
        ) {
            (Route::TenantRing(plan), Some(tenant), Some(t)) => {
                let source = self.inner.core.borrow_mut().prebook_source(
                    plan.charge,
                    file,
                    offset,
                    buf.len() as u64,
                );
                let range = (buf.len(), offset);
                match fair_turn(t, tenant, file, range, source, max_block).await {
                    Ok(s) => s,
                    Err(e) => return (Err(e.into()), buf),
                }
            }
            (route, ..) => Submit::new(
                route.plan(),
                Op::Read,
                file,
                offset,
                throttle,
                max_block,
                PreIoWait::Linked,
            ),
        };
        self.run(s, buf).await
    }

    /// Write all of `buf` at `offset`.
    pub async fn write_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> BufResult<usize, Vec<u8>> {
        let plan = route::route(
            self.policy(),
            Offer::RING,
            Op::Write,
            file,
            throttle,
            buf.len(),
        )
        .plan();
        let s = Submit::new(
            plan,
            Op::Write,
            file,
            offset,
            throttle,
            max_block,
            PreIoWait::Linked,
        );
        self.run(s, buf).await
    }

    /// The policy of its ring (what its requests are routed by).
    fn policy(&self) -> Policy {
        self.inner.core.borrow().policy()
    }

    async fn run(&self, s: Submit, buf: Vec<u8>) -> BufResult<usize, Vec<u8>> {
        let id = self.inner.core.borrow_mut().submit(s, buf);
        let mut guard = CancelOnDrop {
            inner: &self.inner,
            id,
            armed: true,
        };
        let out = poll_fn(|cx| self.inner.poll_req(id, cx)).await;
        guard.armed = false;
        self.inner.hand_off(id);
        out
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> UringCounters {
        self.inner.core.borrow().counters()
    }

    /// Requests not yet collected (including dropped ones still owed CQEs).
    pub fn in_flight(&self) -> usize {
        self.inner.core.borrow().in_flight()
    }

    /// A one-line-per-request description of the engine's state (diagnostics).
    pub fn debug_state(&self) -> String {
        format!(
            "pump={:?}\n{}",
            self.inner.pump.get(),
            self.inner.core.borrow().dump()
        )
    }

    /// Reap, advance and submit without waiting (e.g. to retire dropped
    /// requests).
    pub fn poll_progress(&self) -> Result<(), UringError> {
        let mut core = self.inner.core.borrow_mut();
        core.submit_and_reap()?;
        core.flush()
    }
}

impl Inner {
    fn poll_req(&self, id: SlotId, cx: &mut Context<'_>) -> Poll<BufResult<usize, Vec<u8>>> {
        loop {
            if let Some(done) = self.core.borrow_mut().poll_progress(id, cx.waker()) {
                return Poll::Ready(done);
            }
            self.pump.set(Some(id));
            match crate::async_wait::poll_eventfd(&self.efd, cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => {
                    self.core.borrow_mut().ignore(id);
                    return Poll::Ready((Err(e), Vec::new()));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// If `id` held the eventfd registration (or nobody does, e.g. because
    /// the request woken to take it over was dropped before it polled),
    /// pass it to a waiting request by waking it.
    fn hand_off(&self, id: SlotId) {
        let pump = self.pump.get();
        if pump == Some(id) || pump.is_none() {
            self.pump.set(None);
            self.core.borrow_mut().wake_one_waiting(id);
        }
    }
}

struct CancelOnDrop<'a> {
    inner: &'a Rc<Inner>,
    id: SlotId,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            {
                let mut core = self.inner.core.borrow_mut();
                core.ignore(self.id);
                let _ = core.flush();
            }
            self.inner.hand_off(self.id);
        }
    }
}
