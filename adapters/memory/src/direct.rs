//! `wrpc:broker/direct` on the store's inboxes: an address is a store inbox name, used verbatim
//! (`inbox()` mints `{prefix}.inbox.{id}`), a listener is a store listener with the same group,
//! and its packets are pumped into the listener's stream until `stop` (which leaves the address
//! first and hands over what was sent before).

use crate::exports::wrpc::broker::direct::{Guest, ListenerId, Packet};
use crate::wrpc::memory::store;
use crate::{Component, DEFAULT_PREFIX, config, store_error};
use wit_bindgen::StreamReader;
use wrpc_broker_guest::Error;
use wrpc_broker_guest::relay;

/// A broker packet as a store packet.
fn to_store(p: Packet) -> store::Packet {
    store::Packet {
        body: p.body,
        headers: p.headers,
        correlation_id: p.correlation_id,
        reply_to: p.reply_to,
    }
}

/// A store packet as a broker packet.
fn from_store(p: store::Packet) -> Packet {
    Packet {
        body: p.body,
        headers: p.headers,
        correlation_id: p.correlation_id,
        reply_to: p.reply_to,
    }
}

/// Turn a batch read from the store into the batch the listener's stream gets.
fn deliver(batch: Vec<store::Packet>) -> Vec<Packet> {
    #[cfg(feature = "mutant-deliver-twice")]
    let batch: Vec<store::Packet> = batch.into_iter().flat_map(|p| [p.clone(), p]).collect();
    batch.into_iter().map(from_store).collect()
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
        #[cfg(feature = "mutant-drop-empty")]
        if message.body.is_empty() {
            return Ok(());
        }
        store::inbox_send(address, to_store(message), timeout_ms)
            .await
            .map_err(store_error)
    }

    async fn listen(
        address: String,
        group: Option<String>,
    ) -> Result<(ListenerId, StreamReader<Packet>), Error> {
        if address.is_empty() {
            return Err(Error::bad_request("empty address"));
        }
        #[cfg(feature = "mutant-ignore-group")]
        let group: Option<String> = group.and(None);
        let (subscription, mut from) = store::inbox_listen(address, group).await;
        let (tx, rx) = crate::wit_stream::new::<Packet>();
        #[cfg(feature = "mutant-drop-on-stop")]
        let id = relay::spawn_listener(move |stop| async move {
            let relayed = std::pin::pin!(relay::pump(&mut from, tx, deliver));
            futures::future::select(relayed, std::pin::pin!(stop.wait())).await;
            store::inbox_unlisten(subscription).await;
        });
        // Stopped: off the address first (a send after `stop` finds nobody), then what was sent
        // before is handed over.
        #[cfg(not(feature = "mutant-drop-on-stop"))]
        let id = relay::spawn_listener(move |stop| async move {
            let relayed = relay::pump(&mut from, tx, deliver);
            relay::until_stopped(relayed, &stop, || store::inbox_unlisten(subscription)).await;
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
