//! What the adaptive loop's history says: the per-window trace, the mean
//! budget, the time at each level, the settling time.

use super::*;

pub(crate) fn trace(h: &[BudgetPoint]) -> String {
    h.iter()
        .map(|p| format!("{}/{:.0}", p.budget, p.runq_share_pct))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn budget_mean(h: &[BudgetPoint], from: f64, to: f64) -> f64 {
    let v: Vec<f64> = h
        .iter()
        .filter(|p| p.t_s > from && p.t_s <= to)
        .map(|p| p.budget as f64)
        .collect();
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The share of windows in `(from, to]` at each budget: "1: 15%, 2: 85%".
pub(crate) fn budget_hist(h: &[BudgetPoint], from: f64, to: f64) -> String {
    let mut n = std::collections::BTreeMap::<u64, usize>::new();
    let pts = h.iter().filter(|p| p.t_s > from && p.t_s <= to);
    let total = pts
        .clone()
        .inspect(|p| *n.entry(p.budget).or_default() += 1)
        .count();
    n.iter()
        .map(|(b, k)| format!("{b}: {:.0}%", *k as f64 * 100.0 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Seconds after `from` until the budget reaches the level it ends the
/// phase at (the median over the last second before `to`) and from then on
/// stays within one slot of it.
pub(crate) fn settle(h: &[BudgetPoint], from: f64, to: f64) -> f64 {
    let mut tail: Vec<f64> = h
        .iter()
        .filter(|p| p.t_s > to - 1.0 && p.t_s <= to)
        .map(|p| p.budget as f64)
        .collect();
    let level = median(&mut tail).round();
    let pts: Vec<&BudgetPoint> = h.iter().filter(|p| p.t_s > from && p.t_s <= to).collect();
    let after_out = pts
        .iter()
        .rposition(|p| (p.budget as f64 - level).abs() > 1.0)
        .map_or(0, |i| i + 1);
    pts[after_out..]
        .iter()
        .find(|p| p.budget as f64 == level)
        .map_or(to - from, |p| p.t_s - from)
}
