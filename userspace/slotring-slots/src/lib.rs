//! # slotring-slots
//!
//! ClickHouse's `ConcurrencyControl` (`src/Common/ISlotControl.h`,
//! `src/Common/ConcurrencyControl.{h,cpp}`; see `ARCHITECTURE.md`), rebuilt:
//! a global budget of CPU slots, shared by allocations (one per query) under
//! one of three schedulers, plus parkable CPU leases.
//!
//! * [`ConcurrencyControl`]: the budget (`set_max_concurrency`, 0 → 1,
//!   [`UNLIMITED`] by default), [`ConcurrencyControl::max_concurrency_from_settings`],
//!   [`ConcurrencyControl::fair_share`], [`ConcurrencyControl::set_scheduler`]
//!   and [`ConcurrencyControl::counters`] ([`SlotsCounters`], `#[repr(C)]`).
//! * [`Scheduler`]: `round_robin` (min slots count, oversubscription
//!   possible), `fair_round_robin` (min slots non-competing, budget never
//!   exceeded), `max_min_fair` (default; each slot to the waiter with the
//!   fewest allocated, FIFO among equals).
//! * [`Allocation`]: `try_acquire` (lock-free), blocking `acquire` /
//!   `acquire_timeout`, `set_max`, `free`, `is_requesting`; each
//!   [`AcquiredSlot`] has a `slot_id` 0, 1, 2, … in grant order.
//!   [`GrantedAllocation`] is the escape hatch that counts nothing.
//! * Workloads ([`ConcurrencyControl::with_workloads`],
//!   [`ConcurrencyControl::set_workloads`], [`ConcurrencyControl::allocate_in`],
//!   [`ConcurrencyControl::workloads`] → [`WorkloadSlots`]): allocations
//!   enter leaves of a `slotring_throttle::WorkloadTree`; each workload's
//!   `max_concurrent_threads` caps the slots below it, and strict priority
//!   then count-fair weights pick the workload a free slot goes to, the
//!   three schedulers the allocation inside it (see the `workloads` module).
//! * CPU leases ([`SlotLease`], [`AcquiredSlot::make_current`],
//!   [`CpuLeaseParkGuard`]): a parked slot stops counting; unpark borrows.
//!   The crate installs a `slotring_throttle::LeaseHook` so blocking throttler
//!   waits park the caller's lease, and reports lease state changes through
//!   `slotring_throttle::notify_lease_state`.
//!
//! Design: one mutex-protected `pub(crate)` scheduler state behind thin
//! wrappers (see the `scheduler_state` module for the waiter lists and the
//! invariants); `try_acquire` never locks, and a release locks only when
//! something queues, a yield is wanted, or it is its allocation's last
//! slot (the `scheduler_state::lock_free` module). The code runs unchanged under loom
//! (`RUSTFLAGS="--cfg loom"`) through the `sync` facade.
//!
//! This crate knows nothing of io_uring, tokio, BPF or Prometheus.
//!
//! ```
//! use slotring_slots::{ConcurrencyControl, Scheduler};
//!
//! let cc = ConcurrencyControl::new();
//! cc.set_max_concurrency(2);
//! cc.set_scheduler(Scheduler::FairRoundRobin);
//! let query = cc.allocate(1, 4).unwrap(); // 1 non-competing + up to 3 competing
//! let mut threads = Vec::new();
//! while let Some(slot) = query.try_acquire() {
//!     threads.push(slot);
//! }
//! assert_eq!(threads.len(), 3); // the master slot and the whole budget of 2
//! assert_eq!(threads.iter().map(|s| s.slot_id()).collect::<Vec<_>>(), [0, 1, 2]);
//! assert!(query.is_requesting()); // still wants one more
//! ```
#![forbid(unsafe_code)]

// Module dependencies run one way: `control` -> `slot` -> `lease` ->
// `control_shared` -> `scheduler_state` -> `workloads`, each also using any
// module further along that chain and the leaves `error`, `scheduler` and
// `sync` (the
// counter sets live in `slotring-counters`); `adaptive` (the budget's
// control law) is a leaf too: pure arithmetic on numbers.
mod adaptive;
mod control;
mod control_shared;
mod error;
mod lease;
mod scheduler;
mod scheduler_state;
mod slot;
mod sync;
mod workloads;

pub use adaptive::{AdaptiveConfig, BudgetController, RunqSample, Step};
pub use control::{Allocation, ConcurrencyControl, GrantedAllocation, SlotAllocation};
pub use error::SlotsError;
pub use lease::{CpuLeaseParkGuard, SlotLease, current_lease_state, install_lease_hook};
pub use scheduler::Scheduler;
pub use slot::{AcquiredSlot, CPU_YIELD_INTERVAL, CurrentLease};
pub use slotring_counters::slots::{AdaptiveCounters, SlotsCounters, UNLIMITED};
pub use slotring_throttle::LeaseState;
pub use workloads::{GRANT_SCALE, WorkloadSlots};
