//! wrpc-broker: a host for message-broker adapters that are WebAssembly components.
//!
//! A broker is described by four capabilities (backplane, log, queue, direct); each adapter is a
//! sandboxed component that maps them onto one broker, and exports the ones it offers. The host
//! owns every broker connection (the drivers) and lends a component only what it was configured
//! with.

#![deny(missing_docs)]

pub mod drivers;
/// The component runtime (`host/runtime`): loading, sandbox, instances, streams.
pub use wrpc_broker_runtime as runtime;
pub use wrpc_broker_runtime::{bindings, error, ids, token};

pub use error::{Error, Result};
pub mod backplane;
mod batch;
pub mod broker;
pub mod direct;
pub mod log;
pub mod migrate;
pub mod queue;
pub mod watch;

pub use backplane::{Backplane, Subscription};
pub use broker::{Broker, BrokerBuilder, SwapReport};
pub use direct::{Direct, Incoming, ListenOptions, Listener, Packet, SendOptions};
pub use drivers::memory::MemoryStore;
pub use log::{AppendOptions, Entry, Log, Position, ReadFrom, Reader};
pub use migrate::{MigrateOptions, MigrationEvent, MigrationReport, QueueDrain};
pub use queue::{ConsumeOptions, Consumer, Delivery, ProduceOptions, Queue, Settled};
pub use runtime::{Capabilities, Limits};
