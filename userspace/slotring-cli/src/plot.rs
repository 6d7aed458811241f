//! `--plot FILE.svg`: achieved disk rate and slots per query over time, as
//! hand-written SVG (no drawing dependency). The rate panel has each scan's
//! read rate and the slots panel each scan's slots, or with `--workloads`
//! each workload's read rate and CPU slots (the first [`PLOTTED_WORKLOADS`]
//! of the tree's order, one colour per workload in both).

use std::fmt::Write as _;

use crate::report::Report;

const W: f64 = 900.0;
const PANEL_H: f64 = 260.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 160.0;
const TOP: f64 = 40.0;
const GAP: f64 = 70.0;
const COLORS: &[&str] = &[
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// The most workloads whose read rate, and whose CPU slots, the plot draws
/// (a line and a legend row each: a panel holds about that many).
pub const PLOTTED_WORKLOADS: usize = 10;

struct Panel {
    y0: f64,
    t_max: f64,
    v_max: f64,
}

impl Panel {
    fn x(&self, t: f64) -> f64 {
        LEFT + (t / self.t_max).clamp(0.0, 1.0) * (W - LEFT - RIGHT)
    }
    fn y(&self, v: f64) -> f64 {
        self.y0 + PANEL_H - (v / self.v_max).clamp(0.0, 1.05) * PANEL_H
    }
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * p {
            return m * p;
        }
    }
    10.0 * p
}

fn axes(svg: &mut String, p: &Panel, title: &str, unit: &str) {
    let x1 = W - RIGHT;
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{}" font-size="15" font-weight="bold">{title}</text>"#,
        p.y0 - 12.0
    );
    for i in 0..=4 {
        let v = p.v_max * i as f64 / 4.0;
        let y = p.y(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            LEFT - 6.0,
            y + 4.0,
            fmt_num(v)
        );
    }
    for i in 0..=5 {
        let t = p.t_max * i as f64 / 5.0;
        let x = p.x(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{t:.1}s</text>"##,
            p.y0,
            p.y0 + PANEL_H,
            p.y0 + PANEL_H + 16.0
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{}" width="{}" height="{PANEL_H}" fill="none" stroke="#333"/><text x="14" y="{:.1}" font-size="12" transform="rotate(-90 14 {:.1})" text-anchor="middle">{unit}</text>"##,
        p.y0,
        W - LEFT - RIGHT,
        p.y0 + PANEL_H / 2.0,
        p.y0 + PANEL_H / 2.0
    );
}

fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn polyline(svg: &mut String, p: &Panel, ts: &[f64], vs: &[f64], color: &str, dash: bool) {
    let pts: Vec<String> = ts
        .iter()
        .zip(vs)
        .map(|(t, v)| format!("{:.1},{:.1}", p.x(*t), p.y(*v)))
        .collect();
    let _ = writeln!(
        svg,
        r#"<polyline fill="none" stroke="{color}" stroke-width="1.8"{} points="{}"/>"#,
        if dash {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        },
        pts.join(" ")
    );
}

fn legend(svg: &mut String, p: &Panel, i: usize, color: &str, label: &str) {
    let x = W - RIGHT + 12.0;
    let y = p.y0 + 14.0 + i as f64 * 18.0;
    let _ = writeln!(
        svg,
        r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}" font-size="12">{label}</text>"#,
        x + 18.0,
        x + 24.0,
        y + 4.0
    );
}

/// Mean over the trailing second (rates sampled every 100 ms are noisy).
/// One line per scan or workload, labelled from legend row `first_row` on;
/// the `i`-th has the same colour in both panels.
fn lines(
    svg: &mut String,
    p: &Panel,
    t: &[f64],
    per: &[(String, Vec<f64>)],
    dash: bool,
    first_row: usize,
) {
    for (i, (label, v)) in per.iter().enumerate() {
        let color = COLORS[(i + 4) % COLORS.len()];
        polyline(svg, p, t, v, color, dash);
        legend(svg, p, first_row + i, color, label);
    }
}

fn smooth(t: &[f64], v: &[f64]) -> Vec<f64> {
    (0..v.len())
        .map(|i| {
            let from = (0..=i).find(|&j| t[i] - t[j] < 1.0).unwrap_or(i);
            let w = &v[from..=i];
            w.iter().sum::<f64>() / w.len() as f64
        })
        .collect()
}

/// Render the report's timeline as an SVG document (rates as trailing
/// one-second means).
pub fn svg(report: &Report) -> String {
    let tl = &report.timeline;
    let t_max = tl
        .t_s
        .last()
        .copied()
        .unwrap_or(1.0)
        .max(report.elapsed_s)
        .max(0.1);
    let mib = |v: &f64| v / (1 << 20) as f64;
    let disk = smooth(
        &tl.t_s,
        &tl.disk_bytes_per_s.iter().map(mib).collect::<Vec<_>>(),
    );
    let cache = smooth(
        &tl.t_s,
        &tl.page_cache_bytes_per_s
            .iter()
            .map(mib)
            .collect::<Vec<_>>(),
    );
    // The reads' limit: the tree's root cap, else `local_read`'s.
    let configured = match &report.workloads {
        Some(w) => w.root_bytes_per_s.unwrap_or(0),
        None => report
            .throttlers
            .iter()
            .find(|t| t.name == "local_read")
            .map_or(0, |t| t.configured_bytes_per_s),
    } as f64
        / (1 << 20) as f64;
    // The first second holds the initial burst (the bucket starts full);
    // scale to the rest so the configured line stays readable.
    let rate_max = disk
        .iter()
        .chain(&cache)
        .zip(tl.t_s.iter().chain(&tl.t_s))
        .filter(|(_, t)| **t > 1.0)
        .map(|(v, _)| *v)
        .fold(configured * 1.5, f64::max);
    let slot_max = tl
        .scan_slots
        .iter()
        .flatten()
        .chain(&tl.short_slots)
        .chain(tl.workload_slots.iter().take(PLOTTED_WORKLOADS).flatten())
        .chain(&tl.slots_in_use)
        .chain(tl.budget.iter().filter(|&&b| b != u64::MAX))
        .copied()
        .max()
        .unwrap_or(1) as f64;
    let h = TOP + 2.0 * PANEL_H + GAP + 40.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>"#
    );
    let rate = Panel {
        y0: TOP,
        t_max,
        v_max: nice_max(rate_max * 1.1),
    };
    axes(
        &mut svg,
        &rate,
        if report.workloads.is_some() {
            "Achieved read rate vs the root's cap, and per workload (the disk's workload tree, 1 s mean)"
        } else {
            "Achieved read rate vs configured, and per scan (block-device throttler, 1 s mean)"
        },
        "MiB/s",
    );
    polyline(&mut svg, &rate, &tl.t_s, &disk, COLORS[0], false);
    polyline(&mut svg, &rate, &tl.t_s, &cache, COLORS[2], false);
    legend(&mut svg, &rate, 0, COLORS[0], "disk (charged)");
    legend(&mut svg, &rate, 1, COLORS[2], "page cache");
    // Dashed, one colour each: each scan's disk read rate (charged as its
    // tenant, in the scan's colour of the slots panel), or with a tree
    // each workload's (net of refunds).
    let first_row = if configured > 0.0 { 3 } else { 2 };
    let per: Vec<(String, &Vec<f64>)> = if tl.workloads.is_empty() {
        (1..)
            .map(|i| format!("scan {i} read rate"))
            .zip(&tl.scan_disk_bytes_per_s)
            .collect()
    } else {
        tl.workloads
            .iter()
            .map(|name| format!("workload {name}"))
            .zip(&tl.workload_bytes_per_s)
            .take(PLOTTED_WORKLOADS)
            .collect()
    };
    let per: Vec<(String, Vec<f64>)> = per
        .into_iter()
        .map(|(label, s)| {
            (
                label,
                smooth(&tl.t_s, &s.iter().map(mib).collect::<Vec<_>>()),
            )
        })
        .collect();
    lines(&mut svg, &rate, &tl.t_s, &per, true, first_row);

    if configured > 0.0 {
        polyline(
            &mut svg,
            &rate,
            &[0.0, t_max],
            &[configured, configured],
            COLORS[3],
            true,
        );
        legend(&mut svg, &rate, 2, COLORS[3], "configured");
    }
    let slots = Panel {
        y0: TOP + PANEL_H + GAP,
        t_max,
        // A multiple of 4 so the 4 grid steps are whole slots.
        v_max: ((slot_max + 1.0) / 4.0).ceil() * 4.0,
    };
    axes(
        &mut svg,
        &slots,
        &format!(
            "CPU slots held per query ({}, budget {})",
            report.slots.scheduler, report.slots.max_concurrency
        ),
        "slots",
    );
    // One line each: with a tree each workload's slots (the colour of its
    // read rate above), else each scan's.
    let per: Vec<(String, &Vec<u64>)> = if tl.slot_workloads.is_empty() {
        (1..)
            .map(|i| format!("scan {i}"))
            .zip(&tl.scan_slots)
            .collect()
    } else {
        tl.slot_workloads
            .iter()
            .map(|name| format!("workload {name} slots"))
            .zip(&tl.workload_slots)
            .take(PLOTTED_WORKLOADS)
            .collect()
    };
    let per: Vec<(String, Vec<f64>)> = per
        .into_iter()
        .map(|(label, s)| (label, s.iter().map(|&x| x as f64).collect()))
        .collect();
    lines(&mut svg, &slots, &tl.t_s, &per, false, 0);
    let n = per.len();
    let short: Vec<f64> = tl.short_slots.iter().map(|&x| x as f64).collect();
    polyline(&mut svg, &slots, &tl.t_s, &short, COLORS[1], false);
    legend(&mut svg, &slots, n, COLORS[1], "short queries");
    let used: Vec<f64> = tl.slots_in_use.iter().map(|&x| x as f64).collect();
    polyline(&mut svg, &slots, &tl.t_s, &used, "#000", true);
    legend(&mut svg, &slots, n + 1, "#000", "slots in use");
    // An unlimited budget (u64::MAX) has no line.
    if tl.budget.iter().all(|&b| b != u64::MAX) {
        let budget: Vec<f64> = tl.budget.iter().map(|&x| x as f64).collect();
        polyline(&mut svg, &slots, &tl.t_s, &budget, "#d62728", true);
        legend(&mut svg, &slots, n + 2, "#d62728", "effective budget");
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    #[test]
    fn smooth_is_a_trailing_one_second_mean() {
        let t: Vec<f64> = (1..=30).map(|i| i as f64 * 0.1).collect();
        let v: Vec<f64> = (1..=30).map(|i| if i <= 10 { 10.0 } else { 0.0 }).collect();
        let s = super::smooth(&t, &v);
        assert_eq!(s[0], 10.0);
        assert!((s[14] - 5.0).abs() < 1e-9, "{}", s[14]); // 5 of the last 10 samples
        assert_eq!(s[29], 0.0);
    }

    #[test]
    fn nice_max_rounds_up() {
        assert_eq!(super::nice_max(7.3), 10.0);
        assert_eq!(super::nice_max(130.0), 200.0);
        assert_eq!(super::nice_max(0.0), 1.0);
    }
}
