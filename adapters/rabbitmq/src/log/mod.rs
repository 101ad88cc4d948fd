//! `wrpc:broker/log` on stream queues: topic `t` is the durable stream `P.log.<enc>`, a single
//! partition whose offsets are the stream's (`x-stream-offset` of each delivery, dense for
//! AMQP-published entries). Retention is the stream's: `x-max-length-bytes` / `x-max-age`,
//! whole segments at a time, never a count (`retention.maxEntries` is not an option here).
//!
//! An entry's id is `{epoch}:{offset}`. Every entry carries its log's epoch in `x-wrpc-epoch`:
//! an appender learns it from the stream's last chunk, or mints one (`host.generate-id`) on an
//! empty stream, so a deleted and recreated stream, or another topic, has another one. An id
//! `e:n` is good when entry `n` is there and carries `e`: 410 when it carries another epoch, or
//! when the first entry a reader from `n` gets is above `n` (trimmed); 400 when malformed, or
//! past the tip (no entry `n`: the reader gets nothing, or an entry below `n`).
//!
//! 0-9-1 has no way to ask a stream for its tip or its first offset, and publisher confirms
//! carry no offset, so this module learns them from consumers (`x-stream-offset` = `first`,
//! `last` or a number, on a channel of their own, each batch acknowledged for credit). Whether
//! a stream has entries at all is told by its marker queue `P.log.<enc>.nonempty` (a classic
//! queue whose exact message count declare-ok returns): the first appender of a stream puts a
//! message there before its first entry, so a count of 0 means no entry was ever appended, and
//! a reader of a non-empty stream waits for its first delivery as long as it takes (up to
//! [`FIRST_WAIT_MS`]). A page and the stream's last chunk end after [`QUIET_MS`] of silence (a
//! page cut by time says `done`). An append's ids come from the appender's read-back consumer
//! on the stream (from `last`, started before the first publish), which matches each entry's
//! `message_id` to its offset.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use wit_bindgen::{StreamReader, StreamResult, StreamWriter};

mod append;

use crate::codec;
use crate::exports::wrpc::broker::log::{Entry, Guest, Page, RecordIn};
use crate::inbox::Inbox;
use crate::wrpc::amqp::client::{self, Delivery, FieldTable, FieldValue, QueueOptions};
use crate::{Component, Config, channel, config};
use append::Appender;
use wrpc_broker_guest::ids::{self, is_epoch};
use wrpc_broker_guest::signal::Ticker;
use wrpc_broker_guest::{Error, Position, Start, host};

/// How long a reader of a non-empty stream waits for its first delivery, in milliseconds.
pub(super) const FIRST_WAIT_MS: u32 = 10_000;
/// How long a reader from an offset that should be there waits for it (past the tip when it
/// never comes).
const PRESENT_WAIT_MS: u32 = 5_000;
/// A page, or the last chunk, ends after this much silence, in milliseconds.
const QUIET_MS: u32 = 60;
/// The credit (`basic.qos`) of a stream reader.
const READ_PREFETCH: u16 = 1_000;
/// How many entries a tail writes at a time at most.
const BATCH: usize = 256;

/// The arguments of a log stream.
fn stream_arguments(config: &Config) -> FieldTable {
    let mut args = vec![codec::text_field("x-queue-type", "stream")];
    if let Some(bytes) = config.max_bytes {
        args.push(("x-max-length-bytes".to_string(), FieldValue::Long(bytes)));
    }
    if let Some(age) = &config.max_age {
        args.push(codec::text_field("x-max-age", age.clone()));
    }
    if let Some(bytes) = config.segment_bytes {
        args.push((
            "x-stream-max-segment-size-bytes".to_string(),
            FieldValue::Long(bytes),
        ));
    }
    args
}

thread_local! {
    /// The streams this instance declared.
    pub(super) static DECLARED: RefCell<std::collections::HashSet<String>> = RefCell::new(Default::default());
    /// The streams this instance knows have entries.
    pub(super) static NON_EMPTY: RefCell<std::collections::HashSet<String>> = RefCell::new(Default::default());
    /// The appenders of the topics this instance appended to.
    pub(super) static APPENDERS: RefCell<HashMap<String, Rc<Appender>>> = RefCell::new(HashMap::new());
}

/// The stream of `topic`, declared (once per instance).
async fn stream(config: &Config, topic: &str) -> Result<String, Error> {
    let name = config.queue("log", topic)?;
    if DECLARED.with_borrow(|d| d.contains(&name)) {
        return Ok(name);
    }
    let options = QueueOptions {
        durable: true,
        exclusive: false,
        auto_delete: false,
        passive: false,
    };
    let args = stream_arguments(config);
    channel::shared()
        .call(|ch| client::queue_declare(ch, name.clone(), options, args.clone()))
        .await?;
    DECLARED.with_borrow_mut(|d| d.insert(name.clone()));
    Ok(name)
}

/// The marker queue of `stream`: a message there means the stream has (or is about to have)
/// entries.
pub(super) fn marker(stream: &str) -> String {
    format!("{stream}.nonempty")
}

/// Declare the marker queue of `stream`: how many markers it holds.
async fn markers(stream: &str) -> Result<u32, Error> {
    let options = QueueOptions {
        durable: true,
        exclusive: false,
        auto_delete: false,
        passive: false,
    };
    let name = marker(stream);
    let info = channel::shared()
        .call(|ch| client::queue_declare(ch, name.clone(), options, Vec::new()))
        .await?;
    Ok(info.messages)
}

/// Whether `stream` has entries (or an appender is about to write its first).
pub(super) async fn non_empty(stream: &str) -> Result<bool, Error> {
    if NON_EMPTY.with_borrow(|n| n.contains(stream)) {
        return Ok(true);
    }
    let found = markers(stream).await? > 0;
    if found {
        NON_EMPTY.with_borrow_mut(|n| n.insert(stream.to_string()));
    }
    Ok(found)
}

/// Split an id `{epoch}:{offset}` (a canonical number); anything else is a bad request.
fn parse(id: &str) -> Result<(&str, u64), Error> {
    ids::parse_log_id(id, "offset")
}

/// A delivery's stream offset.
pub(super) fn offset(d: &Delivery) -> u64 {
    codec::number(&d.properties.headers, codec::STREAM_OFFSET)
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0)
}

/// A delivery's epoch (`none` for an entry another client wrote).
pub(super) fn epoch(d: &Delivery) -> String {
    codec::text(&d.properties.headers, codec::EPOCH)
        .filter(|e| is_epoch(e))
        .unwrap_or_else(|| "none".to_string())
}

/// A stream delivery as an entry.
fn entry(d: Delivery) -> Entry {
    let h = &d.properties.headers;
    let at = offset(&d);
    Entry {
        id: format!("{}:{at}", epoch(&d)),
        pos: Position {
            partition: 0,
            offset: at,
        },
        key: codec::bytes(h, codec::KEY),
        headers: codec::unpack(h),
        value: d.body,
    }
}

/// A consumer on a stream, on a channel of its own.
pub(super) struct Reading {
    pub(super) channel: u64,
    pub(super) inbox: Rc<Inbox>,
}

impl Reading {
    /// Read `stream` from `offset` (`first`, `last`, `next` or a number); while the stream is
    /// not back yet after a restart, tried again for up to [`channel::UNREACHABLE_MS`].
    pub(super) async fn start(stream: &str, offset: FieldValue) -> Result<Reading, Error> {
        let deadline = host::now_ms() + channel::UNREACHABLE_MS;
        loop {
            let ch = channel::open(READ_PREFETCH).await?;
            let args = vec![(codec::STREAM_OFFSET.to_string(), offset.clone())];
            match client::consume(ch, stream.to_string(), false, false, args).await {
                Ok((_, deliveries)) => {
                    return Ok(Reading {
                        channel: ch,
                        inbox: Inbox::start(deliveries, Some(ch)),
                    });
                }
                Err(e) => {
                    client::close_channel(ch).await;
                    if !crate::transient(&e) || host::now_ms() >= deadline {
                        return Err(crate::amqp_error(e));
                    }
                    host::sleep(channel::RETRY_MS).await;
                }
            }
        }
    }

    /// Stop reading.
    pub(super) async fn close(self) {
        self.inbox.close();
        client::close_channel(self.channel).await;
    }
}

/// The reader positioned after id `id` (`after(id)`), checked: the entry `n` it names, read.
async fn after(stream: &str, id: &str) -> Result<(Reading, u64), Error> {
    let (epoch_of_id, n) = parse(id)?;
    let reading = Reading::start(stream, FieldValue::Long(n as i64)).await?;
    let checked = match reading.inbox.next(PRESENT_WAIT_MS).await {
        None => Err(Error::bad_request(format!(
            "id `{id}` is past the tip of the log"
        ))),
        Some(d) if offset(&d) < n => Err(Error::bad_request(format!(
            "id `{id}` is past the tip of the log (next offset {})",
            offset(&d)
        ))),
        Some(d) if offset(&d) > n => Err(Error::gone(format!(
            "id `{id}` is older than the retained history (oldest offset {})",
            offset(&d)
        ))),
        Some(d) if epoch(&d) != epoch_of_id => Err(Error::gone(format!(
            "id `{id}` was minted by another log (entry {n} here has epoch {})",
            epoch(&d)
        ))),
        Some(_) => Ok(n + 1),
    };
    match checked {
        Ok(next) => Ok((reading, next)),
        Err(e) => {
            reading.close().await;
            Err(e)
        }
    }
}

/// Up to `limit` entries after `first` from `reading`; done when it went quiet first.
async fn page(reading: &Reading, first: Option<Delivery>, limit: u32) -> Page {
    let mut entries: Vec<Entry> = first.into_iter().map(entry).collect();
    while entries.len() < limit as usize {
        match reading.inbox.next(QUIET_MS).await {
            Some(d) => entries.push(entry(d)),
            None => {
                return Page {
                    entries,
                    done: true,
                };
            }
        }
    }
    Page {
        entries,
        done: false,
    }
}

impl Guest for Component {
    async fn append(topic: String, batch: Vec<RecordIn>) -> Result<Vec<String>, Error> {
        let config = config()?;
        let stream = stream(&config, &topic).await?;
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let appender = Appender::of(&topic, &stream).await?;
        let answer = appender.append(&stream, batch).await;
        if appender.dead.get() {
            APPENDERS.with_borrow_mut(|a| a.remove(&topic));
        }
        answer
    }

    fn parse_id(text: String) -> Result<(), Error> {
        parse(&text).map(|_| ())
    }

    async fn range(topic: String, origin: Start, limit: u32) -> Result<Page, Error> {
        if limit == 0 {
            return Err(Error::bad_request("limit must be at least 1"));
        }
        let config = config()?;
        let stream = stream(&config, &topic).await?;
        let (reading, first) = match &origin {
            Start::Latest => {
                return Ok(Page {
                    entries: Vec::new(),
                    done: true,
                });
            }
            Start::Earliest => {
                if !non_empty(&stream).await? {
                    return Ok(Page {
                        entries: Vec::new(),
                        done: true,
                    });
                }
                let reading = Reading::start(&stream, FieldValue::Text("first".into())).await?;
                let first = reading.inbox.next(FIRST_WAIT_MS).await;
                if first.is_none() {
                    reading.close().await;
                    return Ok(Page {
                        entries: Vec::new(),
                        done: true,
                    });
                }
                (reading, first)
            }
            Start::After(id) => (after(&stream, id).await?.0, None),
        };
        let page = page(&reading, first, limit).await;
        reading.close().await;
        Ok(page)
    }

    async fn tail(
        topic: String,
        origin: Start,
    ) -> Result<(Vec<Position>, StreamReader<Entry>), Error> {
        let config = config()?;
        let stream = stream(&config, &topic).await?;
        let empty =
            matches!(origin, Start::Latest | Start::Earliest) && !non_empty(&stream).await?;
        let (reading, next, first) = match &origin {
            // Nothing was ever appended: everything from offset 0 on is new.
            _ if empty => (Reading::start(&stream, FieldValue::Long(0)).await?, 0, None),
            Start::Latest => {
                let reading = Reading::start(&stream, FieldValue::Text("last".into())).await?;
                // The last chunk comes first: the tip is after its last entry.
                let mut tip = 0;
                let mut wait = FIRST_WAIT_MS;
                while let Some(d) = reading.inbox.next(wait).await {
                    tip = tip.max(offset(&d) + 1);
                    wait = QUIET_MS;
                }
                (reading, tip, None)
            }
            Start::Earliest => {
                let reading = Reading::start(&stream, FieldValue::Text("first".into())).await?;
                let first = reading.inbox.next(FIRST_WAIT_MS).await;
                let at = first.as_ref().map_or(0, offset);
                (reading, at, first)
            }
            Start::After(id) => {
                let (reading, next) = after(&stream, id).await?;
                (reading, next, None)
            }
        };
        let (tx, rx) = crate::wit_stream::new::<Entry>();
        wit_bindgen::spawn_local(follow(reading, next, first, tx));
        Ok((
            vec![Position {
                partition: 0,
                offset: next,
            }],
            rx,
        ))
    }
}

/// Move a tail's deliveries from `next` on into `to`, in order, until the consumer ends (the
/// connection was lost: the host re-joins with `range`) or the reader is gone.
async fn follow(
    reading: Reading,
    mut next: u64,
    first: Option<Delivery>,
    mut to: StreamWriter<Entry>,
) {
    let mut pending: Vec<Delivery> = first.into_iter().collect();
    // One host timer per second, not one per wait (a live entry is a wait of its own).
    let tick = Ticker::new(1_000);
    loop {
        if pending.is_empty() {
            reading.inbox.wait_on(&tick, None).await;
            pending = reading.inbox.take(BATCH);
        }
        if pending.is_empty() {
            if reading.inbox.has_ended() {
                break;
            }
            // A write of nothing tells whether the reader is still there.
            let (result, _) = to.write(Vec::new()).await;
            if matches!(result, StreamResult::Dropped) {
                break;
            }
            continue;
        }
        let entries: Vec<Entry> = std::mem::take(&mut pending)
            .into_iter()
            .filter(|d| offset(d) >= next)
            .map(entry)
            .collect();
        if let Some(last) = entries.last() {
            next = last.pos.offset + 1;
        }
        if !entries.is_empty() && !to.write_all(entries).await.is_empty() {
            break;
        }
    }
    drop(to);
    reading.close().await;
}
