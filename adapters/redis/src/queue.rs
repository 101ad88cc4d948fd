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
//! writes the copy first: ack → `XACK` + `XDEL` (the acks of one `queue.settle` batch in one
//! script call); retry(d) → `ZADD` the copy (attempt + 1) due
//! at `TIME + d` (d = 0: `XADD` it); release → `XADD` a copy with the same attempt (back of the
//! queue); dead-letter → `XADD` to the dead-letter stream with `x-wrpc-dead-reason` and
//! `x-wrpc-attempt`. An entry no longer pending (reclaimed and settled elsewhere) is left alone.
//! The SDK's queue machinery tries a refused script again after 10, 20 and 40 ms; if it still
//! fails the message is handed back — made idle at once (`XCLAIM … IDLE`) so the next
//! `XAUTOCLAIM` sweep takes it — never moved past, and the consumer is unhealthy until a
//! settlement lands.

use std::cell::Cell;

use crate::exports::wrpc::broker::queue::{
    ConsumeOptions, ConsumerId, Delivery, Guest, Message, Settlement,
};
use crate::{
    Component, Reply, args, blocking, cmd, config, encode_headers, eval, headers_field, pipeline,
};
use wit_bindgen::StreamReader;
use wrpc_broker_guest::coalesce::Coalesce;
use wrpc_broker_guest::queue::{self, Copy, CopyTo, Received, tried};
use wrpc_broker_guest::signal::Latch;
use wrpc_broker_guest::{Error, Headers, Tag, headers, host};

wrpc_broker_guest::queue_conversions!(crate::exports::wrpc::broker::queue);

/// Settle one entry. KEYS: queue stream, target (stream or delayed set). ARGV: the marker
/// `wrpc-settle` (fault injection matches it), group, entry id, op (`copy`, `delay`; any other
/// only acks — plain acks go by [`ACK_ALL`]), body, headers, delay ms, member id. Returns 1 when the entry was pending, else 0.
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

/// Acknowledge several entries at once, as [`SETTLE`]'s `ack` does each: `XACK` them, then
/// `XDEL` them — one call of each per thousand ids, not two per entry. Deleting the ones that
/// were no longer pending too is the same: an entry leaves the group's pending list by a
/// settlement, which deletes it in the same script, or by being deleted (`XAUTOCLAIM` drops
/// deleted entries) — either way it is gone from the stream. KEYS:
/// queue stream. ARGV: the marker `wrpc-settle`, group, entry ids.
pub(crate) const ACK_ALL: &str = r#"
for i = 3, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  redis.call('XACK', KEYS[1], ARGV[2], unpack(ARGV, i, last))
  redis.call('XDEL', KEYS[1], unpack(ARGV, i, last))
end
return 1
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
/// How long a settle script keeps trying while the connection is down, in milliseconds.
const SETTLE_PATIENCE_MS: u64 = 5_000;

/// One consumer's side of Redis: a member of the queue's group.
struct GroupMember {
    /// The queue stream, its delayed set and the dead-letter stream.
    key: Vec<u8>,
    delayed: Vec<u8>,
    dlq: Vec<u8>,
    /// This group member's name.
    name: String,
    visibility_ms: u32,
    /// When the next look at the delayed set and the next `XAUTOCLAIM` sweep are due.
    next_move: Cell<u64>,
    next_claim: Cell<u64>,
    /// Sweep at the next receive (a delivery was handed back).
    claim_now: Cell<bool>,
    /// Acks waiting to go to the server together (see [`GroupMember::ack`]).
    acks: Coalesce<Vec<u8>, Result<(), Error>>,
}

/// Create the group (from the start of the stream, creating the stream); existing is fine.
async fn ensure_group(key: &[u8]) -> Result<(), Error> {
    match cmd(args!["XGROUP", "CREATE", key, GROUP, "0", "MKSTREAM"]).await {
        Err(Error::Internal(m)) if m.contains("BUSYGROUP") => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Stream entries `[[id, [field, value, …]], …]` as deliveries to hold; deleted ones skipped.
fn stored(entries: &[Reply]) -> Vec<Received<Vec<u8>>> {
    entries
        .iter()
        .filter_map(|raw| {
            let parts = raw.array();
            let id = parts.first()?.bytes()?.to_vec();
            let fields = parts.get(1)?;
            if fields.array().is_empty() {
                return None;
            }
            let headers: Headers = headers_field(fields.field("h").and_then(Reply::bytes));
            Some(Received {
                handle: id,
                body: fields
                    .field("b")
                    .and_then(Reply::bytes)
                    .unwrap_or_default()
                    .to_vec(),
                attempt: headers::attempt(&headers),
                headers: headers::without_attempt(headers),
            })
        })
        .collect()
}

impl GroupMember {
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
    async fn claim(&self, room: u32) -> Result<Vec<Received<Vec<u8>>>, Error> {
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
        let reply = cmd(call).await?;
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
        Ok(claimed)
    }

    /// New entries for this member, blocking at most until the next look at the delayed set.
    async fn read(&self, room: u32) -> Result<Vec<Received<Vec<u8>>>, Error> {
        let block = self
            .next_move
            .get()
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
        let reply = blocking(call).await?;
        let mut batch = Vec::new();
        for stream in reply.array() {
            if let Some(entries) = stream.array().get(1) {
                batch.extend(stored(entries.array()));
            }
        }
        Ok(batch)
    }

    /// A failed read: a group lost with the server's data is created again.
    async fn note_read_error(&self, e: &Error) {
        if let Error::Internal(m) = e
            && m.contains("NOGROUP")
        {
            wrpc_broker_guest::info!(
                "queue group missing (server restarted empty?); creating it again"
            );
            let _ = ensure_group(&self.key).await;
        }
    }

    /// One settle script call (see [`SETTLE`]): acknowledge `held` and write its copy (these
    /// headers; `delay` ms for `delay`) to `target` in the same step. Plain acks go by
    /// [`Self::ack_all`].
    async fn script(
        &self,
        held: &Received<Vec<u8>>,
        target: &[u8],
        op: &str,
        (headers, delay): (Headers, u32),
    ) -> Result<(), Error> {
        let argv = args![
            "wrpc-settle",
            GROUP,
            &held.handle,
            op,
            held.body.clone(),
            encode_headers(&headers),
            delay,
            host::generate_id()
        ];
        let keys = vec![self.key.clone(), target.to_vec()];
        settle_script(SETTLE, keys, argv).await
    }

    /// One [`ACK_ALL`] script call for `ids`; like [`Self::script`], safe to repeat.
    async fn ack_all(&self, ids: Vec<Vec<u8>>) -> Result<(), Error> {
        let mut argv = args!["wrpc-settle", GROUP];
        argv.extend(ids);
        settle_script(ACK_ALL, vec![self.key.clone()], argv).await
    }
}

/// Call a settle script, again every 100 ms while the connection is down (for up to
/// [`SETTLE_PATIENCE_MS`]): each is safe to repeat (an entry already acked is left alone).
async fn settle_script(
    body: &'static str,
    keys: Vec<Vec<u8>>,
    argv: Vec<Vec<u8>>,
) -> Result<(), Error> {
    let deadline = host::now_ms() + SETTLE_PATIENCE_MS;
    loop {
        match eval(body, keys.clone(), argv.clone()).await {
            Ok(_) => return Ok(()),
            Err(e) if crate::is_connection_lost(&e) && host::now_ms() < deadline => {
                host::sleep(100).await
            }
            Err(e) => return Err(e),
        }
    }
}

impl queue::Broker for GroupMember {
    /// Each delivery is settled on its own; a batch's calls may overlap.
    const CONCURRENT_SETTLES: bool = true;

    /// The stream entry id.
    type Handle = Vec<u8>;

    fn keep_alive_ms(&self) -> u32 {
        (self.visibility_ms / 3).max(10)
    }

    async fn receive(&self, room: u32, _stop: &Latch) -> Result<Vec<Received<Vec<u8>>>, Error> {
        let now = host::now_ms();
        if now >= self.next_move.get() {
            self.next_move.set(host::now_ms() + self.move_due().await);
        }
        if now >= self.next_claim.get() || self.claim_now.replace(false) {
            let claim_every = u64::from(self.visibility_ms / 2).clamp(10, 5_000);
            self.next_claim.set(now + claim_every);
            let claimed = self.claim(room).await;
            match claimed {
                Ok(claimed) if claimed.is_empty() => {}
                Ok(claimed) => return Ok(claimed),
                Err(e) => {
                    self.note_read_error(&e).await;
                    return Err(e);
                }
            }
        }
        match self.read(room).await {
            Ok(batch) => Ok(batch),
            Err(e) => {
                self.note_read_error(&e).await;
                Err(e)
            }
        }
    }

    /// Reset the idle time of every delivery held (`XCLAIM … JUSTID`), so nobody reclaims it.
    async fn extend(&self, held: Vec<Vec<u8>>) {
        let mut call = args!["XCLAIM", &self.key, GROUP, &self.name, "0"];
        call.extend(held);
        call.push(b"JUSTID".to_vec());
        let _ = cmd(call).await;
    }

    /// The acks of one `queue.settle` batch (its settlements run together) go as one script
    /// call: the first to arrive lets the others of its batch join, then sends them all.
    async fn ack(&self, held: &Received<Vec<u8>>) -> Result<(), Error> {
        let all = |ids: Vec<Vec<u8>>| async move {
            let count = ids.len();
            vec![self.ack_all(ids).await; count]
        };
        self.acks
            .call(held.handle.clone(), all)
            .await
            .unwrap_or_else(|| Err(Error::internal("an ack's script call was dropped")))
    }

    async fn copy_then_ack(&self, held: &Received<Vec<u8>>, copy: Copy<'_>) -> Result<(), Error> {
        let headers = headers::with_attempt(copy.headers.clone(), copy.attempt);
        let (target, op) = match copy.to {
            CopyTo::DeadLetter => (&self.dlq, "copy"),
            CopyTo::Queue if copy.delay_ms == 0 => (&self.key, "copy"),
            CopyTo::Queue => (&self.delayed, "delay"),
        };
        let copy = (headers, copy.delay_ms);
        tried(|| self.script(held, target, op, copy.clone())).await
    }

    /// A copy with the same attempt at the back of the queue, in the same step as the ack.
    async fn release(&self, held: &Received<Vec<u8>>) -> Result<(), Error> {
        let headers = headers::with_attempt(held.headers.clone(), held.attempt);
        self.script(held, &self.key, "copy", (headers, 0)).await
    }

    /// Make the entry claimable at once: idle as long as the visibility, so the next sweep (of
    /// any consumer, this one included) takes it.
    async fn hand_back(&self, held: &Received<Vec<u8>>) {
        let call = args![
            "XCLAIM",
            &self.key,
            GROUP,
            &self.name,
            "0",
            &held.handle,
            "IDLE",
            self.visibility_ms,
            "JUSTID"
        ];
        let _ = cmd(call).await;
        self.claim_now.set(true);
    }

    /// Leave the group if nothing is pending for this member.
    async fn finish(&self) {
        let _ = eval(
            FORGET_CONSUMER,
            vec![self.key.clone()],
            args![GROUP, &self.name],
        )
        .await;
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
        let now = host::now_ms();
        let member = GroupMember {
            delayed: config.key("qd", &queue)?,
            dlq: config.key("q", &dlq)?,
            key,
            name: wrpc_broker_guest::ids::generate(),
            visibility_ms: config.visibility_ms,
            next_move: Cell::new(now),
            next_claim: Cell::new(now),
            claim_now: Cell::new(false),
            acks: Coalesce::default(),
        };
        let (tx, rx) = crate::wit_stream::new::<Delivery>();
        Ok((
            queue::start(member, opts.prefetch, config.generation, tx)?,
            rx,
        ))
    }

    wrpc_broker_guest::queue_forwarding_exports!();

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
