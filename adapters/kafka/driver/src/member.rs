//! Group members: a `StreamConsumer` subscribed to a queue's topics, whose rebalance events and
//! records travel, in the order librdkafka produced them, on one stream to the adapter; and
//! the calls on a member (commit, seek, pause, leave). Commits of one member are serialised and
//! never move a partition's committed offset backwards.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{mpsc, oneshot, watch};

use crate::bindings::wit;
use crate::client::{CALL_TIMEOUT, blocking, consumer_config};
use crate::{KafkaDriver, REFUSALS, convert};

/// Events queued for the adapter beyond which the member stops fetching until it reads.
const MEMBER_BUFFER: usize = 1024;
/// How long `join` waits for the member's first assignment.
const JOIN_WAIT: Duration = Duration::from_secs(30);
/// How long `join` then waits for the member's first record (none on an empty queue).
const FIRST_FETCH_WAIT: Duration = Duration::from_millis(1_000);

/// A topic partition as a map key.
type Key = (String, i32);

/// Rebalance callbacks of one member: they queue events and track what it owns.
pub(crate) struct MemberContext {
    events: mpsc::UnboundedSender<wit::MemberEvent>,
    /// Events queued and not yet read by the adapter.
    queued: Arc<AtomicUsize>,
    /// How many assignments the member received.
    assignments: watch::Sender<u32>,
    /// The partitions it owns now.
    owned: Mutex<HashSet<Key>>,
}

impl ClientContext for MemberContext {}

/// The partitions of `list` as WIT records and map keys.
fn partitions(list: &TopicPartitionList) -> (Vec<wit::TopicPartition>, Vec<Key>) {
    list.elements()
        .iter()
        .map(|e| {
            (
                wit::TopicPartition {
                    topic: e.topic().to_string(),
                    partition: u32::try_from(e.partition()).unwrap_or(0),
                },
                (e.topic().to_string(), e.partition()),
            )
        })
        .unzip()
}

impl ConsumerContext for MemberContext {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let event = match rebalance {
            Rebalance::Assign(list) => {
                let (tps, keys) = partitions(list);
                self.owned
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(keys);
                let mut n = 0;
                self.assignments.send_modify(|count| {
                    *count += 1;
                    n = *count;
                });
                wit::MemberEvent::Assigned((n, tps))
            }
            Rebalance::Revoke(list) => {
                let (tps, keys) = partitions(list);
                let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
                for key in &keys {
                    owned.remove(key);
                }
                wit::MemberEvent::Revoked(tps)
            }
            Rebalance::Error(e) => wit::MemberEvent::Failed(convert::error(e.clone())),
        };
        tracing::debug!("kafka: rebalance: {rebalance:?}");
        self.queued.fetch_add(1, Ordering::SeqCst);
        let _ = self.events.send(event);
    }
}

/// One live group member.
pub(crate) struct Member {
    consumer: Arc<StreamConsumer<MemberContext>>,
    /// The topics it subscribed to (the fault hook matches a queue name in them).
    topics: Vec<String>,
    /// The highest offset committed per partition.
    committed: tokio::sync::Mutex<HashMap<Key, i64>>,
    /// Ends the fetch task.
    stop: watch::Sender<bool>,
    /// Fires once the consumer closed (left the group).
    closed: Mutex<Option<oneshot::Receiver<()>>>,
}

/// A member's events, as a batch source for its stream.
pub(crate) struct Events {
    rx: mpsc::UnboundedReceiver<wit::MemberEvent>,
    queued: Arc<AtomicUsize>,
}

impl wrpc_broker_runtime::streams::PollBatch for Events {
    type Item = wit::MemberEvent;

    fn poll_batch(
        &mut self,
        cx: &mut std::task::Context<'_>,
        max: usize,
    ) -> std::task::Poll<Option<Vec<Self::Item>>> {
        let mut batch = Vec::new();
        match self.rx.poll_recv_many(cx, &mut batch, max.max(1)) {
            std::task::Poll::Ready(0) => std::task::Poll::Ready(None),
            std::task::Poll::Ready(n) => {
                self.queued.fetch_sub(n, Ordering::SeqCst);
                std::task::Poll::Ready(Some(batch))
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl KafkaDriver {
    /// Join `group` on `topics`; returns once the first assignment arrived (or after
    /// [`JOIN_WAIT`]) and then the first record (or after [`FIRST_FETCH_WAIT`]).
    pub(crate) async fn join(
        &self,
        group: String,
        topics: Vec<String>,
    ) -> Result<(u64, Events), wit::KafkaError> {
        let (events, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let (assignments, mut assigned) = watch::channel(0);
        let context = MemberContext {
            events: events.clone(),
            queued: queued.clone(),
            assignments,
            owned: Mutex::new(HashSet::new()),
        };
        let mut config = consumer_config(&self.shared.bootstrap, &group);
        // Range assigns each topic on its own: the main topic is shared by the members (a
        // balanced count over all the topics could leave one member only bucket partitions).
        config.set("partition.assignment.strategy", "range");
        let consumer: StreamConsumer<MemberContext> = config
            .create_with_context(context)
            .map_err(convert::error)?;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&names).map_err(convert::error)?;
        let consumer = Arc::new(consumer);
        let (stop, stopped) = watch::channel(false);
        let (fetched_tx, mut fetched) = watch::channel(false);
        let (closed_tx, closed_rx) = oneshot::channel();
        let id = self.shared.next_handle.fetch_add(1, Ordering::SeqCst);
        let member = Arc::new(Member {
            consumer: consumer.clone(),
            topics,
            committed: tokio::sync::Mutex::new(HashMap::new()),
            stop,
            closed: Mutex::new(Some(closed_rx)),
        });
        self.members().insert(id, member);
        let driver = self.clone();
        tokio::spawn(async move {
            fetch(&consumer, events, queued.clone(), stopped, fetched_tx).await;
            let member = driver.members().remove(&id);
            // Closing the consumer (LeaveGroup) blocks: off the runtime, with the last handles.
            let _ = blocking(move || {
                consumer.unsubscribe();
                drop(member);
                drop(consumer);
                Ok(())
            })
            .await;
            let _ = closed_tx.send(());
        });
        let _ = tokio::time::timeout(JOIN_WAIT, assigned.wait_for(|n| *n > 0)).await;
        // Fetching starts after the assignment (committed offsets, then a fetch): a queue with
        // messages has its first one on the way when `join` returns.
        let _ = tokio::time::timeout(FIRST_FETCH_WAIT, fetched.wait_for(|f| *f)).await;
        let queued = self
            .member(id)
            .map(|m| m.consumer.context().queued.clone())?;
        Ok((id, Events { rx, queued }))
    }

    /// The live members.
    fn members(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Member>>> {
        self.shared
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Member `id`, or `stale`.
    fn member(&self, id: u64) -> Result<Arc<Member>, wit::KafkaError> {
        self.members()
            .get(&id)
            .cloned()
            .ok_or_else(|| wit::KafkaError::Stale(format!("no group member {id}")))
    }

    /// Commit `offsets` for member `id`: only partitions it owns, only forward.
    pub(crate) async fn commit(
        &self,
        id: u64,
        offsets: Vec<(wit::TopicPartition, u64)>,
    ) -> Result<(), wit::KafkaError> {
        let member = self.member(id)?;
        if REFUSALS.is_armed()
            && let Some(why) =
                REFUSALS.refuse(|queue| member.topics.iter().any(|t| t.contains(queue)))
        {
            return Err(wit::KafkaError::Refused(why));
        }
        let mut committed = member.committed.lock().await;
        let mut list = TopicPartitionList::new();
        let mut moved = Vec::new();
        {
            let owned = member
                .consumer
                .context()
                .owned
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for (tp, offset) in offsets {
                let key = (tp.topic, convert::partition(tp.partition)?);
                let offset = convert::offset(offset)?;
                if !owned.contains(&key) {
                    return Err(wit::KafkaError::Stale(format!(
                        "{}/{} is not assigned to this member",
                        key.0, key.1
                    )));
                }
                if committed.get(&key).is_some_and(|c| *c >= offset) {
                    continue;
                }
                list.add_partition_offset(&key.0, key.1, Offset::Offset(offset))
                    .map_err(convert::error)?;
                moved.push((key, offset));
            }
        }
        if moved.is_empty() {
            return Ok(());
        }
        let consumer = member.consumer.clone();
        blocking(move || {
            consumer
                .commit(&list, CommitMode::Sync)
                .map_err(convert::error)
        })
        .await?;
        committed.extend(moved);
        Ok(())
    }

    /// Move member `id`'s fetch position on `at` to `offset`.
    pub(crate) async fn seek(
        &self,
        id: u64,
        at: wit::TopicPartition,
        offset: u64,
    ) -> Result<(), wit::KafkaError> {
        let consumer = self.member(id)?.consumer.clone();
        let partition = convert::partition(at.partition)?;
        let offset = Offset::Offset(convert::offset(offset)?);
        blocking(move || {
            consumer
                .seek(&at.topic, partition, offset, CALL_TIMEOUT)
                .map_err(convert::error)
        })
        .await
    }

    /// Pause or resume member `id`'s fetching of `at`.
    pub(crate) async fn pause(
        &self,
        id: u64,
        at: wit::TopicPartition,
        paused: bool,
    ) -> Result<(), wit::KafkaError> {
        let consumer = self.member(id)?.consumer.clone();
        let mut list = TopicPartitionList::new();
        list.add_partition(&at.topic, convert::partition(at.partition)?);
        blocking(move || {
            if paused {
                consumer.pause(&list)
            } else {
                consumer.resume(&list)
            }
            .map_err(convert::error)
        })
        .await
    }

    /// Leave the group: end member `id`'s fetching and wait until its consumer closed.
    pub(crate) async fn leave(&self, id: u64) {
        let Ok(member) = self.member(id) else {
            return;
        };
        let _ = member.stop.send(true);
        let closed = member
            .closed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(member);
        if let Some(closed) = closed {
            let _ = tokio::time::timeout(CALL_TIMEOUT, closed).await;
        }
    }
}

/// Fetch records into `events` until stopped or the adapter dropped the stream, holding off
/// while [`MEMBER_BUFFER`] events wait, pausing after a consumer error.
async fn fetch(
    consumer: &StreamConsumer<MemberContext>,
    events: mpsc::UnboundedSender<wit::MemberEvent>,
    queued: Arc<AtomicUsize>,
    mut stopped: watch::Receiver<bool>,
    fetched: watch::Sender<bool>,
) {
    loop {
        if *stopped.borrow() || events.is_closed() {
            break;
        }
        if queued.load(Ordering::SeqCst) >= MEMBER_BUFFER {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
                _ = stopped.changed() => {}
            }
            continue;
        }
        let event = tokio::select! {
            next = consumer.recv() => match next {
                Ok(m) => {
                    fetched.send_if_modified(|f| !std::mem::replace(f, true));
                    wit::MemberEvent::Fetched(convert::incoming(&m))
                }
                Err(e) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    wit::MemberEvent::Failed(convert::error(e))
                }
            },
            _ = stopped.changed() => break,
            () = events.closed() => break,
        };
        queued.fetch_add(1, Ordering::SeqCst);
        if events.send(event).is_err() {
            break;
        }
    }
}
