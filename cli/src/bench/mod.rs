//! `wrpc-broker bench`: each operation through the adapter component and the same work done
//! natively on the broker, alternating in one run, with ops/s, p50, p99 and the ratio.
//!
//! The native side is each broker's own (its driver's [`NativeBench`], in `adapters/<name>/driver`):
//! for memory the `wrpc:memory` store called directly, for a server its own client, issuing
//! what the adapter issues. Speed is measured here, never asserted in a test.

mod extras;
pub mod scale;
pub mod stats;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use wrpc_broker::{AppendOptions, Broker, ConsumeOptions, ListenOptions, ProduceOptions, ReadFrom};

use extras::{load_times, swap_pause};
use stats::Row;
use wrpc_broker::runtime::bench::{
    APPEND_BATCH, CATCH_UP, FAN_OUT_PAYLOADS, NativeBench, QUEUE_BATCH, Sample, Tally, Workload,
    fan_out_round, joined, timed, unique,
};
use wrpc_broker::runtime::floor::{
    Answerer, after_loopback, concurrent_call, floor_call, native_round_trip, owner_task_call,
    pending_import_call,
};

pub use extras::{Extras, load_table, swap_table};

/// What to benchmark and for how long.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The broker URL (`memory://` by default).
    pub broker: String,
    /// An adapter component file instead of the one embedded for the broker.
    pub adapter: Option<PathBuf>,
    /// Payload size in bytes.
    pub size: usize,
    /// Time spent on each operation (split between the two sides, alternating).
    pub duration: Duration,
    /// Counts for the scale rows (none: no scale rows).
    pub scale: Vec<usize>,
    /// Only the rows whose operation contains one of these (none: every row, and the swap and
    /// load tables).
    pub only: Vec<String>,
}

impl BenchConfig {
    /// Whether the row `operation` is measured.
    fn wants(&self, operation: &str) -> bool {
        self.only.is_empty()
            || self
                .only
                .iter()
                .any(|word| operation.contains(word.as_str()))
    }
}

/// Rounds per operation: component, native, component, native, …
const ROUNDS: u32 = 3;

/// Two host instances on one broker, and the native side of that broker.
pub struct Setup {
    /// The first host instance.
    pub a: Broker,
    /// The second host instance (request/reply across instances).
    pub b: Broker,
    /// The broker's native side, when its driver has one.
    pub native: Option<Box<dyn NativeBench>>,
    /// Payload and time per half-round, the same on both sides.
    pub work: Workload,
}

async fn open(config: &BenchConfig, url: &str) -> anyhow::Result<Broker> {
    let mut builder = Broker::builder().url(url)?;
    if let Some(adapter) = &config.adapter {
        builder = builder.component_file(adapter);
    }
    Ok(builder.open().await?)
}

/// Run every operation and return the rows, printing progress to stderr.
pub async fn run(config: &BenchConfig) -> anyhow::Result<(Vec<Row>, Extras)> {
    // Both instances and the native side on one broker (a named store on memory).
    let driver = wrpc_broker::drivers::for_url(&config.broker)?;
    let url = driver.shared_url(&config.broker);
    let connection = driver.connect(&url).await?;
    let setup = Setup {
        a: open(config, &url).await?,
        b: open(config, &url).await?,
        native: driver.native_bench(&url, &connection).await?,
        work: Workload {
            payload: vec![b'x'; config.size],
            slice: config.duration / (2 * ROUNDS),
        },
    };
    let mut rows = Vec::new();
    // A row of a capability the adapter does not export is left out, saying so.
    let exports = setup.a.capabilities();
    macro_rules! measure {
        ($name:expr, $unit:expr, $component:expr, |$n:ident| $native:expr) => {
            measure!(true, "", $name, $unit, $component, |$n| $native)
        };
        ($exported:expr, $capability:expr, $name:expr, $unit:expr, $component:expr, |$n:ident| $native:expr) => {{
            if !config.wants(&$name) {
                // Not asked for (`--only`).
            } else if !$exported {
                eprintln!(
                    "bench: {}: skipped, the adapter exports no {}",
                    $name, $capability
                );
            } else {
                eprintln!("bench: {}", $name);
                let mut row = Row {
                    operation: $name.to_string(),
                    unit: $unit,
                    component: Sample::default(),
                    native: None,
                };
                for _ in 0..ROUNDS {
                    row.component.merge($component.await?);
                    if let Some($n) = &setup.native
                        && let Some(sample) = $native.await?
                    {
                        row.native.get_or_insert_with(Sample::default).merge(sample);
                    }
                }
                rows.push(row);
            }
        }};
    }
    // Its native side is the floor: the same call through a bare wasmtime Store.
    measure!(
        "trivial export call vs bare wasmtime floor",
        "calls",
        trivial_call(&setup),
        |_n| async { floor_call(setup.work.slice).map(Some) }
    );
    // The steps between the floor and the host's call (`runtime::floor`), each against the one
    // before it: where a trivial call's time goes.
    measure!(
        "floor step: call_concurrent vs a plain call",
        "calls",
        concurrent_call(setup.work.slice),
        |_n| async { floor_call(setup.work.slice).map(Some) }
    );
    measure!(
        "floor step: an owner task vs the caller's",
        "calls",
        owner_task_call(setup.work.slice),
        |_n| async { concurrent_call(setup.work.slice).await.map(Some) }
    );
    measure!(
        "trivial export call vs the owner-task step",
        "calls",
        trivial_call(&setup),
        |_n| async { owner_task_call(setup.work.slice).await.map(Some) }
    );
    // The floor of a broker round trip: an import that goes pending until another task answers
    // (and that task asks a loopback echo server: the floor under a server row's ratio), in a
    // bare Store, against the same exchange awaited natively.
    for (name, answerer) in [
        ("floor: a pending import vs a native await", Answerer::Task),
        (
            "floor: a pending import over loopback TCP",
            Answerer::Loopback,
        ),
    ] {
        measure!(
            name,
            "round trips",
            pending_import_call(setup.work.slice, answerer),
            |_n| async {
                native_round_trip(setup.work.slice, answerer)
                    .await
                    .map(Some)
            }
        );
    }
    // The host's trivial call in a broker operation's rhythm: each after a loopback round trip
    // (its native side: the round trip alone), so what the call costs cold reads beside what
    // it costs back to back.
    measure!(
        "trivial export call after a loopback round trip",
        "calls",
        after_loopback(setup.work.slice, || async {
            let _ = setup.a.adapter().log_parse_id("x:1".into()).await;
            Ok(())
        }),
        |_n| async {
            after_loopback(setup.work.slice, || async { Ok(()) })
                .await
                .map(Some)
        }
    );
    measure!(
        exports.log,
        "log",
        "log append, 1 in flight",
        "ops",
        log_append(&setup, 1),
        |n| n.log_append(&setup.work, 1)
    );
    measure!(
        exports.log,
        "log",
        "log append, 64 in flight",
        "ops",
        log_append(&setup, 64),
        |n| n.log_append(&setup.work, 64)
    );
    measure!(
        exports.log,
        "log",
        format!("log append, batches of {APPEND_BATCH}"),
        "entries",
        log_append_batch(&setup),
        |n| n.log_append_batch(&setup.work)
    );
    measure!(
        exports.log,
        "log",
        "log read, catch-up 10k",
        "entries",
        log_catch_up(&setup),
        |n| n.log_catch_up(&setup.work)
    );
    measure!(
        exports.log,
        "log",
        "log read, live (append→read)",
        "entries",
        log_live(&setup),
        |n| n.log_live(&setup.work)
    );
    for prefetch in [1u32, 64] {
        measure!(
            exports.queue,
            "queue",
            format!("queue produce+consume+ack, prefetch {prefetch}"),
            "msgs",
            queue_round_trip(&setup, prefetch),
            |n| n.queue_round_trip(&setup.work, prefetch)
        );
    }
    measure!(
        exports.direct,
        "direct",
        "direct request/reply (2 instances)",
        "reqs",
        request_reply(&setup),
        |n| n.request_reply(&setup.work)
    );
    for subscribers in [1usize, 1000] {
        measure!(
            exports.backplane,
            "backplane",
            format!("backplane publish → {subscribers} local subscribers"),
            "deliveries",
            fan_out(&setup, subscribers),
            |n| n.fan_out(&setup.work, subscribers)
        );
    }
    let (mut swap, mut load) = (None, None);
    if config.only.is_empty() {
        eprintln!("bench: swap pause");
        swap = Some(swap_pause(&setup, config).await?);
        load = Some(load_times(config).await?);
    }
    let scale = scale::run(&config.scale, || open(config, &url)).await?;
    Ok((rows, Extras { load, swap, scale }))
}

async fn trivial_call(setup: &Setup) -> anyhow::Result<Sample> {
    // Borrowed, not cloned per call: the floor's side clones nothing either.
    let adapter = &setup.a.adapter();
    timed(setup.work.slice, || async move {
        let _ = adapter.log_parse_id("x:1".into()).await;
        Ok(1)
    })
    .await
}

async fn log_append(setup: &Setup, in_flight: usize) -> anyhow::Result<Sample> {
    let log = setup.a.log()?;
    let topic = unique("append");
    let deadline = Instant::now() + setup.work.slice;
    let started = Instant::now();
    let workers = (0..in_flight).map(|_| {
        let (log, topic, payload) = (log.clone(), topic.clone(), setup.work.payload.clone());
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                log.append(&topic, payload.clone(), AppendOptions::default())
                    .await?;
                latencies.push(t.elapsed());
            }
            anyhow::Ok(latencies)
        })
    });
    let sample = joined(started, workers).await?;
    Ok(sample)
}

async fn log_append_batch(setup: &Setup) -> anyhow::Result<Sample> {
    let log = setup.a.log()?;
    let topic = unique("batch");
    timed(setup.work.slice, || {
        let (log, topic) = (log.clone(), topic.clone());
        let batch = (0..APPEND_BATCH)
            .map(|_| (setup.work.payload.clone(), AppendOptions::default()))
            .collect();
        async move {
            log.append_batch(&topic, batch).await?;
            Ok(APPEND_BATCH as u64)
        }
    })
    .await
}

async fn log_catch_up(setup: &Setup) -> anyhow::Result<Sample> {
    let log = setup.a.log()?;
    let topic = unique("catchup");
    for chunk in 0..CATCH_UP / 250 {
        let batch = (0..250)
            .map(|_| (setup.work.payload.clone(), AppendOptions::default()))
            .collect();
        log.append_batch(&topic, batch)
            .await
            .with_context(|| format!("filling chunk {chunk}"))?;
    }
    timed(setup.work.slice, || {
        let (log, topic) = (setup.b.log(), topic.clone());
        async move {
            let mut reader = log?.read(&topic, ReadFrom::Earliest).await?;
            for _ in 0..CATCH_UP {
                reader.next_entry().await.context("reader ended")??;
            }
            Ok(CATCH_UP as u64)
        }
    })
    .await
}

async fn log_live(setup: &Setup) -> anyhow::Result<Sample> {
    let log = setup.a.log()?;
    let topic = unique("live");
    let mut reader = setup.b.log()?.read(&topic, ReadFrom::Latest).await?;
    let started = Instant::now();
    let mut sample = Sample::default();
    while started.elapsed() < setup.work.slice {
        let t = Instant::now();
        log.append(&topic, setup.work.payload.clone(), AppendOptions::default())
            .await?;
        reader.next_entry().await.context("reader ended")??;
        sample.latencies.push(t.elapsed());
        sample.ops += 1;
    }
    sample.elapsed = started.elapsed();
    Ok(sample)
}

async fn queue_round_trip(setup: &Setup, prefetch: u32) -> anyhow::Result<Sample> {
    let queue = setup.a.queue()?;
    let name = unique("queue");
    let handled = Arc::new(Tally::default());
    let counter = handled.clone();
    let consumer = queue
        .consume(
            &name,
            move |_d| {
                counter.add(1);
                async { Ok(()) }
            },
            ConsumeOptions {
                prefetch,
                dead_letter: None,
            },
        )
        .await?;
    let sample = timed(setup.work.slice, || {
        let (queue, name, handled, payload) = (
            queue.clone(),
            name.clone(),
            handled.clone(),
            setup.work.payload.clone(),
        );
        async move {
            let target = handled.get() + QUEUE_BATCH;
            let batch = (0..QUEUE_BATCH)
                .map(|_| (payload.clone(), ProduceOptions::default()))
                .collect();
            queue.produce_batch(&name, batch).await?;
            if handled.reach(target, Duration::from_secs(30)).await < target {
                anyhow::bail!("the consumer handled too few of a round's messages in 30 s");
            }
            Ok(QUEUE_BATCH)
        }
    })
    .await;
    consumer.stop().await;
    let mut sample = sample?;
    sample.latencies.clear();
    Ok(sample)
}

async fn request_reply(setup: &Setup) -> anyhow::Result<Sample> {
    let address = unique("rr");
    let listener = setup
        .b
        .direct()?
        .listen(
            &address,
            |incoming| async move {
                incoming
                    .reply(incoming.packet.body.clone())
                    .await
                    .map_err(Into::into)
            },
            ListenOptions::default(),
        )
        .await?;
    let direct = setup.a.direct()?;
    let sample = timed(setup.work.slice, || {
        let (direct, address, payload) =
            (direct.clone(), address.clone(), setup.work.payload.clone());
        async move {
            direct
                .request(&address, payload, Duration::from_secs(5))
                .await?;
            Ok(1)
        }
    })
    .await;
    listener.stop().await;
    sample
}

async fn fan_out(setup: &Setup, subscribers: usize) -> anyhow::Result<Sample> {
    let backplane = setup.a.backplane()?;
    let channel = unique("room");
    let received = Arc::new(Tally::default());
    let mut tasks = Vec::new();
    for _ in 0..subscribers {
        let mut subscription = backplane.subscribe(&channel).await?;
        let received = received.clone();
        tasks.push(tokio::spawn(async move {
            while subscription.recv().await.is_some() {
                received.add(1);
            }
        }));
    }
    let sample = timed(setup.work.slice, || {
        let (backplane, channel, received, payload) = (
            backplane.clone(),
            channel.clone(),
            received.clone(),
            setup.work.payload.clone(),
        );
        async move {
            fan_out_round(&received, subscribers, async {
                for _ in 0..FAN_OUT_PAYLOADS {
                    backplane.publish(&channel, payload.clone()).await?;
                }
                Ok(())
            })
            .await
        }
    })
    .await;
    for task in tasks {
        task.abort();
    }
    let mut sample = sample?;
    sample.latencies.clear();
    Ok(sample)
}
