//! The per-broker log machinery ([`Logs`]): the append batchers, the shared topic tails,
//! and the feeds a migration ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::broadcast;

use super::MAX_APPEND_BATCH;
use super::tail::{ReaderGuard, TailEvent, TopicTail};
use crate::batch::Batchers;
use crate::bindings::{log as wit, types};
use crate::error::{Error, Result};
use crate::handover::{Handover, Migration, MigrationEvent, Progress, Step};
use crate::runtime::AdapterInstance;
use crate::slot::AdapterSlot;

/// Per-broker log machinery: the append batchers, the shared topic tails and the feed.
pub(crate) struct Logs {
    slot: Arc<AdapterSlot>,
    pub(super) appends: Batchers<wit::RecordIn, String>,
    tails: tokio::sync::Mutex<HashMap<String, Arc<TopicTail>>>,
    /// The feed readers start on now (the broker the slot's adapter talks to).
    feed: Mutex<Arc<Feed>>,
    /// The feed the last migration ended.
    pub(super) previous: Mutex<Option<Arc<Feed>>>,
}

/// The logs of one broker as seen through this host. A migration to another broker ends a
/// feed: its readers finish it on the old adapter, then go on with the next feed from the
/// swap point.
pub(crate) struct Feed {
    /// The old adapter, pinned by a migration while readers still finish this feed.
    old: Mutex<Option<AdapterInstance>>,
    /// Set when a migration ended this feed: the next feed, and per topic where it started.
    pub(super) next: std::sync::OnceLock<(Arc<Feed>, SwapPoints)>,
    /// How many readers read this feed.
    readers: tokio::sync::watch::Sender<usize>,
    /// How many readers finished this feed and went on with the next one.
    pub(super) moved: std::sync::atomic::AtomicUsize,
}

/// Per topic, the position of the next entry on the new broker when a migration switched.
pub(crate) type SwapPoints = HashMap<String, Vec<types::Position>>;

impl Feed {
    fn new() -> Arc<Self> {
        Arc::new(Feed {
            old: Mutex::new(None),
            next: std::sync::OnceLock::new(),
            readers: tokio::sync::watch::channel(0).0,
            moved: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The adapter that serves this feed: the pinned old one, the slot's when the feed is the
    /// current one, or `Gone` once a migration let the old broker go.
    pub(super) fn adapter(&self, slot: &AdapterSlot) -> Result<AdapterInstance> {
        if let Some(old) = self.old.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Ok(old.clone());
        }
        match self.next.get() {
            None => Ok(slot.current()),
            Some(_) => Err(Error::Gone(
                "the log moved to another broker, and the old one was let go before this reader \
                 finished its feed"
                    .into(),
            )),
        }
    }

    pub(super) fn reader(self: &Arc<Self>) -> FeedGuard {
        self.readers.send_modify(|n| *n += 1);
        FeedGuard { feed: self.clone() }
    }

    /// Wait until no reader is left on this feed or `deadline` passes: (moved on, left).
    pub(crate) async fn readers_moved(&self, deadline: std::time::Instant) -> (usize, usize) {
        let mut readers = self.readers.subscribe();
        let _ = tokio::time::timeout_at(deadline.into(), readers.wait_for(|n| *n == 0)).await;
        let left = *readers.borrow();
        (self.moved.load(std::sync::atomic::Ordering::Relaxed), left)
    }

    /// Let the old adapter go: readers still on this feed fail with `Gone`.
    pub(crate) fn let_go(&self) {
        self.old.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Counts a reader of a [`Feed`].
pub(super) struct FeedGuard {
    pub(super) feed: Arc<Feed>,
}

impl Drop for FeedGuard {
    fn drop(&mut self) {
        self.feed.readers.send_modify(|n| *n -= 1);
    }
}

/// The tails of an ended feed, stopped once the writes to the old broker have landed.
pub(crate) struct EndedTails(Vec<Arc<TopicTail>>);

impl EndedTails {
    /// Stop them: their readers finish the old feed from pages and move on.
    pub(crate) fn stop(self) {
        self.0.iter().for_each(|t| t.stop());
    }
}

impl Logs {
    pub(crate) fn new(slot: Arc<AdapterSlot>) -> Self {
        Self {
            slot: slot.clone(),
            appends: Batchers::with_depth(
                slot,
                MAX_APPEND_BATCH,
                AdapterInstance::appends_in_flight,
                Arc::new(|adapter, topic, records| {
                    Box::pin(async move { adapter.log_append(topic, records).await })
                }),
            ),
            tails: tokio::sync::Mutex::new(HashMap::new()),
            feed: Mutex::new(Feed::new()),
            previous: Mutex::new(None),
        }
    }

    /// The feed readers start on now.
    pub(super) fn current_feed(&self) -> Arc<Feed> {
        self.feed.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A migration, before the slot moves: where each topic read here now starts on the new
    /// adapter (its position before this host writes there).
    pub(crate) async fn swap_points(&self, new: &AdapterInstance) -> SwapPoints {
        let topics: Vec<String> = self.tails.lock().await.keys().cloned().collect();
        let points = topics.into_iter().map(|topic| async move {
            match new.log_tail(topic.clone(), types::Start::Latest).await {
                Ok((positions, _stream)) => Some((topic, positions)),
                Err(e) => {
                    tracing::warn!(topic, "the new broker's position of the feed: {e} (its readers go on from its earliest entry)");
                    None
                }
            }
        });
        futures::future::join_all(points)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// A migration, before the slot moves: the current feed is served by `old` from now on.
    pub(crate) fn pin(&self, old: AdapterInstance) -> Arc<Feed> {
        let feed = self.current_feed();
        *feed.old.lock().unwrap_or_else(|e| e.into_inner()) = Some(old);
        feed
    }

    /// A migration, once the slot moved: end `ended` (readers go on at `points` of a new
    /// feed); its tails are returned, to be stopped when the old broker's writes landed.
    pub(crate) async fn next_feed(&self, ended: &Arc<Feed>, points: SwapPoints) -> EndedTails {
        let mut tails = self.tails.lock().await;
        let next = Feed::new();
        let _ = ended.next.set((next.clone(), points));
        *self.feed.lock().unwrap_or_else(|e| e.into_inner()) = next;
        *self.previous.lock().unwrap_or_else(|e| e.into_inner()) = Some(ended.clone());
        EndedTails(tails.drain().map(|(_, tail)| tail).collect())
    }

    /// Join the live shared tail of `topic` (started now if there is none): the tail, a guard
    /// that keeps it alive, and a subscription taken before any catch-up read.
    /// `None` when `feed` is no longer the current one (a migration ended it).
    pub(super) async fn join(
        &self,
        topic: &str,
        feed: &Arc<Feed>,
    ) -> Result<Option<(Arc<TopicTail>, ReaderGuard, broadcast::Receiver<TailEvent>)>> {
        let mut tails = self.tails.lock().await;
        if !Arc::ptr_eq(feed, &self.current_feed()) {
            return Ok(None);
        }
        if let Some(tail) = tails.get(topic).filter(|t| !t.is_stopped()) {
            let guard = tail.join();
            if let Some(subscription) = tail.subscribe() {
                return Ok(Some((tail.clone(), guard, subscription)));
            }
        }
        let tail = TopicTail::start(self.slot.clone(), topic.to_string(), feed.clone()).await?;
        tails.insert(topic.to_string(), tail.clone());
        let guard = tail.join();
        let subscription = tail
            .subscribe()
            .ok_or_else(|| Error::Closed("the log was closed".into()))?;
        Ok(Some((tail, guard, subscription)))
    }
}

/// A migration of the logs: readers finish the old broker's feed, then go on with the new one
/// from the swap point.
struct LogMigration<'a> {
    logs: &'a Logs,
    old: &'a AdapterInstance,
    points: Option<SwapPoints>,
    old_feed: Option<Arc<Feed>>,
    old_tails: Option<EndedTails>,
}

impl Handover for Logs {
    fn migrating<'a>(
        &'a self,
        old: &'a AdapterInstance,
        new: &'a AdapterInstance,
    ) -> Step<'a, Box<dyn Migration + 'a>> {
        Box::pin(async move {
            let points = self.swap_points(new).await;
            Box::new(LogMigration {
                logs: self,
                old,
                points: Some(points),
                old_feed: None,
                old_tails: None,
            }) as Box<dyn Migration>
        })
    }
}

impl Migration for LogMigration<'_> {
    fn switching(&mut self) {
        // The current feed stays on the old adapter.
        self.old_feed = Some(self.logs.pin(self.old.clone()));
    }

    fn switched(&mut self) -> Step<'_> {
        Box::pin(async move {
            if let (Some(feed), Some(points)) = (&self.old_feed, self.points.take()) {
                self.old_tails = Some(self.logs.next_feed(feed, points).await);
            }
        })
    }

    fn old_complete(&mut self) {
        if let Some(tails) = self.old_tails.take() {
            tails.stop();
        }
    }

    fn drain<'a>(&'a mut self, deadline: Instant, progress: &'a Progress) -> Step<'a> {
        Box::pin(async move {
            if let Some(feed) = &self.old_feed {
                let (moved, left) = feed.readers_moved(deadline).await;
                progress(MigrationEvent::ReadersMoved { moved, left });
            }
        })
    }

    fn let_go(&mut self) {
        if let Some(feed) = &self.old_feed {
            feed.let_go();
        }
    }
}
