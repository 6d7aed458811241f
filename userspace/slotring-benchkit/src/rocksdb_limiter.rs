//! A port of RocksDB's rate limiter (`GenericRateLimiter`,
//! `util/rate_limiter.cc`, not auto-tuned), the workload benchmark's
//! baseline for priorities with a fairness draw. Written from its
//! algorithm, not its code:
//!
//! * four priorities, `User > High > Mid > Low`, one FIFO queue each;
//! * tokens come in refills of `rate · refill_period` bytes (default
//!   period 100 ms); a request that finds enough available bytes takes them
//!   at once, else it queues;
//! * one queued thread waits for the next refill time (the others wait to be
//!   signalled); at the refill, whoever holds the lock adds a period's bytes
//!   (when fewer than that are left) and grants queue fronts in the
//!   *iteration order*: `User` always first; then `High` goes last with
//!   probability `1/fairness` (default 10), and `Mid` goes after `Low` with
//!   probability `1/fairness`; a front that does not fit is granted the
//!   available bytes in part and stays at the front;
//! * the random draws are RocksDB's `Random` (Park–Miller, `16807·s mod
//!   2³¹−1`), `OneIn(n)` being `next % n == 0`.
//!
//! So a user request can wait up to one refill period behind a burst: the
//! behaviour the workload tree is measured against.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// RocksDB's `Env::IOPriority`, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IoPriority {
    /// `IO_LOW` (compaction).
    Low = 0,
    /// `IO_MID`.
    Mid = 1,
    /// `IO_HIGH` (flush).
    High = 2,
    /// `IO_USER` (user reads and writes).
    User = 3,
}

/// RocksDB's `Random`: the Park–Miller "minimal standard" generator.
#[derive(Debug, Clone)]
pub struct ParkMiller {
    seed: u32,
}

impl ParkMiller {
    const M: u32 = 2_147_483_647;

    /// Seeded as RocksDB seeds it (`s & 0x7fffffff`, never 0 nor 2³¹−1).
    pub fn new(s: u32) -> Self {
        let seed = s & 0x7fff_ffff;
        Self {
            seed: if seed == 0 || seed == Self::M {
                1
            } else {
                seed
            },
        }
    }

    /// The next value, `16807 · seed mod (2³¹ − 1)`.
    pub fn next_value(&mut self) -> u32 {
        let product = u64::from(self.seed) * 16_807;
        let mut s = ((product >> 31) + (product & u64::from(Self::M))) as u32;
        if s > Self::M {
            s -= Self::M;
        }
        self.seed = s;
        s
    }

    /// `true` with probability `1/n`.
    pub fn one_in(&mut self, n: u32) -> bool {
        self.next_value().is_multiple_of(n.max(1))
    }
}

/// The state RocksDB keeps under `request_mutex_`, and its refill: the
/// algorithm without threads, so it can be tested exactly.
#[derive(Debug)]
pub struct RocksDbCore {
    refill_bytes: i64,
    available: i64,
    fairness: u32,
    rnd: ParkMiller,
    /// Per priority: `(request id, bytes still to grant, bytes asked)`.
    queues: [VecDeque<(u64, i64, i64)>; 4],
    /// Bytes granted per priority (`total_bytes_through_`).
    pub through: [i64; 4],
}

impl RocksDbCore {
    /// `rate_bytes_per_sec` refilled every `refill_period`, `fairness`
    /// capped at 100 as RocksDB caps it.
    pub fn new(rate_bytes_per_sec: i64, refill_period: Duration, fairness: u32, seed: u32) -> Self {
        let period_us = refill_period.as_micros() as i64;
        let refill_bytes = if i64::MAX / rate_bytes_per_sec.max(1) < period_us {
            i64::MAX / 1_000_000
        } else {
            rate_bytes_per_sec * period_us / 1_000_000
        };
        Self {
            refill_bytes,
            available: 0,
            fairness: fairness.min(100),
            rnd: ParkMiller::new(seed),
            queues: Default::default(),
            through: [0; 4],
        }
    }

    /// A request that finds enough available bytes takes them at once.
    pub fn try_take(&mut self, bytes: i64, pri: IoPriority) -> bool {
        if self.available >= bytes {
            self.available -= bytes;
            self.through[pri as usize] += bytes;
            return true;
        }
        false
    }

    /// Queue request `id` of `bytes` at `pri`.
    pub fn enqueue(&mut self, id: u64, bytes: i64, pri: IoPriority) {
        self.queues[pri as usize].push_back((id, bytes, bytes));
    }

    /// `GeneratePriorityIterationOrder`: `User` first, then two draws.
    pub fn iteration_order(&mut self) -> [IoPriority; 4] {
        use IoPriority::{High, Low, Mid, User};
        let high_last = self.rnd.one_in(self.fairness);
        let mid_after_low = self.rnd.one_in(self.fairness);
        let (first, second) = if mid_after_low {
            (Low, Mid)
        } else {
            (Mid, Low)
        };
        if high_last {
            [User, first, second, High]
        } else {
            [User, High, first, second]
        }
    }

    /// `RefillBytesAndGrantRequests`: one period's bytes (when fewer are
    /// left), then queue fronts in the iteration order; the ids granted.
    pub fn refill_and_grant(&mut self) -> Vec<u64> {
        if self.available < self.refill_bytes {
            self.available += self.refill_bytes;
        }
        let mut granted = Vec::new();
        for pri in self.iteration_order() {
            let q = &mut self.queues[pri as usize];
            while let Some(front) = q.front_mut() {
                if self.available < front.1 {
                    front.1 -= self.available;
                    self.available = 0;
                    break;
                }
                self.available -= front.1;
                self.through[pri as usize] += front.2;
                granted.push(front.0);
                q.pop_front();
            }
        }
        granted
    }

    /// The front of the highest non-empty queue (the thread signalled to
    /// take the next duty).
    pub fn highest_front(&self) -> Option<u64> {
        self.queues
            .iter()
            .rev()
            .find_map(|q| q.front().map(|f| f.0))
    }

    /// Requests queued.
    pub fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }
}

#[derive(Debug)]
struct State {
    core: RocksDbCore,
    next_refill: Instant,
    refill_period: Duration,
    waiting_for_refill: bool,
    next_id: u64,
    /// Ids granted whose threads have not yet left.
    granted: Vec<u64>,
    /// Each queued request's condition variable.
    cvs: Vec<(u64, Arc<Condvar>)>,
}

/// The limiter's clock: the real monotonic one, or one a test moves.
type Clock = Box<dyn Fn() -> Instant + Send + Sync>;

/// The blocking limiter: `GenericRateLimiter::Request`.
///
/// Duty protocol (RocksDB's): of the queued threads, one waits for the next
/// refill time with a timeout (`waiting_for_refill`); the rest wait to be
/// signalled. Whoever holds the lock past the refill time refills. Every
/// thread that leaves granted first signals the front of the highest
/// non-empty queue, so that some queued thread is awake to take the duty:
/// without it, a timed waiter granted by another thread's refill leaves
/// while every other queued thread waits for a signal that never comes.
pub struct RocksDbRateLimiter {
    state: Mutex<State>,
    now: Clock,
}

impl std::fmt::Debug for RocksDbRateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbRateLimiter")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RocksDbRateLimiter {
    /// RocksDB's defaults: a 100 ms refill period and a fairness of 10.
    pub fn new(rate_bytes_per_sec: i64) -> Self {
        Self::with(rate_bytes_per_sec, Duration::from_millis(100), 10, 0x5eed)
    }

    /// Every parameter, and the draws' seed (RocksDB seeds with the time).
    pub fn with(rate: i64, refill_period: Duration, fairness: u32, seed: u32) -> Self {
        Self::with_clock(rate, refill_period, fairness, seed, Box::new(Instant::now))
    }

    fn with_clock(
        rate: i64,
        refill_period: Duration,
        fairness: u32,
        seed: u32,
        now: Clock,
    ) -> Self {
        Self {
            state: Mutex::new(State {
                core: RocksDbCore::new(rate, refill_period, fairness, seed),
                next_refill: now(),
                refill_period,
                waiting_for_refill: false,
                next_id: 0,
                granted: Vec::new(),
                cvs: Vec::new(),
            }),
            now,
        }
    }

    /// Block until `bytes` at `pri` are granted.
    pub fn request(&self, bytes: i64, pri: IoPriority) {
        let mut st = lock(&self.state);
        if st.core.try_take(bytes, pri) {
            return;
        }
        let id = st.next_id;
        st.next_id += 1;
        st.core.enqueue(id, bytes, pri);
        let cv = Arc::new(Condvar::new());
        st.cvs.push((id, cv.clone()));
        loop {
            let now = (self.now)();
            if st.next_refill > now {
                if st.waiting_for_refill {
                    st = cv.wait(st).unwrap_or_else(PoisonError::into_inner);
                } else {
                    st.waiting_for_refill = true;
                    let until = st.next_refill - now;
                    st = cv
                        .wait_timeout(st, until)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                    st.waiting_for_refill = false;
                }
            } else {
                st.next_refill = now + st.refill_period;
                let granted = st.core.refill_and_grant();
                for g in &granted {
                    if let Some((_, c)) = st.cvs.iter().find(|(i, _)| i == g) {
                        c.notify_one();
                    }
                }
                st.granted.extend(granted);
            }
            if let Some(pos) = st.granted.iter().position(|&g| g == id) {
                st.granted.swap_remove(pos);
                st.cvs.retain(|(i, _)| *i != id);
                // Leaving: someone must be awake for the next duty, whichever
                // branch granted this request (the protocol above).
                if let Some(front) = st.core.highest_front()
                    && let Some((_, c)) = st.cvs.iter().find(|(i, _)| *i == front)
                {
                    c.notify_one();
                }
                return;
            }
        }
    }

    /// Bytes granted per priority, `Low` first.
    pub fn through(&self) -> [i64; 4] {
        lock(&self.state).core.through
    }

    #[cfg(test)]
    fn queued(&self) -> usize {
        lock(&self.state).core.queued()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn park_miller_is_the_minimal_standard() {
        // 16807^k mod (2^31 − 1) from seed 1; the 10,000th value is the
        // published check value 1043618065.
        let mut r = ParkMiller::new(1);
        assert_eq!(r.next_value(), 16_807);
        assert_eq!(r.next_value(), 282_475_249);
        let mut r = ParkMiller::new(1);
        let mut last = 0;
        for _ in 0..10_000 {
            last = r.next_value();
        }
        assert_eq!(last, 1_043_618_065);
        assert_eq!(ParkMiller::new(0).next_value(), 16_807, "seed 0 becomes 1");
    }

    #[test]
    fn user_goes_first_and_the_draw_puts_high_last_one_time_in_ten() {
        let mut c = RocksDbCore::new(1 << 20, Duration::from_millis(100), 10, 42);
        let mut high_last = 0;
        let mut mid_after_low = 0;
        for _ in 0..100_000 {
            let o = c.iteration_order();
            assert_eq!(o[0], IoPriority::User);
            high_last += usize::from(o[3] == IoPriority::High);
            let (m, l) = (
                o.iter().position(|&p| p == IoPriority::Mid),
                o.iter().position(|&p| p == IoPriority::Low),
            );
            mid_after_low += usize::from(m > l);
        }
        assert!((9_000..11_000).contains(&high_last), "{high_last}");
        assert!((9_000..11_000).contains(&mid_after_low), "{mid_after_low}");
    }

    #[test]
    fn a_refill_grants_fronts_in_order_and_a_partial_front_waits() {
        // 10 MiB/s, 100 ms: 1 MiB per refill (1048576 bytes).
        let mut c = RocksDbCore::new(10 << 20, Duration::from_millis(100), 10, 7);
        assert!(!c.try_take(1, IoPriority::User), "starts empty");
        c.enqueue(1, 600_000, IoPriority::Low);
        c.enqueue(2, 600_000, IoPriority::User);
        c.enqueue(3, 300_000, IoPriority::User);
        let g = c.refill_and_grant();
        // User first: 600,000 + 300,000; 148,576 go to Low's front in part.
        assert_eq!(g, vec![2, 3]);
        assert_eq!(c.queued(), 1);
        assert_eq!(c.refill_and_grant(), vec![1], "the rest of it next period");
        assert_eq!(c.through, [600_000, 0, 0, 900_000]);
    }

    /// Runs `f` on a thread; its result, or `None` when it has not
    /// returned within `limit` (the thread is left blocked).
    fn within<T: Send + 'static>(
        limit: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit).ok()
    }

    #[test]
    fn the_blocking_limiter_grants_every_request() {
        let l = Arc::new(RocksDbRateLimiter::with(
            100 << 20,
            Duration::from_millis(1),
            10,
            1,
        ));
        let l2 = l.clone();
        let done = within(Duration::from_secs(60), move || {
            let hs: Vec<_> = [IoPriority::Low, IoPriority::User, IoPriority::High]
                .into_iter()
                .map(|p| {
                    let l = l2.clone();
                    std::thread::spawn(move || {
                        for _ in 0..20 {
                            l.request(64 << 10, p);
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        });
        assert!(done.is_some(), "60 requests not granted in 60 s: {l:?}");
        assert_eq!(l.through(), [20 << 16, 0, 20 << 16, 20 << 16]);
    }

    #[test]
    fn a_timed_waiter_granted_by_another_refill_hands_on_the_duty() {
        // The interleaving that hung CI: A waits for the refill time; D
        // arrives after it, refills, grants A's request but not its own, and
        // waits to be signalled because A holds the duty. A leaves granted;
        // unless it signals D, no thread waits for the next refill time.
        let period = Duration::from_millis(200);
        let base = Instant::now();
        let offset = Arc::new(Mutex::new(Duration::ZERO));
        let o = offset.clone();
        let clock: Clock = Box::new(move || base + *o.lock().unwrap());
        let refill = (10 << 20) / 5; // 10 MiB/s · 200 ms
        let l = Arc::new(RocksDbRateLimiter::with_clock(
            10 << 20,
            period,
            10,
            1,
            clock,
        ));
        // The first refill is due at once; it drains the bucket.
        l.request(refill, IoPriority::Low);
        let a = {
            let l = l.clone();
            std::thread::spawn(move || l.request(refill, IoPriority::Low))
        };
        // A queued, so it waits: its timeout is a real 200 ms, renewed while
        // the test's clock stands still.
        while l.queued() == 0 {
            std::thread::yield_now();
        }
        *offset.lock().unwrap() = period;
        let (tx, d) = std::sync::mpsc::channel();
        {
            let (l, offset) = (l.clone(), offset.clone());
            std::thread::spawn(move || {
                l.request(refill, IoPriority::Low);
                let _ = tx.send(*offset.lock().unwrap());
            });
        }
        a.join().unwrap();
        // A was granted by D's refill, D by none yet: D's turn comes one
        // period later.
        *offset.lock().unwrap() = 2 * period;
        let d = d
            .recv_timeout(Duration::from_secs(5))
            .expect("D left queued with no thread on refill duty");
        assert_eq!(d, 2 * period, "D is granted by the second refill");
        assert_eq!(l.through(), [3 * refill, 0, 0, 0]);
    }
}
