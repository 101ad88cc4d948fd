//! The subscriptions components hold on one NATS connection. Components that subscribe to the
//! same subject in the same queue group (or both in none) share one server subscription, a
//! *share*: its task hands each message to every member (no group) or to the next member in
//! turn (a group), as the server would between separate subscriptions. A member leaves without
//! losing anything: it is taken off the share and its stream ends after what it was handed.
//! The server subscription is drained (UNSUB, then what the client already holds) only when its
//! last member leaves. So a hot swap, where the new adapter joins before the old one leaves,
//! never unsubscribes at the server and no message in flight is lost: async-nats 0.51 forgets a
//! draining subscription before the server has confirmed the UNSUB, dropping what the server
//! routed to it meanwhile. Dropping a stream leaves at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use async_nats::{Message, Subscriber};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use wrpc_broker_runtime::streams::PollBatch;

/// Messages a member's stream holds before the share waits for the guest to read.
const MEMBER_BUFFER: usize = 256;

/// What identifies a share: the subject and the queue group.
type Key = (String, Option<String>);

/// A drain request to a share's task: answered once the UNSUB is on its way to the server.
type DrainRequest = oneshot::Sender<()>;

/// One server subscription and the members it feeds.
#[derive(Debug)]
struct Share {
    key: Key,
    /// The members, in joining order: (id, the sender of its stream).
    members: Mutex<Vec<(u64, mpsc::Sender<Message>)>>,
    /// Where the next grouped message goes (an index into `members`).
    next: AtomicU64,
    /// Taken by the leave of the last member, to drain the server subscription.
    drain: Mutex<Option<oneshot::Sender<DrainRequest>>>,
    /// Notified when every member dropped its stream: the task unsubscribes.
    emptied: tokio::sync::Notify,
}

impl Share {
    fn members(&self) -> MutexGuard<'_, Vec<(u64, mpsc::Sender<Message>)>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Who gets `message`: every member without a group, the next one in turn in a group.
    fn targets(&self) -> Vec<(u64, mpsc::Sender<Message>)> {
        let members = self.members();
        if self.key.1.is_none() || members.is_empty() {
            return members.clone();
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed) as usize % members.len();
        vec![members[turn].clone()]
    }
}

/// The shares of one connection, by key, and which share each member belongs to.
#[derive(Debug, Default)]
struct Registry {
    /// The share new subscribers with that key join; a share that lost its last member is
    /// no longer here.
    by_key: HashMap<Key, Arc<Share>>,
    by_member: HashMap<u64, Arc<Share>>,
}

impl Registry {
    /// No new member joins `share` from now on.
    fn close(&mut self, share: &Arc<Share>) {
        if self
            .by_key
            .get(&share.key)
            .is_some_and(|s| Arc::ptr_eq(s, share))
        {
            self.by_key.remove(&share.key);
        }
    }
}

/// The live subscriptions of one connection.
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    next: AtomicU64,
    registry: Mutex<Registry>,
}

impl Subscriptions {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new member with its stream's sender and receiver.
    fn member(self: &Arc<Self>) -> (u64, mpsc::Sender<Message>, Subscription) {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let (tx, rx) = mpsc::channel(MEMBER_BUFFER);
        let subscription = Subscription {
            messages: rx,
            id,
            subscriptions: self.clone(),
        };
        (id, tx, subscription)
    }

    /// Join the live share of `subject` in `group`, if there is one: the member's id and
    /// stream. The server already routes to it.
    pub(crate) fn join(
        self: &Arc<Self>,
        subject: &str,
        group: &Option<String>,
    ) -> Option<(u64, Subscription)> {
        let key = (subject.to_string(), group.clone());
        let mut registry = self.registry();
        let share = registry.by_key.get(&key)?.clone();
        let (id, tx, subscription) = self.member();
        share.members().push((id, tx));
        registry.by_member.insert(id, share);
        Some((id, subscription))
    }

    /// Make a share of `subscriber` (just confirmed by the server) with one member: its id and
    /// stream.
    pub(crate) fn share(
        self: &Arc<Self>,
        subject: &str,
        group: &Option<String>,
        subscriber: Subscriber,
    ) -> (u64, Subscription) {
        let (id, tx, subscription) = self.member();
        let (drain_tx, drain_rx) = oneshot::channel();
        let share = Arc::new(Share {
            key: (subject.to_string(), group.clone()),
            members: Mutex::new(vec![(id, tx)]),
            next: AtomicU64::new(0),
            drain: Mutex::new(Some(drain_tx)),
            emptied: tokio::sync::Notify::new(),
        });
        {
            let mut registry = self.registry();
            // A share made meanwhile by another subscriber stays on its own until it empties.
            registry.by_key.insert(share.key.clone(), share.clone());
            registry.by_member.insert(id, share.clone());
        }
        tokio::spawn(serve(share, subscriber, drain_rx, self.clone()));
        (id, subscription)
    }

    /// Member `id` leaves. Another member still there: it is taken off the share at once.
    /// The last one stays on until the drained subscription ends (what the server routed
    /// before the UNSUB still reaches it): the share is closed to new members and the sender of
    /// its drain request is returned.
    fn remove(&self, id: u64) -> Option<oneshot::Sender<DrainRequest>> {
        let mut registry = self.registry();
        let share = registry.by_member.get(&id)?.clone();
        let mut members = share.members();
        if members.len() > 1 {
            members.retain(|(member, _)| *member != id);
            registry.by_member.remove(&id);
            return None;
        }
        drop(members);
        registry.close(&share);
        share.drain.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Member `id` dropped its stream: take it off its share. True when no member is left (the
    /// share is then closed to new members).
    fn forget(&self, id: u64) -> bool {
        let mut registry = self.registry();
        let Some(share) = registry.by_member.remove(&id) else {
            return false;
        };
        let mut members = share.members();
        members.retain(|(member, _)| *member != id);
        if !members.is_empty() {
            return false;
        }
        drop(members);
        registry.close(&share);
        share.emptied.notify_one();
        true
    }

    /// Member `id` leaves: its stream ends after what it was handed. When it was the share's
    /// last member, the server subscription is drained: returns true once its UNSUB is queued
    /// on the connection (the caller confirms it with a round trip). False for an unknown or
    /// ended member, or when others still share the subscription.
    pub(crate) async fn leave(&self, id: u64) -> bool {
        let Some(drain) = self.remove(id) else {
            return false;
        };
        let (queued_tx, queued) = oneshot::channel();
        drain.send(queued_tx).is_ok() && queued.await.is_ok()
    }
}

/// A share's task: hand each message of `subscriber` to its targets until the subscription
/// ends (drained, or the connection closed for good) or its last member dropped its stream;
/// drain it when asked.
async fn serve(
    share: Arc<Share>,
    mut subscriber: Subscriber,
    mut drain: oneshot::Receiver<DrainRequest>,
    subscriptions: Arc<Subscriptions>,
) {
    let mut draining = false;
    loop {
        let message = tokio::select! {
            biased;
            request = &mut drain, if !draining => {
                draining = true;
                if let Ok(queued) = request {
                    if let Err(e) = subscriber.drain().await {
                        tracing::debug!(subject = %share.key.0, "nats: drain: {e}");
                    }
                    let _ = queued.send(());
                }
                continue;
            }
            // Every member dropped its stream: unsubscribe at once (dropping the subscriber).
            () = share.emptied.notified() => break,
            message = subscriber.next() => match message {
                Some(message) => message,
                None => break,
            },
        };
        if !hand_over(&share, message, &subscriptions).await {
            break;
        }
    }
    // Whoever is still a member gets the end of its stream.
    let gone: Vec<u64> = share.members().drain(..).map(|(id, _)| id).collect();
    let mut registry = subscriptions.registry();
    for id in gone {
        registry.by_member.remove(&id);
    }
    registry.close(&share);
}

/// Give `message` to its targets; a member whose stream was dropped leaves (in a group the next
/// member gets the message instead). False when no member is left.
async fn hand_over(share: &Share, message: Message, subscriptions: &Subscriptions) -> bool {
    loop {
        let targets = share.targets();
        if targets.is_empty() {
            return false;
        }
        let mut taken = false;
        for (id, tx) in targets {
            if tx.send(message.clone()).await.is_ok() {
                taken = true;
            } else if subscriptions.forget(id) {
                return false;
            }
        }
        if taken || share.key.1.is_none() {
            return true;
        }
    }
}

/// A member's side of a share: a batch source for its stream. Dropping it leaves the share.
pub(crate) struct Subscription {
    messages: mpsc::Receiver<Message>,
    id: u64,
    subscriptions: Arc<Subscriptions>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.subscriptions.forget(self.id);
    }
}

impl PollBatch for Subscription {
    type Item = Message;

    fn poll_batch(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<Vec<Message>>> {
        let mut batch = Vec::new();
        match self.messages.poll_recv_many(cx, &mut batch, max.max(1)) {
            Poll::Ready(0) => Poll::Ready(None),
            Poll::Ready(_) => Poll::Ready(Some(batch)),
            Poll::Pending => Poll::Pending,
        }
    }
}
