//! Coalescing concurrent calls into batches, per name (topic, queue, channel). A call that
//! finds no other call of its name in flight makes its adapter call at once, on its own task
//! (no hand-over to another task: one in flight pays one boundary crossing and nothing more).
//! Calls that arrive while one is in flight wait, in order, and then go as one batch, from a
//! task started for them that takes every call waiting each time and ends when none is left —
//! so throughput under load pays one boundary crossing per batch, and one name's calls reach
//! the adapter one batch at a time, in the order they came. That task takes the next batch only
//! after the callers it just answered had their turn to call again: taken at once, the callers
//! split into two cohorts that alternate (each waits out the other's batch before its own), and
//! a broker round trip bounds throughput at half what one batch per round trip gives. A call
//! failed by a trap is tried again on the replacement instance.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::runtime::AdapterInstance;
use crate::slot::AdapterSlot;

/// One adapter call for a batch: (instance, name, items) → one answer per item. The items are
/// shared so a retry after a trap sends them again without copying them.
pub(crate) type BatchCall<I, A> = dyn Fn(AdapterInstance, String, Arc<[I]>) -> Pin<Box<dyn Future<Output = Result<Vec<A>>> + Send>>
    + Send
    + Sync;

type Request<I, A> = (I, oneshot::Sender<Result<A>>);

/// At most this many yields of a lane's batch task, between two batches, for the callers it
/// answered to call again.
const CALLERS_IN_YIELDS: usize = 8;

/// The batchers of one kind of call, one lane per name while calls of it are in flight.
pub(crate) struct Batchers<I, A> {
    shared: Arc<Shared<I, A>>,
}

struct Shared<I, A> {
    slot: Arc<AdapterSlot>,
    max: usize,
    call: Arc<BatchCall<I, A>>,
    /// A name is here while a call of it is in flight; its value holds the calls waiting.
    lanes: Mutex<HashMap<String, Vec<Request<I, A>>>>,
}

impl<I: Send + Sync + 'static, A: Send + 'static> Batchers<I, A> {
    /// Batchers making at most `max` items per `call`.
    pub(crate) fn new(slot: Arc<AdapterSlot>, max: usize, call: Arc<BatchCall<I, A>>) -> Self {
        let shared = Shared {
            slot,
            max,
            call,
            lanes: Mutex::new(HashMap::new()),
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Make the call for `item` of `name` (at once, or with the others waiting) and wait for
    /// its answer.
    pub(crate) async fn submit(&self, name: &str, item: I) -> Result<A> {
        let queued = {
            let mut lanes = self.shared.lanes();
            match lanes.get_mut(name) {
                Some(waiting) => {
                    let (reply, answer) = oneshot::channel();
                    waiting.push((item, reply));
                    Err(answer)
                }
                None => {
                    lanes.insert(name.to_owned(), Vec::new());
                    Ok(item)
                }
            }
        };
        let item = match queued {
            Ok(item) => item,
            Err(answer) => {
                return answer
                    .await
                    .map_err(|_| Error::Closed("the broker was closed".into()))?;
            }
        };
        // Whatever becomes of this call (done, failed, or dropped by its caller), the calls
        // that came meanwhile go on without it.
        let lead = Lead {
            shared: self.shared.clone(),
            name: name.to_owned(),
        };
        let answers = self.shared.batch(&lead.name, Arc::from([item])).await;
        drop(lead);
        let mut answers = answers?;
        match answers.len() {
            1 => Ok(answers.remove(0)),
            count => Err(Error::Internal(format!(
                "the adapter answered {count} results for 1 item"
            ))),
        }
    }
}

impl<I: Send + Sync + 'static, A: Send + 'static> Shared<I, A> {
    fn lanes(&self) -> MutexGuard<'_, HashMap<String, Vec<Request<I, A>>>> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One adapter call of `items`, tried again on the replacement when a trap failed it.
    async fn batch(&self, name: &str, items: Arc<[I]>) -> Result<Vec<A>> {
        self.slot
            .retry_trapped(|adapter| (self.call)(adapter, name.to_owned(), items.clone()))
            .await
    }

    /// Yield until the calls waiting for `name` stop growing (at most [`CALLERS_IN_YIELDS`]
    /// times): the callers a batch answered may be woken on another worker, and a batch taken
    /// before they call again splits them into cohorts that wait out each other's batches.
    async fn let_callers_in(&self, name: &str) {
        let waiting =
            |lanes: &HashMap<String, Vec<Request<I, A>>>| lanes.get(name).map_or(0, Vec::len);
        let mut seen = waiting(&self.lanes());
        for _ in 0..CALLERS_IN_YIELDS {
            tokio::task::yield_now().await;
            let now = waiting(&self.lanes());
            if now == seen {
                break;
            }
            seen = now;
        }
    }

    /// The calls waiting behind the one in flight for `name`, taken off its lane; none waiting
    /// closes the lane (the next call of `name` goes at once again).
    fn next_batch(&self, name: &str) -> Option<Vec<Request<I, A>>> {
        let mut lanes = self.lanes();
        if close_if_idle(&mut lanes, name) {
            return None;
        }
        lanes.get_mut(name).map(std::mem::take)
    }

    /// The call in flight for `name` ended: the calls waiting go next, from a task of their own
    /// that takes them when it runs (so a call the lead's caller makes next joins them); none
    /// waiting closes the lane.
    fn hand_over(self: &Arc<Self>, name: &str) {
        if close_if_idle(&mut self.lanes(), name) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(self.clone().drain(name.to_owned()))),
            // No runtime left to run them (it is shutting down): they end as closed.
            Err(_) => {
                let waiting = self.lanes().remove(name);
                drop(waiting);
            }
        }
    }

    /// Make the calls waiting for `name`, `max` at a time, then those that came meanwhile,
    /// until none waits. After each batch it yields once, so the callers it answered (woken on
    /// this worker) call again before it takes the next one.
    async fn drain(self: Arc<Self>, name: String) {
        // Dropped unfinished (its runtime shut down), it closes the lane: the calls waiting
        // there end as closed rather than wait for a task that will not come.
        let mut lane = Unfinished {
            shared: self,
            name,
            finished: false,
        };
        let (shared, name) = (&lane.shared, lane.name.as_str());
        while let Some(mut batch) = shared.next_batch(name) {
            while !batch.is_empty() {
                let rest = batch.split_off(batch.len().min(shared.max));
                let mut replies = Vec::with_capacity(batch.len());
                let items: Arc<[I]> = batch
                    .into_iter()
                    .map(|(item, reply)| {
                        replies.push(reply);
                        item
                    })
                    .collect();
                let answers = shared.batch(name, items).await;
                let answers = answers.map(|answers| answers.into_iter().map(Ok).collect());
                hand_out(replies, answers, "items");
                batch = rest;
            }
            shared.let_callers_in(name).await;
        }
        // `next_batch` closed the lane when it found none waiting.
        lane.finished = true;
    }
}

/// The call in flight for a name, made on its caller's task: when it ends (or its caller drops
/// it), the calls waiting behind it go on.
struct Lead<I: Send + Sync + 'static, A: Send + 'static> {
    shared: Arc<Shared<I, A>>,
    name: String,
}

impl<I: Send + Sync + 'static, A: Send + 'static> Drop for Lead<I, A> {
    fn drop(&mut self) {
        self.shared.hand_over(&self.name);
    }
}

/// Whether `name`'s lane has no call waiting; if so it is closed (the next call goes at once).
fn close_if_idle<R>(lanes: &mut HashMap<String, Vec<R>>, name: &str) -> bool {
    let idle = lanes.get(name).is_none_or(Vec::is_empty);
    if idle {
        lanes.remove(name);
    }
    idle
}

/// A lane's batch task while it runs: dropped before it finished, it closes the lane.
struct Unfinished<I: Send + Sync + 'static, A: Send + 'static> {
    shared: Arc<Shared<I, A>>,
    name: String,
    finished: bool,
}

impl<I: Send + Sync + 'static, A: Send + 'static> Drop for Unfinished<I, A> {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.lanes().remove(&self.name);
        }
    }
}

/// Hand each waiting request the answer of its item, in order. When the call failed, or
/// answered another number of results than it was given `what`, every request gets the error.
pub(crate) fn hand_out<T>(
    replies: Vec<oneshot::Sender<Result<T>>>,
    answers: Result<Vec<Result<T>>>,
    what: &str,
) {
    let count = replies.len();
    match answers {
        Ok(answers) if answers.len() == count => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(answer);
            }
        }
        Ok(answers) => {
            let e = Error::Internal(format!(
                "the adapter answered {} results for {count} {what}",
                answers.len()
            ));
            replies
                .into_iter()
                .for_each(|r| drop(r.send(Err(e.clone()))));
        }
        Err(e) => replies
            .into_iter()
            .for_each(|r| drop(r.send(Err(e.clone())))),
    }
}
