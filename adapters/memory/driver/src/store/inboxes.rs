//! Inboxes: addressed packets to listeners (one member per group, every ungrouped one), and
//! [`InboxListener`], the stream of one listener.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{INBOX_CAPACITY, MemoryStore, Packet, StoreError, lock, ms};

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
pub(super) struct Address {
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
pub(super) struct Inboxes {
    pub(super) addresses: HashMap<String, Address>,
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

impl MemoryStore {
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
    use super::super::test_support::*;
    use super::*;
    use std::collections::HashSet;
    use std::time::Duration;
    use tokio::time::{sleep, timeout};

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
