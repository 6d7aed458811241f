//! Kernel proof that a parked CPU lease costs nothing, and slotring's
//! statistics in pinned, mmapable, BTF-described BPF maps.
//!
//! [`SlotringBpf::load`] loads the embedded CO-RE object
//! (`ebpf/slotring.bpf.o`, built from `ebpf/slotring.bpf.c`) with aya,
//! attaches `sched_switch`, `sched_wakeup` and `sched_wakeup_new` (as
//! `tp_btf`, or `raw_tp` where tp_btf cannot load), pins the maps under a
//! directory (default `/sys/fs/bpf/slotring/`, mode 0600) and mmaps the
//! mmapable ones. [`SlotringBpf::load_or_degrade`] runs on without probes
//! when loading fails (no privilege, no BTF, verifier rejection), says so
//! once on stderr, and keeps every counter in plain memory.
//!
//! * Lease states reach the kernel through [`LEASE_MIRROR`] (a
//!   [`slotring_throttle::LeaseObserver`]): one registration syscall per
//!   thread, then plain atomic stores into the thread's mmapped slot.
//! * Throttle, slot and engine counters are published with
//!   [`SlotringBpf::publish_throttle`], [`SlotringBpf::publish_slots`] and
//!   [`SlotringBpf::publish_uring`]: stores into map memory, no syscalls;
//!   `bpftool map dump pinned /sys/fs/bpf/slotring/<map>` prints them with
//!   field names.
//! * [`AdaptiveBudget`] closes the loop: the run-queue share of running
//!   leases ([`RunqProbe`]) sizes the slot budget through
//!   `slotring_slots::BudgetController`.
//! * [`SlotringBpf::verify`] turns the kernel's accounting into a
//!   [`VerificationReport`] with a [`Verdict`]: per parked episode, the
//!   on-CPU time before the first sleep, between sleeps and after the last
//!   wake-up, each with its own bound (the model is in the `verify` module).

#![deny(unsafe_code)]

pub mod abi;
mod budget;
mod error;
mod lease;
mod loader;
pub mod pins;
#[allow(
    unsafe_code,
    reason = "the BPF boundary: mmap of map memory and views into it; every block has a SAFETY comment"
)]
mod region;
mod verify;

pub use abi::{
    AbiStruct, EpisodeRule, FieldLayout, Hist, HotEpisode, HotLog, LeaseClock, LeaseSlot, Owner,
    ThreadAcct, ThrottleStats,
};
pub use budget::{AdaptiveBudget, BudgetPoint, RunqProbe};
pub use error::BpfError;
pub use lease::{LEASE_MIRROR, LeaseMirror, install_lease_observer, monotonic_ns};
pub use loader::{
    AttachMode, BpfConfig, DEFAULT_PIN_ROOT, EPISODE_RULE_MAP, HistKind, NamedId, OBJECT,
    ProbeStatus, ProgStats, SlotringBpf,
};
pub use verify::{
    BETWEEN_SLEEPS_FRACTION, EpisodeFigures, Histograms, POST_WAKE_BOUND, POST_WAKE_FRACTION,
    PRE_SLEEP_BOUND, ParkedWindow, Reading, Segments, TOLERATED_EXCESS_FLOOR,
    TOLERATED_EXCESS_FRACTION, TOLERATED_HOT_EPISODES, TOLERATED_HOT_FRACTION, ThreadReport,
    Verdict, VerificationReport, VerifyConfig, WINDOW_HEADER, describe_hot, describe_rule,
    describe_segments, hot_names, open_episode, write_failing, write_window_row,
};
