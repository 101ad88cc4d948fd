//! The floor of the component boundary, and the steps from it to the host's own call, so
//! `wrpc-broker bench` can say where a trivial call's time goes on any machine:
//!
//! 1. [`floor_call`]: a plain synchronous call through a bare `Store` (no WASI, no async);
//! 2. [`concurrent_call`]: the same export through `call_concurrent` inside `run_concurrent`,
//!    on the calling task — the async component-model machinery every host call goes through;
//! 3. [`owner_task_call`]: that Store on a task of its own, each call handed over through an
//!    mpsc and answered through a oneshot — the host's Store-owner shape without its
//!    bookkeeping (budgets, call timeouts, trap reports, successors).
//!
//! The host's trivial call is step 3's shape plus that bookkeeping, except that a caller that
//! finds nobody polling the Store-owner's future polls it itself (`drive`): no hop to the
//! owner's task, which step 3 keeps as the comparison.

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use wasmtime::component::{Component, Linker, TypedFunc};
use wasmtime::{Config, Engine, Store};

use crate::bench::{Sample, timed};
use crate::bindings::types::Error as WitError;

/// The smallest component with the trivial export's signature (`parse-id: func(text: string) ->
/// result<_, error>`): it lowers the string into its memory and answers `ok`.
const FLOOR_COMPONENT: &str = r#"
(component
  (core module $m
    (memory (export "memory") 1)
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
    (func (export "parse-id") (param i32 i32) (result i32) (i32.const 0)))
  (core instance $i (instantiate $m))
  (type $error' (variant
    (case "bad-request" string) (case "gone" string) (case "unavailable" string)
    (case "refused" string) (case "timeout" string) (case "closed" string)
    (case "stale" string) (case "unsupported" string) (case "internal" string)))
  (export $error "error" (type $error'))
  (func (export "parse-id") (param "text" string) (result (result (error $error)))
    (canon lift (core func $i "parse-id") (memory (core memory $i "memory"))
      (realloc (core func $i "realloc")))))
"#;

/// The trivial export as the concurrent steps call it.
type ParseId = TypedFunc<(String,), (Result<(), WitError>,)>;

/// The floor of the boundary: the trivial export's call through a bare wasmtime `Store` on the
/// calling thread, into [`FLOOR_COMPONENT`] (no WASI, no actor, no budgets, no host machinery),
/// repeatedly for `slice`. What the host's trivial call costs reads as a ratio to this on any
/// machine.
pub fn floor_call(slice: Duration) -> anyhow::Result<Sample> {
    let engine = Engine::default();
    let component = Component::new(&engine, FLOOR_COMPONENT)?;
    let mut store = Store::new(&engine, ());
    let instance = Linker::new(&engine).instantiate(&mut store, &component)?;
    let parse_id: TypedFunc<(&str,), (Result<(), WitError>,)> =
        instance.get_typed_func(&mut store, "parse-id")?;
    let started = Instant::now();
    let mut sample = Sample::default();
    while started.elapsed() < slice {
        let t = Instant::now();
        let (answer,) = parse_id.call(&mut store, ("x:1",))?;
        std::hint::black_box(answer.is_ok());
        sample.latencies.push(t.elapsed());
        sample.ops += 1;
    }
    sample.elapsed = started.elapsed();
    Ok(sample)
}

/// A Store of [`FLOOR_COMPONENT`] on an engine configured as the host's (component-model
/// async, concurrency, epoch interruption with a deadline that never comes).
async fn concurrent_store() -> anyhow::Result<(Store<()>, ParseId)> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.wasm_component_model_async(true);
    config.concurrency_support(true);
    config.epoch_interruption(true);
    let engine = Engine::new(&config)?;
    let component = Component::new(&engine, FLOOR_COMPONENT)?;
    let mut store = Store::new(&engine, ());
    store.set_epoch_deadline(1 << 62);
    let instance = Linker::new(&engine)
        .instantiate_async(&mut store, &component)
        .await?;
    let parse_id: ParseId = instance.get_typed_func(&mut store, "parse-id")?;
    Ok((store, parse_id))
}

/// Step 2: the trivial export through `call_concurrent` inside `run_concurrent`, one call
/// after another on the calling task, for `slice`.
pub async fn concurrent_call(slice: Duration) -> anyhow::Result<Sample> {
    let (mut store, parse_id) = concurrent_store().await?;
    store
        .run_concurrent(async |accessor| {
            timed(slice, || async {
                let (answer,) = parse_id
                    .call_concurrent(accessor, ("x:1".to_string(),))
                    .await?;
                std::hint::black_box(answer.is_ok());
                Ok(1)
            })
            .await
        })
        .await?
}

/// Step 3: the Store on a task of its own that serves calls concurrently, each handed over
/// through an mpsc and answered through a oneshot; the caller makes one after another for
/// `slice`.
pub async fn owner_task_call(slice: Duration) -> anyhow::Result<Sample> {
    let (mut store, parse_id) = concurrent_store().await?;
    let (calls, mut rx) = mpsc::channel::<oneshot::Sender<bool>>(1024);
    let owner = tokio::spawn(async move {
        store
            .run_concurrent(async |accessor| {
                let mut inflight = FuturesUnordered::new();
                loop {
                    tokio::select! {
                        Some(()) = inflight.next(), if !inflight.is_empty() => {}
                        call = rx.recv() => {
                            let Some(reply) = call else { break };
                            inflight.push(async move {
                                let answer =
                                    parse_id.call_concurrent(accessor, ("x:1".to_string(),)).await;
                                let _ = reply.send(matches!(answer, Ok((Ok(()),))));
                            });
                        }
                    }
                }
            })
            .await
    });
    let sample = timed(slice, || {
        let (reply, answer) = oneshot::channel();
        let calls = &calls;
        async move {
            calls.send(reply).await?;
            std::hint::black_box(answer.await?);
            Ok(1)
        }
    })
    .await?;
    drop(calls);
    owner.await??;
    Ok(sample)
}
