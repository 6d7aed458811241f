//! What a bench run ran on: `target/bench/<suite>.meta.json`, written next
//! to the suite's flat JSON by [`crate::Report`].
//!
//! Every field is best effort: a value that cannot be read is `"unknown"`
//! (or `null` for a number), because a statistic never fails the bench.

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// The machine, kernel, commit and load a suite was measured at.
#[derive(Debug, Clone, PartialEq)]
pub struct RunMeta {
    /// `"<n> vCPU, <m> GiB, <cpu model>"`.
    pub machine: String,
    /// `uname -r` (`/proc/sys/kernel/osrelease`).
    pub kernel: String,
    /// `git rev-parse --short HEAD`, with `-dirty` when the work tree has
    /// changes; `"unknown"` when git cannot tell.
    pub commit: String,
    /// When the run started, UTC, RFC 3339 (`2026-12-01T05:00:00Z`).
    pub date: String,
    /// The 1-minute load average when the run started (the largest of
    /// the runs a merged suite holds).
    pub load: Option<f64>,
    /// Seconds since boot when the run started.
    pub uptime_s: Option<f64>,
}

const UNKNOWN: &str = "unknown";

impl RunMeta {
    /// Read it now from `/proc` and git (run in `repo`, any directory of
    /// the work tree).
    pub fn collect(repo: &Path) -> Self {
        let proc_file = |p: &str| std::fs::read_to_string(p).ok();
        let first_number = |text: Option<String>| {
            text.and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        };
        Self {
            machine: machine(
                proc_file("/proc/cpuinfo").as_deref(),
                std::thread::available_parallelism().map_or(0, usize::from),
                proc_file("/proc/meminfo").as_deref(),
            ),
            kernel: proc_file("/proc/sys/kernel/osrelease")
                .map(|k| k.trim().to_owned())
                .filter(|k| !k.is_empty())
                .unwrap_or_else(|| UNKNOWN.to_owned()),
            commit: commit(repo),
            date: rfc3339_utc(SystemTime::now()),
            load: first_number(proc_file("/proc/loadavg")),
            uptime_s: first_number(proc_file("/proc/uptime")),
        }
    }

    /// The metadata of a suite whose JSON `self` (an earlier bench target
    /// of the same run) wrote and `later` added to: the first run's date,
    /// commit, machine, kernel and uptime, the larger load.
    pub fn merged_with(self, later: &Self) -> Self {
        let load = match (self.load, later.load) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Self { load, ..self }
    }

    /// As a JSON object (numbers that were not read are `null`).
    pub fn to_json(&self) -> Value {
        let num = |v: Option<f64>| {
            v.and_then(serde_json::Number::from_f64)
                .map_or(Value::Null, Value::Number)
        };
        let mut o = Map::new();
        o.insert("machine".into(), self.machine.clone().into());
        o.insert("kernel".into(), self.kernel.clone().into());
        o.insert("commit".into(), self.commit.clone().into());
        o.insert("date".into(), self.date.clone().into());
        o.insert("load".into(), num(self.load));
        o.insert("uptime_s".into(), num(self.uptime_s));
        Value::Object(o)
    }

    /// From [`RunMeta::to_json`]'s object; a field it lacks is unknown.
    pub fn from_json(v: &Value) -> Self {
        let text = |k: &str| v[k].as_str().unwrap_or(UNKNOWN).to_owned();
        Self {
            machine: text("machine"),
            kernel: text("kernel"),
            commit: text("commit"),
            date: text("date"),
            load: v["load"].as_f64(),
            uptime_s: v["uptime_s"].as_f64(),
        }
    }
}

/// `"<cpus> vCPU, <GiB> GiB, <model>"` from `/proc/cpuinfo` and
/// `/proc/meminfo`'s text; a part that cannot be read is left out.
fn machine(cpuinfo: Option<&str>, cpus: usize, meminfo: Option<&str>) -> String {
    let model = cpuinfo.and_then(|c| {
        c.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_owned())
    });
    let gib = meminfo.and_then(|m| {
        let kb: f64 = m
            .lines()
            .find(|l| l.starts_with("MemTotal:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some((kb / (1u64 << 20) as f64).round())
    });
    let mut parts = vec![];
    if cpus > 0 {
        parts.push(format!("{cpus} vCPU"));
    }
    if let Some(g) = gib {
        parts.push(format!("{g} GiB"));
    }
    parts.extend(model);
    if parts.is_empty() {
        UNKNOWN.to_owned()
    } else {
        parts.join(", ")
    }
}

/// The short commit of `repo`'s HEAD, `-dirty` when `git status
/// --porcelain` lists anything; `"unknown"` when git fails.
fn commit(repo: &Path) -> String {
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]).filter(|h| !h.is_empty()) else {
        return UNKNOWN.to_owned();
    };
    match git(&["status", "--porcelain"]) {
        Some(s) if s.is_empty() => head,
        Some(_) => format!("{head}-dirty"),
        None => format!("{head}-unknown-status"),
    }
}

/// `t` as `YYYY-MM-DDTHH:MM:SSZ` (UTC; a time before 1970 is the epoch).
pub fn rfc3339_utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of `z` days after 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates_are_utc_rfc3339() {
        let at = |s: u64| rfc3339_utc(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        // 2000-02-29 (a leap day of a century divisible by 400) 12:34:56.
        assert_eq!(at(951_827_696), "2000-02-29T12:34:56Z");
        assert_eq!(at(1_798_761_599), "2026-12-31T23:59:59Z");
        assert_eq!(at(1_798_761_600), "2027-01-01T00:00:00Z");
    }

    #[test]
    fn the_machine_is_cpus_memory_and_model() {
        let cpuinfo = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n";
        let meminfo = "MemTotal:       24683656 kB\nMemFree: 1 kB\n";
        assert_eq!(
            machine(Some(cpuinfo), 2, Some(meminfo)),
            "2 vCPU, 24 GiB, Intel(R) Xeon(R) Processor"
        );
        assert_eq!(machine(None, 2, Some("garbage")), "2 vCPU");
        assert_eq!(machine(None, 0, None), "unknown");
    }

    #[test]
    fn the_commit_is_heads_or_unknown() {
        assert_eq!(commit(Path::new("/does/not/exist")), "unknown");
        let here = commit(Path::new(env!("CARGO_MANIFEST_DIR")));
        let head = here.trim_end_matches("-dirty");
        assert!(
            here == "unknown" || (head.len() >= 7 && head.chars().all(|c| c.is_ascii_hexdigit())),
            "{here}"
        );
    }

    #[test]
    fn a_merge_keeps_the_first_run_and_the_larger_load() {
        let first = RunMeta {
            machine: "m".into(),
            kernel: "k".into(),
            commit: "abc".into(),
            date: "d1".into(),
            load: Some(0.5),
            uptime_s: Some(10.0),
        };
        let later = RunMeta {
            commit: "def".into(),
            date: "d2".into(),
            load: Some(2.0),
            uptime_s: Some(99.0),
            ..first.clone()
        };
        let m = first.clone().merged_with(&later);
        assert_eq!((m.commit.as_str(), m.date.as_str()), ("abc", "d1"));
        assert_eq!((m.load, m.uptime_s), (Some(2.0), Some(10.0)));
        let unread = RunMeta {
            load: None,
            ..first.clone()
        };
        assert_eq!(unread.merged_with(&first).load, Some(0.5));
        assert_eq!(RunMeta::from_json(&m.to_json()), m);
    }
}
