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

use std::cell::{RefCell, UnsafeCell};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll, Wake, Waker};

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

/// Owners woken by the poll a task holds, polled by that task once its own poll is done,
/// instead of each by its driver task: one instance's poll that hands something to another
/// (a memory broker's send to another instance's listener, an append to a topic another
/// instance's tail reads, the tail to its readers) goes on in the same task, with no hop to a
/// driver. A hop from within a task's poll takes tokio's LIFO slot, and once that is taken (or
/// used three times in a row) wakes a parked worker across threads: most of a request/reply's
/// and a live read's wakes of another thread were such hops (BENCHMARKS.md).
struct Nearby;

thread_local! {
    /// `Some` while this thread holds an owner's poll: the owners it woke, to poll next.
    static NEARBY: RefCell<Option<Vec<Arc<Signal>>>> = const { RefCell::new(None) };
}

impl Nearby {
    /// Leave `signal`'s owner to the task whose held poll woke it; false when this thread holds
    /// no poll (or has enough waiting already).
    fn defer(signal: &Arc<Signal>) -> bool {
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
    fn collect() -> Option<NearbyGuard> {
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
struct NearbyGuard;

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
        let _nearby = Nearby::collect();
        self.poll_held_here()
    }

    /// [`Owner::poll_held`] without the owners it woke.
    fn poll_held_here(&self) -> bool {
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
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    use tokio::sync::{mpsc, oneshot};

    type Request = (u64, oneshot::Sender<u64>);

    /// An owner that answers each number sent to it with its double.
    fn doubler() -> (Arc<Owner>, mpsc::Sender<Request>) {
        let (tx, mut rx) = mpsc::channel::<Request>(16);
        let owner = Owner::spawn(|_| {
            Box::pin(async move {
                while let Some((n, answer)) = rx.recv().await {
                    let _ = answer.send(n * 2);
                }
            })
        });
        (owner, tx)
    }

    /// Submit `request` as the host does: through the held future when nobody polls it.
    async fn submit(owner: &Owner, tx: &mpsc::Sender<Request>, request: Request) {
        let request = match owner.hold() {
            Some(held) => match tx.try_send(request) {
                Ok(()) => return drop(held),
                Err(full) => full.into_inner(),
            },
            None => request,
        };
        tx.send(request).await.unwrap();
    }

    /// An owner whose every poll is counted and, when asked, wakes itself once before the
    /// covered part of its poll (`BEFORE`) or after it (`AFTER`).
    fn self_waking() -> (Arc<Owner>, Arc<AtomicUsize>, Arc<AtomicU8>) {
        let (polls, wake) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU8::new(0)));
        let (counted, asked) = (polls.clone(), wake.clone());
        let owner = Owner::spawn(|cover| {
            Box::pin(async move {
                let mut covered = std::pin::pin!(cover.polling(std::future::pending::<()>()));
                std::future::poll_fn(|cx| {
                    counted.fetch_add(1, SeqCst);
                    let wake = asked.swap(0, SeqCst);
                    if wake == BEFORE {
                        cx.waker().wake_by_ref();
                    }
                    let _ = covered.as_mut().poll(cx);
                    if wake == AFTER {
                        cx.waker().wake_by_ref();
                    }
                    Poll::<()>::Pending
                })
                .await
            })
        });
        (owner, polls, wake)
    }
    const BEFORE: u8 = 1;
    const AFTER: u8 = 2;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wake_the_covered_part_saw_costs_no_second_poll_and_a_later_one_does() {
        let (owner, polls, wake) = self_waking();
        // The driver's first poll.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(polls.load(SeqCst), 1);
        wake.store(BEFORE, SeqCst);
        drop(owner.hold().expect("idle"));
        assert_eq!(
            polls.load(SeqCst),
            2,
            "the wake came before the mark: one poll"
        );
        wake.store(AFTER, SeqCst);
        drop(owner.hold().expect("idle"));
        assert_eq!(
            polls.load(SeqCst),
            4,
            "the wake came after the mark: polled again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(polls.load(SeqCst), 4, "and nothing left for the driver");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_helper_polls_a_woken_future_on_its_own_task_and_the_driver_then_skips_its_poll() {
        let (tx, mut rx) = mpsc::channel::<u64>(16);
        let (polls, seen) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (counted, got) = (polls.clone(), seen.clone());
        let owner = Owner::spawn(|_| {
            Box::pin(async move {
                std::future::poll_fn(|cx| {
                    counted.fetch_add(1, SeqCst);
                    while let Poll::Ready(Some(n)) = rx.poll_recv(cx) {
                        got.fetch_add(n as usize, SeqCst);
                    }
                    Poll::<()>::Pending
                })
                .await
            })
        });
        // The driver's first poll.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(polls.load(SeqCst), 1);
        owner.help();
        assert_eq!(polls.load(SeqCst), 1, "not woken: no poll");
        // The send wakes the future; on this one thread the driver cannot run before the help.
        tx.try_send(7).unwrap();
        owner.help();
        assert_eq!(seen.load(SeqCst), 7, "taken within the helper's poll");
        assert_eq!(polls.load(SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            polls.load(SeqCst),
            2,
            "the driver, woken too, found nothing to poll for"
        );
        tx.try_send(5).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            (seen.load(SeqCst), polls.load(SeqCst)),
            (12, 3),
            "unhelped: the driver polls"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_submission_is_answered_within_the_callers_own_poll() {
        let (owner, tx) = doubler();
        // Let the driver run once and go idle.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (answer, mut rx) = oneshot::channel();
        submit(&owner, &tx, (21, answer)).await;
        assert_eq!(rx.try_recv(), Ok(42), "answered before the caller waited");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_a_poll_from_another_runtime_makes_belongs_to_the_owners_runtime() {
        // Each request waits for a tick of an interval made at the first request (as the
        // Store-owner's heartbeat and a job's sleeps are made inside its future's poll).
        let (tx, mut rx) = mpsc::channel::<Request>(16);
        let owner = Owner::spawn(|_| {
            Box::pin(async move {
                let mut ticks = None;
                while let Some((n, answer)) = rx.recv().await {
                    let interval = ticks
                        .get_or_insert_with(|| tokio::time::interval(Duration::from_millis(1)));
                    interval.tick().await;
                    let _ = answer.send(n * 2);
                }
            })
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The first request comes from a runtime of its own, on a thread of its own, which then
        // shuts down: its poll of the future made the interval.
        let (other_owner, other_tx) = (owner.clone(), tx.clone());
        std::thread::spawn(move || {
            let other = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            other.block_on(async {
                let (answer, rx) = oneshot::channel();
                submit(&other_owner, &other_tx, (1, answer)).await;
                assert_eq!(rx.await.unwrap(), 2);
            });
        })
        .join()
        .unwrap();
        // Its interval still ticks: it was made in the owner's runtime, not the one that ended.
        for n in 2..5 {
            let (answer, rx) = oneshot::channel();
            submit(&owner, &tx, (n, answer)).await;
            let got = tokio::time::timeout(Duration::from_secs(5), rx).await;
            assert_eq!(got.expect("answered").expect("the owner lives"), n * 2);
        }
    }

    /// A chain of `len` owners: each passes every number it gets on to the next, the last
    /// adds it to the returned total. The first owner's sender.
    fn chain(len: usize) -> (Vec<Arc<Owner>>, mpsc::Sender<u64>, Arc<AtomicUsize>) {
        let total = Arc::new(AtomicUsize::new(0));
        let (first, mut rx) = mpsc::channel::<u64>(16);
        let mut owners = Vec::new();
        for at in 0..len {
            let (tx, next_rx) = mpsc::channel::<u64>(16);
            let mut this_rx = std::mem::replace(&mut rx, next_rx);
            let last = (at + 1 == len).then(|| total.clone());
            owners.push(Owner::spawn(|_| {
                Box::pin(async move {
                    while let Some(n) = this_rx.recv().await {
                        match &last {
                            Some(total) => drop(total.fetch_add(n as usize, SeqCst)),
                            None => tx.try_send(n).unwrap(),
                        }
                    }
                })
            }));
        }
        (owners, first, total)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn owners_a_held_poll_wakes_are_polled_by_the_holder_and_the_rest_by_their_drivers() {
        let (owners, first, total) = chain(3);
        // Every driver's first poll.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let held = owners[0].hold().expect("idle");
        first.try_send(5).unwrap();
        drop(held);
        // On this one thread no driver ran in between: the holder polled the second owner,
        // whose poll woke the third, polled by the holder too.
        assert_eq!(
            total.load(SeqCst),
            5,
            "through the chain within the holder's poll"
        );
        // A chain longer than the holder polls: the rest goes on through the drivers.
        let (owners, first, total) = chain(NEARBY_HELPS + 4);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let held = owners[0].hold().expect("idle");
        first.try_send(7).unwrap();
        drop(held);
        assert_eq!(total.load(SeqCst), 0, "past what the holder polls");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(total.load(SeqCst), 7, "the drivers took it from there");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wakes_from_many_tasks_are_never_lost() {
        let (owner, tx) = doubler();
        let answered = Arc::new(AtomicUsize::new(0));
        let tasks = (0..8).map(|t| {
            let (owner, tx, answered) = (owner.clone(), tx.clone(), answered.clone());
            tokio::spawn(async move {
                for n in 0..2_000u64 {
                    let (answer, rx) = oneshot::channel();
                    // Half the tasks submit through the held future, half leave it to others.
                    if t % 2 == 0 {
                        submit(&owner, &tx, (n, answer)).await;
                    } else {
                        tx.send((n, answer)).await.unwrap();
                    }
                    let got = tokio::time::timeout(Duration::from_secs(5), rx).await;
                    assert_eq!(got.expect("a wake was lost").unwrap(), n * 2);
                    answered.fetch_add(1, SeqCst);
                }
            })
        });
        for task in tasks.collect::<Vec<_>>() {
            task.await.unwrap();
        }
        assert_eq!(answered.load(SeqCst), 16_000);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_future_finishes_once_whoever_polls_it() {
        let (tx, mut rx) = mpsc::channel::<()>(1);
        let ended = Arc::new(AtomicUsize::new(0));
        let end = ended.clone();
        let owner = Owner::spawn(|_| {
            Box::pin(async move {
                let _ = rx.recv().await;
                end.fetch_add(1, SeqCst);
            })
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The sender's drop wakes the future; it ends in the driver's poll or this one.
        drop(tx);
        drop(owner.hold());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(ended.load(SeqCst), 1);
        assert!(owner.hold().is_some(), "a finished future is not held");
        assert_eq!(Arc::strong_count(&owner), 1, "the driver task ended");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_future_ends_without_panicking_the_caller_that_polled_it() {
        let (tx, mut rx) = mpsc::channel::<Request>(16);
        let owner = Owner::spawn(|_| {
            Box::pin(async move {
                if let Some((n, _answer)) = rx.recv().await {
                    panic!("a host bug on {n}");
                }
            })
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (answer, waiting) = oneshot::channel();
        // The held poll runs the future into its panic here, on the caller's task.
        submit(&owner, &tx, (7, answer)).await;
        let got = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert!(got.expect("answered").is_err(), "the call answers: gone");
        assert!(
            tx.send((8, oneshot::channel().0)).await.is_err(),
            "the owner's end is gone"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(Arc::strong_count(&owner), 1, "the driver task ended");
    }
}
