//! The one place of the workload that lists individual fields of the
//! library's counter structs (`UringCounters`, `SlotsCounters`,
//! `ThrottleCounters`): copying the counters the report shows into it.

use slotring::slots::{AdaptiveCounters, SlotsCounters};
use slotring::throttle::Throttler;
use slotring::uring::UringCounters;

use super::engines::Choice;
use crate::config::RunConfig;
use crate::report::{BudgetReport, IoReport, SlotsReport, ThrottlerReport};

/// The engine section of the report.
pub(super) fn io_report(uring: &UringCounters, choice: Choice, failed: FailedReads) -> IoReport {
    IoReport {
        engine: choice.engine,
        fallback_reason: choice.fallback_reason,
        reads: uring.reads,
        read_bytes: uring.read_bytes,
        write_bytes: uring.write_bytes,
        page_cache_hits: uring.page_cache_hits,
        page_cache_bytes: uring.page_cache_bytes,
        nowait_misses: uring.nowait_misses,
        cachestat_checks: uring.cachestat_checks,
        waits: uring.waits_submitted,
        wait_s: uring.wait_us as f64 / 1e6,
        read_errors: failed.errors,
        short_reads: failed.short,
        first_read_error: failed.first,
    }
}

/// The workload's own read failure counts (the engine's counters have none).
pub(super) struct FailedReads {
    /// Reads that returned an error.
    pub errors: u64,
    /// Reads that came back short.
    pub short: u64,
    /// The first error.
    pub first: Option<String>,
}

/// The CPU slot section of the report.
pub(super) fn slots_report(slots: &SlotsCounters, cfg: &RunConfig) -> SlotsReport {
    SlotsReport {
        max_concurrency: slots.max_concurrency,
        scheduler: cfg.concurrent_threads_scheduler,
        lease_parking: cfg.lease_parking,
        slots_granted: slots.slots_granted,
        slots_delayed: slots.slots_delayed,
        slots_acquired: slots.slots_acquired,
        slots_acquired_non_competing: slots.slots_acquired_non_competing,
        queries_delayed: slots.queries_delayed,
        slot_wait_s: slots.wait_us as f64 / 1e6,
        parks: slots.parks,
        unparks: slots.unparks,
        unpark_borrows: slots.unpark_borrows,
        borrowed_at_end: slots.borrowed,
        in_use_at_end: slots.cur_concurrency,
    }
}

/// The debt of `t`'s bucket now, in tokens (bytes).
pub(super) fn debt_now(t: &Throttler) -> u64 {
    let tokens = t.tokens_nano();
    if tokens >= 0 {
        0
    } else {
        u64::try_from((-tokens) / slotring::throttle::NANO_PER_TOKEN).unwrap_or(u64::MAX)
    }
}

/// The budget section of the report: the effective budget sampled over the
/// run (`series`), the running leases' run-queue and on-CPU ns (`runq`,
/// with probes) and the adaptive loop's last state (`status`, when one ran).
pub(super) fn budget_report(
    cfg: &RunConfig,
    series: &[u64],
    runq: Option<(u64, u64)>,
    status: Option<AdaptiveCounters>,
    slots: &SlotsCounters,
) -> BudgetReport {
    let mode = match (&status, cfg.adaptive_budget) {
        (Some(s), _) if s.probe_losses > 0 => "adaptive until the probes went away, then static",
        (Some(s), _) if s.adaptive == 1 => "adaptive",
        (_, true) => "static (no kernel probes)",
        (_, false) => "static",
    };
    let n = series.len().max(1) as f64;
    let (runq_ns, on_cpu_ns) = runq.unwrap_or_default();
    BudgetReport {
        adaptive_budget: cfg.adaptive_budget,
        mode: mode.into(),
        ceiling: slots.max_concurrency,
        // An unlimited budget (u64::MAX) has no mean.
        budget_mean: if series.contains(&u64::MAX) {
            f64::NAN
        } else {
            series.iter().map(|&b| b as f64).sum::<f64>() / n
        },
        budget_min: series
            .iter()
            .copied()
            .min()
            .unwrap_or(slots.budget_effective),
        budget_max: series
            .iter()
            .copied()
            .max()
            .unwrap_or(slots.budget_effective),
        runq_share_pct: if runq_ns + on_cpu_ns == 0 {
            f64::NAN
        } else {
            runq_ns as f64 * 100.0 / (runq_ns + on_cpu_ns) as f64
        },
        yields: slots.yields,
        windows: status.map_or(0, |s| s.windows),
        probe_losses: status.map_or(0, |s| s.probe_losses),
    }
}

/// One throttler's section of the report: achieved against configured
/// over `elapsed` seconds.
/// `debt_at_end` is the bucket's debt when the phase ended (tokens booked
/// by IO admitted ahead of its time, which the run did not wait out).
pub(super) fn throttle_report(t: &Throttler, elapsed: f64, debt_at_end: u64) -> ThrottlerReport {
    let c = t.counters();
    let burst = if c.max_speed == 0 {
        0
    } else {
        (t.burst().as_secs_f64() * c.max_speed as f64) as u64
    };
    let achieved = c.amount as f64 / elapsed.max(1e-9);
    let sustained =
        c.amount.saturating_sub(burst).saturating_sub(debt_at_end) as f64 / elapsed.max(1e-9);
    let saturated = c.waits > 0;
    ThrottlerReport {
        name: t.name().to_owned(),
        configured_bytes_per_s: c.max_speed,
        burst_bytes: burst,
        charged_bytes: c.amount,
        page_cache_bytes_not_charged: c.page_cache_amount,
        achieved_bytes_per_s: achieved,
        sustained_bytes_per_s: sustained,
        debt_at_end_bytes: debt_at_end,
        rate_error_pct: (c.max_speed > 0 && saturated)
            .then(|| (sustained - c.max_speed as f64).abs() / c.max_speed as f64 * 100.0),
        saturated,
        wait_s: c.wait_us as f64 / 1e6,
        waits: c.waits,
    }
}
