//! `kernel.io_uring_disabled=2` on the real kernel: the `Send` handle falls
//! back to pread and says why. Its own test binary, so no other test of
//! this crate sets up a ring while the sysctl is set (it is set only around
//! one `open`, and always restored).

mod common;

use common::*;
use slotring_uring::{SharedConfig, SharedEngine};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

const SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";

/// Restores the sysctl however the test ends.
struct Restore(String);
impl Drop for Restore {
    fn drop(&mut self) {
        std::fs::write(SYSCTL, &self.0).expect("restore kernel.io_uring_disabled");
    }
}

/// The real kernel refusing io_uring (`kernel.io_uring_disabled=2`): the
/// handle falls back to pread and says why. The sysctl is set only around
/// `open` (other processes on the machine share it) and always restored.
#[test]
fn io_uring_disabled_sysctl_falls_back_to_pread() {
    let Ok(old) = std::fs::read_to_string(SYSCTL) else {
        eprintln!("skipped: {SYSCTL} does not exist on this kernel");
        return;
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: setting {SYSCTL} needs root");
        return;
    }
    let tf = disk_file(256 << 10, 53);
    rt().block_on(async {
        let opened = {
            let _restore = Restore(old.clone());
            std::fs::write(SYSCTL, "2").unwrap();
            SharedEngine::open(&SharedConfig::default())
        };
        assert_eq!(std::fs::read_to_string(SYSCTL).unwrap(), old, "restored");
        let (e, why) = opened.unwrap();
        assert_eq!(e.kind(), "pread");
        let why = why.expect("the reason is handed back");
        assert!(why.to_string().contains("io_uring_disabled"), "{why}");
        let (r, buf) = e
            .read_at(&tf.file, vec![0; 256 << 10], 0, None, NO_CAP)
            .await;
        assert_eq!(r.unwrap(), 256 << 10);
        assert_eq!(buf, tf.data);
    });
}
