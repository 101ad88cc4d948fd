//! The memory store: the native in-process broker behind the `wrpc:memory` driver.
//!
//! The memory adapter component keeps no lasting state of its own; it imports
//! `wrpc:memory/store` and the host answers with this store. One [`MemoryStore`] is shared by
//! `Arc` between every host instance that opened the same memory broker, so two host instances
//! on it behave like two processes on a real broker, and a trap or a hot-swap loses nothing.
//!
//! It offers four primitives, mirroring `wit/memory/store.wit` one-to-one:
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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio::time::Instant;

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

/// Faults a test can inject, as a real broker might refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The next `count` receipts passed to ack/nack/extend on `queue` answer `Refused` and change nothing.
    RefuseSettlements {
        /// The queue whose settlements are refused.
        queue: String,
        /// How many receipts to refuse (replaces any count still pending).
        count: u32,
    },
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

// ---------------------------------------------------------------------------------- logs

/// One topic: its log once created, and a watch of its tip that wakes followers.
struct Topic {
    log: Mutex<Option<Log>>,
    tip: watch::Sender<u64>,
}

struct Log {
    epoch: String,
    first: u64,
    entries: VecDeque<LogEntry>,
}

impl Log {
    fn next(&self) -> u64 {
        self.first + self.entries.len() as u64
    }

    fn info(&self) -> LogInfo {
        LogInfo {
            epoch: self.epoch.clone(),
            first: self.first,
            next: self.next(),
        }
    }
}

// -------------------------------------------------------------------------------- queues

struct QueueSlot {
    state: Mutex<Queue>,
    /// Woken when a message may have become deliverable or a deadline moved.
    notify: Notify,
}

struct Msg {
    body: Vec<u8>,
    headers: Headers,
}

struct Lease {
    msg: Msg,
    deadline: Instant,
}

#[derive(Default)]
struct Queue {
    ready: VecDeque<Msg>,
    /// Keyed by (due time, push sequence).
    delayed: BTreeMap<(Instant, u64), Msg>,
    leased: HashMap<u64, Lease>,
    /// (deadline, receipt) of every live lease, to expire them in order.
    deadlines: BTreeSet<(Instant, u64)>,
    seq: u64,
    refuse: u32,
}

impl Queue {
    /// Expires leases (back to the head) and releases due delayed messages (to the tail).
    fn tick(&mut self, now: Instant) {
        let mut expired = Vec::new();
        while let Some(&(deadline, receipt)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(lease) = self.leased.remove(&receipt) {
                expired.push((receipt, lease.msg));
            }
        }
        // The earliest lease was nearest the head: it ends up first.
        expired.sort_by_key(|(receipt, _)| *receipt);
        for (_, msg) in expired.into_iter().rev() {
            self.ready.push_front(msg);
        }
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            self.ready.push_back(entry.remove());
        }
    }

    fn delay(&mut self, msg: Msg, due: Instant) {
        self.seq += 1;
        self.delayed.insert((due, self.seq), msg);
    }

    /// The next instant something changes by itself (a delay ends, a lease expires).
    fn next_event(&self) -> Option<Instant> {
        let delayed = self.delayed.keys().next().map(|(t, _)| *t);
        let lease = self.deadlines.first().map(|(t, _)| *t);
        match (delayed, lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn earliest_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(t, _)| *t)
    }

    /// Takes the next receipt-named lease for a settlement, or says why not.
    fn take_lease(&mut self, queue: &str, receipt: u64) -> Result<Lease, StoreError> {
        if self.refuse > 0 {
            self.refuse -= 1;
            return Err(StoreError::Refused(format!(
                "settlement of receipt {receipt} on queue {queue} refused (injected fault)"
            )));
        }
        match self.leased.remove(&receipt) {
            Some(lease) => {
                self.deadlines.remove(&(lease.deadline, receipt));
                Ok(lease)
            }
            None => Err(StoreError::BadRequest(format!(
                "receipt {receipt} is not leased on queue {queue} (unknown, settled or expired)"
            ))),
        }
    }

    fn stats(&self) -> QueueStats {
        QueueStats {
            ready: self.ready.len(),
            delayed: self.delayed.len(),
            leased: self.leased.len(),
        }
    }
}

// ------------------------------------------------------------------------------- inboxes

struct Slot {
    id: u64,
    tx: mpsc::Sender<Packet>,
}

#[derive(Default)]
struct Group {
    members: Vec<Slot>,
    next: usize,
}

#[derive(Default)]
struct Address {
    ungrouped: Vec<Slot>,
    groups: BTreeMap<String, Group>,
}

impl Address {
    fn prune(&mut self) {
        self.ungrouped.retain(|s| !s.tx.is_closed());
        for group in self.groups.values_mut() {
            group.members.retain(|s| !s.tx.is_closed());
        }
        self.groups.retain(|_, g| !g.members.is_empty());
    }

    fn is_empty(&self) -> bool {
        self.ungrouped.is_empty() && self.groups.is_empty()
    }
}

#[derive(Default)]
struct Inboxes {
    addresses: HashMap<String, Address>,
    next_id: u64,
}

impl Inboxes {
    /// Take listener `id` off whatever address it listens on.
    fn remove_anywhere(&mut self, id: u64) {
        let found = self.addresses.iter().find_map(|(address, addr)| {
            if addr.ungrouped.iter().any(|s| s.id == id) {
                return Some((address.clone(), None));
            }
            addr.groups
                .iter()
                .find(|(_, g)| g.members.iter().any(|s| s.id == id))
                .map(|(name, _)| (address.clone(), Some(name.clone())))
        });
        if let Some((address, group)) = found {
            self.remove(&address, group.as_deref(), id);
        }
    }

    fn remove(&mut self, address: &str, group: Option<&str>, id: u64) {
        let Some(addr) = self.addresses.get_mut(address) else {
            return;
        };
        match group {
            None => addr.ungrouped.retain(|s| s.id != id),
            Some(name) => {
                if let Some(g) = addr.groups.get_mut(name) {
                    g.members.retain(|s| s.id != id);
                    if g.members.is_empty() {
                        addr.groups.remove(name);
                    }
                }
            }
        }
        if addr.is_empty() {
            self.addresses.remove(address);
        }
    }
}

// --------------------------------------------------------------------------------- store

/// The in-process broker: logs, queues, channels and inboxes, shared as `Arc<MemoryStore>`.
pub struct MemoryStore {
    topics: Mutex<HashMap<String, Arc<Topic>>>,
    queues: Mutex<HashMap<String, Arc<QueueSlot>>>,
    receipts: AtomicU64,
    channels: Mutex<HashMap<String, broadcast::Sender<Vec<u8>>>>,
    inboxes: Arc<Mutex<Inboxes>>,
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

impl MemoryStore {
    /// An empty store, ready to share between host instances.
    pub fn new() -> Arc<Self> {
        Arc::new(MemoryStore {
            topics: Mutex::new(HashMap::new()),
            queues: Mutex::new(HashMap::new()),
            receipts: AtomicU64::new(1),
            channels: Mutex::new(HashMap::new()),
            inboxes: Arc::new(Mutex::new(Inboxes::default())),
        })
    }

    // ------------------------------------------------------------------------------ logs

    fn topic(&self, topic: &str) -> Arc<Topic> {
        lock(&self.topics)
            .entry(topic.to_owned())
            .or_insert_with(|| {
                Arc::new(Topic {
                    log: Mutex::new(None),
                    tip: watch::Sender::new(0),
                })
            })
            .clone()
    }

    fn existing_topic(&self, topic: &str) -> Option<Arc<Topic>> {
        lock(&self.topics).get(topic).cloned()
    }

    /// Opens a log, creating it with `epoch` when missing (a later epoch is ignored).
    pub fn log_open(&self, topic: &str, epoch: &str, max_entries: u32) -> LogInfo {
        let _ = max_entries; // retention is applied by each append with its own limit
        let t = self.topic(topic);
        let mut log = lock(&t.log);
        let created = log.is_none();
        let info = log
            .get_or_insert_with(|| Log {
                epoch: epoch.to_owned(),
                first: 0,
                entries: VecDeque::new(),
            })
            .info();
        drop(log);
        if created {
            // Wakes followers that wait for the topic to exist.
            t.tip.send_replace(info.next);
        }
        info
    }

    /// Appends a batch, trims to `max_entries` (0 = unlimited); returns the state and the first new offset.
    pub fn log_append(
        &self,
        topic: &str,
        epoch: &str,
        max_entries: u32,
        batch: Vec<LogRecord>,
    ) -> (LogInfo, u64) {
        let t = self.topic(topic);
        let mut guard = lock(&t.log);
        let log = guard.get_or_insert_with(|| Log {
            epoch: epoch.to_owned(),
            first: 0,
            entries: VecDeque::new(),
        });
        let start = log.next();
        for (i, r) in batch.into_iter().enumerate() {
            log.entries.push_back(LogEntry {
                offset: start + i as u64,
                value: r.value,
                headers: r.headers,
                key: r.key,
            });
        }
        if max_entries > 0 {
            while log.entries.len() > max_entries as usize {
                log.entries.pop_front();
                log.first += 1;
            }
        }
        let info = log.info();
        drop(guard);
        t.tip.send_replace(info.next);
        (info, start)
    }

    /// Up to `limit` entries from `from` (clamped to `first`); `BadRequest` when `from` is past the tip.
    pub fn log_read(
        &self,
        topic: &str,
        from: u64,
        limit: u32,
    ) -> Result<(LogInfo, Vec<LogEntry>), StoreError> {
        let missing = LogInfo {
            epoch: String::new(),
            first: 0,
            next: 0,
        };
        let Some(t) = self.existing_topic(topic) else {
            return Ok((missing, Vec::new()));
        };
        let guard = lock(&t.log);
        let Some(log) = guard.as_ref() else {
            return Ok((missing, Vec::new()));
        };
        let info = log.info();
        if from > info.next {
            return Err(StoreError::BadRequest(format!(
                "offset {from} is past the tip {} of log {topic}",
                info.next
            )));
        }
        let skip = (from.max(info.first) - info.first) as usize;
        let entries = log
            .entries
            .iter()
            .skip(skip)
            .take(limit as usize)
            .cloned()
            .collect();
        Ok((info, entries))
    }

    /// Follows a log from `from` on, waiting at the tip (and for the topic to exist).
    pub fn log_follow(&self, topic: &str, from: u64) -> LogFollower {
        let t = self.topic(topic);
        let rx = t.tip.subscribe();
        LogFollower {
            topic: topic.to_owned(),
            shared: Arc::downgrade(&t),
            cursor: from,
            state: FollowState::Idle(rx),
        }
    }

    // ---------------------------------------------------------------------------- queues

    fn queue_slot(&self, queue: &str) -> Arc<QueueSlot> {
        lock(&self.queues)
            .entry(queue.to_owned())
            .or_insert_with(|| {
                Arc::new(QueueSlot {
                    state: Mutex::new(Queue::default()),
                    notify: Notify::new(),
                })
            })
            .clone()
    }

    /// Puts messages on a queue in order (a delayed one becomes ready when due); never fails today.
    pub fn queue_push(&self, queue: &str, batch: Vec<Queued>) -> Result<(), StoreError> {
        let slot = self.queue_slot(queue);
        let mut q = lock(&slot.state);
        let now = Instant::now();
        q.tick(now);
        for m in batch {
            let msg = Msg {
                body: m.body,
                headers: m.headers,
            };
            if m.delay_ms == 0 {
                q.ready.push_back(msg);
            } else {
                q.delay(msg, now + ms(m.delay_ms));
            }
        }
        drop(q);
        slot.notify.notify_waiters();
        Ok(())
    }

    /// Leases up to `max` ready messages for `visibility_ms`, waiting up to `wait_ms` for the first.
    pub async fn queue_receive(
        &self,
        queue: &str,
        max: u32,
        visibility_ms: u32,
        wait_ms: u32,
    ) -> Vec<Received> {
        let slot = self.queue_slot(queue);
        let give_up = Instant::now() + ms(wait_ms);
        loop {
            let notified = slot.notify.notified();
            tokio::pin!(notified);
            // Registered before the state is checked: a push after the check wakes us.
            notified.as_mut().enable();
            let wake_at = {
                let mut q = lock(&slot.state);
                let now = Instant::now();
                q.tick(now);
                let n = (max as usize).min(q.ready.len());
                if n > 0 {
                    let deadline = now + ms(visibility_ms);
                    let earlier = q.earliest_deadline().is_none_or(|d| deadline < d);
                    let mut out = Vec::with_capacity(n);
                    for msg in q.ready.drain(..n).collect::<Vec<_>>() {
                        let receipt = self.receipts.fetch_add(1, Ordering::Relaxed);
                        out.push(Received {
                            receipt,
                            body: msg.body.clone(),
                            headers: msg.headers.clone(),
                        });
                        q.leased.insert(receipt, Lease { msg, deadline });
                        q.deadlines.insert((deadline, receipt));
                    }
                    drop(q);
                    if earlier {
                        // Waiters sleeping until a later event must see this lease's expiry.
                        slot.notify.notify_waiters();
                    }
                    return out;
                }
                if max == 0 || now >= give_up {
                    return Vec::new();
                }
                q.next_event().map_or(give_up, |t| t.min(give_up))
            };
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// Removes leased messages for good; one result per receipt.
    pub fn queue_ack(&self, queue: &str, receipts: &[u64]) -> Vec<Result<(), StoreError>> {
        let slot = self.queue_slot(queue);
        let mut q = lock(&slot.state);
        q.tick(Instant::now());
        receipts
            .iter()
            .map(|&r| q.take_lease(queue, r).map(drop))
            .collect()
    }

    /// Puts leased messages back unchanged, ready after `delay_ms` (0: at the head of the queue).
    pub fn queue_nack(
        &self,
        queue: &str,
        receipts: &[u64],
        delay_ms: u32,
    ) -> Vec<Result<(), StoreError>> {
        let slot = self.queue_slot(queue);
        let mut q = lock(&slot.state);
        let now = Instant::now();
        q.tick(now);
        let mut back = Vec::new();
        let results = receipts
            .iter()
            .map(|&r| {
                let lease = q.take_lease(queue, r)?;
                if delay_ms == 0 {
                    back.push(lease.msg);
                } else {
                    q.delay(lease.msg, now + ms(delay_ms));
                }
                Ok(())
            })
            .collect::<Vec<_>>();
        // Nacked together, they keep the order they were given in, ahead of the rest.
        for msg in back.into_iter().rev() {
            q.ready.push_front(msg);
        }
        let changed = results.iter().any(Result::is_ok);
        drop(q);
        if changed {
            slot.notify.notify_waiters();
        }
        results
    }

    /// Moves lease deadlines to now + `visibility_ms`; one result per receipt.
    pub fn queue_extend(
        &self,
        queue: &str,
        receipts: &[u64],
        visibility_ms: u32,
    ) -> Vec<Result<(), StoreError>> {
        let slot = self.queue_slot(queue);
        let mut q = lock(&slot.state);
        let now = Instant::now();
        q.tick(now);
        let deadline = now + ms(visibility_ms);
        let results = receipts
            .iter()
            .map(|&r| {
                let lease = q.take_lease(queue, r)?;
                q.leased.insert(
                    r,
                    Lease {
                        msg: lease.msg,
                        deadline,
                    },
                );
                q.deadlines.insert((deadline, r));
                Ok(())
            })
            .collect::<Vec<_>>();
        let changed = results.iter().any(Result::is_ok);
        drop(q);
        if changed {
            // A deadline may have moved earlier: sleeping receivers recompute their wake time.
            slot.notify.notify_waiters();
        }
        results
    }

    /// Counts a queue's messages by state (after processing due delays and expired leases).
    pub fn queue_len(&self, queue: &str) -> QueueStats {
        let Some(slot) = lock(&self.queues).get(queue).cloned() else {
            return QueueStats::default();
        };
        let mut q = lock(&slot.state);
        q.tick(Instant::now());
        q.stats()
    }

    // -------------------------------------------------------------------------- channels

    /// Fans payloads out to the channel's current subscribers; returns how many there were.
    pub fn channel_publish(&self, channel: &str, payloads: Vec<Vec<u8>>) -> u32 {
        let mut channels = lock(&self.channels);
        let Some(tx) = channels.get(channel) else {
            return 0;
        };
        let n = tx.receiver_count();
        if n == 0 {
            channels.remove(channel);
            return 0;
        }
        for p in payloads {
            // Fails only with no receivers, which the lock rules out.
            let _ = tx.send(p);
        }
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Subscribes to a channel (literal name); sees only payloads published from now on.
    pub fn channel_subscribe(&self, channel: &str) -> ChannelSubscription {
        let rx = lock(&self.channels)
            .entry(channel.to_owned())
            .or_insert_with(|| broadcast::channel(CHANNEL_CAPACITY).0)
            .subscribe();
        ChannelSubscription {
            channel: channel.to_owned(),
            state: SubState::Idle(rx),
        }
    }

    // --------------------------------------------------------------------------- inboxes

    /// Sends to every ungrouped listener and one member per group; waits up to `timeout_ms` for room.
    pub async fn inbox_send(
        &self,
        address: &str,
        packet: Packet,
        timeout_ms: u32,
    ) -> Result<(), StoreError> {
        let targets: Vec<mpsc::Sender<Packet>> = {
            let mut inboxes = lock(&self.inboxes);
            let mut targets = Vec::new();
            if let Some(addr) = inboxes.addresses.get_mut(address) {
                addr.prune();
                targets.extend(addr.ungrouped.iter().map(|s| s.tx.clone()));
                for group in addr.groups.values_mut() {
                    let i = group.next % group.members.len();
                    group.next = i + 1;
                    targets.push(group.members[i].tx.clone());
                }
                if addr.is_empty() {
                    inboxes.addresses.remove(address);
                }
            }
            targets
        };
        if targets.is_empty() {
            return Err(StoreError::Unavailable(format!(
                "nobody listens on {address}"
            )));
        }
        let give_up = Instant::now() + ms(timeout_ms);
        let mut delivered = 0usize;
        let mut timed_out = 0usize;
        for tx in targets {
            match tx.try_send(packet.clone()) {
                Ok(()) => delivered += 1,
                Err(mpsc::error::TrySendError::Closed(_)) => {}
                Err(mpsc::error::TrySendError::Full(p)) => {
                    match tokio::time::timeout_at(give_up, tx.reserve()).await {
                        Ok(Ok(permit)) => {
                            permit.send(p);
                            delivered += 1;
                        }
                        Ok(Err(_closed)) => {}
                        Err(_elapsed) => timed_out += 1,
                    }
                }
            }
        }
        if timed_out > 0 {
            return Err(StoreError::Timeout(format!(
                "{timed_out} listener(s) on {address} had no room within {timeout_ms} ms"
            )));
        }
        if delivered == 0 {
            return Err(StoreError::Unavailable(format!(
                "nobody listens on {address}"
            )));
        }
        Ok(())
    }

    /// Registers a listener on `address`, competing with the other members of `group` if any.
    pub fn inbox_listen(&self, address: &str, group: Option<String>) -> InboxListener {
        let (tx, rx) = mpsc::channel(INBOX_CAPACITY);
        let mut inboxes = lock(&self.inboxes);
        inboxes.next_id += 1;
        let id = inboxes.next_id;
        let addr = inboxes.addresses.entry(address.to_owned()).or_default();
        let slot = Slot { id, tx };
        match &group {
            None => addr.ungrouped.push(slot),
            Some(name) => addr
                .groups
                .entry(name.clone())
                .or_default()
                .members
                .push(slot),
        }
        InboxListener {
            address: address.to_owned(),
            group,
            id,
            registry: Arc::downgrade(&self.inboxes),
            rx,
        }
    }

    /// Takes listener `id` (from [`InboxListener::id`]) off its address: later sends no longer
    /// reach it, and its stream ends once it has yielded what was sent before (sends already
    /// under way included). Unknown ids are ignored.
    pub fn inbox_unlisten(&self, id: u64) {
        lock(&self.inboxes).remove_anywhere(id);
    }

    // ---------------------------------------------------------------------------- faults

    /// Injects a fault (replacing a pending one of the same kind on the same target).
    pub fn inject(&self, fault: Fault) {
        match fault {
            Fault::RefuseSettlements { queue, count } => {
                let slot = self.queue_slot(&queue);
                lock(&slot.state).refuse = count;
            }
        }
    }
}

// ------------------------------------------------------------------------------- streams

type WatchWait = Pin<Box<dyn Future<Output = (watch::Receiver<u64>, bool)> + Send>>;

enum FollowState {
    /// Holding the receiver: check the log, then arm a wait.
    Idle(watch::Receiver<u64>),
    /// Waiting for the tip to move (the future owns the receiver).
    Waiting(WatchWait),
    /// Ended: trimmed past, or the store is gone.
    Done,
}

/// A live reader of one log from an offset on; ends if retention trims past it. Drop to stop.
pub struct LogFollower {
    topic: String,
    shared: Weak<Topic>,
    cursor: u64,
    state: FollowState,
}

enum Step<T> {
    Batch(Vec<T>),
    Wait,
    End,
}

impl LogFollower {
    /// The offset of the next entry this follower yields.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    fn check(&mut self, max: usize) -> Step<LogEntry> {
        let Some(topic) = self.shared.upgrade() else {
            return Step::End;
        };
        let guard = lock(&topic.log);
        let Some(log) = guard.as_ref() else {
            return Step::Wait;
        };
        if self.cursor < log.first {
            tracing::debug!(
                topic = %self.topic,
                cursor = self.cursor,
                first = log.first,
                "log follower fell behind the retention; ending"
            );
            return Step::End;
        }
        if self.cursor >= log.next() {
            return Step::Wait;
        }
        let skip = (self.cursor - log.first) as usize;
        let batch: Vec<LogEntry> = log.entries.iter().skip(skip).take(max).cloned().collect();
        self.cursor += batch.len() as u64;
        Step::Batch(batch)
    }

    /// Polls for the next batch of at most `max` entries (≥ 1); `None` once ended. Cancel-safe.
    pub fn poll_next_batch(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Poll<Option<Vec<LogEntry>>> {
        let max = max.max(1);
        loop {
            match std::mem::replace(&mut self.state, FollowState::Done) {
                FollowState::Done => return Poll::Ready(None),
                FollowState::Idle(mut rx) => {
                    // Seen before the check, so an append after the check fires the wait.
                    rx.mark_unchanged();
                    match self.check(max) {
                        Step::Batch(b) => {
                            self.state = FollowState::Idle(rx);
                            return Poll::Ready(Some(b));
                        }
                        Step::End => return Poll::Ready(None),
                        Step::Wait => {
                            self.state = FollowState::Waiting(Box::pin(async move {
                                let alive = rx.changed().await.is_ok();
                                (rx, alive)
                            }));
                        }
                    }
                }
                FollowState::Waiting(mut fut) => match fut.as_mut().poll(cx) {
                    Poll::Pending => {
                        self.state = FollowState::Waiting(fut);
                        return Poll::Pending;
                    }
                    Poll::Ready((rx, true)) => self.state = FollowState::Idle(rx),
                    Poll::Ready((_, false)) => return Poll::Ready(None),
                },
            }
        }
    }

    /// The next batch of at most `max` entries, waiting at the tip; `None` once ended. Cancel-safe.
    pub async fn next_batch(&mut self, max: usize) -> Option<Vec<LogEntry>> {
        std::future::poll_fn(|cx| self.poll_next_batch(cx, max)).await
    }
}

impl std::fmt::Debug for LogFollower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogFollower")
            .field("topic", &self.topic)
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

type BroadcastWait = Pin<
    Box<
        dyn Future<
                Output = (
                    broadcast::Receiver<Vec<u8>>,
                    Result<Vec<u8>, broadcast::error::RecvError>,
                ),
            > + Send,
    >,
>;

enum SubState {
    Idle(broadcast::Receiver<Vec<u8>>),
    Waiting(BroadcastWait),
    Done,
}

/// A subscription to one channel; drop to unsubscribe.
pub struct ChannelSubscription {
    channel: String,
    state: SubState,
}

impl ChannelSubscription {
    /// Adds buffered payloads to `batch` up to `max`; false when the channel closed with nothing taken.
    fn drain(
        &self,
        rx: &mut broadcast::Receiver<Vec<u8>>,
        batch: &mut Vec<Vec<u8>>,
        max: usize,
    ) -> bool {
        use broadcast::error::TryRecvError;
        while batch.len() < max {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(TryRecvError::Lagged(n)) => self.lagged(n),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Closed) => return !batch.is_empty(),
            }
        }
        true
    }

    fn lagged(&self, n: u64) {
        tracing::warn!(
            channel = %self.channel,
            skipped = n,
            "channel subscriber fell behind; oldest payloads dropped"
        );
    }

    /// Polls for the next batch of at most `max` payloads (≥ 1); `None` once the store is gone. Cancel-safe.
    pub fn poll_next_batch(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Poll<Option<Vec<Vec<u8>>>> {
        let max = max.max(1);
        loop {
            match std::mem::replace(&mut self.state, SubState::Done) {
                SubState::Done => return Poll::Ready(None),
                SubState::Idle(mut rx) => {
                    let mut batch = Vec::new();
                    if !self.drain(&mut rx, &mut batch, max) {
                        return Poll::Ready(None);
                    }
                    if !batch.is_empty() {
                        self.state = SubState::Idle(rx);
                        return Poll::Ready(Some(batch));
                    }
                    self.state = SubState::Waiting(Box::pin(async move {
                        let r = rx.recv().await;
                        (rx, r)
                    }));
                }
                SubState::Waiting(mut fut) => match fut.as_mut().poll(cx) {
                    Poll::Pending => {
                        self.state = SubState::Waiting(fut);
                        return Poll::Pending;
                    }
                    Poll::Ready((mut rx, Ok(p))) => {
                        let mut batch = vec![p];
                        // A close here still leaves the batch to hand over; the next poll ends.
                        self.drain(&mut rx, &mut batch, max);
                        self.state = SubState::Idle(rx);
                        return Poll::Ready(Some(batch));
                    }
                    Poll::Ready((rx, Err(broadcast::error::RecvError::Lagged(n)))) => {
                        self.lagged(n);
                        self.state = SubState::Idle(rx);
                    }
                    Poll::Ready((_, Err(broadcast::error::RecvError::Closed))) => {
                        return Poll::Ready(None);
                    }
                },
            }
        }
    }

    /// The next batch of at most `max` payloads; `None` once the store is gone. Cancel-safe.
    pub async fn next_batch(&mut self, max: usize) -> Option<Vec<Vec<u8>>> {
        std::future::poll_fn(|cx| self.poll_next_batch(cx, max)).await
    }
}

impl std::fmt::Debug for ChannelSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelSubscription")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

/// A listener on one inbox address; dropping it unregisters it at once.
pub struct InboxListener {
    address: String,
    group: Option<String>,
    id: u64,
    registry: Weak<Mutex<Inboxes>>,
    rx: mpsc::Receiver<Packet>,
}

impl InboxListener {
    /// Its id, for [`MemoryStore::inbox_unlisten`].
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Polls for the next batch of at most `max` packets (≥ 1); `None` once the store is gone
    /// or the listener was taken off its address and has yielded the rest. Cancel-safe.
    pub fn poll_next_batch(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Poll<Option<Vec<Packet>>> {
        let mut batch = Vec::new();
        match self.rx.poll_recv_many(cx, &mut batch, max.max(1)) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(0) => Poll::Ready(None),
            Poll::Ready(_) => Poll::Ready(Some(batch)),
        }
    }

    /// The next batch of at most `max` packets; `None` once [`Self::poll_next_batch`] says so.
    /// Cancel-safe.
    pub async fn next_batch(&mut self, max: usize) -> Option<Vec<Packet>> {
        std::future::poll_fn(|cx| self.poll_next_batch(cx, max)).await
    }
}

impl Drop for InboxListener {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            lock(&registry).remove(&self.address, self.group.as_deref(), self.id);
        }
    }
}

impl std::fmt::Debug for InboxListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxListener")
            .field("address", &self.address)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use tokio::time::{sleep, timeout};

    fn rec(v: &str) -> LogRecord {
        LogRecord {
            value: v.as_bytes().to_vec(),
            headers: vec![("h".into(), b"1".to_vec())],
            key: Some(b"k".to_vec()),
        }
    }

    fn recs(n: usize) -> Vec<LogRecord> {
        (0..n).map(|i| rec(&i.to_string())).collect()
    }

    fn q(body: &str, delay_ms: u32) -> Queued {
        Queued {
            body: body.as_bytes().to_vec(),
            headers: vec![("h".into(), b"v".to_vec())],
            delay_ms,
        }
    }

    fn bodies(r: &[Received]) -> Vec<String> {
        r.iter()
            .map(|m| String::from_utf8(m.body.clone()).unwrap())
            .collect()
    }

    fn pkt(body: &str) -> Packet {
        Packet {
            body: body.as_bytes().to_vec(),
            headers: vec![],
            correlation_id: Some("c".into()),
            reply_to: None,
        }
    }

    const LONG: Duration = Duration::from_secs(5);
    const SHORT: Duration = Duration::from_millis(100);

    // ------------------------------------------------------------------------ static

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

    // -------------------------------------------------------------------------- logs

    #[test]
    fn log_created_on_open_with_first_epoch_kept() {
        let s = MemoryStore::new();
        let info = s.log_open("t", "e1", 10);
        assert_eq!(
            info,
            LogInfo {
                epoch: "e1".into(),
                first: 0,
                next: 0
            }
        );
        assert_eq!(s.log_open("t", "e2", 10).epoch, "e1");
        let (info, first) = s.log_append("t", "e3", 10, recs(2));
        assert_eq!((info.epoch.as_str(), first), ("e1", 0));
        // Created by an append too.
        let (info, _) = s.log_append("u", "eu", 10, recs(1));
        assert_eq!(
            info,
            LogInfo {
                epoch: "eu".into(),
                first: 0,
                next: 1
            }
        );
    }

    #[test]
    fn log_offsets_dense_and_retention_trims_first() {
        let s = MemoryStore::new();
        let (info, first) = s.log_append("t", "e", 5, recs(3));
        assert_eq!((info.first, info.next, first), (0, 3, 0));
        let (info, first) = s.log_append("t", "e", 5, recs(4));
        assert_eq!((info.first, info.next, first), (2, 7, 3));
        let (info, entries) = s.log_read("t", 0, 100).unwrap();
        assert_eq!(info.first, 2);
        let offsets: Vec<u64> = entries.iter().map(|e| e.offset).collect();
        assert_eq!(offsets, vec![2, 3, 4, 5, 6]);
        assert_eq!(entries[0].value, b"2".to_vec());
        assert_eq!(entries[0].key, Some(b"k".to_vec()));
        assert_eq!(entries[0].headers, vec![("h".to_string(), b"1".to_vec())]);
        // Empty batch: first offset is the tip.
        let (info, first) = s.log_append("t", "e", 5, vec![]);
        assert_eq!((info.next, first), (7, 7));
        // 0 = unlimited.
        let (info, _) = s.log_append("z", "e", 0, recs(50));
        assert_eq!((info.first, info.next), (0, 50));
    }

    #[test]
    fn log_read_missing_topic_is_empty() {
        let s = MemoryStore::new();
        let (info, entries) = s.log_read("nope", 0, 10).unwrap();
        assert_eq!(
            info,
            LogInfo {
                epoch: String::new(),
                first: 0,
                next: 0
            }
        );
        assert!(entries.is_empty());
        // A follower on a missing topic does not create the log.
        let _f = s.log_follow("ghost", 0);
        assert_eq!(s.log_read("ghost", 0, 10).unwrap().0.epoch, "");
    }

    #[test]
    fn log_read_past_tip_is_bad_request_and_limit_clamps() {
        let s = MemoryStore::new();
        s.log_append("t", "e", 3, recs(5)); // keeps 2, 3, 4
        let err = s.log_read("t", 6, 10).unwrap_err();
        assert!(
            matches!(&err, StoreError::BadRequest(m) if m.contains('6')),
            "{err}"
        );
        let (info, entries) = s.log_read("t", 5, 10).unwrap();
        assert_eq!(info.next, 5);
        assert!(entries.is_empty());
        // Below first: clamped, the caller compares `first` with what it asked for.
        let (info, entries) = s.log_read("t", 0, 2).unwrap();
        assert_eq!(info.first, 2);
        assert_eq!(
            entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
            vec![2, 3]
        );
        let (_, entries) = s.log_read("t", 3, 1).unwrap();
        assert_eq!(
            entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
            vec![3]
        );
    }

    #[tokio::test]
    async fn follower_yields_backlog_then_wakes_on_append() {
        let s = MemoryStore::new();
        s.log_append("t", "e", 100, recs(3));
        let mut f = s.log_follow("t", 1);
        let b = f.next_batch(10).await.unwrap();
        assert_eq!(b.iter().map(|e| e.offset).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(f.cursor(), 3);
        let s2 = s.clone();
        let task = tokio::spawn(async move {
            let mut got = Vec::new();
            while got.len() < 5 {
                let b = f.next_batch(2).await.unwrap();
                assert!(b.len() <= 2);
                got.extend(b.into_iter().map(|e| e.offset));
            }
            got
        });
        sleep(Duration::from_millis(30)).await;
        // The waiting follower holds no lock: appends and reads go through.
        s2.log_append("t", "e", 100, recs(1));
        assert!(s2.log_read("t", 0, 10).is_ok());
        sleep(Duration::from_millis(30)).await;
        s2.log_append("t", "e", 100, recs(4));
        let got = timeout(LONG, task).await.unwrap().unwrap();
        assert_eq!(got, vec![3, 4, 5, 6, 7]);
    }

    #[tokio::test]
    async fn follower_ends_when_start_is_trimmed() {
        let s = MemoryStore::new();
        s.log_append("t", "e", 3, recs(5)); // first = 2
        let mut f = s.log_follow("t", 1);
        assert_eq!(timeout(LONG, f.next_batch(10)).await.unwrap(), None);
        assert_eq!(f.next_batch(10).await, None, "stays ended");
    }

    #[tokio::test]
    async fn follower_ends_when_trimmed_past_while_behind_never_skips() {
        let s = MemoryStore::new();
        s.log_append("t", "e", 4, recs(4));
        let mut f = s.log_follow("t", 0);
        let b = f.next_batch(2).await.unwrap();
        assert_eq!(b.iter().map(|e| e.offset).collect::<Vec<_>>(), vec![0, 1]);
        // Trim past the cursor (2): first becomes 4.
        s.log_append("t", "e", 4, recs(4));
        assert_eq!(timeout(LONG, f.next_batch(10)).await.unwrap(), None);
    }

    #[tokio::test]
    async fn follower_at_tip_ends_when_woken_by_a_trim_past_it() {
        let s = MemoryStore::new();
        s.log_append("t", "e", 2, recs(2));
        let mut f = s.log_follow("t", 2);
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(b) = f.next_batch(1).await {
                seen.extend(b.into_iter().map(|e| e.offset));
                sleep(Duration::from_millis(50)).await; // a slow reader
            }
            seen
        });
        sleep(Duration::from_millis(20)).await;
        s.log_append("t", "e", 2, recs(1)); // offset 2: the reader takes it
        sleep(Duration::from_millis(10)).await;
        s.log_append("t", "e", 2, recs(5)); // 3..7, keeps 6, 7: cursor 3 trimmed
        let seen = timeout(LONG, task).await.unwrap().unwrap();
        assert_eq!(seen, vec![2]);
    }

    #[tokio::test]
    async fn follower_on_missing_topic_waits_for_creation() {
        let s = MemoryStore::new();
        let mut f = s.log_follow("later", 0);
        assert!(timeout(SHORT, f.next_batch(10)).await.is_err());
        s.log_open("later", "e", 10);
        assert!(timeout(SHORT, f.next_batch(10)).await.is_err());
        s.log_append("later", "e", 10, recs(2));
        let b = timeout(LONG, f.next_batch(10)).await.unwrap().unwrap();
        assert_eq!(b.len(), 2);
    }

    #[tokio::test]
    async fn follower_is_cancel_safe() {
        let s = MemoryStore::new();
        let mut f = s.log_follow("t", 0);
        let writer = {
            let s = s.clone();
            tokio::spawn(async move {
                for _ in 0..200 {
                    s.log_append("t", "e", 0, recs(3));
                    tokio::task::yield_now().await;
                    if rand_bit() {
                        sleep(Duration::from_millis(1)).await;
                    }
                }
            })
        };
        let mut next = 0u64;
        while next < 600 {
            // Polls are dropped constantly; nothing may be lost or repeated.
            if let Ok(b) = timeout(Duration::from_micros(300), f.next_batch(7)).await {
                for e in b.unwrap() {
                    assert_eq!(e.offset, next);
                    next += 1;
                }
            }
        }
        writer.await.unwrap();
    }

    fn rand_bit() -> bool {
        use std::hash::{BuildHasher, RandomState};
        RandomState::new().hash_one(0u8) & 1 == 1
    }

    #[tokio::test]
    async fn follower_ends_when_store_dropped() {
        let s = MemoryStore::new();
        s.log_open("t", "e", 10);
        let mut f = s.log_follow("t", 0);
        let task = tokio::spawn(async move { f.next_batch(1).await });
        sleep(Duration::from_millis(20)).await;
        drop(s);
        assert_eq!(timeout(LONG, task).await.unwrap().unwrap(), None);
    }

    // ------------------------------------------------------------------------ queues

    #[tokio::test]
    async fn queue_is_fifo_and_receive_takes_at_most_max() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0), q("c", 0)])
            .unwrap();
        let r = s.queue_receive("q", 2, 10_000, 0).await;
        assert_eq!(bodies(&r), vec!["a", "b"]);
        assert_eq!(r[0].headers, vec![("h".to_string(), b"v".to_vec())]);
        assert_eq!(bodies(&s.queue_receive("q", 5, 10_000, 0).await), vec!["c"]);
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 0,
                delayed: 0,
                leased: 3
            }
        );
        assert!(s.queue_receive("q", 0, 10_000, 0).await.is_empty());
        assert_eq!(s.queue_len("missing"), QueueStats::default());
    }

    #[tokio::test]
    async fn receive_gives_up_after_wait_ms() {
        let s = MemoryStore::new();
        let t0 = Instant::now();
        assert!(s.queue_receive("q", 1, 1000, 80).await.is_empty());
        assert!(t0.elapsed() >= Duration::from_millis(80));
    }

    #[tokio::test]
    async fn delayed_message_not_delivered_early_then_ordered_by_due_then_push() {
        let s = MemoryStore::new();
        s.queue_push(
            "q",
            vec![q("late", 300), q("d1", 150), q("d2", 150), q("now", 0)],
        )
        .unwrap();
        assert_eq!(
            bodies(&s.queue_receive("q", 10, 10_000, 0).await),
            vec!["now"]
        );
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 0,
                delayed: 3,
                leased: 1
            }
        );
        assert!(s.queue_receive("q", 10, 10_000, 50).await.is_empty());
        sleep(Duration::from_millis(400)).await;
        assert_eq!(
            bodies(&s.queue_receive("q", 10, 10_000, 0).await),
            vec!["d1", "d2", "late"]
        );
    }

    #[tokio::test]
    async fn waiting_receiver_woken_by_push() {
        let s = MemoryStore::new();
        let s2 = s.clone();
        let t0 = Instant::now();
        let task = tokio::spawn(async move { s2.queue_receive("q", 5, 10_000, 5_000).await });
        sleep(Duration::from_millis(50)).await;
        s.queue_push("q", vec![q("x", 0)]).unwrap();
        let r = timeout(LONG, task).await.unwrap().unwrap();
        assert_eq!(bodies(&r), vec!["x"]);
        assert!(t0.elapsed() < Duration::from_millis(2_000));
    }

    #[tokio::test]
    async fn waiting_receiver_woken_by_delay_becoming_due() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("d", 100)]).unwrap();
        let t0 = Instant::now();
        let r = s.queue_receive("q", 5, 10_000, 5_000).await;
        assert_eq!(bodies(&r), vec!["d"]);
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(100) && took < Duration::from_millis(2_000));
    }

    #[tokio::test]
    async fn lease_expiry_redelivers_at_the_front_and_wakes_waiters() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0)]).unwrap();
        let first = s.queue_receive("q", 1, 100, 0).await;
        assert_eq!(bodies(&first), vec!["a"]);
        let second = s.queue_receive("q", 1, 10_000, 0).await;
        assert_eq!(bodies(&second), vec!["b"]);
        s.queue_push("q", vec![q("c", 0)]).unwrap();
        // Leave c alone; a waiter on an empty queue is woken by a's expiry alone.
        let c = s.queue_receive("q", 1, 10_000, 0).await;
        assert_eq!(bodies(&c), vec!["c"]);
        s.queue_push("q", vec![q("d", 0)]).unwrap();
        sleep(Duration::from_millis(150)).await;
        // a expired: back at the front, before d.
        let r = s.queue_receive("q", 10, 10_000, 0).await;
        assert_eq!(bodies(&r), vec!["a", "d"]);
        assert_ne!(r[0].receipt, first[0].receipt, "a fresh receipt");
        // The old receipt is stale now.
        assert!(matches!(
            &s.queue_ack("q", &[first[0].receipt])[0],
            Err(StoreError::BadRequest(_))
        ));

        // A waiter with nothing ready is woken by an expiry (no push at all).
        let s2 = MemoryStore::new();
        s2.queue_push("w", vec![q("x", 0)]).unwrap();
        let _lease = s2.queue_receive("w", 1, 120, 0).await;
        let t0 = Instant::now();
        let r = s2.queue_receive("w", 1, 10_000, 5_000).await;
        assert_eq!(bodies(&r), vec!["x"]);
        assert!(t0.elapsed() < Duration::from_millis(2_000));
    }

    #[tokio::test]
    async fn waiter_woken_by_a_shorter_lease_taken_after_it_started() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("long", 0)]).unwrap();
        let _long = s.queue_receive("q", 1, 60_000, 0).await;
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.queue_receive("q", 1, 10_000, 4_000).await });
        sleep(Duration::from_millis(30)).await;
        // Pushed and leased at once by someone else with a short lease; the waiter may or may
        // not win the push, but either way it must get a message well before its wait ends.
        s.queue_push("q", vec![q("short", 0)]).unwrap();
        let _mine = s.queue_receive("q", 1, 100, 0).await;
        let t0 = Instant::now();
        let r = timeout(LONG, waiter).await.unwrap().unwrap();
        assert_eq!(bodies(&r), vec!["short"]);
        assert!(t0.elapsed() < Duration::from_millis(2_000));
    }

    #[tokio::test]
    async fn ack_removes_for_good() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0)]).unwrap();
        let r = s.queue_receive("q", 2, 50, 0).await;
        let res = s.queue_ack("q", &[r[0].receipt]);
        assert_eq!(res, vec![Ok(())]);
        sleep(Duration::from_millis(100)).await;
        // b expired and comes back; a does not.
        assert_eq!(
            bodies(&s.queue_receive("q", 10, 10_000, 0).await),
            vec!["b"]
        );
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 0,
                delayed: 0,
                leased: 1
            }
        );
    }

    #[tokio::test]
    async fn nack_zero_puts_back_at_front_unchanged() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0), q("c", 0)])
            .unwrap();
        let r = s.queue_receive("q", 2, 10_000, 0).await;
        assert_eq!(
            s.queue_nack("q", &[r[0].receipt, r[1].receipt], 0),
            vec![Ok(()), Ok(())]
        );
        let again = s.queue_receive("q", 10, 10_000, 0).await;
        assert_eq!(bodies(&again), vec!["a", "b", "c"]);
        assert_eq!(again[0].headers, r[0].headers);
        assert!(
            !again
                .iter()
                .any(|m| m.receipt == r[0].receipt || m.receipt == r[1].receipt)
        );
    }

    #[tokio::test]
    async fn nack_with_delay_redelivers_after_it_and_wakes_waiter() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0)]).unwrap();
        let r = s.queue_receive("q", 1, 10_000, 0).await;
        assert_eq!(s.queue_nack("q", &[r[0].receipt], 150), vec![Ok(())]);
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 0,
                delayed: 1,
                leased: 0
            }
        );
        assert!(s.queue_receive("q", 1, 10_000, 50).await.is_empty());
        let r = s.queue_receive("q", 1, 10_000, 3_000).await;
        assert_eq!(bodies(&r), vec!["a"]);

        // A waiter is woken by a nack (delay 0).
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.queue_receive("q", 1, 10_000, 4_000).await });
        sleep(Duration::from_millis(30)).await;
        let t0 = Instant::now();
        s.queue_nack("q", &[r[0].receipt], 0);
        let got = timeout(LONG, waiter).await.unwrap().unwrap();
        assert_eq!(bodies(&got), vec!["a"]);
        assert!(t0.elapsed() < Duration::from_millis(1_000));
    }

    #[tokio::test]
    async fn extend_keeps_the_lease_alive() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0)]).unwrap();
        let r = s.queue_receive("q", 1, 100, 0).await;
        sleep(Duration::from_millis(50)).await;
        assert_eq!(s.queue_extend("q", &[r[0].receipt], 400), vec![Ok(())]);
        sleep(Duration::from_millis(150)).await;
        // Past the original 100 ms: still leased.
        assert!(s.queue_receive("q", 1, 10_000, 0).await.is_empty());
        assert_eq!(s.queue_len("q").leased, 1);
        assert_eq!(s.queue_ack("q", &[r[0].receipt]), vec![Ok(())]);
        assert_eq!(s.queue_len("q"), QueueStats::default());
    }

    #[tokio::test]
    async fn extend_to_a_shorter_lease_wakes_a_sleeping_waiter() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0)]).unwrap();
        let r = s.queue_receive("q", 1, 60_000, 0).await;
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.queue_receive("q", 1, 10_000, 4_000).await });
        sleep(Duration::from_millis(30)).await; // the waiter sleeps until its 4 s give-up
        let t0 = Instant::now();
        assert_eq!(s.queue_extend("q", &[r[0].receipt], 50), vec![Ok(())]);
        let got = timeout(LONG, waiter).await.unwrap().unwrap();
        assert_eq!(bodies(&got), vec!["a"]);
        assert!(t0.elapsed() < Duration::from_millis(2_000));
    }

    #[tokio::test]
    async fn stale_receipts_are_bad_requests_naming_the_receipt() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0)]).unwrap();
        let r = s.queue_receive("q", 2, 60, 0).await;
        let (a, b) = (r[0].receipt, r[1].receipt);
        let check = |res: &Result<(), StoreError>, receipt: u64| match res {
            Err(StoreError::BadRequest(m)) => assert!(m.contains(&receipt.to_string()), "{m}"),
            other => panic!("expected bad request, got {other:?}"),
        };
        // Unknown.
        check(&s.queue_ack("q", &[999_999])[0], 999_999);
        // Already settled, per-receipt results in order.
        let res = s.queue_ack("q", &[a, a]);
        assert_eq!(res[0], Ok(()));
        check(&res[1], a);
        check(&s.queue_nack("q", &[a], 0)[0], a);
        check(&s.queue_extend("q", &[a], 100)[0], a);
        // Expired.
        sleep(Duration::from_millis(120)).await;
        check(&s.queue_ack("q", &[b])[0], b);
        check(&s.queue_extend("q", &[b], 100)[0], b);
        // Another queue's receipt names nothing here.
        s.queue_push("other", vec![q("o", 0)]).unwrap();
        let o = s.queue_receive("other", 1, 10_000, 0).await[0].receipt;
        check(&s.queue_ack("q", &[o])[0], o);
        assert_eq!(s.queue_ack("other", &[o]), vec![Ok(())]);
    }

    #[tokio::test]
    async fn receipts_are_unique_store_wide() {
        let s = MemoryStore::new();
        let mut seen = HashSet::new();
        for name in ["q1", "q2"] {
            s.queue_push(name, (0..20).map(|i| q(&i.to_string(), 0)).collect())
                .unwrap();
        }
        for _ in 0..2 {
            for name in ["q1", "q2"] {
                for m in s.queue_receive(name, 5, 1, 0).await {
                    assert!(seen.insert(m.receipt), "receipt reused");
                }
            }
            sleep(Duration::from_millis(5)).await; // leases expire: the same messages again
        }
        assert_eq!(seen.len(), 20);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn competing_receivers_get_disjoint_messages() {
        let s = MemoryStore::new();
        let n = 400;
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    let r = s.queue_receive("q", 3, 60_000, 200).await;
                    if r.is_empty() {
                        break;
                    }
                    got.extend(bodies(&r));
                }
                got
            }));
        }
        for chunk in (0..n).collect::<Vec<_>>().chunks(10) {
            s.queue_push("q", chunk.iter().map(|i| q(&i.to_string(), 0)).collect())
                .unwrap();
            tokio::task::yield_now().await;
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(timeout(LONG, t).await.unwrap().unwrap());
        }
        let distinct: HashSet<_> = all.iter().cloned().collect();
        assert_eq!(all.len(), n, "no duplicates");
        assert_eq!(distinct.len(), n, "nothing lost");
    }

    #[tokio::test]
    async fn refused_settlements_count_and_change_nothing() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0)]).unwrap();
        let r = s.queue_receive("q", 2, 10_000, 0).await;
        let (a, b) = (r[0].receipt, r[1].receipt);
        s.inject(Fault::RefuseSettlements {
            queue: "q".into(),
            count: 3,
        });
        // Another queue is not affected.
        s.queue_push("other", vec![q("o", 0)]).unwrap();
        let o = s.queue_receive("other", 1, 10_000, 0).await[0].receipt;
        assert_eq!(s.queue_ack("other", &[o]), vec![Ok(())]);
        let res = s.queue_ack("q", &[a, b]);
        assert!(
            res.iter().all(|r| matches!(r, Err(StoreError::Refused(_)))),
            "{res:?}"
        );
        let res = s.queue_nack("q", &[a], 0);
        assert!(matches!(res[0], Err(StoreError::Refused(_))));
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 0,
                delayed: 0,
                leased: 2
            },
            "nothing changed"
        );
        // The count is used up: settlements land again.
        assert_eq!(s.queue_ack("q", &[a]), vec![Ok(())]);
        assert_eq!(s.queue_extend("q", &[b], 10_000), vec![Ok(())]);
        assert_eq!(s.queue_nack("q", &[b], 0), vec![Ok(())]);
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 1,
                delayed: 0,
                leased: 0
            }
        );
        // A refused extend does not extend.
        let r = s.queue_receive("q", 1, 80, 0).await;
        s.inject(Fault::RefuseSettlements {
            queue: "q".into(),
            count: 1,
        });
        assert!(matches!(
            s.queue_extend("q", &[r[0].receipt], 60_000)[0],
            Err(StoreError::Refused(_))
        ));
        sleep(Duration::from_millis(120)).await;
        assert_eq!(
            s.queue_len("q").ready,
            1,
            "the lease expired as if never extended"
        );
    }

    // ---------------------------------------------------------------------- channels

    fn strs(b: &[Vec<u8>]) -> Vec<String> {
        b.iter()
            .map(|p| String::from_utf8(p.clone()).unwrap())
            .collect()
    }

    async fn drain_channel(sub: &mut ChannelSubscription) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(Some(b)) = timeout(Duration::from_millis(50), sub.next_batch(1000)).await {
            out.extend(strs(&b));
        }
        out
    }

    #[tokio::test]
    async fn channel_fans_out_to_every_subscriber() {
        let s = MemoryStore::new();
        assert_eq!(s.channel_publish("c", vec![b"lost".to_vec()]), 0);
        let mut s1 = s.channel_subscribe("c");
        let mut s2 = s.channel_subscribe("c");
        let n = s.channel_publish("c", vec![b"1".to_vec(), b"2".to_vec()]);
        assert_eq!(n, 2);
        assert_eq!(s.channel_publish("c", vec![b"3".to_vec()]), 2);
        assert_eq!(drain_channel(&mut s1).await, vec!["1", "2", "3"]);
        assert_eq!(drain_channel(&mut s2).await, vec!["1", "2", "3"]);
        // Batches respect max.
        s.channel_publish("c", vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(s1.next_batch(2).await.unwrap().len(), 2);
        assert_eq!(s1.next_batch(2).await.unwrap().len(), 1);
        // Drop = unsubscribe.
        drop(s2);
        assert_eq!(s.channel_publish("c", vec![b"x".to_vec()]), 1);
        drop(s1);
        assert_eq!(s.channel_publish("c", vec![b"y".to_vec()]), 0);
    }

    #[tokio::test]
    async fn channel_waiting_subscriber_woken_by_publish() {
        let s = MemoryStore::new();
        let mut sub = s.channel_subscribe("c");
        let task = tokio::spawn(async move { sub.next_batch(10).await });
        sleep(Duration::from_millis(30)).await;
        assert_eq!(s.channel_publish("c", vec![b"w".to_vec()]), 1);
        let got = timeout(LONG, task).await.unwrap().unwrap().unwrap();
        assert_eq!(strs(&got), vec!["w"]);
    }

    #[tokio::test]
    async fn channel_names_are_literal() {
        let s = MemoryStore::new();
        let mut star = s.channel_subscribe("room:*");
        let mut one = s.channel_subscribe("room:1");
        assert_eq!(s.channel_publish("room:1", vec![b"to-1".to_vec()]), 1);
        assert_eq!(s.channel_publish("room:*", vec![b"to-star".to_vec()]), 1);
        assert_eq!(drain_channel(&mut one).await, vec!["to-1"]);
        assert_eq!(drain_channel(&mut star).await, vec!["to-star"]);
    }

    #[tokio::test]
    async fn new_subscriber_gets_no_old_payloads() {
        let s = MemoryStore::new();
        let _early = s.channel_subscribe("c");
        s.channel_publish("c", vec![b"old".to_vec()]);
        let mut late = s.channel_subscribe("c");
        s.channel_publish("c", vec![b"new".to_vec()]);
        assert_eq!(drain_channel(&mut late).await, vec!["new"]);
    }

    #[tokio::test]
    async fn lagging_subscriber_skips_oldest_and_continues() {
        let s = MemoryStore::new();
        let mut sub = s.channel_subscribe("c");
        let total = CHANNEL_CAPACITY + 100;
        let payloads = (0..total).map(|i| i.to_string().into_bytes()).collect();
        s.channel_publish("c", payloads);
        let got = drain_channel(&mut sub).await;
        assert_eq!(got.len(), CHANNEL_CAPACITY);
        assert_eq!(got[0], "100");
        assert_eq!(got.last().unwrap(), &(total - 1).to_string());
        s.channel_publish("c", vec![b"after".to_vec()]);
        assert_eq!(drain_channel(&mut sub).await, vec!["after"]);

        // Lag noticed while waiting (the boxed recv) is skipped the same way.
        let mut sub2 = s.channel_subscribe("c");
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(sub2.poll_next_batch(&mut cx, 10).is_pending());
        s.channel_publish(
            "c",
            (0..total).map(|i| i.to_string().into_bytes()).collect(),
        );
        let got = drain_channel(&mut sub2).await;
        assert_eq!(got.len(), CHANNEL_CAPACITY);
        assert_eq!(got[0], "100");
    }

    #[tokio::test]
    async fn channel_subscription_is_cancel_safe() {
        let s = MemoryStore::new();
        let mut sub = s.channel_subscribe("c");
        let writer = {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..500u32 {
                    s.channel_publish("c", vec![i.to_string().into_bytes()]);
                    if i % 7 == 0 {
                        sleep(Duration::from_millis(1)).await;
                    }
                }
            })
        };
        let mut next = 0u32;
        while next < 500 {
            if let Ok(b) = timeout(Duration::from_micros(300), sub.next_batch(5)).await {
                for p in b.unwrap() {
                    assert_eq!(p, next.to_string().into_bytes());
                    next += 1;
                }
            }
        }
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn channel_subscription_ends_when_store_dropped() {
        let s = MemoryStore::new();
        let mut sub = s.channel_subscribe("c");
        drop(s);
        assert_eq!(timeout(LONG, sub.next_batch(1)).await.unwrap(), None);
    }

    // ----------------------------------------------------------------------- inboxes

    #[tokio::test]
    async fn send_to_nobody_is_unavailable() {
        let s = MemoryStore::new();
        let err = s.inbox_send("inbox.1", pkt("x"), 100).await.unwrap_err();
        assert_eq!(
            err,
            StoreError::Unavailable("nobody listens on inbox.1".into())
        );
    }

    #[tokio::test]
    async fn unlisten_ends_the_stream_after_what_was_sent_before() {
        let s = MemoryStore::new();
        let mut l = s.inbox_listen("a", None);
        let mut g = s.inbox_listen("a", Some("g".into()));
        for i in 0..3 {
            s.inbox_send("a", pkt(&i.to_string()), 100).await.unwrap();
        }
        s.inbox_unlisten(l.id());
        s.inbox_unlisten(g.id());
        let err = s.inbox_send("a", pkt("late"), 100).await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        for listener in [&mut l, &mut g] {
            let mut got = Vec::new();
            while let Some(batch) = listener.next_batch(16).await {
                got.extend(batch.into_iter().map(|p| p.body));
            }
            assert_eq!(got, [b"0".to_vec(), b"1".to_vec(), b"2".to_vec()]);
        }
        s.inbox_unlisten(12345);
    }

    #[tokio::test]
    async fn inbox_delivers_the_packet_whole() {
        let s = MemoryStore::new();
        let mut l = s.inbox_listen("a", None);
        let p = Packet {
            body: b"b".to_vec(),
            headers: vec![("x".into(), b"y".to_vec())],
            correlation_id: Some("corr".into()),
            reply_to: Some("reply".into()),
        };
        s.inbox_send("a", p.clone(), 100).await.unwrap();
        assert_eq!(l.next_batch(10).await.unwrap(), vec![p]);
    }

    #[tokio::test]
    async fn group_members_compete_ungrouped_get_all() {
        let s = MemoryStore::new();
        let mut g1 = s.inbox_listen("a", Some("g".into()));
        let mut g2 = s.inbox_listen("a", Some("g".into()));
        let mut all = s.inbox_listen("a", None);
        let n = 50;
        for i in 0..n {
            s.inbox_send("a", pkt(&i.to_string()), 1000).await.unwrap();
        }
        async fn drain(l: &mut InboxListener) -> Vec<String> {
            let mut out = Vec::new();
            while let Ok(Some(b)) = timeout(Duration::from_millis(50), l.next_batch(1000)).await {
                out.extend(b.into_iter().map(|p| String::from_utf8(p.body).unwrap()));
            }
            out
        }
        let (a, b, c) = (
            drain(&mut g1).await,
            drain(&mut g2).await,
            drain(&mut all).await,
        );
        let expected: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        assert_eq!(
            c, expected,
            "the ungrouped listener gets every packet, in order"
        );
        assert!(!a.is_empty() && !b.is_empty(), "both members get some");
        assert_eq!(a.len() + b.len(), n, "no duplicates within the group");
        let union: HashSet<_> = a.iter().chain(b.iter()).cloned().collect();
        assert_eq!(union.len(), n);
        // Each member sees its share in the sender's order.
        let idx = |v: &Vec<String>| {
            v.iter()
                .map(|x| x.parse::<u32>().unwrap())
                .collect::<Vec<_>>()
        };
        assert!(idx(&a).windows(2).all(|w| w[0] < w[1]));
        assert!(idx(&b).windows(2).all(|w| w[0] < w[1]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn per_sender_order_is_kept() {
        let s = MemoryStore::new();
        let mut l = s.inbox_listen("a", None);
        let mut senders = Vec::new();
        for who in 0..3 {
            let s = s.clone();
            senders.push(tokio::spawn(async move {
                for i in 0..1000 {
                    s.inbox_send("a", pkt(&format!("{who}:{i}")), 5_000)
                        .await
                        .unwrap();
                }
            }));
        }
        let mut last = [-1i64; 3];
        let mut count = 0;
        while count < 3000 {
            let b = timeout(LONG, l.next_batch(64)).await.unwrap().unwrap();
            for p in b {
                let text = String::from_utf8(p.body).unwrap();
                let (who, i) = text.split_once(':').unwrap();
                let (who, i): (usize, i64) = (who.parse().unwrap(), i.parse().unwrap());
                assert_eq!(i, last[who] + 1, "sender {who} out of order");
                last[who] = i;
                count += 1;
            }
        }
        for t in senders {
            t.await.unwrap();
        }
    }

    #[tokio::test]
    async fn dropped_listener_unregisters_at_once() {
        let s = MemoryStore::new();
        let l = s.inbox_listen("a", None);
        let g = s.inbox_listen("a", Some("g".into()));
        s.inbox_send("a", pkt("x"), 100).await.unwrap();
        drop(l);
        s.inbox_send("a", pkt("y"), 100).await.unwrap();
        drop(g);
        let err = s.inbox_send("a", pkt("z"), 100).await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)));
        assert_eq!(lock(&s.inboxes).addresses.len(), 0, "nothing left behind");
    }

    #[tokio::test]
    async fn group_round_robin_skips_dropped_member() {
        let s = MemoryStore::new();
        let g1 = s.inbox_listen("a", Some("g".into()));
        let mut g2 = s.inbox_listen("a", Some("g".into()));
        drop(g1);
        for i in 0..4 {
            s.inbox_send("a", pkt(&i.to_string()), 100).await.unwrap();
        }
        assert_eq!(g2.next_batch(10).await.unwrap().len(), 4);
    }

    #[tokio::test]
    async fn full_listener_times_out_then_takes_again() {
        let s = MemoryStore::new();
        let mut l = s.inbox_listen("a", None);
        for i in 0..INBOX_CAPACITY {
            s.inbox_send("a", pkt(&i.to_string()), 0).await.unwrap();
        }
        let t0 = Instant::now();
        let err = s.inbox_send("a", pkt("over"), 60).await.unwrap_err();
        assert!(matches!(err, StoreError::Timeout(_)), "{err}");
        assert!(t0.elapsed() >= Duration::from_millis(60));
        // A sender waiting for room gets in once the listener reads.
        let s2 = s.clone();
        let waiting = tokio::spawn(async move { s2.inbox_send("a", pkt("late"), 5_000).await });
        sleep(Duration::from_millis(30)).await;
        let first = l.next_batch(10).await.unwrap();
        assert_eq!(first.len(), 10);
        timeout(LONG, waiting).await.unwrap().unwrap().unwrap();
        let mut rest = Vec::new();
        while rest.len() < INBOX_CAPACITY - 10 + 1 {
            rest.extend(l.next_batch(2000).await.unwrap());
        }
        assert_eq!(rest.last().unwrap().body, b"late".to_vec());
    }

    #[tokio::test]
    async fn inbox_listener_is_cancel_safe_and_ends_with_store() {
        let s = MemoryStore::new();
        let mut l = s.inbox_listen("a", None);
        let writer = {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..300u32 {
                    s.inbox_send("a", pkt(&i.to_string()), 5_000).await.unwrap();
                    if i % 5 == 0 {
                        sleep(Duration::from_millis(1)).await;
                    }
                }
            })
        };
        let mut next = 0u32;
        while next < 300 {
            if let Ok(b) = timeout(Duration::from_micros(300), l.next_batch(4)).await {
                for p in b.unwrap() {
                    assert_eq!(p.body, next.to_string().into_bytes());
                    next += 1;
                }
            }
        }
        writer.await.unwrap();
        drop(s);
        assert_eq!(timeout(LONG, l.next_batch(1)).await.unwrap(), None);
    }
}
