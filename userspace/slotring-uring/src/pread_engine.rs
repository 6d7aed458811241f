//! The fallback engine where io_uring is unavailable: [`PreadEngine`],
//! ClickHouse's method — `preadv2(RWF_NOWAIT)`, then `pread` for the rest —
//! charging after the read with the policy of `policy.rs` and sleeping with
//! the CPU lease parked. Its every request is [`ThreadIo`]'s, in the
//! caller's thread.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use slotring_throttle::ThrottlePtr;

use crate::counters::UringCounters;
use crate::engine::IoEngine;
use crate::error::BufResult;
use crate::file::UringFile;
use crate::policy::{Op, Policy};
use crate::route::{self, Offer};
use crate::sys::{RealSyscalls, Syscalls};
use crate::thread_io::ThreadIo;

/// The fallback engine: `preadv2(RWF_NOWAIT)` then `pread` (ClickHouse's
/// method), charging after the read and sleeping with the CPU lease parked.
pub struct PreadEngine {
    sys: Box<dyn Syscalls>,
    policy: Policy,
    counters: UringCounters,
    /// Cancels the paced writes ([`IoEngine::cancel_paced_writes_on`]).
    cancel: Option<Arc<AtomicBool>>,
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
        Self::on(policy, Box::new(RealSyscalls))
    }

    /// Every syscall through `sys` (feature `test-util`: fault injection).
    #[cfg(feature = "test-util")]
    pub fn with_syscalls(policy: Policy, sys: Box<dyn Syscalls>) -> Self {
        Self::on(policy, sys)
    }

    pub(crate) fn on(policy: Policy, sys: Box<dyn Syscalls>) -> Self {
        Self {
            sys,
            policy,
            counters: UringCounters::default(),
            cancel: None,
        }
    }

    fn io(&mut self) -> ThreadIo<'_> {
        ThreadIo {
            sys: self.sys.as_mut(),
            policy: self.policy,
            counters: &mut self.counters,
            cancel: self.cancel.as_deref(),
        }
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
        // Without a ring every route is `Route::Pread`.
        let plan = route::route(
            self.policy,
            Offer::PREAD,
            Op::Read,
            file,
            throttle,
            buf.len(),
        )
        .plan();
        let r = self
            .io()
            .read(plan, file, &mut buf, offset, throttle, max_block);
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
        let plan = route::route(
            self.policy,
            Offer::PREAD,
            Op::Write,
            file,
            throttle,
            buf.len(),
        )
        .plan();
        let r = self
            .io()
            .write(plan, file, &buf, offset, throttle, max_block);
        (r, buf)
    }

    fn counters(&self) -> UringCounters {
        self.counters
    }

    fn kind(&self) -> &'static str {
        "pread"
    }

    fn cancel_paced_writes_on(&mut self, flag: Arc<AtomicBool>) -> bool {
        self.cancel = Some(flag);
        true
    }
}
