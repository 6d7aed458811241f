//! The one error type of this crate. Being throttled is not an error: it is
//! the `bool`/[`crate::Reservation`] a call returns.

use nix::errno::Errno;

/// What can go wrong when charging or waiting on a throttler.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThrottleError {
    /// A [`Workload`](crate::Workload) refused the request (removed, not a
    /// leaf, or a cap's arithmetic out of range): the workload's error,
    /// naming it and the value.
    #[error(transparent)]
    Workload(#[from] crate::WorkloadError),
    /// The lifetime `limit` was exceeded. The tokens were already charged, as
    /// in ClickHouse, so the bucket stays consistent. The lifetime count
    /// saturates at `u64::MAX`; a saturated count exceeds every limit, so
    /// `count` may equal `limit` when `limit` is `u64::MAX`.
    #[error("{message} Maximum: {limit} (throttler `{name}` has counted {count})")]
    LimitExceeded {
        /// Throttler name.
        name: String,
        /// The configured lifetime limit.
        limit: u64,
        /// The lifetime count after this charge.
        count: u64,
        /// The configured message (ClickHouse's `limit_exceeded_exception_message`).
        message: String,
    },
    /// The accumulated debt would leave the exact fixed-point range (2¹⁰⁰
    /// nano-tokens, about 1.27·10²¹ tokens). Nothing was charged, and the
    /// lifetime count did not move.
    #[error("throttler `{name}`: debt would reach {debt_tokens} tokens (max {max_tokens})")]
    DebtOverflow {
        /// Throttler name.
        name: String,
        /// The debt the charge would have produced, in tokens.
        debt_tokens: u128,
        /// The largest debt kept exact, in tokens.
        max_tokens: u128,
    },
    /// A rate above the largest exactly representable one.
    #[error("max_speed {rate} tokens/s exceeds the largest supported rate {max}")]
    RateTooLarge {
        /// The rejected rate.
        rate: u64,
        /// The largest accepted rate.
        max: u64,
    },
    /// A burst that, at the configured rate, leaves the fixed-point range.
    #[error("burst of {burst_ns} ns at {rate} tokens/s exceeds the supported range")]
    BurstTooLarge {
        /// The rejected burst duration.
        burst_ns: u64,
        /// The rate it was combined with.
        rate: u64,
    },
    /// The clock failed while waiting (`clock_nanosleep`/`clock_gettime`).
    #[error("throttler `{name}`: waiting failed")]
    Wait {
        /// Throttler name.
        name: String,
        /// The error the OS returned.
        #[source]
        errno: Errno,
    },
    /// A tenant weight of 0 or above the largest supported one.
    #[error("tenant `{name}`: weight {weight} is outside 1..={max}")]
    TenantWeight {
        /// Tenant name.
        name: String,
        /// The rejected weight.
        weight: u32,
        /// The largest accepted weight.
        max: u32,
    },
    /// A catch-up bound above the largest supported one.
    #[error("catch-up bound tau of {tau_ns} ns exceeds the largest supported {max_ns} ns")]
    TauTooLarge {
        /// The rejected bound, ns.
        tau_ns: u128,
        /// The largest accepted bound, ns.
        max_ns: u128,
    },
    /// An operations limit set on a throttler built without one.
    #[error("throttler `{name}`: cannot set an operations limit of {ops}/s: built without one")]
    NoOpsLimit {
        /// Throttler name.
        name: String,
        /// The rejected limit.
        ops: u64,
    },
}

#[cfg(test)]
mod tests {
    use std::error::Error;
    use std::sync::Arc;
    use std::time::Duration;

    use nix::errno::Errno;

    use crate::{Clock, Throttle, Throttler, WaitStrategy};

    /// A wait strategy whose clock always fails.
    #[derive(Debug)]
    struct FailingWait;

    impl WaitStrategy for FailingWait {
        fn wait_until(&self, _: &dyn Clock, _: u64) -> Result<(), Errno> {
            Err(Errno::EIO)
        }
    }

    /// The error and its causes, as `{:#}` of an `anyhow` chain prints them.
    fn chain(e: &dyn Error) -> String {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    }

    #[test]
    fn a_failed_wait_names_the_throttler_and_keeps_the_os_error_once() {
        let t = Throttler::builder(1)
            .name("disk")
            .wait_strategy(Arc::new(FailingWait))
            .build()
            .unwrap();
        let err = t.throttle(10, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, crate::ThrottleError::Wait { .. }), "{err:?}");
        let source = err.source().expect("the OS error is the source");
        assert_eq!(source.to_string(), Errno::EIO.to_string());
        let text = chain(&err);
        assert!(
            text.starts_with("throttler `disk`: waiting failed"),
            "{text}"
        );
        assert_eq!(text.matches(&Errno::EIO.to_string()).count(), 1, "{text}");
    }
}
