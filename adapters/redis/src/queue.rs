//! `wrpc:broker/queue` on a Redis stream and consumer group: queue `q` is the stream
//! `{P}:q:<q>` (fields `b` body, `h` headers with the attempt in `x-wrpc-attempt`; absent = 1)
//! read by the group `wrpc`; each consumer is a group member named by `host.generate-id`.
//!
//! A consumer reads new entries with `XREADGROUP … BLOCK` (at most `prefetch` unsettled),
//! reclaims entries another consumer left idle longer than `queue.visibilityMs` with
//! `XAUTOCLAIM`, keeps the ones it holds alive with `XCLAIM … JUSTID` every third of that (so a
//! slow handler is not duplicated), and moves due delayed retries from the sorted set
//! `{P}:qd:<q>` back onto the stream with a Lua script (`ZREM` + `XADD`, one clock: `TIME`).
//!
//! Every settlement is one Lua script that acknowledges the entry and, in the same atomic step,
//! writes the copy first: ack → `XACK` + `XDEL`; retry(d) → `ZADD` the copy (attempt + 1) due
//! at `TIME + d` (d = 0: `XADD` it); release → `XADD` a copy with the same attempt (back of the
//! queue); dead-letter → `XADD` to the dead-letter stream with `x-wrpc-dead-reason` and
//! `x-wrpc-attempt`. An entry no longer pending (reclaimed and settled elsewhere) is left alone.
//! A refused script is tried again after 10, 20 and 40 ms; if it still fails the message is
//! handed back — made idle at once (`XCLAIM … IDLE`) so the next `XAUTOCLAIM` sweep takes it —
//! never moved past, and the consumer is unhealthy until a settlement lands.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::pin::pin;
use std::rc::Rc;

use crate::exports::wrpc::broker::queue::{
    ConsumeOptions, ConsumerId, Delivery, Guest, Message, Settlement,
};
use crate::{
    Component, Reply, args, blocking, cmd, config, encode_headers, eval, headers_field, pipeline,
};
use futures::future::{Either, select};
use wit_bindgen::{StreamReader, StreamWriter};
use wrpc_broker_guest::signal::{Latch, Notify};
use wrpc_broker_guest::{Error, Headers, Tag, headers, host};

/// Settle one entry. KEYS: queue stream, target (stream or delayed set). ARGV: the marker
/// `wrpc-settle` (fault injection matches it), group, entry id, op (`ack`, `copy`, `delay`),
/// body, headers, delay ms, member id. Returns 1 when the entry was pending, else 0.
pub(crate) const SETTLE: &str = r#"
local acked = redis.call('XACK', KEYS[1], ARGV[2], ARGV[3])
if acked == 1 then
  if ARGV[4] == 'copy' then
    redis.call('XADD', KEYS[2], '*', 'b', ARGV[5], 'h', ARGV[6])
  elseif ARGV[4] == 'delay' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[7]), cmsgpack.pack(ARGV[8], ARGV[5], ARGV[6]))
  end
  redis.call('XDEL', KEYS[1], ARGV[3])
end
return acked
"#;

/// Move due delayed retries onto the stream. KEYS: delayed set, stream. ARGV: most to move.
/// Returns milliseconds until the next one is due (0: call again now), or -1 when none waits.
pub(crate) const MOVE_DUE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, m in ipairs(due) do
  if redis.call('ZREM', KEYS[1], m) == 1 then
    local _, b, h = cmsgpack.unpack(m)
    redis.call('XADD', KEYS[2], '*', 'b', b, 'h', h)
  end
end
if #due >= tonumber(ARGV[1]) then return 0 end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nxt == 0 then return -1 end
return math.max(0, tonumber(nxt[2]) - now)
"#;

/// Remove a consumer from the group if nothing is pending for it. KEYS: stream. ARGV: group,
/// consumer.
pub(crate) const FORGET_CONSUMER: &str = r#"
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #p == 0 then return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2]) end
return -1
"#;

/// The consumer group of every queue.
const GROUP: &str = "wrpc";
/// How long one `XREADGROUP` blocks, in milliseconds (also the longest a stop waits for it).
const READ_BLOCK_MS: u64 = 250;
/// The longest pause between two looks at the delayed set, in milliseconds.
const MOVER_MAX_MS: u64 = 200;
/// Delayed retries moved per script call at most.
const MOVE_BATCH: u32 = 256;
/// The pauses before each new try of a refused settlement, in milliseconds.
const REFUSED_BACKOFF_MS: [u32; 3] = [10, 20, 40];
/// How long a settle call keeps trying while the connection is down, in milliseconds.
const SETTLE_PATIENCE_MS: u64 = 5_000;

/// A delivery the consumer holds and nobody has settled yet.
#[derive(Clone)]
struct Held {
    /// The stream entry id.
    id: Vec<u8>,
    body: Vec<u8>,
    /// The stored headers, `x-wrpc-attempt` included.
    headers: Headers,
}

/// The mutable part of a consumer.
struct Ledger {
    unsettled: BTreeMap<u64, Held>,
    /// Taken out of `unsettled` by a settle in progress; still counted against the prefetch.
    settling: usize,
    /// False since a settlement failed, until one lands.
    settled_ok: bool,
    /// False while reading fails (connection lost, missing group).
    reading_ok: bool,
}

/// A live consumer.
struct Consumer {
    /// The queue stream, its delayed set and the dead-letter stream.
    key: Vec<u8>,
    delayed: Vec<u8>,
    dlq: Vec<u8>,
    /// This group member's name.
    name: String,
    prefetch: u32,
    visibility_ms: u32,
    generation: u32,
    ledger: RefCell<Ledger>,
    /// Run an `XAUTOCLAIM` sweep at the next turn (a delivery was handed back).
    claim_now: Cell<bool>,
    stop: Latch,
    ended: Latch,
    /// Fires when a delivery leaves the ledger or a sweep is asked for.
    settled: Notify,
}

thread_local! {
    static CONSUMERS: RefCell<BTreeMap<ConsumerId, Rc<Consumer>>> = const { RefCell::new(BTreeMap::new()) };
    static NEXT_ID: Cell<ConsumerId> = const { Cell::new(1) };
    static NEXT_SEQ: Cell<u64> = const { Cell::new(1) };
}

fn consumer(id: ConsumerId) -> Option<Rc<Consumer>> {
    CONSUMERS.with_borrow(|m| m.get(&id).cloned())
}

/// Stop every live consumer (`close`).
pub(crate) async fn stop_all() {
    let ids: Vec<ConsumerId> = CONSUMERS.with_borrow(|m| m.keys().copied().collect());
    for id in ids {
        <Component as Guest>::stop(id).await;
    }
}

/// Create the group (from the start of the stream, creating the stream); existing is fine.
async fn ensure_group(key: &[u8]) -> Result<(), Error> {
    match cmd(args!["XGROUP", "CREATE", key, GROUP, "0", "MKSTREAM"]).await {
        Err(Error::Internal(m)) if m.contains("BUSYGROUP") => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Stream entries `[[id, [field, value, …]], …]` as (id, body, headers); deleted ones skipped.
fn stored(entries: &[Reply]) -> Vec<Held> {
    entries
        .iter()
        .filter_map(|raw| {
            let parts = raw.array();
            let id = parts.first()?.bytes()?.to_vec();
            let fields = parts.get(1)?;
            if fields.array().is_empty() {
                return None;
            }
            Some(Held {
                id,
                body: fields
                    .field("b")
                    .and_then(Reply::bytes)
                    .unwrap_or_default()
                    .to_vec(),
                headers: headers_field(fields.field("h").and_then(Reply::bytes)),
            })
        })
        .collect()
}

impl Consumer {
    fn room(&self) -> u32 {
        let ledger = self.ledger.borrow();
        let held = ledger.unsettled.len() + ledger.settling;
        self.prefetch
            .saturating_sub(u32::try_from(held).unwrap_or(u32::MAX))
    }

    fn hold(&self, held: Held) -> Delivery {
        let seq = NEXT_SEQ.replace(NEXT_SEQ.get() + 1);
        let delivery = Delivery {
            tag: Tag {
                generation: self.generation,
                seq,
            },
            body: held.body.clone(),
            headers: headers::without_attempt(held.headers.clone()),
            attempt: headers::attempt(&held.headers),
        };
        self.ledger.borrow_mut().unsettled.insert(seq, held);
        delivery
    }

    fn set_reading(&self, ok: bool) {
        self.ledger.borrow_mut().reading_ok = ok;
    }

    /// Move due delayed retries; milliseconds until the next look.
    async fn move_due(&self) -> u64 {
        match eval(
            MOVE_DUE,
            vec![self.delayed.clone(), self.key.clone()],
            args![MOVE_BATCH],
        )
        .await
        {
            Ok(reply) => match reply.int() {
                Some(ms) if ms >= 0 => (ms as u64).min(MOVER_MAX_MS),
                _ => MOVER_MAX_MS,
            },
            Err(_) => MOVER_MAX_MS,
        }
    }

    /// Reclaim up to `room` entries idle longer than the visibility (any consumer's).
    async fn claim(&self, room: u32) -> Vec<Held> {
        let call = args![
            "XAUTOCLAIM",
            &self.key,
            GROUP,
            &self.name,
            self.visibility_ms,
            "0-0",
            "COUNT",
            room
        ];
        match cmd(call).await {
            Ok(reply) => {
                let parts = reply.array();
                let claimed = parts.get(1).map(|r| stored(r.array())).unwrap_or_default();
                // Entries deleted while pending: nothing to deliver, just forget them.
                let deleted: Vec<Vec<u8>> = parts
                    .get(2)
                    .map(|r| {
                        r.array()
                            .iter()
                            .filter_map(|d| d.bytes().map(<[u8]>::to_vec))
                            .collect()
                    })
                    .unwrap_or_default();
                if !deleted.is_empty() {
                    let mut ack = args!["XACK", &self.key, GROUP];
                    ack.extend(deleted);
                    let _ = cmd(ack).await;
                }
                if !claimed.is_empty() {
                    wrpc_broker_guest::debug!("reclaimed {} idle deliveries", claimed.len());
                }
                claimed
            }
            Err(e) => {
                self.note_read_error(&e).await;
                Vec::new()
            }
        }
    }

    /// Reset the idle time of every delivery held, so nobody reclaims it.
    async fn refresh(&self) {
        let ids: Vec<Vec<u8>> = self
            .ledger
            .borrow()
            .unsettled
            .values()
            .map(|h| h.id.clone())
            .collect();
        if ids.is_empty() {
            return;
        }
        let mut call = args!["XCLAIM", &self.key, GROUP, &self.name, "0"];
        call.extend(ids);
        call.push(b"JUSTID".to_vec());
        let _ = cmd(call).await;
    }

    async fn note_read_error(&self, e: &Error) {
        self.set_reading(false);
        if let Error::Internal(m) = e
            && m.contains("NOGROUP")
        {
            wrpc_broker_guest::info!(
                "queue group missing (server restarted empty?); creating it again"
            );
            let _ = ensure_group(&self.key).await;
        }
    }

    /// Read, reclaim, refresh and move until stopped or the host drops the stream; then hand
    /// back what is unsettled.
    async fn pump(self: Rc<Self>, mut to: StreamWriter<Delivery>) {
        let refresh_every = u64::from(self.visibility_ms / 3).max(10);
        let claim_every = u64::from(self.visibility_ms / 2).clamp(10, 5_000);
        let now = host::now_ms();
        let (mut next_move, mut next_claim, mut next_refresh) = (now, now, now + refresh_every);
        while !self.stop.is_set() {
            let now = host::now_ms();
            if now >= next_move {
                next_move = host::now_ms() + self.move_due().await;
            }
            if now >= next_refresh {
                self.refresh().await;
                next_refresh = now + refresh_every;
            }
            let mut batch = Vec::new();
            let room = self.room();
            if room > 0 && (now >= next_claim || self.claim_now.replace(false)) {
                batch.extend(self.claim(room).await);
                next_claim = now + claim_every;
            }
            let room = room.saturating_sub(batch.len() as u32);
            if batch.is_empty() && room > 0 {
                let block = next_move
                    .saturating_sub(host::now_ms())
                    .clamp(1, READ_BLOCK_MS);
                let call = args![
                    "XREADGROUP",
                    "GROUP",
                    GROUP,
                    &self.name,
                    "COUNT",
                    room,
                    "BLOCK",
                    block,
                    "STREAMS",
                    &self.key,
                    ">"
                ];
                match blocking(call).await {
                    Ok(reply) => {
                        self.set_reading(true);
                        for stream in reply.array() {
                            if let Some(entries) = stream.array().get(1) {
                                batch.extend(stored(entries.array()));
                            }
                        }
                    }
                    Err(e) => {
                        self.note_read_error(&e).await;
                        host::sleep(100).await;
                    }
                }
            } else if batch.is_empty() {
                let wait = next_move
                    .min(next_refresh)
                    .saturating_sub(host::now_ms())
                    .clamp(1, READ_BLOCK_MS);
                let settled = pin!(self.settled.notified());
                let tick = pin!(host::sleep(wait as u32));
                select(settled, select(tick, pin!(self.stop.wait()))).await;
                continue;
            }
            if batch.is_empty() {
                continue;
            }
            let deliveries: Vec<Delivery> = batch.into_iter().map(|h| self.hold(h)).collect();
            if self.stop.is_set() {
                break;
            }
            let write = pin!(to.write_all(deliveries));
            match select(write, pin!(self.stop.wait())).await {
                Either::Left((unsent, _)) if unsent.is_empty() => {}
                _ => break,
            }
        }
        drop(to);
        self.stop.set();
        self.release_all().await;
        let _ = eval(
            FORGET_CONSUMER,
            vec![self.key.clone()],
            args![GROUP, &self.name],
        )
        .await;
        self.ended.set();
    }

    /// Put every unsettled delivery back on the queue (a copy with the same attempt); one that
    /// cannot be copied is handed back for reclaiming.
    async fn release_all(&self) {
        let unsettled = std::mem::take(&mut self.ledger.borrow_mut().unsettled);
        for held in unsettled.into_values() {
            let id = held.id.clone();
            if self.apply(held, Settlement::Release).await.is_err() {
                self.hand_back(&id).await;
            }
        }
    }

    /// Make an entry claimable at once: idle as long as the visibility, so the next sweep (of
    /// any consumer, this one included) takes it.
    async fn hand_back(&self, id: &[u8]) {
        let call = args![
            "XCLAIM",
            &self.key,
            GROUP,
            &self.name,
            "0",
            id,
            "IDLE",
            self.visibility_ms,
            "JUSTID"
        ];
        let _ = cmd(call).await;
        self.claim_now.set(true);
        self.settled.notify();
    }

    /// The settle script of one settlement.
    async fn apply(&self, held: Held, settlement: Settlement) -> Result<(), Error> {
        let attempt = headers::attempt(&held.headers);
        let (target, op, copy_headers, delay) = match settlement {
            Settlement::Ack => (self.key.clone(), "ack", Vec::new(), 0),
            Settlement::Retry(0) => (
                self.key.clone(),
                "copy",
                headers::with_attempt(held.headers, attempt + 1),
                0,
            ),
            Settlement::Retry(d) => (
                self.delayed.clone(),
                "delay",
                headers::with_attempt(held.headers, attempt + 1),
                d,
            ),
            Settlement::Release => (self.key.clone(), "copy", held.headers, 0),
            Settlement::DeadLetter(reason) => (
                self.dlq.clone(),
                "copy",
                headers::dead_letter(held.headers, &reason, attempt),
                0,
            ),
        };
        let body = if op == "ack" { Vec::new() } else { held.body };
        let argv = args![
            "wrpc-settle",
            GROUP,
            held.id,
            op,
            body,
            encode_headers(&copy_headers),
            delay,
            host::generate_id()
        ];
        let keys = vec![self.key.clone(), target];
        let deadline = host::now_ms() + SETTLE_PATIENCE_MS;
        let mut backoff = REFUSED_BACKOFF_MS.iter();
        loop {
            match eval(SETTLE, keys.clone(), argv.clone()).await {
                Ok(_) => return Ok(()),
                Err(Error::Refused(m)) => match backoff.next() {
                    Some(pause) => host::sleep(*pause).await,
                    None => return Err(Error::Refused(m)),
                },
                // The script is safe to repeat: an entry already acked is left alone.
                Err(e) if crate::is_connection_lost(&e) && host::now_ms() < deadline => {
                    host::sleep(100).await
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn settle(&self, tag: Tag, settlement: Settlement) -> Result<(), Error> {
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
        let id = held.id.clone();
        let answer = self.apply(held, settlement).await;
        if answer.is_err() {
            self.hand_back(&id).await;
        }
        {
            let mut ledger = self.ledger.borrow_mut();
            ledger.settling -= 1;
            ledger.settled_ok = answer.is_ok();
        }
        self.settled.notify();
        if let Err(e) = &answer {
            wrpc_broker_guest::warn!(
                "settle failed after {} tries ({e:?}); message handed back",
                REFUSED_BACKOFF_MS.len() + 1
            );
        }
        answer
    }
}

impl Guest for Component {
    async fn produce(queue: String, batch: Vec<Message>) -> Result<(), Error> {
        let key = config()?.key("q", &queue)?;
        if batch.is_empty() {
            return Ok(());
        }
        let commands = batch
            .into_iter()
            .map(|m| {
                args![
                    "XADD",
                    &key,
                    "*",
                    "b",
                    m.body,
                    "h",
                    encode_headers(&m.headers)
                ]
            })
            .collect();
        for reply in pipeline(commands).await? {
            if let Reply::Error(e) = reply {
                return Err(Error::internal(format!("XADD: {e}")));
            }
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
        let key = config.key("q", &queue)?;
        ensure_group(&key).await?;
        let consumer = Rc::new(Consumer {
            delayed: config.key("qd", &queue)?,
            dlq: config.key("q", &dlq)?,
            key,
            name: wrpc_broker_guest::ids::generate(),
            prefetch: opts.prefetch,
            visibility_ms: config.visibility_ms,
            generation: config.generation,
            ledger: RefCell::new(Ledger {
                unsettled: BTreeMap::new(),
                settling: 0,
                settled_ok: true,
                reading_ok: true,
            }),
            claim_now: Cell::new(false),
            stop: Latch::new(),
            ended: Latch::new(),
            settled: Notify::new(),
        });
        let id = NEXT_ID.replace(NEXT_ID.get() + 1);
        CONSUMERS.with_borrow_mut(|m| m.insert(id, consumer.clone()));
        let (tx, rx) = crate::wit_stream::new::<Delivery>();
        wit_bindgen::spawn_local(consumer.pump(tx));
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
        consumer(consumer_id).map(|c| {
            let ledger = c.ledger.borrow();
            ledger.settled_ok && ledger.reading_ok
        })
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
        // Acknowledged entries are deleted, so the stream holds exactly the waiting and the
        // unsettled ones; delayed retries wait in the sorted set.
        let config = config()?;
        let (stream, delayed) = (config.key("q", &queue)?, config.key("qd", &queue)?);
        let replies = pipeline(vec![args!["XLEN", &stream], args!["ZCARD", &delayed]]).await?;
        let mut depth = 0u64;
        for reply in &replies {
            match reply {
                Reply::Int(n) => depth += *n as u64,
                other => return Err(Error::internal(format!("XLEN/ZCARD answered {other:?}"))),
            }
        }
        Ok(depth)
    }
}
