//! The native side of the bench: [`Native`] dispatches each operation to the broker's
//! own client (the calls its adapter makes, made directly).

use std::sync::Arc;

use wrpc_broker::MemoryStore;

use super::stats::Sample;
use super::{Setup, memory, nats_native, redis_native};

/// The native side of the broker under test: the calls its adapter makes, made directly.
pub enum Native {
    /// The `wrpc:memory` store.
    Memory(memory::Native),
    /// The `redis` crate.
    Redis(redis_native::Native),
    /// The `async-nats` crate.
    Nats(nats_native::Native),
}

impl Native {
    /// The native side of the broker `driver` names at `url` (`connection` is a connection of
    /// that driver: the store itself on memory), when the bench has one.
    pub(super) async fn for_broker(
        driver: &str,
        url: &str,
        connection: &wrpc_broker::drivers::Lent,
    ) -> anyhow::Result<Option<Native>> {
        Ok(match driver {
            "memory" => connection
                .get::<Arc<MemoryStore>>()
                .map(|store| Native::Memory(memory::Native::new(store.clone()))),
            "redis" => Some(Native::Redis(redis_native::Native::new(url)?)),
            "nats" => Some(Native::Nats(nats_native::Native::new(url).await?)),
            _ => None,
        })
    }

    pub(super) async fn log_append(
        &self,
        setup: &Setup,
        in_flight: usize,
    ) -> anyhow::Result<Option<Sample>> {
        match self {
            Native::Memory(n) => n.log_append(setup, in_flight).await.map(Some),
            Native::Redis(n) => n.log_append(setup, in_flight).await.map(Some),
            Native::Nats(n) => n.log_append(setup, in_flight).await.map(Some),
        }
    }

    pub(super) async fn log_catch_up(&self, setup: &Setup) -> anyhow::Result<Option<Sample>> {
        match self {
            Native::Memory(n) => n.log_catch_up(setup).await.map(Some),
            Native::Redis(n) => n.log_catch_up(setup).await.map(Some),
            Native::Nats(_) => Ok(None),
        }
    }

    pub(super) async fn log_live(&self, setup: &Setup) -> anyhow::Result<Option<Sample>> {
        match self {
            Native::Memory(n) => n.log_live(setup).await.map(Some),
            Native::Redis(n) => n.log_live(setup).await.map(Some),
            Native::Nats(_) => Ok(None),
        }
    }

    pub(super) async fn queue_round_trip(
        &self,
        setup: &Setup,
        prefetch: u32,
    ) -> anyhow::Result<Option<Sample>> {
        match self {
            Native::Memory(n) => n.queue_round_trip(setup, prefetch).await.map(Some),
            Native::Redis(n) => n.queue_round_trip(setup, prefetch).await.map(Some),
            Native::Nats(n) => n.queue_round_trip(setup, prefetch).await.map(Some),
        }
    }

    pub(super) async fn request_reply(&self, setup: &Setup) -> anyhow::Result<Option<Sample>> {
        match self {
            Native::Memory(n) => n.request_reply(setup).await.map(Some),
            Native::Redis(n) => n.request_reply(setup).await.map(Some),
            Native::Nats(n) => n.request_reply(setup).await.map(Some),
        }
    }

    pub(super) async fn fan_out(
        &self,
        setup: &Setup,
        subscribers: usize,
    ) -> anyhow::Result<Option<Sample>> {
        match self {
            Native::Memory(n) => n.fan_out(setup, subscribers).await.map(Some),
            Native::Redis(n) => n.fan_out(setup, subscribers).await,
            Native::Nats(n) => n.fan_out(setup, subscribers).await,
        }
    }
}
