//! Moving a broker subscription's items into a stream an export returned ([`pump`]), and
//! listeners that stop without losing what already reached them. [`until_stopped`] drives the
//! pump from a broker subscription into a listener's stream and, on stop, takes the
//! subscription off the broker first and lets the pump hand over the rest. The listener
//! registry ([`spawn_listener`], [`listener_healthy`], [`stop_listener`],
//! [`stop_all_listeners`]) is what an adapter's `direct` export needs around that: ids, a stop
//! signal per listener, and a stop that waits until the listener's task has ended.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;

use wit_bindgen::{StreamReader, StreamResult, StreamWriter};

use crate::signal::Latch;

/// How many items [`pump`] reads at a time at most.
pub const BATCH: usize = 256;

/// The capacity of the next read from a stream. A read's buffer is reserved in linear memory
/// for as long as the read waits, so a quiet stream is read with a few slots (an idle reader
/// of a log tail or a subscription costs ≈ 100 bytes, not [`BATCH`] entries), doubling up to
/// [`BATCH`] while reads come back full and falling back to what the last read needed.
#[derive(Debug, Clone, Copy)]
pub struct ReadSize(usize);

impl ReadSize {
    /// Slots of the first read, and of one after a read that got this many or fewer.
    pub const MIN: usize = 4;

    /// The next read from `from`, with a buffer of the current capacity; what it returned
    /// sets the next one's. (A read dropped before it finished teaches nothing.)
    pub async fn read<T: 'static>(&mut self, from: &mut StreamReader<T>) -> (StreamResult, Vec<T>) {
        let (result, items) = from.read(Vec::with_capacity(self.0)).await;
        let got = items.len();
        self.0 = if got >= self.0 {
            (self.0 * 2).min(BATCH)
        } else {
            got.next_power_of_two().clamp(Self::MIN, BATCH)
        };
        (result, items)
    }
}

impl Default for ReadSize {
    fn default() -> Self {
        Self(Self::MIN)
    }
}

/// Copy `from` into `to`, a batch (up to [`BATCH`] items, as [`ReadSize`] says) at a time
/// through `convert`, until either end is dropped. `from` stays with the caller, who decides when it goes (dropping a
/// driver stream unsubscribes). A dropped `to` shows only at the next write (the component
/// model has no other signal), so an idle pump lingers until an item arrives.
pub async fn pump<T: 'static, U: 'static>(
    from: &mut StreamReader<T>,
    mut to: StreamWriter<U>,
    mut convert: impl FnMut(Vec<T>) -> Vec<U>,
) {
    let mut size = ReadSize::default();
    loop {
        let (result, items) = size.read(from).await;
        let batch = convert(items);
        if !batch.is_empty() && !to.write_all(batch).await.is_empty() {
            return;
        }
        if !matches!(result, StreamResult::Complete(_)) {
            return;
        }
    }
}

/// Drive `relay` (a pump from a broker subscription into a listener's stream) to its end. If
/// `stop` is set first, `leave` runs (it takes the subscription off the broker, confirmed, after
/// which the subscription's stream ends once it has yielded what the broker sent before) and
/// the relay goes on until it has handed all of that over: a packet that reached a listener
/// before its stop is not lost. `leave` also runs when the relay ended on its own (its reader
/// went away, or the subscription ended), to free the subscription.
pub async fn until_stopped<L: Future<Output = ()>>(
    relay: impl Future<Output = ()>,
    stop: &Latch,
    leave: impl FnOnce() -> L,
) {
    let mut relay = pin!(relay);
    let mut stopped = pin!(stop.wait());
    let stop_first = poll_fn(|cx| {
        if relay.as_mut().poll(cx).is_ready() {
            Poll::Ready(false)
        } else if stopped.as_mut().poll(cx).is_ready() {
            Poll::Ready(true)
        } else {
            Poll::Pending
        }
    })
    .await;
    leave().await;
    if stop_first {
        relay.await;
    }
}

/// A live listener: the latch its stop sets, and the one its task sets when it has ended.
#[derive(Default)]
struct Listener {
    stop: Latch,
    ended: Latch,
}

thread_local! {
    /// The live listeners of this component instance, by id.
    static LISTENERS: RefCell<BTreeMap<u64, Rc<Listener>>> = const { RefCell::new(BTreeMap::new()) };
    /// The next listener id.
    static NEXT_ID: Cell<u64> = const { Cell::new(1) };
}

/// Register a listener and spawn its task, `run(stop)`, where `stop` is the latch
/// [`stop_listener`] sets; the task should then leave the broker, hand over what it holds and
/// end. Returns the listener's id.
pub fn spawn_listener<F: Future<Output = ()> + 'static>(run: impl FnOnce(Latch) -> F) -> u64 {
    let id = NEXT_ID.replace(NEXT_ID.get() + 1);
    let listener = Rc::new(Listener::default());
    LISTENERS.with_borrow_mut(|m| m.insert(id, listener.clone()));
    let task = run(listener.stop.clone());
    wit_bindgen::spawn_local(async move {
        task.await;
        listener.ended.set();
    });
    id
}

/// `direct.healthy`: whether listener `id`'s task still runs; `None` for an unknown id.
pub fn listener_healthy(id: u64) -> Option<bool> {
    LISTENERS.with_borrow(|m| m.get(&id).map(|l| !l.ended.is_set()))
}

/// `direct.stop`: stop listener `id` and wait until its task has ended. Unknown ids are ignored.
pub async fn stop_listener(id: u64) {
    let Some(listener) = LISTENERS.with_borrow(|m| m.get(&id).cloned()) else {
        return;
    };
    listener.stop.set();
    listener.ended.wait().await;
    LISTENERS.with_borrow_mut(|m| m.remove(&id));
}

/// Stop every live listener (an adapter's `close`).
pub async fn stop_all_listeners() {
    let ids: Vec<u64> = LISTENERS.with_borrow(|m| m.keys().copied().collect());
    for id in ids {
        stop_listener(id).await;
    }
}
