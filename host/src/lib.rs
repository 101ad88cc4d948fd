//! wrpc-broker: a host for message-broker adapters that are WebAssembly components.
//!
//! A broker is described by four capabilities (backplane, log, queue, direct); each adapter is a
//! sandboxed component that maps them onto one broker, and exports the ones it offers. The host
//! owns every broker connection (the drivers) and lends a component only what it was configured
//! with.

#![deny(missing_docs)]

pub mod drivers;
pub use wrpc_broker_runtime::{error, ids, token};
// The runtime and the raw WIT bindings are not the API: `Broker` and the capability handles
// are. The contract suite's raw tests and the CLI's `inspect` reach below them, behind the
// `raw` feature.
/// The component runtime (`host/runtime`): loading, sandbox, instances, streams.
#[cfg(feature = "raw")]
pub use wrpc_broker_runtime as runtime;
#[cfg(not(feature = "raw"))]
use wrpc_broker_runtime as runtime;
/// The raw WIT bindings of `wrpc:broker` (what an adapter exports, as the host calls it).
#[cfg(feature = "raw")]
pub use wrpc_broker_runtime::bindings;
#[cfg(not(feature = "raw"))]
use wrpc_broker_runtime::bindings;

pub use error::{Error, Result};
pub mod backplane;
mod batch;
pub mod broker;
pub mod direct;
mod handover;
pub mod log;
pub mod migrate;
pub mod queue;
mod slot;
pub mod watch;

pub use backplane::{Backplane, Subscription};
pub use broker::{Broker, BrokerBuilder, SwapReport};
pub use direct::{Direct, Incoming, ListenOptions, Listener, Packet, SendOptions};
pub use drivers::memory::MemoryStore;
pub use log::{AppendOptions, Entry, Log, Position, ReadFrom, Reader};
pub use migrate::{MigrateOptions, MigrationEvent, MigrationReport, QueueDrain};
pub use queue::{ConsumeOptions, Consumer, Delivery, ProduceOptions, Queue, Settled};
pub use runtime::{Capabilities, Limits};
