//! One broker reader per topic: [`TopicTail`], the live `tail` fanned out to every local
//! reader, and re-established after the last entry seen when its stream ends.

use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;

use super::feeds::Feed;
use super::offsets::Offsets;
use super::{RETRY_PAUSE, TAIL_BUFFER};
use crate::bindings::{log as wit, types};
use crate::error::{Error, Result};
use crate::runtime::streams::BatchSink;
use crate::slot::AdapterSlot;

/// What a topic tail broadcasts to its local readers.
#[derive(Clone)]
pub(super) enum TailEvent {
    /// The next entries from the adapter's tail, as one batch of its stream: a slot of the
    /// broadcast holds a batch, so the buffer costs a few KiB per topic however many entries
    /// it holds.
    Entries(Arc<[wit::Entry]>),
    /// The tail was re-established past entries it never delivered: read them from pages.
    Gap,
}

/// The last position and id a topic tail has seen.
#[derive(Debug, Default)]
pub(super) struct Head {
    pub(super) next: Offsets,
    pub(super) last_id: Option<String>,
}

/// The one live `tail` of a topic in this host instance, fanned out to every local reader.
/// If the adapter's stream ends (a trap, a cut connection) it is re-established after the last
/// entry seen; readers see at worst a gap, which they fill from pages.
pub(crate) struct TopicTail {
    /// The feed it follows: once a migration ended it, the tail is not re-established.
    feed: Arc<Feed>,
    tx: Mutex<Option<broadcast::Sender<TailEvent>>>,
    pub(super) head: Mutex<Head>,
    readers: Mutex<usize>,
    pub(super) stop: CancellationToken,
}

impl TopicTail {
    pub(super) async fn start(
        slot: Arc<AdapterSlot>,
        topic: String,
        feed: Arc<Feed>,
    ) -> Result<Arc<Self>> {
        let (tx, _) = broadcast::channel(TAIL_BUFFER);
        let tail = Arc::new(TopicTail {
            feed,
            tx: Mutex::new(Some(tx)),
            head: Mutex::new(Head::default()),
            readers: Mutex::new(0),
            stop: CancellationToken::new(),
        });
        let (sink, ended) = TailSink::new(&tail, &topic);
        let positions = tail
            .feed
            .adapter(&slot)?
            .log_tail_into(topic.clone(), types::Start::Latest, sink)
            .await?;
        {
            // Entries the stream delivered already moved the head past these.
            let mut head = tail.head.lock().unwrap_or_else(|e| e.into_inner());
            for p in &positions {
                head.next.get_or_insert(p.partition, p.offset);
            }
        }
        tokio::spawn(tail.clone().watch(slot, topic, ended));
        Ok(tail)
    }

    pub(super) fn subscribe(&self) -> Option<broadcast::Receiver<TailEvent>> {
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|tx| tx.subscribe())
    }

    pub(super) fn join(self: &Arc<Self>) -> ReaderGuard {
        *self.readers.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        ReaderGuard { tail: self.clone() }
    }

    /// One batch of the adapter's tail: move the head past it and broadcast it. False once the
    /// tail was stopped (the adapter's stream is then dropped).
    fn deliver(&self, topic: &str, entries: Vec<wit::Entry>) -> bool {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(tx) = tx else { return false };
        if self.stop.is_cancelled() {
            return false;
        }
        {
            let mut head = self.head.lock().unwrap_or_else(|e| e.into_inner());
            for entry in &entries {
                let next = head
                    .next
                    .get_or_insert(entry.pos.partition, entry.pos.offset);
                if entry.pos.offset < *next {
                    tracing::warn!(
                        topic,
                        offset = entry.pos.offset,
                        expected = *next,
                        "the adapter's tail repeated an entry (the readers drop it)"
                    );
                }
                *next = (*next).max(entry.pos.offset + 1);
            }
            if let Some(last) = entries.last() {
                head.last_id = Some(last.id.clone());
            }
        }
        let _ = tx.send(TailEvent::Entries(entries.into()));
        true
    }

    /// Re-establish the adapter's tail each time its stream ends, until no local reader is left.
    async fn watch(self: Arc<Self>, slot: Arc<AdapterSlot>, topic: String, mut ended: Ended) {
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = &mut ended => {}
            }
            // Boxed: re-establishing is rare, and its future (a whole adapter call) would
            // otherwise sit inline in every idle tail's task.
            match Box::pin(self.reestablish(&slot, &topic)).await {
                Some(next) => ended = next,
                None => break,
            }
        }
        self.stop.cancel();
        // Readers still subscribed see the broadcast close and join a new tail.
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// A re-established tail that starts past what the old one delivered (it started from
    /// `latest`) tells the readers to fill the gap from pages.
    fn note_gap(&self, positions: &[types::Position]) {
        let mut gap = false;
        {
            let mut head = self.head.lock().unwrap_or_else(|e| e.into_inner());
            for p in positions {
                let next = head.next.get_or_insert(p.partition, p.offset);
                if p.offset > *next {
                    gap = true;
                    *next = p.offset;
                }
            }
        }
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let (true, Some(tx)) = (gap, tx) {
            let _ = tx.send(TailEvent::Gap);
        }
    }

    /// A new adapter `tail` after the last entry seen (or from now when that is gone).
    async fn reestablish(self: &Arc<Self>, slot: &AdapterSlot, topic: &str) -> Option<Ended> {
        let mut from_latest = false;
        loop {
            if self.stop.is_cancelled() || self.feed.next.get().is_some() {
                return None;
            }
            let last_id = self
                .head
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .last_id
                .clone();
            let origin = match last_id {
                Some(id) if !from_latest => types::Start::After(id),
                _ => types::Start::Latest,
            };
            let Ok(adapter) = self.feed.adapter(slot) else {
                return None;
            };
            let (sink, ended) = TailSink::new(self, topic);
            match adapter.log_tail_into(topic.to_string(), origin, sink).await {
                Ok(positions) => {
                    self.note_gap(&positions);
                    return Some(ended);
                }
                Err(Error::Gone(_)) => from_latest = true,
                Err(Error::Closed(_)) => return None,
                Err(e) => {
                    tracing::debug!(topic, "re-establishing the tail: {e}");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }
}

/// Resolves when the adapter's tail stream behind a [`TailSink`] ended (the sink was dropped).
type Ended = oneshot::Receiver<()>;

/// Where the adapter's tail stream lands, inside the instance: each batch moves the head and
/// goes to the readers' broadcast at once, with no task between the stream and the readers.
/// Dropped (the stream ended, or the call that started it failed), it tells the tail's task.
struct TailSink {
    tail: Weak<TopicTail>,
    topic: String,
    _ended: oneshot::Sender<()>,
}

impl TailSink {
    fn new(tail: &Arc<TopicTail>, topic: &str) -> (Self, Ended) {
        let (ended, rx) = oneshot::channel();
        let sink = Self {
            tail: Arc::downgrade(tail),
            topic: topic.to_owned(),
            _ended: ended,
        };
        (sink, rx)
    }
}

impl BatchSink<wit::Entry> for TailSink {
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<bool> {
        // The broadcast never waits: a reader that falls behind fills the gap from pages.
        Poll::Ready(self.tail.strong_count() > 0)
    }

    fn deliver(&mut self, batch: Vec<wit::Entry>) -> bool {
        match self.tail.upgrade() {
            Some(tail) => tail.deliver(&self.topic, batch),
            None => false,
        }
    }
}

/// Counts a reader of a [`TopicTail`]; the tail stops when the last one is dropped.
pub(super) struct ReaderGuard {
    tail: Arc<TopicTail>,
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        let mut readers = self.tail.readers.lock().unwrap_or_else(|e| e.into_inner());
        *readers -= 1;
        if *readers == 0 {
            self.tail.stop.cancel();
        }
    }
}
