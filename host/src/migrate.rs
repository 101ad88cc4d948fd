//! Migration: moving a running host to another broker, losing nothing.
//!
//! [`Broker::migrate`] starts the new broker's adapter and, in this order: subscribes every
//! backplane channel and direct listener there too (so nothing sent to the new broker finds
//! nobody); points the slot at it (every produce, append, publish and send from now on goes to
//! the new broker); waits for the writes still going to the old one to land; ends the old
//! feeds (their readers read the rest from the old broker, then go on with the new one from the
//! swap point); then lets consumers consume on the new broker at once while they keep draining
//! the old broker's queues until those are empty or the deadline passes. Last, the old adapter
//! is closed: a log id it minted is foreign from then on (410, saying the feed moved).

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, BrokerBuilder, start_successor};
use crate::error::Result;
use crate::runtime::AdapterInstance;

/// How a migration runs.
#[derive(Debug, Clone)]
pub struct MigrateOptions {
    /// How long consumers may drain the old broker's queues (and readers finish its feeds)
    /// before the old adapter is let go anyway; what was left is reported.
    pub deadline: Duration,
    /// Where progress goes as it happens.
    pub progress: Option<mpsc::UnboundedSender<MigrationEvent>>,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(60),
            progress: None,
        }
    }
}

/// A step of a migration, as it happens.
#[derive(Debug, Clone)]
pub enum MigrationEvent {
    /// The new adapter runs: from now on every write goes to the new broker.
    Switched {
        /// The old broker.
        from: String,
        /// The new broker.
        to: String,
        /// The new adapter's generation.
        generation: u32,
    },
    /// Consumers consume on the new broker; `queues` of them still drain the old one.
    ConsumersMoved {
        /// How many consumers drain an old queue.
        queues: usize,
    },
    /// A consumer finished with the old broker's queue.
    QueueDrained(QueueDrain),
    /// Readers finished the old broker's feeds.
    ReadersMoved {
        /// How many moved to the new broker.
        moved: usize,
        /// How many had not finished by the deadline.
        left: usize,
    },
    /// The old adapter was closed.
    OldClosed,
}

/// How one consumer's drain of the old broker's queue ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDrain {
    /// The queue.
    pub queue: String,
    /// True when the old queue was empty (nothing waiting, delayed or unsettled).
    pub drained: bool,
    /// Messages left on the old broker (0 when drained; the count when the deadline passed).
    pub left: u64,
    /// How long the drain took.
    pub took: Duration,
}

/// What a [`Broker::migrate`] did.
#[derive(Debug, Clone)]
pub struct MigrationReport {
    /// The old broker.
    pub from: String,
    /// The new broker.
    pub to: String,
    /// The new adapter's generation.
    pub generation: u32,
    /// Loading and starting the new adapter (calls kept going to the old one).
    pub ready: Duration,
    /// From the start until every write went to the new broker and the old one's had landed.
    pub switched: Duration,
    /// One entry per consumer that drained an old queue.
    pub queues: Vec<QueueDrain>,
    /// Log readers that finished the old feed and went on with the new one.
    pub readers_moved: usize,
    /// Log readers that had not finished the old feed by the deadline.
    pub readers_left: usize,
    /// The whole migration, until the old adapter was closed.
    pub total: Duration,
}

impl MigrationReport {
    /// True when every old queue was drained and every reader moved.
    pub fn complete(&self) -> bool {
        self.readers_left == 0 && self.queues.iter().all(|q| q.drained)
    }
}

/// The last migration of a broker: for the message a foreign id gets.
#[derive(Debug, Clone)]
pub(crate) struct Moved {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) at: Instant,
}

/// Describes the broker behind an adapter, for reports: `redis (adapter redis 0.1.0)`.
fn describe(adapter: &AdapterInstance) -> String {
    let info = adapter.info();
    format!("{} (adapter {} {})", info.broker, info.name, info.version)
}

impl Broker {
    /// Move this running host to the broker `to` describes (its URL, or a component file and
    /// the drivers it needs), losing nothing: see the [module documentation](self). A failure
    /// to connect, load or start the new adapter changes nothing.
    pub async fn migrate(
        &self,
        to: BrokerBuilder,
        options: MigrateOptions,
    ) -> Result<MigrationReport> {
        let started = Instant::now();
        let inner = &self.inner;
        let _one_at_a_time = inner.swapping.lock().await;
        let old = inner.slot.current();
        let (_, component, config) = to.prepare(Some(inner.runtime.clone())).await?;
        let new = start_successor(&old, component.clone(), config.clone(), "migrated").await?;
        let ready = started.elapsed();
        let (from, to) = (describe(&old), describe(&new));
        let progress = |event: MigrationEvent| {
            tracing::info!(?event, "migration");
            if let Some(tx) = &options.progress {
                let _ = tx.send(event);
            }
        };

        // Listen on the new broker before anything is sent there.
        let old_subscriptions = CancellationToken::new();
        let points = inner.logs.swap_points(&new).await;
        tokio::join!(
            inner.channels.switch_all(&new, old_subscriptions.clone()),
            inner.inboxes.switch_all(&new),
        );

        // Switch: writes go to the new broker; the current feed stays on the old adapter.
        let old_feed = inner.logs.pin(old.clone());
        inner.install(new.clone(), component, config);
        *inner.migrated.write().unwrap_or_else(|e| e.into_inner()) = Some(Moved {
            from: from.clone(),
            to: to.clone(),
            at: Instant::now(),
        });
        let old_tails = inner.logs.next_feed(&old_feed, points).await;
        inner.slot.quiesce_writes().await;
        let switched = started.elapsed();
        progress(MigrationEvent::Switched {
            from: from.clone(),
            to: to.clone(),
            generation: new.generation(),
        });
        // The old broker's feeds and subscriptions are complete: readers finish them and move.
        old_tails.stop();
        old_subscriptions.cancel();

        let deadline = Instant::now() + options.deadline;
        let drains = inner.queues.migrate_all(deadline).await;
        progress(MigrationEvent::ConsumersMoved {
            queues: drains.len(),
        });
        let queues = async {
            let mut drained = Vec::new();
            let mut pending: futures::stream::FuturesUnordered<_> =
                drains.into_iter().map(|(_, answer)| answer).collect();
            while let Some(answer) = futures::StreamExt::next(&mut pending).await {
                if let Ok(drain) = answer {
                    progress(MigrationEvent::QueueDrained(drain.clone()));
                    drained.push(drain);
                }
            }
            drained
        };
        let readers = async {
            let (moved, left) = old_feed.readers_moved(deadline).await;
            progress(MigrationEvent::ReadersMoved { moved, left });
            (moved, left)
        };
        let (queues, (readers_moved, readers_left)) = tokio::join!(queues, readers);

        old_feed.let_go();
        old.close();
        if tokio::time::timeout(Duration::from_secs(10), old.finished())
            .await
            .is_err()
        {
            tracing::warn!("the old adapter took over 10 s to close");
        }
        progress(MigrationEvent::OldClosed);
        Ok(MigrationReport {
            from,
            to,
            generation: new.generation(),
            ready,
            switched,
            queues,
            readers_moved,
            readers_left,
            total: started.elapsed(),
        })
    }
}
