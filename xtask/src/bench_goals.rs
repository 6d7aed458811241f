//! The goals `cargo xtask bench-report` judges each suite's keys by: for
//! each suite, its keys with a goal (`bench_goal.rs`'s forms), the key the
//! value is read against (its baseline) and what the key means. A goal is
//! the one its bench's note or its issue states; a key with none is listed
//! in the report without one.

/// One key's row.
pub(crate) struct KeyGoal {
    /// The bench key.
    pub(crate) key: &'static str,
    /// Its goal, in `bench_goal.rs`'s forms; `None`: none is stated.
    pub(crate) goal: Option<&'static str>,
    /// The key its value is read against, when the goal names none.
    pub(crate) baseline: Option<&'static str>,
    /// What it measures, in one line.
    pub(crate) meaning: &'static str,
}

const fn g(key: &'static str, goal: &'static str, meaning: &'static str) -> KeyGoal {
    KeyGoal {
        key,
        goal: Some(goal),
        baseline: None,
        meaning,
    }
}

const fn gb(
    key: &'static str,
    goal: &'static str,
    baseline: &'static str,
    meaning: &'static str,
) -> KeyGoal {
    KeyGoal {
        key,
        goal: Some(goal),
        baseline: Some(baseline),
        meaning,
    }
}

/// A key without a goal, shown beside the key it is read against.
const fn context(key: &'static str, baseline: &'static str, meaning: &'static str) -> KeyGoal {
    KeyGoal {
        key,
        goal: None,
        baseline: Some(baseline),
        meaning,
    }
}

const fn info(key: &'static str, meaning: &'static str) -> KeyGoal {
    KeyGoal {
        key,
        goal: None,
        baseline: None,
        meaning,
    }
}

/// `(suite, its keys' goals)`; a suite of `suites::BENCHES` that is not
/// here has no stated goals.
pub(crate) const GOALS: &[(&str, &[KeyGoal])] = &[
    ("verdict", VERDICT),
    ("workload", WORKLOAD),
    ("throttle", THROTTLE),
    ("fair", FAIR),
    ("slots", SLOTS),
    ("bpf", BPF),
    ("uring", URING),
    ("write", WRITE),
    ("e2e", E2E),
    ("adaptive", ADAPTIVE),
];

const VERDICT: &[KeyGoal] = &[
    g(
        "verdict_false_pass",
        "<= 0",
        "spinners (>= 5 % of each wait, and partial spinners) that passed",
    ),
    g(
        "verdict_false_fail",
        "<= 0",
        "honest sleepers that failed, quiet or beside stress-ng --cpu 2",
    ),
    g(
        "verdict_detect_min_pct_20ms",
        "<= 2",
        "smallest spin % caught at 20 ms waits, every position and round",
    ),
    g(
        "verdict_partial_fails",
        ">= 1 x verdict_partial_threads",
        "partial spinners (one wait in ten spun through) that failed: all of them",
    ),
    info(
        "verdict_partial_threads",
        "partial spinners run, every wait length and round",
    ),
    info(
        "verdict_excess_pct_honest_worst",
        "CPU above the bounds of the worst honest sleeper, % of its parked time (tolerated 1 %)",
    ),
];

const WORKLOAD: &[KeyGoal] = &[
    g(
        "wl_charge_ratio_3level_flat",
        "<= 1.5",
        "wl_charge_ns_3level / wl_charge_ns_flat, the median over rounds run in alternate pairs (the issue's wl_charge_ns_3level <= 1.5 x wl_charge_ns_flat)",
    ),
    info(
        "wl_charge_ns_3level",
        "no-wait permit, 2 threads, a leaf two levels under the capped root, ns",
    ),
    info(
        "wl_charge_ns_flat",
        "no-wait permit, 2 threads, one leaf under the capped root, ns",
    ),
    g(
        "wl_grant_release_ratio_tokio",
        "<= 1.5",
        "wl_grant_release_ns / tokio_semaphore_ns, the median over rounds run in alternate pairs (the issue's wl_grant_release_ns <= 1.5 x tokio_semaphore_ns)",
    ),
    info(
        "wl_grant_release_ns",
        "a CPU slot taken and given back, 2 threads, limits at root and leaf, ns",
    ),
    info(
        "tokio_semaphore_ns",
        "tokio::sync::Semaphore::try_acquire and its permit's drop, 2 threads, ns",
    ),
    g(
        "wl_push_pop_ns_10k",
        "<= 500",
        "one push and one dispatch, 10,000 queued leaves",
    ),
    g(
        "wl_user_wait_p99_ms",
        "<= wl_piece_ms + 2",
        "a priority-0 read's wait for its turn beside a saturating priority-1 background, p99 ms: at most one 256 KiB piece in flight ahead of it, plus 2 ms",
    ),
    g(
        "wl_user_wait_p99_ms",
        "<= 0.1 x wl_user_wait_p99_ms_rocksdb",
        "the same wait against the RocksDB-style limiter's",
    ),
    info("wl_piece_ms", "one 256 KiB piece at the 64 MiB/s root, ms"),
    g(
        "wl_background_share_idle_pct",
        ">= 99",
        "a background workload's share of an otherwise idle resource, %",
    ),
    g(
        "wl_cap_error_pct",
        "<= 0.5",
        "a capped workload's rate against its cap, %",
    ),
    g(
        "wl_share_w31_pct",
        "75 +- 2",
        "the weight-3 sibling's share against a weight-1 one, %",
    ),
    g(
        "wl_share_nested_pct",
        "50 +- 2",
        "a nested workload's share against its parent's sibling, equal weights, %",
    ),
    g(
        "wl_inflight_max",
        "<= 1 x wl_inflight_limit",
        "most requests in flight at once, against the limit",
    ),
    g(
        "wl_inflight_sysfs_over_pct",
        "<= 1",
        "the same case as the device counts it (its reads in flight, sysfs): % of 0.5 ms samples above the limit",
    ),
    info(
        "wl_inflight_max_sysfs",
        "the device's peak of reads in flight in that case (a read the kernel splits in two counts twice)",
    ),
    info(
        "wl_inflight_sysfs_over_pct_unlimited",
        "% of samples above the limit with the 16 readers unthrottled",
    ),
    g(
        "wl_write_share_pct",
        "75 +- 2",
        "the weight-3 workload's share of the write rate, %",
    ),
    g(
        "wl_cpu_share_pct",
        "67 +- 3",
        "the weight-2 workload's share of CPU slots, %",
    ),
    g(
        "wl_cpu_short_p99_ms",
        "<= 1.2 x wl_cpu_short_p99_ms_alone",
        "short queries' p99 beside the CPU-bound workloads, ms",
    ),
    g(
        "wl_cpu_short_p99_ms",
        "<= 1.2 x wl_cpu_short_p99_ms_busy_cores",
        "the same against the floor: the queries alone while plain threads keep the other cores busy",
    ),
    info(
        "wl_cpu_short_p99_ms_busy_cores",
        "short queries with no background while plain threads spin on the other cores outside any slot: the machine's floor for a work-conserving tree, ms",
    ),
    info(
        "wl_cpu_short_p99_over_busy_cores",
        "wl_cpu_short_p99_ms / wl_cpu_short_p99_ms_busy_cores",
    ),
    info(
        "wl_cpu_short_work_p99_ms_busy_cores",
        "of them, the 0.5 ms of work, wall time, p99 ms",
    ),
    info(
        "wl_cpu_short_p99_ms_no_checkpoint",
        "the same short queries beside background tasks that never check should_yield (no preemption), ms",
    ),
    info(
        "wl_cpu_preemptions_per_s",
        "background slots preempted for the short queries, per s",
    ),
    info(
        "wl_cpu_short_wait_p99_ms",
        "of the short queries' latency, the wait for a slot, p99 ms (what the slot scheduler decides)",
    ),
    info(
        "wl_cpu_short_work_p99_ms",
        "of it, the 0.5 ms of work, wall time, p99 ms (alone: wl_cpu_short_work_p99_ms_alone)",
    ),
    info(
        "wl_cpu_short_release_p99_ms",
        "of it, the drop of the slot, handed to a woken background thread, p99 ms",
    ),
    info(
        "wl_cpu_short_slowest_pct_wait",
        "of the queries slower than 1.2 x the alone p99, % whose largest part was the wait",
    ),
    info(
        "wl_cpu_short_slowest_pct_work",
        "the same, % whose largest part was the work",
    ),
    info(
        "wl_cpu_short_slowest_pct_release",
        "the same, % whose largest part was the release",
    ),
    info(
        "wl_cpu_bg_held_p99_ms",
        "the background's 1 ms tasks from acquire to done, p99 ms: the kernel's stretch of CPU-bound work on this machine",
    ),
    info(
        "wl_push_pop_ns_10",
        "the same loop over 10 leaves, their state in the cache: the scheduler's own work, ns",
    ),
    info(
        "mem_cold_line_ns",
        "the machine's cost of one cache line not in the core's caches (a dependent-load chase over 64 MiB), ns: what reaching each of 10,000 leaves' state costs",
    ),
    info(
        "wl_push_pop_cold_lines_10k",
        "what 10,000 leaves add to 10, in cold-line loads: (wl_push_pop_ns_10k - wl_push_pop_ns_10) / mem_cold_line_ns",
    ),
    info(
        "wl_push_pop_ns_10k_bench_overhead",
        "of wl_push_pop_ns_10k, the bench's own loop with no scheduler, ns",
    ),
    info(
        "wl_grant_release_ns_1level",
        "wl_grant_release_ns with one limit (the leaf's), ns",
    ),
    info(
        "tokio_semaphore_ns_2",
        "two tokio Semaphores taken and given back (the two-limit comparison), ns",
    ),
];

const THROTTLE: &[KeyGoal] = &[
    gb(
        "ratio_ours_vs_mutex_1t",
        "<= 0.5",
        "mutex_port_ns_1t",
        "no-wait throttle, 1 thread: ours / a mutex-guarded port",
    ),
    gb(
        "ratio_ours_vs_governor_2t",
        "<= 1",
        "governor_ns_2t",
        "no-wait throttle, 2 threads: ours / governor",
    ),
    g(
        "rate_error_pct_max",
        "<= 0.5",
        "worst rate error of 1 MB/s, 100 MB/s and 1 GB/s, %",
    ),
    g(
        "wait_overshoot_us_p50_ring",
        "<= 0.5 x wait_overshoot_us_p50",
        "ring-timeout wait's overshoot of 1 ms deficits, p50 µs, against the nanosleep's",
    ),
];

const FAIR: &[KeyGoal] = &[
    gb(
        "fair_share_b_pct",
        "50 +- 2",
        "fifo_share_b_pct",
        "B (1 stream) vs A (64), equal weights, fair, %",
    ),
    g(
        "fair_share_a_pct_w31",
        "75 +- 2",
        "A weight 3 vs B weight 1, %",
    ),
    g(
        "fair_jain_weighted",
        ">= 0.99",
        "Jain's index of bytes/weight, the worse of 1:1 and 3:1",
    ),
    g(
        "fair_rate_error_pct",
        "<= 0.5",
        "total granted vs 64 MiB/s over 5 s, fair, %",
    ),
    gb(
        "fair_b_wait_p99_ms",
        "<= 36.25",
        "fifo_b_wait_p99_ms",
        "B's wait p99, fair, ms (goal: its 1 MiB at half the 64 MiB/s rate + 5 ms)",
    ),
    g(
        "fair_idle_return_excess_pct",
        "<= 0.5",
        "B's bytes above its half in its first second back after 10 s idle, % (tau / 1 s)",
    ),
    g(
        "fair_share_b_pct_async",
        "50 +- 2",
        "B (1 task) vs A (64 tasks) through SharedEngine, equal weights, %",
    ),
];

const SLOTS: &[KeyGoal] = &[
    gb(
        "grant_release_over_tokio",
        "<= 1.5",
        "tokio_semaphore_ns",
        "slot grant + release / tokio Semaphore",
    ),
    g(
        "mmf_grant_ns_10k",
        "<= 300",
        "max-min fair grant, 10,000 waiting allocations, ns",
    ),
    g(
        "jain_mmf",
        ">= 0.99",
        "Jain's index of the short queries' service, max-min fair",
    ),
];

const BPF: &[KeyGoal] = &[
    g(
        "wakeup_prog_ns",
        "<= 150",
        "ns per sched_wakeup of a traced thread",
    ),
    g(
        "filtered_prog_ns",
        "<= 70",
        "ns per sched_switch dropped by the tgid filter",
    ),
    g(
        "switch_prog_ns",
        "<= 150",
        "ns per sched_switch of traced threads",
    ),
];

const URING: &[KeyGoal] = &[
    gb(
        "hot_ratio_uring_vs_pread",
        ">= 0.9",
        "hot_gibps_pread",
        "hot reads, ring / pread, median per-round ratio",
    ),
    g(
        "nowait_overhead_pct",
        "<= 5",
        "miss detection on vs off, hot reads, %",
    ),
    g(
        "disk_peak_ratio",
        "<= 1.2",
        "peak 100 ms device read rate / 20 MB/s limit, 64 cold streams",
    ),
];

const WRITE: &[KeyGoal] = &[
    g(
        "write_disk_peak_ratio",
        "<= 1.2",
        "peak 100 ms device write rate / 32 MiB/s, paced, worst run",
    ),
    g(
        "write_disk_rate_error_pct",
        "<= 1",
        "device bytes against limit x time, %, median round, worse of 1 and 8 writers",
    ),
    g(
        "write_throughput_ratio",
        ">= 0.98",
        "writers' achieved rate / limit, median round, worse of 1 and 8",
    ),
    g(
        "write_dirty_mb_max",
        "<= 48",
        "MiB dirty + writeback of the run's files, every run (1.5 s of the limit)",
    ),
    g(
        "write_cpu_ratio",
        "<= 1.2",
        "CPU paced / unpaced of the same round, median round",
    ),
    g(
        "write_pacing_cpu_vs_fio",
        "<= 1.2",
        "pacing's CPU per piece, ours / fio's, median round (judged in the quiet state only)",
    ),
    g(
        "write_pacing_cpu_vs_fio_shared",
        "<= 1.2",
        "as write_pacing_cpu_vs_fio for SharedEngine (quiet state only)",
    ),
    g(
        "write_disk_peak_ratio_shared",
        "<= 1.2",
        "peak 100 ms device write rate / 32 MiB/s, SharedEngine, worst run",
    ),
    g(
        "write_throughput_ratio_shared",
        ">= 0.98",
        "SharedEngine writer's achieved rate / limit, median round",
    ),
    g(
        "write_stall_peak_ratio",
        "<= 1.2",
        "peak device write rate / limit under a 3 s filesystem freeze",
    ),
];

const E2E: &[KeyGoal] = &[
    g(
        "e2e_rate_error_pct",
        "<= 1",
        "sustained against configured bytes/s, %",
    ),
    g(
        "e2e_jain_mmf",
        ">= 0.95",
        "Jain's index of the default mix, max-min fair",
    ),
    g(
        "e2e_failing_threads",
        "<= 0",
        "threads failing the kernel verdict",
    ),
    g(
        "e2e_slots_delayed",
        "<= 1 x e2e_slots_delayed_noparking",
        "slots delayed with lease parking, against without (the goal: fewer)",
    ),
];

/// Issue 28's goals, each its own row (a key with several goals has several
/// rows). No regression on (a), (b) in both cgroups and (c); near the best
/// static budget of the sweep on (a) and (c); near the floor on (a) and on
/// (b) in its own cgroup, where the floor is the short queries alone (no
/// scan) and one plain CPU-bound thread beside the same hog. On (b) in the
/// hog's cgroup, work is a documented trade-off: reported, not judged.
const ADAPTIVE: &[KeyGoal] = &[
    g(
        "adapt_short_p99_ms_cpu",
        "<= 1.1 x static_short_p99_ms_cpu",
        "(a) CPU-bound: short queries' p99, adaptive against static (no regression)",
    ),
    g(
        "adapt_short_p99_ms_cpu",
        "<= 1.2 x best_static_short_p99_ms_cpu",
        "(a) short queries' p99 against the best static budget of the sweep",
    ),
    g(
        "adapt_short_p99_ms_cpu",
        "<= 0.5 x static_short_p99_ms_cpu",
        "(a) short queries' p99 against static (near the floor)",
    ),
    g(
        "adapt_work_per_s_cpu",
        ">= 0.95 x static_work_per_s_cpu",
        "(a) scan work per s, adaptive against static (no regression)",
    ),
    g(
        "adapt_work_per_s_cpu",
        ">= 0.95 x best_static_work_per_s_cpu",
        "(a) scan work per s against the best static budget of the sweep",
    ),
    g(
        "adapt_short_p99_ms_hog",
        "<= 1.1 x static_short_p99_ms_hog",
        "(b) a CPU hog in the workload's cgroup: short queries' p99, adaptive against static (no regression; work is reported, not judged)",
    ),
    g(
        "adapt_short_p99_ms_hog_own_cgroup",
        "<= 1.1 x static_short_p99_ms_hog_own_cgroup",
        "(b) the hog in a sibling cgroup: short queries' p99, adaptive against static (no regression)",
    ),
    g(
        "adapt_short_p99_ms_hog_own_cgroup",
        "<= 1.5 x floor_short_p99_ms_hog_own_cgroup",
        "(b) own cgroup: short queries' p99 against the short queries alone beside the same hog (near the floor)",
    ),
    g(
        "adapt_work_per_s_hog_own_cgroup",
        ">= 0.95 x static_work_per_s_hog_own_cgroup",
        "(b) own cgroup: work per s, adaptive against static (no regression)",
    ),
    g(
        "adapt_runq_share_pct_hog_own_cgroup",
        "<= floor_runq_share_pct_hog_own_cgroup + 10",
        "(b) own cgroup: run-queue share of running leases, % (near the floor: one plain thread beside the same hog)",
    ),
    g(
        "adapt_short_p99_ms_io",
        "<= 1.1 x static_short_p99_ms_io",
        "(c) IO-bound `slotring run`: short queries' p99, adaptive against static (no regression)",
    ),
    g(
        "adapt_short_p99_ms_io",
        "<= 1.2 x best_static_short_p99_ms_io",
        "(c) short queries' p99 against the best static budget of the sweep",
    ),
    g(
        "adapt_work_per_s_io",
        ">= 0.95 x static_work_per_s_io",
        "(c) scan MiB/s, adaptive against static (no regression)",
    ),
    g(
        "adapt_work_per_s_io",
        ">= 0.95 x best_static_work_per_s_io",
        "(c) scan MiB/s against the best static budget of the sweep",
    ),
    g(
        "adapt_settle_s",
        "<= 3",
        "seconds until the adaptive budget settles after the hog starts or stops, the worst run",
    ),
    context(
        "adapt_runq_share_pct_cpu",
        "floor_runq_share_pct_cpu",
        "(a) run-queue share of running leases, adaptive, % (context; issue 28 sets no goal on it)",
    ),
];

/// The goals of `suite` (none: an empty list).
pub(crate) fn of(suite: &str) -> &'static [KeyGoal] {
    GOALS
        .iter()
        .find(|(s, _)| *s == suite)
        .map_or(&[], |(_, g)| g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_goal::Goal;

    #[test]
    fn every_goal_parses_and_every_suite_and_key_is_known_once() {
        for (i, (suite, keys)) in GOALS.iter().enumerate() {
            assert!(
                crate::suites::bench_suite(suite).is_some(),
                "no suite {suite}"
            );
            assert!(
                GOALS[i + 1..].iter().all(|(s, _)| s != suite),
                "{suite} twice"
            );
            for (j, k) in keys.iter().enumerate() {
                if let Some(e) = k.goal {
                    Goal::parse(e).unwrap_or_else(|e| panic!("{suite}: {e}"));
                }
                assert!(!k.meaning.is_empty(), "{suite}.{}: no meaning", k.key);
                assert!(
                    keys[j + 1..]
                        .iter()
                        .all(|o| o.key != k.key || o.goal != k.goal),
                    "{suite}.{} with the same goal twice",
                    k.key
                );
            }
        }
        assert!(of("nope").is_empty() && !of("verdict").is_empty());
    }
}
