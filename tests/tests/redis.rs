//! The Redis adapter beyond the contract suite (which `tests/contract.rs` runs against it): a
//! restart test on a server of its own and an interop test with a plain Redis client, on the
//! Redis server at 127.0.0.1:6379 — a missing server is a failure, never a skip.
//!
//! Two host instances of the suite are two `Broker`s, each with its own driver connections,
//! on one server: like two processes of one deployment. Valkey, KeyDB and Dragonfly speak the
//! same protocol: point `WRPC_REDIS_URL` at one to run the suite against it.

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use wrpc_broker::{AppendOptions, Broker, ConsumeOptions, Delivery, ProduceOptions, ReadFrom};
use wrpc_broker_contract::Factory;

/// The shared server (nothing on disk: `--save ""`, no AOF).
fn url() -> String {
    std::env::var("WRPC_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// Host instances of the embedded Redis adapter on `url`, with extra options (a missing server
/// fails here).
async fn redis_factory(url: String, extra: &'static [(&'static str, &'static str)]) -> Factory {
    let extra = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Factory::for_url(&url, None, extra)
        .await
        .unwrap_or_else(|e| panic!("the Redis server at {url} must be running: {e:#}"))
}

/// What the log wrote is plain Redis: `XRANGE` with the `redis` crate reads it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_xrange_reads_what_the_log_wrote() {
    let broker = Broker::connect(&url()).await.expect("the broker opens");
    let log = broker.log().unwrap();
    let topic = format!("interop-{}", uuid::Uuid::new_v4().simple());
    let mut ids = Vec::new();
    for i in 0..5 {
        let options = AppendOptions {
            headers: vec![("h".into(), vec![i])],
            key: (i % 2 == 0).then(|| b"even".to_vec()),
        };
        ids.push(log.append(&topic, format!("v{i}"), options).await.unwrap());
    }
    let client = redis::Client::open(url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(format!("{{wrpc}}:log:{topic}"))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(reply.ids.len(), 5);
    for (i, entry) in reply.ids.iter().enumerate() {
        assert_eq!(
            entry.id,
            format!("0-{}", i + 1),
            "stream ids are dense `0-n`"
        );
        assert!(
            ids[i].ends_with(&format!(":{}", i + 1)),
            "the log id {} names entry {}",
            ids[i],
            i + 1
        );
        let value: Vec<u8> = entry.get("v").expect("field v");
        assert_eq!(value, format!("v{i}").into_bytes());
        let key: Option<Vec<u8>> = entry.get("k");
        assert_eq!(key, (i % 2 == 0).then(|| b"even".to_vec()));
    }
}

// ------------------------------------------------------------------------------ restart

/// A `redis-server` of the test's own, persisting every write (`appendfsync always`).
struct OwnServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl OwnServer {
    fn start(port: u16) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "wrpc-redis-restart-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = OwnServer {
            port,
            dir,
            child: None,
        };
        server.spawn();
        server
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--appendonly",
                "yes",
            ])
            .args(["--appendfsync", "always", "--save", "", "--dir"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (apt-get install redis-server)");
        self.child = Some(child);
        wait_for_port(self.port, true);
    }

    /// Kill the server (SIGKILL: nothing graceful) and start it again on the same files.
    fn restart(&mut self) {
        self.kill();
        wait_for_port(self.port, false);
        self.spawn();
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Wait until the port accepts connections (`open`) or refuses them.
fn wait_for_port(port: u16, open: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let accepting = TcpStream::connect(("127.0.0.1", port)).is_ok();
        if accepting == open {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "port {port} did not become {}",
            if open { "open" } else { "closed" }
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The server restarts in the middle of a queue run and of a log read; nothing is lost: every
/// queued message is handled, and the reader resumes without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_nothing() {
    let mut server = OwnServer::start(6391);
    let factory = redis_factory(server.url(), &[("queue.visibilityMs", "1000")]).await;
    let broker = factory.instance().await.expect("a host instance");

    // A log with 2000 entries, and a reader that has read 500 of them.
    let log = broker.log().unwrap();
    let topic = "restart-log";
    for chunk in 0..8 {
        let records = (chunk * 250..(chunk + 1) * 250)
            .map(|i| (format!("v{i}").into_bytes(), AppendOptions::default()))
            .collect();
        log.append_batch(topic, records).await.unwrap();
    }
    let mut reader = log.read(topic, ReadFrom::Earliest).await.unwrap();
    let mut read = Vec::new();
    while read.len() < 500 {
        read.push(next_entry(&mut reader).await);
    }

    // A queue of 300 messages, handled slowly by two consumers.
    let queue = broker.queue().unwrap();
    let messages = (0..300)
        .map(|i| (format!("m{i}").into_bytes(), ProduceOptions::default()))
        .collect();
    queue
        .produce_batch("restart-queue", messages)
        .await
        .unwrap();
    let handled: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let mut consumers = Vec::new();
    for _ in 0..2 {
        let handled = handled.clone();
        let consumer = queue
            .consume(
                "restart-queue",
                move |d: Delivery| {
                    let handled = handled.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        handled
                            .lock()
                            .unwrap()
                            .insert(String::from_utf8_lossy(&d.body).into_owned());
                        Ok(())
                    }
                },
                ConsumeOptions {
                    prefetch: 8,
                    dead_letter: None,
                },
            )
            .await
            .unwrap();
        consumers.push(consumer);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while handled.lock().unwrap().len() < 60 {
        assert!(
            Instant::now() < deadline,
            "the consumers handled nothing before the restart"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Restart in the middle of both.
    let before = handled.lock().unwrap().len();
    server.restart();
    println!(
        "restarted the server with {before} of 300 messages handled and 500 of 2000 entries read"
    );

    // The reader resumes without a gap, and sees entries appended after the restart.
    while read.len() < 2000 {
        let entry = tokio::time::timeout(Duration::from_secs(30), reader.next()).await;
        match entry {
            Ok(Some(Ok(entry))) => read.push(entry),
            other => panic!("after {} entries read: {other:?}", read.len()),
        }
    }
    let appended = retry(|| log.append(topic, "after", AppendOptions::default())).await;
    let last = next_entry(&mut reader).await;
    assert_eq!(last.value, b"after".to_vec());
    assert_eq!(last.id, appended);
    let values: Vec<String> = read
        .iter()
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
        .collect();
    let expected: Vec<String> = (0..2000).map(|i| format!("v{i}")).collect();
    assert!(
        values == expected,
        "the reader skipped or repeated entries across the restart"
    );
    let offsets: Vec<u64> = read
        .iter()
        .chain([&last])
        .map(|e| e.position.offset)
        .collect();
    assert!(
        offsets.windows(2).all(|w| w[1] == w[0] + 1),
        "offsets stay dense across the restart"
    );

    // Every queued message is handled.
    let deadline = Instant::now() + Duration::from_secs(45);
    while handled.lock().unwrap().len() < 300 {
        assert!(
            Instant::now() < deadline,
            "{} of 300 messages handled after the restart",
            handled.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for consumer in &consumers {
        consumer.stop().await;
    }
    println!("after the restart: all 300 messages handled, 2001 entries read in order");
}

async fn next_entry(reader: &mut wrpc_broker::Reader) -> wrpc_broker::Entry {
    tokio::time::timeout(Duration::from_secs(30), reader.next())
        .await
        .expect("an entry within 30 s")
        .expect("the reader goes on")
        .expect("the reader does not fail")
}

/// Call `f` until it succeeds (the server may still be loading).
async fn retry<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = wrpc_broker::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(Instant::now() < deadline, "still failing: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Redis-specific queue behaviour the contract suite cannot see from outside.
mod queue_on_redis {
    use super::*;

    /// Messages a consumer took and never settled (it died: no stop, no release) are
    /// reclaimed by a live consumer once idle longer than `queue.visibilityMs` (XAUTOCLAIM).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_consumers_deliveries_are_reclaimed() {
        let factory = redis_factory(url(), &[("queue.visibilityMs", "500")]).await;
        let broker = factory.instance().await.unwrap();
        let queue = broker.queue().unwrap();
        let name = format!("dead-consumer-{}", uuid::Uuid::new_v4().simple());
        let messages = (0..5)
            .map(|i| (format!("m{i}").into_bytes(), ProduceOptions::default()))
            .collect();
        queue.produce_batch(&name, messages).await.unwrap();
        // A consumer outside any host takes every message and vanishes.
        let client = redis::Client::open(url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let key = format!("{{wrpc}}:q:{name}");
        let _: redis::Value = redis::cmd("XGROUP")
            .arg(&["CREATE", &key, "wrpc", "0", "MKSTREAM"])
            .query_async(&mut conn)
            .await
            .unwrap();
        let taken: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
            .arg(&[
                "GROUP", "wrpc", "ghost", "COUNT", "10", "STREAMS", &key, ">",
            ])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(taken.keys[0].ids.len(), 5, "the ghost took all five");
        let handled: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let started = Instant::now();
        let consumer = {
            let handled = handled.clone();
            queue
                .consume(
                    &name,
                    move |d: Delivery| {
                        let handled = handled.clone();
                        async move {
                            handled
                                .lock()
                                .unwrap()
                                .insert(String::from_utf8_lossy(&d.body).into_owned());
                            Ok(())
                        }
                    },
                    ConsumeOptions::default(),
                )
                .await
                .unwrap()
        };
        while handled.lock().unwrap().len() < 5 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "reclaimed {} of 5",
                handled.lock().unwrap().len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        consumer.stop().await;
        let pending: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
            .arg(&[&key, "wrpc"])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(pending.count(), 0, "nothing is left pending");
    }

    /// A handler that runs far longer than `queue.visibilityMs` keeps its delivery (XCLAIM
    /// JUSTID refreshes): a competing consumer never gets a duplicate.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_handler_is_not_duplicated() {
        let factory = redis_factory(url(), &[("queue.visibilityMs", "300")]).await;
        let (a, b) = (
            factory.instance().await.unwrap(),
            factory.instance().await.unwrap(),
        );
        let name = format!("long-{}", uuid::Uuid::new_v4().simple());
        let runs = Arc::new(Mutex::new(Vec::new()));
        let mut consumers = Vec::new();
        for (who, broker) in [("a", &a), ("b", &b)] {
            let runs = runs.clone();
            consumers.push(
                broker
                    .queue()
                    .unwrap()
                    .consume(
                        &name,
                        move |d: Delivery| {
                            let runs = runs.clone();
                            async move {
                                runs.lock().unwrap().push((who, d.attempt));
                                tokio::time::sleep(Duration::from_millis(1500)).await;
                                Ok(())
                            }
                        },
                        ConsumeOptions {
                            prefetch: 1,
                            dead_letter: None,
                        },
                    )
                    .await
                    .unwrap(),
            );
        }
        a.queue()
            .unwrap()
            .produce(&name, "slow", ProduceOptions::default())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        for consumer in &consumers {
            consumer.stop().await;
        }
        let runs = runs.lock().unwrap().clone();
        assert_eq!(
            runs.len(),
            1,
            "the slow message ran once, not again elsewhere: {runs:?}"
        );
    }
}
