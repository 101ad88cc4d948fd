//! A future polled by whichever task gets to it first: a Store-owner's, or a log reader's.
//!
//! A task of its own (the driver) polls the future whenever something it waits on wakes it.
//! A caller that submits a call does not wake the driver and wait for it: if nobody is polling
//! the future, the caller takes it, hands its call over, and polls it right there
//! ([`Owner::hold`]). A trivial call is then answered within the caller's own poll, with
//! no hop to another task — on tokio's multi-threaded runtime such a hop wakes a parked worker
//! every few calls, and that wake-up was most of a trivial call's time (BENCHMARKS.md).
//!
//! Whoever polls, every poll uses the same waker, which wakes the driver only when nobody is
//! polling: a wake that arrives during a poll makes that poller poll again before it lets go,
//! so no wake is lost, and the driver runs only for what no caller is there to see. A wake
//! that a later part of the same poll already saw needs no second poll: the future marks the
//! point of its poll after which everything a wake can be for is polled ([`Cover`]).
//!
//! A task about to wait on what the future produces can [`Owner::help`]: when the future was
//! woken and nobody polls it yet, it is polled there and then, and what it produces is ready
//! before the task waits (a live log read takes its entry from the instance's stream, through
//! its reader, in the reading task's own poll); the driver, woken too, finds nothing left.
//!
//! Owners that a held poll wakes are polled by the holder once its poll is done, not by their
//! drivers ([`Nearby`]): what one instance hands to another goes on in the same task. Every
//! future is polled in the runtime its owner was spawned on, whoever polls it.

use std::cell::UnsafeCell;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll, Wake, Waker};

use nearby::Nearby;

mod nearby;

/// Set while one task polls the future (the future is only touched by the holder of this bit).
const HELD: u8 = 1;
/// Set by a wake since the current (or the last) poll began.
const WOKEN: u8 = 2;
/// How many times in a row one holder polls again because it was woken during its poll, before
/// it leaves the rest to the driver (a future that keeps waking itself must not hold a caller).
const REPOLLS: usize = 4;

/// How many owners a holder polls after its own, woken by its poll (see [`Nearby`]), before it
/// leaves the rest to their drivers.
const NEARBY_HELPS: usize = 8;

/// The future an owner polls for its life.
pub type OwnerFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The wake state, and the driver task's waker once it first ran.
struct Signal {
    state: AtomicU8,
    driver: OnceLock<Waker>,
    /// The owner this signal wakes, for a holder that polls it next (see [`Nearby`]).
    owner: OnceLock<Weak<Owner>>,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Nobody holds the future and nobody was woken yet: the driver polls it, or the task
        // whose poll of another owner woke this one, right after. (While it is held, the holder
        // sees `WOKEN` and polls again.)
        if self.state.fetch_or(WOKEN, SeqCst) == 0 && !Nearby::defer(self) {
            self.wake_driver();
        }
    }
}

impl Signal {
    fn wake_driver(&self) {
        // Before its first run the driver has no waker here; that first run polls anyway.
        if let Some(driver) = self.driver.get() {
            driver.wake_by_ref();
        }
    }
}

/// The owner future's mark of a point in its poll after which everything that a wake so far
/// can be for is still polled in that same poll: a wake that came before the mark needs no
/// second poll (a trivial call's answer wakes the owner's future within its poll; without the
/// mark, every call paid one more poll of the whole future, which then found nothing to do).
pub struct Cover {
    signal: Arc<Signal>,
}

impl Cover {
    /// `future`, each of whose polls starts at the mark. Sound only where, in each poll of the
    /// owner's future, everything a wake can be for is polled after the mark's last pass: in
    /// `supervise`, wasmtime's loop polls the host's side first, then its own futures and
    /// work, and goes round again while any made progress; the kill timer is polled after.
    pub(crate) async fn polling<F: Future>(&self, future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        std::future::poll_fn(|cx| {
            // Only the holder polls: `HELD` is set and stays set.
            self.signal.state.store(HELD, SeqCst);
            future.as_mut().poll(cx)
        })
        .await
    }
}

/// The future held by this task: dropping it polls the future here, then lets it go.
pub(crate) struct Held<'a> {
    owner: &'a Owner,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.owner.poll_held();
    }
}

/// A future shared by its driver task and the tasks that submit to it or wait on it, polled by
/// whichever of them gets to it first: a Store-owner's, or a log reader's.
pub struct Owner {
    signal: Arc<Signal>,
    /// The waker every poll uses (wakes [`Signal`]).
    waker: Waker,
    /// `None` once the future finished (or panicked: logged, not passed on to the poller).
    future: UnsafeCell<Option<OwnerFuture>>,
    /// The runtime the owner was spawned on: every poll enters it, so the timers and sockets
    /// the future makes belong to it even when a task of another runtime polls (they would
    /// fail once that runtime shuts down, and the owner with them).
    runtime: tokio::runtime::Handle,
}

// SAFETY: `future` is only touched by the one task that set `HELD` (acquired and released with
// `SeqCst`, which orders the accesses), as a `Mutex` would; the future itself is `Send`.
unsafe impl Sync for Owner {}

impl Owner {
    /// Share the future `make` returns (given its [`Cover`]) and spawn its driver task on the
    /// current runtime, the one the future is polled in whichever task polls it.
    pub fn spawn(make: impl FnOnce(Cover) -> OwnerFuture) -> Arc<Self> {
        let signal = Arc::new(Signal {
            state: AtomicU8::new(0),
            driver: OnceLock::new(),
            owner: OnceLock::new(),
        });
        let future = make(Cover {
            signal: signal.clone(),
        });
        let owner = Arc::new(Self {
            waker: Waker::from(signal.clone()),
            signal,
            future: UnsafeCell::new(Some(future)),
            runtime: tokio::runtime::Handle::current(),
        });
        let _ = owner.signal.owner.set(Arc::downgrade(&owner));
        let driven = owner.clone();
        let mut started = false;
        tokio::spawn(std::future::poll_fn(move |cx| {
            driven.signal.driver.get_or_init(|| cx.waker().clone());
            let Some(woken) = driven.acquire() else {
                // Held: the holder polls (again) before it lets go.
                return Poll::Pending;
            };
            // Not woken since the last poll began: a task that helped ([`Owner::help`]) did
            // what this one was woken for. Let go, unless a wake came meanwhile.
            if started && !woken && driven.release_unwoken() {
                return Poll::Pending;
            }
            started = true;
            match driven.poll_held() {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        }));
        owner
    }

    /// Poll the future here if it was woken and nobody polls it now, instead of leaving it to
    /// the driver task: a task about to wait on what the future produces gets it without a
    /// hand-over (and a wake of another thread) in between. Nothing when it was not woken.
    pub fn help(&self) {
        if self.signal.state.load(SeqCst) == WOKEN {
            drop(self.hold());
        }
    }

    /// Hold the future if nobody polls it now (`None`: another task does, and its poll sees
    /// what is submitted meanwhile). The holder submits (that wake does not go to the driver)
    /// and the future is polled here when the [`Held`] drops. Never hold it across an await.
    pub(crate) fn hold(&self) -> Option<Held<'_>> {
        self.acquire().map(|_| Held { owner: self })
    }

    /// Take the future for polling: whether it was woken since its last poll began; `None`
    /// when another task holds it.
    fn acquire(&self) -> Option<bool> {
        let before = self.signal.state.fetch_or(HELD, SeqCst);
        (before & HELD == 0).then_some(before & WOKEN != 0)
    }

    /// Let the future go unpolled; false (still held) when a wake came since it was taken.
    fn release_unwoken(&self) -> bool {
        self.signal
            .state
            .compare_exchange(HELD, 0, SeqCst, SeqCst)
            .is_ok()
    }

    /// Poll the held future until no wake came during the poll (at most [`REPOLLS`] times),
    /// then let it go, and poll the owners it woke ([`Nearby`]). True when the future has
    /// finished.
    fn poll_held(&self) -> bool {
        // Dropped last, on whichever return: the woken owners are polled after this one's
        // poll, outside its runtime's enter.
        let _nearby = Nearby::collect();
        let mut cx = Context::from_waker(&self.waker);
        let _runtime = self.runtime.enter();
        for _ in 0..REPOLLS {
            // This poll covers every wake so far.
            self.signal.state.store(HELD, SeqCst);
            // SAFETY: this task set `HELD`; nobody else touches `future` until it is cleared.
            let slot = unsafe { &mut *self.future.get() };
            let Some(future) = slot.as_mut() else {
                self.signal.state.store(0, SeqCst);
                return true;
            };
            let polled = catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx)));
            match polled {
                Ok(Poll::Pending) => {}
                Ok(Poll::Ready(())) => return self.finish(slot),
                // A bug of the host's own (a component's trap is an error, not a panic): the
                // owner ends as its own task would have, and the caller that happened to poll
                // it goes on (its call, like every waiting one, answers that the adapter closed).
                Err(panic) => {
                    tracing::error!(
                        "a shared future (a Store-owner's or a reader's) panicked: {}; it is gone",
                        panic_text(&*panic)
                    );
                    return self.finish(slot);
                }
            }
            if self.release_unwoken() {
                return false;
            }
        }
        // Still woken: let go, and let the driver poll it next.
        self.signal.state.store(WOKEN, SeqCst);
        self.signal.wake_driver();
        false
    }

    /// The future finished (or panicked): drop it, let go and wake the driver so it ends too.
    fn finish(&self, slot: &mut Option<OwnerFuture>) -> bool {
        *slot = None;
        self.signal.state.store(WOKEN, SeqCst);
        self.signal.wake_driver();
        true
    }
}

/// What a panic said, when it said it with a string.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => text,
        (_, Some(text)) => text,
        _ => "(no message)",
    }
}

#[cfg(test)]
mod tests;
