//! The blocking front end parks the caller's CPU lease from submission to
//! completion of a throttled request (and only then).

mod common;

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use slotring_throttle::{LeaseHook, ThrottlePtr, Throttler, install_lease_hook};
use slotring_uring::{IoEngine, RingConfig, UringEngine};

thread_local! {
    static PARKED: Cell<bool> = const { Cell::new(false) };
}
static PARKS: AtomicU64 = AtomicU64::new(0);
static UNPARKS: AtomicU64 = AtomicU64::new(0);

struct Hook;
impl LeaseHook for Hook {
    fn park_current(&self) -> bool {
        PARKED.with(|p| p.set(true));
        PARKS.fetch_add(1, Ordering::SeqCst);
        true
    }
    fn unpark_current(&self) {
        PARKED.with(|p| p.set(false));
        UNPARKS.fetch_add(1, Ordering::SeqCst);
    }
}
static HOOK: Hook = Hook;

#[test]
fn throttled_reads_park_the_lease_until_completion() {
    assert!(install_lease_hook(&HOOK));
    let tf = disk_file(1 << 20, 60);
    let t: ThrottlePtr = Arc::new(
        Throttler::builder(8 << 20)
            .burst(Duration::from_millis(10))
            .build()
            .unwrap(),
    );
    let mut e = UringEngine::new(&RingConfig::default()).unwrap();
    let (r, _) = e.read_at(&tf.file, vec![0; 4096], 0, None, NO_CAP);
    r.unwrap();
    assert_eq!(
        PARKS.load(Ordering::SeqCst),
        0,
        "an unthrottled read parks nothing"
    );
    let (r, _) = e.read_at(&tf.file, vec![0; 512 << 10], 0, Some(&t), NO_CAP);
    r.unwrap();
    assert!(e.counters().waits_submitted >= 1);
    assert_eq!(PARKS.load(Ordering::SeqCst), 1);
    assert_eq!(UNPARKS.load(Ordering::SeqCst), 1, "unparked at completion");
    assert!(!PARKED.with(Cell::get));
}
