//! [`UringCounters`]: the engine's statistics, C layout for BPF maps,
//! defined by one field list in `slotring-counters` (with every other counter
//! set, so that `slotring-bpf` mirrors them without depending on this crate).

pub use slotring_counters::uring::UringCounters;
