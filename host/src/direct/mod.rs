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

mod adapter_listener;
mod inboxes;
mod listener;
mod sink;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bindings::direct as wit;
use crate::error::{Error, Result};
use crate::log::Headers;
use crate::slot::{AdapterSlot, Held};
use adapter_listener::AdapterListener;
use inboxes::PendingGuard;
use listener::ListenerShared;

pub(crate) use inboxes::Inboxes;

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
// The public API

/// A handler: gets each packet; `Err` (or a panic) is logged and the packet is gone.
type Handler =
    dyn Fn(Incoming) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync;

/// The direct capability of one broker.
#[derive(Clone)]
pub struct Direct {
    inner: Held<Inboxes>,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct").finish_non_exhaustive()
    }
}

impl Direct {
    pub(crate) fn new(inner: Held<Inboxes>) -> Self {
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
        let inbox = tokio::time::timeout_at(deadline, self.inner.live.reply_inbox())
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
        let (switch_tx, switches) = mpsc::channel(4);
        let shared = Arc::new_cyclic(|me: &Weak<ListenerShared>| ListenerShared {
            listener: AdapterListener::new(
                self.inner.slot.clone(),
                address,
                options.group,
                me.clone(),
            ),
            handler: Arc::new(move |incoming| Box::pin(handler(incoming))),
            stopping: CancellationToken::new(),
            handlers: TaskTracker::new(),
            slots: Arc::new(Semaphore::new(options.concurrency)),
            switch_tx,
            in_place: Mutex::new(true),
        });
        let session = shared.listener.listen().await?;
        self.inner
            .live
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
