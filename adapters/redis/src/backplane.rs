//! `wrpc:broker/backplane` on Redis pub/sub: channel `c` is the Redis channel `{P}:bp:<c>`.
//! `publish` sends one `PUBLISH` per payload in one pipeline (receiver counts are ignored:
//! at-most-once); `subscribe` is a `SUBSCRIBE` (never `PSUBSCRIBE`, so `room:*` is a literal
//! name) on a connection of its own, returned once the server confirmed it: the driver's stream
//! itself, so deliveries never enter the instance. Dropping it closes that connection, which
//! unsubscribes it.

use crate::exports::wrpc::broker::backplane::Guest;
use crate::wrpc::redis::client;
use crate::{Component, args, config, pipeline, redis_error};
use wit_bindgen::StreamReader;
use wrpc_broker_guest::Error;

impl Guest for Component {
    async fn publish(channel: String, payloads: Vec<Vec<u8>>) -> Result<(), Error> {
        let key = config()?.key("bp", &channel)?;
        if payloads.is_empty() {
            return Ok(());
        }
        let commands = payloads
            .into_iter()
            .map(|p| args!["PUBLISH", &key, p])
            .collect();
        for reply in pipeline(commands).await? {
            if let crate::Reply::Error(e) = reply {
                return Err(Error::internal(format!("PUBLISH: {e}")));
            }
        }
        Ok(())
    }

    async fn subscribe(channel: String) -> Result<StreamReader<Vec<u8>>, Error> {
        let key = config()?.key("bp", &channel)?;
        let (_, from) = client::subscribe(key).await.map_err(redis_error)?;
        // The driver's stream is the subscription as it is: handed on, its payloads go from the
        // host's connection to the host's reader without entering this instance, and dropping
        // it closes the subscription's connection (the server unsubscribes it).
        Ok(from)
    }
}
