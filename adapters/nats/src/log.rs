//! `wrpc:broker/log` on JetStream: one stream `P_log_<enc>` per topic (subject `P.log.<enc>`,
//! limits retention with `max_msgs` = `retention.maxEntries`, discard old), a single partition
//! whose offsets are the stream sequences, dense because limits only ever trim the head.
//!
//! An entry's id is `{epoch}:{seq}`. The epoch is minted (`host.generate-id`) by whoever creates
//! the stream and kept in the stream's description (`wrpc log; epoch=<id>`; servers before 2.10
//! have no stream metadata), so every instance mints the same ids and an id of another stream,
//! or of a deleted and recreated one, is 410. 410 too below the first retained sequence; 400
//! past the last one.
//!
//! `range` reads a page with pipelined direct gets (`$JS.API.DIRECT.GET.<stream>` `{seq}`; the
//! batch form needs 2.11) and refuses a page whose head was trimmed under it (410). `tail` is an
//! ephemeral push consumer from the start sequence (ack none, idle heartbeats, memory state) on
//! a fresh inbox; each delivery's sequence comes from its `$JS.ACK` subject. When the tail hears
//! nothing for 3.5 s (a server restart forgets memory consumers) it creates a new consumer from
//! the next sequence on the same inbox, so a restart is invisible to the reader; a sequence jump
//! (the next entry was trimmed), a failed re-creation or a dropped reader ends the stream, and
//! the host re-joins with `range`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::pin::pin;

use futures::future::{Either, select};
use serde_json::{Value, json};
use wit_bindgen::{StreamReader, StreamResult};

use crate::codec;
use crate::exports::wrpc::broker::log::{Entry, Guest, Page, RecordIn};
use crate::js::{self, Fail, Windows};
use crate::wrpc::nats::client::{self, Message, Outgoing};
use crate::{Component, Config, config};
use wrpc_broker_guest::ids::{self, is_epoch};
use wrpc_broker_guest::relay::ReadSize;
use wrpc_broker_guest::signal::Ticker;
use wrpc_broker_guest::{Error, Position, Start, host};

/// The NATS headers an entry is made of: the rest of a stored message's stay in the host.
const ENTRY_HEADERS: [&str; 2] = [codec::KEY, codec::HEADERS];
/// A tail's heartbeat header: the stream sequence the consumer last delivered.
const LAST_STREAM: &str = "Nats-Last-Stream";
/// How many direct gets one window of a page sends (one `request-all` call each).
const GETS_IN_FLIGHT: usize = 64;
/// The tail consumer's idle heartbeat, in milliseconds.
const HEARTBEAT_MS: u32 = 1_000;
/// A tail that hears nothing (not even a heartbeat) this long ends.
const DEAF_MS: u32 = 3_500;
/// Deafness is noticed when more than this many ticks of `DEAF_MS / QUIET_TICKS` passed
/// without a message (the first of them may have begun before the silence did): after
/// `DEAF_MS` to `DEAF_MS` and one tick of silence.
const QUIET_TICKS: u32 = 4;

/// What a read needs to know of a topic's stream.
#[derive(Debug, Clone)]
struct State {
    stream: String,
    epoch: String,
    /// The oldest retained sequence (`last + 1` when empty).
    first: u64,
    /// The newest sequence (0 when nothing was ever appended).
    last: u64,
}

thread_local! {
    /// Epochs of the topics this instance appended to (a cache: the stream holds the truth).
    static EPOCHS: RefCell<HashMap<String, String>> = RefCell::new(HashMap::new());
}

/// Split an id `{epoch}:{seq}` (seq a canonical number ≥ 1); anything else is a bad request.
fn parse(id: &str) -> Result<(&str, u64), Error> {
    match ids::parse_log_id(id, "seq")? {
        (_, 0) => Err(Error::bad_request(format!(
            "malformed id `{id}`: expected `epoch:seq`"
        ))),
        parsed => Ok(parsed),
    }
}

/// The stream description that carries the epoch.
fn description(epoch: &str) -> String {
    format!("wrpc log; epoch={epoch}")
}

/// The epoch in a stream description.
fn epoch_of(info: &Value) -> Option<String> {
    let text = info.pointer("/config/description")?.as_str()?;
    let (_, epoch) = text.rsplit_once("epoch=")?;
    is_epoch(epoch).then(|| epoch.to_string())
}

/// The state of `topic`'s stream, creating the stream when missing.
async fn state(config: &Config, topic: &str) -> Result<State, Error> {
    let stream = config.stream("log", topic)?;
    let subject = config.subject("log", topic)?;
    let info = js::stream_info_or_create(&stream, || {
        let mut c = js::stream_config(config, &stream, &subject, description(&host::generate_id()));
        c["retention"] = json!("limits");
        c["max_msgs"] = json!(config.max_entries);
        c["allow_direct"] = json!(true);
        c
    })
    .await
    .map_err(|e| e.into_error(&format!("log stream {stream}")))?;
    let epoch = epoch_of(&info).ok_or_else(|| {
        Error::internal(format!(
            "stream {stream} exists but was not made by this adapter (no epoch in its description)"
        ))
    })?;
    let number = |p: &str| info.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let (messages, first, last) = (
        number("/state/messages"),
        number("/state/first_seq"),
        number("/state/last_seq"),
    );
    let first = if messages == 0 {
        last + 1
    } else {
        first.max(1)
    };
    EPOCHS.with_borrow_mut(|m| m.insert(topic.to_string(), epoch.clone()));
    Ok(State {
        stream,
        epoch,
        first,
        last,
    })
}

/// The sequence a read from `origin` starts at, checked against the stream's state.
fn start_seq(state: &State, origin: &Start) -> Result<u64, Error> {
    let id = match origin {
        Start::Earliest => return Ok(state.first),
        Start::Latest => return Ok(state.last + 1),
        Start::After(id) => id,
    };
    let (epoch, seq) = parse(id)?;
    if epoch != state.epoch {
        return Err(Error::gone(format!(
            "id `{id}` was minted by another log (epoch {epoch}, this log has {})",
            state.epoch
        )));
    }
    if seq > state.last {
        return Err(Error::bad_request(format!(
            "id `{id}` is past the tip (last sequence {})",
            state.last
        )));
    }
    if seq + 1 < state.first {
        return Err(Error::gone(format!(
            "id `{id}` is older than the retained history (oldest sequence {})",
            state.first
        )));
    }
    Ok(seq + 1)
}

/// A stored message (direct get or consumer delivery) as an entry at `seq`.
fn entry(epoch: &str, seq: u64, m: Message) -> Entry {
    Entry {
        id: ids::log_id(epoch, seq),
        pos: Position {
            partition: 0,
            offset: seq,
        },
        key: codec::get(&m.headers, codec::KEY).and_then(codec::unb64),
        headers: codec::unpack(&m.headers),
        value: m.payload,
    }
}

/// The stream sequence in a push delivery's `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.…`
/// reply subject (v1: 9 tokens; v2 adds domain and account hash).
fn delivered_seq(reply: &str) -> Option<u64> {
    let tokens: Vec<&str> = reply.split('.').collect();
    let at = match tokens.len() {
        9 => 5,
        n if n >= 11 => 7,
        _ => return None,
    };
    tokens.get(at)?.parse().ok()
}

/// Fetch sequences `from..to` with direct gets; `None` for a sequence the stream no longer has.
/// Each reply brings only the headers an entry is made of (the server adds four of its own and
/// keeps the publish's `Nats-Msg-Id` and `Nats-Expected-*`). The gets go in windows of
/// [`GETS_IN_FLIGHT`], two out at once ([`Windows`]): the answers of one are taken in while
/// the next is at the server.
async fn fetch(stream: &str, from: u64, to: u64) -> Result<Vec<Option<Message>>, Error> {
    let subject = format!("$JS.API.DIRECT.GET.{stream}");
    let window = |first: u64, end: u64| {
        let gets = (first..end)
            .map(|s| Outgoing {
                subject: subject.clone(),
                headers: Vec::new(),
                payload: format!("{{\"seq\":{s}}}").into_bytes(),
            })
            .collect();
        js::request_all(gets, false, Some(&ENTRY_HEADERS))
    };
    let mut out = Vec::with_capacity((to - from) as usize);
    // An error returns with the next window still out: dropping it drops its requests.
    let mut windows = Windows::new(from..to, GETS_IN_FLIGHT);
    while let Some(answers) = windows.next(&window).await {
        for got in answers {
            let m = got.map_err(crate::nats_error)?;
            match m.status {
                None => out.push(Some(m)),
                Some(404) => out.push(None),
                Some(status) => {
                    return Err(Error::internal(format!(
                        "direct get on {stream}: status {status} {}",
                        m.description
                    )));
                }
            }
        }
    }
    Ok(out)
}

/// Append `batch` to the stream of `topic`, in order (pipelined); the sequence of each.
async fn append_all(config: &Config, topic: &str, batch: Vec<RecordIn>) -> Result<Vec<u64>, Error> {
    let subject = config.subject("log", topic)?;
    let stream = config.stream("log", topic)?;
    let messages = batch
        .into_iter()
        .map(|record| {
            let mut headers = Vec::new();
            codec::push_packed(&mut headers, &record.headers);
            if let Some(key) = &record.key {
                codec::push(&mut headers, codec::KEY, codec::b64(key));
            }
            (headers, record.value)
        })
        .collect();
    js::publish_all(&subject, &stream, messages, || async {
        state(config, topic).await.map(|_| ())
    })
    .await
}

impl Guest for Component {
    async fn append(topic: String, batch: Vec<RecordIn>) -> Result<Vec<String>, Error> {
        let config = config()?;
        config.enc("log", &topic)?;
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let epoch = match EPOCHS.with_borrow(|m| m.get(&topic).cloned()) {
            Some(epoch) => epoch,
            None => state(&config, &topic).await?.epoch,
        };
        let seqs = append_all(&config, &topic, batch).await?;
        Ok(seqs.into_iter().map(|s| ids::log_id(&epoch, s)).collect())
    }

    fn parse_id(text: String) -> Result<(), Error> {
        parse(&text).map(|_| ())
    }

    async fn range(topic: String, origin: Start, limit: u32) -> Result<Page, Error> {
        if limit == 0 {
            return Err(Error::bad_request("limit must be at least 1"));
        }
        let config = config()?;
        // Earliest may race with trimming: read again from the new head (a few times).
        for _ in 0..5 {
            let state = state(&config, &topic).await?;
            let start = start_seq(&state, &origin)?;
            let end = (start + u64::from(limit)).min(state.last + 1);
            if start >= end {
                return Ok(Page {
                    entries: Vec::new(),
                    done: true,
                });
            }
            let got = fetch(&state.stream, start, end).await?;
            let complete = got.iter().all(Option::is_some);
            if !complete {
                if let Start::After(id) = &origin {
                    return Err(Error::gone(format!(
                        "id `{id}` is older than the retained history (trimmed during the read)"
                    )));
                }
                continue;
            }
            let entries: Vec<Entry> = got
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(i, m)| entry(&state.epoch, start + i as u64, m))
                .collect();
            return Ok(Page {
                done: end > state.last,
                entries,
            });
        }
        Err(Error::unavailable(format!(
            "log {topic}: trimmed faster than it can be read"
        )))
    }

    async fn tail(
        topic: String,
        origin: Start,
    ) -> Result<(Vec<Position>, StreamReader<Entry>), Error> {
        let config = config()?;
        let state = state(&config, &topic).await?;
        let start = start_seq(&state, &origin)?;
        let deliver = client::new_inbox();
        let keep = [codec::KEY, codec::HEADERS, LAST_STREAM];
        let (_, deliveries) = client::subscribe_keeping(deliver.clone(), None, codec::names(&keep))
            .await
            .map_err(crate::nats_error)?;
        let consumer = push_consumer(&state.stream, &deliver, start)
            .await
            .map_err(|e| e.into_error(&format!("tail consumer on {}", state.stream)))?;
        let (tx, rx) = crate::wit_stream::new::<Entry>();
        wit_bindgen::spawn_local(follow(state, deliver, consumer, start, deliveries, tx));
        Ok((
            vec![Position {
                partition: 0,
                offset: start,
            }],
            rx,
        ))
    }
}

/// Create an ephemeral push consumer on `stream` delivering to `deliver` from sequence `start`
/// (ack none, idle heartbeats, memory state); its name.
async fn push_consumer(stream: &str, deliver: &str, start: u64) -> Result<String, Fail> {
    let created = js::api(
        &format!("CONSUMER.CREATE.{stream}"),
        &json!({
            "stream_name": stream,
            "config": {
                "deliver_policy": "by_start_sequence",
                "opt_start_seq": start,
                "ack_policy": "none",
                "deliver_subject": deliver,
                "idle_heartbeat": u64::from(HEARTBEAT_MS) * 1_000_000,
                "inactive_threshold": 10_000_000_000u64,
                "mem_storage": true,
                "num_replicas": 1,
            }
        }),
    )
    .await?;
    Ok(created
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string())
}

/// Delete a tail consumer (best effort: an unused one also goes after its inactivity
/// threshold).
async fn delete_consumer(stream: &str, consumer: &str) {
    if !consumer.is_empty() {
        let _ = js::api(
            &format!("CONSUMER.DELETE.{stream}.{consumer}"),
            &Value::Null,
        )
        .await;
    }
}

/// Replace the tail consumer `old` by a new one from `next` on the same inbox, once the server
/// has the inbox subscription again (after a reconnect the client re-subscribes first).
async fn recreate(stream: &str, deliver: &str, old: &str, next: u64) -> Result<String, Fail> {
    delete_consumer(stream, old).await;
    client::flush().await.map_err(Fail::Nats)?;
    push_consumer(stream, deliver, next).await
}

/// Move a tail consumer's deliveries into `to`, in order, until a gap, deafness or a dropped
/// reader; then delete the consumer.
async fn follow(
    state: State,
    deliver: String,
    mut consumer: String,
    mut next: u64,
    mut from: StreamReader<Message>,
    mut to: wit_bindgen::StreamWriter<Entry>,
) {
    let mut size = ReadSize::default();
    // Deafness is counted in ticks, so a live entry starts no host timer of its own: one timer
    // per tick, and the read in flight goes on across ticks.
    let tick = Ticker::new(DEAF_MS / QUIET_TICKS);
    let mut quiet = 0;
    let why = loop {
        let heard = {
            let mut read = pin!(size.read(&mut from));
            loop {
                match select(read.as_mut(), pin!(tick.tick())).await {
                    Either::Left((read, _)) => {
                        quiet = 0;
                        break Some(read);
                    }
                    Either::Right(_) => {
                        quiet += 1;
                        if quiet > QUIET_TICKS {
                            quiet = 0;
                            break None;
                        }
                    }
                }
            }
        };
        let (result, batch) = match heard {
            Some(read) => read,
            None => {
                // The server lost the consumer (a restart forgets memory consumers) or the
                // connection is down: a new consumer from where this tail stands, on the
                // same subscription, so the reader sees nothing of it.
                crate::debug(&format!(
                    "tail of {}: no heartbeat for {DEAF_MS} ms, re-creating its consumer at {next}",
                    state.stream
                ));
                match recreate(&state.stream, &deliver, &consumer, next).await {
                    Ok(name) => {
                        consumer = name;
                        continue;
                    }
                    Err(e) => {
                        break format!("no heartbeat, and re-creating the consumer failed: {e:?}");
                    }
                }
            }
        };
        let mut entries = Vec::with_capacity(batch.len());
        let mut gap = None;
        let mut heartbeat = false;
        let mut missed = false;
        for m in batch {
            if m.status.is_some() {
                heartbeat = true;
                // A heartbeat names the last sequence the consumer sent: past what arrived
                // here, deliveries were lost (sent while the subscription was not yet back
                // after a reconnect).
                if codec::number(&m.headers, LAST_STREAM).is_some_and(|last| last >= next) {
                    missed = true;
                }
                continue;
            }
            match m.reply.as_deref().and_then(delivered_seq) {
                Some(seq) if seq == next => {
                    entries.push(entry(&state.epoch, seq, m));
                    next += 1;
                }
                Some(seq) if seq < next => {}
                other => {
                    gap = Some(format!("expected sequence {next}, got {other:?}"));
                    break;
                }
            }
        }
        if !entries.is_empty() {
            if !to.write_all(entries).await.is_empty() {
                break "the reader is gone".to_string();
            }
        } else if heartbeat {
            // A write of nothing tells whether the reader is still there.
            let (result, _) = to.write(Vec::new()).await;
            if matches!(result, StreamResult::Dropped) {
                break "the reader is gone".to_string();
            }
        }
        if let Some(gap) = gap {
            break gap;
        }
        if missed {
            crate::debug(&format!(
                "tail of {}: deliveries from {next} were lost, re-creating its consumer",
                state.stream
            ));
            match recreate(&state.stream, &deliver, &consumer, next).await {
                Ok(name) => consumer = name,
                Err(e) => break format!("re-creating the consumer failed: {e:?}"),
            }
        }
        if !matches!(result, StreamResult::Complete(_)) {
            break "the subscription ended".to_string();
        }
    };
    crate::debug(&format!("tail of {} ends: {why}", state.stream));
    drop(from);
    drop(to);
    delete_consumer(&state.stream, &consumer).await;
}
