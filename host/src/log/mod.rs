//! The log capability: ordered, replayable feeds a reader resumes from an id.
//!
//! Appends to one topic are coalesced into batches (one adapter call carries every append that
//! arrived while the previous one was in flight). Reads share one live `tail` per topic per host
//! instance ([`TopicTail`]), fanned out to every local reader; each reader joins `range`
//! catch-up pages with that tail by position, dropping duplicates and filling gaps, and a reader
//! that falls behind goes back to `range` reads, so memory per slow reader stays bounded.
//!
//! [`TopicTail`]: tail::TopicTail

mod feeds;
mod offsets;
mod reader;
mod tail;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::bindings::{log as wit, types};
use crate::error::{Error, Result};
use crate::runtime::drive::Owner;
use crate::runtime::pages::PageSize;
use crate::slot::Held;
use feeds::Feed;
use reader::{Cursor, ReaderTask, first_page_of};

pub(crate) use feeds::Logs;
pub use reader::Reader;

/// Message headers: repeated names allowed, values are bytes.
pub type Headers = Vec<(String, Vec<u8>)>;

/// Where an entry sits: partition 0 for single-sequence logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// The partition.
    pub partition: u32,
    /// The dense offset within the partition.
    pub offset: u64,
}

/// An entry read from a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The resume token after this entry: pass it to [`ReadFrom::After`] to continue from here.
    pub id: String,
    /// Where it sits.
    pub position: Position,
    /// The payload.
    pub value: Vec<u8>,
    /// Its headers.
    pub headers: Headers,
    /// Its key, if any.
    pub key: Option<Vec<u8>>,
}

impl From<wit::Entry> for Entry {
    fn from(e: wit::Entry) -> Self {
        Entry {
            id: e.id,
            position: Position {
                partition: e.pos.partition,
                offset: e.pos.offset,
            },
            value: e.value,
            headers: e.headers,
            key: e.key,
        }
    }
}

/// Headers and key of an append.
#[derive(Debug, Clone, Default)]
pub struct AppendOptions {
    /// Headers stored with the entry.
    pub headers: Headers,
    /// Entries with one key keep their order (partitioned brokers route by it).
    pub key: Option<Vec<u8>>,
}

/// Where a read starts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ReadFrom {
    /// Strictly after the entry with this id (a token this log minted).
    After(String),
    /// From the oldest retained entry.
    Earliest,
    /// Only entries appended from now on.
    #[default]
    Latest,
}

/// Appends carried by one adapter call at most.
const MAX_APPEND_BATCH: usize = 256;
/// Batches (of the adapter's tail stream, up to its batch size each) a topic tail buffers for
/// its local readers before a slow one lags and reads pages instead. Allocated whole with the
/// tail (48 bytes a slot): 32 of them were 1.5 KiB of every idle tail's heap.
const TAIL_BUFFER: usize = 8;
/// Batches (a page or a tail batch each) buffered per reader between its task and its consumer.
const READER_BUFFER: usize = 4;
/// Attempts at a catch-up page when the adapter is being replaced (trap, timeout).
const TRANSIENT_RETRIES: u32 = 20;
/// Pause between such attempts, and before re-establishing a lost tail.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The log capability of one broker.
#[derive(Clone)]
pub struct Log {
    inner: Held<Logs>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").finish_non_exhaustive()
    }
}

impl Log {
    pub(crate) fn new(inner: Held<Logs>) -> Self {
        Self { inner }
    }

    /// Append `value` to `topic`; returns its id. Concurrent appends are batched.
    pub async fn append(
        &self,
        topic: &str,
        value: impl Into<Vec<u8>>,
        options: AppendOptions,
    ) -> Result<String> {
        let record = wit::RecordIn {
            value: value.into(),
            headers: options.headers,
            key: options.key,
        };
        self.inner.live.appends.submit(topic, record).await
    }

    /// Append several entries in order, in one adapter call.
    pub async fn append_batch(
        &self,
        topic: &str,
        records: Vec<(Vec<u8>, AppendOptions)>,
    ) -> Result<Vec<String>> {
        let batch: Arc<[wit::RecordIn]> = records
            .into_iter()
            .map(|(value, o)| wit::RecordIn {
                value,
                headers: o.headers,
                key: o.key,
            })
            .collect();
        self.inner
            .slot
            .retry_trapped(|adapter| {
                let (topic, batch) = (topic.to_string(), batch.clone());
                async move { adapter.log_append(topic, batch).await }
            })
            .await
    }

    /// Check the syntax of an id (e.g. a peer's last-event-id) before it reaches the broker.
    pub async fn parse_id(&self, text: &str) -> Result<()> {
        self.inner
            .slot
            .current()
            .log_parse_id(text.to_string())
            .await
    }

    /// Start a read. Returns once its position is fixed (an `after` id checked, the first page
    /// read, or the live tail positioned); then the [`Reader`] yields entries in order.
    /// A malformed id or one past the tip is [`Error::BadRequest`]; an id older than the
    /// retained history or minted by another log is [`Error::Gone`].
    pub async fn read(&self, topic: &str, from: ReadFrom) -> Result<Reader> {
        let logs = &self.inner.live;
        match self.read_on(logs.current_feed(), topic, from.clone()).await {
            Err(e @ (Error::Gone(_) | Error::BadRequest(_)))
                if matches!(from, ReadFrom::After(_)) =>
            {
                // An id minted before a migration: read the old feed while it is kept.
                let previous = logs
                    .previous
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                if let Some(previous) = previous
                    && let Ok(reader) = self.read_on(previous, topic, from).await
                {
                    return Ok(reader);
                }
                Err(self.moved(e))
            }
            answer => answer,
        }
    }

    /// After a migration, an id the new broker refuses was minted by the old one: `Gone`,
    /// saying the feed moved.
    fn moved(&self, refused: Error) -> Error {
        let moved = self
            .inner
            .migrated
            .read()
            .unwrap_or_else(|e| e.into_inner());
        match (moved.as_ref(), refused) {
            (Some(moved), Error::Gone(why) | Error::BadRequest(why)) => Error::Gone(format!(
                "{why}; the log moved from {} to {} {:.1?} ago: an id minted before the move is \
                 foreign here (read from earliest to start over on the new broker)",
                moved.from,
                moved.to,
                moved.at.elapsed()
            )),
            (_, refused) => refused,
        }
    }

    /// Start a read on `feed`.
    async fn read_on(&self, feed: Arc<Feed>, topic: &str, from: ReadFrom) -> Result<Reader> {
        let slot = self.inner.slot.clone();
        let adapter = feed.adapter(&slot)?;
        if let ReadFrom::After(id) = &from {
            adapter.log_parse_id(id.clone()).await?;
        }
        let feed_guard = feed.reader();
        let joined = if feed.next.get().is_none() {
            self.inner.live.join(topic, &feed).await?
        } else {
            None
        };
        let mut cursor = Cursor::new(types::Start::Earliest);
        let mut first_page = None;
        let mut page = PageSize::default();
        match from {
            ReadFrom::Latest => {
                // An ended feed has no live tail and nothing more to come.
                let Some((tail, _, _)) = &joined else {
                    return Err(Error::Gone(format!(
                        "the log of topic `{topic}` moved to another broker"
                    )));
                };
                let head = tail.head.lock().unwrap_or_else(|e| e.into_inner());
                cursor.next = head.next.clone();
                cursor.scan_from = head.last_id.clone();
            }
            ReadFrom::Earliest | ReadFrom::After(_) => {
                if let ReadFrom::After(id) = from {
                    cursor.origin = types::Start::After(id);
                }
                first_page = Some(first_page_of(&adapter, topic, &cursor.origin, &mut page).await?);
            }
        }
        let position = match &first_page {
            Some(page) => page.entries.first().map(|e| Position {
                partition: e.pos.partition,
                offset: e.pos.offset,
            }),
            None => cursor
                .next
                .first()
                .map(|(partition, offset)| Position { partition, offset }),
        };
        let (out, rx) = mpsc::channel(READER_BUFFER);
        // Without a live tail (an ended feed) the reader reads its pages, then moves on.
        let (guard, subscription) = match joined {
            Some((_, guard, subscription)) => (Some(guard), Some(subscription)),
            None => (None, None),
        };
        let task = Box::new(ReaderTask {
            inner: self.inner.clone(),
            topic: topic.to_string(),
            feed: feed_guard,
            guard,
            subscription,
            cursor,
            page,
            out,
            pending: Vec::new(),
        });
        let (stop, stopped) = oneshot::channel();
        let task = Owner::spawn(|_| Box::pin(task.run_until(first_page, stopped)));
        Ok(Reader {
            rx,
            ready: Vec::new().into_iter(),
            position,
            task,
            instance: adapter.owner(),
            _stop: stop,
        })
    }
}
