//! A consumer's deliveries, read off the driver's stream by a task of their own into a buffer
//! the consumer takes from with a bounded wait. (A driver stream read is never cut short by a
//! timeout, which could drop what it had read.) A stream-queue consumer acknowledges on its own
//! channel (`multiple`) once [`ACK_EVERY`] deliveries are unacknowledged: acks there are only the
//! broker's credit, and a waiter is told of a batch before any ack of it is sent.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::pin::pin;
use std::rc::Rc;

use futures::future::{Either, select};
use wit_bindgen::{StreamReader, StreamResult};

use crate::wrpc::amqp::client::{self, Delivery};
use wrpc_broker_guest::host;
use wrpc_broker_guest::signal::{Latch, Notify, Ticker};

/// How many deliveries one read of the driver stream takes at most.
const BATCH: usize = 256;
/// A stream reader acknowledges once this many deliveries are unacknowledged: well inside
/// its credit (`log::READ_PREFETCH`), and no ack per delivery when one arrives at a time.
const ACK_EVERY: usize = 64;

/// What a consumer's stream brought.
#[derive(Default)]
pub(crate) struct Inbox {
    arrived: RefCell<VecDeque<Delivery>>,
    /// Fires when deliveries arrived or the stream ended.
    wake: Notify,
    /// True once the driver stream ended (consumer cancelled, channel closed).
    ended: Cell<bool>,
    /// Set to stop reading (the stream is dropped: the driver cancels the consumer).
    stop: Latch,
}

impl Inbox {
    /// Start reading `from`; with `ack_on`, acknowledge each batch on that channel.
    pub(crate) fn start(from: StreamReader<Delivery>, ack_on: Option<u64>) -> Rc<Inbox> {
        let inbox = Rc::new(Inbox::default());
        wit_bindgen::spawn_local(inbox.clone().read(from, ack_on));
        inbox
    }

    async fn read(self: Rc<Self>, mut from: StreamReader<Delivery>, ack_on: Option<u64>) {
        let mut unacked = 0;
        loop {
            let read = pin!(from.read(Vec::with_capacity(BATCH)));
            let (result, batch) = match select(read, pin!(self.stop.wait())).await {
                Either::Left((read, _)) => read,
                Either::Right(_) => break,
            };
            let last_tag = batch.last().map(|d| d.delivery_tag);
            unacked += batch.len();
            self.arrived.borrow_mut().extend(batch);
            self.wake.notify();
            if let (Some(channel), Some(tag)) = (ack_on, last_tag)
                && unacked >= ACK_EVERY
            {
                unacked = 0;
                let _ = client::ack(channel, tag, true).await;
            }
            if !matches!(result, StreamResult::Complete(_)) {
                break;
            }
        }
        self.ended.set(true);
        self.wake.notify();
    }

    /// Whether the driver stream ended and everything it brought was taken.
    pub(crate) fn is_done(&self) -> bool {
        self.ended.get() && self.arrived.borrow().is_empty()
    }

    /// Whether the driver stream ended.
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.get()
    }

    /// Up to `max` deliveries that arrived.
    pub(crate) fn take(&self, max: usize) -> Vec<Delivery> {
        let mut arrived = self.arrived.borrow_mut();
        let n = max.min(arrived.len());
        arrived.drain(..n).collect()
    }

    /// How many deliveries wait to be taken.
    pub(crate) fn len(&self) -> usize {
        self.arrived.borrow().len()
    }

    /// Wait up to `ms` until a delivery is there (or the stream ended, or `stop` is set).
    pub(crate) async fn wait(&self, ms: u32, stop: Option<&Latch>) {
        if !self.arrived.borrow().is_empty() || self.ended.get() {
            return;
        }
        let woken = pin!(self.wake.notified());
        let timer = pin!(host::sleep(ms));
        match stop {
            Some(stop) => {
                let stopped = pin!(stop.wait());
                select(select(woken, timer), stopped).await;
            }
            None => {
                select(woken, timer).await;
            }
        }
    }

    /// Wait until a delivery is there, the stream ended, `stop` is set, or `tick` fired
    /// (true): a loop waiting for each delivery starts a host timer per period, not per wait.
    pub(crate) async fn wait_on(&self, tick: &Ticker, stop: Option<&Latch>) -> bool {
        if !self.arrived.borrow().is_empty() || self.ended.get() {
            return false;
        }
        let woken = pin!(self.wake.notified());
        let ticked = pin!(tick.tick());
        match stop {
            Some(stop) => matches!(
                select(select(woken, ticked), pin!(stop.wait())).await,
                Either::Left((Either::Right(_), _))
            ),
            None => matches!(select(woken, ticked).await, Either::Right(_)),
        }
    }

    /// The next delivery, waiting up to `ms`; none on timeout or when the stream ended.
    pub(crate) async fn next(&self, ms: u32) -> Option<Delivery> {
        self.wait(ms, None).await;
        self.arrived.borrow_mut().pop_front()
    }

    /// Stop reading: the driver stream is dropped, which cancels its consumer.
    pub(crate) fn close(&self) {
        self.stop.set();
    }
}
