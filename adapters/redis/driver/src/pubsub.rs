//! A pub/sub subscription as a batch source for a guest-read stream: each message's payload,
//! in order. The subscription owns its connection; dropping it (the guest dropped its stream)
//! closes the connection, which unsubscribes (`unsubscribe` does it with the server's
//! confirmation, then the stream ends once it has yielded what arrived before). A lost
//! connection ends the stream.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use futures::task::AtomicWaker;
use redis::aio::PubSubStream;

use super::connection::Connections;
use wrpc_broker_runtime::streams::PollBatch;

/// Raised once the server confirmed the `UNSUBSCRIBE` of a subscription (or gave up on it):
/// every message published before is already in the stream's buffer, so the stream ends when
/// that buffer is empty.
#[derive(Default)]
pub(crate) struct Unsubscribed {
    raised: AtomicBool,
    waker: AtomicWaker,
}

impl Unsubscribed {
    /// Raise it and wake the stream's reader.
    pub(crate) fn raise(&self) {
        self.raised.store(true, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Whether it was raised; if not, `cx` is woken when it is.
    fn poll(&self, cx: &Context<'_>) -> bool {
        self.waker.register(cx.waker());
        self.raised.load(Ordering::SeqCst)
    }
}

/// The payloads of one confirmed subscription.
pub(crate) struct Subscription {
    id: u64,
    stream: PubSubStream,
    unsubscribed: Arc<Unsubscribed>,
    conns: Arc<Connections>,
}

impl Subscription {
    pub(crate) fn new(
        id: u64,
        stream: PubSubStream,
        unsubscribed: Arc<Unsubscribed>,
        conns: Arc<Connections>,
    ) -> Self {
        Self {
            id,
            stream,
            unsubscribed,
            conns,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.conns.forget(self.id);
    }
}

impl PollBatch for Subscription {
    type Item = Vec<u8>;

    fn poll_batch(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<Vec<Vec<u8>>>> {
        let mut batch = Vec::new();
        while batch.len() < max {
            match Pin::new(&mut self.stream).poll_next(cx) {
                Poll::Ready(Some(msg)) => batch.push(msg.get_payload_bytes().to_vec()),
                Poll::Ready(None) if batch.is_empty() => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        if batch.is_empty() {
            // Nothing buffered: after a confirmed unsubscribe nothing more comes.
            if self.unsubscribed.poll(cx) {
                return Poll::Ready(None);
            }
            Poll::Pending
        } else {
            Poll::Ready(Some(batch))
        }
    }
}
