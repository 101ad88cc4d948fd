//! A running listener's machinery: the runner that hands queued packets to handlers, the
//! [`Taker`] that starts handlers where the instance reads packets while nothing is queued,
//! and the overlap filter that drops what both adapter listeners of a move got.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::{CancellationToken, PollSender};
use tokio_util::task::TaskTracker;

use super::adapter_listener::{AdapterListener, Session};
use super::inboxes::Switch;
use super::sink::{Taker, queue_rest};
use super::{Handler, Incoming};
use crate::bindings::direct as wit;

pub(super) struct ListenerShared {
    pub(super) listener: AdapterListener,
    pub(super) handler: Arc<Handler>,
    pub(super) stopping: CancellationToken,
    pub(super) handlers: TaskTracker,
    /// Bounds the handlers in flight to `concurrency`.
    pub(super) slots: Arc<Semaphore>,
    /// Asks the runner to listen on the slot's current adapter; answered once it does.
    pub(super) switch_tx: mpsc::Sender<Switch>,
    /// Whether the [`Taker`] starts handlers itself: only while the runner has nothing queued
    /// and filters nothing, so packets still start in arrival order and the overlap filter
    /// sees every packet of a move. Packets are queued under this lock.
    pub(super) in_place: Mutex<bool>,
}

/// While in place, each packet starts its handler where the instance reads it if a slot is
/// free; from the first that finds none, the rest of the batch and every later one go to the
/// runner's queue until the runner has caught up.
impl Taker for ListenerShared {
    fn take(
        self: Arc<Self>,
        batch: Vec<wit::Packet>,
        queue: &mut PollSender<Vec<wit::Packet>>,
    ) -> bool {
        let mut in_place = self.in_place.lock().unwrap_or_else(|e| e.into_inner());
        let mut taking = *in_place && !self.stopping.is_cancelled();
        let mut rest = Vec::new();
        for packet in batch {
            if taking {
                match self.slots.clone().try_acquire_owned() {
                    Ok(permit) => {
                        self.start(packet, permit);
                        continue;
                    }
                    Err(_) => {
                        taking = false;
                        *in_place = false;
                    }
                }
            }
            rest.push(packet);
        }
        queue_rest(queue, rest)
    }
}

impl ListenerShared {
    /// Hand queued packets to handlers until stopped; listen again when the stream ends
    /// without a stop.
    pub(super) async fn run(
        self: Arc<Self>,
        mut session: Session,
        mut switches: mpsc::Receiver<Switch>,
    ) {
        let mut overlap: Option<Overlap> = None;
        'run: loop {
            if overlap.as_ref().is_some_and(Overlap::over) {
                overlap = None;
            }
            self.resume_in_place(&session, overlap.is_some());
            let batch = tokio::select! {
                biased;
                _ = self.stopping.cancelled() => break,
                Some((to, moved)) = switches.recv() => {
                    self.pause_in_place();
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
                self.start(packet, permit);
            }
        }
        self.finish(Some(session)).await;
    }

    /// Let the taker start handlers again if nothing waits in `session`'s queue and the
    /// runner filters nothing (checked under the lock the taker queues under).
    fn resume_in_place(&self, session: &Session, filtering: bool) {
        let mut in_place = self.in_place.lock().unwrap_or_else(|e| e.into_inner());
        *in_place = !filtering && session.packets.is_empty() && !self.stopping.is_cancelled();
    }

    /// From now on every packet goes to the runner's queue.
    fn pause_in_place(&self) {
        *self.in_place.lock().unwrap_or_else(|e| e.into_inner()) = false;
    }

    /// Run the handler on `packet` in a task of its own, holding `permit` until it is done.
    fn start(self: &Arc<Self>, packet: wit::Packet, permit: OwnedSemaphorePermit) {
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

    /// Stop the adapter listener (the broker routes nothing more here), then wait for the
    /// handlers in flight (the taker starts none after this begins).
    async fn finish(&self, session: Option<Session>) {
        self.pause_in_place();
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

    /// Whether its window has passed.
    fn over(&self) -> bool {
        tokio::time::Instant::now() >= self.until
    }

    /// `batch` without the repeats of what `overlap` holds; `overlap` ends once it is used up
    /// or its window has passed.
    fn unrepeated(overlap: &mut Option<Self>, batch: Vec<wit::Packet>) -> Vec<wit::Packet> {
        let Some(watch) = overlap else {
            return batch;
        };
        if watch.over() {
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
