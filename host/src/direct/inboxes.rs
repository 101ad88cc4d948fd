//! The reply inbox of a host instance, and [`Inboxes`], the per-broker direct machinery
//! that makes it and moves every live listener to another adapter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{OnceCell, mpsc, oneshot};
use tokio_util::sync::{CancellationToken, PollSender};

use super::Packet;
use super::adapter_listener::{AdapterListener, Session};
use super::listener::ListenerShared;
use super::sink::{Taker, queue_rest};
use crate::bindings::direct as wit;
use crate::error::Result;
use crate::handover::{Handover, Migration, NothingMore, Step};
use crate::runtime::AdapterInstance;
use crate::slot::AdapterSlot;

/// The replies a host instance waits for, by correlation id.
pub(super) type Pending = Mutex<HashMap<String, oneshot::Sender<Packet>>>;

/// This host instance's reply inbox: one address, one listener, the requests waiting on it.
pub(super) struct ReplyInbox {
    listener: AdapterListener,
    pub(super) pending: Pending,
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
        let inbox = Arc::new_cyclic(|me: &Weak<ReplyInbox>| ReplyInbox {
            listener: AdapterListener::new(slot, &address, None, me.clone()),
            pending: Mutex::new(HashMap::new()),
            stopping: CancellationToken::new(),
            switch_tx,
        });
        let session = inbox.listener.listen().await?;
        tracing::debug!(%address, "reply inbox listening");
        tokio::spawn(inbox.clone().route(session, switches));
        Ok(inbox)
    }

    pub(super) fn address(&self) -> &str {
        &self.listener.address
    }

    /// Follow the inbox's adapter listener across switches and re-listens until stopped (each
    /// reply goes to its request where the instance reads it: see the [`Taker`] impl).
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
                // The taker delivers every reply while this runs (it holds the inbox), so
                // nothing is queued; handled alike should that change.
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

/// Every reply goes to the request waiting for it as the instance reads it.
impl Taker for ReplyInbox {
    fn take(
        self: Arc<Self>,
        batch: Vec<wit::Packet>,
        queue: &mut PollSender<Vec<wit::Packet>>,
    ) -> bool {
        batch.into_iter().for_each(|p| self.deliver(p.into()));
        queue_rest(queue, Vec::new())
    }
}

/// A request to move a listener to another adapter, answered once it listens there.
pub(super) type Switch = (AdapterInstance, oneshot::Sender<()>);

/// Removes a request's entry from the pending map however the request ends.
pub(super) struct PendingGuard<'a> {
    pub(super) pending: &'a Pending,
    pub(super) id: String,
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
    pub(super) listeners: Mutex<Vec<Weak<ListenerShared>>>,
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
    pub(super) async fn reply_inbox(&self) -> Result<&Arc<ReplyInbox>> {
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

impl Handover for Inboxes {
    fn swapped<'a>(&'a self, new: &'a AdapterInstance) -> Step<'a> {
        Box::pin(self.switch_all(new))
    }

    fn migrating<'a>(
        &'a self,
        _old: &'a AdapterInstance,
        new: &'a AdapterInstance,
    ) -> Step<'a, Box<dyn Migration + 'a>> {
        Box::pin(async move {
            self.switch_all(new).await;
            Box::new(NothingMore) as Box<dyn Migration>
        })
    }
}
