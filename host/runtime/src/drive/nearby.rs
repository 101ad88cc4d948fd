//! Owners woken by a held poll, polled by its holder once that poll is done ([`Nearby`]).

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use super::{NEARBY_HELPS, Signal};

/// Owners woken by the poll a task holds, polled by that task once its own poll is done,
/// instead of each by its driver task: one instance's poll that hands something to another
/// (a memory broker's send to another instance's listener, an append to a topic another
/// instance's tail reads, the tail to its readers) goes on in the same task, with no hop to a
/// driver. A hop from within a task's poll takes tokio's LIFO slot, and once that is taken (or
/// used three times in a row) wakes a parked worker across threads: most of a request/reply's
/// and a live read's wakes of another thread were such hops (BENCHMARKS.md).
pub(super) struct Nearby;

thread_local! {
    /// `Some` while this thread holds an owner's poll: the owners it woke, to poll next.
    static NEARBY: RefCell<Option<Vec<Arc<Signal>>>> = const { RefCell::new(None) };
}

impl Nearby {
    /// Leave `signal`'s owner to the task whose held poll woke it; false when this thread holds
    /// no poll (or has enough waiting already).
    pub(super) fn defer(signal: &Arc<Signal>) -> bool {
        NEARBY.with(|nearby| match nearby.borrow_mut().as_mut() {
            Some(woken) if woken.len() < NEARBY_HELPS => {
                woken.push(signal.clone());
                true
            }
            _ => false,
        })
    }

    /// Collect the owners this thread's polls wake until the returned guard drops, which polls
    /// them; `None` when an outer poll on this thread already collects (it polls them).
    pub(super) fn collect() -> Option<NearbyGuard> {
        NEARBY.with(|nearby| {
            let mut nearby = nearby.borrow_mut();
            nearby.is_none().then(|| {
                *nearby = Some(Vec::new());
                NearbyGuard
            })
        })
    }

    /// The next woken owner to poll, in the order they were woken.
    fn next() -> Option<Arc<Signal>> {
        NEARBY.with(|nearby| {
            let mut nearby = nearby.borrow_mut();
            let woken = nearby.as_mut()?;
            (!woken.is_empty()).then(|| woken.remove(0))
        })
    }
}

/// Polls the owners woken while it lived (at most [`NEARBY_HELPS`]; what their polls wake
/// too), then stops collecting and wakes the drivers of any left.
pub(super) struct NearbyGuard;

impl Drop for NearbyGuard {
    fn drop(&mut self) {
        for _ in 0..NEARBY_HELPS {
            let Some(signal) = Nearby::next() else { break };
            match signal.owner.get().and_then(Weak::upgrade) {
                // Polled here unless another task holds it (it sees the wake) or polled it.
                Some(owner) => owner.help(),
                None => signal.wake_driver(),
            }
        }
        let left = NEARBY.with(|nearby| nearby.borrow_mut().take());
        for signal in left.into_iter().flatten() {
            signal.wake_driver();
        }
    }
}
