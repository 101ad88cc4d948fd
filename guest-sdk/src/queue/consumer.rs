//! One live consumer: its ledger, the pump that receives under the prefetch bound and writes
//! deliveries, the keep-alive task, and settlement.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::{Pin, pin};
use std::rc::Rc;

use futures::future::{Either, select};
use wit_bindgen::StreamWriter;

use super::{BACKOFF_MS, Broker, Copy, CopyTo, Delivery, Received, Settlement, tried};
use crate::signal::{Latch, Notify};
use crate::{Error, Tag, headers, host};

/// How long the pump pauses after a failed receive, in milliseconds.
const RECEIVE_PAUSE_MS: u32 = 100;

thread_local! {
    /// The next tag seq, unique across the consumers of this instance.
    static NEXT_SEQ: Cell<u64> = const { Cell::new(1) };
}

/// A boxed future of this single-threaded instance.
pub(super) type Boxed<T> = Pin<Box<dyn Future<Output = T>>>;

/// A consumer whatever its broker, as the registry holds it.
pub(super) trait Live {
    /// Settle a batch, one answer each, in order ([`super::settle`]).
    fn settle(self: Rc<Self>, batch: Vec<(Tag, Settlement)>) -> Boxed<Vec<Result<(), Error>>>;
    /// `queue.healthy`.
    fn healthy(&self) -> bool;
    /// Stop and resolve once what it held is handed back.
    fn stop(self: Rc<Self>) -> Boxed<()>;
}

/// The mutable part of a consumer.
struct Ledger<H> {
    /// Unsettled deliveries by tag seq. A delivery leaves when its settlement arrives: from
    /// then on it is acknowledged or handed back, never held again, so the pump may receive in
    /// its place while the settlement is on its way to the broker.
    unsettled: BTreeMap<u64, Received<H>>,
    /// False since a settlement failed, until one lands.
    settled_ok: bool,
    /// False since a receive failed, until one succeeds.
    receiving_ok: bool,
}

/// A live consumer on broker `B`.
pub(super) struct Consumer<B: Broker> {
    broker: B,
    prefetch: u32,
    generation: u32,
    ledger: RefCell<Ledger<B::Handle>>,
    /// Set by `stop`, a dropped delivery stream or a closed broker: take nothing more.
    stop: Latch,
    /// Set once the pump has ended and handed back what was unsettled.
    ended: Latch,
    /// Fires when a delivery leaves the ledger (its settlement arrived), making room under the
    /// prefetch.
    settled: Notify,
}

impl<B: Broker> Consumer<B> {
    /// A consumer that holds nothing yet.
    pub(super) fn new(broker: B, prefetch: u32, generation: u32) -> Self {
        Self {
            broker,
            prefetch,
            generation,
            ledger: RefCell::new(Ledger {
                unsettled: BTreeMap::new(),
                settled_ok: true,
                receiving_ok: true,
            }),
            stop: Latch::new(),
            ended: Latch::new(),
            settled: Notify::new(),
        }
    }

    /// How many more deliveries the prefetch allows.
    fn room(&self) -> u32 {
        let ledger = self.ledger.borrow();
        let held = ledger.unsettled.len();
        self.prefetch
            .saturating_sub(u32::try_from(held).unwrap_or(u32::MAX))
    }

    /// Record a received message as unsettled and make its delivery.
    fn hold(&self, r: Received<B::Handle>) -> Delivery {
        let seq = NEXT_SEQ.replace(NEXT_SEQ.get() + 1);
        let delivery = Delivery {
            tag: Tag {
                generation: self.generation,
                seq,
            },
            body: r.body.clone(),
            headers: r.headers.clone(),
            attempt: r.attempt,
        };
        self.ledger.borrow_mut().unsettled.insert(seq, r);
        delivery
    }

    /// Receive while there is room under the prefetch and write deliveries to `to`, until
    /// stopped, the host drops the stream or the broker closes; then hand back what is
    /// unsettled and close `to`.
    pub(super) async fn pump<D: From<Delivery> + 'static>(self: Rc<Self>, mut to: StreamWriter<D>) {
        while !self.stop.is_set() {
            let room = self.room();
            if room == 0 {
                let settled = pin!(self.settled.notified());
                select(settled, pin!(self.stop.wait())).await;
                continue;
            }
            // A receive is not cut short from here (the broker may stop it early on `stop`):
            // what it took is held, and handed back below when stopping.
            let received = self.broker.receive(room, &self.stop).await;
            let batch = match received {
                Ok(batch) => {
                    self.ledger.borrow_mut().receiving_ok = true;
                    batch
                }
                Err(e) => {
                    self.ledger.borrow_mut().receiving_ok = false;
                    crate::debug!("queue receive failed: {e:?}");
                    if matches!(e, Error::Closed(_)) {
                        break;
                    }
                    let pause = pin!(host::sleep(RECEIVE_PAUSE_MS));
                    select(pause, pin!(self.stop.wait())).await;
                    continue;
                }
            };
            if batch.is_empty() {
                continue;
            }
            let deliveries: Vec<D> = batch.into_iter().map(|r| D::from(self.hold(r))).collect();
            let write = pin!(to.write_all(deliveries));
            match select(write, pin!(self.stop.wait())).await {
                Either::Left((unsent, _)) if unsent.is_empty() => {}
                _ => break,
            }
        }
        drop(to);
        self.stop.set();
        let unsettled = std::mem::take(&mut self.ledger.borrow_mut().unsettled);
        if !unsettled.is_empty() {
            self.broker
                .hand_back_all(unsettled.into_values().collect())
                .await;
        }
        self.broker.finish().await;
        self.ended.set();
    }

    /// Extend every unsettled delivery every [`Broker::keep_alive_ms`], until stopped.
    pub(super) async fn keep_alive(self: Rc<Self>) {
        let period = self.broker.keep_alive_ms().max(1);
        loop {
            let tick = pin!(host::sleep(period));
            if let Either::Right(_) = select(tick, pin!(self.stop.wait())).await {
                return;
            }
            let handles: Vec<B::Handle> = {
                let ledger = self.ledger.borrow();
                ledger
                    .unsettled
                    .values()
                    .map(|h| h.handle.clone())
                    .collect()
            };
            if !handles.is_empty() {
                self.broker.extend(handles).await;
            }
        }
    }

    /// The broker calls of one settlement; a copy is confirmed before the original is acked.
    async fn apply(&self, held: &Received<B::Handle>, settlement: Settlement) -> Result<(), Error> {
        match settlement {
            Settlement::Ack => tried(|| self.broker.ack(held)).await,
            Settlement::Release => tried(|| self.broker.release(held)).await,
            Settlement::Retry(delay_ms) => {
                let copy = Copy {
                    to: CopyTo::Queue,
                    headers: &held.headers,
                    attempt: held.attempt + 1,
                    delay_ms,
                };
                self.broker.copy_then_ack(held, copy).await
            }
            Settlement::DeadLetter(reason) => {
                let mut dead = held.headers.clone();
                headers::set(
                    &mut dead,
                    headers::DEAD_REASON,
                    headers::dead_reason(&reason),
                );
                let copy = Copy {
                    to: CopyTo::DeadLetter,
                    headers: &dead,
                    attempt: held.attempt,
                    delay_ms: 0,
                };
                self.broker.copy_then_ack(held, copy).await
            }
        }
    }

    /// Take the delivery `tag` off the ledger: its settlement has arrived.
    fn take(&self, tag: Tag) -> Result<Received<B::Handle>, Error> {
        if tag.generation != self.generation {
            return Err(Error::stale(format!(
                "tag from generation {}, this instance is {}",
                tag.generation, self.generation
            )));
        }
        let mut ledger = self.ledger.borrow_mut();
        // The mutant keeps the delivery, so a second settlement of one tag applies too.
        #[cfg(not(feature = "mutant-second-settlement-wins"))]
        let held = ledger.unsettled.remove(&tag.seq);
        #[cfg(feature = "mutant-second-settlement-wins")]
        let held = ledger.unsettled.get(&tag.seq).cloned();
        held.ok_or_else(|| {
            Error::stale(format!(
                "delivery {} was already settled or handed back",
                tag.seq
            ))
        })
    }

    /// Make the broker calls of a settlement taken off the ledger; on failure hand the message
    /// back and answer `refused`.
    async fn apply_taken(
        &self,
        held: Received<B::Handle>,
        settlement: Settlement,
    ) -> Result<(), Error> {
        let answer = self.apply(&held, settlement).await;
        if answer.is_err() {
            self.broker.hand_back(&held).await;
        }
        self.ledger.borrow_mut().settled_ok = answer.is_ok();
        answer.map_err(|e| {
            let why = format!(
                "settlement failed after {} tries ({e:?}); message handed back",
                BACKOFF_MS.len() + 1
            );
            crate::warn!("{why}");
            Error::refused(why)
        })
    }

    /// Settle a batch: every delivery of it leaves the ledger first, in batch order (the
    /// settlements have reached the adapter, so they no longer count under the prefetch, and
    /// the pump receives in their place at once, not one at a time as broker calls end); a tag
    /// twice in the batch settles once and answers `stale` after. Then the broker calls: all
    /// together with [`Broker::CONCURRENT_SETTLES`] (acks gathered by [`crate::coalesce`]),
    /// else one after the other, in batch order.
    async fn settle_batch(&self, batch: Vec<(Tag, Settlement)>) -> Vec<Result<(), Error>> {
        let taken: Vec<_> = batch
            .into_iter()
            .map(|(tag, settlement)| self.take(tag).map(|held| (held, settlement)))
            .collect();
        self.settled.notify();
        let settle = |taken: Result<_, Error>| async move {
            let (held, settlement) = taken?;
            self.apply_taken(held, settlement).await
        };
        if B::CONCURRENT_SETTLES {
            let count = taken.len();
            let settling = futures::future::join_all(taken.into_iter().map(settle));
            return crate::coalesce::in_turn_of(count, settling).await;
        }
        let mut answers = Vec::with_capacity(taken.len());
        for one in taken {
            answers.push(settle(one).await);
        }
        answers
    }
}

impl<B: Broker> Live for Consumer<B> {
    fn settle(self: Rc<Self>, batch: Vec<(Tag, Settlement)>) -> Boxed<Vec<Result<(), Error>>> {
        Box::pin(async move { self.settle_batch(batch).await })
    }

    fn healthy(&self) -> bool {
        let ledger = self.ledger.borrow();
        ledger.settled_ok && ledger.receiving_ok
    }

    fn stop(self: Rc<Self>) -> Boxed<()> {
        self.stop.set();
        Box::pin(async move { self.ended.wait().await })
    }
}
