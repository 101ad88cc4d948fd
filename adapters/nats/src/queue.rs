//! `wrpc:broker/queue` on JetStream: queue `q` is the work-queue stream `P_q_<enc>` (subject
//! `P.q.<enc>`) with one durable pull consumer `wrpc` shared by every consumer on every host
//! instance (explicit acks, `ack_wait` = `queue.ackWaitMs`, unlimited redeliveries), so each
//! message goes to one of them and an acknowledged one leaves the stream.
//!
//! A consumer keeps one pull (`CONSUMER.MSG.NEXT`, batch = its free prefetch, short expiry)
//! outstanding on its own inbox, so it never holds more than `prefetch` unsettled deliveries;
//! a delivery that arrives over the bound, or after `stop`, is NAK'd back at once. Deliveries it
//! holds get `+WPI` (in progress) every half `ack_wait`, so a slow handler is not redelivered
//! to someone else. The attempt travels in `x-wrpc-attempt` (JetStream's delivery count is not
//! used: a NAK bumps it).
//!
//! Settlements (each a request, so the server's reply proves it landed): ack → `+ACK`; retry →
//! publish a copy (attempt + 1, `x-wrpc-not-before` = now + delay; the consumer NAKs a copy
//! that is not due yet with that delay) and, once its PubAck came, `+ACK`; release → `-NAK`
//! (same message, attempt unchanged); dead-letter → publish to the dead-letter queue's own
//! stream with `x-wrpc-dead-reason` and `x-wrpc-attempt`, and only once that PubAck came,
//! `+TERM`. A call that fails is tried again after 10, 20 and 40 ms; then the message is handed
//! back with `-NAK` (if even that fails, `ack_wait` redelivers it) and the settlement answers
//! `refused`; `healthy` is false until a settlement lands again.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::pin::pin;
use std::rc::Rc;

use futures::future::{Either, select};
use serde_json::json;
use wit_bindgen::{StreamReader, StreamResult, StreamWriter};

use crate::codec;
use crate::exports::wrpc::broker::queue::{
    ConsumeOptions, ConsumerId, Delivery, Guest, Message as QueueMessage, Settlement,
};
use crate::js::{self, Fail};
use crate::wrpc::nats::client::{self, Message, NatsError};
use crate::{Component, Config, config};
use wrpc_broker_guest::signal::{Latch, Notify};
use wrpc_broker_guest::{Error, Headers, Tag, headers, host};

/// The durable consumer every instance shares.
const DURABLE: &str = "wrpc";
/// How long one pull waits on the server for messages, in milliseconds.
const PULL_MS: u64 = 500;
/// How long past its expiry a pull may stay unanswered before the consumer gives up on it (a
/// restarted server forgets pulls).
const PULL_GRACE_MS: u64 = 1_500;
/// How long one settlement request waits for the server's reply.
const SETTLE_MS: u32 = 2_000;
/// The pauses before each new try of a failed settlement call, in milliseconds.
const RETRY_BACKOFF_MS: [u32; 3] = [10, 20, 40];

/// A delivery the consumer holds and nobody has settled yet.
#[derive(Clone)]
struct Held {
    /// Its `$JS.ACK.…` subject.
    ack: String,
    /// The body, kept for a retry or dead-letter copy.
    body: Vec<u8>,
    /// The broker headers (without the attempt).
    headers: Headers,
    /// Its attempt.
    attempt: u32,
}

/// The pull a consumer has outstanding.
struct Pull {
    /// Messages it may still bring.
    left: u32,
    /// When the consumer stops waiting for it (ms since the epoch).
    deadline: u64,
    /// Its number (its reply subject is `<inbox>.<number>`).
    number: u64,
}

/// The mutable part of a consumer.
struct Ledger {
    /// Unsettled deliveries by tag seq.
    unsettled: BTreeMap<u64, Held>,
    /// Deliveries a `settle` has taken out of `unsettled` and not finished with.
    settling: usize,
    /// False since a settlement failed, until one lands.
    healthy: bool,
    /// The outstanding pull.
    pull: Option<Pull>,
    /// Deliveries held and not yet written to the stream.
    out: VecDeque<Delivery>,
    /// The server lost the consumer (409, 503 on a pull): create it again.
    recreate: bool,
    /// The next pull number.
    pulls: u64,
}

/// A live consumer, shared by its tasks, `settle` and `stop`.
struct Consumer {
    /// The queue name (for logs).
    queue: String,
    /// Its stream.
    stream: String,
    /// The dead-letter queue's name.
    dlq: String,
    prefetch: u32,
    ack_wait_ms: u32,
    generation: u32,
    /// Where this consumer's pulls are answered: `<inbox>.<pull number>`.
    inbox: String,
    ledger: RefCell<Ledger>,
    /// Set by `stop` (or a lost subscription): take nothing more.
    stop: Latch,
    /// Set when the pump has ended and handed back what was unsettled.
    ended: Latch,
    /// Set once the pump is done with the pull subscription.
    unsubscribe: Latch,
    /// Fires on anything the pump waits for (a delivery, a settled one, a finished pull).
    wake: Notify,
    /// False once the pull subscription ended.
    subscribed: Cell<bool>,
}

thread_local! {
    /// Live consumers by id.
    static CONSUMERS: RefCell<BTreeMap<ConsumerId, Rc<Consumer>>> = const { RefCell::new(BTreeMap::new()) };
    /// The next consumer id.
    static NEXT_ID: Cell<ConsumerId> = const { Cell::new(1) };
    /// The next tag seq, unique across the consumers of this instance.
    static NEXT_SEQ: Cell<u64> = const { Cell::new(1) };
}

/// Stop every live consumer (`close`).
pub(crate) async fn stop_all() {
    let ids: Vec<ConsumerId> = CONSUMERS.with_borrow(|m| m.keys().copied().collect());
    for id in ids {
        <Component as Guest>::stop(id).await;
    }
}

/// The live consumer `id`.
fn consumer(id: ConsumerId) -> Option<Rc<Consumer>> {
    CONSUMERS.with_borrow(|m| m.get(&id).cloned())
}

/// Make sure the work-queue stream of `queue` exists.
async fn ensure_stream(config: &Config, queue: &str) -> Result<(), Error> {
    let stream = config.stream("q", queue)?;
    let subject = config.subject("q", queue)?;
    js::stream_info_or_create(&stream, || {
        let mut c = js::stream_config(config, &stream, &subject, "wrpc queue".to_string());
        c["retention"] = json!("workqueue");
        c
    })
    .await
    .map(|_| ())
    .map_err(|e| e.into_error(&format!("queue stream {stream}")))
}

/// Store one message on `queue`, creating its stream when missing.
async fn store(config: &Config, queue: &str, headers: Headers, body: Vec<u8>) -> Result<(), Error> {
    let subject = config.subject("q", queue)?;
    let stream = config.stream("q", queue)?;
    let mut created = false;
    loop {
        match js::publish(&subject, &stream, headers.clone(), body.clone()).await {
            Ok(_) => return Ok(()),
            Err(e) if e.stream_missing() && !created => {
                ensure_stream(config, queue).await?;
                created = true;
            }
            Err(e) => return Err(e.into_error(&format!("publish to {stream}"))),
        }
    }
}

/// Create (or update) the shared durable consumer of `stream`.
async fn create_durable(config: &Config, queue: &str, stream: &str) -> Result<(), Error> {
    let body = json!({
        "stream_name": stream,
        "config": {
            "durable_name": DURABLE,
            "deliver_policy": "all",
            "ack_policy": "explicit",
            "ack_wait": u64::from(config.ack_wait_ms) * 1_000_000,
            "max_deliver": -1,
            "max_ack_pending": 20_000,
            "max_waiting": 512,
        }
    });
    let call = format!("CONSUMER.DURABLE.CREATE.{stream}.{DURABLE}");
    match js::api(&call, &body).await {
        Ok(_) => Ok(()),
        Err(e) if e.stream_missing() => {
            ensure_stream(config, queue).await?;
            js::api(&call, &body)
                .await
                .map(|_| ())
                .map_err(|e| e.into_error(&format!("consumer on {stream}")))
        }
        Err(e) => Err(e.into_error(&format!("consumer on {stream}"))),
    }
}

/// Make a call; while it fails, try again after each pause of [`RETRY_BACKOFF_MS`].
async fn retried<F, Fut>(mut call: F) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    for pause in RETRY_BACKOFF_MS {
        match call().await {
            Err(Error::BadRequest(m)) => return Err(Error::BadRequest(m)),
            Err(_) => host::sleep(pause).await,
            Ok(()) => return Ok(()),
        }
    }
    call().await
}

/// Send `verb` (`+ACK`, `-NAK`, `+TERM`) for a delivery and wait for the server's reply.
async fn ack_call(ack: &str, verb: &str) -> Result<(), Error> {
    match client::request(
        ack.to_string(),
        Vec::new(),
        verb.as_bytes().to_vec(),
        SETTLE_MS,
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(NatsError::Refused(m)) => Err(Error::refused(m)),
        Err(e) => Err(crate::nats_error(e)),
    }
}

/// Tell the server at once to redeliver a delivery (`-NAK`, optionally with a delay).
async fn nak(ack: &str, delay_ms: u64) {
    let body = if delay_ms == 0 {
        "-NAK".to_string()
    } else {
        format!("-NAK {{\"delay\": {}}}", delay_ms * 1_000_000)
    };
    let _ = client::publish(ack.to_string(), Vec::new(), body.into_bytes(), None).await;
}

impl Consumer {
    /// How many more deliveries the prefetch allows.
    fn room(&self) -> u32 {
        let ledger = self.ledger.borrow();
        let held = ledger.unsettled.len() + ledger.settling;
        self.prefetch
            .saturating_sub(u32::try_from(held).unwrap_or(u32::MAX))
    }

    /// Read the pull subscription until the pump is done with it.
    async fn read(self: Rc<Self>, mut from: StreamReader<Message>) {
        loop {
            let read = pin!(from.read(Vec::with_capacity(crate::BATCH)));
            let (result, batch) = match select(read, pin!(self.unsubscribe.wait())).await {
                Either::Left((read, _)) => read,
                Either::Right(_) => break,
            };
            for m in batch {
                self.on_message(m).await;
            }
            if !matches!(result, StreamResult::Complete(_)) {
                crate::debug(&format!(
                    "queue {}: the pull subscription ended",
                    self.queue
                ));
                self.subscribed.set(false);
                self.stop.set();
                break;
            }
        }
        self.wake.notify();
    }

    /// One message on the pull inbox: a status ends a pull; a delivery is held (or NAK'd).
    async fn on_message(&self, m: Message) {
        if let Some(status) = m.status {
            if status == 100 {
                return;
            }
            let number = m
                .subject
                .rsplit_once('.')
                .and_then(|(_, n)| n.parse::<u64>().ok());
            let mut ledger = self.ledger.borrow_mut();
            if ledger.pull.as_ref().map(|p| p.number) == number {
                ledger.pull = None;
            }
            if status == 409 || status == 503 {
                crate::debug(&format!(
                    "queue {}: pull answered {status} {}: re-creating the consumer",
                    self.queue, m.description
                ));
                ledger.recreate = true;
            }
            drop(ledger);
            self.wake.notify();
            return;
        }
        let Some(ack) = m.reply.clone().filter(|r| r.starts_with("$JS.ACK.")) else {
            return;
        };
        {
            let mut ledger = self.ledger.borrow_mut();
            if let Some(pull) = ledger.pull.as_mut() {
                pull.left = pull.left.saturating_sub(1);
                if pull.left == 0 {
                    ledger.pull = None;
                }
            }
        }
        self.wake.notify();
        let now = host::now_ms();
        if let Some(due) = codec::number(&m.headers, codec::NOT_BEFORE)
            && due > now
        {
            nak(&ack, due - now).await;
            return;
        }
        if self.stop.is_set() || self.room() == 0 {
            nak(&ack, 0).await;
            return;
        }
        let seq = NEXT_SEQ.replace(NEXT_SEQ.get() + 1);
        let attempt = headers::attempt(&m.headers);
        let user = codec::unpack(&m.headers);
        let delivery = Delivery {
            tag: Tag {
                generation: self.generation,
                seq,
            },
            body: m.payload.clone(),
            headers: user.clone(),
            attempt,
        };
        let mut ledger = self.ledger.borrow_mut();
        ledger.unsettled.insert(
            seq,
            Held {
                ack,
                body: m.payload,
                headers: user,
                attempt,
            },
        );
        ledger.out.push_back(delivery);
    }

    /// Pull while there is room, write deliveries to `to`, until stopped; then hand back what
    /// is unsettled and close `to`.
    async fn pump(self: Rc<Self>, config: Rc<Config>, mut to: StreamWriter<Delivery>) {
        while !self.stop.is_set() {
            let woken = self.wake.notified();
            let out: Vec<Delivery> = self.ledger.borrow_mut().out.drain(..).collect();
            if !out.is_empty() {
                let write = pin!(to.write_all(out));
                match select(write, pin!(self.stop.wait())).await {
                    Either::Left((unsent, _)) if unsent.is_empty() => {}
                    _ => break,
                }
                continue;
            }
            let recreate = std::mem::take(&mut self.ledger.borrow_mut().recreate);
            if recreate && let Err(e) = create_durable(&config, &self.queue, &self.stream).await {
                crate::debug(&format!(
                    "queue {}: re-creating the consumer: {e:?}",
                    self.queue
                ));
                self.ledger.borrow_mut().recreate = true;
                host::sleep(200).await;
                continue;
            }
            let now = host::now_ms();
            let expired = self
                .ledger
                .borrow()
                .pull
                .as_ref()
                .is_some_and(|p| p.deadline <= now);
            if expired {
                self.ledger.borrow_mut().pull = None;
            }
            let room = self.room();
            if self.ledger.borrow().pull.is_none() && room > 0 {
                let number = {
                    let mut ledger = self.ledger.borrow_mut();
                    ledger.pulls += 1;
                    ledger.pull = Some(Pull {
                        left: room,
                        deadline: now + PULL_MS + PULL_GRACE_MS,
                        number: ledger.pulls,
                    });
                    ledger.pulls
                };
                let body = json!({"batch": room, "expires": PULL_MS * 1_000_000}).to_string();
                let reply = format!("{}.{number}", self.inbox);
                let next = format!("$JS.API.CONSUMER.MSG.NEXT.{}.{DURABLE}", self.stream);
                if client::publish(next, Vec::new(), body.into_bytes(), Some(reply))
                    .await
                    .is_err()
                {
                    self.ledger.borrow_mut().pull = None;
                    host::sleep(200).await;
                }
                continue;
            }
            let wait = self
                .ledger
                .borrow()
                .pull
                .as_ref()
                .map_or(1_000, |p| p.deadline.saturating_sub(now).max(1));
            let wait = u32::try_from(wait).unwrap_or(1_000);
            let stop = self.stop.wait();
            select(
                pin!(woken),
                pin!(select(pin!(stop), pin!(host::sleep(wait)))),
            )
            .await;
        }
        self.stop.set();
        // A pull still open may bring deliveries: they are NAK'd as they come (stop is set).
        while self.subscribed.get() {
            let now = host::now_ms();
            let Some(deadline) = self.ledger.borrow().pull.as_ref().map(|p| p.deadline) else {
                break;
            };
            if deadline <= now {
                break;
            }
            let woken = self.wake.notified();
            let wait = u32::try_from(deadline - now).unwrap_or(1_000);
            select(pin!(woken), pin!(host::sleep(wait))).await;
        }
        self.unsubscribe.set();
        drop(to);
        let unsettled = {
            let mut ledger = self.ledger.borrow_mut();
            ledger.out.clear();
            std::mem::take(&mut ledger.unsettled)
        };
        for held in unsettled.into_values() {
            nak(&held.ack, 0).await;
        }
        self.ended.set();
    }

    /// Send `+WPI` for every held delivery every half `ack_wait`, until stopped.
    async fn keep_alive(self: Rc<Self>) {
        let period = (self.ack_wait_ms / 2).max(50);
        loop {
            let tick = pin!(host::sleep(period));
            if let Either::Right(_) = select(tick, pin!(self.stop.wait())).await {
                return;
            }
            let acks: Vec<String> = {
                let ledger = self.ledger.borrow();
                ledger.unsettled.values().map(|h| h.ack.clone()).collect()
            };
            for ack in acks {
                let _ = client::publish(ack, Vec::new(), b"+WPI".to_vec(), None).await;
            }
        }
    }

    /// The broker calls of one settlement; a copy is confirmed before the original is acked.
    async fn apply(
        &self,
        config: &Config,
        held: &Held,
        settlement: Settlement,
    ) -> Result<(), Error> {
        match settlement {
            Settlement::Ack => {}
            Settlement::Retry(delay_ms) => {
                let mut copy = Vec::new();
                codec::push_packed(&mut copy, &held.headers);
                codec::push(&mut copy, codec::ATTEMPT, (held.attempt + 1).to_string());
                if delay_ms > 0 {
                    let due = host::now_ms() + u64::from(delay_ms);
                    codec::push(&mut copy, codec::NOT_BEFORE, due.to_string());
                }
                retried(|| store(config, &self.queue, copy.clone(), held.body.clone())).await?;
            }
            Settlement::Release => return retried(|| ack_call(&held.ack, "-NAK")).await,
            Settlement::DeadLetter(reason) => {
                let mut with_reason = held.headers.clone();
                headers::set(
                    &mut with_reason,
                    codec::DEAD_REASON,
                    headers::dead_reason(&reason),
                );
                let mut copy = Vec::new();
                codec::push_packed(&mut copy, &with_reason);
                codec::push(&mut copy, codec::ATTEMPT, held.attempt.to_string());
                retried(|| store(config, &self.dlq, copy.clone(), held.body.clone())).await?;
                return retried(|| ack_call(&held.ack, "+TERM")).await;
            }
        }
        retried(|| ack_call(&held.ack, "+ACK")).await
    }

    /// Settle the delivery `tag`; on failure hand the message back.
    async fn settle(&self, config: &Config, tag: Tag, settlement: Settlement) -> Result<(), Error> {
        if tag.generation != self.generation {
            return Err(Error::stale(format!(
                "tag from generation {}, this instance is {}",
                tag.generation, self.generation
            )));
        }
        let held = {
            let mut ledger = self.ledger.borrow_mut();
            let held = ledger.unsettled.remove(&tag.seq).ok_or_else(|| {
                Error::stale(format!(
                    "delivery {} was already settled or handed back",
                    tag.seq
                ))
            })?;
            ledger.settling += 1;
            held
        };
        let answer = self.apply(config, &held, settlement).await;
        if answer.is_err() {
            let _ = retried(|| ack_call(&held.ack, "-NAK")).await;
        }
        {
            let mut ledger = self.ledger.borrow_mut();
            ledger.settling -= 1;
            ledger.healthy = answer.is_ok();
        }
        self.wake.notify();
        answer.map_err(|e| {
            let why = format!(
                "settlement on queue {} failed after {} tries ({e:?}); message handed back",
                self.queue,
                RETRY_BACKOFF_MS.len() + 1
            );
            wrpc_broker_guest::warn!("{why}");
            match e {
                Error::BadRequest(m) => Error::internal(m),
                _ => Error::refused(why),
            }
        })
    }
}

/// The `Fail` of a JetStream call as an error (for `?` in this module).
impl From<Fail> for Error {
    fn from(f: Fail) -> Self {
        f.into_error("JetStream")
    }
}

impl Guest for Component {
    async fn produce(queue: String, batch: Vec<QueueMessage>) -> Result<(), Error> {
        let config = config()?;
        config.enc("queue", &queue)?;
        for m in batch {
            let mut headers = Vec::new();
            codec::push_packed(&mut headers, &m.headers);
            store(&config, &queue, headers, m.body).await?;
        }
        Ok(())
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
        config.enc("queue", &dlq)?;
        let stream = config.stream("q", &queue)?;
        ensure_stream(&config, &queue).await?;
        create_durable(&config, &queue, &stream).await?;
        let inbox = client::new_inbox();
        let (_, pulls) = client::subscribe(format!("{inbox}.*"), None)
            .await
            .map_err(crate::nats_error)?;
        let consumer = Rc::new(Consumer {
            queue,
            stream,
            dlq,
            prefetch: opts.prefetch,
            ack_wait_ms: config.ack_wait_ms,
            generation: config.generation,
            inbox,
            ledger: RefCell::new(Ledger {
                unsettled: BTreeMap::new(),
                settling: 0,
                healthy: true,
                pull: None,
                out: VecDeque::new(),
                recreate: false,
                pulls: 0,
            }),
            stop: Latch::new(),
            ended: Latch::new(),
            unsubscribe: Latch::new(),
            wake: Notify::new(),
            subscribed: Cell::new(true),
        });
        let id = NEXT_ID.replace(NEXT_ID.get() + 1);
        CONSUMERS.with_borrow_mut(|m| m.insert(id, consumer.clone()));
        let (tx, rx) = crate::wit_stream::new::<Delivery>();
        wit_bindgen::spawn_local(consumer.clone().read(pulls));
        wit_bindgen::spawn_local(consumer.clone().pump(config, tx));
        wit_bindgen::spawn_local(consumer.keep_alive());
        Ok((id, rx))
    }

    async fn settle(
        consumer_id: ConsumerId,
        batch: Vec<(Tag, Settlement)>,
    ) -> Vec<Result<(), Error>> {
        let (Some(c), Ok(config)) = (consumer(consumer_id), config()) else {
            let closed = || Error::closed(format!("consumer {consumer_id} is not live"));
            return batch.iter().map(|_| Err(closed())).collect();
        };
        let mut answers = Vec::with_capacity(batch.len());
        for (tag, settlement) in batch {
            answers.push(c.settle(&config, tag, settlement).await);
        }
        answers
    }

    fn healthy(consumer_id: ConsumerId) -> Option<bool> {
        consumer(consumer_id).map(|c| c.ledger.borrow().healthy && c.subscribed.get())
    }

    async fn stop(consumer_id: ConsumerId) {
        let Some(c) = consumer(consumer_id) else {
            return;
        };
        c.stop.set();
        c.wake.notify();
        c.ended.wait().await;
        CONSUMERS.with_borrow_mut(|m| m.remove(&consumer_id));
    }

    async fn depth(queue: String) -> Result<u64, Error> {
        // A work-queue stream keeps exactly the messages not yet acknowledged (or terminated):
        // waiting, delayed copies of retries, and delivered ones still unsettled.
        let stream = config()?.stream("q", &queue)?;
        match js::api(&format!("STREAM.INFO.{stream}"), &serde_json::Value::Null).await {
            Ok(info) => info["state"]["messages"].as_u64().ok_or_else(|| {
                Error::internal(format!("STREAM.INFO {stream}: no state.messages in {info}"))
            }),
            Err(e) if e.stream_missing() => Ok(0),
            Err(e) => Err(e.into_error(&format!("queue stream {stream}"))),
        }
    }
}
