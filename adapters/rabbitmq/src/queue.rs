//! `wrpc:broker/queue` on quorum queues: queue `q` is the durable quorum queue `P.q.<enc>`;
//! every consumer on every host instance consumes it on a channel of its own with `basic.qos`
//! = its prefetch (exact: the broker never hands it more unacknowledged deliveries), so each
//! message goes to one of them. The SDK's queue machinery holds the ledger, tags and
//! settlement; this module is the AMQP side of it.
//!
//! Settlements: ack → `basic.ack`; release → `basic.nack(requeue)` (the message is unchanged,
//! so `x-wrpc-attempt` is too; the broker's own counters are not used); retry(d) → publish the
//! copy (attempt + 1) to the retry bucket `P.q.<enc>.retry.<b>`, the smallest bucket `b ≥ d`
//! (quorum, `x-message-ttl` b, dead-lettered at-least-once back to the main queue when it
//! expires), or straight to the main queue when d = 0, and once the broker confirmed it,
//! `basic.ack`; dead-letter → publish to the dead-letter queue (its own quorum queue) with
//! `x-wrpc-dead-reason` and `x-wrpc-attempt`, confirmed, then `basic.ack`. ⚠ a delay is rounded
//! up to a bucket; one above the largest waits the largest.
//!
//! 0-9-1 acks have no reply: an ack is ok once written on an open channel. A channel that
//! closed (consumer timeout, lost connection) made the broker requeue all it held: their
//! settlements answer `stale`, and the consumer consumes again on a new channel. ⚠ RabbitMQ 3.10
//! has no per-delivery keep-alive: a handler longer than the broker's `consumer_timeout` (30
//! minutes by default) loses its channel and every unacknowledged delivery is redelivered.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::{Rc, Weak};

use wit_bindgen::StreamReader;

use crate::codec;
use crate::exports::wrpc::broker::queue::{
    ConsumeOptions, ConsumerId, Delivery, Guest, Message, Settlement,
};
use crate::inbox::Inbox;
use crate::wrpc::amqp::client::{self, AmqpError, Confirm, FieldTable, FieldValue, QueueOptions};
use crate::{Component, Config, channel, config};
use wrpc_broker_guest::queue::{self, Copy, CopyTo, Received, tried};
use wrpc_broker_guest::signal::{Latch, Ticker};
use wrpc_broker_guest::{Error, Headers, Tag};

wrpc_broker_guest::queue_conversions!(crate::exports::wrpc::broker::queue);

/// How long `depth` waits for the broker's counts to settle, in milliseconds.
const STAT_SETTLE_MS: u32 = 100;
/// The longest one receive waits for a delivery, in milliseconds.
const RECEIVE_WAIT_MS: u32 = 250;

thread_local! {
    /// The queues this instance declared (a cache: declaring again is harmless).
    static DECLARED: RefCell<HashSet<String>> = RefCell::new(HashSet::new());
    /// What each live consumer holds, by main queue (for `depth`).
    static HOLDERS: RefCell<HashMap<String, Vec<Weak<Held>>>> = RefCell::new(HashMap::new());
}

/// The arguments of a main or dead-letter queue.
fn quorum() -> FieldTable {
    vec![codec::text_field("x-queue-type", "quorum")]
}

/// The arguments of retry bucket `ms` of `main`.
fn bucket_arguments(main: &str, ms: u32) -> FieldTable {
    vec![
        codec::text_field("x-queue-type", "quorum"),
        ("x-message-ttl".to_string(), FieldValue::Long(i64::from(ms))),
        codec::text_field("x-dead-letter-exchange", ""),
        codec::text_field("x-dead-letter-routing-key", main),
        codec::text_field("x-dead-letter-strategy", "at-least-once"),
        codec::text_field("x-overflow", "reject-publish"),
    ]
}

/// The retry bucket of `main` for a delay of `ms`: its name and arguments.
fn bucket(config: &Config, main: &str, ms: u32) -> (String, FieldTable) {
    let b = config
        .buckets
        .iter()
        .copied()
        .find(|b| *b >= ms)
        .or_else(|| config.buckets.last().copied())
        .unwrap_or(ms);
    (format!("{main}.retry.{b}"), bucket_arguments(main, b))
}

/// Declare durable queue `name` with `arguments` unless this instance did already.
async fn declare(name: &str, arguments: &FieldTable, again: bool) -> Result<(), Error> {
    if !again && DECLARED.with_borrow(|d| d.contains(name)) {
        return Ok(());
    }
    let options = QueueOptions {
        durable: true,
        exclusive: false,
        auto_delete: false,
        passive: false,
    };
    channel::shared()
        .call(|ch| client::queue_declare(ch, name.to_string(), options, arguments.clone()))
        .await?;
    DECLARED.with_borrow_mut(|d| d.insert(name.to_string()));
    Ok(())
}

/// Publish `messages` to queue `name` (declared with `arguments`) in one driver call (all
/// written before the confirms are awaited); what the broker returned (the queue is gone)
/// declares it again and is published once more.
async fn put(
    name: &str,
    arguments: &FieldTable,
    mut messages: Vec<client::Message>,
) -> Result<(), Error> {
    declare(name, arguments, false).await?;
    for again in [false, true] {
        if again {
            declare(name, arguments, true).await?;
        }
        let confirms = channel::shared()
            .call(|ch| {
                client::publish_batch(ch, String::new(), name.to_string(), true, messages.clone())
            })
            .await?;
        let mut returned = Vec::new();
        for (message, confirm) in messages.into_iter().zip(confirms) {
            match confirm {
                Confirm::Ack => {}
                Confirm::Nack => {
                    return Err(Error::refused(format!(
                        "the broker refused a message for {name}"
                    )));
                }
                Confirm::Returned(why) => {
                    crate::debug(&format!("{name}: returned ({} {})", why.code, why.text));
                    returned.push(message);
                }
            }
        }
        if returned.is_empty() {
            return Ok(());
        }
        messages = returned;
    }
    Err(Error::unavailable(format!(
        "{name}: the broker returned the message twice"
    )))
}

/// A persistent message of `headers` and `body`.
fn persistent(headers: FieldTable, body: Vec<u8>) -> client::Message {
    client::Message {
        properties: codec::persistent(headers),
        body,
    }
}

/// The headers a message carries: the broker's, packed, and the attempt when above 1.
fn fields(headers: &Headers, attempt: u32) -> FieldTable {
    let mut table = Vec::new();
    codec::pack(&mut table, headers);
    if attempt > 1 {
        table.push(codec::text_field(codec::ATTEMPT, attempt.to_string()));
    }
    table
}

/// What a consumer holds: deliveries taken and not settled, and its inbox.
#[derive(Default)]
struct Held {
    taken: Cell<usize>,
    inbox: RefCell<Option<Rc<Inbox>>>,
}

impl Held {
    fn count(&self) -> usize {
        self.taken.get() + self.inbox.borrow().as_ref().map_or(0, |i| i.len())
    }
}

/// The consumer's current channel and consumer.
struct Live {
    channel: u64,
    tag: String,
    inbox: Rc<Inbox>,
}

/// One consumer's side of the broker.
struct AmqpConsumer {
    config: Rc<Config>,
    main: String,
    dlq: String,
    prefetch: u16,
    live: RefCell<Option<Live>>,
    held: Rc<Held>,
    /// The receive wait's host timer, kept across receives until it fires (a receive per
    /// delivery at prefetch 1 would start and cancel one each).
    tick: Ticker,
}

/// A delivery: its channel and delivery tag.
type Handle = (u64, u64);

impl AmqpConsumer {
    /// Consume on a new channel (after a loss, the old one's deliveries were requeued).
    async fn connect(&self) -> Result<(), Error> {
        let old = self.live.borrow_mut().take();
        if let Some(old) = old {
            old.inbox.close();
            client::close_channel(old.channel).await;
            self.held.taken.set(0);
            crate::debug(&format!(
                "queue {}: consumer lost, consuming again",
                self.main
            ));
        }
        declare(&self.main, &quorum(), false).await?;
        let ch = channel::open(self.prefetch).await?;
        let consumed = client::consume(ch, self.main.clone(), false, false, Vec::new()).await;
        let (tag, deliveries) = match consumed {
            Ok(consumed) => consumed,
            Err(e) => {
                client::close_channel(ch).await;
                if matches!(&e, AmqpError::Closed(why) if why.code == 404) {
                    DECLARED.with_borrow_mut(|d| d.remove(&self.main));
                }
                return Err(crate::amqp_error(e));
            }
        };
        let inbox = Inbox::start(deliveries, None);
        *self.held.inbox.borrow_mut() = Some(inbox.clone());
        *self.live.borrow_mut() = Some(Live {
            channel: ch,
            tag,
            inbox,
        });
        Ok(())
    }

    /// Settle on the delivery's own channel.
    fn settled(&self, answer: Result<(), AmqpError>, held: &Received<Handle>) -> Result<(), Error> {
        answer.map_err(crate::amqp_error)?;
        if self
            .live
            .borrow()
            .as_ref()
            .is_some_and(|l| l.channel == held.handle.0)
        {
            self.held.taken.set(self.held.taken.get().saturating_sub(1));
        }
        Ok(())
    }
}

impl queue::Broker for AmqpConsumer {
    /// Each delivery is settled on its own; a batch's calls may overlap.
    const CONCURRENT_SETTLES: bool = true;

    type Handle = Handle;

    fn keep_alive_ms(&self) -> u32 {
        // Nothing to extend in 0-9-1: a held delivery stays with its channel.
        3_600_000
    }

    async fn receive(&self, room: u32, stop: &Latch) -> Result<Vec<Received<Handle>>, Error> {
        let ended = self
            .live
            .borrow()
            .as_ref()
            .is_none_or(|l| l.inbox.is_done());
        if ended {
            self.connect().await?;
        }
        let (channel, inbox) = match self.live.borrow().as_ref() {
            Some(l) => (l.channel, l.inbox.clone()),
            None => return Err(Error::unavailable("no consumer")),
        };
        // An empty receive is asked again at once: a kept timer that fires early is harmless.
        inbox.wait_on(&self.tick, Some(stop)).await;
        let batch = inbox.take(room as usize);
        self.held.taken.set(self.held.taken.get() + batch.len());
        Ok(batch
            .into_iter()
            .map(|d| {
                let h = &d.properties.headers;
                let attempt = codec::number(h, codec::ATTEMPT)
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n >= 1)
                    .unwrap_or(1);
                Received {
                    handle: (channel, d.delivery_tag),
                    headers: codec::unpack(h),
                    body: d.body,
                    attempt,
                }
            })
            .collect())
    }

    async fn extend(&self, _held: Vec<Handle>) {}

    async fn ack(&self, held: &Received<Handle>) -> Result<(), Error> {
        let (ch, tag) = held.handle;
        self.settled(client::ack(ch, tag, false).await, held)
    }

    async fn copy_then_ack(&self, held: &Received<Handle>, copy: Copy<'_>) -> Result<(), Error> {
        let table = fields(copy.headers, copy.attempt);
        let (name, arguments) = match copy.to {
            CopyTo::Queue if copy.delay_ms == 0 => (self.main.clone(), quorum()),
            CopyTo::Queue => bucket(&self.config, &self.main, copy.delay_ms),
            CopyTo::DeadLetter => (self.dlq.clone(), quorum()),
        };
        put(
            &name,
            &arguments,
            vec![persistent(table, held.body.clone())],
        )
        .await?;
        tried(|| self.ack(held)).await
    }

    async fn release(&self, held: &Received<Handle>) -> Result<(), Error> {
        let (ch, tag) = held.handle;
        self.settled(client::nack(ch, tag, false, true).await, held)
    }

    async fn finish(&self) {
        let live = self.live.borrow_mut().take();
        if let Some(live) = live {
            let _ = client::cancel(live.channel, live.tag).await;
            live.inbox.close();
            client::close_channel(live.channel).await;
        }
        self.held.taken.set(0);
        *self.held.inbox.borrow_mut() = None;
    }
}

/// Ready messages of queue `name` (0 when it does not exist).
async fn ready(name: &str) -> Result<u64, Error> {
    let options = QueueOptions {
        durable: true,
        exclusive: false,
        auto_delete: false,
        passive: true,
    };
    let declared = channel::probe()
        .try_once(|ch| client::queue_declare(ch, name.to_string(), options, Vec::new()))
        .await;
    match declared {
        Ok(info) => Ok(u64::from(info.messages)),
        Err(AmqpError::Closed(why)) if why.code == 404 => Ok(0),
        Err(e) => Err(crate::amqp_error(e)),
    }
}

impl Guest for Component {
    async fn produce(queue: String, batch: Vec<Message>) -> Result<(), Error> {
        let main = config()?.queue("q", &queue)?;
        let messages = batch
            .into_iter()
            .map(|message| persistent(fields(&message.headers, 1), message.body))
            .collect();
        put(&main, &quorum(), messages).await
    }

    async fn consume(
        queue: String,
        opts: ConsumeOptions,
    ) -> Result<(ConsumerId, StreamReader<Delivery>), Error> {
        let config = config()?;
        let main = config.queue("q", &queue)?;
        let dead = opts.dead_letter.unwrap_or_else(|| format!("{queue}.dead"));
        let consumer = AmqpConsumer {
            dlq: config.queue("q", &dead)?,
            main: main.clone(),
            prefetch: u16::try_from(opts.prefetch).unwrap_or(u16::MAX),
            config,
            live: RefCell::new(None),
            held: Rc::new(Held::default()),
            tick: Ticker::new(RECEIVE_WAIT_MS),
        };
        consumer.connect().await?;
        HOLDERS.with_borrow_mut(|h| {
            let list = h.entry(main).or_default();
            list.retain(|w| w.strong_count() > 0);
            list.push(Rc::downgrade(&consumer.held));
        });
        let generation = consumer.config.generation;
        let (tx, rx) = crate::wit_stream::new::<Delivery>();
        Ok((queue::start(consumer, opts.prefetch, generation, tx)?, rx))
    }

    wrpc_broker_guest::queue_forwarding_exports!();

    async fn depth(queue: String) -> Result<u64, Error> {
        let config = config()?;
        let main = config.queue("q", &queue)?;
        // ⚠ A quorum queue's ready count (declare-ok) lags the deliveries it just made for a
        // moment: a delivery this instance already holds may still count as ready. Counted
        // after a pause, it does not.
        wrpc_broker_guest::sleep(STAT_SETTLE_MS).await;
        let mut depth = ready(&main).await?;
        for b in &config.buckets {
            depth += ready(&format!("{main}.retry.{b}")).await?;
        }
        let held: usize = HOLDERS.with_borrow(|h| {
            h.get(&main)
                .map(|list| {
                    list.iter()
                        .filter_map(Weak::upgrade)
                        .map(|held| held.count())
                        .sum()
                })
                .unwrap_or(0)
        });
        Ok(depth + held as u64)
    }
}
