//! `wrpc:broker/backplane` on the store's channels: channel `c` is the store channel
//! `{prefix}/chan/{c}`. Names are literal; the store never reads a pattern into them.

use crate::exports::wrpc::broker::backplane::Guest;
use crate::wrpc::memory::store;
use crate::{Component, config};
use wit_bindgen::StreamReader;
use wrpc_broker_guest::Error;

#[cfg(feature = "mutant-replay-backplane")]
thread_local! {
    /// Mutant: the last payload this instance published, per store channel.
    static LAST: std::cell::RefCell<std::collections::BTreeMap<String, Vec<u8>>> =
        const { std::cell::RefCell::new(std::collections::BTreeMap::new()) };
}

impl Guest for Component {
    async fn publish(channel: String, payloads: Vec<Vec<u8>>) -> Result<(), Error> {
        let config = config()?;
        let name = config.name("chan", &channel)?;
        #[cfg(feature = "mutant-drop-empty")]
        let payloads: Vec<Vec<u8>> = payloads.into_iter().filter(|p| !p.is_empty()).collect();
        #[cfg(feature = "mutant-replay-backplane")]
        if let Some(last) = payloads.last() {
            LAST.with_borrow_mut(|m| m.insert(name.clone(), last.clone()));
        }
        #[cfg(feature = "mutant-pattern-channel")]
        if let Some((head, _)) = channel.rsplit_once(':')
            && format!("{head}:*") != channel
        {
            store::channel_publish(&config.name("chan", &format!("{head}:*"))?, &payloads);
        }
        store::channel_publish(&name, &payloads);
        Ok(())
    }

    async fn subscribe(channel: String) -> Result<StreamReader<Vec<u8>>, Error> {
        let config = config()?;
        let name = config.name("chan", &channel)?;
        #[cfg(feature = "mutant-replay-backplane")]
        let last = LAST.with_borrow(|m| m.get(&name).cloned());
        let from = store::channel_subscribe(name).await;
        // The store's stream is the subscription as it is: handed on, its payloads go from the
        // host's store to the host's reader without entering this instance.
        #[cfg(not(feature = "mutant-replay-backplane"))]
        return Ok(from);
        #[cfg(feature = "mutant-replay-backplane")]
        {
            let mut from = from;
            let (mut tx, rx) = crate::wit_stream::new::<Vec<u8>>();
            wit_bindgen::spawn_local(async move {
                if let Some(last) = last
                    && !tx.write_all(vec![last]).await.is_empty()
                {
                    return;
                }
                wrpc_broker_guest::relay::pump(&mut from, tx, |batch| batch).await
            });
            Ok(rx)
        }
    }
}
