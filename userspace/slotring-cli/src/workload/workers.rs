//! The query threads: scans and short queries, and the state they share
//! with the sampler.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use slotring::slots::{Allocation, ConcurrencyControl, SlotsError};
use slotring::throttle::{Tenant, ThrottlePtr, Throttler};
use slotring::uring::{IoEngine, UringFile};

use super::disk_workloads::DiskWorkloads;
use super::engines::Engines;
use super::progress::Progress;
use super::setup::MAX_BLOCK;
use super::waits::{STOP_SLICE, pay_debt, sleep_until};
use super::{RunError, lock};
use crate::config::RunConfig;
use crate::report::QueryKind;

const SHORT_REGION: u64 = 16 << 20;
const SHORT_READ: usize = 64 << 10;
const SHORT_READS: u32 = 4;
const MAX_LIVE_SHORT: u64 = 64;
/// The longest a short query waits for its slot before giving up.
const SHORT_SLOT_WAIT: Duration = Duration::from_secs(5);

/// One query's statistics. Every counter is an independent statistic
/// (`Relaxed`); `end` is set once the query is over.
pub(super) struct QueryState {
    pub id: u32,
    pub kind: QueryKind,
    /// A scan's tenant on the throttlers (weight 1), carried by its slots.
    pub tenant: Option<Tenant>,
    pub start: Instant,
    pub end: Mutex<Option<Instant>>,
    /// Slots held now.
    pub held: AtomicU64,
    pub reads: AtomicU64,
    pub bytes: AtomicU64,
    pub slot_wait_ns: AtomicU64,
    /// Sum of samples of `held` and number of samples while live.
    pub held_sum: AtomicU64,
    pub samples: AtomicU64,
    pub max_held: AtomicU64,
}

impl QueryState {
    fn new(id: u32, kind: QueryKind, tenant: Option<Tenant>) -> Arc<Self> {
        Arc::new(Self {
            id,
            kind,
            tenant,
            start: Instant::now(),
            end: Mutex::new(None),
            held: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            slot_wait_ns: AtomicU64::new(0),
            held_sum: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            max_held: AtomicU64::new(0),
        })
    }

    pub fn live(&self) -> bool {
        lock(&self.end).is_none()
    }

    fn finish(&self) {
        *lock(&self.end) = Some(Instant::now());
    }
}

/// State shared by the query threads and the sampler. Every counter is an
/// independent statistic (`Relaxed`).
pub(super) struct Live {
    pub cfg: RunConfig,
    pub start: Instant,
    deadline: Instant,
    stop: Arc<AtomicBool>,
    file: Arc<UringFile>,
    pub read: Arc<Throttler>,
    read_ptr: ThrottlePtr,
    /// The disk's workload tree, which schedules the reads instead of
    /// `read` when there is one.
    pub disk: Option<DiskWorkloads>,
    pub cc: ConcurrencyControl,
    /// Every query so far, scans first.
    pub queries: Mutex<Vec<Arc<QueryState>>>,
    pub engines: Engines,
    /// Query threads started.
    pub query_threads: AtomicU64,
    live_short: AtomicU64,
    /// Reads that failed (an error from the engine).
    pub read_errors: AtomicU64,
    /// Reads that returned fewer bytes than the file should have there
    /// (end of file before the expected end: the file got shorter).
    pub short_reads: AtomicU64,
    /// The first failed read, for the report.
    pub first_read_error: Mutex<Option<String>>,
    /// Time the queries spent paying the read bucket's debt before a read
    /// ([`pay_debt`]), ns: throttle waits the throttler does not record.
    pub debt_wait_ns: AtomicU64,
}

impl Live {
    /// The state of a run whose queries start now (`start`) and run for
    /// `cfg.duration`, reading `file` through engines from `engines`,
    /// charged to `read`, under the slot budget `cc`.
    pub fn new(
        cfg: RunConfig,
        start: Instant,
        stop: Arc<AtomicBool>,
        file: Arc<UringFile>,
        read: Arc<Throttler>,
        cc: ConcurrencyControl,
        engines: Engines,
    ) -> Self {
        Self {
            deadline: start + cfg.duration,
            cfg,
            start,
            stop,
            file,
            read_ptr: read.clone(),
            read,
            disk: None,
            cc,
            queries: Mutex::new(Vec::new()),
            engines,
            query_threads: AtomicU64::new(0),
            live_short: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
            short_reads: AtomicU64::new(0),
            first_read_error: Mutex::new(None),
            debt_wait_ns: AtomicU64::new(0),
        }
    }

    /// The same run with its reads scheduled by `disk` instead of `read`.
    pub fn with_workloads(self, disk: Option<DiskWorkloads>) -> Self {
        Self { disk, ..self }
    }

    /// Ctrl-C, or the duration is over.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }

    /// Read `buf.len()` bytes at `off` for query `q` through `engine`,
    /// charged to the read throttler or `q`'s workload (its debt paid
    /// first, stop-aware),
    /// counting the read, a failure or a short read; nothing once the run
    /// is stopping. Hands the buffer back (full length).
    fn read(&self, engine: &mut dyn IoEngine, q: &QueryState, buf: Vec<u8>, off: u64) -> Vec<u8> {
        let len = buf.len();
        let stopping = || self.stopping();
        let (waited, throttle) = match &self.disk {
            Some(d) => (d.pay_debt(q.kind, &stopping), d.throttle(q.kind)),
            None => (pay_debt(&self.read, &stopping), &self.read_ptr),
        };
        if !waited.is_zero() {
            self.debt_wait_ns
                .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        }
        if self.stopping() {
            // No IO starts once stopping (it could queue behind others'
            // bookings in the throttler's fair gate).
            return buf;
        }
        let (r, mut buf) = engine.read_at(&self.file, buf, off, Some(throttle), MAX_BLOCK);
        match r {
            Ok(n) => {
                q.reads.fetch_add(1, Ordering::Relaxed);
                q.bytes.fetch_add(n as u64, Ordering::Relaxed);
                let expected = (len as u64).min(self.cfg.file_size.saturating_sub(off));
                if (n as u64) < expected {
                    self.short_reads.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                self.read_errors.fetch_add(1, Ordering::Relaxed);
                lock(&self.first_read_error).get_or_insert_with(|| {
                    format!("read of {len} bytes at {off}: {}", crate::error_chain(&e))
                });
            }
        }
        if buf.len() != len {
            buf = vec![0u8; len];
        }
        buf
    }

    /// A query of `kind`'s allocation of `min..=max` slots: in its leaf of
    /// the run's workload tree when there is one.
    fn allocate(&self, kind: QueryKind, min: u64, max: u64) -> Result<Allocation, SlotsError> {
        match &self.disk {
            Some(d) => self.cc.allocate_in(d.leaf_name(kind), min, max),
            None => self.cc.allocate(min, max),
        }
    }

    fn add_query(&self, id: u32, kind: QueryKind, tenant: Option<Tenant>) -> Arc<QueryState> {
        let q = QueryState::new(id, kind, tenant);
        lock(&self.queries).push(q.clone());
        q
    }
}

/// Spend about `d` of CPU hashing `buf` (the "query processing" between
/// reads), or less when `stopping()` turns true (it is asked every 4 KiB
/// hashed, a few microseconds). Returns the hash so the work cannot be
/// optimised away.
pub fn cpu_work(buf: &[u8], d: Duration, stopping: &dyn Fn() -> bool) -> u64 {
    let start = Instant::now();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    if buf.is_empty() {
        return h;
    }
    let mut i = 0usize;
    loop {
        for chunk in buf[i..].chunks(8).take(512) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x0100_0000_01b3);
        }
        i = (i + 4096) % buf.len();
        if start.elapsed() >= d || stopping() {
            return std::hint::black_box(h);
        }
    }
}

/// The running query threads.
pub(super) struct Workers {
    scan_threads: Vec<JoinHandle<()>>,
    scans: Vec<Arc<QueryState>>,
    spawner: JoinHandle<Vec<JoinHandle<()>>>,
}

/// Start the scans (a progress bar each) and the short-query spawner.
pub(super) fn start(live: &Arc<Live>, progress: &mut Progress) -> Result<Workers, RunError> {
    let cfg = &live.cfg;
    let mut scan_threads = Vec::new();
    let mut scans = Vec::new();
    for i in 0..cfg.scans {
        let width = cfg.scan_width(i);
        // A tenant of `local_read`'s fair gate; a workload tree orders
        // the scans by their leaf instead.
        let tenant = live.disk.is_none().then(|| {
            Tenant::new(format!("scan{}", i + 1), 1).expect("weight 1 is a valid tenant weight")
        });
        let q = live.add_query(i + 1, QueryKind::Scan, tenant.clone());
        scans.push(q.clone());
        let alloc = live
            .allocate(QueryKind::Scan, 1, u64::from(width))
            .map_err(|source| RunError::Slots {
                scan: i + 1,
                source,
            })?;
        let alloc = Arc::new(match tenant {
            Some(t) => alloc.with_tenant(t),
            None => alloc,
        });
        let max = Arc::new(AtomicU64::new(u64::from(width)));
        let cursor = Arc::new(AtomicU64::new(
            (cfg.file_size / u64::from(cfg.scans)) * u64::from(i) / cfg.read_size * cfg.read_size,
        ));
        progress.add_scan(q.clone());
        for t in 0..width {
            let (live, q, alloc, cursor, max) = (
                live.clone(),
                q.clone(),
                alloc.clone(),
                cursor.clone(),
                max.clone(),
            );
            live.query_threads.fetch_add(1, Ordering::Relaxed);
            scan_threads.push(spawn(format!("scan{}-{t}", i + 1), move || {
                scan_worker(&live, &q, &alloc, &cursor, &max);
            })?);
        }
    }
    // Short queries come from their own spawner.
    let first_short = cfg.scans + 1;
    let spawner = {
        let live = live.clone();
        spawn("short-spawner".into(), move || {
            spawn_shorts(&live, first_short)
        })?
    };
    Ok(Workers {
        scan_threads,
        scans,
        spawner,
    })
}

impl Workers {
    /// Wait until every query thread is done (they stop by themselves at
    /// the deadline or on Ctrl-C).
    pub fn join(self) {
        for h in self.scan_threads {
            while !h.is_finished() {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = h.join();
        }
        for s in &self.scans {
            s.finish();
        }
        let shorts = self.spawner.join().unwrap_or_default();
        for h in shorts {
            let _ = h.join();
        }
    }
}

fn spawn<T: Send + 'static>(
    name: String,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<JoinHandle<T>, RunError> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .map_err(|source| RunError::Spawn { name, source })
}

/// One thread of a scan: slot by slot, one quantum of reads and CPU work
/// each, until the run stops.
fn scan_worker(
    live: &Live,
    q: &QueryState,
    alloc: &Allocation,
    cursor: &AtomicU64,
    max: &AtomicU64,
) {
    let (id, mut engine) = live.engines.open();
    let size = live.cfg.file_size;
    let rs = live.cfg.read_size;
    let mut buf = vec![0u8; rs as usize];
    'outer: while !live.stopping() {
        let remaining = live.deadline.saturating_duration_since(Instant::now());
        // Wake up now and then to notice Ctrl-C.
        let t0 = Instant::now();
        let slot = alloc.acquire_timeout(remaining.min(STOP_SLICE));
        q.slot_wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut slot = match slot {
            Ok(s) => s,
            Err(SlotsError::Timeout { .. }) => continue,
            Err(_) => break,
        };
        q.held.fetch_add(1, Ordering::Relaxed);
        // One quantum of reads, with a `should_yield` checkpoint between reads.
        let mut quantum = |should_yield: &dyn Fn() -> bool| {
            let started = Instant::now();
            while started.elapsed() < live.cfg.slot_quantum {
                if live.stopping() {
                    return Quantum::Stop;
                }
                let off = cursor.fetch_add(rs, Ordering::Relaxed) % size;
                let off = off.min(size.saturating_sub(rs));
                buf = live.read(engine.as_mut(), q, std::mem::take(&mut buf), off);
                live.engines.record(id, engine.counters());
                cpu_work(&buf, live.cfg.cpu_work_per_read, &|| live.stopping());
                if should_yield() {
                    return Quantum::Yield;
                }
            }
            Quantum::Done
        };
        let done = if live.cfg.lease_parking {
            // The current slot carries the scan's tenant.
            let current = slot.make_current();
            // The lease's checkpoint: `should_yield`, and the CPU given
            // away once a millisecond of reads and CPU work.
            quantum(&|| current.checkpoint())
        } else {
            // Without lease parking the thread names its tenant itself.
            let _tenant = q.tenant.as_ref().map(Tenant::enter);
            quantum(&|| slot.should_yield())
        };
        drop(slot);
        q.held.fetch_sub(1, Ordering::Relaxed);
        match done {
            Quantum::Stop => break 'outer,
            // A yielded slot is asked for again by the allocation itself.
            Quantum::Yield => {}
            // Ask for one more slot over the allocation's life.
            Quantum::Done => {
                let m = max.fetch_add(1, Ordering::Relaxed) + 1;
                if alloc.set_max(m).is_err() {
                    break;
                }
            }
        }
    }
    live.engines.record(id, engine.counters());
}

/// How a scan thread's quantum under one slot ended.
enum Quantum {
    /// The quantum's time is up.
    Done,
    /// `should_yield` asked for the slot back (the budget shrank).
    Yield,
    /// The run is stopping.
    Stop,
}

/// Start a short query every `short_query_interval` (at most
/// `MAX_LIVE_SHORT` at once) until the run stops; their threads, to join.
fn spawn_shorts(live: &Arc<Live>, mut id: u32) -> Vec<JoinHandle<()>> {
    let mut shorts = Vec::new();
    let every = live.cfg.short_query_interval;
    if every.is_zero() {
        return shorts;
    }
    let mut next = Instant::now();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    while !live.stopping() {
        next += every;
        if live.live_short.load(Ordering::Relaxed) < MAX_LIVE_SHORT {
            let q = live.add_query(id, QueryKind::Short, None);
            id += 1;
            live.live_short.fetch_add(1, Ordering::Relaxed);
            live.query_threads.fetch_add(1, Ordering::Relaxed);
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let (l, s) = (live.clone(), seed);
            if let Ok(h) = std::thread::Builder::new()
                .name(format!("short{}", q.id))
                .spawn(move || short_query(&l, &q, s))
            {
                shorts.push(h);
            } else {
                live.live_short.fetch_sub(1, Ordering::Relaxed);
            }
        }
        sleep_until(next, &|| live.stopping());
    }
    shorts
}

/// A short query: one slot, `SHORT_READS` random reads of the file's first
/// `SHORT_REGION` bytes with half the CPU work of a scan between them.
fn short_query(live: &Live, q: &QueryState, seed: u64) {
    let run = || -> Option<()> {
        // Its one slot: a `min` without a tree (the fair schedulers grant it
        // at once, outside the budget), requested from the tree with one
        // (so the tree's priority, weight and `max_concurrent_threads`
        // decide it, and a lower-priority holder is told to yield).
        let min = u64::from(live.disk.is_none());
        let alloc = live.allocate(QueryKind::Short, min, 1).ok()?;
        let t0 = Instant::now();
        // At most SHORT_SLOT_WAIT in all, one stop slice at a time.
        let slot = loop {
            let left = SHORT_SLOT_WAIT.saturating_sub(t0.elapsed());
            match alloc.acquire_timeout(left.min(STOP_SLICE)) {
                Err(SlotsError::Timeout { .. }) if !left.is_zero() && !live.stopping() => {}
                other => break other,
            }
        };
        q.slot_wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut slot = slot.ok()?;
        q.held.fetch_add(1, Ordering::Relaxed);
        let (id, mut engine) = live.engines.open();
        {
            let _current = live.cfg.lease_parking.then(|| slot.make_current());
            let region = SHORT_REGION.min(live.cfg.file_size) / SHORT_READ as u64;
            let mut x = seed | 1;
            let mut buf = vec![0u8; SHORT_READ];
            for _ in 0..SHORT_READS {
                if live.stopping() {
                    break;
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let off = (x % region.max(1)) * SHORT_READ as u64;
                buf = live.read(engine.as_mut(), q, buf, off);
                cpu_work(&buf, live.cfg.cpu_work_per_read / 2, &|| live.stopping());
            }
        }
        live.engines.record(id, engine.counters());
        drop(slot);
        q.held.fetch_sub(1, Ordering::Relaxed);
        Some(())
    };
    let _ = run();
    q.finish();
    live.live_short.fetch_sub(1, Ordering::Relaxed);
}
