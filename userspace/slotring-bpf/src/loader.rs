//! Load, attach, pin and mmap; or degrade to plain memory.
//!
//! Every kernel step goes through aya; the only raw syscalls of this crate
//! are the mmaps in `region.rs` and the bpffs mount here.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Once;

use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData, MapError};
use aya::programs::{BtfTracePoint, ProgramError, RawTracePoint};
use aya::{Btf, Ebpf, EbpfError, EbpfLoader};

use crate::BpfError;
use slotring_counters::slots::SlotsCounters;
use slotring_counters::uring::UringCounters;

use crate::abi::{
    AbiStruct, EpisodeRule, HIST_SLOTS, Hist, HotEpisode, HotLog, LeaseSlot, MAX_THREADS,
    MAX_THROTTLERS, Owner, ThreadAcct, ThrottleStats,
};
use crate::error::is_perm;
use crate::lease::{self, Shared, ThreadRegions};
use crate::pins::{OWNER_MAP, PinDirs};
use crate::region::Region;

#[repr(C, align(32))]
struct Aligned<B: ?Sized> {
    bytes: B,
}

static ALIGNED: &Aligned<[u8]> = &Aligned {
    bytes: *include_bytes!("../../../ebpf/slotring.bpf.o"),
};

/// The embedded BPF object (`ebpf/slotring.bpf.o`, rebuilt and checked for
/// staleness by `cargo xtask build-ebpf [--check]`).
pub static OBJECT: &[u8] = &ALIGNED.bytes;

/// Maps that are pinned (by their map name, which is the metric name).
const PINNED_MAPS: &[&str] = &[
    "lease",
    "thread_acct",
    "thread_index",
    "hist_park_cpu",
    "hist_unpark_rq",
    "hist_pre_sleep",
    "hist_between_sleeps",
    "hist_post_wake",
    "hot_episodes",
    EPISODE_RULE_MAP,
    "throttle",
    "slots",
    "uring",
];

/// The map holding the [`EpisodeRule`] the programs judge episodes by.
pub const EPISODE_RULE_MAP: &str = "episode_rule";

/// The process-wide exp2 histograms of the probes (one map each, named by
/// [`HistKind::map`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistKind {
    /// On-CPU ns per parked episode (all its segments): one sample per
    /// episode.
    ParkCpu,
    /// Run-queue latency at unpark (wake-up to switch-in), ns.
    UnparkRunq,
    /// On-CPU ns before an episode's first real sleep: one sample per
    /// episode.
    PreSleep,
    /// On-CPU ns between an episode's sleeps: one sample per episode that
    /// slept twice or more.
    BetweenSleeps,
    /// On-CPU ns after an episode's last wake-up: one sample per episode
    /// that slept.
    PostWake,
}

impl HistKind {
    /// Every histogram.
    pub const ALL: [HistKind; 5] = [
        HistKind::ParkCpu,
        HistKind::UnparkRunq,
        HistKind::PreSleep,
        HistKind::BetweenSleeps,
        HistKind::PostWake,
    ];

    /// The map's name (pinned under it).
    pub fn map(self) -> &'static str {
        match self {
            HistKind::ParkCpu => "hist_park_cpu",
            HistKind::UnparkRunq => "hist_unpark_rq",
            HistKind::PreSleep => "hist_pre_sleep",
            HistKind::BetweenSleeps => "hist_between_sleeps",
            HistKind::PostWake => "hist_post_wake",
        }
    }
}

/// `(tp_btf program, raw_tp program, tracepoint)`.
const PROGRAMS: &[(&str, &str, &str)] = &[
    ("switch_btf", "switch_raw", "sched_switch"),
    ("wakeup_btf", "wakeup_raw", "sched_wakeup"),
    ("wakeup_new_btf", "wakeup_new_raw", "sched_wakeup_new"),
];

pub(crate) const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// A program or map name with its kernel id.
pub type NamedId = (String, u32);

/// One program's BPF run statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgStats {
    /// Program (function) name, e.g. `switch_btf`.
    pub name: String,
    /// Cumulative ns spent running it.
    pub run_time_ns: u64,
    /// Times it ran.
    pub run_count: u64,
}

/// How the probes were attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// BTF-typed tracepoints (direct field reads).
    TpBtf,
    /// Raw tracepoints with CO-RE probe reads (fallback).
    RawTp,
}

/// Whether the kernel side is live.
#[derive(Debug)]
pub enum ProbeStatus<'a> {
    /// Loaded, attached and pinned.
    Attached(AttachMode),
    /// Running without probes, for this reason; counters are in plain memory.
    Degraded(&'a BpfError),
}

/// Loader configuration.
#[derive(Debug, Clone)]
pub struct BpfConfig {
    /// Pin root (default `/sys/fs/bpf/slotring`): the instance pins in
    /// `<pin_dir>/<instance>/`. Both are created when missing (and removed
    /// when empty on drop); existing ones must be owned by this user and
    /// not writable by others, with no symbolic link on the way (see
    /// [`crate::pins`]).
    pub pin_dir: PathBuf,
    /// Instance name: the directory under `pin_dir` (default: this
    /// process's id). Taken over only when empty or provably stale.
    pub instance: Option<String>,
    /// Keep the pins after drop (default: removed).
    pub keep_pins: bool,
    /// Group allowed to read the pins (mode 0640/0750); `None`: 0600/0700.
    pub pin_group: Option<u32>,
    /// Process whose threads are traced (default: this process; threads
    /// register only from this process, so another tgid filters out every
    /// event — which is how the bench measures the filter).
    pub target_tgid: u32,
    /// Try only the raw_tp programs (to exercise the fallback).
    pub force_raw_tp: bool,
    /// Place each thread at index `tid % MAX_THREADS` when that is free, so
    /// the programs find it with an array lookup instead of a hash lookup
    /// (default `true`; `false` sends every thread through `thread_index`).
    pub direct_index: bool,
    /// The rule the programs judge each parked episode by (default
    /// [`EpisodeRule::default_rule`], the constants of `verify/rule.rs`).
    pub episode_rule: EpisodeRule,
}

impl Default for BpfConfig {
    fn default() -> Self {
        Self {
            pin_dir: PathBuf::from(DEFAULT_PIN_ROOT),
            instance: None,
            keep_pins: false,
            pin_group: None,
            target_tgid: std::process::id(),
            force_raw_tp: false,
            direct_index: true,
            episode_rule: EpisodeRule::default_rule(),
        }
    }
}

/// The default pin root.
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/slotring";

impl BpfConfig {
    /// The instance directory name: `instance`, or this process's id.
    pub fn instance_name(&self) -> String {
        self.instance
            .clone()
            .unwrap_or_else(|| std::process::id().to_string())
    }
}

struct Kernel {
    ebpf: Ebpf,
    mode: AttachMode,
    dir: PathBuf,
    /// Removes the pins (unless kept) when the instance drops.
    pins: PinDirs,
}

/// A loaded (or degraded) instance. Dropping it detaches the probes, removes
/// the pins (unless `keep_pins`), unmaps the map memory and closes every fd.
///
/// Threads register with the most recently created instance (at their first
/// lease report or [`SlotringBpf::register_current_thread`]); once it drops,
/// their reports are ignored until another instance is created. Each
/// instance pins in its own directory `<pin_dir>/<instance>/` and refuses
/// one that holds the pins of a live (or unjudgeable) owner.
pub struct SlotringBpf {
    pub(crate) shared: &'static Shared,
    hists: [Region; HistKind::ALL.len()],
    rule: Region,
    throttle: Region,
    slots: Region,
    uring: Region,
    kernel: Option<Kernel>,
    degraded: Option<BpfError>,
}

impl std::fmt::Debug for SlotringBpf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotringBpf")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

/// The error of loading the embedded object. aya's `EbpfError` repeats the
/// message of the map, program or BTF error it wraps, so those are kept as
/// the source without the wrapper.
fn object_err(e: EbpfError) -> BpfError {
    match e {
        EbpfError::MapError(MapError::CreateError { name, io_error }) if is_perm(&io_error) => {
            BpfError::NoPrivilege {
                what: format!("creating map `{name}`"),
                source: io_error,
            }
        }
        EbpfError::MapError(source) => BpfError::CreateMaps {
            source: Box::new(source),
        },
        EbpfError::BtfError(source) => BpfError::NoBtf(source),
        source => BpfError::Object {
            source: Box::new(source),
        },
    }
}

fn program_missing(name: &str) -> BpfError {
    BpfError::NotInObject {
        kind: "program",
        name: name.to_owned(),
    }
}

fn map_missing(name: &str) -> BpfError {
    BpfError::NotInObject {
        kind: "map",
        name: name.to_owned(),
    }
}

fn prog_err(program: &str, tracepoint: &str, e: ProgramError, attaching: bool) -> BpfError {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            if is_perm(&io_error) && verifier_log.to_string().trim().is_empty() {
                BpfError::NoPrivilege {
                    what: format!("loading program `{program}`"),
                    source: io_error,
                }
            } else {
                BpfError::Verifier {
                    program: program.to_owned(),
                    source: io_error,
                    log: verifier_log.to_string(),
                }
            }
        }
        ProgramError::SyscallError(s) if is_perm(&s.io_error) => BpfError::NoPrivilege {
            what: format!(
                "{} `{program}` ({})",
                if attaching { "attaching" } else { "loading" },
                s.call
            ),
            source: s.io_error,
        },
        source if attaching => BpfError::Attach {
            program: program.to_owned(),
            tracepoint: tracepoint.to_owned(),
            source: Box::new(source),
        },
        source => BpfError::Program {
            what: "loading",
            program: program.to_owned(),
            source: Box::new(source),
        },
    }
}

fn attach_set(ebpf: &mut Ebpf, btf: &Btf, mode: AttachMode) -> Result<(), BpfError> {
    for (b, r, tp) in PROGRAMS {
        let name = if mode == AttachMode::TpBtf { *b } else { *r };
        let prog = ebpf
            .program_mut(name)
            .ok_or_else(|| program_missing(name))?;
        let converting = |source: ProgramError| BpfError::Program {
            what: "converting",
            program: name.to_owned(),
            source: Box::new(source),
        };
        match mode {
            AttachMode::TpBtf => {
                let p: &mut BtfTracePoint = prog.try_into().map_err(converting)?;
                p.load(tp, btf).map_err(|e| prog_err(name, tp, e, false))?;
                p.attach().map_err(|e| prog_err(name, tp, e, true))?;
            }
            AttachMode::RawTp => {
                let p: &mut RawTracePoint = prog.try_into().map_err(converting)?;
                p.load().map_err(|e| prog_err(name, tp, e, false))?;
                p.attach(tp).map_err(|e| prog_err(name, tp, e, true))?;
            }
        }
    }
    Ok(())
}

fn unload_set(ebpf: &mut Ebpf, mode: AttachMode) {
    for (b, r, _) in PROGRAMS {
        let name = if mode == AttachMode::TpBtf { *b } else { *r };
        if let Some(prog) = ebpf.program_mut(name) {
            let _ = match mode {
                AttachMode::TpBtf => <&mut BtfTracePoint>::try_from(prog).map(|p| p.unload()),
                AttachMode::RawTp => <&mut RawTracePoint>::try_from(prog).map(|p| p.unload()),
            };
        }
    }
}

fn map_fd_region(ebpf: &Ebpf, name: &str, words: usize, entries: u32) -> Result<Region, BpfError> {
    let map = ebpf.map(name).ok_or_else(|| map_missing(name))?;
    let Map::Array(data) = map else {
        return Err(BpfError::NotAnArray {
            map: name.to_owned(),
        });
    };
    Region::map(name, data.fd().as_fd(), words, entries as usize)
}

/// A region per histogram, in the order of [`HistKind::ALL`].
fn hist_regions(
    mut open: impl FnMut(HistKind) -> Result<Region, BpfError>,
) -> Result<[Region; HistKind::ALL.len()], BpfError> {
    let mut v = Vec::with_capacity(HistKind::ALL.len());
    for k in HistKind::ALL {
        v.push(open(k)?);
    }
    Ok(v.try_into().ok().expect("one region per kind"))
}

fn is_bpffs(p: &Path) -> bool {
    nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type().0 == BPF_FS_MAGIC)
}

/// Mount bpffs on `/sys/fs/bpf` if that is where `dir` lives and nothing is
/// mounted there yet (whether the opened directory is on bpffs is checked
/// on its descriptor).
fn ensure_bpffs(dir: &Path) -> Result<(), BpfError> {
    let root = Path::new("/sys/fs/bpf");
    if dir.starts_with(root) && !is_bpffs(root) {
        nix::mount::mount(
            Some("bpf"),
            root,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|source| BpfError::MountBpffs {
            path: root.to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// Write this process into the `owner` map, then pin it and every map and
/// attached program in this instance's directory (see [`crate::pins`]). On
/// error the returned directories are dropped, removing what this call
/// pinned and created.
fn pin_all(ebpf: &mut Ebpf, cfg: &BpfConfig, mode: AttachMode) -> Result<PinDirs, BpfError> {
    ensure_bpffs(&cfg.pin_dir)?;
    let instance = cfg.instance_name();
    let mut dirs = PinDirs::open(&cfg.pin_dir, &instance, cfg.pin_group)?;
    if !dirs.is_bpffs() {
        return Err(BpfError::NotBpffs {
            path: dirs.path().to_owned(),
        });
    }
    let owner = Owner::current().map_err(|source| BpfError::PinAccess {
        what: "reading the start time of this process from",
        path: PathBuf::from("/proc/self/stat"),
        source,
    })?;
    {
        let map = ebpf
            .map_mut(OWNER_MAP)
            .ok_or_else(|| map_missing(OWNER_MAP))?;
        let map_err = |source| BpfError::Map {
            what: format!("writing pid {} into map `{OWNER_MAP}`", owner.pid),
            source: Box::new(source),
        };
        let mut array: Array<&mut MapData, [u64; Owner::WORDS]> =
            Array::try_from(map).map_err(map_err)?;
        let words: [u64; Owner::WORDS] = owner
            .to_words()
            .try_into()
            .expect("an owner is WORDS words");
        array.set(0, words, 0).map_err(map_err)?;
    }
    let group = cfg.pin_group;
    // The owner first: a directory without it is never judged stale.
    for name in std::iter::once(OWNER_MAP).chain(PINNED_MAPS.iter().copied()) {
        let map = ebpf.map(name).ok_or_else(|| map_missing(name))?;
        dirs.pin(
            name,
            group,
            |p| map.pin(p),
            |path, source| BpfError::Pin { path, source },
        )?;
    }
    for (b, r, _) in PROGRAMS {
        let name = if mode == AttachMode::TpBtf { *b } else { *r };
        let prog = ebpf
            .program_mut(name)
            .ok_or_else(|| program_missing(name))?;
        dirs.pin(
            &format!("prog_{name}"),
            group,
            |p| prog.pin(p),
            |path, source| BpfError::Pin { path, source },
        )?;
    }
    Ok(dirs)
}

static DEGRADED_ONCE: Once = Once::new();

impl SlotringBpf {
    /// Load, attach, pin and mmap; a typed error names the cause.
    pub fn load(cfg: BpfConfig) -> Result<Self, BpfError> {
        cfg.episode_rule.check()?;
        let btf = Btf::from_sys_fs().map_err(BpfError::NoBtf)?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .override_global("targ_tgid", &cfg.target_tgid, true)
            .load(OBJECT)
            .map_err(object_err)?;
        let mode = if cfg.force_raw_tp {
            attach_set(&mut ebpf, &btf, AttachMode::RawTp)?;
            AttachMode::RawTp
        } else {
            match attach_set(&mut ebpf, &btf, AttachMode::TpBtf) {
                Ok(()) => AttachMode::TpBtf,
                Err(e) if e.is_no_privilege() => return Err(e),
                Err(first) => {
                    unload_set(&mut ebpf, AttachMode::TpBtf);
                    attach_set(&mut ebpf, &btf, AttachMode::RawTp).map_err(|_| first)?;
                    AttachMode::RawTp
                }
            }
        };
        let regions = ThreadRegions {
            lease: map_fd_region(&ebpf, "lease", LeaseSlot::WORDS, MAX_THREADS)?,
            acct: map_fd_region(&ebpf, "thread_acct", ThreadAcct::WORDS, MAX_THREADS)?,
            hot: map_fd_region(&ebpf, "hot_episodes", HotLog::WORDS, MAX_THREADS)?,
        };
        let hists = hist_regions(|k| map_fd_region(&ebpf, k.map(), HIST_SLOTS, 1))?;
        // The rule is in place before any thread registers.
        let rule = map_fd_region(&ebpf, EPISODE_RULE_MAP, EpisodeRule::WORDS, 1)?;
        rule.store(0, &cfg.episode_rule.to_words());
        let throttle = map_fd_region(&ebpf, "throttle", ThrottleStats::WORDS, MAX_THROTTLERS)?;
        let slots = map_fd_region(&ebpf, "slots", SlotsCounters::WORDS, 1)?;
        let uring = map_fd_region(&ebpf, "uring", UringCounters::WORDS, 1)?;
        // From here on, an error drops `pins`, which removes them.
        let mut pins = pin_all(&mut ebpf, &cfg, mode)?;
        let index_map = ebpf
            .take_map("thread_index")
            .ok_or_else(|| map_missing("thread_index"))?;
        let index: BpfHashMap<MapData, u32, u32> =
            BpfHashMap::try_from(index_map).map_err(|source| BpfError::Map {
                what: "opening map `thread_index` as a hash map".into(),
                source: Box::new(source),
            })?;
        pins.keep = cfg.keep_pins;
        let shared = Shared::new(regions, Some(index), cfg.direct_index);
        lease::set_active(Some(shared));
        Ok(Self {
            shared,
            hists,
            rule,
            throttle,
            slots,
            uring,
            kernel: Some(Kernel {
                ebpf,
                mode,
                dir: pins.path().to_owned(),
                pins,
            }),
            degraded: None,
        })
    }

    /// Load one program of the embedded object for `tracepoint` and unload
    /// it again, without attaching or creating pins: a dry run that reports
    /// the verifier's verdict (with its log) for that pairing. `program` is
    /// a function name of `slotring.bpf.c`, e.g. `switch_btf`.
    pub fn check_program(program: &str, tracepoint: &str) -> Result<(), BpfError> {
        let btf = Btf::from_sys_fs().map_err(BpfError::NoBtf)?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .load(OBJECT)
            .map_err(object_err)?;
        let prog = ebpf
            .program_mut(program)
            .ok_or_else(|| program_missing(program))?;
        let bad = |what: &'static str| {
            move |source: ProgramError| BpfError::Program {
                what,
                program: program.to_owned(),
                source: Box::new(source),
            }
        };
        if let Ok(p) = <&mut BtfTracePoint>::try_from(&mut *prog) {
            p.load(tracepoint, &btf)
                .map_err(|e| prog_err(program, tracepoint, e, false))?;
            p.unload().map_err(bad("unloading"))
        } else {
            let p: &mut RawTracePoint = prog.try_into().map_err(bad("converting"))?;
            p.load()
                .map_err(|e| prog_err(program, tracepoint, e, false))?;
            p.unload().map_err(bad("unloading"))
        }
    }

    /// [`SlotringBpf::load`], or on failure an instance without probes whose
    /// counters live in plain memory. The first degradation in the process
    /// is reported once on stderr.
    pub fn load_or_degrade(cfg: BpfConfig) -> Self {
        match Self::load(cfg) {
            Ok(s) => s,
            Err(e) => {
                DEGRADED_ONCE.call_once(|| {
                    eprintln!(
                        "slotring-bpf: running without kernel probes: {}",
                        crate::error::chain(&e)
                    );
                });
                Self::degraded(e)
            }
        }
    }

    /// An instance without probes (plain memory), remembering why.
    pub fn degraded(reason: BpfError) -> Self {
        let shared = Shared::new(ThreadRegions::heap(), None, true);
        lease::set_active(Some(shared));
        let rule = Region::heap(EpisodeRule::WORDS, 1);
        rule.store(0, &EpisodeRule::default_rule().to_words());
        Self {
            shared,
            hists: std::array::from_fn(|_| Region::heap(HIST_SLOTS, 1)),
            rule,
            throttle: Region::heap(ThrottleStats::WORDS, MAX_THROTTLERS as usize),
            slots: Region::heap(SlotsCounters::WORDS, 1),
            uring: Region::heap(UringCounters::WORDS, 1),
            kernel: None,
            degraded: Some(reason),
        }
    }

    /// Whether probes are attached, or why not.
    pub fn status(&self) -> ProbeStatus<'_> {
        match (&self.kernel, &self.degraded) {
            (Some(k), _) => ProbeStatus::Attached(k.mode),
            (None, Some(e)) => ProbeStatus::Degraded(e),
            (None, None) => unreachable!("an instance is either loaded or degraded"),
        }
    }

    /// Whether the kernel probes are live.
    pub fn is_attached(&self) -> bool {
        self.kernel.is_some() && self.shared.lease.is_mapped()
    }

    /// Stale instance directories (of dead owners) this load removed.
    pub fn removed_stale(&self) -> &[PathBuf] {
        self.kernel.as_ref().map_or(&[], |k| &k.pins.removed_stale)
    }

    /// The instance's pin directory and pinned files (empty when degraded).
    pub fn pins(&self) -> (Option<&Path>, &[PathBuf]) {
        match &self.kernel {
            Some(k) => (Some(&k.dir), &k.pins.pins),
            None => (None, &[]),
        }
    }

    /// Kernel ids of the programs and maps (for `bpftool ... id N`).
    pub fn kernel_ids(&self) -> (Vec<NamedId>, Vec<NamedId>) {
        let Some(k) = &self.kernel else {
            return (Vec::new(), Vec::new());
        };
        let progs = k
            .ebpf
            .programs()
            .filter_map(|(n, p)| p.info().ok().map(|i| (n.to_owned(), i.id())))
            .collect();
        let maps = k
            .ebpf
            .maps()
            .filter_map(|(n, m)| match m {
                Map::Array(d) | Map::HashMap(d) => d.info().ok().map(|i| (n.to_owned(), i.id())),
                _ => None,
            })
            .collect();
        (progs, maps)
    }

    /// Per attached program: cumulative run time and run count (non-zero
    /// only while `kernel.bpf_stats_enabled` is 1).
    pub fn prog_stats(&self) -> Vec<ProgStats> {
        let Some(k) = &self.kernel else {
            return Vec::new();
        };
        k.ebpf
            .programs()
            .filter_map(|(n, p)| {
                let info = p.info().ok()?;
                Some(ProgStats {
                    name: n.to_owned(),
                    run_time_ns: info.run_time().as_nanos() as u64,
                    run_count: info.run_count(),
                })
            })
            .collect()
    }

    /// Register the calling thread (otherwise done by its first lease state
    /// report). Returns its thread id; [`BpfError::OtherInstance`] when a
    /// newer instance exists (threads register with the newest).
    pub fn register_current_thread(&self) -> Result<u32, BpfError> {
        let (s, _) = lease::current_slot()?;
        if !std::ptr::eq(s, self.shared) {
            return Err(BpfError::OtherInstance {
                tid: lease::current_tid(),
            });
        }
        Ok(lease::current_tid())
    }

    /// Store one named throttler's counters at `index` (no syscall).
    pub fn publish_throttle(&self, index: u32, stats: &ThrottleStats) -> Result<(), BpfError> {
        if index >= MAX_THROTTLERS {
            return Err(BpfError::IndexOutOfRange {
                map: "throttle",
                index,
                capacity: MAX_THROTTLERS,
            });
        }
        self.throttle.store(index as usize, &stats.to_words());
        Ok(())
    }

    /// Store the slot counters (no syscall).
    pub fn publish_slots(&self, stats: &SlotsCounters) {
        self.slots.store(0, &stats.to_words());
    }

    /// Store the io_uring engine counters (no syscall).
    pub fn publish_uring(&self, stats: &UringCounters) {
        self.uring.store(0, &stats.to_words());
    }

    /// Read back a throttler entry.
    pub fn throttle_stats(&self, index: u32) -> Result<ThrottleStats, BpfError> {
        if index >= MAX_THROTTLERS {
            return Err(BpfError::IndexOutOfRange {
                map: "throttle",
                index,
                capacity: MAX_THROTTLERS,
            });
        }
        Ok(ThrottleStats::from_words(
            &self.throttle.load(index as usize),
        ))
    }

    /// Read back the slot counters.
    pub fn slot_stats(&self) -> SlotsCounters {
        SlotsCounters::from_words(&self.slots.load(0))
    }

    /// Read back the engine counters.
    pub fn uring_stats(&self) -> UringCounters {
        UringCounters::from_words(&self.uring.load(0))
    }

    /// One of the probes' histograms.
    pub fn hist(&self, kind: HistKind) -> Hist {
        let i = HistKind::ALL
            .iter()
            .position(|k| *k == kind)
            .expect("ALL lists every kind");
        Hist::from_words(&self.hists[i].load(0))
    }

    /// The rule the programs judge episodes by (from its map).
    pub fn episode_rule(&self) -> EpisodeRule {
        EpisodeRule::from_words(&self.rule.load(0))
    }

    /// A thread's last hot episodes, oldest first.
    pub fn hot_episodes(&self, tid: u32) -> Result<Vec<HotEpisode>, BpfError> {
        let idx = self.index_of(tid).ok_or(BpfError::UnknownThread { tid })?;
        Ok(HotLog::from_words(&self.shared.hot.load(idx as usize)).recent())
    }

    pub(crate) fn index_of(&self, tid: u32) -> Option<u32> {
        self.shared.registry().by_tid.get(&tid).map(|e| e.idx)
    }

    /// The kernel's accounting of a registered (or exited) thread.
    pub fn thread_acct(&self, tid: u32) -> Result<ThreadAcct, BpfError> {
        let idx = self.index_of(tid).ok_or(BpfError::UnknownThread { tid })?;
        Ok(ThreadAcct::from_words(&self.shared.acct.load(idx as usize)))
    }

    /// A thread's lease slot.
    pub fn lease_slot(&self, tid: u32) -> Result<LeaseSlot, BpfError> {
        let idx = self.index_of(tid).ok_or(BpfError::UnknownThread { tid })?;
        // Acquire `active` first (pairs with the writer's Release flip).
        let active = self.shared.lease.entry(idx as usize)[lease::W_ACTIVE]
            .load(std::sync::atomic::Ordering::Acquire);
        let mut s = LeaseSlot::from_words(&self.shared.lease.load(idx as usize));
        s.active = active;
        Ok(s)
    }

    /// Every registered thread id (live or exited) with its index.
    pub fn threads(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.shared.registry().by_tid.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

impl Drop for SlotringBpf {
    fn drop(&mut self) {
        lease::clear_active_if(self.shared);
        self.shared.kill();
        if let Some(k) = self.kernel.take() {
            // Pins first (unless kept), then the programs and maps.
            drop(k.pins);
            drop(k.ebpf);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn instance_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<super::SlotringBpf>();
    }
}
