//! Wake-ups between the tasks of one instance: a [`Latch`] that is set once (a stop signal, "this
//! pump ended"), a [`Notify`] that can fire many times ("a delivery was settled") and a
//! [`Ticker`], the host timer of a loop that waits for many things in turn.
//!
//! Both are single-threaded (`Rc`, like everything in a component instance). Waking a task
//! that belongs to another export call needs `wit-bindgen`'s `inter-task-wakeup` feature,
//! which this crate turns on.

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// The tasks parked on a signal; each waker is kept once.
#[derive(Default)]
struct Waiters(Vec<Waker>);

impl Waiters {
    fn park(&mut self, cx: &Context<'_>) {
        if !self.0.iter().any(|w| w.will_wake(cx.waker())) {
            self.0.push(cx.waker().clone());
        }
    }

    fn take(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.0)
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
        let wakers = {
            let mut state = self.0.borrow_mut();
            state.0 = true;
            state.1.take()
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Whether the latch is set.
    pub fn is_set(&self) -> bool {
        self.0.borrow().0
    }

    /// Resolves once the latch is set.
    pub fn wait(&self) -> impl Future<Output = ()> + 'static {
        let state = self.0.clone();
        poll_fn(move |cx| {
            let mut state = state.borrow_mut();
            if state.0 {
                Poll::Ready(())
            } else {
                state.1.park(cx);
                Poll::Pending
            }
        })
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
        let wakers = {
            let mut state = self.0.borrow_mut();
            state.0 += 1;
            state.1.take()
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Resolves on the next [`Notify::notify`].
    pub fn notified(&self) -> impl Future<Output = ()> + 'static {
        let state = self.0.clone();
        let seen = state.borrow().0;
        poll_fn(move |cx| {
            let mut state = state.borrow_mut();
            if state.0 != seen {
                Poll::Ready(())
            } else {
                state.1.park(cx);
                Poll::Pending
            }
        })
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
