//! The CPU-lease seam: how a blocking wait parks the caller's CPU slot, and
//! how lease state changes are observed.
//!
//! This crate knows nothing of slots. The slots crate installs a
//! [`LeaseHook`] once per process; a blocking wait then parks the calling
//! thread's lease for the duration of the sleep (ClickHouse's
//! `CPULeaseParkGuard` around `sleepForNanoseconds`).

use std::sync::OnceLock;

use crate::tenant::Tenant;

/// Parks and unparks *the calling thread's* CPU lease. Both calls never block.
pub trait LeaseHook: Send + Sync + 'static {
    /// Park the calling thread's lease, if it holds one. Returns `true` if it
    /// parked; then [`LeaseHook::unpark_current`] is called exactly once.
    fn park_current(&self) -> bool;
    /// Take the lease back after a successful park (may borrow a slot).
    fn unpark_current(&self);
    /// The tenant of the calling thread's current lease, if it has one
    /// (a query's slots carry the query's tenant). Never blocks.
    fn current_tenant(&self) -> Option<Tenant> {
        None
    }
    /// Whether [`LeaseHook::current_tenant`] would return a tenant (no clone).
    fn has_current_tenant(&self) -> bool {
        false
    }
}

static HOOK: OnceLock<&'static dyn LeaseHook> = OnceLock::new();

/// Install the process-wide lease hook. Returns `false` (and changes nothing)
/// if a hook was already installed.
pub fn install_lease_hook(hook: &'static dyn LeaseHook) -> bool {
    HOOK.set(hook).is_ok()
}

/// The tenant of the calling thread's current lease, through the hook.
pub(crate) fn lease_tenant() -> Option<Tenant> {
    HOOK.get().and_then(|h| h.current_tenant())
}

/// Whether the calling thread's current lease carries a tenant.
pub(crate) fn has_lease_tenant() -> bool {
    HOOK.get().is_some_and(|h| h.has_current_tenant())
}

/// Whether a lease hook is installed.
pub fn lease_hook_installed() -> bool {
    HOOK.get().is_some()
}

/// While alive, the calling thread's lease is parked (if it had one).
#[must_use = "the lease is unparked when this guard drops"]
#[derive(Debug)]
pub struct LeaseParked {
    parked: bool,
}

impl LeaseParked {
    /// Whether this guard actually parked a lease.
    pub fn parked(&self) -> bool {
        self.parked
    }
}

/// Park the calling thread's CPU lease until the returned guard drops.
pub fn park_current_lease() -> LeaseParked {
    let parked = HOOK.get().is_some_and(|h| h.park_current());
    LeaseParked { parked }
}

impl Drop for LeaseParked {
    fn drop(&mut self) {
        if self.parked
            && let Some(h) = HOOK.get()
        {
            h.unpark_current();
        }
    }
}

/// The lease state of a thread, as later layers mirror it (e.g. into a BPF
/// map that the kernel reads at every context switch).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// The thread holds no CPU slot.
    NotHolding = 0,
    /// The thread holds a slot and counts against the budget.
    Running = 1,
    /// The thread holds a slot but has parked it for a non-CPU wait.
    Parked = 2,
}

/// Told about every lease state change, *on the thread whose state changes*.
///
/// Implementations must not block and should cost a few nanoseconds (the
/// BPF mirror does one atomic store into an mmapped map).
pub trait LeaseObserver: Send + Sync + 'static {
    /// The calling thread's lease is now in `state`.
    fn on_lease_state(&self, state: LeaseState);
}

static OBSERVER: OnceLock<&'static dyn LeaseObserver> = OnceLock::new();

/// Install the process-wide lease observer. Returns `false` (and changes
/// nothing) if one was already installed.
pub fn install_lease_observer(observer: &'static dyn LeaseObserver) -> bool {
    OBSERVER.set(observer).is_ok()
}

/// Report the calling thread's new lease state to the observer, if any.
/// Called by the lease implementation (the slots crate).
#[inline]
pub fn notify_lease_state(state: LeaseState) {
    if let Some(o) = OBSERVER.get() {
        o.on_lease_state(state);
    }
}
