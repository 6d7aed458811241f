//! The loom facade: the same code runs on `std` atomics and, under
//! `RUSTFLAGS="--cfg loom"`, on loom's model-checked ones.

#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use portable_atomic::AtomicU128;

/// Loom has no 128-bit atomic; model one as a cell whose every operation is a
/// single indivisible step, which is exactly what `cmpxchg16b` gives the real
/// build. Loom still explores every interleaving of those steps.
#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct AtomicU128(loom::sync::Mutex<u128>);

#[cfg(loom)]
impl AtomicU128 {
    pub(crate) fn new(v: u128) -> Self {
        Self(loom::sync::Mutex::new(v))
    }
    pub(crate) fn load(&self, _order: Ordering) -> u128 {
        *self.0.lock().expect("loom mutex")
    }
    pub(crate) fn compare_exchange_weak(
        &self,
        current: u128,
        new: u128,
        _success: Ordering,
        _failure: Ordering,
    ) -> Result<u128, u128> {
        let mut v = self.0.lock().expect("loom mutex");
        if *v == current {
            *v = new;
            Ok(current)
        } else {
            Err(*v)
        }
    }
}

/// Lock a mutex, treating poisoning as harmless: every critical section in
/// this crate leaves its data consistent before anything can panic.
#[cfg(not(loom))]
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Loom's twin of [`lock`].
#[cfg(loom)]
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> loom::sync::MutexGuard<'_, T> {
    m.lock().expect("loom mutex")
}

/// Wait for another thread to finish a short critical step (a rate change
/// between its two stores). Spins briefly, then yields the CPU so a preempted
/// writer can run; under loom it always yields so the model can progress.
#[cfg(not(loom))]
pub(crate) fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Loom's twin of [`backoff`].
#[cfg(loom)]
pub(crate) fn backoff(_spins: &mut u32) {
    loom::thread::yield_now();
}
