//! `cargo xtask bench e2e`: `slotring run` under the default mix for a fixed
//! duration, with lease parking on and off. Writes `target/bench/e2e.json`.
//!
//! Goals to report against: rate error <= 1 %, `e2e_jain_mmf >= 0.95`,
//! no thread failing the kernel verdict (its hot parked episodes within
//! the tolerance), fewer slots delayed with parking than without; the raw
//! parked on-CPU ratio is reported beside it.

use std::process::Command;

use serde_json::Value;
use slotring_benchkit::Report;

const DURATION: &str = "15s";

fn run(parking: bool) -> Value {
    let pins = format!(
        "/sys/fs/bpf/slotring-bench-{}-{}",
        std::process::id(),
        parking
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_slotring"));
    cmd.args(["run", "--duration", DURATION, "--json", "--no-progress"])
        .args(["--listen", "", "--pin-dir", &pins]);
    if !parking {
        cmd.arg("--no-lease-parking");
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

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn main() {
    let mut report = Report::new("e2e");
    let on = run(true);
    let off = run(false);
    let t = &on["throttlers"][0];
    let configured = f(&t["configured_bytes_per_s"]);
    let sustained = f(&t["sustained_bytes_per_s"]);
    report.put(
        "e2e_rate_error_pct",
        (sustained - configured).abs() / configured * 100.0,
        &format!(
            "local_read: sustained {:.2} MiB/s vs {:.2} configured (burst excluded), {DURATION}",
            sustained / 1048576.0,
            configured / 1048576.0
        ),
    );
    report.put(
        "e2e_jain_mmf",
        f(&on["fairness"]["jain_scans"]),
        "Jain's index of the 3 scans' mean slots held (max_min_fair)",
    );
    report.put(
        "e2e_jain_instant_mmf",
        f(&on["fairness"]["jain_instant_mean"]),
        "mean per-sample Jain's index of the scans' slots",
    );
    report.put(
        "e2e_parked_oncpu_pct",
        f(&on["kernel"]["parked_oncpu_pct"]),
        &format!(
            "kernel: on-CPU while parked / parked time, a diagnostic (verdict {})",
            on["kernel"]["verdict"]
        ),
    );
    report.put(
        "e2e_failing_threads",
        on["kernel"]["failing_tids"]
            .as_array()
            .map_or(f64::NAN, |a| a.len() as f64),
        &format!(
            "threads with more hot parked episodes than allowed, of {}",
            on["kernel"]["threads"]
        ),
    );
    report.put(
        "e2e_hot_episode_pct",
        f(&on["kernel"]["segments"]["hot_episodes"])
            / f(&on["kernel"]["segments"]["episodes"]).max(1.0)
            * 100.0,
        "kernel: parked episodes over a per-episode bound, % of episodes",
    );
    report.put(
        "e2e_oncpu_us_per_park",
        f(&on["kernel"]["parked_oncpu_us_per_park"]),
        "kernel: on-CPU µs inside each parked window",
    );
    report.put(
        "e2e_threads",
        f(&on["process"]["peak_threads"]),
        "peak threads of the process (12 scan threads + short queries + helpers)",
    );
    report.put(
        "e2e_cpu_s",
        f(&on["process"]["cpu_s"]),
        "process CPU seconds during the queries",
    );
    report.put(
        "e2e_slots_delayed",
        f(&on["slots"]["slots_delayed"]),
        "slots_delayed, lease parking on",
    );
    report.put(
        "e2e_slot_wait_s",
        f(&on["slots"]["slot_wait_s"]),
        "thread-seconds blocked waiting for a slot, parking on",
    );
    report.put(
        "e2e_cpu_s_noparking",
        f(&off["process"]["cpu_s"]),
        "process CPU seconds, lease parking off",
    );
    report.put(
        "e2e_slots_delayed_noparking",
        f(&off["slots"]["slots_delayed"]),
        "slots_delayed, lease parking off",
    );
    report.put(
        "e2e_slot_wait_s_noparking",
        f(&off["slots"]["slot_wait_s"]),
        "thread-seconds blocked waiting for a slot, parking off",
    );
    report.finish().expect("write target/bench/e2e.json");
}
