//! The `wrpc:nats` driver: one `async-nats` connection per configured broker, lent to the NATS
//! adapter component as `wrpc:nats/client` (core publish, subscribe with queue groups, request,
//! all with headers). JetStream needs nothing more: its API is request/reply on `$JS.API.*` and
//! its acknowledgements are publishes to `$JS.ACK.*`, which the adapter drives itself. A
//! process-wide fault hook ([`NatsDriver::refuse_settlements`]) lets tests make a queue's
//! settlements fail, since a real server never refuses on cue.

mod bench;
mod bindings;
mod checked;
mod faults;
mod subscription;

use std::sync::Arc;
use std::time::Duration;

pub use bindings::add_to_linker;

use wrpc_broker_runtime::driver::{ConnectFuture, Driver, DriverInfo, Lent, NativeBenchFuture};

/// The WIT interface this driver provides.
pub const INTERFACE: &str = "wrpc:nats/client";

/// The NATS adapter component, built from `adapters/nats` and shipped inside the host.
pub static ADAPTER: &[u8] = include_bytes!(env!("WRPC_NATS_COMPONENT"));

/// How long [`NatsDriver::connect`] waits for the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to one NATS server (cluster), shared by clones. It reconnects on its own after
/// the server goes away, re-subscribing every live subscription.
#[derive(Clone, Debug)]
pub struct NatsDriver {
    client: async_nats::Client,
    /// The subscriptions components hold on this connection.
    subscriptions: Arc<subscription::Subscriptions>,
    /// Publishes that learn whether anyone took them (`publish-checked`).
    checked: Arc<checked::Checked>,
}

impl NatsDriver {
    /// Connect to the server at `url` (`nats://host:port`, several separated by commas).
    pub async fn connect(url: &str) -> wrpc_broker_runtime::Result<NatsDriver> {
        let options = async_nats::ConnectOptions::new()
            .connection_timeout(CONNECT_TIMEOUT)
            .request_timeout(Some(Duration::from_secs(10)))
            // A restarted server is found again quickly: 0, 50, 100 … up to 1 s between tries.
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis((attempts as u64 * 50).min(1000))
            });
        let client = async_nats::connect_with_options(url, options)
            .await
            .map_err(|e| {
                wrpc_broker_runtime::Error::Unavailable(format!(
                    "cannot connect to NATS at {url}: {e}"
                ))
            })?;
        Ok(NatsDriver {
            client,
            subscriptions: Arc::default(),
            checked: Arc::default(),
        })
    }

    /// The native client (the bench compares against it).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Fault injection for tests: the next `count` settlements of messages of `queue`, on any
    /// driver of this process, fail with `refused` (see [`faults`]).
    pub fn refuse_settlements(queue: &str, count: u32) {
        faults::arm(queue, count);
    }
}

/// NATS with JetStream as a [`Driver`].
#[derive(Debug, Clone, Copy)]
pub struct Nats;

/// What this driver is.
static INFO: DriverInfo = DriverInfo {
    name: "nats",
    schemes: &["nats"],
    interface: INTERFACE,
    embedded_adapter: ADAPTER,
    linker: add_to_linker,
    appends_in_flight: 1,
};

impl Driver for Nats {
    fn info(&self) -> &'static DriverInfo {
        &INFO
    }

    fn connect<'a>(&'a self, url: &'a str) -> ConnectFuture<'a> {
        Box::pin(async move { Ok(INFO.lend(NatsDriver::connect(url).await?)) })
    }

    fn refuse_settlements(&self, _connection: &Lent, queue: &str, count: u32) -> bool {
        NatsDriver::refuse_settlements(queue, count);
        true
    }

    fn native_bench<'a>(&'a self, url: &'a str, _connection: &'a Lent) -> NativeBenchFuture<'a> {
        Box::pin(async move { Ok(Some(Box::new(bench::Native::new(url).await?) as _)) })
    }
}
