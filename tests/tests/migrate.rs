//! Migration to another broker under load: producers and consumers run 10 000 queue messages
//! and a log reader follows a feed while the host moves memory → Redis, Redis → NATS,
//! memory → RabbitMQ and Kafka → memory. Every message produced before or after the switch is handled at least
//! once, the reader sees every entry of both feeds in order, and no API call fails. After the
//! old adapter is closed, an id it minted is foreign (410, saying the feed moved); a queue that
//! cannot drain by the deadline is reported with what was left.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use wrpc_broker::{
    AppendOptions, Broker, BrokerBuilder, ConsumeOptions, Error, MemoryStore, MigrateOptions,
    MigrationEvent, ProduceOptions, ReadFrom,
};
use wrpc_broker_contract::workload;

const MESSAGES: usize = 10_000;
/// Appends before the migration starts, and after it switched.
const APPENDS_BEFORE: usize = 200;
const APPENDS_AFTER: usize = 2_000;

/// A fresh namespace on a server broker.
fn on_server(url: &str) -> BrokerBuilder {
    Broker::builder().url(url).unwrap().option(
        "prefix",
        format!("mg{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
    )
}

/// The p50 and p99 of `samples`.
fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    if samples.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.50), at(0.99))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_memory_to_redis_under_load_loses_nothing() {
    let from = Broker::builder().memory_store(MemoryStore::new());
    migrate_under_load(from, on_server("redis://127.0.0.1:6379"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_memory_to_rabbitmq_under_load_loses_nothing() {
    let from = Broker::builder().memory_store(MemoryStore::new());
    migrate_under_load(from, on_server("amqp://127.0.0.1:5672"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_kafka_to_memory_under_load_loses_nothing() {
    // Not memory → Kafka: the host refuses a move to an adapter without a capability the
    // running one exports, and the Kafka adapter has no direct.
    let to = Broker::builder().memory_store(MemoryStore::new());
    migrate_under_load(on_server("kafka://127.0.0.1:9092"), to)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_redis_to_nats_under_load_loses_nothing() {
    migrate_under_load(
        on_server("redis://127.0.0.1:6379"),
        on_server("nats://127.0.0.1:4222"),
    )
    .await
    .unwrap();
}

/// Run the workload on the broker `from` opens and migrate to `to` halfway.
async fn migrate_under_load(from: BrokerBuilder, to: BrokerBuilder) -> anyhow::Result<()> {
    let broker = from.open().await?;
    let old_broker = broker.info().broker;
    let queue = broker.queue()?;
    let log = broker.log()?;
    let name = format!("migrate-{}", uuid::Uuid::new_v4().simple());

    let (consumers, handled) = workload::numbered_consumers(
        &queue,
        &name,
        2,
        ConsumeOptions {
            prefetch: 8,
            dead_letter: None,
        },
        // A little work per message, so a backlog waits on the old broker when the
        // migration switches.
        Duration::from_millis(2),
    )
    .await?;
    // The reader must see 0, 1, 2, … with no gap: the old feed, then the new one.
    let (total_tx, reading) = workload::follow_in_order(log.read(&name, ReadFrom::Earliest).await?);

    let migrated = Arc::new(AtomicBool::new(false));
    let producer = {
        let (queue, name, migrated) = (queue.clone(), name.clone(), migrated.clone());
        tokio::spawn(async move {
            // Half at once on the old broker (a backlog), half in small batches while and after
            // the migration switches.
            let mut produced = 0;
            while produced < MESSAGES {
                let size = if produced < MESSAGES / 2 { 100 } else { 10 };
                let batch = (produced..produced + size)
                    .map(|n| (n.to_string().into_bytes(), ProduceOptions::default()))
                    .collect();
                queue
                    .produce_batch(&name, batch)
                    .await
                    .with_context(|| format!("produce {produced}.."))?;
                produced += size;
                if produced >= MESSAGES / 2 {
                    if !migrated.load(Ordering::Relaxed) && produced < MESSAGES * 3 / 5 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    } else {
                        tokio::time::sleep(Duration::from_millis(4)).await;
                    }
                }
            }
            anyhow::Ok(())
        })
    };
    let appended = Arc::new(AtomicUsize::new(0));
    let first_id: Arc<Mutex<Option<String>>> = Arc::default();
    let appender = {
        let (log, name, migrated, appended, first_id) = (
            log.clone(),
            name.clone(),
            migrated.clone(),
            appended.clone(),
            first_id.clone(),
        );
        tokio::spawn(async move {
            // One append at a time, each timed: (when it started, how long it took).
            let mut timings = Vec::new();
            let mut after = 0usize;
            let mut n = 0usize;
            while after < APPENDS_AFTER {
                let began = Instant::now();
                let id = log
                    .append(&name, n.to_string(), AppendOptions::default())
                    .await
                    .with_context(|| format!("append {n}"))?;
                timings.push((began, began.elapsed()));
                if n == 0 {
                    *first_id.lock().unwrap() = Some(id);
                }
                n += 1;
                appended.store(n, Ordering::Relaxed);
                if migrated.load(Ordering::Relaxed) {
                    after += 1;
                }
                if n.is_multiple_of(4) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            anyhow::Ok((n, timings))
        })
    };
    let migrator = {
        let (broker, migrated, appended, handled) = (
            broker.clone(),
            migrated.clone(),
            appended.clone(),
            handled.clone(),
        );
        tokio::spawn(async move {
            while appended.load(Ordering::Relaxed) < APPENDS_BEFORE
                || handled.lock().unwrap().len() < 100
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let backlog = MESSAGES / 2 - handled.lock().unwrap().len().min(MESSAGES / 2);
            let (progress, mut events) = tokio::sync::mpsc::unbounded_channel();
            let began = Instant::now();
            let report = broker
                .migrate(
                    to,
                    MigrateOptions {
                        deadline: Duration::from_secs(60),
                        progress: Some(progress),
                    },
                )
                .await
                .context("migrate")?;
            migrated.store(true, Ordering::Relaxed);
            let mut seen = Vec::new();
            while let Ok(event) = events.try_recv() {
                seen.push(event);
            }
            anyhow::Ok((began, report, seen, backlog))
        })
    };

    let (began, report, events, backlog) = migrator.await??;
    let (entries, timings) = appender.await??;
    let _ = total_tx.send(Some(entries));
    producer.await??;
    let read = reading.await??;
    ensure!(read == entries, "read {read} of {entries} entries");
    workload::until_all_handled(&handled, MESSAGES)
        .await
        .with_context(|| format!("after the migration: {report:?}"))?;
    for consumer in &consumers {
        consumer.stop().await;
    }

    ensure!(
        report.complete(),
        "the migration left work behind: {report:?}"
    );
    ensure!(
        report.queues.len() == 2 && report.readers_moved == 1,
        "two consumers drained and one reader moved: {report:?}"
    );
    ensure!(
        broker.info().broker != old_broker,
        "the host still runs on {old_broker}"
    );
    for step in [
        "Switched",
        "ConsumersMoved",
        "QueueDrained",
        "ReadersMoved",
        "OldClosed",
    ] {
        ensure!(
            events.iter().any(|e| format!("{e:?}").starts_with(step)),
            "no {step} progress event in {events:?}"
        );
    }
    ensure!(
        events
            .iter()
            .any(|e| matches!(e, MigrationEvent::QueueDrained(q) if q.drained && q.left == 0)),
        "{events:?}"
    );

    // The old broker is gone: an id it minted is foreign, and says so.
    let old_id = first_id.lock().unwrap().clone().context("no first id")?;
    match log.read(&name, ReadFrom::After(old_id.clone())).await {
        Err(Error::Gone(why)) => ensure!(why.contains("moved"), "{why}"),
        other => anyhow::bail!("reading after {old_id} on the new broker: {other:?}"),
    }

    // The pause: append latency while the migration switched vs outside it.
    let switch_end = began + report.switched;
    let (during, outside): (Vec<_>, Vec<_>) = timings
        .iter()
        .partition(|(at, took)| *at + *took >= began && *at <= switch_end);
    let (during, outside) = (
        percentiles(during.into_iter().map(|(_, t)| t).collect()),
        percentiles(outside.into_iter().map(|(_, t)| t).collect()),
    );
    println!(
        "{} -> {}: switched after {:?} (ready {:?}), total {:?}; queues {:?}; append p50/p99 \
         during the switch {:?}/{:?}, outside {:?}/{:?}; {entries} entries read in order; \
         about {backlog} messages waited on the old broker at the switch",
        report.from,
        report.to,
        report.switched,
        report.ready,
        report.total,
        report
            .queues
            .iter()
            .map(|q| (q.left, q.took))
            .collect::<Vec<_>>(),
        during.0,
        during.1,
        outside.0,
        outside.1,
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_that_cannot_drain_by_the_deadline_is_reported_with_what_was_left() {
    let old_store = MemoryStore::new();
    let broker = Broker::builder()
        .memory_store(old_store.clone())
        .open()
        .await
        .unwrap();
    let queue = broker.queue().unwrap();
    for n in 0..5 {
        queue
            .produce("stuck", format!("{n}"), ProduceOptions::default())
            .await
            .unwrap();
    }
    // A handler that never finishes a message of the old broker.
    let consumer = queue
        .consume(
            "stuck",
            |_| async { anyhow::bail!("not today") },
            ConsumeOptions::default(),
        )
        .await
        .unwrap();
    let report = broker
        .migrate(
            Broker::builder(),
            MigrateOptions {
                deadline: Duration::from_millis(500),
                progress: None,
            },
        )
        .await
        .unwrap();
    assert!(!report.complete(), "{report:?}");
    assert_eq!(report.queues.len(), 1, "{report:?}");
    let drain = &report.queues[0];
    assert!(!drain.drained && drain.left == 5, "{drain:?}");
    // What was left stays on the old broker, released for another consumer there.
    let stats = old_store.queue_len(&format!("{}/queue/stuck", memory_prefix()));
    assert_eq!(stats.ready + stats.delayed + stats.leased, 5, "{stats:?}");
    // The host works on the new broker.
    queue
        .produce("stuck", "new", ProduceOptions::default())
        .await
        .unwrap();
    consumer.stop().await;
}

/// The memory adapter's default namespace prefix.
fn memory_prefix() -> &'static str {
    "wrpc"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_broker_url_file_migrates_the_host_and_a_bad_url_is_refused() {
    use wrpc_broker::watch::WatchEvent;
    let dir = std::env::temp_dir().join(format!("wrpc-url-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let url_file = dir.join("broker.url");
    std::fs::write(&url_file, "memory://\n").unwrap();
    let broker = Broker::memory().await.unwrap();
    let log = broker.log().unwrap();
    let topic = format!("watched-{}", uuid::Uuid::new_v4().simple());
    let mut reader = log.read(&topic, ReadFrom::Earliest).await.unwrap();
    log.append(&topic, "before", AppendOptions::default())
        .await
        .unwrap();
    let prefix = format!("mw{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut watcher = broker.watch_broker_url(
        &url_file,
        [("prefix", prefix.as_str())],
        MigrateOptions::default(),
    );
    let drop_in = |text: &str| {
        let staged = dir.join("broker.url.new");
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(&staged, &url_file).unwrap();
    };

    // An operator names the new broker with an atomic rename.
    drop_in("redis://127.0.0.1:6379\n");
    let event = tokio::time::timeout(Duration::from_secs(30), watcher.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&event, WatchEvent::Migrated(r) if r.complete()),
        "{event:?}"
    );
    assert_eq!(broker.info().broker, "redis");
    log.append(&topic, "after", AppendOptions::default())
        .await
        .unwrap();
    for expected in ["before", "after"] {
        let entry = tokio::time::timeout(Duration::from_secs(10), reader.next_entry())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(entry.value, expected.as_bytes());
    }

    // A URL the host cannot open is refused; the host stays on Redis.
    drop_in("kafka://nowhere:1\n");
    let event = tokio::time::timeout(Duration::from_secs(10), watcher.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&event, WatchEvent::Refused(why) if why.contains("kafka")),
        "{event:?}"
    );
    assert_eq!(broker.info().broker, "redis");
    std::fs::remove_dir_all(&dir).unwrap();
}
