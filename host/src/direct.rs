//! The direct capability: addressable inboxes and request/reply, at most once.
//!
//! An address is a name the broker routes packets to ([`Direct::inbox`] mints a fresh one).
//! [`Direct::listen`] runs a handler on every packet that reaches a [`Listener`]: listeners in one
//! group compete (each packet reaches one of them), ungrouped listeners each get every packet,
//! and packets from one sender to one address arrive in order. Nothing is retried: a handler
//! that fails is logged and its packet is gone.
//!
//! [`Direct::request`] sends a packet with a fresh correlation id (a UUID v4) and this host
//! instance's own reply inbox as `reply_to`, and waits for the packet that echoes the id. The
//! reply inbox is one address per host instance, made on the first request and shared by every
//! request after it ([`Inboxes`]). If an adapter listener's packet stream ends without a stop
//! (the instance trapped and was replaced), the host listens again on the new instance, on the
//! same address and in the same group; packets sent meanwhile are lost, as at-most-once allows.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{OnceCell, Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bindings::direct as wit;
use crate::broker::{AdapterSlot, Inner};
use crate::error::{Error, Result};
use crate::log::Headers;
use crate::runtime::AdapterInstance;

/// Pause before listening again after an adapter listener's packet stream ended.
const RELISTEN_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between attempts to listen again while they keep failing.
const MAX_RELISTEN_PAUSE: Duration = Duration::from_secs(1);
/// How long a reply may wait for room at the requester's inbox, by default.
const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// A message sent to an address.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Packet {
    /// The payload.
    pub body: Vec<u8>,
    /// Its headers: repeated names allowed, values are bytes.
    pub headers: Headers,
    /// Set by a request, echoed by its reply.
    pub correlation_id: Option<String>,
    /// Where a reply should go (an [`Direct::inbox`] address).
    pub reply_to: Option<String>,
}

impl From<wit::Packet> for Packet {
    fn from(p: wit::Packet) -> Self {
        Packet {
            body: p.body,
            headers: p.headers,
            correlation_id: p.correlation_id,
            reply_to: p.reply_to,
        }
    }
}

impl From<Packet> for wit::Packet {
    fn from(p: Packet) -> Self {
        wit::Packet {
            body: p.body,
            headers: p.headers,
            correlation_id: p.correlation_id,
            reply_to: p.reply_to,
        }
    }
}

/// How a packet is sent.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// How long the broker may hold the packet for a listener with no room before it discards
    /// it (default 5 s).
    pub timeout: Duration,
}

impl Default for SendOptions {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_SEND_TIMEOUT,
        }
    }
}

/// How a listener takes packets.
#[derive(Debug, Clone)]
pub struct ListenOptions {
    /// Listeners of one group on one address compete: each packet reaches one of them. `None`:
    /// this listener gets every packet sent to the address.
    pub group: Option<String>,
    /// Handlers running at once (at least 1). With 1 (the default) packets are handled one at
    /// a time, in arrival order.
    pub concurrency: usize,
}

impl Default for ListenOptions {
    fn default() -> Self {
        Self {
            group: None,
            concurrency: 1,
        }
    }
}

/// A duration as whole milliseconds for the WIT, saturating.
fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

fn check_address(address: &str) -> Result<()> {
    if address.is_empty() {
        return Err(Error::BadRequest("empty address".into()));
    }
    Ok(())
}

/// Send `packet` to `address` through the adapter in `slot`. A send the adapter trapped under
/// is not tried again: it may have reached the broker, and direct is at most once.
async fn send_packet(
    slot: &AdapterSlot,
    address: &str,
    packet: Packet,
    timeout: Duration,
) -> Result<()> {
    check_address(address)?;
    slot.current()
        .direct_send(address.to_string(), packet.into(), millis(timeout))
        .await
}

// ---------------------------------------------------------------------------------------------
// Adapter listeners that survive a trap

/// One `listen` of the adapter: the instance and generation it runs on, its id and its packets.
struct Session {
    instance: AdapterInstance,
    generation: u32,
    id: wit::ListenerId,
    packets: mpsc::Receiver<Vec<wit::Packet>>,
}

/// An adapter listener on one address, kept listening across instance replacements.
struct AdapterListener {
    slot: Arc<AdapterSlot>,
    address: String,
    group: Option<String>,
    /// The live adapter listener: (generation, id); `None` while re-listening or once ended.
    current: Mutex<Option<(u32, wit::ListenerId)>>,
}

impl AdapterListener {
    fn new(slot: Arc<AdapterSlot>, address: &str, group: Option<String>) -> Self {
        Self {
            slot,
            address: address.to_string(),
            group,
            current: Mutex::new(None),
        }
    }

    fn set_current(&self, current: Option<(u32, wit::ListenerId)>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = current;
    }

    /// Listen on the adapter now; returns once the broker routes packets to it.
    async fn listen(&self) -> Result<Session> {
        let (instance, generation, id, packets) = self
            .slot
            .retry_trapped(|adapter| {
                let (address, group) = (self.address.clone(), self.group.clone());
                async move {
                    let (id, packets) = adapter.direct_listen(address, group).await?;
                    // Read after the call: a call queued while a trapped instance was being
                    // replaced runs on the new one, whose generation is published first.
                    let generation = adapter.generation();
                    Ok((adapter, generation, id, packets))
                }
            })
            .await?;
        self.set_current(Some((generation, id)));
        Ok(Session {
            instance,
            generation,
            id,
            packets,
        })
    }

    /// The packet stream of `ended` ended without a stop: release what is left of it and listen
    /// again (at once if another instance already serves, else after a pause of 50 ms doubling
    /// to 1 s while it fails), until that works. `None` when `stopping` fired or the adapter was
    /// closed.
    async fn relisten(&self, ended: Session, stopping: &CancellationToken) -> Option<Session> {
        // The old adapter listener is not stopped: after a trap its id may already name a
        // listener of the new instance (ids are per instance).
        self.set_current(None);
        // Another instance already serves (a hot-swap replaced this one): listen there at once.
        let mut pause = if self.slot.current().generation() == ended.generation {
            RELISTEN_PAUSE
        } else {
            Duration::ZERO
        };
        drop(ended);
        loop {
            tokio::select! {
                biased;
                _ = stopping.cancelled() => return None,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).clamp(RELISTEN_PAUSE, MAX_RELISTEN_PAUSE);
            match self.listen().await {
                Ok(session) => {
                    tracing::debug!(address = %self.address, group = ?self.group, "listening again");
                    return Some(session);
                }
                Err(Error::Closed(_)) => return None,
                Err(e) => {
                    tracing::warn!(address = %self.address, group = ?self.group, "listening again: {e}")
                }
            }
        }
    }

    /// Listen on `adapter` (not through the slot: a migration moves listeners before the slot
    /// points at the new adapter).
    async fn listen_on(&self, adapter: AdapterInstance) -> Result<Session> {
        let (id, packets) = adapter
            .direct_listen(self.address.clone(), self.group.clone())
            .await?;
        let generation = adapter.generation();
        self.set_current(Some((generation, id)));
        Ok(Session {
            instance: adapter,
            generation,
            id,
            packets,
        })
    }

    /// A hot swap or a migration: listen on `to` first, then stop the listener of `session` on
    /// the old adapter, so the address always has a listener. On failure `session` stays (it
    /// re-listens when the old instance closes).
    async fn switch(&self, session: Session, to: AdapterInstance) -> (Session, Vec<wit::Packet>) {
        match self.listen_on(to).await {
            Ok(new) => (new, self.stop_and_drain(session).await),
            Err(e) => {
                tracing::warn!(address = %self.address, "moving a listener to the new adapter: {e}");
                (session, Vec::new())
            }
        }
    }

    /// Stop the listener of `session` and collect what it had already received (the adapter
    /// hands over what its broker routed to it before the stop, then ends the stream), so none
    /// is lost in a swap. Its packets are read while the stop runs: the adapter may be writing
    /// them before its stop returns.
    async fn stop_and_drain(&self, mut session: Session) -> Vec<wit::Packet> {
        let adapter = session.instance.clone();
        let stop = async {
            if adapter.generation() == session.generation
                && let Err(e) = adapter.direct_stop(session.id).await
            {
                tracing::debug!(address = %self.address, "stopping the adapter listener: {e}");
            }
        };
        let mut stop = std::pin::pin!(stop);
        let mut stopped = false;
        let mut left = Vec::new();
        loop {
            tokio::select! {
                () = &mut stop, if !stopped => stopped = true,
                batch = session.packets.recv() => match batch {
                    Some(batch) => left.extend(batch),
                    None if stopped => break,
                    // Ended before the stop returned: let the stop finish.
                    None => {
                        (&mut stop).await;
                        break;
                    }
                },
                // An adapter that keeps its stream open after the stop: stop waiting when it
                // has been quiet for a while.
                () = tokio::time::sleep(DRAIN_WAIT), if stopped => break,
            }
        }
        left
    }

    /// Stop the adapter listener of `session`, if its instance is still the live one and its
    /// stream has not ended (after a trap its id may name a listener of the new instance).
    async fn stop(&self, session: Session) {
        {
            let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
            if *current == Some((session.generation, session.id)) {
                *current = None;
            }
        }
        let adapter = &session.instance;
        let ended = session.packets.is_closed();
        // Nobody takes its packets any more: dropped first, so an adapter handing over what it
        // still holds before its stop returns finds the stream closed instead of full.
        drop(session.packets);
        if adapter.generation() == session.generation
            && !ended
            && let Err(e) = adapter.direct_stop(session.id).await
        {
            tracing::debug!(address = %self.address, "stopping the adapter listener: {e}");
        }
    }

    /// False while re-listening or once ended, or when the adapter says the listener went deaf.
    async fn healthy(&self) -> bool {
        let current = *self.current.lock().unwrap_or_else(|e| e.into_inner());
        let Some((generation, id)) = current else {
            return false;
        };
        let adapter = self.slot.current();
        if adapter.generation() != generation {
            return false;
        }
        match adapter.direct_healthy(id).await {
            Ok(healthy) => healthy.unwrap_or(true),
            Err(_) => false,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The reply inbox of a host instance

/// How long a moved ungrouped listener watches its new session for repeats of what the old one
/// handed over.
const OVERLAP_WINDOW: Duration = Duration::from_secs(1);

/// What the old adapter listener of an ungrouped listener handed over in a move. Both the old
/// and the new adapter listener get every packet sent while both listen, so the new session's
/// first packets may repeat some of these: each repeat is dropped once (at most once), for
/// [`OVERLAP_WINDOW`]. Packets are told apart by a hash of their whole content; a request's
/// correlation id makes each one distinct.
struct Overlap {
    /// Fingerprints of handed-over packets the new session has not repeated yet, with counts.
    left: HashMap<u64, usize>,
    /// When the new session stops being watched.
    until: tokio::time::Instant,
}

impl Overlap {
    /// The overlap after a move in which the old listener handed over `left`; `None` if nothing.
    fn after(left: &[wit::Packet]) -> Option<Self> {
        if left.is_empty() {
            return None;
        }
        let mut counts = HashMap::new();
        for packet in left {
            *counts.entry(fingerprint(packet)).or_insert(0) += 1;
        }
        Some(Self {
            left: counts,
            until: tokio::time::Instant::now() + OVERLAP_WINDOW,
        })
    }

    /// `batch` without the repeats of what `overlap` holds; `overlap` ends once it is used up
    /// or its window has passed.
    fn unrepeated(overlap: &mut Option<Self>, batch: Vec<wit::Packet>) -> Vec<wit::Packet> {
        let Some(watch) = overlap else {
            return batch;
        };
        if tokio::time::Instant::now() >= watch.until {
            *overlap = None;
            return batch;
        }
        let fresh = batch
            .into_iter()
            .filter(|packet| match watch.left.get_mut(&fingerprint(packet)) {
                Some(count) if *count > 0 => {
                    *count -= 1;
                    tracing::trace!("a packet both adapter listeners got in a move: handled once");
                    false
                }
                _ => true,
            })
            .collect();
        watch.left.retain(|_, count| *count > 0);
        if watch.left.is_empty() {
            *overlap = None;
        }
        fresh
    }
}

/// A hash of a packet's whole content.
fn fingerprint(packet: &wit::Packet) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    packet.body.hash(&mut hasher);
    packet.headers.hash(&mut hasher);
    packet.correlation_id.hash(&mut hasher);
    packet.reply_to.hash(&mut hasher);
    hasher.finish()
}

/// How long a moved listener waits for the old adapter's last packets.
const DRAIN_WAIT: Duration = Duration::from_millis(500);

/// The replies a host instance waits for, by correlation id.
type Pending = Mutex<HashMap<String, oneshot::Sender<Packet>>>;

/// This host instance's reply inbox: one address, one listener, the requests waiting on it.
struct ReplyInbox {
    listener: AdapterListener,
    pending: Pending,
    stopping: CancellationToken,
    /// Asks the router to listen on another adapter; answered once it does.
    switch_tx: mpsc::Sender<Switch>,
}

impl ReplyInbox {
    /// Make an address, listen on it, and route replies until `stopping` fires.
    async fn start(slot: Arc<AdapterSlot>) -> Result<Arc<Self>> {
        let address = slot
            .retry_trapped(|adapter| async move { adapter.direct_inbox().await })
            .await?;
        let (switch_tx, switches) = mpsc::channel(4);
        let inbox = Arc::new(ReplyInbox {
            listener: AdapterListener::new(slot, &address, None),
            pending: Mutex::new(HashMap::new()),
            stopping: CancellationToken::new(),
            switch_tx,
        });
        let session = inbox.listener.listen().await?;
        tracing::debug!(%address, "reply inbox listening");
        tokio::spawn(inbox.clone().route(session, switches));
        Ok(inbox)
    }

    fn address(&self) -> &str {
        &self.listener.address
    }

    /// Hand every reply to the request waiting for it.
    async fn route(self: Arc<Self>, mut session: Session, mut switches: mpsc::Receiver<Switch>) {
        loop {
            let batch = tokio::select! {
                biased;
                _ = self.stopping.cancelled() => break,
                Some((to, moved)) = switches.recv() => {
                    let left;
                    (session, left) = self.listener.switch(session, to).await;
                    left.into_iter().for_each(|p| self.deliver(p.into()));
                    let _ = moved.send(());
                    continue;
                }
                batch = session.packets.recv() => batch,
            };
            match batch {
                Some(packets) => packets.into_iter().for_each(|p| self.deliver(p.into())),
                None => match self.listener.relisten(session, &self.stopping).await {
                    Some(new) => session = new,
                    None => return self.listener.set_current(None),
                },
            }
        }
        self.listener.stop(session).await;
    }

    fn deliver(&self, packet: Packet) {
        let waiting = packet.correlation_id.as_ref().and_then(|id| {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(id)
        });
        match waiting {
            Some(tx) => {
                let _ = tx.send(packet);
            }
            None => tracing::debug!(
                address = %self.address(),
                correlation_id = ?packet.correlation_id,
                "dropping a reply nobody waits for (late, or an unknown correlation id)"
            ),
        }
    }
}

/// A request to move a listener to another adapter, answered once it listens there.
type Switch = (AdapterInstance, oneshot::Sender<()>);

/// Removes a request's entry from the pending map however the request ends.
struct PendingGuard<'a> {
    pending: &'a Pending,
    id: String,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Per-broker direct machinery: the host instance's reply inbox, made on the first request.
pub(crate) struct Inboxes {
    slot: Arc<AdapterSlot>,
    reply: OnceCell<Arc<ReplyInbox>>,
    listeners: Mutex<Vec<std::sync::Weak<ListenerShared>>>,
}

impl Inboxes {
    pub(crate) fn new(slot: Arc<AdapterSlot>) -> Self {
        Self {
            slot,
            reply: OnceCell::new(),
            listeners: Mutex::new(Vec::new()),
        }
    }

    /// Move every live listener, and the reply inbox, to the adapter `to`: each listens there
    /// first, then stops its listener on the old one, so an address is never
    /// without a listener.
    pub(crate) async fn switch_all(&self, to: &AdapterInstance) {
        let mut switches: Vec<mpsc::Sender<Switch>> = {
            let mut listeners = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
            listeners.retain(|l| l.strong_count() > 0);
            listeners
                .iter()
                .filter_map(|l| l.upgrade())
                .map(|l| l.switch_tx.clone())
                .collect()
        };
        if let Some(inbox) = self.reply.get() {
            switches.push(inbox.switch_tx.clone());
        }
        let moves = switches.iter().map(|switch| async move {
            let (reply, done) = oneshot::channel();
            if switch.send((to.clone(), reply)).await.is_ok() {
                let _ = done.await;
            }
        });
        futures::future::join_all(moves).await;
    }

    /// The reply inbox, listening; made now if this is the first request.
    async fn reply_inbox(&self) -> Result<&Arc<ReplyInbox>> {
        self.reply
            .get_or_try_init(|| ReplyInbox::start(self.slot.clone()))
            .await
    }
}

impl Drop for Inboxes {
    fn drop(&mut self) {
        if let Some(inbox) = self.reply.get() {
            inbox.stopping.cancel();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The public API

/// A handler: gets each packet; `Err` (or a panic) is logged and the packet is gone.
type Handler =
    dyn Fn(Incoming) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync;

/// The direct capability of one broker.
#[derive(Clone)]
pub struct Direct {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct").finish_non_exhaustive()
    }
}

impl Direct {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    /// A fresh, unique address the broker routes to (the adapter mints it). Listen on it, or
    /// hand it to a peer as `reply_to`.
    pub async fn inbox(&self) -> Result<String> {
        self.inner
            .slot
            .retry_trapped(|adapter| async move { adapter.direct_inbox().await })
            .await
    }

    /// Send `packet` to `address`, at most once. [`Error::Unavailable`] (503) when the broker
    /// knows nobody listens there; a packet nobody took within `options.timeout` may be
    /// discarded. Packets one sender sends one after another to one address arrive in order.
    pub async fn send(&self, address: &str, packet: Packet, options: SendOptions) -> Result<()> {
        send_packet(&self.inner.slot, address, packet, options.timeout).await
    }

    /// Send `body` to `address` with a fresh correlation id (a UUID v4) and this host instance's
    /// reply inbox as `reply_to`, and wait for the reply. [`Error::Unavailable`] when nobody
    /// listens at `address`; [`Error::Timeout`] when no reply came within `timeout`. Concurrent
    /// requests share the reply inbox; each gets its own reply.
    pub async fn request(
        &self,
        address: &str,
        body: impl Into<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Packet> {
        check_address(address)?;
        let deadline = tokio::time::Instant::now() + timeout;
        let timed_out = || {
            Error::Timeout(format!(
                "no reply from `{address}` within {timeout:?} (request/reply timeout)"
            ))
        };
        let inbox = tokio::time::timeout_at(deadline, self.inner.inboxes.reply_inbox())
            .await
            .map_err(|_| timed_out())??;
        let correlation_id = uuid::Uuid::new_v4().simple().to_string();
        let (tx, rx) = oneshot::channel();
        inbox
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(correlation_id.clone(), tx);
        let _guard = PendingGuard {
            pending: &inbox.pending,
            id: correlation_id.clone(),
        };
        let packet = Packet {
            body: body.into(),
            headers: Vec::new(),
            correlation_id: Some(correlation_id),
            reply_to: Some(inbox.address().to_string()),
        };
        let sent = send_packet(&self.inner.slot, address, packet, timeout);
        tokio::time::timeout_at(deadline, sent)
            .await
            .map_err(|_| timed_out())??;
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(Error::Closed(
                "the reply inbox stopped before the reply came".into(),
            )),
            Err(_) => Err(timed_out()),
        }
    }

    /// Listen on `address`: `handler` runs on every packet that reaches this listener, up to
    /// `options.concurrency` at once (one at a time, in arrival order, by default). Returns once
    /// the broker routes packets to it: every packet sent after this returns reaches it (or a
    /// competing member of its group). A handler that fails or panics is logged; nothing is
    /// retried. Stop it with [`Listener::stop`] or by dropping it.
    pub async fn listen<H, F>(
        &self,
        address: &str,
        handler: H,
        options: ListenOptions,
    ) -> Result<Listener>
    where
        H: Fn(Incoming) -> F + Send + Sync + 'static,
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        check_address(address)?;
        if options.concurrency == 0 {
            return Err(Error::BadRequest("concurrency must be at least 1".into()));
        }
        let listener = AdapterListener::new(self.inner.slot.clone(), address, options.group);
        let session = listener.listen().await?;
        let (switch_tx, switches) = mpsc::channel(4);
        let shared = Arc::new(ListenerShared {
            listener,
            handler: Arc::new(move |incoming| Box::pin(handler(incoming))),
            stopping: CancellationToken::new(),
            handlers: TaskTracker::new(),
            slots: Arc::new(Semaphore::new(options.concurrency)),
            switch_tx,
        });
        self.inner
            .inboxes
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&shared));
        let runner = tokio::spawn(shared.clone().run(session, switches));
        Ok(Listener {
            shared,
            runner: Mutex::new(Some(runner)),
        })
    }
}

struct ListenerShared {
    listener: AdapterListener,
    handler: Arc<Handler>,
    stopping: CancellationToken,
    handlers: TaskTracker,
    /// Bounds the handlers in flight to `concurrency`.
    slots: Arc<Semaphore>,
    /// Asks the runner to listen on the slot's current adapter; answered once it does.
    switch_tx: mpsc::Sender<Switch>,
}

impl ListenerShared {
    /// Hand packets to handlers until stopped; listen again when the stream ends without a stop.
    async fn run(self: Arc<Self>, mut session: Session, mut switches: mpsc::Receiver<Switch>) {
        let mut overlap: Option<Overlap> = None;
        'run: loop {
            let batch = tokio::select! {
                biased;
                _ = self.stopping.cancelled() => break,
                Some((to, moved)) = switches.recv() => {
                    let left;
                    (session, left) = self.listener.switch(session, to).await;
                    let _ = moved.send(());
                    // The old session may itself have been the new one of a move just before.
                    let left = Overlap::unrepeated(&mut overlap, left);
                    if self.listener.group.is_none() {
                        overlap = Overlap::after(&left);
                    }
                    Some(left)
                }
                batch = session.packets.recv() => {
                    batch.map(|batch| Overlap::unrepeated(&mut overlap, batch))
                }
            };
            let Some(batch) = batch else {
                match self.listener.relisten(session, &self.stopping).await {
                    Some(new) => {
                        session = new;
                        continue;
                    }
                    None => return self.finish(None).await,
                }
            };
            for packet in batch {
                let permit = tokio::select! {
                    biased;
                    _ = self.stopping.cancelled() => break 'run,
                    permit = self.slots.clone().acquire_owned() => permit,
                };
                let Ok(permit) = permit else { break 'run };
                let incoming = Incoming {
                    packet: packet.into(),
                    slot: self.listener.slot.clone(),
                };
                let shared = self.clone();
                self.handlers.spawn(async move {
                    shared.handle(incoming).await;
                    drop(permit);
                });
            }
        }
        self.finish(Some(session)).await;
    }

    /// Stop the adapter listener (the broker routes nothing more here), then wait for the
    /// handlers in flight.
    async fn finish(&self, session: Option<Session>) {
        match session {
            Some(session) => self.listener.stop(session).await,
            None => self.listener.set_current(None),
        }
        self.handlers.close();
        self.handlers.wait().await;
    }

    async fn handle(&self, incoming: Incoming) {
        let address = &self.listener.address;
        let correlation_id = incoming.packet.correlation_id.clone();
        match AssertUnwindSafe((self.handler)(incoming))
            .catch_unwind()
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(
                %address,
                ?correlation_id,
                "direct handler failed; the packet is dropped (at most once): {e:#}"
            ),
            Err(_) => tracing::warn!(
                %address,
                ?correlation_id,
                "direct handler panicked; the packet is dropped (at most once)"
            ),
        }
    }
}

/// A packet that reached a listener, and the means to answer it.
#[derive(Clone)]
pub struct Incoming {
    /// The packet as sent.
    pub packet: Packet,
    slot: Arc<AdapterSlot>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("packet", &self.packet)
            .finish_non_exhaustive()
    }
}

impl Incoming {
    /// Answer a request: send `body` to the packet's `reply_to` with its `correlation_id`.
    /// [`Error::BadRequest`] when the packet has no `reply_to` (it was sent, not requested);
    /// [`Error::Unavailable`] when the requester is no longer listening.
    pub async fn reply(&self, body: impl Into<Vec<u8>>) -> Result<()> {
        let Some(reply_to) = &self.packet.reply_to else {
            return Err(Error::BadRequest(
                "cannot reply: the packet has no reply_to address (it was sent, not requested)"
                    .into(),
            ));
        };
        let reply = Packet {
            body: body.into(),
            headers: Vec::new(),
            correlation_id: self.packet.correlation_id.clone(),
            reply_to: None,
        };
        send_packet(&self.slot, reply_to, reply, DEFAULT_SEND_TIMEOUT).await
    }
}

/// A running listener. Dropping it stops it in the background; [`Listener::stop`] waits.
pub struct Listener {
    shared: Arc<ListenerShared>,
    runner: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("address", &self.shared.listener.address)
            .field("group", &self.shared.listener.group)
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// The address it listens on.
    pub fn address(&self) -> &str {
        &self.shared.listener.address
    }

    /// The group it competes in, if any.
    pub fn group(&self) -> Option<&str> {
        self.shared.listener.group.as_deref()
    }

    /// Take no new packets, stop the adapter listener (packets it had not handed over are
    /// dropped: at most once), and wait for the handlers in flight.
    pub async fn stop(&self) {
        self.shared.stopping.cancel();
        let runner = self.runner.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(runner) = runner {
            let _ = runner.await;
        }
    }

    /// False once it was stopped or its packet stream ended (while it listens again after a
    /// trap, or for good once the adapter closed), or when the adapter says it went deaf.
    pub async fn healthy(&self) -> bool {
        !self.shared.stopping.is_cancelled() && self.shared.listener.healthy().await
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shared.stopping.cancel();
    }
}
