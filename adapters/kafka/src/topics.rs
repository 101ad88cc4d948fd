//! Topics the adapter makes and what it knows of them: created on first use (a topic that
//! exists is fine), described for the log epoch (the topic id) and partition count. Both are
//! caches of what the cluster holds: a trap loses nothing but a round trip.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use crate::wrpc::kafka::client::{self, TopicInfo};
use crate::{Config, kafka_error};
use wrpc_broker_guest::Error;

thread_local! {
    /// Topics this instance made or saw.
    static MADE: RefCell<HashSet<String>> = RefCell::new(HashSet::new());
    /// Topic ids and partition counts seen, by topic.
    static DESCRIBED: RefCell<HashMap<String, Described>> = RefCell::new(HashMap::new());
}

/// A topic as the cluster described it, its id made an epoch (`[A-Za-z0-9_-]`).
#[derive(Clone, Debug)]
pub(crate) struct Described {
    /// The topic id, base64url without padding.
    pub(crate) epoch: String,
    /// Its partition count.
    pub(crate) partitions: u32,
}

/// Create the topics `wanted` (name, partitions) not yet made, with `configs`.
pub(crate) async fn ensure(
    config: &Config,
    wanted: &[(String, u32)],
    configs: &[(String, String)],
) -> Result<(), Error> {
    let missing: Vec<(String, u32)> = wanted
        .iter()
        .filter(|(name, _)| !MADE.with_borrow(|m| m.contains(name)))
        .cloned()
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    client::create_topics(missing.clone(), config.replication, configs.to_vec())
        .await
        .map_err(kafka_error)?;
    MADE.with_borrow_mut(|m| m.extend(missing.into_iter().map(|(name, _)| name)));
    Ok(())
}

/// The topic id as an epoch: base64url, no padding.
fn epoch(info: &TopicInfo) -> String {
    info.id
        .chars()
        .filter(|c| *c != '=')
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect()
}

/// `topic`'s id and partition count; none when it does not exist.
pub(crate) async fn describe(topic: &str) -> Result<Option<Described>, Error> {
    if let Some(d) = DESCRIBED.with_borrow(|m| m.get(topic).cloned()) {
        return Ok(Some(d));
    }
    let Some(info) = client::describe_topic(topic.to_string())
        .await
        .map_err(kafka_error)?
    else {
        return Ok(None);
    };
    let described = Described {
        epoch: epoch(&info),
        partitions: info.partitions,
    };
    DESCRIBED.with_borrow_mut(|m| m.insert(topic.to_string(), described.clone()));
    Ok(Some(described))
}
