//! Shared benchmark plumbing for `cargo xtask bench <suite>`.
//!
//! Every suite measures ours and the baselines in the same run, then calls
//! [`Report::finish`], which prints a table for people and writes
//! `target/bench/<suite>.json`, a flat JSON object of named numbers. The
//! machine is shared and noisy: suites report medians of repeated runs and
//! ratios; nothing here asserts a wall time.
//!
//! A suite measured by more than one bench target (its io_uring part lives
//! in the system-level bench crate, slotring-bench) writes one JSON: the
//! first target with [`Report::new`], the others with
//! [`Report::adding_to`].
//!
//! Beside the JSON, [`Report`] writes `target/bench/<suite>.meta.json`: the
//! machine, kernel, commit, date and load the run started at
//! ([`meta::RunMeta`]), which `cargo xtask bench-report` prints above the
//! suite's table.

pub mod meta;
pub mod rocksdb_limiter;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Instant;

use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};

use crate::meta::RunMeta;

/// Median of `xs` (sorted in place); 0 for an empty slice.
pub fn median(xs: &mut [f64]) -> f64 {
    percentile(xs, 50.0)
}

/// The `p`-th percentile (nearest rank) of `xs` (sorted in place).
pub fn percentile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

/// Nanoseconds per iteration of `f`, median of `rounds` rounds of `iters`.
pub fn ns_per_iter(rounds: usize, iters: u64, mut f: impl FnMut()) -> f64 {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..iters {
            f();
        }
        samples.push(start.elapsed().as_nanos() as f64 / iters as f64);
    }
    median(&mut samples)
}

/// Run `f(thread_index)` on `threads` threads at once, `rounds` times; each
/// call does `iters` operations. Returns the median over rounds of wall ns per
/// operation per thread.
pub fn ns_per_iter_threads(
    rounds: usize,
    threads: usize,
    iters: u64,
    f: impl Fn(usize) + Sync,
) -> f64 {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let barrier = std::sync::Barrier::new(threads);
        let start = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                let f = &f;
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    for _ in 0..iters {
                        f(t);
                    }
                });
            }
        });
        samples.push(start.elapsed().as_nanos() as f64 / iters as f64);
    }
    median(&mut samples)
}

/// Two figures measured in alternate rounds, so that a ratio of them sees
/// the same host on both sides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Paired {
    /// Median of `a`'s rounds.
    pub a: f64,
    /// Median of `b`'s rounds.
    pub b: f64,
    /// Median over rounds of that round's `b / a`: a ratio of two medians
    /// taken minutes apart would carry the host's drift in between.
    pub ratio: f64,
}

/// `rounds` rounds of `a` and of `b`, each call one round's figure: `a`
/// first in even rounds, `b` first in odd ones, so that a host that slows
/// down or speeds up within a round falls on each side equally.
pub fn paired(rounds: usize, mut a: impl FnMut() -> f64, mut b: impl FnMut() -> f64) -> Paired {
    let (mut xs, mut ys, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (x, y) = if round % 2 == 0 {
            let x = a();
            (x, b())
        } else {
            let y = b();
            (a(), y)
        };
        xs.push(x);
        ys.push(y);
        ratios.push(y / x);
    }
    Paired {
        a: median(&mut xs),
        b: median(&mut ys),
        ratio: median(&mut ratios),
    }
}

/// Overshoot in µs of each of `n` waits of `deficit_ns` from their start:
/// `now_ns` reads the clock the waits are on, `wait_until` waits until its
/// absolute deadline on it.
pub fn overshoots_us(
    n: usize,
    deficit_ns: u64,
    now_ns: impl Fn() -> u64,
    mut wait_until: impl FnMut(u64),
) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let deadline = now_ns() + deficit_ns;
            wait_until(deadline);
            now_ns().saturating_sub(deadline) as f64 / 1_000.0
        })
        .collect()
}

/// The first of `/var/tmp` and the temporary directory that is on a disk
/// filesystem (not tmpfs or ramfs), else the current directory: where a
/// suite puts the files it reads from or writes to the disk.
pub fn disk_dir() -> PathBuf {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    for cand in [PathBuf::from("/var/tmp"), std::env::temp_dir()] {
        if let Ok(st) = nix::sys::statfs::statfs(&cand) {
            let magic = st.filesystem_type().0;
            if magic != TMPFS_MAGIC && magic != RAMFS_MAGIC {
                return cand;
            }
        }
    }
    std::env::current_dir().expect("cwd")
}

/// A file of pseudo-random bytes on a disk filesystem, evicted from the
/// page cache on demand and removed however the run ends: the cold data
/// of a suite that reads from the disk.
#[derive(Debug)]
pub struct DataFile {
    /// Where it is.
    pub path: PathBuf,
    /// Open for reading.
    pub file: File,
}

impl DataFile {
    /// `size` bytes (whole MiB) at `path`, written, synced to the disk,
    /// reopened for reading and evicted.
    ///
    /// # Panics
    ///
    /// If the file cannot be written (a bench has no way on without it).
    pub fn create(path: PathBuf, size: u64) -> Self {
        const MIB: u64 = 1 << 20;
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("create the data file {}: {e}", path.display()));
        let mut block = vec![0u8; MIB as usize];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..size / MIB {
            for b in block.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.copy_from_slice(&x.to_le_bytes());
            }
            f.write_all(&block).expect("write the data file");
        }
        f.sync_all().expect("fsync the data file");
        let file = File::open(&path).expect("reopen the data file");
        let d = Self { path, file };
        d.evict();
        d
    }

    /// Drop its pages from the page cache (`posix_fadvise(DONTNEED)`).
    ///
    /// # Panics
    ///
    /// If the kernel refuses the advice.
    pub fn evict(&self) {
        posix_fadvise(
            self.file.as_fd(),
            0,
            0,
            PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
        .expect("posix_fadvise(DONTNEED)");
    }
}

impl Drop for DataFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Collects named numbers, prints them and writes the JSON and the run's
/// metadata.
#[derive(Debug)]
pub struct Report {
    suite: String,
    /// Read when the report is made: the run's start.
    meta: RunMeta,
    values: BTreeMap<String, f64>,
    notes: BTreeMap<String, String>,
    order: Vec<String>,
    /// Add to the suite's JSON instead of replacing it.
    adding: bool,
}

impl Report {
    /// A report for `suite` (the JSON file is `target/bench/<suite>.json`,
    /// written anew); the run's metadata is read now.
    pub fn new(suite: &str) -> Self {
        Self {
            suite: suite.to_owned(),
            meta: RunMeta::collect(std::path::Path::new(env!("CARGO_MANIFEST_DIR"))),
            values: BTreeMap::new(),
            notes: BTreeMap::new(),
            order: vec![],
            adding: false,
        }
    }

    /// A report that adds its keys to `suite`'s JSON as an earlier target
    /// of the same `cargo xtask bench` run left it: a key of this report
    /// replaces the file's, every other key of the file stays (no file: only
    /// this report's keys). Its metadata is merged into the file's
    /// ([`RunMeta::merged_with`]).
    pub fn adding_to(suite: &str) -> Self {
        Self {
            adding: true,
            ..Self::new(suite)
        }
    }

    /// Record `key = value`, with a short human note (unit, baseline, goal).
    pub fn put(&mut self, key: &str, value: f64, note: &str) {
        if self.values.insert(key.to_owned(), value).is_none() {
            self.order.push(key.to_owned());
        }
        self.notes.insert(key.to_owned(), note.to_owned());
        eprintln!("  {key:<34} {value:>14.3}  {note}");
    }

    /// The recorded value of `key`.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.values.get(key).copied()
    }

    /// Where the JSON goes: `$SLOTRING_BENCH_DIR`, else `bench/` under
    /// `$CARGO_TARGET_DIR` or the workspace `target/`.
    pub fn default_dir() -> PathBuf {
        std::env::var_os("SLOTRING_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let base = std::env::var_os("CARGO_TARGET_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| {
                        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target")
                    });
                base.join("bench")
            })
    }

    /// Print the table and write the JSON to [`Report::default_dir`].
    pub fn finish(self) -> std::io::Result<PathBuf> {
        self.finish_in(&Self::default_dir())
    }

    /// Print the table and write `<dir>/<suite>.json` (a value that is not
    /// a finite number is `null`) and `<dir>/<suite>.meta.json`; returns the
    /// JSON's path.
    ///
    /// # Errors
    ///
    /// If the directory or the JSON cannot be written, or (adding) the
    /// JSON there is not a JSON object. The metadata is a statistic: a
    /// failure to write it is printed, not returned.
    pub fn finish_in(self, dir: &std::path::Path) -> std::io::Result<PathBuf> {
        let added = if self.adding { " added" } else { "" };
        println!(
            "\n{} benchmark ({} values{added})",
            self.suite,
            self.values.len()
        );
        println!("{:-<90}", "");
        for k in &self.order {
            println!("{:<34} {:>14.3}  {}", k, self.values[k], self.notes[k]);
        }
        println!("{:-<90}", "");
        let path = dir.join(format!("{}.json", self.suite));
        std::fs::create_dir_all(dir)?;
        let mut obj: serde_json::Map<String, serde_json::Value> = match self.adding {
            true => match std::fs::read_to_string(&path) {
                Ok(text) => serde_json::from_str(&text).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{} is not a JSON object: {e}", path.display()),
                    )
                })?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Map::new(),
                Err(e) => return Err(e),
            },
            false => serde_json::Map::new(),
        };
        for (k, v) in &self.values {
            let n = serde_json::Number::from_f64(*v)
                .map_or(serde_json::Value::Null, serde_json::Value::Number);
            obj.insert(k.clone(), n);
        }
        std::fs::write(&path, serde_json::to_string_pretty(&obj)? + "\n")?;
        println!("wrote {}", path.display());
        self.write_meta(dir);
        Ok(path)
    }

    /// Write `<dir>/<suite>.meta.json`: this run's metadata, merged into
    /// the file's when adding to it. A failure is printed.
    fn write_meta(&self, dir: &std::path::Path) {
        let path = dir.join(format!("{}.meta.json", self.suite));
        let earlier = self
            .adding
            .then(|| std::fs::read_to_string(&path).ok())
            .flatten()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .filter(serde_json::Value::is_object)
            .map(|v| RunMeta::from_json(&v));
        let meta = match earlier {
            Some(e) => e.merged_with(&self.meta),
            None => self.meta.clone(),
        };
        let text = serde_json::to_string_pretty(&meta.to_json()).unwrap_or_default() + "\n";
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("the run's metadata not written to {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_rounds_alternate_and_the_ratio_is_per_round() {
        let order = std::cell::RefCell::new(Vec::new());
        let (mut a, mut b) = ([1.0, 2.0, 4.0].into_iter(), [3.0, 2.0, 4.0].into_iter());
        let p = paired(
            3,
            || {
                order.borrow_mut().push('a');
                a.next().unwrap()
            },
            || {
                order.borrow_mut().push('b');
                b.next().unwrap()
            },
        );
        assert_eq!(order.into_inner(), ['a', 'b', 'b', 'a', 'a', 'b']);
        // Rounds' ratios 3, 1, 1: their median is 1, where the medians'
        // ratio (3 / 2) would be 1.5.
        assert_eq!(
            p,
            Paired {
                a: 2.0,
                b: 3.0,
                ratio: 1.0
            }
        );
    }

    #[test]
    fn overshoots_are_measured_from_each_deadline() {
        let now = std::cell::Cell::new(1_000u64);
        // Each wait ends 3 µs late.
        let o = overshoots_us(2, 1_000_000, || now.get(), |d| now.set(d + 3_000));
        assert_eq!(o, vec![3.0, 3.0]);
        // A clock that is early at the deadline counts as no overshoot.
        let o = overshoots_us(1, 1_000, || now.get(), |_| {});
        assert_eq!(o, vec![0.0]);
    }

    #[test]
    fn percentiles() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(median(&mut v), 3.0);
        assert_eq!(percentile(&mut v, 100.0), 5.0);
        assert_eq!(percentile(&mut v, 1.0), 1.0);
        assert_eq!(median(&mut []), 0.0);
    }

    fn read_back(p: &std::path::Path) -> BTreeMap<String, f64> {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    /// `r` with `keys`, finished in `dir`.
    fn finish(
        mut r: Report,
        keys: &[(&str, f64)],
        dir: &std::path::Path,
    ) -> std::io::Result<PathBuf> {
        for &(k, v) in keys {
            r.put(k, v, "test");
        }
        r.finish_in(dir)
    }

    #[test]
    fn an_added_report_keeps_the_other_keys_and_replaces_its_own() {
        let dir = std::env::temp_dir().join(format!("benchkit-add-{}", std::process::id()));
        finish(Report::new("split"), &[("a", 1.0), ("b", 2.0)], &dir).unwrap();
        let p = finish(Report::adding_to("split"), &[("b", 3.0), ("c", 4.0)], &dir).unwrap();
        let want: BTreeMap<String, f64> =
            [("a".into(), 1.0), ("b".into(), 3.0), ("c".into(), 4.0)].into();
        assert_eq!(read_back(&p), want);
        // A fresh report replaces the file: the added keys are gone.
        finish(Report::new("split"), &[("a", 5.0)], &dir).unwrap();
        assert_eq!(read_back(&p), [("a".into(), 5.0)].into());
        // Adding to a file that is not a JSON object fails, and leaves it.
        std::fs::write(&p, "not json").unwrap();
        let e = finish(Report::adding_to("split"), &[("d", 6.0)], &dir).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "not json");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_value_that_is_not_finite_is_null_and_the_meta_is_written_beside() {
        let dir = std::env::temp_dir().join(format!("benchkit-meta-{}", std::process::id()));
        let mut r = Report::new("m");
        r.meta.load = Some(0.5);
        r.meta.date = "first".into();
        r.put("nan", f64::NAN, "x");
        r.put("inf", f64::INFINITY, "x");
        r.put("one", 1.0, "x");
        let p = r.finish_in(&dir).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert!(v["nan"].is_null() && v["inf"].is_null());
        assert_eq!(v["one"].as_f64(), Some(1.0));
        let meta = |d: &std::path::Path| {
            let t = std::fs::read_to_string(d.join("m.meta.json")).unwrap();
            RunMeta::from_json(&serde_json::from_str(&t).unwrap())
        };
        assert_eq!(meta(&dir).date, "first");
        assert!(!meta(&dir).kernel.is_empty());
        // An added report keeps the first run's date and the larger load.
        let mut added = Report::adding_to("m");
        added.meta.load = Some(3.0);
        added.meta.date = "second".into();
        added.finish_in(&dir).unwrap();
        assert_eq!(
            (meta(&dir).date.as_str(), meta(&dir).load),
            ("first", Some(3.0))
        );
        // A fresh report replaces it.
        let mut fresh = Report::new("m");
        fresh.meta.load = Some(0.1);
        fresh.finish_in(&dir).unwrap();
        assert_eq!(meta(&dir).load, Some(0.1));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writes_flat_json() {
        let dir = std::env::temp_dir().join(format!("benchkit-{}", std::process::id()));
        let mut r = Report::new("unit");
        r.put("a_ns", 1.5, "x");
        r.put("b", 2.0, "y");
        assert_eq!(r.get("b"), Some(2.0));
        let p = r.finish_in(&dir).unwrap();
        assert_eq!(p, dir.join("unit.json"));
        let back = read_back(&p);
        assert_eq!(back.len(), 2);
        assert_eq!(back.get("a_ns"), Some(&1.5));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
