//! Calls issued in one turn of an instance's event loop, sent to the broker as one: the
//! settlements of one `queue.settle` batch run together, and a broker that can take many in
//! one command (a Redis script, NATS requests sent together) answers them with one call across
//! the boundary instead of one each. A turn known to hold one call ([`in_turn_of`]) sends it
//! at once, without yielding for others that will not come.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;

use crate::signal::Latch;

/// Where one item's answer goes: filled at most once; the latch is set when the answer is
/// there or will not come (this end dropped).
struct Reply<R>(Rc<(RefCell<Option<R>>, Latch)>);

impl<R> Drop for Reply<R> {
    fn drop(&mut self) {
        (self.0).1.set();
    }
}

/// Items waiting to go to the broker together, each with where its answer goes.
pub struct Coalesce<I, R> {
    waiting: RefCell<Vec<(I, Reply<R>)>>,
    /// The task of the call that sends what waits ([`crate::bell::current_task`]).
    sender: Cell<usize>,
}

impl<I, R> Default for Coalesce<I, R> {
    fn default() -> Self {
        Self {
            waiting: RefCell::new(Vec::new()),
            sender: Cell::new(0),
        }
    }
}

impl<I, R> Coalesce<I, R> {
    /// Send `item` with the others issued in this turn. The first of a turn yields once, so the
    /// turn's other calls join it, then hands them all to `send`, which answers one `R` per
    /// item, in order. `None` when no answer came for this item: `send` answered fewer, or the
    /// call that sent it was dropped before it answered.
    pub async fn call<Fut>(&self, item: I, send: impl FnOnce(Vec<I>) -> Fut) -> Option<R>
    where
        Fut: Future<Output = Vec<R>>,
    {
        let answer = Rc::new((RefCell::new(None), Latch::new()));
        let here = crate::bell::current_task();
        let first = {
            let mut waiting = self.waiting.borrow_mut();
            waiting.push((item, Reply(answer.clone())));
            waiting.len() == 1
        };
        if first {
            self.sender.set(here);
        }
        // A call the sender's own task made (the settlements of one batch) is answered in that
        // task: no bell for it.
        let sent_here = self.sender.get() == here;
        if first {
            if TURN.get() > 1 {
                wit_bindgen::yield_async().await;
            }
            let batch = std::mem::take(&mut *self.waiting.borrow_mut());
            let (items, replies): (Vec<I>, Vec<_>) = batch.into_iter().unzip();
            for (reply, answered) in replies.into_iter().zip(send(items).await) {
                *(reply.0).0.borrow_mut() = Some(answered);
            }
        }
        if sent_here {
            answer.1.wait_here().await;
        } else {
            answer.1.wait().await;
        }
        answer.0.borrow_mut().take()
    }
}

thread_local! {
    /// How many calls the turn being polled holds at most; unknown (`usize::MAX`) outside
    /// [`in_turn_of`].
    static TURN: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Run `calls`, the futures of one turn holding at most `count` [`Coalesce::call`]s (e.g. the
/// settlements of one batch): a turn of one sends its call at once instead of yielding first.
pub async fn in_turn_of<F: Future>(count: usize, calls: F) -> F::Output {
    let mut calls = std::pin::pin!(calls);
    std::future::poll_fn(move |cx| {
        let outer = TURN.replace(count);
        let polled = calls.as_mut().poll(cx);
        TURN.set(outer);
        polled
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;
    use futures::future::join_all;
    use std::task::{Context, Poll};

    /// A send answering each item times ten, counting its calls in `sends`.
    fn times_ten(
        sends: &Cell<u32>,
    ) -> impl Fn(Vec<u32>) -> futures::future::Ready<Vec<u32>> + Copy + '_ {
        move |items| {
            sends.set(sends.get() + 1);
            futures::future::ready(items.into_iter().map(|i| i * 10).collect())
        }
    }

    #[test]
    fn the_calls_of_one_turn_go_in_one_send_and_each_gets_its_own_answer() {
        let coalesce = Coalesce::<u32, u32>::default();
        let sends = Cell::new(0);
        let send = times_ten(&sends);
        let answers = block_on(join_all((1..=5).map(|i| coalesce.call(i, send))));
        assert_eq!(answers, [1, 2, 3, 4, 5].map(|i| Some(i * 10)));
        assert_eq!(sends.get(), 1);
        // A later turn is a send of its own.
        assert_eq!(block_on(coalesce.call(7, send)), Some(70));
        assert_eq!(sends.get(), 2);
    }

    #[test]
    fn a_turn_of_one_sends_at_once_and_a_larger_one_still_gathers() {
        let coalesce = Coalesce::<u32, u32>::default();
        let sends = Cell::new(0);
        let send = times_ten(&sends);
        // Polled once, a lone call of a turn of one has its answer: no yield before the send.
        let mut lone = Box::pin(in_turn_of(1, coalesce.call(1, send)));
        let waker = futures::task::noop_waker();
        let polled = lone.as_mut().poll(&mut Context::from_waker(&waker));
        assert_eq!(polled, Poll::Ready(Some(10)));
        // Outside a turn of one, a lone call yields once first.
        let mut unknown = Box::pin(coalesce.call(2, send));
        assert_eq!(
            unknown.as_mut().poll(&mut Context::from_waker(&waker)),
            Poll::Pending
        );
        assert_eq!(block_on(unknown), Some(20));
        let many = in_turn_of(3, join_all((1..=3).map(|i| coalesce.call(i, send))));
        assert_eq!(block_on(many), [Some(10), Some(20), Some(30)]);
        assert_eq!(sends.get(), 3);
    }

    #[test]
    fn an_item_without_an_answer_gets_none() {
        let coalesce = Coalesce::<u32, u32>::default();
        let short = |items: Vec<u32>| async move { items.into_iter().take(1).collect() };
        let answers = block_on(join_all((1..=3).map(|i| coalesce.call(i, short))));
        assert_eq!(answers, [Some(1), None, None]);
    }
}
