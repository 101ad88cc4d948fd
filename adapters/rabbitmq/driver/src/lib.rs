//! The `wrpc:amqp` driver: one `lapin` connection per configured broker, lent to the RabbitMQ
//! adapter component as `wrpc:amqp/client` (channels, declare, bind, publish with publisher
//! confirms and `mandatory` returns, consume as a stream, ack / nack, qos, cancel). It is
//! deliberately generic: streams, quorum queues, retry buckets and ids live in the adapter.
//!
//! A lost connection is noticed by the next call, which connects again and bumps the
//! generation; the old connection's channels stay closed (calls on them answer `closed`, their
//! delivery tags `stale`), so the adapter opens new ones. A process-wide fault hook
//! ([`AmqpDriver::refuse_settlements`]) lets tests make a queue's settlements fail, since a real
//! server never refuses on cue.

#![deny(missing_docs)]

mod bench;
mod bindings;
mod calls;
mod channels;
mod convert;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

pub use bindings::add_to_linker;
use channels::Channels;

use wrpc_broker_runtime::driver::{ConnectFuture, Driver, DriverInfo, Lent, NativeBenchFuture};
use wrpc_broker_runtime::faults::SettlementRefusals;

/// The WIT interface this driver provides.
pub const INTERFACE: &str = "wrpc:amqp/client";

/// The RabbitMQ adapter component, built from `adapters/rabbitmq` and shipped inside the host.
pub static ADAPTER: &[u8] = include_bytes!(env!("WRPC_RABBITMQ_COMPONENT"));

/// The heartbeat asked for, in seconds (0: none).
const HEARTBEAT_S: u16 = 0;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Settlement refusals armed by tests, for every driver of this process (tests open brokers
/// through URLs, so they never hold the driver).
static REFUSALS: LazyLock<SettlementRefusals> = LazyLock::new(SettlementRefusals::default);

/// The live connection and its incarnation.
struct Live {
    connection: Arc<lapin::Connection>,
    generation: u64,
}

/// The connection state shared by clones of one driver.
struct Shared {
    url: String,
    /// The current connection; replaced by the first call that finds it lost.
    live: tokio::sync::Mutex<Option<Live>>,
    /// The generation of the current connection (1 after `connect`).
    generation: AtomicU64,
    channels: Channels,
}

/// A connection to one AMQP 0-9-1 broker (RabbitMQ), shared by clones.
#[derive(Clone)]
pub struct AmqpDriver {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AmqpDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpDriver")
            .field("url", &self.shared.url)
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

/// `amqp://host:port` with the default vhost `/` when the URL names none, and heartbeats off
/// ([`HEARTBEAT_S`]) when it sets none: with lapin 4.12 on tokio the broker saw no heartbeats
/// from us and closed the connection after two intervals. A broker that goes away closes the
/// socket, which the driver notices at once; `?heartbeat=<s>` in the URL turns them on.
pub(crate) fn with_vhost(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let mut url = if rest.contains('/') {
        url.to_string()
    } else {
        format!("{url}/%2f")
    };
    if !url.contains("heartbeat=") {
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!("heartbeat={HEARTBEAT_S}"));
    }
    url
}

impl AmqpDriver {
    /// Connect to the broker at `url` (`amqp://[user:pass@]host:port[/vhost]`; guest/guest and
    /// vhost `/` by default). The first connection is made now, so a wrong URL or a broker that
    /// is down fails here with `unavailable`.
    pub async fn connect(url: &str) -> wrpc_broker_runtime::Result<AmqpDriver> {
        let driver = AmqpDriver {
            shared: Arc::new(Shared {
                url: with_vhost(url),
                live: tokio::sync::Mutex::new(None),
                generation: AtomicU64::new(0),
                channels: Channels::default(),
            }),
        };
        driver
            .connection()
            .await
            .map_err(wrpc_broker_runtime::Error::Unavailable)?;
        Ok(driver)
    }

    /// The live connection, connecting again (generation + 1) when the last one was lost.
    pub async fn connection(&self) -> Result<(Arc<lapin::Connection>, u64), String> {
        let mut live = self.shared.live.lock().await;
        if let Some(l) = live.as_ref()
            && l.connection.status().connected()
        {
            return Ok((l.connection.clone(), l.generation));
        }
        let properties =
            lapin::ConnectionProperties::default().with_connection_name("wrpc-broker".into());
        let connect = lapin::Connection::connect(&self.shared.url, properties);
        let connection = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(connection)) => Arc::new(connection),
            Ok(Err(e)) => return Err(format!("cannot connect to {}: {e}", self.shared.url)),
            Err(_) => {
                return Err(format!(
                    "cannot connect to {} within {CONNECT_TIMEOUT:?}",
                    self.shared.url
                ));
            }
        };
        let generation = self.shared.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if generation > 1 {
            tracing::info!(url = %self.shared.url, generation, "amqp: connected again");
        }
        *live = Some(Live {
            connection: connection.clone(),
            generation,
        });
        Ok((connection, generation))
    }

    /// The current connection's generation (1 after `connect`, + 1 per reconnect).
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::SeqCst)
    }

    /// Fault injection for tests: the next `count` acks or nacks of deliveries of a queue whose
    /// name contains `queue`, on any driver of this process, fail with `refused` without being
    /// sent.
    pub fn refuse_settlements(queue: &str, count: u32) {
        REFUSALS.arm(queue, count);
    }
}

/// RabbitMQ (AMQP 0-9-1) as a [`Driver`].
#[derive(Debug, Clone, Copy)]
pub struct RabbitMq;

/// What this driver is.
static INFO: DriverInfo = DriverInfo {
    name: "rabbitmq",
    schemes: &["amqp"],
    interface: INTERFACE,
    embedded_adapter: ADAPTER,
    linker: add_to_linker,
    appends_in_flight: 1,
};

impl Driver for RabbitMq {
    fn info(&self) -> &'static DriverInfo {
        &INFO
    }

    fn connect<'a>(&'a self, url: &'a str) -> ConnectFuture<'a> {
        Box::pin(async move { Ok(INFO.lend(AmqpDriver::connect(url).await?)) })
    }

    fn refuse_settlements(&self, _connection: &Lent, queue: &str, count: u32) -> bool {
        AmqpDriver::refuse_settlements(queue, count);
        true
    }

    fn native_bench<'a>(&'a self, url: &'a str, _connection: &'a Lent) -> NativeBenchFuture<'a> {
        Box::pin(async move { Ok(Some(Box::new(bench::Native::new(url).await?) as _)) })
    }
}
