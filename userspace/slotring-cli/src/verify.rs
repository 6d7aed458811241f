//! `slotring verify --pid`: the verdict on a running process's parked
//! threads over a window, from two readings of its pinned maps.
//!
//! The rule is the one `SlotringBpf::verify` applies (`slotring_bpf`'s
//! `verify` module): the programs judge every parked episode by the
//! `episode_rule` map of the instance (its on-CPU time before the first
//! sleep, between sleeps and after the last wake-up, each with its own
//! bound), and a thread fails when more of its episodes in the window were
//! hot than it is allowed, or when its hot episodes spent more of its
//! parked time on a CPU above their bounds than it is allowed
//! ([`VerifyConfig`]). A window that is empty, or
//! across which the probes went away or were reloaded, verifies nothing.

use std::fmt;

use slotring::bpf::abi::{EpisodeRule, HotEpisode};
use slotring::bpf::{
    Owner, ParkedWindow, Reading as ThreadReading, VerifyConfig, WINDOW_HEADER, describe_rule,
    describe_segments, write_failing, write_window_row,
};
use slotring::pinned::{PinnedError, PinnedMaps, ThreadState};

/// The instance a reading came from: its owner and the kernel's id of its
/// accounting map (another id at the same path is another load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceId {
    /// The owner record.
    pub owner: Option<Owner>,
    /// The id of the `thread_acct` map.
    pub acct_map: u32,
}

/// One reading of an instance's threads.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// Every registered thread.
    pub threads: Vec<ThreadState>,
    /// When (CLOCK_MONOTONIC ns).
    pub at_ns: u64,
    /// Which load of the probes.
    pub instance: InstanceId,
}

impl Reading {
    /// Read `maps` now.
    pub fn of(maps: &PinnedMaps) -> Result<Self, PinnedError> {
        let instance = InstanceId {
            owner: maps.owner()?,
            acct_map: maps.map_id("thread_acct")?,
        };
        let threads = maps.threads()?;
        Ok(Self {
            threads,
            at_ns: slotring::pinned::monotonic_ns(),
            instance,
        })
    }
}

/// One thread over the window.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadWindow {
    /// Thread id.
    pub tid: u32,
    /// Its parked figures and verdict.
    pub parked: ParkedWindow,
    /// Its hot episodes that ended in the window (the last few).
    pub hot: Vec<HotEpisode>,
}

/// The verdict over the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing could be judged, and why.
    Unverified(String),
    /// No thread had more hot episodes, or more CPU above the bounds, than it is allowed.
    Pass,
    /// These threads did.
    Fail(Vec<u32>),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Unverified(why) => write!(f, "UNVERIFIED ({why})"),
            Outcome::Pass => f.write_str("PASS"),
            Outcome::Fail(tids) => write!(f, "FAIL (threads {tids:?} used CPU while parked)"),
        }
    }
}

/// Every thread seen at both readings, and the total.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Per thread, in the order of the first reading.
    pub threads: Vec<ThreadWindow>,
    /// Sums over the threads.
    pub total: ParkedWindow,
    /// The rule the programs applied.
    pub rule: EpisodeRule,
    /// The tolerance applied.
    pub cfg: VerifyConfig,
    /// Why the window verifies nothing, if so (empty, probes reloaded).
    pub void: Option<String>,
}

impl Window {
    /// Compare `before` with `after` under `rule` and `cfg`. Threads gone by
    /// the second reading are left out.
    pub fn measure(
        before: &Reading,
        after: &Reading,
        rule: &EpisodeRule,
        cfg: &VerifyConfig,
    ) -> Self {
        let void = if after.at_ns <= before.at_ns {
            Some("the window is empty".to_owned())
        } else if after.instance != before.instance {
            Some(format!(
                "the probes were detached or reloaded during the window (accounting map {} at the start, {} at the end)",
                before.instance.acct_map, after.instance.acct_map
            ))
        } else {
            None
        };
        let mut total = ParkedWindow {
            pass: true,
            ..ParkedWindow::default()
        };
        let mut threads = Vec::new();
        for b in &before.threads {
            let Some(a) = after.threads.iter().find(|a| a.tid == b.tid) else {
                continue;
            };
            let parked = ParkedWindow::between(
                Some(reading_of(b, before.at_ns)),
                reading_of(a, after.at_ns),
                rule,
                cfg,
            );
            total.add(&parked);
            total.pass &= parked.pass;
            threads.push(ThreadWindow {
                tid: b.tid,
                parked,
                hot: a
                    .hot
                    .iter()
                    .filter(|e| e.end_ns > before.at_ns)
                    .copied()
                    .collect(),
            });
        }
        Self {
            threads,
            total,
            rule: *rule,
            cfg: *cfg,
            void,
        }
    }

    /// The verdict.
    pub fn outcome(&self) -> Outcome {
        if let Some(why) = &self.void {
            Outcome::Unverified(why.clone())
        } else if self.total.parks == 0 && self.total.parked_ns == 0 {
            Outcome::Unverified("no thread parked during the window".into())
        } else if self.total.pass {
            Outcome::Pass
        } else {
            Outcome::Fail(
                self.threads
                    .iter()
                    .filter(|t| !t.parked.pass)
                    .map(|t| t.tid)
                    .collect(),
            )
        }
    }
}

fn reading_of(t: &ThreadState, now_ns: u64) -> ThreadReading<'_> {
    ThreadReading {
        lease: &t.lease,
        acct: &t.acct,
        now_ns,
    }
}

/// The rule, a row per thread and the total, the segments, and the hot
/// episodes of each failing thread.
impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "rule: {}", describe_rule(&self.rule, &self.cfg))?;
        writeln!(f, "{WINDOW_HEADER}")?;
        for t in &self.threads {
            write_window_row(f, &t.tid.to_string(), &t.parked)?;
        }
        write_window_row(f, "total", &self.total)?;
        writeln!(f, "segments: {}", describe_segments(&self.total))?;
        for t in &self.threads {
            write_failing(f, t.tid, &t.parked, &t.hot)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotring::bpf::abi::{HOT_POST_WAKE, LeaseSlot, ThreadAcct};
    use slotring::throttle::LeaseState;

    /// A thread that has parked `parks` times for `parked_ns` in all,
    /// `hot` of its episodes hot (its lease not parked now).
    fn thread(tid: u32, parks: u64, parked_ns: u64, hot: u64) -> ThreadState {
        let p = LeaseState::Parked as usize;
        let mut lease = LeaseSlot {
            tid: u64::from(tid),
            ..LeaseSlot::default()
        };
        lease.clk[0].parks = parks;
        lease.clk[0].state_ns[p] = parked_ns;
        let mut acct = ThreadAcct {
            episodes: parks,
            hot_episodes: hot,
            hot_post_wake: hot,
            parked_sleeps: parks,
            ..ThreadAcct::default()
        };
        acct.on_cpu_ns[p] = parks * 10_000;
        let hot = (0..hot.min(4))
            .map(|i| HotEpisode {
                end_ns: 10 + i,
                wait_ns: parked_ns / parks.max(1),
                post_wake_ns: 3_000_000,
                sleeps: 1,
                hot: HOT_POST_WAKE,
                count: 1,
                ..HotEpisode::default()
            })
            .collect();
        ThreadState {
            tid,
            lease,
            acct,
            hot,
        }
    }

    fn reading(threads: Vec<ThreadState>, at_ns: u64, acct_map: u32) -> Reading {
        Reading {
            threads,
            at_ns,
            instance: InstanceId {
                owner: None,
                acct_map,
            },
        }
    }

    #[test]
    fn judges_each_thread_on_its_hot_episodes_in_the_window() {
        let rule = EpisodeRule::default_rule();
        let cfg = VerifyConfig {
            tolerated_hot_episodes: 2,
            tolerated_hot_fraction: 0.05,
            tolerated_excess_fraction: 1.0,
            ..VerifyConfig::default()
        };
        let before = reading(
            vec![thread(1, 0, 0, 0), thread(2, 0, 0, 0), thread(3, 0, 0, 0)],
            5,
            9,
        );
        // Thread 1: 100 parks, 5 hot <= 2 + 5: ok. Thread 2: 10 parks, all
        // hot > 2 + 0: FAIL. Thread 3 exited: left out.
        let after = reading(
            vec![
                thread(1, 100, 2_000_000_000, 5),
                thread(2, 10, 200_000_000, 10),
            ],
            20,
            9,
        );
        let w = Window::measure(&before, &after, &rule, &cfg);
        assert_eq!(w.threads.len(), 2);
        assert!(w.threads[0].parked.pass && !w.threads[1].parked.pass);
        assert_eq!(w.threads[0].parked.tolerated, 7);
        assert_eq!((w.total.parks, w.total.segments.episodes), (110, 110));
        assert_eq!(w.outcome(), Outcome::Fail(vec![2]));
        assert_eq!(
            w.outcome().to_string(),
            "FAIL (threads [2] used CPU while parked)"
        );
        let text = w.to_string();
        assert!(
            text.contains("thread 2: 10 of 10 episodes hot (allowed 2)"),
            "{text}"
        );
        assert!(
            text.contains("post-wake hot: waited 20.000 ms, 1 sleeps"),
            "the failing thread's hot episodes: {text}"
        );
        assert!(!text.contains("thread 1:"), "{text}");
        // The same counts before the window are not the window's.
        let w = Window::measure(&after, &after_later(&after), &rule, &cfg);
        assert_eq!(w.outcome(), Outcome::Pass);
    }

    /// `r` a little later with one more honest park per thread.
    fn after_later(r: &Reading) -> Reading {
        let mut later = r.clone();
        later.at_ns += 10;
        for t in &mut later.threads {
            t.lease.clk[0].parks += 1;
            t.lease.clk[0].state_ns[LeaseState::Parked as usize] += 20_000_000;
            t.acct.episodes += 1;
        }
        later
    }

    #[test]
    fn an_empty_window_or_a_reload_verifies_nothing() {
        let rule = EpisodeRule::default_rule();
        let cfg = VerifyConfig::default();
        let before = reading(vec![thread(1, 0, 0, 0)], 5, 9);
        let after = reading(vec![thread(1, 10, 200_000_000, 10)], 20, 9);
        // The spinner fails over a real window...
        assert_eq!(
            Window::measure(&before, &after, &rule, &cfg).outcome(),
            Outcome::Fail(vec![1])
        );
        // ...but not over an empty one,
        let same_instant = Reading {
            at_ns: 5,
            ..after.clone()
        };
        let o = Window::measure(&before, &same_instant, &rule, &cfg).outcome();
        assert_eq!(o, Outcome::Unverified("the window is empty".into()));
        // nor across a reload of the probes (another accounting map).
        let reloaded = Reading {
            instance: InstanceId {
                owner: None,
                acct_map: 10,
            },
            ..after.clone()
        };
        let o = Window::measure(&before, &reloaded, &rule, &cfg).outcome();
        assert!(
            matches!(&o, Outcome::Unverified(why) if why.contains("reloaded")),
            "{o}"
        );
        // Nothing parked: nothing to judge.
        let idle = Window::measure(
            &before,
            &reading(vec![thread(1, 0, 0, 0)], 20, 9),
            &rule,
            &cfg,
        );
        assert!(matches!(idle.outcome(), Outcome::Unverified(_)));
    }
}
