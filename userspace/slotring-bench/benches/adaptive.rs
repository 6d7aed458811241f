//! `cargo xtask bench adaptive`: the static CPU slot budget (2 × cores)
//! against the adaptive one, side by side, on three workloads. Writes
//! `target/bench/adaptive.json`.
//!
//! * (a) `_cpu`: three CPU-bound scans (no throttle; each an allocation of
//!   up to 2 × cores slots, one thread per slot, releasing every 10 ms and
//!   calling the lease's `checkpoint` every unit of work: `should_yield`,
//!   and a CPU yield once a millisecond) plus short queries (a
//!   pool of 4 threads, one query each per 20 ms: 10 units of work on a
//!   non-competing slot; latency from its scheduled start). Four rounds of
//!   4 s each of the static budget, a static budget of the cores (context:
//!   `cores_work_per_s_cpu`, the best any budget does without a loop) and
//!   the adaptive one, interleaved so other work on the machine meets all
//!   three alike. The notes say how many CPUs the bench process got and
//!   how many the machine left idle, and the budget's time at each level.
//! * (b) `_hog`: the same, with `stress-ng --cpu 2×cores` started after 3 s
//!   and stopped 6 s later; keys are measured over the hog's 6 s;
//!   `adapt_settle_s` is the longer of the two settling times (after the
//!   start, after the stop). Run twice: the hog in the workload's cgroup,
//!   and in a sibling cgroup of its own (`…_own_cgroup`). Context keys
//!   `floor_*_hog`: the physical floor without slotring (one plain thread
//!   beside the hog: its run-queue share; the short queries alone beside
//!   it: their p99).
//! * (c) `_io`: `slotring run` (the IO-bound default workload) with
//!   `--adaptive-budget` and `--no-adaptive-budget`.
//!
//! `ADAPTIVE_BENCH_TRACE=1` prints a trace of every run of (a) and (b), one
//! line per 100 ms window (budget, slots in use, waiting allocations,
//! run-queue share of running leases, CPUs of the bench, idle CPUs of the
//! machine, work, grants, yields), and splits each short query's latency
//! into its wake-up (scheduled start until its thread ran), its on-CPU time
//! and the wait after it woke. `ADAPTIVE_BENCH_ONLY=a` stops after (a)
//! (no JSON).
//!
//! A unit of CPU work is a fixed loop (`UNIT_ITERS` iterations). Runs as
//! root (probes, cgroups). The whole bench runs in a cpu cgroup of its own
//! with a large weight, so the other work on a shared machine disturbs it
//! less; that cgroup's children hold the workload and, for the "own cgroup"
//! variant, the hog. Clean-up: stress-ng runs in a process group of its own
//! that a guard kills (also on a panic's unwind) and stops by itself after
//! 60 s; the cgroup directories are removed by guards, and a run killed
//! outright leaves directories that the next run removes.

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
/// Workload (a): interleaved rounds of each mode, seconds per run.
const A_ROUNDS: usize = 4;
const A_SECS: f64 = 4.0;

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

/// Remove what a bench killed outright (no unwind) left behind: the
/// `slotring-bench-<pid>` directories of processes that are gone, their
/// leftover tasks (a stress-ng that outlived it) killed first.
fn remove_stale(root: &Path) {
    let Ok(dir) = std::fs::read_dir(root) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("slotring-bench-") else {
            continue;
        };
        if Path::new("/proc").join(pid).exists() {
            continue;
        }
        let top = e.path();
        for leaf in ["work", "hog", ""] {
            let d = top.join(leaf);
            let tasks = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            for t in tasks.lines().filter_map(|t| t.parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(t),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(50));
            match std::fs::remove_dir(&d) {
                Ok(()) => eprintln!("adaptive bench: removed the stale cgroup {}", d.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => eprintln!("adaptive bench: stale cgroup {}: {e}", d.display()),
            }
        }
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
    remove_stale(&root);
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

/// `stress-ng --cpu n`, started inside `cg` (moved before it execs), in a
/// process group of its own. Dropping it (also on a panic's unwind) kills
/// the whole group, workers included, and waits until it is gone; stress-ng
/// also stops by itself after 60 s should the bench be killed outright.
struct Hog {
    child: Child,
}

fn hog(n: usize, cg: &Path) -> Hog {
    use std::os::unix::process::CommandExt;
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec stress-ng --cpu {n} --timeout 60s --quiet",
        cg.display()
    );
    let child = Command::new("sh")
        .args(["-c", &script])
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("stress-ng (apt-get install stress-ng)");
    Hog { child }
}

impl Drop for Hog {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, killpg};
        let pg = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = killpg(pg, Signal::SIGKILL);
        let _ = self.child.wait();
        // The workers are the group's other members: wait until none is left.
        let t = Instant::now();
        while killpg(pg, None).is_ok() && t.elapsed() < Duration::from_secs(5) {
            let _ = killpg(pg, Signal::SIGKILL);
            std::thread::sleep(Duration::from_millis(10));
        }
        if killpg(pg, None).is_ok() {
            eprintln!("adaptive bench: stress-ng process group {pg} survived SIGKILL for 5 s");
        }
    }
}

// ---- the physical floor of (b), without slotring -----------------------

/// On-CPU and run-queue ns of one thread of this process (`schedstat`).
fn schedstat(tid: nix::unistd::Pid) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .expect("schedstat (CONFIG_SCHED_INFO)");
    let mut it = s.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// What (b) allows at best, with no slotring and no scan: one plain
/// CPU-bound thread beside the hog (its run-queue share, from `schedstat`)
/// and then the short queries alone beside the hog (their p99).
fn physical_floor(hog_n: usize, cg: &Path) -> (f64, f64) {
    let _hog = hog(hog_n, cg);
    std::thread::sleep(Duration::from_millis(300));
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let tid = nix::unistd::gettid();
        let (c0, r0) = schedstat(tid);
        while !st.load(Ordering::Relaxed) {
            unit();
        }
        let (c1, r1) = schedstat(tid);
        let _ = tx.send((c1 - c0, r1 - r0));
    });
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let _ = t.join();
    let (cpu, rq) = rx.recv().unwrap_or((1, 0));
    let share = rq as f64 * 100.0 / (rq + cpu).max(1) as f64;
    let sh = Arc::new(Shared {
        stop: AtomicBool::new(false),
        units: AtomicU64::new(0),
        short: Mutex::new(Vec::new()),
        short_parts: Mutex::new(Vec::new()),
    });
    let threads: Vec<_> = (0..SHORT_THREADS)
        .map(|i| {
            let sh = sh.clone();
            let off = SHORT_EVERY * i as u32;
            std::thread::spawn(move || short_thread(sh, None, off))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(4));
    sh.stop.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|t| {
        let _ = t.join();
    });
    let mut ms: Vec<f64> = sh.short.lock().unwrap().iter().map(|&(_, m)| m).collect();
    (share, percentile(&mut ms, 99.0))
}

// ---- workloads (a) and (b) ---------------------------------------------

#[derive(Debug, Default)]
struct Phase {
    short_ms: Vec<f64>,
    units: u64,
    secs: f64,
    runq_ns: u64,
    on_cpu_ns: u64,
    /// CPU time of this process (all threads), s.
    proc_cpu_s: f64,
    /// Idle time of the machine (all CPUs), s.
    idle_s: f64,
}

/// CPU seconds of this process and idle seconds of the machine so far.
fn cpu_clock() -> (f64, f64) {
    let tick = 100.0; // USER_HZ
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; utime, stime are 14, 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let proc_s = (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / tick;
    let all = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let idle_s = all
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|x| x.parse::<f64>().ok())
        .unwrap_or(0.0)
        / tick;
    (proc_s, idle_s)
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
    /// "CPUs used by the bench, machine idle": where the CPU went.
    fn cpus(&self) -> String {
        format!(
            "bench process on {:.2} CPUs, machine idle {:.2} CPUs",
            self.proc_cpu_s / self.secs,
            self.idle_s / self.secs
        )
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
    /// Trace mode: per short query (on-CPU ms from waking to the end, ms
    /// from the scheduled start until its thread ran, latency ms).
    short_parts: Mutex<Vec<(f64, f64, f64)>>,
}

/// `ADAPTIVE_BENCH_TRACE=1`: print a per-window trace of every run of (a)
/// and (b) (budget, slots in use, waiting allocations, run-queue share of
/// running leases, CPUs of the bench and idle CPUs of the machine, work)
/// and split each short query's latency into run-queue wait and on-CPU.
fn tracing() -> bool {
    std::env::var_os("ADAPTIVE_BENCH_TRACE").is_some_and(|v| v == "1")
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
                // The lease's checkpoint: `should_yield`, and the CPU
                // given away once a millisecond (`CPU_YIELD_INTERVAL`).
                if lease.checkpoint() {
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

/// One short query every `SHORT_EVERY × SHORT_THREADS`, on a slot of its
/// own allocation (`cc`) or, for the physical floor, without slotring.
fn short_thread(sh: Arc<Shared>, cc: Option<ConcurrencyControl>, offset: Duration) {
    let mut next = Instant::now() + offset;
    while !sh.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        let start = next;
        next += SHORT_EVERY * SHORT_THREADS as u32;
        // Trace mode: (when the thread ran after its sleep, its CPU time then).
        let ss0 = tracing().then(|| (start.elapsed(), thread_cpu()));
        match &cc {
            Some(cc) => {
                let Ok(alloc) = cc.allocate(1, 1) else { break };
                let Ok(mut slot) = alloc.acquire_timeout(Duration::from_secs(5)) else {
                    continue;
                };
                let _lease = slot.make_current();
                for _ in 0..SHORT_UNITS {
                    unit();
                }
            }
            None => {
                for _ in 0..SHORT_UNITS {
                    unit();
                }
            }
        }
        let ms = start.elapsed().as_secs_f64() * 1e3;
        if let Some((woke, c0)) = ss0 {
            let cpu = (thread_cpu() - c0).as_secs_f64() * 1e3;
            sh.short_parts
                .lock()
                .unwrap()
                .push((cpu, woke.as_secs_f64() * 1e3, ms));
        }
        sh.short.lock().unwrap().push((Instant::now(), ms));
    }
}

/// The budget of a run of (a)/(b).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// 2 × cores, the static default.
    Static,
    /// Fixed at the cores (the best a budget can do on (a), without a loop).
    AtCores,
    /// The adaptive loop (ceiling 2 × cores).
    Adaptive,
}

/// Several phases as one (their sums; the short queries of all).
fn merge(ps: impl IntoIterator<Item = Phase>) -> Phase {
    ps.into_iter().fold(Phase::default(), |mut m, p| {
        m.short_ms.extend(p.short_ms);
        m.units += p.units;
        m.secs += p.secs;
        m.runq_ns += p.runq_ns;
        m.on_cpu_ns += p.on_cpu_ns;
        m.proc_cpu_s += p.proc_cpu_s;
        m.idle_s += p.idle_s;
        m
    })
}

/// Run (a)/(b) once. `events` are the phase boundaries in seconds; at each
/// boundary `on_event(i)` runs (starting/stopping the hog).
fn cpu_run(
    bpf: &SlotringBpf,
    mode: Mode,
    events: &[f64],
    mut on_event: impl FnMut(usize),
) -> CpuRun {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ceiling = 2 * cores as u64;
    let adaptive = mode == Mode::Adaptive;
    let cc = ConcurrencyControl::new();
    cc.set_max_concurrency(ceiling);
    if mode == Mode::AtCores {
        cc.set_effective_budget(cores as u64);
    }
    let sh = Arc::new(Shared {
        stop: AtomicBool::new(false),
        units: AtomicU64::new(0),
        short: Mutex::new(Vec::new()),
        short_parts: Mutex::new(Vec::new()),
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
        threads.push(std::thread::spawn(move || short_thread(sh, Some(cc), off)));
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
    let tracer = tracing().then(|| {
        let (sh, cc, mut probe) = (sh.clone(), cc.clone(), bpf.runq_probe());
        std::thread::spawn(move || window_trace(mode, &sh, &cc, &mut probe))
    });
    let mut probe: RunqProbe = bpf.runq_probe();
    let _ = probe.sample();
    let t0 = Instant::now();
    let mut phases = Vec::new();
    let mut marks = Vec::new();
    let mut prev = (t0, sh.units.load(Ordering::Relaxed));
    let mut clock = cpu_clock();
    for (i, &at) in events.iter().enumerate() {
        let due = t0 + Duration::from_secs_f64(at);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let now = Instant::now();
        let units = sh.units.load(Ordering::Relaxed);
        let (runq_ns, on_cpu_ns) = probe.sample().unwrap_or_default();
        let c = cpu_clock();
        let (proc_cpu_s, idle_s) = (c.0 - clock.0, c.1 - clock.1);
        clock = c;
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
            proc_cpu_s,
            idle_s,
        });
        marks.push(now.duration_since(t0).as_secs_f64());
        prev = (now, units);
        on_event(i);
    }
    sh.stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    if let Some(t) = tracer {
        let _ = t.join();
        short_split(mode, &sh);
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

/// Trace mode: one line per 100 ms window until the run stops.
fn window_trace(mode: Mode, sh: &Shared, cc: &ConcurrencyControl, probe: &mut RunqProbe) {
    let _ = probe.sample();
    let mut clock = cpu_clock();
    let mut units = sh.units.load(Ordering::Relaxed);
    let mut c0 = cc.counters();
    let mut t = Instant::now();
    eprintln!(
        "trace {mode:?}: t_s budget in_use waiters runq% bench_cpus idle_cpus work/s grants yields"
    );
    let start = t;
    while !sh.stop.load(Ordering::Relaxed) {
        std::thread::sleep(WINDOW);
        let now = Instant::now();
        let dt = (now - t).as_secs_f64();
        let (rq, oc) = probe.sample().unwrap_or_default();
        let c = cpu_clock();
        let u = sh.units.load(Ordering::Relaxed);
        let k = cc.counters();
        eprintln!(
            "trace {mode:?}: {:.1} {} {} {} {:.0} {:.2} {:.2} {:.0} {} {}",
            (now - start).as_secs_f64(),
            k.budget_effective,
            k.cur_concurrency,
            k.waiters,
            rq as f64 * 100.0 / (rq + oc).max(1) as f64,
            (c.0 - clock.0) / dt,
            (c.1 - clock.1) / dt,
            (u - units) as f64 / dt,
            k.slots_granted - c0.slots_granted,
            k.yields - c0.yields,
        );
        (clock, units, c0, t) = (c, u, k, now);
    }
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}

/// Trace mode: the short queries' latency split into the wake-up (from the
/// scheduled start until the thread ran), its on-CPU time, and the rest
/// (waiting for a CPU or for the slot after it woke), at p50/p99 and for
/// the slowest 1%.
fn short_split(mode: Mode, sh: &Shared) {
    let mut v = sh.short_parts.lock().unwrap().clone();
    if v.is_empty() {
        return;
    }
    v.sort_by(|a, b| a.2.total_cmp(&b.2));
    let n = v.len();
    let tail = &v[n - n.div_ceil(100)..];
    let mean = |f: fn(&(f64, f64, f64)) -> f64| tail.iter().map(f).sum::<f64>() / tail.len() as f64;
    let mut cpu: Vec<f64> = v.iter().map(|x| x.0).collect();
    let mut rq: Vec<f64> = v.iter().map(|x| x.1).collect();
    eprintln!(
        "short {mode:?}: n {n}; latency p50 {:.2} p99 {:.2} ms; on-CPU p50 {:.2} p99 {:.2}; wake-up p50 {:.2} p99 {:.2}; slowest 1%: latency {:.2} = wake-up {:.2} + on-CPU {:.2} + waiting after it {:.2}",
        v[n / 2].2,
        v[(n * 99 / 100).min(n - 1)].2,
        percentile(&mut cpu, 50.0),
        percentile(&mut cpu, 99.0),
        percentile(&mut rq, 50.0),
        percentile(&mut rq, 99.0),
        mean(|x| x.2),
        mean(|x| x.1),
        mean(|x| x.0),
        mean(|x| x.2 - x.0 - x.1),
    );
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

/// The share of windows in `(from, to]` at each budget: "1: 15%, 2: 85%".
fn budget_hist(h: &[BudgetPoint], from: f64, to: f64) -> String {
    let mut n = std::collections::BTreeMap::<u64, usize>::new();
    let pts = h.iter().filter(|p| p.t_s > from && p.t_s <= to);
    let total = pts
        .clone()
        .inspect(|p| *n.entry(p.budget).or_default() += 1)
        .count();
    n.iter()
        .map(|(b, k)| format!("{b}: {:.0}%", *k as f64 * 100.0 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Seconds after `from` until the budget reaches the level it ends the
/// phase at (the median over the last second before `to`) and from then on
/// stays within one slot of it.
fn settle(h: &[BudgetPoint], from: f64, to: f64) -> f64 {
    let mut tail: Vec<f64> = h
        .iter()
        .filter(|p| p.t_s > to - 1.0 && p.t_s <= to)
        .map(|p| p.budget as f64)
        .collect();
    let level = median(&mut tail).round();
    let pts: Vec<&BudgetPoint> = h.iter().filter(|p| p.t_s > from && p.t_s <= to).collect();
    let after_out = pts
        .iter()
        .rposition(|p| (p.budget as f64 - level).abs() > 1.0)
        .map_or(0, |i| i + 1);
    pts[after_out..]
        .iter()
        .find(|p| p.budget as f64 == level)
        .map_or(to - from, |p| p.t_s - from)
}

// ---- workload (c) ----------------------------------------------------------

fn slotring_run(adaptive: bool) -> Value {
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
fn slotring_bin() -> PathBuf {
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

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// (a): the CPU-bound scans and short queries, every mode in each of
/// [`A_ROUNDS`] rounds, and their keys.
fn workload_a(bpf: &SlotringBpf, cores: usize, report: &mut Report) {
    // (a) CPU-bound scans + short queries: 3 rounds of 3 s per mode,
    // interleaved, so that other work on the machine meets all modes alike.
    let (mut sa, mut ca, mut aa, mut hist) = (vec![], vec![], vec![], vec![]);
    let mut yields_a = 0;
    for round in 0..A_ROUNDS {
        for mode in [Mode::Static, Mode::AtCores, Mode::Adaptive] {
            let mut r = cpu_run(bpf, mode, &[A_SECS], |_| {});
            let p = r.phases.pop().expect("one phase");
            match mode {
                Mode::Static => sa.push(p),
                Mode::AtCores => ca.push(p),
                Mode::Adaptive => {
                    eprintln!(
                        "(a) adaptive round {round}, budget/run-queue % per window: {}",
                        trace(&r.history)
                    );
                    // The windows of the measured phase (not the wind-down).
                    let end = r.marks[0];
                    hist.extend(r.history.into_iter().filter(|p| p.t_s <= end));
                    yields_a += r.yields;
                    aa.push(p);
                }
            }
        }
    }
    let (mut sp, cp, mut ap) = (merge(sa), merge(ca), merge(aa));
    let (sp, ap) = (&mut sp, &mut ap);
    let a_hist = budget_hist(&hist, f64::NEG_INFINITY, f64::INFINITY);
    eprintln!("(a) adaptive, windows at each budget: {a_hist}");
    let note = |w: &str| format!("{w}; {} cores, ceiling {}", cores, 2 * cores);
    let p50s = format!(
        "(a) static, {A_ROUNDS} × {A_SECS} s; p50 {:.2} ms",
        sp.p50()
    );
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
        &format!(
            "(a) static: units of CPU work ({UNIT_ITERS} iterations) per s; {}",
            sp.cpus()
        ),
    );
    report.put(
        "adapt_work_per_s_cpu",
        ap.work_per_s(),
        &format!("(a) adaptive; {}", ap.cpus()),
    );
    report.put(
        "cores_work_per_s_cpu",
        cp.work_per_s(),
        &format!(
            "(a) context: a static budget of {cores} (the cores), no loop; {}",
            cp.cpus()
        ),
    );
    report.put(
        "adapt_budget_mean_cpu",
        budget_mean(&hist, f64::NEG_INFINITY, f64::INFINITY),
        &format!("(a) mean effective budget; windows at each budget: {a_hist}"),
    );
    report.put(
        "adapt_yields_cpu",
        yields_a as f64,
        "(a) slots released by should_yield",
    );
}

/// Where (b)'s hog runs: in a sibling cgroup of its own (`own`), else in
/// the workload's.
fn hog_dir(cg: Option<&Cgroups>, own: bool) -> PathBuf {
    match (cg, own) {
        (Some(c), true) => c.hog.dir.clone(),
        (Some(c), false) => c.work.dir.clone(),
        (None, _) => PathBuf::from("/sys/fs/cgroup/cpu"),
    }
}

/// One run of (b) in `mode`: 3 s without the hog, 6 s with, 3 s without.
fn hog_run(bpf: &SlotringBpf, cores: usize, mode: Mode, dir: &Path) -> CpuRun {
    let events = [3.0, 9.0, 12.0];
    let mut h: Option<Hog> = None;
    cpu_run(bpf, mode, &events, |i| match i {
        0 => h = Some(hog(2 * cores, dir)),
        1 => h = None,
        _ => {}
    })
}

/// (b) with the hog in the workload's cgroup, and its keys.
fn workload_b(bpf: &SlotringBpf, cores: usize, cg: Option<&Cgroups>, report: &mut Report) {
    // (b) the hog: 3 s without, 6 s with, 3 s without.
    let same = hog_dir(cg, false);
    let mut hs = hog_run(bpf, cores, Mode::Static, &same);
    let mut ha = hog_run(bpf, cores, Mode::Adaptive, &same);
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
        &format!("(b) after the hog starts {s_on:.2} s, after it stops {s_off:.2} s (to the phase's final level, then within one slot of it; 100 ms windows)"),
    );
    // The physical floor of (b) in the same cgroup, without slotring.
    let (floor_share, floor_p99) = physical_floor(2 * cores, &same);
    report.put(
        "floor_runq_share_pct_hog",
        floor_share,
        &format!(
            "(b) context: one plain CPU-bound thread beside stress-ng --cpu {} in its cgroup, 2 s, /proc schedstat (the least any budget >= 1 can reach; per-thread CFS: {:.0}% expected)",
            2 * cores,
            100.0 * (1.0 - cores as f64 / (2 * cores + 1) as f64)
        ),
    );
    report.put(
        "floor_short_p99_ms_hog",
        floor_p99,
        "(b) context: the short queries alone beside the same hog, no scan, no slotring, 4 s (the best p99 of a budget of 0)",
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
}

/// (b) with the hog in a sibling cgroup of its own, and its keys.
fn workload_b_own_cgroup(bpf: &SlotringBpf, cores: usize, cg: &Cgroups, report: &mut Report) {
    let own = hog_dir(Some(cg), true);
    let mut os = hog_run(bpf, cores, Mode::Static, &own);
    let mut oa = hog_run(bpf, cores, Mode::Adaptive, &own);
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

/// (c): `slotring run`, IO-bound, with and without the adaptive budget,
/// and its keys.
fn workload_c(report: &mut Report) {
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
    slotring::bpf::install_lease_observer();
    let mut report = Report::new("adaptive");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cg_note = cg.as_ref().map_or("none".into(), |c| c.note.clone());
    workload_a(&bpf, cores, &mut report);
    if std::env::var_os("ADAPTIVE_BENCH_ONLY").is_some_and(|v| v == "a") {
        eprintln!("ADAPTIVE_BENCH_ONLY=a: (a) only, no JSON written");
        return;
    }
    workload_b(&bpf, cores, cg.as_ref(), &mut report);
    if let Some(c) = &cg {
        workload_b_own_cgroup(&bpf, cores, c, &mut report);
    }
    // (c) `slotring run`, IO-bound.
    drop(bpf);
    workload_c(&mut report);
    let end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "machine: load average {} at the start, {} at the end; cgroups: {cg_note}",
        load.trim(),
        end.trim()
    );
    drop(cg);
    report.finish().expect("writing target/bench/adaptive.json");
}
