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

use crate::broker::{Broker, BrokerBuilder, start_successor};
use crate::error::Result;
pub use crate::handover::{MigrationEvent, QueueDrain};
use crate::runtime::AdapterInstance;
use crate::slot::Moved;

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
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let progress = move |event: MigrationEvent| {
            tracing::info!(?event, "migration");
            if let Some(tx) = &options.progress {
                let _ = tx.send(event.clone());
            }
            let _ = events_tx.send(event);
        };

        // Listen on the new broker before anything is sent there.
        let mut moves =
            futures::future::join_all(inner.handovers().map(|h| h.migrating(&old, &new))).await;
        // Switch: writes go to the new broker.
        moves.iter_mut().for_each(|m| m.switching());
        inner.install(new.clone(), component, config);
        *inner.migrated.write().unwrap_or_else(|e| e.into_inner()) = Some(Moved {
            from: from.clone(),
            to: to.clone(),
            at: Instant::now(),
        });
        for step in moves.iter_mut() {
            step.switched().await;
        }
        inner.slot.quiesce_writes().await;
        let switched = started.elapsed();
        progress(MigrationEvent::Switched {
            from: from.clone(),
            to: to.clone(),
            generation: new.generation(),
        });
        // The old broker's feeds and subscriptions are complete: what it holds moves over.
        moves.iter_mut().for_each(|m| m.old_complete());
        let deadline = Instant::now() + options.deadline;
        futures::future::join_all(moves.iter_mut().map(|m| m.drain(deadline, &progress))).await;
        moves.iter_mut().for_each(|m| m.let_go());
        drop(moves);

        let (mut queues, mut readers_moved, mut readers_left) = (Vec::new(), 0, 0);
        while let Ok(event) = events.try_recv() {
            match event {
                MigrationEvent::QueueDrained(drain) => queues.push(drain),
                MigrationEvent::ReadersMoved { moved, left } => {
                    readers_moved += moved;
                    readers_left += left;
                }
                _ => {}
            }
        }
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
