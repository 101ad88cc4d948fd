//! One queue consumer: a group member of the queue's topics, its events read by an [`Inbox`],
//! and the ledger of each assigned partition. It commits only a partition's settled prefix
//! (the lowest offset still held, or the next one to deliver); a not-yet-due retry copy pauses
//! its partition until it is due, then a seek back to it resumes the partition. A refused
//! commit, tried again by the SDK, ends in a seek back to the last committed offset: everything
//! after it is redelivered, never skipped, and the partition's older tags turn `stale`, as do
//! a revoked partition's.
//!
//! Settlements of a batch run together: one commit at a time per member, covering the prefix
//! settled by then of every assigned partition (one `commit` call for all of them, as a native
//! consumer commits); the settlement that starts a commit first yields, so the rest of its
//! batch is off the ledger and a batch of acks costs one commit, not one each (nor one per
//! partition).
//!
//! After a seek, records the member fetched before it are still on their way (the member's
//! event stream buffers them): until the record at the sought offset arrives, a partition's
//! records are the old fetch's and are dropped. Taking one of them would skip the sought
//! record, whose refetch would then look like a duplicate.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::rc::Rc;

use super::{NOT_BEFORE, Names, put};
use crate::inbox::Inbox;
use crate::wrpc::kafka::client::{self, Incoming, MemberEvent, TopicPartition};
use crate::{Config, debug, kafka_error, topics};
use wrpc_broker_guest::queue::{self, Copy, CopyTo, Received, tried};
use wrpc_broker_guest::signal::{Latch, Notify};
use wrpc_broker_guest::{Error, headers, host, now_ms};

/// How long one receive waits for a record, in milliseconds.
const RECEIVE_WAIT_MS: u64 = 250;
/// How many member events are taken at a time.
const EVENTS: usize = 256;

/// A topic partition as a map key.
type Key = (String, u32);

/// What settles one delivery: where it is and the partition incarnation it came in.
#[derive(Clone)]
pub(crate) struct Handle {
    topic: String,
    partition: u32,
    offset: u64,
    /// The partition's incarnation (a revoke or a seek back starts another).
    epoch: u64,
}

/// The ledger of one assigned partition.
struct Part {
    epoch: u64,
    /// Offsets delivered and not settled.
    held: BTreeSet<u64>,
    /// The next offset to deliver (none before the first record).
    next: Option<u64>,
    /// The offset the group has committed (or started from).
    committed: Option<u64>,
    /// The due time of the retry copy the partition waits for, paused.
    waiting: Option<u64>,
    /// The offset the partition delivers next after a seek (a seek back, or the one that
    /// resumes a waiting partition): records before it arrives are the old fetch's.
    sought: Option<u64>,
}

/// The live group member.
struct Member {
    id: u64,
    events: Rc<Inbox<MemberEvent>>,
}

/// A consumer of one queue.
pub(crate) struct KafkaConsumer {
    config: Rc<Config>,
    names: Names,
    dlq: String,
    member: RefCell<Option<Member>>,
    parts: RefCell<HashMap<Key, Part>>,
    ready: RefCell<VecDeque<Incoming>>,
    next_epoch: Cell<u64>,
    /// A commit of this member is on its way.
    committing: Cell<bool>,
    /// Fires when a commit ended.
    commits: Notify,
}

/// The ledger of `key` if it is still the incarnation `epoch` (not revoked, not sought back).
fn incarnation<'a>(
    parts: &'a mut HashMap<Key, Part>,
    key: &Key,
    epoch: u64,
) -> Option<&'a mut Part> {
    parts.get_mut(key).filter(|p| p.epoch == epoch)
}

/// The WIT topic partition of `key`.
fn tp(key: &Key) -> TopicPartition {
    TopicPartition {
        topic: key.0.clone(),
        partition: key.1,
    }
}

impl KafkaConsumer {
    /// A consumer of `names` not yet in its group.
    pub(crate) fn new(config: Rc<Config>, names: Names, dlq: String) -> Self {
        Self {
            config,
            names,
            dlq,
            member: RefCell::new(None),
            parts: RefCell::new(HashMap::new()),
            ready: RefCell::new(VecDeque::new()),
            next_epoch: Cell::new(1),
            committing: Cell::new(false),
            commits: Notify::new(),
        }
    }

    /// Join the group (returns once the first assignment arrived).
    pub(crate) async fn join(&self) -> Result<(), Error> {
        let (id, events) = client::join(self.names.main.clone(), self.names.topics())
            .await
            .map_err(kafka_error)?;
        self.parts.borrow_mut().clear();
        self.ready.borrow_mut().clear();
        *self.member.borrow_mut() = Some(Member {
            id,
            events: Inbox::start(events),
        });
        Ok(())
    }

    fn member_id(&self) -> Result<u64, Error> {
        self.member
            .borrow()
            .as_ref()
            .map(|m| m.id)
            .ok_or_else(|| Error::unavailable("not in the group"))
    }

    fn epoch(&self) -> u64 {
        self.next_epoch.replace(self.next_epoch.get() + 1)
    }

    /// Apply member events: assignments, revocations, records.
    fn absorb(&self, events: Vec<MemberEvent>) {
        for event in events {
            match event {
                MemberEvent::Fetched(r) => self.ready.borrow_mut().push_back(r),
                MemberEvent::Assigned((n, list)) => {
                    debug(&format!(
                        "group {}: assignment {n}: {} partitions",
                        self.names.main,
                        list.len()
                    ));
                    for t in list {
                        let part = Part {
                            epoch: self.epoch(),
                            held: BTreeSet::new(),
                            next: None,
                            committed: None,
                            waiting: None,
                            sought: None,
                        };
                        self.parts.borrow_mut().insert((t.topic, t.partition), part);
                    }
                }
                MemberEvent::Revoked(list) => {
                    debug(&format!(
                        "group {}: {} partitions revoked",
                        self.names.main,
                        list.len()
                    ));
                    let keys: Vec<Key> = list.into_iter().map(|t| (t.topic, t.partition)).collect();
                    let mut parts = self.parts.borrow_mut();
                    for key in &keys {
                        parts.remove(key);
                    }
                    self.ready
                        .borrow_mut()
                        .retain(|r| !keys.iter().any(|k| k.0 == r.topic && k.1 == r.partition));
                }
                MemberEvent::Failed(e) => debug(&format!("group {}: {e:?}", self.names.main)),
            }
        }
    }

    /// Resume the partitions whose waiting retry copy is due, fetching again from that copy.
    async fn resume_due(&self, member: u64) {
        let now = now_ms();
        let due: Vec<(Key, Option<u64>)> = self
            .parts
            .borrow_mut()
            .iter_mut()
            .filter(|(_, p)| p.waiting.is_some_and(|at| at <= now))
            .map(|(k, p)| {
                p.waiting = None;
                (k.clone(), p.sought)
            })
            .collect();
        for (key, sought) in due {
            if let Some(offset) = sought {
                let _ = client::seek(member, tp(&key), offset).await;
            }
            let _ = client::pause(member, tp(&key), false).await;
        }
    }

    /// The earliest due time of a waiting partition.
    fn next_due(&self) -> Option<u64> {
        self.parts.borrow().values().filter_map(|p| p.waiting).min()
    }

    /// Up to `room` deliverable records of the ready ones; a not-yet-due retry copy pauses
    /// its partition (`resume_due` seeks back to it when it is due).
    async fn take(&self, member: u64, room: usize) -> Vec<Received<Handle>> {
        let mut out = Vec::new();
        let mut hold_back = Vec::new();
        let now = now_ms();
        while out.len() < room {
            let Some(r) = self.ready.borrow_mut().pop_front() else {
                break;
            };
            let key = (r.topic.clone(), r.partition);
            let mut parts = self.parts.borrow_mut();
            let Some(part) = parts.get_mut(&key) else {
                continue;
            };
            if part.waiting.is_some() || part.next.is_some_and(|n| r.offset < n) {
                continue;
            }
            if let Some(sought) = part.sought {
                if r.offset != sought {
                    continue;
                }
                part.sought = None;
            }
            part.committed.get_or_insert(r.offset);
            let due = headers::get(&r.headers, NOT_BEFORE)
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|s| s.parse::<u64>().ok());
            if let Some(at) = due.filter(|at| *at > now) {
                part.waiting = Some(at);
                part.next = Some(r.offset);
                part.sought = Some(r.offset);
                hold_back.push(key);
                continue;
            }
            part.next = Some(r.offset + 1);
            part.held.insert(r.offset);
            let attempt = headers::attempt(&r.headers);
            let mut kept = headers::without_attempt(r.headers);
            kept.retain(|(k, _)| !k.eq_ignore_ascii_case(NOT_BEFORE));
            out.push(Received {
                handle: Handle {
                    topic: r.topic,
                    partition: r.partition,
                    offset: r.offset,
                    epoch: part.epoch,
                },
                body: r.value,
                headers: kept,
                attempt,
            });
        }
        for key in hold_back {
            let _ = client::pause(member, tp(&key), true).await;
        }
        out
    }

    /// Settle `held` in its partition's ledger and see the settled prefix committed: by this
    /// call, or by the commit on its way when that one covers it.
    async fn settle(&self, held: &Handle) -> Result<(), Error> {
        let key = (held.topic.clone(), held.partition);
        let stale = || {
            Error::stale(format!(
                "{}/{} was revoked or sought back: offset {} is redelivered",
                key.0, key.1, held.offset
            ))
        };
        let wanted = {
            let mut parts = self.parts.borrow_mut();
            let part = incarnation(&mut parts, &key, held.epoch).ok_or_else(stale)?;
            part.held.remove(&held.offset);
            Self::prefix(part, held.offset)
        };
        loop {
            let notified = self.commits.notified();
            {
                let mut parts = self.parts.borrow_mut();
                let part = incarnation(&mut parts, &key, held.epoch).ok_or_else(stale)?;
                if part.committed.is_some_and(|c| c >= wanted) {
                    return Ok(());
                }
            }
            if self.committing.replace(true) {
                notified.await;
                continue;
            }
            // The settlements of this batch run together: let the others take their deliveries
            // off the ledger first, so this commit covers the batch (not its first ack alone,
            // with a second commit for the rest after it).
            wit_bindgen::yield_async().await;
            let targets = self.targets(&key, held);
            let Some(targets) = targets else {
                self.committing.set(false);
                self.commits.notify();
                return Err(stale());
            };
            let offsets = targets.iter().map(|(k, _, o)| (tp(k), *o)).collect();
            let committed = self.commit(offsets).await;
            if committed.is_ok() {
                let mut parts = self.parts.borrow_mut();
                for (k, epoch, offset) in targets {
                    if let Some(part) = incarnation(&mut parts, &k, epoch) {
                        part.committed = Some(part.committed.map_or(offset, |c| c.max(offset)));
                    }
                }
            }
            self.committing.set(false);
            self.commits.notify();
            return committed;
        }
    }

    /// What a commit started by the settlement of `held` (on `key`) covers: the settled
    /// prefix of its partition, and of every other assigned partition whose prefix is past its
    /// committed offset — with each partition's incarnation. None when `key` is no longer the
    /// incarnation `held` came from.
    fn targets(&self, key: &Key, held: &Handle) -> Option<Vec<(Key, u64, u64)>> {
        let parts = self.parts.borrow();
        let own = parts.get(key).filter(|p| p.epoch == held.epoch)?;
        let mut targets = vec![(key.clone(), own.epoch, Self::prefix(own, held.offset))];
        for (k, part) in parts.iter().filter(|(k, _)| *k != key) {
            let Some(prefix) = Self::settled_prefix(part) else {
                continue;
            };
            if part.committed.is_some_and(|c| c >= prefix) {
                continue;
            }
            targets.push((k.clone(), part.epoch, prefix));
        }
        Some(targets)
    }

    /// The offset `part` may commit: its lowest held one, or the next to deliver (none before
    /// its first record).
    fn settled_prefix(part: &Part) -> Option<u64> {
        part.held.first().copied().or(part.next)
    }

    /// [`Self::settled_prefix`], or past `settled` when the partition has delivered nothing.
    fn prefix(part: &Part, settled: u64) -> u64 {
        Self::settled_prefix(part).unwrap_or(settled + 1)
    }

    /// Commit these next offsets, in one call.
    async fn commit(&self, offsets: Vec<(TopicPartition, u64)>) -> Result<(), Error> {
        client::commit(self.member_id()?, offsets)
            .await
            .map_err(kafka_error)
    }
}

impl queue::Broker for KafkaConsumer {
    type Handle = Handle;
    // Acks of a batch settle together; their commits coalesce into one per member (`settle`).
    const CONCURRENT_SETTLES: bool = true;

    fn keep_alive_ms(&self) -> u32 {
        // Nothing to extend: a partition's records stay with its member until a rebalance.
        3_600_000
    }

    async fn receive(&self, room: u32, stop: &Latch) -> Result<Vec<Received<Handle>>, Error> {
        let ended = self
            .member
            .borrow()
            .as_ref()
            .is_none_or(|m| m.events.is_done());
        if ended {
            if let Ok(old) = self.member_id() {
                debug(&format!(
                    "group {}: member stream ended, joining again",
                    self.names.main
                ));
                client::leave(old).await;
            }
            *self.member.borrow_mut() = None;
            self.join().await?;
        }
        let (member, events) = match self.member.borrow().as_ref() {
            Some(m) => (m.id, m.events.clone()),
            None => return Err(Error::unavailable("not in the group")),
        };
        let deadline = now_ms() + RECEIVE_WAIT_MS;
        loop {
            self.resume_due(member).await;
            self.absorb(events.take(EVENTS));
            let got = self.take(member, room as usize).await;
            let now = now_ms();
            if !got.is_empty() || stop.is_set() || now >= deadline || events.is_done() {
                return Ok(got);
            }
            let until = self.next_due().map_or(deadline, |d| d.min(deadline));
            let wait = u32::try_from(until.saturating_sub(now).max(1)).unwrap_or(1);
            events.wait(wait, Some(stop)).await;
        }
    }

    async fn extend(&self, _held: Vec<Handle>) {}

    async fn ack(&self, held: &Received<Handle>) -> Result<(), Error> {
        self.settle(&held.handle).await
    }

    async fn copy_then_ack(&self, held: &Received<Handle>, copy: Copy<'_>) -> Result<(), Error> {
        let (topic, not_before) = match copy.to {
            CopyTo::Queue if copy.delay_ms == 0 => (self.names.main.clone(), None),
            CopyTo::Queue => (
                self.names.bucket(copy.delay_ms).to_string(),
                Some(now_ms() + u64::from(copy.delay_ms)),
            ),
            CopyTo::DeadLetter => {
                let wanted = [(self.dlq.clone(), self.config.queue_partitions)];
                topics::ensure(&self.config, &wanted, &[]).await?;
                (self.dlq.clone(), None)
            }
        };
        put(&topic, copy.headers, copy.attempt, not_before, &held.body).await?;
        tried(|| self.ack(held)).await
    }

    async fn release(&self, held: &Received<Handle>) -> Result<(), Error> {
        put(
            &self.names.main,
            &held.headers,
            held.attempt,
            None,
            &held.body,
        )
        .await?;
        tried(|| self.ack(held)).await
    }

    async fn hand_back(&self, held: &Received<Handle>) {
        let h = &held.handle;
        let key = (h.topic.clone(), h.partition);
        let back = {
            let mut parts = self.parts.borrow_mut();
            let Some(part) = incarnation(&mut parts, &key, h.epoch) else {
                return;
            };
            let back = part.committed.unwrap_or(h.offset);
            part.epoch = self.epoch();
            part.held.clear();
            part.next = Some(back);
            part.waiting = None;
            part.sought = Some(back);
            // A commit on its way that covers the old incarnation does not count for this one
            // (its result applies only to the incarnation it was made for).
            back
        };
        self.ready
            .borrow_mut()
            .retain(|r| !(r.topic == key.0 && r.partition == key.1));
        host::log(
            wrpc_broker_guest::Level::Warn,
            &format!(
                "{}/{}: settlement refused; seeking back to {back} (redelivered)",
                key.0, key.1
            ),
        );
        if let Ok(member) = self.member_id() {
            let _ = client::pause(member, tp(&key), false).await;
            let _ = client::seek(member, tp(&key), back).await;
        }
    }

    async fn hand_back_all(&self, _held: Vec<Received<Handle>>) {
        // Left uncommitted: the partition's next owner gets them from the committed offset.
    }

    async fn finish(&self) {
        let member = self.member.borrow_mut().take();
        if let Some(member) = member {
            member.events.close();
            client::leave(member.id).await;
        }
    }
}
