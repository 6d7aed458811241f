//! CPU leases: every acquired slot can be parked during a non-CPU wait.
//!
//! **Beyond ClickHouse** (where only workload-scheduler leases park), every
//! acquired [`crate::ConcurrencyControl`] slot is a lease:
//!
//! * [`SlotLease::park`] never blocks. A parked competing slot stops counting
//!   against `max_concurrency` and its capacity is offered to waiters at once.
//! * [`SlotLease::unpark`] never blocks. It takes the slot back even when the
//!   budget is full; that overshoot is a *borrow* (`borrowed` gauge,
//!   `unpark_borrows` counter), repaid by withholding the next released
//!   capacity (see the invariants in the `scheduler_state` module docs:
//!   `cur − borrowed ≤ max` for the fair schedulers, `borrowed` ≤ overshoot,
//!   so it is 0 whenever everything is released and no capacity is lost).
//! * Non-competing slots (fair schedulers' `min`) park too (the thread's state
//!   is tracked and `parks`/`parked` count them) but move no capacity.
//! * [`crate::GrantedAllocation`] slots count nothing and never park.
//!
//! Park and unpark take the state mutex: a park must hand its capacity to a
//! waiter atomically with uncounting it, and an unpark must decide between
//! "fits" and "borrows" against the same count. Uncontended, that is one
//! futex-free lock/unlock each (see `park_unpark_ns` in the `slots` bench).
//!
//! # The thread's current lease
//!
//! [`crate::AcquiredSlot::make_current`] makes a slot the calling thread's
//! current lease until the returned [`crate::CurrentLease`] guard drops
//! (guards nest, like a stack; they may also drop out of order: each takes
//! back only its own state, leaving a tombstone if a later lease is still
//! current). While
//! current, the lease's state lives in a thread-local, so a leaked guard
//! (`mem::forget`) cannot double-count: its lease stays on the stack (and
//! current until a later one is made current) and the slot is released when
//! the thread exits. [`CpuLeaseParkGuard`] parks the current lease for a
//! scope, nesting-safely: only the outermost guard parks, and it unparks only
//! if its park succeeded. The `slotring-throttle` lease hook goes through the
//! same guard, so a blocking throttler wait parks the caller's lease.
//!
//! Every state change of the current lease is reported, on the thread
//! concerned, through [`slotring_throttle::notify_lease_state`]: `Running`
//! when a slot becomes current or is unparked, `Parked` on a successful park,
//! `NotHolding` when the current lease is cleared (or the state of the lease
//! that becomes current again when guards nest).
//!
//! This module holds the [`SlotLease`] trait, the thread-local stack of
//! current leases, [`CpuLeaseParkGuard`] and the `slotring-throttle` hook. It
//! moves `SlotState`s (`control_shared.rs`) and knows nothing of the slot
//! type: the slot and its `CurrentLease` guard (`slot.rs`) push their state
//! here with [`push_current`] and take it back with [`take_current`].

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;

use slotring_throttle::{LeaseHook, LeaseState, notify_lease_state};

use crate::control_shared::SlotState;

/// A CPU lease that a thread can park during a non-CPU wait (ClickHouse's
/// `ISlotLease`).
pub trait SlotLease {
    /// Park the lease. Never waits for capacity (it holds the state mutex for
    /// a few instructions). Returns `true` if it parked; then
    /// [`SlotLease::unpark`] must be called once.
    fn park(&mut self) -> bool;
    /// Take the lease back after a successful park. Never waits for
    /// capacity: borrows a slot if the budget is full. A no-op if not parked.
    fn unpark(&mut self);
}

/// One position of the thread's stack of current leases.
#[derive(Debug)]
struct Entry {
    /// Unique on the thread: tells a reused stack position apart.
    token: u64,
    /// The lease's state; `None` once its [`crate::CurrentLease`] guard dropped
    /// while a later lease was still current (a tombstone, removed when it
    /// reaches the top: the top entry is never a tombstone).
    state: Option<SlotState>,
}

#[cfg(not(loom))]
std::thread_local! {
    /// The stack of current leases; the last is the thread's current lease.
    static LEASES: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    /// The next [`Entry::token`].
    static NEXT_TOKEN: Cell<u64> = const { Cell::new(0) };
    /// Active `CpuLeaseParkGuard` scopes on this thread that found a lease.
    static PARK_DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Guards opened by the `slotring-throttle` hook, closed by its unpark.
    static HOOK_GUARDS: RefCell<Vec<CpuLeaseParkGuard>> = const { RefCell::new(Vec::new()) };
}

// loom's `thread_local!` takes no `const` initialisers; otherwise identical.
#[cfg(loom)]
loom::thread_local! {
    static LEASES: RefCell<Vec<Entry>> = RefCell::new(Vec::new());
    static NEXT_TOKEN: Cell<u64> = Cell::new(0);
    static PARK_DEPTH: Cell<usize> = Cell::new(0);
    static HOOK_GUARDS: RefCell<Vec<CpuLeaseParkGuard>> = RefCell::new(Vec::new());
}

/// The state of the top of a lease stack (never a tombstone).
fn top_state(l: &[Entry]) -> LeaseState {
    l.last()
        .and_then(|e| e.state.as_ref())
        .map_or(LeaseState::NotHolding, SlotState::lease_state)
}

/// The calling thread's current lease state.
pub fn current_lease_state() -> LeaseState {
    LEASES.with(|l| top_state(&l.borrow()))
}

/// Push `state` on the thread's stack of current leases, making it the
/// current lease. Returns its position and token, which the caller's
/// [`crate::CurrentLease`] guard hands back to [`take_current`].
pub(crate) fn push_current(state: SlotState) -> (usize, u64) {
    let token = NEXT_TOKEN.with(|t| {
        let v = t.get();
        t.set(v + 1);
        v
    });
    let index = LEASES.with(|l| {
        let mut l = l.borrow_mut();
        l.push(Entry {
            token,
            state: Some(state),
        });
        l.len() - 1
    });
    (index, token)
}

/// Take back the state that [`push_current`] put at `index` with `token`.
///
/// Returns that state (`None` if the thread's locals are already gone: the
/// state was released with them) and, if it was the current lease, the state
/// of the lease that is current now, to report. If a later lease is still
/// current, the position becomes a tombstone and nothing is to be reported.
pub(crate) fn take_current(index: usize, token: u64) -> (Option<SlotState>, Option<LeaseState>) {
    LEASES
        .try_with(|l| {
            let mut l = l.borrow_mut();
            let Some(e) = l.get_mut(index) else {
                debug_assert!(false, "a live guard's entry is never removed");
                return (None, None);
            };
            debug_assert_eq!(e.token, token, "a live guard's entry is its own");
            if e.token != token {
                return (None, None);
            }
            let mine = e.state.take();
            if index + 1 < l.len() {
                // A later lease is current: leave a tombstone, report nothing.
                return (mine, None);
            }
            // Ours was current: remove it and the tombstones under it.
            while l.last().is_some_and(|e| e.state.is_none()) {
                l.pop();
            }
            (mine, Some(top_state(&l)))
        })
        .unwrap_or((None, None))
}

/// Parks the thread's current lease for a scope (ClickHouse's
/// `CPULeaseParkGuard`). Nesting-safe: only the outermost guard parks, and it
/// unparks on drop only if its park succeeded. Without a current lease it
/// does nothing. `!Send`.
#[must_use = "the lease is unparked when this guard drops"]
#[derive(Debug)]
pub struct CpuLeaseParkGuard {
    active: bool,
    parked: bool,
    /// The lease it found current: its `LEASES` position and token.
    index: usize,
    token: u64,
    _not_send: PhantomData<*const ()>,
}

impl Default for CpuLeaseParkGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuLeaseParkGuard {
    /// Park the current lease if this is the outermost guard.
    pub fn new() -> Self {
        let top = LEASES.with(|l| {
            let l = l.borrow();
            l.len().checked_sub(1).map(|i| (i, l[i].token))
        });
        let Some((index, token)) = top else {
            return Self {
                active: false,
                parked: false,
                index: 0,
                token: 0,
                _not_send: PhantomData,
            };
        };
        let depth = PARK_DEPTH.with(Cell::get);
        let parked = depth == 0
            && LEASES.with(|l| {
                l.borrow_mut()[index]
                    .state
                    .as_mut()
                    .is_some_and(SlotState::park)
            });
        PARK_DEPTH.with(|d| d.set(depth + 1));
        if parked {
            notify_lease_state(LeaseState::Parked);
        }
        Self {
            active: true,
            parked,
            index,
            token,
            _not_send: PhantomData,
        }
    }

    /// Whether this guard parked the lease.
    pub fn parked(&self) -> bool {
        self.parked
    }
}

impl Drop for CpuLeaseParkGuard {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        // `try_with`: a guard kept in `HOOK_GUARDS` may drop while the
        // thread's locals are being destroyed; then there is nothing to undo.
        let _ = PARK_DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
        if self.parked {
            // If the lease stopped being current in between (its guard
            // dropped first), its slot got its state back parked and stays
            // parked: the slot's drop accounts for that. The position may
            // hold another lease by now: the token tells.
            //
            // The thread stopped waiting when it woke: report it running
            // before the unpark's bookkeeping, which is its own CPU work.
            let is_top = LEASES
                .try_with(|l| {
                    let l = l.borrow();
                    matches!(l.get(self.index),
                        Some(Entry { token, state: Some(_) }) if *token == self.token)
                        && self.index + 1 == l.len()
                })
                .unwrap_or(false);
            if is_top {
                notify_lease_state(LeaseState::Running);
            }
            let _ = LEASES.try_with(|l| {
                if let Some(Entry {
                    token,
                    state: Some(s),
                }) = l.borrow_mut().get_mut(self.index)
                    && *token == self.token
                {
                    s.unpark();
                }
            });
        }
    }
}

/// The [`LeaseHook`] this crate installs into `slotring-throttle`.
#[derive(Debug)]
struct ThrottleHook;

impl LeaseHook for ThrottleHook {
    fn park_current(&self) -> bool {
        let g = CpuLeaseParkGuard::new();
        if g.parked() {
            HOOK_GUARDS.with(|h| h.borrow_mut().push(g));
            true
        } else {
            // Dropping it undoes its depth bump; nothing to unpark.
            drop(g);
            false
        }
    }

    fn unpark_current(&self) {
        let g = HOOK_GUARDS.with(|h| h.borrow_mut().pop());
        drop(g);
    }

    fn current_tenant(&self) -> Option<slotring_throttle::Tenant> {
        LEASES
            .try_with(|l| {
                l.borrow()
                    .last()
                    .and_then(|e| e.state.as_ref())
                    .and_then(|s| s.tenant.clone())
            })
            .ok()
            .flatten()
    }

    fn has_current_tenant(&self) -> bool {
        LEASES
            .try_with(|l| {
                l.borrow()
                    .last()
                    .and_then(|e| e.state.as_ref())
                    .is_some_and(|s| s.tenant.is_some())
            })
            .unwrap_or(false)
    }
}

static HOOK: ThrottleHook = ThrottleHook;

/// Install this crate's lease hook into `slotring-throttle` (idempotent; also
/// done by [`crate::ConcurrencyControl::new`] and
/// [`crate::AcquiredSlot::make_current`]). Returns whether our hook is the one
/// installed (false if another hook got there first).
pub fn install_lease_hook() -> bool {
    static OURS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OURS.get_or_init(|| slotring_throttle::install_lease_hook(&HOOK))
}
