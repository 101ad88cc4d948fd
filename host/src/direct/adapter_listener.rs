//! Adapter listeners that survive a trap: one `listen` of the adapter ([`Session`]), kept
//! listening across instance replacements and switched to another adapter in a swap.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, PollSender};

use super::sink::{PacketSink, Taker};
use super::{MAX_RELISTEN_PAUSE, RELISTEN_PAUSE};
use crate::bindings::direct as wit;
use crate::error::{Error, Result};
use crate::runtime::AdapterInstance;
use crate::runtime::streams::CHANNEL_BATCHES;
use crate::slot::AdapterSlot;

/// How long a moved listener waits for the old adapter's last packets.
const DRAIN_WAIT: Duration = Duration::from_millis(500);

/// One `listen` of the adapter: the instance and generation it runs on, its id and its packets.
pub(super) struct Session {
    instance: AdapterInstance,
    generation: u32,
    id: wit::ListenerId,
    pub(super) packets: mpsc::Receiver<Vec<wit::Packet>>,
}

/// An adapter listener on one address, kept listening across instance replacements.
pub(super) struct AdapterListener {
    pub(super) slot: Arc<AdapterSlot>,
    pub(super) address: String,
    pub(super) group: Option<String>,
    /// The live adapter listener: (generation, id); `None` while re-listening or once ended.
    current: Mutex<Option<(u32, wit::ListenerId)>>,
    /// Offered every packet where the instance reads it, before the session's queue.
    taker: Weak<dyn Taker>,
}

impl AdapterListener {
    pub(super) fn new(
        slot: Arc<AdapterSlot>,
        address: &str,
        group: Option<String>,
        taker: Weak<dyn Taker>,
    ) -> Self {
        Self {
            slot,
            address: address.to_string(),
            group,
            current: Mutex::new(None),
            taker,
        }
    }

    pub(super) fn set_current(&self, current: Option<(u32, wit::ListenerId)>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = current;
    }

    /// Listen on the adapter now; returns once the broker routes packets to it.
    pub(super) async fn listen(&self) -> Result<Session> {
        let (instance, generation, id, packets) = self
            .slot
            .retry_trapped(|adapter| {
                let (address, group) = (self.address.clone(), self.group.clone());
                let taker = self.taker.clone();
                async move {
                    let (id, packets) = listen_with(&adapter, address, group, taker).await?;
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
    pub(super) async fn relisten(
        &self,
        ended: Session,
        stopping: &CancellationToken,
    ) -> Option<Session> {
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
        let (address, group) = (self.address.clone(), self.group.clone());
        let (id, packets) = listen_with(&adapter, address, group, self.taker.clone()).await?;
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
    pub(super) async fn switch(
        &self,
        session: Session,
        to: AdapterInstance,
    ) -> (Session, Vec<wit::Packet>) {
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
    pub(super) async fn stop(&self, session: Session) {
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
    pub(super) async fn healthy(&self) -> bool {
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

/// `direct.listen` on `adapter`, its packets offered to `taker` first: the listener id and the
/// session's queue of what the taker left.
async fn listen_with(
    adapter: &AdapterInstance,
    address: String,
    group: Option<String>,
    taker: Weak<dyn Taker>,
) -> Result<(wit::ListenerId, mpsc::Receiver<Vec<wit::Packet>>)> {
    let (tx, packets) = mpsc::channel(CHANNEL_BATCHES);
    let sink = PacketSink::new(PollSender::new(tx), taker);
    let id = adapter.direct_listen_into(address, group, sink).await?;
    Ok((id, packets))
}
