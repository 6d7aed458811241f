//! `slotring-bpf-report`: load the probes (or run degraded), park one thread
//! four times in a real sleep and one four times in a spin, and print the
//! verification report.
//!
//! `slotring-bpf-report [--pin-dir DIR] [--keep-pins] [--park-ms N] [--reload]`
//! (built with `cargo build -p slotring-bpf --features report-bin`).
//! (`--reload`: load and drop one instance first, to check reloading).
//! Exit status 0 when the run behaved as expected: with probes, the sleeper
//! passes and the spinner fails; without probes, the verdict is unverified
//! and the counters still round-trip through plain memory.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use slotring_bpf::{BpfConfig, ProbeStatus, SlotringBpf, Verdict, VerifyConfig};
use slotring_slots::SlotsCounters;
use slotring_throttle::{LeaseState, notify_lease_state};

fn main() -> Result<()> {
    let mut cfg = BpfConfig::default();
    let mut park_ms = 200u64;
    let mut reload = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pin-dir" => cfg.pin_dir = args.next().context("--pin-dir needs a value")?.into(),
            "--keep-pins" => cfg.keep_pins = true,
            "--park-ms" => park_ms = args.next().context("--park-ms needs a value")?.parse()?,
            "--reload" => reload = true,
            other => bail!("unknown argument `{other}`"),
        }
    }
    if reload {
        drop(SlotringBpf::load_or_degrade(cfg.clone()));
    }
    let bpf = SlotringBpf::load_or_degrade(cfg);
    match bpf.status() {
        ProbeStatus::Attached(mode) => println!("probes: attached ({mode:?})"),
        ProbeStatus::Degraded(e) => {
            // The reason and each of its causes, once.
            let causes: Vec<String> =
                std::iter::successors(Some(e as &dyn std::error::Error), |e| e.source())
                    .map(ToString::to_string)
                    .collect();
            println!("probes: degraded: {}", causes.join(": "));
        }
    }
    slotring_bpf::install_lease_observer();

    let stats = SlotsCounters {
        slots_granted: 3,
        parks: 2,
        ..SlotsCounters::default()
    };
    bpf.publish_slots(&stats);
    if bpf.slot_stats() != stats {
        bail!("slot counters did not round-trip");
    }
    println!("counters: ok");

    // Each thread parks PARKS times: more hot episodes than a thread is
    // tolerated (`slotring_bpf::TOLERATED_HOT_EPISODES`) for the spinner.
    const PARKS: u32 = 4;
    let park = Duration::from_millis(park_ms);
    let sleeper = std::thread::spawn(move || {
        notify_lease_state(LeaseState::Running);
        for _ in 0..PARKS {
            notify_lease_state(LeaseState::Parked);
            std::thread::sleep(park);
            notify_lease_state(LeaseState::Running);
        }
        notify_lease_state(LeaseState::NotHolding);
        nix::unistd::gettid().as_raw() as u32
    });
    let spinner = std::thread::spawn(move || {
        notify_lease_state(LeaseState::Running);
        for _ in 0..PARKS {
            notify_lease_state(LeaseState::Parked);
            let t = Instant::now();
            while t.elapsed() < park {
                std::hint::spin_loop();
            }
            notify_lease_state(LeaseState::Running);
        }
        notify_lease_state(LeaseState::NotHolding);
        nix::unistd::gettid().as_raw() as u32
    });
    let tids = [
        sleeper.join().expect("sleeper"),
        spinner.join().expect("spinner"),
    ];
    let report = bpf.verify(&tids, VerifyConfig::default())?;
    print!("{report}");
    match (&report.verdict, bpf.is_attached()) {
        (Verdict::Unverified { .. }, false) => Ok(()),
        (Verdict::Fail { tids: bad }, true) if bad == &[tids[1]] => Ok(()),
        (v, _) => bail!("unexpected verdict {v:?}"),
    }
}
