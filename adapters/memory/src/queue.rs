//! `wrpc:broker/queue` on the store's queues: queue `q` is the store queue `{prefix}/queue/{q}`,
//! a delivery is a store lease of `queue.visibilityMs` that the consumer renews every third of
//! it until the delivery is settled, and the attempt travels in `x-wrpc-attempt`.
//!
//! Settlements: ack → `queue-ack`; retry → push a copy (attempt + 1, the delay), then ack;
//! release → `queue-nack`; dead-letter → push a copy to the dead-letter queue, then ack. A store
//! call answering `refused` is tried again after 10, 20 and 40 ms; if it still fails, the
//! message is handed back (`queue-nack`) and the settlement answers `refused`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::pin::pin;
use std::rc::Rc;

use crate::exports::wrpc::broker::queue::{
    ConsumeOptions, ConsumerId, Delivery, Guest, Message, Settlement,
};
use crate::wrpc::memory::store::{self, Queued, Received, StoreError};
use crate::{Component, config, store_error};
use futures::future::{Either, select};
use wit_bindgen::{StreamReader, StreamWriter};
use wrpc_broker_guest::signal::{Latch, Notify};
use wrpc_broker_guest::{Error, Headers, Tag, headers, host};

/// How long one `queue-receive` waits for a first message, in milliseconds.
const RECEIVE_WAIT_MS: u32 = 250;
/// The pauses before each new try of a refused store call, in milliseconds.
const REFUSED_BACKOFF_MS: [u32; 3] = [10, 20, 40];

/// A delivery the consumer holds and nobody has settled yet.
#[derive(Clone)]
struct Held {
    /// The store lease.
    receipt: u64,
    /// The body, kept for a retry or dead-letter copy.
    body: Vec<u8>,
    /// The stored headers, `x-wrpc-attempt` included.
    headers: Headers,
}

/// The mutable part of a consumer.
struct Ledger {
    /// Unsettled deliveries by tag seq.
    unsettled: BTreeMap<u64, Held>,
    /// Deliveries a `settle` has taken out of `unsettled` and not finished with; they still
    /// count against the prefetch.
    settling: usize,
    /// False since a settlement was refused, until one lands.
    healthy: bool,
}

/// A live consumer, shared by its pump and keep-alive tasks, `settle` and `stop`.
struct Consumer {
    /// The store queue.
    queue: String,
    /// The store queue dead letters go to.
    dlq: String,
    /// The most unsettled deliveries at once.
    prefetch: u32,
    /// The lease taken on each delivery, in milliseconds.
    visibility_ms: u32,
    /// The instance generation its tags carry.
    generation: u32,
    /// What it holds now.
    ledger: RefCell<Ledger>,
    /// Set by `stop` (or when the host drops the delivery stream): take nothing more.
    stop: Latch,
    /// Set when the pump has ended, its unsettled deliveries handed back and its stream closed.
    ended: Latch,
    /// Fires when a delivery leaves the ledger, making room under the prefetch.
    settled: Notify,
}

thread_local! {
    /// Live consumers by id.
    static CONSUMERS: RefCell<BTreeMap<ConsumerId, Rc<Consumer>>> = const { RefCell::new(BTreeMap::new()) };
    /// The next consumer id.
    static NEXT_ID: Cell<ConsumerId> = const { Cell::new(1) };
    /// The next tag seq, unique across the consumers of this instance.
    static NEXT_SEQ: Cell<u64> = const { Cell::new(1) };
}

/// The live consumer `id`.
fn consumer(id: ConsumerId) -> Option<Rc<Consumer>> {
    CONSUMERS.with_borrow(|m| m.get(&id).cloned())
}

/// The single answer of a store call made for one receipt.
fn one(results: Vec<Result<(), StoreError>>) -> Result<(), StoreError> {
    results.into_iter().next().unwrap_or_else(|| {
        Err(StoreError::BadRequest(
            "the store answered nothing for a receipt".to_string(),
        ))
    })
}

/// Make a store call; while it answers `refused`, try again after each pause of
/// [`REFUSED_BACKOFF_MS`].
async fn retried(mut call: impl FnMut() -> Result<(), StoreError>) -> Result<(), StoreError> {
    for pause in REFUSED_BACKOFF_MS {
        match call() {
            Err(StoreError::Refused(_)) => host::sleep(pause).await,
            answer => return answer,
        }
    }
    call()
}

/// Stop every live consumer (`close`).
pub(crate) async fn stop_all() {
    let ids: Vec<ConsumerId> = CONSUMERS.with_borrow(|m| m.keys().copied().collect());
    for id in ids {
        <Component as Guest>::stop(id).await;
    }
}

impl Consumer {
    /// How many more deliveries the prefetch allows.
    fn room(&self) -> u32 {
        let ledger = self.ledger.borrow();
        let held = ledger.unsettled.len() + ledger.settling;
        self.prefetch
            .saturating_sub(u32::try_from(held).unwrap_or(u32::MAX))
    }

    /// Record a leased message as unsettled and make its delivery.
    fn hold(&self, r: Received) -> Delivery {
        let seq = NEXT_SEQ.replace(NEXT_SEQ.get() + 1);
        let delivery = Delivery {
            tag: Tag {
                generation: self.generation,
                seq,
            },
            body: r.body.clone(),
            headers: headers::without_attempt(r.headers.clone()),
            attempt: headers::attempt(&r.headers),
        };
        let held = Held {
            receipt: r.receipt,
            body: r.body,
            headers: r.headers,
        };
        self.ledger.borrow_mut().unsettled.insert(seq, held);
        delivery
    }

    /// Lease messages while there is room under the prefetch and write them to `to`, until
    /// stopped or the host drops the stream; then hand back what is unsettled and close `to`.
    async fn pump(self: Rc<Self>, mut to: StreamWriter<Delivery>) {
        while !self.stop.is_set() {
            let room = self.room();
            if room == 0 {
                let settled = pin!(self.settled.notified());
                select(settled, pin!(self.stop.wait())).await;
                continue;
            }
            // Biased to the receive: a lease taken as the stop arrives is still recorded (and
            // handed back below).
            let receive = pin!(store::queue_receive(
                self.queue.clone(),
                room,
                self.visibility_ms,
                RECEIVE_WAIT_MS,
            ));
            let Either::Left((received, _)) = select(receive, pin!(self.stop.wait())).await else {
                break;
            };
            if received.is_empty() {
                continue;
            }
            let batch: Vec<Delivery> = received.into_iter().map(|r| self.hold(r)).collect();
            let write = pin!(to.write_all(batch));
            match select(write, pin!(self.stop.wait())).await {
                Either::Left((unsent, _)) if unsent.is_empty() => {}
                _ => break,
            }
        }
        drop(to);
        self.stop.set();
        self.hand_back_all();
        self.ended.set();
    }

    /// Renew the lease of every unsettled delivery every third of the visibility, until stopped.
    async fn keep_alive(self: Rc<Self>) {
        let period = (self.visibility_ms / 3).max(1);
        loop {
            let tick = pin!(host::sleep(period));
            if let Either::Right(_) = select(tick, pin!(self.stop.wait())).await {
                return;
            }
            let receipts: Vec<u64> = {
                let ledger = self.ledger.borrow();
                ledger.unsettled.values().map(|h| h.receipt).collect()
            };
            if !receipts.is_empty() {
                // A lease settled meanwhile answers bad-request; a refused renewal is tried
                // again next tick, before the lease runs out.
                store::queue_extend(&self.queue, &receipts, self.visibility_ms);
            }
        }
    }

    /// Put every unsettled delivery back on the queue, deliverable at once. A refused nack is
    /// left to the lease expiry.
    fn hand_back_all(&self) {
        let unsettled = std::mem::take(&mut self.ledger.borrow_mut().unsettled);
        let receipts: Vec<u64> = unsettled.into_values().map(|h| h.receipt).collect();
        if !receipts.is_empty() {
            store::queue_nack(&self.queue, &receipts, 0);
        }
    }

    /// Push one message to the store queue `queue`, retrying while refused.
    async fn push(&self, queue: &str, message: Queued) -> Result<(), StoreError> {
        retried(|| store::queue_push(queue, std::slice::from_ref(&message))).await
    }

    /// The store calls of one settlement; a copy is confirmed before the original is acked.
    async fn apply(&self, held: Held, settlement: Settlement) -> Result<(), StoreError> {
        let receipt = held.receipt;
        let attempt = headers::attempt(&held.headers);
        match settlement {
            Settlement::Ack => {}
            Settlement::Retry(delay_ms) => {
                let copy = Queued {
                    body: held.body,
                    headers: headers::with_attempt(held.headers, attempt + 1),
                    delay_ms,
                };
                if cfg!(not(feature = "mutant-lose-retry")) {
                    self.push(&self.queue, copy).await?;
                }
            }
            Settlement::Release => {
                return retried(|| one(store::queue_nack(&self.queue, &[receipt], 0))).await;
            }
            Settlement::DeadLetter(reason) => {
                let copy = Queued {
                    body: held.body,
                    headers: headers::dead_letter(held.headers, &reason, attempt),
                    delay_ms: 0,
                };
                self.push(&self.dlq, copy).await?;
            }
        }
        retried(|| one(store::queue_ack(&self.queue, &[receipt]))).await
    }

    /// Settle the delivery `tag`; on failure hand the message back.
    async fn settle(&self, tag: Tag, settlement: Settlement) -> Result<(), Error> {
        if tag.generation != self.generation {
            return Err(Error::stale(format!(
                "tag from generation {}, this instance is {}",
                tag.generation, self.generation
            )));
        }
        let held = {
            let mut ledger = self.ledger.borrow_mut();
            // The mutant keeps the delivery, so a second settlement of one tag applies too.
            #[cfg(not(feature = "mutant-second-settlement-wins"))]
            let held = ledger.unsettled.remove(&tag.seq);
            #[cfg(feature = "mutant-second-settlement-wins")]
            let held = ledger.unsettled.get(&tag.seq).cloned();
            let held = held.ok_or_else(|| {
                Error::stale(format!(
                    "delivery {} was already settled or handed back",
                    tag.seq
                ))
            })?;
            ledger.settling += 1;
            held
        };
        let receipt = held.receipt;
        let answer = self.apply(held, settlement).await;
        if answer.is_err() {
            store::queue_nack(&self.queue, &[receipt], 0);
        }
        {
            let mut ledger = self.ledger.borrow_mut();
            ledger.settling -= 1;
            match &answer {
                Ok(()) => ledger.healthy = true,
                Err(StoreError::Refused(_)) => ledger.healthy = false,
                Err(_) => {}
            }
        }
        self.settled.notify();
        answer.map_err(|e| {
            if let StoreError::Refused(m) = &e {
                wrpc_broker_guest::warn!(
                    "settle refused on {} after {} tries ({m}); message handed back",
                    self.queue,
                    REFUSED_BACKOFF_MS.len() + 1
                );
            }
            store_error(e)
        })
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
        if opts.prefetch == 0 {
            return Err(Error::bad_request("prefetch must be at least 1"));
        }
        let dlq = opts.dead_letter.unwrap_or_else(|| format!("{queue}.dead"));
        let consumer = Rc::new(Consumer {
            queue: config.name("queue", &queue)?,
            dlq: config.name("queue", &dlq)?,
            prefetch: opts.prefetch,
            visibility_ms: config.visibility_ms,
            generation: config.generation,
            ledger: RefCell::new(Ledger {
                unsettled: BTreeMap::new(),
                settling: 0,
                healthy: true,
            }),
            stop: Latch::new(),
            ended: Latch::new(),
            settled: Notify::new(),
        });
        let id = NEXT_ID.replace(NEXT_ID.get() + 1);
        CONSUMERS.with_borrow_mut(|m| m.insert(id, consumer.clone()));
        let (tx, rx) = crate::wit_stream::new::<Delivery>();
        wit_bindgen::spawn_local(consumer.clone().pump(tx));
        wit_bindgen::spawn_local(consumer.keep_alive());
        Ok((id, rx))
    }

    async fn settle(
        consumer_id: ConsumerId,
        batch: Vec<(Tag, Settlement)>,
    ) -> Vec<Result<(), Error>> {
        let Some(c) = consumer(consumer_id) else {
            let closed = || Error::closed(format!("consumer {consumer_id} is not live"));
            return batch.iter().map(|_| Err(closed())).collect();
        };
        let mut answers = Vec::with_capacity(batch.len());
        for (tag, settlement) in batch {
            answers.push(c.settle(tag, settlement).await);
        }
        answers
    }

    fn healthy(consumer_id: ConsumerId) -> Option<bool> {
        consumer(consumer_id).map(|c| c.ledger.borrow().healthy)
    }

    async fn stop(consumer_id: ConsumerId) {
        let Some(c) = consumer(consumer_id) else {
            return;
        };
        c.stop.set();
        c.ended.wait().await;
        CONSUMERS.with_borrow_mut(|m| m.remove(&consumer_id));
    }

    async fn depth(queue: String) -> Result<u64, Error> {
        Ok(store::queue_depth(&config()?.name("queue", &queue)?))
    }
}
