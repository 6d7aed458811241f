//! The process-wide default wait: throttlers built afterwards on the
//! production clock use it; an injected clock keeps waiting on itself; an
//! explicit strategy wins. (Its own test binary: the default is set once
//! per process.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use slotring_throttle::{
    Clock, ManualClock, Throttle, Throttler, UNLIMITED_BLOCK, WaitStrategy, install_default_wait,
};

#[derive(Debug, Default)]
struct Counting(AtomicU64);
impl WaitStrategy for Counting {
    fn wait_until(&self, clock: &dyn Clock, deadline_ns: u64) -> Result<(), Errno> {
        self.0.fetch_add(1, Ordering::SeqCst);
        clock.sleep_until(deadline_ns)
    }
}

/// Charge twice the burst: exactly one wait.
fn one_wait(t: &Throttler) {
    assert!(!t.throttle(1_000, UNLIMITED_BLOCK).unwrap());
    assert!(t.throttle(1_000, UNLIMITED_BLOCK).unwrap());
}

#[test]
fn the_installed_default_performs_waits_on_the_production_clock_only() {
    let default = Arc::new(Counting::default());
    assert!(install_default_wait(default.clone()));
    assert!(
        !install_default_wait(Arc::new(Counting::default())),
        "set once"
    );

    let real = Throttler::builder(1_000_000)
        .burst(Duration::from_millis(1))
        .build()
        .unwrap();
    one_wait(&real);
    assert_eq!(default.0.load(Ordering::SeqCst), 1, "the default waited");

    let manual = Arc::new(ManualClock::new(0));
    let injected = Throttler::builder(1_000_000)
        .burst(Duration::from_millis(1))
        .clock(manual)
        .build()
        .unwrap();
    one_wait(&injected);
    assert_eq!(
        default.0.load(Ordering::SeqCst),
        1,
        "an injected clock waits on itself"
    );

    let explicit = Arc::new(Counting::default());
    let chosen = Throttler::builder(1_000_000)
        .burst(Duration::from_millis(1))
        .wait_strategy(explicit.clone())
        .build()
        .unwrap();
    one_wait(&chosen);
    assert_eq!(explicit.0.load(Ordering::SeqCst), 1);
    assert_eq!(default.0.load(Ordering::SeqCst), 1);
}
