//! Live and stale instances seen through the pinned-map reader and the
//! collector, against the real kernel (run as root): a child process pins,
//! is killed with SIGKILL, and its pins must read as stale.
#![cfg(feature = "bpf")]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use slotring::bpf::{BpfConfig, BpfError, SlotringBpf};
use slotring::metrics::{INSTANCE_LABEL, SlotringCollector};
use slotring::pinned::{self, Liveness, PinnedError};

const CHILD: &str = "SLOTRING_TEST_PIN_CHILD";

/// In the re-executed child: load with probes under the given root, say
/// `ready <dir>`, and wait to be killed.
#[test]
fn child_holds_pins() {
    let Ok(root) = std::env::var(CHILD) else {
        return;
    };
    let bpf = SlotringBpf::load(BpfConfig {
        pin_dir: root.into(),
        ..BpfConfig::default()
    })
    .expect("load");
    println!("ready {}", bpf.pins().0.unwrap().display());
    std::thread::sleep(std::time::Duration::from_secs(60));
}

/// Kills the child if the test fails before it does.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scrape(c: SlotringCollector) -> String {
    let registry = prometheus::Registry::new();
    registry.register(Box::new(c)).unwrap();
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap()
}

#[test]
fn a_killed_instance_reads_as_stale_and_unattached() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    match SlotringBpf::check_program("switch_btf", "sched_switch") {
        Err(BpfError::NoBtf(why)) => {
            eprintln!("SKIP: kernel has no BTF: {why}");
            return;
        }
        other => other.expect("the object verifies"),
    }
    let root = PathBuf::from(format!(
        "/sys/fs/bpf/slotring-test-{}-facade",
        std::process::id()
    ));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holds_pins",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &root)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut child = KillOnDrop(child);
    let dir = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited early");
        // (libtest prints `test child_holds_pins ... ` before it.)
        if let Some((_, d)) = line.trim().split_once("ready ") {
            break PathBuf::from(d);
        }
    };
    let name = child.0.id().to_string();
    assert_eq!(dir, root.join(&name));

    // Live: selected, labelled, attached.
    let live = pinned::select(&root, None).unwrap();
    assert_eq!(
        (live.name.as_str(), live.liveness),
        (name.as_str(), Liveness::Live)
    );
    let text = scrape(SlotringCollector::pinned_instances(&root));
    let attached = |v: u8| format!("slotring_probes_attached{{{INSTANCE_LABEL}=\"{name}\"}} {v}\n");
    assert!(text.contains(&attached(1)), "{text}");

    child.0.kill().unwrap(); // SIGKILL: no destructor runs, the pins stay
    child.0.wait().unwrap();
    assert!(dir.join("slots").exists(), "the pins outlive the process");

    let all = pinned::instances(&root).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].liveness, Liveness::Gone);
    let err = pinned::select(&root, None).unwrap_err();
    assert!(matches!(err, PinnedError::Stale { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!("process {name}")),
        "{err}"
    );
    let text = scrape(SlotringCollector::pinned_instances(&root));
    assert!(text.contains(&attached(0)), "{text}");
    assert!(
        !text.contains("slotring_slots_"),
        "no frozen counters: {text}"
    );
    assert!(text.contains("slotring_exporter_up 1"), "{text}");

    // The next load removes the provably dead instance, and its own drop
    // leaves no empty root behind.
    let next = SlotringBpf::load(BpfConfig {
        pin_dir: root.clone(),
        ..BpfConfig::default()
    })
    .unwrap();
    assert_eq!(next.removed_stale(), std::slice::from_ref(&dir));
    drop(next);
    assert!(!root.exists());
}
