//! What the engines share: their configuration ([`RingConfig`], the async
//! front end's too), the [`IoEngine`] trait of the two blocking engines, and
//! [`open_engine`], which picks io_uring where the kernel allows it and
//! falls back to `pread`, naming the cause.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use slotring_throttle::ThrottlePtr;

use crate::counters::UringCounters;
use crate::error::{BufResult, UringError};
use crate::file::UringFile;
use crate::policy::Policy;
use crate::pread_engine::PreadEngine;
use crate::sys::{RealSyscalls, SetupParams, Syscalls};
use crate::uring_engine::UringEngine;

/// Ring size, setup flags and policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    /// SQ entries (a power of two is used by the kernel).
    pub entries: u32,
    /// CQ entries (0 = twice `entries`).
    pub cq_entries: u32,
    /// `IORING_SETUP_SQPOLL` with this idle time (ms). A loss on 2 vCPUs.
    pub sqpoll_idle_ms: Option<u32>,
    /// `IORING_SETUP_COOP_TASKRUN`.
    pub coop_taskrun: bool,
    /// `IORING_SETUP_SINGLE_ISSUER` (then only the creating thread may submit).
    pub single_issuer: bool,
    /// `IORING_SETUP_DEFER_TASKRUN` (needs `single_issuer`; blocking front end only).
    pub defer_taskrun: bool,
    /// Detection and guard switches.
    pub policy: Policy,
}

impl Default for RingConfig {
    fn default() -> Self {
        Self {
            entries: 256,
            cq_entries: 0,
            sqpoll_idle_ms: None,
            coop_taskrun: false,
            single_issuer: false,
            defer_taskrun: false,
            policy: Policy::default(),
        }
    }
}

impl RingConfig {
    pub(crate) fn setup(&self) -> Result<SetupParams, UringError> {
        if self.entries == 0 || self.entries > 32_768 {
            return Err(UringError::Invalid {
                what: "ring entries",
                value: u64::from(self.entries),
            });
        }
        if self.defer_taskrun && !self.single_issuer {
            return Err(UringError::InvalidFlags {
                what: "defer_taskrun without single_issuer",
                flags: format!(
                    "defer_taskrun={} single_issuer={}",
                    self.defer_taskrun, self.single_issuer
                ),
            });
        }
        Ok(SetupParams {
            entries: self.entries,
            cq_entries: self.cq_entries,
            sqpoll_idle_ms: self.sqpoll_idle_ms,
            coop_taskrun: self.coop_taskrun,
            single_issuer: self.single_issuer,
            defer_taskrun: self.defer_taskrun,
        })
    }
}

/// Throttled positional IO, blocking style. Both engines implement it, so a
/// caller never has to special-case a kernel without io_uring.
pub trait IoEngine: Send {
    /// Read up to `buf.len()` bytes at `offset` into `buf`, charged to
    /// `throttle` (each level waits at most `max_block`). Returns the bytes
    /// read (fewer only at EOF) and the buffer.
    fn read_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> BufResult<usize, Vec<u8>>;

    /// Write all of `buf` at `offset`, charged to `throttle`. A throttled
    /// buffered write on a disk filesystem is paced (written in booked
    /// pieces, each followed by the start of its writeback); a failure is
    /// [`UringError::Write`] with the bytes written before it.
    ///
    /// [`UringError::Write`]: crate::UringError::Write
    fn write_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> BufResult<usize, Vec<u8>>;

    /// A snapshot of the counters.
    fn counters(&self) -> UringCounters;

    /// `"io_uring"` or `"pread"`.
    fn kind(&self) -> &'static str;

    /// Have every paced write that the engine does in the calling thread
    /// (every paced write of a [`PreadEngine`]; those of a
    /// [`UringEngine`] while it holds no other request) look at `flag`
    /// throughout: before a piece is booked, while it waits for its turn,
    /// for room under the writeback cap and for the catch-up pacer (each
    /// such wait sleeps in slices of at most [`CANCEL_POLL`]), and before
    /// its `pwrite`. Once `flag` is set, the write waits for the device to
    /// complete the pieces it wrote and ends as [`UringError::Cancelled`].
    /// Reads and unpaced writes never look at it: their throttle waits are
    /// capped by `max_block` and always waited out (a shortened wait would
    /// break the rate). Returns whether the engine honours the flag; both
    /// engines of this crate do, and an engine that cannot keeps the
    /// default, which changes nothing and says so (`false`).
    ///
    /// [`UringError::Cancelled`]: crate::UringError::Cancelled
    fn cancel_paced_writes_on(&mut self, flag: Arc<AtomicBool>) -> bool {
        let _ = flag;
        false
    }
}

/// The longest a paced write done in its caller's thread sleeps without
/// looking at its cancel flag ([`IoEngine::cancel_paced_writes_on`]).
pub const CANCEL_POLL: Duration = Duration::from_millis(50);

/// The io_uring engine if the kernel lets us have one; otherwise the `pread`
/// engine and the reason io_uring could not be used.
pub fn open_engine(cfg: &RingConfig) -> (Box<dyn IoEngine>, Option<UringError>) {
    open_engine_on(cfg, &|| Box::new(RealSyscalls))
}

/// [`open_engine`] with every syscall of either engine going through a seam
/// made by `sys` (feature `test-util`: fault injection).
#[cfg(feature = "test-util")]
pub fn open_engine_with(
    cfg: &RingConfig,
    sys: &dyn Fn() -> Box<dyn Syscalls>,
) -> (Box<dyn IoEngine>, Option<UringError>) {
    open_engine_on(cfg, sys)
}

fn open_engine_on(
    cfg: &RingConfig,
    sys: &dyn Fn() -> Box<dyn Syscalls>,
) -> (Box<dyn IoEngine>, Option<UringError>) {
    match UringEngine::on(cfg, sys()) {
        Ok(e) => (Box::new(e), None),
        Err(err) => (Box::new(PreadEngine::on(cfg.policy, sys())), Some(err)),
    }
}
