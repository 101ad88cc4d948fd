//! One broker reader per topic: [`TopicTail`], the live `tail` fanned out to every local
//! reader, and re-established after the last entry seen when its stream ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use tokio::sync::broadcast;

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
/// entry seen; readers see at worst a gap, which they fill from pages. An idle tail has no task
/// of its own: the end of its stream (its [`TailSink`] dropped) starts the re-establishing.
pub(crate) struct TopicTail {
    /// The feed it follows: once a migration ended it, the tail is not re-established.
    feed: Arc<Feed>,
    slot: Arc<AdapterSlot>,
    topic: String,
    /// The readers' broadcast; taken when the tail stops.
    tx: Mutex<Option<broadcast::Sender<TailEvent>>>,
    pub(super) head: Mutex<Head>,
    readers: AtomicUsize,
    stream: Mutex<Stream>,
}

/// Which adapter stream is the tail's current one, and where it stands.
#[derive(Default)]
struct Stream {
    /// Counts the `tail` calls made; a sink carries the count of its call, so the end of an
    /// older stream (or of a failed call's sink, dropped late) is told apart from the current.
    generation: u64,
    state: StreamState,
}

/// Where the current adapter stream stands.
#[derive(Default, PartialEq)]
enum StreamState {
    /// Its `tail` call has not returned yet.
    #[default]
    Calling,
    /// Its call returned it, and it has not ended.
    Open,
    /// It ended (its sink was dropped), maybe before its call returned.
    Ended,
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
            slot,
            topic,
            tx: Mutex::new(Some(tx)),
            head: Mutex::new(Head::default()),
            readers: AtomicUsize::new(0),
            stream: Mutex::new(Stream::default()),
        });
        let sink = tail.next_sink();
        let positions = tail
            .feed
            .adapter(&tail.slot)?
            .log_tail_into(tail.topic.clone(), types::Start::Latest, sink)
            .await?;
        {
            // Entries the stream delivered already moved the head past these.
            let mut head = tail.head.lock().unwrap_or_else(|e| e.into_inner());
            for p in &positions {
                head.next.get_or_insert(p.partition, p.offset);
            }
        }
        if !tail.opened() {
            tail.clone().reopen();
        }
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
        self.readers.fetch_add(1, Ordering::AcqRel);
        ReaderGuard { tail: self.clone() }
    }

    /// Whether the tail was stopped (no reader left, or its feed ended): it is not
    /// re-established, and readers that join start a new one.
    pub(super) fn is_stopped(&self) -> bool {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Stop the tail: its readers see the broadcast close (they join a new tail, or finish an
    /// ended feed from pages), and the adapter's stream is dropped at its next batch.
    pub(super) fn stop(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// One batch of the adapter's tail: move the head past it and broadcast it. False once the
    /// tail was stopped (the adapter's stream is then dropped).
    fn deliver(&self, entries: Vec<wit::Entry>) -> bool {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(tx) = tx else { return false };
        {
            let mut head = self.head.lock().unwrap_or_else(|e| e.into_inner());
            for entry in &entries {
                let next = head
                    .next
                    .get_or_insert(entry.pos.partition, entry.pos.offset);
                if entry.pos.offset < *next {
                    tracing::warn!(
                        topic = self.topic,
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

    /// The sink for a new `tail` call, which becomes the current stream.
    fn next_sink(self: &Arc<Self>) -> TailSink {
        let mut stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        *stream = Stream {
            generation: stream.generation + 1,
            state: StreamState::Calling,
        };
        TailSink {
            tail: Arc::downgrade(self),
            generation: stream.generation,
        }
    }

    /// The current `tail` call returned its stream: true when it is open, false when it ended
    /// meanwhile (it must be re-established).
    fn opened(&self) -> bool {
        let mut stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        if stream.state == StreamState::Ended {
            return false;
        }
        stream.state = StreamState::Open;
        true
    }

    /// The stream behind the sink of `generation` ended: re-establish it if it was the current
    /// open one and the tail still has readers. (A current one whose call has not returned yet
    /// is left to that call's caller.)
    fn stream_ended(self: Arc<Self>, generation: u64) {
        {
            let mut stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
            if stream.generation != generation {
                return;
            }
            let was = std::mem::replace(&mut stream.state, StreamState::Ended);
            if was != StreamState::Open || self.is_stopped() {
                return;
            }
        }
        self.reopen();
    }

    /// Re-establish the adapter's tail in a task of its own (the stream's end is rare); stop
    /// the tail if that cannot be done.
    fn reopen(self: Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // The host is shutting down.
            return self.stop();
        };
        runtime.spawn(async move {
            if !self.reestablish().await {
                self.stop();
            }
        });
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

    /// A new adapter `tail` after the last entry seen (or from now when that is gone): true
    /// once one is open, false when the tail should stop (stopped, its feed ended, the log
    /// closed).
    async fn reestablish(self: &Arc<Self>) -> bool {
        let mut from_latest = false;
        loop {
            if self.is_stopped() || self.feed.next.get().is_some() {
                return false;
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
            let Ok(adapter) = self.feed.adapter(&self.slot) else {
                return false;
            };
            let sink = self.next_sink();
            match adapter
                .log_tail_into(self.topic.clone(), origin, sink)
                .await
            {
                Ok(positions) => {
                    self.note_gap(&positions);
                    if self.opened() {
                        return true;
                    }
                }
                Err(Error::Gone(_)) => from_latest = true,
                Err(Error::Closed(_)) => return false,
                Err(e) => {
                    tracing::debug!(topic = self.topic, "re-establishing the tail: {e}");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }
}

/// Where the adapter's tail stream lands, inside the instance: each batch moves the head and
/// goes to the readers' broadcast at once, with no task between the stream and the readers.
/// Dropped (the stream ended, or the call that started it failed), it tells the tail.
struct TailSink {
    tail: Weak<TopicTail>,
    /// The tail's stream generation this sink belongs to.
    generation: u64,
}

impl Drop for TailSink {
    fn drop(&mut self) {
        if let Some(tail) = self.tail.upgrade() {
            tail.stream_ended(self.generation);
        }
    }
}

impl BatchSink<wit::Entry> for TailSink {
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<bool> {
        // The broadcast never waits: a reader that falls behind fills the gap from pages.
        Poll::Ready(self.tail.strong_count() > 0)
    }

    fn deliver(&mut self, batch: Vec<wit::Entry>) -> bool {
        match self.tail.upgrade() {
            Some(tail) => tail.deliver(batch),
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
        if self.tail.readers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.tail.stop();
        }
    }
}
