//! The sweep of static budgets 1 … 2 × cores and the one a person would
//! pick after measuring it (`best_static_<key>_<w>`): the lowest short
//! query p99 among the budgets that keep at least [`BEST_WORK_FRACTION`]
//! of the sweep's best work.

use super::*;

/// The work a chosen static budget may give up against the sweep's best.
pub(crate) const BEST_WORK_FRACTION: f64 = 0.95;

/// One static budget's measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StaticPoint {
    pub(crate) budget: u64,
    pub(crate) short_p99_ms: f64,
    pub(crate) work_per_s: f64,
    pub(crate) runq_share_pct: f64,
}

impl StaticPoint {
    /// The point of a (merged) phase of (a)/(b) run at `budget`.
    pub(crate) fn of(budget: u64, p: &mut Phase) -> Self {
        Self {
            budget,
            short_p99_ms: p.p99(),
            work_per_s: p.work_per_s(),
            runq_share_pct: p.share_pct(),
        }
    }
}

/// The point a person would pick (see the module docs); `None` for an
/// empty sweep. A NaN p99 (no short query finished) is never picked over
/// a number.
pub(crate) fn best_static(points: &[StaticPoint]) -> Option<StaticPoint> {
    let top = points.iter().map(|p| p.work_per_s).fold(0.0, f64::max);
    points
        .iter()
        .filter(|p| p.work_per_s >= BEST_WORK_FRACTION * top)
        .min_by(|a, b| {
            let key = |p: &StaticPoint| {
                if p.short_p99_ms.is_nan() {
                    f64::INFINITY
                } else {
                    p.short_p99_ms
                }
            };
            key(a).total_cmp(&key(b))
        })
        .copied()
}

/// The rule on a sweep it must get right, checked before every run (a
/// bench has no test harness): the lowest p99 below 95% of the best work
/// is rejected, a NaN p99 is never picked, an empty sweep has no best.
pub(crate) fn check_best_static_rule() {
    let p = |budget, short_p99_ms, work_per_s| StaticPoint {
        budget,
        short_p99_ms,
        work_per_s,
        runq_share_pct: 0.0,
    };
    let sweep = [
        p(1, 1.0, 90.0),
        p(2, 2.0, 99.0),
        p(3, f64::NAN, 100.0),
        p(4, 3.0, 100.0),
    ];
    assert_eq!(best_static(&sweep).map(|b| b.budget), Some(2));
    assert_eq!(best_static(&sweep[2..3]).map(|b| b.budget), Some(3));
    assert_eq!(best_static(&[]), None);
}

/// Write `best_static_{short_p99_ms,work_per_s,runq_share_pct,budget}_<w>`;
/// the note lists every budget of the sweep.
pub(crate) fn put_best_static(report: &mut Report, w: &str, points: &[StaticPoint], what: &str) {
    let Some(best) = best_static(points) else {
        return;
    };
    let all = points
        .iter()
        .map(|p| {
            format!(
                "{}: p99 {:.2} ms, {:.0}/s, run queue {:.0}%",
                p.budget, p.short_p99_ms, p.work_per_s, p.runq_share_pct
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let note = format!(
        "{what} the static budget with the lowest short p99 among those within {:.0}% of the sweep's best work: {}; sweep {all}",
        (1.0 - BEST_WORK_FRACTION) * 100.0,
        best.budget
    );
    report.put(
        &format!("best_static_short_p99_ms_{w}"),
        best.short_p99_ms,
        &note,
    );
    report.put(
        &format!("best_static_work_per_s_{w}"),
        best.work_per_s,
        &format!("{what} at the best static budget"),
    );
    report.put(
        &format!("best_static_runq_share_pct_{w}"),
        best.runq_share_pct,
        &format!("{what} at the best static budget"),
    );
    report.put(
        &format!("best_static_budget_{w}"),
        best.budget as f64,
        &format!("{what} the best static budget itself"),
    );
}
