//! Every front end through a workload tree, on the real kernel: reads and
//! paced writes byte-exact, the root's cap and in-flight limit holding,
//! every miss charged and no hit, the in-flight place held until the IO's
//! completion, and a dropped queued request charging nothing.
//!
//! The tree: `disk` (64 MiB/s, a 256 KiB burst, `max_io_requests` 2)
//! over `user` (priority 0) and `background` (priority 1, half the disk).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use slotring_throttle::{
    Resource, Throttle, ThrottlePtr, UNLIMITED_BLOCK, WorkloadScheduler, WorkloadSpec, WorkloadTree,
};
use slotring_uring::{
    IoEngine, LocalEngine, PacedWrites, PreadEngine, RingConfig, SharedConfig, SharedEngine,
    UringCounters, UringEngine,
};

const RATE: u64 = 64 << 20;
const BURST: u64 = 256 << 10;
const MAX_IO: u64 = 2;
const CHUNK: usize = 64 << 10;
const LEN: usize = 1 << 20;
const HANG: Duration = Duration::from_secs(10);

fn disk(tau: Duration, max_io: u64) -> WorkloadScheduler {
    let tree = WorkloadTree::new(vec![
        WorkloadSpec::new("disk")
            .max_bytes_per_second(RATE)
            .max_burst_bytes(BURST)
            .max_io_requests(max_io),
        WorkloadSpec::new("user").parent("disk").priority(0),
        WorkloadSpec::new("background")
            .parent("disk")
            .priority(1)
            .max_bytes_per_second(RATE / 2)
            .max_burst_bytes(BURST),
    ])
    .unwrap();
    WorkloadScheduler::builder(&tree, Resource::Io)
        .tau(tau)
        .build()
        .unwrap()
}

fn leaves(s: &WorkloadScheduler) -> (ThrottlePtr, ThrottlePtr) {
    (
        Arc::new(s.workload("user").unwrap()),
        Arc::new(s.workload("background").unwrap()),
    )
}

/// Whether io_uring can be had here (else the test prints why and skips).
fn uring_or_skip() -> bool {
    match UringEngine::new(&RingConfig::default()) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("skipped: io_uring is unavailable here ({e})");
            false
        }
    }
}

/// After a front end's run: every miss (and every byte written) was
/// charged to the root and nothing else, the cap held over `elapsed`, the
/// in-flight limit held, and no place is left held.
fn check(s: &WorkloadScheduler, c: &UringCounters, elapsed: Duration, what: &str) {
    let root = s.counters_of("disk").unwrap();
    let misses = c.read_bytes - c.page_cache_bytes;
    let charged = root.bytes - root.refunded_bytes;
    assert_eq!(
        charged,
        misses + c.write_bytes,
        "{what}: bytes charged = read misses + bytes written ({c:?}, {root:?})"
    );
    assert!(
        c.write_bytes >= LEN as u64,
        "{what}: the write went through: {c:?}"
    );
    let user = s.counters_of("user").unwrap();
    let bg = s.counters_of("background").unwrap();
    assert_eq!(user.bytes + bg.bytes, root.bytes, "{what}: leaves sum up");
    assert!(
        bg.bytes >= LEN as u64,
        "{what}: the writes were background's"
    );
    // The bucket bound: at most burst + rate·T + one request (τ is 1 ms).
    let allowed = BURST as f64 + RATE as f64 * (elapsed.as_secs_f64() + 0.001) + CHUNK as f64;
    assert!(
        (root.bytes as f64) <= allowed,
        "{what}: {} bytes in {elapsed:?} exceed the cap's {allowed}",
        root.bytes
    );
    assert!(
        root.peak_in_flight_requests <= MAX_IO && root.peak_in_flight_requests >= 1,
        "{what}: in flight at most max_io_requests: {root:?}"
    );
    assert_eq!(
        (root.in_flight_requests, root.queued),
        (0, 0),
        "{what}: every place went back at the completions"
    );
}

/// The blocking front ends: cold reads as `user`, a paced write as
/// `background`, read back and compared.
fn blocking_run(mut e: Box<dyn IoEngine>, what: &str) {
    let tf = disk_file(LEN, 71);
    let s = disk(slotring_throttle::WORKLOAD_DEFAULT_TAU, MAX_IO);
    let (user, bg) = leaves(&s);
    tf.file.make_cold().unwrap();
    let t0 = Instant::now();
    for off in (0..LEN).step_by(CHUNK) {
        let (r, buf) = e.read_at(
            &tf.file,
            vec![0; CHUNK],
            off as u64,
            Some(&user),
            UNLIMITED_BLOCK,
        );
        assert_eq!(r.unwrap(), CHUNK, "{what}");
        assert_eq!(buf, tf.data[off..off + CHUNK], "{what}: byte-exact read");
    }
    let data = pattern(LEN, 72);
    let (r, _) = e.write_at(&tf.file, data.clone(), 0, Some(&bg), UNLIMITED_BLOCK);
    assert_eq!(r.unwrap(), LEN, "{what}");
    let elapsed = t0.elapsed();
    let c = e.counters();
    let (r, buf) = e.read_at(&tf.file, vec![0; LEN], 0, None, UNLIMITED_BLOCK);
    assert_eq!(r.unwrap(), LEN);
    assert_eq!(buf, data, "{what}: the paced write is byte-exact");
    assert!(
        c.paced_bytes >= LEN as u64,
        "{what}: the write was paced: {c:?}"
    );
    check(&s, &c, elapsed, what);
}

#[test]
fn blocking_uring_engine_reads_and_paced_writes_through_the_tree() {
    if !uring_or_skip() {
        return;
    }
    blocking_run(
        Box::new(UringEngine::new(&RingConfig::default()).unwrap()),
        "UringEngine",
    );
}

#[test]
fn pread_engine_reads_and_paced_writes_through_the_tree() {
    blocking_run(
        Box::new(PreadEngine::new(Default::default())),
        "PreadEngine",
    );
}

/// A queued miss reaches the device only at its turn: while another leaf
/// holds the tree's only place, no page of the queued read's range is in
/// the page cache, not even one being read in. A `RWF_NOWAIT` probe would
/// have started reading the range in at once, ahead of the turn.
fn a_queued_miss_reads_nothing_before_its_turn(make: fn() -> Box<dyn IoEngine>, what: &str) {
    let tf = disk_file(LEN, 75);
    tf.file.advise_random().unwrap();
    tf.file.make_cold().unwrap();
    let s = one_place_disk();
    let user: ThrottlePtr = Arc::new(s.workload("user").unwrap());
    let place = s.workload("other").unwrap().acquire(4096).unwrap();
    let file = tf.file.clone();
    let reader = std::thread::spawn(move || {
        make().read_at(&file, vec![0; CHUNK], 0, Some(&user), UNLIMITED_BLOCK)
    });
    let t0 = Instant::now();
    while s.queued() == 0 {
        assert!(t0.elapsed() < HANG, "{what}: the read never queued");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Time for a probe's read-in to have shown, had there been one.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        cached_pages(&tf.file, 0, CHUNK as u64),
        0,
        "{what}: the device read the queued range before its turn"
    );
    drop(place);
    let (r, buf) = reader.join().unwrap();
    assert_eq!(r.unwrap(), CHUNK, "{what}");
    assert_eq!(buf, tf.data[..CHUNK], "{what}");
    assert_eq!(s.counters_of("user").unwrap().bytes, CHUNK as u64, "{what}");
}

#[test]
fn a_queued_miss_on_the_ring_reads_nothing_before_its_turn() {
    if !uring_or_skip() {
        return;
    }
    a_queued_miss_reads_nothing_before_its_turn(
        || Box::new(UringEngine::new(&RingConfig::default()).unwrap()),
        "UringEngine",
    );
}

#[test]
fn a_queued_miss_by_pread_reads_nothing_before_its_turn() {
    a_queued_miss_reads_nothing_before_its_turn(
        || Box::new(PreadEngine::new(Default::default())),
        "PreadEngine",
    );
}

/// A read of a cached file's last page with a larger buffer is a page-cache
/// read: only the bytes before EOF can be cached, and `cachestat` counts
/// no page past it, so the range it is asked about ends at EOF.
fn a_cached_read_past_eof_is_not_charged(mut e: Box<dyn IoEngine>, what: &str) {
    let tf = disk_file(LEN, 76);
    // Cached: read it all once.
    let (r, _) = e.read_at(&tf.file, vec![0; LEN], 0, None, UNLIMITED_BLOCK);
    assert_eq!(r.unwrap(), LEN);
    let s = disk(slotring_throttle::WORKLOAD_DEFAULT_TAU, MAX_IO);
    let (user, _bg) = leaves(&s);
    let off = (LEN - 4096) as u64;
    let (r, buf) = e.read_at(&tf.file, vec![0; CHUNK], off, Some(&user), UNLIMITED_BLOCK);
    assert_eq!(r.unwrap(), 4096, "{what}");
    assert_eq!(buf[..4096], tf.data[LEN - 4096..], "{what}");
    let c = e.counters();
    assert_eq!(
        s.counters_of("user").unwrap().bytes,
        0,
        "{what}: a cached tail is not charged to the disk: {c:?}"
    );
    assert_eq!(c.page_cache_bytes, 4096, "{what}: {c:?}");
}

#[test]
fn a_cached_read_past_eof_on_the_ring_is_not_charged() {
    if !uring_or_skip() {
        return;
    }
    a_cached_read_past_eof_is_not_charged(
        Box::new(UringEngine::new(&RingConfig::default()).unwrap()),
        "UringEngine",
    );
}

#[test]
fn a_cached_read_past_eof_by_pread_is_not_charged() {
    a_cached_read_past_eof_is_not_charged(
        Box::new(PreadEngine::new(Default::default())),
        "PreadEngine",
    );
}

/// The async front ends: eight concurrent cold reads as `user` and a
/// paced write as `background` beside them.
macro_rules! async_run {
    ($e:expr, $spawn:path, $what:expr) => {{
        let tf = Arc::new(disk_file(LEN, 73));
        let s = disk(slotring_throttle::WORKLOAD_DEFAULT_TAU, MAX_IO);
        let (user, bg) = leaves(&s);
        tf.file.make_cold().unwrap();
        let data = pattern(LEN, 74);
        let t0 = Instant::now();
        let mut hs = Vec::new();
        for k in 0..8usize {
            let (e, tf, user) = ($e.clone(), tf.clone(), user.clone());
            hs.push($spawn(async move {
                for i in 0..2usize {
                    let off = (k * 2 + i) * CHUNK;
                    let (r, buf) = e
                        .read_at(&tf.file, vec![0; CHUNK], off as u64, Some(&user), UNLIMITED_BLOCK)
                        .await;
                    assert_eq!(r.unwrap(), CHUNK);
                    assert_eq!(buf, tf.data[off..off + CHUNK], "byte-exact read");
                }
            }));
        }
        let wf = disk_file(LEN, 75);
        let (r, _) = tokio::time::timeout(
            HANG,
            $e.write_at(&wf.file, data.clone(), 0, Some(&bg), UNLIMITED_BLOCK),
        )
        .await
        .expect("the paced write ends");
        assert_eq!(r.unwrap(), LEN, "{}", $what);
        for h in hs {
            tokio::time::timeout(HANG, h).await.expect("no hang").unwrap();
        }
        let elapsed = t0.elapsed();
        let c = $e.counters();
        let (r, buf) = $e
            .read_at(&wf.file, vec![0; LEN], 0, None, UNLIMITED_BLOCK)
            .await;
        assert_eq!(r.unwrap(), LEN);
        assert_eq!(buf, data, "{}: the paced write is byte-exact", $what);
        assert!(c.paced_bytes >= LEN as u64, "{}: paced: {c:?}", $what);
        check(&s, &c, elapsed, $what);
    }};
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn local_engine_reads_and_paced_writes_through_the_tree() {
    if !uring_or_skip() {
        return;
    }
    current_thread().block_on(async {
        tokio::task::LocalSet::new()
            .run_until(async {
                let e = LocalEngine::new(&RingConfig::default()).unwrap();
                async_run!(e, tokio::task::spawn_local, "LocalEngine");
            })
            .await;
    });
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn shared(paced_writes: PacedWrites) -> SharedEngine {
    SharedEngine::new(&SharedConfig {
        rings: 2,
        paced_writes,
        ..SharedConfig::default()
    })
    .unwrap()
}

#[test]
fn shared_engine_reads_and_blocking_pool_paced_writes_through_the_tree() {
    if !uring_or_skip() {
        return;
    }
    multi_thread().block_on(async {
        let e = shared(PacedWrites::default());
        async_run!(e, tokio::spawn, "SharedEngine (blocking pool)");
    });
}

#[test]
fn shared_engine_reads_and_ring_paced_writes_through_the_tree() {
    if !uring_or_skip() {
        return;
    }
    multi_thread().block_on(async {
        let e = shared(PacedWrites::Ring);
        async_run!(e, tokio::spawn, "SharedEngine (ring)");
    });
}

/// Put the root's bucket `ms` milliseconds into debt (its place given back
/// at once).
fn debt(s: &WorkloadScheduler, ms: u64) -> u64 {
    let n = BURST + RATE * ms / 1000;
    let user = s.workload("user").unwrap();
    let (_, hold) = user
        .reserve_held(n, UNLIMITED_BLOCK, 0, slotring_throttle::Source::Device)
        .unwrap();
    hold.release();
    n
}

#[test]
fn the_place_is_held_until_the_completion_and_a_dropped_queued_read_charges_nothing() {
    if !uring_or_skip() {
        return;
    }
    let tf = disk_file(LEN, 76);
    // τ = 400 ms: a read booked 100 ms into the debt goes at once, its
    // place held through its timeout SQE and its IO.
    let s = disk(Duration::from_millis(400), 1);
    let (user, _) = leaves(&s);
    // No readahead: the first read's miss must not bring the second's in.
    tf.file.advise_random().unwrap();
    tf.file.make_cold().unwrap();
    current_thread().block_on(async {
        let e = LocalEngine::new(&RingConfig::default()).unwrap();
        let pre = debt(&s, 100);
        // The first read takes the only place (its probe misses, its turn
        // books it ~100 ms into the debt), then the second queues.
        let mut first =
            Box::pin(e.read_at(&tf.file, vec![0; CHUNK], 0, Some(&user), UNLIMITED_BLOCK));
        tokio::select! {
            _ = &mut first => panic!("the first read waits ~100 ms for its booking"),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        assert_eq!(s.counters_of("disk").unwrap().in_flight_requests, 1);
        // Boxed, so that dropping `second` drops the future itself.
        let mut second = Box::pin(e.read_at(
            &tf.file,
            vec![0; CHUNK],
            CHUNK as u64,
            Some(&user),
            UNLIMITED_BLOCK,
        ));
        tokio::select! {
            _ = &mut first => panic!("the first read waits ~100 ms for its booking"),
            _ = &mut second => panic!("the second read cannot have a place"),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        let root = s.counters_of("disk").unwrap();
        assert_eq!(
            (root.in_flight_requests, root.queued),
            (1, 1),
            "the waiting read holds the only place; the other queues: {root:?}"
        );
        // The queued read's future goes away: its turn with it.
        drop(second);
        let (r, buf) = tokio::time::timeout(HANG, first).await.expect("no hang");
        assert_eq!(r.unwrap(), CHUNK);
        assert_eq!(buf, tf.data[..CHUNK]);
        // Let the ring deliver the cancelled turn's CQEs.
        let (r, _) = e
            .read_at(&tf.file, vec![0; CHUNK], 0, None, UNLIMITED_BLOCK)
            .await;
        r.unwrap();
        let root = s.counters_of("disk").unwrap();
        assert_eq!(
            (root.in_flight_requests, root.queued),
            (0, 0),
            "the completion gave the place back; the dropped read left the queue: {root:?}"
        );
        // Granted by the completion before its cancel was reaped, the
        // dropped read's grant went back whole (counted as refunded).
        assert_eq!(
            root.bytes - root.refunded_bytes,
            pre + CHUNK as u64,
            "the debt's booking and the first read only: the dropped one charged nothing: {root:?}"
        );
        assert_eq!(root.peak_in_flight_requests, 1);
    });
}
