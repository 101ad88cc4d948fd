//! The adapter slot: the one place every call of one broker's handles goes through, so the
//! component underneath can be replaced (swap, trap, migration). Below the capabilities: they
//! hold a [`Held`] of their broker, never the broker itself.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::runtime::AdapterInstance;

/// How many times a call failed by a trap is tried again on the replacement instance.
pub const TRAP_RETRIES: u32 = 3;

/// The adapter instance every handle of one broker goes through; swapping it swaps the adapter.
#[derive(Debug)]
pub struct AdapterSlot {
    current: RwLock<AdapterInstance>,
    /// Held (shared) by every call that writes to the broker (produce, append, publish, send),
    /// so a migration can wait until the writes still going to the old broker have landed.
    writes: tokio::sync::RwLock<()>,
}

impl AdapterSlot {
    pub(crate) fn new(instance: AdapterInstance) -> Self {
        Self {
            current: RwLock::new(instance),
            writes: tokio::sync::RwLock::new(()),
        }
    }

    /// Hold this while a write runs on [`Self::current`].
    pub(crate) async fn writing(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.writes.read().await
    }

    /// Wait until every write that started before now has finished (later ones wait meanwhile).
    pub(crate) async fn quiesce_writes(&self) {
        drop(self.writes.write().await);
    }

    /// Point every later call at `instance`; returns the one it replaces.
    pub(crate) fn replace(&self, instance: AdapterInstance) -> AdapterInstance {
        std::mem::replace(
            &mut *self.current.write().unwrap_or_else(|e| e.into_inner()),
            instance,
        )
    }

    /// Run `call` on the current adapter, and again on its replacement (up to
    /// [`TRAP_RETRIES`] times) when it failed because the adapter trapped. A trap before the
    /// broker was touched repeats nothing; one after it may repeat the operation (at least once).
    pub(crate) async fn retry_trapped<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut(AdapterInstance) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut attempt = 0;
        loop {
            let writing = self.writing().await;
            let answer = call(self.current()).await;
            drop(writing);
            match answer {
                Err(Error::Trapped(why)) if attempt < TRAP_RETRIES => {
                    attempt += 1;
                    tracing::debug!(
                        attempt,
                        "the adapter trapped under a call; trying it again: {why}"
                    );
                }
                answer => return answer,
            }
        }
    }

    /// `f` of the adapter instance calls go to now, without cloning it.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&AdapterInstance) -> R) -> R {
        f(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The adapter instance calls go to now.
    pub fn current(&self) -> AdapterInstance {
        self.read(AdapterInstance::clone)
    }
}

/// The last migration of a broker: for the message a foreign id gets.
#[derive(Debug, Clone)]
pub(crate) struct Moved {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) at: Instant,
}

/// What a capability handle (and what it spawns: readers, consumers, listeners) holds of its
/// broker: the slot its calls go through, the capability's own live parts, the last migration,
/// and the broker itself, kept open while the handle lives.
pub(crate) struct Held<P> {
    /// Where calls go.
    pub(crate) slot: Arc<AdapterSlot>,
    /// The capability's live parts (its feeds, channels, consumers or inboxes).
    pub(crate) live: Arc<P>,
    /// The last migration of this broker, if any.
    pub(crate) migrated: Arc<RwLock<Option<Moved>>>,
    /// The broker: its adapter closes when the last holder is gone.
    _broker: Arc<dyn Send + Sync>,
}

impl<P> Held<P> {
    /// What a handle of `broker` holds.
    pub(crate) fn new(
        slot: Arc<AdapterSlot>,
        live: Arc<P>,
        migrated: Arc<RwLock<Option<Moved>>>,
        broker: Arc<dyn Send + Sync>,
    ) -> Self {
        Self {
            slot,
            live,
            migrated,
            _broker: broker,
        }
    }
}

impl<P> Clone for Held<P> {
    fn clone(&self) -> Self {
        Self {
            slot: self.slot.clone(),
            live: self.live.clone(),
            migrated: self.migrated.clone(),
            _broker: self._broker.clone(),
        }
    }
}
