//! The RabbitMQ adapter beyond the contract suite (which `tests/tests/contract.rs` runs against
//! it): the suite's restart scenario on a RabbitMQ node of its own, and interop with a plain
//! lapin client on the shared node at 127.0.0.1:5672 — a missing server is a failure, never a
//! skip.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use wrpc_broker::{AppendOptions, Broker, ProduceOptions};
use wrpc_broker_contract::restart::{self, ServerRecipe};

/// The shared node.
fn url() -> String {
    std::env::var("WRPC_AMQP_URL").unwrap_or_else(|_| "amqp://127.0.0.1:5672".to_string())
}

/// A fresh namespace (`prefix` option) for one test.
fn prefix() -> String {
    format!("io{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// The suite's restart scenario on a RabbitMQ node of the test's own (`own-node.sh`: its own
/// node name, ports and data directory), preferably on port 5682, killed with SIGKILL and
/// started again on the same data: what the quorum queue and the stream confirmed is there.
///
/// One thing is prepared first ([`ready_and_prepared`]): RabbitMQ 3.10 keeps its Ra server
/// registrations (every quorum queue, the stream coordinator) in a table saved every few
/// seconds, so a SIGKILL soon after a quorum queue or the first stream was declared loses the
/// registration, and after the restart that queue never gets a leader ("leader not known"; the
/// stream: 404 "home node … is down or inaccessible"). Measured here by hand with a plain
/// client: killed 1 s after the declare, the queue is lost; 25 s after, it comes back. So the
/// scenario's queue and stream are declared (with the adapter's arguments) when the node first
/// accepts connections, 20 s before the scenario starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_nothing() -> anyhow::Result<()> {
    // What the driver and the adapter log (RUST_LOG, e.g. `broker=debug,wrpc_driver_rabbitmq=debug`).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/own-node.sh");
    let server = ServerRecipe::new(script, "apt-get install rabbitmq-server", 5682)
        .args(["{port}", "{data}"])
        .url("amqp://127.0.0.1:{port}")
        .option("prefix", "wrpc")
        .ready(ready_and_prepared, Duration::from_secs(120));
    restart::a_server_restart_loses_nothing(server).await
}

/// Ready once the node accepts connections; the first time, the scenario's quorum queue and
/// stream are declared and given 20 s to be registered for good (see above).
fn ready_and_prepared(port: u16) -> bool {
    static PREPARED: AtomicBool = AtomicBool::new(false);
    if !restart::accepts(port) {
        return false;
    }
    if PREPARED.swap(true, Ordering::SeqCst) {
        return true;
    }
    let prepared = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(prepare(port))
    });
    prepared
        .join()
        .expect("the preparation thread")
        .expect("the scenario's queues declared");
    true
}

/// Declare `wrpc.q.restart-queue` (quorum) and `wrpc.log.restart-log` (stream) on the node at
/// `port`, then wait 20 s.
async fn prepare(port: u16) -> anyhow::Result<()> {
    let url = format!("amqp://127.0.0.1:{port}/%2f");
    let mut tries = 0;
    let connection = loop {
        match lapin::Connection::connect(&url, Default::default()).await {
            Ok(connection) => break connection,
            Err(e) if tries < 50 => {
                tries += 1;
                eprintln!("preparing the node: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let channel = connection.create_channel().await?;
    for (name, kind) in [
        ("wrpc.q.restart-queue", "quorum"),
        ("wrpc.log.restart-log", "stream"),
    ] {
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), AMQPValue::LongString(kind.into()));
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel.queue_declare(name.into(), options, args).await?;
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    Ok(())
}

/// A plain lapin consumer of `queue` (stream offset `first` when `stream`): the first `n`
/// deliveries, acknowledged.
async fn read_plainly(queue: &str, stream: bool, n: usize) -> Vec<lapin::message::Delivery> {
    let connection = lapin::Connection::connect(&format!("{}/%2f", url()), Default::default())
        .await
        .expect("a plain AMQP connection");
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_qos(100, BasicQosOptions::default())
        .await
        .unwrap();
    let mut args = FieldTable::default();
    if stream {
        args.insert(
            "x-stream-offset".into(),
            AMQPValue::LongString("first".into()),
        );
    }
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            args,
        )
        .await
        .expect("consume");
    let mut got = Vec::new();
    while got.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await;
        let delivery = next.expect("a delivery within 10 s").unwrap().unwrap();
        delivery.ack(BasicAckOptions::default()).await.unwrap();
        got.push(delivery);
    }
    got
}

/// A header's bytes.
fn header(d: &lapin::message::Delivery, name: &str) -> Option<Vec<u8>> {
    let headers = d.properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.as_bytes().to_vec()),
        AMQPValue::ByteArray(b) => Some(b.as_slice().to_vec()),
        _ => None,
    }
}

/// What the log wrote is a plain stream: a lapin consumer from `first` reads the values in
/// order, at the offsets the ids name, with the epoch and the key as headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_stream_consumer_reads_what_the_log_wrote() {
    let prefix = prefix();
    let broker = Broker::builder()
        .url(&url())
        .unwrap()
        .options(vec![("prefix".to_string(), prefix.clone())])
        .open()
        .await
        .expect("the broker opens");
    let log = broker.log().unwrap();
    let topic = format!("interop-{}", uuid::Uuid::new_v4().simple());
    let mut ids = Vec::new();
    for i in 0..5u8 {
        let options = AppendOptions {
            headers: vec![("h".into(), vec![i])],
            key: (i % 2 == 0).then(|| b"even".to_vec()),
        };
        ids.push(log.append(&topic, format!("v{i}"), options).await.unwrap());
    }
    let read = read_plainly(&format!("{prefix}.log.{topic}"), true, 5).await;
    for (i, d) in read.iter().enumerate() {
        assert_eq!(d.data, format!("v{i}").into_bytes(), "value {i}");
        let (epoch, offset) = ids[i].rsplit_once(':').unwrap();
        match d
            .properties
            .headers()
            .as_ref()
            .unwrap()
            .inner()
            .get("x-stream-offset")
        {
            Some(AMQPValue::LongLongInt(o)) => assert_eq!(o.to_string(), offset, "offset {i}"),
            other => panic!("x-stream-offset of entry {i}: {other:?}"),
        }
        assert_eq!(header(d, "x-wrpc-epoch"), Some(epoch.as_bytes().to_vec()));
        let key = (i % 2 == 0).then(|| b"even".to_vec());
        assert_eq!(header(d, "x-wrpc-key"), key, "key {i}");
    }
}

/// What the queue took is a plain quorum queue: a lapin consumer gets the bodies in order, the
/// headers packed in `x-wrpc-headers` (u32 count, then u32-length-prefixed names and values).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_consumer_reads_what_the_queue_took() {
    let prefix = prefix();
    let broker = Broker::builder()
        .url(&url())
        .unwrap()
        .options(vec![("prefix".to_string(), prefix.clone())])
        .open()
        .await
        .expect("the broker opens");
    let queue = broker.queue().unwrap();
    let name = format!("interop-{}", uuid::Uuid::new_v4().simple());
    for i in 0..3u8 {
        let options = ProduceOptions {
            headers: vec![("h".into(), vec![i])],
        };
        queue
            .produce(&name, format!("job{i}"), options)
            .await
            .unwrap();
    }
    let read = read_plainly(&format!("{prefix}.q.{name}"), false, 3).await;
    for (i, d) in read.iter().enumerate() {
        assert_eq!(d.data, format!("job{i}").into_bytes(), "body {i}");
        let mut expected = 1u32.to_be_bytes().to_vec();
        expected.extend(1u32.to_be_bytes());
        expected.extend(b"h");
        expected.extend(1u32.to_be_bytes());
        expected.push(i as u8);
        assert_eq!(
            header(d, "x-wrpc-headers"),
            Some(expected),
            "headers of {i}"
        );
        assert_eq!(
            header(d, "x-wrpc-attempt"),
            None,
            "a first attempt carries no header"
        );
    }
    assert_eq!(
        queue.depth(&name).await.unwrap(),
        0,
        "read and acknowledged"
    );
}
