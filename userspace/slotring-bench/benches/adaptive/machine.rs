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

// ---- the physical floor of (b), without slotring -----------------------

/// On-CPU and run-queue ns of one thread of this process (`schedstat`).
pub(crate) fn schedstat(tid: nix::unistd::Pid) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .expect("schedstat (CONFIG_SCHED_INFO)");
    let mut it = s.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// What a workload allows at best, with no slotring and no scan: one plain
/// CPU-bound thread beside its load (`with`: a hog of `n` threads in a
/// cgroup, for (b); none for (a): the machine's other work) — its
/// run-queue share, from `schedstat` — and then the short queries alone
/// beside it (their p99).
pub(crate) fn physical_floor(with: Option<(usize, &Path)>) -> (f64, f64) {
    let _hog = with.map(|(n, cg)| hog(n, cg));
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
