//! `wrpc:broker/backplane` on Redis pub/sub: channel `c` is the Redis channel `{P}:bp:<c>`.
//! `publish` sends one `PUBLISH` per payload in one pipeline (receiver counts are ignored:
//! at-most-once); `subscribe` is a `SUBSCRIBE` (never `PSUBSCRIBE`, so `room:*` is a literal
//! name) on a connection of its own, returned once the server confirmed it. Dropping the stream
//! unsubscribes (confirmed) and closes that connection.

use std::pin::pin;

use crate::exports::wrpc::broker::backplane::Guest;
use crate::wrpc::redis::client;
use crate::{Component, args, config, pipeline, redis_error};
use futures::future::{Either, select};
use wit_bindgen::{StreamReader, StreamResult};
use wrpc_broker_guest::Error;

/// Copy payloads from the driver's subscription to the returned stream until either ends.
pub(crate) async fn relay(
    from: &mut StreamReader<Vec<u8>>,
    mut to: wit_bindgen::StreamWriter<Vec<u8>>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut stop = pin!(stop);
    loop {
        let read = pin!(from.read(Vec::with_capacity(256)));
        let (result, items) = match select(read, stop.as_mut()).await {
            Either::Left((read, _)) => read,
            Either::Right(_) => return,
        };
        if !items.is_empty() && !to.write_all(items).await.is_empty() {
            return;
        }
        if !matches!(result, StreamResult::Complete(_)) {
            return;
        }
    }
}

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
        let (subscription, mut from) = client::subscribe(key).await.map_err(redis_error)?;
        let (tx, rx) = crate::wit_stream::new::<Vec<u8>>();
        wit_bindgen::spawn_local(async move {
            relay(&mut from, tx, std::future::pending()).await;
            // Unsubscribe while the stream still holds the connection open.
            client::unsubscribe(subscription).await;
        });
        Ok(rx)
    }
}
