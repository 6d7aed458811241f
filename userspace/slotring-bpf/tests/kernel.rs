//! Integration tests against the real kernel (run as root): loading,
//! pinning, the accounting and its readers. The verdict's own tests are in
//! `verdict.rs`. Every test takes [`probes::serial`].

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::Barrier;
use std::time::Duration;

use libbpf_rs::MapCore as _;
use slotring_bpf::{
    AbiStruct, AttachMode, BpfConfig, BpfError, ProbeStatus, SlotringBpf, ThrottleStats, Verdict,
    VerifyConfig,
};
use slotring_counters::uring::UringCounters;
use slotring_slots::SlotsCounters;
use slotring_throttle::{LeaseState, ThrottleCounters, notify_lease_state};

mod probes;
mod shapes;

use probes::{load, pin_dir, serial, tid};
use shapes::{Position, Shape, run_episodes, thread_cpu_ns};

#[test]
fn load_attach_pin_with_mode_0600() {
    let _g = serial();
    let Some(bpf) = load("attach", |_| {}) else {
        return;
    };
    assert!(
        matches!(bpf.status(), ProbeStatus::Attached(AttachMode::TpBtf)),
        "{bpf:?}"
    );
    let (dir, pins) = bpf.pins();
    let dir = dir.unwrap();
    assert_eq!(
        std::fs::metadata(dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    for name in [
        "lease",
        "thread_acct",
        "throttle",
        "slots",
        "uring",
        "prog_switch_btf",
    ] {
        let p = dir.join(name);
        assert!(pins.contains(&p), "{p:?} pinned");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600,
            "{p:?}"
        );
    }
    // The programs really run: our own switch-outs are accounted.
    let me = bpf.register_current_thread().unwrap();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::yield_now();
    let a = bpf.thread_acct(me).unwrap();
    assert!(a.events >= 3, "switch events seen: {a:?}");
    assert!(a.switches[0] >= 3, "{a:?}");
}

#[test]
fn pin_group_gets_group_read_modes() {
    use std::os::unix::fs::MetadataExt;
    let _g = serial();
    let Some(bpf) = load("group", |c| c.pin_group = Some(65534)) else {
        return;
    };
    let (dir, pins) = bpf.pins();
    let meta = std::fs::metadata(dir.unwrap()).unwrap();
    assert_eq!(
        (meta.permissions().mode() & 0o777, meta.gid()),
        (0o750, 65534)
    );
    for p in pins {
        let meta = std::fs::metadata(p).unwrap();
        assert_eq!(
            (meta.permissions().mode() & 0o777, meta.gid()),
            (0o640, 65534),
            "{p:?}"
        );
    }
}

#[test]
fn raw_tp_fallback_accounts_too() {
    let _g = serial();
    // Also the hash path of the thread lookup (no direct-mapped index).
    let Some(bpf) = load("rawtp", |c| {
        c.force_raw_tp = true;
        c.direct_index = false;
    }) else {
        return;
    };
    assert!(matches!(
        bpf.status(),
        ProbeStatus::Attached(AttachMode::RawTp)
    ));
    let t = std::thread::spawn(|| {
        notify_lease_state(LeaseState::Parked);
        std::thread::sleep(Duration::from_millis(500));
        notify_lease_state(LeaseState::NotHolding);
        tid()
    })
    .join()
    .unwrap();
    let r = bpf.verify(&[t], VerifyConfig::default()).unwrap();
    let th = &r.threads[0];
    assert!(th.parked.parked_ns >= 500_000_000, "{r}");
    assert!(th.switches[2] >= 1, "blocked while parked: {r}");
    assert_eq!(th.parked.segments.episodes, 1, "{r}");
    assert_eq!(r.verdict, Verdict::Pass, "{r}");
}

#[test]
fn timeout_sqe_park_costs_no_cpu_and_passes() {
    let _g = serial();
    let Some(bpf) = load("timeout", |_| {}) else {
        return;
    };
    let shape = Shape {
        wait: Duration::from_millis(500),
        spin_pct: 0.0,
        position: Position::BeforeSleep,
    };
    let t = std::thread::spawn(move || run_episodes(&shape, 1))
        .join()
        .unwrap();
    let r = bpf.verify(&[t], VerifyConfig::default()).unwrap();
    println!("{r}");
    let th = &r.threads[0];
    assert_eq!(th.parked.parks, 1);
    assert!(
        th.parked.parked_ns >= 500_000_000,
        "parked at least the timeout: {r}"
    );
    assert!(th.switches[2] >= 1, "it blocked while parked: {r}");
    // One wake-up into the parked state, seen at its switch-in; a switch-in
    // BPF did not see (counted in `missed_events`; once in CI, 0 of 20 runs
    // here) loses that wake-up's latency, not the thread's time.
    let missed_wakeup = th.unpark_wakeups == 0 && th.parked.missed_events >= 1;
    assert!(
        th.unpark_wakeups == 1 || missed_wakeup,
        "one wake-up into the parked state: {r}"
    );
    // ~0 run-queue while parked: just the wake-up latency (the machine is
    // shared, so bound it loosely at 5 % of the parked time).
    assert!(th.parked.runq_ns < th.parked.parked_ns / 20, "{r}");
    assert_eq!(r.verdict, Verdict::Pass, "{r}");
    // One episode, one sleep: a sample in each histogram it has.
    let s = &th.parked.segments;
    assert_eq!((s.episodes, s.sleeps, s.hot_episodes), (1, 1, 0), "{r}");
    assert_eq!(r.hists.park_cpu.total(), 1, "{r}");
    assert_eq!(r.hists.pre_sleep.total(), 1, "{r}");
    assert_eq!(r.hists.post_wake.total(), 1, "{r}");
    assert_eq!(r.hists.between_sleeps.total(), 0, "{r}");
    assert!(r.hists.unpark_rq.total() >= 1 || missed_wakeup, "{r}");
}

#[test]
fn spinning_parked_thread_fails_the_verdict() {
    let _g = serial();
    let Some(bpf) = load("spin", |_| {}) else {
        return;
    };
    let sleep = Shape {
        wait: Duration::from_millis(300),
        spin_pct: 0.0,
        position: Position::BeforeSleep,
    };
    // A thread that "parks" and spins the whole wait, never sleeping.
    let spin = Shape {
        wait: Duration::from_millis(100),
        spin_pct: 100.0,
        position: Position::BeforeSleep,
    };
    let (good, bad) = std::thread::scope(|s| {
        let good = s.spawn(|| run_episodes(&sleep, 1));
        let bad = s.spawn(|| {
            notify_lease_state(LeaseState::Running);
            for _ in 0..3 {
                notify_lease_state(LeaseState::Parked);
                shapes::spin_cpu(spin.spin());
                notify_lease_state(LeaseState::Running);
            }
            notify_lease_state(LeaseState::NotHolding);
            tid()
        });
        (good.join().unwrap(), bad.join().unwrap())
    });
    let r = bpf.verify(&[good, bad], VerifyConfig::default()).unwrap();
    println!("{r}");
    assert_eq!(r.verdict, Verdict::Fail { tids: vec![bad] }, "{r}");
    let spinner = &r.threads[1];
    // It ran the whole time it was "parked": 300 ms of CPU.
    assert!(spinner.parked.on_cpu_ns >= 290_000_000, "{r}");
    let s = &spinner.parked.segments;
    assert_eq!((s.episodes, s.sleeps, s.hot_pre_sleep), (3, 0, 3), "{r}");
    // Logged: every episode (an entry stands for several when they ended
    // in one on-CPU interval).
    assert_eq!(spinner.hot.iter().map(|e| e.count).sum::<u64>(), 3, "{r}");
    assert!(r.threads[0].parked.pass, "{r}");
}

#[test]
fn run_queue_wait_when_two_spinners_share_a_cpu() {
    let _g = serial();
    let Some(bpf) = load("runq", |_| {}) else {
        return;
    };
    let barrier = Barrier::new(2);
    let tids: Vec<u32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut set = nix::sched::CpuSet::new();
                    set.set(0).unwrap();
                    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
                    notify_lease_state(LeaseState::Running);
                    barrier.wait();
                    let start = thread_cpu_ns();
                    while thread_cpu_ns() - start < 40_000_000 {
                        std::hint::spin_loop();
                    }
                    notify_lease_state(LeaseState::NotHolding);
                    tid()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let r = bpf.verify(&tids, VerifyConfig::default()).unwrap();
    println!("{r}");
    let running = 1;
    let waits: u64 = r.threads.iter().map(|t| t.runq_ns[running]).sum();
    // While both are runnable on one CPU, one of them always waits: until
    // the first finishes its 40 ms of CPU, at least ~40 ms of waiting.
    assert!(waits >= 20_000_000, "run-queue wait while running: {r}");
    assert!(
        r.threads
            .iter()
            .all(|t| t.runq_ns[running] > 0 && t.preemptions[running] > 0),
        "{r}"
    );
    assert_eq!(r.total.parked.parked_ns, 0);
}

fn bpftool_dump(path: &Path) -> serde_json::Value {
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(path)
        .output()
        .expect("bpftool is installed (apt-get install bpftool)");
    assert!(
        out.status.success(),
        "bpftool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("bpftool prints JSON")
}

fn formatted(dump: &serde_json::Value, key: u64) -> &serde_json::Value {
    let e = dump
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["formatted"]["key"] == key)
        .expect("entry present");
    &e["formatted"]["value"]
}

#[test]
fn pinned_counters_read_by_bpftool_and_libbpf() {
    let _g = serial();
    let Some(bpf) = load("stats", |_| {}) else {
        return;
    };
    let dir = bpf.pins().0.unwrap().to_owned();
    let tc = ThrottleCounters {
        amount: 1 << 40,
        page_cache_amount: 2,
        wait_us: 3,
        waits: 4,
        block_count: 5,
        max_speed: 6,
    };
    bpf.publish_throttle(3, &ThrottleStats::new("disk-read", &tc))
        .unwrap();
    let words = |n: usize| (1..=n as u64).map(|i| i * 1000 + 7).collect::<Vec<u64>>();
    let slots = SlotsCounters::from_words(&words(SlotsCounters::WORDS));
    let uring = UringCounters::from_words(
        &words(UringCounters::WORDS)
            .iter()
            .map(|w| w + 1)
            .collect::<Vec<_>>(),
    );
    bpf.publish_slots(&slots);
    bpf.publish_uring(&uring);

    let t = bpftool_dump(&dir.join("throttle"));
    let v = formatted(&t, 3);
    assert_eq!(v["name"], "disk-read");
    assert_eq!(v["amount"], 1u64 << 40);
    for (f, want) in [
        ("page_cache_amount", 2),
        ("wait_us", 3),
        ("waits", 4),
        ("block_count", 5),
        ("max_speed", 6),
    ] {
        assert_eq!(v[f], want, "{f}");
    }
    for (map, value) in [("slots", slots.to_words()), ("uring", uring.to_words())] {
        let d = bpftool_dump(&dir.join(map));
        let v = formatted(&d, 0);
        let layout = match map {
            "slots" => SlotsCounters::layout(),
            _ => UringCounters::layout(),
        };
        for (f, want) in layout.iter().zip(&value) {
            assert_eq!(v[f.name], *want, "{map}.{}", f.name);
        }
    }

    // An independent libbpf-based reader (what bpftool is built on).
    let h = libbpf_rs::MapHandle::from_pinned_path(dir.join("slots")).unwrap();
    let bytes = h
        .lookup(&0u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
        .unwrap()
        .unwrap();
    let read: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(SlotsCounters::from_words(&read), slots);
    let h = libbpf_rs::MapHandle::from_pinned_path(dir.join("throttle")).unwrap();
    let bytes = h
        .lookup(&3u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
        .unwrap()
        .unwrap();
    let read: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(ThrottleStats::from_words(&read).name_str(), "disk-read");
    assert_eq!(ThrottleStats::from_words(&read).counters.amount, 1 << 40);
    // And a libbpf write is seen through our mmap.
    let mut patched = slots;
    patched.borrowed = 99;
    let raw: Vec<u8> = patched
        .to_words()
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .collect();
    let h = libbpf_rs::MapHandle::from_pinned_path(dir.join("slots")).unwrap();
    h.update(&0u32.to_ne_bytes(), &raw, libbpf_rs::MapFlags::ANY)
        .unwrap();
    assert_eq!(bpf.slot_stats().borrowed, 99);
}

fn bpf_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
        .filter(|l| l.to_string_lossy().starts_with("anon_inode:bpf"))
        .count()
}

fn bpftool_ok(args: &[&str]) -> bool {
    Command::new("bpftool")
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn no_pins_or_fds_left_after_drop() {
    let _g = serial();
    let before = bpf_fds();
    let Some(bpf) = load("drop", |_| {}) else {
        return;
    };
    let (progs, maps) = bpf.kernel_ids();
    assert!(!progs.is_empty() && !maps.is_empty());
    let dir = bpf.pins().0.unwrap().to_owned();
    // A thread registered in this instance keeps reporting after the drop.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let late = std::thread::spawn(move || {
        notify_lease_state(LeaseState::Parked);
        rx.recv().unwrap();
        notify_lease_state(LeaseState::NotHolding); // after the drop: no fault
    });
    std::thread::sleep(Duration::from_millis(10));
    assert!(bpf_fds() > before);
    drop(bpf);
    tx.send(()).unwrap();
    late.join().unwrap();
    assert!(!dir.exists(), "pin dir removed");
    assert_eq!(bpf_fds(), before, "every BPF fd closed");
    // The kernel frees the objects asynchronously (RCU); give it a moment.
    for (kind, ids) in [("prog", &progs), ("map", &maps)] {
        for (name, id) in ids {
            let id = id.to_string();
            let mut gone = false;
            for _ in 0..200 {
                if !bpftool_ok(&[kind, "show", "id", &id]) {
                    gone = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(gone, "{kind} {name} (id {id}) still exists after drop");
        }
    }
}

/// Run `sh -c script` as nobody (uid/gid 65534, no groups).
fn as_nobody(script: &str) {
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("setpriv (util-linux) runs");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `/sys/fs/bpf` writable by everyone (sticky), as on this machine: the
/// setting in which another user can plant a pin directory.
fn bpffs_world_writable() -> bool {
    std::fs::metadata("/sys/fs/bpf").is_ok_and(|m| m.permissions().mode() & 0o1777 == 0o1777)
}

fn snapshot_of(p: &Path) -> (u32, u32, Vec<std::ffi::OsString>) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).unwrap();
    let mut names: Vec<_> = if m.is_dir() {
        std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    } else {
        Vec::new()
    };
    names.sort();
    (m.uid(), m.mode(), names)
}

#[test]
fn hostile_pin_dirs_of_another_user_are_refused_and_untouched() {
    let _g = serial();
    if !bpffs_world_writable() {
        eprintln!("SKIP: /sys/fs/bpf is not writable by other users here");
        return;
    }
    let planted = pin_dir("hostile");
    let link = pin_dir("hostile-link");
    let above = pin_dir("hostile-above");
    as_nobody(&format!(
        "mkdir -m 0777 {p} && mkdir {p}/lease && ln -s /sys/fs/bpf {l} && mkdir -m 0755 {a}",
        p = planted.display(),
        l = link.display(),
        a = above.display()
    ));
    let bpffs_before = snapshot_of(Path::new("/sys/fs/bpf")).1;
    let fds = bpf_fds();
    let cases = [
        (planted.clone(), planted.clone(), "owned by another user"),
        (link.clone(), link.clone(), "a symbolic link"),
        (
            above.join("sub"),
            above.clone(),
            "an ancestor owned by another user",
        ),
    ];
    for (root, refused, why) in cases {
        let before = snapshot_of(&refused);
        let err = SlotringBpf::load(BpfConfig {
            pin_dir: root.clone(),
            instance: Some(format!("hostile-{}", std::process::id())),
            ..BpfConfig::default()
        })
        .expect_err("refused");
        let BpfError::UnsafePinDir {
            path,
            owner,
            reason,
            ..
        } = &err
        else {
            panic!("{root:?}: {err:?}");
        };
        assert_eq!((path, *owner, *reason), (&refused, 65534, why), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(&refused.display().to_string())
                && msg.contains("owner uid 65534")
                && msg.contains("mode 0"),
            "{msg}"
        );
        assert_eq!(snapshot_of(&refused), before, "{refused:?} untouched");
        assert_eq!(bpf_fds(), fds, "every BPF fd closed");
    }
    assert_eq!(
        snapshot_of(Path::new("/sys/fs/bpf")).1,
        bpffs_before,
        "/sys/fs/bpf mode"
    );
    assert!(
        !Path::new(&format!("/sys/fs/bpf/hostile-{}", std::process::id())).exists(),
        "nothing pinned through the link"
    );
    std::fs::remove_dir_all(&planted).unwrap();
    std::fs::remove_file(&link).unwrap();
    std::fs::remove_dir_all(&above).unwrap();
}

#[test]
fn a_second_load_of_the_same_instance_is_refused_and_others_keep_their_pins() {
    let _g = serial();
    let Some(first) = load("twice", |_| {}) else {
        return;
    };
    let dir = first.pins().0.unwrap().to_owned();
    first.publish_slots(&SlotsCounters {
        waiters: 7,
        ..SlotsCounters::default()
    });
    // The same root and (default) instance name: the first is alive.
    let err = SlotringBpf::load(BpfConfig {
        pin_dir: pin_dir("twice"),
        ..BpfConfig::default()
    })
    .expect_err("the first instance is live");
    assert!(matches!(err, BpfError::InstanceInUse { .. }), "{err:?}");
    assert_eq!(
        formatted(&bpftool_dump(&dir.join("slots")), 0)["waiters"],
        7
    );
    // Another instance name in the same root: its own directory; dropping
    // it leaves the first's pins.
    let Some(second) = load("twice", |c| c.instance = Some("second".into())) else {
        return;
    };
    let dir2 = second.pins().0.unwrap().to_owned();
    assert_eq!(dir2, pin_dir("twice").join("second"));
    assert_ne!(dir, dir2);
    drop(second);
    assert!(!dir2.exists());
    assert_eq!(
        formatted(&bpftool_dump(&dir.join("slots")), 0)["waiters"],
        7
    );
    let names: Vec<_> = slotring_bpf::pins::instances(&pin_dir("twice"))
        .unwrap()
        .into_iter()
        .map(|i| (i.name, i.liveness))
        .collect();
    assert_eq!(
        names,
        vec![(
            std::process::id().to_string(),
            slotring_bpf::pins::Liveness::Live
        )]
    );
    drop(first);
    assert!(!pin_dir("twice").exists(), "no empty root left");
}

#[test]
fn stale_pins_of_a_dead_process_are_seen_and_removed_by_the_next_load() {
    let _g = serial();
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        eprintln!("SKIP: kernel has no BTF");
        return;
    }
    let root = pin_dir("stale");
    let out = Command::new(env!("CARGO_BIN_EXE_slotring-bpf-report"))
        .arg("--pin-dir")
        .arg(&root)
        .args(["--park-ms", "1", "--keep-pins"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dead: Vec<_> = slotring_bpf::pins::instances(&root).unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].liveness, slotring_bpf::pins::Liveness::Gone);
    assert!(dead[0].path.join("slots").exists());
    let Some(bpf) = load("stale", |_| {}) else {
        return;
    };
    assert_eq!(bpf.removed_stale(), [dead[0].path.clone()]);
    assert!(!dead[0].path.exists());
    drop(bpf);
    assert!(!root.exists(), "no empty pin directory left behind");
}

#[test]
fn keep_pins_survive_drop() {
    let _g = serial();
    let Some(bpf) = load("keep", |c| c.keep_pins = true) else {
        return;
    };
    let dir = bpf.pins().0.unwrap().to_owned();
    bpf.publish_slots(&SlotsCounters {
        waiters: 42,
        ..SlotsCounters::default()
    });
    drop(bpf);
    let v = bpftool_dump(&dir.join("slots"));
    assert_eq!(formatted(&v, 0)["waiters"], 42);
    std::fs::remove_dir_all(pin_dir("keep")).unwrap();
}

#[test]
fn degraded_without_privileges_runs_and_says_so() {
    let _g = serial();
    let dir = pin_dir("degraded");
    let out = Command::new("setpriv")
        .args([
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--ambient-caps=-all",
        ])
        .arg(env!("CARGO_BIN_EXE_slotring-bpf-report"))
        .arg("--pin-dir")
        .arg(&dir)
        .args(["--park-ms", "20", "--reload"])
        .output()
        .expect("setpriv (util-linux) runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(out.status.success(), "the child ran on without probes");
    assert!(
        stdout.contains("probes: degraded: no privilege"),
        "{stdout}"
    );
    assert!(
        stdout.contains("counters: ok"),
        "plain-memory counters work: {stdout}"
    );
    assert!(stdout.contains("verdict: UNVERIFIED"), "{stdout}");
    // Two instances were created (--reload); the degradation is said once.
    assert_eq!(
        stderr.matches("running without kernel probes").count(),
        1,
        "said once: {stderr}"
    );
    assert!(!dir.exists());
}

#[test]
fn verifier_rejection_is_a_typed_error_with_the_log() {
    let _g = serial();
    match SlotringBpf::check_program("switch_btf", "sched_switch") {
        Err(BpfError::NoBtf(why)) => {
            eprintln!("SKIP: kernel has no BTF: {why}");
            return;
        }
        other => other.expect("switch_btf verifies against sched_switch"),
    }
    // sched_wakeup has one argument; switch_btf reads three.
    let err = SlotringBpf::check_program("switch_btf", "sched_wakeup").unwrap_err();
    match &err {
        BpfError::Verifier { program, log, .. } => {
            assert_eq!(program, "switch_btf");
            assert!(!log.trim().is_empty(), "the verifier log is included");
        }
        other => panic!("expected a verifier rejection, got {other}"),
    }
    let text = err.to_string();
    println!("{text}");
    assert!(
        text.contains("verifier rejected program `switch_btf`"),
        "{text}"
    );
    assert!(matches!(
        SlotringBpf::check_program("no_such_prog", "sched_switch"),
        Err(BpfError::NotInObject { .. })
    ));
}

#[test]
fn abi_matches_btf_of_the_object() {
    let tmp = std::env::temp_dir().join(format!("slotring-abi-{}.bpf.o", std::process::id()));
    std::fs::write(&tmp, slotring_bpf::OBJECT).unwrap();
    let out = Command::new("bpftool")
        .args(["-j", "btf", "dump", "file"])
        .arg(&tmp)
        .output()
        .expect("bpftool is installed");
    std::fs::remove_file(&tmp).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let btf: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let types = btf["types"].as_array().unwrap();
    let check = |c_name: &str, size: usize, layout: Vec<slotring_bpf::FieldLayout>| {
        let t = types
            .iter()
            .find(|t| t["kind"] == "STRUCT" && t["name"] == c_name)
            .unwrap_or_else(|| panic!("struct {c_name} in BTF"));
        assert_eq!(t["size"], size as u64, "sizeof(struct {c_name})");
        let members = t["members"].as_array().unwrap();
        assert_eq!(members.len(), layout.len(), "{c_name} member count");
        for (m, f) in members.iter().zip(&layout) {
            assert_eq!(m["name"], f.name, "{c_name} member order");
            assert_eq!(
                m["bits_offset"],
                (f.offset * 8) as u64,
                "{c_name}.{}",
                f.name
            );
        }
    };
    use slotring_bpf::{Hist, LeaseClock, LeaseSlot, Owner, ThreadAcct};
    check("lease_clock", size_of::<LeaseClock>(), LeaseClock::layout());
    check("lease_slot", size_of::<LeaseSlot>(), LeaseSlot::layout());
    check("thread_acct", size_of::<ThreadAcct>(), ThreadAcct::layout());
    check("hist", size_of::<Hist>(), Hist::layout());
    check("owner", size_of::<Owner>(), Owner::layout());
    check(
        "throttle_stats",
        size_of::<ThrottleStats>(),
        ThrottleStats::layout(),
    );
    check(
        "slots_stats",
        size_of::<SlotsCounters>(),
        SlotsCounters::layout(),
    );
    check(
        "uring_stats",
        size_of::<UringCounters>(),
        UringCounters::layout(),
    );
}
