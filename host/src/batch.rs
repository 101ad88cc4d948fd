//! Coalescing concurrent calls into batches: one task per name (topic, queue, channel) takes
//! every request waiting and makes one adapter call of them, in order, so throughput under load
//! pays one boundary crossing per batch. A call failed by a trap is tried again on the
//! replacement instance.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::runtime::AdapterInstance;
use crate::slot::AdapterSlot;

/// One adapter call for a batch: (instance, name, items) → one answer per item.
pub(crate) type BatchCall<I, A> = dyn Fn(AdapterInstance, String, Vec<I>) -> Pin<Box<dyn Future<Output = Result<Vec<A>>> + Send>>
    + Send
    + Sync;

type Request<I, A> = (I, oneshot::Sender<Result<A>>);

/// The batchers of one kind of call, one per name, started on first use.
pub(crate) struct Batchers<I, A> {
    slot: Arc<AdapterSlot>,
    max: usize,
    call: Arc<BatchCall<I, A>>,
    senders: Mutex<HashMap<String, mpsc::Sender<Request<I, A>>>>,
}

impl<I: Clone + Send + Sync + 'static, A: Send + 'static> Batchers<I, A> {
    /// Batchers making at most `max` items per `call`.
    pub(crate) fn new(slot: Arc<AdapterSlot>, max: usize, call: Arc<BatchCall<I, A>>) -> Self {
        Self {
            slot,
            max,
            call,
            senders: Mutex::new(HashMap::new()),
        }
    }

    /// Queue `item` for `name` and wait for its answer.
    pub(crate) async fn submit(&self, name: &str, item: I) -> Result<A> {
        let sender = {
            let mut senders = self.senders.lock().unwrap_or_else(|e| e.into_inner());
            match senders.get(name).filter(|tx| !tx.is_closed()) {
                Some(tx) => tx.clone(),
                None => {
                    let (tx, rx) = mpsc::channel(4 * self.max);
                    tokio::spawn(run(
                        self.slot.clone(),
                        name.to_string(),
                        self.max,
                        self.call.clone(),
                        rx,
                    ));
                    senders.insert(name.to_string(), tx.clone());
                    tx
                }
            }
        };
        let (reply, answer) = oneshot::channel();
        let closed = || Error::Closed("the broker was closed".into());
        sender.send((item, reply)).await.map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

/// Take every request waiting, make one call of them, hand each its answer.
async fn run<I: Clone, A>(
    slot: Arc<AdapterSlot>,
    name: String,
    max: usize,
    call: Arc<BatchCall<I, A>>,
    mut rx: mpsc::Receiver<Request<I, A>>,
) {
    let mut waiting = Vec::with_capacity(max);
    while rx.recv_many(&mut waiting, max).await > 0 {
        let (items, replies): (Vec<I>, Vec<_>) = waiting.drain(..).unzip();
        let answers = slot
            .retry_trapped(|adapter| call(adapter, name.clone(), items.clone()))
            .await;
        let answers = answers.map(|answers| answers.into_iter().map(Ok).collect());
        hand_out(replies, answers, "items");
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
