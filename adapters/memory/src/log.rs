//! `wrpc:broker/log` on the store's logs: one store log `{prefix}/log/{topic}` per topic, a
//! single partition (0) whose offsets are the store's. An entry's id is `{epoch}:{offset}`, the
//! epoch being the one the store keeps for that log, so every instance mints the same ids and a
//! foreign id is recognised.

use crate::exports::wrpc::broker::log::{Entry, Guest, Page, RecordIn};
use crate::wrpc::memory::store::{self, LogEntry, LogInfo, LogRecord};
use crate::{Component, Config, config, store_error};
use wit_bindgen::StreamReader;
use wrpc_broker_guest::relay;
use wrpc_broker_guest::{Error, Position, Start};

pub(crate) use wrpc_broker_guest::ids::is_epoch;

/// Split an id `{epoch}:{offset}` into its parts; anything else is a bad request.
fn parse(id: &str) -> Result<(&str, u64), Error> {
    let malformed = || Error::bad_request(format!("malformed id `{id}`: expected `epoch:offset`"));
    let (epoch, offset) = id.rsplit_once(':').ok_or_else(malformed)?;
    if !is_epoch(epoch) || offset.is_empty() || !offset.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    Ok((epoch, offset.parse().map_err(|_| malformed())?))
}

/// The id of the entry at `offset` of a log with `epoch`.
fn id(epoch: &str, offset: u64) -> String {
    wrpc_broker_guest::ids::log_id(epoch, offset)
}

/// A stored entry as the broker's entry.
fn entry(epoch: &str, e: LogEntry) -> Entry {
    Entry {
        id: id(epoch, e.offset),
        pos: Position {
            partition: 0,
            offset: e.offset,
        },
        value: e.value,
        headers: e.headers,
        key: e.key,
    }
}

/// Open (or create) the log of `topic`.
fn open(config: &Config, topic: &str) -> Result<(String, LogInfo), Error> {
    let name = config.name("log", topic)?;
    let info = config.creating_log(
        |epoch| store::log_open(&name, epoch, config.max_entries),
        |info| &info.epoch,
    );
    Ok((name, info))
}

/// The offset a read from `origin` starts at, checked against the log's state.
fn start_offset(info: &LogInfo, origin: &Start) -> Result<u64, Error> {
    let id = match origin {
        Start::Earliest => return Ok(info.first),
        Start::Latest => return Ok(info.next),
        Start::After(id) => id,
    };
    let (epoch, offset) = parse(id)?;
    if epoch != info.epoch {
        return Err(Error::gone(format!(
            "id `{id}` was minted by another log (epoch {epoch}, this log has {})",
            info.epoch
        )));
    }
    let start = offset.saturating_add(1);
    if start > info.next {
        return Err(Error::bad_request(format!(
            "id `{id}` is past the tip (next offset {})",
            info.next
        )));
    }
    if start < info.first {
        return Err(Error::gone(format!(
            "id `{id}` is older than the retained history (oldest offset {})",
            info.first
        )));
    }
    Ok(start)
}

/// Identity, except under a mutant feature: the damage it does to a batch of stored entries on
/// their way out. `held` carries an entry from one batch of a tail to the next; `live` is true
/// for a tail, false for a range page.
fn bend(entries: Vec<LogEntry>, _held: &mut Option<LogEntry>, _live: bool) -> Vec<LogEntry> {
    #[cfg(feature = "mutant-skip-entry")]
    let entries: Vec<LogEntry> = entries.into_iter().filter(|e| e.offset != 3).collect();
    #[cfg(feature = "mutant-duplicate-entry")]
    let entries: Vec<LogEntry> = entries
        .into_iter()
        .flat_map(|e| {
            let twice = _live && e.offset == 2;
            std::iter::repeat_n(e, if twice { 2 } else { 1 })
        })
        .collect();
    #[cfg(feature = "mutant-reorder")]
    let entries: Vec<LogEntry> = {
        let mut out = Vec::with_capacity(entries.len() + 1);
        for e in entries {
            match e.offset {
                1 => *_held = Some(e),
                2 => out.extend(std::iter::once(e).chain(_held.take())),
                _ => out.push(e),
            }
        }
        out
    };
    #[cfg(feature = "mutant-drop-empty")]
    let entries: Vec<LogEntry> = entries
        .into_iter()
        .filter(|e| !e.value.is_empty())
        .collect();
    entries
}

impl Guest for Component {
    async fn append(topic: String, batch: Vec<RecordIn>) -> Result<Vec<String>, Error> {
        let config = config()?;
        let name = config.name("log", &topic)?;
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let records: Vec<LogRecord> = batch
            .into_iter()
            .map(|r| LogRecord {
                value: r.value,
                headers: r.headers,
                key: r.key,
            })
            .collect();
        let count = records.len() as u64;
        let (info, first) = config.creating_log(
            |epoch| store::log_append(&name, epoch, config.max_entries, &records),
            |(info, _)| &info.epoch,
        );
        Ok((first..first + count).map(|o| id(&info.epoch, o)).collect())
    }

    fn parse_id(text: String) -> Result<(), Error> {
        parse(&text).map(|_| ())
    }

    async fn range(topic: String, origin: Start, limit: u32) -> Result<Page, Error> {
        if limit == 0 {
            return Err(Error::bad_request("limit must be at least 1"));
        }
        let config = config()?;
        let (name, info) = open(&config, &topic)?;
        let start = start_offset(&info, &origin)?;
        let (info, entries) = store::log_read(&name, start, limit).map_err(store_error)?;
        // Trimmed between the open and the read: the store clamped the read forward.
        if let Start::After(id) = &origin
            && let Some(head) = entries.first()
            && head.offset != start
        {
            return Err(Error::gone(format!(
                "id `{id}` is older than the retained history (oldest offset {})",
                head.offset
            )));
        }
        let done = entries.last().is_none_or(|e| e.offset + 1 >= info.next);
        let mut held = None;
        let mut entries = bend(entries, &mut held, false);
        entries.extend(held);
        Ok(Page {
            entries: entries.into_iter().map(|e| entry(&info.epoch, e)).collect(),
            done,
        })
    }

    async fn tail(
        topic: String,
        origin: Start,
    ) -> Result<(Vec<Position>, StreamReader<Entry>), Error> {
        let config = config()?;
        let (name, info) = open(&config, &topic)?;
        let start = start_offset(&info, &origin)?;
        let follow = store::log_follow(name, start).await;
        let (tx, rx) = crate::wit_stream::new::<Entry>();
        let epoch = info.epoch;
        let mut held = None;
        let convert = move |batch: Vec<LogEntry>| -> Vec<Entry> {
            let batch = bend(batch, &mut held, true);
            batch.into_iter().map(|e| entry(&epoch, e)).collect()
        };
        let mut follow = follow;
        wit_bindgen::spawn_local(async move { relay::pump(&mut follow, tx, convert).await });
        Ok((
            vec![Position {
                partition: 0,
                offset: start,
            }],
            rx,
        ))
    }
}
