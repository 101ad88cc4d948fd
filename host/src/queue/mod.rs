//! The queue capability: at-least-once work queues with competing consumers, retry and
//! dead-lettering.
//!
//! Produces to one queue are coalesced into batches. A [`Consumer`] runs the handler on up to
//! `prefetch` deliveries at once; each [`Delivery`] settles once (the first settlement wins,
//! enforced here), and settlements reach the adapter in batches with their generation-stamped
//! tags. A handler that fails has settled nothing: the delivery is retried after a backoff
//! (50 ms doubling to 1 s), attempt + 1. If the adapter's delivery stream ends (a trap replaced
//! the instance) the consumer starts again on the new instance; what was unsettled comes back
//! by the broker's redelivery.

mod consumer;
mod delivery;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::batch::{BatchCall, Batchers};
use crate::bindings::queue as wit;
use crate::error::{Error, Result};
use crate::handover::{Handover, Migration, MigrationEvent, Progress, QueueDrain, Step};
use crate::log::Headers;
use crate::runtime::AdapterInstance;
use crate::runtime::trace::TargetLogger;
use crate::slot::{AdapterSlot, Held};
use consumer::{ConsumerShared, Move};
use delivery::run_settler;

pub use delivery::Delivery;

/// Messages carried by one `produce` call at most.
const MAX_PRODUCE_BATCH: usize = 256;
/// Settlements carried by one `settle` call at most.
const MAX_SETTLE_BATCH: usize = 256;
/// The first backoff after a handler failed; it doubles per attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The longest backoff after a handler failed.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Pause before consuming again after the adapter's delivery stream ended.
const RECONSUME_PAUSE: Duration = Duration::from_millis(50);

/// Headers of a produced message.
#[derive(Debug, Clone, Default)]
pub struct ProduceOptions {
    /// Headers delivered with the message.
    pub headers: Headers,
}

/// How a consumer takes deliveries.
#[derive(Debug, Clone)]
pub struct ConsumeOptions {
    /// At most this many unsettled deliveries at once, handled concurrently (at least 1).
    pub prefetch: u32,
    /// Where dead-lettered messages go; the adapter's default (`<queue>.dead`) when `None`.
    pub dead_letter: Option<String>,
}

impl Default for ConsumeOptions {
    fn default() -> Self {
        Self {
            prefetch: 16,
            dead_letter: None,
        }
    }
}

/// What a settlement call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// This settlement was the first: it was applied.
    Applied,
    /// An earlier settlement of this delivery won; this one did nothing.
    AlreadySettled {
        /// The settlement that won: `ack`, `retry`, `release` or `dead-letter`.
        first: &'static str,
    },
}

/// The backoff before retrying a delivery whose handler failed on `attempt`.
pub fn handler_backoff(attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(16);
    (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
}

/// Per-broker queue machinery: the produce batchers and the live consumers.
pub(crate) struct Queues {
    produces: Batchers<wit::Message, ()>,
    consumers: Mutex<Vec<std::sync::Weak<ConsumerShared>>>,
}

impl Queues {
    pub(crate) fn new(slot: Arc<AdapterSlot>) -> Self {
        let produce: Arc<BatchCall<wit::Message, ()>> = Arc::new(|adapter, queue, messages| {
            Box::pin(async move {
                let count = messages.len();
                adapter
                    .queue_produce(queue, messages)
                    .await
                    .map(|()| vec![(); count])
            })
        });
        Self {
            produces: Batchers::new(slot, MAX_PRODUCE_BATCH, produce),
            consumers: Mutex::new(Vec::new()),
        }
    }

    /// The consumers not yet dropped.
    fn live(&self) -> Vec<Arc<ConsumerShared>> {
        let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        consumers.retain(|c| c.strong_count() > 0);
        consumers.iter().filter_map(|c| c.upgrade()).collect()
    }

    /// Move every live consumer to the slot's current adapter: each drains its session on the
    /// old one (handlers in flight finish within [`SWITCH_GRACE`], unsettled deliveries are
    /// released) and consumes again on the new one. Returns once all have moved.
    pub(crate) async fn switch_all(&self) {
        let live = self.live();
        let moves = live.iter().map(|consumer| async move {
            let (reply, done) = oneshot::channel();
            if consumer.switch_tx.send(Move::Swap(reply)).await.is_ok() {
                let _ = done.await;
            }
        });
        futures::future::join_all(moves).await;
    }

    /// A migration: every live consumer consumes on the slot's current adapter at once and keeps
    /// draining its session on the old one until the old broker's queue is empty (or
    /// `deadline`). Returns once all consume on the new adapter, with the queue of each
    /// consumer and an answer that comes when its old queue was drained or given up.
    pub(crate) async fn migrate_all(
        &self,
        deadline: Instant,
    ) -> Vec<(String, oneshot::Receiver<QueueDrain>)> {
        let live = self.live();
        let moves = live.iter().map(|consumer| async move {
            let (moved, on_new) = oneshot::channel();
            let (drained, answer) = oneshot::channel();
            let request = Move::Migrate {
                deadline,
                moved,
                drained,
            };
            if consumer.switch_tx.send(request).await.is_ok() {
                let _ = on_new.await;
            }
            (consumer.queue.clone(), answer)
        });
        futures::future::join_all(moves).await
    }
}

/// A migration of the queues: consumers consume on the new broker and drain the old one.
struct QueueMigration<'a>(&'a Queues);

impl Handover for Queues {
    fn swapped<'a>(&'a self, _new: &'a AdapterInstance) -> Step<'a> {
        Box::pin(self.switch_all())
    }

    fn migrating<'a>(
        &'a self,
        _old: &'a AdapterInstance,
        _new: &'a AdapterInstance,
    ) -> Step<'a, Box<dyn Migration + 'a>> {
        Box::pin(async move { Box::new(QueueMigration(self)) as Box<dyn Migration> })
    }
}

impl Migration for QueueMigration<'_> {
    fn drain<'a>(&'a mut self, deadline: Instant, progress: &'a Progress) -> Step<'a> {
        Box::pin(async move {
            let drains = self.0.migrate_all(deadline).await;
            progress(MigrationEvent::ConsumersMoved {
                queues: drains.len(),
            });
            let mut pending: futures::stream::FuturesUnordered<_> =
                drains.into_iter().map(|(_, answer)| answer).collect();
            while let Some(answer) = futures::StreamExt::next(&mut pending).await {
                if let Ok(drain) = answer {
                    progress(MigrationEvent::QueueDrained(drain));
                }
            }
        })
    }
}

/// A handler: gets each delivery, may settle it; `Ok` without a settlement acks it, `Err` (or a
/// panic) retries it after a backoff.
type Handler =
    dyn Fn(Delivery) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync;

/// The queue capability of one broker.
#[derive(Clone)]
pub struct Queue {
    inner: Held<Queues>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

impl Queue {
    pub(crate) fn new(inner: Held<Queues>) -> Self {
        Self { inner }
    }

    /// Put `body` on `queue`. Returns once the broker has it. Concurrent produces are batched.
    pub async fn produce(
        &self,
        queue: &str,
        body: impl Into<Vec<u8>>,
        options: ProduceOptions,
    ) -> Result<()> {
        let message = wit::Message {
            body: body.into(),
            headers: options.headers,
        };
        self.inner.live.produces.submit(queue, message).await
    }

    /// Put several messages on `queue`, in order, in one adapter call.
    pub async fn produce_batch(
        &self,
        queue: &str,
        messages: Vec<(Vec<u8>, ProduceOptions)>,
    ) -> Result<()> {
        let batch = messages
            .into_iter()
            .map(|(body, o)| wit::Message {
                body,
                headers: o.headers,
            })
            .collect();
        let batch: Vec<wit::Message> = batch;
        self.inner
            .slot
            .retry_trapped(|adapter| {
                let (first, second) = (queue.to_string(), batch.clone());
                async move { adapter.queue_produce(first, second).await }
            })
            .await
    }

    /// How many messages of `queue` are not yet done on the broker: waiting, delayed for a
    /// retry, or delivered and unsettled (by any host instance).
    pub async fn depth(&self, queue: &str) -> Result<u64> {
        self.inner
            .slot
            .current()
            .queue_depth(queue.to_string())
            .await
    }

    /// Consume `queue`: `handler` runs on each delivery, up to `prefetch` at once. Returns once
    /// the adapter consumes; stop it with [`Consumer::stop`].
    pub async fn consume<H, F>(
        &self,
        queue: &str,
        handler: H,
        options: ConsumeOptions,
    ) -> Result<Consumer>
    where
        H: Fn(Delivery) -> F + Send + Sync + 'static,
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        if options.prefetch == 0 {
            return Err(Error::BadRequest("prefetch must be at least 1".into()));
        }
        let adapter = self.inner.slot.current();
        let (settle_tx, settle_rx) = mpsc::channel(4 * MAX_SETTLE_BATCH);
        let (switch_tx, switch_rx) = mpsc::channel(4);
        let shared = Arc::new(ConsumerShared {
            queue: queue.to_string(),
            options: options.clone(),
            slot: self.inner.slot.clone(),
            handler: Arc::new(move |d| Box::pin(handler(d))),
            healthy: AtomicBool::new(true),
            current: Mutex::new(None),
            stopping: CancellationToken::new(),
            slots: Arc::new(Semaphore::new(options.prefetch as usize)),
            settle_tx,
            switch_tx,
            settle_log: TargetLogger::new(&format!("broker.{}.settle", adapter.info().name)),
        });
        let (session, deliveries) = shared.start_session().await?;
        tokio::spawn(run_settler(settle_rx));
        let runner = tokio::spawn(shared.clone().run(session, deliveries, switch_rx));
        self.inner
            .live
            .consumers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&shared));
        Ok(Consumer {
            shared,
            runner: Mutex::new(Some(runner)),
        })
    }
}

/// How long handlers in flight may take to finish when a consumer moves to a new adapter.
pub(crate) const SWITCH_GRACE: Duration = Duration::from_secs(5);

/// A running consumer. Dropping it stops it in the background; [`Consumer::stop`] waits.
pub struct Consumer {
    shared: Arc<ConsumerShared>,
    runner: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("queue", &self.shared.queue)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// The queue it consumes.
    pub fn queue(&self) -> &str {
        &self.shared.queue
    }

    /// Take no new deliveries, wait for the handlers in flight, and stop the adapter consumer;
    /// what is unsettled is redelivered later.
    pub async fn stop(&self) {
        self.shared.stopping.cancel();
        let runner = self.runner.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(runner) = runner {
            let _ = runner.await;
        }
    }

    /// False while settlements are refused or the adapter consumer is being re-established, or
    /// when the adapter says the consumer lost its broker subscription.
    pub async fn healthy(&self) -> bool {
        if !self.shared.healthy.load(Ordering::Relaxed) {
            return false;
        }
        let current = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(session) = current else { return false };
        session
            .instance
            .queue_healthy(session.id)
            .await
            .ok()
            .flatten()
            .unwrap_or(true)
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.shared.stopping.cancel();
    }
}
