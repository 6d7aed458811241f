//! [`ThrottlerArray`]: unrelated limits that must all hold, and
//! [`add_throttler`], which builds one.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::async_reserve::AsyncReserve;
use crate::error::ThrottleError;
use crate::throttle::{Reservation, Source, Throttle, ThrottlePtr};
use crate::throttler::Throttler;

/// Unrelated limits that must all hold (ClickHouse's `ThrottlerArray`).
/// Each member is charged in turn and waits for its own deficit, so each
/// keeps its own rate (waits add up, as in ClickHouse).
#[derive(Debug, Clone)]
pub struct ThrottlerArray {
    members: Vec<ThrottlePtr>,
}

impl ThrottlerArray {
    /// An array of `members`.
    pub fn new(members: Vec<ThrottlePtr>) -> Self {
        Self { members }
    }

    /// The members.
    pub fn members(&self) -> &[ThrottlePtr] {
        &self.members
    }
}

impl Throttle for ThrottlerArray {
    fn throttle(&self, amount: u64, max_block: Duration) -> Result<bool, ThrottleError> {
        let mut result = false;
        for t in &self.members {
            result |= t.throttle(amount, max_block)?;
        }
        Ok(result)
    }

    fn throttle_page_cache_read(
        &self,
        amount: u64,
        max_block: Duration,
    ) -> Result<bool, ThrottleError> {
        let mut result = false;
        for t in &self.members {
            result |= t.throttle_page_cache_read(amount, max_block)?;
        }
        Ok(result)
    }

    fn ignores_page_cache_reads(&self) -> bool {
        self.members.iter().any(|t| t.ignores_page_cache_reads())
    }

    fn reserve(
        &self,
        amount: u64,
        max_block: Duration,
        after_ns: u64,
        source: Source,
    ) -> Result<Reservation, ThrottleError> {
        let mut acc = Reservation {
            delay_ns: after_ns,
            blocked: false,
        };
        for t in &self.members {
            let r = t.reserve(amount, max_block, acc.delay_ns, source)?;
            acc = Reservation {
                delay_ns: r.delay_ns,
                blocked: acc.blocked || r.blocked,
            };
        }
        Ok(acc)
    }

    fn refund_page_cache_read(&self, amount: u64) {
        for t in &self.members {
            t.refund_page_cache_read(amount);
        }
    }

    fn poll_reserve(
        &self,
        cx: &mut Context<'_>,
        op: &mut AsyncReserve,
    ) -> Poll<Result<Reservation, ThrottleError>> {
        for t in &self.members {
            match t.poll_reserve(cx, op) {
                Poll::Ready(Ok(_)) => {}
                other => return other,
            }
        }
        Poll::Ready(Ok(op.acc))
    }

    fn visit(&self, f: &mut dyn FnMut(&Throttler)) {
        for t in &self.members {
            t.visit(f);
        }
    }
}

/// Add `new` to `existing`, combining them into a [`ThrottlerArray`] if both
/// exist (ClickHouse's `addThrottler`). Neither throttler's hierarchy changes.
pub fn add_throttler(existing: &mut Option<ThrottlePtr>, new: Option<ThrottlePtr>) {
    match (existing.take(), new) {
        (None, n) => *existing = n,
        (Some(e), None) => *existing = Some(e),
        (Some(e), Some(n)) => *existing = Some(Arc::new(ThrottlerArray::new(vec![e, n]))),
    }
}
