//! Loading the probes in a kernel test (run as root).
//!
//! Every test takes [`serial`]: the probes, the process-wide lease observer
//! and the fd accounting are per process, so kernel tests run one at a time.

#![allow(dead_code, reason = "each includer uses part of it")]

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use slotring_bpf::{BpfConfig, BpfError, SlotringBpf};

static SERIAL: Mutex<()> = Mutex::new(());

/// Install the lease observer and take the test lock.
pub fn serial() -> MutexGuard<'static, ()> {
    slotring_bpf::install_lease_observer();
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pin root of `test`.
pub fn pin_dir(test: &str) -> PathBuf {
    PathBuf::from(format!(
        "/sys/fs/bpf/slotring-test-{}-{test}",
        std::process::id()
    ))
}

/// Load, or skip (with the reason printed) only when the kernel lacks a
/// feature this needs.
pub fn load(test: &str, tweak: impl FnOnce(&mut BpfConfig)) -> Option<SlotringBpf> {
    let mut cfg = BpfConfig {
        pin_dir: pin_dir(test),
        ..BpfConfig::default()
    };
    tweak(&mut cfg);
    match SlotringBpf::load(cfg) {
        Ok(b) => Some(b),
        Err(BpfError::NoBtf(why)) => {
            eprintln!("SKIP {test}: kernel has no BTF: {why}");
            None
        }
        Err(e) => panic!("{test}: loading the probes failed: {e}"),
    }
}

/// The calling thread's id.
pub fn tid() -> u32 {
    nix::unistd::gettid().as_raw() as u32
}
