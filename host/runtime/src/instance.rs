//! A running adapter: a handle ([`AdapterInstance`]) to the Store-owner that serves its
//! instances (see `supervise`), and calls into it. The owner's future has a task of its own,
//! and a caller that finds nobody polling it polls it itself (see `drive`). Every call has a
//! wall clock that fires on the caller's side, so it answers `timeout` even while the guest
//! holds the instance; a call that was in flight when its instance trapped answers with that
//! trap's report.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use wasmtime::component::Accessor;

use super::drive::Owner;
use super::lent::DriverConnections;
use super::loader::{Capabilities, Exports, SharedComponent};
use super::output::InstanceLog;
use super::sandbox::{Ctx, Limits};
use super::start::instantiate;
use super::supervise::{Supervisor, supervise};
use super::trace::TargetLogger;
use crate::error::{Error, Result};
use crate::ids::IdGenerator;

pub use super::start::describe;

/// The future of one job on the Store-owner task. `Err` means the instance is broken (a trap).
pub type JobFuture<'a> = Pin<Box<dyn Future<Output = wasmtime::Result<()>> + Send + 'a>>;
/// One unit of work run inside the instance's `run_concurrent`.
pub type Job = Box<dyn for<'a> FnOnce(&'a Accessor<Ctx>, &'a Exports) -> JobFuture<'a> + Send>;
/// What a call computes: `Err` from wasmtime (a trap) or the call's own result.
pub type CallFuture<'a, R> = Pin<Box<dyn Future<Output = wasmtime::Result<Result<R>>> + Send + 'a>>;

/// How long a call that was in flight when its instance stopped waits for the trap's report.
const REPORT_WAIT: Duration = Duration::from_secs(5);
/// How many trap reports are kept (by generation) for the calls that were in flight.
const TRAPS_KEPT: usize = 16;

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

/// The trap reports of the last generations that trapped.
#[derive(Debug, Default, Clone)]
pub(crate) struct TrapLog {
    recent: std::collections::VecDeque<(u32, String)>,
}

impl TrapLog {
    fn of(&self, generation: u32) -> Option<&str> {
        self.recent
            .iter()
            .find(|(g, _)| *g == generation)
            .map(|(_, m)| m.as_str())
    }
}

/// What the handles and the Store-owner task share.
pub(crate) struct Shared {
    info: AdapterInfo,
    capabilities: Capabilities,
    /// Append calls of one topic kept in flight at once (its drivers' fewest).
    appends_in_flight: usize,
    limits: Limits,
    traps: watch::Sender<TrapLog>,
    /// The memory and tables the live instance holds (its limiter's count).
    memory: Mutex<Arc<AtomicUsize>>,
    pub(crate) closing: CancellationToken,
    /// Set by [`AdapterInstance::retire`]: finish what was submitted, then close.
    pub(crate) retiring: CancellationToken,
    /// Where calls go once this instance was retired.
    successor: std::sync::OnceLock<AdapterInstance>,
    /// Cancelled when the Store-owner task has ended.
    pub(crate) finished: CancellationToken,
}

impl Shared {
    /// Generation `generation` trapped with `message`: tell the calls that were in flight.
    pub(crate) fn record_trap(&self, generation: u32, message: String) {
        self.traps.send_modify(|log| {
            if log.recent.len() == TRAPS_KEPT {
                log.recent.pop_front();
            }
            log.recent.push_back((generation, message));
        });
    }

    /// A new instance is live: its limiter's count.
    pub(crate) fn publish_memory(&self, total: Arc<AtomicUsize>) {
        *self.memory.lock().unwrap_or_else(|e| e.into_inner()) = total;
    }
}

/// A handle to a running adapter; clones share the instance. Dropping every handle closes it.
#[derive(Clone)]
pub struct AdapterInstance {
    jobs: mpsc::Sender<Job>,
    /// The Store-owner's future, polled by its driver task or by a caller that submits.
    owner: Arc<Owner>,
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

/// What the caller of a job hears.
enum Answer<R> {
    /// The call's own answer.
    Done(Result<R>),
    /// The instance of this generation stopped (a trap, or it was dropped) with the call in
    /// flight.
    Stopped(u32),
}

/// A job's side of its caller's answer: dropped unanswered (its instance stopped with it in
/// flight), it tells the caller which generation had it.
struct Reply<R> {
    tx: Option<oneshot::Sender<Answer<R>>>,
    generation: u32,
}

impl<R> Reply<R> {
    fn send(mut self, answer: Answer<R>) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(answer);
        }
    }
}

impl<R> Drop for Reply<R> {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Answer::Stopped(self.generation));
        }
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
        let log = InstanceLog::unnamed();
        let (store, exports, info) = instantiate(&component, &config, generation, log).await?;
        let logger = TargetLogger::new(&format!("broker.{}", info.name));
        let (jobs, rx) = mpsc::channel(1024);
        let (gen_tx, generations) = watch::channel(generation);
        let shared = Arc::new(Shared {
            capabilities: component.capabilities,
            appends_in_flight: config.drivers.appends_in_flight(),
            info,
            limits: config.limits.clone(),
            traps: watch::channel(TrapLog::default()).0,
            memory: Mutex::new(store.data().limiter.total()),
            closing: CancellationToken::new(),
            retiring: CancellationToken::new(),
            successor: std::sync::OnceLock::new(),
            finished: CancellationToken::new(),
        });
        let owner = Owner::spawn(|cover| {
            let sup = Supervisor {
                component,
                config,
                shared: shared.clone(),
                generation,
                gen_tx,
                rx,
                logger,
                cover,
            };
            Box::pin(supervise(sup, store, exports))
        });
        Ok(Self {
            jobs,
            owner,
            generations,
            shared,
        })
    }

    /// What `describe` said.
    pub fn info(&self) -> &AdapterInfo {
        &self.shared.info
    }

    /// How many append calls of one topic the host keeps in flight at once on this adapter
    /// (the fewest its lent drivers allow).
    pub fn appends_in_flight(&self) -> usize {
        self.shared.appends_in_flight
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

    /// The report of the last trap, if any: its cause on one line.
    pub fn last_trap(&self) -> Option<String> {
        let traps = self.shared.traps.borrow();
        traps.recent.back().map(|(_, message)| message.clone())
    }

    /// The bytes of linear memory and tables the live instance holds (what its memory cap,
    /// `Limits::memory_bytes`, counts).
    pub fn memory_bytes(&self) -> usize {
        let memory = self.shared.memory.lock().unwrap_or_else(|e| e.into_inner());
        memory.load(Ordering::Relaxed)
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

    /// The Store-owner of this instance, for a task that waits on what the instance produces
    /// to [`Owner::help`] (holding it does not keep the instance open).
    pub fn owner(&self) -> Arc<Owner> {
        self.owner.clone()
    }

    /// Queue `job` here, or at the successor once this instance was retired.
    async fn submit(&self, job: Job) -> Result<()> {
        match self.submit_here(job) {
            Ok(()) => Ok(()),
            Err(job) => self.submit_queued(job).await,
        }
    }

    /// Nobody polls the Store-owner now: hand `job` over and poll it on this task, so a call
    /// that needs nothing else is answered here, without a hop to another task. `Err` gives the
    /// job back when another task polls the owner (or the channel is full or closed).
    fn submit_here(&self, job: Job) -> std::result::Result<(), Job> {
        let Some(held) = self.owner.hold() else {
            return Err(job);
        };
        let handed = self.jobs.try_send(job);
        drop(held);
        handed.map_err(|(TrySendError::Full(job) | TrySendError::Closed(job))| job)
    }

    /// Queue `job` for the owner (waiting while the channel is full); once this instance was
    /// retired, at the successor.
    fn submit_queued(&self, job: Job) -> Pin<Box<dyn Future<Output = Result<()>> + Send + '_>> {
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

    /// Run `f` inside the instance, within the wall-clock call timeout (counted from now, and
    /// answered on this side: it fires even while the guest holds the instance). A trap fails
    /// this call (and every call in flight) with [`Error::Trapped`] and the trap's report; the
    /// instance is replaced.
    pub async fn call<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&'a Accessor<Ctx>, &'a Exports) -> CallFuture<'a, R> + Send + 'static,
    {
        let timeout = self.shared.limits.call_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let timed_out =
            move || Error::Timeout(format!("the adapter did not answer within {timeout:?}"));
        let (tx, mut rx) = oneshot::channel();
        let job: Job = Box::new(move |accessor, exports| {
            let generation = accessor.with(|mut access| access.get().generation);
            let mut reply = Reply {
                tx: Some(tx),
                generation,
            };
            Box::pin(async move {
                let Some(tx) = reply.tx.as_mut() else {
                    return Ok(());
                };
                // The caller's clock is the call's wall clock: once it fired (or the caller
                // went away) the receiver is gone, and this stops waiting for the guest.
                let answer = tokio::select! {
                    biased;
                    _ = tx.closed() => None,
                    answer = f(accessor, exports) => Some(answer),
                };
                match answer {
                    Some(Ok(answer)) => {
                        reply.send(Answer::Done(answer));
                        Ok(())
                    }
                    // The supervisor reports the trap to every call that was in flight.
                    Some(Err(trap)) => Err(trap),
                    None => Ok(()),
                }
            })
        });
        // Most calls into an idle instance are answered right here, within this task's poll of
        // the owner: those need no timer.
        let queued = match self.submit_here(job) {
            Ok(()) => match (&mut rx).now_or_never() {
                Some(got) => return self.answered(got).await,
                None => None,
            },
            Err(job) => Some(job),
        };
        let answer = tokio::time::timeout_at(deadline, async {
            if let Some(job) = queued {
                self.submit_queued(job).await?;
            }
            Ok(rx.await)
        })
        .await;
        match answer {
            Err(_) => Err(timed_out()),
            Ok(Err(e)) => Err(e),
            Ok(Ok(got)) => self.answered(got).await,
        }
    }

    /// What a call answers, given what its job sent back.
    async fn answered<R>(
        &self,
        got: std::result::Result<Answer<R>, oneshot::error::RecvError>,
    ) -> Result<R> {
        match got {
            Ok(Answer::Done(answer)) => answer,
            Ok(Answer::Stopped(generation)) => self.stopped_in_flight(generation).await,
            // The job was dropped before any instance took it.
            Err(_) => self.stopped_in_flight(0).await,
        }
    }

    /// The answer of a call whose instance (generation `generation`; 0: none took it) stopped
    /// while it was in flight.
    async fn stopped_in_flight<R>(&self, generation: u32) -> Result<R> {
        if generation == 0 || self.is_closed() {
            return Err(Error::Closed("the adapter was closed".into()));
        }
        let mut traps = self.shared.traps.subscribe();
        let reported = tokio::time::timeout(
            REPORT_WAIT,
            traps.wait_for(|log| log.of(generation).is_some()),
        )
        .await;
        if let Ok(Ok(log)) = reported {
            let message = log.of(generation).unwrap_or_default();
            return Err(Error::Trapped(format!(
                "generation {generation} trapped while this call was in flight: {message}"
            )));
        }
        if self.is_closed() {
            return Err(Error::Closed("the adapter was closed".into()));
        }
        Err(Error::Trapped(format!(
            "generation {generation} stopped while this call was in flight, and no trap was \
             reported within {REPORT_WAIT:?}"
        )))
    }
}
