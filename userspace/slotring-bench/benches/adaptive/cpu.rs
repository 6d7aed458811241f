//! Workloads (a) and (b)'s engine: CPU-bound scans and short queries under
//! one mode of the budget, measured phase by phase (work, short query
//! latency, run-queue share of running leases, where the CPU went).

use super::*;

#[derive(Debug, Default)]
pub(crate) struct Phase {
    pub(crate) short_ms: Vec<f64>,
    pub(crate) units: u64,
    pub(crate) secs: f64,
    pub(crate) runq_ns: u64,
    pub(crate) on_cpu_ns: u64,
    /// CPU time of this process (all threads), s.
    pub(crate) proc_cpu_s: f64,
    /// Idle time of the machine (all CPUs), s.
    pub(crate) idle_s: f64,
}

/// CPU seconds of this process and idle seconds of the machine so far.
pub(crate) fn cpu_clock() -> (f64, f64) {
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
    pub(crate) fn p99(&mut self) -> f64 {
        percentile(&mut self.short_ms, 99.0)
    }
    pub(crate) fn p50(&mut self) -> f64 {
        percentile(&mut self.short_ms, 50.0)
    }
    pub(crate) fn work_per_s(&self) -> f64 {
        self.units as f64 / self.secs
    }
    /// "CPUs used by the bench, machine idle": where the CPU went.
    pub(crate) fn cpus(&self) -> String {
        format!(
            "bench process on {:.2} CPUs, machine idle {:.2} CPUs",
            self.proc_cpu_s / self.secs,
            self.idle_s / self.secs
        )
    }
    pub(crate) fn share_pct(&self) -> f64 {
        let t = self.runq_ns + self.on_cpu_ns;
        if t == 0 {
            0.0
        } else {
            self.runq_ns as f64 * 100.0 / t as f64
        }
    }
}

pub(crate) struct CpuRun {
    pub(crate) phases: Vec<Phase>,
    pub(crate) history: Vec<BudgetPoint>,
    pub(crate) yields: u64,
    /// `(seconds since the loop started)` of each phase boundary.
    pub(crate) marks: Vec<f64>,
}

pub(crate) struct Shared {
    pub(crate) stop: AtomicBool,
    pub(crate) units: AtomicU64,
    pub(crate) short: Mutex<Vec<(Instant, f64)>>,
    /// Trace mode: per short query (on-CPU ms from waking to the end, ms
    /// from the scheduled start until its thread ran, latency ms).
    pub(crate) short_parts: Mutex<Vec<(f64, f64, f64)>>,
}

/// `ADAPTIVE_BENCH_TRACE=1`: print a per-window trace of every run of (a)
/// and (b) (budget, slots in use, waiting allocations, run-queue share of
/// running leases, CPUs of the bench and idle CPUs of the machine, work)
/// and split each short query's latency into run-queue wait and on-CPU.
pub(crate) fn tracing() -> bool {
    std::env::var_os("ADAPTIVE_BENCH_TRACE").is_some_and(|v| v == "1")
}

pub(crate) fn scan_thread(
    sh: Arc<Shared>,
    alloc: Arc<slotring::slots::Allocation>,
    max: Arc<AtomicU64>,
) {
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
pub(crate) fn short_thread(sh: Arc<Shared>, cc: Option<ConcurrencyControl>, offset: Duration) {
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
pub(crate) enum Mode {
    /// 2 × cores, the static default.
    Static,
    /// A static budget below 2 × cores (the sweep of `best_static_*`; at
    /// the cores, `cores_work_per_s_cpu`).
    Fixed(u64),
    /// The adaptive loop (ceiling 2 × cores).
    Adaptive,
    /// The floor: no scan, the short queries alone on their slots at the
    /// static budget (`floor_short_p99_ms_*`; (c): `slotring run --scans 0`).
    Floor,
}

/// Several phases as one (their sums; the short queries of all).
pub(crate) fn merge(ps: impl IntoIterator<Item = Phase>) -> Phase {
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
pub(crate) fn cpu_run(
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
    if let Mode::Fixed(b) = mode {
        cc.set_effective_budget(b);
    }
    let sh = Arc::new(Shared {
        stop: AtomicBool::new(false),
        units: AtomicU64::new(0),
        short: Mutex::new(Vec::new()),
        short_parts: Mutex::new(Vec::new()),
    });
    let mut threads = Vec::new();
    let scans = if mode == Mode::Floor { 0 } else { SCANS };
    for _ in 0..scans {
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
pub(crate) fn window_trace(
    mode: Mode,
    sh: &Shared,
    cc: &ConcurrencyControl,
    probe: &mut RunqProbe,
) {
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
pub(crate) fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}

/// Trace mode: the short queries' latency split into the wake-up (from the
/// scheduled start until the thread ran), its on-CPU time, and the rest
/// (waiting for a CPU or for the slot after it woke), at p50/p99 and for
/// the slowest 1%.
pub(crate) fn short_split(mode: Mode, sh: &Shared) {
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
