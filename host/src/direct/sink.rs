//! Where an adapter listener's packets go as the instance reads them: straight to whoever
//! takes them in place (a [`Taker`]: the reply inbox hands a reply to its request, a listener
//! starts a handler), and into the session's queue for what it does not take.

use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use tokio_util::sync::PollSender;

use crate::bindings::direct as wit;
use crate::runtime::streams::BatchSink;

/// Takes a batch of packets where the instance reads it, with no task in between.
pub(super) trait Taker: Send + Sync {
    /// Take what it can of `batch` now and put the rest into `queue` (see [`queue_rest`]),
    /// in order; false once the queue takes nothing more.
    fn take(
        self: Arc<Self>,
        batch: Vec<wit::Packet>,
        queue: &mut PollSender<Vec<wit::Packet>>,
    ) -> bool;
}

/// The sink of one adapter listener's packet stream: its queue, and the taker that may take
/// packets before they reach it.
pub(super) struct PacketSink {
    queue: PollSender<Vec<wit::Packet>>,
    taker: Weak<dyn Taker>,
}

impl PacketSink {
    /// A sink that offers each batch to `taker` first and queues the rest in `queue`.
    pub(super) fn new(queue: PollSender<Vec<wit::Packet>>, taker: Weak<dyn Taker>) -> Self {
        Self { queue, taker }
    }
}

impl BatchSink<wit::Packet> for PacketSink {
    /// Ready while the queue has room: a taker that takes nothing still has somewhere to put it.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        self.queue.poll_reserve(cx).map(|reserved| reserved.is_ok())
    }

    fn deliver(&mut self, batch: Vec<wit::Packet>) -> bool {
        match self.taker.upgrade() {
            Some(taker) => taker.take(batch, &mut self.queue),
            None => self.queue.send_item(batch).is_ok(),
        }
    }
}

/// Put what a taker left of a batch into the queue whose room was reserved for it (nothing
/// left: the room is given back). False once the queue takes nothing more.
pub(super) fn queue_rest(queue: &mut PollSender<Vec<wit::Packet>>, rest: Vec<wit::Packet>) -> bool {
    if rest.is_empty() {
        queue.abort_send();
        !queue.is_closed()
    } else {
        queue.send_item(rest).is_ok()
    }
}
