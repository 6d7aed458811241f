//! The adaptive budget against the real kernel (run as root): the budget
//! falls under a real CPU hog (`stress-ng --cpu`) and recovers after it
//! stops; probes that go away return it to static.
//!
//! The test process and the hog share a cgroup of their own (v1 `cpu`
//! controller, or v2 where it has the `cpu` controller) with a large CPU
//! weight, so that what the probes see is this test's hog and not whatever
//! else runs on the machine. One test in its own file: the process moves
//! into that cgroup as a whole.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use slotring_bpf::{AdaptiveBudget, BpfConfig, BpfError, SlotringBpf};
use slotring_slots::{AdaptiveConfig, ConcurrencyControl};

/// A cpu cgroup this process runs in while alive; moves back and removes it on drop.
struct Cgroup {
    dir: PathBuf,
    parent_procs: PathBuf,
}

impl Cgroup {
    fn enter() -> Option<Self> {
        let name = format!("slotring-adaptive-test-{}", std::process::id());
        // v2 with the cpu controller, else v1's cpu hierarchy.
        let v2 = PathBuf::from("/sys/fs/cgroup");
        let candidates = [
            (v2.clone(), "cpu.weight", "10000"),
            (v2.join("cpu"), "cpu.shares", "262144"),
        ];
        for (root, knob, value) in candidates {
            if !root.join(knob).exists() && !root.join("cgroup.procs").exists() {
                continue;
            }
            let dir = root.join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            let ok = std::fs::write(dir.join(knob), value).is_ok()
                && std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).is_ok();
            let g = Cgroup {
                dir,
                parent_procs: root.join("cgroup.procs"),
            };
            if ok {
                return Some(g);
            }
        }
        None
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.parent_procs, std::process::id().to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn hog(n: usize) -> Option<Child> {
    match Command::new("stress-ng")
        .args(["--cpu", &n.to_string(), "--timeout", "20s", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => Some(c),
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "stress-ng is required under CI=true (apt-get install stress-ng): {e}"
            );
            eprintln!("SKIP the budget under a hog: stress-ng is not installed: {e}");
            None
        }
    }
}

/// CPU work in ~1 ms chunks between checkpoints.
fn spin_ms() {
    let t = Instant::now();
    let mut x = 0u64;
    while t.elapsed() < Duration::from_millis(1) {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

#[test]
fn budget_falls_under_a_cpu_hog_and_recovers() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP the budget under a hog: needs root for the probes");
        return;
    }
    let bpf = match SlotringBpf::load(BpfConfig {
        pin_dir: PathBuf::from(format!(
            "/sys/fs/bpf/slotring-test-{}-adaptive",
            std::process::id()
        )),
        ..BpfConfig::default()
    }) {
        Ok(b) => b,
        Err(BpfError::NoBtf(why)) => {
            eprintln!("SKIP the budget under a hog: kernel has no BTF: {why}");
            return;
        }
        Err(e) => panic!("loading the probes failed: {e}"),
    };
    slotring_bpf::install_lease_observer();
    // Is stress-ng there (a failure under CI=true, else a printed skip)?
    match hog(1) {
        Some(mut c) => {
            let _ = c.kill();
            let _ = c.wait();
        }
        None => return,
    }
    let cg = Cgroup::enter();
    if cg.is_none() {
        eprintln!("note: no writable cpu cgroup: the machine's other load is part of the signal");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ceiling = 2 * cores as u64;
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(ceiling);
    let alloc = Arc::new(cc.allocate(0, ceiling).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..ceiling)
        .map(|_| {
            let (alloc, stop) = (alloc.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut yields = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut slot) = alloc.acquire_timeout(Duration::from_millis(50)) else {
                        continue;
                    };
                    let lease = slot.make_current();
                    loop {
                        spin_ms();
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        if lease.should_yield() {
                            yields += 1;
                            break;
                        }
                    }
                }
                yields
            })
        })
        .collect();
    let mut ab = AdaptiveBudget::start(
        cc.clone(),
        bpf.runq_probe(),
        AdaptiveConfig::with_ceiling(ceiling),
        Duration::from_millis(100),
    )
    .unwrap();
    assert_eq!(ab.status().adaptive, 1);
    // Without the hog: the budget comes down to about the cores.
    std::thread::sleep(Duration::from_millis(1500));
    let before = ab.status().budget;
    // With the hog (twice the cores in busy threads): down to the floor.
    let mut h = hog(2 * cores).expect("stress-ng ran a moment ago");
    let t_hog = Instant::now();
    std::thread::sleep(Duration::from_millis(2000));
    let during: Vec<u64> = ab
        .history()
        .iter()
        .filter(|p| p.t_s >= 1.5 + 1.0)
        .map(|p| p.budget)
        .collect();
    let _ = h.kill();
    let _ = h.wait();
    let t_stop = t_hog.elapsed();
    std::thread::sleep(Duration::from_millis(2500));
    let hist = ab.history();
    let after: Vec<u64> = hist
        .iter()
        .filter(|p| p.t_s >= 1.5 + t_stop.as_secs_f64())
        .map(|p| p.budget)
        .collect();
    // The probes go away mid-run: back to the static budget, counted.
    drop(bpf);
    std::thread::sleep(Duration::from_millis(300));
    let s = ab.status();
    stop.store(true, Ordering::Relaxed);
    let yields: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    ab.stop();
    drop(cg);
    let trace: Vec<(f64, u64, f64)> = hist
        .iter()
        .map(|p| {
            (
                (p.t_s * 10.0).round() / 10.0,
                p.budget,
                p.runq_share_pct.round(),
            )
        })
        .collect();
    eprintln!("before {before}, during {during:?}, after {after:?}; trace {trace:?}");
    assert!(
        !during.is_empty() && during.iter().all(|&b| b == 1),
        "the hog drives the budget to the floor: {during:?} (trace {trace:?})"
    );
    assert!(
        after.iter().any(|&b| b >= 2),
        "the budget recovers after the hog: {after:?} (trace {trace:?})"
    );
    assert!(yields > 0, "holders above the shrunk budget yielded");
    assert_eq!(cc.counters().yields, yields);
    assert_eq!((s.adaptive, s.probe_losses), (0, 1), "{s:?}");
    assert_eq!(cc.effective_budget(), ceiling, "static again");
}
