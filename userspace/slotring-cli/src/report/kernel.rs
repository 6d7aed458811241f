//! The kernel verdict's section of the report: the rule, where parked
//! CPU went by segment, and the failing threads with their hot episodes.

use std::fmt;

use serde::Serialize;
use slotring::bpf::{
    AttachMode, EpisodeRule, HotEpisode, ParkedWindow, ThreadReport, VerifyConfig, hot_names,
};

use super::*;

/// The kernel's verdict on parked threads.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KernelReport {
    /// Whether the eBPF probes were attached.
    pub attached: bool,
    /// `tp_btf` or `raw_tp` when attached.
    #[serde(serialize_with = "ser_attach_mode")]
    pub attach_mode: Option<AttachMode>,
    /// Why not, when not attached.
    pub reason: Option<String>,
    /// `pass`, `fail` or `unverified`.
    pub verdict: KernelVerdict,
    /// The rule the verdict applied.
    pub rule: RuleReport,
    /// Threads verified.
    pub threads: u64,
    /// Threads over the rule.
    pub failing_tids: Vec<u32>,
    /// Details of (up to 8 of) the threads over the rule.
    pub failing: Vec<FailingThread>,
    /// Lease parks seen by the kernel mirror.
    pub parks: u64,
    /// Wall time parked, seconds (sum over threads).
    pub parked_s: f64,
    /// On-CPU while parked, seconds.
    pub parked_oncpu_s: f64,
    /// `parked_oncpu / parked × 100`: the raw ratio, a diagnostic beside
    /// the verdict (no part of the rule).
    pub parked_oncpu_pct: f64,
    /// Run-queue while parked, seconds.
    pub parked_runq_s: f64,
    /// Mean wake-up latency at unpark, µs.
    pub unpark_wake_avg_us: f64,
    /// Largest wake-up latency at unpark, µs.
    pub unpark_wake_max_us: f64,
    /// Switch events BPF missed (time stays exact).
    pub missed_events: u64,
    /// On-CPU µs while parked, per park.
    pub parked_oncpu_us_per_park: f64,
    /// Where the parked on-CPU time went, over every thread.
    pub segments: SegmentReport,
}

/// The per-episode rule and the per-thread tolerance, with the names of
/// the constants they come from (`slotring_bpf`'s `verify/rule.rs`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct RuleReport {
    /// Bound on the on-CPU time before an episode's first sleep, µs
    /// (`PRE_SLEEP_BOUND`).
    pub pre_sleep_us: f64,
    /// Bound on the on-CPU time between its sleeps, % of its wait
    /// (`BETWEEN_SLEEPS_FRACTION`).
    pub between_sleeps_pct_of_wait: f64,
    /// Base bound on the on-CPU time after its last wake-up, µs
    /// (`POST_WAKE_BOUND`).
    pub post_wake_us: f64,
    /// Plus this % of the sleep before it (`POST_WAKE_FRACTION`).
    pub post_wake_pct_of_sleep: f64,
    /// Hot episodes a thread may have (`TOLERATED_HOT_EPISODES`).
    pub tolerated_hot_episodes: u64,
    /// Plus this % of its episodes (`TOLERATED_HOT_FRACTION`).
    pub tolerated_hot_pct: f64,
    /// On-CPU time above the bounds a thread may spend, % of its parked
    /// time (`TOLERATED_EXCESS_FRACTION`).
    pub tolerated_excess_pct: f64,
    /// ... and at least this many µs (`TOLERATED_EXCESS_FLOOR`).
    pub tolerated_excess_floor_us: f64,
}

impl RuleReport {
    /// The rule the programs apply and the tolerance of `cfg`.
    pub fn new(rule: &EpisodeRule, cfg: &VerifyConfig) -> Self {
        Self {
            pre_sleep_us: rule.pre_sleep_ns as f64 / 1e3,
            between_sleeps_pct_of_wait: rule.between_ppm as f64 / 1e4,
            post_wake_us: rule.post_wake_ns as f64 / 1e3,
            post_wake_pct_of_sleep: rule.post_wake_ppm as f64 / 1e4,
            tolerated_hot_episodes: cfg.tolerated_hot_episodes,
            tolerated_hot_pct: cfg.tolerated_hot_fraction * 100.0,
            tolerated_excess_pct: cfg.tolerated_excess_fraction * 100.0,
            tolerated_excess_floor_us: cfg.tolerated_excess_floor.as_secs_f64() * 1e6,
        }
    }
}

impl fmt::Display for RuleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "an episode is hot when on CPU > {:.0} us before its first sleep (PRE_SLEEP_BOUND), > {:.2}% of its wait between sleeps (BETWEEN_SLEEPS_FRACTION), or > {:.0} us (POST_WAKE_BOUND) + {:.2}% of the sleep before it (POST_WAKE_FRACTION) after the wake; a thread fails with more than {} (TOLERATED_HOT_EPISODES) + {:.2}% (TOLERATED_HOT_FRACTION) of its episodes hot, or more than {:.2}% (TOLERATED_EXCESS_FRACTION) of its parked time, at least {:.0} us (TOLERATED_EXCESS_FLOOR), on CPU above those bounds",
            self.pre_sleep_us,
            self.between_sleeps_pct_of_wait,
            self.post_wake_us,
            self.post_wake_pct_of_sleep,
            self.tolerated_hot_episodes,
            self.tolerated_hot_pct,
            self.tolerated_excess_pct,
            self.tolerated_excess_floor_us
        )
    }
}

/// Where parked on-CPU time went: per segment of the parked episodes.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct SegmentReport {
    /// Episodes that ended (one per park).
    pub episodes: u64,
    /// Episodes whose figures are an even share of one on-CPU interval.
    pub episodes_split: u64,
    /// Real sleeps while parked.
    pub sleeps: u64,
    /// Hot episodes (ended hot, or open and hot so far).
    pub hot_episodes: u64,
    /// Mean on-CPU before the first sleep, µs per episode.
    pub pre_sleep_us_mean: f64,
    /// Mean on-CPU between sleeps, µs per episode.
    pub between_sleeps_us_mean: f64,
    /// Mean on-CPU after the last wake-up, µs per episode.
    pub post_wake_us_mean: f64,
    /// Largest pre-sleep segment, µs.
    pub pre_sleep_max_us: f64,
    /// Largest between-sleeps total of an episode, µs.
    pub between_sleeps_max_us: f64,
    /// Largest post-wake segment, µs.
    pub post_wake_max_us: f64,
    /// Episodes hot before the sleep.
    pub hot_pre_sleep: u64,
    /// Episodes hot between sleeps.
    pub hot_between_sleeps: u64,
    /// Episodes hot after the wake.
    pub hot_post_wake: u64,
    /// On-CPU time of the hot episodes above their bounds, µs.
    pub above_bounds_us: f64,
}

impl From<&ParkedWindow> for SegmentReport {
    fn from(w: &ParkedWindow) -> Self {
        let s = &w.segments;
        let mean = |ns: u64| {
            if s.episodes == 0 {
                0.0
            } else {
                ns as f64 / 1e3 / s.episodes as f64
            }
        };
        Self {
            episodes: s.episodes,
            episodes_split: s.episodes_split,
            sleeps: s.sleeps,
            hot_episodes: w.hot_episodes(),
            pre_sleep_us_mean: mean(s.pre_sleep_ns),
            between_sleeps_us_mean: mean(s.between_sleeps_ns),
            post_wake_us_mean: mean(s.post_wake_ns),
            pre_sleep_max_us: s.pre_sleep_max_ns as f64 / 1e3,
            between_sleeps_max_us: s.between_sleeps_max_ns as f64 / 1e3,
            post_wake_max_us: s.post_wake_max_ns as f64 / 1e3,
            hot_pre_sleep: s.hot_pre_sleep,
            hot_between_sleeps: s.hot_between_sleeps,
            hot_post_wake: s.hot_post_wake,
            above_bounds_us: w.hot_excess_ns() as f64 / 1e3,
        }
    }
}

impl fmt::Display for SegmentReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} episodes, {} sleeps; on CPU per episode: {:.1} us before the sleep, {:.1} us between sleeps, {:.1} us after the wake (largest {:.1} / {:.1} / {:.1} us); {} hot ({} before the sleep, {} between sleeps, {} after the wake), {:.1} us on CPU above the bounds",
            self.episodes,
            self.sleeps,
            self.pre_sleep_us_mean,
            self.between_sleeps_us_mean,
            self.post_wake_us_mean,
            self.pre_sleep_max_us,
            self.between_sleeps_max_us,
            self.post_wake_max_us,
            self.hot_episodes,
            self.hot_pre_sleep,
            self.hot_between_sleeps,
            self.hot_post_wake,
            self.above_bounds_us
        )
    }
}

/// One hot episode of a failing thread.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HotEpisodeReport {
    /// The segments over their bounds, e.g. `pre-sleep` or
    /// `pre-sleep+post-wake`.
    pub over: String,
    /// Wall time parked, ms.
    pub wait_ms: f64,
    /// Real sleeps.
    pub sleeps: u64,
    /// The sleep before the post-wake segment, ms.
    pub last_sleep_ms: f64,
    /// On-CPU before the first sleep, µs.
    pub pre_sleep_us: f64,
    /// On-CPU between sleeps, µs.
    pub between_sleeps_us: f64,
    /// On-CPU after the last wake-up, µs.
    pub post_wake_us: f64,
    /// Episodes this entry stands for (> 1: split evenly from one on-CPU
    /// interval).
    pub count: u64,
}

impl From<&HotEpisode> for HotEpisodeReport {
    fn from(e: &HotEpisode) -> Self {
        Self {
            over: hot_names(e.hot),
            wait_ms: e.wait_ns as f64 / 1e6,
            sleeps: e.sleeps,
            last_sleep_ms: e.last_sleep_ns as f64 / 1e6,
            pre_sleep_us: e.pre_sleep_ns as f64 / 1e3,
            between_sleeps_us: e.between_sleeps_ns as f64 / 1e3,
            post_wake_us: e.post_wake_ns as f64 / 1e3,
            count: e.count,
        }
    }
}

/// A thread over the rule: more hot episodes, or more CPU above the bounds, than it is allowed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailingThread {
    /// Thread id.
    pub tid: u32,
    /// Its parks.
    pub parks: u64,
    /// Wall time parked, ms.
    pub parked_ms: f64,
    /// On-CPU while parked, µs.
    pub parked_oncpu_us: f64,
    /// Run-queue while parked, µs.
    pub parked_runq_us: f64,
    /// Hot episodes it was allowed.
    pub tolerated_hot_episodes: u64,
    /// On-CPU time of its hot episodes above their bounds, µs.
    pub above_bounds_us: f64,
    /// What it was allowed of that, µs.
    pub tolerated_above_bounds_us: f64,
    /// Its segments.
    pub segments: SegmentReport,
    /// Its last hot episodes, oldest first.
    pub hot: Vec<HotEpisodeReport>,
}

impl FailingThread {
    /// The report of `t`.
    pub fn new(t: &ThreadReport) -> Self {
        let p = &t.parked;
        Self {
            tid: t.tid,
            parks: p.parks,
            parked_ms: p.parked_ns as f64 / 1e6,
            parked_oncpu_us: p.on_cpu_ns as f64 / 1e3,
            parked_runq_us: p.runq_ns as f64 / 1e3,
            tolerated_hot_episodes: p.tolerated,
            above_bounds_us: p.hot_excess_ns() as f64 / 1e3,
            tolerated_above_bounds_us: p.tolerated_excess_ns as f64 / 1e3,
            segments: SegmentReport::from(p),
            hot: t.hot.iter().map(HotEpisodeReport::from).collect(),
        }
    }
}

impl fmt::Display for HotEpisodeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} hot: waited {:.3} ms, {} sleeps (last {:.3} ms); on CPU {:.1} us before the sleep, {:.1} us between sleeps, {:.1} us after the wake{}",
            self.over,
            self.wait_ms,
            self.sleeps,
            self.last_sleep_ms,
            self.pre_sleep_us,
            self.between_sleeps_us,
            self.post_wake_us,
            if self.count > 1 {
                format!(" (each of {} episodes of one on-CPU interval)", self.count)
            } else {
                String::new()
            }
        )
    }
}
