//! `Broker`: the public entry point. It loads an adapter component (from a file, or the memory
//! adapter embedded in this crate), starts it, and hands out the capability handles. Every handle
//! reaches the adapter through one [`AdapterSlot`], so the component underneath can be replaced.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::backplane::{Backplane, Channels};
use crate::direct::{Direct, Inboxes};
use crate::drivers::DriverConnections;
use crate::drivers::memory::MemoryStore;
use crate::error::{Error, Result};
use crate::ids::{self, IdGenerator, RandomIds};
use crate::log::{Log, Logs};
use crate::queue::{Queue, Queues};
use crate::runtime::{
    AdapterComponent, AdapterInfo, AdapterInstance, Capabilities, InstanceConfig, Limits, Runtime,
};

/// The memory adapter component, built from `adapters/memory` and shipped inside the host.
pub static MEMORY_COMPONENT: &[u8] = include_bytes!(env!("WRPC_MEMORY_COMPONENT"));

/// Where the adapter component comes from.
#[derive(Debug, Clone)]
enum ComponentSource {
    EmbeddedMemory,
    File(PathBuf),
}

/// Configures and opens a [`Broker`].
pub struct BrokerBuilder {
    source: ComponentSource,
    options: Vec<(String, String)>,
    limits: Limits,
    ids: Arc<dyn IdGenerator>,
    memory: Option<Arc<MemoryStore>>,
    runtime: Option<Runtime>,
}

impl BrokerBuilder {
    /// Load the adapter from a component file.
    pub fn component_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.source = ComponentSource::File(path.into());
        self
    }

    /// Set one `init` option of the adapter.
    pub fn option(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.push((name.into(), value.into()));
        self
    }

    /// Set several `init` options.
    pub fn options<K: Into<String>, V: Into<String>>(
        mut self,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.options
            .extend(options.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Memory, CPU and time limits for the adapter's instances.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The id generator behind `host.generate-id` (checked when the broker opens).
    pub fn ids(mut self, ids: impl IdGenerator) -> Self {
        self.ids = Arc::new(ids);
        self
    }

    /// Lend the adapter this in-process memory broker (`wrpc:memory/store`). Two brokers opened on
    /// one store behave like two processes on one real broker.
    pub fn memory_store(mut self, store: Arc<MemoryStore>) -> Self {
        self.memory = Some(store);
        self
    }

    /// Use this runtime (engine and component cache) instead of the process-wide one.
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Load the component, start it, and run `init` with the options.
    pub async fn open(self) -> Result<Broker> {
        ids::validate(self.ids.as_ref())?;
        let runtime = match self.runtime {
            Some(runtime) => runtime,
            None => Runtime::shared()?,
        };
        let memory = match (&self.source, self.memory) {
            (ComponentSource::EmbeddedMemory, None) => Some(MemoryStore::new()),
            (_, memory) => memory,
        };
        let drivers = DriverConnections { memory };
        let component = match &self.source {
            ComponentSource::EmbeddedMemory => {
                runtime.load_bytes("embedded memory adapter", MEMORY_COMPONENT, &drivers)?
            }
            ComponentSource::File(path) => runtime.load_file(path, &drivers)?,
        };
        let component = Arc::new(component);
        let config = InstanceConfig {
            options: self.options,
            limits: self.limits,
            ids: self.ids,
            drivers,
        };
        let instance = AdapterInstance::start(component.clone(), config).await?;
        let slot = Arc::new(AdapterSlot::new(instance));
        Ok(Broker {
            inner: Arc::new(Inner {
                logs: Logs::new(slot.clone()),
                channels: Channels::new(slot.clone()),
                queues: Queues::new(slot.clone()),
                inboxes: Inboxes::new(slot.clone()),
                slot,
                component,
            }),
        })
    }
}

/// The adapter instance every handle of one broker goes through; swapping it swaps the adapter.
#[derive(Debug)]
pub struct AdapterSlot {
    current: RwLock<AdapterInstance>,
}

impl AdapterSlot {
    fn new(instance: AdapterInstance) -> Self {
        Self {
            current: RwLock::new(instance),
        }
    }

    /// The adapter instance calls go to now.
    pub fn current(&self) -> AdapterInstance {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

pub(crate) struct Inner {
    pub(crate) slot: Arc<AdapterSlot>,
    pub(crate) logs: Logs,
    pub(crate) channels: Channels,
    pub(crate) queues: Queues,
    pub(crate) inboxes: Inboxes,
    component: Arc<AdapterComponent>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.slot.current().close();
    }
}

/// A host instance on one broker, through one adapter component. Clones share it; the adapter
/// closes when the last clone is dropped or [`Broker::close`] is called.
#[derive(Clone)]
pub struct Broker {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("adapter", &self.info().name)
            .field("capabilities", &self.capabilities().names())
            .finish()
    }
}

impl Broker {
    /// A builder; by default it opens the embedded memory adapter on a fresh in-process store.
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder {
            source: ComponentSource::EmbeddedMemory,
            options: Vec::new(),
            limits: Limits::default(),
            ids: Arc::new(RandomIds),
            memory: None,
            runtime: None,
        }
    }

    /// The embedded memory adapter on a fresh in-process store: needs no file and no server.
    pub async fn memory() -> Result<Broker> {
        Broker::builder().open().await
    }

    /// The adapter component in `path`, with `init` options.
    pub async fn open<K: Into<String>, V: Into<String>>(
        path: impl Into<PathBuf>,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Broker> {
        Broker::builder()
            .component_file(path)
            .options(options)
            .open()
            .await
    }

    /// What the adapter said about itself.
    pub fn info(&self) -> AdapterInfo {
        self.inner.slot.current().info().clone()
    }

    /// The capabilities the adapter exports.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.slot.current().capabilities()
    }

    /// The loaded component (source, size, cache origin, load time, imports).
    pub fn component(&self) -> &AdapterComponent {
        &self.inner.component
    }

    /// The live adapter instance, for raw calls to its exports (the contract suite checks an
    /// adapter's own contract through these).
    pub fn adapter(&self) -> AdapterInstance {
        self.inner.slot.current()
    }

    fn require(&self, has: bool, capability: &str) -> Result<()> {
        if has {
            Ok(())
        } else {
            Err(Error::Unsupported(format!(
                "adapter `{}` does not export the `{capability}` capability (it offers: {})",
                self.info().name,
                self.capabilities().names().join(", ")
            )))
        }
    }

    /// The log capability: ordered, replayable feeds.
    pub fn log(&self) -> Result<Log> {
        self.require(self.capabilities().log, "log")?;
        Ok(Log::new(self.inner.clone()))
    }

    /// The backplane capability: at-most-once fan-out across host instances.
    pub fn backplane(&self) -> Result<Backplane> {
        self.require(self.capabilities().backplane, "backplane")?;
        Ok(Backplane::new(self.inner.clone()))
    }

    /// The queue capability: at-least-once work with retry and dead-lettering.
    pub fn queue(&self) -> Result<Queue> {
        self.require(self.capabilities().queue, "queue")?;
        Ok(Queue::new(self.inner.clone()))
    }

    /// The direct capability: addressable inboxes and request/reply.
    pub fn direct(&self) -> Result<Direct> {
        self.require(self.capabilities().direct, "direct")?;
        Ok(Direct::new(self.inner.clone()))
    }

    /// Close the adapter: handles stop working, streams end.
    pub fn close(&self) {
        self.inner.slot.current().close();
    }
}
