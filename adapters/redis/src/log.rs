//! `wrpc:broker/log` on Redis Streams: topic `t` is the stream `{P}:log:<t>`, whose entries
//! have ids `0-<n>` (`XADD … 0-*`: explicit millisecond 0, server-assigned sequence), so `n` is
//! dense from 1 and is the entry's position (partition 0). Fields: `v` value, `h` headers
//! (length-prefixed pairs), `k` key (only when there is one) — plain `XRANGE` readers see them.
//!
//! An id is `<epoch>:<n>`. The epoch (`{P}:loge:<t>`) is minted by the append script when it
//! creates the stream, so a recreated stream or another topic never accepts a foreign id: 410.
//! Retention is `MAXLEN = retention.maxEntries` (exact, so the contract "older trimmed" holds to
//! the entry). `after(n)` is 410 when entry `n + 1` was trimmed (below the first retained entry
//! or `max-deleted-entry-id`, from `XINFO STREAM`), 400 when `n` is past
//! `last-generated-id`. Info and page come from one script, so they agree.
//!
//! Live reads: every tail of this instance joins one reader task that issues a single
//! multi-key `XREAD BLOCK` for all of them on the driver's blocking connection. A new tail
//! cancels the read in flight (the driver discards that connection) so it joins at once. A tail
//! whose next entry was trimmed or whose buffer overflows ends; the host re-joins it with
//! `range`. A lost connection does not end the tails: their positions are in Redis, so the
//! reader resumes after the driver reconnected — unless the stream's epoch changed meanwhile
//! (the server came back without its data), which ends them.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::pin::pin;
use std::rc::Rc;

use crate::exports::wrpc::broker::log::{Entry, Guest, Page, RecordIn};
use crate::{Component, Config, Reply, args, blocking, config, eval, headers_field, patiently};
use futures::future::{Either, select};
use wit_bindgen::{StreamReader, StreamWriter};
use wrpc_broker_guest::ids;
use wrpc_broker_guest::signal::{Latch, Notify};
use wrpc_broker_guest::{Error, Position, Start};

/// Append records; create the stream's epoch with the stream. KEYS: stream, epoch key.
/// ARGV: new epoch, maxlen, then per record value, headers, has-key (`0`/`1`), key.
pub(crate) const APPEND: &str = include_str!("../scripts/append.lua");

/// The state of a stream and a page of it, atomically. KEYS: stream, epoch key. ARGV: start
/// (`-` or `(0-n`), count (0: state only). Returns {epoch, last-generated-id,
/// max-deleted-entry-id, first entry id, entries} or {false} when there is no stream.
pub(crate) const RANGE: &str = include_str!("../scripts/range.lua");

/// Entries a live read takes per `XREAD`.
const READ_COUNT: u32 = 1024;
/// How long one `XREAD` blocks, in milliseconds.
const BLOCK_MS: u32 = 2000;
/// Entries a tail buffers for its stream before it ends (the host then reads pages).
const TAIL_BUFFER: usize = 8192;

/// Split an id `<epoch>:<n>` (n a canonical decimal ≥ 1); anything else is a bad request.
fn parse(id: &str) -> Result<(&str, u64), Error> {
    match ids::parse_log_id(id, "n")? {
        (_, 0) => Err(Error::bad_request(format!(
            "malformed id `{id}`: expected `epoch:n`"
        ))),
        parsed => Ok(parsed),
    }
}

/// The sequence of a stream id `0-<n>`.
fn seq(id: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(id).ok()?;
    let (ms, seq) = text.split_once('-')?;
    (ms == "0").then_some(())?;
    seq.parse().ok()
}

/// The state of a topic's stream.
struct State {
    /// `None` when there is no stream yet.
    epoch: Option<String>,
    /// The last sequence ever assigned (0: none).
    last: u64,
    /// Every sequence up to this one was trimmed.
    floor: u64,
}

/// Read the state (and a page from `start`, up to `count`) of `topic`.
async fn read(
    config: &Config,
    topic: &str,
    start: &str,
    count: u32,
) -> Result<(State, Vec<Reply>), Error> {
    let keys = vec![config.key("log", topic)?, config.key("loge", topic)?];
    let reply = patiently(|| eval(RANGE, keys.clone(), args![start, count])).await?;
    let mut parts = reply.into_array().into_iter();
    let epoch = parts.next().and_then(|e| e.text().map(str::to_string));
    let Some(epoch) = epoch else {
        return Ok((
            State {
                epoch: None,
                last: 0,
                floor: 0,
            },
            Vec::new(),
        ));
    };
    let bad = || Error::internal(format!("log `{topic}`: the stream does not hold `0-n` ids"));
    let last = parts
        .next()
        .and_then(|r| r.bytes().and_then(seq))
        .ok_or_else(bad)?;
    let deleted = parts
        .next()
        .and_then(|r| r.bytes().and_then(seq))
        .unwrap_or(0);
    let first = parts.next().and_then(|r| r.bytes().and_then(seq));
    let entries = parts.next().map(Reply::into_array).unwrap_or_default();
    // Trimming moves the first entry; XDEL moves max-deleted-entry-id.
    let floor = deleted.max(first.map_or(last, |f| f - 1));
    Ok((
        State {
            epoch: Some(epoch),
            last,
            floor,
        },
        entries,
    ))
}

/// The first sequence a read from `origin` yields, checked against the stream's state.
fn start_seq(state: &State, origin: &Start) -> Result<u64, Error> {
    let id = match origin {
        Start::Earliest => return Ok(state.floor + 1),
        Start::Latest => return Ok(state.last + 1),
        Start::After(id) => id,
    };
    let (epoch, n) = parse(id)?;
    match &state.epoch {
        Some(e) if e == epoch => {}
        Some(e) => {
            return Err(Error::gone(format!(
                "id `{id}` was minted by another log (epoch {epoch}, this log has {e})"
            )));
        }
        None => {
            return Err(Error::gone(format!(
                "id `{id}`: this log has no entries (another log minted it)"
            )));
        }
    }
    if n > state.last {
        return Err(Error::bad_request(format!(
            "id `{id}` is past the tip (last entry {})",
            state.last
        )));
    }
    if n < state.floor {
        return Err(Error::gone(format!(
            "id `{id}` is older than the retained history (entries up to {} were trimmed)",
            state.floor
        )));
    }
    Ok(n + 1)
}

/// A stream entry `[id, [field, value, …]]` as a log entry.
fn entry(epoch: &str, raw: &Reply) -> Option<Entry> {
    let parts = raw.array();
    let n = seq(parts.first()?.bytes()?)?;
    let fields = parts.get(1)?;
    Some(Entry {
        id: wrpc_broker_guest::ids::log_id(epoch, n),
        pos: Position {
            partition: 0,
            offset: n,
        },
        value: fields
            .field("v")
            .and_then(Reply::bytes)
            .unwrap_or_default()
            .to_vec(),
        headers: headers_field(fields.field("h").and_then(Reply::bytes)),
        key: fields.field("k").and_then(Reply::bytes).map(<[u8]>::to_vec),
    })
}

// ------------------------------------------------------------------------------ live reads

/// One live read.
struct Tail {
    key: Vec<u8>,
    /// The epoch key of the topic (read when the stream did not exist at the start).
    epoch_key: Vec<u8>,
    /// The stream's epoch; empty until known.
    epoch: RefCell<String>,
    /// The sequence of the next entry this tail yields.
    next: Cell<u64>,
    /// Entries read, waiting for the stream.
    buffer: RefCell<VecDeque<Entry>>,
    /// Fires when entries were buffered.
    wake: Notify,
    /// Set when the tail must end (after its buffer drained) or its stream was dropped.
    end: Latch,
}

impl Tail {
    /// Take the entries of one `XREAD` batch for this key.
    fn offer(&self, entries: &[Reply]) {
        let mut taken = 0;
        let epoch = self.epoch.borrow().clone();
        for raw in entries {
            let Some(e) = entry(&epoch, raw) else {
                continue;
            };
            let next = self.next.get();
            if e.pos.offset < next {
                continue;
            }
            if e.pos.offset > next {
                wrpc_broker_guest::debug!(
                    "log tail: entry {next} was trimmed before it was read; ending the tail"
                );
                self.end.set();
                break;
            }
            self.next.set(next + 1);
            self.buffer.borrow_mut().push_back(e);
            taken += 1;
        }
        if self.buffer.borrow().len() > TAIL_BUFFER {
            self.end.set();
        }
        if taken > 0 {
            self.wake.notify();
        }
    }

    /// Move buffered entries to the stream until the tail ends or the host drops it.
    async fn pump(self: Rc<Self>, mut to: StreamWriter<Entry>) {
        loop {
            let woken = self.wake.notified();
            let batch: Vec<Entry> = self.buffer.borrow_mut().drain(..).collect();
            if !batch.is_empty() {
                if !to.write_all(batch).await.is_empty() {
                    self.end.set();
                    return;
                }
                continue;
            }
            if self.end.is_set() {
                return;
            }
            select(pin!(woken), pin!(self.end.wait())).await;
        }
    }
}

thread_local! {
    /// Live tails by id.
    static TAILS: RefCell<BTreeMap<u64, Rc<Tail>>> = const { RefCell::new(BTreeMap::new()) };
    static NEXT_TAIL: Cell<u64> = const { Cell::new(1) };
    /// Fires when a tail joins.
    static JOINED: Notify = Notify::new();
    /// Whether the reader task runs.
    static READING: Cell<bool> = const { Cell::new(false) };
}

/// End every tail (`close`).
pub(crate) fn stop_all() {
    TAILS.with_borrow_mut(|tails| {
        for tail in tails.values() {
            tail.end.set();
        }
        tails.clear();
    });
}

/// The instance's one reader: a multi-key `XREAD BLOCK` over every live tail, until none is
/// left.
async fn reader() {
    let recheck = Cell::new(false);
    loop {
        if recheck.get() && !epochs_hold().await {
            wrpc_broker_guest::sleep(100).await;
            continue;
        }
        recheck.set(false);
        let tails: Vec<Rc<Tail>> = TAILS.with_borrow_mut(|tails| {
            tails.retain(|_, t| !t.end.is_set());
            tails.values().cloned().collect()
        });
        if tails.is_empty() {
            READING.set(false);
            return;
        }
        // Per key, read after the smallest position any tail on it still needs.
        let mut keys: BTreeMap<&[u8], u64> = BTreeMap::new();
        for t in &tails {
            let after = t.next.get() - 1;
            keys.entry(&t.key)
                .and_modify(|a| *a = (*a).min(after))
                .or_insert(after);
        }
        let mut call = args!["XREAD", "COUNT", READ_COUNT, "BLOCK", BLOCK_MS, "STREAMS"];
        call.extend(keys.keys().map(|k| k.to_vec()));
        call.extend(keys.values().map(|a| format!("0-{a}").into_bytes()));
        let signal = JOINED.with(Notify::clone);
        let joined = signal.notified();
        let read = match select(pin!(blocking(call)), pin!(joined)).await {
            Either::Left((read, _)) => read,
            // A tail joined: drop this read (the driver discards its connection) and re-issue.
            Either::Right(_) => continue,
        };
        match read {
            Ok(reply) => {
                for stream in reply.array() {
                    let parts = stream.array();
                    let (Some(key), Some(entries)) =
                        (parts.first().and_then(Reply::bytes), parts.get(1))
                    else {
                        continue;
                    };
                    for t in tails.iter().filter(|t| t.key == key) {
                        if t.epoch.borrow().is_empty() {
                            // The stream was created after the tail started: its epoch now.
                            match crate::cmd(args!["GET", &t.epoch_key]).await {
                                Ok(epoch) => {
                                    *t.epoch.borrow_mut() =
                                        epoch.text().unwrap_or_default().to_string()
                                }
                                Err(_) => {
                                    t.end.set();
                                    continue;
                                }
                            }
                        }
                        t.offer(entries.array());
                    }
                }
            }
            Err(e) if crate::is_connection_lost(&e) => {
                // Keep the tails: their positions live in Redis, so once the driver has
                // reconnected the same XREAD resumes without a gap. A server that came back
                // without the data (another epoch, or none) ends them instead.
                wrpc_broker_guest::debug!("log tails: {e:?}; resuming after the reconnect");
                wrpc_broker_guest::sleep(100).await;
                recheck.set(true);
            }
            Err(e) => {
                wrpc_broker_guest::warn!("log tails: XREAD failed: {e:?}");
                wrpc_broker_guest::sleep(100).await;
            }
        }
    }
}

/// After a lost connection: end every tail whose stream's epoch changed (the server came back
/// without its data). False while the server cannot be asked yet.
async fn epochs_hold() -> bool {
    let tails: Vec<Rc<Tail>> = TAILS.with_borrow(|tails| tails.values().cloned().collect());
    for t in tails {
        let known = t.epoch.borrow().clone();
        if known.is_empty() || t.end.is_set() {
            continue;
        }
        match crate::cmd(args!["GET", &t.epoch_key]).await {
            Ok(now) if now.text() == Some(known.as_str()) => {}
            Ok(_) => {
                wrpc_broker_guest::info!(
                    "log tail: the stream has another epoch after a reconnect; ending the tail"
                );
                t.end.set();
            }
            Err(_) => return false,
        }
    }
    true
}

impl Guest for Component {
    async fn append(topic: String, batch: Vec<RecordIn>) -> Result<Vec<String>, Error> {
        let config = config()?;
        let keys = vec![config.key("log", &topic)?, config.key("loge", &topic)?];
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let count = batch.len();
        let mut argv = args![wrpc_broker_guest::ids::generate(), config.max_entries];
        for r in batch {
            argv.push(r.value);
            argv.push(crate::encode_headers(&r.headers));
            match r.key {
                Some(key) => argv.extend([b"1".to_vec(), key]),
                None => argv.extend([b"0".to_vec(), Vec::new()]),
            }
        }
        let reply = eval(APPEND, keys, argv).await?;
        let parts = reply.array();
        let epoch = parts
            .first()
            .and_then(Reply::text)
            .ok_or_else(|| Error::internal("append: no epoch"))?;
        let ids: Vec<String> = parts
            .get(1)
            .map(Reply::array)
            .unwrap_or_default()
            .iter()
            .filter_map(|id| id.bytes().and_then(seq))
            .map(|n| wrpc_broker_guest::ids::log_id(epoch, n))
            .collect();
        if ids.len() != count {
            return Err(Error::internal(format!(
                "append: {} ids for {count} records",
                ids.len()
            )));
        }
        Ok(ids)
    }

    fn parse_id(text: String) -> Result<(), Error> {
        parse(&text).map(|_| ())
    }

    async fn range(topic: String, origin: Start, limit: u32) -> Result<Page, Error> {
        if limit == 0 {
            return Err(Error::bad_request("limit must be at least 1"));
        }
        if let Start::After(id) = &origin {
            parse(id)?;
        }
        if let Start::Latest = origin {
            config()?.key("log", &topic)?;
            return Ok(Page {
                entries: Vec::new(),
                done: true,
            });
        }
        let config = config()?;
        let start = match &origin {
            Start::After(id) => format!("(0-{}", parse(id)?.1),
            _ => "-".to_string(),
        };
        let (state, raw) = read(&config, &topic, &start, limit).await?;
        let from = start_seq(&state, &origin)?;
        let epoch = state.epoch.unwrap_or_default();
        let entries: Vec<Entry> = raw.iter().filter_map(|r| entry(&epoch, r)).collect();
        if let Some(head) = entries.first()
            && head.pos.offset != from
        {
            return Err(Error::gone(format!(
                "entry {from} was trimmed (the oldest retained is {})",
                head.pos.offset
            )));
        }
        let done = entries.len() < limit as usize
            || entries.last().is_some_and(|e| e.pos.offset >= state.last);
        Ok(Page { entries, done })
    }

    async fn tail(
        topic: String,
        origin: Start,
    ) -> Result<(Vec<Position>, StreamReader<Entry>), Error> {
        if let Start::After(id) = &origin {
            parse(id)?;
        }
        let config = config()?;
        let (state, _) = read(&config, &topic, "-", 0).await?;
        let next = start_seq(&state, &origin)?;
        // No stream yet: its epoch is minted by the first append and read when entries come.
        let epoch = state.epoch.unwrap_or_default();
        let tail = Rc::new(Tail {
            key: config.key("log", &topic)?,
            epoch_key: config.key("loge", &topic)?,
            epoch: RefCell::new(epoch),
            next: Cell::new(next),
            buffer: RefCell::new(VecDeque::new()),
            wake: Notify::new(),
            end: Latch::new(),
        });
        let (tx, rx) = crate::wit_stream::new::<Entry>();
        let id = NEXT_TAIL.replace(NEXT_TAIL.get() + 1);
        TAILS.with_borrow_mut(|tails| tails.insert(id, tail.clone()));
        JOINED.with(Notify::notify);
        if !READING.replace(true) {
            wit_bindgen::spawn_local(reader());
        }
        wit_bindgen::spawn_local(tail.pump(tx));
        Ok((
            vec![Position {
                partition: 0,
                offset: next,
            }],
            rx,
        ))
    }
}
