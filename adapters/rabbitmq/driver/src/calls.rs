//! The driver's calls that are more than one lapin call: opening a channel (with confirms),
//! publishing (one message, or a batch written before its confirms are awaited), consuming into
//! a stream fed by a task of its own; and the channel lookups every call starts with.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::Confirmation;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
};
use tokio::sync::mpsc;

use super::bindings::wit;
use super::channels::Entry;
use super::{AmqpDriver, REFUSALS, convert};

/// How long opening a channel may take (a connection that died unnoticed never answers).
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// Deliveries a consumer's stream holds before its task waits for the guest to read.
const CONSUMER_BUFFER: usize = 512;

/// What the broker said of one publish, as the WIT confirm.
fn confirm(confirmation: Confirmation) -> wit::Confirm {
    match confirmation {
        Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
            wit::Confirm::Returned(wit::CloseReason {
                code: returned.reply_code,
                text: returned.reply_text.to_string(),
            })
        }
        Confirmation::Ack(None) | Confirmation::NotRequested => wit::Confirm::Ack,
        Confirmation::Nack(None) => wit::Confirm::Nack,
    }
}

impl AmqpDriver {
    /// Open channel `id`, or `closed` when it is gone (or `stale` when unknown).
    pub(crate) fn channel(&self, id: u64) -> Result<Arc<Entry>, wit::AmqpError> {
        let entry = self
            .shared
            .channels
            .get(id)
            .ok_or_else(|| wit::AmqpError::Stale(format!("no channel {id}")))?;
        if !entry.is_open() {
            return Err(wit::AmqpError::Closed(wit::CloseReason {
                code: 0,
                text: format!("channel {id} is closed"),
            }));
        }
        Ok(entry)
    }

    /// A settlement on channel `id`: `stale` when the channel is gone (the broker requeued its
    /// deliveries), `refused` when a test armed a refusal for a queue consumed on it.
    pub(crate) fn settling(&self, id: u64) -> Result<Arc<Entry>, wit::AmqpError> {
        let entry = self.channel(id).map_err(|e| match e {
            wit::AmqpError::Closed(why) => wit::AmqpError::Stale(why.text),
            other => other,
        })?;
        if REFUSALS.is_armed()
            && let Some(why) = REFUSALS.refuse(|queue| entry.any_queue(|q| q.contains(queue)))
        {
            return Err(wit::AmqpError::Refused(why));
        }
        Ok(entry)
    }

    pub(crate) async fn open_channel(&self, confirms: bool) -> Result<u64, wit::AmqpError> {
        let (connection, _) = self
            .connection()
            .await
            .map_err(wit::AmqpError::Unavailable)?;
        let channel = tokio::time::timeout(OPEN_TIMEOUT, connection.create_channel())
            .await
            .map_err(|_| wit::AmqpError::Unavailable("opening a channel timed out".into()))?
            .map_err(|e| wit::AmqpError::Unavailable(e.to_string()))?;
        if confirms {
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(convert::error)?;
        }
        Ok(self.shared.channels.insert(channel))
    }

    /// Publish one message on channel `id` and wait for its confirm.
    pub(crate) async fn publish(
        &self,
        id: u64,
        exchange: String,
        routing_key: String,
        mandatory: bool,
        properties: wit::Properties,
        body: Vec<u8>,
    ) -> Result<wit::Confirm, wit::AmqpError> {
        let message = wit::Message { properties, body };
        let confirms = self
            .publish_batch(id, exchange, routing_key, mandatory, vec![message])
            .await?;
        Ok(confirms
            .into_iter()
            .next()
            .expect("publish_batch confirms each message it publishes"))
    }

    /// Publish `messages` in order on channel `id`, every one written before the first
    /// confirm is awaited; their confirms, in order.
    pub(crate) async fn publish_batch(
        &self,
        id: u64,
        exchange: String,
        routing_key: String,
        mandatory: bool,
        messages: Vec<wit::Message>,
    ) -> Result<Vec<wit::Confirm>, wit::AmqpError> {
        let entry = self.channel(id)?;
        let exchange = convert::short("the exchange name", exchange)?;
        let key = convert::short("the routing key", routing_key)?;
        let options = BasicPublishOptions {
            mandatory,
            ..BasicPublishOptions::default()
        };
        // Converted first, so a bad message is refused before anything is written.
        let messages = messages
            .into_iter()
            .map(|m| Ok((convert::properties(m.properties)?, m.body)))
            .collect::<Result<Vec<_>, wit::AmqpError>>()?;
        let mut pending = Vec::with_capacity(messages.len());
        for (properties, body) in messages {
            let written = entry
                .channel
                .basic_publish(exchange.clone(), key.clone(), options, &body, properties)
                .await
                .map_err(convert::error)?;
            pending.push(written);
        }
        let mut confirms = Vec::with_capacity(pending.len());
        for written in pending {
            confirms.push(confirm(written.await.map_err(convert::error)?));
        }
        Ok(confirms)
    }

    pub(crate) async fn consume(
        &self,
        id: u64,
        queue: String,
        no_ack: bool,
        exclusive: bool,
        arguments: wit::FieldTable,
    ) -> Result<(String, Deliveries), wit::AmqpError> {
        let entry = self.channel(id)?;
        let arguments = convert::table(arguments)?;
        let options = BasicConsumeOptions {
            no_ack,
            exclusive,
            ..BasicConsumeOptions::default()
        };
        let name = convert::short("the queue name", queue.clone())?;
        let consumer = entry
            .channel
            .basic_consume(name, "".into(), options, arguments)
            .await
            .map_err(convert::error)?;
        entry.consumes(&queue);
        let tag = consumer.tag().to_string();
        let (tx, rx) = mpsc::channel(CONSUMER_BUFFER);
        tokio::spawn(forward(consumer, entry.channel.clone(), tx));
        Ok((tag, rx))
    }
}

/// Move a consumer's deliveries into its stream until it ends (cancelled, channel closed) or
/// the stream is dropped (then cancel it).
async fn forward(
    mut consumer: lapin::Consumer,
    channel: lapin::Channel,
    tx: mpsc::Sender<wit::Delivery>,
) {
    loop {
        let next = tokio::select! {
            next = consumer.next() => next,
            () = tx.closed() => break,
        };
        match next {
            Some(Ok(delivery)) => {
                if tx.send(convert::delivery(delivery)).await.is_err() {
                    break;
                }
            }
            Some(Err(e)) => {
                tracing::debug!(consumer = %consumer.tag(), "amqp: consumer ended: {e}");
                return;
            }
            None => return,
        }
    }
    let _ = channel
        .basic_cancel(consumer.tag(), BasicCancelOptions::default())
        .await;
}

/// A consumer's deliveries, in order (a batch source for its stream).
pub(crate) type Deliveries = mpsc::Receiver<wit::Delivery>;
