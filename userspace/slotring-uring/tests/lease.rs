//! The blocking front end parks the caller's CPU lease exactly while it
//! waits on a throttle timeout, and never while the kernel moves data for
//! it: a lease holder's pre-IO wait goes out as a standalone timeout, the IO
//! only after the lease is back. Without a lease the wait stays linked.
//!
//! A [`LeaseHook`] test double and a logging [`Syscalls`] seam record, on
//! the calling thread, every park/unpark, every `io_uring_enter` (with the
//! lease state at entry and the SQEs it submits) and every CQE (with the
//! lease state when it was reaped, i.e. right after the enter that produced
//! it). All state is thread-local, so the tests run in parallel.

mod common;

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Once};
use std::time::Duration;

use common::*;
use slotring_throttle::{LeaseHook, ThrottlePtr, Throttler, install_lease_hook};
use slotring_uring::{
    IoEngine, IoUring, RealSyscalls, RingConfig, Syscalls, UringEngine, UringError,
};

const TAG_IO: u64 = 0;
const TAG_WAIT: u64 = 1;
const TAG_POST_WAIT: u64 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Park,
    Unpark,
    Enter { to_submit: u32, parked: bool },
    Cqe { tag: u64, res: i32, parked: bool },
}

thread_local! {
    static HAS_LEASE: Cell<bool> = const { Cell::new(false) };
    static PARKED: Cell<bool> = const { Cell::new(false) };
    static FAIL_PARKED_ENTER: Cell<Option<i32>> = const { Cell::new(None) };
    static LOG: RefCell<Vec<Ev>> = const { RefCell::new(Vec::new()) };
}

fn log(e: Ev) {
    LOG.with(|l| l.borrow_mut().push(e));
}

fn take_log() -> Vec<Ev> {
    LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

fn parked() -> bool {
    PARKED.with(Cell::get)
}

struct Hook;
impl LeaseHook for Hook {
    fn park_current(&self) -> bool {
        if !HAS_LEASE.with(Cell::get) {
            return false;
        }
        assert!(!parked(), "parked twice");
        PARKED.with(|p| p.set(true));
        PARKERS.lock().unwrap().push(std::thread::current().id());
        log(Ev::Park);
        true
    }
    fn unpark_current(&self) {
        assert!(parked(), "unparked without a park");
        PARKED.with(|p| p.set(false));
        log(Ev::Unpark);
    }
}
static HOOK: Hook = Hook;
/// The threads that parked a lease, one entry per park: what another
/// thread can wait for.
static PARKERS: std::sync::Mutex<Vec<std::thread::ThreadId>> = std::sync::Mutex::new(Vec::new());

/// The real kernel, every enter and completion logged.
struct LogSys;
impl Syscalls for LogSys {
    fn io_uring_enter(&mut self, ring: &IoUring, s: u32, m: u32, f: u32) -> std::io::Result<usize> {
        log(Ev::Enter {
            to_submit: s,
            parked: parked(),
        });
        if parked()
            && let Some(e) = FAIL_PARKED_ENTER.with(Cell::take)
        {
            return Err(std::io::Error::from_raw_os_error(e));
        }
        RealSyscalls.io_uring_enter(ring, s, m, f)
    }
    fn completion(&mut self, user_data: u64, res: &mut i32) {
        log(Ev::Cqe {
            tag: user_data & 3,
            res: *res,
            parked: parked(),
        });
    }
}

fn setup(has_lease: bool) -> UringEngine {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| assert!(install_lease_hook(&HOOK), "our hook is the only one"));
    HAS_LEASE.with(|h| h.set(has_lease));
    let e = UringEngine::with_syscalls(&RingConfig::default(), Box::new(LogSys)).unwrap();
    // The ring's warm-up NOP (one enter and its CQE, running) is not part
    // of what the tests look at.
    let warm_up = take_log();
    assert!(
        matches!(
            warm_up[..],
            [
                Ev::Enter {
                    to_submit: 1,
                    parked: false
                },
                Ev::Cqe { res: 0, .. }
            ]
        ),
        "{warm_up:?}"
    );
    e
}

/// A throttler that does not care about the page cache (no NOWAIT probe):
/// `rate` bytes/s, 10 ms of burst.
fn plain(rate: u64) -> ThrottlePtr {
    Arc::new(
        Throttler::builder(rate)
            .burst(Duration::from_millis(10))
            .build()
            .unwrap(),
    )
}

fn pos(log: &[Ev], f: impl Fn(&Ev) -> bool) -> Vec<usize> {
    log.iter()
        .enumerate()
        .filter(|(_, e)| f(e))
        .map(|(i, _)| i)
        .collect()
}

fn cqe(log: &[Ev], tag: u64) -> Vec<usize> {
    pos(log, |e| matches!(e, Ev::Cqe { tag: t, .. } if *t == tag))
}

fn is_park(e: &Ev) -> bool {
    matches!(e, Ev::Park)
}

fn is_unpark(e: &Ev) -> bool {
    matches!(e, Ev::Unpark)
}

fn is_enter(e: &Ev) -> bool {
    matches!(e, Ev::Enter { .. })
}

#[test]
fn a_lease_holder_is_parked_during_the_wait_and_unparked_during_the_io() {
    let mut e = setup(true);
    let tf = disk_file(1 << 20, 60);
    let (r, _) = e.read_at(&tf.file, vec![0; 4096], 0, None, NO_CAP);
    r.unwrap();
    assert!(
        pos(&take_log(), is_park).is_empty(),
        "an unthrottled read parks nothing"
    );

    // 512 KiB at 8 MiB/s with 80 KiB of burst: a ~50 ms wait before the read.
    let t = plain(8 << 20);
    let (r, buf) = e.read_at(&tf.file, vec![0; 512 << 10], 0, Some(&t), NO_CAP);
    assert_eq!(r.unwrap(), 512 << 10);
    assert_eq!(buf, tf.data[..512 << 10], "data intact");
    assert_eq!(e.counters().waits_submitted, 1);
    assert!(!parked());
    let log = take_log();

    let parks = pos(&log, is_park);
    let unparks = pos(&log, is_unpark);
    assert_eq!(
        (parks.len(), unparks.len()),
        (1, 1),
        "one wait, one park: {log:?}"
    );
    let (park, unpark) = (parks[0], unparks[0]);
    let waits = cqe(&log, TAG_WAIT);
    let ios = cqe(&log, TAG_IO);
    assert_eq!((waits.len(), ios.len()), (1, 1), "{log:?}");
    let (wait, io) = (waits[0], ios[0]);
    // The timeout expires inside the parked enter; the lease is back as
    // soon as that enter returns, before its CQE is reaped (reaping is the
    // thread's own work).
    assert!(
        park < unpark && unpark < wait && wait < io,
        "park, unpark, timeout CQE, IO CQE: {log:?}"
    );
    assert!(
        matches!(log[unpark - 1], Ev::Enter { parked: true, .. }),
        "the wait's enter went out parked and returned into the unpark: {log:?}"
    );
    assert!(
        matches!(log[wait], Ev::Cqe { res, parked: false, .. } if res == -libc::ETIME),
        "the timeout expired, reaped unparked: {log:?}"
    );
    assert!(matches!(log[io], Ev::Cqe { parked: false, .. }), "{log:?}");
    // Nothing reached the ring before the park: the wait went out parked,
    // alone (not linked to its IO).
    assert!(pos(&log[..park], is_enter).is_empty(), "{log:?}");
    let enters = pos(&log, is_enter);
    assert!(
        matches!(
            log[enters[0]],
            Ev::Enter {
                to_submit: 1,
                parked: true
            }
        ),
        "the timeout alone, parked: {log:?}"
    );
    // The IO was submitted by the first enter after the timeout's CQE, with
    // the lease back: the kernel copied the data on a running lease.
    let io_enter = *enters
        .iter()
        .find(|&&i| i > wait)
        .expect("an enter for the IO");
    assert!(
        matches!(
            log[io_enter],
            Ev::Enter {
                to_submit: 1,
                parked: false
            }
        ),
        "{log:?}"
    );
    assert!(io_enter > unpark && io_enter < io);
}

#[test]
fn without_a_lease_the_wait_stays_linked_to_its_io() {
    let mut e = setup(false);
    let tf = disk_file(1 << 20, 61);
    let t = plain(8 << 20);
    let (r, buf) = e.read_at(&tf.file, vec![0; 512 << 10], 0, Some(&t), NO_CAP);
    assert_eq!(r.unwrap(), 512 << 10);
    assert_eq!(buf, tf.data[..512 << 10]);
    assert_eq!(e.counters().waits_submitted, 1);
    let log = take_log();
    assert!(
        pos(&log, |e| is_park(e) || is_unpark(e)).is_empty(),
        "{log:?}"
    );
    let enters = pos(&log, is_enter);
    assert!(
        matches!(
            log[enters[0]],
            Ev::Enter {
                to_submit: 2,
                parked: false
            }
        ),
        "timeout and IO in one submission (one kernel-linked chain): {log:?}"
    );
    assert_eq!(
        pos(&log, |e| matches!(e, Ev::Enter { to_submit: 1.., .. })).len(),
        1,
        "no second submission: {log:?}"
    );
}

#[test]
fn io_without_a_throttle_delay_parks_nothing() {
    let mut e = setup(true);
    let tf = disk_file(1 << 20, 62);
    // Unthrottled, then throttled within the burst (1 GiB/s, 1 s of burst),
    // then a page-cache hit detected with NOWAIT (charged to the parent).
    let roomy: ThrottlePtr = Arc::new(Throttler::builder(1 << 30).build().unwrap());
    let (_d, _p, chain) = disk_chain(1 << 30, 1 << 30);
    let (r, _) = e.read_at(&tf.file, vec![0; 256 << 10], 0, None, NO_CAP);
    r.unwrap();
    let (r, _) = e.read_at(&tf.file, vec![0; 256 << 10], 0, Some(&roomy), NO_CAP);
    r.unwrap();
    let (r, _) = e.write_at(&tf.file, tf.data[..4096].to_vec(), 0, Some(&roomy), NO_CAP);
    r.unwrap();
    let (r, buf) = e.read_at(&tf.file, vec![0; 256 << 10], 0, Some(&chain), NO_CAP);
    assert_eq!(r.unwrap(), 256 << 10);
    assert_eq!(buf, tf.data[..256 << 10]);
    let c = e.counters();
    assert!(c.page_cache_hits >= 1, "{c:?}");
    assert_eq!(c.waits_submitted, 0);
    let log = take_log();
    assert!(
        pos(&log, |e| is_park(e) || is_unpark(e)).is_empty(),
        "{log:?}"
    );
}

/// Read `[0, len)` of `tf` until cachestat(2) reports every page of it
/// cached (bounded retries, then fail: the test needs a page-cache hit).
fn make_cached(e: &mut UringEngine, tf: &TestFile, len: usize) {
    let pages = (len as u64).div_ceil(4096);
    for _ in 0..20 {
        let (r, _) = e.read_at(&tf.file, vec![0; len], 0, None, NO_CAP);
        assert_eq!(r.unwrap(), len);
        if cached_pages(&tf.file, 0, len as u64) >= pages {
            return;
        }
    }
    panic!(
        "{} of {pages} pages cached after 20 reads",
        cached_pages(&tf.file, 0, len as u64)
    );
}

#[test]
fn a_page_cache_charge_wait_after_the_read_is_parked() {
    let mut e = setup(true);
    let tf = disk_file(1 << 20, 63);
    make_cached(&mut e, &tf, 512 << 10);
    // The block device is fast; its parent (which counts page-cache reads)
    // allows 8 MiB/s with 80 KiB of burst.
    let parent: ThrottlePtr = plain(8 << 20);
    let disk: ThrottlePtr = Arc::new(
        Throttler::builder(1 << 30)
            .limits_block_device_bandwidth(true)
            .parent(parent)
            .build()
            .unwrap(),
    );
    take_log();
    let (r, buf) = e.read_at(&tf.file, vec![0; 512 << 10], 0, Some(&disk), NO_CAP);
    assert_eq!(r.unwrap(), 512 << 10);
    assert_eq!(buf, tf.data[..512 << 10]);
    let c = e.counters();
    assert_eq!(c.page_cache_hits, 1, "{c:?}");
    assert_eq!(c.waits_submitted, 1, "{c:?}");
    let log = take_log();
    let (parks, unparks) = (pos(&log, is_park), pos(&log, is_unpark));
    assert_eq!((parks.len(), unparks.len()), (1, 1), "{log:?}");
    let ios = cqe(&log, TAG_IO);
    let posts = cqe(&log, TAG_POST_WAIT);
    assert_eq!((ios.len(), posts.len()), (1, 1), "{log:?}");
    assert!(
        ios[0] < parks[0] && parks[0] < unparks[0] && unparks[0] < posts[0],
        "the hit is copied unparked, the charge's wait is parked: {log:?}"
    );
    assert!(matches!(log[ios[0]], Ev::Cqe { parked: false, .. }));
    assert!(
        matches!(log[unparks[0] - 1], Ev::Enter { parked: true, .. }),
        "the wait's enter went out parked: {log:?}"
    );
    assert!(matches!(log[posts[0]], Ev::Cqe { parked: false, .. }));
}

#[test]
fn with_other_requests_in_flight_nothing_is_parked_and_the_wait_stays_linked() {
    let mut e = setup(true);
    let tf = disk_file(1 << 20, 64);
    let other = e.submit_read(&tf.file, vec![0; 4096], 0, None, NO_CAP);
    let t = plain(8 << 20);
    let (r, buf) = e.read_at(&tf.file, vec![0; 512 << 10], 0, Some(&t), NO_CAP);
    assert_eq!(r.unwrap(), 512 << 10);
    assert_eq!(buf, tf.data[..512 << 10]);
    let c = e.wait(other).unwrap();
    assert_eq!(c.buf, tf.data[..4096]);
    let log = take_log();
    assert!(
        pos(&log, |e| is_park(e) || is_unpark(e)).is_empty(),
        "a linked IO of another request could run on this thread: {log:?}"
    );
    let enters = pos(&log, is_enter);
    assert!(
        matches!(log[enters[0]], Ev::Enter { to_submit: 3, .. }),
        "the other read plus a linked chain: {log:?}"
    );
}

#[test]
fn a_ring_failure_during_a_parked_wait_unparks_and_abandons_the_request() {
    let mut e = setup(true);
    let tf = disk_file(1 << 20, 65);
    let t = plain(8 << 20);
    FAIL_PARKED_ENTER.with(|f| f.set(Some(libc::EBADF)));
    let (r, buf) = e.read_at(&tf.file, vec![0; 512 << 10], 0, Some(&t), NO_CAP);
    let err = r.unwrap_err();
    assert!(
        matches!(
            err,
            UringError::Ring {
                what: "io_uring_enter",
                ..
            }
        ),
        "{err}"
    );
    assert!(buf.is_empty(), "the buffer stays with the engine");
    assert!(!parked(), "the lease is back");
    let log = take_log();
    assert_eq!(pos(&log, is_park).len(), 1, "{log:?}");
    assert_eq!(pos(&log, is_unpark).len(), 1, "{log:?}");
    // The request was cancelled and is freed at its last CQE, never handed out.
    while e.in_flight() > 0 {
        assert!(e.wait_any().unwrap().is_none());
    }
    assert_eq!(e.counters().cancellations, 1);
    // The engine still works.
    let (r, buf) = e.read_at(&tf.file, vec![0; 4096], 0, None, NO_CAP);
    assert_eq!(r.unwrap(), 4096);
    assert_eq!(buf, tf.data[..4096]);
}

#[test]
fn a_read_queued_for_its_workload_turn_is_parked_until_the_turn_comes() {
    let mut e = setup(true);
    let tf = disk_file(1 << 20, 64);
    // A miss takes a place (a page-cache hit would take none).
    tf.file.advise_random().unwrap();
    tf.file.make_cold().unwrap();
    // One request in flight at a time; another leaf holds the place.
    let disk = one_place_disk();
    let user: ThrottlePtr = Arc::new(disk.workload("user").unwrap());
    let other = disk.workload("other").unwrap();
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (taken, wait_taken) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let permit = other.acquire(4096).unwrap();
        taken.send(()).unwrap();
        held.recv().unwrap();
        drop(permit);
    });
    wait_taken.recv().unwrap();
    // The place is given back once this thread's lease has parked in the
    // read's queued turn (no fixed time: a busy machine can delay the read
    // past any). This thread parks nowhere else.
    let reader = std::thread::current().id();
    let releaser = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while !PARKERS.lock().unwrap().contains(&reader) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the queued read never parked"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        release.send(()).unwrap();
    });
    let (r, buf) = e.read_at(&tf.file, vec![0; 64 << 10], 0, Some(&user), NO_CAP);
    assert_eq!(r.unwrap(), 64 << 10);
    assert_eq!(buf, tf.data[..64 << 10]);
    releaser.join().unwrap();
    holder.join().unwrap();
    let log = take_log();
    let parks = pos(&log, is_park);
    let unparks = pos(&log, is_unpark);
    assert!(!parks.is_empty(), "the queued turn parked: {log:?}");
    assert_eq!(parks.len(), unparks.len(), "{log:?}");
    // While parked, nothing but the turn's own timeout goes to the kernel,
    // and the read's CQE is reaped unparked.
    for e in &log {
        if let Ev::Cqe { tag, parked, .. } = e {
            assert!(
                !(*tag == TAG_IO && *parked),
                "the IO completed while parked: {log:?}"
            );
        }
    }
    assert!(!parked());
}
