//! `cargo xtask bench bpf`: what the probes cost.
//!
//! * `filtered_prog_ns`: sched_switch program cost when the event is
//!   dropped by the early tgid filter (probes loaded for another tgid).
//! * `switch_prog_ns` / `wakeup_prog_ns`: cost per event for traced threads,
//!   from `kernel.bpf_stats_enabled` run_time_ns / run_cnt (the sysctl is
//!   restored afterwards). The probes run machine-wide, so the filtered
//!   events in the same window are subtracted at `filtered_*` cost.
//! * `pingpong_overhead_pct`: pipe ping-pong between two registered threads
//!   pinned to one CPU, probes on vs off (median of alternating runs).
//! * `park_unpark_ns_bpf` vs `park_unpark_ns_plain`: one park + unpark
//!   report through the observer into mmapped map memory, vs a no-op
//!   observer (`park_unpark_ns_memory`: into plain memory, degraded mode).
//! * `missed_switch_ratio`: switch events that never reached BPF, over all
//!   switch events of the traced threads.

use std::hint::black_box;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use slotring_benchkit::{Report, median, ns_per_iter};
use slotring_bpf::{BpfConfig, BpfError, LEASE_MIRROR, ProgStats, SlotringBpf};
use slotring_throttle::{LeaseObserver, LeaseState, notify_lease_state};

const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";
const ROUNDS: u32 = 20_000;

struct StatsGuard(String);

impl StatsGuard {
    fn enable() -> Self {
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

fn pin_to(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("cpu in range");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("setaffinity");
}

fn tid() -> u32 {
    nix::unistd::gettid().as_raw() as u32
}

/// Two threads on one CPU bouncing a byte through two pipes. Returns the
/// wall ns per round trip and the two thread ids.
fn pingpong(rounds: u32) -> (f64, [u32; 2]) {
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

fn prog(stats: &[ProgStats], name: &str) -> (u64, u64) {
    stats
        .iter()
        .find(|p| p.name == name)
        .map_or((0, 0), |p| (p.run_time_ns, p.run_count))
}

fn load(dir: &str, tgid: u32) -> Result<SlotringBpf, BpfError> {
    SlotringBpf::load(BpfConfig {
        pin_dir: format!("/sys/fs/bpf/{dir}-{}", std::process::id()).into(),
        target_tgid: tgid,
        ..BpfConfig::default()
    })
}

struct Noop;
impl LeaseObserver for Noop {
    fn on_lease_state(&self, state: LeaseState) {
        black_box(state);
    }
}

fn main() {
    let mut report = Report::new("bpf");
    slotring_bpf::install_lease_observer();
    let guard = StatsGuard::enable();

    // 1. Everything filtered: probes for a tgid that does not exist.
    let filtered = match load("slotring-bench-filtered", 0x7fff_fff0) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("bpf bench: probes unavailable, nothing to measure: {e}");
            return;
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
    report.put(
        "filtered_prog_ns",
        f_switch,
        "ns per sched_switch dropped by the tgid filter (goal <= 70)",
    );

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
    report.put(
        "switch_prog_ns",
        switch_ns,
        "ns per sched_switch of traced threads (goal <= 150)",
    );
    report.put(
        "wakeup_prog_ns",
        wakeup_ns,
        "ns per sched_wakeup of a traced thread (goal <= 150)",
    );
    report.put(
        "missed_switch_ratio",
        missed as f64 / (events + missed).max(1) as f64,
        "switch events that never reached BPF (time stays exact)",
    );

    // 3. Ping-pong with probes on vs off, alternating (stats collection off:
    // it adds two clock reads per program run).
    drop(guard);
    let mut on = Vec::new();
    let mut off = Vec::new();
    for _ in 0..5 {
        on.push(pingpong(ROUNDS / 2).0);
    }
    drop(traced);
    for _ in 0..5 {
        off.push(pingpong(ROUNDS / 2).0);
    }
    let traced = load("slotring-bench-traced2", std::process::id()).expect("reload");
    for _ in 0..5 {
        on.push(pingpong(ROUNDS / 2).0);
    }
    drop(traced);
    for _ in 0..5 {
        off.push(pingpong(ROUNDS / 2).0);
    }
    let (m_on, m_off) = (median(&mut on), median(&mut off));
    report.put(
        "pingpong_rtt_ns_probes_on",
        m_on,
        "ns per pipe round trip, one CPU",
    );
    report.put(
        "pingpong_rtt_ns_probes_off",
        m_off,
        "ns per pipe round trip, one CPU",
    );
    report.put(
        "pingpong_overhead_pct",
        (m_on - m_off) / m_off * 100.0,
        "% slower with probes on",
    );

    // 4. The observer's cost per park + unpark.
    let noop: &dyn LeaseObserver = &Noop;
    let plain = ns_per_iter(9, 200_000, || {
        black_box(noop).on_lease_state(LeaseState::Parked);
        black_box(noop).on_lease_state(LeaseState::Running);
    });
    let traced = load("slotring-bench-park", std::process::id()).expect("load");
    traced.register_current_thread().expect("register");
    let bpf = ns_per_iter(9, 200_000, || {
        LEASE_MIRROR.on_lease_state(LeaseState::Parked);
        LEASE_MIRROR.on_lease_state(LeaseState::Running);
    });
    drop(traced);
    let mem = SlotringBpf::degraded(BpfError::NoBtf(aya::BtfError::FileError {
        path: "/sys/kernel/btf/vmlinux".into(),
        error: std::io::Error::other("bench: plain-memory baseline"),
    }));
    mem.register_current_thread().expect("register");
    let memory = ns_per_iter(9, 200_000, || {
        LEASE_MIRROR.on_lease_state(LeaseState::Parked);
        LEASE_MIRROR.on_lease_state(LeaseState::Running);
    });
    drop(mem);
    report.put(
        "park_unpark_ns_plain",
        plain,
        "park+unpark through a no-op observer",
    );
    report.put(
        "park_unpark_ns_bpf",
        bpf,
        "park+unpark mirrored into the mmapped lease map",
    );
    report.put(
        "park_unpark_ns_memory",
        memory,
        "park+unpark mirrored into plain memory",
    );
    report.finish().expect("write bench JSON");
}
