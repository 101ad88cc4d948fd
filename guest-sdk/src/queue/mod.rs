//! The queue machinery every adapter shares, so `wrpc:broker/queue` behaves the same on every
//! broker: delivery tags and their generation check, the ledger of held deliveries under the
//! prefetch bound, keep-alive of what is held, settlement (tried again after 10, 20 and 40 ms,
//! then handed back, never moved past), `healthy`, `stop` and `close`.
//!
//! An adapter supplies only what its broker does, as a [`Broker`]: receive, extend, ack, copy
//! then ack, release (and, where it differs, hand back). Its `consume` export makes one and
//! calls [`start`]; `settle`, `healthy` and `stop` forward to [`settle`], [`healthy`] and
//! [`stop`]; `close` calls [`stop_all`]:
//!
//! ```text
//! async fn consume(queue: String, opts: ConsumeOptions) -> Result<(ConsumerId, StreamReader<Delivery>), Error> {
//!     let broker = MyQueue::open(&queue, &opts).await?;           // the adapter's Broker
//!     let (tx, rx) = crate::wit_stream::new::<Delivery>();
//!     Ok((queue::start(broker, opts.prefetch, generation, tx)?, rx))
//! }
//! wrpc_broker_guest::queue_forwarding_exports!();   // settle, healthy, stop
//! ```
//!
//! The adapter's generated `Delivery` and `Settlement` convert from and to this module's with
//! [`queue_conversions!`](crate::queue_conversions).

mod consumer;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::rc::Rc;

use wit_bindgen::StreamWriter;

use crate::signal::Latch;
use crate::{Error, Headers, Tag, host};
use consumer::{Consumer, Live};

/// The pauses before each new try of a failed broker call of a settlement, in milliseconds.
pub const BACKOFF_MS: [u32; 3] = [10, 20, 40];

/// One message the broker handed to a consumer; the consumer keeps it until it is settled.
#[derive(Clone)]
pub struct Received<H> {
    /// What the adapter needs to settle it later: a lease receipt, an entry id, an ack subject.
    pub handle: H,
    /// The body.
    pub body: Vec<u8>,
    /// The message's headers, without the adapter's own `x-wrpc-attempt`.
    pub headers: Headers,
    /// Its attempt: 1 on the first delivery.
    pub attempt: u32,
}

/// Where a settlement's copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyTo {
    /// The consumer's own queue (a retry).
    Queue,
    /// The consumer's dead-letter queue.
    DeadLetter,
}

/// The copy a retry or dead-letter puts on the broker before the original is acknowledged; its
/// body is the original's.
pub struct Copy<'a> {
    /// Where it goes.
    pub to: CopyTo,
    /// Its headers, without `x-wrpc-attempt` (a dead letter's carry `x-wrpc-dead-reason`).
    pub headers: &'a Headers,
    /// Its attempt: the original's + 1 for a retry, the original's for a dead letter.
    pub attempt: u32,
    /// Milliseconds before it may be delivered (0 for a dead letter).
    pub delay_ms: u32,
}

/// How a delivery is settled (`wrpc:broker/queue.settlement`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// Done.
    Ack,
    /// Redelivered after this many milliseconds, attempt + 1.
    Retry(u32),
    /// Back to the queue now, attempt unchanged.
    Release,
    /// To the dead-letter queue, with this reason.
    DeadLetter(String),
}

/// One delivery, as the adapter's generated `delivery` record wants it.
pub struct Delivery {
    /// Its tag: the instance generation and a sequence number unique in the instance.
    pub tag: Tag,
    /// The body.
    pub body: Vec<u8>,
    /// The headers, without `x-wrpc-attempt`.
    pub headers: Headers,
    /// 1 on the first delivery.
    pub attempt: u32,
}

/// What a broker does for one queue consumer; the rest is this module's.
///
/// Every method is one try: [`settle`] tries `ack` and `release` again after each pause of
/// [`BACKOFF_MS`]; `copy_then_ack` tries its own steps with [`tried`], since only the adapter
/// knows which of them are safe to repeat (a copy is not).
#[allow(async_fn_in_trait)] // A component instance is single-threaded: no `Send` to promise.
pub trait Broker: 'static {
    /// What the adapter keeps to settle one delivery.
    type Handle: Clone + 'static;

    /// Whether the settlements of one `settle` batch may run at once (their broker calls
    /// pipelined: one round trip for the batch). Off by default: settlements run one after the
    /// other, in batch order, for a broker whose bookkeeping needs that. Either way the batch's
    /// deliveries leave the ledger before the first broker call.
    const CONCURRENT_SETTLES: bool = false;

    /// How often [`Broker::extend`] is called for what the consumer holds, in milliseconds.
    fn keep_alive_ms(&self) -> u32;

    /// Up to `room` messages (never more), waiting a bounded time (about 250 ms) for the first.
    /// May return early, with what it has, once `stop` is set. An error marks the consumer
    /// unhealthy until a receive succeeds; [`Error::Closed`] ends the consumer.
    async fn receive(&self, room: u32, stop: &Latch) -> Result<Vec<Received<Self::Handle>>, Error>;

    /// Keep these held deliveries from being redelivered to anyone else.
    async fn extend(&self, held: Vec<Self::Handle>);

    /// Acknowledge: the message is done and leaves the queue.
    async fn ack(&self, held: &Received<Self::Handle>) -> Result<(), Error>;

    /// Put `copy` on the broker and, once the broker has confirmed it, acknowledge the original
    /// (retry, dead-letter). A failure leaves the original unacknowledged.
    async fn copy_then_ack(
        &self,
        held: &Received<Self::Handle>,
        copy: Copy<'_>,
    ) -> Result<(), Error>;

    /// Back to the queue now, attempt unchanged.
    async fn release(&self, held: &Received<Self::Handle>) -> Result<(), Error>;

    /// Make a delivery whose settlement failed deliverable again without the call that failed
    /// (best effort: if even this fails, the broker's redelivery window brings it back). The
    /// default is one [`Broker::release`].
    async fn hand_back(&self, held: &Received<Self::Handle>) {
        let _ = self.release(held).await;
    }

    /// At stop: put every unsettled delivery back. The default releases each, handing back
    /// the ones that cannot be released.
    async fn hand_back_all(&self, held: Vec<Received<Self::Handle>>) {
        for message in held {
            if self.release(&message).await.is_err() {
                self.hand_back(&message).await;
            }
        }
    }

    /// Called once after the consumer stopped and handed back what it held.
    async fn finish(&self) {}
}

/// Make a call; while it fails (but for a bad request, a stale handle or a closed consumer),
/// try again after each pause of [`BACKOFF_MS`].
pub async fn tried<F, Fut>(mut call: F) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    for pause in BACKOFF_MS {
        let answer = call().await;
        match answer {
            Err(Error::BadRequest(_) | Error::Stale(_) | Error::Closed(_)) | Ok(()) => {
                return answer;
            }
            Err(_) => host::sleep(pause).await,
        }
    }
    call().await
}

thread_local! {
    /// Live consumers by id.
    static CONSUMERS: RefCell<BTreeMap<u64, Rc<dyn Live>>> = const { RefCell::new(BTreeMap::new()) };
    /// The next consumer id.
    static NEXT_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(1) };
}

/// Start a consumer of at most `prefetch` unsettled deliveries on `broker`, writing its
/// deliveries to `to`; returns its id. Tags carry `generation`.
pub fn start<B: Broker, D: From<Delivery> + 'static>(
    broker: B,
    prefetch: u32,
    generation: u32,
    to: StreamWriter<D>,
) -> Result<u64, Error> {
    if prefetch == 0 {
        return Err(Error::bad_request("prefetch must be at least 1"));
    }
    let consumer = Rc::new(Consumer::new(broker, prefetch, generation));
    let id = NEXT_ID.replace(NEXT_ID.get() + 1);
    CONSUMERS.with_borrow_mut(|m| m.insert(id, consumer.clone()));
    wit_bindgen::spawn_local(consumer.clone().pump(to));
    wit_bindgen::spawn_local(consumer.keep_alive());
    Ok(id)
}

/// The live consumer `id`.
fn live(id: u64) -> Option<Rc<dyn Live>> {
    CONSUMERS.with_borrow(|m| m.get(&id).cloned())
}

/// Settle a batch on consumer `id`, one answer each, in order (`queue.settle`). Every delivery
/// of the batch leaves the ledger first, in batch order, so a tag twice in one batch settles
/// once and answers `stale` after, and the prefetch has room for the whole batch at once. With
/// [`Broker::CONCURRENT_SETTLES`] the batch's settlements then go to the broker together (one
/// round trip for the batch where the connection pipelines); otherwise one after the other.
pub async fn settle<S: Into<Settlement>>(id: u64, batch: Vec<(Tag, S)>) -> Vec<Result<(), Error>> {
    let Some(consumer) = live(id) else {
        let closed = || Error::closed(format!("consumer {id} is not live"));
        return batch.iter().map(|_| Err(closed())).collect();
    };
    let batch = batch.into_iter().map(|(tag, s)| (tag, s.into())).collect();
    consumer.settle(batch).await
}

/// Whether consumer `id` is healthy; none when it is not live (`queue.healthy`).
pub fn healthy(id: u64) -> Option<bool> {
    live(id).map(|c| c.healthy())
}

/// Stop consumer `id` and wait until it has handed back what it held (`queue.stop`).
pub async fn stop(id: u64) {
    let Some(consumer) = live(id) else {
        return;
    };
    consumer.clone().stop().await;
    CONSUMERS.with_borrow_mut(|m| m.remove(&id));
}

/// Stop every live consumer (`adapter.close`).
pub async fn stop_all() {
    let ids: Vec<u64> = CONSUMERS.with_borrow(|m| m.keys().copied().collect());
    for id in ids {
        stop(id).await;
    }
}

/// The `settle`, `healthy` and `stop` exports of `wrpc:broker/queue`, forwarding to [`settle`],
/// [`healthy`] and [`stop`]; used inside the adapter's `impl Guest for Component` (its
/// generated `ConsumerId`, `Tag`, `Settlement` and `Error` in scope).
#[macro_export]
macro_rules! queue_forwarding_exports {
    () => {
        async fn settle(id: ConsumerId, batch: Vec<(Tag, Settlement)>) -> Vec<Result<(), Error>> {
            $crate::queue::settle(id, batch).await
        }

        fn healthy(id: ConsumerId) -> Option<bool> {
            $crate::queue::healthy(id)
        }

        async fn stop(id: ConsumerId) {
            $crate::queue::stop(id).await
        }
    };
}

/// Conversions between an adapter's generated `delivery` and `settlement` (of the module named)
/// and this module's [`Delivery`] and [`Settlement`]:
/// `wrpc_broker_guest::queue_conversions!(crate::exports::wrpc::broker::queue);`
#[macro_export]
macro_rules! queue_conversions {
    ($($module:ident)::+) => {
        impl From<$crate::queue::Delivery> for $($module)::+::Delivery {
            fn from(d: $crate::queue::Delivery) -> Self {
                Self { tag: d.tag, body: d.body, headers: d.headers, attempt: d.attempt }
            }
        }
        impl From<$($module)::+::Settlement> for $crate::queue::Settlement {
            fn from(s: $($module)::+::Settlement) -> Self {
                use $($module)::+::Settlement as S;
                match s {
                    S::Ack => Self::Ack,
                    S::Retry(delay_ms) => Self::Retry(delay_ms),
                    S::Release => Self::Release,
                    S::DeadLetter(reason) => Self::DeadLetter(reason),
                }
            }
        }
    };
}
