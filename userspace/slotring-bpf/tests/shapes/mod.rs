//! Parked waits of a known shape, for the kernel tests and the `verdict`
//! bench (`benches/verdict.rs` includes this file): a thread parks its lease,
//! sleeps on an io_uring timeout and spins a chosen share of each wait before
//! the sleep, after the wake or between ten short sleeps.
//!
//! The set-up is honest: the ring is created and its first submission made
//! (which sets up the thread's io_uring task context, a one-time cost) while
//! the lease is running, so a parked episode holds only the wait. Spins are
//! measured in the thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`), so a
//! spinner that is preempted still burns the share it was given.

#![allow(dead_code, reason = "each includer uses part of it")]

use std::time::Duration;

use slotring_throttle::{LeaseState, notify_lease_state};

/// Where a wait's spin goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// Spin, then sleep the rest.
    BeforeSleep,
    /// Sleep, then spin the rest.
    AfterWake,
    /// Ten sleeps sharing the wait, the spin shared by the nine gaps.
    BetweenSleeps,
}

impl Position {
    /// Every position.
    pub const ALL: [Position; 3] = [
        Position::BeforeSleep,
        Position::AfterWake,
        Position::BetweenSleeps,
    ];

    /// A short name for tables and keys.
    pub fn name(self) -> &'static str {
        match self {
            Position::BeforeSleep => "before",
            Position::AfterWake => "after",
            Position::BetweenSleeps => "between",
        }
    }
}

/// Sleeps of a [`Position::BetweenSleeps`] wait.
pub const POLL_SLEEPS: u32 = 10;

/// One parked wait: `wait` long, `spin_pct` percent of it spun at
/// `position`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// The wait's length (the sleeps plus the spin).
    pub wait: Duration,
    /// Percent of the wait spent spinning.
    pub spin_pct: f64,
    /// Where.
    pub position: Position,
}

impl Shape {
    /// The spin's CPU time.
    pub fn spin(&self) -> Duration {
        self.wait.mul_f64(self.spin_pct / 100.0)
    }
}

/// The calling thread's CPU time, ns.
pub fn thread_cpu_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .expect("CLOCK_THREAD_CPUTIME_ID");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// Spin until this thread has used `d` more CPU time.
pub fn spin_cpu(d: Duration) {
    let end = thread_cpu_ns() + d.as_nanos() as u64;
    while thread_cpu_ns() < end {
        std::hint::spin_loop();
    }
}

/// The calling thread's ring for its sleeps, set up while it runs.
pub struct Waiter {
    ring: io_uring::IoUring,
}

impl Waiter {
    /// A ring, and its first submission (a NOP), made now: call it with the
    /// lease running.
    pub fn new() -> Self {
        let mut ring = io_uring::IoUring::new(4).expect("io_uring");
        let nop = io_uring::opcode::Nop::new().build().user_data(1);
        // SAFETY: a NOP points at no memory.
        unsafe { ring.submission().push(&nop).expect("sq has room") };
        ring.submit_and_wait(1).expect("io_uring_enter");
        ring.completion().for_each(drop);
        Self { ring }
    }

    /// Sleep `d` in `io_uring_enter` on an `IORING_OP_TIMEOUT`.
    pub fn sleep(&mut self, d: Duration) {
        let ts = io_uring::types::Timespec::from(d);
        let sqe = io_uring::opcode::Timeout::new(&ts).build().user_data(7);
        // SAFETY: `ts` outlives the submission: its completion is reaped
        // before this returns.
        unsafe { self.ring.submission().push(&sqe).expect("sq has room") };
        self.ring.submit_and_wait(1).expect("io_uring_enter");
        let cqe = self.ring.completion().next().expect("one completion");
        assert_eq!(cqe.result(), -libc::ETIME, "the timeout expired");
    }

    /// One parked episode of `shape` (the lease is running before and
    /// after).
    pub fn episode(&mut self, shape: &Shape) {
        let spin = shape.spin();
        let rest = shape.wait.saturating_sub(spin);
        notify_lease_state(LeaseState::Parked);
        match shape.position {
            Position::BeforeSleep => {
                spin_cpu(spin);
                self.sleep(rest);
            }
            Position::AfterWake => {
                self.sleep(rest);
                spin_cpu(spin);
            }
            Position::BetweenSleeps => {
                let each = rest / POLL_SLEEPS;
                let gap = spin / (POLL_SLEEPS - 1);
                for i in 0..POLL_SLEEPS {
                    if i > 0 {
                        spin_cpu(gap);
                    }
                    self.sleep(each);
                }
            }
        }
        notify_lease_state(LeaseState::Running);
    }
}

/// One episode's segments as the probes accounted them (ns).
#[derive(Debug, Clone, Copy, Default)]
pub struct Segments {
    /// On-CPU before the first sleep.
    pub pre: u64,
    /// On-CPU between sleeps.
    pub between: u64,
    /// On-CPU after the last wake-up.
    pub post: u64,
}

/// Like [`run_episodes`], but after each episode the thread sleeps once
/// with the lease running (the switch-out that ends the episode for the
/// probes) and reads its own accounting through `read`: each episode's
/// segments, exactly.
pub fn run_recorded(
    shape: &Shape,
    episodes: u32,
    read: impl Fn(u32) -> slotring_bpf::ThreadAcct,
) -> Vec<Segments> {
    notify_lease_state(LeaseState::Running);
    let me = nix::unistd::gettid().as_raw() as u32;
    let mut w = Waiter::new();
    let mut out = Vec::with_capacity(episodes as usize);
    let mut last = read(me);
    for _ in 0..episodes {
        w.episode(shape);
        w.sleep(Duration::from_micros(20));
        let a = read(me);
        out.push(Segments {
            pre: a.pre_sleep_ns - last.pre_sleep_ns,
            between: a.between_sleeps_ns - last.between_sleeps_ns,
            post: a.post_wake_ns - last.post_wake_ns,
        });
        last = a;
    }
    notify_lease_state(LeaseState::NotHolding);
    out
}

/// `episodes` parked waits of `shape` on the calling thread, its ring set
/// up first with the lease running; returns the thread id.
pub fn run_episodes(shape: &Shape, episodes: u32) -> u32 {
    notify_lease_state(LeaseState::Running);
    let mut w = Waiter::new();
    for _ in 0..episodes {
        w.episode(shape);
    }
    notify_lease_state(LeaseState::NotHolding);
    nix::unistd::gettid().as_raw() as u32
}

/// One parked wait of each shape of `sequence`, in order, on the calling
/// thread (its ring set up first with the lease running); returns the
/// thread id. A thread whose waits are not all alike: one that spins
/// through only some of them.
pub fn run_sequence(sequence: &[Shape]) -> u32 {
    notify_lease_state(LeaseState::Running);
    let mut w = Waiter::new();
    for shape in sequence {
        w.episode(shape);
    }
    notify_lease_state(LeaseState::NotHolding);
    nix::unistd::gettid().as_raw() as u32
}
