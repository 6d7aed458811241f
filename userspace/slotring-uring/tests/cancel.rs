//! `IoEngine::cancel_paced_writes_on` on the real kernel, both blocking
//! engines: a paced write under a rate at which it would take days ends
//! as `Cancelled` soon after its flag is set, wherever it waits (its turn,
//! the catch-up pacer), having written no piece whose turn had not come;
//! and reads and unpaced writes do not look at the flag.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use slotring_throttle::{ThrottlePtr, Throttler};
use slotring_uring::{
    BufResult, IoEngine, Policy, PreadEngine, RingConfig, UringCounters, UringEngine, UringError,
    UringFile,
};

/// The engines' piece size (`policy::WRITEBACK_PIECE`).
const PIECE: u64 = 256 << 10;
/// How long the engines wait on one throttle level inside a request.
const MAX_BLOCK: Duration = Duration::from_millis(100);
/// The bound within which a test's engine call must return; it only keeps
/// a broken engine from hanging the test (the write it cancels would take
/// days).
const HANG: Duration = Duration::from_secs(60);

fn engines(policy: Policy) -> Vec<Box<dyn IoEngine>> {
    let ring = RingConfig {
        policy,
        ..RingConfig::default()
    };
    vec![
        Box::new(PreadEngine::new(policy)),
        Box::new(UringEngine::new(&ring).expect("io_uring is enabled on this machine")),
    ]
}

/// A block-device limit of `rate` bytes/s with a 100 ms burst.
fn disk_limit(rate: u64) -> Arc<Throttler> {
    Arc::new(
        Throttler::builder(rate)
            .burst(Duration::from_millis(100))
            .limits_block_device_bandwidth(true)
            .build()
            .unwrap(),
    )
}

/// An empty file on a disk filesystem.
fn empty_disk_file() -> (Arc<UringFile>, tempfile::TempPath) {
    let (f, path) = tempfile::Builder::new()
        .prefix("slotring-cancel-")
        .tempfile_in(disk_dir())
        .unwrap()
        .into_parts();
    drop(f);
    (UringFile::new(open_rw(&path)).unwrap(), path)
}

/// Run `f` with `e` on a thread of its own; its result and the engine's
/// counters, or a panic after [`HANG`].
fn bounded(
    mut e: Box<dyn IoEngine>,
    f: impl FnOnce(&mut dyn IoEngine) -> BufResult<usize, Vec<u8>> + Send + 'static,
) -> (Result<usize, UringError>, UringCounters, &'static str) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (r, _buf) = f(e.as_mut());
        let _ = tx.send((r, e.counters(), e.kind()));
    });
    rx.recv_timeout(HANG)
        .unwrap_or_else(|_| panic!("the engine call did not return within {HANG:?}"))
}

#[test]
fn a_paced_write_of_days_ends_as_cancelled_once_its_flag_is_set() {
    for mut e in engines(Policy::default()) {
        let flag = Arc::new(AtomicBool::new(false));
        assert!(e.cancel_paced_writes_on(flag.clone()), "{}", e.kind());
        let (f, _path) = empty_disk_file();
        // 1 byte/s: each 256 KiB piece's turn (and its pacer slot) is three
        // days after the one before.
        let limit: ThrottlePtr = disk_limit(1);
        let file = f.clone();
        let setter = std::thread::spawn({
            let flag = flag.clone();
            move || {
                std::thread::sleep(Duration::from_millis(400));
                flag.store(true, Ordering::Relaxed);
            }
        });
        let (r, c, kind) = bounded(e, move |e| {
            e.write_at(&file, vec![7u8; 4 << 20], 0, Some(&limit), MAX_BLOCK)
        });
        setter.join().unwrap();
        assert!(matches!(r, Err(UringError::Cancelled)), "{kind}: {r:?}");
        assert_eq!(c.cancellations, 1, "{kind}: {c:?}");
        // Only the first piece's turn came (within its first wait, capped at
        // MAX_BLOCK): the rest were never written, and nobody is told of
        // the one that was.
        assert_eq!(c.paced_bytes, PIECE, "{kind}: {c:?}");
        assert_eq!(c.write_bytes, 0, "{kind}: {c:?}");
        assert!(
            f.file().metadata().unwrap().len() <= PIECE,
            "{kind}: a piece whose turn had not come was written"
        );
        // The device has what was written: nothing is left under
        // writeback by the cancelled write.
        let st = cache_stat(&f, 0, 4 << 20);
        assert_eq!(st.nr_writeback, 0, "{kind}: {st:?}");
    }
}

#[test]
fn a_flag_set_before_the_write_stops_it_before_its_first_piece() {
    for mut e in engines(Policy::default()) {
        let flag = Arc::new(AtomicBool::new(true));
        assert!(e.cancel_paced_writes_on(flag));
        let (f, _path) = empty_disk_file();
        let limit: ThrottlePtr = disk_limit(1);
        let file = f.clone();
        let (r, c, kind) = bounded(e, move |e| {
            e.write_at(&file, vec![7u8; 1 << 20], 0, Some(&limit), MAX_BLOCK)
        });
        assert!(matches!(r, Err(UringError::Cancelled)), "{kind}: {r:?}");
        assert_eq!((c.paced_bytes, c.write_bytes), (0, 0), "{kind}: {c:?}");
        assert_eq!(f.file().metadata().unwrap().len(), 0, "{kind}");
    }
}

#[test]
fn reads_and_unpaced_writes_do_not_look_at_the_flag() {
    let unpaced = Policy {
        pace_writeback: false,
        ..Policy::default()
    };
    for mut e in engines(unpaced) {
        let flag = Arc::new(AtomicBool::new(true));
        assert!(e.cancel_paced_writes_on(flag));
        let (f, _path) = empty_disk_file();
        // 1 MiB/s with a 100 ms burst: 256 KiB waits about 150 ms, which a
        // set flag must not cut short (the wait is capped by MAX_BLOCK and
        // waited out).
        let limit: ThrottlePtr = disk_limit(1 << 20);
        let (file, lim) = (f.clone(), limit.clone());
        let (r, c, kind) = bounded(e, move |e| {
            e.write_at(&file, vec![7u8; PIECE as usize], 0, Some(&lim), MAX_BLOCK)
        });
        assert_eq!(r.unwrap(), PIECE as usize, "{kind}");
        assert_eq!((c.cancellations, c.paced_bytes), (0, 0), "{kind}: {c:?}");
        assert!(c.waits_submitted > 0, "{kind}: the write waited: {c:?}");
    }
    for mut e in engines(Policy::default()) {
        let flag = Arc::new(AtomicBool::new(true));
        assert!(e.cancel_paced_writes_on(flag));
        let data = disk_file(PIECE as usize, 3);
        let limit: ThrottlePtr = disk_limit(1 << 20);
        let file = data.file.clone();
        let (r, c, kind) = bounded(e, move |e| {
            e.read_at(&file, vec![0u8; PIECE as usize], 0, Some(&limit), MAX_BLOCK)
        });
        assert_eq!(r.unwrap(), PIECE as usize, "{kind}");
        assert_eq!(c.cancellations, 0, "{kind}: {c:?}");
    }
}
