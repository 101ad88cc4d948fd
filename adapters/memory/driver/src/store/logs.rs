//! Logs: per-topic ordered entries with dense offsets and count-based retention, and
//! [`LogFollower`], the stream that tails one.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use tokio::sync::Notify;

use super::{LogEntry, LogInfo, LogRecord, MemoryStore, StoreError, lock};

/// One topic: its log once created, and what wakes the followers waiting at its tip. (A
/// `watch` channel did this with 352 bytes of its own per topic; these fields are ≈ 60.)
pub(super) struct Topic {
    log: Mutex<Option<Log>>,
    /// Moves on with every change a follower may wait for (creation, append, trim, the store's
    /// end); a follower reads it before it checks the log.
    version: AtomicU64,
    /// Set when the store is dropped: its followers end.
    closed: AtomicBool,
    /// Wakes the followers waiting for `version` to move.
    moved: Notify,
}

impl Topic {
    fn new() -> Self {
        Self {
            log: Mutex::new(None),
            version: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            moved: Notify::new(),
        }
    }

    /// The log changed (or the store ended): wake the followers at the tip.
    fn move_on(&self) {
        self.version.fetch_add(1, SeqCst);
        self.moved.notify_waiters();
    }

    /// End the followers (the store is dropped).
    pub(super) fn close(&self) {
        self.closed.store(true, SeqCst);
        self.move_on();
    }

    /// Resolves once `version` is no longer `seen`. Registered before it looks, so a change
    /// between the look and the wait still wakes it.
    async fn moved_past(self: Arc<Self>, seen: u64) {
        let mut moved = std::pin::pin!(self.moved.notified());
        moved.as_mut().enable();
        if self.version.load(SeqCst) != seen {
            return;
        }
        moved.await;
    }
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

impl MemoryStore {
    fn topic(&self, topic: &str) -> Arc<Topic> {
        lock(&self.topics)
            .entry(topic.to_owned())
            .or_insert_with(|| Arc::new(Topic::new()))
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
            t.move_on();
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
        t.move_on();
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
        LogFollower {
            topic: topic.to_owned(),
            shared: Arc::downgrade(&t),
            cursor: from,
            state: FollowState::Idle,
        }
    }
}

// ------------------------------------------------------------------------------- streams

/// A follower's wait for its topic to move ([`Topic::moved_past`]).
type TipWait = Pin<Box<dyn Future<Output = ()> + Send>>;

enum FollowState {
    /// Check the log, then wait at the tip.
    Idle,
    /// Waiting for the topic to move past what the last check saw.
    Waiting(TipWait),
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

    fn check(&mut self, topic: &Topic, max: usize) -> Step<LogEntry> {
        if topic.closed.load(SeqCst) {
            return Step::End;
        }
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
                FollowState::Idle => {
                    let Some(topic) = self.shared.upgrade() else {
                        return Poll::Ready(None);
                    };
                    // Read before the check, so a change after the check ends the wait.
                    let seen = topic.version.load(SeqCst);
                    match self.check(&topic, max) {
                        Step::Batch(b) => {
                            self.state = FollowState::Idle;
                            return Poll::Ready(Some(b));
                        }
                        Step::End => return Poll::Ready(None),
                        Step::Wait => {
                            self.state = FollowState::Waiting(Box::pin(topic.moved_past(seen)));
                        }
                    }
                }
                FollowState::Waiting(mut wait) => match wait.as_mut().poll(cx) {
                    Poll::Pending => {
                        self.state = FollowState::Waiting(wait);
                        return Poll::Pending;
                    }
                    Poll::Ready(()) => self.state = FollowState::Idle,
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

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use std::time::Duration;
    use tokio::time::{sleep, timeout};

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
}
