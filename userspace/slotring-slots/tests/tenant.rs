//! The slots connection of fair sharing: a query's allocation carries its
//! tenant, and a thread holding one of its slots charges IO to that tenant.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use slotring_slots::{ConcurrencyControl, Scheduler};
use slotring_throttle::{
    Clock, ManualClock, Tenant, Throttle, Throttler, UNLIMITED_BLOCK, WaitStrategy,
};

/// Records the tenant current on the thread at each throttle wait.
#[derive(Debug, Default)]
struct Who(Mutex<Vec<Option<String>>>);

impl WaitStrategy for Who {
    fn wait_until(&self, clock: &dyn Clock, deadline_ns: u64) -> Result<(), Errno> {
        let who = Tenant::current().map(|t| t.name().to_owned());
        self.0.lock().unwrap().push(who);
        clock.sleep_until(deadline_ns)
    }
}

#[test]
fn a_slot_of_a_tenants_allocation_charges_its_waits_to_the_tenant() {
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(4);
    cc.set_scheduler(Scheduler::RoundRobin);
    let q1 = Tenant::new("q1", 2).unwrap();
    let q2 = Tenant::new("q2", 1).unwrap();
    let a1 = cc.allocate(1, 2).unwrap().with_tenant(q1.clone());
    let a2 = cc.allocate(1, 2).unwrap().with_tenant(q2.clone());
    let plain = cc.allocate(1, 1).unwrap();
    assert_eq!(a1.tenant().map(Tenant::id), Some(q1.id()));

    let who = Arc::new(Who::default());
    let t = Throttler::builder(10)
        .burst(Duration::ZERO)
        .clock(Arc::new(ManualClock::new(1_000)))
        .wait_strategy(who.clone())
        .build()
        .unwrap();

    let mut s1 = a1.try_acquire().unwrap();
    let mut s2 = a2.try_acquire().unwrap();
    let mut s3 = plain.try_acquire().unwrap();
    t.throttle(1, UNLIMITED_BLOCK).unwrap();
    {
        let _l1 = s1.make_current();
        assert_eq!(Tenant::current().unwrap().id(), q1.id());
        t.throttle(1, UNLIMITED_BLOCK).unwrap();
        {
            let _l2 = s2.make_current();
            t.throttle(1, UNLIMITED_BLOCK).unwrap();
            // A tenant entered explicitly wins over the lease's.
            let other = Tenant::new("explicit", 1).unwrap();
            let _e = other.enter();
            t.throttle(1, UNLIMITED_BLOCK).unwrap();
        }
        t.throttle(1, UNLIMITED_BLOCK).unwrap();
        {
            let _l3 = s3.make_current();
            t.throttle(1, UNLIMITED_BLOCK).unwrap();
        }
    }
    assert!(Tenant::current().is_none());
    assert_eq!(
        *who.0.lock().unwrap(),
        [
            None,
            Some("q1".into()),
            Some("q2".into()),
            Some("explicit".into()),
            Some("q1".into()),
            None
        ]
    );
    assert_eq!(t.count(), 6, "every wait charged once");
}

#[test]
fn out_of_order_guard_drops_keep_the_top_leases_tenant() {
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(4);
    let q1 = Tenant::new("q1", 1).unwrap();
    let q2 = Tenant::new("q2", 1).unwrap();
    let a1 = cc.allocate(1, 1).unwrap().with_tenant(q1.clone());
    let a2 = cc.allocate(1, 1).unwrap().with_tenant(q2.clone());
    let mut s1 = a1.try_acquire().unwrap();
    let mut s2 = a2.try_acquire().unwrap();
    let l1 = s1.make_current();
    let l2 = s2.make_current();
    drop(l1);
    assert_eq!(
        Tenant::current().unwrap().id(),
        q2.id(),
        "q2 is still on top"
    );
    drop(l2);
    assert!(Tenant::current().is_none());
    // The allocation (and the caller's handle) may go while a slot lives.
    drop(a2);
    drop(q2);
    let _l = s2.make_current();
    assert_eq!(Tenant::current().unwrap().name(), "q2");
}
