//! Subscriptions a guest can leave without losing what is on its way: a task owns each
//! `async_nats::Subscriber` and forwards its messages to the guest's stream; `unsubscribe` asks
//! that task to drain it (UNSUB, then every message the client already holds), and the stream
//! ends after the last of those. Dropping the stream still unsubscribes at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use async_nats::{Message, Subscriber};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use crate::runtime::streams::PollBatch;

/// Messages a subscription's task holds for the guest before it waits for the guest to read.
const FORWARD_BUFFER: usize = 256;

/// A drain request: answered once the UNSUB is on its way to the server.
type DrainRequest = oneshot::Sender<()>;

/// The live subscriptions of one connection, by id.
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    next: AtomicU64,
    drains: Mutex<HashMap<u64, oneshot::Sender<DrainRequest>>>,
}

impl Subscriptions {
    /// Hand `subscriber` to a forwarding task: its id and the guest's side of it.
    pub(crate) fn add(self: &Arc<Self>, subscriber: Subscriber) -> (u64, Subscription) {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let (drain_tx, drain_rx) = oneshot::channel();
        self.lock().insert(id, drain_tx);
        let (tx, rx) = mpsc::channel(FORWARD_BUFFER);
        tokio::spawn(forward(subscriber, tx, drain_rx, id, self.clone()));
        (id, Subscription(rx))
    }

    /// Ask subscription `id` to drain; returns once its UNSUB is queued on the connection.
    /// False when it is unknown or already ended or draining.
    pub(crate) async fn drain(&self, id: u64) -> bool {
        let Some(drain) = self.lock().remove(&id) else {
            return false;
        };
        let (queued_tx, queued) = oneshot::channel();
        drain.send(queued_tx).is_ok() && queued.await.is_ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<DrainRequest>>> {
        self.drains.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Forward `subscriber`'s messages to `tx` (holding at most one while the guest is behind)
/// until the subscription ends (a drain completed, or the connection closed for good) or the
/// guest dropped its stream; drain it when asked.
async fn forward(
    mut subscriber: Subscriber,
    tx: mpsc::Sender<Message>,
    mut drain: oneshot::Receiver<DrainRequest>,
    id: u64,
    subscriptions: Arc<Subscriptions>,
) {
    let mut held: Option<Message> = None;
    let mut draining = false;
    loop {
        tokio::select! {
            biased;
            request = &mut drain, if !draining => {
                draining = true;
                if let Ok(queued) = request {
                    if let Err(e) = subscriber.drain().await {
                        tracing::debug!(subscription = id, "nats: drain: {e}");
                    }
                    let _ = queued.send(());
                }
            }
            permit = tx.reserve(), if held.is_some() => match (permit, held.take()) {
                (Ok(permit), Some(message)) => permit.send(message),
                _ => break,
            },
            _ = tx.closed(), if held.is_none() => break,
            message = subscriber.next(), if held.is_none() => match message {
                Some(message) => held = Some(message),
                None => break,
            },
        }
    }
    subscriptions.lock().remove(&id);
}

/// The guest's side of a subscription: a batch source for its stream.
pub(crate) struct Subscription(mpsc::Receiver<Message>);

impl PollBatch for Subscription {
    type Item = Message;

    fn poll_batch(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<Vec<Message>>> {
        let mut batch = Vec::new();
        match self.0.poll_recv_many(cx, &mut batch, max.max(1)) {
            Poll::Ready(0) => Poll::Ready(None),
            Poll::Ready(_) => Poll::Ready(Some(batch)),
            Poll::Pending => Poll::Pending,
        }
    }
}
