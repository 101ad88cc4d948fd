//! The channels components hold on one driver, by id (never reused): each remembers the
//! connection generation it was opened on and the queues consumed on it (for the fault hook).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// One open (or since closed) channel.
pub(crate) struct Entry {
    pub(crate) channel: lapin::Channel,
    /// The queues consumers on it read: a settlement concerns one of them.
    queues: Mutex<Vec<String>>,
}

impl Entry {
    /// Whether the channel (and its connection) is still open.
    pub(crate) fn is_open(&self) -> bool {
        self.channel.status().connected()
    }

    /// A consumer on this channel reads `queue`.
    pub(crate) fn consumes(&self, queue: &str) {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if !queues.iter().any(|q| q == queue) {
            queues.push(queue.to_string());
        }
    }

    /// Whether a consumer on this channel reads a queue for which `matches` holds.
    pub(crate) fn any_queue(&self, matches: impl Fn(&str) -> bool) -> bool {
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues.iter().any(|q| matches(q))
    }
}

/// The channel table of one driver.
#[derive(Default)]
pub(crate) struct Channels {
    next: AtomicU64,
    map: Mutex<HashMap<u64, Arc<Entry>>>,
}

impl Channels {
    fn map(&self) -> MutexGuard<'_, HashMap<u64, Arc<Entry>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add `channel`; its id.
    pub(crate) fn insert(&self, channel: lapin::Channel) -> u64 {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let entry = Arc::new(Entry {
            channel,
            queues: Mutex::new(Vec::new()),
        });
        self.map().insert(id, entry);
        id
    }

    /// Channel `id`, if the table has it.
    pub(crate) fn get(&self, id: u64) -> Option<Arc<Entry>> {
        self.map().get(&id).cloned()
    }

    /// Take channel `id` out of the table.
    pub(crate) fn remove(&self, id: u64) -> Option<Arc<Entry>> {
        self.map().remove(&id)
    }
}
