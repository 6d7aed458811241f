//! The adaptive budget's sensor and loop: the kernel's run-queue accounting
//! of running leases drives [`slotring_slots::BudgetController`].
//!
//! * [`RunqProbe`] sums, over every registered thread, the growth of
//!   `ThreadAcct.runq_ns[Running]` and `ThreadAcct.on_cpu_ns[Running]` since
//!   the previous call: one window of the controller's input. It reads
//!   mmapped map memory (no syscall). It answers `None` once the probes are
//!   gone: an instance that never attached (degraded), or whose owner
//!   dropped it (programs detached, maps unpinned).
//! * [`AdaptiveBudget`] runs the loop on a thread of its own: every window
//!   it samples the probe, feeds the controller (with the control's
//!   `max_concurrency` as ceiling, its waiters as demand, its slots in
//!   use as the running leases, the growth of its `waiting_us` as the
//!   window's slot wait and the window's measured length) and applies the result with
//!   [`ConcurrencyControl::set_effective_budget`]. Without probes the
//!   budget stays static and this is said once on stderr; probes that go
//!   away mid-run return the budget to static (`probe_losses`, said once).
//!
//! The slots crate holds the control law and knows nothing of BPF; this
//! module holds the sampling and knows nothing of the law beyond its API.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use slotring_slots::{
    AdaptiveConfig, AdaptiveCounters, BudgetController, ConcurrencyControl, LeaseState, RunqSample,
    SlotsError, Step, UNLIMITED,
};

use crate::abi::{AbiStruct, ThreadAcct};
use crate::lease::Shared;
use crate::loader::SlotringBpf;

const R: usize = LeaseState::Running as usize;

/// Reads the running leases' run-queue and on-CPU time, window by window.
pub struct RunqProbe {
    shared: &'static Shared,
    attached: bool,
    /// Per thread id: its index and the totals seen last.
    last: HashMap<u32, (u32, u64, u64)>,
}

impl std::fmt::Debug for RunqProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunqProbe")
            .field("attached", &self.attached)
            .field("threads", &self.last.len())
            .finish_non_exhaustive()
    }
}

impl SlotringBpf {
    /// A sensor over this instance's per-thread accounting (see [`RunqProbe`]).
    pub fn runq_probe(&self) -> RunqProbe {
        RunqProbe {
            shared: self.shared,
            attached: self.is_attached(),
            last: HashMap::new(),
        }
    }
}

impl RunqProbe {
    /// Whether the probes were attached when the sensor was made.
    pub fn attached(&self) -> bool {
        self.attached
    }

    /// Run-queue and on-CPU ns of running leases accrued since the previous
    /// call (the first call returns what accrued since each thread
    /// registered). `None` when the probes are not (or no longer) live.
    ///
    /// A thread whose index was reused, or whose accounting went backwards,
    /// is re-baselined and contributes nothing to this window.
    pub fn sample(&mut self) -> Option<(u64, u64)> {
        if !self.attached {
            return None;
        }
        let reg = self.shared.registry();
        if !reg.alive {
            return None;
        }
        let (mut runq, mut on_cpu) = (0u64, 0u64);
        let mut seen = HashMap::with_capacity(reg.by_tid.len());
        for (&tid, e) in &reg.by_tid {
            let a = ThreadAcct::from_words(&self.shared.acct.load(e.idx as usize));
            if a.tid != u64::from(tid) {
                continue;
            }
            let (rq, oc) = (a.runq_ns[R], a.on_cpu_ns[R]);
            if let Some(&(idx, lrq, loc)) = self.last.get(&tid)
                && idx == e.idx
                && rq >= lrq
                && oc >= loc
            {
                runq += rq - lrq;
                on_cpu += oc - loc;
            } else if !self.last.contains_key(&tid) {
                runq += rq;
                on_cpu += oc;
            }
            seen.insert(tid, (e.idx, rq, oc));
        }
        drop(reg);
        self.last = seen;
        Some((runq, on_cpu))
    }
}

/// One window of the loop, for reports and plots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetPoint {
    /// Seconds since the loop started (end of the window).
    pub t_s: f64,
    /// The effective budget after the window.
    pub budget: u64,
    /// The run-queue share of running leases in the window, percent.
    pub runq_share_pct: f64,
    /// Slots in use at the end of the window.
    pub running: u64,
    /// Blocked `acquire` calls on average over the window (its slot wait
    /// over its length).
    pub blocked_mean: f64,
}

#[derive(Debug, Default)]
struct Status {
    adaptive: AtomicU64,
    budget: AtomicU64,
    share_bp: AtomicU64,
    runq_ns: AtomicU64,
    on_cpu_ns: AtomicU64,
    slot_wait_ns: AtomicU64,
    windows: AtomicU64,
    downs: AtomicU64,
    ups: AtomicU64,
    probe_losses: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    status: Status,
    history: Mutex<Vec<BudgetPoint>>,
    stop: Mutex<bool>,
    cv: Condvar,
}

/// The adaptive budget loop (see the module docs). Stops (and leaves the
/// last budget in place) when dropped or [`AdaptiveBudget::stop`]ped.
#[derive(Debug)]
pub struct AdaptiveBudget {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

static STATIC_ONCE: Once = Once::new();
static LOST_ONCE: Once = Once::new();

impl AdaptiveBudget {
    /// Start the loop on `cc` with the sensor `probe`, one decision every
    /// `window`. The controller's ceiling is `cc.max_concurrency()` (the
    /// `ceiling` of `cfg` is replaced by it); a bad `cfg` is a typed error.
    /// With a sensor that is not attached the budget stays static: no
    /// thread is started and that is said once on stderr.
    pub fn start(
        cc: ConcurrencyControl,
        mut probe: RunqProbe,
        cfg: AdaptiveConfig,
        window: Duration,
    ) -> Result<Self, SlotsError> {
        let ceiling = cc.max_concurrency();
        let mut ctl = BudgetController::new(AdaptiveConfig { ceiling, ..cfg })?;
        let inner = Arc::new(Inner::default());
        inner.status.budget.store(ceiling, Ordering::Relaxed);
        if !probe.attached() {
            STATIC_ONCE.call_once(|| {
                eprintln!(
                    "slotring: the CPU slot budget stays static ({ceiling}): no kernel probes to measure run-queue delay"
                );
            });
            return Ok(Self {
                inner,
                thread: None,
            });
        }
        inner.status.adaptive.store(1, Ordering::Relaxed);
        // Baseline: the first window starts now.
        let _ = probe.sample();
        let mut last = (Instant::now(), cc.counters().waiting_us);
        let th = inner.clone();
        let thread = std::thread::Builder::new()
            .name("slotring-budget".into())
            .spawn(move || {
                let start = Instant::now();
                loop {
                    {
                        let stop = th.stop.lock().unwrap_or_else(|e| e.into_inner());
                        let (stop, _) = th
                            .cv
                            .wait_timeout_while(stop, window, |s| !*s)
                            .unwrap_or_else(|e| e.into_inner());
                        if *stop {
                            return;
                        }
                    }
                    let s = &th.status;
                    let Some((runq_ns, on_cpu_ns)) = probe.sample() else {
                        // The probes went away: back to the static budget.
                        cc.set_effective_budget(UNLIMITED);
                        s.adaptive.store(0, Ordering::Relaxed);
                        s.budget.store(cc.max_concurrency(), Ordering::Relaxed);
                        s.probe_losses.fetch_add(1, Ordering::Relaxed);
                        LOST_ONCE.call_once(|| {
                            eprintln!(
                                "slotring: kernel probes went away: the CPU slot budget is static again ({})",
                                cc.max_concurrency()
                            );
                        });
                        return;
                    };
                    let c = cc.counters();
                    let now = Instant::now();
                    let window_ns = u64::try_from(now.duration_since(last.0).as_nanos())
                        .unwrap_or(u64::MAX);
                    let wait_ns = c.waiting_us.saturating_sub(last.1).saturating_mul(1000);
                    last = (now, c.waiting_us);
                    ctl.set_ceiling(c.max_concurrency);
                    let sample = RunqSample {
                        runq_ns,
                        on_cpu_ns,
                        running: c.cur_concurrency,
                        waiting: c.waiters > 0,
                        wait_ns,
                        window_ns,
                    };
                    let step = ctl.update(sample);
                    let budget = ctl.budget();
                    cc.set_effective_budget(budget);
                    s.budget.store(budget, Ordering::Relaxed);
                    let share = sample.share();
                    s.share_bp
                        .store((share * 10_000.0).round() as u64, Ordering::Relaxed);
                    s.runq_ns.fetch_add(runq_ns, Ordering::Relaxed);
                    s.on_cpu_ns.fetch_add(on_cpu_ns, Ordering::Relaxed);
                    s.slot_wait_ns.fetch_add(wait_ns, Ordering::Relaxed);
                    s.windows.fetch_add(1, Ordering::Relaxed);
                    match step {
                        Step::Down => s.downs.fetch_add(1, Ordering::Relaxed),
                        Step::Up => s.ups.fetch_add(1, Ordering::Relaxed),
                        Step::Hold => 0,
                    };
                    th.history
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(BudgetPoint {
                            t_s: start.elapsed().as_secs_f64(),
                            budget,
                            runq_share_pct: share * 100.0,
                            running: c.cur_concurrency,
                            blocked_mean: wait_ns as f64 / window_ns.max(1) as f64,
                        });
                }
            })
            .expect("spawning the budget thread");
        Ok(Self {
            inner,
            thread: Some(thread),
        })
    }

    /// The loop's live state.
    pub fn status(&self) -> AdaptiveCounters {
        let s = &self.inner.status;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        AdaptiveCounters {
            adaptive: l(&s.adaptive),
            budget: l(&s.budget),
            runq_share_bp: l(&s.share_bp),
            runq_us: l(&s.runq_ns) / 1000,
            on_cpu_us: l(&s.on_cpu_ns) / 1000,
            slot_wait_us: l(&s.slot_wait_ns) / 1000,
            windows: l(&s.windows),
            downs: l(&s.downs),
            ups: l(&s.ups),
            probe_losses: l(&s.probe_losses),
        }
    }

    /// Every window so far.
    pub fn history(&self) -> Vec<BudgetPoint> {
        self.inner
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stop the loop (the budget keeps its last value) and wait for it.
    pub fn stop(&mut self) {
        *self.inner.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.inner.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AdaptiveBudget {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_probes_the_budget_stays_static() {
        let bpf = SlotringBpf::degraded(crate::error::tests::no_btf("unit test"));
        let probe = bpf.runq_probe();
        assert!(!probe.attached());
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(4);
        let mut ab = AdaptiveBudget::start(
            cc.clone(),
            probe,
            AdaptiveConfig::with_ceiling(4),
            Duration::from_millis(1),
        )
        .unwrap();
        assert!(ab.thread.is_none(), "no loop without probes");
        let s = ab.status();
        assert_eq!(s.adaptive, 0);
        assert_eq!((s.budget, s.windows), (4, 0));
        assert_eq!(cc.effective_budget(), 4);
        ab.stop();
        let mut p = bpf.runq_probe();
        assert_eq!(p.sample(), None);
    }

    #[test]
    fn a_bad_config_is_a_typed_error() {
        let bpf = SlotringBpf::degraded(crate::error::tests::no_btf("unit test"));
        let cc = ConcurrencyControl::new();
        cc.set_max_concurrency(2);
        let cfg = AdaptiveConfig {
            floor: 3,
            ..AdaptiveConfig::with_ceiling(UNLIMITED)
        };
        let e =
            AdaptiveBudget::start(cc, bpf.runq_probe(), cfg, Duration::from_millis(1)).unwrap_err();
        assert_eq!(
            e,
            SlotsError::AdaptiveFloorAboveCeiling {
                floor: 3,
                ceiling: 2
            }
        );
    }
}
