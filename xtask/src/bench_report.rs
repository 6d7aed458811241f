//! `cargo xtask bench-report [SUITE ...] [--take] [--check]`: the checked-in
//! benchmark reports, rendered from their data.
//!
//! A suite's data is `docs/bench/data/<suite>.json` (the flat object `cargo
//! xtask bench <suite>` writes to `target/bench/`) and `<suite>.meta.json`
//! beside it (the run's machine, kernel, commit, date and load). The data
//! is only ever taken from `target/bench/` on request: `--take` copies the
//! named suites' two files (none named: every suite `target/bench/` holds)
//! into `docs/bench/data/` before rendering. From the data it renders
//! `docs/bench/<suite>.md` (the run, then every key with its goal from
//! `bench_goals.rs`, baseline and verdict) and `docs/bench/README.md` (the
//! index). `--check` renders in memory and fails, naming each file, when a
//! checked-in report differs from what its data renders to or has no data:
//! the reports cannot drift from their data.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use slotring_benchkit::meta::RunMeta;

use crate::bench_goal::{Goal, Values, Verdict};
use crate::bench_goals::{self, KeyGoal};

/// Where the reports go, under the workspace root.
const REPORTS: &str = "docs/bench";
/// Where their data goes, under the workspace root.
const DATA: &str = "docs/bench/data";

/// One suite's data as read from its two files.
#[derive(Debug)]
pub(crate) struct SuiteData {
    /// The suite's name.
    pub(crate) suite: String,
    /// Its keys' values.
    pub(crate) values: Values,
    /// The run's metadata; `None`: no `.meta.json`.
    pub(crate) meta: Option<RunMeta>,
}

/// A rendered suite report and its count of goals.
#[derive(Debug)]
pub(crate) struct Rendered {
    /// The Markdown.
    pub(crate) text: String,
    /// Goals met.
    pub(crate) met: usize,
    /// Goals judged (met or missed).
    pub(crate) judged: usize,
    /// Goals in the table.
    pub(crate) goals: usize,
}

/// `v` for a table: an integer as an integer, a value of 100 or more with
/// no decimals, else three significant digits.
pub(crate) fn format_number(v: f64) -> String {
    if !v.is_finite() {
        return "null".to_owned();
    }
    let a = v.abs();
    if v == v.trunc() && a < 1e15 {
        return format!("{}", v as i64);
    }
    if a >= 100.0 {
        return format!("{v:.0}");
    }
    if a < 1e-3 {
        return format!("{v:.2e}");
    }
    let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
    format!("{v:.decimals$}")
}

/// Read `<dir>/<suite>.json` and its `.meta.json`.
pub(crate) fn read_suite(dir: &Path, suite: &str) -> Result<SuiteData> {
    let path = dir.join(format!("{suite}.json"));
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let obj: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON object", path.display()))?;
    let mut values = Values::new();
    for (k, v) in obj {
        let n = match v {
            serde_json::Value::Null => None,
            serde_json::Value::Number(n) => n.as_f64(),
            other => bail!("{}: `{k}` is {other}, not a number", path.display()),
        };
        values.insert(k, n);
    }
    let meta_path = dir.join(format!("{suite}.meta.json"));
    let meta = match std::fs::read_to_string(&meta_path) {
        Ok(t) => Some(RunMeta::from_json(
            &serde_json::from_str(&t).with_context(|| format!("{}", meta_path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("{}", meta_path.display())),
    };
    Ok(SuiteData {
        suite: suite.to_owned(),
        values,
        meta,
    })
}

/// The suites `dir` holds data of (`<suite>.json`, not `.meta.json`), sorted.
pub(crate) fn suites_in(dir: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e).with_context(|| format!("{}", dir.display())),
    };
    let mut out = vec![];
    for e in entries {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Some(s) = name.strip_suffix(".json")
            && !s.ends_with(".meta")
        {
            out.push(s.to_owned());
        }
    }
    out.sort();
    Ok(out)
}

fn value_cell(values: &Values, key: &str) -> String {
    match values.get(key) {
        Some(Some(v)) => format_number(*v),
        Some(None) => "null".to_owned(),
        None => "not measured".to_owned(),
    }
}

/// One row of the table, and its verdict when it has a goal.
fn row(k: &KeyGoal, values: &Values) -> Result<(String, Option<Verdict>)> {
    row_of(k.key, k.goal, k.baseline, k.meaning, values)
}

/// The row of `key`: [`row`] of a key `bench_goals.rs` may not list.
fn row_of(
    key: &str,
    goal: Option<&str>,
    baseline: Option<&str>,
    meaning: &str,
    values: &Values,
) -> Result<(String, Option<Verdict>)> {
    let goal = goal.map(Goal::parse).transpose()?;
    let verdict = goal.as_ref().map(|g| g.judge(key, values));
    let baseline = baseline
        .or_else(|| goal.as_ref().and_then(Goal::other_key))
        .map_or(String::new(), |b| {
            format!("`{b}` = {}", value_cell(values, b))
        });
    let text = format!(
        "| `{key}` | {} | {} | {baseline} | {} | {meaning} |",
        value_cell(values, key),
        goal.as_ref().map_or(String::new(), ToString::to_string),
        verdict.as_ref().map_or("", Verdict::mark),
    );
    Ok((text, verdict))
}

fn meta_lines(meta: Option<&RunMeta>) -> String {
    let Some(m) = meta else {
        return "The run's metadata (`.meta.json`) was not recorded.\n".to_owned();
    };
    let num = |v: Option<f64>| v.map_or("unknown".to_owned(), format_number);
    format!(
        "- machine: {}\n- kernel: {}\n- date: {}\n- commit: `{}`\n- load at the start: {}\n- uptime at the start: {} s\n",
        m.machine,
        m.kernel,
        m.date,
        m.commit,
        num(m.load),
        num(m.uptime_s)
    )
}

/// `docs/bench/<suite>.md` of `data`, judged by `goals`.
pub(crate) fn render_suite(data: &SuiteData, goals: &[KeyGoal]) -> Result<Rendered> {
    let s = &data.suite;
    let mut rows = vec![];
    let (mut met, mut judged) = (0, 0);
    for k in goals {
        let (text, verdict) = row(k, &data.values).with_context(|| format!("suite {s}"))?;
        match verdict {
            Some(Verdict::Met) => (met, judged) = (met + 1, judged + 1),
            Some(Verdict::Missed) => judged += 1,
            _ => {}
        }
        rows.push(text);
    }
    for key in data.values.keys() {
        if goals.iter().all(|g| g.key != key) {
            rows.push(row_of(key, None, None, "", &data.values)?.0);
        }
    }
    let n_goals = goals.iter().filter(|g| g.goal.is_some()).count();
    let text = format!(
        "# The `{s}` benchmark\n\n\
         Generated by `cargo xtask bench-report` from `data/{s}.json`; do not edit.\n\n\
         {}\n\
         Goals met: {met} of {judged} judged ({} of {n_goals} not judged: a value missing or null).\n\n\
         | key | value | goal | baseline | verdict | meaning |\n\
         |---|---|---|---|---|---|\n\
         {}\n",
        meta_lines(data.meta.as_ref()),
        n_goals - judged,
        rows.join("\n")
    );
    Ok(Rendered {
        text,
        met,
        judged,
        goals: n_goals,
    })
}

/// `docs/bench/README.md`: one line per suite.
pub(crate) fn render_index(suites: &[(&SuiteData, &Rendered)]) -> String {
    let mut out = String::from(
        "# Benchmark reports\n\n\
         Generated by `cargo xtask bench-report` from `data/`; do not edit.\n\
         `cargo xtask bench <suite>` measures a suite into `target/bench/`;\n\
         `cargo xtask bench-report --take <suite>` copies its data here and renders its report.\n\n\
         | suite | date | commit | goals met |\n|---|---|---|---|\n",
    );
    for (d, r) in suites {
        let (date, commit) = d.meta.as_ref().map_or(("unknown", "unknown"), |m| {
            (m.date.as_str(), m.commit.as_str())
        });
        out += &format!(
            "| [{s}]({s}.md) | {date} | `{commit}` | {} / {} ({} judged) |\n",
            r.met,
            r.goals,
            r.judged,
            s = d.suite
        );
    }
    out
}

/// Every report the data under `root` renders to: `(path, text)`.
pub(crate) fn render_all(root: &Path) -> Result<BTreeMap<PathBuf, String>> {
    let data_dir = root.join(DATA);
    let mut out = BTreeMap::new();
    let mut read = vec![];
    for s in suites_in(&data_dir)? {
        if crate::suites::bench_suite(&s).is_none() {
            bail!(
                "{}/{s}.json: no suite `{s}` in suites.rs",
                data_dir.display()
            );
        }
        let d = read_suite(&data_dir, &s)?;
        let r = render_suite(&d, bench_goals::of(&s))?;
        read.push((d, r));
    }
    if read.is_empty() {
        return Ok(out);
    }
    let pairs: Vec<_> = read.iter().map(|(d, r)| (d, r)).collect();
    out.insert(root.join(REPORTS).join("README.md"), render_index(&pairs));
    for (d, r) in read {
        out.insert(root.join(REPORTS).join(format!("{}.md", d.suite)), r.text);
    }
    Ok(out)
}

/// The checked-in reports that differ from what their data renders to, or
/// have no data: their paths.
pub(crate) fn stale(root: &Path) -> Result<Vec<PathBuf>> {
    let want = render_all(root)?;
    let mut bad = vec![];
    for (path, text) in &want {
        if std::fs::read_to_string(path).ok().as_deref() != Some(text.as_str()) {
            bad.push(path.clone());
        }
    }
    if let Ok(entries) = std::fs::read_dir(root.join(REPORTS)) {
        for e in entries {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "md") && !want.contains_key(&p) {
                bad.push(p);
            }
        }
    }
    bad.sort();
    Ok(bad)
}

/// Copy `target/bench/<suite>{,.meta}.json` of `suites` (none: every suite
/// there) into `docs/bench/data/`.
fn take(root: &Path, suites: &[String]) -> Result<()> {
    let from = root.join("target/bench");
    let names = if suites.is_empty() {
        suites_in(&from)?
    } else {
        suites.to_vec()
    };
    if names.is_empty() {
        bail!("{} holds no suite's data", from.display());
    }
    let to = root.join(DATA);
    std::fs::create_dir_all(&to).with_context(|| format!("{}", to.display()))?;
    for s in &names {
        if crate::suites::bench_suite(s).is_none() {
            bail!("unknown bench suite `{s}`");
        }
        let json = format!("{s}.json");
        std::fs::copy(from.join(&json), to.join(&json))
            .with_context(|| format!("copy {}", from.join(&json).display()))?;
        let meta = format!("{s}.meta.json");
        match std::fs::copy(from.join(&meta), to.join(&meta)) {
            Ok(_) => {}
            // An older run wrote no metadata: the report says so.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let _ = std::fs::remove_file(to.join(&meta));
            }
            Err(e) => return Err(e).with_context(|| format!("copy {meta}")),
        }
        eprintln!("took {}", from.join(&json).display());
    }
    Ok(())
}

/// The command: `--take` first, then render (or, with `check`, compare).
pub(crate) fn run(root: &Path, suites: &[String], take_first: bool, check: bool) -> Result<()> {
    if check {
        if take_first || !suites.is_empty() {
            bail!("`bench-report --check` checks every report and takes nothing");
        }
        let bad = stale(root)?;
        if bad.is_empty() {
            eprintln!("bench-report: the reports in {REPORTS}/ match their data");
            return Ok(());
        }
        for p in &bad {
            let rel = p.strip_prefix(root).unwrap_or(p);
            eprintln!("{}: stale (run `cargo xtask bench-report`)", rel.display());
        }
        bail!("{} benchmark report(s) differ from their data", bad.len());
    }
    if take_first {
        take(root, suites)?;
    }
    let all = render_all(root)?;
    let wanted = |p: &Path| {
        suites.is_empty()
            || p.file_name().is_some_and(|n| n == "README.md")
            || suites.iter().any(|s| p.ends_with(format!("{s}.md")))
    };
    for s in suites {
        if !all.keys().any(|p| p.ends_with(format!("{s}.md"))) {
            bail!("no data for suite `{s}` in {DATA}/ (take it with --take)");
        }
    }
    for (path, text) in all.iter().filter(|(p, _)| wanted(p)) {
        std::fs::write(path, text).with_context(|| format!("{}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
