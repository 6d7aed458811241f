//! End-to-end tests of the `slotring` binary, deploy/ and the Prometheus
//! tooling. Root-only parts (pinned maps, probes) and tools that may be
//! absent (promtool, prometheus, systemd-analyze, bpftool, setpriv) are
//! skipped with a printed reason on a developer machine; under CI
//! (`CI=true`) a missing tool fails the test instead.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use slotring_cli::http::http_get;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_slotring")
}

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether this is a CI run (`CI=true`), where every tool must be present.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Skip a part for `reason` (printed), or fail when under CI.
fn skip_unless_ci(reason: &str) {
    assert!(!in_ci(), "{reason}, which CI=true requires");
    println!("skipping: {reason}");
}

/// A port that was free a moment ago, for tools that cannot report the
/// port they bound (Prometheus): callers retry when the bind fails.
fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A `slotring` child started with `--listen 127.0.0.1:0`: its stderr is
/// collected by a thread, which also picks the bound address out of the
/// "serving ... http://ADDR/metrics" line (no port race).
struct Served {
    child: Reap,
    addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
}

fn spawn_served(cmd: &mut Command) -> Served {
    let mut child = Reap(cmd.stderr(Stdio::piped()).spawn().unwrap());
    let pipe = child.0.stderr.take().unwrap();
    let stderr = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel();
    let collected = stderr.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("http://").nth(1)
                && let Some(addr) = rest.split("/metrics").next()
                && let Ok(addr) = addr.parse::<SocketAddr>()
            {
                let _ = tx.send(addr);
            }
            let mut s = collected.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    let addr = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(a) => a,
        Err(e) => panic!(
            "slotring never said where it serves ({e}); stderr:\n{}",
            stderr.lock().unwrap()
        ),
    };
    Served {
        child,
        addr,
        stderr,
        reader: Some(reader),
    }
}

impl Served {
    /// Wait for the exit (killing it after `limit`) and collect the output.
    fn finish(mut self, limit: Duration) -> Output {
        let mut out = wait_output(&mut self.child.0, limit);
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        out.stderr = self.stderr.lock().unwrap().clone().into_bytes();
        out
    }

    /// SIGINT, then the exit, which must be 130 within 30 s.
    fn interrupt(self) -> Output {
        sigint(&self.child.0);
        let out = self.finish(Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{err}");
        out
    }

    fn stderr_so_far(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

/// A directory on a real disk (the data file must not be on tmpfs).
fn data_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("slotring-test")
        .tempdir_in("/var/tmp")
        .unwrap()
}

fn pin_dir(tag: &str) -> PathBuf {
    PathBuf::from(format!(
        "/sys/fs/bpf/slotring-test-{tag}-{}",
        std::process::id()
    ))
}

/// Kills (by its own pid) and reaps a child we started, on drop.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for_metrics(addr: SocketAddr, must_contain: &str) -> String {
    let start = Instant::now();
    loop {
        if let Ok((200, body)) = http_get(addr, "/metrics")
            && body.contains(must_contain)
        {
            return body;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no /metrics with {must_contain} at {addr}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait until a run's queries run: `/metrics` is served from the start
/// (the data file's creation included), its tenants only once the scans
/// started.
fn wait_for_queries(addr: SocketAddr) -> String {
    wait_for_metrics(addr, "slotring_tenant_bytes_total")
}

fn wait_output(child: &mut Child, limit: Duration) -> Output {
    // Drain the pipes while waiting: a report larger than the pipe buffer
    // (a 12 s `run --json` writes ~70 KiB) would block the child's write
    // and the child would never exit.
    fn drain(r: Option<impl Read + Send + 'static>) -> JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    }
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("slotring did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Output {
        status: child.wait().unwrap(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn promtool_check_metrics(text: &str) {
    if !have("promtool") {
        skip_unless_ci(
            "promtool check metrics: promtool not installed (Debian package prometheus)",
        );
        return;
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- metrics ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sample names present in an exposition text.
fn sample_names(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or("").to_owned())
        .collect()
}

/// The Grafana dashboard's row of the workload tree's panels, whose
/// series only a run with `--workloads` has.
const WORKLOADS_ROW: &str = "Workloads";

/// Every `slotring_*` series the Grafana dashboard queries in its
/// [`WORKLOADS_ROW`] (`workloads`) or outside it. A row panel has no
/// query; every other panel has at least one.
fn dashboard_series(workloads: bool) -> Vec<String> {
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy().join("grafana/slotring.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    let mut row = None;
    for p in dash["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            assert!(p.get("targets").is_none(), "row {}", p["title"]);
            row = p["title"].as_str();
            continue;
        }
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        if (row == Some(WORKLOADS_ROW)) != workloads {
            continue;
        }
        for t in targets {
            exprs.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    let mut names = Vec::new();
    for e in exprs {
        let mut rest = e.as_str();
        while let Some(i) = rest.find("slotring_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.push(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names.sort();
    names.dedup();
    names
}

const ISSUE_NAMES: &[&str] = &[
    "slotring_throttler_bytes_total",
    "slotring_throttler_page_cache_bytes_total",
    "slotring_throttler_wait_seconds_total",
    "slotring_slots_granted_total",
    "slotring_slots_delayed_total",
    "slotring_slots_queries_delayed_total",
    "slotring_slots_in_use",
    "slotring_slots_max",
    "slotring_slots_leases_parked",
    "slotring_slots_lease_parks_total",
    "slotring_slots_budget_effective",
];

/// With `--adaptive-budget` and the probes attached.
const ADAPTIVE_NAMES: &[&str] = &[
    "slotring_slots_adaptive_enabled",
    "slotring_slots_adaptive_runq_share_basis_points",
    "slotring_slots_adaptive_runq_seconds_total",
    "slotring_slots_adaptive_oncpu_seconds_total",
];

const KERNEL_NAMES: &[&str] = &[
    "slotring_parked_oncpu_seconds_total",
    "slotring_parked_runqueue_seconds_total",
    "slotring_parked_oncpu_episode_seconds_bucket",
    "slotring_unpark_runqueue_latency_seconds_bucket",
];

#[test]
fn run_serves_metrics_tools_read_pins_and_json_report_is_sane() {
    let dir = data_dir();
    let pins = pin_dir("run");
    let svg = dir.path().join("plot.svg");
    let rate: u64 = 16 << 20;
    // The run must outlive the tools below (verify's 1 s window, the
    // exporter, stats), which read its pins: on a machine loaded several
    // times over they took longer than a 6 s run, and its pins were gone.
    let child = spawn_served(
        Command::new(bin())
            .args(["run", "--duration", "12s", "--file-size", "128MiB"])
            .args([
                "--max-local-read-bandwidth",
                "16MiB",
                "--json",
                "--no-progress",
                "--no-adaptive-budget",
                "--adaptive-budget",
            ])
            .arg("--dir")
            .arg(dir.path())
            .arg("--pin-dir")
            .arg(&pins)
            .args(["--listen", "127.0.0.1:0"])
            .arg("--plot")
            .arg(&svg)
            .stdout(Stdio::piped()),
    );
    let (addr, pid) = (child.addr, child.child.0.id());
    wait_for_queries(addr);
    let body = wait_for_metrics(addr, "slotring_throttler_bytes_total");
    promtool_check_metrics(&body);
    let names = sample_names(&body);
    for n in ISSUE_NAMES {
        assert!(names.contains(*n), "{n} missing from /metrics:\n{body}");
    }
    // The sample line (the HELP text also contains "slotring_probes_attached 1").
    let attached = body.lines().any(|l| l == "slotring_probes_attached 1");
    // As root with kernel BTF the probes must attach: a broken object must
    // not turn this test green by skipping every kernel check.
    let must_attach = is_root() && Path::new("/sys/kernel/btf/vmlinux").exists();
    assert!(
        attached || !must_attach,
        "root with kernel BTF, but the probes did not attach:\n{}\n--- /metrics ---\n{body}",
        child.stderr_so_far()
    );
    if attached {
        for n in KERNEL_NAMES.iter().chain(ADAPTIVE_NAMES) {
            assert!(names.contains(*n), "{n} missing from /metrics:\n{body}");
        }
        for series in dashboard_series(false) {
            assert!(
                names.contains(&series),
                "the Grafana dashboard queries {series}, which /metrics does not have"
            );
        }
        let buckets = body
            .lines()
            .filter(|l| l.starts_with("slotring_parked_oncpu_episode_seconds_bucket"))
            .count();
        assert_eq!(buckets, 40, "every exp2 bucket is present");
    } else {
        println!(
            "probes not attached (not root?): kernel families and the dashboard check skipped"
        );
    }

    if attached {
        assert!(
            pins.join(pid.to_string()).join("slots").exists(),
            "probes attached but no pins at {}",
            pins.display()
        );

        // `slotring verify --pid` on the running process.
        let out = Command::new(bin())
            .args(["verify", "--pid", &pid.to_string(), "--window", "1s"])
            .arg("--pin-dir")
            .arg(&pins)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let code = out.status.code();
        assert!(
            (code == Some(0) && text.contains("verdict: PASS"))
                || (code == Some(3) && text.contains("verdict: FAIL")),
            "verify: {code:?}\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );

        // `slotring exporter` over the pins of the running process.
        let exporter = exporter_on(&pins);
        let ex_body = wait_for_metrics(exporter.addr, "slotring_parked_oncpu_seconds_total");
        promtool_check_metrics(&ex_body);
        assert!(
            ex_body.contains(&format!(
                "slotring_throttler_bytes_total{{slotring_instance=\"{pid}\",throttler=\"local_read\"}}"
            )),
            "{ex_body}"
        );
        drop(exporter);

        // `slotring stats`.
        let out = Command::new(bin())
            .args(["stats", "--interval", "500ms"])
            .arg("--pin-dir")
            .arg(&pins)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("local_read") && text.contains("slots: budget"),
            "{text}"
        );
    }

    let out = child.finish(Duration::from_secs(120));
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(3),
        "exit {code:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Structure: every section of the report.
    for key in [
        "config",
        "elapsed_s",
        "interrupted",
        "data_file",
        "throttlers",
        "io",
        "slots",
        "fairness",
        "queries",
        "kernel",
        "process",
        "metrics_addr",
        "short_latency_ms",
        "adaptive",
        "timeline",
    ] {
        assert!(r.get(key).is_some(), "report lacks {key}");
    }
    assert_eq!(code == Some(3), r["kernel"]["verdict"] == "fail");
    assert_eq!(r["interrupted"], false);
    assert_eq!(r["config"]["max_local_read_bandwidth"], rate);
    // The throttler: configured as asked, never more than the bucket allows.
    let t = &r["throttlers"][0];
    assert_eq!(t["name"], "local_read");
    assert_eq!(t["configured_bytes_per_s"], rate);
    let charged = t["charged_bytes"].as_u64().unwrap();
    let burst = t["burst_bytes"].as_u64().unwrap();
    let elapsed = r["elapsed_s"].as_f64().unwrap();
    assert!(charged > 0);
    // Charged ≤ burst + rate·T + in-flight requests (12 scan threads × 256 KiB
    // and short queries × 64 KiB).
    let bound = burst as f64 + rate as f64 * elapsed + (12 * (256 << 10) + 64 * (64 << 10)) as f64;
    assert!(charged as f64 <= bound, "charged {charged} > bound {bound}");
    // Data-file writes are limited by default, and what the disk wrote
    // meanwhile is reported beside the limit (/var/tmp is a block device).
    let write_limit: u64 = 64 << 20;
    assert_eq!(r["config"]["max_local_write_bandwidth"], write_limit);
    let w = &r["throttlers"][1];
    assert_eq!(w["name"], "local_write");
    assert_eq!(w["configured_bytes_per_s"], write_limit);
    assert_eq!(w["charged_bytes"], 128u64 << 20);
    let d = &r["data_file"]["disk_writes"];
    let (peak, median) = (
        d["peak_bytes_per_s"].as_f64().unwrap(),
        d["median_bytes_per_s"].as_f64().unwrap(),
    );
    assert!(median > 0.0 && peak >= median, "{d}");
    assert!(d["neighbours_peak_bytes_per_s"].as_f64().is_some(), "{d}");
    assert!(d["stat"].as_str().unwrap().starts_with("/sys/dev/block/"));
    // Reads happened; page-cache bytes are not charged to the disk throttler.
    let io = &r["io"];
    assert!(io["reads"].as_u64().unwrap() > 0);
    let read = io["read_bytes"].as_u64().unwrap();
    let not_charged = t["page_cache_bytes_not_charged"].as_u64().unwrap();
    assert!(
        charged + not_charged >= read,
        "{charged} + {not_charged} < {read}"
    );
    // Slots: the ClickHouse default ratio 2 per core, nothing leaked.
    let cores = std::thread::available_parallelism().unwrap().get() as u64;
    assert_eq!(r["slots"]["max_concurrency"], 2 * cores);
    assert_eq!(r["slots"]["in_use_at_end"], 0);
    assert_eq!(r["slots"]["borrowed_at_end"], 0);
    assert_eq!(r["slots"]["scheduler"], "max_min_fair");
    assert_eq!(r["slots"]["parks"], r["slots"]["unparks"]);
    // Queries: 3 scans that read, and short queries.
    let qs = r["queries"].as_array().unwrap();
    let scans: Vec<&Value> = qs.iter().filter(|q| q["kind"] == "scan").collect();
    assert_eq!(scans.len(), 3);
    for q in &scans {
        assert!(q["bytes"].as_u64().unwrap() > 0, "{q}");
        assert!(q["max_slots"].as_u64().unwrap() <= 4, "{q}");
    }
    assert!(qs.iter().any(|q| q["kind"] == "short"));
    let jain = r["fairness"]["jain_scans"].as_f64().unwrap();
    assert!(jain > 1.0 / 3.0 - 1e-9 && jain <= 1.0 + 1e-9, "{jain}");
    // Timeline series have one point per sample.
    let tl = &r["timeline"];
    let n = tl["t_s"].as_array().unwrap().len();
    assert!(n >= 10, "{n} samples");
    for k in [
        "disk_bytes_per_s",
        "short_slots",
        "slots_in_use",
        "leases_parked",
        "budget",
    ] {
        assert_eq!(tl[k].as_array().unwrap().len(), n, "{k}");
    }
    // The budget: the last of `--no-adaptive-budget --adaptive-budget` won;
    // between the floor and the ceiling, never 0.
    let b = &r["adaptive"];
    assert_eq!(r["config"]["adaptive_budget"], true);
    assert_eq!(b["ceiling"], 2 * cores);
    let (lo, hi) = (
        b["budget_min"].as_u64().unwrap(),
        b["budget_max"].as_u64().unwrap(),
    );
    assert!(1 <= lo && lo <= hi && hi <= 2 * cores, "{b}");
    if attached {
        assert_eq!(b["mode"], "adaptive", "{b}");
        assert!(b["windows"].as_u64().unwrap() > 0, "{b}");
        let share = b["runq_share_pct"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&share), "{b}");
    }
    for s in tl["scan_slots"].as_array().unwrap() {
        assert_eq!(s.as_array().unwrap().len(), n);
    }
    // Kernel verdict, when the probes were attached.
    let k = &r["kernel"];
    assert_eq!(k["attached"], attached);
    if attached {
        assert!(
            ["pass", "fail"].contains(&k["verdict"].as_str().unwrap()),
            "{k}"
        );
        assert!(k["parks"].as_u64().unwrap() > 0);
        assert!(k["parked_s"].as_f64().unwrap() > 0.0);
        // Every park is an episode, with its segments and the rule.
        let seg = &k["segments"];
        let episodes = seg["episodes"].as_u64().unwrap();
        assert!(
            episodes > 0 && episodes <= k["parks"].as_u64().unwrap(),
            "{k}"
        );
        assert!(seg["pre_sleep_us_mean"].as_f64().unwrap() > 0.0, "{k}");
        assert!(k["rule"]["pre_sleep_us"].as_f64().unwrap() > 0.0, "{k}");
        assert!(k["rule"]["tolerated_hot_pct"].as_f64().is_some(), "{k}");
        assert_eq!(
            k["verdict"] == "fail",
            !k["failing"].as_array().unwrap().is_empty(),
            "{k}"
        );
    }
    // Clean up: data file removed, pins removed, plot written.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "plot.svg")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(!pins.exists(), "pins left at {}", pins.display());
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
    assert!(svg.contains("effective budget"));
}

#[test]
fn prometheus_server_scrapes_a_run() {
    if !Path::new("/usr/bin/prometheus").exists() {
        skip_unless_ci("/usr/bin/prometheus not installed (Debian package prometheus)");
        return;
    }
    let dir = data_dir();
    let run = spawn_served(
        Command::new(bin())
            .args([
                "run",
                "--duration",
                "20s",
                "--file-size",
                "16MiB",
                "--no-progress",
            ])
            .args(["--listen", "127.0.0.1:0", "--no-probes"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null()),
    );
    let addr = run.addr;
    wait_for_queries(addr);
    let prom_dir = tempfile::tempdir().unwrap();
    let cfg = prom_dir.path().join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: slotring\n    static_configs:\n      - targets: [\"{addr}\"]\n"
        ),
    )
    .unwrap();
    // Prometheus cannot report a port it picked: take a free one and start
    // again on another if it loses the race for it (it exits at once).
    let (prom_addr, _prom) = (0..5)
        .find_map(|_| {
            let prom_addr = free_addr();
            let mut prom = Reap(
                Command::new("/usr/bin/prometheus")
                    .arg(format!("--config.file={}", cfg.display()))
                    .arg(format!(
                        "--storage.tsdb.path={}",
                        prom_dir.path().join("data").display()
                    ))
                    .arg(format!("--web.listen-address={prom_addr}"))
                    .arg("--log.level=warn")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(60) {
                if prom.0.try_wait().unwrap().is_some() {
                    return None; // lost the port (or failed): try again
                }
                if let Ok((200, _)) = http_get(prom_addr, "/-/ready") {
                    return Some((prom_addr, prom));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            panic!("Prometheus never became ready on {prom_addr}");
        })
        .expect("Prometheus failed to start 5 times");
    let cores = std::thread::available_parallelism().unwrap().get();
    let start = Instant::now();
    let body = loop {
        if let Ok((200, body)) = http_get(prom_addr, "/api/v1/query?query=slotring_slots_max")
            && body.contains("\"__name__\":\"slotring_slots_max\"")
        {
            break body;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "Prometheus never returned slotring_slots_max"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(body.contains("\"job\":\"slotring\""), "{body}");
    assert!(body.contains(&format!("\"{}\"]", 2 * cores)), "{body}");
    // A labelled counter made it too.
    let (code, body) = http_get(
        prom_addr,
        "/api/v1/query?query=slotring_throttler_bytes_total%7Bthrottler%3D%22local_read%22%7D",
    )
    .unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("\"throttler\":\"local_read\""), "{body}");
    drop(run);
}

#[test]
fn promtool_checks_deploy_prometheus() {
    if !have("promtool") {
        skip_unless_ci("promtool not installed (Debian package prometheus)");
        return;
    }
    let d = deploy().join("prometheus");
    for args in [
        vec!["check", "config", "prometheus.yml"],
        vec!["check", "rules", "slotring.rules.yml"],
        vec!["test", "rules", "slotring.rules.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(&args)
            .current_dir(&d)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn systemd_unit_has_narrow_capabilities_and_verifies() {
    let unit = std::fs::read_to_string(deploy().join("systemd/slotring-exporter.service")).unwrap();
    let line = |key: &str| {
        unit.lines()
            .find(|l| l.starts_with(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{key}= missing"))
            .to_owned()
    };
    assert_eq!(
        line("CapabilityBoundingSet"),
        "CapabilityBoundingSet=CAP_BPF CAP_PERFMON"
    );
    assert_eq!(
        line("AmbientCapabilities"),
        "AmbientCapabilities=CAP_BPF CAP_PERFMON"
    );
    assert_eq!(line("DynamicUser"), "DynamicUser=yes");
    assert_eq!(line("NoNewPrivileges"), "NoNewPrivileges=yes");
    assert!(line("ExecStart").contains("exporter --listen 127.0.0.1:9464"));
    if !have("systemd-analyze") {
        skip_unless_ci("systemd-analyze verify: not installed (Debian package systemd)");
        return;
    }
    // Verify a copy whose ExecStart points at the binary under test.
    let d = tempfile::tempdir().unwrap();
    let copy = d.path().join("slotring-exporter.service");
    std::fs::write(&copy, unit.replace("/usr/local/bin/slotring", bin())).unwrap();
    // `--man=no`: a minimal image has no man pages for `Documentation=man:`
    // (an empty MANPATH stands for one, so the check cannot depend on this
    // machine's pages); every other warning about the unit still fails.
    let no_man = d.path().join("no-man");
    std::fs::create_dir(&no_man).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .env("MANPATH", &no_man)
        .arg(&copy)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{err}"
    );
    assert!(
        !err.contains("slotring-exporter.service"),
        "systemd-analyze warned about the unit:\n{err}"
    );
}

#[test]
fn bad_settings_exit_2_naming_option_and_value() {
    let out = Command::new(bin())
        .args(["run", "--max-local-read-bandwidth", "lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--max-local-read-bandwidth") && err.contains("`lots`"),
        "{err}"
    );

    let out = Command::new(bin())
        .args(["run"])
        .env("SLOTRING_CONCURRENT_THREADS_SCHEDULER", "fifo")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`fifo`") && err.contains("SLOTRING_CONCURRENT_THREADS_SCHEDULER"),
        "{err}"
    );

    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("c.toml");
    std::fs::write(&cfg, "duration = \"forever\"\n").unwrap();
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--duration") && err.contains("`forever`") && err.contains("c.toml"),
        "{err}"
    );

    let out = Command::new(bin())
        .args(["run", "--bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    let out = Command::new(bin())
        .args(["run", "--plot", "run.png"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    // A verdict over an empty window, or with a tolerance outside [0, 1],
    // is refused before anything is read.
    for (args, option, value) in [
        (&["--window", "0s"][..], "--window", "`0s`"),
        (
            &["--tolerated-hot-fraction", "1.5"][..],
            "--tolerated-hot-fraction",
            "`1.5`",
        ),
        (
            &["--tolerated-hot-fraction=-0.1"][..],
            "--tolerated-hot-fraction",
            "`-0.1`",
        ),
    ] {
        let out = Command::new(bin())
            .args(["verify", "--pid", "1"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(option) && err.contains(value),
            "{args:?}: {err}"
        );
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--plot") && err.contains("`run.png`"), "{err}");

    // Nothing to read: exit 4, naming the path.
    let out = Command::new(bin())
        .args(["stats", "--pin-dir", "/nonexistent/slotring"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no slotring instance under /nonexistent/slotring "),
        "{err}"
    );
    let out = Command::new(bin())
        .args(["verify", "--pid", "4000000000", "--window", "1s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));

    let out = Command::new(bin()).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Examples:") && help.contains("Exit codes"),
        "{help}"
    );
}

#[test]
fn exporter_without_pins_still_answers_scrapes() {
    let exporter = spawn_served(
        Command::new(bin())
            .args(["exporter", "--pin-dir", "/nonexistent/slotring"])
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::null()),
    );
    let body = wait_for_metrics(exporter.addr, "slotring_exporter_up 0");
    promtool_check_metrics(&body);
    // Remote listening needs an explicit opt-in (a bad option: 2).
    let out = Command::new(bin())
        .args(["exporter", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-remote"));
}

#[test]
fn ctrl_c_stops_cleanly() {
    let dir = data_dir();
    let pins = pin_dir("int");
    let child = spawn_served(
        Command::new(bin())
            .args([
                "run",
                "--duration",
                "60s",
                "--file-size",
                "32MiB",
                "--no-progress",
            ])
            .args(["--listen", "127.0.0.1:0"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--pin-dir")
            .arg(&pins)
            .stdout(Stdio::piped()),
    );
    wait_for_queries(child.addr);
    let pid = nix::unistd::Pid::from_raw(child.child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.finish(Duration::from_secs(30));
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(interrupted)"), "{text}");
    // The text report has every section.
    for section in [
        "throttlers (achieved vs configured):",
        "  local_read ",
        "page-cache bytes not charged to the disk",
        "CPU slots: budget",
        "Jain's index of the scans",
        "kernel verdict on parked threads:",
        "  rule: an episode is hot when",
        "  verdict: ",
        "process: ",
    ] {
        assert!(text.contains(section), "no `{section}` in:\n{text}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "data file left behind");
    assert!(!pins.exists(), "pins left at {}", pins.display());
}

/// `degrades_cleanly_without_privileges`'s run, as user 65534 with no
/// capabilities.
fn setpriv_run(bin: &Path, dir: &Path, cfg: &Path) -> std::process::Output {
    Command::new("setpriv")
        .env("SLOTRING_SCAN_THREADS", "2")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["--inh-caps=-all", "--bounding-set=-all", "--"])
        .arg(bin)
        .args([
            "run",
            "--duration",
            "2s",
            "--file-size",
            "16MiB",
            "--json",
            "--no-progress",
            "--adaptive-budget",
        ])
        .args(["--listen", "127.0.0.1:0"])
        .arg("--dir")
        .arg(dir)
        .arg("--config")
        .arg(cfg)
        .output()
        .unwrap()
}

#[test]
fn degrades_cleanly_without_privileges() {
    if !is_root() || !have("setpriv") {
        skip_unless_ci("needs root and setpriv (util-linux) to run as an unprivileged user");
        return;
    }
    // The unprivileged user must be able to reach the binary: the checkout
    // or target dir may sit under a directory it cannot traverse (e.g.
    // /root, mode 0700), so run a copy from a world-traversable directory.
    let bin_dir = tempfile::Builder::new()
        .prefix("slotring-bin")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(
        bin_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let bin_copy = bin_dir.path().join("slotring");
    std::fs::copy(bin(), &bin_copy).unwrap();
    std::fs::set_permissions(
        &bin_copy,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let dir = data_dir();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    // Settings from a TOML file and the environment, too.
    let cfg = dir.path().join("slotring.toml");
    std::fs::write(&cfg, "scans = 2\nscan_threads = 3\nduration = \"5s\"\n").unwrap();
    // A copy just written can be briefly busy (ETXTBSY): another test's
    // child, forked while the copy was open for writing, holds the file
    // until its exec closes it. Retried a bounded number of times.
    let out = (0..20)
        .map(|_| setpriv_run(&bin_copy, dir.path(), &cfg))
        .find(|o| {
            let busy = o.status.code() == Some(126)
                && String::from_utf8_lossy(&o.stderr).contains("Text file busy");
            if busy {
                std::thread::sleep(Duration::from_millis(50));
            }
            !busy
        })
        .expect("the copied binary stayed busy for a second");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        err.matches("running without kernel probes").count(),
        1,
        "said once: {err}"
    );
    assert_eq!(
        err.matches("the CPU slot budget stays static").count(),
        1,
        "said once: {err}"
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    // File < environment < command line.
    assert_eq!(r["config"]["scans"], 2);
    assert_eq!(r["config"]["scan_threads"], 2);
    assert_eq!(r["config"]["duration"], 2.0);
    let scans = r["queries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["kind"] == "scan")
        .count();
    assert_eq!(scans, 2);
    assert_eq!(r["kernel"]["attached"], false);
    assert_eq!(r["kernel"]["verdict"], "unverified");
    assert_eq!(r["adaptive"]["mode"], "static (no kernel probes)");
    assert_eq!(r["adaptive"]["budget_min"], r["adaptive"]["ceiling"]);
    assert!(r["io"]["reads"].as_u64().unwrap() > 0);
    assert!(
        r["kernel"]["reason"]
            .as_str()
            .unwrap()
            .contains("privilege"),
        "{}",
        r["kernel"]
    );
}

// ---- The /metrics server under hostile or broken clients ----
//
// Every client below talks to a server this test started, on loopback; every
// loop is bounded in count and time.

/// `slotring exporter` on an ephemeral loopback port, with no pins.
fn spawn_exporter() -> Served {
    exporter_on(Path::new("/nonexistent/slotring"))
}

/// `slotring exporter` of the pins under `root`, on an ephemeral loopback
/// port.
fn exporter_on(root: &Path) -> Served {
    spawn_served(
        Command::new(bin())
            .args(["exporter", "--listen", "127.0.0.1:0"])
            .arg("--pin-dir")
            .arg(root)
            .stdout(Stdio::null()),
    )
}

/// A client that sends a request head one byte every 200 ms, never
/// finishing it, until stopped, until its budget of bytes runs out, or until
/// the server closes the connection (then `closed_after` says when).
struct Dribbler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<Option<Duration>>>,
}

impl Dribbler {
    fn attach(addr: SocketAddr) -> Self {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            // "GET /metrics HTTP/1.1\r\nX: aaaa..." without the blank line.
            let head = b"GET /metrics HTTP/1.1\r\nX-Slow: ";
            for i in 0..300 {
                if stop2.load(std::sync::atomic::Ordering::Relaxed) {
                    return None;
                }
                let byte = head.get(i).copied().unwrap_or(b'a');
                if s.write_all(&[byte]).is_err() {
                    return Some(start.elapsed());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            None
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop dribbling; when the server closed the connection, if it did.
    fn closed_after(mut self) -> Option<Duration> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Dribbler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Send `raw` and read the whole answer (the server closes after it).
fn raw_request(addr: SocketAddr, raw: &str) -> String {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// A header's value in a raw response (names are case-insensitive).
fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    let head = response.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// `(utime + stime)` of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the `(comm)`, which may contain spaces.
    let rest = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5), i.e. 12 and 13 here.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A line of `/proc/PID/status` in KiB (`VmHWM`, `VmRSS`).
fn status_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The lowest descriptor number a process has free: a soft `RLIMIT_NOFILE`
/// of this leaves it none (the kernel hands out the lowest free number below
/// the limit).
fn lowest_free_fd(pid: u32) -> usize {
    let used: std::collections::BTreeSet<usize> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    (0..).find(|n| !used.contains(n)).unwrap()
}

#[test]
fn metrics_are_answered_promptly_while_slow_clients_dribble() {
    let exporter = spawn_exporter();
    wait_for_metrics(exporter.addr, "slotring_exporter_up");
    let slow: Vec<Dribbler> = (0..20).map(|_| Dribbler::attach(exporter.addr)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let (code, body) = http_get(exporter.addr, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("slotring_exporter_up"), "{body}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "/metrics took {:?} while 20 slow clients were attached",
        t.elapsed()
    );
    // The head has a deadline of its own (a few seconds), however steadily
    // the bytes arrive: every slow client is cut off.
    std::thread::sleep(Duration::from_secs(8));
    for d in slow {
        let closed = d.closed_after();
        assert!(
            closed.is_some_and(|c| c < Duration::from_secs(10)),
            "a client dribbling its head was still connected after 8 s ({closed:?})"
        );
    }
}

#[test]
fn a_huge_request_line_is_refused_and_memory_stays_bounded() {
    use std::io::Write;
    let exporter = spawn_exporter();
    wait_for_metrics(exporter.addr, "slotring_exporter_up");
    let pid = exporter.child.0.id();
    let mut s = std::net::TcpStream::connect(exporter.addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /").unwrap();
    // 64 MiB of request line and no newline; the server may close the
    // connection long before (a write error ends the sending).
    let chunk = vec![b'a'; 1 << 20];
    let mut sent = 0usize;
    while sent < 64 << 20 {
        if s.write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len();
    }
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "after {sent} bytes of request line: {answer}"
    );
    let peak_kib = status_kib(pid, "VmHWM");
    assert!(
        peak_kib < 64 << 10,
        "the exporter's peak RSS reached {peak_kib} KiB after {sent} bytes of request line"
    );
    // And it still serves.
    assert_eq!(http_get(exporter.addr, "/metrics").unwrap().0, 200);
}

#[test]
fn many_idle_connections_are_capped_and_metrics_still_answered() {
    let exporter = spawn_exporter();
    wait_for_metrics(exporter.addr, "slotring_exporter_up");
    let pid = exporter.child.0.id();
    let before = open_fds(pid);
    // Connecting is bounded too: a server that does not accept fills its
    // backlog, and a connect then waits for the kernel's SYN retries.
    let deadline = Instant::now() + Duration::from_secs(5);
    let idle: Vec<std::net::TcpStream> = (0..500)
        .map_while(|_| {
            let left = deadline.checked_duration_since(Instant::now())?;
            std::net::TcpStream::connect_timeout(&exporter.addr, left).ok()
        })
        .collect();
    assert_eq!(idle.len(), 500, "500 connections within 5 s");
    std::thread::sleep(Duration::from_millis(500));
    let held = open_fds(pid) - before;
    assert!(
        held <= 64,
        "the exporter holds {held} connections for 500 idle clients (cap 64)"
    );
    // The idle connections are cut off at the head deadline; a scrape is
    // answered by then, with a real answer.
    let start = Instant::now();
    let body = loop {
        if let Ok((200, body)) = http_get(exporter.addr, "/metrics") {
            break body;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no /metrics answer within 10 s of 500 idle connections"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(body.contains("slotring_exporter_up"), "{body}");
    drop(idle);
}

#[test]
fn head_and_other_methods_get_correct_answers() {
    let exporter = spawn_exporter();
    let get = wait_for_metrics(exporter.addr, "slotring_exporter_up");
    let head = raw_request(
        exporter.addr,
        "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head}");
    assert_eq!(
        header(&head, "content-type"),
        Some("text/plain; version=0.0.4"),
        "{head}"
    );
    // The same length as a GET's body (the exporter without pins renders
    // the same text each time).
    assert_eq!(
        header(&head, "content-length"),
        Some(get.len().to_string().as_str()),
        "{head}"
    );
    for method in ["POST", "PUT", "DELETE"] {
        let r = raw_request(
            exporter.addr,
            &format!("{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
        );
        assert!(r.starts_with("HTTP/1.1 405"), "{r}");
        assert_eq!(header(&r, "allow"), Some("GET, HEAD"), "{r}");
    }
    let r = raw_request(exporter.addr, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
}

#[test]
fn sigterm_stops_the_exporter_with_a_slow_client_attached() {
    let exporter = spawn_exporter();
    wait_for_metrics(exporter.addr, "slotring_exporter_up");
    let slow = Dribbler::attach(exporter.addr);
    std::thread::sleep(Duration::from_millis(500));
    let pid = nix::unistd::Pid::from_raw(exporter.child.0.id() as i32);
    let t = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = exporter.finish(Duration::from_secs(30));
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the exporter took {took:?} to stop on SIGTERM with a slow client attached"
    );
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(slow);
}

#[test]
fn run_finishes_on_time_with_a_slow_client_attached() {
    let dir = data_dir();
    let run = spawn_served(
        Command::new(bin())
            .args(["run", "--duration", "1s", "--file-size", "16MiB"])
            .args(["--no-progress", "--no-probes", "--listen", "127.0.0.1:0"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null()),
    );
    let t = Instant::now();
    let slow = Dribbler::attach(run.addr);
    let out = run.finish(Duration::from_secs(60));
    let took = t.elapsed();
    // 1 s of workload, the report and at most the server's shutdown grace
    // (generous for a loaded machine): a client that keeps dribbling its
    // request for a minute must not hold the run.
    assert!(
        took < Duration::from_secs(10),
        "a 1 s run took {took:?} after it started serving, with a slow client attached"
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(slow);
}

#[test]
fn accept_backs_off_when_out_of_file_descriptors() {
    use std::io::Write;
    if !have("prlimit") {
        skip_unless_ci("prlimit (util-linux) not installed");
        return;
    }
    let exporter = spawn_exporter();
    wait_for_metrics(exporter.addr, "slotring_exporter_up");
    let pid = exporter.child.0.id();
    let prlimit = |soft: usize| {
        let out = Command::new("prlimit")
            .args(["--pid", &pid.to_string(), &format!("--nofile={soft}:")])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "prlimit: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // No descriptor left: every accept fails with EMFILE while a client
    // waits in the backlog.
    prlimit(lowest_free_fd(pid));
    let mut client = std::net::TcpStream::connect(exporter.addr).unwrap();
    client
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (c0, t0) = (cpu_ticks(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let (c1, t1) = (cpu_ticks(pid), Instant::now());
    let ticks_per_s = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as f64;
    let cpu = (c1 - c0) as f64 / ticks_per_s / (t1 - t0).as_secs_f64();
    assert!(
        cpu < 0.05,
        "out of descriptors, the exporter burnt {:.0}% of a CPU",
        cpu * 100.0
    );
    // Descriptors free again: the waiting client is answered.
    prlimit(1024);
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut answer = String::new();
    client.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("slotring_exporter_up"), "{answer}");
    assert!(
        exporter.stderr_so_far().contains("Too many open files"),
        "the exporter says why it cannot accept: {}",
        exporter.stderr_so_far()
    );
}

/// `slotring run` with probes for `duration`, pinning under `root`; its
/// data file in `data`.
fn spawn_run(root: &Path, data: &Path, duration: &str) -> Served {
    spawn_served(
        Command::new(bin())
            .args(["run", "--duration", duration, "--file-size", "8MiB"])
            .args(["--max-local-read-bandwidth", "4MiB"])
            .args(["--no-progress", "--listen", "127.0.0.1:0"])
            .arg("--dir")
            .arg(data)
            .arg("--pin-dir")
            .arg(root)
            .stdout(Stdio::null()),
    )
}

/// Wait until the instance of `pid` has pinned its maps under `root`.
fn wait_for_pins(root: &Path, pid: u32) -> PathBuf {
    let dir = root.join(pid.to_string());
    let start = Instant::now();
    while !dir.join("slots").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no pins at {}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    dir
}

/// Probes can attach here (root with kernel BTF), else the test is skipped.
fn probes_possible(test: &str) -> bool {
    let ok = is_root() && Path::new("/sys/kernel/btf/vmlinux").exists();
    if !ok {
        println!("skipping {test}: needs root and kernel BTF for the probes");
    }
    ok
}

fn slotring(args: &[&str], root: &Path) -> Output {
    Command::new(bin())
        .args(args)
        .arg("--pin-dir")
        .arg(root)
        .output()
        .unwrap()
}

#[test]
fn after_kill_9_the_pins_read_as_stale_and_the_next_run_removes_them() {
    if !probes_possible("the kill -9 test") {
        return;
    }
    let data = data_dir();
    let root = pin_dir("kill9");
    let mut run = spawn_run(&root, data.path(), "60s");
    let pid = run.child.0.id();
    let dir = wait_for_pins(&root, pid);
    run.child.0.kill().unwrap(); // SIGKILL: nothing is cleaned up
    run.child.0.wait().unwrap();
    assert!(dir.join("slots").exists(), "the pins outlive the process");

    // `stats`: stale, exit 4 (nothing to read), naming the process.
    let out = slotring(&["stats", "--interval", "100ms"], &root);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("stale") && err.contains(&format!("process {pid}")),
        "{err}"
    );

    // The exporter: the dead instance is labelled and not attached, with no
    // frozen counters.
    let exporter = spawn_served(
        Command::new(bin())
            .args(["exporter", "--listen", "127.0.0.1:0"])
            .arg("--pin-dir")
            .arg(&root)
            .stdout(Stdio::null()),
    );
    let body = wait_for_metrics(exporter.addr, "slotring_exporter_up 1");
    promtool_check_metrics(&body);
    let line = format!("slotring_probes_attached{{slotring_instance=\"{pid}\"}} 0");
    assert!(body.lines().any(|l| l == line), "no `{line}` in:\n{body}");
    assert!(!body.contains("slotring_slots_granted_total{"), "{body}");
    drop(exporter);

    // The next run proves the owner dead, removes its pins, and leaves no
    // empty directory behind.
    let next = spawn_run(&root, data.path(), "500ms");
    let out = next.finish(Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 3)), "{err}");
    assert!(
        err.contains(&format!("removed stale pins {}", dir.display())),
        "{err}"
    );
    assert!(!root.exists(), "left behind: {}", root.display());
}

#[test]
fn a_verdict_across_a_window_in_which_the_probes_go_away_is_unverified() {
    if !probes_possible("the detached-window test") {
        return;
    }
    let data = data_dir();
    let root = pin_dir("detach");
    let run = spawn_run(&root, data.path(), "60s");
    let pid = run.child.0.id();
    wait_for_pins(&root, pid);
    // The pins are there from the start (`/metrics` too): wait for the
    // query threads, whose parks the window is to watch.
    wait_for_queries(run.addr);
    let verify = Command::new(bin())
        .args(["verify", "--pid", &pid.to_string(), "--window", "5s"])
        .arg("--pin-dir")
        .arg(&root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run stops (and removes its pins) inside the window.
    std::thread::sleep(Duration::from_millis(1500));
    sigint(&run.child.0);
    let out = run.finish(Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(130));
    let out = verify.wait_with_output().unwrap();
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // Nothing verified, never a PASS: the window ends when the target's
    // probes go away, whichever of its ends verify sees first (the pins
    // gone at the reading, or the process gone while it watches).
    assert_eq!(out.status.code(), Some(4), "{text}{err}");
    assert!(!text.contains("verdict: PASS"), "{text}");
    assert!(
        text.contains("verdict: UNVERIFIED (the probes went away during the window")
            || err.contains(&format!("process {pid} exited")),
        "{text}{err}"
    );
    assert!(!root.exists(), "left behind: {}", root.display());
}

#[test]
fn two_runs_keep_their_own_pins_and_top_says_when_one_is_gone() {
    if !probes_possible("the two-runs test") {
        return;
    }
    let data = data_dir();
    let root = pin_dir("two");
    // A loaded machine takes seconds per bpftool dump of `lease`: the
    // second run lasts long enough for the dashboard's first report.
    let first = spawn_run(&root, data.path(), "60s");
    let first_pid = first.child.0.id();
    wait_for_pins(&root, first_pid);
    let second = spawn_run(&root, data.path(), "10s");
    let second_pid = second.child.0.id();
    wait_for_pins(&root, second_pid);

    // The bpftool dashboard on the second instance, across its exit.
    let top = have("bpftool").then(|| {
        Command::new("sh")
            .arg(deploy().join("bpftool/slotring-top.sh"))
            .arg("-d")
            .arg(&root)
            .args(["-I", &second_pid.to_string(), "-i", "0.5"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    });
    let out = second.finish(Duration::from_secs(60));
    assert!(matches!(out.status.code(), Some(0 | 3)));
    if let Some(mut top) = top {
        let out = wait_output(&mut top, Duration::from_secs(30));
        let (text, err) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(4), "{text}{err}");
        assert!(
            err.contains(&format!(
                "instance {second_pid} (process {second_pid}) is gone"
            )),
            "{err}"
        );
        assert!(
            text.contains("SLOTS  budget"),
            "it showed the instance: {text}"
        );
        let negative = text
            .split_whitespace()
            .any(|w| w.starts_with('-') && w[1..].starts_with(|c: char| c.is_ascii_digit()));
        assert!(!negative, "negative rates:\n{text}");
        assert!(!err.contains("Error"), "raw bpftool errors: {err}");
    } else {
        skip_unless_ci("the bpftool dashboard: bpftool not installed");
    }

    // The first instance is untouched and still observable, by the
    // dashboard too (the only live instance now).
    assert!(root.join(first_pid.to_string()).join("slots").exists());
    if have("bpftool") {
        let out = Command::new("sh")
            .arg(deploy().join("bpftool/slotring-top.sh"))
            .arg("-d")
            .arg(&root)
            .args(["-n", "1", "-i", "1"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("local_read"), "{text}");
        assert!(text.contains("SLOTS  budget"), "{text}");
        assert!(text.contains("KERNEL threads"), "{text}");
        assert!(text.contains("parked episodes/s"), "{text}");
    }
    let out = slotring(&["stats", "--interval", "200ms"], &root);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = slotring(
        &["verify", "--pid", &first_pid.to_string(), "--window", "1s"],
        &root,
    );
    // Observable: a verdict on its threads (UNVERIFIED, exit 4, only when
    // none parked in the window), not "none of the threads belongs".
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        matches!(out.status.code(), Some(0 | 3))
            || (out.status.code() == Some(4) && text.contains("verdict: UNVERIFIED")),
        "verify: {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = nix::unistd::Pid::from_raw(first_pid as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = first.finish(Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(130));
    assert!(!root.exists(), "left behind: {}", root.display());
}

#[test]
fn a_pin_dir_planted_by_another_user_is_refused_and_untouched() {
    if !probes_possible("the hostile pin directory test") || !have("setpriv") {
        skip_unless_ci("needs setpriv (util-linux)");
        return;
    }
    if std::fs::metadata("/sys/fs/bpf")
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o1777)
        .ok()
        != Some(0o1777)
    {
        println!("skipping: /sys/fs/bpf is not writable by other users here");
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let data = data_dir();
    let planted = pin_dir("planted");
    let link = pin_dir("link");
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
        ])
        .arg(format!(
            "mkdir -m 0777 {p} && mkdir {p}/lease && ln -s /sys/fs/bpf {l}",
            p = planted.display(),
            l = link.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (root, why) in [
        (&planted, "owned by another user"),
        (&link, "a symbolic link"),
    ] {
        let before = std::fs::symlink_metadata(root).unwrap();
        let out = spawn_run(root, data.path(), "300ms").finish(Duration::from_secs(60));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(matches!(out.status.code(), Some(0)), "{err}");
        let said = format!(
            "refusing pin directory {}: {why} (owner uid 65534, mode ",
            root.display()
        );
        assert!(err.contains(&said), "no `{said}` in:\n{err}");
        let after = std::fs::symlink_metadata(root).unwrap();
        assert_eq!((after.mode(), after.uid()), (before.mode(), before.uid()));
    }
    assert!(planted.join("lease").is_dir(), "the planted entry stays");
    assert_eq!(
        std::fs::metadata("/sys/fs/bpf").unwrap().mode() & 0o7777,
        0o1777,
        "/sys/fs/bpf is not chmod'ed through the link"
    );
    std::fs::remove_dir_all(&planted).unwrap();
    std::fs::remove_file(&link).unwrap();
}

#[test]
fn unequal_scans_share_the_disk_fairly_and_the_report_shows_it() {
    let dir = data_dir();
    let plot = dir.path().join("run.svg");
    let out = Command::new(bin())
        .args(["run", "--scan-threads", "8,2,1", "--duration", "3s"])
        .args([
            "--file-size",
            "64MiB",
            "--max-local-read-bandwidth",
            "16MiB",
        ])
        // The kernel verdict is another test's; this one is about shares.
        .args(["--json", "--no-progress", "--listen", "off", "--no-probes"])
        .arg("--dir")
        .arg(dir.path())
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["config"]["scans"], 3);
    assert_eq!(r["config"]["scan_threads"], serde_json::json!([8, 2, 1]));
    let scans: Vec<&Value> = r["queries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["kind"] == "scan")
        .collect();
    let threads: Vec<u64> = scans
        .iter()
        .map(|q| q["threads"].as_u64().unwrap())
        .collect();
    assert_eq!(threads, [8, 2, 1]);
    let shares: Vec<f64> = scans
        .iter()
        .map(|q| q["disk_share_pct"].as_f64().unwrap())
        .collect();
    assert!(
        (shares.iter().sum::<f64>() - 100.0).abs() < 1e-6,
        "{shares:?}"
    );
    for q in &scans {
        assert!((q["fair_share_pct"].as_f64().unwrap() - 100.0 / 3.0).abs() < 1e-9);
        assert!(q["disk_bytes"].as_u64().unwrap() > 0);
    }
    // First-come would give 8:2:1 (73% / 18% / 9%); the fair order keeps
    // the widest scan far from that (loose: a loaded machine, 3 s).
    assert!(shares[0] < 55.0, "the 8-thread scan took {shares:?}");
    assert!(shares[2] > 18.0, "the 1-thread scan got {shares:?}");
    let svg = std::fs::read_to_string(&plot).unwrap();
    for i in 1..=3 {
        assert!(
            svg.contains(&format!("scan {i} read rate")),
            "plot draws scan {i}"
        );
    }
}

// ---- Workload trees (`--workloads`, issue 27) ----

/// The workload names of a report's text section, in order.
fn workload_lines<'a>(text: &'a str, names: &[&str]) -> Vec<&'a str> {
    let section = text
        .split("\nworkloads (")
        .nth(1)
        .unwrap_or_else(|| panic!("no workloads section in:\n{text}"));
    section
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| {
            names
                .iter()
                .any(|n| l.trim_start().starts_with(&format!("{n} ")))
        })
        .collect()
}

#[test]
fn deploy_workloads_toml_runs_and_the_report_has_a_line_per_workload() {
    let dir = data_dir();
    let file = deploy().join("workloads.toml");
    let plot = dir.path().join("run.svg");
    let out = run_cmd(dir.path(), &["--duration", "1s", "--listen", "off"])
        .arg("--workloads")
        .arg(&file)
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap();
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{err}{text}");
    assert!(
        text.contains("root cap 64.0 MiB/s from max_local_read_bandwidth")
            && text.contains("short queries enter `user`, scans `background`"),
        "{text}"
    );
    let lines = workload_lines(&text, &["all", "user", "background"]);
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[2].contains("background       all             1"),
        "{text}"
    );
    // The tree schedules the reads: `local_read` is not the reads' throttler.
    assert!(!text.contains("  local_read "), "{text}");
    // The plot draws each workload's read rate (and no scan's: scans carry
    // no tenant under a tree).
    let svg = std::fs::read_to_string(&plot).unwrap();
    for w in ["all", "user", "background"] {
        assert!(svg.contains(&format!(">workload {w}<")), "plot draws {w}");
        assert!(
            svg.contains(&format!(">workload {w} slots<")),
            "plot draws {w}'s CPU slots"
        );
    }
    assert!(!svg.contains("scan 1 read rate"), "{svg}");
}

#[test]
fn deploy_workloads_toml_schedules_the_cpu_slots_of_both_leaves_and_exports_them() {
    let dir = data_dir();
    // Defaults: 3 scans of 4 threads for a budget of 2 slots per core, a
    // short query every 100 ms; the 8 MiB file is soon all in the page
    // cache, so the scans' threads are CPU-bound and hold every slot.
    let child = spawn_served(
        run_cmd(dir.path(), &["--duration", "3s", "--json"])
            .arg("--workloads")
            .arg(deploy().join("workloads.toml"))
            .stdout(Stdio::piped()),
    );
    let body = wait_for_metrics(
        child.addr,
        "slotring_workload_cpu_grants_total{workload=\"user\"}",
    );
    let out = child.finish(Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    promtool_check_metrics(&body);
    // The dashboard's workload row queries only series a run by a tree has.
    let names = sample_names(&body);
    let row = dashboard_series(true);
    assert!(
        row.contains(&"slotring_workload_wait_seconds_bucket".to_owned()),
        "{row:?}"
    );
    for series in row {
        assert!(
            names.contains(&series),
            "the Grafana dashboard's {WORKLOADS_ROW} row queries {series}, which /metrics does not have"
        );
    }
    for family in [
        "slotring_workload_cpu_slot_seconds_total",
        "slotring_workload_cpu_slots_held",
        "slotring_workload_cpu_grants_total",
        "slotring_workload_cpu_preemptions_total",
    ] {
        for w in ["all", "user", "background"] {
            assert!(
                body.contains(&format!("{family}{{workload=\"{w}\"}} ")),
                "{family} of {w}:\n{body}"
            );
        }
    }
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cpu = r["workloads"]["cpu"].as_array().unwrap();
    let names: Vec<&str> = cpu.iter().map(|w| w["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["all", "user", "background"]);
    let (all, user, bg) = (&cpu[0], &cpu[1], &cpu[2]);
    let n = |w: &Value, k: &str| w[k].as_u64().unwrap();
    let f = |w: &Value, k: &str| w[k].as_f64().unwrap();
    // Both leaves' allocations were granted slots by the tree and held them.
    for w in [user, bg] {
        assert!(n(w, "grants") > 0 && f(w, "slot_s") > 0.0, "{w}");
    }
    // The root's grants and slot time are its leaves'.
    assert_eq!(n(all, "grants"), n(user, "grants") + n(bg, "grants"));
    assert!((f(all, "slot_s") - f(user, "slot_s") - f(bg, "slot_s")).abs() < 1e-6);
    assert_eq!(f(all, "share_pct"), 100.0);
    // Nothing outranks priority 0; the short queries, waiting behind the
    // scans' threads for a full budget, outrank `background`, whose
    // holders yield at their next checkpoint.
    assert_eq!(n(user, "preemptions"), 0, "{user}");
    assert!(n(bg, "preemptions") > 0, "{bg}");
    // Every short query got its slot from the tree: one grant each.
    let shorts = r["queries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["kind"] == "short")
        .count() as u64;
    assert!(
        shorts > 0 && n(user, "grants") <= shorts,
        "{shorts}: {user}"
    );
}

/// A run under `tree` (a workloads file's text) at 16 MiB/s for the whole
/// disk, with `/metrics`: its JSON report and a scrape taken while it ran.
fn run_with_workloads(dir: &Path, tree: &str) -> (Value, String) {
    let file = dir.join("workloads.toml");
    std::fs::write(&file, tree).unwrap();
    let child = spawn_served(
        Command::new(bin())
            .args(["run", "--workloads"])
            .arg(&file)
            // A file the scans do not read twice (page-cache hits are not
            // charged), written at full speed.
            .args(["--duration", "3s", "--file-size", "160MiB"])
            .args(["--max-local-write-bandwidth", "0"])
            .args(["--max-local-read-bandwidth", "16MiB"])
            .args(["--json", "--no-progress", "--no-probes"])
            .args(["--listen", "127.0.0.1:0"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::piped()),
    );
    let body = wait_for_metrics(
        child.addr,
        "slotring_workload_requests_total{workload=\"user\"}",
    );
    let out = child.finish(Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    (serde_json::from_slice(&out.stdout).unwrap(), body)
}

/// The report's entry of workload `name`.
fn workload<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["workloads"]["io"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == name)
        .unwrap_or_else(|| panic!("no workload {name} in {}", r["workloads"]))
}

#[test]
fn a_run_by_a_tree_holds_its_caps_and_exports_each_workload() {
    const TREE: &str = "[[workload]]\nname = \"all\"\n\
        [[workload]]\nname = \"user\"\nparent = \"all\"\n\
        [[workload]]\nname = \"background\"\nparent = \"all\"\npriority = 1\n";
    let dir = data_dir();
    let cap: u64 = 4 << 20;
    let (r, body) =
        run_with_workloads(dir.path(), &format!("{TREE}max_bytes_per_second = {cap}\n"));
    promtool_check_metrics(&body);
    let names = sample_names(&body);
    for n in [
        "slotring_workload_bytes_total",
        "slotring_workload_refunded_bytes_total",
        "slotring_workload_requests_total",
        "slotring_workload_queued",
        "slotring_workload_in_flight",
        "slotring_workload_wait_seconds_bucket",
        "slotring_workload_wait_seconds_count",
    ] {
        assert!(names.contains(n), "{n} missing from /metrics:\n{body}");
    }
    for w in ["all", "user", "background"] {
        assert!(
            body.contains(&format!(
                "slotring_workload_bytes_total{{workload=\"{w}\"}}"
            )),
            "{w}: {body}"
        );
    }
    let w = &r["workloads"];
    assert_eq!(w["root_cap"], "max_local_read_bandwidth");
    assert_eq!(w["root_bytes_per_s"], 16u64 << 20);
    assert_eq!(
        (w["queries"].as_str(), w["scans"].as_str()),
        (Some("user"), Some("background"))
    );
    assert!(
        r["throttlers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["name"] != "local_read"),
        "{}",
        r["throttlers"]
    );
    // Every scan read went through `background`, every short query through
    // `user`; the root saw both.
    let (all, user, bg) = (
        workload(&r, "all"),
        workload(&r, "user"),
        workload(&r, "background"),
    );
    assert!(user["requests"].as_u64().unwrap() > 0, "{user}");
    assert!(bg["requests"].as_u64().unwrap() > 0, "{bg}");
    assert_eq!(
        all["requests"].as_u64().unwrap(),
        user["requests"].as_u64().unwrap() + bg["requests"].as_u64().unwrap()
    );
    let share = |w: &Value| w["share_pct"].as_f64().unwrap();
    assert!((share(user) + share(bg) - 100.0).abs() < 1e-6);
    // The cap: at most its burst (one second of it) plus its rate over the
    // run, plus what a grant may book ahead: the 1 ms horizon and one read.
    // It bounds the bytes the disk was charged net of refunds (the report's
    // `bytes`): a read found cached after its wait gives its tokens back
    // to the bucket, which the next read spends.
    let elapsed = r["elapsed_s"].as_f64().unwrap();
    let bound = |rate: u64| rate as f64 * (1.0 + elapsed + 1e-3) + f64::from(256u32 << 10);
    let bg_bytes = bg["bytes"].as_u64().unwrap();
    assert!(
        bg_bytes as f64 <= bound(cap),
        "background {bg_bytes} over {}",
        bound(cap)
    );

    // The same run without background's cap takes well past that bound: the
    // check above can fail.
    let dir = data_dir();
    let (r, _) = run_with_workloads(dir.path(), TREE);
    let bg = workload(&r, "background");
    let bg_bytes = bg["bytes"].as_u64().unwrap();
    assert!(
        bg_bytes as f64 > bound(cap),
        "uncapped background: {bg_bytes}"
    );
    assert!(
        bg_bytes as f64 <= bound(16 << 20),
        "the root's cap: {bg_bytes}"
    );
}

#[test]
fn a_bad_workloads_file_exits_2_naming_the_workload_the_key_and_the_value() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("w.toml");
    for (tree, wants) in [
        (
            "[[workload]]\nname = \"all\"\n[[workload]]\nname = \"user\"\nparent = \"all\"\nweight = \"heavy\"\n",
            &["w.toml", "`user`", "weight = \"heavy\""][..],
        ),
        (
            "[[workload]]\nname = \"all\"\n[[workload]]\nname = \"user\"\nparent = \"everyone\"\n",
            &["`user`", "parent `everyone`"][..],
        ),
        (
            "[[workload]]\nname = \"all\"\nmax_iops = 0\n[[workload]]\nname = \"user\"\nparent = \"all\"\n[[workload]]\nname = \"background\"\nparent = \"all\"\n",
            &["`all`", "max_iops = 0"][..],
        ),
    ] {
        std::fs::write(&file, tree).unwrap();
        let out = Command::new(bin())
            .args(["run", "--workloads"])
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        for w in wants {
            assert!(err.contains(w), "{err} lacks {w}");
        }
        assert!(out.stdout.is_empty(), "nothing ran");
    }
}

// ---- Files, stopping, the plot, exit codes and read errors (issue 13) ----

/// `slotring run` on a small file with no probes, `/metrics` on an ephemeral
/// port unless `args` say where (so that the test knows when the queries
/// run), data in `dir`.
fn run_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(["run", "--file-size", "8MiB", "--no-progress", "--no-probes"]);
    if !args.contains(&"--listen") {
        c.args(["--listen", "127.0.0.1:0"]);
    }
    c.arg("--dir").arg(dir).args(args);
    c
}

fn sigint(child: &Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
}

/// The data file a run names on stderr ("slotring: data file PATH (...").
fn data_file_of(stderr: &str) -> PathBuf {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("slotring: data file "))
        .unwrap_or_else(|| panic!("no data file line in:\n{stderr}"));
    PathBuf::from(line.split(" (").next().unwrap())
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_run_never_removes_a_file_it_did_not_create() {
    let dir = data_dir();
    // A file already at the name the run would pick: kept, byte for byte,
    // and the run takes a fresh name.
    let script = format!(
        "echo precious > {d}/slotring-data-$$.$(cut -d' ' -f22 /proc/$$/stat).bin; \
         exec {b} run --dir {d} --duration 0.5s \
         --file-size 8MiB --no-progress --no-probes --listen ''",
        d = dir.path().display(),
        b = bin()
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let left = entries(dir.path());
    assert_eq!(left.len(), 1, "{left:?}");
    let kept = dir.path().join(&left[0]);
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "precious\n");
    assert_ne!(data_file_of(&err), kept, "{err}");

    // The data file replaced by another file during the run: the other file
    // stays.
    let run = spawn_served(run_cmd(dir.path(), &["--duration", "1.5s"]).stdout(Stdio::null()));
    let path = data_file_of(&run.stderr_so_far());
    std::fs::rename(&path, dir.path().join("moved")).unwrap();
    std::fs::write(&path, "someone else's\n").unwrap();
    let out = run.finish(Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "someone else's\n");
    assert!(err.contains("not removing"), "{err}");
}

#[test]
fn a_missing_dir_is_announced_and_removed_when_empty() {
    let base = data_dir();
    let dir = base.path().join("new/sub");
    let out = run_cmd(&dir, &["--duration", "0.3s", "--listen", ""])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("creating data directory {}", dir.display())),
        "{err}"
    );
    assert!(
        entries(base.path()).is_empty(),
        "left: {:?}",
        entries(base.path())
    );
}

/// SIGINT to a run whose queries wait on something long; the run must be
/// gone within 1 s (the bound is 200 ms plus the report).
fn interrupted_within_a_second(args: &[&str]) {
    let dir = data_dir();
    let run = spawn_served(run_cmd(dir.path(), args).stdout(Stdio::piped()));
    wait_for_queries(run.addr);
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    sigint(&run.child.0);
    let out = run.finish(Duration::from_secs(30));
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        took < Duration::from_secs(1),
        "{args:?}: exit {took:?} after SIGINT; {err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("(interrupted)"));
    assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
}

#[test]
fn ctrl_c_is_timely_under_a_one_hour_short_query_interval() {
    interrupted_within_a_second(&["--duration", "60s", "--short-query-interval", "1h"]);
}

#[test]
fn ctrl_c_is_timely_under_a_one_byte_per_second_throttle() {
    interrupted_within_a_second(&["--duration", "60s", "--max-local-read-bandwidth", "1"]);
}

#[test]
fn ctrl_c_is_timely_while_tenants_queue_for_their_fair_turn() {
    // 21 scan threads of three tenants, each 256 KiB read ~100 ms of the
    // rate: queued one behind another in the throttler's fair order they
    // would take ~2 s to get through; stopping releases the queue instead.
    interrupted_within_a_second(&[
        "--duration",
        "60s",
        "--scan-threads",
        "16,4,1",
        "--max-local-read-bandwidth",
        "2560KiB",
    ]);
}

#[test]
fn ctrl_c_is_timely_during_long_cpu_work_and_slot_waits() {
    // One slot for 12 threads, each holding it for an hour of CPU work.
    interrupted_within_a_second(&[
        "--duration",
        "60s",
        "--concurrent-threads-soft-limit-num",
        "1",
        "--cpu-work-per-read",
        "1h",
        "--slot-quantum",
        "1h",
    ]);
}

#[test]
fn a_second_ctrl_c_still_removes_the_data_file_and_the_pins() {
    let dir = data_dir();
    let pins = pin_dir("abort");
    let mut cmd = Command::new(bin());
    cmd.args([
        "run",
        "--file-size",
        "8MiB",
        "--no-progress",
        "--duration",
        "60s",
    ])
    .args(["--max-local-read-bandwidth", "1", "--listen", "127.0.0.1:0"])
    .arg("--dir")
    .arg(dir.path())
    .arg("--pin-dir")
    .arg(&pins)
    .stdout(Stdio::null());
    let run = spawn_served(&mut cmd);
    let data = data_file_of(&run.stderr_so_far());
    assert!(data.exists());
    wait_for_queries(run.addr);
    if is_root() {
        assert!(
            std::fs::read_dir(&pins).unwrap().count() > 0,
            "nothing pinned at {}",
            pins.display()
        );
    }
    sigint(&run.child.0);
    // The second SIGINT only after the first was handled: two sent before
    // the process runs are one pending signal (standard signals do not
    // queue), which is what a loaded machine did to a fixed 5 ms gap.
    let t = Instant::now();
    while !run.stderr_so_far().contains("SIGINT, stopping") {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the first SIGINT was never handled: {}",
            run.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    sigint(&run.child.0);
    let out = run.finish(Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("again, aborted"), "the abort path ran: {err}");
    assert!(!data.exists(), "data file left behind: {err}");
    assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
    if is_root() {
        let left: Vec<_> = std::fs::read_dir(&pins)
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "pins left: {left:?}; {err}");
        let _ = std::fs::remove_dir(&pins);
    } else {
        skip_unless_ci("pins: not root");
    }
}

#[test]
fn a_short_query_interval_of_an_hour_does_not_outlive_the_duration() {
    let dir = data_dir();
    let t = Instant::now();
    let mut child = run_cmd(
        dir.path(),
        &["--duration", "1s", "--short-query-interval", "1h"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let out = wait_output(&mut child, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

#[test]
fn a_bad_plot_path_is_refused_before_the_run() {
    let dir = data_dir();
    let t = Instant::now();
    let out = run_cmd(
        dir.path(),
        &["--duration", "20s", "--plot", "/nonexistent/dir/run.svg"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--plot") && err.contains("/nonexistent/dir/run.svg"),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "refused only after the run"
    );
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn a_plot_that_cannot_be_written_after_the_run_keeps_the_report() {
    let dir = data_dir();
    let plots = data_dir();
    let plot = plots.path().join("sub/run.svg");
    std::fs::create_dir(plots.path().join("sub")).unwrap();
    let run = spawn_served(
        run_cmd(dir.path(), &["--duration", "1s", "--json", "--plot"])
            .arg(&plot)
            .stdout(Stdio::piped()),
    );
    std::fs::remove_dir(plots.path().join("sub")).unwrap();
    let out = run.finish(Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&plot.display().to_string()), "{err}");
    let r: Value = serde_json::from_slice(&out.stdout).expect("the report, as JSON");
    assert!(r["io"]["reads"].as_u64().unwrap() > 0);
}

#[test]
fn settings_the_throttler_refuses_exit_2_naming_the_option() {
    let out = Command::new(bin())
        .args(["run", "--max-local-read-bandwidth", "64TiB", "--no-probes"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--max-local-read-bandwidth") && err.contains("`64TiB`"),
        "{err}"
    );
    let out = Command::new(bin())
        .args(["run", "--no-probes"])
        .env("SLOTRING_MAX_LOCAL_WRITE_BANDWIDTH", "1PiB")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn non_loopback_listen_is_refused_with_2_unless_allowed() {
    for cmd in [&["run", "--no-probes"][..], &["exporter"][..]] {
        let t = Instant::now();
        let out = Command::new(bin())
            .args(cmd)
            .args(["--listen", "0.0.0.0:0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(
            err.contains("--allow-remote") && err.contains("0.0.0.0:0"),
            "{err}"
        );
        assert!(t.elapsed() < Duration::from_secs(10), "{cmd:?} ran first");
    }
}

#[test]
fn unknown_and_non_utf8_slotring_variables_exit_2() {
    use std::os::unix::ffi::OsStrExt;
    let out = Command::new(bin())
        .args(["run", "--no-probes"])
        .env("SLOTRING_DURATON", "1s")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("SLOTRING_DURATON"), "{err}");
    let out = Command::new(bin())
        .args(["run", "--no-probes"])
        .env("SLOTRING_DURATION", std::ffi::OsStr::from_bytes(b"1\xffs"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("SLOTRING_DURATION") && err.contains("UTF-8"),
        "{err}"
    );
    // Variables the workspace documents as not settings pass.
    let dir = data_dir();
    let out = run_cmd(dir.path(), &["--duration", "0.2s", "--listen", ""])
        .env("SLOTRING_BENCH_DIR", "/tmp")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn os_causes_are_printed_once() {
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = Command::new(bin())
        .args(["exporter", "--listen", &addr])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("in use").count(), 1, "{err}");
    let dir = data_dir();
    let out = run_cmd(dir.path(), &["--duration", "0.2s", "--listen", &addr])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(err.matches("in use").count(), 1, "{err}");
}

/// The exit-code table of `main.rs`'s docs, as `(code, meaning)` rows.
fn exit_code_rows(text: &str) -> Vec<(u8, String)> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start_matches("//!").trim();
            let mut cells = l.strip_prefix('|')?.split('|');
            let code = cells.next()?.trim().trim_matches('`').parse().ok()?;
            Some((code, cells.next()?.trim().to_owned()))
        })
        .collect()
}

#[test]
fn exit_codes_are_as_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let main = exit_code_rows(&std::fs::read_to_string(root.join("src/main.rs")).unwrap());
    let codes: Vec<u8> = main.iter().map(|r| r.0).collect();
    assert_eq!(codes, [0, 1, 2, 3, 4, 130]);
    for readme in [root.join("README.md"), root.join("../../README.md")] {
        let rows = exit_code_rows(&std::fs::read_to_string(&readme).unwrap());
        assert_eq!(rows, main, "{} and src/main.rs differ", readme.display());
    }
    // 0: a run; 1: a runtime error (the data directory is a file); 2: a bad
    // setting; 4: nothing to read. 3 (verdict FAIL) needs a parked thread
    // that uses CPU, which this workload does not do; 130 is
    // `every_command_exits_130_on_its_first_signal` (run, exporter,
    // stats --watch, verify), `ctrl_c_stops_cleanly` and the Ctrl-C tests
    // above.
    let dir = data_dir();
    let out = run_cmd(dir.path(), &["--duration", "0.2s", "--listen", ""])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = run_cmd(&file, &["--duration", "0.2s", "--listen", ""])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&file.display().to_string()), "{err}");
    let out = run_cmd(dir.path(), &["--scans", "65"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(bin())
        .args(["stats", "--pin-dir", "/nonexistent/slotring"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
}

#[test]
fn a_data_file_truncated_during_the_run_is_counted_and_fails_the_run() {
    let dir = data_dir();
    let run = spawn_served(
        run_cmd(
            dir.path(),
            &[
                "--duration",
                "2s",
                "--json",
                "--max-local-read-bandwidth",
                "0",
            ],
        )
        .stdout(Stdio::piped()),
    );
    let path = data_file_of(&run.stderr_so_far());
    wait_for_queries(run.addr);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let body = wait_for_metrics(run.addr, "slotring_run_short_reads_total");
    let shorts = |text: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix("slotring_run_short_reads_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let start = Instant::now();
    let mut body = body;
    while shorts(&body) == 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        if let Ok((200, b)) = http_get(run.addr, "/metrics") {
            body = b;
        }
    }
    assert!(shorts(&body) > 0, "{body}");
    let out = run.finish(Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&path.display().to_string()) && err.contains("truncated"),
        "{err}"
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("the report, as JSON");
    assert!(r["io"]["short_reads"].as_u64().unwrap() > 0, "{}", r["io"]);
    assert_eq!(r["io"]["read_errors"], 0, "{}", r["io"]);
}

#[test]
fn stats_without_permission_says_so() {
    if !is_root() || !have("setpriv") {
        skip_unless_ci("needs root and setpriv (util-linux) to run as an unprivileged user");
        return;
    }
    let bin_dir = tempfile::Builder::new()
        .prefix("slotring-bin")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap();
    };
    mode(bin_dir.path(), 0o755);
    let bin_copy = bin_dir.path().join("slotring");
    std::fs::copy(bin(), &bin_copy).unwrap();
    mode(&bin_copy, 0o755);
    // A pin directory only root may look into (as the loader makes it).
    let pins = data_dir();
    std::fs::write(pins.path().join("slots"), "").unwrap();
    mode(pins.path(), 0o700);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["--inh-caps=-all", "--bounding-set=-all", "--"])
        .arg(&bin_copy)
        .args(["stats", "--interval", "0.1s", "--pin-dir"])
        .arg(pins.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(!err.contains("is a process"), "{err}");
}

// ---- Every command stops on the first signal; no wait is unbounded ----

/// A child whose stderr goes to a file (read while it runs), stdout piped.
struct Logged {
    child: Reap,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Logged {
    fn spawn(cmd: &mut Command) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stderr");
        let err = std::fs::File::create(&log).unwrap();
        let child = Reap(cmd.stderr(err).stdout(Stdio::piped()).spawn().unwrap());
        Self {
            child,
            log,
            _dir: dir,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait until stderr contains `what` (at most 60 s).
    fn wait_for(&self, what: &str) -> String {
        let t = Instant::now();
        loop {
            let err = self.stderr();
            if err.contains(what) {
                return err;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "no `{what}` on stderr within 60 s:\n{err}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.0.id() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }

    /// Wait for the exit (killing it after `limit`): the output, stderr
    /// included.
    fn finish(mut self, limit: Duration) -> Output {
        let mut out = wait_output(&mut self.child.0, limit);
        out.stderr = self.stderr().into_bytes();
        out
    }
}

/// `run` with no probes, `/metrics` at `listen` (empty: none), data in
/// `dir`, creating a 1 MiB data file under a write limit of `rate`.
fn slow_creation(dir: &Path, rate: &str, listen: &str) -> Command {
    let mut c = Command::new(bin());
    c.args(["run", "--file-size", "1MiB", "--duration", "1s"])
        .args(["--no-progress", "--no-probes", "--listen", listen])
        .args(["--max-local-write-bandwidth", rate])
        .arg("--dir")
        .arg(dir);
    c
}

#[test]
fn the_first_ctrl_c_stops_a_data_file_paced_at_one_byte_per_second() {
    // At 1 byte/s the 1 MiB file would take about 12 days, and at 64 KiB/s
    // 16 s: the first signal ends either at once, removing the file.
    for (rate, sig) in [
        ("1", nix::sys::signal::Signal::SIGINT),
        ("64KiB", nix::sys::signal::Signal::SIGTERM),
    ] {
        let dir = data_dir();
        let run = Logged::spawn(&mut slow_creation(dir.path(), rate, ""));
        let err = run.wait_for("slotring: data file ");
        let data = data_file_of(&err);
        // Into the paced write: its first pieces are booked and waiting.
        std::thread::sleep(Duration::from_millis(1500));
        assert!(data.exists(), "{err}");
        run.signal(sig);
        let out = run.finish(Duration::from_secs(20));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{rate}: {err}");
        assert!(
            err.contains("interrupted") && !err.contains("again, aborted"),
            "{rate}: the first signal did it: {err}"
        );
        assert!(!data.exists(), "{rate}: data file left: {err}");
        assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
    }
}

#[test]
fn metrics_are_served_while_the_data_file_is_written() {
    let dir = data_dir();
    // 1 MiB at 64 KiB/s: 16 s of paced writing, watched from the start.
    let run = spawn_served(slow_creation(dir.path(), "64KiB", "127.0.0.1:0").stdout(Stdio::null()));
    let line = "slotring_throttler_bytes_total{throttler=\"local_write\"}";
    let t = Instant::now();
    let written = loop {
        let body = wait_for_metrics(run.addr, line);
        let v: f64 = body
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0);
        if v > 0.0 {
            break v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "local_write never charged: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        written < f64::from(1 << 20),
        "scraped while the file was still being written: {written}"
    );
    run.interrupt();
}

/// Send `request`, half-close the connection (`shutdown(SHUT_WR)`, as
/// `nc -N` does), and read the whole answer.
fn half_closed_request(addr: SocketAddr, request: &str) -> String {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// A GET and a HEAD of `/metrics`, each followed by a half-close, get the
/// same answer as without it.
fn half_closing_clients_are_answered(addr: SocketAddr, must_contain: &str) {
    let full = wait_for_metrics(addr, must_contain);
    let get = half_closed_request(addr, "GET /metrics HTTP/1.0\r\n\r\n");
    assert!(get.starts_with("HTTP/1.0 200"), "GET got: {get:?}");
    assert!(get.contains(must_contain), "{get}");
    let len: usize = header(&get, "content-length").unwrap().parse().unwrap();
    assert!(
        len > full.len() / 2,
        "{len} bytes, a full scrape {}",
        full.len()
    );
    let head = half_closed_request(addr, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "HEAD got: {head:?}");
    assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head}");
}

#[test]
fn half_closing_clients_get_their_metrics() {
    let dir = data_dir();
    let root = pin_dir("halfclose");
    let run = spawn_run(&root, dir.path(), "60s");
    half_closing_clients_are_answered(run.addr, "slotring_slots_in_use");
    if probes_possible("the exporter part of the half-close test") {
        wait_for_pins(&root, run.child.0.id());
        let exporter = exporter_on(&root);
        half_closing_clients_are_answered(exporter.addr, "slotring_slots_granted_total{");
        drop(exporter);
    }
    run.interrupt();
}

#[test]
fn a_kept_data_file_is_not_said_to_be_removed_on_abort() {
    let dir = data_dir();
    let cfg = dir.path().join("keep.toml");
    std::fs::write(&cfg, "keep = \"yes\"\n").unwrap();
    let run = spawn_served(
        run_cmd(
            dir.path(),
            &["--duration", "60s", "--max-local-read-bandwidth", "1"],
        )
        .arg("--config")
        .arg(&cfg)
        .stdout(Stdio::null()),
    );
    let data = data_file_of(&run.stderr_so_far());
    wait_for_queries(run.addr);
    let pid = nix::unistd::Pid::from_raw(run.child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let t = Instant::now();
    while !run.stderr_so_far().contains("SIGTERM, stopping") {
        assert!(t.elapsed() < Duration::from_secs(30), "first SIGTERM lost");
        std::thread::sleep(Duration::from_millis(1));
    }
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = run.finish(Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    // Either signal may have ended it (the first one stops the run within
    // 200 ms); if the second did, its line says what it did.
    if err.contains("again, aborted") {
        assert!(
            err.contains(&format!("data file {} kept", data.display())),
            "{err}"
        );
    }
    assert!(!err.contains("removed"), "{err}");
    assert!(data.exists(), "the kept data file is gone: {err}");
    std::fs::remove_file(&data).unwrap();
}

#[test]
fn a_config_file_must_be_a_small_regular_file() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("fifo.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let big = d.path().join("big.toml");
    std::fs::write(&big, format!("# {}\n", "x".repeat(2 << 20))).unwrap();
    for (path, says) in [
        (Path::new("/dev/zero"), "a character device"),
        (fifo.as_path(), "a FIFO"),
        (d.path(), "a directory"),
        (big.as_path(), "more than the 1048576"),
    ] {
        // Memory and time bounded: a reader that does not check would read
        // /dev/zero until it was killed.
        let script = format!(
            "ulimit -v 4000000; exec {} run --config {} --no-probes --listen ''",
            bin(),
            path.display()
        );
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_output(&mut child, Duration::from_secs(20));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", path.display());
        assert!(
            err.contains(&format!("config file {}", path.display())) && err.contains(says),
            "{err}"
        );
    }
}

#[test]
fn a_run_killed_with_kill_9_leaves_a_data_file_that_the_next_run_removes() {
    let dir = data_dir();
    // Killed while its data file is paced at 64 KiB/s.
    let run = Logged::spawn(&mut slow_creation(dir.path(), "64KiB", ""));
    let killed = data_file_of(&run.wait_for("slotring: data file "));
    let mut child = run.child;
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    assert!(killed.exists(), "kill -9 cleans nothing up");

    // Names of dead runs that are not what a dead run created: a symbolic
    // link, a file with two links, one with another mode; and the names of
    // runs that live (this process; a live pid with the right start time).
    let dead = {
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    };
    let me = std::process::id();
    let my_start = std::fs::read_to_string("/proc/self/stat").unwrap();
    let my_start = my_start[my_start.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .to_owned();
    let at = |name: String| dir.path().join(name);
    let decoy = std::fs::File::create(dir.path().join("decoy")).unwrap();
    drop(decoy);
    let link = at(format!("slotring-data-{dead}.1.bin"));
    std::os::unix::fs::symlink(dir.path().join("decoy"), &link).unwrap();
    let linked = at(format!("slotring-data-{dead}.2.bin"));
    std::fs::hard_link(dir.path().join("decoy"), &linked).unwrap();
    let open_mode = at(format!("slotring-data-{dead}.3.bin"));
    std::fs::write(&open_mode, "not a run's\n").unwrap();
    let live = at(format!("slotring-data-{me}.{my_start}.bin"));
    std::fs::write(&live, "live\n").unwrap();
    let other_name = at(format!("slotring-data-{dead}.bin"));
    std::fs::write(&other_name, "an older name\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    for p in [&live, &other_name] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    // A file exactly as a dead run creates it, of a pid now reused (this
    // process, another start time): provably dead, removed.
    let reused = at(format!("slotring-data-{me}.1-2.bin"));
    std::fs::write(&reused, "").unwrap();
    std::fs::set_permissions(&reused, std::fs::Permissions::from_mode(0o600)).unwrap();

    let out = Command::new(bin())
        .args(["run", "--file-size", "1MiB", "--duration", "0.2s"])
        .args(["--no-progress", "--no-probes", "--listen", ""])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    for gone in [&killed, &reused] {
        assert!(
            err.contains(&format!("removed stale data file {}", gone.display())),
            "{err}"
        );
        assert!(!gone.exists(), "{}", gone.display());
    }
    for kept in [&link, &linked, &open_mode, &live, &other_name] {
        assert!(
            std::fs::symlink_metadata(kept).is_ok(),
            "{} was removed: {err}",
            kept.display()
        );
    }
    for said in [
        format!("leaving {}: ", link.display()),
        format!("leaving {}: ", linked.display()),
        format!("leaving {}: ", open_mode.display()),
    ] {
        assert!(err.contains(&said), "no `{said}` in: {err}");
    }
    assert!(std::fs::read_to_string(dir.path().join("decoy")).is_ok());
}

#[test]
fn doubtful_values_exit_2_naming_the_option() {
    let dir = data_dir();
    let check = |out: Output, says: &[&str]| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{err}");
        for s in says {
            assert!(err.contains(s), "no `{s}` in: {err}");
        }
    };
    // A relative pin root, for every command that takes one.
    check(
        run_cmd(dir.path(), &["--pin-dir", "relpins"])
            .output()
            .unwrap(),
        &["--pin-dir", "`relpins`", "absolute"],
    );
    for cmd in [&["stats"][..], &["exporter"], &["verify", "--pid", "1"]] {
        let out = Command::new(bin())
            .args(cmd)
            .args(["--pin-dir", "relpins"])
            .output()
            .unwrap();
        check(out, &["--pin-dir", "relpins"]);
    }
    // A fractional byte rate, from the file and the command line.
    let cfg = dir.path().join("frac.toml");
    std::fs::write(&cfg, "max_local_read_bandwidth = 1.5\n").unwrap();
    let out = run_cmd(dir.path(), &["--duration", "0.2s"])
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    check(
        out,
        &["--max-local-read-bandwidth", "`1.5`", "frac.toml", "whole"],
    );
    check(
        run_cmd(dir.path(), &["--max-local-write-bandwidth", "0.3KiB"])
            .output()
            .unwrap(),
        &["--max-local-write-bandwidth", "`0.3KiB`"],
    );
    // A plot where no file can be made, refused before the run.
    let out = run_cmd(dir.path(), &["--duration", "20s", "--plot", "/proc/x.svg"])
        .output()
        .unwrap();
    check(out, &["--plot", "/proc/x.svg"]);
    // A window longer than an hour (as `run --duration`).
    let out = Command::new(bin())
        .args(["verify", "--pid", "1", "--window", "99999999999h"])
        .output()
        .unwrap();
    check(out, &["--window", "99999999999h"]);
    assert!(entries(dir.path()).iter().all(|e| e.ends_with(".toml")));
}

/// `slotring verify --pid PID` on the pins under `root`, watching for
/// `window`.
fn spawn_verify(root: &Path, pid: u32, window: &str) -> Logged {
    Logged::spawn(
        Command::new(bin())
            .args(["verify", "--pid", &pid.to_string(), "--window", window])
            .arg("--pin-dir")
            .arg(root),
    )
}

/// A 60 s `run` with probes whose queries run, pinning under a root of its
/// own (`tag`); its data directory and pin root with it.
fn live_run(tag: &str) -> (tempfile::TempDir, PathBuf, Served) {
    let data = data_dir();
    let root = pin_dir(tag);
    let run = spawn_run(&root, data.path(), "60s");
    wait_for_pins(&root, run.child.0.id());
    wait_for_queries(run.addr);
    (data, root, run)
}

#[test]
fn verify_stops_on_the_first_signal_and_when_its_target_exits() {
    if !probes_possible("the verify signal test") {
        return;
    }
    let (_data, root, run) = live_run("verifysig");
    let pid = run.child.0.id();
    // The first SIGINT or SIGTERM ends a 30 s window with the verdict on
    // the time watched so far.
    for sig in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
    ] {
        let verify = spawn_verify(&root, pid, "30s");
        verify.wait_for("watching");
        std::thread::sleep(Duration::from_millis(500));
        verify.signal(sig);
        let out = verify.finish(Duration::from_secs(10));
        let (text, err) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(130), "{sig}: {text}{err}");
        assert!(text.contains("verdict: "), "{sig}: {text}");
        assert!(err.contains("interrupted"), "{sig}: {err}");
        assert!(!err.contains("removed"), "{sig}: {err}");
    }
    // An hour-long window ends when its target does.
    let verify = spawn_verify(&root, pid, "1h");
    verify.wait_for("watching");
    run.interrupt();
    let out = verify.finish(Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains(&format!("process {pid} exited")), "{err}");
}

/// Exit code 130 for every command on its first signal: `exporter`
/// (SIGTERM), and, on a live instance, `stats --watch`, `verify` and `run`
/// itself (SIGINT).
#[test]
fn every_command_exits_130_on_its_first_signal() {
    let exporter = spawn_exporter();
    wait_for_metrics(exporter.addr, "slotring_exporter_up");
    let pid = nix::unistd::Pid::from_raw(exporter.child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = exporter.finish(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(130));
    if !probes_possible("stats --watch on a live instance") {
        return;
    }
    let (_data, root, run) = live_run("watch");
    let watch = Logged::spawn(
        Command::new(bin())
            .args(["stats", "--watch", "--interval", "200ms", "--pin-dir"])
            .arg(&root),
    );
    // A few tables, then the signal while it waits for the next.
    std::thread::sleep(Duration::from_millis(1000));
    watch.signal(nix::sys::signal::Signal::SIGINT);
    let out = watch.finish(Duration::from_secs(10));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(130),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("local_read"),
        "it showed the instance: {text}"
    );
    let verify = spawn_verify(&root, run.child.0.id(), "1h");
    verify.wait_for("watching");
    verify.signal(nix::sys::signal::Signal::SIGINT);
    assert_eq!(
        verify.finish(Duration::from_secs(10)).status.code(),
        Some(130)
    );
    run.interrupt();
}
