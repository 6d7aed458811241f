//! The product's claim, end to end on the real kernel (root): a thread that
//! holds a CPU slot and waits on a throttled io_uring read parks its lease —
//! the slot's capacity goes to a waiting query meanwhile — and the kernel
//! (our eBPF probes) confirms that the parked interval cost no CPU.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result};
use slotring_bpf::{BpfConfig, BpfError, SlotringBpf, Verdict, VerifyConfig};
use slotring_slots::{ConcurrencyControl, Scheduler};
use slotring_throttle::{ThrottlePtr, Throttler, UNLIMITED_BLOCK};
use slotring_uring::{IoEngine, RingConfig, UringEngine, UringFile};

// 2 MiB at 2 MiB/s: a 1 s wait once the burst is spent, in one parked
// episode that sleeps on the ring's timeout; the verdict judges its
// segments (before the sleep, after the wake-up) by the default rule.
const RATE: u64 = 2 << 20; // 2 MiB/s
const READ: usize = 2 << 20; // 2 MiB

fn data_file() -> Result<std::path::PathBuf> {
    // On the real disk, not tmpfs: the io_uring read path differs there.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("parked-io-{}.dat", std::process::id()));
    let mut f = std::fs::File::create(&path)?;
    let block: Vec<u8> = (0..READ).map(|i| (i % 251) as u8).collect();
    f.write_all(&block)?;
    f.sync_all()?;
    Ok(path)
}

#[test]
fn a_throttled_uring_read_parks_the_slot_and_costs_no_cpu() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: needs root for BPF (CAP_BPF, CAP_PERFMON)");
        return Ok(());
    }
    slotring_bpf::install_lease_observer();
    let pin_dir =
        std::path::PathBuf::from(format!("/sys/fs/bpf/slotring-it-{}", std::process::id()));
    let bpf = match SlotringBpf::load(BpfConfig {
        pin_dir,
        ..BpfConfig::default()
    }) {
        Ok(b) => b,
        Err(BpfError::NoBtf(why)) => {
            eprintln!("SKIP: kernel has no BTF: {why}");
            return Ok(());
        }
        Err(e) => return Err(e).context("loading the probes"),
    };

    // A budget of one CPU slot, two queries that each want one.
    let cc = ConcurrencyControl::new();
    cc.set_scheduler(Scheduler::MaxMinFair);
    cc.set_max_concurrency(1);
    let scan = cc.allocate(0, 1)?;
    let short = cc.allocate(0, 1)?;
    assert!(
        short.is_requesting(),
        "the budget is full: the short query waits"
    );

    let path = data_file()?;
    let file = UringFile::new(std::fs::File::open(&path)?)?;
    let throttle: ThrottlePtr = Arc::new(Throttler::builder(RATE).name("scan").build()?);

    let read_done = Arc::new(AtomicBool::new(false));
    let (entering_tx, entering_rx) = mpsc::channel();
    let scan_thread = {
        let read_done = read_done.clone();
        let throttle = throttle.clone();
        std::thread::spawn(move || -> Result<(u32, Vec<u8>)> {
            let tid = nix::unistd::gettid().as_raw() as u32;
            let mut slot = scan.try_acquire().context("the scan holds the only slot")?;
            let _current = slot.make_current();
            let mut engine = UringEngine::new(&RingConfig::default())?;
            // This thread's first io_uring submission sets up its io_uring
            // task context (a one-time cost, 0.26-0.52 ms measured under
            // memory pressure): an unthrottled read makes it while running,
            // so the parked episode below holds only the throttle wait.
            let (warm, _) = engine.read_at(&file, vec![0; 4096], 0, None, UNLIMITED_BLOCK);
            warm?;
            entering_tx.send(())?;
            // Spend the burst right before the read, so that the time taken
            // to start this thread and its ring (long on a loaded machine)
            // does not refill the bucket and shorten the wait below.
            throttle.throttle(RATE, std::time::Duration::ZERO)?;
            let (n, buf) =
                engine.read_at(&file, vec![0; READ], 0, Some(&throttle), UNLIMITED_BLOCK);
            read_done.store(true, Ordering::SeqCst);
            assert_eq!(n?, READ);
            Ok((tid, buf))
        })
    };
    entering_rx.recv()?;
    // While the scan thread waits on its throttled read with its lease
    // parked, its capacity is granted to the waiting query.
    let granted = short.acquire_timeout(Duration::from_secs(30))?;
    let (tid, buf) = scan_thread.join().expect("scan thread")?;
    assert!(read_done.load(Ordering::SeqCst));
    assert!(
        buf.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8),
        "data intact"
    );
    let k = cc.counters();
    assert!(
        k.parks >= 1 && k.unparks == k.parks,
        "parked and unparked: {k:?}"
    );
    // The grant happened at the park, inside the scan's wait: when the scan
    // unparked, the short query held the only slot, so the unpark borrowed.
    // (Deterministic: it does not depend on when this thread ran.)
    assert_eq!(k.unpark_borrows, 1, "{k:?}");
    assert_eq!(k.parked, 0);
    drop(granted);
    assert_eq!(
        cc.counters().borrowed,
        0,
        "the loan is repaid by the release"
    );

    let report = bpf.verify(&[tid], VerifyConfig::default())?;
    println!("{report}");
    let th = &report.threads[0];
    assert!(th.parked.parks >= 1, "{report}");
    // Lower bound only: 2 MiB at 2 MiB/s with the burst spent.
    assert!(
        th.parked.parked_ns >= 750_000_000,
        "parked for the throttle wait: {report}"
    );
    assert_eq!(report.verdict, Verdict::Pass, "{report}");
    drop(bpf);
    std::fs::remove_file(&path)?;
    Ok(())
}
