//! Every fault the engine must survive (`EINTR`, `EAGAIN`, short reads, a
//! full SQ, `EBUSY`, CQ overflow, `ECANCELED`, setup `EPERM`), injected
//! through the syscall seam on top of the real kernel, plus the real ones we
//! can provoke (CQ overflow, cancellation of a pending throttled read).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use slotring_throttle::{ThrottlePtr, Throttler};
use slotring_uring::{
    IoEngine, Policy, PreadEngine, RingConfig, UringEngine, UringError, WARM_UP_USER_DATA,
    open_engine_with,
};

fn engine(plan: &Arc<Mutex<Plan>>, cfg: &RingConfig) -> UringEngine {
    UringEngine::with_syscalls(cfg, Box::new(FaultSys(plan.clone()))).unwrap()
}

/// 1 MiB/s with a 1 ms burst: any read of real size waits behind a timeout SQE.
fn slow_throttle() -> ThrottlePtr {
    Arc::new(
        Throttler::builder(1 << 20)
            .burst(Duration::from_millis(1))
            .build()
            .unwrap(),
    )
}

fn read_ok(e: &mut dyn IoEngine, tf: &TestFile, off: usize, len: usize, t: Option<&ThrottlePtr>) {
    let (r, buf) = e.read_at(&tf.file, vec![0; len], off as u64, t, NO_CAP);
    assert_eq!(r.unwrap(), len);
    assert_eq!(buf, tf.data[off..off + len]);
}

#[test]
fn cqe_eintr_and_eagain_are_resubmitted() {
    let tf = disk_file(256 << 10, 20);
    let plan = fault_plan();
    plan.lock().unwrap().io_results =
        vec![Rewrite::Errno(libc::EINTR), Rewrite::Errno(libc::EAGAIN)];
    let mut e = engine(&plan, &RingConfig::default());
    read_ok(&mut e, &tf, 4096, 64 << 10, None);
    assert_eq!(e.counters().resubmits, 2);
}

#[test]
fn short_reads_are_continued() {
    let tf = disk_file(256 << 10, 21);
    let plan = fault_plan();
    plan.lock().unwrap().io_results = vec![Rewrite::Half, Rewrite::Half, Rewrite::Half];
    let mut e = engine(&plan, &RingConfig::default());
    read_ok(&mut e, &tf, 0, 200_000, None);
    assert_eq!(e.counters().short_reads, 3);
    assert_eq!(e.counters().read_bytes, 200_000);
}

#[test]
fn sq_full_submits_and_retries() {
    let tf = disk_file(256 << 10, 22);
    let plan = fault_plan();
    plan.lock().unwrap().sq_full = 3;
    let mut e = engine(&plan, &RingConfig::default());
    read_ok(&mut e, &tf, 0, 64 << 10, None);
    assert_eq!(
        e.counters().sq_full,
        3,
        "the SQ was found full three times, then had room"
    );
}

#[test]
fn enter_ebusy_eagain_eintr_are_back_pressure_not_errors() {
    let tf = disk_file(256 << 10, 23);
    let plan = fault_plan();
    let mut e = engine(&plan, &RingConfig::default());
    // After the ring's warm-up NOP: these hit the read's enters.
    plan.lock().unwrap().enter_errors = vec![libc::EBUSY, libc::EINTR, libc::EAGAIN];
    read_ok(&mut e, &tf, 0, 64 << 10, None);
    assert_eq!(
        e.counters().resubmits,
        2,
        "EBUSY and EAGAIN counted as back-pressure"
    );
}

#[test]
fn enter_fatal_error_is_reported_with_its_cause() {
    let tf = disk_file(64 << 10, 24);
    let plan = fault_plan();
    let mut e = engine(&plan, &RingConfig::default());
    plan.lock().unwrap().enter_errors = vec![libc::EBADF];
    let (r, _) = e.read_at(&tf.file, vec![0; 4096], 0, None, NO_CAP);
    let err = r.unwrap_err();
    assert!(
        matches!(
            err,
            UringError::Ring {
                what: "io_uring_enter",
                ..
            }
        ),
        "{err}"
    );
    // The engine still drains the request on drop (no early free).
    drop(e);
}

#[test]
fn ecanceled_is_reported_as_cancellation() {
    let tf = disk_file(64 << 10, 25);
    let plan = fault_plan();
    plan.lock().unwrap().io_results = vec![Rewrite::Errno(libc::ECANCELED)];
    let mut e = engine(&plan, &RingConfig::default());
    let (r, buf) = e.read_at(&tf.file, vec![0; 4096], 0, None, NO_CAP);
    assert!(r.unwrap_err().is_cancelled());
    assert_eq!(buf.len(), 4096, "the buffer comes back");
    assert_eq!(e.counters().cancellations, 1);
}

#[test]
fn injected_nowait_eagain_is_a_miss_charged_to_disk() {
    let tf = disk_file(256 << 10, 26);
    let (disk, parent, chain) = disk_chain(1 << 30, 1 << 30);
    let plan = fault_plan();
    plan.lock().unwrap().io_results = vec![Rewrite::Errno(libc::EAGAIN)];
    let mut e = engine(&plan, &RingConfig::default());
    read_ok(&mut e, &tf, 0, 64 << 10, Some(&chain));
    assert_eq!(e.counters().nowait_misses, 1);
    assert_eq!(disk.counters().amount, 64 << 10);
    assert_eq!(parent.counters().amount, 64 << 10);
}

#[test]
fn a_miss_retry_rides_the_next_enter() {
    // The probe and the retry each need one enter; the retry is queued while
    // reaping and goes out with the enter that waits for it: no extra call.
    let tf = disk_file(256 << 10, 27);
    let (_d, _p, chain) = disk_chain(1 << 30, 1 << 30);
    // A cold probe can be answered with the data it read in
    // (`COLD_PROBE_ATTEMPTS`): try again on a fresh engine then.
    let mut attempt = 0;
    let (plan, e) = loop {
        attempt += 1;
        let plan = fault_plan();
        let mut e = engine(&plan, &RingConfig::default());
        tf.file.make_cold().unwrap();
        plan.lock().unwrap().log.clear();
        read_ok(&mut e, &tf, 0, 64 << 10, Some(&chain));
        if e.counters().nowait_misses == 1 || attempt == COLD_PROBE_ATTEMPTS {
            break (plan, e);
        }
        eprintln!("the kernel served a cold NOWAIT read with data; retrying");
    };
    let enters = plan
        .lock()
        .unwrap()
        .log
        .iter()
        .filter(|s| **s == "io_uring_enter")
        .count();
    assert_eq!(e.counters().nowait_misses, 1);
    assert_eq!(
        enters, 2,
        "probe + (retry submitted and waited in one enter)"
    );
}

#[test]
fn setup_eperm_names_the_cause_and_falls_back_to_pread() {
    let tf = disk_file(64 << 10, 28);
    let plan = fault_plan();
    plan.lock().unwrap().setup_errno = Some(libc::EPERM);
    let err = UringEngine::with_syscalls(&RingConfig::default(), Box::new(FaultSys(plan.clone())))
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, UringError::Unavailable { .. }));
    assert!(
        msg.contains("seccomp") || msg.contains("io_uring_disabled"),
        "{msg}"
    );
    let (mut e, why) =
        open_engine_with(&RingConfig::default(), &|| Box::new(FaultSys(plan.clone())));
    assert!(why.is_some());
    assert_eq!(e.kind(), "pread");
    read_ok(e.as_mut(), &tf, 0, 64 << 10, None);
    let plan2 = fault_plan();
    plan2.lock().unwrap().setup_errno = Some(libc::ENOSYS);
    let err =
        UringEngine::with_syscalls(&RingConfig::default(), Box::new(FaultSys(plan2))).unwrap_err();
    assert!(err.to_string().contains("kernel without io_uring"), "{err}");
}

#[test]
fn bad_config_is_a_typed_error() {
    let cfg = RingConfig {
        entries: 0,
        ..RingConfig::default()
    };
    let err = UringEngine::new(&cfg).unwrap_err();
    assert!(
        matches!(
            err,
            UringError::Invalid {
                what: "ring entries",
                value: 0
            }
        ),
        "{err}"
    );
}

#[test]
fn cq_overflow_is_survived_without_losing_completions() {
    let tf = disk_file(1 << 20, 29);
    let cfg = RingConfig {
        entries: 4,
        cq_entries: 8,
        ..RingConfig::default()
    };
    let mut e = UringEngine::new(&cfg).unwrap();
    let mut tickets = Vec::new();
    for i in 0..64usize {
        tickets.push((
            e.submit_read(&tf.file, vec![0; 4096], (i * 4096) as u64, None, NO_CAP),
            i,
        ));
    }
    e.submit_pending().unwrap();
    let mut seen = 0;
    while let Some(c) = e.wait_any().unwrap() {
        let i = tickets.iter().find(|(t, _)| *t == c.ticket).unwrap().1;
        assert_eq!(c.result.unwrap(), 4096);
        assert_eq!(c.buf, tf.data[i * 4096..(i + 1) * 4096]);
        seen += 1;
    }
    assert_eq!(seen, 64, "every completion arrived");
    assert!(
        e.counters().cq_overflows >= 1,
        "the CQ did overflow: {:?}",
        e.counters()
    );
    assert!(e.counters().sq_full >= 1);
}

#[test]
fn cancelling_a_waiting_read_returns_the_buffer() {
    let tf = disk_file(1 << 20, 30);
    let t: ThrottlePtr = slow_throttle();
    let mut e = UringEngine::new(&RingConfig::default()).unwrap();
    // 1 MiB at 1 MiB/s: a ~1 s timeout SQE in front of the read.
    let tk = e.submit_read(&tf.file, vec![7; 1 << 20], 0, Some(&t), NO_CAP);
    e.submit_pending().unwrap();
    e.cancel(tk);
    let c = e.wait(tk).unwrap();
    assert!(c.result.unwrap_err().is_cancelled());
    assert_eq!(c.buf, vec![7; 1 << 20], "the read never ran");
    assert_eq!(e.counters().cancellations, 1);
    assert_eq!(e.in_flight(), 0);
}

#[test]
fn abandoned_requests_are_freed_at_their_last_cqe() {
    let tf = disk_file(1 << 20, 31);
    let t: ThrottlePtr = slow_throttle();
    let mut e = UringEngine::new(&RingConfig::default()).unwrap();
    let a = e.submit_read(&tf.file, vec![0; 512 << 10], 0, Some(&t), NO_CAP);
    let b = e.submit_read(&tf.file, vec![0; 4096], 0, None, NO_CAP);
    e.submit_pending().unwrap();
    e.abandon(a);
    assert!(e.in_flight() >= 1);
    let c = e.wait(b).unwrap();
    assert_eq!(c.buf, tf.data[..4096]);
    while e.in_flight() > 0 {
        assert!(
            e.wait_any().unwrap().is_none(),
            "an abandoned request is never handed out"
        );
    }
    assert_eq!(e.counters().cancellations, 1);
}

#[test]
fn blocking_random_reads_with_random_cancellations() {
    let tf = disk_file(4 << 20, 32);
    let (_d, _p, chain) = disk_chain(64 << 20, 1 << 30);
    let mut e = UringEngine::new(&RingConfig {
        entries: 64,
        ..RingConfig::default()
    })
    .unwrap();
    let mut rng = Rng(99);
    let mut pending = std::collections::HashMap::new();
    let mut done = 0;
    let total = 100_000;
    let mut submitted = 0;
    while done < total {
        while pending.len() < 32 && submitted < total {
            let off = rng.below(5 << 20);
            let len = 1 + rng.below(64 << 10) as usize;
            if rng.below(16) == 0 {
                tf.file.evict().unwrap();
            }
            let th = (rng.below(2) == 0).then_some(&chain);
            let t = e.submit_read(&tf.file, vec![0x5A; len], off, th, NO_CAP);
            submitted += 1;
            match rng.below(8) {
                0 => e.cancel(t),
                1 => {
                    e.abandon(t);
                    done += 1;
                    continue;
                }
                _ => {}
            }
            pending.insert(t, (off as usize, len));
        }
        let Some(c) = e.wait_any().unwrap() else {
            break;
        };
        let (off, len) = pending
            .remove(&c.ticket)
            .expect("only live tickets complete");
        done += 1;
        match c.result {
            Ok(n) => {
                let end = (off + len).min(tf.data.len());
                assert_eq!(n, end.saturating_sub(off));
                assert_eq!(c.buf[..n], tf.data[off.min(end)..end]);
            }
            Err(err) => assert!(err.is_cancelled(), "{err}"),
        }
    }
    while e.wait_any().unwrap().is_some() {}
    assert_eq!(e.in_flight(), 0, "no request leaks");
    assert!(e.counters().cancellations > 0);
}

#[test]
fn pread_engine_faults() {
    let tf = disk_file(256 << 10, 33);
    let plan = fault_plan();
    plan.lock().unwrap().pread_errors = vec![libc::EINTR, libc::EAGAIN];
    plan.lock().unwrap().pread_short = 2;
    let mut e = PreadEngine::with_syscalls(Policy::default(), Box::new(FaultSys(plan.clone())));
    read_ok(&mut e, &tf, 0, 100_000, None);
    let c = e.counters();
    assert_eq!(c.resubmits, 2);
    assert!(c.short_reads >= 2, "{c:?}");
    // ClickHouse's method: a miss costs preadv2(NOWAIT) + pread.
    // A cold probe can be answered with the data it read in
    // (`COLD_PROBE_ATTEMPTS`): then it is the whole read; try again.
    let (_d, _p, chain) = disk_chain(1 << 30, 1 << 30);
    let mut attempt = 0;
    let log = loop {
        attempt += 1;
        tf.file.make_cold().unwrap();
        plan.lock().unwrap().log.clear();
        read_ok(&mut e, &tf, 0, 64 << 10, Some(&chain));
        let log = plan.lock().unwrap().log.clone();
        if log.len() > 1 || attempt == COLD_PROBE_ATTEMPTS {
            break log;
        }
        eprintln!("the kernel served a cold NOWAIT read with data; retrying");
    };
    assert_eq!(log, vec!["preadv2_nowait", "pread"]);
}

#[test]
fn guard_uses_cachestat_when_the_disk_bucket_cannot_cover_probes() {
    let tf = disk_file(1 << 20, 34);
    // A disk bucket of 64 KiB: a 128 KiB read cannot be covered, so no probe.
    let (disk, _p, chain) = disk_chain(64 << 10, 1 << 30);
    let plan = fault_plan();
    let mut e = engine(&plan, &RingConfig::default());
    tf.file.make_cold().unwrap();
    plan.lock().unwrap().log.clear();
    let (r, _) = e.read_at(
        &tf.file,
        vec![0; 128 << 10],
        0,
        Some(&chain),
        Duration::from_millis(1),
    );
    assert_eq!(r.unwrap(), 128 << 10);
    let c = e.counters();
    assert_eq!(c.cachestat_checks, 1);
    assert_eq!(
        c.nowait_misses, 0,
        "no NOWAIT probe started an unthrottled disk read"
    );
    assert_eq!(disk.counters().amount, 128 << 10);
    // Cached now: cachestat says so and the read is charged as page cache.
    let (r, _) = e.read_at(
        &tf.file,
        vec![0; 128 << 10],
        0,
        Some(&chain),
        Duration::from_millis(1),
    );
    assert_eq!(r.unwrap(), 128 << 10);
    assert_eq!(disk.counters().amount, 128 << 10);
    assert_eq!(e.counters().page_cache_bytes, 128 << 10);
    let _ = Policy {
        detect_page_cache: true,
        disk_rate_guard: false,
        pace_writeback: true,
        ..Policy::default()
    };
}

#[test]
fn setup_flag_combinations_serve_the_same_reads() {
    let tf = disk_file(1 << 20, 35);
    let combos = [
        RingConfig {
            coop_taskrun: true,
            ..RingConfig::default()
        },
        RingConfig {
            single_issuer: true,
            ..RingConfig::default()
        },
        RingConfig {
            single_issuer: true,
            defer_taskrun: true,
            ..RingConfig::default()
        },
        RingConfig {
            sqpoll_idle_ms: Some(10),
            ..RingConfig::default()
        },
    ];
    'combos: for cfg in combos {
        // A cold probe can be answered with the data it read in
        // (`COLD_PROBE_ATTEMPTS`): try again on a fresh engine then.
        let mut attempt = 0;
        let (mut e, chain) = loop {
            attempt += 1;
            let mut e = match UringEngine::new(&cfg) {
                Ok(e) => e,
                Err(err) => {
                    eprintln!("skipped {cfg:?}: the kernel refused it: {err}");
                    continue 'combos;
                }
            };
            let (_d, _p, chain) = disk_chain(1 << 30, 1 << 30);
            tf.file.make_cold().unwrap();
            read_ok(&mut e, &tf, 4096, 128 << 10, Some(&chain));
            if e.counters().nowait_misses == 1 || attempt == COLD_PROBE_ATTEMPTS {
                break (e, chain);
            }
            eprintln!("the kernel served a cold NOWAIT read with data; retrying");
        };
        read_ok(&mut e, &tf, 4096, 128 << 10, Some(&chain));
        let t: ThrottlePtr = Arc::new(
            Throttler::builder(16 << 20)
                .burst(Duration::from_millis(1))
                .build()
                .unwrap(),
        );
        read_ok(&mut e, &tf, 0, 256 << 10, Some(&t));
        let c = e.counters();
        assert_eq!(
            (c.nowait_misses, c.page_cache_hits),
            (1, 1),
            "{cfg:?}: {c:?}"
        );
        assert!(c.waits_submitted >= 1);
    }
    let bad = RingConfig {
        defer_taskrun: true,
        ..RingConfig::default()
    };
    let err = UringEngine::new(&bad).unwrap_err();
    assert!(
        matches!(
            &err,
            UringError::InvalidFlags { flags, .. }
                if flags == "defer_taskrun=true single_issuer=false"
        ),
        "{err}"
    );
}

/// Run `f` on its own thread; fail (instead of hanging the suite) if it
/// does not return within `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .expect("the call did not return (hang or spin)")
}

#[test]
fn wait_on_an_abandoned_ticket_is_a_typed_error_not_a_hang() {
    let tf = disk_file(1 << 20, 40);
    let t: ThrottlePtr = slow_throttle();
    let mut e = UringEngine::new(&RingConfig::default()).unwrap();
    // A read behind a ~250 ms linked wait, abandoned before it completes.
    let ticket = e.submit_read(&tf.file, vec![0; 256 << 10], 0, Some(&t), NO_CAP);
    e.submit_pending().unwrap();
    e.abandon(ticket);
    let (e, r) = within(Duration::from_secs(10), move || {
        let r = e.wait(ticket);
        (e, r)
    });
    let mut e = e;
    match r {
        Err(UringError::Ticket { why, .. }) => assert_eq!(why, "abandoned"),
        other => panic!("expected a ticket error, got {other:?}"),
    }
    // The engine frees it at its last CQE; waiting on it then is an error too.
    while e.wait_any().unwrap().is_some() {}
    assert_eq!(e.in_flight(), 0);
    let (_e, r) = within(Duration::from_secs(10), move || {
        let r = e.wait(ticket);
        (e, r)
    });
    assert!(
        matches!(r, Err(UringError::Ticket { why, .. }) if why.starts_with("not live")),
        "{r:?}"
    );
}

#[test]
fn a_failed_linked_timeout_reports_its_error_not_a_cancellation() {
    let tf = disk_file(1 << 20, 41);
    let plan = fault_plan();
    {
        // The wait heading the chain fails with EINVAL; the kernel then
        // fails the linked read with ECANCELED.
        let mut p = plan.lock().unwrap();
        p.wait_results = vec![libc::EINVAL];
        p.io_results = vec![Rewrite::Errno(libc::ECANCELED)];
    }
    let mut e = engine(&plan, &RingConfig::default());
    let t: ThrottlePtr = Arc::new(
        Throttler::builder(16 << 20)
            .burst(Duration::from_millis(1))
            .build()
            .unwrap(),
    );
    // The ticket API keeps pre-IO waits linked to their IO.
    let ticket = e.submit_read(&tf.file, vec![0; 1 << 20], 0, Some(&t), NO_CAP);
    let c = e.wait(ticket).unwrap();
    match c.result {
        Err(UringError::Ring { what, source }) => {
            assert_eq!(what, "throttle timeout");
            assert_eq!(source.raw_os_error(), Some(libc::EINVAL));
        }
        other => panic!("expected the timeout's error, got {other:?}"),
    }
    assert!(c.deadline_ns.is_some(), "a linked wait was booked");
    let counters = e.counters();
    assert_eq!(counters.cancellations, 0, "{counters:?}");
    assert_eq!(counters.waits_submitted, 1, "{counters:?}");
    let p = plan.lock().unwrap();
    assert!(
        p.wait_results.is_empty() && p.io_results.is_empty(),
        "both faults were injected"
    );
}

#[test]
fn a_submission_queue_that_stays_full_is_an_error_naming_its_sizes() {
    let tf = disk_file(64 << 10, 42);
    let plan = fault_plan();
    plan.lock().unwrap().sq_full = u32::MAX;
    let cfg = RingConfig {
        entries: 8,
        ..RingConfig::default()
    };
    let mut e = engine(&plan, &cfg);
    let (r, _) = e.read_at(&tf.file, vec![0; 4096], 0, None, NO_CAP);
    plan.lock().unwrap().sq_full = 0;
    match r {
        Err(UringError::Ring { what, source }) => {
            assert_eq!(what, "io_uring_enter (SQ full)");
            let msg = source.to_string();
            assert!(
                msg.contains("1 entries needed, 0 free of 8 after 1000001 submit attempts"),
                "{msg}"
            );
        }
        other => panic!("expected a ring error, got {other:?}"),
    }
}

#[test]
fn dropping_the_engine_cancels_a_queued_write_still_behind_its_wait() {
    let tf = disk_file(64 << 10, 43);
    // 64 KiB at 8 KiB/s with a tiny burst: a wait of several seconds.
    let t: ThrottlePtr = Arc::new(
        Throttler::builder(8 << 10)
            .burst(Duration::from_millis(1))
            .build()
            .unwrap(),
    );
    let mut e = UringEngine::new(&RingConfig::default()).unwrap();
    let new = vec![0xA5u8; 64 << 10];
    let ticket = e.submit_write(&tf.file, new, 0, Some(&t), NO_CAP);
    // Never submitted: the drop submits the chain and cancels its wait.
    drop(e);
    let _ = ticket;
    let mut back = vec![0u8; 64 << 10];
    std::os::unix::fs::FileExt::read_exact_at(tf.file.file(), &mut back, 0).unwrap();
    assert_eq!(back, tf.data, "the delayed write was cancelled, not issued");
}

#[test]
fn a_new_ring_submits_its_warm_up_nop_before_any_request() {
    // The thread's one-time io_uring set-up happens at creation: one enter
    // that submits and waits for one NOP, whose CQE comes back at once.
    let plan = fault_plan();
    let tf = disk_file(64 << 10, 41);
    let mut e = engine(&plan, &RingConfig::default());
    {
        let p = plan.lock().unwrap();
        assert_eq!(p.log, ["io_uring_setup", "io_uring_enter"], "{:?}", p.log);
        assert_eq!(p.enters, [(1, 1)], "submit 1, wait for 1");
        assert_eq!(p.completions, [(WARM_UP_USER_DATA, 0)]);
    }
    // The NOP advanced no request and touched no counter.
    assert_eq!(e.counters(), Default::default());
    assert_eq!(e.in_flight(), 0);
    read_ok(&mut e, &tf, 0, 4096, None);
}

#[test]
fn a_failed_warm_up_enter_loses_nothing() {
    // The warm-up is best effort: its NOP rides the first request's enter,
    // and its CQE is dropped without touching any request.
    let plan = fault_plan();
    let tf = disk_file(64 << 10, 42);
    plan.lock().unwrap().enter_errors = vec![libc::EINTR];
    let mut e = engine(&plan, &RingConfig::default());
    assert!(plan.lock().unwrap().completions.is_empty());
    read_ok(&mut e, &tf, 0, 4096, None);
    let p = plan.lock().unwrap();
    // The injected EINTR never reached the kernel: the first real enter
    // submits the NOP with the read.
    assert_eq!(p.enters.first().map(|e| e.0), Some(2), "{:?}", p.enters);
    assert!(
        p.completions.contains(&(WARM_UP_USER_DATA, 0)),
        "{:?}",
        p.completions
    );
    assert_eq!(e.counters().reads, 1);
}
