//! Publishes that learn whether anyone took them (`publish-checked`), in one call.
//!
//! Core NATS says nothing about a plain PUB nobody subscribes to; it answers a PUB that names a
//! reply subject with a 503 status there instead, and it handles one connection's commands in
//! order. So a checked publish names a reply subject of its own, `<base>.<n>`, then publishes a
//! marker to `<base>.m<n>`; one wildcard subscription of `<base>.>` per connection routes both
//! back. The server sends the 503 before it routes the marker, so when the marker arrives the
//! publish knows: a 503 first means nobody took it. Nothing waits for a reply from the
//! subscriber, and nothing is held: a message nobody took is gone.
//!
//! The driver does this for the adapter's `direct.send` (one call across the boundary that
//! answers once the server has routed the packet, instead of two publishes, a host timer and
//! the marker read by a task of the component), and the bench's native side does it the same
//! way, with this code.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_nats::{HeaderMap, Subscriber};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::oneshot;

use crate::bindings::{publish_error, wit};

/// One publish waiting for its marker: whether a 503 came first, and where to tell it.
struct Waiter {
    no_responders: bool,
    done: oneshot::Sender<bool>,
}

/// The wildcard subscription of one `<base>` and the publishes waiting on it.
struct Mux {
    base: String,
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiter>>,
    /// The subscription ended (set with `waiting` locked): a publish needs a new mux.
    ended: AtomicBool,
}

impl Mux {
    fn waiting(&self) -> MutexGuard<'_, HashMap<u64, Waiter>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hand each 503 and marker to its publish until the subscription ends or `stop` is
    /// dropped; then every publish still waiting is told the connection was lost (its sender
    /// dropped).
    async fn route(self: Arc<Self>, mut answers: Subscriber, mut stop: oneshot::Receiver<()>) {
        let prefix = format!("{}.", self.base);
        loop {
            let m = tokio::select! {
                m = answers.next() => m,
                _ = &mut stop => None,
            };
            let Some(m) = m else { break };
            let Some(token) = m.subject.as_str().strip_prefix(&prefix) else {
                continue;
            };
            let (marker, number) = match token.strip_prefix('m') {
                Some(n) => (true, n),
                None => (false, token),
            };
            let Ok(number) = number.parse::<u64>() else {
                continue;
            };
            let mut waiting = self.waiting();
            if marker {
                if let Some(waiter) = waiting.remove(&number) {
                    let _ = waiter.done.send(!waiter.no_responders);
                }
            } else if m.status.map(|s| s.as_u16()) == Some(503)
                && let Some(waiter) = waiting.get_mut(&number)
            {
                waiter.no_responders = true;
            }
        }
        let mut waiting = self.waiting();
        self.ended.store(true, Ordering::Relaxed);
        waiting.clear();
    }
}

/// Takes a waiter off its mux when the publish ends, answered or not (timed out, cancelled).
struct Registered<'a> {
    mux: &'a Mux,
    number: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.mux.waiting().remove(&self.number);
    }
}

/// A mux in use, and what stops its routing task when dropped.
struct Live {
    mux: Arc<Mux>,
    _stop: oneshot::Sender<()>,
}

/// Checked publishes on one connection: its mux, made by the first publish and again after
/// the connection closed for good; dropped, it unsubscribes.
#[derive(Default)]
pub(crate) struct Checked {
    live: Mutex<Option<Live>>,
}

impl std::fmt::Debug for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checked").finish_non_exhaustive()
    }
}

impl Checked {
    /// The live mux of `client`, subscribing first when there is none.
    async fn mux(&self, client: &async_nats::Client) -> Result<Arc<Mux>, wit::NatsError> {
        let live = |slot: &Option<Live>| {
            slot.as_ref()
                .filter(|live| !live.mux.ended.load(Ordering::Relaxed))
                .map(|live| live.mux.clone())
        };
        if let Some(mux) = live(&self.slot()) {
            return Ok(mux);
        }
        let base = client.new_inbox();
        // The server handles one connection's commands in order: the SUB is in place before
        // any publish made after it, no round trip needed.
        let answers = client
            .subscribe(format!("{base}.>"))
            .await
            .map_err(|e| wit::NatsError::Unavailable(format!("subscribe to {base}.>: {e}")))?;
        let mut slot = self.slot();
        if let Some(mux) = live(&slot) {
            // Another publish made one meanwhile: ours unsubscribes as it is dropped.
            return Ok(mux);
        }
        let mux = Arc::new(Mux {
            base,
            next: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::new()),
            ended: AtomicBool::new(false),
        });
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(mux.clone().route(answers, stopped));
        *slot = Some(Live {
            mux: mux.clone(),
            _stop: stop,
        });
        Ok(mux)
    }

    fn slot(&self) -> MutexGuard<'_, Option<Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publish `payload` to `subject` and answer once the server routed it to a subscriber
    /// (`Ok`), or said nobody subscribes (`no-responders`); `timeout` when neither is known
    /// within `timeout`, `unavailable` when the connection was lost first.
    pub(crate) async fn publish(
        &self,
        client: &async_nats::Client,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<(), wit::NatsError> {
        let lost =
            || wit::NatsError::Unavailable(format!("{subject}: the connection to NATS was lost"));
        let mux = self.mux(client).await?;
        let number = mux.next.fetch_add(1, Ordering::Relaxed);
        let (done, answered) = oneshot::channel();
        {
            let mut waiting = mux.waiting();
            if mux.ended.load(Ordering::Relaxed) {
                return Err(lost());
            }
            waiting.insert(
                number,
                Waiter {
                    no_responders: false,
                    done,
                },
            );
        }
        let _registered = Registered { mux: &mux, number };
        let reply = format!("{}.{number}", mux.base);
        client
            .publish_with_reply_and_headers(subject.clone(), reply, headers, payload)
            .await
            .map_err(publish_error)?;
        client
            .publish(format!("{}.m{number}", mux.base), Bytes::new())
            .await
            .map_err(publish_error)?;
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(wit::NatsError::NoResponders(format!(
                "{subject}: no responders"
            ))),
            Ok(Err(_)) => Err(lost()),
            Err(_) => Err(wit::NatsError::Timeout(format!(
                "{subject}: not routed within {} ms",
                timeout.as_millis()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A subject with a subscriber is told `Ok`, one without `NoResponders`, and each
    /// publish's answer is its own while many are in flight. Needs the NATS server of
    /// `scripts/services.sh`.
    #[tokio::test]
    async fn a_checked_publish_tells_taken_from_nobody_listening() {
        let client = async_nats::connect("nats://127.0.0.1:4222")
            .await
            .expect("the NATS server of scripts/services.sh on 127.0.0.1:4222");
        let (heard, unheard) = (client.new_inbox(), client.new_inbox());
        let mut listener = client.subscribe(heard.clone()).await.unwrap();
        client.flush().await.unwrap();
        let checked = Checked::default();
        let second = Duration::from_secs(5);
        let publish = |subject: &String, n: u8| {
            checked.publish(
                &client,
                subject.clone(),
                HeaderMap::new(),
                Bytes::from(vec![n]),
                second,
            )
        };
        let answers = futures::future::join_all(
            (0..64u8).map(|n| publish(if n % 2 == 0 { &heard } else { &unheard }, n)),
        )
        .await;
        for (n, answer) in answers.iter().enumerate() {
            let expected = if n % 2 == 0 {
                matches!(answer, Ok(()))
            } else {
                matches!(answer, Err(wit::NatsError::NoResponders(_)))
            };
            assert!(expected, "publish {n}: {answer:?}");
        }
        for n in (0..64u8).step_by(2) {
            let m = tokio::time::timeout(second, listener.next())
                .await
                .expect("a taken publish arrives")
                .expect("the subscription is live");
            assert_eq!(m.payload.as_ref(), &[n], "in order");
        }
        assert!(checked.slot().as_ref().unwrap().mux.waiting().is_empty());
    }
}
