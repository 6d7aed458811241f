//! The shared core handle and a held slot's claim on it.
//!
//! [`Shared`] is what a control, its allocations and their slots all point
//! to: the mutex-protected [`Core`] and the statistics that the lock-free
//! `try_acquire` bumps. [`SlotState`] is the accounting half of an acquired
//! slot: whether it counts against the budget and whether it is parked; it
//! parks and unparks through the core and releases the slot when dropped.
//! Both sit below the lease machinery (`lease.rs`) and the slot type
//! (`slot.rs`), which only move a `SlotState` around.

use slotring_throttle::LeaseState;

use crate::core::Core;
use crate::sync::{Arc, AtomicU64, Mutex, MutexGuard, lock};

/// State shared by a control, its allocations and their slots.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) core: Mutex<Core>,
    /// Statistics bumped by lock-free `try_acquire` (`Relaxed`: independent counts).
    pub(crate) slots_acquired: AtomicU64,
    pub(crate) slots_acquired_nc: AtomicU64,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        lock(&self.core)
    }
}

/// The accounting half of an acquired slot.
#[derive(Debug, Default)]
pub(crate) struct SlotState {
    pub(crate) shared: Option<Arc<Shared>>,
    pub(crate) competing: bool,
    pub(crate) parked: bool,
}

impl SlotState {
    pub(crate) fn new(shared: Option<Arc<Shared>>, competing: bool) -> Self {
        Self {
            shared,
            competing,
            parked: false,
        }
    }

    pub(crate) fn park(&mut self) -> bool {
        let Some(shared) = &self.shared else {
            return false;
        };
        if self.parked {
            return false;
        }
        shared.lock().park(self.competing);
        self.parked = true;
        true
    }

    pub(crate) fn unpark(&mut self) {
        let Some(shared) = &self.shared else { return };
        if !self.parked {
            return;
        }
        shared.lock().unpark(self.competing);
        self.parked = false;
    }

    pub(crate) fn lease_state(&self) -> LeaseState {
        if self.parked {
            LeaseState::Parked
        } else {
            LeaseState::Running
        }
    }
}

impl Drop for SlotState {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.lock().release(self.competing, self.parked);
        }
    }
}
