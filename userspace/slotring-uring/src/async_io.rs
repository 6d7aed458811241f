//! [`AsyncIo`]: the trait both async front ends implement, so that code
//! generic over it runs on either.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use slotring_throttle::ThrottlePtr;

use crate::counters::UringCounters;
use crate::error::BufResult;
use crate::file::UringFile;
use crate::shared_engine::SharedEngine;

/// Throttled positional IO from async code, whichever front end serves it:
/// [`SharedEngine`] (any task, `Send` futures) or [`crate::LocalEngine`]
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

impl AsyncIo for crate::LocalEngine {
    fn read_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>> {
        crate::LocalEngine::read_at(self, file, buf, offset, throttle, max_block)
    }

    fn write_at(
        &self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>> {
        crate::LocalEngine::write_at(self, file, buf, offset, throttle, max_block)
    }

    fn counters(&self) -> UringCounters {
        crate::LocalEngine::counters(self)
    }
}
