//! How the async front ends wait without blocking the runtime: on their
//! ring's eventfd (through tokio's reactor) and for a tenant's fair turn.

use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use nix::sys::eventfd::EventFd;
use slotring_throttle::{AsyncReserve, Source, Tenant, ThrottleError, ThrottlePtr};
use tokio::io::unix::AsyncFd;

use crate::error::UringError;
use crate::file::UringFile;
use crate::policy::Op;
use crate::ring_core::{PreIoWait, Submit};
use crate::route::Plan;

/// Wait for the ring's eventfd to signal (async front ends): on readiness
/// drain the counter, then clear readiness, so that the reap that follows
/// sees every CQE posted before, and one posted in between raises a new edge.
pub(crate) fn poll_eventfd(
    efd: &AsyncFd<EventFd>,
    cx: &mut Context<'_>,
) -> Poll<Result<(), UringError>> {
    match efd.poll_read_ready(cx) {
        Poll::Ready(Ok(mut g)) => {
            let _ = g.get_inner().read();
            g.clear_ready();
            Poll::Ready(Ok(()))
        }
        Poll::Ready(Err(source)) => Poll::Ready(Err(UringError::Ring {
            what: "eventfd poll",
            source,
        })),
        Poll::Pending => Poll::Pending,
    }
}

/// Take `tenant`'s fair turn for a read of `len` bytes at `offset` of
/// `file` through every level of `throttle`, without blocking the runtime
/// (the async turn: the task's waker queues in each gate; the head that
/// waits only for time sleeps on a tokio timer), and book its bytes
/// (trimmed at the known end of the file) from `source`
/// (`RingCore::prebook_source`). Returns the delay the IO must still wait, from
/// now. Dropping the future while it is queued hands the turn on.
async fn fair_booking(
    throttle: &ThrottlePtr,
    tenant: &Tenant,
    file: &UringFile,
    (len, offset): (usize, u64),
    source: Source,
    max_block: Duration,
) -> Result<u64, ThrottleError> {
    let amount = (len as u64).min(file.size_hint().saturating_sub(offset));
    if amount == 0 {
        return Ok(0);
    }
    let mut r = AsyncReserve::new(Some(tenant.clone()), amount, max_block, 0, source);
    let mut timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    poll_fn(|cx| {
        loop {
            if let Poll::Ready(out) = r.poll(throttle.as_ref(), cx) {
                return Poll::Ready(out.map(|r| r.delay_ns));
            }
            let Some(after) = r.retry_after() else {
                return Poll::Pending;
            };
            let t = timer.insert(Box::pin(tokio::time::sleep(after)));
            if t.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    })
    .await
}

/// A tenant's read ([`Route::TenantRing`]): its fair turn
/// ([`fair_booking`]), then the ring request that carries the delay left
/// in its timeout SQE, with nothing more to charge ([`Plan::BOOKED`]).
///
/// [`Route::TenantRing`]: crate::route::Route::TenantRing
pub(crate) async fn fair_turn(
    throttle: &ThrottlePtr,
    tenant: &Tenant,
    file: &Arc<UringFile>,
    (len, offset): (usize, u64),
    source: Source,
    max_block: Duration,
) -> Result<Submit, ThrottleError> {
    let delay = fair_booking(throttle, tenant, file, (len, offset), source, max_block).await?;
    let s = Submit::new(
        Plan::BOOKED,
        Op::Read,
        file,
        offset,
        None,
        max_block,
        PreIoWait::Linked,
    );
    Ok(s.prebooked(delay))
}
