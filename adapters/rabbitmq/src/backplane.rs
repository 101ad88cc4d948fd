//! `wrpc:broker/backplane` on the direct exchange `P.bp`: channel `c` is the routing key
//! `enc(c)` (a direct exchange matches keys exactly, so `room:*`, `#` and `a.b` are literal).
//! Publish is a `basic.publish` per payload on the confirm channel, the whole batch written
//! before its confirms are awaited, not mandatory (nobody subscribed: dropped), answered once
//! the broker confirmed them. A subscription is a
//! server-named exclusive auto-delete queue bound with that key (bind-ok: from then on every
//! publish reaches it), bounded by `x-max-length` (drop-head: a laggard loses its oldest) and
//! consumed without acks; dropping the stream cancels the consumer and the broker deletes the
//! queue. The subscription's stream is the driver's stream of bodies, handed on: deliveries
//! never enter the instance. At most once: nothing is kept for a subscriber that is not there.

use wit_bindgen::StreamReader;

use crate::channel;
use crate::exports::wrpc::broker::backplane::Guest;
use crate::wrpc::amqp::client::{
    self, Confirm, Delivery, FieldValue, Message, Properties, QueueOptions,
};
use crate::{Component, config};
use wrpc_broker_guest::Error;

/// How many payloads a subscription's queue holds before it drops the oldest.
const MAX_BACKLOG: i64 = 10_000;

/// Properties of a transient message with no headers.
pub(crate) fn transient() -> Properties {
    Properties {
        message_id: None,
        correlation_id: None,
        reply_to: None,
        expiration: None,
        persistent: false,
        headers: Vec::new(),
    }
}

/// A consumer without acks on the listening channel: its channel, tag and deliveries.
pub(crate) struct Bound {
    pub(crate) channel: u64,
    pub(crate) tag: String,
    pub(crate) deliveries: StreamReader<Delivery>,
}

/// An auto-delete queue bound to `exchange` with `key`, consumed without acks on the listening
/// channel: server-named and exclusive, or the queue `shared_name` its consumers share.
pub(crate) async fn bound_queue(
    exchange: &str,
    key: &str,
    shared_name: Option<&str>,
) -> Result<Bound, Error> {
    let queue = declare_bound(exchange, key, shared_name).await?;
    let on = std::cell::Cell::new(0);
    let (tag, deliveries) = channel::listen()
        .call(|ch| {
            on.set(ch);
            client::consume(ch, queue.clone(), true, shared_name.is_none(), Vec::new())
        })
        .await?;
    Ok(Bound {
        channel: on.get(),
        tag,
        deliveries,
    })
}

/// Declare an auto-delete queue bound to `exchange` with `key` on the listening channel
/// (server-named and exclusive, or the queue `shared_name` its consumers share); its name.
async fn declare_bound(
    exchange: &str,
    key: &str,
    shared_name: Option<&str>,
) -> Result<String, Error> {
    let listen = channel::listen();
    let options = QueueOptions {
        durable: false,
        exclusive: shared_name.is_none(),
        auto_delete: true,
        passive: false,
    };
    let arguments = vec![("x-max-length".to_string(), FieldValue::Long(MAX_BACKLOG))];
    let name = shared_name.unwrap_or_default().to_string();
    let queue = listen
        .call(|ch| client::queue_declare(ch, name.clone(), options, arguments.clone()))
        .await?
        .name;
    listen
        .call(|ch| client::queue_bind(ch, queue.clone(), exchange.to_string(), key.to_string()))
        .await?;
    Ok(queue)
}

impl Guest for Component {
    async fn publish(channel: String, payloads: Vec<Vec<u8>>) -> Result<(), Error> {
        let config = config()?;
        let (exchange, key) = (config.exchange("bp"), config.key(&channel)?);
        let messages: Vec<Message> = payloads
            .into_iter()
            .map(|body| Message {
                properties: transient(),
                body,
            })
            .collect();
        let confirms = channel::shared()
            .call(|ch| {
                client::publish_batch(ch, exchange.clone(), key.clone(), false, messages.clone())
            })
            .await?;
        if confirms.iter().any(|c| matches!(c, Confirm::Nack)) {
            return Err(Error::refused(format!(
                "the broker refused a payload on `{channel}`"
            )));
        }
        Ok(())
    }

    async fn subscribe(channel: String) -> Result<StreamReader<Vec<u8>>, Error> {
        let config = config()?;
        let key = config.key(&channel)?;
        let queue = declare_bound(&config.exchange("bp"), &key, None).await?;
        // The driver's stream of bodies is the subscription as it is: handed on, its payloads
        // go from the host's connection to the host's reader without entering this instance.
        let (_, bodies) = channel::listen()
            .call(|ch| client::consume_bodies(ch, queue.clone(), true, Vec::new()))
            .await?;
        Ok(bodies)
    }
}
