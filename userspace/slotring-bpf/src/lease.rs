//! Lease state into the kernel without a syscall per park.
//!
//! Each thread that reports a lease state gets, once, an index into the
//! mmapable `lease` map (one `bpf(BPF_MAP_UPDATE_ELEM)` of `thread_index`:
//! tid -> index). From then on a state change is a handful of plain atomic
//! stores into that thread's own [`LeaseSlot`](crate::abi::LeaseSlot): the
//! inactive half of its double-buffered clock (state, `since_ns`, per-state
//! wall time) is filled from the active half, then `active` is flipped.
//!
//! # Memory ordering
//!
//! A slot has a single writer, its thread. The BPF programs read it only at
//! that thread's own context switches and wake-ups, when the thread is not
//! running: the scheduler's run-queue lock, the full barrier in
//! `__schedule` and the `p->on_cpu` release/acquire on migration order every
//! store the thread made before it stopped before the BPF read, on whatever
//! CPU. A thread can however be preempted in the middle of an update; the
//! double buffer makes that harmless: the half BPF reads (`clk[active]`) is
//! complete, and the one store that flips `active` publishes the other half.
//! That flip is a `Release` store (userspace readers load `active` with
//! `Acquire`), so a reader in this process that sees the new `active` also
//! sees the half it points to. A concurrent userspace reader can still race
//! with the *next* update of the half it is reading; the verification API
//! reads threads that are parked or done, whose slots are quiescent. All
//! other stores are `Relaxed`.
//!
//! Registration and the liveness check use the `alive` flag of the
//! instance (`Release` when it dies, `Acquire` on every state change): a
//! thread that sees it false never touches the dead instance's map again.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use aya::maps::{HashMap as BpfHashMap, MapData};
use slotring_throttle::{LeaseObserver, LeaseState};

use crate::BpfError;
use crate::abi::{AbiStruct, HotLog, LEASE_STATES, LeaseClock, LeaseSlot, MAX_THREADS, ThreadAcct};
use crate::region::Region;

// Word offsets in `struct lease_slot` / `struct lease_clock`.
pub(crate) const W_TID: usize = 0;
pub(crate) const W_ACTIVE: usize = 1;
const W_CLK: usize = 2;
const C_STATE: usize = 0;
const C_SINCE: usize = 1;
const C_STATE_NS: usize = 2;
const C_PARKS: usize = 2 + LEASE_STATES;
/// Word offset of `events` in `struct thread_acct`.
const W_EVENTS: usize = std::mem::offset_of!(ThreadAcct, events) / 8;
/// Most sleeps a thread that unregisters takes for its final switch-out.
const FINAL_SLEEPS: u32 = 10;

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns` (vDSO, no syscall).
pub fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

pub(crate) fn current_tid() -> u32 {
    nix::unistd::gettid().as_raw() as u32
}

/// `se.sum_exec_runtime`, `sched_info.run_delay` and `sched_info.pcount`
/// of the calling thread, the same counters BPF snapshots.
fn read_schedstat() -> std::io::Result<(u64, u64, u64)> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    let mut next = || {
        it.next()
            .and_then(Result::ok)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, text.clone()))
    };
    Ok((next()?, next()?, next()?))
}

/// One registered thread in an instance's registry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub(crate) idx: u32,
    pub(crate) live: bool,
}

pub(crate) struct Registry {
    pub(crate) alive: bool,
    pub(crate) index: Option<BpfHashMap<MapData, u32, u32>>,
    pub(crate) by_tid: HashMap<u32, Entry>,
    /// Index in use by a live thread or holding an exited thread's data.
    used: Vec<bool>,
    /// Place threads at `tid % MAX_THREADS` when free (BPF's fast path).
    direct: bool,
    retired: VecDeque<(u32, u32)>,
}

/// What an instance shares with the threads that report lease states. It is
/// leaked (`&'static`): a thread may still hold it after the instance drops.
pub(crate) struct Shared {
    pub(crate) alive: AtomicBool,
    pub(crate) lease: Region,
    pub(crate) acct: Region,
    /// The `hot_episodes` log, at the same index as `lease` and `acct`.
    pub(crate) hot: Region,
    pub(crate) reg: Mutex<Registry>,
}

/// The per-thread regions of an instance: lease slots, accounting and the
/// hot-episode log, all indexed alike.
pub(crate) struct ThreadRegions {
    pub(crate) lease: Region,
    pub(crate) acct: Region,
    pub(crate) hot: Region,
}

impl ThreadRegions {
    /// Plain memory (degraded mode and unit tests).
    pub(crate) fn heap() -> Self {
        let n = MAX_THREADS as usize;
        Self {
            lease: Region::heap(LeaseSlot::WORDS, n),
            acct: Region::heap(ThreadAcct::WORDS, n),
            hot: Region::heap(HotLog::WORDS, n),
        }
    }
}

impl Shared {
    pub(crate) fn new(
        regions: ThreadRegions,
        index: Option<BpfHashMap<MapData, u32, u32>>,
        direct: bool,
    ) -> &'static Shared {
        let ThreadRegions { lease, acct, hot } = regions;
        Box::leak(Box::new(Shared {
            alive: AtomicBool::new(true),
            lease,
            acct,
            hot,
            reg: Mutex::new(Registry {
                alive: true,
                index,
                by_tid: HashMap::new(),
                used: vec![false; MAX_THREADS as usize],
                direct,
                retired: VecDeque::new(),
            }),
        }))
    }

    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.reg.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register `tid` (the calling thread): pick an index, reset its slot
    /// and accounting, then publish tid -> index to the kernel.
    fn register(&self, tid: u32) -> Result<u32, BpfError> {
        let mut reg = self.registry();
        if !reg.alive {
            return Err(BpfError::InstanceDropped { tid });
        }
        if let Some(e) = reg.by_tid.get(&tid).copied()
            && e.live
        {
            return Ok(e.idx);
        }
        // Prefer the direct-mapped index (BPF finds it without a hash
        // lookup), then any free one, then the oldest exited thread's.
        let preferred = tid % MAX_THREADS;
        let idx = if reg.direct && !reg.used[preferred as usize] {
            preferred
        } else if let Some(free) = reg.used.iter().position(|u| !u) {
            free as u32
        } else if let Some((old_tid, idx)) = reg.retired.pop_front() {
            // Forget the exited thread unless its tid was reused since.
            if reg.by_tid.get(&old_tid).is_some_and(|e| e.idx == idx) {
                reg.by_tid.remove(&old_tid);
            }
            reg.used[idx as usize] = false;
            idx
        } else {
            return Err(BpfError::ThreadsExhausted {
                capacity: MAX_THREADS,
                tid,
            });
        };
        let i = idx as usize;
        let now = monotonic_ns();
        let mut acct = ThreadAcct {
            tid: u64::from(tid),
            ..ThreadAcct::default()
        };
        if reg.index.is_some() {
            // Baseline the kernel's counters now, as BPF would at a
            // switch-in, so the first switch-out is already accounted (the
            // thread is on CPU: its current arrival is in pcount).
            let (exec, run_delay, pcount) =
                read_schedstat().map_err(|source| BpfError::Schedstat { tid, source })?;
            acct.snap_exec_ns = exec;
            acct.snap_run_delay = run_delay;
            acct.snap_pcount = pcount;
            acct.on_cpu = 1;
            acct.in_ts = now;
            acct.initialized = 1;
        }
        self.acct.store(i, &acct.to_words());
        self.hot.store(i, &HotLog::default().to_words());
        let clock = LeaseClock {
            state: LeaseState::NotHolding as u64,
            since_ns: now,
            state_ns: [0; LEASE_STATES],
            parks: 0,
        };
        let slot = LeaseSlot {
            clk: [clock; 2],
            ..LeaseSlot::default()
        };
        let entry = self.lease.entry(i);
        self.lease.store(i, &slot.to_words());
        if let Some(map) = reg.index.as_mut() {
            map.insert(tid, idx, 0).map_err(|source| BpfError::Map {
                what: format!("registering thread {tid} in map `thread_index`"),
                source: Box::new(source),
            })?;
        }
        // The tid goes last: BPF's direct-mapped lookup matches only a fully
        // initialized slot (the stores before are ordered by this Release
        // and, for BPF, by the context switch that precedes any event).
        entry[W_TID].store(u64::from(tid), Ordering::Release);
        reg.used[i] = true;
        reg.by_tid.insert(tid, Entry { idx, live: true });
        Ok(idx)
    }

    fn unregister(&self, tid: u32, idx: u32) {
        // A thread that exits with its lease parked stops being parked.
        write_state(
            self.lease.entry(idx as usize),
            LeaseState::NotHolding as u64,
            monotonic_ns(),
        );
        // Block so the kernel sees a final switch-out and accounts the
        // thread's last on-CPU interval (and ends its last episode) before
        // it stops being tracked. A short sleep whose timer fires before
        // the thread gets off the CPU is no switch at all: sleep again until
        // the programs have seen one (a few times at most).
        let events = &self.acct.entry(idx as usize)[W_EVENTS];
        let seen = events.load(Ordering::Relaxed);
        for _ in 0..FINAL_SLEEPS {
            std::thread::sleep(std::time::Duration::from_micros(50));
            if !self.acct.is_mapped() || events.load(Ordering::Relaxed) != seen {
                break;
            }
        }
        let mut reg = self.registry();
        if !reg.alive {
            return;
        }
        self.lease.entry(idx as usize)[W_TID].store(0, Ordering::Release);
        if let Some(map) = reg.index.as_mut() {
            let _ = map.remove(&tid);
        }
        if let Some(e) = reg.by_tid.get_mut(&tid) {
            e.live = false;
        }
        reg.retired.push_back((tid, idx));
    }

    /// Mark dead: threads stop using it at their next state change.
    pub(crate) fn kill(&self) {
        let mut reg = self.registry();
        reg.alive = false;
        reg.index = None;
        self.alive.store(false, Ordering::Release);
        self.lease.retire();
        self.acct.retire();
        self.hot.retire();
    }
}

/// The instance new threads register with (set by load, cleared by drop).
static ACTIVE: Mutex<Option<&'static Shared>> = Mutex::new(None);
/// Whether `ACTIVE` is `Some`: lets a report with no instance loaded return
/// without touching the mutex (written under the mutex; `Relaxed` is enough
/// because the mutex orders everything the slow path then reads).
static ANY_ACTIVE: AtomicBool = AtomicBool::new(false);

pub(crate) fn set_active(s: Option<&'static Shared>) {
    let mut a = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
    *a = s;
    ANY_ACTIVE.store(s.is_some(), Ordering::Relaxed);
}

pub(crate) fn clear_active_if(s: &'static Shared) {
    let mut a = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
    if a.is_some_and(|cur| std::ptr::eq(cur, s)) {
        *a = None;
        ANY_ACTIVE.store(false, Ordering::Relaxed);
    }
}

struct ThreadReg {
    cur: Cell<Option<(&'static Shared, u32)>>,
}

impl Drop for ThreadReg {
    fn drop(&mut self) {
        if let Some((s, idx)) = self.cur.get()
            && s.alive.load(Ordering::Acquire)
        {
            s.unregister(current_tid(), idx);
        }
    }
}

thread_local! {
    static REG: ThreadReg = const { ThreadReg { cur: Cell::new(None) } };
}

/// The calling thread's slot in the active instance, registering it first
/// if needed (the only syscall, once per thread and instance).
pub(crate) fn current_slot() -> Result<(&'static Shared, u32), BpfError> {
    REG.with(|r| {
        if let Some((s, idx)) = r.cur.get()
            && s.alive.load(Ordering::Acquire)
        {
            return Ok((s, idx));
        }
        let tid = current_tid();
        if !ANY_ACTIVE.load(Ordering::Relaxed) {
            r.cur.set(None);
            return Err(BpfError::NoInstance { tid });
        }
        let active = *ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = active else {
            r.cur.set(None);
            return Err(BpfError::NoInstance { tid });
        };
        let idx = s.register(tid)?;
        r.cur.set(Some((s, idx)));
        Ok((s, idx))
    })
}

/// Apply a state change to a slot (see the module's memory ordering): fill
/// the inactive clock from the active one, then flip `active`.
pub(crate) fn write_state(slot: &[std::sync::atomic::AtomicU64], new: u64, now: u64) {
    let a = (slot[W_ACTIVE].load(Ordering::Relaxed) & 1) as usize;
    let cur = W_CLK + a * LeaseClock::WORDS;
    let next = W_CLK + (1 - a) * LeaseClock::WORDS;
    let old = slot[cur + C_STATE].load(Ordering::Relaxed);
    if old == new {
        return;
    }
    let since = slot[cur + C_SINCE].load(Ordering::Relaxed);
    for s in 0..LEASE_STATES {
        let mut v = slot[cur + C_STATE_NS + s].load(Ordering::Relaxed);
        if s as u64 == old.min(2) {
            v += now.saturating_sub(since);
        }
        slot[next + C_STATE_NS + s].store(v, Ordering::Relaxed);
    }
    slot[next + C_STATE].store(new, Ordering::Relaxed);
    slot[next + C_SINCE].store(now, Ordering::Relaxed);
    let parks = slot[cur + C_PARKS].load(Ordering::Relaxed);
    slot[next + C_PARKS].store(
        parks + u64::from(new == LeaseState::Parked as u64),
        Ordering::Relaxed,
    );
    slot[W_ACTIVE].store((1 - a) as u64, Ordering::Release);
}

/// The process-wide [`LeaseObserver`] that mirrors lease states into the
/// active instance's `lease` map (or its plain-memory stand-in).
///
/// Install it with [`install_lease_observer`]. A thread's first report registers
/// it (one syscall); every later report is one `clock_gettime` (vDSO) and a
/// few atomic stores. Reports with no instance loaded are dropped.
#[derive(Debug, Default)]
pub struct LeaseMirror;

/// The observer instance to pass to `slotring_throttle::install_lease_observer`.
pub static LEASE_MIRROR: LeaseMirror = LeaseMirror;

impl LeaseObserver for LeaseMirror {
    fn on_lease_state(&self, state: LeaseState) {
        if let Ok((s, idx)) = current_slot() {
            write_state(s.lease.entry(idx as usize), state as u64, monotonic_ns());
        }
    }
}

/// Install [`LEASE_MIRROR`] as the process's lease observer. Returns
/// `false` if another observer was installed first.
pub fn install_lease_observer() -> bool {
    slotring_throttle::install_lease_observer(&LEASE_MIRROR)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    fn slot() -> Vec<AtomicU64> {
        (0..LeaseSlot::WORDS).map(|_| AtomicU64::new(0)).collect()
    }

    fn read(s: &[AtomicU64]) -> LeaseSlot {
        LeaseSlot::from_words(
            &s.iter()
                .map(|w| w.load(Ordering::Relaxed))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn word_offsets_match_the_mirrors() {
        let off = |l: Vec<crate::abi::FieldLayout>, n: &str| {
            l.iter()
                .find(|f| f.name == n)
                .map(|f| f.offset / 8)
                .unwrap()
        };
        let slot = LeaseSlot::layout();
        assert_eq!(off(slot.clone(), "tid"), W_TID);
        assert_eq!(off(slot.clone(), "active"), W_ACTIVE);
        assert_eq!(off(slot, "clk"), W_CLK);
        let clk = LeaseClock::layout();
        assert_eq!(off(clk.clone(), "state"), C_STATE);
        assert_eq!(off(clk.clone(), "since_ns"), C_SINCE);
        assert_eq!(off(clk.clone(), "state_ns"), C_STATE_NS);
        assert_eq!(off(clk, "parks"), C_PARKS);
    }

    #[test]
    fn per_state_clock_is_exact() {
        let s = slot();
        s[W_CLK + C_SINCE].store(100, Ordering::Relaxed);
        write_state(&s, LeaseState::Running as u64, 150); // 50 not holding
        write_state(&s, LeaseState::Parked as u64, 170); // 20 running
        write_state(&s, LeaseState::Parked as u64, 180); // no change
        write_state(&s, LeaseState::Running as u64, 1170); // 1000 parked
        write_state(&s, LeaseState::NotHolding as u64, 1171); // 1 running
        let l = read(&s);
        let c = l.clock();
        assert_eq!(c.state_ns, [50, 21, 1000]);
        assert_eq!(
            (l.parks(), l.unparks(), c.since_ns, c.state),
            (1, 1, 1171, 0)
        );
        assert_eq!(c.time_in(0, 1200), 50 + 29);
        // The other half still holds the previous, complete clock.
        let prev = &l.clk[1 - l.active as usize];
        assert_eq!(
            (prev.state, prev.since_ns, prev.state_ns),
            (1, 1170, [50, 20, 1000])
        );
    }

    /// Unit tests that create instances (process-wide "most recent
    /// instance") take this lock.
    static INSTANCES: std::sync::Mutex<()> = std::sync::Mutex::new(());

    pub(crate) fn instances() -> std::sync::MutexGuard<'static, ()> {
        INSTANCES.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn registration_errors_say_why_and_name_the_thread() {
        let _g = instances();
        // An instance being dropped refuses new threads.
        let dead = Shared::new(ThreadRegions::heap(), None, true);
        dead.kill();
        assert!(matches!(
            dead.register(4242),
            Err(BpfError::InstanceDropped { tid: 4242 })
        ));
        // A thread of a newer instance asked through an older one.
        let old = crate::SlotringBpf::degraded(crate::error::tests::no_btf("unit test"));
        let new = crate::SlotringBpf::degraded(crate::error::tests::no_btf("unit test"));
        let (on_old, on_new, tid) = std::thread::scope(|sc| {
            sc.spawn(|| {
                (
                    old.register_current_thread(),
                    new.register_current_thread(),
                    current_tid(),
                )
            })
            .join()
            .unwrap()
        });
        assert!(
            matches!(on_old, Err(BpfError::OtherInstance { tid: t }) if t == tid),
            "{on_old:?}"
        );
        assert_eq!(on_new.unwrap(), tid);
        drop(new);
        drop(old);
        // No instance at all.
        let (none, tid) = std::thread::spawn(|| (current_slot().map(|_| ()), current_tid()))
            .join()
            .unwrap();
        assert!(
            matches!(none, Err(BpfError::NoInstance { tid: t }) if t == tid),
            "{none:?}"
        );
        assert!(none.unwrap_err().to_string().contains(&tid.to_string()));
    }

    #[test]
    fn degraded_instance_mirrors_in_plain_memory() {
        let _g = instances();
        let bpf = crate::SlotringBpf::degraded(crate::error::tests::no_btf("unit test"));
        assert!(!bpf.is_attached());
        let me = bpf.register_current_thread().unwrap();
        LEASE_MIRROR.on_lease_state(LeaseState::Parked);
        std::thread::sleep(std::time::Duration::from_millis(2));
        LEASE_MIRROR.on_lease_state(LeaseState::NotHolding);
        let l = bpf.lease_slot(me).unwrap();
        assert_eq!((l.parks(), l.unparks(), l.tid), (1, 1, u64::from(me)));
        assert!(l.clock().state_ns[2] >= 2_000_000, "{l:?}");
        let r = bpf.verify(&[me], crate::VerifyConfig::default()).unwrap();
        assert!(
            matches!(r.verdict, crate::Verdict::Unverified { .. }),
            "{r}"
        );
        assert!(matches!(
            bpf.verify(
                &[me],
                crate::VerifyConfig {
                    tolerated_hot_fraction: 2.0,
                    ..crate::VerifyConfig::default()
                }
            ),
            Err(BpfError::BadThreshold(_))
        ));
        assert!(matches!(
            bpf.thread_acct(1),
            Err(BpfError::UnknownThread { tid: 1 })
        ));
        let s = slotring_slots::SlotsCounters {
            parked: 5,
            ..Default::default()
        };
        bpf.publish_slots(&s);
        assert_eq!(bpf.slot_stats(), s);
        assert!(bpf.publish_throttle(64, &Default::default()).is_err());
        drop(bpf);
        // The thread's cached slot is dead now: reports are dropped.
        LEASE_MIRROR.on_lease_state(LeaseState::Parked);
    }
}

#[cfg(test)]
mod model {
    use std::sync::atomic::AtomicU64;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The per-state clock equals a model that sums the time between
        /// consecutive transitions into the state left; parks/unparks count
        /// transitions into/out of Parked; no-op reports change nothing.
        #[test]
        fn lease_clock_matches_model(steps in proptest::collection::vec((0u64..3, 0u64..1_000_000), 0..64)) {
            let slot: Vec<AtomicU64> = (0..LeaseSlot::WORDS).map(|_| AtomicU64::new(0)).collect();
            let (mut now, mut state, mut since) = (0u64, 0u64, 0u64);
            let mut model = [0u64; 3];
            let (mut parks, mut unparks) = (0u64, 0u64);
            for (next, dt) in steps {
                now += dt;
                write_state(&slot, next, now);
                if next != state {
                    model[state as usize] += now - since;
                    parks += u64::from(next == 2);
                    unparks += u64::from(state == 2);
                    state = next;
                    since = now;
                }
            }
            let l = LeaseSlot::from_words(&slot.iter().map(|w| w.load(Ordering::Relaxed)).collect::<Vec<_>>());
            let c = l.clock();
            prop_assert_eq!(c.state_ns, model);
            prop_assert_eq!((c.state, c.since_ns, l.parks(), l.unparks()), (state, since, parks, unparks));
        }
    }
}
