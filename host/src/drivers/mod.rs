//! Drivers: the only code that touches a broker. Each is a small async mirror of a native client,
//! exposed to components as its own WIT package and lent only to the components the operator
//! configured it for. One module per driver.

pub mod memory;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "redis")]
pub mod redis;

use std::sync::Arc;

use wasmtime::component::Linker;

use crate::runtime::sandbox::Ctx;
use memory::MemoryStore;

/// The broker connections lent to one adapter: only what the operator configured.
#[derive(Clone, Default, Debug)]
pub struct DriverConnections {
    /// The in-process memory broker (`wrpc:memory/store`).
    pub memory: Option<Arc<MemoryStore>>,
    /// A Redis connection (`wrpc:redis/client`).
    #[cfg(feature = "redis")]
    pub redis: Option<redis::RedisDriver>,
    /// A NATS connection (`wrpc:nats/client`).
    #[cfg(feature = "nats")]
    pub nats: Option<nats::NatsDriver>,
}

/// Every driver interface the host knows (built in or not), by WIT name without version.
pub const DRIVER_INTERFACES: &[&str] = &[
    memory::INTERFACE,
    "wrpc:redis/client",
    "wrpc:nats/client",
    "wrpc:amqp/client",
    "wrpc:kafka/client",
];

impl DriverConnections {
    /// Whether the driver behind `interface` (a WIT name without version) is configured.
    pub fn grants(&self, interface: &str) -> bool {
        match interface {
            memory::INTERFACE => self.memory.is_some(),
            #[cfg(feature = "redis")]
            redis::INTERFACE => self.redis.is_some(),
            #[cfg(feature = "nats")]
            nats::INTERFACE => self.nats.is_some(),
            _ => false,
        }
    }

    /// Link the configured drivers' imports, and only those.
    pub(crate) fn add_to_linker(&self, linker: &mut Linker<Ctx>) -> wasmtime::Result<()> {
        if self.memory.is_some() {
            memory::add_to_linker(linker)?;
        }
        #[cfg(feature = "redis")]
        if self.redis.is_some() {
            redis::add_to_linker(linker)?;
        }
        #[cfg(feature = "nats")]
        if self.nats.is_some() {
            nats::add_to_linker(linker)?;
        }
        Ok(())
    }
}
