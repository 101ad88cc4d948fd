//! Appending: one appender per topic and instance, whose read-back consumer on the stream
//! (from `last`, started before the first publish) tells the offset of each appended entry by
//! its `message_id`, and whose first delivery tells the epoch (on a stream nothing was appended
//! to, the appender mints it and puts the stream's marker first).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use super::{
    APPENDERS, DECLARED, FIRST_WAIT_MS, NON_EMPTY, Reading, epoch, marker, non_empty, offset,
};
use crate::channel;
use crate::codec;
use crate::exports::wrpc::broker::log::RecordIn;
use crate::wrpc::amqp::client::{self, Confirm, FieldValue, Message};
use wrpc_broker_guest::signal::{Latch, Notify, Ticker};
use wrpc_broker_guest::{Error, host};

/// How long an append waits for its read-back.
const READ_BACK_MS: u64 = 10_000;
/// The read-back task looks at least this often (milliseconds), and wakes the appends waiting.
const TICK_MS: u32 = 1_000;

/// One topic's appender on this instance: the epoch, and the read-back consumer that tells
/// each appended entry's offset.
pub(super) struct Appender {
    epoch: RefCell<String>,
    /// Set once the epoch is known (the creator learns it; concurrent appends wait).
    ready: Latch,
    /// The message ids of appends in flight, and the offset once read back.
    pending: RefCell<HashMap<String, Option<u64>>>,
    read_back: Notify,
    /// The read-back consumer ended: the next append makes a new appender.
    pub(super) dead: Cell<bool>,
    failed: RefCell<Option<Error>>,
    /// The read-back consumer's channel (0 until started).
    channel: Cell<u64>,
}

impl Appender {
    /// The appender of `topic`, made when there is none.
    pub(super) async fn of(topic: &str, stream: &str) -> Result<Rc<Appender>, Error> {
        // One whose read-back consumer is gone (its channel closed with a lost connection)
        // would never see the entries: make a new one before publishing.
        let existing = APPENDERS
            .with_borrow(|a| a.get(topic).cloned())
            .filter(|a| !a.dead.get() && (!a.ready.is_set() || client::is_open(a.channel.get())));
        let appender = match existing {
            Some(appender) => appender,
            None => {
                let appender = Rc::new(Appender {
                    epoch: RefCell::new(String::new()),
                    ready: Latch::new(),
                    pending: RefCell::new(HashMap::new()),
                    read_back: Notify::new(),
                    dead: Cell::new(false),
                    failed: RefCell::new(None),
                    channel: Cell::new(0),
                });
                APPENDERS.with_borrow_mut(|a| a.insert(topic.to_string(), appender.clone()));
                if let Err(e) = appender.clone().start(stream).await {
                    appender.dead.set(true);
                    *appender.failed.borrow_mut() = Some(e);
                    APPENDERS.with_borrow_mut(|a| a.remove(topic));
                }
                appender.ready.set();
                appender
            }
        };
        appender.ready.wait().await;
        let failed = appender.failed.borrow().clone();
        match failed {
            Some(e) => Err(e),
            None => Ok(appender),
        }
    }

    /// Start the read-back consumer (from the last chunk, which tells the epoch). On a stream
    /// nothing was appended to, mint the epoch and put the marker first.
    async fn start(self: Rc<Self>, stream: &str) -> Result<(), Error> {
        let reading = Reading::start(stream, FieldValue::Text("last".into())).await?;
        let last = match non_empty(stream).await {
            Ok(true) => reading.inbox.next(FIRST_WAIT_MS).await,
            Ok(false) => None,
            Err(e) => {
                reading.close().await;
                return Err(e);
            }
        };
        let epoch = match last {
            Some(d) => epoch(&d),
            None => {
                let epoch = host::generate_id();
                if let Err(e) = Self::mark(stream, &epoch).await {
                    reading.close().await;
                    return Err(e);
                }
                epoch
            }
        };
        *self.epoch.borrow_mut() = epoch;
        self.channel.set(reading.channel);
        wit_bindgen::spawn_local(self.watch(reading));
        Ok(())
    }

    /// Put the marker of `stream` (its body the epoch), confirmed, before its first entry.
    async fn mark(stream: &str, epoch: &str) -> Result<(), Error> {
        let name = marker(stream);
        let properties = codec::persistent(Vec::new());
        let confirm = channel::shared()
            .call(|ch| {
                client::publish(
                    ch,
                    String::new(),
                    name.clone(),
                    true,
                    properties.clone(),
                    epoch.as_bytes().to_vec(),
                )
            })
            .await?;
        match confirm {
            Confirm::Ack => {
                NON_EMPTY.with_borrow_mut(|n| n.insert(stream.to_string()));
                Ok(())
            }
            _ => Err(Error::unavailable(format!(
                "the marker of {stream} was not taken"
            ))),
        }
    }

    /// Note the offset of each pending append the read-back consumer sees; notify
    /// `read_back` after each look, at least once per [`TICK_MS`] (the appends waiting count on
    /// it for their deadline).
    async fn watch(self: Rc<Self>, reading: Reading) {
        let tick = Ticker::new(TICK_MS);
        while !reading.inbox.is_done() {
            reading.inbox.wait_on(&tick, None).await;
            let mut pending = self.pending.borrow_mut();
            for d in reading.inbox.take(usize::MAX) {
                if let Some(slot) = d
                    .properties
                    .message_id
                    .as_ref()
                    .and_then(|id| pending.get_mut(id))
                {
                    *slot = Some(offset(&d));
                }
            }
            drop(pending);
            self.read_back.notify();
        }
        self.dead.set(true);
        self.read_back.notify();
        reading.close().await;
    }

    /// Publish `batch` in order, confirmed, then wait for the offset of each.
    pub(super) async fn append(
        &self,
        stream: &str,
        batch: Vec<RecordIn>,
    ) -> Result<Vec<String>, Error> {
        let epoch = self.epoch.borrow().clone();
        let mut ids = Vec::with_capacity(batch.len());
        let result = self.publish_all(stream, &epoch, batch, &mut ids).await;
        let offsets = match result {
            Ok(()) => self.offsets(&ids).await,
            Err(e) => Err(e),
        };
        let mut pending = self.pending.borrow_mut();
        for id in &ids {
            pending.remove(id);
        }
        Ok(offsets?
            .into_iter()
            .map(|o| wrpc_broker_guest::ids::log_id(&epoch, o))
            .collect())
    }

    /// Publish `batch` to `stream` in one driver call (every record written before the
    /// confirms are awaited), noting each record's message id in `ids` and as pending.
    async fn publish_all(
        &self,
        stream: &str,
        epoch: &str,
        batch: Vec<RecordIn>,
        ids: &mut Vec<String>,
    ) -> Result<(), Error> {
        let mut messages = Vec::with_capacity(batch.len());
        for record in batch {
            let id = host::generate_id();
            self.pending.borrow_mut().insert(id.clone(), None);
            ids.push(id.clone());
            let mut headers = vec![codec::text_field(codec::EPOCH, epoch)];
            if let Some(key) = record.key {
                headers.push((codec::KEY.to_string(), FieldValue::Bytes(key)));
            }
            codec::pack(&mut headers, &record.headers);
            let mut properties = codec::persistent(headers);
            properties.message_id = Some(id);
            messages.push(Message {
                properties,
                body: record.value,
            });
        }
        let confirms = channel::shared()
            .call(|ch| {
                client::publish_batch(
                    ch,
                    String::new(),
                    stream.to_string(),
                    true,
                    messages.clone(),
                )
            })
            .await?;
        for confirm in confirms {
            match confirm {
                Confirm::Ack => {}
                Confirm::Nack => {
                    return Err(Error::refused(format!(
                        "the broker refused an entry of {stream}"
                    )));
                }
                Confirm::Returned(why) => {
                    DECLARED.with_borrow_mut(|d| d.remove(stream));
                    return Err(Error::unavailable(format!(
                        "{stream} is gone ({} {})",
                        why.code, why.text
                    )));
                }
            }
        }
        Ok(())
    }

    /// The offsets of `ids`, once the read-back consumer saw them all.
    async fn offsets(&self, ids: &[String]) -> Result<Vec<u64>, Error> {
        let deadline = host::now_ms() + READ_BACK_MS;
        loop {
            let woken = self.read_back.notified();
            let seen: Option<Vec<u64>> = {
                let pending = self.pending.borrow();
                ids.iter()
                    .map(|id| pending.get(id).copied().flatten())
                    .collect()
            };
            if let Some(offsets) = seen {
                return Ok(offsets);
            }
            if self.dead.get() || host::now_ms() > deadline {
                return Err(Error::unavailable(
                    "the appended entries were not read back (the stream consumer ended)",
                ));
            }
            // The read-back task notifies after each look and once per tick at least, and when
            // it ends: no timer of its own per append.
            woken.await;
        }
    }
}
