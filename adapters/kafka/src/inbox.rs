//! What a driver stream (a reader's records, a member's events) brought, read off the stream
//! by a task of its own into a bounded buffer the adapter takes from with a bounded wait. A
//! driver stream read is never cut short by a timeout, which could drop what it had read;
//! while the buffer is full the task stops reading, so the driver stops fetching.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::pin::pin;
use std::rc::Rc;

use futures::future::{Either, select};
use wit_bindgen::{StreamReader, StreamResult};

use wrpc_broker_guest::host;
use wrpc_broker_guest::signal::{Latch, Notify};

/// How many items one read of the driver stream takes at most.
const BATCH: usize = 256;
/// How many items wait in the buffer before the task stops reading.
const CAPACITY: usize = 1_024;

/// A driver stream's items, buffered.
pub(crate) struct Inbox<T> {
    arrived: RefCell<VecDeque<T>>,
    /// Fires when items arrived or the stream ended.
    wake: Notify,
    /// Fires when items were taken (room in the buffer).
    taken: Notify,
    /// True once the driver stream ended.
    ended: Cell<bool>,
    /// Set to stop reading (the stream is then dropped).
    stop: Latch,
}

impl<T: 'static> Inbox<T> {
    /// Start reading `from`.
    pub(crate) fn start(from: StreamReader<T>) -> Rc<Inbox<T>> {
        let inbox = Rc::new(Inbox {
            arrived: RefCell::new(VecDeque::new()),
            wake: Notify::new(),
            taken: Notify::new(),
            ended: Cell::new(false),
            stop: Latch::new(),
        });
        wit_bindgen::spawn_local(inbox.clone().read(from));
        inbox
    }

    async fn read(self: Rc<Self>, mut from: StreamReader<T>) {
        while !self.stop.is_set() {
            if self.arrived.borrow().len() >= CAPACITY {
                let taken = pin!(self.taken.notified());
                select(taken, pin!(self.stop.wait())).await;
                continue;
            }
            let read = pin!(from.read(Vec::with_capacity(BATCH)));
            let (result, batch) = match select(read, pin!(self.stop.wait())).await {
                Either::Left((read, _)) => read,
                Either::Right(_) => break,
            };
            self.arrived.borrow_mut().extend(batch);
            self.wake.notify();
            if !matches!(result, StreamResult::Complete(_)) {
                break;
            }
        }
        self.ended.set(true);
        self.wake.notify();
    }

    /// Whether the driver stream ended.
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.get()
    }

    /// Whether the driver stream ended and everything it brought was taken.
    pub(crate) fn is_done(&self) -> bool {
        self.ended.get() && self.arrived.borrow().is_empty()
    }

    /// Up to `max` items that arrived.
    pub(crate) fn take(&self, max: usize) -> Vec<T> {
        let taken: Vec<T> = {
            let mut arrived = self.arrived.borrow_mut();
            let n = max.min(arrived.len());
            arrived.drain(..n).collect()
        };
        if !taken.is_empty() {
            self.taken.notify();
        }
        taken
    }

    /// Wait up to `ms` until an item is there (or the stream ended, or `stop` is set).
    pub(crate) async fn wait(&self, ms: u32, stop: Option<&Latch>) {
        if !self.arrived.borrow().is_empty() || self.ended.get() {
            return;
        }
        let woken = pin!(self.wake.notified());
        let timer = pin!(host::sleep(ms));
        match stop {
            Some(stop) => {
                select(select(woken, timer), pin!(stop.wait())).await;
            }
            None => {
                select(woken, timer).await;
            }
        }
    }

    /// Stop reading: the driver stream is dropped, which ends its reader or member.
    pub(crate) fn close(&self) {
        self.stop.set();
    }
}
