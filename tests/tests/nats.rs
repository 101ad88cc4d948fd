//! The NATS adapter beyond the contract suite (which `tests/contract.rs` runs against it): the
//! suite's restart scenario on a server of its own (killed and restarted mid queue run and mid
//! log read: nothing lost) and a long-handler test (kept alive past `ack_wait` with `+WPI`) on the
//! `nats-server -js` at 127.0.0.1:4222. A missing server fails these tests: they are never
//! skipped. The long-handler test works under a prefix of its own and deletes its streams at
//! the end, so runs leave nothing behind on the shared server.

use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wrpc_broker::drivers::nats::NatsDriver;
use wrpc_broker::{ConsumeOptions, Delivery, ProduceOptions};
use wrpc_broker_contract::Factory;
use wrpc_broker_contract::restart::{self, ServerRecipe};

/// The shared server the suite runs against.
const URL: &str = "nats://127.0.0.1:4222";

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

/// The suite's restart scenario on a `nats-server -js` of the test's own, preferably on port
/// 4233, with a store directory of its own (what JetStream acknowledged survives a kill of the
/// process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_nothing() -> anyhow::Result<()> {
    let server = ServerRecipe::new("nats-server", "apt-get install nats-server", 4233)
        .args(["-js", "-a", "127.0.0.1", "-p", "{port}", "-sd", "{data}"])
        .url("nats://127.0.0.1:{port}")
        .option("prefix", "wrpc")
        .option("queue.visibilityMs", "2000");
    restart::a_server_restart_loses_nothing(server).await
}

/// A handler that runs far longer than `ack_wait` is not duplicated: the adapter keeps its
/// delivery alive with `+WPI` (DESIGN §4, long handlers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_handler_is_kept_alive_past_ack_wait() {
    require_server(4222);
    let prefix = fresh_prefix();
    let factory = nats_factory(URL, &prefix, vec![("queue.visibilityMs".into(), "600".into())]).await;
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
