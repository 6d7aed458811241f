//! One ring of a [`SharedEngine`](crate::SharedEngine): its [`RingCore`]
//! behind a `std::sync::Mutex` (held only for a non-blocking reap + submit,
//! never across an `await`), and how its completions reach the waiting
//! tasks ([`Reaper`]: the reactor's eventfd pump, or a reaper thread).
//!
//! # Memory ordering
//!
//! The counter that hands out thread indices is `Relaxed` (any distinct
//! value will do). Everything else a ring shares is behind its mutex.

use std::future::poll_fn;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::unix::AsyncFd;

use crate::error::{BufResult, UringError};
use crate::policy::Policy;
use crate::ring_core::{RingCore, Submit};
use crate::shared_engine::Reaper;
use crate::sys::{SlotId, Syscalls, async_eventfd};

/// A stable small index of the calling thread, handed out round-robin.
pub(crate) fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i)
}

/// One ring and how its completions are announced.
pub(crate) struct Shard {
    state: Mutex<ShardState>,
    wake: Wake,
}

pub(crate) struct ShardState {
    pub(crate) core: RingCore,
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
    pub(crate) fn new(
        sys: Box<dyn Syscalls>,
        setup: &crate::sys::SetupParams,
        policy: Policy,
        reaper: Reaper,
    ) -> Result<Arc<Self>, UringError> {
        let mut core = RingCore::new(sys, setup, policy)?;
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

    pub(crate) fn lock(&self) -> MutexGuard<'_, ShardState> {
        // A panic while holding the lock leaves the core consistent enough
        // to free buffers only at their last CQE; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) async fn run(self: Arc<Self>, s: Submit, buf: Vec<u8>) -> BufResult<usize, Vec<u8>> {
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
            match crate::async_wait::poll_eventfd(efd, cx) {
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
