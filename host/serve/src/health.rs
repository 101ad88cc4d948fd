//! `/readyz`: the health of what the gateway opened for its sockets (queue consumers, direct
//! listeners), and stopping them all when the server stops.

use std::sync::{Arc, Mutex, Weak};

use wrpc_broker::{Consumer, Listener};

/// The consumers and listeners open now (held weakly: a closed socket drops its own).
#[derive(Default)]
pub struct Health {
    consumers: Mutex<Vec<(String, Weak<Consumer>)>>,
    listeners: Mutex<Vec<(String, Weak<Listener>)>>,
}

fn live<T>(entries: &Mutex<Vec<(String, Weak<T>)>>) -> Vec<(String, Arc<T>)> {
    let mut entries = entries.lock().unwrap_or_else(|e| e.into_inner());
    entries.retain(|(_, w)| w.strong_count() > 0);
    entries
        .iter()
        .filter_map(|(name, w)| Some((name.clone(), w.upgrade()?)))
        .collect()
}

impl Health {
    /// Track a consumer of `queue`.
    pub fn add_consumer(&self, queue: &str, consumer: &Arc<Consumer>) {
        let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        consumers.push((queue.to_string(), Arc::downgrade(consumer)));
    }

    /// Track a listener on `address`.
    pub fn add_listener(&self, address: &str, listener: &Arc<Listener>) {
        let mut listeners = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
        listeners.push((address.to_string(), Arc::downgrade(listener)));
    }

    /// What is not healthy now, named (`consumer of jobs`, `listener on svc`).
    pub async fn unhealthy(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (queue, consumer) in live(&self.consumers) {
            if !consumer.healthy().await {
                out.push(format!("consumer of {queue}"));
            }
        }
        for (address, listener) in live(&self.listeners) {
            if !listener.healthy().await {
                out.push(format!("listener on {address}"));
            }
        }
        out
    }

    /// Stop every consumer and listener (their unsettled deliveries go back to the broker).
    pub async fn stop_all(&self) {
        let consumers = live(&self.consumers);
        let listeners = live(&self.listeners);
        futures::future::join_all(consumers.iter().map(|(_, c)| c.stop())).await;
        futures::future::join_all(listeners.iter().map(|(_, l)| l.stop())).await;
    }
}
