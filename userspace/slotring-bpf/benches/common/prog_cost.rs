//! What the probes cost per event, from `kernel.bpf_stats_enabled`
//! (run_time_ns / run_cnt of each program): shared by the `bpf` and
//! `verdict` benches, which include this file.
//!
//! * `filtered_prog_ns`: a sched_switch dropped by the early tgid filter
//!   (probes loaded for a tgid that does not exist).
//! * `switch_prog_ns` / `wakeup_prog_ns`: per event of traced threads. The
//!   probes run machine-wide, so the filtered events in the same window are
//!   subtracted at the filtered cost.

#![allow(dead_code, reason = "each includer uses part of it")]

use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use slotring_benchkit::Report;
use slotring_bpf::{BpfConfig, BpfError, ProgStats, SlotringBpf};
use slotring_throttle::{LeaseState, notify_lease_state};

const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Ping-pong round trips per measurement.
pub const ROUNDS: u32 = 20_000;

/// `kernel.bpf_stats_enabled = 1` until dropped (then restored).
pub struct StatsGuard(String);

impl StatsGuard {
    /// Enable the run statistics (root).
    pub fn enable() -> Self {
        let old = std::fs::read_to_string(SYSCTL).expect("read bpf_stats_enabled");
        std::fs::write(SYSCTL, "1").expect("enable bpf_stats_enabled (root)");
        Self(old.trim().to_owned())
    }
}

impl Drop for StatsGuard {
    fn drop(&mut self) {
        let _ = std::fs::write(SYSCTL, &self.0);
    }
}

/// Pin the calling thread to `cpu`.
pub fn pin_to(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("cpu in range");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("setaffinity");
}

/// The calling thread's id.
pub fn tid() -> u32 {
    nix::unistd::gettid().as_raw() as u32
}

/// Two threads on one CPU bouncing a byte through two pipes. Returns the
/// wall ns per round trip and the two thread ids.
pub fn pingpong(rounds: u32) -> (f64, [u32; 2]) {
    let (a_r, a_w) = nix::unistd::pipe().unwrap();
    let (b_r, b_w) = nix::unistd::pipe().unwrap();
    let cpu = 1 % std::thread::available_parallelism().map_or(1, |n| n.get());
    let side = move |rx: OwnedFd, tx: OwnedFd, first: bool| {
        move || {
            pin_to(cpu);
            notify_lease_state(LeaseState::Running);
            let mut buf = [0u8; 1];
            let start = Instant::now();
            for _ in 0..rounds {
                if first {
                    nix::unistd::write(tx.as_fd(), b"x").unwrap();
                    nix::unistd::read(rx.as_fd(), &mut buf).unwrap();
                } else {
                    nix::unistd::read(rx.as_fd(), &mut buf).unwrap();
                    nix::unistd::write(tx.as_fd(), b"x").unwrap();
                }
            }
            let ns = start.elapsed().as_nanos() as f64 / f64::from(rounds);
            notify_lease_state(LeaseState::NotHolding);
            (ns, tid())
        }
    };
    let h1 = std::thread::spawn(side(a_r, b_w, true));
    let h2 = std::thread::spawn(side(b_r, a_w, false));
    let (ns, t1) = h1.join().unwrap();
    let (_, t2) = h2.join().unwrap();
    (ns, [t1, t2])
}

/// `(run_time_ns, run_count)` of program `name`.
pub fn prog(stats: &[ProgStats], name: &str) -> (u64, u64) {
    stats
        .iter()
        .find(|p| p.name == name)
        .map_or((0, 0), |p| (p.run_time_ns, p.run_count))
}

/// Load the probes for `tgid`, pinned under `/sys/fs/bpf/<dir>-<pid>`.
pub fn load(dir: &str, tgid: u32) -> Result<SlotringBpf, BpfError> {
    SlotringBpf::load(BpfConfig {
        pin_dir: format!("/sys/fs/bpf/{dir}-{}", std::process::id()).into(),
        target_tgid: tgid,
        ..BpfConfig::default()
    })
}

/// The per-event costs.
#[derive(Debug, Clone, Copy)]
pub struct ProgCost {
    /// ns per sched_switch dropped by the tgid filter.
    pub filtered_switch_ns: f64,
    /// ns per sched_switch of traced threads.
    pub switch_ns: f64,
    /// ns per sched_wakeup of a traced thread.
    pub wakeup_ns: f64,
    /// Switch events that never reached BPF, over all of the traced threads.
    pub missed_ratio: f64,
}

/// Measure [`ProgCost`] with ping-pongs (filtered, then traced), with the
/// run statistics enabled for the duration. `None` without probes.
pub fn measure() -> Option<ProgCost> {
    let _guard = StatsGuard::enable();
    // 1. Everything filtered: probes for a tgid that does not exist.
    let filtered = match load("slotring-bench-filtered", 0x7fff_fff0) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("probes unavailable, nothing to measure: {e}");
            return None;
        }
    };
    let before = filtered.prog_stats();
    let _ = pingpong(ROUNDS);
    let after = filtered.prog_stats();
    let (t0, c0) = prog(&before, "switch_btf");
    let (t1, c1) = prog(&after, "switch_btf");
    let f_switch = (t1 - t0) as f64 / (c1 - c0).max(1) as f64;
    let (t0, c0) = prog(&before, "wakeup_btf");
    let (t1, c1) = prog(&after, "wakeup_btf");
    let f_wakeup = (t1 - t0) as f64 / (c1 - c0).max(1) as f64;
    drop(filtered);

    // 2. Traced: our ping-pong threads registered.
    let traced = load("slotring-bench-traced", std::process::id()).expect("load traced");
    let before = traced.prog_stats();
    let (_, tids) = pingpong(ROUNDS);
    let after = traced.prog_stats();
    let mut events = 0u64;
    let mut wakeups = 0u64;
    let mut missed = 0u64;
    for t in tids {
        let a = traced.thread_acct(t).expect("registered");
        events += a.events;
        wakeups += a.wakeups.iter().sum::<u64>();
        missed += a.missed_switch_in + a.missed_switch_out;
    }
    // A switch between the two threads is one run with two events.
    let runs_traced = (events / 2).max(1);
    let (t0, c0) = prog(&before, "switch_btf");
    let (t1, c1) = prog(&after, "switch_btf");
    let other = (c1 - c0).saturating_sub(runs_traced) as f64;
    let switch_ns = ((t1 - t0) as f64 - other * f_switch) / runs_traced as f64;
    let (t0, c0) = prog(&before, "wakeup_btf");
    let (t1, c1) = prog(&after, "wakeup_btf");
    let other_w = (c1 - c0).saturating_sub(wakeups) as f64;
    let wakeup_ns = ((t1 - t0) as f64 - other_w * f_wakeup) / wakeups.max(1) as f64;
    Some(ProgCost {
        filtered_switch_ns: f_switch,
        switch_ns,
        wakeup_ns,
        missed_ratio: missed as f64 / (events + missed).max(1) as f64,
    })
}

/// Put the two keys both benches report, with their goals.
pub fn put_switch_costs(report: &mut Report, c: &ProgCost) {
    report.put(
        "filtered_prog_ns",
        c.filtered_switch_ns,
        "ns per sched_switch dropped by the tgid filter (goal <= 70)",
    );
    report.put(
        "switch_prog_ns",
        c.switch_ns,
        "ns per sched_switch of traced threads (goal <= 150)",
    );
}
