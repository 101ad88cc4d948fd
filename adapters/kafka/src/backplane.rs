//! `wrpc:broker/backplane` on the topic `P.bp` (one partition), keyed by channel: a publish
//! produces each payload with key = the channel (answered once every delivery report came);
//! a subscription is an assign-mode reader (no group) of `P.bp` from the high watermarks read
//! when it subscribes, the driver keeping only its channel's records (`read-values`: the
//! values never enter the instance). Keys are compared whole, so channel names are literal. ⚠ Payloads are stored for the topic's retention (at most once comes from
//! readers starting at the end), and each subscription costs a consumer that reads every
//! channel's traffic.

use wit_bindgen::StreamReader;

use crate::exports::wrpc::broker::backplane::Guest;
use crate::wrpc::kafka::client::{self, Outgoing};
use crate::{Component, config, kafka_error};
use wrpc_broker_guest::Error;

impl Guest for Component {
    async fn publish(channel: String, payloads: Vec<Vec<u8>>) -> Result<(), Error> {
        let topic = config()?.backplane();
        let records = payloads
            .into_iter()
            .map(|value| Outgoing {
                topic: topic.clone(),
                partition: None,
                key: Some(channel.clone().into_bytes()),
                value,
                headers: Vec::new(),
            })
            .collect();
        client::produce(records).await.map_err(kafka_error)?;
        Ok(())
    }

    async fn subscribe(channel: String) -> Result<StreamReader<Vec<u8>>, Error> {
        let topic = config()?.backplane();
        let marks = client::watermarks(topic.clone())
            .await
            .map_err(kafka_error)?;
        let starts = marks
            .iter()
            .enumerate()
            .map(|(p, m)| (p as u32, m.high))
            .collect();
        // The driver's stream of this channel's values is the subscription as it is: handed
        // on, they go from the host's reader to the host's fan-out without entering this
        // instance.
        client::read_values(topic, starts, channel.into_bytes())
            .await
            .map_err(kafka_error)
    }
}
