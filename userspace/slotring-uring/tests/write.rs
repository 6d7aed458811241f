//! Paced writeback on the real kernel and a real filesystem, both engines:
//! the bytes are right, the device has completed all a paced write dirtied
//! when it returns, with at most `writeback_depth` pieces on their way at
//! once, large writes are paced piece by piece, drops in each state end
//! cleanly, and every
//! write fault (`ENOSPC` on a real loop-mounted filesystem, `EIO` and short
//! writes through the seam, a file truncated under the writer) ends in a
//! typed error or result that reports exactly what was written.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use slotring_throttle::{ThrottlePtr, Throttler};
use slotring_uring::{
    IoEngine, PacedWrites, Policy, PreadEngine, RingConfig, SharedConfig, SharedEngine,
    UringCounters, UringEngine, UringError, UringFile,
};

const MIB: usize = 1 << 20;
/// The engines' piece size (`policy::WRITEBACK_PIECE`).
const PIECE: usize = 256 << 10;

/// A ring with `policy`.
fn ring_engine(policy: Policy) -> UringEngine {
    let cfg = RingConfig {
        policy,
        ..RingConfig::default()
    };
    UringEngine::new(&cfg).expect("io_uring is enabled on this machine")
}

fn uring(policy: Policy) -> Box<dyn IoEngine> {
    Box::new(ring_engine(policy))
}

/// The ring's own paced path: a piece's write and its writeback as linked
/// SQEs (the ticket API never does IO in its caller's thread; a
/// `UringEngine`'s `write_at` does a paced write in its caller's thread
/// when nothing else is in flight).
struct Tickets(UringEngine);

impl Tickets {
    /// Wait for `t` and hand back its result and buffer.
    fn collect(&mut self, t: slotring_uring::Ticket) -> slotring_uring::BufResult<usize, Vec<u8>> {
        match self.0.wait(t) {
            Ok(c) => (c.result, c.buf),
            Err(e) => (Err(e), Vec::new()),
        }
    }
}

impl IoEngine for Tickets {
    fn read_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> slotring_uring::BufResult<usize, Vec<u8>> {
        let t = self.0.submit_read(file, buf, offset, throttle, max_block);
        self.collect(t)
    }

    fn write_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> slotring_uring::BufResult<usize, Vec<u8>> {
        let t = self.0.submit_write(file, buf, offset, throttle, max_block);
        self.collect(t)
    }

    fn counters(&self) -> UringCounters {
        self.0.counters()
    }

    fn kind(&self) -> &'static str {
        "io_uring tickets"
    }
}

fn ring(policy: Policy) -> Box<dyn IoEngine> {
    Box::new(Tickets(ring_engine(policy)))
}

/// The blocking front end with another request held (a finished read
/// nobody collected): its paced `write_at` takes the ring's path (the
/// turn's wait staged, then linked), as for a thread with tickets in
/// flight.
fn busy(policy: Policy) -> Box<dyn IoEngine> {
    let mut e = ring_engine(policy);
    let (f, _path) = empty_disk_file();
    let _held = e.submit_read(&f, Vec::new(), 0, None, NO_CAP);
    assert_eq!(
        e.in_flight(),
        1,
        "a finished request is held until collected"
    );
    Box::new(e)
}

fn pread(policy: Policy) -> Box<dyn IoEngine> {
    Box::new(PreadEngine::new(policy))
}

/// The shared async front end, each call awaited on a runtime of its own
/// (a paced write goes to the runtime's blocking pool, or, with
/// [`PacedWrites::Ring`], stays on the ring).
struct Shared {
    rt: tokio::runtime::Runtime,
    e: SharedEngine,
}

impl Shared {
    fn new(policy: Policy, paced_writes: PacedWrites) -> Self {
        Self::with(policy, paced_writes, None)
    }

    /// With every syscall through a [`FaultSys`] of `plan`, if given.
    fn with(
        policy: Policy,
        paced_writes: PacedWrites,
        plan: Option<&std::sync::Arc<std::sync::Mutex<Plan>>>,
    ) -> Self {
        let sys = plan.map(|plan| {
            let plan = plan.clone();
            Arc::new(move || -> Box<dyn slotring_uring::Syscalls> {
                Box::new(FaultSys(plan.clone()))
            }) as Arc<dyn Fn() -> Box<dyn slotring_uring::Syscalls> + Send + Sync>
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let cfg = SharedConfig {
            ring: RingConfig {
                policy,
                ..RingConfig::default()
            },
            rings: 1,
            paced_writes,
            ..SharedConfig::default()
        };
        let e = rt.block_on(async {
            match sys {
                Some(sys) => {
                    let (e, why) = SharedEngine::open_with(&cfg, sys).unwrap();
                    assert!(
                        why.is_none(),
                        "io_uring is enabled on this machine: {why:?}"
                    );
                    e
                }
                None => SharedEngine::new(&cfg).expect("io_uring is enabled on this machine"),
            }
        });
        Self { rt, e }
    }
}

impl IoEngine for Shared {
    fn read_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> slotring_uring::BufResult<usize, Vec<u8>> {
        self.rt
            .block_on(self.e.read_at(file, buf, offset, throttle, max_block))
    }

    fn write_at(
        &mut self,
        file: &Arc<UringFile>,
        buf: Vec<u8>,
        offset: u64,
        throttle: Option<&ThrottlePtr>,
        max_block: Duration,
    ) -> slotring_uring::BufResult<usize, Vec<u8>> {
        self.rt
            .block_on(self.e.write_at(file, buf, offset, throttle, max_block))
    }

    fn counters(&self) -> UringCounters {
        self.e.counters()
    }

    fn kind(&self) -> &'static str {
        "shared"
    }
}

fn shared(policy: Policy) -> Box<dyn IoEngine> {
    Box::new(Shared::new(policy, PacedWrites::default()))
}

fn shared_ring(policy: Policy) -> Box<dyn IoEngine> {
    Box::new(Shared::new(policy, PacedWrites::Ring))
}

fn unpaced() -> Policy {
    Policy {
        pace_writeback: false,
        ..Policy::default()
    }
}

/// A block-device write limit of `rate` bytes/s with a 100 ms burst.
fn disk_limit(rate: u64) -> ThrottlePtr {
    disk_limit_throttler(rate)
}

/// An empty file on a disk filesystem (never tmpfs).
fn empty_disk_file() -> (Arc<UringFile>, tempfile::TempPath) {
    let tmp = tempfile::Builder::new()
        .prefix("slotring-write-")
        .tempfile_in(disk_dir())
        .unwrap();
    let (f, path) = tmp.into_parts();
    drop(f);
    (UringFile::new(open_rw(&path)).unwrap(), path)
}

/// Write `data` at 0 with `e` under `limit`; then check what the page cache
/// holds at once and after the writeback, and that the bytes came back from
/// the disk. Returns the pages found dirty or under writeback right after
/// the write returned.
fn write_then_check_disk(e: &mut dyn IoEngine, data: &[u8], limit: &ThrottlePtr) -> u64 {
    let (f, _path) = empty_disk_file();
    let (r, _) = e.write_at(&f, data.to_vec(), 0, Some(limit), NO_CAP);
    assert_eq!(r.unwrap(), data.len());
    let at_return = cache_stat(&f, 0, data.len() as u64);
    let dirty_at_return = at_return.nr_dirty + at_return.nr_writeback;
    // Let whatever writeback was started finish (bounded; not a timing
    // assert: the bound only keeps a broken kernel from hanging the test).
    let t0 = Instant::now();
    while cache_stat(&f, 0, data.len() as u64).nr_writeback > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "writeback never ended"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    if dirty_at_return == 0 {
        // Clean pages can be dropped; then every byte read comes from the disk.
        f.make_cold().unwrap();
        assert_eq!(
            cached_pages(&f, 0, data.len() as u64),
            0,
            "pages stayed cached"
        );
    }
    let mut back = vec![0; data.len()];
    f.file().read_exact_at(&mut back, 0).unwrap();
    assert!(back == data, "the file holds other bytes than written");
    dirty_at_return
}

/// `writeback_us` timed the pieces' writebacks: not nothing (each went to
/// the disk), and no piece longer than the `elapsed` around the whole
/// write (a bound on garbage, not a timing assert).
fn assert_writebacks_timed(what: &str, wb: &UringCounters, elapsed: Duration) {
    assert!(wb.writeback_us > 0, "{what}: no writeback time: {wb:?}");
    assert!(
        wb.writeback_us <= elapsed.as_micros() as u64 * wb.writeback_submissions,
        "{what}: {} us of writeback in a write of {elapsed:?}: {wb:?}",
        wb.writeback_us
    );
}

/// `Policy::default()` with at most `depth` pieces of a request on their
/// way to the device.
fn depth(depth: u32) -> Policy {
    Policy {
        writeback_depth: std::num::NonZeroU32::new(depth).unwrap(),
        ..Policy::default()
    }
}

fn paced_writes_reach_the_disk(make: fn(Policy) -> Box<dyn IoEngine>) {
    let data = pattern(MIB, 7);
    // 1 MiB fits the 100 ms burst of 32 MiB/s: every piece is booked at
    // once, so only the depth holds the next piece back.
    let limit = disk_limit(32 << 20);
    for d in [1, 2, Policy::default().writeback_depth.get()] {
        let mut e = make(depth(d));
        let t0 = Instant::now();
        assert_eq!(
            write_then_check_disk(e.as_mut(), &data, &limit),
            0,
            "depth {d}: a paced write returned before the device had completed every piece"
        );
        let wb = e.counters();
        assert_writebacks_timed(&format!("depth {d}"), &wb, t0.elapsed());
        assert_eq!(wb.paced_bytes, MIB as u64);
        assert_eq!(wb.writeback_submissions, (MIB / PIECE) as u64, "{wb:?}");
        assert_eq!(wb.writeback_errors, 0);
        assert!(
            wb.dirty_high_water_bytes <= u64::from(d) * PIECE as u64,
            "depth {d}: {wb:?}"
        );
        assert_eq!(e.counters().write_bytes, MIB as u64);
    }
    // The same write without pacing leaves its pages to the kernel's flush:
    // what this test catches when pacing is broken.
    let mut plain = make(unpaced());
    assert!(write_then_check_disk(plain.as_mut(), &data, &limit) > 0);
    assert_eq!(plain.counters().paced_bytes, 0);
}

#[test]
fn uring_paced_writes_reach_the_disk_before_the_next_window() {
    paced_writes_reach_the_disk(uring);
}

#[test]
fn ring_paced_writes_reach_the_disk_before_the_next_window() {
    paced_writes_reach_the_disk(ring);
}

#[test]
fn busy_ring_paced_writes_reach_the_disk_before_the_next_window() {
    paced_writes_reach_the_disk(busy);
}

#[test]
fn pread_paced_writes_reach_the_disk_before_the_next_window() {
    paced_writes_reach_the_disk(pread);
}

#[test]
fn shared_paced_writes_reach_the_disk_before_the_next_window() {
    paced_writes_reach_the_disk(shared);
}

#[test]
fn shared_ring_paced_writes_reach_the_disk_before_the_next_window() {
    paced_writes_reach_the_disk(shared_ring);
}

/// At 8 MiB/s with a 1 ms burst, a 1 MiB write is four pieces, each booked
/// on its own: the writer waits between them instead of dirtying 1 MiB at
/// once, and (depth 1) never has more than a piece dirty and not on the
/// device.
fn large_writes_go_in_booked_pieces(make: fn(Policy) -> Box<dyn IoEngine>) {
    let limit: ThrottlePtr = disk_limit_burst(8 << 20, Duration::from_millis(1));
    let (f, _path) = empty_disk_file();
    let data = pattern(MIB, 8);
    let mut e = make(depth(1));
    let (r, _) = e.write_at(&f, data.clone(), 4096, Some(&limit), NO_CAP);
    assert_eq!(r.unwrap(), MIB);
    let c = e.counters();
    assert!(
        c.waits_submitted >= 3,
        "one wait per piece after the first: {c:?}"
    );
    let wb = e.counters();
    assert_eq!(wb.writeback_submissions, 4, "{wb:?}");
    assert!(wb.dirty_high_water_bytes <= PIECE as u64, "{wb:?}");
    let mut back = vec![0; MIB];
    f.file().read_exact_at(&mut back, 4096).unwrap();
    assert!(back == data);
}

/// A paced write dropped in each state of its life that lasts (its piece's
/// wait for its turn in the bucket, a standalone timeout in front of the
/// write; its wait for the catch-up pacer's slot, holding room under the
/// writeback cap; its piece's writeback, before the next piece is booked) ends as one cancellation once its chain's last
/// CQE is in, never reports bytes it did not write, keeps the dirty-bytes
/// accounting whole, and leaves the ring serving the next paced write with
/// every byte right.
#[test]
fn dropped_paced_writes_end_cleanly_in_every_state() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Depth 1: every piece waits for its writeback before the next.
        let cfg = RingConfig {
            policy: depth(1),
            ..RingConfig::default()
        };
        let e = slotring_uring::LocalEngine::new(&cfg).unwrap();
        let (f, _path) = empty_disk_file();
        // 4 MiB at 16 MiB/s: 16 pieces, one every 15.6 ms. With a 1 ms
        // burst every piece waits for its turn in the bucket; with 100 ms
        // the bucket lets the first pieces go at once and the pacer spaces
        // them out.
        let limit: ThrottlePtr = disk_limit_burst(16 << 20, Duration::from_millis(1));
        let data = pattern(4 * MIB, 9);
        let states = [
            ("Held", limit.clone()),
            ("Pacing", disk_limit(16 << 20)),
            ("Syncing", limit.clone()),
        ];
        let rounds = 3u64;
        for (state, limit) in &states {
            for _ in 0..rounds {
                let mut fut = Box::pin(e.write_at(&f, data.clone(), 0, Some(limit), NO_CAP));
                let mut cx = Context::from_waker(Waker::noop());
                assert!(fut.as_mut().poll(&mut cx).is_pending());
                // The engine advances on its CQEs without the future being
                // polled; drop it the moment the request is in `state`.
                let deadline = Instant::now() + Duration::from_secs(20);
                while !e.debug_state().contains(*state) {
                    assert!(
                        Instant::now() < deadline,
                        "never {state}: {}",
                        e.debug_state()
                    );
                    e.poll_progress().unwrap();
                }
                let paced_at_drop = e.counters().paced_bytes;
                drop(fut);
                let deadline = Instant::now() + Duration::from_secs(20);
                while e.in_flight() > 0 {
                    assert!(Instant::now() < deadline, "{}", e.debug_state());
                    e.poll_progress().unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                // No piece is booked or written after the drop, beyond the
                // one whose write the kernel may already have started.
                let after = e.counters().paced_bytes - paced_at_drop;
                assert!(
                    after <= PIECE as u64,
                    "{after} bytes written after a drop in {state}"
                );
            }
        }
        let c = e.counters();
        assert_eq!(c.cancellations, rounds * states.len() as u64, "{c:?}");
        assert_eq!(c.writes, 0, "{c:?}");
        assert_eq!(c.write_bytes, 0, "a cancelled write reported bytes: {c:?}");
        assert!(c.dirty_high_water_bytes <= PIECE as u64, "{c:?}");
        let (r, _) = e.write_at(&f, data.clone(), 0, Some(&limit), NO_CAP).await;
        assert_eq!(r.unwrap(), data.len());
        let mut back = vec![0; data.len()];
        f.file().read_exact_at(&mut back, 0).unwrap();
        assert!(back == data, "the file holds other bytes than written");
        let at_return = cache_stat(&f, 0, data.len() as u64);
        assert_eq!(at_return.nr_dirty + at_return.nr_writeback, 0);
    });
}

/// The real kernel, the time of every `pwrite` recorded.
struct PwriteTimes(Arc<std::sync::Mutex<Vec<Instant>>>);

impl slotring_uring::Syscalls for PwriteTimes {
    fn pwrite(&mut self, fd: std::os::fd::RawFd, buf: &[u8], off: u64) -> std::io::Result<usize> {
        self.0.lock().unwrap().push(Instant::now());
        slotring_uring::RealSyscalls.pwrite(fd, buf, off)
    }
}

/// The `pread` engine writes a paced piece at its turn in the bucket, not
/// before: at 16 MiB/s with a 1 ms burst, piece `k` of a 1 MiB write (256
/// KiB each) is due `(k + 1) x 15.6 ms - 1 ms` after the start, and no
/// `pwrite` of it may come earlier. (Charged after its `pwrite`, as a read
/// is, each piece went one turn early.) A lower bound only: a sleep never
/// ends early.
#[test]
fn pread_paced_pieces_are_written_at_their_turn_not_before() {
    let rate = 16u64 << 20;
    let limit: ThrottlePtr = disk_limit_burst(rate, Duration::from_millis(1));
    let (f, _path) = empty_disk_file();
    let data = pattern(MIB, 9);
    let times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut e = PreadEngine::with_syscalls(depth(1), Box::new(PwriteTimes(times.clone())));
    let t0 = Instant::now();
    let (r, _) = e.write_at(&f, data.clone(), 0, Some(&limit), NO_CAP);
    assert_eq!(r.unwrap(), MIB);
    let times = times.lock().unwrap();
    assert_eq!(times.len(), MIB / PIECE, "one pwrite per piece: {times:?}");
    let turn = Duration::from_nanos(PIECE as u64 * 1_000_000_000 / rate);
    for (k, t) in times.iter().enumerate() {
        let due = turn * (k as u32 + 1) - Duration::from_micros(1_100);
        assert!(
            t.duration_since(t0) >= due,
            "piece {k} written {:?} after the start, before its turn at {due:?}",
            t.duration_since(t0)
        );
    }
    let mut back = vec![0; MIB];
    f.file().read_exact_at(&mut back, 0).unwrap();
    assert!(back == data);
}

#[test]
fn uring_large_writes_go_in_booked_pieces() {
    large_writes_go_in_booked_pieces(uring);
}

#[test]
fn ring_large_writes_go_in_booked_pieces() {
    large_writes_go_in_booked_pieces(ring);
}

#[test]
fn busy_ring_large_writes_go_in_booked_pieces() {
    large_writes_go_in_booked_pieces(busy);
}

#[test]
fn shared_large_writes_go_in_booked_pieces() {
    large_writes_go_in_booked_pieces(shared);
}

#[test]
fn shared_ring_large_writes_go_in_booked_pieces() {
    large_writes_go_in_booked_pieces(shared_ring);
}

#[test]
fn pread_large_writes_go_in_booked_pieces() {
    large_writes_go_in_booked_pieces(pread);
}

fn fault_engine(kind: &str, plan: &std::sync::Arc<std::sync::Mutex<Plan>>) -> Box<dyn IoEngine> {
    match kind {
        "uring" => Box::new(
            UringEngine::with_syscalls(&RingConfig::default(), Box::new(FaultSys(plan.clone())))
                .unwrap(),
        ),
        "ring" => Box::new(Tickets(
            UringEngine::with_syscalls(&RingConfig::default(), Box::new(FaultSys(plan.clone())))
                .unwrap(),
        )),
        "shared" => Box::new(Shared::with(
            Policy::default(),
            PacedWrites::default(),
            Some(plan),
        )),
        _ => Box::new(PreadEngine::with_syscalls(
            Policy::default(),
            Box::new(FaultSys(plan.clone())),
        )),
    }
}

/// The typed error of a failed write: file, offset reached, bytes written.
fn write_error(r: Result<usize, UringError>) -> (String, u64, u64, u64, std::io::Error) {
    match r {
        Err(UringError::Write {
            file,
            offset,
            len,
            written,
            source,
        }) => (file, offset, len, written, source),
        other => panic!("expected UringError::Write, got {other:?}"),
    }
}

#[test]
fn eio_after_a_short_write_names_file_offset_and_written_bytes() {
    for kind in ["uring", "ring", "shared", "pread"] {
        let (f, path) = empty_disk_file();
        let plan = fault_plan();
        {
            let mut p = plan.lock().unwrap();
            // The ring: the first write CQE reports half, the continuation EIO.
            p.io_results = vec![Rewrite::Half, Rewrite::Errno(libc::EIO)];
            // pread, and the blocking front end's paced write: the first
            // pwrite writes half, the next fails.
            p.pwrite_faults = vec![Rewrite::Half, Rewrite::Errno(libc::EIO)];
        }
        let mut e = fault_engine(kind, &plan);
        let limit = disk_limit(1 << 30);
        let data = pattern(200 << 10, 9);
        let off = 8192u64;
        let (r, _) = e.write_at(&f, data.clone(), off, Some(&limit), NO_CAP);
        let (file, at, len, written, source) = write_error(r);
        assert_eq!(file, path.display().to_string(), "{kind}");
        assert_eq!(len, data.len() as u64);
        assert_eq!(written, data.len() as u64 / 2, "{kind}");
        assert_eq!(at, off + written, "{kind}");
        assert_eq!(source.raw_os_error(), Some(libc::EIO), "{kind}");
        assert_eq!(
            e.counters().write_bytes,
            written,
            "{kind}: written bytes accounted"
        );
        assert_eq!(e.counters().writes, 0, "{kind}: no write reported complete");
        let mut back = vec![0; written as usize];
        f.file().read_exact_at(&mut back, off).unwrap();
        assert!(
            back == data[..written as usize],
            "{kind}: the written half is in the file"
        );
    }
}

#[test]
fn short_writes_are_continued_and_paced() {
    for kind in ["uring", "ring", "shared", "pread"] {
        let (f, _path) = empty_disk_file();
        let plan = fault_plan();
        {
            let mut p = plan.lock().unwrap();
            p.io_results = vec![Rewrite::Half, Rewrite::Half];
            p.pwrite_faults = vec![Rewrite::Half, Rewrite::Half];
        }
        let mut e = fault_engine(kind, &plan);
        let limit = disk_limit(1 << 30);
        let data = pattern(300 << 10, 10);
        let t0 = Instant::now();
        let (r, _) = e.write_at(&f, data.clone(), 0, Some(&limit), NO_CAP);
        assert_eq!(r.unwrap(), data.len(), "{kind}");
        assert_writebacks_timed(kind, &e.counters(), t0.elapsed());
        assert_eq!(e.counters().short_reads, 2, "{kind}");
        assert_eq!(e.counters().write_bytes, data.len() as u64, "{kind}");
        assert_eq!(e.counters().paced_bytes, data.len() as u64, "{kind}");
        if kind != "ring" {
            // Really short: the continuation dirties new pages, which the
            // piece's writeback takes. (On the ring the seam only rewrites
            // the CQE of a full write, so the continuation overwrites pages
            // whose writeback is in flight, which SYNC_FILE_RANGE_WRITE
            // leaves dirty for the kernel's flush: see README's limits.)
            assert_eq!(
                cache_stat(&f, 0, data.len() as u64).nr_dirty,
                0,
                "{kind}: all paced"
            );
        }
        let mut back = vec![0; data.len()];
        f.file().read_exact_at(&mut back, 0).unwrap();
        assert!(back == data, "{kind}");
    }
}

#[test]
fn a_refused_writeback_fails_no_write() {
    for kind in ["uring", "shared", "pread"] {
        let (f, _path) = empty_disk_file();
        let plan = fault_plan();
        plan.lock().unwrap().sync_errors = vec![libc::EIO];
        let mut e = fault_engine(kind, &plan);
        let limit = disk_limit(1 << 30);
        let data = pattern(64 << 10, 11);
        let (r, _) = e.write_at(&f, data.clone(), 0, Some(&limit), NO_CAP);
        assert_eq!(r.unwrap(), data.len(), "{kind}");
        assert_eq!(e.counters().writeback_errors, 1, "{kind}");
    }
}

/// How many times the seam saw `name` called.
fn calls(plan: &std::sync::Arc<std::sync::Mutex<Plan>>, name: &str) -> usize {
    plan.lock()
        .unwrap()
        .log
        .iter()
        .filter(|c| **c == name)
        .count()
}

/// The ring's blocking front end does a paced write in its caller's thread
/// (`pwrite` and `sync_file_range` through the seam, no write SQE): the
/// caller waits anyway, and on the ring a paced piece sleeps and wakes an
/// io-wq worker twice. It keeps the ring's path when another request is in
/// flight (whose completions it would not reap meanwhile), and an unpaced
/// write stays on the ring.
#[test]
fn the_blocking_front_end_writes_paced_pieces_in_its_own_thread() {
    let limit = disk_limit(1 << 30);
    let data = pattern(MIB, 14);
    let plan = fault_plan();
    let mut e =
        UringEngine::with_syscalls(&RingConfig::default(), Box::new(FaultSys(plan.clone())))
            .unwrap();
    plan.lock().unwrap().log.clear();
    let (f, _path) = empty_disk_file();
    let (r, _) = e.write_at(&f, data.clone(), 0, Some(&limit), NO_CAP);
    assert_eq!(r.unwrap(), MIB);
    assert_eq!(calls(&plan, "pwrite"), MIB / PIECE, "one pwrite per piece");
    // Each piece's writeback is started; the last wait covers the rest.
    assert!(calls(&plan, "sync_file_range") > MIB / PIECE);
    assert_eq!(
        calls(&plan, "io_uring_enter"),
        0,
        "{:?}",
        plan.lock().unwrap().log
    );
    assert_eq!(e.counters().writeback_submissions, (MIB / PIECE) as u64);
    assert_eq!(e.counters().paced_bytes, MIB as u64);
    assert_eq!(cache_stat(&f, 0, MIB as u64).nr_dirty, 0);

    // Another request in flight: the ring's path.
    plan.lock().unwrap().log.clear();
    let (g, _gpath) = empty_disk_file();
    let t = e.submit_write(&g, data.clone(), 0, Some(&limit), NO_CAP);
    let (r, _) = e.write_at(&f, data.clone(), MIB as u64, Some(&limit), NO_CAP);
    assert_eq!(r.unwrap(), MIB);
    assert_eq!(e.wait(t).unwrap().result.unwrap(), MIB);
    assert_eq!(calls(&plan, "pwrite"), 0);
    assert_eq!(calls(&plan, "sync_file_range"), 0);
    assert!(calls(&plan, "io_uring_enter") > 0);

    // Unpaced: the ring's path.
    plan.lock().unwrap().log.clear();
    let (r, _) = e.write_at(&f, data.clone(), 0, None, NO_CAP);
    assert_eq!(r.unwrap(), MIB);
    assert_eq!(calls(&plan, "pwrite"), 0);
    let mut back = vec![0; 2 * MIB];
    f.file().read_exact_at(&mut back, 0).unwrap();
    assert!(back[..MIB] == data[..] && back[MIB..] == data[..]);
}

/// The shared front end runs a paced write on tokio's blocking pool
/// (`pwrite` and `sync_file_range` through the seam, no ring request), and
/// with [`PacedWrites::Ring`] on the ring; an unpaced write stays on the
/// ring either way.
#[test]
fn the_shared_front_end_writes_paced_pieces_on_the_blocking_pool() {
    let limit = disk_limit(1 << 30);
    let data = pattern(MIB, 15);
    for paced_writes in [PacedWrites::default(), PacedWrites::Ring] {
        let plan = fault_plan();
        let mut e = Shared::with(Policy::default(), paced_writes, Some(&plan));
        plan.lock().unwrap().log.clear();
        let (f, _path) = empty_disk_file();
        // Twice: the counters of two calls add up, the high-water mark of
        // dirty bytes does not.
        for _ in 0..2 {
            let (r, _) = e.write_at(&f, data.clone(), 0, Some(&limit), NO_CAP);
            assert_eq!(r.unwrap(), MIB);
        }
        let c = e.counters();
        assert_eq!(c.paced_bytes, 2 * MIB as u64, "{paced_writes:?}");
        assert_eq!(c.writeback_submissions, (2 * MIB / PIECE) as u64);
        assert_eq!(c.writes, 2);
        let depth = u64::from(Policy::default().writeback_depth.get());
        assert!(
            c.dirty_high_water_bytes <= depth * PIECE as u64,
            "{paced_writes:?}: {c:?}"
        );
        assert_eq!(cache_stat(&f, 0, MIB as u64).nr_dirty, 0);
        assert_eq!(e.e.in_flight(), 0);
        let (pwrites, enters) = (calls(&plan, "pwrite"), calls(&plan, "io_uring_enter"));
        match paced_writes {
            PacedWrites::BlockingPool { .. } => {
                assert_eq!(pwrites, 2 * MIB / PIECE, "one pwrite per piece");
                assert!(calls(&plan, "sync_file_range") > 2 * MIB / PIECE);
                assert_eq!(enters, 0, "{:?}", plan.lock().unwrap().log);
            }
            PacedWrites::Ring => {
                assert_eq!(pwrites, 0);
                assert!(enters > 0);
            }
        }
        // Unpaced: the ring's path.
        plan.lock().unwrap().log.clear();
        let (r, _) = e.write_at(&f, data.clone(), MIB as u64, None, NO_CAP);
        assert_eq!(r.unwrap(), MIB);
        assert_eq!(calls(&plan, "pwrite"), 0);
        assert!(calls(&plan, "io_uring_enter") > 0);
        let mut back = vec![0; 2 * MIB];
        f.file().read_exact_at(&mut back, 0).unwrap();
        assert!(back[..MIB] == data[..] && back[MIB..] == data[..]);
    }
}

/// At most `at_once` paced writes of a shared engine hold a pool thread:
/// of two at once with room for one, the first polled runs on the pool
/// and the other on the ring, and both write every byte.
#[test]
fn paced_writes_beyond_at_once_take_the_ring() {
    let plan = fault_plan();
    let e = Shared::with(
        Policy::default(),
        PacedWrites::BlockingPool { at_once: 1 },
        Some(&plan),
    );
    plan.lock().unwrap().log.clear();
    let limit = disk_limit(1 << 30);
    let (a, b) = (pattern(MIB, 17), pattern(MIB, 18));
    let (fa, _pa) = empty_disk_file();
    let (fb, _pb) = empty_disk_file();
    let (ra, rb) = e.rt.block_on(async {
        tokio::join!(
            e.e.write_at(&fa, a.clone(), 0, Some(&limit), NO_CAP),
            e.e.write_at(&fb, b.clone(), 0, Some(&limit), NO_CAP)
        )
    });
    assert_eq!(ra.0.unwrap(), MIB);
    assert_eq!(rb.0.unwrap(), MIB);
    assert_eq!(calls(&plan, "pwrite"), MIB / PIECE, "one write on the pool");
    assert!(calls(&plan, "io_uring_enter") > 0, "one on the ring");
    assert_eq!(e.counters().paced_bytes, 2 * MIB as u64);
    assert_eq!(e.e.in_flight(), 0);
    for (f, data) in [(&fa, &a), (&fb, &b)] {
        let mut back = vec![0; MIB];
        f.file().read_exact_at(&mut back, 0).unwrap();
        assert!(back == *data);
    }
}

/// A paced write on the shared front end's blocking pool whose future is
/// dropped writes no piece after the one it may be writing, waits for the
/// device to complete what it wrote, gives back its room under the cap,
/// and ends as one cancellation: the file holds exactly the pieces it
/// counted, none of them dirty or under writeback, no write is reported,
/// and the engine goes on.
#[test]
fn a_paced_write_dropped_on_the_blocking_pool_stops_at_its_next_piece() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let e = Shared::new(Policy::default(), PacedWrites::default());
    // 4 MiB at 2 MiB/s with a 1 ms burst: 16 pieces, one every 125 ms
    // (the whole write would take 2 s: the drop comes long before).
    let throttler = disk_limit_burst(2 << 20, Duration::from_millis(1));
    let limit: ThrottlePtr = throttler.clone();
    let (f, _path) = empty_disk_file();
    let data = pattern(4 * MIB, 16);
    let at_drop = e.rt.block_on(async {
        let mut fut = Box::pin(e.e.write_at(&f, data.clone(), 0, Some(&limit), NO_CAP));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        // Some pieces in, far from all.
        let deadline = Instant::now() + Duration::from_secs(20);
        while f.file().metadata().unwrap().len() < 2 * PIECE as u64 {
            assert!(Instant::now() < deadline, "the write never started");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(e.e.in_flight(), 1);
        let at_drop = f.file().metadata().unwrap().len();
        drop(fut);
        let deadline = Instant::now() + Duration::from_secs(20);
        while e.e.in_flight() > 0 {
            assert!(
                Instant::now() < deadline,
                "the dropped write never returned"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        at_drop
    });
    let c = e.counters();
    assert_eq!(c.cancellations, 1, "{c:?}");
    assert_eq!((c.writes, c.write_bytes), (0, 0), "{c:?}");
    let len = f.file().metadata().unwrap().len();
    assert_eq!(
        len, c.paced_bytes,
        "the file holds exactly the pieces counted"
    );
    assert!(
        len >= 2 * PIECE as u64 && len < data.len() as u64,
        "{len}: stopped before the end"
    );
    assert_eq!(len % PIECE as u64, 0, "whole pieces");
    assert!(
        len <= (at_drop / PIECE as u64 + 1) * PIECE as u64,
        "{len} bytes written, {at_drop} at the drop: more than the piece being written"
    );
    let st = cache_stat(&f, 0, len);
    assert_eq!(st.nr_dirty + st.nr_writeback, 0, "on the device: {st:?}");
    assert_eq!(slotring_uring::writeback_in_flight(&throttler), Some(0));
    let mut back = vec![0; len as usize];
    f.file().read_exact_at(&mut back, 0).unwrap();
    assert!(back == data[..len as usize]);
    // The engine goes on.
    let mut e = e;
    let (r, _) = e.write_at(&f, data[..PIECE].to_vec(), 0, Some(&limit), NO_CAP);
    assert_eq!(r.unwrap(), PIECE);
}

/// A file truncated between the pieces of a paced write: the kernel does
/// not fail the later pieces (they extend the file again), and the engine
/// reports exactly the bytes the kernel wrote; the pieces after the
/// truncation are in the file.
#[test]
fn a_file_truncated_while_written_reports_what_the_kernel_wrote() {
    for make in [
        uring as fn(Policy) -> Box<dyn IoEngine>,
        ring,
        busy,
        shared,
        shared_ring,
        pread,
    ] {
        let (f, path) = empty_disk_file();
        // 4 MiB/s with a 1 ms burst: the four pieces of 1 MiB are ~60 ms apart.
        let limit: ThrottlePtr = disk_limit_burst(4 << 20, Duration::from_millis(1));
        let data = pattern(MIB, 12);
        let truncator = {
            let path = path.to_path_buf();
            std::thread::spawn(move || {
                // Wait until the first piece is in, then cut the file to 0.
                let t0 = Instant::now();
                while std::fs::metadata(&path).unwrap().len() < PIECE as u64 {
                    assert!(t0.elapsed() < Duration::from_secs(10));
                    std::thread::sleep(Duration::from_millis(1));
                }
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(0)
                    .unwrap();
            })
        };
        let mut e = make(Policy::default());
        let (r, _) = e.write_at(&f, data.clone(), 0, Some(&limit), NO_CAP);
        truncator.join().unwrap();
        assert_eq!(r.unwrap(), MIB);
        assert_eq!(e.counters().write_bytes, MIB as u64);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), MIB as u64);
        // The last piece was written after the cut: it is there.
        let mut back = vec![0; PIECE];
        f.file()
            .read_exact_at(&mut back, (MIB - PIECE) as u64)
            .unwrap();
        assert!(back == data[MIB - PIECE..]);
    }
}

/// A loop-mounted ext4 image, unmounted (and its loop device detached)
/// however the test ends.
struct LoopFs {
    dir: tempfile::TempDir,
    image: tempfile::TempPath,
    mounted: bool,
}

impl LoopFs {
    fn new(size: &str) -> anyhow::Result<Self> {
        let image = tempfile::Builder::new()
            .prefix("slotring-enospc-")
            .suffix(".img")
            .tempfile_in(disk_dir())?
            .into_temp_path();
        let dir = tempfile::tempdir_in(disk_dir())?;
        let mut fs = LoopFs {
            dir,
            image,
            mounted: false,
        };
        run("truncate", &["-s", size, &fs.image.display().to_string()])?;
        run(
            "mkfs.ext4",
            &["-q", "-F", "-m", "0", &fs.image.display().to_string()],
        )?;
        run(
            "mount",
            &[
                "-o",
                "loop",
                &fs.image.display().to_string(),
                &fs.dir.path().display().to_string(),
            ],
        )?;
        fs.mounted = true;
        Ok(fs)
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            // `mount -o loop` sets autoclear: unmounting detaches the device.
            let _ = Command::new("umount").arg(self.dir.path()).status();
        }
    }
}

fn run(cmd: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| anyhow::anyhow!("{cmd} could not be started: {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn enospc_on_a_full_filesystem_reports_what_was_written() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root: the ENOSPC test needs mount"
        );
        eprintln!("skipped: mounting a loop filesystem needs root");
        return;
    }
    let fs = match LoopFs::new("4M") {
        Ok(fs) => fs,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no loop filesystem here ({e:#})");
            return;
        }
        Err(e) => panic!("a loop filesystem is needed in CI: {e:#}"),
    };
    for (i, make) in [
        uring as fn(Policy) -> Box<dyn IoEngine>,
        ring,
        shared,
        pread,
    ]
    .into_iter()
    .enumerate()
    {
        let path: PathBuf = fs.path().join(format!("full-{i}"));
        let f = UringFile::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .unwrap(),
        )
        .unwrap();
        let limit = disk_limit(1 << 30);
        let data = pattern(8 * MIB, 13);
        let mut e = make(Policy::default());
        let (r, _) = e.write_at(&f, data.clone(), 0, Some(&limit), NO_CAP);
        let (file, at, len, written, source) = write_error(r);
        assert_eq!(source.raw_os_error(), Some(libc::ENOSPC), "{source}");
        assert_eq!(file, path.display().to_string());
        assert_eq!(len, data.len() as u64);
        assert!(written > 0 && written < len, "{written}");
        assert_eq!(at, written);
        assert_eq!(e.counters().write_bytes, written);
        assert_eq!(e.counters().writes, 0);
        // Nothing is reported written that is not in the file.
        assert_eq!(std::fs::metadata(&path).unwrap().len(), written);
        let mut back = vec![0; written as usize];
        f.file().read_exact_at(&mut back, 0).unwrap();
        assert!(back == data[..written as usize]);
        drop(f);
        std::fs::remove_file(&path).unwrap();
    }
}

/// [`disk_limit`] kept as a `Throttler`, to read its writeback cap.
fn disk_limit_throttler(rate: u64) -> Arc<Throttler> {
    disk_limit_burst(rate, Duration::from_millis(100))
}

/// A block-device limit of `rate` bytes/s with a `burst`.
fn disk_limit_burst(rate: u64, burst: Duration) -> Arc<Throttler> {
    Arc::new(
        Throttler::builder(rate)
            .burst(burst)
            .limits_block_device_bandwidth(true)
            .build()
            .unwrap(),
    )
}

#[test]
fn the_writeback_cap_holds_across_requests_rings_and_engines() {
    // 32 MiB/s: the default cap (16 ms of the rate) has room for two
    // pieces; eight writers share it: two blocking front ends (their paced
    // writes in their own threads), two rings' ticket paths, the shared
    // front end on its blocking pool and on its ring, and two pread
    // engines.
    let rate = 32 << 20;
    let cap = Policy::default().writeback_cap.unwrap();
    let cap_bytes = (rate as u128 * cap.as_nanos() / 1_000_000_000) as u64;
    assert!(cap_bytes >= 2 * PIECE as u64 && cap_bytes < 3 * PIECE as u64);
    let throttler = disk_limit_throttler(rate);
    let limit: ThrottlePtr = throttler.clone();
    let makers: [fn(Policy) -> Box<dyn IoEngine>; 8] =
        [uring, uring, ring, ring, shared, shared_ring, pread, pread];
    let handles: Vec<_> = makers
        .into_iter()
        .enumerate()
        .map(|(i, make)| {
            let limit = limit.clone();
            std::thread::spawn(move || {
                let mut e = make(Policy::default());
                let (f, path) = empty_disk_file();
                let data = pattern(2 * MIB, i as u64);
                for (k, chunk) in data.chunks(MIB).enumerate() {
                    let at = (k * MIB) as u64;
                    let (r, _) = e.write_at(&f, chunk.to_vec(), at, Some(&limit), NO_CAP);
                    assert_eq!(r.unwrap(), chunk.len());
                }
                let mut back = vec![0; data.len()];
                f.file().read_exact_at(&mut back, 0).unwrap();
                assert!(back == data, "writer {i}: the file holds other bytes");
                drop(path);
                e.counters()
            })
        })
        .collect();
    let counters: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let high = slotring_uring::writeback_high_water(&throttler).unwrap();
    assert!(
        high <= cap_bytes,
        "{high} bytes under writeback at once, cap {cap_bytes}"
    );
    // Eight writers against two pieces of room: the cap did hold them back.
    assert_eq!(high, 2 * PIECE as u64, "the writers never filled the cap");
    let waits: u64 = counters.iter().map(|c| c.writeback_cap_waits).sum();
    assert!(waits > 0, "{counters:?}");
    assert_eq!(slotring_uring::writeback_in_flight(&throttler), Some(0));
}

#[test]
fn a_write_dropped_while_capped_frees_nothing_twice_and_loses_nothing() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let e = slotring_uring::LocalEngine::new(&RingConfig::default()).unwrap();
        // 1 MiB/s: the cap has room for one piece. A burst of 30 s: every
        // piece's turn comes at once, and a piece takes its room only then
        // (a piece waiting for its turn holds none), so a's piece under
        // writeback (or held by the pacer) leaves b none.
        let throttler = disk_limit_burst(1 << 20, Duration::from_secs(30));
        let limit: ThrottlePtr = throttler.clone();
        let (fa, _pa) = empty_disk_file();
        let (fb, _pb) = empty_disk_file();
        let a_data = pattern(2 * PIECE, 3);
        let mut cx = Context::from_waker(Waker::noop());
        for round in 0..3u64 {
            let mut a = Box::pin(e.write_at(&fa, a_data.clone(), 0, Some(&limit), NO_CAP));
            assert!(a.as_mut().poll(&mut cx).is_pending());
            let mut b = Box::pin(e.write_at(&fb, pattern(PIECE, 4), 0, Some(&limit), NO_CAP));
            assert!(b.as_mut().poll(&mut cx).is_pending());
            assert!(
                e.debug_state().contains("Capped"),
                "round {round}: {}",
                e.debug_state()
            );
            drop(b);
            let (r, _) = a.await;
            assert_eq!(r.unwrap(), a_data.len());
            let deadline = Instant::now() + Duration::from_secs(20);
            while e.in_flight() > 0 {
                assert!(Instant::now() < deadline, "{}", e.debug_state());
                e.poll_progress().unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // Nothing of the dropped write was written, and its (never
            // taken) room was not given back: released more than held
            // would panic in the cap (debug) or show here.
            assert_eq!(fb.file().metadata().unwrap().len(), 0);
            assert_eq!(slotring_uring::writeback_in_flight(&throttler), Some(0));
        }
        let high = slotring_uring::writeback_high_water(&throttler).unwrap();
        assert_eq!(high, PIECE as u64);
        let c = e.counters();
        assert_eq!(c.cancellations, 3, "{c:?}");
        assert!(c.writeback_cap_waits >= 3, "{c:?}");
        assert_eq!(c.write_bytes, 3 * a_data.len() as u64, "{c:?}");
        let mut back = vec![0; a_data.len()];
        fa.file().read_exact_at(&mut back, 0).unwrap();
        assert!(back == a_data, "the file holds other bytes than written");
        // The cap is not stranded: the next write to fb goes.
        let (r, _) = e
            .write_at(&fb, pattern(PIECE, 5), 0, Some(&limit), NO_CAP)
            .await;
        assert_eq!(r.unwrap(), PIECE);
    });
}
