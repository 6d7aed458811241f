//! The report of a verification: per thread, the total, the histograms
//! and the verdict, and the text every reader of the verdict prints (the
//! library's report, `slotring run`, `slotring verify --pid`).

use std::fmt;

use crate::SlotringBpf;
use crate::abi::{EpisodeRule, Hist, HotEpisode, LEASE_STATES};
use crate::loader::HistKind;
use crate::verify::rule::{VerifyConfig, hot_names};
use crate::verify::window::ParkedWindow;

/// One thread (or the total) in a report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadReport {
    /// Thread id (0 for the total).
    pub tid: u32,
    /// Its parked figures and verdict.
    pub parked: ParkedWindow,
    /// Wake-ups while parked that reached a CPU.
    pub unpark_wakeups: u64,
    /// Sum of their wake-up to switch-in latency, ns.
    pub unpark_lat_ns: u64,
    /// Largest such latency, ns.
    pub unpark_lat_max_ns: u64,
    /// On-CPU ns by lease state (not holding, running, parked).
    pub on_cpu_ns: [u64; LEASE_STATES],
    /// Run-queue ns by lease state.
    pub runq_ns: [u64; LEASE_STATES],
    /// Switch-outs by lease state.
    pub switches: [u64; LEASE_STATES],
    /// Switch-outs while runnable, by lease state.
    pub preemptions: [u64; LEASE_STATES],
    /// Its last hot episodes, oldest first (empty for the total).
    pub hot: Vec<HotEpisode>,
}

impl ThreadReport {
    pub(crate) fn add(&mut self, o: &ThreadReport) {
        self.parked.add(&o.parked);
        self.unpark_wakeups += o.unpark_wakeups;
        self.unpark_lat_ns += o.unpark_lat_ns;
        self.unpark_lat_max_ns = self.unpark_lat_max_ns.max(o.unpark_lat_max_ns);
        for s in 0..LEASE_STATES {
            self.on_cpu_ns[s] += o.on_cpu_ns[s];
            self.runq_ns[s] += o.runq_ns[s];
            self.switches[s] += o.switches[s];
            self.preemptions[s] += o.preemptions[s];
        }
    }
}

/// The outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// No thread had more hot episodes, or more CPU above the bounds, than it is allowed.
    Pass,
    /// These threads burned CPU while parked.
    Fail {
        /// The offending thread ids.
        tids: Vec<u32>,
    },
    /// Nothing could be verified: no kernel probes, or no parked episode.
    Unverified {
        /// Why.
        reason: String,
    },
}

/// The probes' histograms, process-wide.
#[derive(Debug, Clone, PartialEq)]
pub struct Histograms {
    /// On-CPU per parked episode (one sample per episode).
    pub park_cpu: Hist,
    /// Pre-sleep segment per episode.
    pub pre_sleep: Hist,
    /// Between-sleeps total per episode that slept twice or more.
    pub between_sleeps: Hist,
    /// Post-wake segment per episode that slept.
    pub post_wake: Hist,
    /// Run-queue latency at unpark.
    pub unpark_rq: Hist,
}

impl Histograms {
    /// The histograms of `bpf` now.
    pub fn of(bpf: &SlotringBpf) -> Self {
        Self {
            park_cpu: bpf.hist(HistKind::ParkCpu),
            pre_sleep: bpf.hist(HistKind::PreSleep),
            between_sleeps: bpf.hist(HistKind::BetweenSleeps),
            post_wake: bpf.hist(HistKind::PostWake),
            unpark_rq: bpf.hist(HistKind::UnparkRunq),
        }
    }
}

/// A verification report over a set of threads.
#[derive(Debug, Clone, PartialEq)]
pub struct VerificationReport {
    /// Per thread.
    pub threads: Vec<ThreadReport>,
    /// Sums (max for the latency maximum); `tid` 0.
    pub total: ThreadReport,
    /// The per-episode rule the programs applied.
    pub rule: EpisodeRule,
    /// The thread-level tolerance used.
    pub config: VerifyConfig,
    /// The probes' histograms.
    pub hists: Histograms,
    /// The verdict.
    pub verdict: Verdict,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// The rule and the tolerance, in one line.
pub fn describe_rule(rule: &EpisodeRule, cfg: &VerifyConfig) -> String {
    format!(
        "an episode is hot when on CPU > {:.0} us before its first sleep, > {:.2}% of its wait \
         between sleeps, or > {:.0} us + {:.2}% of the sleep before it after the wake; a thread \
         fails with more than {} + {:.2}% of its episodes hot, or more than {:.2}% of its parked \
         time (at least {:.0} us) on CPU above those bounds",
        us(rule.pre_sleep_ns),
        rule.between_ppm as f64 / 1e4,
        us(rule.post_wake_ns),
        rule.post_wake_ppm as f64 / 1e4,
        cfg.tolerated_hot_episodes,
        cfg.tolerated_hot_fraction * 100.0,
        cfg.tolerated_excess_fraction * 100.0,
        cfg.tolerated_excess_floor.as_secs_f64() * 1e6
    )
}

/// The header of [`write_window_row`]'s table.
pub const WINDOW_HEADER: &str = "     tid  parks   parked_ms   oncpu_ms    oncpu%   runq_ms  episodes  pre_max_us betw_max_us post_max_us   hot  allowed  above_ms missed";

/// One row of the per-thread table shared by every report.
pub fn write_window_row(f: &mut impl fmt::Write, name: &str, t: &ParkedWindow) -> fmt::Result {
    writeln!(
        f,
        "{name:>8} {:>6} {:>11.3} {:>10.4} {:>8.4}% {:>9.4} {:>9} {:>11.1} {:>11.1} {:>11.1} {:>5} {:>8} {:>9.3} {:>6} {}",
        t.parks,
        ms(t.parked_ns),
        ms(t.on_cpu_ns),
        t.parked_cpu_ratio() * 100.0,
        ms(t.runq_ns),
        t.segments.episodes,
        us(t.segments.pre_sleep_max_ns),
        us(t.segments.between_sleeps_max_ns),
        us(t.segments.post_wake_max_ns),
        t.hot_episodes(),
        t.tolerated,
        ms(t.hot_excess_ns()),
        t.missed_events,
        if t.pass { "ok" } else { "FAIL" },
    )
}

/// Per-segment totals of a window, in one line.
pub fn describe_segments(t: &ParkedWindow) -> String {
    let s = &t.segments;
    let per = |ns: u64, n: u64| if n == 0 { 0.0 } else { us(ns) / n as f64 };
    format!(
        "{} episodes ({} split), {} sleeps; on CPU per episode: pre-sleep {:.1} us, between sleeps {:.1} us, post-wake {:.1} us (largest {:.1} / {:.1} / {:.1} us); hot: {} pre-sleep, {} between-sleeps, {} post-wake",
        s.episodes,
        s.episodes_split,
        s.sleeps,
        per(s.pre_sleep_ns, s.episodes),
        per(s.between_sleeps_ns, s.episodes),
        per(s.post_wake_ns, s.episodes),
        us(s.pre_sleep_max_ns),
        us(s.between_sleeps_max_ns),
        us(s.post_wake_max_ns),
        s.hot_pre_sleep,
        s.hot_between_sleeps,
        s.hot_post_wake,
    )
}

/// One hot episode, in one line.
pub fn describe_hot(e: &HotEpisode) -> String {
    format!(
        "{} hot: waited {:.3} ms, {} sleeps (last {:.3} ms); on CPU {:.1} us before the sleep, {:.1} us between sleeps, {:.1} us after the wake{}",
        hot_names(e.hot),
        ms(e.wait_ns),
        e.sleeps,
        ms(e.last_sleep_ns),
        us(e.pre_sleep_ns),
        us(e.between_sleeps_ns),
        us(e.post_wake_ns),
        if e.count > 1 {
            format!(
                " (each of {} episodes split from one on-CPU interval)",
                e.count
            )
        } else {
            String::new()
        }
    )
}

/// When the thread `tid` failed: its hot count, segments and its last hot
/// episodes `hot`, a line each (nothing for a thread that passed).
pub fn write_failing(
    f: &mut impl fmt::Write,
    tid: u32,
    t: &ParkedWindow,
    hot: &[HotEpisode],
) -> fmt::Result {
    if t.pass {
        return Ok(());
    }
    writeln!(
        f,
        "thread {tid}: {} of {} episodes hot (allowed {}), {:.3} ms on CPU above the bounds \
         (allowed {:.3} ms of {:.1} ms parked); {}",
        t.hot_episodes(),
        t.segments.episodes,
        t.tolerated,
        ms(t.hot_excess_ns()),
        ms(t.tolerated_excess_ns),
        ms(t.parked_ns),
        describe_segments(t)
    )?;
    for e in hot {
        writeln!(f, "  {}", describe_hot(e))?;
    }
    Ok(())
}

fn write_hist(f: &mut fmt::Formatter<'_>, title: &str, h: &Hist) -> fmt::Result {
    writeln!(f, "{title} (ns): {} samples", h.total())?;
    for (lo, hi, c) in h.buckets() {
        writeln!(f, "  [{lo:>10}, {hi:>10}) {c}")?;
    }
    Ok(())
}

impl fmt::Display for VerificationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "slotring parked-lease verification ({})",
            describe_rule(&self.rule, &self.config)
        )?;
        writeln!(f, "{WINDOW_HEADER}")?;
        for t in &self.threads {
            write_window_row(f, &t.tid.to_string(), &t.parked)?;
        }
        write_window_row(f, "total", &self.total.parked)?;
        writeln!(f, "segments: {}", describe_segments(&self.total.parked))?;
        let avg = self
            .total
            .unpark_lat_ns
            .checked_div(self.total.unpark_wakeups)
            .unwrap_or(0);
        writeln!(
            f,
            "wake-up at unpark: {} wake-ups, mean {:.1} us, max {:.1} us",
            self.total.unpark_wakeups,
            us(avg),
            us(self.total.unpark_lat_max_ns)
        )?;
        for t in &self.threads {
            write_failing(f, t.tid, &t.parked, &t.hot)?;
        }
        write_hist(f, "on-CPU per parked episode", &self.hists.park_cpu)?;
        write_hist(f, "pre-sleep segment per episode", &self.hists.pre_sleep)?;
        write_hist(
            f,
            "between-sleeps total per episode",
            &self.hists.between_sleeps,
        )?;
        write_hist(f, "post-wake segment per episode", &self.hists.post_wake)?;
        write_hist(f, "run-queue latency at unpark", &self.hists.unpark_rq)?;
        match &self.verdict {
            Verdict::Pass => writeln!(f, "verdict: PASS"),
            Verdict::Fail { tids } => {
                writeln!(f, "verdict: FAIL (threads {tids:?} used CPU while parked)")
            }
            Verdict::Unverified { reason } => writeln!(f, "verdict: UNVERIFIED ({reason})"),
        }
    }
}
