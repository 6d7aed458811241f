//! `cargo xtask bench adaptive`: the static CPU slot budget (2 × cores)
//! against the adaptive one, side by side, on three workloads. Writes
//! `target/bench/adaptive.json`.
//!
//! * (a) `_cpu`: three CPU-bound scans (no throttle; each an allocation of
//!   up to 2 × cores slots, one thread per slot, releasing every 10 ms and
//!   calling the lease's `checkpoint` every unit of work: `should_yield`,
//!   and a CPU yield once a millisecond) plus short queries (a
//!   pool of 4 threads, one query each per 20 ms: 10 units of work on a
//!   non-competing slot; latency from its scheduled start). Three rounds of
//!   4 s each of the static budget, the adaptive one, every static budget
//!   from 1 to 2 × cores − 1 (the sweep) and the floor, interleaved so
//!   other work on the machine meets all of them alike; each mode's short
//!   queries are pooled over its rounds. `best_static_*_cpu`: the sweep's
//!   budget with the lowest short p99 within 5% of its best work (the
//!   budget a person picks after measuring; at the cores, context
//!   `cores_work_per_s_cpu`).
//! * The floors (`floor_*_<w>`, every workload) measure what no budget can
//!   beat, beside the same load: `floor_short_p99_ms_<w>` is the short
//!   queries alone on their slots, with no scan (the same engine as the
//!   measured runs; for (c) `slotring run --scans 0`);
//!   `floor_runq_share_pct_<w>` is one plain CPU-bound thread (no
//!   slotring) beside the same load (the short queries, and the hog of
//!   (b)), from its `/proc` schedstat: the least run-queue share one
//!   running lease can see.
//! * (b) `_hog`: the same, with `stress-ng --cpu 2×cores` started after 2 s
//!   and stopped 6 s later; keys are measured over the hog's 6 s, pooled
//!   over two interleaved rounds of static, adaptive and the floor; the
//!   sweep (`best_static_*`) runs in the first round. `adapt_settle_s` is
//!   the longest settling time of every adaptive run (after the start,
//!   after the stop). Run twice: the hog in the workload's cgroup (`_hog`),
//!   and in a sibling cgroup of its own (`_hog_own_cgroup`).
//! * (c) `_io`: `slotring run` (the IO-bound default workload, 12 s) with
//!   `--adaptive-budget` and `--no-adaptive-budget` in two interleaved
//!   rounds (short queries pooled from the reports' per-query times), and
//!   once each static budget from 1 to 2 × cores − 1
//!   (`--concurrent-threads-soft-limit-num`) for `best_static_*_io` and the
//!   floor.
//!
//! `ADAPTIVE_BENCH_TRACE=1` prints a trace of every run of (a) and (b), one
//! line per 100 ms window (budget, slots in use, waiting allocations,
//! run-queue share of running leases, CPUs of the bench, idle CPUs of the
//! machine, work, grants, yields), and splits each short query's latency
//! into its wake-up (scheduled start until its thread ran), its on-CPU time
//! and the wait after it woke. `ADAPTIVE_BENCH_ONLY=bc` runs only the
//! workloads named (here (b) and (c)) and writes no JSON.
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
const A_ROUNDS: usize = 3;
const A_SECS: f64 = 4.0;
/// Workload (b): interleaved rounds of static, adaptive and the floor; the
/// phase boundaries of a static or adaptive run (the hog from the first to
/// the second, 3 s after it for the settling time).
const B_ROUNDS: usize = 2;
const B_EVENTS: [f64; 3] = [2.0, 8.0, 11.0];
/// Workload (c): interleaved rounds of static and adaptive, and each run's
/// `--duration`.
const C_ROUNDS: usize = 2;
const C_DURATION: &str = "12s";
/// A floor run ([`machine::floor_run`]): a warm-up, then the short queries
/// alone (beside the hog, for (b)), then one plain thread beside them, s.
const FLOOR_LEAD_S: f64 = 0.5;
const FLOOR_SHORT_S: f64 = 2.5;
const FLOOR_PLAIN_S: f64 = 1.0;

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
    machine::require_stress_ng();
    check_best_static_rule();
    check_plain_window_rule();
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
    // `ADAPTIVE_BENCH_ONLY=bc`: only those workloads, no JSON written.
    let only = std::env::var("ADAPTIVE_BENCH_ONLY").ok();
    let runs = |w: char| only.as_ref().is_none_or(|o| o.contains(w));
    if runs('a') {
        workload_a(&bpf, cores, &mut report);
    }
    if runs('b') {
        let same = hog_dir(cg.as_ref(), false);
        let mut settles = vec![(
            "hog",
            workload_b(
                &bpf,
                cores,
                &same,
                true,
                "hog",
                "hog in the workload's cgroup",
                &mut report,
            ),
        )];
        if let Some(c) = &cg {
            let own = hog_dir(Some(c), true);
            let s = workload_b(
                &bpf,
                cores,
                &own,
                false,
                "hog_own_cgroup",
                "hog in a sibling cgroup of equal weight",
                &mut report,
            );
            settles.push(("hog_own_cgroup", s));
        }
        put_settle(&mut report, &settles);
    }
    // (c) `slotring run`, IO-bound.
    drop(bpf);
    if runs('c') {
        workload_c(cores, &mut report);
    }
    if let Some(o) = &only {
        eprintln!("ADAPTIVE_BENCH_ONLY={o}: only those workloads, no JSON written");
        return;
    }
    let end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "machine: load average {} at the start, {} at the end; cgroups: {cg_note}",
        load.trim(),
        end.trim()
    );
    drop(cg);
    report.finish().expect("writing target/bench/adaptive.json");
}
