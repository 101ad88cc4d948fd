//! A pub/sub subscription as a batch source for a guest-read stream: each message's payload,
//! in order. The subscription owns its connection; dropping it (the guest dropped its stream)
//! closes the connection, which unsubscribes (`unsubscribe` does it with the server's
//! confirmation). A lost connection ends the stream.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use redis::aio::PubSubStream;

use super::connection::Connections;
use crate::runtime::streams::PollBatch;

/// The payloads of one confirmed subscription.
pub(crate) struct Subscription {
    id: u64,
    stream: PubSubStream,
    conns: Arc<Connections>,
}

impl Subscription {
    pub(crate) fn new(id: u64, stream: PubSubStream, conns: Arc<Connections>) -> Self {
        Self { id, stream, conns }
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
            Poll::Pending
        } else {
            Poll::Ready(Some(batch))
        }
    }
}
