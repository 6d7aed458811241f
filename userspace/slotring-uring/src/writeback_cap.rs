//! The cap on bytes under writeback per block-device throttler, and the
//! bound on catching up after the device held the writers back.
//!
//! # Model
//!
//! A paced write's piece is *under writeback* from the moment its turn
//! comes (its wait in the bucket is over) and it takes room, until the
//! device has completed it (its `SYNC_FILE_RANGE(WAIT_BEFORE | WRITE |
//! WAIT_AFTER)` returned). A piece waiting for its turn holds no room: a
//! booked piece is not on its way to the device yet (on the ring, room is
//! taken at the expiry of the piece's standalone timeout; in the caller's
//! thread, `thread_io::ThreadIo`, after the piece's charge has slept and before
//! its `pwrite`). Every request that charges a
//! rate-limited block-device throttler `T` of rate `r` shares one
//! [`WritebackCap`] of `T`, whatever ring or engine it runs on:
//!
//! * **Cap.** The bytes under writeback of all those requests together stay
//!   `≤ C = Policy::writeback_cap_bytes(r)` (one piece may always go when
//!   none is under writeback, so a piece larger than `C` still progresses).
//!   A piece that does not fit waits, unwritten and holding no room, until a
//!   writeback of `T` completes ([`CapHold::try_acquire`] registers the caller's waker
//!   under the same lock that [`WritebackCap::release`] takes: no lost
//!   wake-up). When the device stalls for `S`, at most `C` bytes complete
//!   together when it recovers.
//! * **Catch-up bound.** The bucket of `T` keeps refilling while the cap
//!   holds the writers (up to its burst); spent at once, that backlog would
//!   reach the device as fast as it completes. So every piece, with its
//!   room taken, also passes a pacer of `T` at `r_c =
//!   Policy::catch_up_rate(r)` (a little above `r`) with no burst: piece `k`
//!   of `T` is scheduled no earlier than piece `k − 1`'s schedule plus
//!   `bytes / r_c`, and starts no earlier than its schedule less
//!   [`PACE_SLACK_NS`]. In steady state the bucket spaces pieces at `r` and
//!   the pacer never delays; after a stall the backlog drains at `r_c`.
//!
//! So a 100 ms window of the device holds at most `C + r_c × (100 ms +
//! slack)` bytes of `T`'s writers (the completions of a stall, then the
//! catch-up), against `r × 100 ms` at the limit: `1 + (r_c − r)/r + C/(r ×
//! 100 ms) + 1 %` in the worst alignment of the window; the bytes over the
//! run are unchanged (the bucket still decides them; the pacer only
//! defers).
//!
//! # Identity and lifetime
//!
//! The throttle crate knows nothing of writeback: a throttler keeps the cap
//! as an opaque typed attachment ([`Throttler::attachment`]), created at its
//! first paced write and dropped with the throttler, so two throttlers never
//! share a cap. A request holds the [`Arc`] of its caps (and its chain holds
//! the throttlers).
//!
//! # Locking
//!
//! One `std::sync::Mutex` per cap, held for a few arithmetic steps (no
//! syscall, no wake-up under it: wakers are woken after it is released);
//! one acquire and one release per 256 KiB piece.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use slotring_throttle::{Clock, ThrottlePtr, Throttler};

use crate::policy::{Policy, WRITEBACK_PIECE};

/// How much earlier than its slot the pacer lets a piece start (1 ms: at
/// 32 MiB/s one piece is due every 7.8 ms and the pacer's slot every
/// 7.6 ms, so the wake-up jitter of the previous piece's turn alone would
/// otherwise cost a timeout now and then).
pub(crate) const PACE_SLACK_NS: u64 = 1_000_000;

/// The shared state of one block-device throttler's writeback.
#[derive(Debug, Default)]
pub(crate) struct WritebackCap {
    state: Mutex<CapState>,
}

#[derive(Debug, Default)]
struct CapState {
    /// Bytes booked and not yet completed by the device.
    in_flight: u64,
    /// The most `in_flight` ever was.
    high_water: u64,
    /// The pacer: the earliest start of the next piece, on the throttler's
    /// clock.
    next_start_ns: u64,
    /// Who waits for room, oldest first (deduplicated with
    /// `Waker::will_wake`).
    waiters: VecDeque<Waker>,
}

impl WritebackCap {
    fn lock(&self) -> MutexGuard<'_, CapState> {
        // A panic under the lock leaves plain numbers behind: still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take `bytes` if they fit under `cap` (or nothing is under
    /// writeback); otherwise register `waker` for the next release.
    fn acquire_or_wait(&self, bytes: u64, cap: u64, waker: &Waker) -> bool {
        let mut s = self.lock();
        if s.in_flight == 0 || s.in_flight.saturating_add(bytes) <= cap {
            s.in_flight += bytes;
            s.high_water = s.high_water.max(s.in_flight);
            return true;
        }
        if !s.waiters.iter().any(|w| w.will_wake(waker)) {
            s.waiters.push_back(waker.clone());
        }
        false
    }

    /// Give back `bytes` and wake the oldest waiters, one per piece of
    /// room given back (every waiter once nothing is under writeback).
    ///
    /// Waking only as many as the room serves keeps eight writers from
    /// all retrying at every release. A woken waiter that no longer wants
    /// the room (its request dropped, or served by an earlier wake) wastes
    /// that wake, but no waiter is stranded: while anything is under
    /// writeback another release follows, and the release that empties the
    /// cap wakes everyone left.
    pub(crate) fn release(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let waiters: Vec<Waker> = {
            let mut s = self.lock();
            debug_assert!(s.in_flight >= bytes, "released more than was held");
            s.in_flight = s.in_flight.saturating_sub(bytes);
            let n = if s.in_flight == 0 {
                s.waiters.len()
            } else {
                usize::try_from(bytes.div_ceil(WRITEBACK_PIECE)).unwrap_or(usize::MAX)
            };
            let n = n.min(s.waiters.len());
            s.waiters.drain(..n).collect()
        };
        for w in waiters {
            w.wake();
        }
    }

    /// The pacer: a piece of `bytes` that the bucket lets start `after_ns`
    /// from `now_ns` is scheduled no earlier than the previous piece's
    /// schedule plus `bytes / rate` (`rate` in bytes/s; 0 = no pacing).
    /// Returns the delay from `now_ns`: `after_ns`, or the schedule's if it
    /// is more than [`PACE_SLACK_NS`] later (a piece whose turn came a
    /// little late in a paced stream does not make the next one wait a
    /// timeout for a few microseconds; the schedule, not the actual start,
    /// sets the next slot, so the slack never accumulates).
    fn pace(&self, now_ns: u64, after_ns: u64, bytes: u64, rate: u64) -> u64 {
        if rate == 0 {
            return after_ns;
        }
        let gap =
            u64::try_from(u128::from(bytes) * 1_000_000_000 / u128::from(rate)).unwrap_or(u64::MAX);
        let mut s = self.lock();
        // Only pieces under writeback can hold the pacer further ahead than
        // one gap: with none but this one, owe at most one gap (a bound that
        // holds whatever state the cap was left in).
        if s.in_flight <= bytes {
            s.next_start_ns = s.next_start_ns.min(now_ns.saturating_add(gap));
        }
        let earliest = now_ns.saturating_add(after_ns);
        let start = earliest.max(s.next_start_ns);
        s.next_start_ns = start.saturating_add(gap);
        if start - earliest <= PACE_SLACK_NS {
            after_ns
        } else {
            start - now_ns
        }
    }

    /// The most bytes that were ever under writeback at once.
    pub(crate) fn high_water(&self) -> u64 {
        self.lock().high_water
    }

    /// Bytes under writeback now.
    pub(crate) fn in_flight(&self) -> u64 {
        self.lock().in_flight
    }
}

/// The cap of throttler `t` (created on first use), kept as the
/// throttler's attachment: it lives exactly as long as the throttler.
pub(crate) fn cap_of(t: &Throttler) -> Arc<WritebackCap> {
    t.attachment::<WritebackCap>()
}

/// One cap a request charges: the throttler's cap with the limits its rate
/// gives, read when the request starts.
#[derive(Debug)]
struct CapUse {
    cap: Arc<WritebackCap>,
    /// The cap in bytes.
    bytes: u64,
    /// The pacer's rate, bytes/s.
    catch_up_rate: u64,
    clock: Arc<dyn Clock>,
}

/// What one request holds of its caps: the bytes of its pieces under
/// writeback, on every cap of its chain. Dropping it gives them back (a
/// request freed or an engine dropped never strands a cap).
#[derive(Debug, Default)]
pub(crate) struct CapHold {
    caps: Vec<CapUse>,
    held: u64,
}

impl CapHold {
    /// The caps of every rate-limited block-device throttler in `throttle`
    /// (none: no cap, e.g. with `Policy::writeback_cap` off).
    pub(crate) fn for_chain(policy: Policy, throttle: Option<&ThrottlePtr>) -> Self {
        let mut caps = Vec::new();
        if let Some(t) = throttle {
            t.visit(&mut |th| {
                let rate = th.max_speed();
                if !th.limits_block_device_bandwidth() || rate == 0 {
                    return;
                }
                if let Some(bytes) = policy.writeback_cap_bytes(rate) {
                    caps.push(CapUse {
                        cap: cap_of(th),
                        bytes,
                        catch_up_rate: policy.catch_up_rate(rate),
                        clock: th.clock().clone(),
                    });
                }
            });
        }
        Self { caps, held: 0 }
    }

    /// Whether any cap applies.
    pub(crate) fn is_capped(&self) -> bool {
        !self.caps.is_empty()
    }

    /// Take `bytes` on every cap, or none of them: on the first that has no
    /// room, give back what was taken and register `waker` there (woken at
    /// its next release).
    pub(crate) fn try_acquire(&mut self, bytes: u64, waker: &Waker) -> bool {
        for (i, c) in self.caps.iter().enumerate() {
            if !c.cap.acquire_or_wait(bytes, c.bytes, waker) {
                for taken in &self.caps[..i] {
                    taken.cap.release(bytes);
                }
                return false;
            }
        }
        self.held += bytes;
        true
    }

    /// A piece's writeback completed: give back `bytes` (at most what is
    /// held).
    pub(crate) fn release(&mut self, bytes: u64) {
        let n = bytes.min(self.held);
        self.held -= n;
        for c in &self.caps {
            c.cap.release(n);
        }
    }

    /// Give back everything held.
    pub(crate) fn release_all(&mut self) {
        self.release(self.held);
    }

    /// Bytes held.
    #[cfg(test)]
    pub(crate) fn held(&self) -> u64 {
        self.held
    }

    /// The delay of a piece of `bytes` the bucket lets start `after_ns` from
    /// now, with every cap's catch-up pacer applied.
    pub(crate) fn pace(&self, after_ns: u64, bytes: u64) -> u64 {
        self.caps.iter().fold(after_ns, |d, c| {
            c.cap.pace(c.clock.now_ns(), d, bytes, c.catch_up_rate)
        })
    }
}

impl Drop for CapHold {
    fn drop(&mut self) {
        self.release_all();
    }
}

/// The most bytes ever under writeback at once for `t` (the shared cap of
/// paced writes charging that block-device throttler), `None` if no paced
/// write has charged it.
pub fn writeback_high_water(t: &Throttler) -> Option<u64> {
    t.attachment_if_any::<WritebackCap>()
        .map(|c| c.high_water())
}

/// Bytes under writeback now for `t` (see [`writeback_high_water`]).
pub fn writeback_in_flight(t: &Throttler) -> Option<u64> {
    t.attachment_if_any::<WritebackCap>().map(|c| c.in_flight())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count::default());
        (c.clone(), Waker::from(c))
    }

    #[test]
    fn the_cap_admits_up_to_its_bytes_and_wakes_waiters_on_release() {
        let cap = WritebackCap::default();
        let (count, w) = waker();
        assert!(cap.acquire_or_wait(256, 512, &w));
        assert!(cap.acquire_or_wait(256, 512, &w));
        assert!(
            !cap.acquire_or_wait(256, 512, &w),
            "a third piece has no room"
        );
        assert!(!cap.acquire_or_wait(256, 512, &w), "registered once");
        assert_eq!(cap.lock().waiters.len(), 1);
        let (count2, w2) = waker();
        let (count3, w3) = waker();
        assert!(!cap.acquire_or_wait(256, 512, &w2));
        assert!(!cap.acquire_or_wait(256, 512, &w3));
        // One piece of room wakes the oldest waiter only.
        cap.release(256);
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        assert_eq!(count2.0.load(Ordering::Relaxed), 0);
        // The woken one went away without taking it: the next release
        // wakes the next, and an empty cap wakes everyone left.
        cap.release(256);
        assert_eq!(count2.0.load(Ordering::Relaxed), 1);
        assert_eq!(count3.0.load(Ordering::Relaxed), 1, "the cap is empty");
        assert!(cap.acquire_or_wait(256, 512, &w));
        assert!(cap.acquire_or_wait(256, 512, &w));
        assert_eq!((cap.in_flight(), cap.high_water()), (512, 512));
        cap.release(512);
        // A piece larger than the cap goes when nothing is under writeback.
        assert!(cap.acquire_or_wait(1024, 512, &w));
    }

    #[test]
    fn the_pacer_defers_a_backlog_to_its_rate_and_never_delays_a_paced_stream() {
        let cap = WritebackCap::default();
        // 1000 bytes/s: a 10-byte piece every 10 ms.
        let rate = 1000;
        let ms = 1_000_000;
        // Held by the cap for a while, the bucket lets three pieces go at
        // once (delay 0): the pacer spaces them out.
        cap.lock().in_flight = 30;
        let now = 5_000 * ms;
        assert_eq!(cap.pace(now, 0, 10, rate), 0);
        assert_eq!(cap.pace(now, 0, 10, rate), 10 * ms);
        assert_eq!(cap.pace(now, 0, 10, rate), 20 * ms);
        // A piece the bucket itself delays past the pacer keeps its delay.
        assert_eq!(cap.pace(now, 100 * ms, 10, rate), 100 * ms);
        // Spaced at the rate by the bucket, the pacer never adds anything.
        let later = now + 200 * ms;
        for k in 0..5 {
            assert_eq!(cap.pace(later + k * 10 * ms, 0, 10, rate), 0);
        }
    }

    #[test]
    fn an_idle_cap_owes_at_most_one_gap() {
        let cap = WritebackCap::default();
        let ms = 1_000_000;
        // A state far ahead of the clock, with nothing under writeback.
        cap.lock().next_start_ns = u64::MAX / 2;
        assert_eq!(cap.pace(1_000 * ms, 0, 10, 1000), 10 * ms);
    }

    #[test]
    fn the_pacer_forgives_jitter_within_its_slack_and_never_lets_it_add_up() {
        let cap = WritebackCap::default();
        cap.lock().in_flight = 100;
        let ms = 1_000_000;
        // 1000 bytes/s, 10-byte pieces: a slot every 10 ms from t0.
        let t0 = 1_000 * ms;
        assert_eq!(cap.pace(t0, 0, 10, 1000), 0);
        // Each turn comes 0.9 ms before its slot: within the slack, no
        // timeout...
        for k in 1..=3 {
            assert_eq!(cap.pace(t0 + k * 10 * ms - 900_000, 0, 10, 1000), 0);
        }
        // ... and the schedule kept its slots: a turn 1.1 ms before the
        // next one waits for it.
        assert_eq!(cap.pace(t0 + 40 * ms - 1_100_000, 0, 10, 1000), 1_100_000);
        // The bucket's own delay is never shortened by the slack.
        assert_eq!(cap.pace(t0 + 50 * ms, 500_000, 10, 1000), 500_000);
    }

    #[test]
    fn a_hold_takes_all_caps_or_none_and_gives_back_on_drop() {
        let a = Arc::new(WritebackCap::default());
        let b = Arc::new(WritebackCap::default());
        let clock: Arc<dyn Clock> = Arc::new(slotring_throttle::MonotonicClock::new());
        let use_of = |cap: &Arc<WritebackCap>, bytes| CapUse {
            cap: cap.clone(),
            bytes,
            catch_up_rate: 0,
            clock: clock.clone(),
        };
        let (_, w) = waker();
        let mut h = CapHold {
            caps: vec![use_of(&a, 1000), use_of(&b, 300)],
            held: 0,
        };
        assert!(h.try_acquire(200, &w));
        assert!(!h.try_acquire(200, &w), "b has no room");
        assert_eq!((a.in_flight(), b.in_flight(), h.held()), (200, 200, 200));
        h.release(150);
        assert_eq!((a.in_flight(), b.in_flight(), h.held()), (50, 50, 50));
        drop(h);
        assert_eq!((a.in_flight(), b.in_flight()), (0, 0));
    }
}
