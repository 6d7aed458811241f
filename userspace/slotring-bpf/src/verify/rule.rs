//! The rule: the bounds of an episode's segments ([`EpisodeRule`], which
//! the programs apply at each episode's end and [`EpisodeRule::judge`]
//! restates for an episode still open) and what a thread may have beyond
//! them ([`VerifyConfig`]). The model and the measurements behind every
//! constant are in the docs of the `verify` module.

use std::time::Duration;

use crate::BpfError;
use crate::abi::{EpisodeRule, HOT_BETWEEN_SLEEPS, HOT_POST_WAKE, HOT_PRE_SLEEP, HotEpisode};

/// Bound on an episode's on-CPU time from the park to its first real sleep
/// (see the module docs for the measurements behind every constant).
pub const PRE_SLEEP_BOUND: Duration = Duration::from_micros(50);
/// Bound on an episode's on-CPU time between its sleeps, as a fraction of
/// its wait.
pub const BETWEEN_SLEEPS_FRACTION: f64 = 0.02;
/// Base bound on an episode's on-CPU time from its last wake-up to the
/// unpark.
pub const POST_WAKE_BOUND: Duration = Duration::from_micros(45);
/// Plus this fraction of the sleep before the post-wake segment.
pub const POST_WAKE_FRACTION: f64 = 0.015;
/// Hot episodes a thread may have whatever its number of episodes.
pub const TOLERATED_HOT_EPISODES: u64 = 2;
/// Plus this fraction of its episodes.
pub const TOLERATED_HOT_FRACTION: f64 = 0.1;
/// The on-CPU time its hot episodes may spend above their bounds, as a
/// fraction of its parked time.
pub const TOLERATED_EXCESS_FRACTION: f64 = 0.01;
/// ... and at least this much, whatever its parked time: the excess of the
/// outliers the count tolerates in a thread that parks only a few times.
pub const TOLERATED_EXCESS_FLOOR: Duration = Duration::from_millis(1);

const PPM: f64 = 1e6;

fn ppm(fraction: f64) -> u64 {
    (fraction * PPM).round() as u64
}

fn ppm_of(v: u64, ppm: u64) -> u64 {
    // As the programs compute it (`ppm_of` in slotring.bpf.c).
    (v / 1000).saturating_mul(ppm) / 1000
}

/// One episode's figures (ns), as the rule sees them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpisodeFigures {
    /// On-CPU before the first real sleep.
    pub pre_sleep_ns: u64,
    /// On-CPU between sleeps.
    pub between_sleeps_ns: u64,
    /// On-CPU after the last wake-up.
    pub post_wake_ns: u64,
    /// Real sleeps.
    pub sleeps: u64,
    /// The sleep before the post-wake segment.
    pub last_sleep_ns: u64,
    /// Wall time parked.
    pub wait_ns: u64,
}

impl From<&HotEpisode> for EpisodeFigures {
    fn from(e: &HotEpisode) -> Self {
        Self {
            pre_sleep_ns: e.pre_sleep_ns,
            between_sleeps_ns: e.between_sleeps_ns,
            post_wake_ns: e.post_wake_ns,
            sleeps: e.sleeps,
            last_sleep_ns: e.last_sleep_ns,
            wait_ns: e.wait_ns,
        }
    }
}

impl EpisodeRule {
    /// The rule of the module docs, from [`PRE_SLEEP_BOUND`],
    /// [`BETWEEN_SLEEPS_FRACTION`], [`POST_WAKE_BOUND`] and
    /// [`POST_WAKE_FRACTION`].
    pub fn default_rule() -> Self {
        Self {
            pre_sleep_ns: PRE_SLEEP_BOUND.as_nanos() as u64,
            between_ppm: ppm(BETWEEN_SLEEPS_FRACTION),
            post_wake_ns: POST_WAKE_BOUND.as_nanos() as u64,
            post_wake_ppm: ppm(POST_WAKE_FRACTION),
        }
    }

    /// `Ok` when both fractions are at most 100 %.
    pub fn check(&self) -> Result<(), BpfError> {
        for (name, v) in [
            ("between_ppm", self.between_ppm),
            ("post_wake_ppm", self.post_wake_ppm),
        ] {
            if v > PPM as u64 {
                return Err(BpfError::BadRule {
                    field: name,
                    value: v,
                });
            }
        }
        Ok(())
    }

    /// Each segment of `f` with its bit and its bound (`None`: the segment
    /// does not apply: no between-sleeps segment below two sleeps, no
    /// post-wake segment without a sleep), as the programs test it.
    fn segments(&self, f: &EpisodeFigures) -> [(u64, u64, Option<u64>); 3] {
        [
            (HOT_PRE_SLEEP, f.pre_sleep_ns, Some(self.pre_sleep_ns)),
            (
                HOT_BETWEEN_SLEEPS,
                f.between_sleeps_ns,
                (f.sleeps >= 2).then(|| ppm_of(f.wait_ns, self.between_ppm)),
            ),
            (
                HOT_POST_WAKE,
                f.post_wake_ns,
                (f.sleeps > 0).then(|| {
                    self.post_wake_ns
                        .saturating_add(ppm_of(f.last_sleep_ns, self.post_wake_ppm))
                }),
            ),
        ]
    }

    /// The bounds `figures` is over ([`HOT_PRE_SLEEP`] …; 0 when none):
    /// the programs' test, for an episode that is still open.
    pub fn judge(&self, f: &EpisodeFigures) -> u64 {
        self.segments(f)
            .iter()
            .filter(|(_, v, b)| b.is_some_and(|b| *v > b))
            .fold(0, |hot, (bit, _, _)| hot | bit)
    }

    /// The on-CPU ns of `figures` above its bounds, summed over its hot
    /// segments (0 for an episode within the rule): what the programs add
    /// to a thread's `hot_excess_ns`.
    pub fn excess(&self, f: &EpisodeFigures) -> u64 {
        self.segments(f)
            .iter()
            .filter_map(|(_, v, b)| b.map(|b| v.saturating_sub(b)))
            .sum()
    }
}

/// Which segments of an episode were over their bounds, as words.
pub fn hot_names(hot: u64) -> String {
    let names: Vec<&str> = [
        (HOT_PRE_SLEEP, "pre-sleep"),
        (HOT_BETWEEN_SLEEPS, "between-sleeps"),
        (HOT_POST_WAKE, "post-wake"),
    ]
    .iter()
    .filter(|(b, _)| hot & b != 0)
    .map(|(_, n)| *n)
    .collect();
    names.join("+")
}

/// Verification settings: what a thread may have beyond the episode rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VerifyConfig {
    /// Hot episodes tolerated per thread whatever its number of episodes
    /// (default [`TOLERATED_HOT_EPISODES`]).
    pub tolerated_hot_episodes: u64,
    /// Plus this fraction of its episodes, in [0, 1] (default
    /// [`TOLERATED_HOT_FRACTION`]).
    pub tolerated_hot_fraction: f64,
    /// The on-CPU time its hot episodes may spend above their bounds, as a
    /// fraction of its parked time, in [0, 1] (default
    /// [`TOLERATED_EXCESS_FRACTION`]).
    pub tolerated_excess_fraction: f64,
    /// ... and at least this much (default [`TOLERATED_EXCESS_FLOOR`]).
    pub tolerated_excess_floor: Duration,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        Self {
            tolerated_hot_episodes: TOLERATED_HOT_EPISODES,
            tolerated_hot_fraction: TOLERATED_HOT_FRACTION,
            tolerated_excess_fraction: TOLERATED_EXCESS_FRACTION,
            tolerated_excess_floor: TOLERATED_EXCESS_FLOOR,
        }
    }
}

impl VerifyConfig {
    /// `Ok` when both fractions are in [0, 1].
    pub fn check(&self) -> Result<(), BpfError> {
        for r in [self.tolerated_hot_fraction, self.tolerated_excess_fraction] {
            if !(0.0..=1.0).contains(&r) {
                return Err(BpfError::BadThreshold(r));
            }
        }
        Ok(())
    }

    /// Hot episodes tolerated for a thread with `episodes` episodes.
    pub fn tolerated(&self, episodes: u64) -> u64 {
        self.tolerated_hot_episodes
            .saturating_add((self.tolerated_hot_fraction * episodes as f64).floor() as u64)
    }

    /// On-CPU ns above the bounds tolerated for a thread parked
    /// `parked_ns`: the fraction of it, and at least the floor.
    pub fn tolerated_excess_ns(&self, parked_ns: u64) -> u64 {
        let floor = u64::try_from(self.tolerated_excess_floor.as_nanos()).unwrap_or(u64::MAX);
        ((self.tolerated_excess_fraction * parked_ns as f64).floor() as u64).max(floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(
        pre: u64,
        between: u64,
        post: u64,
        sleeps: u64,
        last: u64,
        wait: u64,
    ) -> EpisodeFigures {
        EpisodeFigures {
            pre_sleep_ns: pre,
            between_sleeps_ns: between,
            post_wake_ns: post,
            sleeps,
            last_sleep_ns: last,
            wait_ns: wait,
        }
    }

    /// Round bounds for exact arithmetic: 30 µs before the sleep, 1 % of
    /// the wait between sleeps, 30 µs + 0.5 % of the sleep after the wake.
    fn test_rule() -> EpisodeRule {
        EpisodeRule {
            pre_sleep_ns: 30_000,
            between_ppm: 10_000,
            post_wake_ns: 30_000,
            post_wake_ppm: 5_000,
        }
    }

    #[test]
    fn each_segment_has_its_own_bound_and_none_is_per_park() {
        let r = test_rule();
        let ms = 1_000_000;
        // An honest 20 ms sleep: a few us each side.
        assert_eq!(r.judge(&figures(5_000, 0, 8_000, 1, 20 * ms, 20 * ms)), 0);
        // 1 ms spun before the sleep of a 20 ms wait: the small constant.
        assert_eq!(
            r.judge(&figures(ms, 0, 8_000, 1, 19 * ms, 20 * ms)),
            HOT_PRE_SLEEP
        );
        // The same 1 ms after the wake: over 30 us + 0.5 % of 19 ms.
        assert_eq!(
            r.judge(&figures(5_000, 0, ms, 1, 19 * ms, 20 * ms)),
            HOT_POST_WAKE
        );
        // After a 1 s sleep, 3 ms of faults after the wake are within
        // 30 us + 5 ms; 6 ms are not.
        assert_eq!(
            r.judge(&figures(5_000, 0, 3 * ms, 1, 1000 * ms, 1000 * ms)),
            0
        );
        assert_eq!(
            r.judge(&figures(5_000, 0, 6 * ms, 1, 1000 * ms, 1000 * ms)),
            HOT_POST_WAKE
        );
        // But a long sleep earns nothing before it.
        assert_eq!(
            r.judge(&figures(3 * ms, 0, 0, 1, 1000 * ms, 1000 * ms)),
            HOT_PRE_SLEEP
        );
        // A poller: 1 % of the wait between its sleeps.
        assert_eq!(r.judge(&figures(0, 190_000, 0, 10, 2 * ms, 20 * ms)), 0);
        assert_eq!(
            r.judge(&figures(0, 210_000, 0, 10, 2 * ms, 20 * ms)),
            HOT_BETWEEN_SLEEPS
        );
        // One sleep has no between-sleeps segment; none has no post-wake.
        assert_eq!(r.judge(&figures(0, ms, 0, 1, ms, ms)), 0);
        assert_eq!(r.judge(&figures(0, 0, ms, 0, 0, ms)), 0);
        // A park that never slept and spun: hot however short.
        assert_eq!(r.judge(&figures(31_000, 0, 0, 0, 0, 31_000)), HOT_PRE_SLEEP);
        assert_eq!(
            hot_names(HOT_PRE_SLEEP | HOT_POST_WAKE),
            "pre-sleep+post-wake"
        );
    }

    #[test]
    fn the_excess_is_what_each_hot_segment_spent_above_its_bound() {
        let r = test_rule();
        let ms = 1_000_000;
        assert_eq!(r.excess(&figures(5_000, 0, 8_000, 1, 20 * ms, 20 * ms)), 0);
        // 1 ms before the sleep: 970 us above its 30 us.
        assert_eq!(
            r.excess(&figures(ms, 0, 8_000, 1, 19 * ms, 20 * ms)),
            970_000
        );
        // After the wake, above 30 us + 0.5 % of 19 ms = 125 us.
        assert_eq!(r.excess(&figures(0, 0, ms, 1, 19 * ms, 20 * ms)), 875_000);
        // Between sleeps, above 1 % of 20 ms; and the segments add up.
        assert_eq!(
            r.excess(&figures(40_000, 300_000, 0, 10, 2 * ms, 20 * ms)),
            10_000 + 100_000
        );
        // A segment that does not apply has no excess (one sleep: nothing
        // between sleeps; no sleep: nothing after a wake).
        assert_eq!(r.excess(&figures(0, ms, 0, 1, ms, ms)), 0);
        assert_eq!(r.excess(&figures(0, 0, ms, 0, 0, ms)), 0);
        // Hot exactly where the excess is positive.
        for f in [
            figures(30_001, 0, 0, 0, 0, ms),
            figures(0, 0, 125_001, 1, 19 * ms, 20 * ms),
        ] {
            assert!(r.judge(&f) != 0 && r.excess(&f) == 1);
        }
    }
}
