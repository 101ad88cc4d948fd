//! The Store-owner task of an adapter: it serves one instance after another. Each instance sits
//! in `run_concurrent` for its life, draining the request channel with `recv_many` so that many
//! calls are in flight inside it at once. A trap ends the instance: the supervisor reports it
//! (one line at ERROR, the wasm backtrace at DEBUG, and to every call that was in flight), drops
//! the Store and starts the next generation. Closing gives the adapter's `close` its time, then
//! drops the Store whatever the guest is doing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, watch};
use wasmtime::Store;

use super::budget;
use super::drive::Cover;
use super::instance::{InstanceConfig, Job, Shared};
use super::loader::{Exports, SharedComponent};
use super::output::InstanceLog;
use super::sandbox::Ctx;
use super::start::instantiate;
use super::trace::TargetLogger;
use super::trap::{self, TrapReport};

/// How many queued requests the owner takes per wake-up.
const JOBS_PER_WAKE: usize = 64;
/// The most `close` may take (less when the call timeout is shorter).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Past the close timeout, how long before the Store is dropped with the guest still in it.
const DROP_GRACE: Duration = Duration::from_millis(500);
/// Pause between attempts to start a replacement instance that failed to start.
const RESTART_BACKOFF: Duration = Duration::from_millis(200);

/// What the task needs to start and replace instances.
pub(crate) struct Supervisor {
    pub(crate) component: SharedComponent,
    pub(crate) config: InstanceConfig,
    pub(crate) shared: Arc<Shared>,
    pub(crate) generation: u32,
    pub(crate) gen_tx: watch::Sender<u32>,
    pub(crate) rx: mpsc::Receiver<Job>,
    pub(crate) logger: TargetLogger,
    /// Marks where a poll of the serving instance starts (see [`Cover`]).
    pub(crate) cover: Cover,
}

/// What the owner is told while it serves.
enum Signal {
    /// The adapter is closed.
    Close,
    /// The adapter is retired: finish what was submitted, then close.
    Retire,
}

enum Exit {
    Closed,
    Trapped(TrapReport),
}

/// Serve instance after instance until the adapter is closed.
pub(crate) async fn supervise(sup: Supervisor, store: Store<Ctx>, exports: Exports) {
    let finished = sup.shared.finished.clone();
    serve_generations(sup, store, exports).await;
    finished.cancel();
}

fn close_timeout(sup: &Supervisor) -> Duration {
    CLOSE_TIMEOUT.min(sup.config.limits.call_timeout)
}

async fn serve_generations(mut sup: Supervisor, mut store: Store<Ctx>, mut exports: Exports) {
    loop {
        sup.shared.publish_memory(store.data().limiter.total());
        let close_timeout = close_timeout(&sup);
        match serve(&mut store, &exports, &mut sup, close_timeout).await {
            Exit::Closed => break,
            Exit::Trapped(report) => {
                if let Some(backtrace) = &report.backtrace {
                    sup.logger.log(
                        tracing::Level::DEBUG,
                        &format!("generation {} trapped at: {backtrace}", sup.generation),
                    );
                }
                sup.logger.log(
                    tracing::Level::ERROR,
                    &format!(
                        "generation {} trapped, starting a new instance: {}",
                        sup.generation, report.message
                    ),
                );
                sup.shared.record_trap(sup.generation, report.message);
            }
        }
        drop(store);
        loop {
            if sup.shared.closing.is_cancelled() || sup.shared.retiring.is_cancelled() {
                return;
            }
            sup.generation += 1;
            let log = InstanceLog::named(sup.logger);
            let started = tokio::select! {
                started = instantiate(&sup.component, &sup.config, sup.generation, log) => started,
                _ = sup.shared.closing.cancelled() => return,
            };
            match started {
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

/// One instance's life: [`serve_loop`] inside `run_concurrent`, until closed or trapped. Once
/// closing, the instance gets the close timeout (plus a grace), then is dropped as it is: a
/// guest that holds it yields to the runtime every tick, so this fires even then.
async fn serve(
    store: &mut Store<Ctx>,
    exports: &Exports,
    sup: &mut Supervisor,
    close_timeout: Duration,
) -> Exit {
    let (rx, shared, cover) = (&mut sup.rx, &*sup.shared, &sup.cover);
    let outcome = {
        let run = store.run_concurrent(async |accessor| -> wasmtime::Result<Exit> {
            let serving = serve_loop(accessor, exports, rx, shared, close_timeout);
            // wasmtime polls this first in each turn of its loop, then its own futures and
            // work; the select below polls the kill timer after it.
            cover.polling(budget::heartbeat(accessor, serving)).await
        });
        let kill = async {
            shared.closing.cancelled().await;
            tokio::time::sleep(close_timeout + DROP_GRACE).await;
        };
        tokio::select! {
            biased;
            outcome = run => Some(outcome),
            _ = kill => None,
        }
    };
    match outcome {
        Some(Ok(Ok(exit))) => exit,
        Some(Ok(Err(e)) | Err(e)) => {
            Exit::Trapped(trap::report(&e, &store.data().log.stderr_tail()))
        }
        None => {
            store.data().log.log(
                tracing::Level::WARN,
                &format!(
                    "the adapter did not stop within {:?} of being closed: its instance was dropped",
                    close_timeout + DROP_GRACE
                ),
            );
            Exit::Closed
        }
    }
}

/// Run jobs concurrently until the adapter is closed, retired (then: finish every job already
/// queued, refuse new ones so they go to the successor, and close) or the instance traps.
async fn serve_loop(
    accessor: &wasmtime::component::Accessor<Ctx>,
    exports: &Exports,
    rx: &mut mpsc::Receiver<Job>,
    shared: &Shared,
    close_timeout: Duration,
) -> wasmtime::Result<Exit> {
    let mut inflight = FuturesUnordered::new();
    let mut batch = Vec::with_capacity(JOBS_PER_WAKE);
    let (mut draining, mut drained) = (false, false);
    let close = async || {
        let _ = tokio::time::timeout(close_timeout, exports.adapter.call_close(accessor)).await;
        Ok(Exit::Closed)
    };
    // Made once, not per turn of the loop (each new one registers with its token, a lock), and
    // polled only when woken: every turn polling both tokens cost a trivial call ≈ 6 %.
    let mut signals: FuturesUnordered<Pin<Box<dyn Future<Output = Signal> + Send + '_>>> =
        FuturesUnordered::new();
    signals.push(Box::pin(async {
        shared.closing.cancelled().await;
        Signal::Close
    }));
    signals.push(Box::pin(async {
        shared.retiring.cancelled().await;
        Signal::Retire
    }));
    loop {
        if drained && inflight.is_empty() {
            return close().await;
        }
        tokio::select! {
            biased;
            Some(signal) = signals.next() => match signal {
                Signal::Close => return close().await,
                Signal::Retire => {
                    // Later submissions fail here and go to the successor.
                    rx.close();
                    draining = true;
                }
            },
            Some(done) = inflight.next(), if !inflight.is_empty() => done?,
            received = rx.recv_many(&mut batch, JOBS_PER_WAKE), if !drained => {
                if received == 0 {
                    if draining {
                        drained = true;
                    } else {
                        // Every handle is gone: close.
                        shared.closing.cancel();
                    }
                    continue;
                }
                for job in batch.drain(..) {
                    inflight.push(job(accessor, exports));
                }
            }
        }
    }
}
