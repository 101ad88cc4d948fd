//! `wrpc:broker/backplane` on core NATS: channel `c` is the subject `P.bp.<enc(c)>`, one token,
//! so `*`, `>` and `.` in a name are literal and never wildcards. Publish is a core PUB per
//! payload followed by a flush (PING/PONG: the server has them, or the call fails); subscribe is
//! a SUB the driver flushes before it returns, so a payload published after the return is
//! delivered. At most once: core NATS keeps nothing, and a slow subscriber loses messages.

use crate::exports::wrpc::broker::backplane::Guest;
use crate::wrpc::nats::client::{self, Message};
use crate::{Component, config, nats_error};
use wit_bindgen::StreamReader;
use wrpc_broker_guest::Error;
use wrpc_broker_guest::relay;

impl Guest for Component {
    async fn publish(channel: String, payloads: Vec<Vec<u8>>) -> Result<(), Error> {
        let subject = config()?.subject("bp", &channel)?;
        for payload in payloads {
            client::publish(subject.clone(), Vec::new(), payload, None)
                .await
                .map_err(nats_error)?;
        }
        client::flush().await.map_err(nats_error)
    }

    async fn subscribe(channel: String) -> Result<StreamReader<Vec<u8>>, Error> {
        let subject = config()?.subject("bp", &channel)?;
        let (_, mut from) = client::subscribe(subject, None).await.map_err(nats_error)?;
        let (tx, rx) = crate::wit_stream::new::<Vec<u8>>();
        let payloads = |batch: Vec<Message>| {
            batch
                .into_iter()
                .filter(|m| m.status.is_none())
                .map(|m| m.payload)
                .collect()
        };
        wit_bindgen::spawn_local(async move { relay::pump(&mut from, tx, payloads).await });
        Ok(rx)
    }
}
