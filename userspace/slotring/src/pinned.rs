//! Read the pinned BPF maps of any process that embeds slotring.
//!
//! A process that loads `slotring-bpf` pins its maps in its own instance
//! directory under a root (default `/sys/fs/bpf/slotring/<pid>/`, or
//! `<root>/<instance name>/`): `owner` (pid and start time of the process),
//! `throttle`, `slots`, `uring` (the counters, map name = metric name),
//! `lease`, `thread_acct` and `hot_episodes` (per-thread lease clocks,
//! kernel accounting and the last hot parked episodes), `episode_rule` (the
//! bounds the programs judge episodes by) and the exp2 histograms
//! (`hist_park_cpu`, `hist_pre_sleep`, `hist_between_sleeps`,
//! `hist_post_wake`, `hist_unpark_rq`). [`instances`] lists
//! the instance directories of a root with their [`Liveness`] (a process
//! killed with `kill -9` leaves stale pins: its pid is gone or reused), and
//! [`select`] picks one for a reader. [`PinnedMaps`] opens one instance's
//! maps by path (like `bpftool map dump pinned …`),
//! decodes every value with the `slotring-bpf` ABI mirrors (the counter
//! structs themselves for `slots` and `uring`) and builds a
//! [`Snapshot`] for `slotring stats` and `slotring exporter`. Each read is
//! one `BPF_MAP_LOOKUP_ELEM` per entry; no map is written.

use std::path::{Path, PathBuf};

use aya::maps::{Array, Map, MapData};
use slotring_bpf::abi::{HIST_SLOTS, HotLog, LeaseSlot, ThreadAcct, ThrottleStats};
use slotring_bpf::{AbiStruct, EPISODE_RULE_MAP, EpisodeRule, Hist, HistKind, HotEpisode, Owner};
use slotring_slots::SlotsCounters;
use slotring_throttle::LeaseState;
use slotring_uring::UringCounters;

use crate::snapshot::{HIST_BUCKETS, KernelSnapshot, NamedThrottler, Snapshot};

/// CLOCK_MONOTONIC in ns, the clock of the lease slots (`slotring-bpf`'s,
/// the one definition).
pub use slotring_bpf::monotonic_ns;
pub use slotring_bpf::pins::Liveness;

/// The default pin root of `slotring-bpf` (instances pin in directories
/// under it).
pub const DEFAULT_PIN_DIR: &str = slotring_bpf::DEFAULT_PIN_ROOT;

const _: () = assert!(HIST_SLOTS == HIST_BUCKETS);

/// Why pinned maps could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PinnedError {
    /// The map is not pinned (no process is publishing there).
    #[error(
        "no pinned slotring map at {path} (is a process using slotring with probes running? see --pin-dir)"
    )]
    Missing {
        /// The path.
        path: PathBuf,
    },
    /// The map's path cannot be looked up (usually permission denied: the
    /// pin directory is the loader's, mode 0700 or 0750).
    #[error("cannot look up pinned map {path}")]
    Access {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Listing the instances of a pin root, or reading an owner record,
    /// failed (often: permission denied).
    #[error("reading the slotring instances under {path} failed")]
    Instances {
        /// The pin root or instance directory.
        path: PathBuf,
        /// The cause.
        source: slotring_bpf::BpfError,
    },
    /// No instance directory under the root (or none by that name).
    #[error(
        "no slotring instance under {root}{} (is a process using slotring with probes running? see --pin-dir)",
        .name.as_ref().map(|n| format!(" named {n:?}")).unwrap_or_default()
    )]
    NoInstance {
        /// The pin root.
        root: PathBuf,
        /// The instance asked for.
        name: Option<String>,
    },
    /// The instance's pins are left by a process that no longer runs: the
    /// counters are frozen and no probe is attached.
    #[error(
        "the pins in {path} are stale: their owner, process {pid}, no longer runs ({liveness})"
    )]
    Stale {
        /// The instance directory.
        path: PathBuf,
        /// The owner's pid.
        pid: u64,
        /// Gone or pid reused.
        liveness: Liveness,
    },
    /// Several live instances and none chosen.
    #[error("{} live slotring instances under {root} ({}): choose one with --instance", .names.len(), .names.join(", "))]
    Ambiguous {
        /// The pin root.
        root: PathBuf,
        /// Their names.
        names: Vec<String>,
    },
    /// Opening or reading the map failed (often: not root / no CAP_BPF).
    #[error("reading pinned map {path} failed")]
    Read {
        /// The path.
        path: PathBuf,
        /// aya's error.
        source: aya::maps::MapError,
    },
    /// The ABI struct the map holds is larger than this reader supports.
    #[error("reading pinned map {path} failed: values of {words} words are not supported")]
    UnsupportedSize {
        /// The path.
        path: PathBuf,
        /// Words per value of the ABI struct.
        words: usize,
    },
    /// A value in the map does not have the size of its ABI struct.
    #[error("decoding pinned map {path} failed")]
    Decode {
        /// The path.
        path: PathBuf,
        /// The size mismatch.
        source: slotring_bpf::BpfError,
    },
}

fn read_array<const N: usize>(dir: &Path, name: &str) -> Result<Vec<Vec<u64>>, PinnedError> {
    let path = dir.join(name);
    // Only a path that is not there is "missing": permission denied is
    // said as such.
    match std::fs::symlink_metadata(&path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(PinnedError::Missing { path });
        }
        Err(source) => return Err(PinnedError::Access { path, source }),
    }
    let err = |source| PinnedError::Read {
        path: path.clone(),
        source,
    };
    let data = MapData::from_pin(&path).map_err(err)?;
    let map = Map::from_map_data(data).map_err(err)?;
    let array: Array<MapData, [u64; N]> = Array::try_from(map).map_err(err)?;
    array
        .iter()
        .map(|v| v.map(|w| w.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)
}

macro_rules! by_size {
    ($words:expr, $dir:expr, $name:expr; $($n:literal)*) => {
        match $words {
            $($n => read_array::<$n>($dir, $name),)*
            other => Err(PinnedError::UnsupportedSize {
                path: $dir.join($name),
                words: other,
            }),
        }
    };
}

/// Every entry of the pinned array `name`, decoded as `T` (the value size
/// comes from the ABI mirror, so a layout change is picked up at build time).
fn read_all<T: AbiStruct>(dir: &Path, name: &str) -> Result<Vec<T>, PinnedError> {
    let rows = by_size!(T::WORDS, dir, name;
        1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32
        33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61
        62 63 64)?;
    decode_rows(rows, &dir.join(name))
}

/// Decode rows read from outside this process, refusing a wrong size.
fn decode_rows<T: AbiStruct>(rows: Vec<Vec<u64>>, path: &Path) -> Result<Vec<T>, PinnedError> {
    rows.iter()
        .map(|w| {
            T::try_from_words(w).map_err(|source| PinnedError::Decode {
                path: path.to_owned(),
                source,
            })
        })
        .collect()
}

/// Decoded per-thread state: the lease clock, the kernel's accounting and
/// the thread's last hot episodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadState {
    /// Thread id.
    pub tid: u32,
    /// The thread's lease slot.
    pub lease: LeaseSlot,
    /// The kernel's accounting.
    pub acct: ThreadAcct,
    /// Its last hot parked episodes, oldest first.
    pub hot: Vec<HotEpisode>,
}

impl ThreadState {
    /// Wall ns parked up to `now_ns` (CLOCK_MONOTONIC), including an open
    /// parked interval.
    pub fn parked_ns(&self, now_ns: u64) -> u64 {
        self.lease
            .clock()
            .time_in(LeaseState::Parked as usize, now_ns)
    }

    /// The thread's lease state now.
    pub fn state(&self) -> u64 {
        self.lease.clock().state
    }
}

/// Handle on a pin directory.
#[derive(Debug, Clone)]
pub struct PinnedMaps {
    dir: PathBuf,
}

impl PinnedMaps {
    /// Use the maps pinned under `dir` (checked on each read).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The pin directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The owner record (`None` when the instance pinned none).
    pub fn owner(&self) -> Result<Option<Owner>, PinnedError> {
        slotring_bpf::pins::read_owner(&self.dir.join(slotring_bpf::pins::OWNER_MAP)).map_err(
            |source| PinnedError::Instances {
                path: self.dir.clone(),
                source,
            },
        )
    }

    /// Whether the process that pinned these maps still runs.
    pub fn liveness(&self) -> Result<Liveness, PinnedError> {
        Ok(self.owner()?.map_or(Liveness::Unknown, |o| o.liveness()))
    }

    /// `Ok` unless the owner is provably gone ([`PinnedError::Stale`]): a
    /// reader calls it after reading, so frozen counters of a killed
    /// process are never shown as live.
    pub fn check_live(&self) -> Result<(), PinnedError> {
        let owner = self.owner()?;
        let liveness = owner.map_or(Liveness::Unknown, |o| o.liveness());
        if liveness.is_stale() {
            return Err(PinnedError::Stale {
                path: self.dir.clone(),
                pid: owner.map_or(0, |o| o.pid),
                liveness,
            });
        }
        Ok(())
    }

    /// Named throttlers (entries with an empty name are unused).
    pub fn throttlers(&self) -> Result<Vec<NamedThrottler>, PinnedError> {
        Ok(read_all::<ThrottleStats>(&self.dir, "throttle")?
            .into_iter()
            .filter(|t| t.name[0] != 0)
            .map(|t| NamedThrottler {
                name: t.name_str(),
                counters: t.counters,
            })
            .collect())
    }

    /// The slot counters.
    pub fn slots(&self) -> Result<SlotsCounters, PinnedError> {
        let s = read_all::<SlotsCounters>(&self.dir, "slots")?;
        Ok(s.first().copied().unwrap_or_default())
    }

    /// The engine counters.
    pub fn uring(&self) -> Result<UringCounters, PinnedError> {
        let u = read_all::<UringCounters>(&self.dir, "uring")?;
        Ok(u.first().copied().unwrap_or_default())
    }

    /// One of the probes' histograms.
    pub fn hist(&self, kind: HistKind) -> Result<[u64; HIST_BUCKETS], PinnedError> {
        let h = read_all::<Hist>(&self.dir, kind.map())?;
        Ok(h.first().copied().unwrap_or_default().slots)
    }

    /// The rule the programs judge parked episodes by.
    pub fn episode_rule(&self) -> Result<EpisodeRule, PinnedError> {
        let r = read_all::<EpisodeRule>(&self.dir, EPISODE_RULE_MAP)?;
        Ok(r.first().copied().unwrap_or_default())
    }

    /// The kernel's id of the pinned map `name`: the same path with another
    /// id is another instance (the process reloaded its probes).
    pub fn map_id(&self, name: &str) -> Result<u32, PinnedError> {
        let path = self.dir.join(name);
        let err = |source| PinnedError::Read {
            path: path.clone(),
            source,
        };
        let data = MapData::from_pin(&path).map_err(err)?;
        Ok(data.info().map_err(err)?.id())
    }

    /// Every registered thread's state.
    pub fn threads(&self) -> Result<Vec<ThreadState>, PinnedError> {
        let leases = read_all::<LeaseSlot>(&self.dir, "lease")?;
        let accts = read_all::<ThreadAcct>(&self.dir, "thread_acct")?;
        let hot = read_all::<HotLog>(&self.dir, "hot_episodes")?;
        Ok(leases
            .into_iter()
            .zip(accts)
            .zip(hot)
            .filter(|((l, _), _)| l.tid != 0)
            .map(|((lease, acct), hot)| ThreadState {
                tid: lease.tid as u32,
                lease,
                acct,
                hot: hot.recent(),
            })
            .collect())
    }

    /// The kernel part of a snapshot.
    pub fn kernel(&self) -> Result<KernelSnapshot, PinnedError> {
        let now = monotonic_ns();
        let threads = self.threads()?;
        let mut hists = [[0; HIST_BUCKETS]; HistKind::ALL.len()];
        for (h, k) in hists.iter_mut().zip(HistKind::ALL) {
            *h = self.hist(k)?;
        }
        Ok(kernel_from_threads(&threads, now, |k| {
            hists[HistKind::ALL.iter().position(|x| *x == k).unwrap_or(0)]
        }))
    }

    /// Everything, as `/metrics` shows it.
    pub fn snapshot(&self) -> Result<Snapshot, PinnedError> {
        Ok(Snapshot {
            throttlers: self.throttlers()?,
            slots: self.slots()?,
            uring: self.uring()?,
            kernel: Some(self.kernel()?),
            // Tenants live in the process that made them: not pinned.
            tenants: Vec::new(),
            adaptive: None,
            // So do its workload trees.
            workloads: Vec::new(),
            cpu_workloads: Vec::new(),
        })
    }
}

/// One instance directory under a pin root.
#[derive(Debug, Clone)]
pub struct Instance {
    /// The directory name (the instance name, by default the owner's pid).
    pub name: String,
    /// Its maps.
    pub maps: PinnedMaps,
    /// The owner record, when pinned.
    pub owner: Option<Owner>,
    /// Whether the owner still runs.
    pub liveness: Liveness,
}

impl Instance {
    /// `Ok` when live (or not judgeable), [`PinnedError::Stale`] otherwise.
    pub fn check_live(&self) -> Result<(), PinnedError> {
        if self.liveness.is_stale() {
            return Err(PinnedError::Stale {
                path: self.maps.dir.clone(),
                pid: self.owner.map_or(0, |o| o.pid),
                liveness: self.liveness,
            });
        }
        Ok(())
    }
}

/// Every instance directory under `root`, sorted by name, live or stale.
pub fn instances(root: &Path) -> Result<Vec<Instance>, PinnedError> {
    let list = slotring_bpf::pins::instances(root).map_err(|source| PinnedError::Instances {
        path: root.to_owned(),
        source,
    })?;
    Ok(list
        .into_iter()
        .map(|d| Instance {
            name: d.name,
            maps: PinnedMaps::new(d.path),
            owner: d.owner,
            liveness: d.liveness,
        })
        .collect())
}

/// The instance a reader should use: the one named `name`, or else the
/// only live one. A stale choice is [`PinnedError::Stale`] (when nothing
/// live is left, the newest stale one is named), several live ones without
/// a name are [`PinnedError::Ambiguous`].
pub fn select(root: &Path, name: Option<&str>) -> Result<Instance, PinnedError> {
    let all = instances(root)?;
    let chosen = match name {
        Some(n) => all.into_iter().find(|i| i.name == n),
        None => {
            let (live, stale): (Vec<_>, Vec<_>) =
                all.into_iter().partition(|i| !i.liveness.is_stale());
            match live.len() {
                0 => stale
                    .into_iter()
                    .max_by_key(|i| i.owner.map_or(0, |o| o.start_time)),
                1 => live.into_iter().next(),
                _ => {
                    return Err(PinnedError::Ambiguous {
                        root: root.to_owned(),
                        names: live.into_iter().map(|i| i.name).collect(),
                    });
                }
            }
        }
    };
    let chosen = chosen.ok_or_else(|| PinnedError::NoInstance {
        root: root.to_owned(),
        name: name.map(str::to_owned),
    })?;
    chosen.check_live()?;
    Ok(chosen)
}

/// Sum per-thread states into a [`KernelSnapshot`], with the histograms
/// `hist` returns.
pub fn kernel_from_threads(
    threads: &[ThreadState],
    now_ns: u64,
    hist: impl Fn(HistKind) -> [u64; HIST_BUCKETS],
) -> KernelSnapshot {
    let p = LeaseState::Parked as usize;
    let r = LeaseState::Running as usize;
    let mut k = KernelSnapshot {
        hist_park_cpu: hist(HistKind::ParkCpu),
        hist_segments: [
            hist(HistKind::PreSleep),
            hist(HistKind::BetweenSleeps),
            hist(HistKind::PostWake),
        ],
        hist_unpark_rq: hist(HistKind::UnparkRunq),
        ..KernelSnapshot::default()
    };
    for t in threads {
        let a = &t.acct;
        k.threads += 1;
        if t.state() == p as u64 {
            k.leases_parked += 1;
        }
        k.episodes += a.episodes;
        k.hot_episodes += a.hot_episodes;
        for (s, (ns, hot)) in [
            (a.pre_sleep_ns, a.hot_pre_sleep),
            (a.between_sleeps_ns, a.hot_between_sleeps),
            (a.post_wake_ns, a.hot_post_wake),
        ]
        .into_iter()
        .enumerate()
        {
            k.segment_oncpu_ns[s] += ns;
            k.segment_hot[s] += hot;
        }
        k.parks += t.lease.parks();
        k.parked_ns += t.parked_ns(now_ns);
        k.parked_oncpu_ns += t.acct.on_cpu_ns[p];
        k.parked_runq_ns += t.acct.runq_ns[p];
        k.running_oncpu_ns += t.acct.on_cpu_ns[r];
        k.missed_events += t.acct.missed_switch_in + t.acct.missed_switch_out;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_value_size_is_a_typed_error_naming_the_map() {
        let path = Path::new("/sys/fs/bpf/slotring/slots");
        let good = vec![vec![7u64; SlotsCounters::WORDS]];
        assert_eq!(
            decode_rows::<SlotsCounters>(good, path).unwrap()[0].parks,
            7
        );
        let short = vec![vec![0u64; 3]];
        let err = decode_rows::<SlotsCounters>(short, path).unwrap_err();
        assert!(matches!(err, PinnedError::Decode { .. }), "{err:?}");
        let msg = chain(&err);
        assert!(
            msg.contains("/sys/fs/bpf/slotring/slots") && msg.contains("got 3"),
            "{msg}"
        );
    }

    #[test]
    fn counter_sets_are_their_own_abi_words_in_field_order() {
        let s = SlotsCounters::from_values(std::array::from_fn(|i| i as u64 + 1));
        assert_eq!(s.slots_granted, 1);
        assert_eq!(SlotsCounters::from_words(&s.to_words()), s);
        // The ABI words are the fields in declaration order.
        let n = SlotsCounters::LEN as u64;
        assert_eq!(s.to_words(), (1..=n).collect::<Vec<u64>>());
        let u = UringCounters::from_values(std::array::from_fn(|i| i as u64 + 1));
        assert_eq!(u.reads, 1);
        assert_eq!(UringCounters::from_words(&u.to_words()), u);
        let n = UringCounters::LEN as u64;
        assert_eq!(u.to_words(), (1..=n).collect::<Vec<u64>>());
    }

    /// The error and its causes, as `{:#}` of an `anyhow` chain prints them.
    fn chain(e: &dyn std::error::Error) -> String {
        std::iter::successors(Some(e), |e| e.source())
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(": ")
    }

    #[test]
    fn each_cause_is_printed_once() {
        // The size mismatch under the decoding error.
        let path = Path::new("/sys/fs/bpf/slotring/slots");
        let err = decode_rows::<SlotsCounters>(vec![vec![0u64; 3]], path).unwrap_err();
        let text = chain(&err);
        assert!(
            text.starts_with("decoding pinned map /sys/fs/bpf/slotring/slots failed: "),
            "{text}"
        );
        assert_eq!(text.matches("got 3").count(), 1, "{text}");
        // aya's error and the kernel's answer under the reading error: a
        // plain file where a pinned map should be.
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("slots"), b"not a map").unwrap();
        let err = PinnedMaps::new(d.path()).slots().unwrap_err();
        assert!(matches!(err, PinnedError::Read { .. }), "{err:?}");
        let text = chain(&err);
        assert!(text.starts_with("reading pinned map "), "{text}");
        let os = std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
            .last()
            .unwrap()
            .to_string();
        assert!(
            os.contains("os error"),
            "the kernel's answer is the last cause: {text}"
        );
        assert_eq!(text.matches(&os).count(), 1, "{text}");
    }

    #[test]
    fn missing_dir_names_the_path() {
        let d = tempfile::tempdir().unwrap();
        let err = PinnedMaps::new(d.path()).slots().unwrap_err();
        assert!(err.to_string().contains("slots"), "{err}");
    }

    #[test]
    fn parked_interval_is_counted_while_open() {
        let mut lease = LeaseSlot {
            tid: 7,
            active: 1,
            ..LeaseSlot::default()
        };
        lease.clk[1].state = LeaseState::Parked as u64;
        lease.clk[1].since_ns = 1_000;
        lease.clk[1].state_ns[LeaseState::Parked as usize] = 500;
        // The inactive buffer is ignored.
        lease.clk[0].state_ns[LeaseState::Parked as usize] = 99_999;
        let t = ThreadState {
            tid: 7,
            lease,
            acct: ThreadAcct {
                episodes: 3,
                hot_episodes: 1,
                post_wake_ns: 40,
                hot_post_wake: 1,
                ..ThreadAcct::default()
            },
            hot: Vec::new(),
        };
        assert_eq!(t.parked_ns(3_000), 2_500);
        let mut pre = [0; HIST_BUCKETS];
        pre[4] = 3;
        let k = kernel_from_threads(std::slice::from_ref(&t), 3_000, |h| {
            if h == HistKind::PreSleep {
                pre
            } else {
                [0; HIST_BUCKETS]
            }
        });
        assert_eq!((k.threads, k.leases_parked, k.parked_ns), (1, 1, 2_500));
        assert_eq!((k.episodes, k.hot_episodes), (3, 1));
        assert_eq!((k.segment_oncpu_ns, k.segment_hot), ([0, 0, 40], [0, 0, 1]));
        assert_eq!(k.hist_segments[0][4], 3);
    }
}
