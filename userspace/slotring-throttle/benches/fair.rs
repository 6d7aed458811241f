//! `cargo xtask bench fair`: tenants sharing one 64 MiB/s throttler on a
//! real disk, the fair order beside today's first-come bucket (ClickHouse's
//! behaviour), and the no-wait cost beside `governor`. Writes
//! `target/bench/fair.json`.
//!
//! Every stream is a thread that waits on the throttler, then `pread`s the
//! bytes it was granted from a file under `/var/tmp` whose page cache is
//! evicted (`posix_fadvise(DONTNEED)`) before and every 250 ms during each
//! run. Bytes are counted at the instant the throttler lets them go. The
//! async variant (`tokio::spawn` tasks reading through `SharedEngine`) is
//! slotring-bench's `fair_uring`, which adds its key to `fair.json`.

use std::num::NonZeroU32;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use slotring_benchkit::{DataFile, Report, median, percentile};
use slotring_throttle::{Tenant, Throttle, Throttler, UNLIMITED_BLOCK};

const MIB: u64 = 1 << 20;
const RATE: u64 = 64 * MIB;
const FILE_SIZE: u64 = 512 * MIB;

/// One group of streams: a tenant (or none: first-come), how many streams,
/// the request size, and when the group starts.
struct Group {
    tenant: Option<Tenant>,
    streams: usize,
    request: u64,
    start: Duration,
}

/// Per group: `(grant instant since start, wait)` of every request, in ns.
type Log = Vec<Vec<(u64, u64)>>;

fn run(t: &Arc<Throttler>, data: &DataFile, groups: &[Group], length: Duration) -> Log {
    let logs: Vec<Mutex<Vec<(u64, u64)>>> = groups.iter().map(|_| Mutex::new(vec![])).collect();
    let stop = AtomicBool::new(false);
    let total: usize = groups.iter().map(|g| g.streams).sum();
    let barrier = Barrier::new(total + 2);
    std::thread::scope(|s| {
        for (gi, g) in groups.iter().enumerate() {
            for k in 0..g.streams {
                let (t, logs, stop, barrier) = (t.clone(), &logs, &stop, &barrier);
                let tenant = g.tenant.clone();
                let (req, start) = (g.request, g.start);
                let file = &data.file;
                s.spawn(move || {
                    let _scope = tenant.as_ref().map(Tenant::enter);
                    let mut buf = vec![0u8; req as usize];
                    let mut x = 0x2545_f491_4f6c_dd1du64 ^ ((gi as u64) << 32 | k as u64);
                    let mut mine = Vec::new();
                    barrier.wait();
                    let t0 = Instant::now();
                    std::thread::sleep(start);
                    while !stop.load(Ordering::Relaxed) {
                        let before = Instant::now();
                        t.throttle(req, UNLIMITED_BLOCK).expect("throttle");
                        let after = Instant::now();
                        mine.push((
                            (after - t0).as_nanos() as u64,
                            (after - before).as_nanos() as u64,
                        ));
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let off = (x % (FILE_SIZE / req)) * req;
                        file.read_exact_at(&mut buf, off).expect("pread");
                    }
                    logs[gi].lock().unwrap().extend(mine);
                });
            }
        }
        // The evictor.
        s.spawn(|| {
            barrier.wait();
            while !stop.load(Ordering::Relaxed) {
                data.evict();
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        barrier.wait();
        std::thread::sleep(length);
        stop.store(true, Ordering::Relaxed);
    });
    logs.into_iter().map(|m| m.into_inner().unwrap()).collect()
}

/// Bytes each group was granted in `[from, to)`.
fn bytes_in(log: &Log, groups: &[Group], from: Duration, to: Duration) -> Vec<f64> {
    let (a, b) = (from.as_nanos() as u64, to.as_nanos() as u64);
    log.iter()
        .zip(groups)
        .map(|(l, g)| l.iter().filter(|e| e.0 >= a && e.0 < b).count() as f64 * g.request as f64)
        .collect()
}

fn waits_ms(log: &[(u64, u64)], from: Duration) -> Vec<f64> {
    let a = from.as_nanos() as u64;
    log.iter()
        .filter(|e| e.0 >= a)
        .map(|e| e.1 as f64 / 1e6)
        .collect()
}

fn throttler() -> Arc<Throttler> {
    Arc::new(Throttler::builder(RATE).name("disk").build().unwrap())
}

/// Jain's index of `x_i / w_i`.
fn jain(bytes: &[f64], weights: &[f64]) -> f64 {
    let x: Vec<f64> = bytes.iter().zip(weights).map(|(b, w)| b / w).collect();
    let s: f64 = x.iter().sum();
    let s2: f64 = x.iter().map(|v| v * v).sum();
    s * s / (x.len() as f64 * s2)
}

fn two_tenants(
    data: &DataFile,
    wa: u32,
    wb: u32,
    fair: bool,
    request: u64,
) -> (Vec<f64>, Vec<f64>, f64) {
    let t = throttler();
    let tenant = |n: &str, w| fair.then(|| Tenant::new(n, w).unwrap());
    let groups = [
        Group {
            tenant: tenant("a", wa),
            streams: 64,
            request,
            start: Duration::ZERO,
        },
        Group {
            tenant: tenant("b", wb),
            streams: 1,
            request,
            start: Duration::ZERO,
        },
    ];
    // The first second drains the burst; measure the next five.
    let (from, to) = (Duration::from_secs(2), Duration::from_secs(7));
    data.evict();
    let log = run(&t, data, &groups, to);
    let bytes = bytes_in(&log, &groups, from, to);
    let mut b_waits = waits_ms(&log[1], from);
    // The granted rate between the first and the last grant of the window
    // (free of the ±1 request a window edge cuts off).
    let mut grants: Vec<u64> = log
        .iter()
        .flatten()
        .map(|e| e.0)
        .filter(|&g| g >= from.as_nanos() as u64 && g < to.as_nanos() as u64)
        .collect();
    grants.sort_unstable();
    let span = (grants[grants.len() - 1] - grants[0]) as f64 / 1e9;
    let rate = (grants.len() - 1) as f64 * request as f64 / span;
    (bytes, vec![percentile(&mut b_waits, 99.0)], rate)
}

/// ns per call per thread of two threads that each, `$iters` times, read
/// `$clock` and run a load + CAS retry loop on the shared word `$w` (an
/// `Arc` of a 64- or 128-bit atomic; `$widen` turns the clock reading into
/// its type), with no other arithmetic: the floor of a limiter whose whole
/// state is that word. A macro because the two atomics share no trait.
macro_rules! cas_floor {
    ($w:expr, $clock:expr, $iters:expr, $widen:expr) => {
        two_threads($iters, |_| {
            let (w, clock, iters) = ($w.clone(), $clock.clone(), $iters);
            Box::new(move || {
                let t0 = Instant::now();
                for _ in 0..iters {
                    let now = $widen(std::hint::black_box(clock.now_ns()));
                    let mut cur = w.load(Ordering::Acquire);
                    while let Err(found) = w.compare_exchange_weak(
                        cur,
                        cur.max(now) + 1,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        cur = found;
                    }
                }
                t0.elapsed()
            })
        })
    };
}

fn main() {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("fair: loadavg before: {}", load.trim());
    let data = DataFile::create(
        PathBuf::from(format!("/var/tmp/slotring-fair-{}.dat", std::process::id())),
        FILE_SIZE,
    );
    let mut r = Report::new("fair");
    let request = MIB; // ClickHouse reads in 1 MiB buffers (max_read_buffer_size)

    // 64 streams against 1, equal weights: first-come, then fair.
    let (fifo, fifo_wait, _) = two_tenants(&data, 1, 1, false, request);
    let (fair, fair_wait, fair_rate) = two_tenants(&data, 1, 1, true, request);
    let share = |v: &[f64], i: usize| 100.0 * v[i] / v.iter().sum::<f64>();
    r.put(
        "fair_share_b_pct",
        share(&fair, 1),
        "B (1 stream) vs A (64), equal weights, fair; goal 50 +- 2",
    );
    r.put(
        "fifo_share_b_pct",
        share(&fifo, 1),
        "the same under today's first-come bucket (ClickHouse)",
    );
    // The same through the async path (tasks on the multi-thread runtime,
    // each task's engine handle carrying its tenant) is slotring-bench's
    // `fair_uring`, which `cargo xtask bench fair` runs next: it adds
    // `fair_share_b_pct_async` to this suite's JSON.
    // Weights 3:1, the same streams.
    let (w31, _, _) = two_tenants(&data, 3, 1, true, request);
    r.put(
        "fair_share_a_pct_w31",
        share(&w31, 0),
        "A weight 3 vs B weight 1; goal 75 +- 2",
    );
    let j = jain(&fair, &[1.0, 1.0]).min(jain(&w31, &[3.0, 1.0]));
    r.put(
        "fair_jain_weighted",
        j,
        "Jain's index of bytes/weight, the worse of 1:1 and 3:1; goal >= 0.99",
    );
    r.put(
        "fair_rate_error_pct",
        100.0 * (fair_rate - RATE as f64).abs() / RATE as f64,
        "total granted vs 64 MiB/s over 5 s, fair; goal <= 0.5",
    );
    r.put(
        "fair_b_wait_p99_ms",
        fair_wait[0],
        &format!(
            "B's wait p99, fair; goal <= {:.1} ms (its 1 MiB at half the rate + 5 ms)",
            request as f64 / (RATE as f64 / 2.0) * 1e3 + 5.0
        ),
    );
    r.put(
        "fifo_b_wait_p99_ms",
        fifo_wait[0],
        "B's wait p99, first-come",
    );

    // A tenant returning from 10 s idle: A runs alone, B (8 streams) joins
    // at 10 s; B's bytes in its first second back against its half.
    {
        let t = throttler();
        let req = 64 * 1024;
        let groups = [
            Group {
                tenant: Some(Tenant::new("a", 1).unwrap()),
                streams: 64,
                request: req,
                start: Duration::ZERO,
            },
            Group {
                tenant: Some(Tenant::new("b", 1).unwrap()),
                streams: 8,
                request: req,
                start: Duration::from_secs(10),
            },
        ];
        data.evict();
        let log = run(&t, &data, &groups, Duration::from_secs(12));
        let b = bytes_in(
            &log,
            &groups,
            Duration::from_secs(10),
            Duration::from_secs(11),
        )[1];
        let share = RATE as f64 / 2.0;
        r.put(
            "fair_idle_return_excess_pct",
            100.0 * (b - share) / share,
            "B's bytes above its half in its first second back after 10 s idle; goal <= tau/1 s = 0.5",
        );
    }

    // Operations: 4 KiB random reads under 64 MiB/s and 2,000 ops/s.
    {
        let ops = 2_000u64;
        let t = Arc::new(
            Throttler::builder(RATE)
                .max_ops(ops)
                .name("disk")
                .build()
                .unwrap(),
        );
        let req = 4096;
        let groups = [Group {
            tenant: None,
            streams: 8,
            request: req,
            start: Duration::ZERO,
        }];
        data.evict();
        let (from, to) = (Duration::from_secs(2), Duration::from_secs(6));
        let log = run(&t, &data, &groups, to);
        let n = bytes_in(&log, &groups, from, to)[0] / req as f64;
        let measured = n / (to - from).as_secs_f64();
        r.put(
            "fair_iops_error_pct",
            100.0 * (measured - ops as f64).abs() / ops as f64,
            "4 KiB random reads vs a 2,000 ops/s limit (bytes alone would allow 16,384/s)",
        );
    }

    // The no-wait cost: two threads, each its own tenant, on one throttler
    // that never waits, beside governor's direct limiter.
    {
        let fast = Arc::new(Throttler::new(slotring_throttle::MAX_RATE).unwrap());
        let gov = Arc::new(governor::RateLimiter::direct(governor::Quota::per_second(
            NonZeroU32::MAX,
        )));
        let iters = 1_000_000u64;
        let mut ours = vec![];
        let mut theirs = vec![];
        let mut plain = vec![];
        // The floors: a clock read (our default clock, the TSC where the
        // kernel keeps time with it, as governor's quanta) and a load + CAS
        // retry loop on one word shared by both threads, with no
        // arithmetic: 128 bits (the width exact nano-token state needs) and
        // 64 bits (governor's state).
        let clock = slotring_throttle::MonotonicClock::shared();
        let w128 = Arc::new(portable_atomic::AtomicU128::new(0));
        let w64 = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut floor128 = vec![];
        let mut floor64 = vec![];
        for _ in 0..7 {
            floor128.push(cas_floor!(w128, clock, iters, u128::from));
            floor64.push(cas_floor!(w64, clock, iters, |n: u64| n));
            plain.push(two_threads(iters, |_| {
                let fast = fast.clone();
                Box::new(move || {
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        std::hint::black_box(fast.throttle(4096, Duration::ZERO).unwrap());
                    }
                    t0.elapsed()
                })
            }));
            ours.push(two_threads(iters, |i| {
                let tenant = Tenant::new(format!("t{i}"), 1).unwrap();
                let fast = fast.clone();
                Box::new(move || {
                    let _s = tenant.enter();
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        std::hint::black_box(fast.throttle(4096, Duration::ZERO).unwrap());
                    }
                    t0.elapsed()
                })
            }));
            theirs.push(two_threads(iters, |_| {
                let gov = gov.clone();
                Box::new(move || {
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        let _ = std::hint::black_box(gov.check());
                    }
                    t0.elapsed()
                })
            }));
        }
        r.put(
            "fair_throttle_ns_2t",
            median(&mut ours),
            "ours with a tenant current, no-wait path, 2 threads (ns per call per thread)",
        );
        eprintln!(
            "  (context) the same throttler without a tenant, 2 threads: {:.1} ns",
            median(&mut plain)
        );
        r.put(
            "governor_ns_2t",
            median(&mut theirs),
            "governor 0.10 direct limiter check(), 2 threads",
        );
        r.put(
            "floor_cas128_ns_2t",
            median(&mut floor128),
            "context: clock read + load/CAS loop on one shared 128-bit word, no arithmetic, 2 threads",
        );
        r.put(
            "floor_cas64_ns_2t",
            median(&mut floor64),
            "context: the same on a 64-bit word (governor's width), 2 threads",
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("fair: loadavg after: {}", load.trim());
    let path = r.finish().expect("write the report");
    eprintln!("wrote {}", path.display());
}

type Body = Box<dyn FnOnce() -> Duration + Send>;

/// Run two bodies on two threads at once; ns per iteration per thread (the
/// slower thread's wall time).
fn two_threads(iters: u64, make: impl Fn(usize) -> Body) -> f64 {
    let bodies: Vec<Body> = (0..2).map(&make).collect();
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = bodies
        .into_iter()
        .map(|b| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                b()
            })
        })
        .collect();
    let worst = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .max()
        .unwrap();
    worst.as_nanos() as f64 / iters as f64
}
