//! The one place of the workload that lists individual fields of the
//! library's counter structs (`UringCounters`, `SlotsCounters`,
//! `ThrottleCounters`): copying the counters the report shows into it.

use slotring::slots::SlotsCounters;
use slotring::throttle::Throttler;
use slotring::uring::UringCounters;

use super::engines::Choice;
use crate::config::RunConfig;
use crate::report::{IoReport, SlotsReport, ThrottlerReport};

/// The engine section of the report.
pub(super) fn io_report(uring: &UringCounters, choice: Choice) -> IoReport {
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
    }
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

/// One throttler's section of the report: achieved against configured
/// over `elapsed` seconds.
pub(super) fn throttle_report(t: &Throttler, elapsed: f64) -> ThrottlerReport {
    let c = t.counters();
    let burst = if c.max_speed == 0 {
        0
    } else {
        (t.burst().as_secs_f64() * c.max_speed as f64) as u64
    };
    let achieved = c.amount as f64 / elapsed.max(1e-9);
    let sustained = c.amount.saturating_sub(burst) as f64 / elapsed.max(1e-9);
    let saturated = c.waits > 0;
    ThrottlerReport {
        name: t.name().to_owned(),
        configured_bytes_per_s: c.max_speed,
        burst_bytes: burst,
        charged_bytes: c.amount,
        page_cache_bytes_not_charged: c.page_cache_amount,
        achieved_bytes_per_s: achieved,
        sustained_bytes_per_s: sustained,
        rate_error_pct: (c.max_speed > 0 && saturated)
            .then(|| (sustained - c.max_speed as f64).abs() / c.max_speed as f64 * 100.0),
        saturated,
        wait_s: c.wait_us as f64 / 1e6,
        waits: c.waits,
    }
}
