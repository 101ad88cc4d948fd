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

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::{BatchCall, Batchers};
use crate::bindings::{queue as wit, types};
use crate::broker::{AdapterSlot, Inner};
use crate::error::{Error, Result};
use crate::log::Headers;
use crate::migrate::QueueDrain;
use crate::runtime::AdapterInstance;
use crate::runtime::trace::TargetLogger;

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

/// How often a consumer draining an old broker asks it how much is left.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// A request to a consumer's runner to move to the slot's current adapter.
enum Move {
    /// A hot swap (same broker): drain the old session, then consume on the new adapter;
    /// answered once it consumes there.
    Swap(oneshot::Sender<()>),
    /// A migration (another broker): consume on the new adapter at once (`moved`), and keep
    /// handling the old session's deliveries until the old queue is empty or `deadline`
    /// (`drained`).
    Migrate {
        deadline: Instant,
        moved: oneshot::Sender<()>,
        drained: oneshot::Sender<QueueDrain>,
    },
}

/// A handler: gets each delivery, may settle it; `Ok` without a settlement acks it, `Err` (or a
/// panic) retries it after a backoff.
type Handler =
    dyn Fn(Delivery) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync;

/// The queue capability of one broker.
#[derive(Clone)]
pub struct Queue {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

impl Queue {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
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
        self.inner.queues.produces.submit(queue, message).await
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
            .queues
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

/// One `consume` of one adapter instance: settlements of its deliveries go back to it.
struct Session {
    instance: AdapterInstance,
    id: wit::ConsumerId,
    /// The handlers of this session's deliveries.
    handlers: TaskTracker,
}

struct ConsumerShared {
    queue: String,
    options: ConsumeOptions,
    slot: Arc<AdapterSlot>,
    handler: Arc<Handler>,
    /// False from a refused settlement until one lands again.
    healthy: AtomicBool,
    /// The live session, if any.
    current: Mutex<Option<Arc<Session>>>,
    stopping: CancellationToken,
    /// Bounds handlers in flight to `prefetch`, whatever the adapter delivers.
    slots: Arc<Semaphore>,
    settle_tx: mpsc::Sender<SettleRequest>,
    /// Asks the runner to move to the slot's current adapter.
    switch_tx: mpsc::Sender<Move>,
    settle_log: TargetLogger,
}

struct SettleRequest {
    session: Arc<Session>,
    tag: types::Tag,
    settlement: wit::Settlement,
    reply: oneshot::Sender<Result<()>>,
}

type Deliveries = mpsc::Receiver<Vec<wit::Delivery>>;

impl ConsumerShared {
    /// Consume on the slot's current adapter; the session becomes the live one.
    async fn start_session(&self) -> Result<(Arc<Session>, Deliveries)> {
        let (session, deliveries) = self.open_session(self.slot.current()).await?;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(session.clone());
        Ok((session, deliveries))
    }

    /// Consume on `instance`.
    async fn open_session(&self, instance: AdapterInstance) -> Result<(Arc<Session>, Deliveries)> {
        let options = wit::ConsumeOptions {
            prefetch: self.options.prefetch,
            dead_letter: self.options.dead_letter.clone(),
        };
        let (id, deliveries) = instance.queue_consume(self.queue.clone(), options).await?;
        let session = Arc::new(Session {
            instance,
            id,
            handlers: TaskTracker::new(),
        });
        Ok((session, deliveries))
    }

    /// Run the handler on each delivery of `batch` (at most `prefetch` at once); false when
    /// the consumer was stopped.
    async fn dispatch(self: &Arc<Self>, session: &Arc<Session>, batch: Vec<wit::Delivery>) -> bool {
        for delivery in batch {
            let Ok(permit) = self.slots.clone().acquire_owned().await else {
                return false;
            };
            let delivery = Delivery::new(self.clone(), session.clone(), delivery);
            let shared = self.clone();
            session.handlers.spawn(async move {
                shared.handle(delivery).await;
                drop(permit);
            });
        }
        true
    }

    /// A migration left `session` on the old broker: keep handling its deliveries until the
    /// old queue is empty (nothing waiting, delayed or unsettled there), the `deadline` passes
    /// or the consumer stops; then stop it (what is unsettled goes back to the old broker).
    async fn drain_migrated(
        self: Arc<Self>,
        mut session: Arc<Session>,
        mut deliveries: Deliveries,
        deadline: Instant,
    ) -> QueueDrain {
        let started = Instant::now();
        let old = session.instance.clone();
        let mut poll = tokio::time::interval(DRAIN_POLL);
        let mut depth = None;
        loop {
            tokio::select! {
                biased;
                _ = self.stopping.cancelled() => break,
                _ = tokio::time::sleep_until(deadline.into()) => break,
                batch = deliveries.recv() => match batch {
                    Some(batch) => {
                        if !self.dispatch(&session, batch).await {
                            break;
                        }
                    }
                    None => {
                        // The old adapter cut the stream (a trap): consume there again.
                        tokio::time::sleep(RECONSUME_PAUSE).await;
                        match self.open_session(old.clone()).await {
                            Ok(next) => (session, deliveries) = next,
                            Err(e) => {
                                tracing::warn!(queue = %self.queue, "draining the old broker: {e}");
                                break;
                            }
                        }
                    }
                },
                _ = poll.tick() => match old.queue_depth(self.queue.clone()).await {
                    Ok(0) => {
                        depth = Some(0);
                        break;
                    }
                    Ok(n) => depth = Some(n),
                    Err(e) => tracing::debug!(queue = %self.queue, "asking the old broker for the queue depth: {e}"),
                },
            }
        }
        self.drain(&session, deliveries).await;
        let left = if depth == Some(0) {
            0
        } else {
            old.queue_depth(self.queue.clone())
                .await
                .unwrap_or(depth.unwrap_or(u64::MAX))
        };
        QueueDrain {
            queue: self.queue.clone(),
            drained: left == 0,
            left,
            took: started.elapsed(),
        }
    }

    /// Consume again on the slot's current adapter, retrying until it answers or the consumer
    /// stops.
    async fn restart(&self) -> Option<(Arc<Session>, Deliveries)> {
        loop {
            if self.stopping.is_cancelled() {
                return None;
            }
            match self.start_session().await {
                Ok(started) => return Some(started),
                Err(Error::Closed(_)) => return None,
                Err(e) => {
                    tracing::warn!(queue = %self.queue, "consuming again: {e}");
                    tokio::time::sleep(RECONSUME_PAUSE).await;
                }
            }
        }
    }

    /// Hand deliveries to handlers until stopped; move sessions when asked or when the stream
    /// ends (a trap replaced the instance).
    async fn run(
        self: Arc<Self>,
        mut session: Arc<Session>,
        mut deliveries: Deliveries,
        mut switches: mpsc::Receiver<Move>,
    ) {
        loop {
            tokio::select! {
                biased;
                _ = self.stopping.cancelled() => break,
                Some(request) = switches.recv() => match request {
                    Move::Swap(moved) => {
                        self.drain(&session, deliveries).await;
                        let Some(next) = self.restart().await else {
                            let _ = moved.send(());
                            return;
                        };
                        (session, deliveries) = next;
                        let _ = moved.send(());
                    }
                    Move::Migrate { deadline, moved, drained } => {
                        let next = self.restart().await;
                        let _ = moved.send(());
                        let draining =
                            self.clone().drain_migrated(session.clone(), deliveries, deadline);
                        tokio::spawn(async move {
                            let _ = drained.send(draining.await);
                        });
                        let Some(next) = next else { return };
                        (session, deliveries) = next;
                    }
                },
                batch = deliveries.recv() => match batch {
                    Some(batch) => {
                        if !self.dispatch(&session, batch).await {
                            return;
                        }
                    }
                    None => {
                        // The stream ended without a stop: the instance was replaced, or the
                        // adapter cut it. What was unsettled comes back by redelivery.
                        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
                        tokio::time::sleep(RECONSUME_PAUSE).await;
                        let Some(next) = self.restart().await else { return };
                        (session, deliveries) = next;
                    }
                },
            }
        }
        self.drain(&session, deliveries).await;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Take no more deliveries from `session`, let its handlers finish (within
    /// [`SWITCH_GRACE`]), then stop the adapter consumer: what is unsettled goes back to the
    /// broker for redelivery.
    async fn drain(&self, session: &Session, deliveries: Deliveries) {
        drop(deliveries);
        session.handlers.close();
        if tokio::time::timeout(SWITCH_GRACE, session.handlers.wait())
            .await
            .is_err()
        {
            tracing::warn!(queue = %self.queue, "handlers still running after {SWITCH_GRACE:?}; their deliveries come back by redelivery");
        }
        if let Err(e) = session.instance.queue_stop(session.id).await {
            tracing::debug!(queue = %self.queue, "stopping the adapter consumer: {e}");
        }
    }

    /// Run the handler on one delivery; settle it if the handler did not.
    async fn handle(&self, delivery: Delivery) {
        let state = delivery.state.clone();
        let attempt = delivery.attempt;
        let outcome = AssertUnwindSafe((self.handler)(delivery.clone()))
            .catch_unwind()
            .await;
        if state
            .first
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            return;
        }
        let result = match outcome {
            Ok(Ok(())) => delivery.ack().await,
            Ok(Err(e)) => {
                let backoff = handler_backoff(attempt);
                tracing::warn!(queue = %self.queue, attempt, ?backoff, "handler failed, retrying: {e:#}");
                delivery.retry(backoff).await
            }
            Err(_) => {
                let backoff = handler_backoff(attempt);
                tracing::warn!(queue = %self.queue, attempt, ?backoff, "handler panicked, retrying");
                delivery.retry(backoff).await
            }
        };
        if let Err(e) = result {
            tracing::debug!(queue = %self.queue, "settling after the handler: {e}");
        }
    }

    async fn settle(
        &self,
        session: &Arc<Session>,
        tag: types::Tag,
        settlement: wit::Settlement,
    ) -> Result<()> {
        let generation = session.instance.generation();
        if tag.generation != generation {
            return Err(Error::Stale(format!(
                "the delivery came from adapter generation {}, the adapter is now generation {generation}; \
                 the broker redelivers it",
                tag.generation
            )));
        }
        let (reply, answer) = oneshot::channel();
        self.settle_tx
            .send(SettleRequest {
                session: session.clone(),
                tag,
                settlement,
                reply,
            })
            .await
            .map_err(|_| Error::Closed("the consumer was stopped".into()))?;
        let result = answer
            .await
            .map_err(|_| Error::Closed("the consumer was stopped".into()))?;
        match &result {
            Ok(()) => self.healthy.store(true, Ordering::Relaxed),
            Err(Error::Refused(why)) => {
                self.healthy.store(false, Ordering::Relaxed);
                self.settle_log.log(
                    tracing::Level::WARN,
                    &format!(
                        "queue {}: settlement refused by the broker, message handed back: {why}",
                        self.queue
                    ),
                );
            }
            Err(_) => {}
        }
        result
    }
}

/// Batches settlements into `settle` calls, per session, in order.
async fn run_settler(mut rx: mpsc::Receiver<SettleRequest>) {
    let mut waiting = Vec::with_capacity(MAX_SETTLE_BATCH);
    while rx.recv_many(&mut waiting, MAX_SETTLE_BATCH).await > 0 {
        let mut by_session: Vec<(Arc<Session>, Vec<SettleRequest>)> = Vec::new();
        for request in waiting.drain(..) {
            match by_session
                .iter_mut()
                .find(|(s, _)| Arc::ptr_eq(s, &request.session))
            {
                Some((_, requests)) => requests.push(request),
                None => by_session.push((request.session.clone(), vec![request])),
            }
        }
        for (session, requests) in by_session {
            let (batch, replies): (Vec<_>, Vec<_>) = requests
                .into_iter()
                .map(|r| ((r.tag, r.settlement), r.reply))
                .unzip();
            let count = batch.len();
            match session.instance.queue_settle(session.id, batch).await {
                Ok(results) if results.len() == count => {
                    for (reply, result) in replies.into_iter().zip(results) {
                        let _ = reply.send(result);
                    }
                }
                Ok(results) => {
                    let e = Error::Internal(format!(
                        "the adapter answered {} results for {count} settlements",
                        results.len()
                    ));
                    replies
                        .into_iter()
                        .for_each(|r| drop(r.send(Err(e.clone()))));
                }
                Err(e) => replies
                    .into_iter()
                    .for_each(|r| drop(r.send(Err(e.clone())))),
            }
        }
    }
}

/// Which settlement won, shared by the clones of one delivery.
#[derive(Default)]
struct DeliveryState {
    first: Mutex<Option<&'static str>>,
}

/// One delivery of a message to a consumer. Settle it once: the first of [`Delivery::ack`],
/// [`Delivery::retry`], [`Delivery::release`], [`Delivery::dead_letter`] wins; later ones do
/// nothing and answer [`Settled::AlreadySettled`].
#[derive(Clone)]
pub struct Delivery {
    /// The message body.
    pub body: Vec<u8>,
    /// The message headers.
    pub headers: Headers,
    /// 1 on the first delivery; + 1 per retry and per failed handler.
    pub attempt: u32,
    consumer: Arc<ConsumerShared>,
    session: Arc<Session>,
    tag: types::Tag,
    state: Arc<DeliveryState>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("queue", &self.consumer.queue)
            .field("attempt", &self.attempt)
            .field("generation", &self.tag.generation)
            .field("seq", &self.tag.seq)
            .field("bytes", &self.body.len())
            .finish()
    }
}

impl Delivery {
    fn new(consumer: Arc<ConsumerShared>, session: Arc<Session>, d: wit::Delivery) -> Self {
        Self {
            body: d.body,
            headers: d.headers,
            attempt: d.attempt,
            consumer,
            session,
            tag: d.tag,
            state: Arc::default(),
        }
    }

    /// The queue it came from.
    pub fn queue(&self) -> &str {
        &self.consumer.queue
    }

    async fn settle(&self, kind: &'static str, settlement: wit::Settlement) -> Result<Settled> {
        {
            let mut first = self.state.first.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(first) = *first {
                tracing::debug!(queue = %self.consumer.queue, first, ignored = kind, "delivery already settled");
                return Ok(Settled::AlreadySettled { first });
            }
            *first = Some(kind);
        }
        self.consumer
            .settle(&self.session, self.tag, settlement)
            .await?;
        Ok(Settled::Applied)
    }

    /// Done with the message.
    pub async fn ack(&self) -> Result<Settled> {
        self.settle("ack", wit::Settlement::Ack).await
    }

    /// Redeliver it after `delay`, attempt + 1.
    pub async fn retry(&self, delay: Duration) -> Result<Settled> {
        let ms = u32::try_from(delay.as_millis()).unwrap_or(u32::MAX);
        self.settle("retry", wit::Settlement::Retry(ms)).await
    }

    /// Put it back on the queue now, attempt unchanged (hand work over).
    pub async fn release(&self) -> Result<Settled> {
        self.settle("release", wit::Settlement::Release).await
    }

    /// Move it to the dead-letter queue with `reason` (kept to one line of 512 characters).
    pub async fn dead_letter(&self, reason: &str) -> Result<Settled> {
        self.settle(
            "dead-letter",
            wit::Settlement::DeadLetter(reason.to_string()),
        )
        .await
    }
}

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
