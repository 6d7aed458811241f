//! [`Tenant`]: a party sharing throttlers by weight, and the calling
//! thread's current tenant.
//!
//! # Scope
//!
//! The fair order (see the `fair_queue` module for the model) applies
//! wherever a tenant is current on the calling thread ([`Tenant::enter`], or
//! the tenant of the thread's current CPU lease):
//! [`crate::Throttle::throttle`] takes its turn, then waits as it does
//! without a tenant; and [`crate::Throttle::reserve`] (the io_uring and
//! pread engines) takes its turn, then books, so the delay it returns — the
//! deadline of the ring's timeout SQE — is the fair one. Taking a turn waits
//! (CPU lease parked) only while other requests queue or the bookings run
//! more than `τ` ahead; alone, a tenant never waits for a turn and every wait
//! is the first-come one. An async runtime thread must not have a tenant
//! current (its reservation could block the runtime).
//!
//! # Bad input
//!
//! A weight of 0 or above [`MAX_WEIGHT`] is a typed error. A tenant handle may
//! be used on any number of throttlers: each keeps its own tags for it (by
//! the handle's process-unique id), so it is fair separately at each.
//! Dropping a handle does not cancel requests already waiting (they hold a
//! clone).

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};

use crate::error::ThrottleError;
use crate::sync::AtomicU64;

/// The largest tenant weight.
pub const MAX_WEIGHT: u32 = 1 << 16;

static NEXT_ID: StdAtomicU64 = StdAtomicU64::new(1);

/// A tenant's shared state. Aligned to 128 bytes (two cache lines, the
/// unit the adjacent-line prefetcher moves) so that two tenants' counters,
/// each bumped by its own threads on every charge, never share a line with
/// each other or with a neighbouring allocation (a gate's hints, a bucket).
#[derive(Debug)]
#[repr(align(128))]
struct TenantInner {
    /// Tokens charged as this tenant, summed over throttler levels.
    charged: AtomicU64,
    /// Waits booked for it, ns, summed over throttler levels.
    wait_ns: AtomicU64,
    id: u64,
    weight: u32,
    name: String,
    /// The cells of the scopes alive now ([`Tenant::enter`]); a reader sums
    /// them with `charged`/`wait_ns` under this lock, and a scope that ends
    /// moves its cell's values into those under it.
    cells: std::sync::Mutex<Vec<Arc<ScopeCell>>>,
}

/// What one thread charged as a tenant while it had the tenant entered:
/// written only by that thread, with a plain load and store (no locked
/// instruction: ~10 ns less per charge here), read by anyone.
///
/// Memory ordering: statistics, all `Relaxed`. The single writer makes
/// load-then-store exact; the scope's end runs on the writer's own thread,
/// so it reads every value it wrote, and it moves them under the tenant's
/// lock, which readers also take: a reader counts each byte exactly once.
#[derive(Debug)]
#[repr(align(128))]
struct ScopeCell {
    charged: AtomicU64,
    wait_ns: AtomicU64,
}

impl ScopeCell {
    fn new() -> Self {
        Self {
            charged: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
        }
    }

    /// Add as the only writer (saturating).
    #[inline]
    fn add_owned(&self, amount: u64, wait_ns: u64) {
        let c = self.charged.load(StdOrdering::Relaxed);
        self.charged
            .store(c.saturating_add(amount), StdOrdering::Relaxed);
        if wait_ns > 0 {
            let w = self.wait_ns.load(StdOrdering::Relaxed);
            self.wait_ns
                .store(w.saturating_add(wait_ns), StdOrdering::Relaxed);
        }
    }
}

/// A party sharing throttlers by weight (a query, a user, a workload).
/// Cheap to clone; clones are the same tenant.
#[derive(Debug, Clone)]
pub struct Tenant(Arc<TenantInner>);

impl Tenant {
    /// A tenant of `weight` (1..=[`MAX_WEIGHT`]).
    pub fn new(name: impl Into<String>, weight: u32) -> Result<Self, ThrottleError> {
        let name = name.into();
        if weight == 0 || weight > MAX_WEIGHT {
            return Err(ThrottleError::TenantWeight {
                name,
                weight,
                max: MAX_WEIGHT,
            });
        }
        Ok(Self(Arc::new(TenantInner {
            id: NEXT_ID.fetch_add(1, StdOrdering::Relaxed),
            weight,
            name,
            charged: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            cells: std::sync::Mutex::new(Vec::new()),
        })))
    }

    /// Tokens charged as this tenant, summed over every throttler level that
    /// charged it (for a single-level disk throttler: its disk bytes).
    /// Saturates at `u64::MAX`.
    pub fn charged(&self) -> u64 {
        self.sum(|c| &c.charged, &self.0.charged)
    }

    /// Time its requests waited (booked), ns, summed like
    /// [`Tenant::charged`].
    pub fn wait_ns(&self) -> u64 {
        self.sum(|c| &c.wait_ns, &self.0.wait_ns)
    }

    /// `base` plus the live scopes' cells, under the lock a scope's end
    /// takes to move its cell into `base`.
    fn sum(&self, field: impl Fn(&ScopeCell) -> &AtomicU64, base: &AtomicU64) -> u64 {
        let cells = self.cells();
        cells.iter().fold(base.load(StdOrdering::Relaxed), |t, c| {
            t.saturating_add(field(c).load(StdOrdering::Relaxed))
        })
    }

    fn cells(&self) -> std::sync::MutexGuard<'_, Vec<Arc<ScopeCell>>> {
        // Nothing panics while the lock is held.
        self.0
            .cells
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Count one charge on the shared statistics (relaxed, saturating,
    /// never fails): the path for a tenant that is not entered on the
    /// calling thread (a lease's, an async request's).
    #[inline]
    pub(crate) fn record(&self, amount: u64, wait_ns: u64) {
        crate::count::add_saturating(&self.0.charged, amount);
        crate::count::add_saturating(&self.0.wait_ns, wait_ns);
    }

    /// Count one charge as the calling thread's current tenant: into the
    /// entered scope's own cell, else on the lease tenant's shared
    /// statistics; nothing without a current tenant.
    #[inline]
    pub(crate) fn record_current(amount: u64, wait_ns: u64) {
        let done = CURRENT
            .try_with(|c| match c.borrow().as_ref() {
                Some(e) => {
                    e.cell.add_owned(amount, wait_ns);
                    true
                }
                None => false,
            })
            .unwrap_or(false);
        if !done && let Some(t) = crate::park::lease_tenant() {
            t.record(amount, wait_ns);
        }
    }

    /// The process-unique id of this tenant.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The weight.
    pub fn weight(&self) -> u32 {
        self.0.weight
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Make this the calling thread's current tenant until the guard drops:
    /// every throttler the thread waits on then charges it as this tenant.
    /// Guards nest; dropping one restores the tenant that was current before.
    /// A tenant entered here takes precedence over the tenant of the
    /// thread's current CPU lease (see [`crate::LeaseHook::current_tenant`]).
    pub fn enter(&self) -> TenantScope {
        let cell = Arc::new(ScopeCell::new());
        self.cells().push(cell.clone());
        let prev = CURRENT.with(|c| {
            c.borrow_mut().replace(Entered {
                tenant: self.clone(),
                cell: cell.clone(),
            })
        });
        TenantScope {
            prev,
            tenant: self.clone(),
            cell,
            _not_send: PhantomData,
        }
    }

    /// The calling thread's current tenant, if any: the one entered with
    /// [`Tenant::enter`], else the one its current CPU lease carries.
    pub fn current() -> Option<Tenant> {
        CURRENT
            .try_with(|c| c.borrow().as_ref().map(|e| e.tenant.clone()))
            .ok()
            .flatten()
            .or_else(crate::park::lease_tenant)
    }

    /// Whether the calling thread has a current tenant (no clone).
    pub(crate) fn has_current() -> bool {
        CURRENT.try_with(|c| c.borrow().is_some()).unwrap_or(false)
            || crate::park::has_lease_tenant()
    }
}

/// The tenant entered on a thread, with the scope's own statistics cell.
#[derive(Debug)]
struct Entered {
    tenant: Tenant,
    cell: Arc<ScopeCell>,
}

thread_local! {
    static CURRENT: RefCell<Option<Entered>> = const { RefCell::new(None) };
}

/// While alive, a tenant is current on this thread; see [`Tenant::enter`].
#[must_use = "the tenant is current only while this guard lives"]
#[derive(Debug)]
pub struct TenantScope {
    prev: Option<Entered>,
    tenant: Tenant,
    cell: Arc<ScopeCell>,
    _not_send: PhantomData<*const ()>,
}

impl Drop for TenantScope {
    fn drop(&mut self) {
        let prev = self.prev.take();
        let _ = CURRENT.try_with(|c| *c.borrow_mut() = prev);
        // Move the cell's values to the shared statistics and forget it,
        // under the lock readers take (see `ScopeCell`).
        let mut cells = self.tenant.cells();
        crate::count::add_saturating(
            &self.tenant.0.charged,
            self.cell.charged.load(StdOrdering::Relaxed),
        );
        crate::count::add_saturating(
            &self.tenant.0.wait_ns,
            self.cell.wait_ns.load(StdOrdering::Relaxed),
        );
        cells.retain(|c| !Arc::ptr_eq(c, &self.cell));
    }
}
