//! Channels: literal-name fan-out to the current subscribers, at most once, and
//! [`ChannelSubscription`], the stream of one subscriber.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::broadcast;

use super::{CHANNEL_CAPACITY, MemoryStore, lock};

impl MemoryStore {
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

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use std::time::Duration;
    use tokio::time::{sleep, timeout};

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
}
