//! `wrpc:broker/backplane` (at-most-once fan-out) on the store's channels: channel `c` is the
//! store channel `chan/c`. Names are literal: `room:*` is a channel of that name, never a
//! pattern. On a broker whose names have wildcards or a narrow alphabet, encode them with
//! `host::encode_token` so that no name can mean another.

use crate::exports::wrpc::broker::backplane::Guest;
use crate::wrpc::broker::types::Error;
use crate::wrpc::memory::store;
use crate::{Adapter, checked, forward};
use wit_bindgen::StreamReader;

/// The store channel of `channel`.
fn store_channel(channel: String) -> Result<String, Error> {
    Ok(format!("chan/{}", checked("channel", channel)?))
}

/// Channels need no option from `init`: each call goes straight to the store.
impl Guest for Adapter {
    /// Hand the payloads to the channel's subscribers of this moment; with none, they are
    /// dropped, as the contract allows.
    async fn publish(channel: String, payloads: Vec<Vec<u8>>) -> Result<(), Error> {
        let name = store_channel(channel)?;
        store::channel_publish(&name, &payloads);
        Ok(())
    }

    /// The store confirms the subscription before its call returns, so a payload published
    /// after this export returns reaches the stream; a task forwards the payloads as they come.
    async fn subscribe(channel: String) -> Result<StreamReader<Vec<u8>>, Error> {
        let name = store_channel(channel)?;
        let from = store::channel_subscribe(name).await;
        let (writer, reader) = crate::wit_stream::new::<Vec<u8>>();
        forward(from, writer, |payload| payload);
        Ok(reader)
    }
}
