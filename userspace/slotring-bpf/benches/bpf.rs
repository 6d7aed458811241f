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

use slotring_benchkit::{Report, median, ns_per_iter};
use slotring_bpf::{BpfError, LEASE_MIRROR, SlotringBpf};
use slotring_throttle::{LeaseObserver, LeaseState};

#[path = "common/prog_cost.rs"]
mod prog_cost;

use prog_cost::{ROUNDS, load, pingpong};

struct Noop;
impl LeaseObserver for Noop {
    fn on_lease_state(&self, state: LeaseState) {
        black_box(state);
    }
}

fn main() {
    let mut report = Report::new("bpf");
    slotring_bpf::install_lease_observer();

    // 1-2. Per event: filtered, traced.
    let Some(cost) = prog_cost::measure() else {
        return;
    };
    prog_cost::put_switch_costs(&mut report, &cost);
    report.put(
        "wakeup_prog_ns",
        cost.wakeup_ns,
        "ns per sched_wakeup of a traced thread (goal <= 150)",
    );
    report.put(
        "missed_switch_ratio",
        cost.missed_ratio,
        "switch events that never reached BPF (time stays exact)",
    );

    // 3. Ping-pong with probes on vs off, alternating (stats collection off:
    // it adds two clock reads per program run).
    let mut on = Vec::new();
    let mut off = Vec::new();
    let traced = load("slotring-bench-traced", std::process::id()).expect("load traced");
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
