//! The ring-timeout wait strategy on the real kernel: it waits until the
//! deadline on the throttler's clock, on the ring (an `io_uring_enter` per
//! wait), with the lease parked; without io_uring it falls back to
//! `clock_nanosleep` and says why.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use slotring_throttle::{
    LeaseHook, MonotonicClock, Throttle, Throttler, UNLIMITED_BLOCK, WaitStrategy,
    install_lease_hook,
};
use slotring_uring::{RingWait, RingWaitConfig, Syscalls};

/// Counts parks of a pretend lease held by every thread; on a thread that
/// watches a plan, also notes what that plan had seen at each park.
struct Parks(AtomicU64);
impl LeaseHook for Parks {
    fn park_current(&self) -> bool {
        self.0.fetch_add(1, Ordering::SeqCst);
        WATCHED.with(|w| {
            if let Some(plan) = w.borrow().as_ref() {
                let seen = (
                    count(plan, "io_uring_setup"),
                    count(plan, "io_uring_wait_until") + count(plan, "io_uring_enter"),
                );
                AT_PARK.with(|a| a.borrow_mut().push(seen));
            }
        });
        true
    }
    fn unpark_current(&self) {}
}
static PARKS: Parks = Parks(AtomicU64::new(0));

thread_local! {
    /// The plan this thread's parks look at.
    static WATCHED: std::cell::RefCell<Option<Arc<std::sync::Mutex<Plan>>>> =
        const { std::cell::RefCell::new(None) };
    /// `(ring set-ups, ring entries)` of it at each park of this thread.
    static AT_PARK: std::cell::RefCell<Vec<(usize, usize)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn seam(plan: &Arc<std::sync::Mutex<Plan>>) -> Arc<dyn Fn() -> Box<dyn Syscalls> + Send + Sync> {
    let p = plan.clone();
    Arc::new(move || -> Box<dyn Syscalls> { Box::new(FaultSys(p.clone())) })
}

fn count(plan: &Arc<std::sync::Mutex<Plan>>, call: &str) -> usize {
    plan.lock()
        .unwrap()
        .log
        .iter()
        .filter(|&&c| c == call)
        .count()
}

#[test]
fn ring_waits_reach_the_deadline_on_the_ring_with_the_lease_parked() {
    for (cfg, call) in [
        (RingWaitConfig::DEFAULT, "io_uring_wait_until"),
        (RingWaitConfig::TIMEOUT_SQE, "io_uring_enter"),
    ] {
        // Each configuration on a thread of its own (a thread has one ring).
        std::thread::spawn(move || waits_reach_the_deadline(cfg, call))
            .join()
            .unwrap();
    }
}

fn waits_reach_the_deadline(cfg: RingWaitConfig, call: &str) {
    install_lease_hook(&PARKS);
    let plan = fault_plan();
    let w = RingWait::with_syscalls(seam(&plan), cfg).unwrap();
    let clock = MonotonicClock::shared();
    let parks = PARKS.0.load(Ordering::SeqCst);
    for _ in 0..20 {
        let deadline = clock.now_ns() + 500_000;
        w.wait_until(clock.as_ref(), deadline).unwrap();
        assert!(clock.now_ns() >= deadline, "woke before the deadline");
    }
    assert!(
        PARKS.0.load(Ordering::SeqCst) - parks >= 20,
        "the lease was parked for every wait"
    );
    let enters = count(&plan, call);
    assert!(
        enters >= 20,
        "every wait entered the ring ({call}): {enters}"
    );
    // A deadline already past returns at once, without the ring.
    w.wait_until(clock.as_ref(), clock.now_ns() - 1).unwrap();
}

#[test]
fn a_throttler_with_the_ring_wait_waits_its_deficit() {
    let w = Arc::new(RingWait::new().unwrap());
    let t = Throttler::builder(10 << 20)
        .burst(std::time::Duration::from_millis(1))
        .wait_strategy(w)
        .build()
        .unwrap();
    let clock = t.clock().clone();
    let start = clock.now_ns();
    // 10 KiB of burst, then 1 MiB at 10 MiB/s: at least ~100 ms.
    assert!(!t.throttle(10 << 10, UNLIMITED_BLOCK).unwrap());
    assert!(t.throttle(1 << 20, UNLIMITED_BLOCK).unwrap());
    let waited = clock.now_ns() - start;
    assert!(waited >= 100_000_000, "{waited} ns");
}

#[test]
fn without_io_uring_the_wait_falls_back_to_nanosleep_and_says_why() {
    let plan = fault_plan();
    plan.lock().unwrap().setup_errno = Some(libc::EPERM);
    let err = RingWait::with_syscalls(seam(&plan), RingWaitConfig::DEFAULT).unwrap_err();
    assert!(err.to_string().contains("unavailable"), "{err}");
    // Made where a ring could be set up; then io_uring goes away. A thread
    // that waits for the first time now cannot make its ring: it waits on
    // clock_nanosleep, still to the deadline, and the reason is recorded.
    plan.lock().unwrap().setup_errno = None;
    let w = RingWait::with_syscalls(seam(&plan), RingWaitConfig::DEFAULT).unwrap();
    plan.lock().unwrap().setup_errno = Some(libc::EPERM);
    let enters_before = plan
        .lock()
        .unwrap()
        .log
        .iter()
        .filter(|&&c| c == "io_uring_enter")
        .count();
    std::thread::spawn(move || {
        let clock = MonotonicClock::shared();
        for _ in 0..3 {
            let deadline = clock.now_ns() + 300_000;
            w.wait_until(clock.as_ref(), deadline).unwrap();
            assert!(clock.now_ns() >= deadline);
        }
    })
    .join()
    .unwrap();
    let log = plan.lock().unwrap().log.clone();
    assert_eq!(
        log.iter().filter(|&&c| c == "io_uring_enter").count(),
        enters_before,
        "no ring was entered: {log:?}"
    );
    let why = RingWait::fallback_reason().expect("the reason is recorded");
    assert!(why.contains("io_uring"), "{why}");
}

#[test]
fn a_kernel_without_absolute_enter_timeouts_waits_on_the_timeout_sqe() {
    std::thread::spawn(|| {
        let plan = fault_plan();
        let w = RingWait::with_syscalls(seam(&plan), RingWaitConfig::DEFAULT).unwrap();
        // What a kernel before 6.12 answers to IORING_ENTER_ABS_TIMER.
        plan.lock().unwrap().wait_until_errors = vec![libc::EINVAL];
        let clock = MonotonicClock::shared();
        let enters = count(&plan, "io_uring_enter");
        for _ in 0..5 {
            let deadline = clock.now_ns() + 300_000;
            w.wait_until(clock.as_ref(), deadline).unwrap();
            assert!(clock.now_ns() >= deadline, "woke before the deadline");
        }
        // Asked once, then every wait on this thread is a timeout SQE.
        assert_eq!(count(&plan, "io_uring_wait_until"), 1);
        assert!(count(&plan, "io_uring_enter") - enters >= 5);
    })
    .join()
    .unwrap();
}

#[test]
fn a_thread_makes_its_ring_and_first_submission_before_it_parks() {
    install_lease_hook(&PARKS);
    for cfg in [RingWaitConfig::DEFAULT, RingWaitConfig::TIMEOUT_SQE] {
        let plan = fault_plan();
        // Made on this thread; the waits below run on a new one, which
        // has no ring yet.
        let w = RingWait::with_syscalls(seam(&plan), cfg).unwrap();
        let (setups, entries) = (count(&plan, "io_uring_setup"), {
            count(&plan, "io_uring_wait_until") + count(&plan, "io_uring_enter")
        });
        let at_park = std::thread::spawn(move || {
            WATCHED.with(|x| *x.borrow_mut() = Some(plan.clone()));
            let clock = MonotonicClock::shared();
            for _ in 0..3 {
                let deadline = clock.now_ns() + 300_000;
                w.wait_until(clock.as_ref(), deadline).unwrap();
            }
            AT_PARK.with(|a| a.borrow().clone())
        })
        .join()
        .unwrap();
        assert_eq!(at_park.len(), 3, "{cfg:?}: every wait parked");
        // At the first park the thread's ring existed and had been entered
        // once (its first submission, a wait already due), running.
        assert_eq!(at_park[0], (setups + 1, entries + 1), "{cfg:?}");
        // Later waits make no ring.
        assert!(at_park.iter().all(|&(s, _)| s == setups + 1), "{cfg:?}");
    }
}
