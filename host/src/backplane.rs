//! The backplane capability: at-most-once fan-out across every host instance on one broker.
//!
//! One broker subscription per channel per host instance, shared by every local subscriber and
//! dropped with the last one; publishes to one channel are coalesced into batches. If the
//! adapter's subscription ends (a trap, a cut connection) it is re-established; what was
//! published meanwhile is lost, as at-most-once allows.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_util::sync::CancellationToken;

use crate::batch::{BatchCall, Batchers};
use crate::error::{Error, Result};
use crate::handover::{Handover, Migration, Step};
use crate::runtime::AdapterInstance;
use crate::slot::{AdapterSlot, Held};

/// Payloads buffered per channel for local subscribers before a slow one loses the oldest.
const FANOUT_BUFFER: usize = 4096;
/// Payloads carried by one `publish` call at most.
const MAX_PUBLISH_BATCH: usize = 256;
/// Pause before re-subscribing a channel whose broker subscription ended.
const RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(50);

/// Per-broker backplane machinery: publish batchers and the shared channel subscriptions.
pub(crate) struct Channels {
    slot: Arc<AdapterSlot>,
    publishes: Batchers<Vec<u8>, ()>,
    fanouts: tokio::sync::Mutex<HashMap<String, Arc<Fanout>>>,
}

impl Channels {
    pub(crate) fn new(slot: Arc<AdapterSlot>) -> Self {
        let publish: Arc<BatchCall<Vec<u8>, ()>> = Arc::new(|adapter, channel, payloads| {
            Box::pin(async move {
                let count = payloads.len();
                adapter
                    .backplane_publish(channel, payloads)
                    .await
                    .map(|()| vec![(); count])
            })
        });
        Self {
            publishes: Batchers::new(slot.clone(), MAX_PUBLISH_BATCH, publish),
            slot,
            fanouts: tokio::sync::Mutex::new(HashMap::new()),
        }
    }
}

impl Channels {
    /// A migration, before calls go to the adapter `to`: subscribe every live channel there too.
    /// Payloads still arriving from the old subscription keep flowing until `old_done` fires
    /// (once the writes to the old broker have landed); then it is dropped. Each payload was
    /// published to one of the two brokers, so nobody gets one twice.
    pub(crate) async fn switch_all(&self, to: &AdapterInstance, old_done: CancellationToken) {
        let live: Vec<(String, Arc<Fanout>)> = self
            .fanouts
            .lock()
            .await
            .iter()
            .filter(|(_, f)| !f.stop.is_cancelled())
            .map(|(c, f)| (c.clone(), f.clone()))
            .collect();
        let moves = live.into_iter().map(|(channel, fanout)| {
            let old_done = old_done.clone();
            async move {
                match to.backplane_subscribe(channel.clone()).await {
                    Ok(rx) => {
                        let _ = fanout.switch_tx.send((rx, old_done)).await;
                    }
                    Err(e) => tracing::warn!(
                        channel,
                        "subscribing on the new broker: {e} (it follows when the old one closes)"
                    ),
                }
            }
        });
        futures::future::join_all(moves).await;
    }
}

/// A subscription on the new adapter, and when to let go of the old one.
type Switch = (mpsc::Receiver<Vec<Vec<u8>>>, CancellationToken);

/// The shared broker subscription of one channel in this host instance.
struct Fanout {
    tx: broadcast::Sender<Bytes>,
    subscribers: Mutex<usize>,
    stop: CancellationToken,
    /// Hands the pump a subscription on the adapter a migration moves to.
    switch_tx: mpsc::Sender<Switch>,
}

impl Fanout {
    async fn start(slot: Arc<AdapterSlot>, channel: String) -> Result<Arc<Self>> {
        let rx = slot.current().backplane_subscribe(channel.clone()).await?;
        let (switch_tx, switches) = mpsc::channel(2);
        let fanout = Arc::new(Fanout {
            tx: broadcast::channel(FANOUT_BUFFER).0,
            subscribers: Mutex::new(0),
            stop: CancellationToken::new(),
            switch_tx,
        });
        tokio::spawn(fanout.clone().pump(slot, channel, rx, switches));
        Ok(fanout)
    }

    /// Hand `payloads` to every local subscriber.
    fn fan_out(&self, payloads: Vec<Vec<u8>>) {
        for payload in payloads {
            let _ = self.tx.send(Bytes::from(payload));
        }
    }

    /// Forward what the old subscription still delivers until `done` fires.
    async fn drain_old(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<Vec<Vec<u8>>>,
        done: CancellationToken,
    ) {
        loop {
            let batch = tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = done.cancelled() => return,
                batch = rx.recv() => batch,
            };
            let Some(payloads) = batch else { return };
            self.fan_out(payloads);
        }
    }

    /// Move payloads from the adapter to local subscribers until the last one leaves.
    async fn pump(
        self: Arc<Self>,
        slot: Arc<AdapterSlot>,
        channel: String,
        mut rx: mpsc::Receiver<Vec<Vec<u8>>>,
        mut switches: mpsc::Receiver<Switch>,
    ) {
        loop {
            let batch = tokio::select! {
                _ = self.stop.cancelled() => return,
                Some((new_rx, old_done)) = switches.recv() => {
                    let old = std::mem::replace(&mut rx, new_rx);
                    tokio::spawn(self.clone().drain_old(old, old_done));
                    continue;
                }
                batch = rx.recv() => batch,
            };
            match batch {
                Some(payloads) => self.fan_out(payloads),
                None => loop {
                    if self.stop.is_cancelled() {
                        return;
                    }
                    match slot.current().backplane_subscribe(channel.clone()).await {
                        Ok(new_rx) => {
                            rx = new_rx;
                            break;
                        }
                        Err(Error::Closed(_)) => return,
                        Err(e) => {
                            tracing::debug!(channel, "re-subscribing: {e}");
                            tokio::time::sleep(RESUBSCRIBE_PAUSE).await;
                        }
                    }
                },
            }
        }
    }

    /// Add a local subscriber, unless the fanout already stopped.
    fn join(self: &Arc<Self>) -> Option<Subscription> {
        let mut subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        if self.stop.is_cancelled() {
            return None;
        }
        *subscribers += 1;
        Some(Subscription {
            payloads: BroadcastStream::new(self.tx.subscribe()),
            fanout: self.clone(),
        })
    }
}

/// The backplane capability of one broker.
#[derive(Clone)]
pub struct Backplane {
    inner: Held<Channels>,
}

impl std::fmt::Debug for Backplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backplane").finish_non_exhaustive()
    }
}

impl Backplane {
    pub(crate) fn new(inner: Held<Channels>) -> Self {
        Self { inner }
    }

    /// Publish `payload` to `channel` (a literal name: no wildcards). Every subscriber that
    /// exists when the broker takes it receives it, at most once. Concurrent publishes to one
    /// channel are batched, in order.
    pub async fn publish(&self, channel: &str, payload: impl Into<Vec<u8>>) -> Result<()> {
        self.inner
            .live
            .publishes
            .submit(channel, payload.into())
            .await
    }

    /// Subscribe to `channel`. Returns once the broker confirmed the subscription: everything
    /// published after this returns is delivered. Drop the [`Subscription`] to unsubscribe.
    pub async fn subscribe(&self, channel: &str) -> Result<Subscription> {
        let channels = &self.inner.live;
        let mut fanouts = channels.fanouts.lock().await;
        if let Some(subscription) = fanouts.get(channel).and_then(|f| f.join()) {
            return Ok(subscription);
        }
        let fanout = Fanout::start(channels.slot.clone(), channel.to_string()).await?;
        fanouts.insert(channel.to_string(), fanout.clone());
        fanout
            .join()
            .ok_or_else(|| Error::Closed("the backplane was closed".into()))
    }
}

/// A local subscription to one channel: a [`Stream`] of payloads. Payloads a subscriber was too
/// slow to take are skipped (at-most-once), with a warning.
pub struct Subscription {
    payloads: BroadcastStream<Bytes>,
    fanout: Arc<Fanout>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl Subscription {
    /// The next payload; `None` once the backplane closed.
    pub async fn recv(&mut self) -> Option<Bytes> {
        futures::StreamExt::next(self).await
    }
}

impl Stream for Subscription {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            match Pin::new(&mut self.payloads).poll_next(cx) {
                Poll::Ready(Some(Ok(payload))) => return Poll::Ready(Some(payload)),
                Poll::Ready(Some(Err(BroadcastStreamRecvError::Lagged(skipped)))) => {
                    tracing::warn!(
                        skipped,
                        "a backplane subscriber fell behind and lost payloads"
                    );
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut subscribers = self
            .fanout
            .subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *subscribers -= 1;
        if *subscribers == 0 {
            self.fanout.stop.cancel();
        }
    }
}

/// A migration of the backplane: every channel is subscribed on the new broker too, and the
/// old subscriptions end once the old broker's writes have landed.
struct ChannelMigration(CancellationToken);

impl Handover for Channels {
    fn migrating<'a>(
        &'a self,
        _old: &'a AdapterInstance,
        new: &'a AdapterInstance,
    ) -> Step<'a, Box<dyn Migration + 'a>> {
        Box::pin(async move {
            let old_done = CancellationToken::new();
            self.switch_all(new, old_done.clone()).await;
            Box::new(ChannelMigration(old_done)) as Box<dyn Migration>
        })
    }
}

impl Migration for ChannelMigration {
    fn old_complete(&mut self) {
        self.0.cancel();
    }
}
