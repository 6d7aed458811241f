//! `cargo xtask bench wait`: where a throttle wait's overshoot goes. Each
//! variant runs on a fresh thread (its own ring, default timer slack
//! unless the variant says otherwise) and waits `WAITS` times for a 1 ms
//! and a 100 µs deficit, as a throttler does: deadline on the throttle
//! clock (`CLOCK_MONOTONIC_RAW`), converted to an absolute
//! `CLOCK_MONOTONIC` one. Reports the median and p99 overshoot and the
//! thread CPU per wait. Variants are interleaved over `ROUNDS` rounds (the
//! machine is shared); the keys take the median over all waits.
//!
//! * `nanosleep`: `BlockingWait` (`clock_nanosleep(TIMER_ABSTIME)`, the
//!   thread's default 50 µs timer slack), the baseline;
//! * `nanosleep_slack1ns`: the same on a thread whose slack is 1 ns: not a
//!   candidate (the baseline's slack stays as it is), a diagnostic that
//!   shows the machine's wake-up latency without slack;
//! * `ring_sqe`: `RingWait`'s `IORING_OP_TIMEOUT` SQE (absolute);
//! * `ring_sqe_coop`: the same on a `COOP_TASKRUN` ring;
//! * `ring_sqe_defer`: on a `SINGLE_ISSUER | DEFER_TASKRUN` ring;
//! * `ring_enter`: no SQE, `io_uring_enter`'s absolute `EXT_ARG` timeout;
//! * `ring_enter_defer`: the same on a `DEFER_TASKRUN` ring;
//! * `ring_sqe_slack1ns`: the SQE wait on a 1 ns-slack thread (does the
//!   thread's slack reach a ring's hrtimer? it should not);
//! * `ring_enter_adv20` (`RingWaitConfig::DEFAULT`), `ring_sqe_adv20`:
//!   woken 20 µs early, the rest spun on the clock (the CPU per wait shows
//!   the spin's cost).

use std::sync::Arc;
use std::time::Duration;

use slotring_benchkit::{Report, median, percentile};
use slotring_throttle::{BlockingWait, MonotonicClock, WaitStrategy};
use slotring_uring::{RingWait, RingWaitConfig};

const WAITS: usize = 30;
const ROUNDS: usize = 10;
const DEFICITS_US: [u64; 2] = [1000, 100];

#[derive(Clone, Copy)]
struct Variant {
    name: &'static str,
    /// `None`: `BlockingWait` (nanosleep).
    ring: Option<RingWaitConfig>,
    slack_1ns: bool,
}

fn variants() -> Vec<Variant> {
    let sqe = RingWaitConfig::TIMEOUT_SQE;
    let enter = RingWaitConfig {
        enter_timeout: true,
        ..sqe
    };
    let v = |name, ring, slack_1ns| Variant {
        name,
        ring,
        slack_1ns,
    };
    vec![
        v("nanosleep", None, false),
        v("nanosleep_slack1ns", None, true),
        v("ring_sqe", Some(sqe), false),
        v(
            "ring_sqe_coop",
            Some(RingWaitConfig {
                coop_taskrun: true,
                ..sqe
            }),
            false,
        ),
        v(
            "ring_sqe_defer",
            Some(RingWaitConfig {
                defer_taskrun: true,
                ..sqe
            }),
            false,
        ),
        v("ring_enter", Some(enter), false),
        v(
            "ring_enter_defer",
            Some(RingWaitConfig {
                defer_taskrun: true,
                ..enter
            }),
            false,
        ),
        v("ring_sqe_slack1ns", Some(sqe), true),
        v(
            "ring_enter_adv20",
            Some(RingWaitConfig {
                advance: Duration::from_micros(20),
                ..enter
            }),
            false,
        ),
        v(
            "ring_sqe_adv20",
            Some(RingWaitConfig {
                advance: Duration::from_micros(20),
                ..sqe
            }),
            false,
        ),
    ]
}

fn thread_cpu_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).expect("clock");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// `(overshoots µs, CPU µs per wait)` of `WAITS` waits of `deficit_us`.
fn run(v: Variant, deficit_us: u64) -> Result<(Vec<f64>, f64), String> {
    std::thread::spawn(move || {
        if v.slack_1ns {
            nix::sys::prctl::set_timerslack(1).map_err(|e| format!("PR_SET_TIMERSLACK: {e}"))?;
        }
        let wait: Arc<dyn WaitStrategy> = match v.ring {
            None => Arc::new(BlockingWait),
            Some(cfg) => Arc::new(RingWait::with_config(cfg).map_err(|e| e.to_string())?),
        };
        let clock = MonotonicClock::shared();
        // One wait first: the ring and the thread are warm.
        wait.wait_until(clock.as_ref(), clock.now_ns() + 100_000)
            .map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(WAITS);
        let cpu0 = thread_cpu_ns();
        for _ in 0..WAITS {
            let deadline = clock.now_ns() + deficit_us * 1_000;
            wait.wait_until(clock.as_ref(), deadline)
                .map_err(|e| e.to_string())?;
            out.push((clock.now_ns() - deadline) as f64 / 1_000.0);
        }
        let cpu = (thread_cpu_ns() - cpu0) as f64 / 1_000.0 / WAITS as f64;
        Ok((out, cpu))
    })
    .join()
    .map_err(|_| "the variant's thread panicked".to_string())?
}

fn main() {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let vs = variants();
    // (variant, deficit) -> overshoots, cpu per wait samples
    let mut all: Vec<Vec<(Vec<f64>, Vec<f64>)>> =
        vec![vec![(Vec::new(), Vec::new()); DEFICITS_US.len()]; vs.len()];
    let mut failed: Vec<Option<String>> = vec![None; vs.len()];
    for _ in 0..ROUNDS {
        for (i, v) in vs.iter().enumerate() {
            for (j, &d) in DEFICITS_US.iter().enumerate() {
                match run(*v, d) {
                    Ok((o, cpu)) => {
                        all[i][j].0.extend(o);
                        all[i][j].1.push(cpu);
                    }
                    Err(e) => failed[i] = Some(e),
                }
            }
        }
    }
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut r = Report::new("wait");
    let mut rows = Vec::new();
    let mut p50_1ms = Vec::new();
    for (i, v) in vs.iter().enumerate() {
        if let Some(e) = &failed[i] {
            rows.push(format!("{:<20} not measured: {e}", v.name));
            continue;
        }
        let mut cells = Vec::new();
        for (j, &d) in DEFICITS_US.iter().enumerate() {
            let (o, cpu) = &mut all[i][j];
            let (p50, p99, c) = (median(o), percentile(o, 99.0), median(cpu));
            cells.push((p50, p99, c));
            let unit = if d == 1000 { "1ms" } else { "100us" };
            r.put(
                &format!("{}_{unit}_p50_us", v.name),
                p50,
                "median overshoot, µs",
            );
            r.put(
                &format!("{}_{unit}_p99_us", v.name),
                p99,
                "p99 overshoot, µs",
            );
            r.put(
                &format!("{}_{unit}_cpu_us", v.name),
                c,
                "thread CPU per wait, µs (median of rounds)",
            );
        }
        p50_1ms.push((v.name, cells[0].0));
        rows.push(format!(
            "{:<20} {:>10.1} {:>10.1} {:>9.1} {:>10.1} {:>10.1} {:>9.1}",
            v.name, cells[0].0, cells[0].1, cells[0].2, cells[1].0, cells[1].1, cells[1].2
        ));
    }
    println!(
        "\nwait: overshoot past the deadline, µs ({} waits per cell; CPU µs per wait)",
        WAITS * ROUNDS
    );
    println!(
        "{:<20} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9}",
        "variant", "1ms p50", "1ms p99", "1ms CPU", "100us p50", "100us p99", "100us CPU"
    );
    for row in &rows {
        println!("{row}");
    }
    if let Some(&(_, base)) = p50_1ms.iter().find(|(n, _)| *n == "nanosleep") {
        for (n, p) in &p50_1ms {
            println!("{n:<20} 1 ms p50 / nanosleep's: {:.2}", p / base);
        }
    }
    println!("load average before: {load}after: {load_after}");
    r.finish().expect("write target/bench/wait.json");
}
