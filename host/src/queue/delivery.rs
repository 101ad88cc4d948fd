//! A [`Delivery`] and its settlement: the first settlement wins, and settlements reach the
//! adapter in batches, per session.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::consumer::{ConsumerShared, Session};
use super::{MAX_SETTLE_BATCH, Settled};
use crate::bindings::{queue as wit, types};
use crate::error::Result;
use crate::log::Headers;

pub(super) struct SettleRequest {
    pub(super) session: Arc<Session>,
    pub(super) tag: types::Tag,
    pub(super) settlement: wit::Settlement,
    pub(super) reply: oneshot::Sender<Result<()>>,
}

/// Batches settlements into `settle` calls, per session, in order.
pub(super) async fn run_settler(mut rx: mpsc::Receiver<SettleRequest>) {
    // Grown by the batches it meets, not reserved: a batch's worth (≈ 23 KiB) in every idle
    // consumer was most of what one held on the heap.
    let mut waiting = Vec::new();
    while rx.recv_many(&mut waiting, MAX_SETTLE_BATCH).await > 0 {
        let mut by_session: Vec<(Arc<Session>, Vec<SettleRequest>)> = Vec::new();
        for request in waiting.drain(..) {
            match by_session
                .iter_mut()
                .find(|(s, _)| Arc::ptr_eq(s, &request.session))
            {
                Some((_, requests)) => requests.push(request),
                None => by_session.push((request.session.clone(), vec![request])),
            }
        }
        for (session, requests) in by_session {
            let (batch, replies): (Vec<_>, Vec<_>) = requests
                .into_iter()
                .map(|r| ((r.tag, r.settlement), r.reply))
                .unzip();
            let results = session.instance.queue_settle(session.id, batch).await;
            crate::batch::hand_out(replies, results, "settlements");
        }
    }
}

/// Which settlement won, shared by the clones of one delivery.
#[derive(Default)]
pub(super) struct DeliveryState {
    pub(super) first: Mutex<Option<&'static str>>,
}

/// One delivery of a message to a consumer. Settle it once: the first of [`Delivery::ack`],
/// [`Delivery::retry`], [`Delivery::release`], [`Delivery::dead_letter`] wins; later ones do
/// nothing and answer [`Settled::AlreadySettled`].
#[derive(Clone)]
pub struct Delivery {
    /// The message body.
    pub body: Vec<u8>,
    /// The message headers.
    pub headers: Headers,
    /// 1 on the first delivery; + 1 per retry and per failed handler.
    pub attempt: u32,
    settler: Settler,
}

/// What settles a delivery, without its message: the consumer keeps one to settle after the
/// handler (the handler owns the [`Delivery`], so its body is never copied).
#[derive(Clone)]
pub(super) struct Settler {
    consumer: Arc<ConsumerShared>,
    session: Arc<Session>,
    tag: types::Tag,
    state: Arc<DeliveryState>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("queue", &self.settler.consumer.queue)
            .field("attempt", &self.attempt)
            .field("generation", &self.settler.tag.generation)
            .field("seq", &self.settler.tag.seq)
            .field("bytes", &self.body.len())
            .finish()
    }
}

impl Delivery {
    pub(super) fn new(
        consumer: Arc<ConsumerShared>,
        session: Arc<Session>,
        d: wit::Delivery,
    ) -> Self {
        Self {
            body: d.body,
            headers: d.headers,
            attempt: d.attempt,
            settler: Settler {
                consumer,
                session,
                tag: d.tag,
                state: Arc::default(),
            },
        }
    }

    /// What settles it, for the consumer to keep while the handler has it.
    pub(super) fn settler(&self) -> Settler {
        self.settler.clone()
    }

    /// The queue it came from.
    pub fn queue(&self) -> &str {
        &self.settler.consumer.queue
    }

    /// Done with the message.
    pub async fn ack(&self) -> Result<Settled> {
        self.settler.ack().await
    }

    /// Redeliver it after `delay`, attempt + 1.
    pub async fn retry(&self, delay: Duration) -> Result<Settled> {
        self.settler.retry(delay).await
    }

    /// Put it back on the queue now, attempt unchanged (hand work over).
    pub async fn release(&self) -> Result<Settled> {
        self.settler
            .settle("release", wit::Settlement::Release)
            .await
    }

    /// Move it to the dead-letter queue with `reason` (kept to one line of 512 characters).
    pub async fn dead_letter(&self, reason: &str) -> Result<Settled> {
        self.settler
            .settle(
                "dead-letter",
                wit::Settlement::DeadLetter(reason.to_string()),
            )
            .await
    }
}

impl Settler {
    /// Whether a settlement of the delivery already won.
    pub(super) fn settled(&self) -> bool {
        self.state
            .first
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    async fn settle(&self, kind: &'static str, settlement: wit::Settlement) -> Result<Settled> {
        {
            let mut first = self.state.first.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(first) = *first {
                tracing::debug!(queue = %self.consumer.queue, first, ignored = kind, "delivery already settled");
                return Ok(Settled::AlreadySettled { first });
            }
            *first = Some(kind);
        }
        self.consumer
            .settle(&self.session, self.tag, settlement)
            .await?;
        Ok(Settled::Applied)
    }

    /// [`Delivery::ack`].
    pub(super) async fn ack(&self) -> Result<Settled> {
        self.settle("ack", wit::Settlement::Ack).await
    }

    /// [`Delivery::retry`].
    pub(super) async fn retry(&self, delay: Duration) -> Result<Settled> {
        let ms = u32::try_from(delay.as_millis()).unwrap_or(u32::MAX);
        self.settle("retry", wit::Settlement::Retry(ms)).await
    }
}
