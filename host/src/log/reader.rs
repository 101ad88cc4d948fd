//! A live read: [`Reader`] and the task behind it, which joins `range` catch-up pages with
//! the shared live tail by position.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::feeds::{FeedGuard, Logs};
use super::offsets::Offsets;
use super::tail::{ReaderGuard, TailEvent};
use super::{Entry, Position, RETRY_PAUSE, TRANSIENT_RETRIES};
use crate::bindings::{log as wit, types};
use crate::error::{Error, Result};
use crate::runtime::AdapterInstance;
use crate::runtime::drive::Owner;
use crate::runtime::pages::{PageSize, entry_bytes};
use crate::slot::Held;

/// One message from a reader's task to its [`Reader`]: a batch of entries, or the error that
/// ends the read. Boxed: a tokio channel allocates its first block of 32 slots with it, and at
/// 8 bytes a slot instead of 32 that block is ≈ 770 bytes smaller in every idle reader.
pub(super) type ReaderBatch = Box<Result<Vec<Entry>>>;

/// A live read of one topic: a [`Stream`] of entries in order, ending with an error if the
/// read cannot continue (e.g. it fell behind the retained history: [`Error::Gone`]).
pub struct Reader {
    /// Batches from the reader's task (a page, or what one tail batch had for this reader).
    pub(super) rx: mpsc::Receiver<ReaderBatch>,
    /// The rest of the batch being yielded.
    pub(super) ready: std::vec::IntoIter<Entry>,
    pub(super) position: Option<Position>,
    /// The reader's task (its `ReaderTask`), polled by its driver or, when it was woken, by
    /// this reader's own poll.
    pub(super) task: Arc<Owner>,
    /// The instance whose stream feeds the read's shared tail.
    pub(super) instance: Arc<Owner>,
    /// Dropped with the reader: ends its task.
    pub(super) _stop: oneshot::Sender<()>,
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
        futures::StreamExt::next(self).await
    }
}

impl Stream for Reader {
    type Item = Result<Entry>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut helped = false;
        loop {
            if let Some(entry) = self.ready.next() {
                return Poll::Ready(Some(Ok(entry)));
            }
            match self.rx.poll_recv(cx).map(|batch| batch.map(|batch| *batch)) {
                Poll::Ready(Some(Ok(batch))) => self.ready = batch.into_iter(),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending if helped => return Poll::Pending,
                // What the next batch waits on, when it was woken and nobody polls it: the
                // instance (its stream into the shared tail), then this reader's task. Polled
                // here, an entry on its way needs no hand-over to their driver tasks.
                Poll::Pending => {
                    self.instance.help();
                    self.task.help();
                    helped = true;
                }
            }
        }
    }
}

/// Where a reader is: the next offset per partition, and the id to continue a `range` scan from.
#[derive(Debug)]
pub(super) struct Cursor {
    pub(super) next: Offsets,
    /// The id of the last entry seen by any means (a `range` after it continues the scan).
    pub(super) scan_from: Option<String>,
    /// Where a scan starts when no entry was seen yet.
    pub(super) origin: types::Start,
}

impl Cursor {
    pub(super) fn new(origin: types::Start) -> Self {
        Self {
            next: Offsets::default(),
            scan_from: None,
            origin,
        }
    }

    /// Whether `e` is the next entry of its partition (or later, which a caller treats as a gap).
    fn is_new(&self, pos: &types::Position) -> bool {
        self.next
            .get(pos.partition)
            .is_none_or(|next| pos.offset >= next)
    }

    fn expects(&self, pos: &types::Position) -> Option<u64> {
        self.next.get(pos.partition)
    }

    /// Past `pos`. The id to scan from is taken once per page or tail batch (`scan_from`), not
    /// per entry: cloning every entry's id was a visible part of a catch-up's cost.
    fn advance(&mut self, pos: &types::Position) {
        self.next.set(pos.partition, pos.offset + 1);
    }
}

/// Why a reader task stopped.
enum Stop {
    /// The consumer dropped the reader.
    Dropped,
    /// The read cannot continue; the error was sent to the consumer.
    Failed,
}

pub(super) struct ReaderTask {
    pub(super) inner: Held<Logs>,
    pub(super) topic: String,
    /// The feed this reader reads.
    pub(super) feed: FeedGuard,
    /// Keeps the shared tail alive while this reader reads (none on an ended feed).
    pub(super) guard: Option<ReaderGuard>,
    pub(super) subscription: Option<broadcast::Receiver<TailEvent>>,
    pub(super) cursor: Cursor,
    /// The size of the next catch-up page, adapted to the entries' sizes.
    pub(super) page: PageSize,
    pub(super) out: mpsc::Sender<ReaderBatch>,
    /// Entries delivered and not yet sent: one send per page or tail batch, not per entry.
    pub(super) pending: Vec<Entry>,
}

impl ReaderTask {
    /// [`Self::run`] until `stop` fires (the reader was dropped).
    pub(super) async fn run_until(
        self: Box<Self>,
        first_page: Option<wit::Page>,
        stop: oneshot::Receiver<()>,
    ) {
        tokio::select! {
            biased;
            _ = stop => {}
            () = self.run(first_page) => {}
        }
    }

    /// Deliver `first_page`, then follow the shared tail until the consumer goes or the read
    /// fails. What an idle reader's task does not wait on is boxed — the task itself, the
    /// first page, catch-up and rejoin (each holds an adapter call's state) — so the task that
    /// waits on the tail holds little more than that wait: inline, they made it 840 bytes.
    async fn run(mut self: Box<Self>, first_page: Option<wit::Page>) {
        if let Some(page) = first_page
            && Box::pin(self.start_from(page)).await.is_err()
        {
            return;
        }
        loop {
            let Some(subscription) = self.subscription.as_mut() else {
                if Box::pin(self.rejoin()).await.is_err() {
                    return;
                }
                continue;
            };
            let entries = match subscription.recv().await {
                Ok(TailEvent::Entries(entries)) => entries,
                Ok(TailEvent::Gap) => {
                    if Box::pin(self.catch_up()).await.is_err() {
                        return;
                    }
                    continue;
                }
                Err(broadcast::error::RecvError::Lagged(skipped)) => {
                    tracing::debug!(topic = %self.topic, skipped, "reader fell behind the tail; reading pages");
                    if Box::pin(self.catch_up()).await.is_err() {
                        return;
                    }
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => {
                    // The shared tail ended (adapter replaced, or its stream was cut): join the
                    // next one and fill what happened in between from pages.
                    if Box::pin(self.rejoin()).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            // The last entry delivered from this batch whose id the cursor has not taken yet.
            let mut unnoted: Option<&wit::Entry> = None;
            for entry in entries.iter() {
                if let Some(next) = self.cursor.expects(&entry.pos) {
                    if entry.pos.offset < next {
                        continue;
                    }
                    if entry.pos.offset > next {
                        if let Some(seen) = unnoted.take() {
                            self.cursor.scan_from = Some(seen.id.clone());
                        }
                        if Box::pin(self.catch_up()).await.is_err() {
                            return;
                        }
                        if !self.cursor.is_new(&entry.pos) {
                            continue;
                        }
                    }
                }
                self.deliver(entry.clone());
                unnoted = Some(entry);
            }
            if let Some(seen) = unnoted {
                self.cursor.scan_from = Some(seen.id.clone());
            }
            if self.flush().await.is_err() {
                return;
            }
        }
    }

    /// Deliver the read's first page, and the pages after it up to the tip.
    async fn start_from(&mut self, page: wit::Page) -> std::result::Result<(), Stop> {
        let done = page.done || page.entries.is_empty();
        self.deliver_page(page).await?;
        if !done {
            Box::pin(self.catch_up()).await?;
        }
        Ok(())
    }

    /// Take `entry` as the next one of the read (sent with the next [`Self::flush`]).
    fn deliver(&mut self, entry: wit::Entry) {
        if let Some(next) = self
            .cursor
            .expects(&entry.pos)
            .filter(|next| entry.pos.offset > *next)
        {
            tracing::warn!(topic = %self.topic, expected = next, got = entry.pos.offset,
                "the adapter skipped offsets that no page returned");
        }
        self.cursor.advance(&entry.pos);
        self.pending.push(entry.into());
    }

    /// Send the entries delivered so far to the consumer, as one batch.
    async fn flush(&mut self) -> std::result::Result<(), Stop> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.pending);
        self.out
            .send(Box::new(Ok(batch)))
            .await
            .map_err(|_| Stop::Dropped)
    }

    /// End the read with `error`, after the entries delivered before it.
    async fn fail(&mut self, error: Error) -> Stop {
        if self.flush().await.is_ok() {
            let _ = self.out.send(Box::new(Err(error))).await;
        }
        Stop::Failed
    }

    async fn deliver_page(&mut self, page: wit::Page) -> std::result::Result<(), Stop> {
        // Whether delivered or already seen, the page's last entry is where a scan goes on.
        let last = page.entries.last().map(|e| e.id.clone());
        for entry in page.entries {
            if self.cursor.is_new(&entry.pos) {
                self.deliver(entry);
            }
        }
        if last.is_some() {
            self.cursor.scan_from = last;
        }
        self.flush().await
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
                Err(e) => return Err(self.fail(e).await),
            };
            match adapter
                .log_range(self.topic.clone(), origin.clone(), self.page.limit())
                .await
            {
                Ok(page) => {
                    note(&mut self.page, &page);
                    return Ok(page);
                }
                // A bad request here is the broker behind itself, not the caller: the id is one
                // it handed this reader (or the first page read), yet it says the id is past its
                // tip (RabbitMQ right after a restart: a stream reader from that offset hears
                // nothing for a while). Tried again as the other passing failures are.
                Err(
                    e @ (Error::Trapped(_)
                    | Error::Timeout(_)
                    | Error::Unavailable(_)
                    | Error::BadRequest(_)),
                ) if attempt < TRANSIENT_RETRIES => {
                    attempt += 1;
                    if matches!(e, Error::Trapped(_)) {
                        self.page.after_trap();
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => return Err(self.fail(e).await),
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
            match self.inner.live.join(&self.topic, &self.feed.feed).await {
                Ok(None) => continue,
                Ok(Some((_, guard, subscription))) => {
                    self.guard = Some(guard);
                    self.subscription = Some(subscription);
                    return self.catch_up().await;
                }
                Err(e) if attempt >= TRANSIENT_RETRIES => return Err(self.fail(e).await),
                Err(_) => {
                    attempt += 1;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }
}

/// The first page of a read from `origin`, asked at `page`'s size. A page that traps (the
/// instance ran out of memory holding it: entries of a mebibyte, say) is asked again at half the
/// size, down to one entry; then the trap is the answer.
pub(super) async fn first_page_of(
    adapter: &AdapterInstance,
    topic: &str,
    origin: &types::Start,
    page: &mut PageSize,
) -> Result<wit::Page> {
    loop {
        match adapter
            .log_range(topic.to_string(), origin.clone(), page.limit())
            .await
        {
            Ok(answer) => {
                note(page, &answer);
                return Ok(answer);
            }
            Err(Error::Trapped(_)) if page.after_trap() => {}
            Err(e) => return Err(e),
        }
    }
}

/// Size the page after `answer` by its entries' bytes.
fn note(page: &mut PageSize, answer: &wit::Page) {
    let bytes = answer
        .entries
        .iter()
        .map(|e| entry_bytes(&e.value, e.key.as_deref(), &e.headers))
        .sum();
    page.after_page(answer.entries.len(), bytes);
}
