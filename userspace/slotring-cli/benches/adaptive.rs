//! `cargo xtask bench adaptive`: the static CPU slot budget (2 × cores)
//! against the adaptive one, side by side, on three workloads. Writes
//! `target/bench/adaptive.json`.
//!
//! * (a) `_cpu`: three CPU-bound scans (no throttle; each an allocation of
//!   up to 2 × cores slots, one thread per slot, releasing every 10 ms and
//!   checkpointing `should_yield` every unit of work) plus short queries (a
//!   pool of 4 threads, one query each per 20 ms: 10 units of work on a
//!   non-competing slot; latency from its scheduled start).
//! * (b) `_hog`: the same, with `stress-ng --cpu 2×cores` started after 3 s
//!   and stopped 6 s later; keys are measured over the hog's 6 s;
//!   `adapt_settle_s` is the longer of the two settling times (after the
//!   start, after the stop). Run twice: the hog in the workload's cgroup,
//!   and in a sibling cgroup of its own (`…_own_cgroup`).
//! * (c) `_io`: `slotring run` (the IO-bound default workload) with
//!   `--adaptive-budget` and `--no-adaptive-budget`.
//!
//! A unit of CPU work is a fixed loop (`UNIT_ITERS` iterations). Runs as
//! root (probes, cgroups). The whole bench runs in a cpu cgroup of its own
//! with a large weight, so the other work on a shared machine disturbs it
//! less; that cgroup's children hold the workload and, for the "own cgroup"
//! variant, the hog.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use slotring::bpf::{AdaptiveBudget, BpfConfig, BudgetPoint, RunqProbe, SlotringBpf};
use slotring::slots::{AdaptiveConfig, ConcurrencyControl, SlotsError};
use slotring_benchkit::{Report, median, percentile};

const UNIT_ITERS: u64 = 50_000;
const SCANS: usize = 3;
const SHORT_THREADS: usize = 4;
const SHORT_EVERY: Duration = Duration::from_millis(20);
const SHORT_UNITS: u64 = 10;
const QUANTUM: Duration = Duration::from_millis(10);
const WINDOW: Duration = Duration::from_millis(100);

fn unit() {
    let mut x = 0x9e37_79b9_u64;
    for _ in 0..UNIT_ITERS {
        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
    }
}

// ---- cgroups -------------------------------------------------------------

/// A cpu cgroup directory, removed (after moving its tasks to `parent`) on drop.
struct Cg {
    dir: PathBuf,
    parent: PathBuf,
}

impl Cg {
    fn new(parent: &Path, name: &str, knob: &str, weight: &str) -> std::io::Result<Self> {
        let dir = parent.join(name);
        std::fs::create_dir(&dir)?;
        let cg = Cg {
            dir,
            parent: parent.to_path_buf(),
        };
        std::fs::write(cg.dir.join(knob), weight)?;
        Ok(cg)
    }
    fn enter(&self, pid: u32) -> std::io::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
    }
}

impl Drop for Cg {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for p in procs.lines() {
                let _ = std::fs::write(self.parent.join("cgroup.procs"), p);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The cgroup layout: `top` (large weight) with `work` and `hog` children
/// of equal weight. The process runs in `work`.
struct Cgroups {
    work: Cg,
    hog: Cg,
    _top: Cg,
    note: String,
}

fn cgroups() -> Result<Cgroups, String> {
    let fs = |p: &str| {
        nix::sys::statfs::statfs(p)
            .map(|s| s.filesystem_type())
            .map_err(|e| format!("{p}: {e}"))
    };
    let v2 = fs("/sys/fs/cgroup")? == nix::sys::statfs::CGROUP2_SUPER_MAGIC;
    let (root, knob, big, equal, note) = if v2
        && std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "cpu"))
    {
        let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpu");
        (
            PathBuf::from("/sys/fs/cgroup"),
            "cpu.weight",
            "10000",
            "100",
            "cgroup v2 (cpu.weight)".to_string(),
        )
    } else {
        let why = if v2 {
            "/sys/fs/cgroup is cgroup2 without the cpu controller".to_string()
        } else {
            let unified = std::fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers")
                .map(|c| {
                    format!(
                        "cgroup2 at /sys/fs/cgroup/unified has controllers [{}]",
                        c.trim()
                    )
                })
                .unwrap_or_else(|_| "no cgroup2 mount".into());
            format!("/sys/fs/cgroup is not cgroup2 (v1 hierarchies; {unified})")
        };
        let v1 = PathBuf::from("/sys/fs/cgroup/cpu");
        if !v1.join("cpu.shares").exists() {
            return Err(format!("{why}; no v1 cpu controller either"));
        }
        (
            v1,
            "cpu.shares",
            "262144",
            "1024",
            format!(
                "{why}: used the v1 cpu controller (cpu.shares), the same CFS group scheduling"
            ),
        )
    };
    let pid = std::process::id();
    let err = |e: std::io::Error| format!("{}: {e}", root.display());
    let top = Cg::new(&root, &format!("slotring-bench-{pid}"), knob, big).map_err(err)?;
    let work = Cg::new(&top.dir, "work", knob, equal).map_err(err)?;
    let hog = Cg::new(&top.dir, "hog", knob, equal).map_err(err)?;
    work.enter(pid).map_err(err)?;
    Ok(Cgroups {
        work,
        hog,
        _top: top,
        note,
    })
}

/// `stress-ng --cpu n`, started inside `cg` (moved before it execs).
fn hog(n: usize, cg: &Path) -> Child {
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec stress-ng --cpu {n} --timeout 60s --quiet",
        cg.display()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("stress-ng (apt-get install stress-ng)")
}

// ---- workloads (a) and (b) ---------------------------------------------

#[derive(Debug, Default)]
struct Phase {
    short_ms: Vec<f64>,
    units: u64,
    secs: f64,
    runq_ns: u64,
    on_cpu_ns: u64,
}

impl Phase {
    fn p99(&mut self) -> f64 {
        percentile(&mut self.short_ms, 99.0)
    }
    fn p50(&mut self) -> f64 {
        percentile(&mut self.short_ms, 50.0)
    }
    fn work_per_s(&self) -> f64 {
        self.units as f64 / self.secs
    }
    fn share_pct(&self) -> f64 {
        let t = self.runq_ns + self.on_cpu_ns;
        if t == 0 {
            0.0
        } else {
            self.runq_ns as f64 * 100.0 / t as f64
        }
    }
}

struct CpuRun {
    phases: Vec<Phase>,
    history: Vec<BudgetPoint>,
    yields: u64,
    /// `(seconds since the loop started)` of each phase boundary.
    marks: Vec<f64>,
}

struct Shared {
    stop: AtomicBool,
    units: AtomicU64,
    short: Mutex<Vec<(Instant, f64)>>,
}

fn scan_thread(sh: Arc<Shared>, alloc: Arc<slotring::slots::Allocation>, max: Arc<AtomicU64>) {
    while !sh.stop.load(Ordering::Relaxed) {
        let mut slot = match alloc.acquire_timeout(Duration::from_millis(100)) {
            Ok(s) => s,
            Err(SlotsError::Timeout { .. }) => continue,
            Err(_) => break,
        };
        let mut yielded = false;
        {
            let lease = slot.make_current();
            let t = Instant::now();
            while t.elapsed() < QUANTUM && !sh.stop.load(Ordering::Relaxed) {
                unit();
                sh.units.fetch_add(1, Ordering::Relaxed);
                if lease.should_yield() {
                    yielded = true;
                    break;
                }
            }
        }
        drop(slot);
        // A yield re-requests the slot by itself; a quantum asks for one more.
        if !yielded {
            let m = max.fetch_add(1, Ordering::Relaxed) + 1;
            if alloc.set_max(m).is_err() {
                break;
            }
        }
    }
}

fn short_thread(sh: Arc<Shared>, cc: ConcurrencyControl, offset: Duration) {
    let mut next = Instant::now() + offset;
    while !sh.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        let start = next;
        next += SHORT_EVERY * SHORT_THREADS as u32;
        let Ok(alloc) = cc.allocate(1, 1) else { break };
        let Ok(mut slot) = alloc.acquire_timeout(Duration::from_secs(5)) else {
            continue;
        };
        {
            let _lease = slot.make_current();
            for _ in 0..SHORT_UNITS {
                unit();
            }
        }
        drop(slot);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        sh.short.lock().unwrap().push((Instant::now(), ms));
    }
}

/// Run (a)/(b) once. `events` are the phase boundaries in seconds; at each
/// boundary `on_event(i)` runs (starting/stopping the hog).
fn cpu_run(
    bpf: &SlotringBpf,
    adaptive: bool,
    events: &[f64],
    mut on_event: impl FnMut(usize),
) -> CpuRun {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ceiling = 2 * cores as u64;
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(ceiling);
    let sh = Arc::new(Shared {
        stop: AtomicBool::new(false),
        units: AtomicU64::new(0),
        short: Mutex::new(Vec::new()),
    });
    let mut threads = Vec::new();
    for _ in 0..SCANS {
        let alloc = Arc::new(cc.allocate(0, ceiling).unwrap());
        let max = Arc::new(AtomicU64::new(ceiling));
        for _ in 0..ceiling {
            let (sh, alloc, max) = (sh.clone(), alloc.clone(), max.clone());
            threads.push(std::thread::spawn(move || scan_thread(sh, alloc, max)));
        }
    }
    for i in 0..SHORT_THREADS {
        let (sh, cc) = (sh.clone(), cc.clone());
        let off = SHORT_EVERY * i as u32;
        threads.push(std::thread::spawn(move || short_thread(sh, cc, off)));
    }
    let mut ab = adaptive.then(|| {
        AdaptiveBudget::start(
            cc.clone(),
            bpf.runq_probe(),
            AdaptiveConfig::with_ceiling(ceiling),
            WINDOW,
        )
        .unwrap()
    });
    let mut probe: RunqProbe = bpf.runq_probe();
    let _ = probe.sample();
    let t0 = Instant::now();
    let mut phases = Vec::new();
    let mut marks = Vec::new();
    let mut prev = (t0, sh.units.load(Ordering::Relaxed));
    for (i, &at) in events.iter().enumerate() {
        let due = t0 + Duration::from_secs_f64(at);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let now = Instant::now();
        let units = sh.units.load(Ordering::Relaxed);
        let (runq_ns, on_cpu_ns) = probe.sample().unwrap_or_default();
        let short_ms = sh
            .short
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| *t > prev.0 && *t <= now)
            .map(|&(_, ms)| ms)
            .collect();
        phases.push(Phase {
            short_ms,
            units: units - prev.1,
            secs: (now - prev.0).as_secs_f64(),
            runq_ns,
            on_cpu_ns,
        });
        marks.push(now.duration_since(t0).as_secs_f64());
        prev = (now, units);
        on_event(i);
    }
    sh.stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let (history, yields) = match ab.as_mut() {
        Some(ab) => {
            ab.stop();
            (ab.history(), cc.counters().yields)
        }
        None => (Vec::new(), cc.counters().yields),
    };
    CpuRun {
        phases,
        history,
        yields,
        marks,
    }
}

fn trace(h: &[BudgetPoint]) -> String {
    h.iter()
        .map(|p| format!("{}/{:.0}", p.budget, p.runq_share_pct))
        .collect::<Vec<_>>()
        .join(" ")
}

fn budget_mean(h: &[BudgetPoint], from: f64, to: f64) -> f64 {
    let v: Vec<f64> = h
        .iter()
        .filter(|p| p.t_s > from && p.t_s <= to)
        .map(|p| p.budget as f64)
        .collect();
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Seconds after `from` until the budget stays within one slot of its
/// median over the last second before `to`.
fn settle(h: &[BudgetPoint], from: f64, to: f64) -> f64 {
    let mut tail: Vec<f64> = h
        .iter()
        .filter(|p| p.t_s > to - 1.0 && p.t_s <= to)
        .map(|p| p.budget as f64)
        .collect();
    let level = median(&mut tail);
    let pts: Vec<&BudgetPoint> = h.iter().filter(|p| p.t_s > from && p.t_s <= to).collect();
    let last_out = pts
        .iter()
        .rposition(|p| (p.budget as f64 - level).abs() > 1.0);
    match last_out {
        None => pts.first().map_or(f64::NAN, |p| p.t_s - from),
        Some(i) => pts.get(i + 1).map_or(to - from, |p| p.t_s - from),
    }
}

// ---- workload (c) ----------------------------------------------------------

fn slotring_run(adaptive: bool) -> Value {
    let pins = format!(
        "/sys/fs/bpf/slotring-bench-adaptive-{}-{adaptive}",
        std::process::id()
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_slotring"));
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

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn main() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cg = match cgroups() {
        Ok(c) => Some(c),
        Err(why) => {
            eprintln!("adaptive bench: no cgroups ({why}); running in the caller's cgroup");
            None
        }
    };
    let bpf = SlotringBpf::load(BpfConfig {
        pin_dir: PathBuf::from(format!("/sys/fs/bpf/slotring-bench-{}", std::process::id())),
        ..BpfConfig::default()
    })
    .expect("the adaptive bench needs the probes (run as root)");
    slotring::bpf::install_observer();
    let mut report = Report::new("adaptive");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cg_note = cg.as_ref().map_or("none".into(), |c| c.note.clone());

    // (a) CPU-bound scans + short queries, 8 s each.
    let mut a = [false, true].map(|adaptive| cpu_run(&bpf, adaptive, &[8.0], |_| {}));
    let [s, ad] = &mut a;
    eprintln!(
        "(a) adaptive, budget/run-queue % per window: {}",
        trace(&ad.history)
    );
    let (sp, ap) = (&mut s.phases[0], &mut ad.phases[0]);
    let note = |w: &str| format!("{w}; {} cores, ceiling {}", cores, 2 * cores);
    let p50s = format!("(a) static, 8 s; p50 {:.2} ms", sp.p50());
    let p50a = format!("(a) adaptive; p50 {:.2} ms", ap.p50());
    report.put("static_short_p99_ms_cpu", sp.p99(), &note(&p50s));
    report.put("adapt_short_p99_ms_cpu", ap.p99(), &note(&p50a));
    report.put(
        "static_runq_share_pct_cpu",
        sp.share_pct(),
        "(a) static: run-queue / (run-queue + on-CPU) of running leases",
    );
    report.put("adapt_runq_share_pct_cpu", ap.share_pct(), "(a) adaptive");
    report.put(
        "static_work_per_s_cpu",
        sp.work_per_s(),
        &format!("(a) static: units of CPU work ({UNIT_ITERS} iterations) per s"),
    );
    report.put("adapt_work_per_s_cpu", ap.work_per_s(), "(a) adaptive");
    report.put(
        "adapt_budget_mean_cpu",
        budget_mean(&ad.history, 0.0, 8.0),
        "(a) mean effective budget",
    );
    report.put(
        "adapt_yields_cpu",
        ad.yields as f64,
        "(a) slots released by should_yield",
    );

    // (b) the hog: 3 s without, 6 s with, 3 s without.
    let events = [3.0, 9.0, 12.0];
    let hog_run = |adaptive: bool, own: bool| {
        let mut h: Option<Child> = None;
        let r = cpu_run(&bpf, adaptive, &events, |i| match i {
            0 => {
                let dir = match (&cg, own) {
                    (Some(c), true) => c.hog.dir.clone(),
                    (Some(c), false) => c.work.dir.clone(),
                    (None, _) => PathBuf::from("/sys/fs/cgroup/cpu"),
                };
                h = Some(hog(2 * cores, &dir));
            }
            1 => {
                if let Some(mut c) = h.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            _ => {}
        });
        if let Some(mut c) = h {
            let _ = c.kill();
            let _ = c.wait();
        }
        r
    };
    let mut hs = hog_run(false, false);
    let mut ha = hog_run(true, false);
    eprintln!(
        "(b) adaptive, budget/run-queue % per window: {}",
        trace(&ha.history)
    );
    let (sp, ap) = (&mut hs.phases[1], &mut ha.phases[1]);
    let hog_note = format!(
        "(b) during the 6 s of stress-ng --cpu {} in the workload's cgroup",
        2 * cores
    );
    let p50a = format!("(b) adaptive, same cgroup; p50 {:.2} ms", ap.p50());
    let hog_note = format!("{hog_note}; p50 {:.2} ms", sp.p50());
    report.put("static_short_p99_ms_hog", sp.p99(), &hog_note);
    report.put("adapt_short_p99_ms_hog", ap.p99(), &p50a);
    report.put("static_runq_share_pct_hog", sp.share_pct(), "(b) static");
    report.put("adapt_runq_share_pct_hog", ap.share_pct(), "(b) adaptive");
    report.put(
        "static_work_per_s_hog",
        sp.work_per_s(),
        "(b) static, hog in the same cgroup",
    );
    report.put(
        "adapt_work_per_s_hog",
        ap.work_per_s(),
        "(b) adaptive, hog in the same cgroup",
    );
    let (m0, m1, m2) = (ha.marks[0], ha.marks[1], ha.marks[2]);
    let (s_on, s_off) = (settle(&ha.history, m0, m1), settle(&ha.history, m1, m2));
    report.put(
        "adapt_settle_s",
        s_on.max(s_off),
        &format!("(b) after the hog starts {s_on:.1} s, after it stops {s_off:.1} s (within one slot of the phase's final median)"),
    );
    report.put(
        "adapt_budget_mean_hog",
        budget_mean(&ha.history, m0, m1),
        "(b) mean budget during the hog",
    );
    report.put(
        "adapt_yields_hog",
        ha.yields as f64,
        "(b) over the whole 12 s",
    );
    if cg.is_some() {
        let mut os = hog_run(false, true);
        let mut oa = hog_run(true, true);
        let (sp, ap) = (&mut os.phases[1], &mut oa.phases[1]);
        report.put(
            "static_work_per_s_hog_own_cgroup",
            sp.work_per_s(),
            "(b) static, hog in a sibling cgroup of equal weight",
        );
        report.put(
            "adapt_work_per_s_hog_own_cgroup",
            ap.work_per_s(),
            "(b) adaptive, hog in a sibling cgroup",
        );
        report.put(
            "static_short_p99_ms_hog_own_cgroup",
            sp.p99(),
            "(b) static, own cgroup",
        );
        report.put(
            "adapt_short_p99_ms_hog_own_cgroup",
            ap.p99(),
            "(b) adaptive, own cgroup",
        );
        report.put(
            "static_runq_share_pct_hog_own_cgroup",
            sp.share_pct(),
            "(b) static, own cgroup",
        );
        report.put(
            "adapt_runq_share_pct_hog_own_cgroup",
            ap.share_pct(),
            "(b) adaptive, own cgroup",
        );
    }

    // (c) `slotring run`, IO-bound.
    drop(bpf);
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
    eprintln!("machine: load average {}; cgroups: {cg_note}", load.trim());
    drop(cg);
    report.finish().expect("writing target/bench/adaptive.json");
}
