//! A consumer's run loop: its sessions on adapter instances, handing deliveries to
//! handlers, and moving to another adapter in a hot swap or a migration.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::delivery::{Delivery, SettleRequest};
use super::{ConsumeOptions, Handler, RECONSUME_PAUSE, SWITCH_GRACE, handler_backoff};
use crate::bindings::{queue as wit, types};
use crate::error::{Error, Result};
use crate::handover::QueueDrain;
use crate::runtime::AdapterInstance;
use crate::runtime::trace::TargetLogger;
use crate::slot::AdapterSlot;

/// How often a consumer draining an old broker asks it how much is left.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// A request to a consumer's runner to move to the slot's current adapter.
pub(super) enum Move {
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

/// One `consume` of one adapter instance: settlements of its deliveries go back to it.
pub(super) struct Session {
    pub(super) instance: AdapterInstance,
    pub(super) id: wit::ConsumerId,
    /// The handlers of this session's deliveries.
    handlers: TaskTracker,
}

pub(super) struct ConsumerShared {
    pub(super) queue: String,
    pub(super) options: ConsumeOptions,
    pub(super) slot: Arc<AdapterSlot>,
    pub(super) handler: Arc<Handler>,
    /// False from a refused settlement until one lands again.
    pub(super) healthy: AtomicBool,
    /// The live session, if any.
    pub(super) current: Mutex<Option<Arc<Session>>>,
    pub(super) stopping: CancellationToken,
    /// Bounds handlers in flight to `prefetch`, whatever the adapter delivers.
    pub(super) slots: Arc<Semaphore>,
    pub(super) settle_tx: mpsc::Sender<SettleRequest>,
    /// Asks the runner to move to the slot's current adapter.
    pub(super) switch_tx: mpsc::Sender<Move>,
    pub(super) settle_log: TargetLogger,
}

pub(super) type Deliveries = mpsc::Receiver<Vec<wit::Delivery>>;

impl ConsumerShared {
    /// Consume on the slot's current adapter; the session becomes the live one.
    pub(super) async fn start_session(&self) -> Result<(Arc<Session>, Deliveries)> {
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
        // The old broker is asked for its depth beside the handling, never in its way: a depth
        // that takes long to answer (Kafka's reads every topic's committed offsets) must not
        // hold the next batch back.
        let (depth_tx, mut depths) = mpsc::channel(1);
        let asking = {
            let (old, queue) = (old.clone(), self.queue.clone());
            tokio::spawn(async move {
                let mut poll = tokio::time::interval(DRAIN_POLL);
                poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    poll.tick().await;
                    if depth_tx
                        .send(old.queue_depth(queue.clone()).await)
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            })
        };
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
                Some(answer) = depths.recv() => match answer {
                    Ok(0) => {
                        depth = Some(0);
                        break;
                    }
                    Ok(n) => depth = Some(n),
                    Err(e) => tracing::debug!(queue = %self.queue, "asking the old broker for the queue depth: {e}"),
                },
            }
        }
        asking.abort();
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
    pub(super) async fn run(
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
        let settler = delivery.settler();
        let attempt = delivery.attempt;
        let outcome = AssertUnwindSafe((self.handler)(delivery))
            .catch_unwind()
            .await;
        if settler.settled() {
            return;
        }
        let result = match outcome {
            Ok(Ok(())) => settler.ack().await,
            Ok(Err(e)) => {
                let backoff = handler_backoff(attempt);
                tracing::warn!(queue = %self.queue, attempt, ?backoff, "handler failed, retrying: {e:#}");
                settler.retry(backoff).await
            }
            Err(_) => {
                let backoff = handler_backoff(attempt);
                tracing::warn!(queue = %self.queue, attempt, ?backoff, "handler panicked, retrying");
                settler.retry(backoff).await
            }
        };
        if let Err(e) = result {
            tracing::debug!(queue = %self.queue, "settling after the handler: {e}");
        }
    }

    pub(super) async fn settle(
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
