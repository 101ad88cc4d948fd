//! `wrpc:broker/direct` on the direct exchange `P.dx`: address `a` is the routing key `enc(a)`
//! (`inbox()` mints `inbox.<generate-id>`). An ungrouped listener is a server-named exclusive
//! auto-delete queue bound with that key; the listeners of group `g` share the auto-delete
//! queue `P.dx.<enc(len(a):a g)>`, bound the same, each consuming it (they compete). Listeners
//! consume without acks and return after bind-ok and consume-ok.
//!
//! A send is a `mandatory` publish on the confirm channel with `expiration` = the timeout (a
//! packet nobody took in time is discarded by the broker): an unroutable packet comes back as
//! `basic.return` before its confirm, which makes the send `unavailable` (503). Correlation id
//! and reply-to ride in the message properties (in headers when longer than 255 bytes). One
//! sender's packets to one address go in order on one channel to one queue.
//!
//! Stop is `basic.cancel`: after cancel-ok the broker routes nothing more to this listener (the
//! last consumer of an auto-delete queue takes the queue with it, so a send after it is 503),
//! and what it sent before is handed over.

use wit_bindgen::StreamReader;

use crate::backplane::{bound_queue, transient};
use crate::codec;
use crate::exports::wrpc::broker::direct::{Guest, ListenerId, Packet};
use crate::wrpc::amqp::client::{self, Confirm, Delivery};
use crate::{Component, channel, config};
use wrpc_broker_guest::{Error, relay};

/// The longest property string (an AMQP short string).
const MAX_SHORT: usize = 255;

/// A delivery as a packet.
fn packet(d: Delivery) -> Packet {
    let h = &d.properties.headers;
    Packet {
        headers: codec::unpack(h),
        correlation_id: d
            .properties
            .correlation_id
            .clone()
            .or_else(|| codec::text(h, codec::CORRELATION_ID)),
        reply_to: d
            .properties
            .reply_to
            .clone()
            .or_else(|| codec::text(h, codec::REPLY_TO)),
        body: d.body,
    }
}

/// Put `value` in a property when it fits a short string, else in header `name`.
fn short_or_header(
    value: Option<String>,
    name: &str,
    headers: &mut Vec<(String, client::FieldValue)>,
) -> Option<String> {
    match value {
        Some(v) if v.len() > MAX_SHORT => {
            headers.push((name.to_string(), client::FieldValue::Bytes(v.into_bytes())));
            None
        }
        other => other,
    }
}

impl Guest for Component {
    fn inbox() -> String {
        wrpc_broker_guest::ids::prefixed("inbox.")
    }

    async fn send(address: String, message: Packet, timeout_ms: u32) -> Result<(), Error> {
        let config = config()?;
        if address.is_empty() {
            return Err(Error::bad_request("empty address"));
        }
        let (exchange, key) = (config.exchange("dx"), config.key(&address)?);
        let mut headers = Vec::new();
        codec::pack(&mut headers, &message.headers);
        let mut properties = transient();
        properties.correlation_id =
            short_or_header(message.correlation_id, codec::CORRELATION_ID, &mut headers);
        properties.reply_to = short_or_header(message.reply_to, codec::REPLY_TO, &mut headers);
        if timeout_ms > 0 {
            properties.expiration = Some(timeout_ms.to_string());
        }
        properties.headers = headers;
        let confirm = channel::shared()
            .call(|ch| {
                client::publish(
                    ch,
                    exchange.clone(),
                    key.clone(),
                    true,
                    properties.clone(),
                    message.body.clone(),
                )
            })
            .await?;
        match confirm {
            Confirm::Ack => Ok(()),
            Confirm::Returned(why) => Err(Error::unavailable(format!(
                "nobody listens on {address} (the broker returned it: {} {})",
                why.code, why.text
            ))),
            Confirm::Nack => Err(Error::refused(format!(
                "the broker refused a packet to {address}"
            ))),
        }
    }

    async fn listen(
        address: String,
        group: Option<String>,
    ) -> Result<(ListenerId, StreamReader<Packet>), Error> {
        let config = config()?;
        if address.is_empty() {
            return Err(Error::bad_request("empty address"));
        }
        let (exchange, key) = (config.exchange("dx"), config.key(&address)?);
        let shared = match &group {
            Some(g) => Some(config.queue("dx", &format!("{}:{address}{g}", address.len()))?),
            None => None,
        };
        // A group's queue may vanish between its declare and the consume, when its last
        // consumer (elsewhere) just left: declare it again.
        let bound = match bound_queue(&exchange, &key, shared.as_deref()).await {
            Err(_) if shared.is_some() => bound_queue(&exchange, &key, shared.as_deref()).await?,
            bound => bound?,
        };
        let (tx, rx) = crate::wit_stream::new::<Packet>();
        let (ch, tag, mut from) = (bound.channel, bound.tag, bound.deliveries);
        let id = relay::spawn_listener(move |stop| async move {
            let deliver = |batch: Vec<Delivery>| batch.into_iter().map(packet).collect();
            let relayed = relay::pump(&mut from, tx, deliver);
            relay::until_stopped(relayed, &stop, || async move {
                let _ = client::cancel(ch, tag).await;
            })
            .await;
        });
        Ok((id, rx))
    }

    fn healthy(listener: ListenerId) -> Option<bool> {
        relay::listener_healthy(listener)
    }

    async fn stop(listener: ListenerId) {
        relay::stop_listener(listener).await;
    }
}
