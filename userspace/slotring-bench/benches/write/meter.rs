//! What a run costs in CPU: the process's own (`getrusage`), its waited-for
//! children's (fio), the kernel's worker threads' (`/proc/<pid>/stat` of
//! every `kworker`, sampled every second) and the whole machine's
//! (`/proc/stat`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};

pub(crate) fn cpu_s() -> f64 {
    rusage_cpu_s(UsageWho::RUSAGE_SELF)
}

/// CPU seconds of the waited-for child processes so far (fio).
pub(crate) fn children_cpu_s() -> f64 {
    rusage_cpu_s(UsageWho::RUSAGE_CHILDREN)
}

/// User + system CPU seconds of `who` so far.
pub(crate) fn rusage_cpu_s(who: UsageWho) -> f64 {
    let u = getrusage(who).expect("getrusage");
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(u.user_time()) + t(u.system_time())
}

/// The kernel's clock ticks per second (`/proc` CPU times are in them).
pub(crate) fn ticks_per_s() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64
}

/// CPU ticks of every kernel worker thread (`kworker`, from
/// `/proc/<pid>/stat`) by pid: the flusher's writeback of an unpaced
/// write runs there (`wb_workfn`, comm `…-flush-<dev>`), as does the loop
/// device's IO for either path.
pub(crate) fn kworker_ticks() -> HashMap<u32, u64> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: the comm may hold spaces.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !stat[open + 1..close].starts_with("kworker") {
            continue;
        }
        // After the comm: state (field 3) … utime (14), stime (15).
        let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let t = [11, 12]
            .iter()
            .filter_map(|&i| f.get(i).and_then(|v| v.parse::<u64>().ok()))
            .sum();
        out.insert(pid, t);
    }
    out
}

/// The kernel workers' CPU over a run: each worker's ticks since the
/// run's start (or its birth), kept per pid and sampled every second, so
/// a worker the pool retires mid-run keeps what it did up to its last
/// sample (a plain sum over `/proc` loses a retired worker's whole past
/// and can go negative).
pub(crate) struct KworkerCpu {
    /// pid → (ticks at the start or birth, ticks last seen).
    pub(crate) seen: HashMap<u32, (u64, u64)>,
}

impl KworkerCpu {
    pub(crate) fn start() -> Self {
        Self {
            seen: kworker_ticks()
                .into_iter()
                .map(|(p, t)| (p, (t, t)))
                .collect(),
        }
    }

    pub(crate) fn sample(&mut self) {
        for (pid, t) in kworker_ticks() {
            let e = self.seen.entry(pid).or_insert((0, 0));
            if t < e.1 {
                // A new worker on a reused pid.
                *e = (0, t);
            } else {
                e.1 = t;
            }
        }
    }

    pub(crate) fn seconds(&self) -> f64 {
        self.seen.values().map(|(a, b)| b - a).sum::<u64>() as f64 / ticks_per_s()
    }
}

/// The kernel workers' CPU from now until [`KworkerMeter::seconds`],
/// sampled every second by a thread of its own: one meter for our runs and
/// fio's alike.
pub(crate) struct KworkerMeter {
    pub(crate) cpu: Arc<Mutex<KworkerCpu>>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) sampler: std::thread::JoinHandle<()>,
}

impl KworkerMeter {
    pub(crate) fn start() -> Self {
        let cpu = Arc::new(Mutex::new(KworkerCpu::start()));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (k, stop) = (cpu.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_secs(1));
                    k.lock().unwrap().sample();
                }
            })
        };
        Self { cpu, stop, sampler }
    }

    /// The workers' CPU seconds since [`KworkerMeter::start`].
    pub(crate) fn seconds(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.sampler.join().unwrap();
        let mut k = self.cpu.lock().unwrap();
        k.sample();
        k.seconds()
    }
}

/// The whole machine's busy CPU seconds so far (`/proc/stat`: user, nice,
/// system, irq, softirq; not idle, iowait or steal): what the kernel's
/// flusher threads spend on writeback is counted here, and not in
/// [`cpu_s`].
pub(crate) fn machine_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let busy: u64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| ticks.get(i)).sum();
    busy as f64 / ticks_per_s()
}
