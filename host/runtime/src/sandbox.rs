//! What one adapter instance may touch: the Store data (`Ctx`), its WASI context with no
//! filesystem, environment, arguments or network, its memory cap ([`InstanceLimiter`]), its CPU
//! slice ([`Budget`]), and where its words go ([`InstanceLog`]).

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::budget::Budget;
use super::lent::DriverConnections;
use super::limiter::InstanceLimiter;
use super::output::{InstanceLog, TracingOutput};
use crate::ids::IdGenerator;

pub use super::budget::EPOCH_TICK;

/// Limits applied to every instance of an adapter.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The most memory one instance may hold: all its linear memories and tables together.
    pub memory_bytes: usize,
    /// How long a guest may hold its instance (run, or wait in a blocking WASI call) without
    /// letting the host's event loop run before it traps. Calls into the host do not renew it.
    pub cpu_slice: Duration,
    /// How long the host waits for one call (and for `describe` with `init` when an instance
    /// starts) before answering `timeout`; `close` gets at most 5 s of it.
    pub call_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 256 << 20,
            cpu_slice: Duration::from_secs(2),
            call_timeout: Duration::from_secs(30),
        }
    }
}

/// The data of one instance's Store.
pub struct Ctx {
    wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: InstanceLimiter,
    /// `broker.<name>`: where `host.log` and stdout/stderr go.
    pub(crate) log: Arc<InstanceLog>,
    /// The operator's id generator.
    pub(crate) ids: Arc<dyn IdGenerator>,
    /// The broker connections lent to this component (only those it was configured with).
    pub(crate) drivers: DriverConnections,
    /// The CPU slice.
    pub(crate) budget: Budget,
    /// The generation of this instance (0 for a `describe`-only instance).
    pub(crate) generation: u32,
}

impl Ctx {
    /// A sandboxed context: no preopens, env or args; stdout/stderr to `log`.
    pub fn new(
        log: Arc<InstanceLog>,
        ids: Arc<dyn IdGenerator>,
        drivers: DriverConnections,
        limits: &Limits,
        generation: u32,
    ) -> Self {
        let wasi = WasiCtx::builder()
            .stdout(TracingOutput::stdout(log.clone()))
            .stderr(TracingOutput::stderr(log.clone()))
            .allow_blocking_current_thread(false)
            .build();
        Self {
            wasi,
            table: ResourceTable::new(),
            limiter: InstanceLimiter::new(limits.memory_bytes),
            log,
            ids,
            drivers,
            budget: Budget::new(limits.cpu_slice),
            generation,
        }
    }

    /// The connection of type `T` lent to this component, if it was configured with one (a
    /// driver's import calls this first).
    pub fn lent<T: std::any::Any + Send + Sync>(&mut self) -> Option<&T> {
        self.drivers.get::<T>()
    }
}

impl WasiView for Ctx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
