//! Wake-ups between the tasks of one instance: a [`Latch`] that is set once (a stop signal, "this
//! pump ended"), a [`Notify`] that can fire many times ("a delivery was settled") and a
//! [`Ticker`], the host timer of a loop that waits for many things in turn.
//!
//! They are single-threaded (`Rc`, like everything in a component instance). A waiter polled by
//! one export call's task and woken from another's is rung through a bell ([`crate::bell`]):
//! wit-bindgen's `inter-task-wakeup` feature is off, and any other Rust-level wake-up across
//! export calls (a `futures` channel, say) panics — use these.

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use crate::bell;

/// A future parked on a signal: one [`Waiting`], by its key.
struct Parked {
    key: u64,
    waker: Waker,
    /// The task that polled it last ([`bell::current_task`]; 0 outside a task).
    task: usize,
}

/// The futures parked on a signal.
#[derive(Default)]
struct Waiters(Vec<Parked>);

impl Waiters {
    fn park(&mut self, key: u64, cx: &Context<'_>, task: usize) {
        match self.0.iter_mut().find(|p| p.key == key) {
            Some(parked) => {
                parked.waker.clone_from(cx.waker());
                parked.task = task;
            }
            None => self.0.push(Parked {
                key,
                waker: cx.waker().clone(),
                task,
            }),
        }
    }

    fn forget(&mut self, key: u64) {
        self.0.retain(|p| p.key != key);
    }

    /// Wake every parked future: one of the task being polled through its waker, one of
    /// another task through that task's bell.
    fn wake_all(parked: Vec<Parked>) {
        let here = bell::current_task();
        for p in parked {
            if p.task == here || p.task == 0 {
                p.waker.wake();
            } else if let Err(waker) = bell::ring(p.task, p.waker) {
                // A waiter with no bell (`Latch::wait_here`) woken from another task: wit-bindgen
                // panics if its task sleeps, which is louder than a wait that never ends.
                waker.wake();
            }
        }
    }
}

thread_local! {
    /// The key of the next [`Waiting`] future.
    static NEXT_KEY: Cell<u64> = const { Cell::new(0) };
}

/// A wait on a signal whose state is `(T, Waiters)`, done once `done(&T, seen)` says so.
struct Waiting<T> {
    state: Rc<RefCell<(T, Waiters)>>,
    done: fn(&T, u64) -> bool,
    seen: u64,
    key: u64,
    /// The task it parked in, once it did.
    parked: Option<usize>,
    /// Whether its task keeps a bell armed for it (see [`Latch::wait_here`]).
    bell: bool,
}

impl<T> Waiting<T> {
    fn new(state: Rc<RefCell<(T, Waiters)>>, done: fn(&T, u64) -> bool, seen: u64) -> Self {
        let key = NEXT_KEY.get();
        NEXT_KEY.set(key + 1);
        Self {
            state,
            done,
            seen,
            key,
            parked: None,
            bell: true,
        }
    }
}

impl<T> Future for Waiting<T> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if (this.done)(&this.state.borrow().0, this.seen) {
            this.unpark();
            return Poll::Ready(());
        }
        // Parked in the task polling it (a future polled by another task than before moves).
        let task = bell::current_task();
        match this.parked {
            Some(parked) if parked == task => {
                if this.bell {
                    bell::repark(task);
                }
            }
            parked => {
                if this.bell {
                    if let Some(old) = parked {
                        bell::leave(old);
                    }
                    bell::park(task);
                }
                this.parked = Some(task);
            }
        }
        this.state.borrow_mut().1.park(this.key, cx, task);
        Poll::Pending
    }
}

impl<T> Waiting<T> {
    /// Waiting no more: out of the signal's waiters and its task's bell.
    fn unpark(&mut self) {
        if let Some(task) = self.parked.take() {
            if let Ok(mut state) = self.state.try_borrow_mut() {
                state.1.forget(self.key);
            }
            if self.bell {
                bell::leave(task);
            }
        }
    }
}

impl<T> Drop for Waiting<T> {
    fn drop(&mut self) {
        self.unpark();
    }
}

/// A signal that is set once and stays set; every [`Latch::wait`], before or after, resolves.
#[derive(Clone, Default)]
pub struct Latch(Rc<RefCell<(bool, Waiters)>>);

impl Latch {
    /// A latch that is not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the latch and wake every waiter. Setting it again does nothing.
    pub fn set(&self) {
        let parked = {
            let mut state = self.0.borrow_mut();
            state.0 = true;
            std::mem::take(&mut (state.1).0)
        };
        Waiters::wake_all(parked);
    }

    /// Whether the latch is set.
    pub fn is_set(&self) -> bool {
        self.0.borrow().0
    }

    /// Resolves once the latch is set.
    pub fn wait(&self) -> impl Future<Output = ()> + 'static {
        Waiting::new(self.0.clone(), |set, _| *set, 0)
    }

    /// Resolves once the latch is set, which only code polled by this same task does (or code
    /// outside any task): no bell is armed for it, so a waiter that does not sleep costs no
    /// host call.
    pub(crate) fn wait_here(&self) -> impl Future<Output = ()> + 'static {
        let mut waiting = Waiting::new(self.0.clone(), |set, _| *set, 0);
        waiting.bell = false;
        waiting
    }
}

/// A signal that can fire many times. A [`Notify::notified`] future resolves on the first
/// [`Notify::notify`] after it was *created* (not first polled), so "check, then wait" loses
/// no wake-up.
#[derive(Clone, Default)]
pub struct Notify(Rc<RefCell<(u64, Waiters)>>);

impl Notify {
    /// A signal nobody waits on yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wake every task waiting on a [`Notify::notified`] future.
    pub fn notify(&self) {
        let parked = {
            let mut state = self.0.borrow_mut();
            state.0 += 1;
            std::mem::take(&mut (state.1).0)
        };
        Waiters::wake_all(parked);
    }

    /// Resolves on the next [`Notify::notify`].
    pub fn notified(&self) -> impl Future<Output = ()> + 'static {
        let seen = self.0.borrow().0;
        Waiting::new(self.0.clone(), |count, seen| *count != seen, seen)
    }
}

/// A period of the host's clock that runs on across waits: a loop that races each wait against
/// [`Ticker::tick`] starts one host timer per period, not one per wait (each a host call, a
/// tokio timer and a cancelled subtask). One waiter at a time.
pub struct Ticker {
    ms: u32,
    timer: RefCell<Pin<Box<dyn Future<Output = ()>>>>,
}

impl Ticker {
    /// Periods of `ms` milliseconds, the first starting when it is first waited for.
    pub fn new(ms: u32) -> Self {
        Self {
            ms,
            timer: RefCell::new(Box::pin(crate::host::sleep(ms))),
        }
    }

    /// Resolves when the current period ends, and starts the next one. Dropped before that,
    /// the period goes on for the next `tick`.
    pub fn tick(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(move |cx| {
            let mut timer = self.timer.borrow_mut();
            match timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    *timer = Box::pin(crate::host::sleep(self.ms));
                    Poll::Ready(())
                }
                Poll::Pending => Poll::Pending,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;

    /// Poll once; true when ready.
    fn ready(f: Pin<&mut impl Future<Output = ()>>) -> bool {
        f.poll(&mut Context::from_waker(Waker::noop())).is_ready()
    }

    #[test]
    fn latch_releases_every_waiter_once_set() {
        let latch = Latch::new();
        let mut before = Box::pin(latch.wait());
        assert!(!ready(before.as_mut()));
        latch.set();
        assert!(latch.is_set() && ready(before.as_mut()));
        assert!(ready(Box::pin(latch.wait()).as_mut()));
    }

    #[test]
    fn notified_sees_only_later_notifications() {
        let notify = Notify::new();
        notify.notify();
        let mut waiting = Box::pin(notify.notified());
        assert!(!ready(waiting.as_mut()));
        notify.notify();
        assert!(ready(waiting.as_mut()));
    }
}
