//! The log capability: ordered, replayable feeds a reader resumes from an id.
//!
//! Appends to one topic are coalesced into batches (one adapter call carries every append that
//! arrived while the previous one was in flight). Reads share one live `tail` per topic per host
//! instance ([`TopicTail`]), fanned out to every local reader; each reader joins `range`
//! catch-up pages with that tail by position, dropping duplicates and filling gaps, and a reader
//! that falls behind goes back to `range` reads, so memory per slow reader stays bounded.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::batch::Batchers;
use crate::bindings::{log as wit, types};
use crate::broker::{AdapterSlot, Inner};
use crate::error::{Error, Result};
use crate::runtime::AdapterInstance;

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

/// Entries per `range` page.
const PAGE: u32 = 256;
/// Appends carried by one adapter call at most.
const MAX_APPEND_BATCH: usize = 256;
/// Entries a topic tail buffers for its local readers before a slow one lags.
const TAIL_BUFFER: usize = 1024;
/// Entries buffered per reader between its task and its consumer.
const READER_BUFFER: usize = 256;
/// Attempts at a catch-up page when the adapter is being replaced (trap, timeout).
const TRANSIENT_RETRIES: u32 = 20;
/// Pause between such attempts, and before re-establishing a lost tail.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Per-broker log machinery: the append batchers, the shared topic tails and the feed.
pub(crate) struct Logs {
    slot: Arc<AdapterSlot>,
    appends: Batchers<wit::RecordIn, String>,
    tails: tokio::sync::Mutex<HashMap<String, Arc<TopicTail>>>,
    /// The feed readers start on now (the broker the slot's adapter talks to).
    feed: Mutex<Arc<Feed>>,
    /// The feed the last migration ended.
    previous: Mutex<Option<Arc<Feed>>>,
}

/// The logs of one broker as seen through this host. A migration to another broker ends a
/// feed: its readers finish it on the old adapter, then go on with the next feed from the
/// swap point.
pub(crate) struct Feed {
    /// The old adapter, pinned by a migration while readers still finish this feed.
    old: Mutex<Option<AdapterInstance>>,
    /// Set when a migration ended this feed: the next feed, and per topic where it started.
    next: std::sync::OnceLock<(Arc<Feed>, SwapPoints)>,
    /// How many readers read this feed.
    readers: tokio::sync::watch::Sender<usize>,
    /// How many readers finished this feed and went on with the next one.
    moved: std::sync::atomic::AtomicUsize,
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
    fn adapter(&self, slot: &AdapterSlot) -> Result<AdapterInstance> {
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

    fn reader(self: &Arc<Self>) -> FeedGuard {
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
struct FeedGuard {
    feed: Arc<Feed>,
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
        self.0.iter().for_each(|t| t.stop.cancel());
    }
}

impl Logs {
    pub(crate) fn new(slot: Arc<AdapterSlot>) -> Self {
        Self {
            slot: slot.clone(),
            appends: Batchers::new(
                slot,
                MAX_APPEND_BATCH,
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
    fn current_feed(&self) -> Arc<Feed> {
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
    async fn join(
        &self,
        topic: &str,
        feed: &Arc<Feed>,
    ) -> Result<Option<(Arc<TopicTail>, ReaderGuard, broadcast::Receiver<TailEvent>)>> {
        let mut tails = self.tails.lock().await;
        if !Arc::ptr_eq(feed, &self.current_feed()) {
            return Ok(None);
        }
        if let Some(tail) = tails.get(topic).filter(|t| !t.stop.is_cancelled()) {
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

/// The log capability of one broker.
#[derive(Clone)]
pub struct Log {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").finish_non_exhaustive()
    }
}

impl Log {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
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
        self.inner.logs.appends.submit(topic, record).await
    }

    /// Append several entries in order, in one adapter call.
    pub async fn append_batch(
        &self,
        topic: &str,
        records: Vec<(Vec<u8>, AppendOptions)>,
    ) -> Result<Vec<String>> {
        let batch = records
            .into_iter()
            .map(|(value, o)| wit::RecordIn {
                value,
                headers: o.headers,
                key: o.key,
            })
            .collect();
        let batch: Vec<wit::RecordIn> = batch;
        self.inner
            .slot
            .retry_trapped(|adapter| {
                let (first, second) = (topic.to_string(), batch.clone());
                async move { adapter.log_append(first, second).await }
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
        let logs = &self.inner.logs;
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
            self.inner.logs.join(topic, &feed).await?
        } else {
            None
        };
        let mut cursor = Cursor::new(types::Start::Earliest);
        let mut first_page = None;
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
                let page = adapter
                    .log_range(topic.to_string(), cursor.origin.clone(), PAGE)
                    .await?;
                first_page = Some(page);
            }
        }
        let position = match &first_page {
            Some(page) => page.entries.first().map(|e| Position {
                partition: e.pos.partition,
                offset: e.pos.offset,
            }),
            None => cursor.next.iter().next().map(|(p, o)| Position {
                partition: *p,
                offset: *o,
            }),
        };
        let (out, rx) = mpsc::channel(READER_BUFFER);
        // Without a live tail (an ended feed) the reader reads its pages, then moves on.
        let (guard, subscription) = match joined {
            Some((_, guard, subscription)) => (Some(guard), Some(subscription)),
            None => (None, None),
        };
        let task = ReaderTask {
            inner: self.inner.clone(),
            topic: topic.to_string(),
            feed: feed_guard,
            guard,
            subscription,
            cursor,
            out,
        };
        let handle = tokio::spawn(task.run(first_page));
        Ok(Reader {
            rx,
            position,
            task: handle,
        })
    }
}

/// A live read of one topic: a [`Stream`] of entries in order, ending with an error if the
/// read cannot continue (e.g. it fell behind the retained history: [`Error::Gone`]).
pub struct Reader {
    rx: mpsc::Receiver<Result<Entry>>,
    position: Option<Position>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

impl Reader {
    /// Where the read was fixed when it became ready: the position of the first entry it will
    /// yield, when known.
    pub fn position(&self) -> Option<Position> {
        self.position
    }

    /// The next entry, waiting for one; `None` when the read ended.
    pub async fn next_entry(&mut self) -> Option<Result<Entry>> {
        self.rx.recv().await
    }
}

impl Stream for Reader {
    type Item = Result<Entry>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where a reader is: the next offset per partition, and the id to continue a `range` scan from.
#[derive(Debug)]
struct Cursor {
    next: BTreeMap<u32, u64>,
    /// The id of the last entry seen by any means (a `range` after it continues the scan).
    scan_from: Option<String>,
    /// Where a scan starts when no entry was seen yet.
    origin: types::Start,
}

impl Cursor {
    fn new(origin: types::Start) -> Self {
        Self {
            next: BTreeMap::new(),
            scan_from: None,
            origin,
        }
    }

    /// Whether `e` is the next entry of its partition (or later, which a caller treats as a gap).
    fn is_new(&self, pos: &types::Position) -> bool {
        self.next
            .get(&pos.partition)
            .is_none_or(|next| pos.offset >= *next)
    }

    fn expects(&self, pos: &types::Position) -> Option<u64> {
        self.next.get(&pos.partition).copied()
    }

    fn advance(&mut self, e: &wit::Entry) {
        self.next.insert(e.pos.partition, e.pos.offset + 1);
        self.scan_from = Some(e.id.clone());
    }
}

/// Why a reader task stopped.
enum Stop {
    /// The consumer dropped the reader.
    Dropped,
    /// The read cannot continue; the error was sent to the consumer.
    Failed,
}

struct ReaderTask {
    inner: Arc<Inner>,
    topic: String,
    /// The feed this reader reads.
    feed: FeedGuard,
    /// Keeps the shared tail alive while this reader reads (none on an ended feed).
    guard: Option<ReaderGuard>,
    subscription: Option<broadcast::Receiver<TailEvent>>,
    cursor: Cursor,
    out: mpsc::Sender<Result<Entry>>,
}

impl ReaderTask {
    async fn run(mut self, first_page: Option<wit::Page>) {
        if let Some(page) = first_page {
            let done = page.done || page.entries.is_empty();
            if self.deliver_page(page).await.is_err() {
                return;
            }
            if !done && self.catch_up().await.is_err() {
                return;
            }
        }
        loop {
            let Some(subscription) = self.subscription.as_mut() else {
                if self.rejoin().await.is_err() {
                    return;
                }
                continue;
            };
            let entry = match subscription.recv().await {
                Ok(TailEvent::Entry(entry)) => entry,
                Ok(TailEvent::Gap) => {
                    if self.catch_up().await.is_err() {
                        return;
                    }
                    continue;
                }
                Err(broadcast::error::RecvError::Lagged(skipped)) => {
                    tracing::debug!(topic = %self.topic, skipped, "reader fell behind the tail; reading pages");
                    if self.catch_up().await.is_err() {
                        return;
                    }
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => {
                    // The shared tail ended (adapter replaced, or its stream was cut): join the
                    // next one and fill what happened in between from pages.
                    if self.rejoin().await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            if let Some(next) = self.cursor.expects(&entry.pos) {
                if entry.pos.offset < next {
                    continue;
                }
                if entry.pos.offset > next {
                    if self.catch_up().await.is_err() {
                        return;
                    }
                    if !self.cursor.is_new(&entry.pos) {
                        continue;
                    }
                }
            }
            if self.deliver((*entry).clone()).await.is_err() {
                return;
            }
        }
    }

    async fn deliver(&mut self, entry: wit::Entry) -> std::result::Result<(), Stop> {
        if let Some(next) = self
            .cursor
            .expects(&entry.pos)
            .filter(|next| entry.pos.offset > *next)
        {
            tracing::warn!(topic = %self.topic, expected = next, got = entry.pos.offset,
                "the adapter skipped offsets that no page returned");
        }
        self.cursor.advance(&entry);
        self.out
            .send(Ok(entry.into()))
            .await
            .map_err(|_| Stop::Dropped)
    }

    async fn deliver_page(&mut self, page: wit::Page) -> std::result::Result<(), Stop> {
        for entry in page.entries {
            if self.cursor.is_new(&entry.pos) {
                self.deliver(entry).await?;
            } else {
                self.cursor.scan_from = Some(entry.id);
            }
        }
        Ok(())
    }

    /// Read pages after the last entry seen until the tip.
    async fn catch_up(&mut self) -> std::result::Result<(), Stop> {
        loop {
            let origin = match &self.cursor.scan_from {
                Some(id) => types::Start::After(id.clone()),
                None => self.cursor.origin.clone(),
            };
            let page = self.range(origin).await?;
            let done = page.done || page.entries.is_empty();
            self.deliver_page(page).await?;
            if done {
                return Ok(());
            }
        }
    }

    async fn range(&mut self, origin: types::Start) -> std::result::Result<wit::Page, Stop> {
        let mut attempt = 0;
        loop {
            let adapter = match self.feed.feed.adapter(&self.inner.slot) {
                Ok(adapter) => adapter,
                Err(e) => {
                    let _ = self.out.send(Err(e)).await;
                    return Err(Stop::Failed);
                }
            };
            match adapter
                .log_range(self.topic.clone(), origin.clone(), PAGE)
                .await
            {
                Ok(page) => return Ok(page),
                Err(Error::Trapped(_) | Error::Timeout(_) | Error::Unavailable(_))
                    if attempt < TRANSIENT_RETRIES =>
                {
                    attempt += 1;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => {
                    let _ = self.out.send(Err(e)).await;
                    return Err(Stop::Failed);
                }
            }
        }
    }

    /// A migration ended this reader's feed: read the rest of it from the old adapter (whose
    /// writes have landed), then go on with the next feed from the swap point.
    async fn move_on(&mut self) -> std::result::Result<(), Stop> {
        self.guard = None;
        self.subscription = None;
        while let Some((next, points)) = self.feed.feed.next.get().cloned() {
            self.catch_up().await?;
            self.cursor = Cursor::new(types::Start::Earliest);
            if let Some(positions) = points.get(&self.topic) {
                self.cursor.next = positions.iter().map(|p| (p.partition, p.offset)).collect();
            }
            self.feed
                .feed
                .moved
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.feed = next.reader();
            tracing::debug!(topic = %self.topic, "reader finished the old broker's feed; on the new one");
        }
        Ok(())
    }

    /// Join the live tail of the reader's feed again (moving on first when a migration ended
    /// it) and fill from pages what happened in between.
    async fn rejoin(&mut self) -> std::result::Result<(), Stop> {
        let mut attempt = 0;
        loop {
            self.move_on().await?;
            match self.inner.logs.join(&self.topic, &self.feed.feed).await {
                Ok(None) => continue,
                Ok(Some((_, guard, subscription))) => {
                    self.guard = Some(guard);
                    self.subscription = Some(subscription);
                    return self.catch_up().await;
                }
                Err(e) if attempt >= TRANSIENT_RETRIES => {
                    let _ = self.out.send(Err(e)).await;
                    return Err(Stop::Failed);
                }
                Err(_) => {
                    attempt += 1;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }
}

/// What a topic tail broadcasts to its local readers.
#[derive(Clone)]
enum TailEvent {
    /// The next entry from the adapter's tail.
    Entry(Arc<wit::Entry>),
    /// The tail was re-established past entries it never delivered: read them from pages.
    Gap,
}

/// The last position and id a topic tail has seen.
#[derive(Debug, Default)]
struct Head {
    next: BTreeMap<u32, u64>,
    last_id: Option<String>,
}

/// The one live `tail` of a topic in this host instance, fanned out to every local reader.
/// If the adapter's stream ends (a trap, a cut connection) it is re-established after the last
/// entry seen; readers see at worst a gap, which they fill from pages.
pub(crate) struct TopicTail {
    /// The feed it follows: once a migration ended it, the tail is not re-established.
    feed: Arc<Feed>,
    tx: Mutex<Option<broadcast::Sender<TailEvent>>>,
    head: Mutex<Head>,
    readers: Mutex<usize>,
    stop: CancellationToken,
}

impl TopicTail {
    async fn start(slot: Arc<AdapterSlot>, topic: String, feed: Arc<Feed>) -> Result<Arc<Self>> {
        let (positions, rx) = feed
            .adapter(&slot)?
            .log_tail(topic.clone(), types::Start::Latest)
            .await?;
        let (tx, _) = broadcast::channel(TAIL_BUFFER);
        let tail = Arc::new(TopicTail {
            feed,
            tx: Mutex::new(Some(tx)),
            head: Mutex::new(Head {
                next: positions.iter().map(|p| (p.partition, p.offset)).collect(),
                last_id: None,
            }),
            readers: Mutex::new(0),
            stop: CancellationToken::new(),
        });
        tokio::spawn(tail.clone().pump(slot, topic, rx));
        Ok(tail)
    }

    fn subscribe(&self) -> Option<broadcast::Receiver<TailEvent>> {
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|tx| tx.subscribe())
    }

    fn join(self: &Arc<Self>) -> ReaderGuard {
        *self.readers.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        ReaderGuard { tail: self.clone() }
    }

    /// Move the adapter's entries into the broadcast until no local reader is left.
    async fn pump(
        self: Arc<Self>,
        slot: Arc<AdapterSlot>,
        topic: String,
        mut rx: mpsc::Receiver<Vec<wit::Entry>>,
    ) {
        loop {
            let batch = tokio::select! {
                _ = self.stop.cancelled() => break,
                batch = rx.recv() => batch,
            };
            match batch {
                Some(entries) => {
                    let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    let Some(tx) = tx else { break };
                    for entry in entries {
                        {
                            let mut head = self.head.lock().unwrap_or_else(|e| e.into_inner());
                            let next = head
                                .next
                                .entry(entry.pos.partition)
                                .or_insert(entry.pos.offset);
                            if entry.pos.offset < *next {
                                tracing::warn!(
                                    topic,
                                    offset = entry.pos.offset,
                                    expected = *next,
                                    "the adapter's tail repeated an entry (the readers drop it)"
                                );
                            }
                            *next = (*next).max(entry.pos.offset + 1);
                            head.last_id = Some(entry.id.clone());
                        }
                        let _ = tx.send(TailEvent::Entry(Arc::new(entry)));
                    }
                }
                None => match self.reestablish(&slot, &topic).await {
                    Some(new_rx) => rx = new_rx,
                    None => break,
                },
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
                let next = head.next.entry(p.partition).or_insert(p.offset);
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
    async fn reestablish(
        &self,
        slot: &AdapterSlot,
        topic: &str,
    ) -> Option<mpsc::Receiver<Vec<wit::Entry>>> {
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
            match adapter.log_tail(topic.to_string(), origin).await {
                Ok((positions, rx)) => {
                    self.note_gap(&positions);
                    return Some(rx);
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

/// Counts a reader of a [`TopicTail`]; the tail stops when the last one is dropped.
struct ReaderGuard {
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
