//! `cargo xtask bench throttle`, its io_uring part: the suite's 1 ms
//! throttle waits on a per-thread io_uring ring ([`RingWait`], the wait
//! strategy the facade installs by default) instead of the nanosleep.
//! slotring-throttle's `throttle` bench writes `target/bench/throttle.json`
//! first (its nanosleep's overshoot is `wait_overshoot_us_p50`); this one
//! adds `wait_overshoot_us_p50_ring` to it (slotring-throttle knows nothing
//! of io_uring).

use slotring_benchkit::{Report, median, overshoots_us};
use slotring_throttle::{MonotonicClock, WaitStrategy};
use slotring_uring::RingWait;

fn main() {
    let mut r = Report::adding_to("throttle");
    let clock = MonotonicClock::shared();
    let waits = |ring: RingWait| {
        let wait = |deadline| ring.wait_until(clock.as_ref(), deadline).unwrap();
        overshoots_us(300, 1_000_000, || clock.now_ns(), wait)
    };
    match RingWait::new().map(waits) {
        Ok(mut overshoot) => r.put(
            "wait_overshoot_us_p50_ring",
            median(&mut overshoot),
            "ring-timeout wait, 1 ms deficits; goal <= 0.5 x the nanosleep's",
        ),
        Err(e) => eprintln!("wait_overshoot_us_p50_ring not measured: {e}"),
    }
    r.finish().expect("write target/bench/throttle.json");
}
