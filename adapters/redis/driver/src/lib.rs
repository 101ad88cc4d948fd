//! The `wrpc:redis` driver: the only code that talks to a Redis server (or Valkey, KeyDB,
//! Dragonfly: anything that speaks RESP). It is deliberately small and generic — a command as a
//! list of byte strings and its reply as flat RESP frames, a blocking command on a dedicated
//! pooled connection, a pub/sub stream that starts once the server confirmed — so every Redis
//! semantic (keys, scripts, consumer groups, ids) lives in the adapter component.
//!
//! Shaped like Spin's host factors: [`RedisConfig`] (what the operator configured), the
//! connection state shared by every instance of one broker ([`connection`]), the pub/sub
//! streams ([`pubsub`]) and the WIT implementation ([`bindings`]).

mod bench;
mod bindings;
mod connection;
mod pubsub;

use std::sync::Arc;

pub use bindings::add_to_linker;
use connection::Connections;

use wrpc_broker_runtime::driver::{ConnectFuture, Driver, DriverInfo, Lent, NativeBenchFuture};

/// The WIT interface this driver provides.
pub const INTERFACE: &str = "wrpc:redis/client";

/// The Redis adapter component, built from `adapters/redis` and shipped inside the host.
pub static ADAPTER: &[u8] = include_bytes!(env!("WRPC_REDIS_COMPONENT"));

/// What the operator configured: the server's URL, nothing else.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://[user:pass@]host:port[/db]` or `rediss://…`.
    pub url: String,
}

/// A connection to one Redis server, lent to the adapter instances of one broker. Clones share
/// the connections; the shared multiplexed connection is re-established after a loss.
#[derive(Clone)]
pub struct RedisDriver {
    config: RedisConfig,
    conns: Arc<Connections>,
}

impl std::fmt::Debug for RedisDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisDriver")
            .field("url", &self.config.url)
            .field("generation", &self.conns.generation())
            .finish_non_exhaustive()
    }
}

impl RedisDriver {
    /// Connect to the server at `url` (the first connection is made now, so a wrong URL or a
    /// server that is down fails here with `unavailable`).
    pub async fn connect(url: &str) -> wrpc_broker_runtime::Result<RedisDriver> {
        let config = RedisConfig {
            url: url.to_string(),
        };
        let conns = Connections::open(&config).map_err(|e| {
            wrpc_broker_runtime::Error::BadRequest(format!("redis URL `{url}`: {e:?}"))
        })?;
        conns.shared().await.map_err(|e| {
            wrpc_broker_runtime::Error::Unavailable(format!("redis at `{url}`: {e:?}"))
        })?;
        Ok(RedisDriver {
            config,
            conns: Arc::new(conns),
        })
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// How many times the shared connection has been established (1 after `connect`).
    pub fn generation(&self) -> u64 {
        self.conns.generation()
    }

    /// Fault injection for tests: the next `count` settlements of queue `queue` — commands or
    /// scripts that `XACK` a key whose name contains `queue` — fail with `refused` without being
    /// sent. The rule applies to every driver connected to the same URL in this process (each
    /// host instance connects its own).
    pub fn refuse_settlements(&self, queue: &str, count: u32) {
        self.conns.faults.refusals.arm(queue, count);
    }
}

/// Redis (and Valkey, KeyDB, Dragonfly) as a [`Driver`].
#[derive(Debug, Clone, Copy)]
pub struct Redis;

/// What this driver is.
static INFO: DriverInfo = DriverInfo {
    name: "redis",
    schemes: &["redis", "rediss"],
    interface: INTERFACE,
    embedded_adapter: ADAPTER,
    linker: add_to_linker,
    appends_in_flight: 1,
};

impl Driver for Redis {
    fn info(&self) -> &'static DriverInfo {
        &INFO
    }

    fn connect<'a>(&'a self, url: &'a str) -> ConnectFuture<'a> {
        Box::pin(async move { Ok(INFO.lend(RedisDriver::connect(url).await?)) })
    }

    fn refuse_settlements(&self, connection: &Lent, queue: &str, count: u32) -> bool {
        let driver = connection.get::<RedisDriver>();
        driver.map(|d| d.refuse_settlements(queue, count)).is_some()
    }

    fn native_bench<'a>(&'a self, url: &'a str, _connection: &'a Lent) -> NativeBenchFuture<'a> {
        Box::pin(async move { Ok(Some(Box::new(bench::Native::new(url)?) as _)) })
    }
}
