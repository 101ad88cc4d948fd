//! The `wrpc:kafka` driver: one rdkafka producer and admin client per configured cluster, lent
//! to the Kafka adapter component as `wrpc:kafka/client` (produce with delivery reports,
//! readers in assign mode, group members with commit / seek / pause, watermarks, committed
//! offsets, topic admin). It is deliberately generic: logs, queues, retry topics and ids live
//! in the adapter. rdkafka reconnects by itself, so the generation stays 1; a member that the
//! group fences or a reader whose offsets fall out of range ends its stream.
//!
//! Blocking librdkafka calls (metadata, watermarks, sync commits, seeks, closing a consumer)
//! run on tokio's blocking pool, never on the Store owner's task. A process-wide fault hook
//! ([`KafkaDriver::refuse_settlements`]) lets tests make a queue's commits fail, since a real
//! broker never refuses on cue.

#![deny(missing_docs)]

mod bench;
mod bindings;
mod client;
mod convert;
mod member;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock, Mutex};

pub use bindings::add_to_linker;
pub use client::bootstrap_servers;

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::FutureProducer;
use wrpc_broker_runtime::driver::{ConnectFuture, Driver, DriverInfo, Lent, NativeBenchFuture};
use wrpc_broker_runtime::faults::SettlementRefusals;

/// The WIT interface this driver provides.
pub const INTERFACE: &str = "wrpc:kafka/client";

/// The Kafka adapter component, built from `adapters/kafka` and shipped inside the host.
pub static ADAPTER: &[u8] = include_bytes!(env!("WRPC_KAFKA_COMPONENT"));

/// Commit refusals armed by tests, for every driver of this process (tests open brokers
/// through URLs, so they never hold the driver).
static REFUSALS: LazyLock<SettlementRefusals> = LazyLock::new(SettlementRefusals::default);

/// What clones of one driver share.
struct Shared {
    /// `bootstrap.servers`.
    bootstrap: String,
    producer: FutureProducer,
    admin: AdminClient<DefaultClientContext>,
    /// Live group members by handle.
    members: Mutex<HashMap<u64, Arc<member::Member>>>,
    /// The next reader or member handle.
    next_handle: AtomicU64,
}

/// The clients of one Kafka cluster, shared by clones.
#[derive(Clone)]
pub struct KafkaDriver {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for KafkaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaDriver")
            .field("bootstrap", &self.shared.bootstrap)
            .finish_non_exhaustive()
    }
}

impl KafkaDriver {
    /// Connect to the cluster at `url` (`kafka://host:port[,host:port…]`). The cluster is asked
    /// for its metadata now, so a wrong URL or a cluster that is down fails here with
    /// `unavailable`.
    pub async fn connect(url: &str) -> wrpc_broker_runtime::Result<KafkaDriver> {
        let bootstrap = bootstrap_servers(url).map_err(wrpc_broker_runtime::Error::Unavailable)?;
        let producer =
            client::producer(&bootstrap).map_err(wrpc_broker_runtime::Error::Unavailable)?;
        let admin = client::admin(&bootstrap).map_err(wrpc_broker_runtime::Error::Unavailable)?;
        let driver = KafkaDriver {
            shared: Arc::new(Shared {
                bootstrap,
                producer,
                admin,
                members: Mutex::new(HashMap::new()),
                next_handle: AtomicU64::new(1),
            }),
        };
        driver
            .ping()
            .await
            .map_err(|e| wrpc_broker_runtime::Error::Unavailable(format!("{e:?}")))?;
        Ok(driver)
    }

    /// The cluster's `bootstrap.servers`.
    pub fn bootstrap(&self) -> &str {
        &self.shared.bootstrap
    }

    /// Fault injection for tests: the next `count` commits of a group member of a queue whose
    /// name contains `queue`, on any driver of this process, fail with `refused` without being
    /// sent.
    pub fn refuse_settlements(queue: &str, count: u32) {
        REFUSALS.arm(queue, count);
    }
}

/// Apache Kafka (and Kafka-API servers such as Redpanda) as a [`Driver`].
#[derive(Debug, Clone, Copy)]
pub struct Kafka;

/// What this driver is.
static INFO: DriverInfo = DriverInfo {
    name: "kafka",
    schemes: &["kafka"],
    interface: INTERFACE,
    embedded_adapter: ADAPTER,
    linker: add_to_linker,
    // rdkafka's idempotent producer keeps a partition's records in the order produced; a
    // second call beside a batch keeps the partition's requests fed (BENCHMARKS, sixteenth
    // session: 64 appends in flight ×1.0–2.4 in seven alternating pairs); four in flight did
    // no better, and every call alone (no coalescing) far worse.
    appends_in_flight: 2,
};

impl Driver for Kafka {
    fn info(&self) -> &'static DriverInfo {
        &INFO
    }

    fn connect<'a>(&'a self, url: &'a str) -> ConnectFuture<'a> {
        Box::pin(async move { Ok(INFO.lend(KafkaDriver::connect(url).await?)) })
    }

    fn refuse_settlements(&self, _connection: &Lent, queue: &str, count: u32) -> bool {
        KafkaDriver::refuse_settlements(queue, count);
        true
    }

    fn native_bench<'a>(&'a self, url: &'a str, _connection: &'a Lent) -> NativeBenchFuture<'a> {
        Box::pin(async move {
            let native = bench::Native::new(url).await?;
            Ok(Some(
                Box::new(bench::Shared(std::sync::Arc::new(native))) as _
            ))
        })
    }
}
