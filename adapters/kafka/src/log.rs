//! `wrpc:broker/log` on topics: topic `t` is `P.log.<enc>` (`partitions` partitions, default
//! 1, `cleanup.policy=delete`, retention by `retention.ms` / `retention.bytes`, never a count).
//! A keyed record goes to its key's partition (murmur2), a keyless batch to one partition, so
//! each stays ordered.
//!
//! An id (the resume token after an entry) is `<topic-id>:<o0>,<o1>,…`: the topic id (KIP-516,
//! base64url) is the epoch, so a deleted and recreated topic, or another log, has another one;
//! `oᵢ` is the next offset to read in partition i. An id is `gone` (410) under another topic
//! id or when some `oᵢ` is below that partition's log-start offset, `bad-request` (400) when
//! malformed, when some `oᵢ` is past the high watermark or when it names more partitions than
//! the topic has. An appended entry's id is a cut: its partition after it, the others at the
//! high watermarks read before the produce (with one partition: exactly the entry).

use std::rc::Rc;

use wit_bindgen::StreamReader;

use crate::exports::wrpc::broker::log::{Entry, Guest, Page, RecordIn};
use crate::inbox::Inbox;
use crate::topics::{self, Described};
use crate::wrpc::kafka::client::{self, Incoming, Marks, Outgoing};
use crate::{Component, Config, config, kafka_error};
use wrpc_broker_guest::{Error, Position, Start, host, ids, relay};

/// How many times (100 ms apart) a topic just created is described before giving up.
const DESCRIBE_TRIES: u32 = 50;
/// How long a page waits for a record it knows is there, in milliseconds.
const FETCH_WAIT_MS: u32 = 10_000;

/// `topic`'s Kafka topic, created (with the configured partitions) if missing.
async fn log_topic(config: &Config, topic: &str) -> Result<(String, Described), Error> {
    let name = config.topic("log", topic)?;
    topics::ensure(
        config,
        &[(name.clone(), config.partitions)],
        &config.log_configs,
    )
    .await?;
    // A topic just created is described once its metadata has spread (a moment).
    for _ in 0..DESCRIBE_TRIES {
        if let Some(described) = topics::describe(&name).await? {
            return Ok((name, described));
        }
        host::sleep(100).await;
    }
    Err(Error::unavailable(format!(
        "topic {name} is not described within {} ms of its creation",
        DESCRIBE_TRIES * 100
    )))
}

/// Parse an id: its epoch and offset vector.
fn parse(id: &str) -> Result<(&str, Vec<u64>), Error> {
    let malformed = || Error::bad_request(format!("malformed id `{id}`: expected `epoch:o0,o1,…`"));
    let (epoch, offsets) = id.split_once(':').ok_or_else(malformed)?;
    if !ids::is_epoch(epoch) {
        return Err(malformed());
    }
    let mut vector = Vec::new();
    for o in offsets.split(',') {
        let canonical = !o.is_empty()
            && o.bytes().all(|b| b.is_ascii_digit())
            && (o == "0" || !o.starts_with('0'));
        if !canonical {
            return Err(malformed());
        }
        vector.push(o.parse().map_err(|_| malformed())?);
    }
    Ok((epoch, vector))
}

/// The id of offset vector `next` under `epoch`.
fn id(epoch: &str, next: &[u64]) -> String {
    let mut id = String::with_capacity(epoch.len() + next.len() * (ids::MAX_DIGITS + 1));
    id.push_str(epoch);
    id.push(':');
    for (i, offset) in next.iter().enumerate() {
        if i > 0 {
            id.push(',');
        }
        ids::push_decimal(&mut id, *offset);
    }
    id
}

/// Where a read from `origin` starts in each partition; `marks` are the partitions' watermarks.
fn starts(described: &Described, marks: &[Marks], origin: &Start) -> Result<Vec<u64>, Error> {
    match origin {
        Start::Earliest => Ok(marks.iter().map(|m| m.low).collect()),
        Start::Latest => Ok(marks.iter().map(|m| m.high).collect()),
        Start::After(text) => {
            let (epoch, vector) = parse(text)?;
            if epoch != described.epoch {
                return Err(Error::gone(format!(
                    "id `{text}` was minted by another log (topic id {epoch}, this one is {})",
                    described.epoch
                )));
            }
            if vector.len() > marks.len() {
                return Err(Error::bad_request(format!(
                    "id `{text}` names {} partitions, the topic has {}",
                    vector.len(),
                    marks.len()
                )));
            }
            let mut next = Vec::with_capacity(marks.len());
            for (p, m) in marks.iter().enumerate() {
                let Some(&o) = vector.get(p) else {
                    next.push(m.low);
                    continue;
                };
                if o > m.high {
                    return Err(Error::bad_request(format!(
                        "id `{text}` is past the tip of partition {p} ({o} > {})",
                        m.high
                    )));
                }
                if o < m.low {
                    return Err(Error::gone(format!(
                        "id `{text}` is older than the retained history of partition {p} ({o} < {})",
                        m.low
                    )));
                }
                next.push(o);
            }
            Ok(next)
        }
    }
}

/// The entry of `record`, advancing the running vector `next`.
fn entry(epoch: &str, next: &mut [u64], record: Incoming) -> Entry {
    if let Some(slot) = next.get_mut(record.partition as usize) {
        *slot = (*slot).max(record.offset + 1);
    }
    Entry {
        id: id(epoch, next),
        pos: Position {
            partition: record.partition,
            offset: record.offset,
        },
        value: record.value,
        headers: record.headers,
        key: record.key,
    }
}

/// A reader of `topic` from `next` in every partition (the ones listed in `only`, if given).
async fn reader(
    topic: &str,
    next: &[u64],
    only: Option<&[u64]>,
) -> Result<StreamReader<Incoming>, Error> {
    let starts: Vec<(u32, u64)> = next
        .iter()
        .enumerate()
        .filter(|(p, o)| only.is_none_or(|high| high.get(*p).is_some_and(|h| *o < h)))
        .map(|(p, o)| (p as u32, *o))
        .collect();
    client::read(topic.to_string(), starts)
        .await
        .map_err(kafka_error)
}

impl Guest for Component {
    async fn append(topic: String, batch: Vec<RecordIn>) -> Result<Vec<String>, Error> {
        let config = config()?;
        let (name, described) = log_topic(&config, &topic).await?;
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut next: Vec<u64> = if described.partitions > 1 {
            client::watermarks(name.clone())
                .await
                .map_err(kafka_error)?
                .iter()
                .map(|m| m.high)
                .collect()
        } else {
            vec![0]
        };
        // A keyless batch goes to one partition, so it stays ordered (a partition picked by the
        // clock; no clock read when there is one).
        let keyless = match described.partitions {
            0 | 1 => 0,
            n => (wrpc_broker_guest::now_ms() % u64::from(n)) as u32,
        };
        let records: Vec<Outgoing> = batch
            .into_iter()
            .map(|r| Outgoing {
                topic: name.clone(),
                partition: if r.key.is_none() { Some(keyless) } else { None },
                key: r.key,
                value: r.value,
                headers: r.headers,
            })
            .collect();
        let delivered = client::produce(records).await.map_err(kafka_error)?;
        Ok(delivered
            .iter()
            .map(|d| {
                let p = d.partition as usize;
                if next.len() <= p {
                    next.resize(p + 1, 0);
                }
                next[p] = next[p].max(d.offset + 1);
                id(&described.epoch, &next)
            })
            .collect())
    }

    fn parse_id(text: String) -> Result<(), Error> {
        parse(&text).map(|_| ())
    }

    async fn range(topic: String, origin: Start, limit: u32) -> Result<Page, Error> {
        if limit == 0 {
            return Err(Error::bad_request("limit must be at least 1"));
        }
        let config = config()?;
        let (name, described) = log_topic(&config, &topic).await?;
        let marks = client::watermarks(name.clone())
            .await
            .map_err(kafka_error)?;
        let mut next = starts(&described, &marks, &origin)?;
        let high: Vec<u64> = marks.iter().map(|m| m.high).collect();
        let reached = |next: &[u64]| next.iter().zip(&high).all(|(n, h)| n >= h);
        let mut entries = Vec::new();
        if matches!(origin, Start::Latest) || reached(&next) {
            return Ok(Page {
                entries,
                done: true,
            });
        }
        let inbox = Inbox::start(reader(&name, &next, Some(&high)).await?);
        while entries.len() < limit as usize && !reached(&next) {
            inbox.wait(FETCH_WAIT_MS, None).await;
            let records = inbox.take(limit as usize - entries.len());
            if records.is_empty() {
                inbox.close();
                if inbox.has_ended() && entries.is_empty() {
                    return Err(Error::gone(format!(
                        "the read of {name} ended: its offsets fell out of the retained range"
                    )));
                }
                if entries.is_empty() {
                    return Err(Error::unavailable(format!(
                        "no record of {name} within {FETCH_WAIT_MS} ms"
                    )));
                }
                return Ok(Page {
                    entries,
                    done: false,
                });
            }
            for r in records {
                let p = r.partition as usize;
                if high.get(p).is_none_or(|h| r.offset >= *h) || r.offset < next[p] {
                    continue;
                }
                entries.push(entry(&described.epoch, &mut next, r));
            }
        }
        inbox.close();
        let done = reached(&next);
        Ok(Page { entries, done })
    }

    async fn tail(
        topic: String,
        origin: Start,
    ) -> Result<(Vec<Position>, StreamReader<Entry>), Error> {
        let config = config()?;
        let (name, described) = log_topic(&config, &topic).await?;
        let marks = client::watermarks(name.clone())
            .await
            .map_err(kafka_error)?;
        let next = starts(&described, &marks, &origin)?;
        let positions = next
            .iter()
            .enumerate()
            .map(|(p, o)| Position {
                partition: p as u32,
                offset: *o,
            })
            .collect();
        let mut from = reader(&name, &next, None).await?;
        let (tx, rx) = crate::wit_stream::new::<Entry>();
        let epoch: Rc<str> = described.epoch.into();
        wit_bindgen::spawn_local(async move {
            let mut next = next;
            relay::pump(&mut from, tx, |records: Vec<Incoming>| {
                let mut entries = Vec::with_capacity(records.len());
                for r in records {
                    if next
                        .get(r.partition as usize)
                        .is_some_and(|n| r.offset >= *n)
                    {
                        entries.push(entry(&epoch, &mut next, r));
                    }
                }
                entries
            })
            .await;
        });
        Ok((positions, rx))
    }
}
