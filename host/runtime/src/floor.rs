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
//!
//! Beside them, the floor of a broker round trip: [`pending_import_call`], an export that awaits
//! one import which goes pending until another task answers (as a broker connection's task
//! answers a command), against [`native_round_trip`], the same exchange awaited natively; and
//! the same with the answer fetched from an echo server over loopback TCP ([`Answerer`]), the
//! floor under a server row's ratio: a process round trip with no server work in it.

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use wasmtime::component::{Component, Instance, Linker, TypedFunc};
use wasmtime::{Engine, Store};

use crate::bench::{Sample, timed};
use crate::bindings::types::Error as WitError;
use crate::loader::engine_config;

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

/// An instance of the component in `wat` in a bare Store on an engine configured as the
/// host's (`loader::engine_config`; an epoch deadline that never comes), its imports defined
/// by `define`.
async fn host_engine_instance(
    wat: &str,
    define: impl FnOnce(&mut Linker<()>) -> wasmtime::Result<()>,
) -> anyhow::Result<(Store<()>, Instance)> {
    let engine = Engine::new(&engine_config())?;
    let component = Component::new(&engine, wat)?;
    let mut linker = Linker::new(&engine);
    define(&mut linker)?;
    let mut store = Store::new(&engine, ());
    store.set_epoch_deadline(1 << 62);
    let instance = linker.instantiate_async(&mut store, &component).await?;
    Ok((store, instance))
}

/// A Store of [`FLOOR_COMPONENT`] on an engine configured as the host's.
async fn concurrent_store() -> anyhow::Result<(Store<()>, ParseId)> {
    let (mut store, instance) = host_engine_instance(FLOOR_COMPONENT, |_| Ok(())).await?;
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

/// The smallest component whose export awaits an import that may go pending, in the
/// callback ABI wit-bindgen's async exports use: `round-trip: async func(x: u32) -> u32`
/// calls `wait: async func(x: u32) -> u32` (lowered async, its result at address 16) and, once
/// the subtask has returned, hands on what it got; `waits: func() -> u32` counts the calls whose
/// import went pending. One call at a time (one result slot).
const PENDING_COMPONENT: &str = r#"
(component
  (import "wait" (func $wait async (param "x" u32) (result u32)))
  (core module $Memory (memory (export "mem") 1))
  (core instance $memory (instantiate $Memory))
  (alias core export $memory "mem" (core memory $mem))
  (core module $M
    (import "" "mem" (memory 1))
    (import "" "task.return" (func $task.return (param i32)))
    (import "" "waitable.join" (func $waitable.join (param i32 i32)))
    (import "" "waitable-set.new" (func $waitable-set.new (result i32)))
    (import "" "subtask.drop" (func $subtask.drop (param i32)))
    (import "" "wait" (func $wait (param i32 i32) (result i32)))
    (global $set (mut i32) (i32.const 0))
    (global $waits (mut i32) (i32.const 0))
    (func (export "waits") (result i32) (global.get $waits))
    (func (export "round-trip") (param $x i32) (result i32)
      (local $status i32)
      (local.set $status (call $wait (local.get $x) (i32.const 16)))
      (if (i32.eq (i32.and (local.get $status) (i32.const 0xf)) (i32.const 2 (; RETURNED ;)))
        (then
          (call $task.return (i32.load (i32.const 16)))
          (return (i32.const 0 (; EXIT ;)))))
      (global.set $waits (i32.add (global.get $waits) (i32.const 1)))
      (if (i32.eqz (global.get $set))
        (then (global.set $set (call $waitable-set.new))))
      (call $waitable.join (i32.shr_u (local.get $status) (i32.const 4)) (global.get $set))
      (i32.or (i32.const 2 (; WAIT ;)) (i32.shl (global.get $set) (i32.const 4))))
    (func (export "callback") (param $event i32) (param $subtask i32) (param $state i32) (result i32)
      (if (i32.ne (local.get $event) (i32.const 1 (; SUBTASK ;))) (then unreachable))
      (if (i32.ne (local.get $state) (i32.const 2 (; RETURNED ;)))
        (then (return (i32.or (i32.const 2 (; WAIT ;)) (i32.shl (global.get $set) (i32.const 4))))))
      (call $subtask.drop (local.get $subtask))
      (call $task.return (i32.load (i32.const 16)))
      (i32.const 0 (; EXIT ;))))
  (core func $task.return (canon task.return (result u32)))
  (core func $waitable.join (canon waitable.join))
  (core func $waitable-set.new (canon waitable-set.new))
  (core func $subtask.drop (canon subtask.drop))
  (core func $wait' (canon lower (func $wait) async (memory $mem)))
  (core instance $i (instantiate $M (with "" (instance
    (export "mem" (memory $mem))
    (export "task.return" (func $task.return))
    (export "waitable.join" (func $waitable.join))
    (export "waitable-set.new" (func $waitable-set.new))
    (export "subtask.drop" (func $subtask.drop))
    (export "wait" (func $wait'))))))
  (func (export "round-trip") async (param "x" u32) (result u32)
    (canon lift (core func $i "round-trip") async (callback (core func $i "callback"))))
  (func (export "waits") (result u32) (canon lift (core func $i "waits"))))
"#;

/// Who answers a floor round trip's question.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answerer {
    /// Another task, at once, without I/O (as a broker connection's task hands on a reply).
    Task,
    /// An echo server on a thread of its own, over a loopback TCP connection that another
    /// task writes and reads (as a broker client's connection task does): a server's
    /// stand-in that does no work, so the row is a process round trip and nothing else.
    Loopback,
}

/// The other end of a round trip: a task that answers each question (`x + 1`), itself or
/// through a loopback echo server ([`Answerer`]).
#[derive(Clone)]
struct Peer(mpsc::UnboundedSender<(u32, oneshot::Sender<u32>)>);

impl Peer {
    /// Start the answering task (and the echo server it asks, for [`Answerer::Loopback`]); both
    /// end when every `Peer` is dropped.
    async fn start(answerer: Answerer) -> anyhow::Result<Self> {
        let (questions, mut rx) = mpsc::unbounded_channel::<(u32, oneshot::Sender<u32>)>();
        match answerer {
            Answerer::Task => {
                tokio::spawn(async move {
                    while let Some((x, answer)) = rx.recv().await {
                        let _ = answer.send(x + 1);
                    }
                });
            }
            Answerer::Loopback => {
                let mut connection = tokio::net::TcpStream::connect(echo_server()?).await?;
                connection.set_nodelay(true)?;
                tokio::spawn(async move {
                    while let Some((x, answer)) = rx.recv().await {
                        let mut reply = [0; 4];
                        if connection.write_all(&x.to_le_bytes()).await.is_err()
                            || connection.read_exact(&mut reply).await.is_err()
                        {
                            break;
                        }
                        let _ = answer.send(u32::from_le_bytes(reply));
                    }
                });
            }
        }
        Ok(Self(questions))
    }

    /// Ask `x` and wait for the answer (`x + 1`).
    async fn ask(&self, x: u32) -> anyhow::Result<u32> {
        let (answer, rx) = oneshot::channel();
        self.0
            .send((x, answer))
            .map_err(|_| anyhow::anyhow!("the peer task ended"))?;
        Ok(rx.await?)
    }
}

/// A loopback TCP server on a thread of its own that answers each little-endian `u32` of its
/// one connection with that number plus one, until the connection closes.
fn echo_server() -> std::io::Result<std::net::SocketAddr> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    std::thread::Builder::new()
        .name("floor-echo".into())
        .spawn(move || {
            let Ok((mut connection, _)) = listener.accept() else {
                return;
            };
            let _ = connection.set_nodelay(true);
            let mut x = [0; 4];
            while connection.read_exact(&mut x).is_ok() {
                let answer = u32::from_le_bytes(x).wrapping_add(1);
                if connection.write_all(&answer.to_le_bytes()).is_err() {
                    break;
                }
            }
        })?;
    Ok(address)
}

/// One round trip to another task through [`PENDING_COMPONENT`]: its export called through
/// `call_concurrent` on the calling task (a bare Store, the engine configured as the host's),
/// its `wait` import a host function that goes pending until the peer answers (`answerer`).
/// Repeated for `slice`.
pub async fn pending_import_call(slice: Duration, answerer: Answerer) -> anyhow::Result<Sample> {
    Ok(pending_round_trips(slice, answerer).await?.0)
}

/// [`pending_import_call`], with how many of its calls found the import pending.
async fn pending_round_trips(slice: Duration, answerer: Answerer) -> anyhow::Result<(Sample, u32)> {
    let peer = Peer::start(answerer).await?;
    let (mut store, instance) = host_engine_instance(PENDING_COMPONENT, |linker| {
        linker
            .root()
            .func_wrap_concurrent("wait", move |_accessor, (x,): (u32,)| {
                let peer = peer.clone();
                Box::pin(async move {
                    let answer = peer.ask(x).await;
                    Ok((answer.map_err(|e| wasmtime::Error::msg(e.to_string()))?,))
                })
            })
    })
    .await?;
    let round_trip: TypedFunc<(u32,), (u32,)> =
        instance.get_typed_func(&mut store, "round-trip")?;
    let waits: TypedFunc<(), (u32,)> = instance.get_typed_func(&mut store, "waits")?;
    let sample = store
        .run_concurrent(async |accessor| {
            timed(slice, || async {
                let (answer,) = round_trip.call_concurrent(accessor, (41,)).await?;
                anyhow::ensure!(answer == 42, "the round trip answered {answer}");
                Ok(1)
            })
            .await
        })
        .await??;
    let (waits,) = waits.call_async(&mut store, ()).await?;
    Ok((sample, waits))
}

/// The native side of [`pending_import_call`]: the same question to the same kind of peer,
/// awaited directly, for `slice`.
pub async fn native_round_trip(slice: Duration, answerer: Answerer) -> anyhow::Result<Sample> {
    let peer = Peer::start(answerer).await?;
    timed(slice, || async {
        let answer = peer.ask(41).await?;
        anyhow::ensure!(answer == 42, "the round trip answered {answer}");
        Ok(1)
    })
    .await
}

/// `op` repeatedly for `slice`, each time right after a round trip to a loopback echo server
/// awaited natively: `op` in a broker operation's rhythm, its code and data gone cold while the
/// process waited. With an `op` that does nothing, the native side of such a row.
pub async fn after_loopback<F, Fut>(slice: Duration, mut op: F) -> anyhow::Result<Sample>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let peer = Peer::start(Answerer::Loopback).await?;
    let peer = &peer;
    timed(slice, || {
        let op = op();
        async move {
            peer.ask(1).await?;
            op.await?;
            Ok(1)
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call of the pending floor finds its import pending (on one thread the peer task
    /// cannot answer before the import's first poll) and answers the peer's `x + 1`
    /// (`pending_round_trips` checks each answer), whoever the peer asks.
    #[tokio::test]
    async fn every_pending_floor_call_waits_for_the_peer() {
        for answerer in [Answerer::Task, Answerer::Loopback] {
            let (sample, waits) = pending_round_trips(Duration::from_millis(50), answerer)
                .await
                .unwrap();
            assert!(sample.ops > 0, "{answerer:?}");
            assert_eq!(u64::from(waits), sample.ops, "{answerer:?}");
            let native = native_round_trip(Duration::from_millis(50), answerer)
                .await
                .unwrap();
            assert!(native.ops > 0, "{answerer:?}");
        }
    }

    /// Each step of `after_loopback` runs the operation once, after its round trip.
    #[tokio::test]
    async fn after_loopback_runs_the_operation_once_a_round_trip() {
        let ran = std::cell::Cell::new(0u64);
        let sample = after_loopback(Duration::from_millis(50), || {
            ran.set(ran.get() + 1);
            async { Ok(()) }
        })
        .await
        .unwrap();
        assert!(sample.ops > 0);
        assert_eq!(ran.get(), sample.ops);
    }
}
