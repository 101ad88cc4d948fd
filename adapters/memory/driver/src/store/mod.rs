//! The memory store: the native in-process broker behind the `wrpc:memory` driver.
//!
//! The memory adapter component keeps no lasting state of its own; it imports
//! `wrpc:memory/store` and the host answers with this store. One [`MemoryStore`] is shared by
//! `Arc` between every host instance that opened the same memory broker, so two host instances
//! on it behave like two processes on a real broker, and a trap or a hot-swap loses nothing.
//!
//! It offers four primitives, mirroring `adapters/memory/wit/store.wit` one-to-one:
//! - **logs**: per-topic ordered entries with dense offsets, count-based retention and an epoch
//!   stamped at creation; [`LogFollower`] tails a log and ends (never skips) when retention
//!   trims past it;
//! - **queues**: FIFO with delays and visibility leases; settlement by receipt (ack, nack,
//!   extend); an expired lease puts its message back at the head;
//! - **channels**: literal-name fan-out, at most once, lagging subscribers lose the oldest;
//! - **inboxes**: addressed packets to listeners; one member per group, every ungrouped one.
//!
//! Delivery to a stream is never synchronous with the call that caused it: the producer only
//! stores and wakes, the consumer's `next_batch`/`poll_next_batch` picks the data up.
//! Locks are `std::sync::Mutex`, per topic and per queue (channels and inboxes each have one
//! registry lock), and are never held across an `.await`. The stream types are
//! `Send + 'static` and their `poll_next_batch` is cancel-safe: a dropped poll loses nothing.

mod channels;
mod inboxes;
mod logs;
mod queues;
#[cfg(test)]
mod test_support;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::broadcast;

use wrpc_broker_runtime::faults::SettlementRefusals;

pub use channels::ChannelSubscription;
pub use inboxes::InboxListener;
pub use logs::LogFollower;

use inboxes::Inboxes;
use logs::Topic;
use queues::QueueSlot;

/// Message headers: repeated names allowed, values are bytes.
pub type Headers = Vec<(String, Vec<u8>)>;

/// Why a store operation failed (the WIT `store-error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A bad argument: an offset past the tip, a receipt that names no live lease.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Nobody listens at an address.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The store refused the operation (only under fault injection).
    #[error("refused: {0}")]
    Refused(String),
    /// A wait ran out.
    #[error("timeout: {0}")]
    Timeout(String),
}

/// An entry to append to a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// The payload.
    pub value: Vec<u8>,
    /// The headers.
    pub headers: Headers,
    /// The optional key.
    pub key: Option<Vec<u8>>,
}

/// A stored log entry and its offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// The entry's offset (dense, from 0).
    pub offset: u64,
    /// The payload.
    pub value: Vec<u8>,
    /// The headers.
    pub headers: Headers,
    /// The optional key.
    pub key: Option<Vec<u8>>,
}

/// The state of one log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogInfo {
    /// Stamped when the log was created (empty for a log that does not exist).
    pub epoch: String,
    /// The oldest retained offset.
    pub first: u64,
    /// The offset the next append gets (the tip).
    pub next: u64,
}

/// A message to put on a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// The payload.
    pub body: Vec<u8>,
    /// The headers.
    pub headers: Headers,
    /// Not deliverable before this many milliseconds.
    pub delay_ms: u32,
}

/// A message leased to a receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Names this lease (store-wide unique); settles it while the lease lasts.
    pub receipt: u64,
    /// The payload.
    pub body: Vec<u8>,
    /// The headers.
    pub headers: Headers,
}

/// A packet sent to an inbox address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The payload.
    pub body: Vec<u8>,
    /// The headers.
    pub headers: Headers,
    /// Ties a reply to its request.
    pub correlation_id: Option<String>,
    /// Where a reply should go.
    pub reply_to: Option<String>,
}

/// How many messages of a queue are in each state (for tests, the demo and the migrate drain).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// Deliverable now.
    pub ready: usize,
    /// Waiting for their delay.
    pub delayed: usize,
    /// Leased to a receiver and not settled.
    pub leased: usize,
}

/// How many payloads a channel subscriber may fall behind before it loses the oldest.
const CHANNEL_CAPACITY: usize = 4096;
/// How many packets an inbox listener buffers before senders wait.
const INBOX_CAPACITY: usize = 1024;

/// Locks a mutex, ignoring poisoning (no invariant here spans a panic).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn ms(n: u32) -> Duration {
    Duration::from_millis(u64::from(n))
}

// --------------------------------------------------------------------------------- store

/// The in-process broker: logs, queues, channels and inboxes, shared as `Arc<MemoryStore>`.
pub struct MemoryStore {
    topics: Mutex<HashMap<String, Arc<Topic>>>,
    queues: Mutex<HashMap<String, Arc<QueueSlot>>>,
    receipts: AtomicU64,
    channels: Mutex<HashMap<String, broadcast::Sender<Vec<u8>>>>,
    inboxes: Arc<Mutex<Inboxes>>,
    /// Settlements a test made the store refuse.
    refusals: SettlementRefusals,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("topics", &lock(&self.topics).len())
            .field("queues", &lock(&self.queues).len())
            .field("channels", &lock(&self.channels).len())
            .field("addresses", &lock(&self.inboxes).addresses.len())
            .finish()
    }
}

impl Drop for MemoryStore {
    /// The log followers of a dropped store end (a waiting one holds its topic).
    fn drop(&mut self) {
        for topic in lock(&self.topics).values() {
            topic.close();
        }
    }
}

impl MemoryStore {
    /// An empty store, ready to share between host instances.
    pub fn new() -> Arc<Self> {
        Arc::new(MemoryStore {
            topics: Mutex::new(HashMap::new()),
            queues: Mutex::new(HashMap::new()),
            receipts: AtomicU64::new(1),
            channels: Mutex::new(HashMap::new()),
            inboxes: Arc::new(Mutex::new(Inboxes::default())),
            refusals: SettlementRefusals::default(),
        })
    }

    // ---------------------------------------------------------------------------- faults

    /// Fault injection: the next `count` receipts passed to ack/nack/extend on any store queue
    /// whose name contains `queue` answer `Refused` and change nothing (replacing a count still
    /// pending for `queue`).
    pub fn refuse_settlements(&self, queue: &str, count: u32) {
        self.refusals.arm(queue, count);
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::pkt;
    use super::*;

    #[test]
    fn types_are_send_sync_static() {
        fn send_static<T: Send + 'static>() {}
        fn send_sync<T: Send + Sync + 'static>() {}
        send_sync::<MemoryStore>();
        send_static::<LogFollower>();
        send_static::<ChannelSubscription>();
        send_static::<InboxListener>();
        fn send_fut<F: Future + Send>(_: F) {}
        let s = MemoryStore::new();
        send_fut(s.queue_receive("q", 1, 1, 0));
        send_fut(s.inbox_send("a", pkt("x"), 0));
        let mut f = s.log_follow("t", 0);
        send_fut(f.next_batch(1));
        let mut c = s.channel_subscribe("c");
        send_fut(c.next_batch(1));
        let mut l = s.inbox_listen("a", None);
        send_fut(l.next_batch(1));
    }
}
