//! `wrpc:broker/backplane` on core NATS: channel `c` is the subject `P.bp.<enc(c)>`, one token,
//! so `*`, `>` and `.` in a name are literal and never wildcards. Publish is a core PUB per
//! payload followed by a flush (PING/PONG: the server has them, or the call fails); subscribe is
//! a SUB the driver flushes before it returns, so a payload published after the return is
//! delivered; its stream is the driver's stream of payloads, handed on (they never enter the
//! instance). At most once: core NATS keeps nothing, and a slow subscriber loses messages.

use crate::exports::wrpc::broker::backplane::Guest;
use crate::wrpc::nats::client;
use crate::{Component, config, nats_error};
use wit_bindgen::StreamReader;
use wrpc_broker_guest::Error;

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
        // The driver's stream of payloads is the subscription as it is: handed on, they go
        // from the host's connection to the host's reader without entering this instance.
        let (_, payloads) = client::subscribe_payloads(subject, None)
            .await
            .map_err(nats_error)?;
        Ok(payloads)
    }
}
