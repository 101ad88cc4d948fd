//! One shape for handing a capability's live parts (log readers, backplane subscriptions,
//! queue consumers, direct listeners) over to a new adapter instance. Each capability's
//! registry is a [`Handover`]; [`crate::Broker::swap`] and [`crate::Broker::migrate`] loop over
//! the four and never name what a capability moves.
//!
//! A swap keeps the broker, so only what an instance holds moves ([`Handover::swapped`]). A
//! migration changes the broker and runs in steps ([`Migration`]), every capability's step
//! before the next step of any: listen on the new broker, switch the slot, let the old broker's
//! writes land and end what it holds, drain it until a deadline, let it go.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use crate::runtime::AdapterInstance;

/// A boxed step of a hand-over.
pub(crate) type Step<'a, T = ()> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a migration's events go as they happen.
pub(crate) type Progress = dyn Fn(MigrationEvent) + Send + Sync;

fn done<'a>() -> Step<'a> {
    Box::pin(async {})
}

/// One capability's live parts, as a swap or a migration hands them over.
pub(crate) trait Handover: Send + Sync {
    /// A swap pointed the slot at `new`, an adapter on the same broker: move what the old
    /// instance held (its consumers, its listeners). What resumes by itself when the old
    /// instance retires (readers, subscriptions) does nothing here.
    fn swapped<'a>(&'a self, new: &'a AdapterInstance) -> Step<'a> {
        let _ = new;
        done()
    }

    /// A migration from `old` to `new` (another broker) begins; nothing goes to `new` yet.
    /// Start what must be in place there before the switch (subscriptions, listeners) and
    /// return the migration's later steps.
    fn migrating<'a>(
        &'a self,
        old: &'a AdapterInstance,
        new: &'a AdapterInstance,
    ) -> Step<'a, Box<dyn Migration + 'a>>;
}

/// The later steps of one capability's migration, called in this order.
pub(crate) trait Migration: Send {
    /// The slot is about to point at the new instance.
    fn switching(&mut self) {}

    /// The slot points at the new instance (writes may still be landing on the old broker).
    fn switched(&mut self) -> Step<'_> {
        done()
    }

    /// The writes that went to the old broker have landed: what it holds is complete.
    fn old_complete(&mut self) {}

    /// Move what the old broker still holds, until `deadline`, telling `progress`.
    fn drain<'a>(&'a mut self, deadline: Instant, progress: &'a Progress) -> Step<'a> {
        let _ = (deadline, progress);
        done()
    }

    /// The old instance is let go (it closes next).
    fn let_go(&mut self) {}
}

/// Nothing to do past [`Handover::migrating`].
pub(crate) struct NothingMore;

impl Migration for NothingMore {}

/// A step of a migration, as it happens.
#[derive(Debug, Clone)]
pub enum MigrationEvent {
    /// The new adapter runs: from now on every write goes to the new broker.
    Switched {
        /// The old broker.
        from: String,
        /// The new broker.
        to: String,
        /// The new adapter's generation.
        generation: u32,
    },
    /// Consumers consume on the new broker; `queues` of them still drain the old one.
    ConsumersMoved {
        /// How many consumers drain an old queue.
        queues: usize,
    },
    /// A consumer finished with the old broker's queue.
    QueueDrained(QueueDrain),
    /// Readers finished the old broker's feeds.
    ReadersMoved {
        /// How many moved to the new broker.
        moved: usize,
        /// How many had not finished by the deadline.
        left: usize,
    },
    /// The old adapter was closed.
    OldClosed,
}

/// How one consumer's drain of the old broker's queue ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDrain {
    /// The queue.
    pub queue: String,
    /// True when the old queue was empty (nothing waiting, delayed or unsettled).
    pub drained: bool,
    /// Messages left on the old broker (0 when drained; the count when the deadline passed).
    pub left: u64,
    /// How long the drain took.
    pub took: Duration,
}
