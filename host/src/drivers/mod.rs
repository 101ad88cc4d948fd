//! Drivers: the only code that touches a broker. Each is a small async mirror of a native client,
//! exposed to components as its own WIT package and lent only to the components the operator
//! configured it for. One module per driver.

pub mod memory;

use std::sync::Arc;

use wasmtime::component::Linker;

use crate::runtime::sandbox::Ctx;
use memory::MemoryStore;

/// The broker connections lent to one adapter: only what the operator configured.
#[derive(Clone, Default, Debug)]
pub struct DriverConnections {
    /// The in-process memory broker (`wrpc:memory/store`).
    pub memory: Option<Arc<MemoryStore>>,
}

/// Every driver interface the host knows, by WIT name without version.
pub const DRIVER_INTERFACES: &[&str] = &[memory::INTERFACE];

impl DriverConnections {
    /// Whether the driver behind `interface` (a WIT name without version) is configured.
    pub fn grants(&self, interface: &str) -> bool {
        match interface {
            memory::INTERFACE => self.memory.is_some(),
            _ => false,
        }
    }

    /// Link the configured drivers' imports, and only those.
    pub(crate) fn add_to_linker(&self, linker: &mut Linker<Ctx>) -> wasmtime::Result<()> {
        if self.memory.is_some() {
            memory::add_to_linker(linker)?;
        }
        Ok(())
    }
}
