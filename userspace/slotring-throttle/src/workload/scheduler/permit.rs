//! What a dispatched request holds until its completion ([`Permit`]).

use super::*;

/// What a permit gives back when it drops.
#[derive(Debug)]
pub(super) enum Hold<'a> {
    /// No in-flight place was taken.
    Nothing,
    /// Taken on the lock-free path, by a caller holding the handle.
    Borrowed {
        leaf: &'a LeafInner,
        places: Places,
        cost: u64,
    },
    /// Taken for a request that queued (or that owns its permit).
    Owned {
        workload: Workload,
        places: Places,
        cost: u64,
    },
}

/// A dispatched request: it may start after [`Permit::delay`] (its booking
/// on the caps; an engine waits it in a timeout SQE) and holds its in-flight
/// places until it drops (the completion). A permit from
/// [`Workload::try_acquire`]'s lock-free path borrows the handle (no
/// reference count moves); [`Permit::into_owned`] detaches it.
#[must_use = "the in-flight places are given back when the permit drops"]
#[derive(Debug)]
pub struct Permit<'a> {
    pub(super) delay_ns: u64,
    pub(super) waited: bool,
    pub(super) hold: Hold<'a>,
}

impl Permit<'_> {
    /// How long from the call that returned it until the request may start.
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns)
    }

    /// [`Permit::delay`] in ns.
    pub fn delay_ns(&self) -> u64 {
        self.delay_ns
    }

    /// Whether the request queued for its turn.
    pub fn waited(&self) -> bool {
        self.waited
    }

    /// Whether it holds in-flight places (some node of its path limits them).
    pub fn holds_places(&self) -> bool {
        !matches!(self.hold, Hold::Nothing)
    }

    /// The request completed: give its in-flight places back (as dropping
    /// it does).
    pub fn complete(self) {}

    /// The same permit, owning what it needs to give its places back.
    pub fn into_owned(mut self) -> Permit<'static> {
        let hold = match std::mem::replace(&mut self.hold, Hold::Nothing) {
            Hold::Nothing => Hold::Nothing,
            Hold::Borrowed { leaf, places, cost } => Hold::Owned {
                workload: Workload {
                    inner: Arc::new(LeafInner {
                        sched: leaf.sched.clone(),
                        node: leaf.node.clone(),
                        path: leaf.path.clone(),
                    }),
                },
                places,
                cost,
            },
            Hold::Owned {
                workload,
                places,
                cost,
            } => Hold::Owned {
                workload,
                places,
                cost,
            },
        };
        Permit {
            delay_ns: self.delay_ns,
            waited: self.waited,
            hold,
        }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.hold, Hold::Nothing) {
            Hold::Nothing => {}
            Hold::Borrowed { leaf, places, cost } => leaf.sched.release(&leaf.path, places, cost),
            Hold::Owned {
                workload,
                places,
                cost,
            } => {
                let inner = &workload.inner;
                inner.sched.release(&inner.path, places, cost);
            }
        }
    }
}
