//! `cargo xtask bench throttle`: ours against a faithful mutex port of
//! ClickHouse's `src/Common/Throttler.cpp` and the `governor` crate, in one
//! run. Writes `target/bench/throttle.json`; the suite's io_uring wait is
//! slotring-bench's `throttle_uring`, which adds its key to the same file.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};
use slotring_benchkit::{
    Report, median, ns_per_iter, ns_per_iter_threads, overshoots_us, percentile,
};
use slotring_throttle::{
    BlockingWait, Clock, MonotonicClock, Throttle, Throttler, UNLIMITED_BLOCK, WaitStrategy,
};

const NS: f64 = 1_000_000_000.0;

fn clock_gettime_ns() -> u64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC_RAW).expect("CLOCK_MONOTONIC_RAW");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// A faithful port of ClickHouse's `Throttler::throttle` / `throttleImpl`:
/// a `f64` bucket under `std::sync::Mutex`, `min` applied after subtracting.
struct MutexPort {
    clock: fn() -> u64,
    state: Mutex<PortState>,
    limit: u64,
    block_count: AtomicU64,
}

struct PortState {
    count: u64,
    max_speed: u64,
    max_burst: u64,
    tokens: f64,
    prev_ns: u64,
}

impl MutexPort {
    fn new(max_speed: u64, clock: fn() -> u64) -> Self {
        Self {
            clock,
            state: Mutex::new(PortState {
                count: 0,
                max_speed,
                max_burst: max_speed,
                tokens: max_speed as f64,
                prev_ns: 0,
            }),
            limit: 0,
            block_count: AtomicU64::new(0),
        }
    }

    fn throttle(&self, amount: u64, max_block_ns: u64) -> bool {
        let (count_value, tokens_value, max_speed_value);
        {
            let mut s = self.state.lock().unwrap();
            let now = (self.clock)();
            let mut speed = 0;
            if s.max_speed != 0 {
                speed = s.max_speed;
                let delta_seconds = if s.prev_ns != 0 {
                    (now - s.prev_ns) as f64 / NS
                } else {
                    0.0
                };
                s.tokens = (s.tokens + s.max_speed as f64 * delta_seconds - amount as f64)
                    .min(s.max_burst as f64);
            }
            s.count += amount;
            count_value = s.count;
            tokens_value = s.tokens;
            max_speed_value = speed;
            s.prev_ns = now;
        }
        assert!(self.limit == 0 || count_value <= self.limit);
        let block = max_block_ns > 0 && max_speed_value > 0 && tokens_value < 0.0;
        if block {
            self.block_count.fetch_add(1, Ordering::Relaxed);
            let block_ns = -tokens_value / max_speed_value as f64 * NS;
            let block_ns = if block_ns >= u64::MAX as f64 {
                u64::MAX
            } else {
                block_ns as u64
            };
            std::thread::sleep(Duration::from_nanos(block_ns.min(max_block_ns)));
            self.block_count.fetch_sub(1, Ordering::Relaxed);
        }
        block
    }
}

static FAKE_NOW: AtomicU64 = AtomicU64::new(1);

/// The mutex port's clock for the algorithm-only measurement.
fn fake_clock() -> u64 {
    FAKE_NOW.load(Ordering::SeqCst)
}

/// Ours' twin of `fake_clock`: the same load, and no clamp (it claims
/// monotonicity, like `CLOCK_MONOTONIC_RAW`).
#[derive(Debug)]
struct FakeClock;

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        fake_clock()
    }

    fn never_steps_back(&self) -> bool {
        true
    }
}

/// A tiny deterministic generator for request sizes.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// 4 KiB – 1 MiB.
    fn amount(&mut self) -> u64 {
        4096 + self.next() % ((1 << 20) - 4096 + 1)
    }
}

/// Achieved-rate error (percent) of a real-clock run with real waits: empty
/// the burst, then charge random 4 KiB–1 MiB requests for `secs`.
fn rate_error_pct(rate: u64, secs: f64) -> f64 {
    let t = Throttler::new(rate).unwrap();
    let clock = MonotonicClock::shared();
    t.throttle(rate, Duration::ZERO).unwrap(); // burst excluded
    let start = clock.now_ns();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ rate);
    let mut charged: u64 = 0;
    loop {
        let a = rng.amount();
        t.throttle(a, UNLIMITED_BLOCK).unwrap();
        charged += a;
        let elapsed = (clock.now_ns() - start) as f64 / NS;
        if elapsed >= secs {
            let achieved = charged as f64 / elapsed;
            return (achieved - rate as f64).abs() / rate as f64 * 100.0;
        }
    }
}

fn main() {
    let mut r = Report::new("throttle");
    const AMOUNT: u64 = 4096;
    let fast_rate = 1u64 << 44; // never in debt at these call rates: the no-wait path
    let iters = 2_000_000;

    let clock_ns = ns_per_iter(7, iters, || {
        std::hint::black_box(clock_gettime_ns());
    });
    r.put(
        "clock_gettime_raw_ns",
        clock_ns,
        "one CLOCK_MONOTONIC_RAW read (both ports pay it)",
    );

    let default_clock = MonotonicClock::new();
    let ours_clock_ns = ns_per_iter(7, iters, || {
        std::hint::black_box(default_clock.now_ns());
    });
    r.put(
        "clock_default_ns",
        ours_clock_ns,
        &format!(
            "one read of our default clock ({:?}; see the throttle crate's clock docs)",
            default_clock.source()
        ),
    );

    let ours = Throttler::new(fast_rate).unwrap();
    let port = MutexPort::new(fast_rate, clock_gettime_ns);
    let gov = governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MAX));

    let ours_1t = ns_per_iter(7, iters, || {
        std::hint::black_box(ours.throttle(AMOUNT, Duration::ZERO).unwrap());
    });
    let port_1t = ns_per_iter(7, iters, || {
        std::hint::black_box(port.throttle(AMOUNT, 0));
    });
    let gov_1t = ns_per_iter(7, iters, || {
        let _ = std::hint::black_box(gov.check());
    });
    r.put("throttle_ns_1t", ours_1t, "ours, no-wait path, 1 thread");
    r.put(
        "mutex_port_ns_1t",
        port_1t,
        "ClickHouse's Throttler.cpp: f64 under std Mutex",
    );
    r.put(
        "governor_ns_1t",
        gov_1t,
        "governor 0.10 direct limiter, check()",
    );
    r.put("ratio_ours_vs_mutex_1t", ours_1t / port_1t, "goal <= 0.5");

    // The algorithms alone: both read a counter as their clock (an atomic
    // load), so the difference is bucket arithmetic and synchronisation.
    let ours_core = Throttler::builder(fast_rate)
        .clock(Arc::new(FakeClock))
        .build()
        .unwrap();
    let port_core = MutexPort::new(fast_rate, fake_clock);
    let ours_core_1t = ns_per_iter(7, iters, || {
        std::hint::black_box(ours_core.throttle(AMOUNT, Duration::ZERO).unwrap());
    });
    let port_core_1t = ns_per_iter(7, iters, || {
        std::hint::black_box(port_core.throttle(AMOUNT, 0));
    });
    r.put(
        "throttle_core_ns_1t",
        ours_core_1t,
        "ours with a counter for a clock: the algorithm alone",
    );
    r.put(
        "mutex_port_core_ns_1t",
        port_core_1t,
        "mutex port with a counter for a clock",
    );

    let ours = Arc::new(Throttler::new(fast_rate).unwrap());
    let port = Arc::new(MutexPort::new(fast_rate, clock_gettime_ns));
    let ours_2t = ns_per_iter_threads(7, 2, iters / 2, |_| {
        std::hint::black_box(ours.throttle(AMOUNT, Duration::ZERO).unwrap());
    });
    let port_2t = ns_per_iter_threads(7, 2, iters / 2, |_| {
        std::hint::black_box(port.throttle(AMOUNT, 0));
    });
    let gov_2t = ns_per_iter_threads(7, 2, iters / 2, |_| {
        let _ = std::hint::black_box(gov.check());
    });
    r.put(
        "throttle_ns_2t",
        ours_2t,
        "ours, 2 threads on one throttler (wall ns per call per thread)",
    );
    let ours_raw = Arc::new(
        Throttler::builder(fast_rate)
            .clock(Arc::new(MonotonicClock::without_tsc()))
            .build()
            .unwrap(),
    );
    let ours_raw_2t = ns_per_iter_threads(7, 2, iters / 2, |_| {
        std::hint::black_box(ours_raw.throttle(AMOUNT, Duration::ZERO).unwrap());
    });
    r.put(
        "throttle_ns_2t_clock_raw",
        ours_raw_2t,
        "ours on CLOCK_MONOTONIC_RAW instead of the TSC, 2 threads (what the clock costs)",
    );
    r.put("mutex_port_ns_2t", port_2t, "mutex port, 2 threads");
    r.put("governor_ns_2t", gov_2t, "governor, 2 threads");
    r.put("ratio_ours_vs_governor_2t", ours_2t / gov_2t, "goal <= 1");

    let secs = 3.0;
    let e1 = rate_error_pct(1_000_000, secs);
    let e2 = rate_error_pct(100_000_000, secs);
    let e3 = rate_error_pct(1_000_000_000, secs);
    r.put(
        "rate_error_pct_1mbs",
        e1,
        "1 MB/s, 3 s, 4 KiB-1 MiB requests, real waits",
    );
    r.put("rate_error_pct_100mbs", e2, "100 MB/s");
    r.put("rate_error_pct_1gbs", e3, "1 GB/s");
    r.put(
        "rate_error_pct_max",
        e1.max(e2).max(e3),
        "worst of the three; goal <= 0.5",
    );

    let clock = MonotonicClock::shared();
    let wait = BlockingWait;
    let mut overshoot = overshoots_us(
        300,
        1_000_000,
        || clock.now_ns(),
        |deadline| wait.wait_until(clock.as_ref(), deadline).unwrap(),
    );
    r.put(
        "wait_overshoot_us_p50",
        median(&mut overshoot),
        "blocking wait, 1 ms deficits",
    );
    r.put(
        "wait_overshoot_us_p99",
        percentile(&mut overshoot, 99.0),
        "blocking wait, 1 ms deficits",
    );
    // The same waits on a per-thread io_uring ring (`RingWait`, which the
    // facade installs by default) are measured by slotring-bench's
    // `throttle_uring`, which `cargo xtask bench throttle` runs next: it adds
    // `wait_overshoot_us_p50_ring` to this suite's JSON.
    r.finish().expect("write target/bench/throttle.json");
}
