//! The Kafka adapter beyond the contract suite (which `tests/tests/contract.rs` runs against
//! it): the suite's restart scenario on a Kafka of its own, consumers joining and leaving a
//! queue's group under load, and interop with a plain rdkafka client on the shared Kafka at
//! 127.0.0.1:9092 — a missing server is a failure, never a skip.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::StreamExt;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use wrpc_broker::{AppendOptions, Broker, ConsumeOptions, ProduceOptions, Queue};
use wrpc_broker_contract::restart::{self, ServerRecipe};

/// The shared Kafka.
fn url() -> String {
    std::env::var("WRPC_KAFKA_URL").unwrap_or_else(|_| "kafka://127.0.0.1:9092".to_string())
}

/// A fresh namespace (`prefix` option) for one test.
fn prefix() -> String {
    format!("io{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// A host instance on the shared Kafka in namespace `prefix`.
async fn open(prefix: &str) -> Broker {
    Broker::builder()
        .url(&url())
        .unwrap()
        .options(vec![("prefix".to_string(), prefix.to_string())])
        .open()
        .await
        .expect("the broker opens")
}

/// The suite's restart scenario on a Kafka of the test's own (`own-broker.sh`: its own ports
/// and data directory, formatted on the first start only), preferably on port 19092, killed
/// with SIGKILL and started again on the same data: what the log and the queue took is there,
/// and the readers resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_nothing() -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/own-broker.sh");
    let server = ServerRecipe::new(script, "scripts/kafka.sh install", 19092)
        .args(["{port}", "{data}"])
        .url("kafka://127.0.0.1:{port}")
        .option("prefix", "wrpc")
        .ready(restart::accepts, Duration::from_secs(120));
    restart::a_server_restart_loses_nothing(server).await
}

/// How many times each message was handled.
type Counts = Arc<Mutex<HashMap<usize, u32>>>;

/// A consumer of `name` counting each number it handles, 2 ms per message.
async fn counting(
    queue: &Queue,
    name: &str,
    counts: &Counts,
) -> anyhow::Result<wrpc_broker::Consumer> {
    let counts = counts.clone();
    let handler = move |d: wrpc_broker::Delivery| {
        let counts = counts.clone();
        async move {
            let n: usize = String::from_utf8_lossy(&d.body).parse()?;
            tokio::time::sleep(Duration::from_millis(2)).await;
            *counts.lock().unwrap().entry(n).or_default() += 1;
            Ok(())
        }
    };
    let options = ConsumeOptions {
        prefetch: 16,
        dead_letter: None,
    };
    Ok(queue.consume(name, handler, options).await?)
}

/// Consumers on three host instances join and leave one queue's group while 3000 messages are
/// produced: every message is handled, and the ones handled more than once (at least once
/// allows it across a rebalance) are counted and printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_joining_and_leaving_under_load_handle_every_message() -> anyhow::Result<()> {
    const MESSAGES: usize = 3000;
    let prefix = prefix();
    let hosts = [
        open(&prefix).await,
        open(&prefix).await,
        open(&prefix).await,
    ];
    let name = format!("rebalance-{}", uuid::Uuid::new_v4().simple());
    let counts = Counts::default();
    let producer = {
        let queue = hosts[0].queue()?;
        let name = name.clone();
        tokio::spawn(async move {
            for chunk in 0..MESSAGES / 10 {
                let batch = (chunk * 10..(chunk + 1) * 10)
                    .map(|n| (n.to_string().into_bytes(), ProduceOptions::default()))
                    .collect();
                queue.produce_batch(&name, batch).await?;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            anyhow::Ok(())
        })
    };
    let handled = |counts: &Counts| counts.lock().unwrap().len();
    let mut live = vec![counting(&hosts[0].queue()?, &name, &counts).await?];
    // Join, join, leave, join, leave: each step once more messages were handled.
    for (step, host) in [
        (1, Some(1)),
        (2, Some(2)),
        (3, None),
        (4, Some(0)),
        (5, None),
    ] {
        let due = step * MESSAGES / 7;
        let deadline = Instant::now() + Duration::from_secs(120);
        while handled(&counts) < due {
            ensure!(
                Instant::now() < deadline,
                "step {step}: {} of {due} handled",
                handled(&counts)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match host {
            Some(h) => live.push(counting(&hosts[h].queue()?, &name, &counts).await?),
            None => live.remove(0).stop().await,
        }
        println!(
            "step {step}: {} consumers, {} handled",
            live.len(),
            handled(&counts)
        );
    }
    producer.await??;
    let deadline = Instant::now() + Duration::from_secs(120);
    while handled(&counts) < MESSAGES {
        ensure!(
            Instant::now() < deadline,
            "{} of {MESSAGES} handled",
            handled(&counts)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for consumer in live {
        consumer.stop().await;
    }
    let counts = counts.lock().unwrap().clone();
    let missing: Vec<usize> = (0..MESSAGES).filter(|n| !counts.contains_key(n)).collect();
    ensure!(missing.is_empty(), "never handled: {missing:?}");
    let twice = counts.values().filter(|c| **c > 1).count();
    let extra: u32 = counts.values().map(|c| c - 1).sum();
    println!(
        "{MESSAGES} messages handled; {twice} of them more than once ({extra} extra deliveries)"
    );
    Ok(())
}

/// A plain rdkafka reader of partition 0 of `topic` from offset 0.
fn plain_reader(topic: &str) -> StreamConsumer {
    let bootstrap = url().trim_start_matches("kafka://").to_string();
    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "interop-plain")
        .set("enable.auto.commit", "false")
        .create()
        .expect("a plain consumer");
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    reader.assign(&list).unwrap();
    reader
}

/// What the log wrote is a plain topic: a plain rdkafka reader gets the values in order, at
/// the offsets the ids name, with their keys and headers (repeats and order) intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_consumer_reads_what_the_log_wrote() -> anyhow::Result<()> {
    let prefix = prefix();
    let log = open(&prefix).await.log()?;
    let topic = format!("interop-{}", uuid::Uuid::new_v4().simple());
    let mut ids = Vec::new();
    for i in 0..5u8 {
        let options = AppendOptions {
            headers: vec![
                ("h".into(), vec![i]),
                ("h".into(), vec![i, i]),
                ("x".into(), vec![]),
            ],
            key: (i % 2 == 0).then(|| b"even".to_vec()),
        };
        ids.push(log.append(&topic, format!("v{i}"), options).await?);
    }
    let reader = plain_reader(&format!("{prefix}.log.{topic}"));
    let mut records = reader.stream();
    for (i, id) in ids.iter().enumerate() {
        let m = tokio::time::timeout(Duration::from_secs(10), records.next())
            .await
            .context("a record within 10 s")?
            .context("the reader ended")??;
        ensure!(m.payload() == Some(format!("v{i}").as_bytes()), "value {i}");
        let (_, next) = id.rsplit_once(':').context("an id with an offset")?;
        ensure!(
            next == (m.offset() + 1).to_string(),
            "entry {i}: id {id} at offset {}",
            m.offset()
        );
        let key = (i % 2 == 0).then_some(b"even".as_slice());
        ensure!(m.key() == key, "key {i}: {:?}", m.key());
        let headers: Vec<(String, Vec<u8>)> = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        let i = i as u8;
        let expected = vec![
            ("h".into(), vec![i]),
            ("h".into(), vec![i, i]),
            ("x".into(), vec![]),
        ];
        ensure!(headers == expected, "headers {i}: {headers:?}");
    }
    Ok(())
}
