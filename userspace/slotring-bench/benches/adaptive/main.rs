//! `cargo xtask bench adaptive`: the static CPU slot budget (2 × cores)
//! against the adaptive one, side by side, on three workloads. Writes
//! `target/bench/adaptive.json`.
//!
//! * (a) `_cpu`: three CPU-bound scans (no throttle; each an allocation of
//!   up to 2 × cores slots, one thread per slot, releasing every 10 ms and
//!   calling the lease's `checkpoint` every unit of work: `should_yield`,
//!   and a CPU yield once a millisecond) plus short queries (a
//!   pool of 4 threads, one query each per 20 ms: 10 units of work on a
//!   non-competing slot; latency from its scheduled start). Four rounds of
//!   4 s each of the static budget, the adaptive one and every static
//!   budget from 1 to 2 × cores − 1 (the sweep), interleaved so other work
//!   on the machine meets all of them alike. `best_static_*_cpu`: the
//!   sweep's budget with the lowest short p99 within 5% of its best work
//!   (the budget a person picks after measuring; at the cores, context
//!   `cores_work_per_s_cpu`). `floor_*_cpu`: the physical floor without
//!   slotring (one plain CPU-bound thread alone: its run-queue share; the
//!   short queries alone: their p99). The notes say how many CPUs the
//!   bench process got and how many the machine left idle, and the
//!   budget's time at each level.
//! * (b) `_hog`: the same, with `stress-ng --cpu 2×cores` started after 3 s
//!   and stopped 6 s later; keys are measured over the hog's 6 s;
//!   `adapt_settle_s` is the longer of the two settling times (after the
//!   start, after the stop). Run twice: the hog in the workload's cgroup,
//!   and in a sibling cgroup of its own (`…_own_cgroup`). Context keys
//!   `floor_*_hog`: the physical floor without slotring (one plain thread
//!   beside the hog: its run-queue share; the short queries alone beside
//!   it: their p99).
//! * (c) `_io`: `slotring run` (the IO-bound default workload) with
//!   `--adaptive-budget` and `--no-adaptive-budget`, and with each static
//!   budget from 1 to 2 × cores − 1 (`--concurrent-threads-soft-limit-num`)
//!   for `best_static_*_io`. (No `floor_*_io`: the command has no run
//!   without scans.)
//!
//! `ADAPTIVE_BENCH_TRACE=1` prints a trace of every run of (a) and (b), one
//! line per 100 ms window (budget, slots in use, waiting allocations,
//! run-queue share of running leases, CPUs of the bench, idle CPUs of the
//! machine, work, grants, yields), and splits each short query's latency
//! into its wake-up (scheduled start until its thread ran), its on-CPU time
//! and the wait after it woke. `ADAPTIVE_BENCH_ONLY=a` stops after (a)
//! (no JSON).
//!
//! A unit of CPU work is a fixed loop (`UNIT_ITERS` iterations). Runs as
//! root (probes, cgroups). The whole bench runs in a cpu cgroup of its own
//! with a large weight, so the other work on a shared machine disturbs it
//! less; that cgroup's children hold the workload and, for the "own cgroup"
//! variant, the hog. Clean-up: stress-ng runs in a process group of its own
//! that a guard kills (also on a panic's unwind) and stops by itself after
//! 60 s; the cgroup directories are removed by guards, and a run killed
//! outright leaves directories that the next run removes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use slotring::bpf::{AdaptiveBudget, BpfConfig, BudgetPoint, RunqProbe, SlotringBpf};
use slotring::slots::{AdaptiveConfig, ConcurrencyControl, SlotsError};
use slotring_benchkit::{Report, median, percentile};

const UNIT_ITERS: u64 = 50_000;
const SCANS: usize = 3;
const SHORT_THREADS: usize = 4;
const SHORT_EVERY: Duration = Duration::from_millis(20);
const SHORT_UNITS: u64 = 10;
const QUANTUM: Duration = Duration::from_millis(10);
const WINDOW: Duration = Duration::from_millis(100);
/// Workload (a): interleaved rounds of each mode, seconds per run.
const A_ROUNDS: usize = 4;
const A_SECS: f64 = 4.0;

mod budget_stats;
mod cpu;
mod io;
mod machine;
mod sweep;
mod workloads;

use budget_stats::*;
use cpu::*;
use io::*;
use machine::*;
use sweep::*;
use workloads::*;

pub(crate) fn unit() {
    let mut x = 0x9e37_79b9_u64;
    for _ in 0..UNIT_ITERS {
        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
    }
}

fn main() {
    check_best_static_rule();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cg = match cgroups() {
        Ok(c) => Some(c),
        Err(why) => {
            eprintln!("adaptive bench: no cgroups ({why}); running in the caller's cgroup");
            None
        }
    };
    let bpf = SlotringBpf::load(BpfConfig {
        pin_dir: PathBuf::from(format!("/sys/fs/bpf/slotring-bench-{}", std::process::id())),
        ..BpfConfig::default()
    })
    .expect("the adaptive bench needs the probes (run as root)");
    slotring::bpf::install_lease_observer();
    let mut report = Report::new("adaptive");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cg_note = cg.as_ref().map_or("none".into(), |c| c.note.clone());
    workload_a(&bpf, cores, &mut report);
    if std::env::var_os("ADAPTIVE_BENCH_ONLY").is_some_and(|v| v == "a") {
        eprintln!("ADAPTIVE_BENCH_ONLY=a: (a) only, no JSON written");
        return;
    }
    workload_b(&bpf, cores, cg.as_ref(), &mut report);
    if let Some(c) = &cg {
        workload_b_own_cgroup(&bpf, cores, c, &mut report);
    }
    // (c) `slotring run`, IO-bound.
    drop(bpf);
    workload_c(cores, &mut report);
    let end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "machine: load average {} at the start, {} at the end; cgroups: {cg_note}",
        load.trim(),
        end.trim()
    );
    drop(cg);
    report.finish().expect("writing target/bench/adaptive.json");
}
