//! Stopping a listener without losing what already reached it: [`until_stopped`] drives the
//! pump from a broker subscription into a listener's stream and, on stop, takes the
//! subscription off the broker first and lets the pump hand over the rest.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::Poll;

use crate::signal::Latch;

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
