//! Rust mirrors of the structs in `ebpf/slotring.h` (the only C definition).
//!
//! The counter structs of the other crates ([`SlotsCounters`],
//! [`UringCounters`], and [`ThrottleCounters`] inside [`ThrottleStats`]) are
//! their own mirrors: their layout comes from their `counter_set!` field
//! list, so no second field list exists here.
//!
//! Every mirror is `#[repr(C)]` and made of 64-bit words (or a 32-byte name),
//! so it has no padding. [`AbiStruct::layout`] lists each field's offset and
//! size; the `abi_matches_btf` test compares it with the BTF of the committed
//! object, so a change on one side fails until the other follows.
//!
//! Values move between Rust and map memory as sequences of `u64` words
//! ([`AbiStruct::to_words`] / [`AbiStruct::from_words`]), each word stored or
//! loaded atomically: no unsafe transmutes.

use std::mem::{offset_of, size_of};

use slotring_counters::CounterSet;
use slotring_counters::slots::SlotsCounters;
use slotring_counters::throttle::ThrottleCounters;
use slotring_counters::uring::UringCounters;

/// Registered threads per loaded instance (`SLOTRING_MAX_THREADS`).
pub const MAX_THREADS: u32 = 1024;
/// exp2 histogram buckets (`SLOTRING_HIST_SLOTS`).
pub const HIST_SLOTS: usize = 40;
/// Named entries in the `throttle` map (`SLOTRING_MAX_THROTTLERS`).
pub const MAX_THROTTLERS: u32 = 64;
/// Bytes in a throttler name, NUL padded (`SLOTRING_NAME_LEN`).
pub const NAME_LEN: usize = 32;
/// Lease states (`SLOTRING_LEASE_STATES`), indexed by `LeaseState as usize`.
pub const LEASE_STATES: usize = 3;

/// One field of a mirrored struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldLayout {
    /// The field name, equal to the C member name.
    pub name: &'static str,
    /// Byte offset in the struct.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// A value stored as a fixed number of little-endian `u64` words.
pub trait Words: Sized {
    /// How many words the value takes.
    const WORDS: usize;
    /// Decode from exactly `WORDS` words.
    fn read(words: &[u64]) -> Self;
    /// Append the encoding to `out`.
    fn write(&self, out: &mut Vec<u64>);
}

impl Words for u64 {
    const WORDS: usize = 1;
    fn read(words: &[u64]) -> Self {
        words[0]
    }
    fn write(&self, out: &mut Vec<u64>) {
        out.push(*self);
    }
}

impl<const N: usize> Words for [u64; N] {
    const WORDS: usize = N;
    fn read(words: &[u64]) -> Self {
        std::array::from_fn(|i| words[i])
    }
    fn write(&self, out: &mut Vec<u64>) {
        out.extend_from_slice(self);
    }
}

impl Words for [u8; NAME_LEN] {
    const WORDS: usize = NAME_LEN / 8;
    fn read(words: &[u64]) -> Self {
        let mut b = [0u8; NAME_LEN];
        for (i, w) in words[..Self::WORDS].iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }
    fn write(&self, out: &mut Vec<u64>) {
        for chunk in self.chunks_exact(8) {
            out.push(u64::from_le_bytes(chunk.try_into().expect("8-byte chunk")));
        }
    }
}

/// A struct shared with the BPF object.
pub trait AbiStruct: Sized {
    /// The C struct name in `slotring.h`.
    const C_NAME: &'static str;
    /// Size in `u64` words.
    const WORDS: usize;
    /// Field offsets and sizes, in declaration order.
    fn layout() -> Vec<FieldLayout>;
    /// Decode from exactly `WORDS` words.
    ///
    /// # Panics
    ///
    /// If `words` is shorter than `WORDS`. For words from outside this
    /// process (a pinned map) use [`AbiStruct::try_from_words`].
    fn from_words(words: &[u64]) -> Self;
    /// Decode words from outside this process: a typed error naming the
    /// struct and both sizes unless there are exactly `WORDS` of them.
    fn try_from_words(words: &[u64]) -> Result<Self, crate::BpfError> {
        if words.len() != Self::WORDS {
            return Err(crate::BpfError::ValueSize {
                c_name: Self::C_NAME,
                expected: Self::WORDS,
                got: words.len(),
            });
        }
        Ok(Self::from_words(words))
    }
    /// Encode into `WORDS` words.
    fn to_words(&self) -> Vec<u64>;
}

macro_rules! abi_struct {
    (
        $(#[$meta:meta])*
        $name:ident = $cname:literal {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl AbiStruct for $name {
            const C_NAME: &'static str = $cname;
            const WORDS: usize = size_of::<$name>() / 8;
            fn layout() -> Vec<FieldLayout> {
                vec![$(FieldLayout {
                    name: stringify!($field),
                    offset: offset_of!($name, $field),
                    size: size_of::<$ty>(),
                }),*]
            }
            #[allow(unused_assignments, reason = "the last field's cursor update is unused")]
            fn from_words(words: &[u64]) -> Self {
                let mut at = 0;
                $(
                    let $field = <$ty as Words>::read(&words[at..at + <$ty as Words>::WORDS]);
                    at += <$ty as Words>::WORDS;
                )*
                Self { $($field),* }
            }
            fn to_words(&self) -> Vec<u64> {
                let mut out = Vec::with_capacity(Self::WORDS);
                $( Words::write(&self.$field, &mut out); )*
                out
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::from_words(&[0; size_of::<$name>() / 8])
            }
        }
    };
}

abi_struct! {
    /// `struct lease_clock`: a lease state, when it began, and the wall time
    /// spent in each state before that.
    LeaseClock = "lease_clock" {
        /// Current `LeaseState` as a number.
        state: u64,
        /// CLOCK_MONOTONIC ns of the last state change.
        since_ns: u64,
        /// Wall ns spent in each state up to `since_ns`.
        state_ns: [u64; LEASE_STATES],
        /// Transitions into `Parked` up to `since_ns` (in the clock, so
        /// that BPF reads the count with the state it belongs to).
        parks: u64,
    }
}

impl Words for [LeaseClock; 2] {
    const WORDS: usize = 2 * LeaseClock::WORDS;
    fn read(words: &[u64]) -> Self {
        let w = LeaseClock::WORDS;
        [
            LeaseClock::from_words(&words[..w]),
            LeaseClock::from_words(&words[w..2 * w]),
        ]
    }
    fn write(&self, out: &mut Vec<u64>) {
        for c in self {
            out.extend(c.to_words());
        }
    }
}

abi_struct! {
    /// `struct lease_slot`: one thread's lease state, written only by that
    /// thread; the clock is double-buffered (`clk[active]` is current).
    LeaseSlot = "lease_slot" {
        /// Owner thread id, stored last at registration (0 = free or exited).
        tid: u64,
        /// Which `clk` is current (0 or 1).
        active: u64,
        /// The two clock buffers.
        clk: [LeaseClock; 2],
    }
}

impl LeaseSlot {
    /// The current clock.
    pub fn clock(&self) -> &LeaseClock {
        &self.clk[(self.active & 1) as usize]
    }

    /// Transitions into `Parked`.
    pub fn parks(&self) -> u64 {
        self.clock().parks
    }

    /// Transitions out of `Parked`.
    pub fn unparks(&self) -> u64 {
        let c = self.clock();
        c.parks.saturating_sub(u64::from(c.state == PARKED))
    }
}

const PARKED: u64 = slotring_throttle::LeaseState::Parked as u64;

impl LeaseClock {
    /// Wall ns spent in `state` up to `now` (CLOCK_MONOTONIC).
    pub fn time_in(&self, state: usize, now: u64) -> u64 {
        let open = if self.state == state as u64 {
            now.saturating_sub(self.since_ns)
        } else {
            0
        };
        self.state_ns[state] + open
    }
}

abi_struct! {
    /// `struct thread_acct`: what the kernel saw of one registered thread.
    ThreadAcct = "thread_acct" {
        /// Thread id.
        tid: u64,
        /// On-CPU ns per lease state (exact, from `se.sum_exec_runtime`).
        on_cpu_ns: [u64; LEASE_STATES],
        /// Run-queue ns per lease state (exact, from `sched_info.run_delay`).
        runq_ns: [u64; LEASE_STATES],
        /// Switch-outs per lease state.
        switches: [u64; LEASE_STATES],
        /// Switch-outs while still runnable, per lease state.
        preemptions: [u64; LEASE_STATES],
        /// Wake-ups per lease state.
        wakeups: [u64; LEASE_STATES],
        /// Switch-ins after a wake-up while parked.
        unpark_wakeups: u64,
        /// Sum of wake-up to switch-in latency of those, ns.
        unpark_lat_ns: u64,
        /// Largest such latency, ns.
        unpark_lat_max_ns: u64,
        /// Arrivals on a CPU (`sched_info.pcount`) that BPF never saw.
        missed_switch_in: u64,
        /// Switch-outs BPF never saw.
        missed_switch_out: u64,
        /// Switch events handled.
        events: u64,
        /// Parked episodes that ended (one per park, once unparked).
        episodes: u64,
        /// Of those, episodes that ended inside one on-CPU interval with
        /// another: their segments are that interval's even share.
        episodes_split: u64,
        /// Real sleeps (`!preempt && prev_state != 0`) while parked.
        parked_sleeps: u64,
        /// On-CPU ns before the first real sleep, summed over episodes.
        pre_sleep_ns: u64,
        /// On-CPU ns between real sleeps, summed over episodes.
        between_sleeps_ns: u64,
        /// On-CPU ns after the last wake-up, summed over episodes.
        post_wake_ns: u64,
        /// The largest pre-sleep segment of one episode, ns.
        pre_sleep_max_ns: u64,
        /// The largest between-sleeps total of one episode, ns.
        between_sleeps_max_ns: u64,
        /// The largest post-wake segment of one episode, ns.
        post_wake_max_ns: u64,
        /// Episodes with a segment over its bound ([`EpisodeRule`]).
        hot_episodes: u64,
        /// Episodes over the pre-sleep bound.
        hot_pre_sleep: u64,
        /// Episodes over the between-sleeps bound.
        hot_between_sleeps: u64,
        /// Episodes over the post-wake bound.
        hot_post_wake: u64,
        /// On-CPU ns of hot episodes above their bounds, summed.
        hot_excess_ns: u64,
        /// BPF private: `se.sum_exec_runtime` at the last switch-out.
        snap_exec_ns: u64,
        /// BPF private: `sched_info.run_delay` at the last switch-out.
        snap_run_delay: u64,
        /// BPF private: `sched_info.pcount` at the last switch-out.
        snap_pcount: u64,
        /// BPF private: switch-ins seen since the last switch-out.
        ins_since_out: u64,
        /// BPF private: 1 while on CPU.
        on_cpu: u64,
        /// BPF private: lease state at switch-in.
        in_state: u64,
        /// BPF private: time of switch-in.
        in_ts: u64,
        /// BPF private: lease clock at switch-in.
        in_state_ns: [u64; LEASE_STATES],
        /// BPF private: time of the last wake-up while parked.
        wake_ts: u64,
        /// BPF private: the lease clock's park count accounted so far.
        ep_seen_parks: u64,
        /// BPF private: the open episode's phase (none, pre-sleep, slept).
        ep_phase: u64,
        /// BPF private: the lease clock's parked total at the open park.
        ep_parked_base_ns: u64,
        /// BPF private: on-CPU ns of the current segment.
        ep_seg_ns: u64,
        /// BPF private: the open episode's pre-sleep segment, once it slept.
        ep_pre_sleep_ns: u64,
        /// BPF private: the open episode's between-sleeps total so far.
        ep_between_ns: u64,
        /// BPF private: the open episode's real sleeps so far.
        ep_sleeps: u64,
        /// BPF private: switch-out time of a sleep in progress (0 = none).
        ep_sleep_ts: u64,
        /// BPF private: the open episode's last sleep, ns.
        ep_last_sleep_ns: u64,
        /// BPF private: baseline taken.
        initialized: u64,
    }
}

abi_struct! {
    /// `struct episode_rule`: the bounds BPF judges each parked episode by
    /// (the single entry of the `episode_rule` map; fractions in parts per
    /// million). An episode is hot when its pre-sleep segment exceeds
    /// `pre_sleep_ns`, its between-sleeps total exceeds `between_ppm` of its
    /// wait, or its post-wake segment exceeds `post_wake_ns` plus
    /// `post_wake_ppm` of the sleep before it.
    EpisodeRule = "episode_rule" {
        /// Bound on the on-CPU time from the park to the first real sleep.
        pre_sleep_ns: u64,
        /// Bound on the on-CPU time between sleeps, ppm of the wait.
        between_ppm: u64,
        /// Base bound on the on-CPU time from the last wake-up to the unpark.
        post_wake_ns: u64,
        /// Plus this many ppm of the length of the sleep before it.
        post_wake_ppm: u64,
    }
}

/// `SLOTRING_HOT_PRE_SLEEP`: a hot episode's pre-sleep segment was over.
pub const HOT_PRE_SLEEP: u64 = 1;
/// `SLOTRING_HOT_BETWEEN_SLEEPS`: its between-sleeps total was over.
pub const HOT_BETWEEN_SLEEPS: u64 = 2;
/// `SLOTRING_HOT_POST_WAKE`: its post-wake segment was over.
pub const HOT_POST_WAKE: u64 = 4;
/// Hot episodes logged per thread (`SLOTRING_HOT_KEEP`).
pub const HOT_KEEP: usize = 4;

abi_struct! {
    /// `struct hot_episode`: one parked episode that was over a bound.
    HotEpisode = "hot_episode" {
        /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) of the switch event that
        /// ended it.
        end_ns: u64,
        /// Wall ns parked.
        wait_ns: u64,
        /// On-CPU ns before the first real sleep.
        pre_sleep_ns: u64,
        /// On-CPU ns between sleeps.
        between_sleeps_ns: u64,
        /// On-CPU ns after the last wake-up.
        post_wake_ns: u64,
        /// Real sleeps.
        sleeps: u64,
        /// The sleep before the post-wake segment, ns.
        last_sleep_ns: u64,
        /// Which bounds it was over ([`HOT_PRE_SLEEP`], …).
        hot: u64,
        /// Episodes this entry stands for (more than one: several ended in
        /// one on-CPU interval and share its figures evenly).
        count: u64,
    }
}

impl Words for [HotEpisode; HOT_KEEP] {
    const WORDS: usize = HOT_KEEP * HotEpisode::WORDS;
    fn read(words: &[u64]) -> Self {
        let w = HotEpisode::WORDS;
        std::array::from_fn(|i| HotEpisode::from_words(&words[i * w..(i + 1) * w]))
    }
    fn write(&self, out: &mut Vec<u64>) {
        for e in self {
            out.extend(e.to_words());
        }
    }
}

abi_struct! {
    /// `struct hot_log`: one thread's last [`HOT_KEEP`] hot episodes (an
    /// entry of the `hot_episodes` map, at the thread's index).
    HotLog = "hot_log" {
        /// Hot episodes logged; entry `(logged - 1) % HOT_KEEP` is the newest.
        logged: u64,
        /// The ring.
        ep: [HotEpisode; HOT_KEEP],
    }
}

impl HotLog {
    /// The logged episodes, oldest first.
    pub fn recent(&self) -> Vec<HotEpisode> {
        let n = (self.logged as usize).min(HOT_KEEP);
        (self.logged as usize - n..self.logged as usize)
            .map(|i| self.ep[i % HOT_KEEP])
            .collect()
    }
}

abi_struct! {
    /// `struct hist`: an exp2 histogram; bucket 0 counts zeros, bucket
    /// `i >= 1` counts values in `[2^(i-1), 2^i)` ns (the last takes the rest).
    Hist = "hist" {
        /// The buckets.
        slots: [u64; HIST_SLOTS],
    }
}

abi_struct! {
    /// `struct owner`: the process that loaded and pinned an instance (the
    /// single entry of the `owner` map), so that a reader can tell a live
    /// instance from the stale pins of a killed one.
    Owner = "owner" {
        /// Process id (tgid) of the loader.
        pid: u64,
        /// Its start time: field 22 of `/proc/<pid>/stat`, clock ticks
        /// after boot (distinguishes a reused pid).
        start_time: u64,
    }
}

/// `struct throttle_stats`: one named throttler's counters, a NUL-padded
/// name followed by the fields of [`ThrottleCounters`].
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleStats {
    /// NUL-padded name.
    pub name: [u8; NAME_LEN],
    /// The counters, in the field order of their `counter_set!` list.
    pub counters: ThrottleCounters,
}

impl ThrottleStats {
    /// A named entry from a throttler's counter snapshot. Names longer than
    /// 31 bytes are cut (the C side keeps a terminating NUL).
    pub fn new(name: &str, counters: &ThrottleCounters) -> Self {
        let mut n = [0u8; NAME_LEN];
        let bytes = name.as_bytes();
        let len = bytes.len().min(NAME_LEN - 1);
        n[..len].copy_from_slice(&bytes[..len]);
        Self {
            name: n,
            counters: *counters,
        }
    }

    /// The name up to the first NUL.
    pub fn name_str(&self) -> String {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

impl AbiStruct for ThrottleStats {
    const C_NAME: &'static str = "throttle_stats";
    const WORDS: usize = size_of::<Self>() / 8;
    fn layout() -> Vec<FieldLayout> {
        let mut out = vec![FieldLayout {
            name: "name",
            offset: offset_of!(Self, name),
            size: NAME_LEN,
        }];
        let base = offset_of!(Self, counters);
        out.extend(
            counter_layout::<ThrottleCounters>()
                .into_iter()
                .map(|f| FieldLayout {
                    offset: base + f.offset,
                    ..f
                }),
        );
        out
    }
    fn from_words(words: &[u64]) -> Self {
        let n = <[u8; NAME_LEN] as Words>::WORDS;
        Self {
            name: <[u8; NAME_LEN] as Words>::read(&words[..n]),
            counters: counters_from_words(&words[n..Self::WORDS]),
        }
    }
    fn to_words(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(Self::WORDS);
        self.name.write(&mut out);
        out.extend(self.counters.to_vec());
        out
    }
}

/// The layout of a counter set, from its field list.
fn counter_layout<T: CounterSet>() -> Vec<FieldLayout> {
    T::FIELDS
        .iter()
        .map(|f| FieldLayout {
            name: f.name,
            offset: f.offset,
            size: size_of::<u64>(),
        })
        .collect()
}

/// A counter set from exactly its number of words.
fn counters_from_words<T: CounterSet>(words: &[u64]) -> T {
    T::from_slice(words).unwrap_or_else(|| {
        panic!(
            "a counter set of {} fields from {} words",
            T::FIELDS.len(),
            words.len()
        )
    })
}

/// The counter sets that are a whole BPF struct: their `counter_set!` field
/// list is the ABI mirror of the C struct named here.
macro_rules! counter_abi {
    ($($set:ty = $cname:literal;)+) => {$(
        impl AbiStruct for $set {
            const C_NAME: &'static str = $cname;
            const WORDS: usize = <$set as CounterSet>::FIELDS.len();
            fn layout() -> Vec<FieldLayout> {
                counter_layout::<$set>()
            }
            fn from_words(words: &[u64]) -> Self {
                counters_from_words(&words[..Self::WORDS])
            }
            fn to_words(&self) -> Vec<u64> {
                self.to_vec()
            }
        }
    )+};
}

counter_abi! {
    SlotsCounters = "slots_stats";
    UringCounters = "uring_stats";
}

impl Hist {
    /// Total count over all buckets.
    pub fn total(&self) -> u64 {
        self.slots.iter().sum()
    }

    /// `(low_ns, high_ns_exclusive, count)` of every non-empty bucket.
    pub fn buckets(&self) -> Vec<(u64, u64, u64)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| match i {
                0 => (0, 1, *c),
                _ => (
                    1u64 << (i - 1),
                    1u64.checked_shl(i as u32).unwrap_or(u64::MAX),
                    *c,
                ),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        let mut t = ThrottleStats::new("disk-read", &Default::default());
        t.counters.amount = 7;
        t.counters.max_speed = u64::MAX;
        assert_eq!(ThrottleStats::from_words(&t.to_words()), t);
        assert_eq!(t.name_str(), "disk-read");
        let long = ThrottleStats::new(&"x".repeat(40), &Default::default());
        assert_eq!(long.name_str().len(), NAME_LEN - 1);
        assert_eq!(ThreadAcct::WORDS * 8, size_of::<ThreadAcct>());
        assert_eq!(LeaseSlot::layout().last().map(|f| f.offset), Some(16));
    }

    #[test]
    fn throttle_stats_is_a_name_then_the_counter_fields() {
        let l = ThrottleStats::layout();
        assert_eq!(l.len(), 1 + ThrottleCounters::LEN);
        assert_eq!((l[0].name, l[0].offset, l[0].size), ("name", 0, NAME_LEN));
        for (f, c) in l[1..].iter().zip(ThrottleCounters::FIELDS) {
            assert_eq!((f.name, f.offset, f.size), (c.name, NAME_LEN + c.offset, 8));
        }
        assert_eq!(ThrottleStats::WORDS * 8, size_of::<ThrottleStats>());
        assert_eq!(l[1].name, "amount");
    }

    #[test]
    fn try_from_words_refuses_a_wrong_size_naming_it() {
        let words = SlotsCounters {
            parks: 9,
            ..SlotsCounters::default()
        }
        .to_words();
        assert_eq!(SlotsCounters::try_from_words(&words).unwrap().parks, 9);
        let short = SlotsCounters::try_from_words(&words[..3]).unwrap_err();
        // The expected size is the field list's length: adding a counter
        // touches no test.
        let expected = SlotsCounters::LEN;
        assert!(
            matches!(
                short,
                crate::BpfError::ValueSize {
                    c_name: "slots_stats",
                    expected: e,
                    got: 3
                } if e == expected
            ),
            "{short:?}"
        );
        assert_eq!(
            short.to_string(),
            format!("a `struct slots_stats` is {expected} words, got 3")
        );
        let mut long = words.clone();
        long.push(0);
        assert!(SlotsCounters::try_from_words(&long).is_err());
    }

    #[test]
    fn hist_buckets() {
        let mut h = Hist::default();
        h.slots[0] = 2;
        h.slots[3] = 1;
        assert_eq!(h.buckets(), vec![(0, 1, 2), (4, 8, 1)]);
        assert_eq!(h.total(), 3);
    }
}

#[cfg(test)]
mod round_trip {
    use proptest::prelude::*;

    use super::*;

    fn check<T: AbiStruct + PartialEq + std::fmt::Debug>(words: &[u64]) {
        let v = T::from_words(&words[..T::WORDS]);
        assert_eq!(v.to_words(), &words[..T::WORDS]);
        assert_eq!(T::from_words(&v.to_words()), v);
        let last = T::layout().last().map(|f| f.offset + f.size);
        assert_eq!(
            last,
            Some(T::WORDS * 8),
            "{} has no tail padding",
            T::C_NAME
        );
    }

    proptest! {
        #[test]
        fn every_mirror_round_trips(words in proptest::collection::vec(any::<u64>(), 64)) {
            check::<LeaseSlot>(&words);
            check::<LeaseClock>(&words);
            check::<ThreadAcct>(&words);
            check::<EpisodeRule>(&words);
            check::<HotEpisode>(&words);
            check::<HotLog>(&words);
            check::<Hist>(&words);
            check::<Owner>(&words);
            check::<ThrottleStats>(&words);
            check::<SlotsCounters>(&words);
            check::<UringCounters>(&words);
        }
    }
}
