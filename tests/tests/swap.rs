//! Hot-swap and recovery: the adapter is replaced 20 times while producers
//! and consumers run 10 000 queue messages and a log reader follows a feed; the same with a
//! component that traps on every 500th call. Every message is handled at least once, the reader
//! sees every entry in order with no gap, and no API call fails; a service answers requests
//! throughout. The same swapping between the Rust and the Python memory adapters, on Redis,
//! NATS and RabbitMQ, and on Kafka (no direct there) with a single queue consumer. And a
//! service answers every request from concurrent
//! requesters while the adapter is swapped 100 times back to back, on each broker, to an
//! ungrouped listener and to a group.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use wrpc_broker::{
    AppendOptions, Broker, BrokerBuilder, ConsumeOptions, Direct, Incoming, ListenOptions,
    Listener, MemoryStore, ProduceOptions, ReadFrom,
};
use wrpc_broker_contract::{components, workload};

const MESSAGES: usize = 10_000;
const SWAPS: usize = 20;
/// Appends between swaps: each is one adapter call, so every instance of the chaos component
/// reaches its 500th call (and traps) before it is swapped out, however loaded the machine is.
const APPENDS_PER_SWAP: usize = 600;

/// The component at `path` on a fresh memory broker.
fn on_memory(path: &str) -> BrokerBuilder {
    Broker::builder()
        .component_file(path)
        .memory_store(MemoryStore::new())
}

/// The embedded adapter for the broker at `url` and the options of its run (its own namespace).
fn on_server(url: &str) -> (BrokerBuilder, Vec<u8>, Vec<(String, String)>) {
    let options = vec![(
        "prefix".to_string(),
        format!("sw{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
    )];
    let builder = Broker::builder().url(url).unwrap().options(options.clone());
    (
        builder,
        wrpc_broker::drivers::embedded_adapter(url)
            .unwrap()
            .to_vec(),
        options,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_swaps_under_load_lose_nothing_on_redis() {
    let (builder, wasm, options) = on_server("redis://127.0.0.1:6379");
    let generation = workload(builder, vec![wasm], options, true, 2)
        .await
        .unwrap();
    assert_eq!(generation, SWAPS as u32 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_swaps_under_load_lose_nothing_on_nats() {
    let (builder, wasm, options) = on_server("nats://127.0.0.1:4222");
    let generation = workload(builder, vec![wasm], options, true, 2)
        .await
        .unwrap();
    assert_eq!(generation, SWAPS as u32 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_swaps_under_load_lose_nothing_on_rabbitmq() {
    let (builder, wasm, options) = on_server("amqp://127.0.0.1:5672");
    let generation = workload(builder, vec![wasm], options, true, 2)
        .await
        .unwrap();
    assert_eq!(generation, SWAPS as u32 + 1);
}

/// Kafka exports no direct, so no requests; one queue consumer, so at each swap the group
/// loses its only member and gets a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_swaps_under_load_lose_nothing_on_kafka_with_one_consumer() {
    let (builder, wasm, options) = on_server("kafka://127.0.0.1:9092");
    let generation = workload(builder, vec![wasm], options, false, 1)
        .await
        .unwrap();
    assert_eq!(generation, SWAPS as u32 + 1);
}

/// A service on `address` (in `group`, if any) answering each request with its body, and how
/// many it handled.
async fn echo_service(
    direct: &Direct,
    address: &str,
    group: Option<&str>,
) -> anyhow::Result<(Listener, Arc<std::sync::atomic::AtomicU64>)> {
    let handled = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = handled.clone();
    let answer = move |incoming: Incoming| {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        async move { Ok(incoming.reply(incoming.packet.body.clone()).await?) }
    };
    let options = ListenOptions {
        group: group.map(str::to_string),
        ..ListenOptions::default()
    };
    let listener = direct.listen(address, answer, options).await?;
    Ok((listener, handled))
}

/// Direct is at most once: the service handled each answered request once, none twice (both
/// adapter listeners get what is sent while a move overlaps them).
fn ensure_handled_once(
    handled: &std::sync::atomic::AtomicU64,
    answered: u64,
) -> anyhow::Result<()> {
    let handled = handled.load(std::sync::atomic::Ordering::Relaxed);
    ensure!(
        handled == answered,
        "the service handled {handled} requests for {answered} answered: some twice"
    );
    Ok(())
}

/// A flag the swapper raises when it is done.
fn new_flag() -> Arc<std::sync::atomic::AtomicBool> {
    Arc::new(std::sync::atomic::AtomicBool::new(false))
}

/// Run the workload on the broker `builder` opens, with `consumers` queue consumers (and a
/// service answering requests throughout when `with_requests`), swapping 20 times meanwhile:
/// to each component of `swap_to` in turn.
async fn workload(
    builder: BrokerBuilder,
    swap_to: Vec<Vec<u8>>,
    options: Vec<(String, String)>,
    with_requests: bool,
    consumers: usize,
) -> anyhow::Result<u32> {
    let broker = builder.open().await?;
    let queue = broker.queue()?;
    let log = broker.log()?;
    let name = format!("swap-{}", uuid::Uuid::new_v4().simple());

    let (consumers, handled) = workload::numbered_consumers(
        &queue,
        &name,
        consumers,
        ConsumeOptions {
            prefetch: 32,
            dead_letter: None,
        },
        Duration::ZERO,
    )
    .await?;
    // The reader follows the feed while it is written; it must see 0, 1, 2, … with no gap.
    let (total_tx, reading) = workload::follow_in_order(log.read(&name, ReadFrom::Earliest).await?);

    let producer = {
        let (queue, name) = (queue.clone(), name.clone());
        tokio::spawn(async move {
            // Spread over the swaps: 1000 batches of 10.
            for chunk in 0..MESSAGES / 10 {
                let batch = (chunk * 10..(chunk + 1) * 10)
                    .map(|n| (n.to_string().into_bytes(), ProduceOptions::default()))
                    .collect();
                queue
                    .produce_batch(&name, batch)
                    .await
                    .with_context(|| format!("produce chunk {chunk}"))?;
                tokio::time::sleep(Duration::from_millis(4)).await;
            }
            anyhow::Ok(())
        })
    };
    let swaps_done = new_flag();
    // A service answering requests throughout: no request may fail because of a swap.
    let service = format!("{name}.service");
    let echo = if with_requests {
        let direct = broker.direct()?;
        let (listener, handled) = echo_service(&direct, &service, None).await?;
        Some((direct, listener, handled))
    } else {
        None
    };
    let requester = {
        let (direct, service, done) = (
            echo.as_ref().map(|(direct, _, _)| direct.clone()),
            service.clone(),
            swaps_done.clone(),
        );
        tokio::spawn(async move {
            let mut answered = 0u64;
            while let Some(direct) = direct
                .as_ref()
                .filter(|_| !done.load(std::sync::atomic::Ordering::Relaxed))
            {
                let reply = direct
                    .request(&service, b"ping".to_vec(), Duration::from_secs(5))
                    .await
                    .with_context(|| format!("request {answered}"))?;
                ensure!(reply.body == b"ping", "a reply with another body");
                answered += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            anyhow::Ok(answered)
        })
    };
    let appended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let appender = {
        let (log, name, done, appended) = (
            log.clone(),
            name.clone(),
            swaps_done.clone(),
            appended.clone(),
        );
        tokio::spawn(async move {
            // One append at a time, for as long as the swaps go on.
            let mut n = 0usize;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                log.append(&name, n.to_string(), AppendOptions::default())
                    .await
                    .with_context(|| format!("append {n}"))?;
                n += 1;
                appended.store(n, std::sync::atomic::Ordering::Relaxed);
                if n.is_multiple_of(4) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            anyhow::Ok(n)
        })
    };
    let swapper = {
        let (broker, done, appended, options) = (
            broker.clone(),
            swaps_done.clone(),
            appended.clone(),
            options.clone(),
        );
        tokio::spawn(async move {
            let mut pauses = Vec::new();
            for i in 0..SWAPS {
                let due = (i + 1) * APPENDS_PER_SWAP;
                while appended.load(std::sync::atomic::Ordering::Relaxed) < due {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let next = &swap_to[i % swap_to.len()];
                let report = broker
                    .swap_bytes("the next adapter version", next, options.clone())
                    .await
                    .with_context(|| format!("swap {i}"))?;
                pauses.push(report.total);
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            anyhow::Ok(pauses)
        })
    };

    let pauses = swapper.await??;
    let answered = requester.await??;
    ensure!(answered > 0 || !with_requests, "no request was answered");
    if let Some((_, listener, handled)) = echo {
        listener.stop().await;
        ensure_handled_once(&handled, answered)?;
    }
    let entries = appender.await??;
    let _ = total_tx.send(Some(entries));
    producer.await??;
    let read = reading.await??;
    ensure!(read == entries, "read {read} of {entries} entries");
    workload::until_all_handled(&handled, MESSAGES).await?;
    for consumer in &consumers {
        consumer.stop().await;
    }
    let generation = broker.adapter().generation();
    ensure!(
        generation > SWAPS as u32,
        "the adapter was swapped {SWAPS} times (generation {generation})"
    );
    println!(
        "{answered} requests answered; {entries} entries read in order; generation {generation} after {SWAPS} swaps; swap durations: {pauses:?}"
    );
    Ok(generation)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_swaps_under_load_lose_nothing() {
    let generation = workload(
        on_memory(components::MEMORY),
        vec![std::fs::read(components::MEMORY).unwrap()],
        vec![],
        true,
        2,
    )
    .await
    .unwrap();
    assert_eq!(
        generation,
        SWAPS as u32 + 1,
        "one generation per swap, no trap"
    );
}

/// The Rust memory adapter swapped for the Python one and back, ten times each way, under the
/// same load: every message handled, every entry read in order, no call failed.
#[cfg(feature = "python")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaps_between_the_rust_and_the_python_memory_adapters_lose_nothing() {
    let rust = std::fs::read(components::MEMORY).unwrap();
    let python = std::fs::read(components::MEMORY_PYTHON).unwrap();
    let generation = workload(
        on_memory(components::MEMORY),
        vec![python, rust],
        vec![],
        true,
        2,
    )
    .await
    .unwrap();
    assert_eq!(
        generation,
        SWAPS as u32 + 1,
        "one generation per swap, no trap"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_swaps_with_a_component_trapping_every_500th_call_lose_nothing() {
    let generation = workload(
        on_memory(components::MEMORY_CHAOS),
        vec![std::fs::read(components::MEMORY_CHAOS).unwrap()],
        vec![],
        false,
        2,
    )
    .await
    .unwrap();
    // Direct is at most once: a request in flight when the adapter traps fails, so the chaos
    // run leaves requests out. Each trap starts a new generation too.
    assert!(
        generation > SWAPS as u32 + 1,
        "the chaos component never trapped (generation {generation})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_file_replaced_by_rename_is_swapped_in_and_a_bad_one_refused() {
    let dir = std::env::temp_dir().join(format!("wrpc-watch-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let live = dir.join("adapter.wasm");
    std::fs::copy(components::MEMORY, &live).unwrap();
    let broker = Broker::builder()
        .component_file(&live)
        .memory_store(MemoryStore::new())
        .open()
        .await
        .unwrap();
    let mut watcher = broker.watch(&live, [("", ""); 0]);
    let drop_in = |source: &str| {
        let staged = dir.join("adapter.wasm.new");
        std::fs::copy(source, &staged).unwrap();
        std::fs::rename(&staged, &live).unwrap();
    };

    // An operator drops in a new version with an atomic rename.
    drop_in(components::MEMORY_CHAOS);
    let event = tokio::time::timeout(Duration::from_secs(10), watcher.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(event, wrpc_broker::watch::WatchEvent::Swapped(_)),
        "{event:?}"
    );
    assert_eq!(broker.adapter().generation(), 2);
    broker
        .queue()
        .unwrap()
        .produce("after-swap", "ok", ProduceOptions::default())
        .await
        .unwrap();

    // A broken file is refused; the running adapter stays.
    let staged = dir.join("adapter.wasm.new");
    std::fs::write(&staged, b"not a component").unwrap();
    std::fs::rename(&staged, &live).unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), watcher.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(event, wrpc_broker::watch::WatchEvent::Refused(_)),
        "{event:?}"
    );
    assert_eq!(broker.adapter().generation(), 2);
    broker
        .log()
        .unwrap()
        .append("still", "works", AppendOptions::default())
        .await
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Swaps back to back in [`requests_across_swaps`].
const REQUEST_SWAPS: usize = 100;
/// Requesters sending back to back in [`requests_across_swaps`].
const REQUESTERS: usize = 4;

/// A service (an ungrouped listener, or a group of one) answers [`REQUESTERS`] requesters
/// sending back to back while the adapter is swapped
/// [`REQUEST_SWAPS`] times with no pause between swaps: every request is answered (a request
/// that reached only the old adapter's listener is handed over by its stop) and handled once
/// (one that reached both is not handled twice). Returns how many were answered.
async fn requests_across_swaps(
    builder: BrokerBuilder,
    swap_to: Vec<u8>,
    options: Vec<(String, String)>,
    group: Option<&str>,
) -> anyhow::Result<u64> {
    let broker = builder.open().await?;
    let direct = broker.direct()?;
    let service = format!("swap-service-{}", uuid::Uuid::new_v4().simple());
    let (listener, handled) = echo_service(&direct, &service, group).await?;
    let (done, swapping) = (new_flag(), new_flag());
    let requesters: Vec<_> = (0..REQUESTERS)
        .map(|who| {
            let (direct, service) = (direct.clone(), service.clone());
            let (done, swapping) = (done.clone(), swapping.clone());
            tokio::spawn(async move {
                // Each request's latency, and whether swaps were going on when it started.
                let mut latencies = Vec::new();
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let body = format!("{who}:{}", latencies.len()).into_bytes();
                    let during = swapping.load(std::sync::atomic::Ordering::Relaxed);
                    let started = std::time::Instant::now();
                    let reply = direct
                        .request(&service, body.clone(), Duration::from_secs(5))
                        .await
                        .with_context(|| format!("requester {who}, request {}", latencies.len()))?;
                    latencies.push((started.elapsed(), during));
                    ensure!(reply.body == body, "a reply with another body");
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    // Requests without swaps first, for the latency outside swaps.
    tokio::time::sleep(Duration::from_millis(300)).await;
    swapping.store(true, std::sync::atomic::Ordering::Relaxed);
    let swapped = async {
        let mut took = Vec::new();
        for i in 0..REQUEST_SWAPS {
            let report = broker
                .swap_bytes("the next adapter version", &swap_to, options.clone())
                .await
                .with_context(|| format!("swap {i}"))?;
            took.push(report.total);
        }
        took.sort();
        anyhow::Ok(took)
    }
    .await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut latencies = Vec::new();
    for requester in requesters {
        latencies.extend(requester.await??);
    }
    let answered = latencies.len() as u64;
    let took = swapped?;
    listener.stop().await;
    ensure_handled_once(&handled, answered)?;
    let (during, outside): (Vec<_>, Vec<_>) = latencies.into_iter().partition(|(_, d)| *d);
    let p50_p99 = |samples: Vec<(Duration, bool)>| {
        let mut samples: Vec<Duration> = samples.into_iter().map(|(t, _)| t).collect();
        samples.sort();
        let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
        (samples.len(), at(0.5), at(0.99))
    };
    println!(
        "{answered} requests to a listener in group {group:?} answered across {REQUEST_SWAPS} back-to-back swaps (swap p50 {:?}, \
         max {:?}); request latency (n, p50, p99) during the swaps {:?}, outside {:?}",
        took[took.len() / 2],
        took[took.len() - 1],
        p50_p99(during),
        p50_p99(outside),
    );
    ensure!(answered > 0, "no request was answered");
    Ok(answered)
}

/// One test per broker and listener kind.
macro_rules! requests_across_swaps {
    ($($test:ident: $broker:expr, $group:expr;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                let (builder, wasm, options) = $broker;
                requests_across_swaps(builder, wasm, options, $group).await.unwrap();
            }
        )*
    };
}

/// The memory component on a fresh store, with no options.
fn memory_setup() -> (BrokerBuilder, Vec<u8>, Vec<(String, String)>) {
    (
        on_memory(components::MEMORY),
        std::fs::read(components::MEMORY).unwrap(),
        vec![],
    )
}

requests_across_swaps! {
    requests_across_back_to_back_swaps_are_all_answered: memory_setup(), None;
    requests_across_back_to_back_swaps_are_all_answered_on_redis: on_server("redis://127.0.0.1:6379"), None;
    requests_across_back_to_back_swaps_are_all_answered_on_nats: on_server("nats://127.0.0.1:4222"), None;
    requests_across_back_to_back_swaps_are_all_answered_on_rabbitmq: on_server("amqp://127.0.0.1:5672"), None;
    grouped_requests_across_back_to_back_swaps_are_all_answered: memory_setup(), Some("service");
    grouped_requests_across_back_to_back_swaps_are_all_answered_on_redis: on_server("redis://127.0.0.1:6379"), Some("service");
    grouped_requests_across_back_to_back_swaps_are_all_answered_on_nats: on_server("nats://127.0.0.1:4222"), Some("service");
    grouped_requests_across_back_to_back_swaps_are_all_answered_on_rabbitmq: on_server("amqp://127.0.0.1:5672"), Some("service");
}
