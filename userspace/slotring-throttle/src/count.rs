//! The lifetime count of charged tokens (ClickHouse's `count`).
//!
//! A count is a statistic unless a lifetime limit reads it. With a limit
//! it is one exact `AtomicU64`, so each charge sees the total it made. Without
//! one it is striped: each thread owns a cache-line-padded stripe that only
//! it writes, with a plain load and store (no locked instruction), and a
//! reader sums them. Measured with two threads on one no-wait throttler
//! (`cargo xtask bench fair`, `fair_throttle_ns_2t`): a locked add costs
//! ~10 ns here even on a line the core owns, and one on the bucket's line
//! moved that contended line a second time per charge.
//!
//! A stripe's owner is the thread holding its index in a process-wide
//! registry of thread indices ([`thread_index`]): an index belongs to one
//! live thread at a time and returns to the registry when that thread
//! exits. Threads beyond the stripes (or in their thread-local teardown)
//! share one more stripe with a locked add.
//!
//! Saturating arithmetic as before: a stripe stops at `u64::MAX` and so does
//! the sum, which then reads "at least 2⁶⁴ − 1".
//!
//! Memory ordering: every stripe is an independent statistic that orders
//! nothing else, so all adds and loads are `Relaxed`. A stripe's single
//! writer makes its load-then-store exact; an index changes hands through
//! the registry's mutex, whose release and acquire order the last owner's
//! stores before the next owner's first load. A sum is not an atomic cut
//! across stripes, but it never decreases for one reader: each stripe only
//! grows, and a later relaxed load of the same atomic never returns an older
//! value (read-read coherence).

use crate::sync::{AtomicU64, Ordering};

/// One stripe, alone in two cache lines (the adjacent-line prefetcher moves
/// pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Stripe(AtomicU64);

/// The count: exact when a limit reads it, striped when only statistics do.
#[derive(Debug)]
pub(crate) enum Count {
    /// One counter; `add` returns the new total.
    Exact(AtomicU64),
    /// One stripe per thread index below its length − 1, each written only
    /// by the thread holding that index; the last is shared by the rest.
    Striped(Box<[Stripe]>),
}

/// The largest number of stripes.
const MAX_STRIPES: usize = 64;

/// Owned stripes for this machine: twice the CPUs the process may use, at
/// most [`MAX_STRIPES`] (threads take the smallest free index, so the first
/// that many threads alive at once each own one).
fn stripes() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    (2 * cpus).min(MAX_STRIPES)
}

/// The process-wide registry of thread indices: the smallest free index
/// is handed to a thread at its first charge and returned when it exits.
#[cfg(not(loom))]
mod registry {
    use std::cell::Cell;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Free {
        /// Indices returned by exited threads, smallest first.
        returned: BinaryHeap<Reverse<usize>>,
        /// The next never-used index.
        next: usize,
    }

    static FREE: Mutex<Free> = Mutex::new(Free {
        returned: BinaryHeap::new(),
        next: 0,
    });

    fn free() -> std::sync::MutexGuard<'static, Free> {
        // Nothing in the critical sections can panic half-way.
        FREE.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A thread's index, returned to the registry when the thread exits.
    struct Held(Cell<Option<usize>>);

    impl Drop for Held {
        fn drop(&mut self) {
            if let Some(i) = self.0.take() {
                free().returned.push(Reverse(i));
            }
        }
    }

    thread_local! {
        static MINE: Held = const { Held(Cell::new(None)) };
    }

    /// The calling thread's index, `None` during its thread-local teardown.
    pub(crate) fn thread_index() -> Option<usize> {
        MINE.try_with(|m| match m.0.get() {
            Some(i) => i,
            None => {
                let mut f = free();
                let i = match f.returned.pop() {
                    Some(Reverse(i)) => i,
                    None => {
                        f.next += 1;
                        f.next - 1
                    }
                };
                drop(f);
                m.0.set(Some(i));
                i
            }
        })
        .ok()
    }
}

#[cfg(not(loom))]
pub(crate) use registry::thread_index;

/// Under loom every count is exact; no thread owns anything.
#[cfg(loom)]
pub(crate) fn thread_index() -> Option<usize> {
    None
}

/// Add `amount` saturating; the new value. The one definition of a
/// saturating statistic, also used for a tenant's (`tenant.rs`).
///
/// A zero amount writes nothing. The common case is one `fetch_add`: while the value is below 2⁶³ and the
/// amount below 2³², the adds in flight at any instant (at most one per
/// thread, fewer than 2²² threads) sum to less than 2⁵⁴, so no reader can
/// ever observe a wrapped value. Anything else takes a CAS loop with
/// `saturating_add`, which never publishes a wrapped value.
pub(crate) fn add_saturating(a: &AtomicU64, amount: u64) -> u64 {
    const FAST_AMOUNT: u64 = 1 << 32;
    const FAST_COUNT: u64 = 1 << 63;
    if amount == 0 {
        return a.load(Ordering::Relaxed);
    }
    if amount < FAST_AMOUNT && a.load(Ordering::Relaxed) < FAST_COUNT {
        return a.fetch_add(amount, Ordering::Relaxed) + amount;
    }
    let mut cur = a.load(Ordering::Relaxed);
    loop {
        let next = cur.saturating_add(amount);
        if next == cur {
            // Saturated already (or a zero amount): nothing to publish.
            return cur;
        }
        match a.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(actual) => cur = actual,
        }
    }
}

impl Count {
    /// An exact count when `exact` (a limit reads it), else striped.
    pub(crate) fn new(exact: bool) -> Self {
        if exact || cfg!(loom) {
            Self::Exact(AtomicU64::new(0))
        } else {
            Self::Striped((0..=stripes()).map(|_| Stripe::default()).collect())
        }
    }

    /// Add `amount`; the new total when the count is exact.
    #[inline]
    pub(crate) fn add(&self, amount: u64) -> Option<u64> {
        match self {
            Self::Exact(a) => Some(add_saturating(a, amount)),
            Self::Striped(s) => {
                let shared = s.len() - 1;
                match thread_index() {
                    Some(i) if i < shared => {
                        // This thread is the stripe's only writer.
                        let a = &s[i].0;
                        let v = a.load(Ordering::Relaxed);
                        a.store(v.saturating_add(amount), Ordering::Relaxed);
                    }
                    _ => {
                        add_saturating(&s[shared].0, amount);
                    }
                }
                None
            }
        }
    }

    /// The total (saturating).
    pub(crate) fn load(&self) -> u64 {
        match self {
            Self::Exact(a) => a.load(Ordering::Relaxed),
            Self::Striped(s) => s
                .iter()
                .fold(0u64, |t, x| t.saturating_add(x.0.load(Ordering::Relaxed))),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn striped_sums_every_thread_and_saturates() {
        let c = std::sync::Arc::new(Count::new(false));
        assert!(matches!(*c, Count::Striped(_)));
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        assert_eq!(c.add(3), None, "a striped count has no total to return");
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(c.load(), 8 * 1000 * 3);
        assert_eq!(
            c.load(),
            8 * 1000 * 3,
            "exited threads' stripes still count"
        );
        c.add(u64::MAX);
        assert_eq!(c.load(), u64::MAX, "the sum saturates");
        c.add(5);
        assert_eq!(c.load(), u64::MAX);
    }

    #[test]
    fn more_threads_than_stripes_lose_nothing() {
        // Many more threads alive at once than owned stripes: the rest
        // share the last one with a locked add, and indices of exited
        // threads are reused by the next ones.
        let c = std::sync::Arc::new(Count::new(false));
        let n = 4 * MAX_STRIPES;
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
        let hs: Vec<_> = (0..n)
            .map(|_| {
                let (c, barrier) = (c.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    for _ in 0..100 {
                        c.add(7);
                    }
                    let mine = thread_index();
                    // Every thread holds its index until all have one.
                    barrier.wait();
                    mine
                })
            })
            .collect();
        let mut seen: Vec<usize> = hs.into_iter().filter_map(|h| h.join().unwrap()).collect();
        assert_eq!(c.load(), n as u64 * 100 * 7);
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), n, "threads alive at once never share an index");
        let again = std::thread::spawn(thread_index).join().unwrap().unwrap();
        assert!(again < n, "an exited thread's index is reused ({again})");
    }

    #[test]
    fn exact_returns_the_total_and_saturates() {
        let c = Count::new(true);
        assert_eq!(c.add(5), Some(5));
        assert_eq!(c.add(u64::MAX - 10), Some(u64::MAX - 5));
        assert_eq!(c.add(1 << 40), Some(u64::MAX));
        assert_eq!(c.load(), u64::MAX);
    }
}
