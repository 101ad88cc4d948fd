//! A running adapter: one Store-owner task per instance, sitting in `run_concurrent` for the
//! instance's life and draining a request channel with `recv_many`, so many calls are in flight
//! inside one instance at once. A supervisor replaces a trapped instance (new Store,
//! `init` again, generation + 1); requests still queued run on the new one.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use wasmtime::component::Accessor;
use wasmtime::{Store, UpdateDeadline};

use super::lent::DriverConnections;
use super::loader::{Capabilities, Exports, SharedComponent};
use super::sandbox::{Ctx, EPOCH_TICK, Limits};
use super::trace::TargetLogger;
use crate::bindings::adapter;
use crate::error::{Error, Result};
use crate::ids::IdGenerator;

/// The future of one job on the Store-owner task. `Err` means the instance is broken (a trap).
pub type JobFuture<'a> = Pin<Box<dyn Future<Output = wasmtime::Result<()>> + Send + 'a>>;
/// One unit of work run inside the instance's `run_concurrent`.
pub type Job = Box<dyn for<'a> FnOnce(&'a Accessor<Ctx>, &'a Exports) -> JobFuture<'a> + Send>;
/// What a call computes: `Err` from wasmtime (a trap) or the call's own result.
pub type CallFuture<'a, R> = Pin<Box<dyn Future<Output = wasmtime::Result<Result<R>>> + Send + 'a>>;

/// How many queued requests the owner takes per wake-up.
const JOBS_PER_WAKE: usize = 64;
/// How long `close` may take before the instance is dropped anyway.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between attempts to start a replacement instance that failed to start.
const RESTART_BACKOFF: Duration = Duration::from_millis(200);

/// Everything needed to start instances of one adapter.
#[derive(Clone)]
pub struct InstanceConfig {
    /// The `init` options.
    pub options: Vec<(String, String)>,
    /// Memory, CPU and time limits.
    pub limits: Limits,
    /// The operator's id generator.
    pub ids: Arc<dyn IdGenerator>,
    /// The broker connections lent to the adapter.
    pub drivers: DriverConnections,
}

/// What `describe` said, kept for the life of the adapter.
#[derive(Debug, Clone)]
pub struct AdapterInfo {
    /// Short name (log target `broker.<name>`).
    pub name: String,
    /// The adapter's version.
    pub version: String,
    /// The broker it maps onto.
    pub broker: String,
    /// The options `init` accepts: (name, default, doc).
    pub options: Vec<(String, String, String)>,
}

struct Shared {
    info: AdapterInfo,
    capabilities: Capabilities,
    limits: Limits,
    last_trap: Mutex<Option<String>>,
    closing: CancellationToken,
    /// Set by [`AdapterInstance::retire`]: finish what was submitted, then close.
    retiring: CancellationToken,
    /// Where calls go once this instance was retired.
    successor: std::sync::OnceLock<AdapterInstance>,
    /// Cancelled when the Store-owner task has ended.
    finished: CancellationToken,
}

/// A handle to a running adapter; clones share the instance. Dropping every handle closes it.
#[derive(Clone)]
pub struct AdapterInstance {
    jobs: mpsc::Sender<Job>,
    generations: watch::Receiver<u32>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AdapterInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterInstance")
            .field("name", &self.shared.info.name)
            .field("generation", &*self.generations.borrow())
            .finish()
    }
}

impl AdapterInstance {
    /// Instantiate `component`, run `describe` and `init`, and start its Store-owner task.
    pub async fn start(component: SharedComponent, config: InstanceConfig) -> Result<Self> {
        Self::start_at(component, config, 1).await
    }

    /// [`Self::start`] with the first generation given: a replacement of another adapter starts
    /// above that one's, so tags it minted stay stale here.
    pub async fn start_at(
        component: SharedComponent,
        config: InstanceConfig,
        generation: u32,
    ) -> Result<Self> {
        let (store, exports, info) = instantiate(&component, &config, generation, None).await?;
        let logger = TargetLogger::new(&format!("broker.{}", info.name));
        let (jobs, rx) = mpsc::channel(1024);
        let (gen_tx, generations) = watch::channel(generation);
        let shared = Arc::new(Shared {
            capabilities: component.capabilities,
            info,
            limits: config.limits.clone(),
            last_trap: Mutex::new(None),
            closing: CancellationToken::new(),
            retiring: CancellationToken::new(),
            successor: std::sync::OnceLock::new(),
            finished: CancellationToken::new(),
        });
        tokio::spawn(supervise(
            Supervisor {
                component,
                config,
                shared: shared.clone(),
                generation,
                gen_tx,
                rx,
                logger,
            },
            store,
            exports,
        ));
        Ok(Self {
            jobs,
            generations,
            shared,
        })
    }

    /// What `describe` said.
    pub fn info(&self) -> &AdapterInfo {
        &self.shared.info
    }

    /// The capabilities the component exports.
    pub fn capabilities(&self) -> Capabilities {
        self.shared.capabilities
    }

    /// The generation of the live instance: 1 for the first, + 1 per replacement.
    pub fn generation(&self) -> u32 {
        *self.generations.borrow()
    }

    /// Watch the generation change (a trap replaced the instance: re-create live handles).
    pub fn generations(&self) -> watch::Receiver<u32> {
        self.generations.clone()
    }

    /// The message of the last trap, if any.
    pub fn last_trap(&self) -> Option<String> {
        self.shared
            .last_trap
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Call `close` on the adapter and stop the instance; later calls fail with `closed`.
    pub fn close(&self) {
        self.shared.closing.cancel();
    }

    /// Whether the instance was closed.
    pub fn is_closed(&self) -> bool {
        self.shared.closing.is_cancelled()
    }

    /// Hand over to `successor`: calls already submitted here finish here, every later call goes
    /// to the successor, then this instance closes (its streams end). No call fails because of it.
    pub fn retire(&self, successor: AdapterInstance) {
        let _ = self.shared.successor.set(successor);
        self.shared.retiring.cancel();
    }

    /// Wait until the Store-owner task has ended (after a close or a retirement).
    pub async fn finished(&self) {
        self.shared.finished.cancelled().await;
    }

    /// Whether `other` is a handle to this same adapter instance.
    pub fn same(&self, other: &AdapterInstance) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Queue `job` here, or at the successor once this instance was retired.
    fn submit(&self, job: Job) -> Pin<Box<dyn Future<Output = Result<()>> + Send + '_>> {
        Box::pin(async move {
            match self.jobs.send(job).await {
                Ok(()) => Ok(()),
                Err(mpsc::error::SendError(job)) => match self.shared.successor.get() {
                    Some(successor) => successor.submit(job).await,
                    None => Err(Error::Closed("the adapter was closed".into())),
                },
            }
        })
    }

    /// Run `f` inside the instance, with the wall-clock call timeout. A trap fails this call
    /// (and every call in flight) with [`Error::Trapped`]; the instance is replaced.
    pub async fn call<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&'a Accessor<Ctx>, &'a Exports) -> CallFuture<'a, R> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let timeout = self.shared.limits.call_timeout;
        let job: Job = Box::new(move |accessor, exports| {
            Box::pin(async move {
                match tokio::time::timeout(timeout, f(accessor, exports)).await {
                    Ok(Ok(answer)) => {
                        let _ = tx.send(answer);
                        Ok(())
                    }
                    Ok(Err(trap)) => {
                        let _ = tx.send(Err(Error::Trapped(format!("{trap:#}"))));
                        Err(trap)
                    }
                    Err(_) => {
                        let _ = tx.send(Err(Error::Timeout(format!(
                            "the adapter did not answer within {timeout:?}"
                        ))));
                        Ok(())
                    }
                }
            })
        });
        self.submit(job).await?;
        match rx.await {
            Ok(answer) => answer,
            Err(_) if self.is_closed() => Err(Error::Closed("the adapter was closed".into())),
            Err(_) => Err(Error::Trapped(format!(
                "the instance trapped while this call was in flight: {}",
                self.last_trap().unwrap_or_else(|| "no message".into())
            ))),
        }
    }
}

/// Instantiate `component` in a sandboxed Store and run `describe`, without `init`: what
/// `wrpc-broker inspect` shows.
pub async fn describe(component: &SharedComponent, config: &InstanceConfig) -> Result<AdapterInfo> {
    let (_, _, info) = new_instance(component, config, None).await?;
    Ok(info)
}

/// A fresh Store with limits and the CPU slice, instantiated, its exports resolved and
/// `describe` called.
async fn new_instance(
    component: &SharedComponent,
    config: &InstanceConfig,
    logger: Option<TargetLogger>,
) -> Result<(Store<Ctx>, Exports, AdapterInfo)> {
    let load = |what: &str, e: wasmtime::Error| {
        Error::Load(format!("{}: {what}: {e:#}", component.source))
    };
    // Until `describe` names the adapter, its output goes to `broker.starting`.
    let logger = logger.unwrap_or_else(|| TargetLogger::new("broker.starting"));
    let mut store = Store::new(
        &component.engine,
        Ctx::new(
            logger,
            config.ids.clone(),
            config.drivers.clone(),
            &config.limits,
        ),
    );
    store.limiter(|ctx| &mut ctx.limits);
    let slice_ticks = (config.limits.cpu_slice.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64;
    let slice = config.limits.cpu_slice;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |mut ctx| {
        let data = ctx.data_mut();
        data.busy_ticks += 1;
        if data.busy_ticks > slice_ticks {
            return Err(wasmtime::Error::msg(format!(
                "CPU slice exhausted: the adapter ran for more than {slice:?} without returning to the host"
            )));
        }
        Ok(UpdateDeadline::Yield(1))
    });
    let instance = component
        .pre
        .instantiate_async(&mut store)
        .await
        .map_err(|e| load("instantiating", e))?;
    let exports = component
        .indices
        .load(&mut store, &instance)
        .map_err(|e| load("resolving exports", e))?;
    let described = exports
        .adapter
        .call_describe(&mut store)
        .await
        .map_err(|e| load("describe", e))?;
    let info = AdapterInfo {
        name: described.name,
        version: described.version,
        broker: described.broker,
        options: described
            .options
            .into_iter()
            .map(|o: adapter::OptionInfo| (o.name, o.default_value, o.doc))
            .collect(),
    };
    if info.name.is_empty()
        || !info
            .name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    {
        return Err(Error::Load(format!(
            "{}: describe() named the adapter {:?}: use letters, digits, `-` and `_`",
            component.source, info.name
        )));
    }
    store.data_mut().logger = TargetLogger::new(&format!("broker.{}", info.name));
    Ok((store, exports, info))
}

/// Start one instance: [`new_instance`], then `init` with the generation and options.
async fn instantiate(
    component: &SharedComponent,
    config: &InstanceConfig,
    generation: u32,
    logger: Option<TargetLogger>,
) -> Result<(Store<Ctx>, Exports, AdapterInfo)> {
    let (mut store, exports, info) = new_instance(component, config, logger).await?;
    let options = config.options.clone();
    let adapter = exports.adapter.clone();
    let init = store
        .run_concurrent(async move |accessor| {
            adapter.call_init(accessor, generation, options).await
        })
        .await
        .and_then(|r| r)
        .map_err(|e| Error::Load(format!("{}: init trapped: {e:#}", component.source)))?;
    init.map_err(|e| match Error::from(e) {
        Error::BadRequest(m) => Error::BadRequest(format!("adapter `{}` options: {m}", info.name)),
        other => other,
    })?;
    Ok((store, exports, info))
}

struct Supervisor {
    component: SharedComponent,
    config: InstanceConfig,
    shared: Arc<Shared>,
    generation: u32,
    gen_tx: watch::Sender<u32>,
    rx: mpsc::Receiver<Job>,
    logger: TargetLogger,
}

enum Exit {
    Closed,
    Trapped(String),
}

/// Serve instance after instance until the adapter is closed.
async fn supervise(sup: Supervisor, store: Store<Ctx>, exports: Exports) {
    let finished = sup.shared.finished.clone();
    serve_generations(sup, store, exports).await;
    finished.cancel();
}

async fn serve_generations(mut sup: Supervisor, mut store: Store<Ctx>, mut exports: Exports) {
    loop {
        match serve(
            &mut store,
            &exports,
            &mut sup.rx,
            &sup.shared.closing,
            &sup.shared.retiring,
        )
        .await
        {
            Exit::Closed => break,
            Exit::Trapped(message) => {
                sup.logger.log(
                    tracing::Level::ERROR,
                    &format!(
                        "generation {} trapped, starting a new instance: {message}",
                        sup.generation
                    ),
                );
                *sup.shared
                    .last_trap
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(message);
            }
        }
        drop(store);
        loop {
            if sup.shared.closing.is_cancelled() || sup.shared.retiring.is_cancelled() {
                return;
            }
            sup.generation += 1;
            match instantiate(
                &sup.component,
                &sup.config,
                sup.generation,
                Some(sup.logger),
            )
            .await
            {
                Ok((new_store, new_exports, _)) => {
                    store = new_store;
                    exports = new_exports;
                    break;
                }
                Err(e) => {
                    sup.logger.log(
                        tracing::Level::ERROR,
                        &format!("cannot start a new instance: {e}"),
                    );
                    tokio::time::sleep(RESTART_BACKOFF).await;
                }
            }
        }
        let _ = sup.gen_tx.send(sup.generation);
    }
}

/// The Store-owner loop: run jobs concurrently inside one `run_concurrent` until the adapter is
/// closed, retired (then: finish every job already queued, refuse new ones so they go to the
/// successor, and close) or the instance traps.
async fn serve(
    store: &mut Store<Ctx>,
    exports: &Exports,
    rx: &mut mpsc::Receiver<Job>,
    closing: &CancellationToken,
    retiring: &CancellationToken,
) -> Exit {
    let outcome = store
        .run_concurrent(async |accessor| -> wasmtime::Result<Exit> {
            let mut inflight = FuturesUnordered::new();
            let mut batch = Vec::with_capacity(JOBS_PER_WAKE);
            let (mut draining, mut drained) = (false, false);
            loop {
                accessor.with(|mut access| access.get().progress());
                if drained && inflight.is_empty() {
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, exports.adapter.call_close(accessor)).await;
                    return Ok(Exit::Closed);
                }
                tokio::select! {
                    biased;
                    _ = closing.cancelled() => {
                        let _ = tokio::time::timeout(CLOSE_TIMEOUT, exports.adapter.call_close(accessor)).await;
                        return Ok(Exit::Closed);
                    }
                    _ = retiring.cancelled(), if !draining => {
                        // Later submissions fail here and go to the successor.
                        rx.close();
                        draining = true;
                    }
                    Some(done) = inflight.next(), if !inflight.is_empty() => done?,
                    received = rx.recv_many(&mut batch, JOBS_PER_WAKE), if !drained => {
                        if received == 0 {
                            if draining {
                                drained = true;
                            } else {
                                // Every handle is gone: close.
                                closing.cancel();
                            }
                            continue;
                        }
                        for job in batch.drain(..) {
                            inflight.push(job(accessor, exports));
                        }
                    }
                }
            }
        })
        .await;
    match outcome {
        Ok(Ok(exit)) => exit,
        Ok(Err(e)) | Err(e) => Exit::Trapped(format!("{e:#}")),
    }
}
