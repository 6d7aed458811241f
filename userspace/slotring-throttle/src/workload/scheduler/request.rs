//! A request's way through the tree without blocking ([`Request`]).

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RequestState {
    /// Not polled yet.
    Idle,
    /// In a leaf queue (or dispatched, its permit in its slot).
    Queued(u64),
    /// Its permit (or error) was returned.
    Done,
}

/// A request's way through the tree without blocking: poll it with
/// [`Request::poll`] until ready. Knows nothing of any runtime: a queued
/// request is woken through its waker when it is dispatched; the one
/// timing the caps' debts is also told [`Request::retry_after`]. Dropping
/// it while queued takes it out of its leaf's queue: it charged nothing,
/// and the request behind it moves up (if it was dispatched but its permit
/// not yet picked up, its charges and in-flight places are given back).
#[derive(Debug)]
pub struct Request {
    /// Its workload, until it is ready: the permit (or nothing) takes it
    /// then, so a request moves its handle on instead of counting one
    /// more reference.
    pub(super) workload: Option<Workload>,
    pub(super) cost: u64,
    pub(super) state: RequestState,
    pub(super) retry_in_ns: Option<u64>,
}

impl Request {
    /// Poll for the permit. Ready with it (or an error); `Pending` while
    /// queued. Do not poll again once ready.
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Permit<'static>, WorkloadError>> {
        self.retry_in_ns = None;
        if self.state == RequestState::Idle {
            let wl = self.workload();
            if let Err(e) = wl.check() {
                self.state = RequestState::Done;
                return Poll::Ready(Err(e));
            }
            match wl.fast(self.cost) {
                Ok(Some(b)) => {
                    self.state = RequestState::Done;
                    let wl = self
                        .workload
                        .take()
                        .expect("a request's handle until ready");
                    return Poll::Ready(Ok(wl.permit(b, b.delay_ns, false)));
                }
                Ok(None) => {}
                Err(e) => {
                    self.state = RequestState::Done;
                    return Poll::Ready(Err(e));
                }
            }
        }
        let wl = self
            .workload
            .as_ref()
            .expect("a workload request polled after it was ready");
        let sched = &wl.inner.sched;
        let (mut st, mut wake, id, now) = match self.state {
            RequestState::Done => panic!("a workload request polled after it was ready"),
            RequestState::Queued(id) => {
                let mut wake = Wakes::default();
                let mut st = lock(&sched.state);
                // Already dispatched (the usual wake-up): nothing to pull,
                // and the clock is read only if a booking's delay remains.
                let now = if matches!(st.slots.get(id), Some(Slot::Queued { .. })) {
                    let now = sched.now();
                    Shared::pump(&mut st, now, &mut wake);
                    Some(now)
                } else {
                    None
                };
                (st, wake, id, now)
            }
            RequestState::Idle => {
                let mut wake = Wakes::default();
                let mut st = lock(&sched.state);
                if let Err(e) = wl.check() {
                    self.state = RequestState::Done;
                    return Poll::Ready(Err(e));
                }
                let leaf = wl.inner.node.index();
                let now = sched.now();
                let id = st.slots.insert(Slot::Queued {
                    leaf,
                    waker: Some(cx.waker().clone()),
                    since: now,
                });
                st.tree.push(leaf, id, self.cost, now);
                Shared::pump(&mut st, now, &mut wake);
                self.state = RequestState::Queued(id);
                (st, wake, id, Some(now))
            }
        };
        let r = settle(
            wl,
            &mut self.state,
            &mut self.retry_in_ns,
            &mut st,
            id,
            now,
            cx,
            &mut wake,
        );
        drop(st);
        wake.wake();
        r.map(|r| {
            r.map(|(booked, delay_ns)| {
                let wl = self
                    .workload
                    .take()
                    .expect("a request's handle until ready");
                wl.permit(booked, delay_ns, true)
            })
        })
    }

    fn workload(&self) -> &Workload {
        self.workload
            .as_ref()
            .expect("a workload request polled after it was ready")
    }

    /// After a `Pending` poll: whether this request times the caps' debts,
    /// and how long from that poll to re-poll (nothing else wakes it then).
    /// `None`: it is woken when it may go.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_in_ns.map(Duration::from_nanos)
    }

    /// Whether it waits in a queue.
    pub fn is_queued(&self) -> bool {
        matches!(self.state, RequestState::Queued(_))
    }
}

/// After a dispatch round: request `id`'s permit if it came, else keep its
/// waker (and, if it times the caps, tell it when to re-poll). `now`: the
/// clock reading of the round, if one was taken (else it is read here when
/// needed).
#[allow(
    clippy::too_many_arguments,
    reason = "the parts of a request a poll changes, split from it so the handle is borrowed, not cloned"
)]
fn settle(
    wl: &Workload,
    state: &mut RequestState,
    retry_in_ns: &mut Option<u64>,
    st: &mut State,
    id: u64,
    now: Option<u64>,
    cx: &mut Context<'_>,
    wake: &mut Wakes,
) -> Poll<Result<(Booked, u64), WorkloadError>> {
    let now = || now.unwrap_or_else(|| wl.inner.sched.now());
    match st.slots.get_mut(id) {
        Some(Slot::Queued { waker, .. }) => {
            match waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => *waker = Some(cx.waker().clone()),
            }
            Shared::keep_time(st, Some(id), wake);
            if let Some((t, at)) = st.timekeeper
                && t == id
            {
                *retry_in_ns = Some(at.saturating_sub(now()));
            }
            Poll::Pending
        }
        _ => {
            let slot = st.slots.remove(id).expect("a queued request has a slot");
            *state = RequestState::Done;
            if st.timekeeper.is_some_and(|(t, _)| t == id) {
                st.timekeeper = None;
            }
            Shared::keep_time(st, None, wake);
            match slot {
                Slot::Granted { at, booked } => {
                    let left = match booked.delay_ns {
                        0 => 0,
                        d => at.saturating_add(d).saturating_sub(now()),
                    };
                    Poll::Ready(Ok((booked, left)))
                }
                Slot::Failed(e) => Poll::Ready(Err(*e)),
                Slot::Queued { .. } => unreachable!("matched above"),
            }
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        let RequestState::Queued(id) = self.state else {
            return;
        };
        let inner = &self
            .workload
            .as_ref()
            .expect("a queued request keeps its handle")
            .inner;
        let sched = &inner.sched;
        let mut wake = Wakes::default();
        {
            let mut st = lock(&sched.state);
            let now = sched.now();
            match st.slots.remove(id) {
                Some(Slot::Queued { leaf, .. }) => {
                    st.tree.cancel(leaf, id, now);
                }
                Some(Slot::Granted { booked, .. }) => {
                    // Dispatched, but its caller never saw the permit: the IO
                    // never happens, so its charges go back (never past a
                    // bucket's burst) with its in-flight places.
                    for n in inner.path.iter() {
                        n.bytes.refund(booked.cost, now);
                        n.ops.refund(1, now);
                        n.counters.refunded(booked.cost);
                    }
                    for (k, n) in inner.path.iter().enumerate() {
                        n.inflight.release(booked.cost, booked.places.get(k));
                    }
                    let nodes = held_nodes(&inner.path, booked.places);
                    st.tree.released(nodes, now);
                }
                _ => {}
            }
            if st.timekeeper.is_some_and(|(t, _)| t == id) {
                st.timekeeper = None;
            }
            Shared::pump(&mut st, now, &mut wake);
            Shared::keep_time(&mut st, None, &mut wake);
        }
        wake.wake();
    }
}
