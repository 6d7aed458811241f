//! The machine around the bench: its cgroups (a top cgroup of a large
//! weight with `work` and `hog` children), the stress-ng hog, per-thread
//! scheduler accounting, and the physical floors that no budget can beat.

use super::*;

/// A cpu cgroup directory, removed (after moving its tasks to `parent`) on drop.
pub(crate) struct Cg {
    pub(crate) dir: PathBuf,
    pub(crate) parent: PathBuf,
}

impl Cg {
    pub(crate) fn new(
        parent: &Path,
        name: &str,
        knob: &str,
        weight: &str,
    ) -> std::io::Result<Self> {
        let dir = parent.join(name);
        std::fs::create_dir(&dir)?;
        let cg = Cg {
            dir,
            parent: parent.to_path_buf(),
        };
        std::fs::write(cg.dir.join(knob), weight)?;
        Ok(cg)
    }
    pub(crate) fn enter(&self, pid: u32) -> std::io::Result<()> {
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
pub(crate) fn remove_stale(root: &Path) {
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
pub(crate) struct Cgroups {
    pub(crate) work: Cg,
    pub(crate) hog: Cg,
    pub(crate) _top: Cg,
    pub(crate) note: String,
}

pub(crate) fn cgroups() -> Result<Cgroups, String> {
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
pub(crate) struct Hog {
    pub(crate) child: Child,
}

/// Stop the bench unless `stress-ng` runs: [`hog`] execs it from a shell,
/// whose exit on a missing binary would otherwise leave (b) measured with
/// no hog.
pub(crate) fn require_stress_ng() {
    match Command::new("stress-ng").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!("`stress-ng --version` failed: {}", out.status),
        Err(e) => panic!("stress-ng cannot run ({e}): `cargo xtask deps` installs it"),
    }
}

pub(crate) fn hog(n: usize, cg: &Path) -> Hog {
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

// ---- one plain CPU-bound thread: the run-queue floor ---------------------

/// On-CPU and run-queue ns of one thread of this process (`schedstat`).
pub(crate) fn schedstat(tid: nix::unistd::Pid) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .expect("schedstat (CONFIG_SCHED_INFO)");
    let mut it = s.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// One sample of the plain thread's `schedstat`: when, on-CPU ns, run-queue ns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlainSample {
    pub(crate) at: Instant,
    pub(crate) cpu_ns: u64,
    pub(crate) runq_ns: u64,
}

/// One plain CPU-bound thread, no slotring: `floor_runq_share_pct_*` is its
/// run-queue share beside a workload's load (the least any budget >= 1 can
/// reach, one lease running alone). It samples its own `schedstat` every
/// [`WINDOW`], so a caller can take the share over part of its life.
pub(crate) struct Plain {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<PlainSample>>,
}

impl Plain {
    pub(crate) fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            let tid = nix::unistd::gettid();
            let sample = || {
                let (cpu_ns, runq_ns) = schedstat(tid);
                PlainSample {
                    at: Instant::now(),
                    cpu_ns,
                    runq_ns,
                }
            };
            let mut v = vec![sample()];
            while !st.load(Ordering::Relaxed) {
                unit();
                if v.last().is_some_and(|s| s.at.elapsed() >= WINDOW) {
                    v.push(sample());
                }
            }
            v.push(sample());
            v
        });
        Self { stop, thread }
    }

    /// Stop it; its samples.
    pub(crate) fn stop(self) -> Vec<PlainSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// `(run-queue ns, on-CPU ns)` of the plain thread between its first
/// sample at or after `from` and its last at or before `to`.
pub(crate) fn plain_between(s: &[PlainSample], from: Instant, to: Instant) -> (u64, u64) {
    let first = s.iter().find(|p| p.at >= from);
    let last = s.iter().rev().find(|p| p.at <= to);
    match (first, last) {
        (Some(a), Some(b)) if b.at > a.at => (b.runq_ns - a.runq_ns, b.cpu_ns - a.cpu_ns),
        _ => (0, 0),
    }
}

/// The window rule of [`plain_between`] and [`share_of`], checked before
/// every run (a bench has no test harness): samples outside the window do
/// not count, a window holding fewer than two samples is empty, and the
/// share is of the sums.
pub(crate) fn check_plain_window_rule() {
    let t0 = Instant::now();
    let at = |ms: u64, cpu_ns: u64, runq_ns: u64| PlainSample {
        at: t0 + Duration::from_millis(ms),
        cpu_ns,
        runq_ns,
    };
    // Setup before 100 ms and teardown after 300 ms are heavily queued.
    let s = [
        at(0, 0, 0),
        at(100, 10, 90),
        at(200, 100, 100),
        at(300, 190, 110),
        at(400, 200, 200),
    ];
    let ms = |m| t0 + Duration::from_millis(m);
    assert_eq!(plain_between(&s, ms(50), ms(350)), (20, 180));
    assert_eq!(plain_between(&s, ms(150), ms(250)), (0, 0));
    assert_eq!(plain_all(&s), (200, 200));
    assert_eq!(
        share_of(&[(20, 180), (0, 0), (30, 70)]),
        50.0 * 100.0 / 300.0
    );
    assert_eq!(share_of(&[]), 0.0);
}

/// `(run-queue ns, on-CPU ns)` over all of the plain thread's life.
pub(crate) fn plain_all(s: &[PlainSample]) -> (u64, u64) {
    match (s.first(), s.last()) {
        (Some(a), Some(b)) => (b.runq_ns - a.runq_ns, b.cpu_ns - a.cpu_ns),
        _ => (0, 0),
    }
}

/// Run-queue share, %, of `(run-queue ns, on-CPU ns)` sums.
pub(crate) fn share_of(rq_cpu: &[(u64, u64)]) -> f64 {
    let rq: u64 = rq_cpu.iter().map(|x| x.0).sum();
    let cpu: u64 = rq_cpu.iter().map(|x| x.1).sum();
    rq as f64 * 100.0 / (rq + cpu).max(1) as f64
}

/// The floor of (a)/(b) through the same engine as their measured runs: no
/// scan, the short queries alone on their slots for [`FLOOR_SHORT_S`]
/// after a warm-up of [`FLOOR_LEAD_S`] (their threads' start is not part of
/// a floor; the hog `with` starts at its end and runs to the end), then one
/// [`Plain`] thread beside the same load for [`FLOOR_PLAIN_S`]. The
/// short-alone phase (its p99 is the floor), and the plain thread's
/// `(run-queue ns, on-CPU ns)`.
pub(crate) fn floor_run(bpf: &SlotringBpf, with: Option<(usize, &Path)>) -> (Phase, (u64, u64)) {
    let lead = FLOOR_LEAD_S;
    let events = [
        lead,
        lead + FLOOR_SHORT_S,
        lead + FLOOR_SHORT_S + FLOOR_PLAIN_S,
    ];
    let (mut h, mut plain, mut rq) = (None, None, (0, 0));
    let mut r = cpu_run(bpf, Mode::Floor, &events, |i| match i {
        0 => h = with.map(|(n, cg)| hog(n, cg)),
        1 => plain = Some(Plain::start()),
        _ => {
            rq = plain.take().map_or((0, 0), |p| plain_all(&p.stop()));
            h = None;
        }
    });
    drop(h);
    (r.phases.swap_remove(1), rq)
}
