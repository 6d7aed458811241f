//! [`InFlightHold`]: what a request keeps from its turn until its IO's last
//! completion.

use crate::workload::Permit;

/// The in-flight places a throttle gave one request at its turn (a
/// [`Workload`](crate::Workload)'s `max_io_requests` / `max_bytes_inflight`
/// on its path), given back when the hold drops. An IO engine keeps it
/// with the operation until the operation's last completion, also when the
/// caller stops waiting: an operation in flight is the ring's until then,
/// and so are its places. Empty for throttles that limit no in-flight
/// count (a [`Throttler`](crate::Throttler)).
#[derive(Debug, Default)]
#[must_use = "the in-flight places are given back when the hold drops"]
pub struct InFlightHold(Option<Permit<'static>>);

impl InFlightHold {
    /// A hold of nothing.
    pub fn none() -> Self {
        Self(None)
    }

    /// Whether it holds any place.
    pub fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|p| !p.holds_places())
    }

    /// The IO completed: give the places back (as dropping it does).
    pub fn release(self) {}
}

impl From<Permit<'_>> for InFlightHold {
    fn from(p: Permit<'_>) -> Self {
        Self(Some(p.into_owned()))
    }
}
