//! Exact arithmetic of the booked waits, with injected clocks: the whole
//! chain's delay becomes one timeout SQE whose length is the sum of every
//! level's wait, each level charged when the previous level's wait ends.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use slotring_throttle::{Clock, ManualClock, ThrottlePtr, Throttler, ThrottlerArray};
use slotring_uring::{IoEngine, RingConfig, UringEngine};

fn throttler(rate: u64, clock: &Arc<ManualClock>, parent: Option<ThrottlePtr>) -> Arc<Throttler> {
    let mut b = Throttler::builder(rate)
        .burst(Duration::from_millis(10))
        .clock(clock.clone() as Arc<dyn Clock>);
    if let Some(p) = parent {
        b = b.parent(p);
    }
    Arc::new(b.build().unwrap())
}

#[test]
fn chain_wait_is_one_timeout_of_the_folded_sum() {
    let tf = disk_file(1 << 20, 50);
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    // parent: 10 MB/s, 100 kB burst; child: 20 MB/s, 200 kB burst.
    let parent = throttler(10_000_000, &clock, None);
    let child = throttler(20_000_000, &clock, Some(parent.clone()));
    let chain: ThrottlePtr = child.clone();
    let mut e = UringEngine::new(&RingConfig::default()).unwrap();
    let (r, buf) = e.read_at(&tf.file, vec![0; 300_000], 0, Some(&chain), NO_CAP);
    assert_eq!(r.unwrap(), 300_000);
    assert_eq!(buf, tf.data[..300_000]);
    // child: 200k - 300k = -100k at 20 MB/s -> 5 ms.
    // parent, charged 5 ms later: min(100k, 100k + 50k) - 300k = -200k at 10 MB/s -> 20 ms.
    assert_eq!(child.counters().wait_us, 5_000);
    assert_eq!(parent.counters().wait_us, 20_000);
    let c = e.counters();
    assert_eq!(c.waits_submitted, 1, "one timeout SQE for the whole chain");
    assert_eq!(c.wait_us, 25_000);
}

#[test]
fn array_members_wait_in_turn_and_max_block_caps_each() {
    let tf = disk_file(1 << 20, 51);
    let clock = Arc::new(ManualClock::new(5_000_000_000));
    let a = throttler(20_000_000, &clock, None);
    let b = throttler(10_000_000, &clock, None);
    let array: ThrottlePtr = Arc::new(ThrottlerArray::new(vec![a.clone(), b.clone()]));
    let mut e = UringEngine::new(&RingConfig::default()).unwrap();
    let (r, _) = e.read_at(&tf.file, vec![0; 300_000], 0, Some(&array), NO_CAP);
    assert_eq!(r.unwrap(), 300_000);
    assert_eq!(
        (a.counters().wait_us, b.counters().wait_us),
        (5_000, 20_000)
    );
    assert_eq!(e.counters().wait_us, 25_000);
    // Both buckets now in debt; a capped read books at most 3 ms per level.
    let (r, _) = e.read_at(
        &tf.file,
        vec![0; 100_000],
        0,
        Some(&array),
        Duration::from_millis(3),
    );
    assert_eq!(r.unwrap(), 100_000);
    assert_eq!(e.counters().wait_us, 25_000 + 6_000);
    assert_eq!(e.counters().waits_submitted, 2);
}
