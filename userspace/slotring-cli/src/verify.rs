//! `slotring verify --pid`: the verdict on a running process's parked
//! threads over a window, from two readings of its pinned lease and
//! accounting maps.
//!
//! The rule is [`VerifyConfig::within`], the same as `SlotringBpf::verify`:
//! parked on-CPU time within a ratio of parked time plus a fixed allowance
//! per park for entering and leaving the wait.

use std::fmt;

use slotring::bpf::{VerifyConfig, parked_blocks};
use slotring::pinned::ThreadState;
use slotring::throttle::LeaseState;

/// One thread over the window (or the total, `tid` 0).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ThreadWindow {
    /// Thread id (0 for the total).
    pub tid: u32,
    /// Parks in the window.
    pub parks: u64,
    /// Voluntary switch-outs while parked in the window (see
    /// [`slotring_bpf::parked_blocks`]).
    pub blocks: u64,
    /// Wall ns parked in the window.
    pub parked_ns: u64,
    /// On-CPU ns while parked.
    pub oncpu_ns: u64,
    /// Run-queue ns while parked.
    pub runq_ns: u64,
    /// Switch events BPF missed.
    pub missed: u64,
    /// Whether the thread is within the rule (the total: every thread is).
    pub pass: bool,
}

impl ThreadWindow {
    /// `oncpu / parked` in percent (0 when nothing was parked).
    pub fn oncpu_pct(&self) -> f64 {
        if self.parked_ns == 0 {
            0.0
        } else {
            self.oncpu_ns as f64 / self.parked_ns as f64 * 100.0
        }
    }
}

/// The verdict over the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing parked during the window: nothing to judge.
    Unverified,
    /// Every thread within the rule.
    Pass,
    /// These threads used CPU while parked.
    Fail(Vec<u32>),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Unverified => f.write_str("UNVERIFIED (no thread parked during the window)"),
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
    pub total: ThreadWindow,
}

impl Window {
    /// Compare `before` (read at `t0`, CLOCK_MONOTONIC ns) with `after`
    /// (read at `t1`) under `rule`. Threads gone by `t1` are left out.
    pub fn measure(
        before: &[ThreadState],
        t0: u64,
        after: &[ThreadState],
        t1: u64,
        rule: &VerifyConfig,
    ) -> Self {
        let p = LeaseState::Parked as usize;
        let mut total = ThreadWindow {
            pass: true,
            ..ThreadWindow::default()
        };
        let mut threads = Vec::new();
        for b in before {
            let Some(a) = after.iter().find(|a| a.tid == b.tid) else {
                continue;
            };
            let parked_ns = a.parked_ns(t1).saturating_sub(b.parked_ns(t0));
            let oncpu_ns = a.acct.on_cpu_ns[p].saturating_sub(b.acct.on_cpu_ns[p]);
            let parks = a.lease.parks.saturating_sub(b.lease.parks);
            let blocks = parked_blocks(&a.acct.switches, &a.acct.preemptions)
                .saturating_sub(parked_blocks(&b.acct.switches, &b.acct.preemptions));
            let w = ThreadWindow {
                tid: b.tid,
                parks,
                blocks,
                parked_ns,
                oncpu_ns,
                runq_ns: a.acct.runq_ns[p].saturating_sub(b.acct.runq_ns[p]),
                missed: (a.acct.missed_switch_in + a.acct.missed_switch_out)
                    .saturating_sub(b.acct.missed_switch_in + b.acct.missed_switch_out),
                pass: rule.within(oncpu_ns, parked_ns, parks, blocks),
            };
            total.parks += w.parks;
            total.blocks += w.blocks;
            total.parked_ns += w.parked_ns;
            total.oncpu_ns += w.oncpu_ns;
            total.runq_ns += w.runq_ns;
            total.missed += w.missed;
            total.pass &= w.pass;
            threads.push(w);
        }
        Self { threads, total }
    }

    /// The verdict. (Every thread within its allowance implies the total
    /// is too, so only threads are judged.)
    pub fn outcome(&self) -> Outcome {
        if self.total.parks == 0 && self.total.parked_ns == 0 {
            Outcome::Unverified
        } else if self.total.pass {
            Outcome::Pass
        } else {
            Outcome::Fail(
                self.threads
                    .iter()
                    .filter(|t| !t.pass)
                    .map(|t| t.tid)
                    .collect(),
            )
        }
    }
}

/// The table: a row per thread and the total.
impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:>8} {:>6} {:>11} {:>11} {:>9} {:>11} {:>6} {:>5}",
            "tid", "parks", "parked_ms", "oncpu_ms", "oncpu%", "runq_ms", "missed", ""
        )?;
        for t in &self.threads {
            writeln!(
                f,
                "{:>8} {:>6} {:>11.3} {:>11.4} {:>8.4}% {:>11.4} {:>6} {:>5}",
                t.tid,
                t.parks,
                t.parked_ns as f64 / 1e6,
                t.oncpu_ns as f64 / 1e6,
                t.oncpu_pct(),
                t.runq_ns as f64 / 1e6,
                t.missed,
                if t.pass { "ok" } else { "FAIL" }
            )?;
        }
        let t = &self.total;
        writeln!(
            f,
            "{:>8} {:>6} {:>11.3} {:>11.4} {:>8.4}% {:>11.4} {:>6}",
            "total",
            t.parks,
            t.parked_ns as f64 / 1e6,
            t.oncpu_ns as f64 / 1e6,
            t.oncpu_pct(),
            t.runq_ns as f64 / 1e6,
            t.missed
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotring::bpf::abi::{LeaseSlot, ThreadAcct};

    /// A thread that has parked `parks` times for `parked_ns` in all,
    /// `oncpu_ns` of it on a CPU (its lease not parked now).
    fn thread(tid: u32, parks: u64, parked_ns: u64, oncpu_ns: u64) -> ThreadState {
        let p = LeaseState::Parked as usize;
        let mut lease = LeaseSlot {
            tid: u64::from(tid),
            parks,
            unparks: parks,
            ..LeaseSlot::default()
        };
        lease.clk[0].state_ns[p] = parked_ns;
        let mut acct = ThreadAcct::default();
        acct.on_cpu_ns[p] = oncpu_ns;
        // Each park went to sleep once.
        acct.switches[p] = parks;
        ThreadState { tid, lease, acct }
    }

    #[test]
    fn parks_that_never_slept_earn_no_allowance() {
        let rule = VerifyConfig::default();
        let p = LeaseState::Parked as usize;
        let before = [thread(1, 0, 0, 0)];
        // 10 parks, 1 s parked, 1.5 ms on CPU: within 1 ms + 10 ms when
        // each park slept...
        let slept = [thread(1, 10, 1_000_000_000, 1_500_000)];
        let w = Window::measure(&before, 0, &slept, 5, &rule);
        assert_eq!((w.threads[0].blocks, w.outcome()), (10, Outcome::Pass));
        // ...but not when every switch-out while parked was a preemption
        // (a spinner): the ratio alone, 1.5 ms > 1 ms.
        let mut spun = slept;
        spun[0].acct.preemptions[p] = 10;
        let w = Window::measure(&before, 0, &spun, 5, &rule);
        assert_eq!(
            (w.threads[0].blocks, w.outcome()),
            (0, Outcome::Fail(vec![1]))
        );
    }

    #[test]
    fn judges_each_thread_on_its_change() {
        // 0.1 % + 1 ms per park (the default allows 5 ms).
        let rule = VerifyConfig {
            per_park_allowance_ns: 1_000_000,
            ..VerifyConfig::default()
        };
        let before = [thread(1, 0, 0, 0), thread(2, 0, 0, 0), thread(3, 0, 0, 0)];
        // Thread 1: 10 parks, 1 s parked, 1.5 ms on CPU <= 1 ms + 10 ms: ok.
        // Thread 2: 1 park, 1 s parked, 2.5 ms on CPU > 1 ms + 1 ms: FAIL.
        // Thread 3 exited: left out.
        let after = [
            thread(1, 10, 1_000_000_000, 1_500_000),
            thread(2, 1, 1_000_000_000, 2_500_000),
        ];
        let w = Window::measure(&before, 0, &after, 5, &rule);
        assert_eq!(w.threads.len(), 2);
        assert!(w.threads[0].pass && !w.threads[1].pass);
        assert_eq!((w.total.parks, w.total.oncpu_ns), (11, 4_000_000));
        assert_eq!(w.outcome(), Outcome::Fail(vec![2]));
        assert_eq!(
            w.outcome().to_string(),
            "FAIL (threads [2] used CPU while parked)"
        );
        let table = w.to_string();
        assert!(
            table.contains(
                "       2      1    1000.000      2.5000   0.2500%      0.0000      0  FAIL"
            ),
            "{table}"
        );
        assert!(
            table
                .lines()
                .last()
                .unwrap()
                .starts_with("   total     11    2000.000"),
            "{table}"
        );

        let idle = Window::measure(&before, 0, &before, 5, &rule);
        assert_eq!(idle.outcome(), Outcome::Unverified);
        let fine = Window::measure(&before[..1], 0, &after[..1], 5, &rule);
        assert_eq!(fine.outcome(), Outcome::Pass);
    }
}
