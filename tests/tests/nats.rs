//! The NATS adapter beyond the contract suite (which `tests/contract.rs` runs against it): a
//! restart test on a server of its own (killed and restarted mid queue run and mid log read:
//! nothing lost) and a long-handler test (kept alive past `ack_wait` with `+WPI`) on the
//! `nats-server -js` at 127.0.0.1:4222. A missing server fails these tests: they are never
//! skipped. The long-handler test works under a prefix of its own and deletes its streams at
//! the end, so runs leave nothing behind on the shared server.

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use wrpc_broker::drivers::nats::NatsDriver;
use wrpc_broker::{AppendOptions, ConsumeOptions, Delivery, ProduceOptions, ReadFrom};
use wrpc_broker_contract::Factory;

/// The shared server the suite runs against.
const URL: &str = "nats://127.0.0.1:4222";
/// The port the restart test's own server prefers; a free one is taken when it is busy (two
/// test runs at once on one machine).
const RESTART_PORT: u16 = 4233;

/// [`RESTART_PORT`] when free, else a free loopback port.
fn restart_port() -> u16 {
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).ok();
    let listener = free(RESTART_PORT)
        .or_else(|| free(0))
        .expect("a free loopback port");
    listener.local_addr().expect("its address").port()
}

/// A fresh prefix (namespace of every subject and stream a test makes).
fn fresh_prefix() -> String {
    format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// Fail clearly when no server listens at `port`.
fn require_server(port: u16) {
    if TcpStream::connect(("127.0.0.1", port)).is_err() {
        panic!(
            "no NATS server at 127.0.0.1:{port}: start `nats-server -js -a 127.0.0.1 -p {port}` \
             (the NATS contract tests never skip)"
        );
    }
}

/// Host instances of the NATS adapter at `url`, all under `prefix` (a missing server fails
/// here).
async fn nats_factory(url: &str, prefix: &str, extra: Vec<(String, String)>) -> Factory {
    let mut options = vec![("prefix".to_string(), prefix.to_string())];
    options.extend(extra);
    Factory::for_url(url, None, options)
        .await
        .unwrap_or_else(|e| panic!("the NATS server at {url} must be running: {e:#}"))
}

/// Delete every stream under `prefix` on the server at `url`.
async fn delete_streams(url: &str, prefix: &str) {
    let Ok(driver) = NatsDriver::connect(url).await else {
        return;
    };
    let client = driver.client();
    let filter = format!("{{\"subject\":\"{prefix}.>\"}}");
    let Ok(answer) = client
        .request("$JS.API.STREAM.NAMES", filter.into_bytes().into())
        .await
    else {
        return;
    };
    let text = String::from_utf8_lossy(&answer.payload).into_owned();
    let Some(list) = text
        .split_once("\"streams\":[")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list.to_string())
    else {
        return;
    };
    for name in list.split(',').map(|n| n.trim().trim_matches('"')) {
        if name.starts_with(&format!("{prefix}_")) {
            let _ = client
                .request(format!("$JS.API.STREAM.DELETE.{name}"), "".into())
                .await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Restart

/// A `nats-server -js` of the test's own, on its own port with its own store directory.
struct OwnServer {
    child: Option<Child>,
    port: u16,
    store: PathBuf,
}

impl OwnServer {
    fn start() -> Self {
        let store =
            std::env::temp_dir().join(format!("wrpc-nats-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&store).expect("a store directory");
        let mut server = OwnServer {
            child: None,
            port: restart_port(),
            store,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let binary = [
            "nats-server",
            "/usr/sbin/nats-server",
            "/usr/local/bin/nats-server",
        ]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok())
        .expect("nats-server is installed (the NATS tests never skip)");
        let child = Command::new(binary)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not open port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kill the server (SIGKILL: no goodbye) and start it again on the same store.
    fn restart(&mut self) {
        self.kill();
        std::thread::sleep(Duration::from_millis(300));
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
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_nothing() {
    let mut server = OwnServer::start();
    let url: &'static str = format!("nats://127.0.0.1:{}", server.port).leak();
    let factory = nats_factory(
        url,
        "wrpc",
        vec![("queue.visibilityMs".into(), "2000".into())],
    )
    .await;
    let broker = factory.instance().await.expect("a host instance");
    let other = factory.instance().await.expect("a second host instance");

    // A log read and a queue run, both mid-way when the server goes down.
    let log = broker.log().unwrap();
    for chunk in 0..3 {
        let records = (chunk * 100..(chunk + 1) * 100)
            .map(|i| (format!("v{i}").into_bytes(), AppendOptions::default()))
            .collect();
        log.append_batch("restart-log", records)
            .await
            .expect("appends");
    }
    let mut reader = other
        .log()
        .unwrap()
        .read("restart-log", ReadFrom::Earliest)
        .await
        .expect("a reader");
    let mut read = Vec::new();
    while read.len() < 150 {
        let entry = tokio::time::timeout(Duration::from_secs(10), reader.next())
            .await
            .expect("entries before the restart")
            .expect("the reader is live")
            .expect("an entry");
        read.push(String::from_utf8_lossy(&entry.value).into_owned());
    }

    let queue = broker.queue().unwrap();
    let messages = (0..300)
        .map(|i| (format!("m{i}").into_bytes(), ProduceOptions::default()))
        .collect();
    queue
        .produce_batch("restart-queue", messages)
        .await
        .expect("produce");
    let handled: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let mut consumers = Vec::new();
    for host in [&broker, &other] {
        let handled = handled.clone();
        consumers.push(
            host.queue()
                .unwrap()
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
                .expect("a consumer"),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while handled.lock().unwrap().len() < 50 {
        assert!(Instant::now() < deadline, "the queue run did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = handled.lock().unwrap().len();
    server.restart();
    println!(
        "restarted the server with {before} of 300 messages handled and 150 of 300 entries read"
    );

    // After the restart: more work and more entries, through the same handles.
    let messages = (300..400)
        .map(|i| (format!("m{i}").into_bytes(), ProduceOptions::default()))
        .collect();
    queue
        .produce_batch("restart-queue", messages)
        .await
        .expect("produce after the restart");
    let records = (300..400)
        .map(|i| (format!("v{i}").into_bytes(), AppendOptions::default()))
        .collect();
    log.append_batch("restart-log", records)
        .await
        .expect("appends after the restart");

    let deadline = Instant::now() + Duration::from_secs(60);
    while handled.lock().unwrap().len() < 400 {
        assert!(
            Instant::now() < deadline,
            "{} of 400 messages handled after the restart",
            handled.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in &consumers {
        c.stop().await;
    }
    while read.len() < 400 {
        let entry = tokio::time::timeout(Duration::from_secs(30), reader.next())
            .await
            .unwrap_or_else(|_| panic!("entry {} of 400 after the restart", read.len()))
            .expect("the reader is live")
            .expect("an entry");
        read.push(String::from_utf8_lossy(&entry.value).into_owned());
    }
    let expected: Vec<String> = (0..400).map(|i| format!("v{i}")).collect();
    assert_eq!(
        read, expected,
        "the log read across the restart: every entry once, in order"
    );
    let all: BTreeSet<String> = (0..400).map(|i| format!("m{i}")).collect();
    assert_eq!(
        *handled.lock().unwrap(),
        all,
        "every message handled across the restart"
    );
}

/// A handler that runs far longer than `ack_wait` is not duplicated: the adapter keeps its
/// delivery alive with `+WPI` (DESIGN §4, long handlers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_handler_is_kept_alive_past_ack_wait() {
    require_server(4222);
    let prefix = fresh_prefix();
    let factory = nats_factory(
        URL,
        &prefix,
        vec![("queue.visibilityMs".into(), "600".into())],
    )
    .await;
    let a = factory.instance().await.expect("a host instance");
    let b = factory.instance().await.expect("a second host instance");
    let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
    let mut consumers = Vec::new();
    for host in [&a, &b] {
        let seen = seen.clone();
        consumers.push(
            host.queue()
                .unwrap()
                .consume(
                    "slow",
                    move |d: Delivery| {
                        let seen = seen.clone();
                        async move {
                            seen.lock().unwrap().push(d.attempt);
                            tokio::time::sleep(Duration::from_millis(2_000)).await;
                            Ok(())
                        }
                    },
                    ConsumeOptions {
                        prefetch: 1,
                        dead_letter: None,
                    },
                )
                .await
                .expect("a consumer"),
        );
    }
    a.queue()
        .unwrap()
        .produce("slow", "job", ProduceOptions::default())
        .await
        .expect("produce");
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    for c in &consumers {
        c.stop().await;
    }
    let seen = seen.lock().unwrap().clone();
    delete_streams(URL, &prefix).await;
    assert_eq!(
        seen,
        vec![1],
        "one delivery of a message whose handler ran 2 s with ack_wait 600 ms"
    );
}
