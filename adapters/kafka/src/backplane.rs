//! `wrpc:broker/backplane` on the topic `P.bp` (one partition), keyed by channel: a publish
//! produces each payload with key = the channel (answered once every delivery report came);
//! a subscription is an assign-mode reader (no group) of `P.bp` from the high watermarks read
//! when it subscribes, keeping only its channel's records. Keys are compared whole, so channel
//! names are literal. ⚠ Payloads are stored for the topic's retention (at most once comes from
//! readers starting at the end), and each subscription costs a consumer that reads every
//! channel's traffic.

use wit_bindgen::StreamReader;

use crate::exports::wrpc::broker::backplane::Guest;
use crate::wrpc::kafka::client::{self, Incoming, Outgoing};
use crate::{Component, config, kafka_error};
use wrpc_broker_guest::{Error, relay};

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
        let mut from = client::read(topic, starts).await.map_err(kafka_error)?;
        let key = channel.into_bytes();
        let (tx, rx) = crate::wit_stream::new::<Vec<u8>>();
        wit_bindgen::spawn_local(async move {
            relay::pump(&mut from, tx, |records: Vec<Incoming>| {
                records
                    .into_iter()
                    .filter(|r| r.key.as_deref() == Some(key.as_slice()))
                    .map(|r| r.value)
                    .collect()
            })
            .await;
        });
        Ok(rx)
    }
}
