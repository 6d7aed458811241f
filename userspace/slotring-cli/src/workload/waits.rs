//! Waits that end soon after the run stops.
//!
//! Every wait of the workload ends within [`STOP_BOUND`] of Ctrl-C (or of
//! the deadline): sleeps are cut into [`STOP_SLICE`]s that look at the stop
//! condition, a slot wait is an `acquire_timeout` of one slice in a loop,
//! CPU work looks at it between blocks, and a throttle wait inside the
//! engine is capped by [`MAX_BLOCK`]. A bucket's debt longer than that cap
//! is waited out *before* the next IO, by [`pay_debt`], in slices and with
//! the CPU lease parked, and no IO starts once stopping: the throttler's
//! rate holds however small it is. Requests already queued in a
//! throttler's fair gate when the run stops drain one booking (at most
//! `MAX_BLOCK`) each. The data file's paced write waits inside the engine
//! for each piece's turn and the catch-up pacer, looking at the stop flag
//! every [`CANCEL_POLL`] (`IoEngine::cancel_paced_writes_on`), at most a
//! slice.

use std::time::{Duration, Instant};

use slotring::throttle::{NANO_PER_TOKEN, Throttler, park_current_lease};
use slotring::uring::CANCEL_POLL;

use super::setup::MAX_BLOCK;

/// The longest a sleep of the workload goes without looking at the stop
/// condition.
pub(super) const STOP_SLICE: Duration = Duration::from_millis(50);

/// The bound on how long after stop any wait of the workload ends.
pub const STOP_BOUND: Duration = Duration::from_millis(200);

const _: () = assert!(STOP_SLICE.as_nanos() + MAX_BLOCK.as_nanos() <= STOP_BOUND.as_nanos());
const _: () = assert!(CANCEL_POLL.as_nanos() <= STOP_SLICE.as_nanos());

/// Sleep until `deadline` or until `stopping()`; whether the deadline was
/// reached.
pub(super) fn sleep_until(deadline: Instant, stopping: &dyn Fn() -> bool) -> bool {
    loop {
        if stopping() {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        std::thread::sleep((deadline - now).min(STOP_SLICE));
    }
}

/// The time until a bucket of `rate` tokens/s holding `tokens_nano`
/// nano-tokens is out of debt (zero when it is not, or when unlimited).
pub(super) fn debt_time(tokens_nano: i128, rate: u64) -> Duration {
    if rate == 0 || tokens_nano >= 0 {
        return Duration::ZERO;
    }
    // nano-tokens / (tokens/s) = ns × NANO_PER_TOKEN / 1e9 = ns.
    let ns = (-tokens_nano) * (1_000_000_000 / NANO_PER_TOKEN) / i128::from(rate);
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// The time until `t`'s bucket is out of debt.
fn debt(t: &Throttler) -> Duration {
    debt_time(t.tokens_nano(), t.max_speed())
}

/// Wait, with the calling thread's CPU lease parked, while `t`'s bucket owes
/// more than a wait capped at [`MAX_BLOCK`] can pay, or until `stopping()`;
/// the time waited. Below that, the request goes on to the throttler, whose
/// fair gate orders the tenants' requests: at rates where one request costs
/// less than `MAX_BLOCK` this never waits, and the order stays the gate's.
pub(super) fn pay_debt(t: &Throttler, stopping: &dyn Fn() -> bool) -> Duration {
    wait_out(&|| debt(t), stopping)
}

/// Wait, CPU lease parked, while `debt()` exceeds [`MAX_BLOCK`], or until
/// `stopping()`; the time waited (zero, and no park, when it does not).
pub(super) fn wait_out(debt: &dyn Fn() -> Duration, stopping: &dyn Fn() -> bool) -> Duration {
    let over = || debt().saturating_sub(MAX_BLOCK);
    if over().is_zero() {
        return Duration::ZERO;
    }
    let start = Instant::now();
    let _parked = park_current_lease();
    loop {
        let d = over();
        if d.is_zero() || stopping() {
            return start.elapsed();
        }
        std::thread::sleep(d.min(STOP_SLICE));
    }
}

#[cfg(test)]
mod tests {
    use slotring::throttle::Throttle;

    use super::*;

    #[test]
    fn debt_is_the_time_to_pay_it_back() {
        let t = Throttler::builder(1000)
            .burst(Duration::from_secs(1))
            .build()
            .unwrap();
        assert_eq!(debt(&t), Duration::ZERO);
        // 1000 tokens of burst, 3000 charged (no wait): 2 s of debt, less
        // the time since.
        t.throttle(3000, Duration::ZERO).unwrap();
        let d = debt(&t);
        assert!(
            d > Duration::from_millis(1500) && d <= Duration::from_secs(2),
            "{d:?}"
        );
    }

    #[test]
    fn waits_end_when_stopping() {
        let t = Throttler::new(1).unwrap();
        let _ = t.throttle(1_000_000, Duration::ZERO);
        assert!(debt(&t) > Duration::from_secs(1000));
        let start = Instant::now();
        let stop_at = start + Duration::from_millis(120);
        let waited = pay_debt(&t, &|| Instant::now() >= stop_at);
        assert!(waited >= Duration::from_millis(120) && waited < Duration::from_secs(100));
        assert!(!sleep_until(start + Duration::from_secs(3600), &|| true));
        assert!(sleep_until(Instant::now(), &|| false));
    }
}
