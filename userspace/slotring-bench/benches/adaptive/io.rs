//! Workload (c): `slotring run`, the IO-bound default workload, with and
//! without the adaptive budget, and at each static budget below the
//! default (`--concurrent-threads-soft-limit-num`) for `best_static_*_io`.

use super::*;

/// One run of `slotring run` ([`C_DURATION`]) in `mode` (`Fixed(n)`: a
/// static budget of `n`; `Floor`: `--scans 0`, the short queries alone);
/// its JSON report and when the command exited.
pub(crate) fn slotring_run(mode: Mode) -> (Value, Instant) {
    let tag = match mode {
        Mode::Static => "static".to_owned(),
        Mode::Adaptive => "adaptive".to_owned(),
        Mode::Floor => "floor".to_owned(),
        Mode::Fixed(n) => format!("fixed{n}"),
    };
    let pins = format!(
        "/sys/fs/bpf/slotring-bench-adaptive-{}-{tag}",
        std::process::id()
    );
    let mut cmd = Command::new(slotring_bin());
    // The command refuses SLOTRING_* variables that are not its settings.
    cmd.env_remove("SLOTRING_BIN");
    cmd.args(["run", "--duration", C_DURATION, "--json", "--no-progress"])
        .args(["--listen", "", "--pin-dir", &pins])
        .arg(if mode == Mode::Adaptive {
            "--adaptive-budget"
        } else {
            "--no-adaptive-budget"
        });
    if let Mode::Fixed(n) = mode {
        cmd.args(["--concurrent-threads-soft-limit-num", &n.to_string()]);
    }
    if mode == Mode::Floor {
        cmd.args(["--scans", "0"]);
    }
    let out = cmd.output().expect("run slotring");
    let exited = Instant::now();
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(3),
        "slotring run failed ({code:?}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        serde_json::from_slice(&out.stdout).expect("JSON report"),
        exited,
    )
}

/// The `slotring` command, which `cargo xtask bench adaptive` builds with
/// the bench profile first: `$SLOTRING_BIN`, else `slotring` in the
/// profile's directory of the target this bench runs from
/// (`target/release/deps/adaptive-*` → `target/release/slotring`).
pub(crate) fn slotring_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SLOTRING_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the bench's own path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("slotring"));
    match bin {
        Some(bin) if bin.exists() => bin,
        _ => panic!(
            "no slotring binary beside {}: build it with \
             `cargo build --profile bench -p slotring-cli --bin slotring` \
             (cargo xtask bench adaptive does) or set SLOTRING_BIN",
            exe.display()
        ),
    }
}

pub(crate) fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// `of(query)` of the short queries of a run's report.
fn shorts(v: &Value, of: impl Fn(&Value) -> f64) -> Vec<f64> {
    v["queries"]
        .as_array()
        .map(|q| q.iter().filter(|q| q["kind"] == "short").map(of).collect())
        .unwrap_or_default()
}

/// The runs of one mode of (c), pooled: every short query's latency, and
/// each run's scan MiB/s, run-queue share of running leases, mean budget
/// and yields.
#[derive(Debug, Default)]
struct IoRuns {
    short_ms: Vec<f64>,
    /// Their slot wait (the part of the latency spent waiting for a slot), ms.
    slot_wait_ms: Vec<f64>,
    round_p99: Vec<f64>,
    mib_per_s: Vec<f64>,
    runq_pct: Vec<f64>,
    budget_mean: Vec<f64>,
    yields: f64,
    modes: Vec<String>,
}

impl IoRuns {
    fn add(&mut self, v: &Value) {
        let mut ms = shorts(v, |q| (f(&q["end_s"]) - f(&q["start_s"])) * 1e3);
        self.slot_wait_ms
            .extend(shorts(v, |q| f(&q["slot_wait_s"]) * 1e3));
        self.round_p99.push(percentile(&mut ms, 99.0));
        self.short_ms.extend(ms);
        self.mib_per_s
            .push(f(&v["throttlers"][0]["sustained_bytes_per_s"]) / 1048576.0);
        let b = &v["adaptive"];
        self.runq_pct.push(f(&b["runq_share_pct"]));
        self.budget_mean.push(f(&b["budget_mean"]));
        self.yields += f(&b["yields"]);
        self.modes
            .push(b["mode"].as_str().unwrap_or("?").to_owned());
    }
    fn p99(&mut self) -> f64 {
        percentile(&mut self.short_ms, 99.0)
    }
    fn p50(&mut self) -> f64 {
        percentile(&mut self.short_ms, 50.0)
    }
    fn mean(v: &[f64]) -> f64 {
        v.iter().sum::<f64>() / v.len().max(1) as f64
    }
    fn point(&mut self, budget: u64) -> StaticPoint {
        StaticPoint {
            budget,
            short_p99_ms: self.p99(),
            work_per_s: Self::mean(&self.mib_per_s),
            runq_share_pct: Self::mean(&self.runq_pct),
        }
    }
    fn rounds(&self) -> String {
        self.round_p99
            .iter()
            .map(|p| format!("{p:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// (c): `slotring run`, IO-bound: static and adaptive in each of
/// [`C_ROUNDS`] interleaved rounds (short queries pooled), the sweep of
/// static budgets and the floor (`--scans 0`) in the first, and in the
/// last a second floor run beside one [`Plain`] thread (its run-queue
/// share over the middle of the query phase: the run's last
/// `elapsed_s`, less a fifth at each end for setup and teardown).
pub(crate) fn workload_c(cores: usize, report: &mut Report) {
    let ceiling = 2 * cores as u64;
    let (mut st, mut ad, mut fl) = (IoRuns::default(), IoRuns::default(), IoRuns::default());
    let mut sweep: Vec<IoRuns> = (1..ceiling).map(|_| IoRuns::default()).collect();
    let mut plain = (0, 0);
    for round in 0..C_ROUNDS {
        st.add(&slotring_run(Mode::Static).0);
        ad.add(&slotring_run(Mode::Adaptive).0);
        if round == 0 {
            for n in 1..ceiling {
                sweep[n as usize - 1].add(&slotring_run(Mode::Fixed(n)).0);
            }
            fl.add(&slotring_run(Mode::Floor).0);
        }
        if round + 1 == C_ROUNDS {
            let p = Plain::start();
            let (v, exited) = slotring_run(Mode::Floor);
            let samples = p.stop();
            let el = Duration::from_secs_f64(f(&v["elapsed_s"]).max(0.0));
            plain = plain_between(&samples, exited - el.mul_f64(0.8), exited - el.mul_f64(0.2));
        }
        eprintln!(
            "(c) round {round}: short p99 static {:.2} ms, adaptive {:.2} ms",
            st.round_p99.last().copied().unwrap_or(f64::NAN),
            ad.round_p99.last().copied().unwrap_or(f64::NAN)
        );
    }
    let mut points: Vec<StaticPoint> = (1..)
        .zip(sweep.iter_mut())
        .map(|(n, r)| r.point(n))
        .collect();
    points.push(st.point(ceiling));
    put_best_static(
        report,
        "io",
        &points,
        &format!("(c) (the sweep: one run each; {ceiling} is static's rounds)"),
    );
    report.put(
        "floor_short_p99_ms_io",
        fl.p99(),
        &format!(
            "(c) floor: slotring run --scans 0 (the short queries alone), {C_DURATION}; p50 {:.1} ms",
            fl.p50()
        ),
    );
    report.put(
        "floor_runq_share_pct_io",
        share_of(&[plain]),
        "(c) floor: one plain CPU-bound thread (no slotring) beside slotring run --scans 0, the middle 60% of its query phase, /proc schedstat",
    );
    for (k, r, what) in [
        ("static", &mut st, "--no-adaptive-budget"),
        ("adapt", &mut ad, "--adaptive-budget"),
    ] {
        report.put(
            &format!("{k}_short_p99_ms_io"),
            r.p99(),
            &format!(
                "(c) slotring run {what}, {C_ROUNDS} × {C_DURATION} pooled: short query p99 (p50 {:.1} ms; their slot wait p50 {:.2} p99 {:.2} ms; p99 of each run {}; mode {})",
                r.p50(),
                percentile(&mut r.slot_wait_ms, 50.0),
                percentile(&mut r.slot_wait_ms, 99.0),
                r.rounds(),
                r.modes.join(", ")
            ),
        );
        report.put(
            &format!("{k}_runq_share_pct_io"),
            IoRuns::mean(&r.runq_pct),
            "(c) run-queue share of running leases, the mean of the runs",
        );
        report.put(
            &format!("{k}_work_per_s_io"),
            IoRuns::mean(&r.mib_per_s),
            "(c) scan throughput, MiB/s read, the mean of the runs",
        );
        if k == "adapt" {
            report.put(
                "adapt_budget_mean_io",
                IoRuns::mean(&r.budget_mean),
                "(c) mean effective budget, the mean of the runs",
            );
            report.put(
                "adapt_yields_io",
                r.yields,
                "(c) slots released by should_yield, every run",
            );
        }
    }
}
