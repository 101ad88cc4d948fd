//! `wrpc:broker/direct` on core NATS: address `a` is the subject `P.dx.<enc(a)>` (`inbox()`
//! mints `P.inbox.<generate-id>`), a listener is a SUB on it, in queue group `enc(group)` when
//! grouped (members compete; every ungrouped SUB gets every packet). The body is the payload;
//! headers, correlation id and reply-to ride in NATS headers.
//!
//! A send is the driver's `publish-checked`: it answers once the server routed the packet to a
//! subscriber, or said nobody subscribes (its 503 makes the send `unavailable`). Core NATS holds
//! nothing, so a packet nobody took is gone at once (discard is implicit). A listener is healthy
//! while its subscription stream is open.

use wit_bindgen::StreamReader;

use crate::codec;
use crate::exports::wrpc::broker::direct::{Guest, ListenerId, Packet};
use crate::wrpc::nats::client::{self, Message, NatsError};
use crate::{Component, DEFAULT_PREFIX, config, nats_error};
use wrpc_broker_guest::Error;
use wrpc_broker_guest::relay;

/// How long a send waits for the server's word when the caller gave no timeout.
const DEFAULT_SEND_MS: u32 = 5_000;

/// A broker packet as NATS headers.
fn headers_of(p: &Packet) -> wrpc_broker_guest::Headers {
    let mut headers = Vec::new();
    codec::push_packed(&mut headers, &p.headers);
    if let Some(id) = &p.correlation_id {
        codec::push(
            &mut headers,
            codec::CORRELATION_ID,
            codec::b64(id.as_bytes()),
        );
    }
    if let Some(to) = &p.reply_to {
        codec::push(&mut headers, codec::REPLY_TO, codec::b64(to.as_bytes()));
    }
    headers
}

/// A text field of a packet from its base64url header.
fn text_field(m: &Message, name: &str) -> Option<String> {
    String::from_utf8(codec::unb64(codec::get(&m.headers, name)?)?).ok()
}

/// A NATS message as a broker packet.
fn packet(m: Message) -> Packet {
    Packet {
        headers: codec::unpack(&m.headers),
        correlation_id: text_field(&m, codec::CORRELATION_ID),
        reply_to: text_field(&m, codec::REPLY_TO),
        body: m.payload,
    }
}

/// Turn a batch read from a subscription into the batch the listener's stream gets.
fn deliver(batch: Vec<Message>) -> Vec<Packet> {
    batch
        .into_iter()
        .filter(|m| m.status.is_none())
        .map(packet)
        .collect()
}

/// Stop every live listener (`close`).
pub(crate) async fn stop_all() {
    relay::stop_all_listeners().await;
}

impl Guest for Component {
    fn inbox() -> String {
        let prefix = config().map_or_else(|_| DEFAULT_PREFIX.to_string(), |c| c.prefix.clone());
        wrpc_broker_guest::ids::prefixed(&format!("{prefix}.inbox."))
    }

    async fn send(address: String, message: Packet, timeout_ms: u32) -> Result<(), Error> {
        let subject = config()?.subject("dx", &address)?;
        let wait = if timeout_ms == 0 {
            DEFAULT_SEND_MS
        } else {
            timeout_ms
        };
        let headers = headers_of(&message);
        match client::publish_checked(subject, headers, message.body, wait).await {
            Ok(()) => Ok(()),
            Err(NatsError::NoResponders(why)) => Err(Error::unavailable(format!(
                "nobody listens on {address} ({why})"
            ))),
            Err(NatsError::Timeout(_)) => Err(Error::Timeout(format!(
                "{address}: NATS did not confirm the send within {wait} ms"
            ))),
            Err(NatsError::Unavailable(why)) => {
                Err(Error::unavailable(format!("{address}: {why}")))
            }
            Err(e) => Err(nats_error(e)),
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
        let subject = config.subject("dx", &address)?;
        let group = match group {
            Some(g) => Some(config.enc("group", &g)?),
            None => None,
        };
        let (subscription, mut from) = client::subscribe(subject, group)
            .await
            .map_err(nats_error)?;
        let (tx, rx) = crate::wit_stream::new::<Packet>();
        // Stopped: the server stops routing to us first (confirmed: a send after `stop` sees
        // nobody), then what it routed before is handed over.
        let id = relay::spawn_listener(move |stop| async move {
            let relayed = relay::pump(&mut from, tx, deliver);
            relay::until_stopped(relayed, &stop, || client::unsubscribe(subscription)).await;
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
