//! `wrpc:broker/log` (ordered, replayable feeds) on the store's logs: topic `t` is the store log
//! `log/t`, one partition (0) whose offsets are the store's.
//!
//! An entry's id is `<epoch>.<offset>`. The epoch is stamped by the store when the log is
//! created and read back on every call, so every instance, on every host, mints the same id for
//! one entry, and an id from another log (or from an older log of the same name) is recognised.

use crate::exports::wrpc::broker::log::{Entry, Guest, Page, RecordIn};
use crate::wrpc::broker::host;
use crate::wrpc::broker::types::{Error, Position, Start};
use crate::wrpc::memory::store::{self, LogEntry, LogInfo, LogRecord};
use crate::{Adapter, checked, forward, max_entries};
use wit_bindgen::StreamReader;

/// The store log of `topic`.
fn store_log(topic: String) -> Result<String, Error> {
    Ok(format!("log/{}", checked("topic", topic)?))
}

/// The epoch for a log that does not exist yet (the store ignores it for one that does): a
/// fresh id from the host, so each log has its own.
fn fresh_epoch() -> String {
    host::generate_id()
}

/// Split an id into its epoch and offset; anything but `<epoch>.<digits>` is a bad request.
/// The host's ids (the epochs) are letters, digits, `-` and `_`: no `.`.
fn parse(id: &str) -> Result<(&str, u64), Error> {
    let malformed = || Error::BadRequest(format!("malformed id `{id}`: expected `epoch.offset`"));
    let (epoch, offset) = id.split_once('.').ok_or_else(malformed)?;
    let epoch_ok = !epoch.is_empty()
        && epoch
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !epoch_ok || offset.is_empty() || !offset.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    Ok((epoch, offset.parse().map_err(|_| malformed())?))
}

/// The id of the entry at `offset` of a log whose epoch is `epoch`.
fn id(epoch: &str, offset: u64) -> String {
    format!("{epoch}.{offset}")
}

/// Where the entry at `offset` sits: the store's logs have a single partition.
fn position(offset: u64) -> Position {
    Position {
        partition: 0,
        offset,
    }
}

/// The broker's view of a stored entry: its id, position and contents.
fn to_entry(epoch: &str, stored: LogEntry) -> Entry {
    Entry {
        id: id(epoch, stored.offset),
        pos: position(stored.offset),
        value: stored.value,
        headers: stored.headers,
        key: stored.key,
    }
}

/// What the caller appends is what the store keeps.
impl From<RecordIn> for LogRecord {
    fn from(r: RecordIn) -> Self {
        LogRecord {
            value: r.value,
            headers: r.headers,
            key: r.key,
        }
    }
}

/// The first offset a read from `origin` yields, given the log's state. After an id: the next
/// offset, if the id is this log's (else `gone`), not past the tip (else `bad-request`) and not
/// trimmed away (else `gone`).
fn first_offset(log: &LogInfo, origin: &Start) -> Result<u64, Error> {
    let Start::After(id) = origin else {
        let earliest = matches!(origin, Start::Earliest);
        return Ok(if earliest { log.first } else { log.next });
    };
    let (epoch, offset) = parse(id)?;
    let next = offset.saturating_add(1);
    if epoch != log.epoch {
        Err(Error::Gone(format!("id `{id}` belongs to another log")))
    } else if next > log.next {
        Err(Error::BadRequest(format!("id `{id}` is past the tip")))
    } else if next < log.first {
        Err(Error::Gone(format!("id `{id}` is older than what is kept")))
    } else {
        Ok(next)
    }
}

impl Guest for Adapter {
    /// Append in order. The store answers with the offset of the first record; the others
    /// follow it one by one.
    async fn append(topic: String, batch: Vec<RecordIn>) -> Result<Vec<String>, Error> {
        let name = store_log(topic)?;
        let max = max_entries()?;
        let records: Vec<LogRecord> = batch.into_iter().map(LogRecord::from).collect();
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let (log, first) = store::log_append(&name, &fresh_epoch(), max, &records);
        let offsets = first..first + records.len() as u64;
        Ok(offsets.map(|offset| id(&log.epoch, offset)).collect())
    }

    /// Syntax only: whether the id is this log's is for `range` and `tail` to say.
    fn parse_id(text: String) -> Result<(), Error> {
        parse(&text).map(|_| ())
    }

    async fn range(topic: String, origin: Start, limit: u32) -> Result<Page, Error> {
        let name = store_log(topic)?;
        if limit == 0 {
            return Err(Error::BadRequest("limit must be at least 1".into()));
        }
        let log = store::log_open(&name, &fresh_epoch(), max_entries()?);
        let from = first_offset(&log, &origin)?;
        let (log, stored) = store::log_read(&name, from, limit)?;
        // The store starts a read at the oldest entry it keeps: a later first offset means
        // entries after the id were trimmed since `log_open`, and resuming would skip them.
        if let (Start::After(id), Some(head)) = (&origin, stored.first())
            && head.offset != from
        {
            return Err(Error::Gone(format!("id `{id}` is older than what is kept")));
        }
        let done = stored.last().is_none_or(|e| e.offset + 1 >= log.next);
        let entries = stored
            .into_iter()
            .map(|e| to_entry(&log.epoch, e))
            .collect();
        Ok(Page { entries, done })
    }

    /// The store follows the log from an offset; a task forwards what it yields.
    async fn tail(
        topic: String,
        origin: Start,
    ) -> Result<(Vec<Position>, StreamReader<Entry>), Error> {
        let name = store_log(topic)?;
        let log = store::log_open(&name, &fresh_epoch(), max_entries()?);
        let from = first_offset(&log, &origin)?;
        let follow = store::log_follow(name, from).await;
        let (writer, reader) = crate::wit_stream::new::<Entry>();
        let epoch = log.epoch;
        forward(follow, writer, move |stored| to_entry(&epoch, stored));
        Ok((vec![position(from)], reader))
    }
}
