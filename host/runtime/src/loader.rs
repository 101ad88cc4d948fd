//! Loading a component from a file at run time: compile once (or take it from the cache), refuse
//! imports the host does not link or drivers the operator did not configure, and discover the
//! capabilities from the interfaces the component exports.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use wasmtime::component::{Component, HasSelf, InstancePre, Linker};
use wasmtime::{Config, Engine};

use super::budget::{self, EPOCH_TICK};
use super::cache::{ComponentCache, Origin};
use super::lent::DriverConnections;
use super::sandbox::Ctx;
use crate::bindings::{self, adapter, backplane, direct, log, queue};
use crate::error::{Error, Result};

/// The WIT interfaces of the four capabilities, as exported by a component.
pub const BACKPLANE: &str = "wrpc:broker/backplane@0.1.0";
/// See [`BACKPLANE`].
pub const LOG: &str = "wrpc:broker/log@0.1.0";
/// See [`BACKPLANE`].
pub const QUEUE: &str = "wrpc:broker/queue@0.1.0";
/// See [`BACKPLANE`].
pub const DIRECT: &str = "wrpc:broker/direct@0.1.0";
/// The lifecycle interface every adapter exports.
pub const ADAPTER: &str = "wrpc:broker/adapter@0.1.0";

/// The wasmtime engine, its epoch ticker and the component cache, shared by every adapter in a
/// process.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    cache: ComponentCache,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("cache", &self.cache)
            .finish()
    }
}

/// The engine configuration every adapter runs on: the component model with its async ABI and
/// concurrent calls, and epoch interruption (the clock of the call budgets). The bench's floor
/// rows build their bare engines from it too.
pub(crate) fn engine_config() -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.wasm_component_model_async(true);
    config.concurrency_support(true);
    config.epoch_interruption(true);
    config
}

impl Runtime {
    /// A runtime caching compiled components in `cache_dir`.
    pub fn new(cache_dir: impl Into<std::path::PathBuf>) -> Result<Self> {
        let engine =
            Engine::new(&engine_config()).map_err(|e| Error::Load(format!("engine: {e:#}")))?;
        let cache = ComponentCache::open(cache_dir).map_err(|e| Error::Load(format!("{e:#}")))?;
        spawn_epoch_ticker(&engine);
        Ok(Self { engine, cache })
    }

    /// The process-wide runtime with the default cache directory.
    pub fn shared() -> Result<Self> {
        static SHARED: OnceLock<Runtime> = OnceLock::new();
        if let Some(runtime) = SHARED.get() {
            return Ok(runtime.clone());
        }
        let runtime = Runtime::new(ComponentCache::default_dir())?;
        Ok(SHARED.get_or_init(|| runtime).clone())
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The cache of compiled components.
    pub fn cache(&self) -> &ComponentCache {
        &self.cache
    }

    /// Load the component in `path`, granting it the drivers in `drivers` and nothing else.
    pub fn load_file(
        &self,
        path: impl AsRef<Path>,
        drivers: &DriverConnections,
    ) -> Result<AdapterComponent> {
        let path = path.as_ref();
        let wasm = std::fs::read(path)
            .map_err(|e| Error::Load(format!("reading {}: {e}", path.display())))?;
        self.load_bytes(&path.display().to_string(), &wasm, drivers)
    }

    /// Load a component from bytes; `source` names it in errors.
    pub fn load_bytes(
        &self,
        source: &str,
        wasm: &[u8],
        drivers: &DriverConnections,
    ) -> Result<AdapterComponent> {
        let started = Instant::now();
        binary_component(wasm).map_err(|e| Error::Load(format!("{source}: {e}")))?;
        let (component, origin) = self
            .cache
            .load(&self.engine, wasm)
            .map_err(|e| Error::Load(format!("{source}: {e:#}")))?;
        let imports = check_imports(&self.engine, &component, drivers)
            .map_err(|e| Error::Load(format!("{source}: {e}")))?;
        let mut linker: Linker<Ctx> = Linker::new(&self.engine);
        let link = |linker: &mut Linker<Ctx>| -> wasmtime::Result<()> {
            wasmtime_wasi::p2::add_to_linker_async(linker)?;
            budget::add_guarded_poll(linker)?;
            bindings::HostView::add_to_linker::<_, HasSelf<Ctx>>(linker, |ctx| ctx)?;
            drivers.add_to_linker(linker)
        };
        link(&mut linker).map_err(|e| Error::Load(format!("linking: {e:#}")))?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| Error::Load(format!("{source}: {e:#}")))?;
        let indices =
            ExportIndices::new(&pre).map_err(|e| Error::Load(format!("{source}: {e}")))?;
        Ok(AdapterComponent {
            source: source.to_string(),
            size: wasm.len() as u64,
            origin,
            load_time: started.elapsed(),
            imports,
            capabilities: indices.capabilities(),
            engine: self.engine.clone(),
            pre,
            indices,
        })
    }
}

/// One ticker thread per engine: advances the epoch every [`EPOCH_TICK`] while the engine lives.
fn spawn_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wrpc-broker-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .expect("spawning the epoch ticker thread");
}

/// Refuse anything but a binary WebAssembly component, saying what it is instead.
fn binary_component(wasm: &[u8]) -> std::result::Result<(), String> {
    const MAGIC: &[u8] = b"\0asm";
    match wasm.get(4..8) {
        _ if !wasm.starts_with(MAGIC) => Err(
            "not a WebAssembly component (the file does not start with the `\\0asm` header)".into(),
        ),
        // Version 1, layer 0: a core module.
        Some([1, 0, 0, 0]) => Err("not a WebAssembly component: a core WebAssembly module \
             (make a component of it with `wasm-tools component new`)"
            .into()),
        // Layer 1: a component (the version moves with the component-model draft).
        Some([_, _, 1, 0]) => Ok(()),
        _ => Err("not a WebAssembly component (an unknown WebAssembly version or layer)".into()),
    }
}

/// Refuse any import the host does not link, or a driver the operator did not configure.
fn check_imports(
    engine: &Engine,
    component: &Component,
    drivers: &DriverConnections,
) -> std::result::Result<Vec<String>, String> {
    let mut names = Vec::new();
    for (name, _) in component.component_type().imports(engine) {
        let interface = name.split('@').next().unwrap_or(name);
        let allowed = name.starts_with("wasi:")
            || interface == "wrpc:broker/host"
            || interface == "wrpc:broker/types"
            || drivers.grants(interface);
        if !allowed {
            return Err(if drivers.knows(interface) {
                format!(
                    "the component imports the driver `{name}`, which the operator did not configure for it"
                )
            } else {
                format!("the component imports `{name}`, which this host does not provide")
            });
        }
        names.push(name.to_string());
    }
    Ok(names)
}

/// Which capabilities a component offers: the capability interfaces it exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Exports `wrpc:broker/backplane`.
    pub backplane: bool,
    /// Exports `wrpc:broker/log`.
    pub log: bool,
    /// Exports `wrpc:broker/queue`.
    pub queue: bool,
    /// Exports `wrpc:broker/direct`.
    pub direct: bool,
}

impl Capabilities {
    /// The names of the capabilities offered, in WIT order.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.backplane, "backplane"),
            (self.log, "log"),
            (self.queue, "queue"),
            (self.direct, "direct"),
        ]
        .into_iter()
        .filter_map(|(has, name)| has.then_some(name))
        .collect()
    }
}

/// Export lookups done once per component, before any instance exists.
#[derive(Clone)]
pub(crate) struct ExportIndices {
    adapter: adapter::GuestIndices,
    backplane: Option<backplane::GuestIndices>,
    log: Option<log::GuestIndices>,
    queue: Option<queue::GuestIndices>,
    direct: Option<direct::GuestIndices>,
}

/// Look up `interface` if exported; an export that does not match the WIT is an error.
fn optional<I>(
    pre: &InstancePre<Ctx>,
    interface: &str,
    new: impl Fn(&InstancePre<Ctx>) -> wasmtime::Result<I>,
) -> std::result::Result<Option<I>, String> {
    if pre.component().get_export_index(None, interface).is_none() {
        return Ok(None);
    }
    new(pre).map(Some).map_err(|e| {
        format!("the component exports `{interface}` but it does not match the WIT: {e:#}")
    })
}

impl ExportIndices {
    fn new(pre: &InstancePre<Ctx>) -> std::result::Result<Self, String> {
        let adapter = optional(pre, ADAPTER, adapter::GuestIndices::new)?.ok_or_else(|| {
            format!("the component does not export `{ADAPTER}`: it is not a wrpc-broker adapter")
        })?;
        Ok(Self {
            adapter,
            backplane: optional(pre, BACKPLANE, backplane::GuestIndices::new)?,
            log: optional(pre, LOG, log::GuestIndices::new)?,
            queue: optional(pre, QUEUE, queue::GuestIndices::new)?,
            direct: optional(pre, DIRECT, direct::GuestIndices::new)?,
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backplane: self.backplane.is_some(),
            log: self.log.is_some(),
            queue: self.queue.is_some(),
            direct: self.direct.is_some(),
        }
    }

    /// Resolve the exports of one instance.
    pub(crate) fn load(
        &self,
        store: &mut wasmtime::Store<Ctx>,
        instance: &wasmtime::component::Instance,
    ) -> wasmtime::Result<Exports> {
        Ok(Exports {
            adapter: self.adapter.load(&mut *store, instance)?,
            backplane: self
                .backplane
                .as_ref()
                .map(|i| i.load(&mut *store, instance))
                .transpose()?,
            log: self
                .log
                .as_ref()
                .map(|i| i.load(&mut *store, instance))
                .transpose()?,
            queue: self
                .queue
                .as_ref()
                .map(|i| i.load(&mut *store, instance))
                .transpose()?,
            direct: self
                .direct
                .as_ref()
                .map(|i| i.load(&mut *store, instance))
                .transpose()?,
        })
    }
}

/// The exports of one live instance.
pub struct Exports {
    /// Lifecycle.
    pub adapter: adapter::Guest,
    /// Backplane, when offered.
    pub backplane: Option<backplane::Guest>,
    /// Log, when offered.
    pub log: Option<log::Guest>,
    /// Queue, when offered.
    pub queue: Option<queue::Guest>,
    /// Direct, when offered.
    pub direct: Option<direct::Guest>,
}

/// A compiled, linked adapter component, ready to instantiate any number of times.
pub struct AdapterComponent {
    /// Where it came from (a file path, or a name for embedded bytes).
    pub source: String,
    /// The size of the component file in bytes.
    pub size: u64,
    /// Compiled now or taken from the cache.
    pub origin: Origin,
    /// How long loading took (read, compile or deserialise, link).
    pub load_time: Duration,
    /// Every interface it imports.
    pub imports: Vec<String>,
    /// The capabilities it exports.
    pub capabilities: Capabilities,
    pub(crate) engine: Engine,
    pub(crate) pre: InstancePre<Ctx>,
    pub(crate) indices: ExportIndices,
}

impl std::fmt::Debug for AdapterComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterComponent")
            .field("source", &self.source)
            .field("size", &self.size)
            .field("origin", &self.origin)
            .field("capabilities", &self.capabilities)
            .finish()
    }
}

/// A loaded component shared by the instances started from it.
pub type SharedComponent = Arc<AdapterComponent>;

#[cfg(test)]
mod tests {
    use super::binary_component;

    #[test]
    fn only_a_binary_component_passes_the_header_check() {
        let component = [b"\0asm".as_slice(), &[0x0d, 0, 1, 0]].concat();
        assert!(binary_component(&component).is_ok());
        let module = [b"\0asm".as_slice(), &[1, 0, 0, 0]].concat();
        assert!(
            binary_component(&module)
                .unwrap_err()
                .contains("a core WebAssembly module")
        );
        for other in [b"(component)".as_slice(), b"", b"\0as", b"ELF\x7f...."] {
            let why = binary_component(other).unwrap_err();
            assert!(why.starts_with("not a WebAssembly component"), "{why}");
        }
    }
}
