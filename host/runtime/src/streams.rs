//! Streams across the component boundary, both ways, always moved in batches:
//! [`Forward`] drains a guest-written stream into a tokio channel of batches (or any
//! [`BatchSink`]), and [`BatchProducer`] feeds a guest-read stream from any host source polled for batches.

use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tokio_util::sync::PollSender;
use wasmtime::StoreContextMut;
use wasmtime::component::{
    Destination, Source, StreamConsumer, StreamProducer, StreamResult, VecBuffer,
};

/// The most items moved in one batch.
pub const MAX_BATCH: usize = 1024;

/// How many batches may wait in a forwarding channel before the guest writer is held back.
pub const CHANNEL_BATCHES: usize = 64;

/// Where a [`Forward`] puts each batch it reads from a guest-written stream.
pub trait BatchSink<T>: Send + Unpin + 'static {
    /// Whether the sink takes one more batch now; `Ready(false)` once it never will (the guest
    /// then sees its reader dropped).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<bool>;
    /// Take `batch` (after `poll_ready` answered `Ready(true)`); false once it never will.
    fn deliver(&mut self, batch: Vec<T>) -> bool;
}

/// A tokio channel of batches: ready while it has room, over once its receiver is gone.
impl<T: Send + 'static> BatchSink<T> for PollSender<Vec<T>> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        self.poll_reserve(cx).map(|reserved| reserved.is_ok())
    }

    fn deliver(&mut self, batch: Vec<T>) -> bool {
        self.send_item(batch).is_ok()
    }
}

/// Reads a guest-written stream and puts each batch into a [`BatchSink`] (by default a tokio
/// channel). When the sink takes no more the guest sees its reader dropped.
pub struct Forward<T, S = PollSender<Vec<T>>> {
    sink: S,
    items: PhantomData<fn() -> T>,
}

impl<T, S> Forward<T, S> {
    /// A forwarder into `sink`.
    pub fn to(sink: S) -> Self {
        Self {
            sink,
            items: PhantomData,
        }
    }
}

impl<D, T, S> StreamConsumer<D> for Forward<T, S>
where
    T: Send + Sync + wasmtime::component::Lift + 'static,
    S: BatchSink<T>,
{
    type Item = T;

    fn poll_consume(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut store: StoreContextMut<D>,
        mut source: Source<'_, Self::Item>,
        finish: bool,
    ) -> Poll<wasmtime::Result<StreamResult>> {
        match self.sink.poll_ready(cx) {
            Poll::Ready(false) => Poll::Ready(Ok(StreamResult::Dropped)),
            Poll::Pending if finish => Poll::Ready(Ok(StreamResult::Cancelled)),
            Poll::Pending => Poll::Pending,
            Poll::Ready(true) => {
                let wanted = source.remaining(&mut store).clamp(1, MAX_BATCH);
                let mut batch = Vec::with_capacity(wanted);
                source.read(&mut store, &mut batch)?;
                if batch.is_empty() {
                    // Nothing to move (a zero-length write): keep the permit for the next one.
                    return Poll::Ready(Ok(StreamResult::Completed));
                }
                match self.sink.deliver(batch) {
                    true => Poll::Ready(Ok(StreamResult::Completed)),
                    false => Poll::Ready(Ok(StreamResult::Dropped)),
                }
            }
        }
    }
}

/// A host source that yields batches when polled (a broker subscription, a store follower).
pub trait PollBatch: Send + 'static {
    /// What the source yields.
    type Item: Send + 'static;
    /// Up to `max` items; `Ready(None)` once the source has ended for good.
    fn poll_batch(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<Vec<Self::Item>>>;
}

/// A channel's receiver: what is queued, up to `max` at a time; ended once every sender is gone
/// and the queue is empty.
impl<T: Send + 'static> PollBatch for mpsc::Receiver<T> {
    type Item = T;

    fn poll_batch(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<Vec<T>>> {
        let mut batch = Vec::new();
        match self.poll_recv_many(cx, &mut batch, max.max(1)) {
            Poll::Ready(0) => Poll::Ready(None),
            Poll::Ready(_) => Poll::Ready(Some(batch)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A [`PollBatch`] source whose items `keep` turns into what is handed on (`None`: left out);
/// a batch of which nothing is kept is not handed on, the source is polled again.
pub struct FilterMap<S, F> {
    source: S,
    keep: F,
}

impl<S, F> FilterMap<S, F> {
    /// `source`, filtered and converted by `keep`.
    pub fn new(source: S, keep: F) -> Self {
        Self { source, keep }
    }
}

impl<S, F, T> PollBatch for FilterMap<S, F>
where
    S: PollBatch,
    F: FnMut(S::Item) -> Option<T> + Send + 'static,
    T: Send + 'static,
{
    type Item = T;

    fn poll_batch(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<Vec<T>>> {
        loop {
            let batch = match self.source.poll_batch(cx, max) {
                Poll::Ready(Some(batch)) => batch,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            let kept: Vec<T> = batch.into_iter().filter_map(&mut self.keep).collect();
            if !kept.is_empty() {
                return Poll::Ready(Some(kept));
            }
        }
    }
}

/// Feeds a guest-read stream from a [`PollBatch`] source, converting each item with `map`.
pub struct BatchProducer<S, F> {
    source: S,
    map: F,
}

impl<S, F> BatchProducer<S, F> {
    /// A producer over `source`.
    pub fn new(source: S, map: F) -> Self {
        Self { source, map }
    }
}

impl<D, S, F, T> StreamProducer<D> for BatchProducer<S, F>
where
    S: PollBatch + Unpin,
    F: FnMut(S::Item) -> T + Send + Unpin + 'static,
    T: Send + Sync + 'static,
{
    type Item = T;
    type Buffer = VecBuffer<T>;

    fn poll_produce<'a>(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut store: StoreContextMut<'a, D>,
        mut dst: Destination<'a, Self::Item, Self::Buffer>,
        finish: bool,
    ) -> Poll<wasmtime::Result<StreamResult>> {
        let room = dst
            .remaining(&mut store)
            .unwrap_or(MAX_BATCH)
            .min(MAX_BATCH);
        if room == 0 {
            // A readiness probe: claim readiness rather than buffering items nobody may read.
            return Poll::Ready(Ok(StreamResult::Completed));
        }
        let me = &mut *self;
        match me.source.poll_batch(cx, room) {
            Poll::Ready(None) => Poll::Ready(Ok(StreamResult::Dropped)),
            Poll::Ready(Some(items)) => {
                let items: Vec<T> = items.into_iter().map(&mut me.map).collect();
                dst.set_buffer(items.into());
                Poll::Ready(Ok(StreamResult::Completed))
            }
            Poll::Pending if finish => Poll::Ready(Ok(StreamResult::Cancelled)),
            Poll::Pending => Poll::Pending,
        }
    }
}
