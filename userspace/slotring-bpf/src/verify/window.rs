//! What a thread did while parked between two readings of its lease slot
//! and accounting ([`ParkedWindow`]), the per-segment figures of its
//! episodes ([`Segments`]), and its verdict under the rule.

use slotring_throttle::LeaseState;

use crate::abi::{EpisodeRule, LeaseSlot, ThreadAcct};
use crate::verify::rule::{EpisodeFigures, VerifyConfig};

const P: usize = LeaseState::Parked as usize;

/// Per-segment figures of a thread's episodes (sums and largest, ns) and
/// its hot counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Segments {
    /// Episodes that ended.
    pub episodes: u64,
    /// Of those, episodes whose figures are an even share of one on-CPU
    /// interval (several ended inside it).
    pub episodes_split: u64,
    /// Real sleeps while parked.
    pub sleeps: u64,
    /// On-CPU before the first sleep, summed.
    pub pre_sleep_ns: u64,
    /// On-CPU between sleeps, summed.
    pub between_sleeps_ns: u64,
    /// On-CPU after the last wake-up, summed.
    pub post_wake_ns: u64,
    /// Largest pre-sleep segment.
    pub pre_sleep_max_ns: u64,
    /// Largest between-sleeps total of one episode.
    pub between_sleeps_max_ns: u64,
    /// Largest post-wake segment.
    pub post_wake_max_ns: u64,
    /// Ended episodes over a bound.
    pub hot_episodes: u64,
    /// Over the pre-sleep bound.
    pub hot_pre_sleep: u64,
    /// Over the between-sleeps bound.
    pub hot_between_sleeps: u64,
    /// Over the post-wake bound.
    pub hot_post_wake: u64,
    /// On-CPU ns of hot episodes above their bounds, summed.
    pub hot_excess_ns: u64,
}

impl Segments {
    /// The figures of `a`.
    pub fn of(a: &ThreadAcct) -> Self {
        Self {
            episodes: a.episodes,
            episodes_split: a.episodes_split,
            sleeps: a.parked_sleeps,
            pre_sleep_ns: a.pre_sleep_ns,
            between_sleeps_ns: a.between_sleeps_ns,
            post_wake_ns: a.post_wake_ns,
            pre_sleep_max_ns: a.pre_sleep_max_ns,
            between_sleeps_max_ns: a.between_sleeps_max_ns,
            post_wake_max_ns: a.post_wake_max_ns,
            hot_episodes: a.hot_episodes,
            hot_pre_sleep: a.hot_pre_sleep,
            hot_between_sleeps: a.hot_between_sleeps,
            hot_post_wake: a.hot_post_wake,
            hot_excess_ns: a.hot_excess_ns,
        }
    }

    /// What happened between `before` and `self` (counts and sums; the
    /// largest values are `self`'s, which may predate `before`).
    pub fn since(&self, before: &Segments) -> Self {
        Self {
            episodes: self.episodes.saturating_sub(before.episodes),
            episodes_split: self.episodes_split.saturating_sub(before.episodes_split),
            sleeps: self.sleeps.saturating_sub(before.sleeps),
            pre_sleep_ns: self.pre_sleep_ns.saturating_sub(before.pre_sleep_ns),
            between_sleeps_ns: self
                .between_sleeps_ns
                .saturating_sub(before.between_sleeps_ns),
            post_wake_ns: self.post_wake_ns.saturating_sub(before.post_wake_ns),
            pre_sleep_max_ns: self.pre_sleep_max_ns,
            between_sleeps_max_ns: self.between_sleeps_max_ns,
            post_wake_max_ns: self.post_wake_max_ns,
            hot_episodes: self.hot_episodes.saturating_sub(before.hot_episodes),
            hot_pre_sleep: self.hot_pre_sleep.saturating_sub(before.hot_pre_sleep),
            hot_between_sleeps: self
                .hot_between_sleeps
                .saturating_sub(before.hot_between_sleeps),
            hot_post_wake: self.hot_post_wake.saturating_sub(before.hot_post_wake),
            hot_excess_ns: self.hot_excess_ns.saturating_sub(before.hot_excess_ns),
        }
    }

    fn add(&mut self, o: &Segments) {
        self.episodes += o.episodes;
        self.episodes_split += o.episodes_split;
        self.sleeps += o.sleeps;
        self.pre_sleep_ns += o.pre_sleep_ns;
        self.between_sleeps_ns += o.between_sleeps_ns;
        self.post_wake_ns += o.post_wake_ns;
        self.pre_sleep_max_ns = self.pre_sleep_max_ns.max(o.pre_sleep_max_ns);
        self.between_sleeps_max_ns = self.between_sleeps_max_ns.max(o.between_sleeps_max_ns);
        self.post_wake_max_ns = self.post_wake_max_ns.max(o.post_wake_max_ns);
        self.hot_episodes += o.hot_episodes;
        self.hot_pre_sleep += o.hot_pre_sleep;
        self.hot_between_sleeps += o.hot_between_sleeps;
        self.hot_post_wake += o.hot_post_wake;
        self.hot_excess_ns += o.hot_excess_ns;
    }
}

/// The figures so far of the episode open in `a` (`None` when not
/// parked), at `now` on the lease clock of `lease`.
pub fn open_episode(a: &ThreadAcct, lease: &LeaseSlot, now: u64) -> Option<EpisodeFigures> {
    const PRE: u64 = 1; // SLOTRING_EP_PRE_SLEEP
    const SLEPT: u64 = 2; // SLOTRING_EP_SLEPT
    let wait_ns = lease
        .clock()
        .time_in(P, now)
        .saturating_sub(a.ep_parked_base_ns);
    match a.ep_phase {
        PRE => Some(EpisodeFigures {
            pre_sleep_ns: a.ep_seg_ns,
            wait_ns,
            ..EpisodeFigures::default()
        }),
        SLEPT => Some(EpisodeFigures {
            pre_sleep_ns: a.ep_pre_sleep_ns,
            between_sleeps_ns: a.ep_between_ns,
            post_wake_ns: a.ep_seg_ns,
            sleeps: a.ep_sleeps,
            last_sleep_ns: a.ep_last_sleep_ns,
            wait_ns,
        }),
        _ => None,
    }
}

/// One reading of a registered thread: its lease slot and accounting, at
/// `now_ns` (CLOCK_MONOTONIC).
#[derive(Debug, Clone, Copy)]
pub struct Reading<'a> {
    /// The lease slot.
    pub lease: &'a LeaseSlot,
    /// The accounting.
    pub acct: &'a ThreadAcct,
    /// When it was read.
    pub now_ns: u64,
}

/// What a thread did while parked between two readings, and its verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ParkedWindow {
    /// Parks.
    pub parks: u64,
    /// Wall ns parked.
    pub parked_ns: u64,
    /// On-CPU ns while parked.
    pub on_cpu_ns: u64,
    /// Run-queue ns while parked.
    pub runq_ns: u64,
    /// Switch events BPF never saw (time stays exact).
    pub missed_events: u64,
    /// The episodes that ended.
    pub segments: Segments,
    /// The hot bits of the episode open at the second reading (0: none, or
    /// within the rule so far).
    pub open_hot: u64,
    /// That episode's on-CPU ns above its bounds so far.
    pub open_excess_ns: u64,
    /// Hot episodes tolerated ([`VerifyConfig::tolerated`]).
    pub tolerated: u64,
    /// On-CPU ns above the bounds tolerated
    /// ([`VerifyConfig::tolerated_excess_ns`]).
    pub tolerated_excess_ns: u64,
    /// Whether the thread is within the rule: no more hot episodes, and no
    /// more on-CPU time above the bounds, than it is tolerated.
    pub pass: bool,
}

impl ParkedWindow {
    /// The window from `before` (`None`: from registration) to `after`,
    /// judged by `rule` (for the open episode) and `cfg`.
    pub fn between(
        before: Option<Reading<'_>>,
        after: Reading<'_>,
        rule: &EpisodeRule,
        cfg: &VerifyConfig,
    ) -> Self {
        let zero_lease = LeaseSlot::default();
        let zero_acct = ThreadAcct::default();
        let b = before.unwrap_or(Reading {
            lease: &zero_lease,
            acct: &zero_acct,
            now_ns: 0,
        });
        let (a, l) = (after.acct, after.lease);
        let segments = Segments::of(a).since(&Segments::of(b.acct));
        let open = open_episode(a, l, after.now_ns);
        let open_hot = open.map_or(0, |f| rule.judge(&f));
        let open_excess_ns = open.map_or(0, |f| rule.excess(&f));
        let tolerated = cfg.tolerated(segments.episodes);
        let parked_ns = l
            .clock()
            .time_in(P, after.now_ns)
            .saturating_sub(b.lease.clock().time_in(P, b.now_ns));
        let mut w = Self {
            parks: l.parks().saturating_sub(b.lease.parks()),
            parked_ns,
            on_cpu_ns: a.on_cpu_ns[P].saturating_sub(b.acct.on_cpu_ns[P]),
            runq_ns: a.runq_ns[P].saturating_sub(b.acct.runq_ns[P]),
            missed_events: (a.missed_switch_in + a.missed_switch_out)
                .saturating_sub(b.acct.missed_switch_in + b.acct.missed_switch_out),
            segments,
            open_hot,
            open_excess_ns,
            tolerated,
            tolerated_excess_ns: cfg.tolerated_excess_ns(parked_ns),
            pass: false,
        };
        w.pass = w.hot_episodes() <= tolerated && w.hot_excess_ns() <= w.tolerated_excess_ns;
        w
    }

    /// Hot episodes: those that ended hot, and the open one if it is.
    pub fn hot_episodes(&self) -> u64 {
        self.segments.hot_episodes + u64::from(self.open_hot != 0)
    }

    /// On-CPU ns above the bounds: of the episodes that ended hot, and of
    /// the open one so far.
    pub fn hot_excess_ns(&self) -> u64 {
        self.segments.hot_excess_ns + self.open_excess_ns
    }

    /// `on_cpu_ns / parked_ns` (0 when never parked): the raw ratio, a
    /// diagnostic beside the verdict.
    pub fn parked_cpu_ratio(&self) -> f64 {
        if self.parked_ns == 0 {
            0.0
        } else {
            self.on_cpu_ns as f64 / self.parked_ns as f64
        }
    }

    /// Sum `o` into `self` (a total; `pass` is left to the caller).
    pub fn add(&mut self, o: &ParkedWindow) {
        self.parks += o.parks;
        self.parked_ns += o.parked_ns;
        self.on_cpu_ns += o.on_cpu_ns;
        self.runq_ns += o.runq_ns;
        self.missed_events += o.missed_events;
        self.segments.add(&o.segments);
        self.open_hot |= o.open_hot;
        self.open_excess_ns += o.open_excess_ns;
        self.tolerated += o.tolerated;
        self.tolerated_excess_ns += o.tolerated_excess_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BpfError;
    use crate::abi::HOT_PRE_SLEEP;

    #[test]
    fn a_thread_fails_beyond_its_tolerated_hot_episodes() {
        let c = VerifyConfig {
            tolerated_hot_episodes: 2,
            tolerated_hot_fraction: 0.01,
            tolerated_excess_fraction: 1.0,
            ..VerifyConfig::default()
        };
        assert_eq!(c.tolerated(0), 2);
        assert_eq!(c.tolerated(99), 2);
        assert_eq!(c.tolerated(100), 3);
        assert_eq!(c.tolerated(5_000), 52);
        let rule = EpisodeRule::default_rule();
        let mut a = ThreadAcct {
            episodes: 100,
            hot_episodes: 3,
            ..ThreadAcct::default()
        };
        let lease = LeaseSlot::default();
        let read = |a: &ThreadAcct| {
            ParkedWindow::between(
                None,
                Reading {
                    lease: &lease,
                    acct: a,
                    now_ns: 0,
                },
                &rule,
                &c,
            )
        };
        assert!(read(&a).pass);
        a.hot_episodes = 4;
        assert!(!read(&a).pass);
        // An open episode that is already hot counts too.
        a.hot_episodes = 3;
        a.ep_phase = 1;
        a.ep_seg_ns = 1_000_000;
        let w = read(&a);
        assert_eq!(
            (w.open_hot, w.hot_episodes(), w.pass),
            (HOT_PRE_SLEEP, 4, false)
        );
        assert!(matches!(
            VerifyConfig {
                tolerated_hot_fraction: 1.5,
                ..c
            }
            .check(),
            Err(BpfError::BadThreshold(_))
        ));
        assert!(matches!(
            VerifyConfig {
                tolerated_hot_fraction: -0.1,
                ..c
            }
            .check(),
            Err(BpfError::BadThreshold(_))
        ));
        assert!(matches!(
            EpisodeRule {
                post_wake_ppm: 1_000_001,
                ..rule
            }
            .check(),
            Err(BpfError::BadRule {
                field: "post_wake_ppm",
                ..
            })
        ));
    }

    #[test]
    fn a_window_counts_what_happened_inside_it() {
        let rule = EpisodeRule::default_rule();
        let cfg = VerifyConfig::default();
        let l0 = LeaseSlot::default();
        let mut l1 = LeaseSlot::default();
        l1.clk[0].parks = 10;
        l1.clk[0].state_ns[P] = 200_000_000;
        let a0 = ThreadAcct {
            episodes: 5,
            hot_episodes: 5,
            ..ThreadAcct::default()
        };
        let a1 = ThreadAcct {
            episodes: 15,
            hot_episodes: 5,
            ..ThreadAcct::default()
        };
        let w = ParkedWindow::between(
            Some(Reading {
                lease: &l0,
                acct: &a0,
                now_ns: 0,
            }),
            Reading {
                lease: &l1,
                acct: &a1,
                now_ns: 1,
            },
            &rule,
            &cfg,
        );
        // The five hot episodes were before the window.
        assert_eq!(
            (w.segments.episodes, w.hot_episodes(), w.pass),
            (10, 0, true)
        );
        assert_eq!((w.parks, w.parked_ns), (10, 200_000_000));
    }

    /// The window from registration to `a`, read at time 0.
    fn read_whole(
        lease: &LeaseSlot,
        a: &ThreadAcct,
        rule: &EpisodeRule,
        cfg: &VerifyConfig,
    ) -> ParkedWindow {
        ParkedWindow::between(
            None,
            Reading {
                lease,
                acct: a,
                now_ns: 0,
            },
            rule,
            cfg,
        )
    }

    #[test]
    fn a_thread_that_parks_a_few_times_has_the_excess_floor() {
        let rule = EpisodeRule::default_rule();
        let cfg = VerifyConfig::default();
        let us = 1_000;
        // One park of 7.6 ms whose pre-sleep segment was an outlier of
        // 157 µs: 107 µs over its bound, more than 1 % of 7.6 ms (76 µs).
        let mut lease = LeaseSlot::default();
        lease.clk[0].parks = 1;
        lease.clk[0].state_ns[P] = 7_600 * us;
        let mut a = ThreadAcct {
            episodes: 1,
            hot_episodes: 1,
            hot_pre_sleep: 1,
            hot_excess_ns: 107 * us,
            ..ThreadAcct::default()
        };
        let read = |a: &ThreadAcct| read_whole(&lease, a, &rule, &cfg);
        let w = read(&a);
        assert_eq!(w.tolerated_excess_ns, 1_000 * us, "the floor, not 76 µs");
        assert!(w.pass, "{w:?}");
        // Spun through (7.5 ms over the bound): over the floor.
        a.hot_excess_ns = 7_500 * us;
        assert!(!read(&a).pass);
        // The floor is the least: 1 % of a long parked time is more.
        assert_eq!(cfg.tolerated_excess_ns(1_000_000 * us), 10_000 * us);
    }

    #[test]
    fn a_thread_that_spins_through_some_of_its_waits_fails_on_its_excess() {
        let rule = EpisodeRule::default_rule();
        let cfg = VerifyConfig::default();
        let ms = 1_000_000;
        // 100 waits of 20 ms (2 s parked); 8 of them spun through whole:
        // within the count's tolerance (2 + 10 of 100), not the excess's.
        let mut lease = LeaseSlot::default();
        lease.clk[0].parks = 100;
        lease.clk[0].state_ns[P] = 2_000 * ms;
        let spun = 8 * (20 * ms - rule.pre_sleep_ns);
        let mut a = ThreadAcct {
            episodes: 100,
            hot_episodes: 8,
            hot_pre_sleep: 8,
            hot_excess_ns: spun,
            ..ThreadAcct::default()
        };
        let read = |a: &ThreadAcct| read_whole(&lease, a, &rule, &cfg);
        let w = read(&a);
        assert!(
            w.hot_episodes() <= w.tolerated,
            "the count alone lets it pass"
        );
        assert_eq!(w.tolerated_excess_ns, 20 * ms);
        assert!(!w.pass, "{w:?}");
        // The same hot episodes, each a few microseconds over a bound (an
        // honest thread's outliers): within both.
        a.hot_excess_ns = 8 * 5_000;
        assert!(read(&a).pass);
        // One episode at the tolerance exactly passes, a nanosecond more fails.
        a.hot_excess_ns = 20 * ms;
        assert!(read(&a).pass);
        a.hot_excess_ns += 1;
        assert!(!read(&a).pass);
        // The open episode's excess counts too.
        a.hot_excess_ns = 0;
        a.ep_phase = 1;
        a.ep_seg_ns = 20 * ms + rule.pre_sleep_ns + 1;
        let w = read(&a);
        assert_eq!(w.open_excess_ns, 20 * ms + 1);
        assert!(!w.pass);
        // A tolerance outside [0, 1] is refused.
        assert!(matches!(
            VerifyConfig {
                tolerated_excess_fraction: 1.01,
                ..cfg
            }
            .check(),
            Err(BpfError::BadThreshold(_))
        ));
    }
}
