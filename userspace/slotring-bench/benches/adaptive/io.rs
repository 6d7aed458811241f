//! Workload (c): `slotring run`, the IO-bound default workload, with and
//! without the adaptive budget, and at each static budget below the
//! default (`--concurrent-threads-soft-limit-num`) for `best_static_*_io`.

use super::*;

/// One run of `slotring run` (15 s) in `mode` (`Fixed(n)`: a static budget
/// of `n`); its JSON report.
pub(crate) fn slotring_run(mode: Mode) -> Value {
    let tag = match mode {
        Mode::Static => "static".to_owned(),
        Mode::Adaptive => "adaptive".to_owned(),
        Mode::Fixed(n) => format!("fixed{n}"),
    };
    let pins = format!(
        "/sys/fs/bpf/slotring-bench-adaptive-{}-{tag}",
        std::process::id()
    );
    let mut cmd = Command::new(slotring_bin());
    // The command refuses SLOTRING_* variables that are not its settings.
    cmd.env_remove("SLOTRING_BIN");
    cmd.args(["run", "--duration", "15s", "--json", "--no-progress"])
        .args(["--listen", "", "--pin-dir", &pins])
        .arg(if mode == Mode::Adaptive {
            "--adaptive-budget"
        } else {
            "--no-adaptive-budget"
        });
    if let Mode::Fixed(n) = mode {
        cmd.args(["--concurrent-threads-soft-limit-num", &n.to_string()]);
    }
    let out = cmd.output().expect("run slotring");
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(3),
        "slotring run failed ({code:?}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
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

/// (c): `slotring run`, IO-bound, with and without the adaptive budget,
/// and its keys.
/// A run's point of the static sweep.
fn io_point(budget: u64, v: &Value) -> StaticPoint {
    StaticPoint {
        budget,
        short_p99_ms: f(&v["short_latency_ms"]["p99"]),
        work_per_s: f(&v["throttlers"][0]["sustained_bytes_per_s"]) / 1048576.0,
        runq_share_pct: f(&v["adaptive"]["runq_share_pct"]),
    }
}

pub(crate) fn workload_c(cores: usize, report: &mut Report) {
    let st = slotring_run(Mode::Static);
    let ad = slotring_run(Mode::Adaptive);
    let ceiling = 2 * cores as u64;
    let mut points: Vec<StaticPoint> = (1..ceiling)
        .map(|n| io_point(n, &slotring_run(Mode::Fixed(n))))
        .collect();
    points.push(io_point(ceiling, &st));
    put_best_static(report, "io", &points, "(c)");
    for (k, v, what) in [
        ("static", &st, "--no-adaptive-budget"),
        ("adapt", &ad, "--adaptive-budget"),
    ] {
        let b = &v["adaptive"];
        report.put(
            &format!("{k}_short_p99_ms_io"),
            f(&v["short_latency_ms"]["p99"]),
            &format!(
                "(c) slotring run {what}, 15 s: short query p99 (p50 {:.1} ms; mode {})",
                f(&v["short_latency_ms"]["p50"]),
                b["mode"]
            ),
        );
        report.put(
            &format!("{k}_runq_share_pct_io"),
            f(&b["runq_share_pct"]),
            "(c) run-queue share of running leases",
        );
        report.put(
            &format!("{k}_work_per_s_io"),
            f(&v["throttlers"][0]["sustained_bytes_per_s"]) / 1048576.0,
            "(c) scan throughput, MiB/s read",
        );
        if k == "adapt" {
            report.put(
                "adapt_budget_mean_io",
                f(&b["budget_mean"]),
                "(c) mean effective budget",
            );
            report.put(
                "adapt_yields_io",
                f(&b["yields"]),
                "(c) slots released by should_yield",
            );
        }
    }
}
