//! `wrpc:broker/queue` on JetStream: queue `q` is the work-queue stream `P_q_<enc>` (subject
//! `P.q.<enc>`) with one durable pull consumer `wrpc` shared by every consumer on every host
//! instance (explicit acks, `ack_wait` = `queue.visibilityMs`, unlimited redeliveries), so each
//! message goes to one of them and an acknowledged one leaves the stream.
//!
//! A consumer keeps one pull (`CONSUMER.MSG.NEXT`, batch = its free prefetch, short expiry)
//! outstanding on its own inbox, so it never holds more than `prefetch` unsettled deliveries;
//! a delivery that arrives over the bound, or after `stop`, is NAK'd back at once. The SDK's
//! queue machinery holds the ledger, tags, keep-alive and settlement; this module is the
//! JetStream side of it. Deliveries it
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
use std::collections::VecDeque;
use std::pin::pin;
use std::rc::Rc;

use futures::future::{Either, select};
use serde_json::json;
use wit_bindgen::{StreamReader, StreamResult};

use crate::codec;
use crate::exports::wrpc::broker::queue::{
    ConsumeOptions, ConsumerId, Delivery, Guest, Message as QueueMessage, Settlement,
};
use crate::js::{self, Fail};
use crate::wrpc::nats::client::{self, Message, NatsError};
use crate::{Component, Config, config};
use wrpc_broker_guest::coalesce::Coalesce;
use wrpc_broker_guest::queue::{self, Copy, CopyTo, Received, tried};
use wrpc_broker_guest::relay::ReadSize;
use wrpc_broker_guest::signal::{Latch, Notify};
use wrpc_broker_guest::{Error, Headers, Tag, headers, host};

wrpc_broker_guest::queue_conversions!(crate::exports::wrpc::broker::queue);

/// The durable consumer every instance shares.
const DURABLE: &str = "wrpc";
/// How long one pull waits on the server for messages, in milliseconds.
const PULL_MS: u64 = 500;
/// How long past its expiry a pull may stay unanswered before the consumer gives up on it (a
/// restarted server forgets pulls).
const PULL_GRACE_MS: u64 = 1_500;
/// The longest one receive waits for a delivery, in milliseconds.
const RECEIVE_WAIT_MS: u64 = 250;
/// How long one settlement request waits for the server's reply.
const SETTLE_MS: u32 = 2_000;
/// The most acks one driver call carries (the driver takes at most 4096 requests a call).
const ACKS_PER_CALL: usize = 1024;

/// The pull a consumer has outstanding.
struct Pull {
    /// Messages it may still bring.
    left: u32,
    /// When the consumer stops waiting for it (ms since the epoch).
    deadline: u64,
    /// Its number (its reply subject is `<inbox>.<number>`).
    number: u64,
}

/// What the pull inbox brought, shared by its reader task and the consumer.
#[derive(Default)]
struct Inbox {
    /// Messages read and not yet looked at.
    arrived: RefCell<VecDeque<Message>>,
    /// Fires when a message arrived or the subscription ended.
    wake: Notify,
    /// False once the pull subscription ended.
    ended: Cell<bool>,
    /// Set once the consumer is done with the subscription (the reader drops it).
    unsubscribe: Latch,
}

/// One consumer's side of JetStream: pulls on the queue's shared durable.
struct PullConsumer {
    config: Rc<Config>,
    /// The queue and dead-letter queue names, and the queue's stream.
    queue: String,
    dlq: String,
    stream: String,
    /// Where this consumer's pulls are answered: `<inbox>.<pull number>`.
    inbox: String,
    messages: Rc<Inbox>,
    /// The outstanding pull.
    pull: RefCell<Option<Pull>>,
    /// The last pull number used.
    pulls: Cell<u64>,
    /// The server lost the durable (409, 503 on a pull): create it again.
    recreate: Cell<bool>,
    /// Acks waiting to go to the server together (see [`PullConsumer::ack`]): `$JS.ACK.…`
    /// subjects.
    acks: Coalesce<String, Result<(), Error>>,
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

/// Store `messages` (headers, body) on `queue`, in order, creating its stream when missing.
async fn store(
    config: &Config,
    queue: &str,
    messages: Vec<(Headers, Vec<u8>)>,
) -> Result<(), Error> {
    let subject = config.subject("q", queue)?;
    let stream = config.stream("q", queue)?;
    js::publish_all(&subject, &stream, messages, || ensure_stream(config, queue))
        .await
        .map(|_| ())
}

/// Create (or update) the shared durable consumer of `stream`.
async fn create_durable(config: &Config, queue: &str, stream: &str) -> Result<(), Error> {
    let body = json!({
        "stream_name": stream,
        "config": {
            "durable_name": DURABLE,
            "deliver_policy": "all",
            "ack_policy": "explicit",
            "ack_wait": u64::from(config.visibility_ms) * 1_000_000,
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

/// Send `verb` (`+ACK`, `-NAK`, `+TERM`) for a delivery and wait for the server's reply.
async fn ack_call(ack: &str, verb: &str) -> Result<(), Error> {
    let answer = client::request(
        ack.to_string(),
        Vec::new(),
        verb.as_bytes().to_vec(),
        SETTLE_MS,
    )
    .await;
    settled(answer)
}

/// The server's reply to a settlement as its answer.
fn settled(answer: Result<client::Message, NatsError>) -> Result<(), Error> {
    match answer {
        Ok(_) => Ok(()),
        Err(NatsError::Refused(m)) => Err(Error::refused(m)),
        Err(e) => Err(crate::nats_error(e)),
    }
}

/// `+ACK` for each of `acks` (`$JS.ACK.…` subjects), sent together ([`ACKS_PER_CALL`] a driver
/// call); one answer each, as [`ack_call`] answers.
async fn ack_all(acks: Vec<String>) -> Vec<Result<(), Error>> {
    let mut answers = Vec::with_capacity(acks.len());
    let mut acks = acks.into_iter().peekable();
    while acks.peek().is_some() {
        let requests = acks
            .by_ref()
            .take(ACKS_PER_CALL)
            .map(|ack| client::Outgoing {
                subject: ack,
                headers: Vec::new(),
                payload: b"+ACK".to_vec(),
            })
            .collect();
        let got = client::request_all(requests, SETTLE_MS).await;
        answers.extend(got.into_iter().map(settled));
    }
    answers
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

impl Inbox {
    /// Read the pull subscription into `arrived` until the consumer is done with it.
    async fn read(self: Rc<Self>, queue: String, mut from: StreamReader<Message>) {
        let mut size = ReadSize::default();
        loop {
            let read = pin!(size.read(&mut from));
            let (result, batch) = match select(read, pin!(self.unsubscribe.wait())).await {
                Either::Left((read, _)) => read,
                Either::Right(_) => break,
            };
            self.arrived.borrow_mut().extend(batch);
            self.wake.notify();
            if !matches!(result, StreamResult::Complete(_)) {
                crate::debug(&format!("queue {queue}: the pull subscription ended"));
                self.ended.set(true);
                break;
            }
        }
        self.wake.notify();
    }
}

impl PullConsumer {
    /// Look at what arrived: a status ends a pull; a delivery not yet due or over `room` is
    /// NAK'd back (room 0, once stopping: all of them); the rest are returned to be held.
    async fn take_arrived(&self, room: u32) -> Vec<Received<String>> {
        let mut taken = Vec::new();
        loop {
            let Some(m) = self.messages.arrived.borrow_mut().pop_front() else {
                return taken;
            };
            if let Some(status) = m.status {
                self.on_status(status, &m);
                continue;
            }
            let Some(ack) = m.reply.clone().filter(|r| r.starts_with("$JS.ACK.")) else {
                continue;
            };
            let pull_done = self.pull.borrow_mut().as_mut().is_some_and(|pull| {
                pull.left = pull.left.saturating_sub(1);
                pull.left == 0
            });
            if pull_done {
                *self.pull.borrow_mut() = None;
            }
            // The clock only for a delayed copy: a host call per message is a crossing each.
            if let Some(due) = codec::number(&m.headers, codec::NOT_BEFORE)
                && let now = host::now_ms()
                && due > now
            {
                nak(&ack, due - now).await;
                continue;
            }
            if taken.len() as u32 >= room {
                nak(&ack, 0).await;
                continue;
            }
            taken.push(Received {
                handle: ack,
                attempt: headers::attempt(&m.headers),
                headers: codec::unpack(&m.headers),
                body: m.payload,
            });
        }
    }

    /// A status on the pull inbox: the pull it answers is over; 409 and 503 mean the server
    /// lost the durable.
    fn on_status(&self, status: u16, m: &Message) {
        if status == 100 {
            return;
        }
        let number = m
            .subject
            .rsplit_once('.')
            .and_then(|(_, n)| n.parse::<u64>().ok());
        if self.pull.borrow().as_ref().map(|p| p.number) == number {
            *self.pull.borrow_mut() = None;
        }
        if status == 409 || status == 503 {
            crate::debug(&format!(
                "queue {}: pull answered {status} {}: re-creating the consumer",
                self.queue, m.description
            ));
            self.recreate.set(true);
        }
    }

    /// Ask for up to `room` messages unless a pull is still outstanding.
    async fn ensure_pull(&self, room: u32) -> Result<(), Error> {
        let now = host::now_ms();
        if self
            .pull
            .borrow()
            .as_ref()
            .is_some_and(|p| p.deadline <= now)
        {
            *self.pull.borrow_mut() = None;
        }
        if self.pull.borrow().is_some() {
            return Ok(());
        }
        let number = self.pulls.get() + 1;
        self.pulls.set(number);
        *self.pull.borrow_mut() = Some(Pull {
            left: room,
            deadline: now + PULL_MS + PULL_GRACE_MS,
            number,
        });
        let body = json!({"batch": room, "expires": PULL_MS * 1_000_000}).to_string();
        let reply = format!("{}.{number}", self.inbox);
        let next = format!("$JS.API.CONSUMER.MSG.NEXT.{}.{DURABLE}", self.stream);
        if let Err(e) = client::publish(next, Vec::new(), body.into_bytes(), Some(reply)).await {
            *self.pull.borrow_mut() = None;
            return Err(crate::nats_error(e));
        }
        Ok(())
    }
}

impl queue::Broker for PullConsumer {
    /// Each delivery is settled on its own; a batch's calls may overlap.
    const CONCURRENT_SETTLES: bool = true;

    /// The delivery's `$JS.ACK.…` subject.
    type Handle = String;

    fn keep_alive_ms(&self) -> u32 {
        (self.config.visibility_ms / 2).max(50)
    }

    async fn receive(&self, room: u32, stop: &Latch) -> Result<Vec<Received<String>>, Error> {
        let woken = self.messages.wake.notified();
        let taken = self
            .take_arrived(if stop.is_set() { 0 } else { room })
            .await;
        if !taken.is_empty() || stop.is_set() {
            return Ok(taken);
        }
        if self.messages.ended.get() {
            return Err(Error::closed("the pull subscription ended"));
        }
        if self.recreate.replace(false)
            && let Err(e) = create_durable(&self.config, &self.queue, &self.stream).await
        {
            self.recreate.set(true);
            return Err(e);
        }
        self.ensure_pull(room).await?;
        let wait = self
            .pull
            .borrow()
            .as_ref()
            .map_or(RECEIVE_WAIT_MS, |p| {
                p.deadline.saturating_sub(host::now_ms())
            })
            .clamp(1, RECEIVE_WAIT_MS);
        let tick = pin!(host::sleep(wait as u32));
        select(pin!(woken), pin!(select(pin!(stop.wait()), tick))).await;
        Ok(self
            .take_arrived(if stop.is_set() { 0 } else { room })
            .await)
    }

    /// `+WPI` (in progress) for each.
    async fn extend(&self, held: Vec<String>) {
        for ack in held {
            let _ = client::publish(ack, Vec::new(), b"+WPI".to_vec(), None).await;
        }
    }

    /// The acks of one `queue.settle` batch (its settlements run together) go to the server
    /// together, in one driver call: the first lets the others of its batch join.
    async fn ack(&self, held: &Received<String>) -> Result<(), Error> {
        self.acks
            .call(held.handle.clone(), ack_all)
            .await
            .unwrap_or_else(|| Err(Error::internal("an ack's driver call was dropped")))
    }

    async fn copy_then_ack(&self, held: &Received<String>, copy: Copy<'_>) -> Result<(), Error> {
        let mut nats_headers = Vec::new();
        codec::push_packed(&mut nats_headers, copy.headers);
        codec::push(&mut nats_headers, codec::ATTEMPT, copy.attempt.to_string());
        if copy.delay_ms > 0 {
            let due = host::now_ms() + u64::from(copy.delay_ms);
            codec::push(&mut nats_headers, codec::NOT_BEFORE, due.to_string());
        }
        let (to, verb) = match copy.to {
            CopyTo::Queue => (&self.queue, "+ACK"),
            CopyTo::DeadLetter => (&self.dlq, "+TERM"),
        };
        let body = &held.body;
        tried(|| store(&self.config, to, vec![(nats_headers.clone(), body.clone())])).await?;
        tried(|| ack_call(&held.handle, verb)).await
    }

    /// `-NAK`: the same message, attempt unchanged.
    async fn release(&self, held: &Received<String>) -> Result<(), Error> {
        ack_call(&held.handle, "-NAK").await
    }

    /// `-NAK` without waiting for replies (a server that is gone redelivers after `ack_wait`).
    async fn hand_back_all(&self, held: Vec<Received<String>>) {
        for message in held {
            nak(&message.handle, 0).await;
        }
    }

    /// Let a pull still open run out (its deliveries are NAK'd as they come), then drop the
    /// subscription and NAK whatever is left.
    async fn finish(&self) {
        while !self.messages.ended.get() {
            let now = host::now_ms();
            let Some(deadline) = self.pull.borrow().as_ref().map(|p| p.deadline) else {
                break;
            };
            if deadline <= now {
                break;
            }
            let woken = self.messages.wake.notified();
            self.take_arrived(0).await;
            let wait = u32::try_from(deadline - now).unwrap_or(1_000);
            select(pin!(woken), pin!(host::sleep(wait))).await;
        }
        self.messages.unsubscribe.set();
        self.take_arrived(0).await;
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
        let messages = batch
            .into_iter()
            .map(|m| {
                let mut headers = Vec::new();
                codec::push_packed(&mut headers, &m.headers);
                (headers, m.body)
            })
            .collect();
        store(&config, &queue, messages).await
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
        // The headers a delivery is made of: the rest of a stored message's stay in the host.
        let keep = [codec::ATTEMPT, codec::NOT_BEFORE, codec::HEADERS];
        let (_, pulls) = client::subscribe_keeping(format!("{inbox}.*"), None, codec::names(&keep))
            .await
            .map_err(crate::nats_error)?;
        let messages = Rc::new(Inbox::default());
        wit_bindgen::spawn_local(messages.clone().read(queue.clone(), pulls));
        let generation = config.generation;
        let consumer = PullConsumer {
            config,
            queue,
            dlq,
            stream,
            inbox,
            messages,
            pull: RefCell::new(None),
            pulls: Cell::new(0),
            recreate: Cell::new(false),
            acks: Coalesce::default(),
        };
        let (tx, rx) = crate::wit_stream::new::<Delivery>();
        Ok((queue::start(consumer, opts.prefetch, generation, tx)?, rx))
    }

    wrpc_broker_guest::queue_forwarding_exports!();

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
