//! Workload (c): `slotring run`, the IO-bound default workload, with and
//! without the adaptive budget.

use super::*;

pub(crate) fn slotring_run(adaptive: bool) -> Value {
    let pins = format!(
        "/sys/fs/bpf/slotring-bench-adaptive-{}-{adaptive}",
        std::process::id()
    );
    let mut cmd = Command::new(slotring_bin());
    // The command refuses SLOTRING_* variables that are not its settings.
    cmd.env_remove("SLOTRING_BIN");
    cmd.args(["run", "--duration", "15s", "--json", "--no-progress"])
        .args(["--listen", "", "--pin-dir", &pins])
        .arg(if adaptive {
            "--adaptive-budget"
        } else {
            "--no-adaptive-budget"
        });
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
pub(crate) fn workload_c(report: &mut Report) {
    let st = slotring_run(false);
    let ad = slotring_run(true);
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
