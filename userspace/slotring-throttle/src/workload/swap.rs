//! A cell holding an optional `Arc` that readers load without a lock and a
//! writer replaces: `arc_swap::ArcSwapOption` in the real build (a load
//! writes no shared cache line in the common case), and under loom a loom
//! mutex, each operation one indivisible step, as `cmpxchg16b` is modelled
//! in the crate's `sync` facade.

use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct SwapCell<T> {
    #[cfg(not(loom))]
    cell: arc_swap::ArcSwapOption<T>,
    #[cfg(loom)]
    cell: loom::sync::Mutex<Option<Arc<T>>>,
}

impl<T> SwapCell<T> {
    pub(crate) fn new(v: Option<Arc<T>>) -> Self {
        Self {
            #[cfg(not(loom))]
            cell: arc_swap::ArcSwapOption::new(v),
            #[cfg(loom)]
            cell: loom::sync::Mutex::new(v),
        }
    }

    /// Run `f` on the current value.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(Option<&Arc<T>>) -> R) -> R {
        #[cfg(not(loom))]
        {
            let g = self.cell.load();
            f(g.as_ref())
        }
        #[cfg(loom)]
        {
            let v = self.cell.lock().expect("loom mutex").clone();
            f(v.as_ref())
        }
    }

    /// Replace the value (Release: a reader that loads the new value sees
    /// everything written before the store).
    pub(crate) fn store(&self, v: Option<Arc<T>>) {
        #[cfg(not(loom))]
        self.cell.store(v);
        #[cfg(loom)]
        {
            *self.cell.lock().expect("loom mutex") = v;
        }
    }
}
