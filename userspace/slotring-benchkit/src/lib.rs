//! Shared benchmark plumbing for `cargo xtask bench <suite>`.
//!
//! Every suite measures ours and the baselines in the same run, then calls
//! [`Report::finish`], which prints a table for people and writes
//! `target/bench/<suite>.json`, a flat JSON object of named numbers. The
//! machine is shared and noisy: suites report medians of repeated runs and
//! ratios; nothing here asserts a wall time.

pub mod rocksdb_limiter;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

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

/// Collects named numbers, prints them and writes the JSON.
#[derive(Debug)]
pub struct Report {
    suite: String,
    values: BTreeMap<String, f64>,
    notes: BTreeMap<String, String>,
    order: Vec<String>,
}

impl Report {
    /// A report for `suite` (the JSON file is `target/bench/<suite>.json`).
    pub fn new(suite: &str) -> Self {
        Self {
            suite: suite.to_owned(),
            values: BTreeMap::new(),
            notes: BTreeMap::new(),
            order: vec![],
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

    /// Print the table and write `<dir>/<suite>.json`; returns the path written.
    pub fn finish_in(self, dir: &std::path::Path) -> std::io::Result<PathBuf> {
        println!("\n{} benchmark ({} values)", self.suite, self.values.len());
        println!("{:-<90}", "");
        for k in &self.order {
            println!("{:<34} {:>14.3}  {}", k, self.values[k], self.notes[k]);
        }
        println!("{:-<90}", "");
        let path = dir.join(format!("{}.json", self.suite));
        std::fs::create_dir_all(dir)?;
        let obj: serde_json::Map<String, serde_json::Value> = self
            .values
            .iter()
            .map(|(k, v)| {
                let n =
                    serde_json::Number::from_f64(*v).unwrap_or_else(|| serde_json::Number::from(0));
                (k.clone(), serde_json::Value::Number(n))
            })
            .collect();
        std::fs::write(&path, serde_json::to_string_pretty(&obj)? + "\n")?;
        println!("wrote {}", path.display());
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(median(&mut v), 3.0);
        assert_eq!(percentile(&mut v, 100.0), 5.0);
        assert_eq!(percentile(&mut v, 1.0), 1.0);
        assert_eq!(median(&mut []), 0.0);
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
        let back: BTreeMap<String, f64> =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back.get("a_ns"), Some(&1.5));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
