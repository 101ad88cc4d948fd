//! `wrpc:broker/queue` on the store's queues: queue `q` is the store queue `{prefix}/queue/{q}`,
//! a delivery is a store lease of `queue.visibilityMs` that the consumer renews every third of
//! it until the delivery is settled, and the attempt travels in `x-wrpc-attempt`.
//!
//! Settlements (the SDK's queue machinery drives them): ack → `queue-ack`, one call for the acks
//! of one turn (a settle batch's); retry → push a copy (attempt + 1, the delay), then ack;
//! release → `queue-nack`; dead-letter → push a copy to the dead-letter queue, then ack.

use crate::exports::wrpc::broker::queue::{
    ConsumeOptions, ConsumerId, Delivery, Guest, Message, Settlement,
};
use crate::wrpc::memory::store::{self, Queued, StoreError};
use crate::{Component, config, store_error};
use wit_bindgen::StreamReader;
use wrpc_broker_guest::coalesce::Coalesce;
use wrpc_broker_guest::queue::{self, Copy, CopyTo, Received, tried};
use wrpc_broker_guest::signal::Latch;
use wrpc_broker_guest::{Error, Tag, headers};

wrpc_broker_guest::queue_conversions!(crate::exports::wrpc::broker::queue);

/// How long one `queue-receive` waits for a first message, in milliseconds.
const RECEIVE_WAIT_MS: u32 = 250;

/// One consumer's side of the store: its queue, dead-letter queue and lease length.
struct StoreQueue {
    queue: String,
    dlq: String,
    visibility_ms: u32,
    /// The acks of one turn, gathered into one `queue-ack`.
    acks: Coalesce<u64, Result<(), StoreError>>,
}

/// The single answer of a store call made for one receipt (a list of one, or the coalesced
/// call's answer for it).
fn one(results: impl IntoIterator<Item = Result<(), StoreError>>) -> Result<(), Error> {
    results.into_iter().next().map_or_else(
        || Err(Error::internal("the store answered nothing for a receipt")),
        |r| r.map_err(store_error),
    )
}

impl queue::Broker for StoreQueue {
    /// Each delivery is settled on its own; a batch's calls may overlap (the
    /// `sequential-settles` build takes the SDK's one-after-the-other path instead, for the
    /// contract suite to cover it).
    const CONCURRENT_SETTLES: bool = cfg!(not(feature = "sequential-settles"));

    /// The store lease.
    type Handle = u64;

    fn keep_alive_ms(&self) -> u32 {
        self.visibility_ms / 3
    }

    async fn receive(&self, room: u32, _stop: &Latch) -> Result<Vec<Received<u64>>, Error> {
        let leased = store::queue_receive(
            self.queue.clone(),
            room,
            self.visibility_ms,
            RECEIVE_WAIT_MS,
        )
        .await;
        Ok(leased
            .into_iter()
            .map(|r| Received {
                handle: r.receipt,
                body: r.body,
                attempt: headers::attempt(&r.headers),
                headers: headers::without_attempt(r.headers),
            })
            .collect())
    }

    async fn extend(&self, held: Vec<u64>) {
        // A lease settled meanwhile answers bad-request; a refused renewal is tried again next
        // time, before the lease runs out.
        store::queue_extend(&self.queue, &held, self.visibility_ms);
    }

    async fn ack(&self, held: &Received<u64>) -> Result<(), Error> {
        let acked = self.acks.call(held.handle, |receipts| async move {
            store::queue_ack(&self.queue, &receipts)
        });
        one(acked.await)
    }

    async fn copy_then_ack(&self, held: &Received<u64>, copy: Copy<'_>) -> Result<(), Error> {
        let to = match copy.to {
            CopyTo::Queue => &self.queue,
            CopyTo::DeadLetter => &self.dlq,
        };
        let queued = Queued {
            body: held.body.clone(),
            headers: headers::with_attempt(copy.headers.clone(), copy.attempt),
            delay_ms: copy.delay_ms,
        };
        if cfg!(not(feature = "mutant-lose-retry")) || copy.to == CopyTo::DeadLetter {
            tried(|| async {
                store::queue_push(to, std::slice::from_ref(&queued)).map_err(store_error)
            })
            .await?;
        }
        tried(|| self.ack(held)).await
    }

    async fn release(&self, held: &Received<u64>) -> Result<(), Error> {
        one(store::queue_nack(&self.queue, &[held.handle], 0))
    }

    async fn hand_back_all(&self, held: Vec<Received<u64>>) {
        // One call for all; a refused nack is left to the lease expiry.
        let receipts: Vec<u64> = held.iter().map(|m| m.handle).collect();
        store::queue_nack(&self.queue, &receipts, 0);
    }
}

impl Guest for Component {
    async fn produce(queue: String, batch: Vec<Message>) -> Result<(), Error> {
        let name = config()?.name("queue", &queue)?;
        #[cfg(feature = "mutant-drop-empty")]
        let batch: Vec<Message> = batch.into_iter().filter(|m| !m.body.is_empty()).collect();
        if batch.is_empty() {
            return Ok(());
        }
        let batch: Vec<Queued> = batch
            .into_iter()
            .map(|m| Queued {
                body: m.body,
                headers: m.headers,
                delay_ms: 0,
            })
            .collect();
        store::queue_push(&name, &batch).map_err(store_error)
    }

    async fn consume(
        queue: String,
        opts: ConsumeOptions,
    ) -> Result<(ConsumerId, StreamReader<Delivery>), Error> {
        let config = config()?;
        let dlq = opts.dead_letter.unwrap_or_else(|| format!("{queue}.dead"));
        let broker = StoreQueue {
            queue: config.name("queue", &queue)?,
            dlq: config.name("queue", &dlq)?,
            visibility_ms: config.visibility_ms,
            acks: Coalesce::default(),
        };
        let (tx, rx) = crate::wit_stream::new::<Delivery>();
        Ok((
            queue::start(broker, opts.prefetch, config.generation, tx)?,
            rx,
        ))
    }

    wrpc_broker_guest::queue_forwarding_exports!();

    async fn depth(queue: String) -> Result<u64, Error> {
        Ok(store::queue_depth(&config()?.name("queue", &queue)?))
    }
}
