//! `Broker`: the public entry point. It loads an adapter component (from a file, or the memory
//! adapter embedded in this crate), starts it, and hands out the capability handles. Every handle
//! reaches the adapter through one [`AdapterSlot`], so the component underneath can be replaced;
//! a swap hands each capability's live parts over through its [`Handover`].

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::backplane::{Backplane, Channels};
use crate::direct::{Direct, Inboxes};
use crate::drivers::Driver;
use crate::drivers::memory::{ADAPTER as MEMORY_ADAPTER, MemoryStore};
use crate::error::{Error, Result};
use crate::handover::Handover;
use crate::ids::{self, IdGenerator, RandomIds};
use crate::log::{Log, Logs};
use crate::queue::{Queue, Queues};
use crate::runtime::{
    AdapterComponent, AdapterInfo, AdapterInstance, Capabilities, DriverConnections,
    InstanceConfig, Lent, Limits, Runtime,
};
pub use crate::slot::{AdapterSlot, TRAP_RETRIES};
use crate::slot::{Held, Moved};

/// Where the adapter component comes from.
#[derive(Debug, Clone)]
enum ComponentSource {
    /// An adapter shipped inside the host binary, for the broker of a URL.
    Embedded {
        name: String,
        bytes: &'static [u8],
    },
    File(PathBuf),
}

impl ComponentSource {
    fn is_embedded_memory(&self) -> bool {
        matches!(self, ComponentSource::Embedded { bytes, .. } if std::ptr::eq(*bytes, MEMORY_ADAPTER))
    }

    fn embedded(driver: &dyn Driver) -> Self {
        ComponentSource::Embedded {
            name: format!("embedded {} adapter", driver.info().name),
            bytes: driver.info().embedded_adapter,
        }
    }
}

/// Configures and opens a [`Broker`].
pub struct BrokerBuilder {
    source: ComponentSource,
    options: Vec<(String, String)>,
    limits: Limits,
    ids: Arc<dyn IdGenerator>,
    /// Broker URLs whose drivers' connections are lent to the adapter.
    urls: Vec<String>,
    /// Connections lent as they are (they win over a URL of the same driver).
    lent: Vec<Lent>,
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
        self.options.extend(owned_options(options));
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
    pub fn memory_store(self, store: Arc<MemoryStore>) -> Self {
        self.lend(crate::drivers::memory::lend(store))
    }

    /// Lend the adapter this driver connection (see [`crate::drivers::Driver::connect`]).
    pub fn lend(mut self, connection: Lent) -> Self {
        self.lent.push(connection);
        self
    }

    /// Open the broker at `url` with the adapter embedded for it: `memory://` (a fresh in-process
    /// store; `memory://<name>` a named one of this process), `redis://host:port`,
    /// `nats://host:port` — every scheme of [`crate::drivers::registry`]. A later
    /// [`Self::component_file`] replaces the adapter and keeps the connection.
    pub fn url(mut self, url: &str) -> Result<Self> {
        let driver = crate::drivers::for_url(url)?;
        self.source = ComponentSource::embedded(driver);
        self.urls.push(url.to_string());
        Ok(self)
    }

    /// Lend the adapter a connection to the broker at `url` too, keeping the adapter (a
    /// component file that imports that broker's driver).
    pub fn driver_url(mut self, url: impl Into<String>) -> Self {
        self.urls.push(url.into());
        self
    }

    /// Use this runtime (engine and component cache) instead of the process-wide one.
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Connect the drivers the operator configured (the embedded memory adapter with no broker
    /// gets a fresh store).
    async fn connect_drivers(&self) -> Result<DriverConnections> {
        let mut urls = self.urls.clone();
        if urls.is_empty() && self.lent.is_empty() && self.source.is_embedded_memory() {
            urls.push("memory://".to_string());
        }
        crate::drivers::connect_all(&urls, self.lent.clone()).await
    }

    /// Connect the drivers and load the component (not started yet): the runtime it was loaded
    /// into, the component and how its instances start.
    pub(crate) async fn prepare(
        self,
        runtime: Option<Runtime>,
    ) -> Result<(Runtime, Arc<AdapterComponent>, InstanceConfig)> {
        ids::validate(self.ids.as_ref())?;
        let runtime = match self.runtime.clone().or(runtime) {
            Some(runtime) => runtime,
            None => Runtime::shared()?,
        };
        let drivers = self.connect_drivers().await?;
        let component = match &self.source {
            ComponentSource::Embedded { name, bytes } => {
                runtime.load_bytes(name, bytes, &drivers)?
            }
            ComponentSource::File(path) => runtime.load_file(path, &drivers)?,
        };
        let config = InstanceConfig {
            options: self.options,
            limits: self.limits,
            ids: self.ids,
            drivers,
        };
        Ok((runtime, Arc::new(component), config))
    }

    /// Load the component, start it, and run `init` with the options.
    pub async fn open(self) -> Result<Broker> {
        let (runtime, component, config) = self.prepare(None).await?;
        let instance = AdapterInstance::start(component.clone(), config.clone()).await?;
        let slot = Arc::new(AdapterSlot::new(instance));
        Ok(Broker {
            inner: Arc::new(Inner {
                logs: Arc::new(Logs::new(slot.clone())),
                channels: Arc::new(Channels::new(slot.clone())),
                queues: Arc::new(Queues::new(slot.clone())),
                inboxes: Arc::new(Inboxes::new(slot.clone())),
                slot,
                component: RwLock::new(component),
                runtime,
                config: RwLock::new(config),
                swapping: tokio::sync::Mutex::new(()),
                migrated: Arc::default(),
            }),
        })
    }
}

/// Start `component` as the successor of `old` (generation + 1). One that does not export a
/// capability `old` exports is refused (the error ends with `not <done>`).
pub(crate) async fn start_successor(
    old: &AdapterInstance,
    component: Arc<AdapterComponent>,
    config: InstanceConfig,
    done: &str,
) -> Result<AdapterInstance> {
    let missing: Vec<&str> = old
        .capabilities()
        .names()
        .into_iter()
        .filter(|c| !component.capabilities.names().contains(c))
        .collect();
    if !missing.is_empty() {
        return Err(Error::Unsupported(format!(
            "the new adapter does not export {} (the running one does): not {done}",
            missing.join(", ")
        )));
    }
    AdapterInstance::start_at(component, config, old.generation() + 1).await
}

/// One host instance: its slot, each capability's live parts, and how its adapter runs.
pub(crate) struct Inner {
    pub(crate) slot: Arc<AdapterSlot>,
    pub(crate) logs: Arc<Logs>,
    pub(crate) channels: Arc<Channels>,
    pub(crate) queues: Arc<Queues>,
    pub(crate) inboxes: Arc<Inboxes>,
    component: RwLock<Arc<AdapterComponent>>,
    pub(crate) runtime: Runtime,
    /// How instances are started: options, limits, ids and the drivers lent to the adapter.
    config: RwLock<InstanceConfig>,
    /// One swap or migration at a time.
    pub(crate) swapping: tokio::sync::Mutex<()>,
    /// The last migration to another broker: what it moved from and to, and when.
    pub(crate) migrated: Arc<RwLock<Option<Moved>>>,
}

impl Inner {
    /// Every capability's live parts, as swap and migration hand them over.
    pub(crate) fn handovers(&self) -> [&dyn Handover; 4] {
        [
            self.logs.as_ref(),
            self.channels.as_ref(),
            self.queues.as_ref(),
            self.inboxes.as_ref(),
        ]
    }

    /// What a handle of this broker holds: its slot, `live` (the capability's live parts) and
    /// the broker itself.
    fn held<P>(self: &Arc<Self>, live: &Arc<P>) -> Held<P> {
        Held::new(
            self.slot.clone(),
            live.clone(),
            self.migrated.clone(),
            self.clone(),
        )
    }

    /// Point every later call at `new`, the component it runs and how it was started.
    pub(crate) fn install(
        &self,
        new: AdapterInstance,
        component: Arc<AdapterComponent>,
        config: InstanceConfig,
    ) {
        self.slot.replace(new);
        *self.component.write().unwrap_or_else(|e| e.into_inner()) = component;
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.slot.current().close();
    }
}

/// What a [`Broker::swap`] did.
#[derive(Debug, Clone, Copy)]
pub struct SwapReport {
    /// The generation of the new adapter instance.
    pub generation: u32,
    /// How long loading and starting the new adapter took (calls kept going to the old one).
    pub ready: std::time::Duration,
    /// How long the whole swap took, consumers moved and the old adapter closed.
    pub total: std::time::Duration,
}

/// `init` options as owned name/value pairs.
pub(crate) fn owned_options<K: Into<String>, V: Into<String>>(
    options: impl IntoIterator<Item = (K, V)>,
) -> Vec<(String, String)> {
    options
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
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
            source: ComponentSource::embedded(&crate::drivers::memory::MemoryDriver),
            options: Vec::new(),
            limits: Limits::default(),
            ids: Arc::new(RandomIds),
            urls: Vec::new(),
            lent: Vec::new(),
            runtime: None,
        }
    }

    /// The embedded memory adapter on a fresh in-process store: needs no file and no server.
    pub async fn memory() -> Result<Broker> {
        Broker::builder().open().await
    }

    /// The broker at `url` through the adapter embedded for it (see [`BrokerBuilder::url`]).
    pub async fn connect(url: &str) -> Result<Broker> {
        Broker::builder().url(url)?.open().await
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
    pub fn component(&self) -> Arc<AdapterComponent> {
        self.inner
            .component
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replace the adapter under this running host with the component in `path` (a new version
    /// for the same broker, with the same drivers), losing nothing: the new one is started; calls
    /// from now on go to it (calls already queued on the old one finish there); queue consumers
    /// drain on the old one (handlers in flight finish within a grace period, unsettled
    /// deliveries are released) and consume again on the new one; then the old one closes, and
    /// log readers, backplane subscriptions and direct listeners resume on the new one (readers
    /// after their last entry). A failure to load or start the new component changes nothing.
    /// `options` replace the running adapter's: pass its `prefix` again to stay in its namespace.
    pub async fn swap<K: Into<String>, V: Into<String>>(
        &self,
        path: impl AsRef<std::path::Path>,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<SwapReport> {
        let path = path.as_ref();
        let wasm = tokio::fs::read(path)
            .await
            .map_err(|e| Error::Load(format!("reading {}: {e}", path.display())))?;
        self.swap_bytes(&path.display().to_string(), &wasm, options)
            .await
    }

    /// [`Broker::swap`] to a component given as bytes; `source` names it in errors.
    pub async fn swap_bytes<K: Into<String>, V: Into<String>>(
        &self,
        source: &str,
        wasm: &[u8],
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<SwapReport> {
        let started = std::time::Instant::now();
        let _one_at_a_time = self.inner.swapping.lock().await;
        let old = self.inner.slot.current();
        let mut config = self
            .inner
            .config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // Loading (hash, cache or compile, link) is synchronous work of a millisecond or more:
        // off the runtime's workers, so that calls to the running instance go on meanwhile
        // (with one worker they stalled for the whole load).
        let component = {
            let (runtime, drivers) = (self.inner.runtime.clone(), config.drivers.clone());
            let (name, wasm) = (source.to_string(), wasm.to_vec());
            tokio::task::spawn_blocking(move || runtime.load_bytes(&name, &wasm, &drivers))
                .await
                .map_err(|e| Error::Load(format!("{source}: the load did not finish: {e}")))??
        };
        let component = Arc::new(component);
        let options = owned_options(options);
        if options != config.options {
            // Options replace the running ones: a `prefix` left out moves the adapter to
            // another namespace, where the queues and feeds of this host are not.
            tracing::warn!(running = ?config.options, new = ?options,
                "the new adapter starts with other options than the running one");
        }
        config.options = options;
        let new = start_successor(&old, component.clone(), config.clone(), "swapped").await?;
        let ready = started.elapsed();
        self.inner.install(new.clone(), component, config);
        futures::future::join_all(self.inner.handovers().map(|h| h.swapped(&new))).await;
        old.retire(new.clone());
        old.finished().await;
        Ok(SwapReport {
            generation: new.generation(),
            ready,
            total: started.elapsed(),
        })
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
        Ok(Log::new(self.inner.held(&self.inner.logs)))
    }

    /// The backplane capability: at-most-once fan-out across host instances.
    pub fn backplane(&self) -> Result<Backplane> {
        self.require(self.capabilities().backplane, "backplane")?;
        Ok(Backplane::new(self.inner.held(&self.inner.channels)))
    }

    /// The queue capability: at-least-once work with retry and dead-lettering.
    pub fn queue(&self) -> Result<Queue> {
        self.require(self.capabilities().queue, "queue")?;
        Ok(Queue::new(self.inner.held(&self.inner.queues)))
    }

    /// The direct capability: addressable inboxes and request/reply.
    pub fn direct(&self) -> Result<Direct> {
        self.require(self.capabilities().direct, "direct")?;
        Ok(Direct::new(self.inner.held(&self.inner.inboxes)))
    }

    /// Close the adapter: handles stop working, streams end.
    pub fn close(&self) {
        self.inner.slot.current().close();
    }
}
