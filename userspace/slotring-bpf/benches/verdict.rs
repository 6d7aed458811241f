//! `cargo xtask bench verdict`: does the kernel verdict tell a spinning
//! parked thread from a sleeping one?
//!
//! The matrix: threads that park their lease for waits of 1 ms, 20 ms,
//! 300 ms and 1 s, sleeping on an io_uring timeout and spinning 0, 1, 2, 5,
//! 10 or 20 % of each wait (by their own CPU time) before the sleep, after
//! the wake or between ten short sleeps (`tests/shapes/mod.rs`, shared with
//! the kernel tests). The threads of one wait length run at once (the
//! accounting is per thread and exact); each is judged by
//! `SlotringBpf::verify` with the default rule. The honest sleepers (0 %)
//! run again beside a `stress-ng --cpu 2` hog.
//!
//! An *honest sleeper* sleeps once per wait and never spins (0 % before
//! the sleep or after the wake: the shape of slotring's own waits). The 0 %
//! shape between ten short sleeps is an honest *poller*: its wake-ups cost
//! CPU in proportion to the wait (ten per wait), so the between-sleeps bound
//! judges it like a spinner; it is reported on its own.
//!
//! Keys:
//! * `verdict_false_pass`: spinners at 5 % or more that passed, and
//!   partial spinners that passed (goal 0);
//! * `verdict_partial_fails`: *partial spinners*, threads that spin
//!   through one wait in ten (95 % of it, before the sleep or after the
//!   wake) and sleep honestly through the others, that failed, of
//!   `verdict_partial_threads` (the count of hot episodes alone would let
//!   them pass; their CPU above the bounds does not);
//! * `verdict_false_fail`: honest sleepers that failed, quiet or beside the
//!   hog (goal 0);
//! * `verdict_poller_fails_<wait>`: honest pollers that failed, quiet or
//!   beside the hog (at 1 ms their 10,000 wake-ups a second cost 5-15 % of
//!   the wait on this VM: they fail by the rule);
//! * `verdict_detect_min_pct_20ms`: the smallest spin fraction at which
//!   every spinner of 20 ms waits failed, in every position and round (and
//!   at every larger fraction; goal <= 2; 100 when none);
//! * `verdict_hot_episode_pct_honest`: hot episodes of the honest sleepers,
//!   percent of their episodes (quiet and hog), and `…_worst`: of the
//!   honest sleeper with the most among those with 50 episodes or more
//!   (what `TOLERATED_HOT_FRACTION` must cover);
//! * `verdict_excess_pct_honest_worst`: the largest CPU above the bounds
//!   of an honest sleeper, percent of its parked time (what
//!   `TOLERATED_EXCESS_FRACTION` must cover);
//! * `switch_prog_ns`, `filtered_prog_ns`: what the probes cost per event,
//!   measured in the same run as the `bpf` suite does (`common/prog_cost.rs`);
//! * `honest_{pre,between,post}_max_us_<wait>[_hog]`: the largest segment
//!   of an episode of an honest sleeper or poller;
//! * `matrix_<wait>_<position>_<pct>_hot_pct` and `…_fails`: each cell,
//!   hot episodes in percent (mean over rounds) and rounds it failed.
//!
//! Calibration: `SLOTRING_VERDICT_RULE=pre_us,between_pct,post_us,post_pct`
//! runs the matrix under another [`EpisodeRule`] than the default (how the
//! constants in `verify/rule.rs` were chosen). The hot episodes of honest
//! sleepers are printed with their figures.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use slotring_benchkit::{Report, percentile};
use slotring_bpf::{BpfConfig, EpisodeRule, SlotringBpf, VerifyConfig, describe_hot};

#[path = "../tests/shapes/mod.rs"]
mod shapes;

#[path = "common/prog_cost.rs"]
mod prog_cost;

use shapes::{Position, Shape, run_episodes, run_sequence};

/// Wait lengths and episodes per thread (fewer at long waits: the suite
/// stays within a few minutes).
const WAITS: [(Duration, u32, &str); 4] = [
    (Duration::from_millis(1), 200, "1ms"),
    (Duration::from_millis(20), 50, "20ms"),
    (Duration::from_millis(300), 6, "300ms"),
    (Duration::from_secs(1), 4, "1s"),
];
const SPINS: [f64; 6] = [0.0, 1.0, 2.0, 5.0, 10.0, 20.0];
/// Spinners at this fraction or more must fail.
const MUST_FAIL_PCT: f64 = 5.0;
const ROUNDS: usize = 3;

/// A partial spinner spins through one wait in this many.
const PARTIAL_EVERY: u32 = 10;

/// One thread's outcome.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    wait: usize,
    position: Position,
    spin_pct: f64,
    /// A partial spinner: `spin_pct` of one wait in [`PARTIAL_EVERY`].
    partial: bool,
    hog: bool,
    pass: bool,
    episodes: u64,
    hot: u64,
    ratio: f64,
    /// CPU above the bounds, % of the parked time.
    excess_pct: f64,
    pre_max_ns: u64,
    between_max_ns: u64,
    post_max_ns: u64,
}

/// `stress-ng --cpu 2` in its own process group, stopped on drop.
struct Hog(Child);

impl Hog {
    fn start() -> Option<Self> {
        use std::os::unix::process::CommandExt;
        let child = Command::new("stress-ng")
            .args(["--cpu", "2", "--timeout", "900s", "--quiet"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        match child {
            Ok(c) => {
                // Let its workers start.
                std::thread::sleep(Duration::from_millis(500));
                Some(Self(c))
            }
            Err(e) => {
                eprintln!("verdict bench: stress-ng unavailable ({e}): no hog rounds");
                None
            }
        }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        // SIGTERM to the group we created: stress-ng stops its workers.
        let pgid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

/// `f` of the shape of each case with waits of `len`, each on a thread of
/// its own, all at once; the results in the order of `cases`.
fn each_case<T: Send>(
    len: Duration,
    cases: &[(Position, f64)],
    f: impl Fn(Shape) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = cases
            .iter()
            .map(|&(position, spin_pct)| {
                let shape = Shape {
                    wait: len,
                    spin_pct,
                    position,
                };
                s.spawn(move || f(shape))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("waiter")).collect()
    })
}

/// Every case of one wait length at once, and the partial spinners of
/// that length beside them; their outcomes.
fn round(bpf: &SlotringBpf, wait: usize, cases: &[(Position, f64)], hog: bool) -> Vec<Outcome> {
    let (len, episodes, _) = WAITS[wait];
    let partial: Vec<(Position, f64)> = match hog {
        false => [Position::BeforeSleep, Position::AfterWake]
            .into_iter()
            .map(|p| (p, 95.0))
            .collect(),
        true => vec![],
    };
    let mut tids = each_case(len, cases, |shape| run_episodes(&shape, episodes));
    // At least two spun waits each: the count's tolerance alone covers them.
    let n = episodes.max(2 * PARTIAL_EVERY);
    tids.extend(each_case(len, &partial, |spun| {
        let honest = Shape {
            spin_pct: 0.0,
            ..spun
        };
        let waits: Vec<Shape> = (0..n)
            .map(|i| match i % PARTIAL_EVERY == PARTIAL_EVERY - 1 {
                true => spun,
                false => honest,
            })
            .collect();
        run_sequence(&waits)
    }));
    let r = bpf
        .verify(&tids, VerifyConfig::default())
        .expect("verify registered threads");
    for (t, &(p, s)) in r.threads.iter().zip(cases) {
        if s == 0.0 {
            for e in &t.hot {
                eprintln!(
                    "  honest {} {}{}: {}",
                    WAITS[wait].2,
                    p.name(),
                    if hog { " (hog)" } else { "" },
                    describe_hot(e)
                );
            }
        }
    }
    let kinds = cases
        .iter()
        .map(|&c| (c, false))
        .chain(partial.iter().map(|&c| (c, true)));
    r.threads
        .iter()
        .zip(kinds)
        .map(|(t, ((position, spin_pct), partial))| {
            let w = &t.parked;
            Outcome {
                wait,
                position,
                spin_pct,
                partial,
                hog,
                pass: w.pass,
                episodes: w.segments.episodes,
                hot: w.hot_episodes(),
                ratio: w.parked_cpu_ratio(),
                excess_pct: w.hot_excess_ns() as f64 / w.parked_ns.max(1) as f64 * 100.0,
                pre_max_ns: w.segments.pre_sleep_max_ns,
                between_max_ns: w.segments.between_sleeps_max_ns,
                post_max_ns: w.segments.post_wake_max_ns,
            }
        })
        .collect()
}

/// The rule to run under: `SLOTRING_VERDICT_RULE`, else the default.
fn rule_from_env() -> EpisodeRule {
    let Ok(v) = std::env::var("SLOTRING_VERDICT_RULE") else {
        return EpisodeRule::default_rule();
    };
    let f: Vec<f64> = v
        .split(',')
        .map(|x| x.trim().parse().expect("SLOTRING_VERDICT_RULE: numbers"))
        .collect();
    assert_eq!(
        f.len(),
        4,
        "SLOTRING_VERDICT_RULE=pre_us,between_pct,post_us,post_pct"
    );
    EpisodeRule {
        pre_sleep_ns: (f[0] * 1e3) as u64,
        between_ppm: (f[1] * 1e4) as u64,
        post_wake_ns: (f[2] * 1e3) as u64,
        post_wake_ppm: (f[3] * 1e4) as u64,
    }
}

/// Sleeps once per wait and never spins.
fn honest(o: &Outcome) -> bool {
    o.spin_pct == 0.0 && o.position != Position::BetweenSleeps && !o.partial
}

/// Ten sleeps per wait, never spins.
fn poller(o: &Outcome) -> bool {
    o.spin_pct == 0.0 && o.position == Position::BetweenSleeps && !o.partial
}

/// A thread that must fail: a spinner at [`MUST_FAIL_PCT`] or more of every
/// wait, or a partial spinner.
fn must_fail(o: &Outcome) -> bool {
    o.partial || o.spin_pct >= MUST_FAIL_PCT
}

fn hot_pct(o: &Outcome) -> f64 {
    o.hot as f64 / o.episodes.max(1) as f64 * 100.0
}

fn pct_name(p: f64) -> String {
    format!("{p:.0}")
}

/// `SLOTRING_VERDICT_CALIBRATE=1`: every cell of the matrix with each
/// episode's segments read back exactly, printed as percentiles (no keys).
fn calibrate(bpf: &SlotringBpf, cases: &[(Position, f64)], hog: bool) {
    for (len, episodes, wname) in WAITS {
        let per = each_case(len, cases, |shape| {
            shapes::run_recorded(&shape, episodes, |t| {
                bpf.thread_acct(t).expect("registered")
            })
        });
        for (segs, &(p, spin)) in per.iter().zip(cases) {
            let mut line = format!(
                "calibrate{} {wname:>6} {:>8} {spin:>4}%:",
                if hog { " (hog)" } else { "" },
                p.name()
            );
            for (name, f) in [
                (
                    "pre",
                    (|s: &shapes::Segments| s.pre) as fn(&shapes::Segments) -> u64,
                ),
                ("between", |s| s.between),
                ("post", |s| s.post),
            ] {
                let mut v: Vec<f64> = segs.iter().map(|s| f(s) as f64 / 1e3).collect();
                line += &format!(
                    "  {name} p50 {:.1} p90 {:.1} p99 {:.1} max {:.1}",
                    percentile(&mut v, 50.0),
                    percentile(&mut v, 90.0),
                    percentile(&mut v, 99.0),
                    percentile(&mut v, 100.0)
                );
            }
            eprintln!("{line}");
        }
    }
}

fn main() {
    if std::env::var_os("SLOTRING_VERDICT_CALIBRATE").is_some() {
        return calibrate_all();
    }
    let mut report = Report::new("verdict");
    slotring_bpf::install_lease_observer();
    let start = Instant::now();
    let Some(cost) = prog_cost::measure() else {
        return;
    };
    prog_cost::put_switch_costs(&mut report, &cost);
    let all = run_matrix(start);
    let table = put_matrix(&mut report, &all);
    put_verdict_keys(&mut report, &all);
    put_honest_segments(&mut report, &all);
    report.put(
        "verdict_bench_s",
        start.elapsed().as_secs_f64(),
        "wall time of the suite, s",
    );
    eprintln!("\n{table}");
    report.finish().expect("write bench JSON");
}

/// `SLOTRING_VERDICT_CALIBRATE=1`: the matrix's segment percentiles,
/// quiet and beside the hog.
fn calibrate_all() {
    slotring_bpf::install_lease_observer();
    let bpf = prog_cost::load("slotring-bench-calibrate", std::process::id()).expect("load");
    let cases: Vec<(Position, f64)> = Position::ALL
        .iter()
        .flat_map(|&p| [0.0, 1.0, 2.0, 5.0].into_iter().map(move |s| (p, s)))
        .collect();
    calibrate(&bpf, &cases, false);
    let hog = Hog::start();
    let unspun: Vec<(Position, f64)> = Position::ALL.iter().map(|&p| (p, 0.0)).collect();
    calibrate(&bpf, &unspun, true);
    drop(hog);
}

/// Every round of the matrix, quiet, then the unspun shapes beside the
/// hog: every thread's outcome.
fn run_matrix(start: Instant) -> Vec<Outcome> {
    let rule = rule_from_env();
    let bpf = SlotringBpf::load(BpfConfig {
        pin_dir: format!("/sys/fs/bpf/slotring-bench-verdict-{}", std::process::id()).into(),
        episode_rule: rule,
        ..BpfConfig::default()
    })
    .expect("load");
    eprintln!(
        "verdict bench: {}",
        slotring_bpf::describe_rule(&rule, &VerifyConfig::default())
    );
    let matrix: Vec<(Position, f64)> = Position::ALL
        .iter()
        .flat_map(|&p| SPINS.iter().map(move |&s| (p, s)))
        .collect();
    let unspun: Vec<(Position, f64)> = Position::ALL.iter().map(|&p| (p, 0.0)).collect();
    let mut all = Vec::new();
    let mut rounds = |cases: &[(Position, f64)], hog: bool| {
        for r in 0..ROUNDS {
            for w in 0..WAITS.len() {
                all.extend(round(&bpf, w, cases, hog));
            }
            eprintln!(
                "verdict bench: {} round {} done ({:.0?})",
                if hog { "hog" } else { "quiet" },
                r + 1,
                start.elapsed()
            );
        }
    };
    rounds(&matrix, false);
    if let Some(hog) = Hog::start() {
        rounds(&unspun, true);
        drop(hog);
    }
    all
}

/// The matrix, quiet: a key per cell (hot % mean over rounds, rounds
/// failed), and the table printed after the keys (F for a round that
/// failed, and the raw ratio).
fn put_matrix(report: &mut Report, all: &[Outcome]) -> String {
    let mut table = format!(
        "hot episodes % (mean of {ROUNDS} rounds; F = failed in a round) / raw on-CPU-while-parked %, quiet:\n{:>8} {:>8}",
        "wait", "position"
    );
    for s in SPINS {
        table += &format!(" {:>12}", format!("{s}%"));
    }
    table += "\n";
    for (w, (_, _, wname)) in WAITS.iter().enumerate() {
        for p in Position::ALL {
            table += &format!("{wname:>8} {:>8}", p.name());
            for s in SPINS {
                let cell: Vec<&Outcome> = all
                    .iter()
                    .filter(|o| {
                        !o.hog && !o.partial && o.wait == w && o.position == p && o.spin_pct == s
                    })
                    .collect();
                let n = cell.len().max(1) as f64;
                let mean = cell.iter().map(|o| hot_pct(o)).sum::<f64>() / n;
                let fails = cell.iter().filter(|o| !o.pass).count();
                let ratio = cell.iter().map(|o| o.ratio).sum::<f64>() / n;
                let mark = if fails > 0 { "F" } else { " " };
                table += &format!(" {:>12}", format!("{mean:.0}{mark} {:.2}", ratio * 100.0));
                let key = format!("matrix_{wname}_{}_{}", p.name(), pct_name(s));
                report.put(
                    &format!("{key}_hot_pct"),
                    mean,
                    "hot episodes, % (mean over rounds)",
                );
                report.put(&format!("{key}_fails"), fails as f64, "rounds failed");
            }
            table += "\n";
        }
    }
    table
}

/// The verdict's own keys: false passes and fails, the detection floor,
/// the honest threads' hot share and excess, the pollers and the partial
/// spinners.
fn put_verdict_keys(report: &mut Report, all: &[Outcome]) {
    let false_pass = all.iter().filter(|o| must_fail(o) && o.pass).count();
    let false_fail = all.iter().filter(|o| honest(o) && !o.pass).count();
    let w20 = WAITS
        .iter()
        .position(|w| w.2 == "20ms")
        .expect("a 20 ms wait");
    let caught = |p: f64| {
        all.iter()
            .filter(|o| !o.partial && o.wait == w20 && o.spin_pct >= p)
            .all(|o| !o.pass)
    };
    let detect_min = SPINS
        .iter()
        .copied()
        .filter(|&p| p > 0.0)
        .find(|&p| caught(p))
        .unwrap_or(100.0);
    let (hot, eps) = all
        .iter()
        .filter(|o| honest(o))
        .fold((0, 0), |(h, e), o| (h + o.hot, e + o.episodes));
    // Where the fraction matters (the absolute count covers a thread of a
    // few long waits).
    let worst = all
        .iter()
        .filter(|o| honest(o) && o.episodes >= 50)
        .map(hot_pct)
        .fold(0.0, f64::max);
    let worst_excess = all
        .iter()
        .filter(|o| honest(o))
        .map(|o| o.excess_pct)
        .fold(0.0, f64::max);
    let partial: Vec<&Outcome> = all.iter().filter(|o| o.partial).collect();
    report.put(
        "verdict_false_pass",
        false_pass as f64,
        "spinners at >= 5 % of each wait, and partial spinners, that passed; goal <= 0",
    );
    report.put(
        "verdict_false_fail",
        false_fail as f64,
        "honest sleepers that failed, quiet or beside stress-ng --cpu 2; goal <= 0",
    );
    report.put(
        "verdict_detect_min_pct_20ms",
        detect_min,
        "smallest spin % caught at 20 ms waits, every position and round; goal <= 2",
    );
    report.put(
        "verdict_hot_episode_pct_honest",
        hot as f64 / eps.max(1) as f64 * 100.0,
        "hot episodes of honest sleepers, % of their episodes",
    );
    report.put(
        "verdict_hot_episode_pct_honest_worst",
        worst,
        "hot episodes of the honest sleeper (>= 50 episodes) with the most, %",
    );
    report.put(
        "verdict_excess_pct_honest_worst",
        worst_excess,
        "CPU above the bounds of the honest sleeper with the most, % of its parked time (tolerated 1 %)",
    );
    report.put(
        "verdict_partial_threads",
        partial.len() as f64,
        "partial spinners (one wait in ten spun through), every wait length and round",
    );
    report.put(
        "verdict_partial_fails",
        partial.iter().filter(|o| !o.pass).count() as f64,
        "of those, the ones that failed; goal >= verdict_partial_threads",
    );
    for (w, (_, _, wname)) in WAITS.iter().enumerate() {
        let fails = all
            .iter()
            .filter(|o| poller(o) && o.wait == w && !o.pass)
            .count();
        report.put(
            &format!("verdict_poller_fails_{wname}"),
            fails as f64,
            "honest pollers (ten sleeps, no spin) that failed, quiet or hog",
        );
    }
}

/// The largest segments of the unspun threads, per wait, quiet and hog.
fn put_honest_segments(report: &mut Report, all: &[Outcome]) {
    for (w, (_, _, wname)) in WAITS.iter().enumerate() {
        for hog in [false, true] {
            let unspun: Vec<&Outcome> = all
                .iter()
                .filter(|o| (honest(o) || poller(o)) && o.wait == w && o.hog == hog)
                .collect();
            if unspun.is_empty() {
                continue;
            }
            let sfx = if hog { "_hog" } else { "" };
            let max = |f: fn(&Outcome) -> u64| {
                unspun.iter().map(|o| f(o)).max().unwrap_or(0) as f64 / 1e3
            };
            report.put(
                &format!("honest_pre_max_us_{wname}{sfx}"),
                max(|o| o.pre_max_ns),
                "largest pre-sleep segment of an honest episode, us",
            );
            report.put(
                &format!("honest_between_max_us_{wname}{sfx}"),
                max(|o| o.between_max_ns),
                "largest between-sleeps total of an honest episode, us",
            );
            report.put(
                &format!("honest_post_max_us_{wname}{sfx}"),
                max(|o| o.post_max_ns),
                "largest post-wake segment of an honest episode, us",
            );
        }
    }
}
