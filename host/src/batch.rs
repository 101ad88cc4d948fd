//! Coalescing concurrent calls into batches, per name (topic, queue, channel). A call that
//! finds fewer calls of its name in flight than the lane's depth (one, or for appends what
//! the adapter's drivers allow: `DriverInfo::appends_in_flight`) and none waiting makes its
//! adapter call at once, on its own task (no hand-over to another task: one in flight pays one
//! boundary crossing and nothing more). Calls that arrive while the lane is full wait, in
//! order, and then go as one batch, from a task started for them that takes every call waiting
//! each time and ends when none is left — so throughput under load pays one boundary crossing
//! per batch, and one name's calls reach the adapter at most depth at a time (with a depth of
//! one, one batch after the other), in the order they came. That task takes the next batch
//! only after the callers it just answered had their turn to call again: taken at once, the
//! callers split into two cohorts that alternate (each waits out the other's batch before its
//! own), and a broker round trip bounds throughput at half what one batch per round trip
//! gives. A deeper lane's second place goes to a caller that finds it free, alone, not to half
//! of a batch: a batch split in two goes out and comes back as one (measured on Kafka), while
//! a call beside it keeps the broker's pipeline fed. A call failed by a trap is tried again on
//! the replacement instance.

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

/// How many batches of one name may be in flight at once on an adapter.
pub(crate) type Depth = fn(&AdapterInstance) -> usize;

/// A name's calls while one is in flight: those waiting, and how many are in flight (callers'
/// own calls and batch tasks).
struct Lane<R> {
    waiting: Vec<R>,
    in_flight: usize,
}

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
    depth: Depth,
    call: Arc<BatchCall<I, A>>,
    /// A name is here while a call of it is in flight.
    lanes: Mutex<HashMap<String, Lane<Request<I, A>>>>,
}

impl<I: Send + Sync + 'static, A: Send + 'static> Batchers<I, A> {
    /// Batchers making at most `max` items per `call`, one batch of a name at a time.
    pub(crate) fn new(slot: Arc<AdapterSlot>, max: usize, call: Arc<BatchCall<I, A>>) -> Self {
        Self::with_depth(slot, max, |_| 1, call)
    }

    /// Batchers making at most `max` items per `call`, with as many batches of a name in
    /// flight at once as `depth` says for the adapter calls go to.
    pub(crate) fn with_depth(
        slot: Arc<AdapterSlot>,
        max: usize,
        depth: Depth,
        call: Arc<BatchCall<I, A>>,
    ) -> Self {
        let shared = Shared {
            slot,
            max,
            depth,
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
                // Room for another batch in flight (an adapter whose drivers pipeline a name's
                // writes) and none waiting: this call goes at once, beside the one out.
                Some(lane)
                    if lane.waiting.is_empty()
                        && lane.in_flight < self.shared.slot.read(self.shared.depth) =>
                {
                    lane.in_flight += 1;
                    Ok(item)
                }
                Some(lane) => {
                    let (reply, answer) = oneshot::channel();
                    lane.waiting.push((item, reply));
                    Err(answer)
                }
                None => {
                    let lane = Lane {
                        waiting: Vec::new(),
                        in_flight: 1,
                    };
                    lanes.insert(name.to_owned(), lane);
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
    fn lanes(&self) -> MutexGuard<'_, HashMap<String, Lane<Request<I, A>>>> {
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
        let waiting = |lanes: &HashMap<String, Lane<Request<I, A>>>| {
            lanes.get(name).map_or(0, |lane| lane.waiting.len())
        };
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

    /// The calls waiting for `name`, taken off its lane; none waiting gives up this task's
    /// place in flight (the next call of `name` may go at once again).
    fn next_batch(&self, name: &str) -> Option<Vec<Request<I, A>>> {
        let mut lanes = self.lanes();
        if leave_if_idle(&mut lanes, name) {
            return None;
        }
        lanes
            .get_mut(name)
            .map(|lane| std::mem::take(&mut lane.waiting))
    }

    /// A call in flight for `name` ended: the calls waiting go next, in its place, from a task
    /// of their own that takes them when it runs (so a call the lead's caller makes next joins
    /// them); none waiting gives up its place.
    fn hand_over(self: &Arc<Self>, name: &str) {
        if leave_if_idle(&mut self.lanes(), name) {
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
    /// until none waits. After each batch it yields, so the callers it answered (woken on this
    /// worker) call again before it takes the next one.
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
                tracing::trace!(name, items = items.len(), "a batch of waiting calls");
                let answers = shared.batch(name, items).await;
                let answers = answers.map(|answers| answers.into_iter().map(Ok).collect());
                hand_out(replies, answers, "items");
                batch = rest;
            }
            shared.let_callers_in(name).await;
        }
        // `next_batch` gave up this task's place when it found none waiting.
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

/// Whether `name`'s lane has no call waiting; if so, one call or task in flight leaves it
/// (the lane closes when the last one leaves, and the next call goes at once).
fn leave_if_idle<R>(lanes: &mut HashMap<String, Lane<R>>, name: &str) -> bool {
    let Some(lane) = lanes.get_mut(name) else {
        return true;
    };
    if !lane.waiting.is_empty() {
        return false;
    }
    lane.in_flight = lane.in_flight.saturating_sub(1);
    if lane.in_flight == 0 {
        lanes.remove(name);
    }
    true
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::Broker;

    /// What a test lane's call saw: each batch's size, and the most batches in flight at once.
    struct Probe {
        sizes: Arc<Mutex<Vec<usize>>>,
        most: Arc<AtomicUsize>,
    }

    /// Batchers of `depth` whose call holds each batch 50 ms and answers each item × 10.
    fn batchers(slot: Arc<AdapterSlot>, depth: Depth) -> (Batchers<u32, u32>, Probe) {
        let probe = Probe {
            sizes: Arc::new(Mutex::new(Vec::new())),
            most: Arc::new(AtomicUsize::new(0)),
        };
        let (sizes, most) = (probe.sizes.clone(), probe.most.clone());
        let active = Arc::new(AtomicUsize::new(0));
        let call: Arc<BatchCall<u32, u32>> = Arc::new(move |_adapter, _name, items| {
            let (sizes, most, active) = (sizes.clone(), most.clone(), active.clone());
            Box::pin(async move {
                sizes.lock().unwrap().push(items.len());
                let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                active.fetch_sub(1, Ordering::SeqCst);
                Ok(items.iter().map(|i| i * 10).collect())
            })
        });
        (Batchers::with_depth(slot, 64, depth, call), probe)
    }

    /// Submit 0..count to one name at once; every answer must be its own.
    async fn submit_all(batchers: &Batchers<u32, u32>, count: u32) {
        let calls = (0..count).map(|i| batchers.submit("t", i));
        for (i, answer) in futures::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(answer.unwrap(), i as u32 * 10);
        }
    }

    /// The lane closes once its batch task has seen none waiting (after the answers: it lets
    /// the callers call again first).
    async fn closes(batchers: &Batchers<u32, u32>) {
        for _ in 0..1000 {
            if batchers.shared.lanes().is_empty() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the lane stayed open with nothing in flight");
    }

    /// Ten calls of one name at once through a lane of `depth`: the most batches in flight
    /// at once, and the batch sizes, smallest first.
    async fn ten_calls(depth: Depth) -> (usize, Vec<usize>) {
        let broker = Broker::memory().await.unwrap();
        let (batchers, probe) = batchers(broker.inner.slot.clone(), depth);
        submit_all(&batchers, 10).await;
        closes(&batchers).await;
        let mut sizes = probe.sizes.lock().unwrap().clone();
        sizes.sort_unstable();
        (probe.most.load(Ordering::SeqCst), sizes)
    }

    #[tokio::test]
    async fn one_batch_of_a_name_in_flight_at_a_time_by_default() {
        assert_eq!(ten_calls(|_| 1).await, (1, vec![1, 9]));
    }

    #[tokio::test]
    async fn a_deeper_lane_sends_a_call_beside_the_one_in_flight_and_batches_the_rest() {
        assert_eq!(ten_calls(|_| 2).await, (2, vec![1, 1, 8]));
    }
}
