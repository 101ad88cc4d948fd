//! The Redis adapter beyond the contract suite (which `tests/tests/contract.rs` runs against it): the
//! suite's restart scenario on a `redis-server` of its own, and interop and queue tests with a
//! plain Redis client on the Redis server at 127.0.0.1:6379 — a missing server is a failure,
//! never a skip.
//!
//! Two host instances of the suite are two `Broker`s, each with its own driver connections,
//! on one server: like two processes of one deployment. Valkey, KeyDB and Dragonfly speak the
//! same protocol: point `WRPC_REDIS_URL` at one to run the suite against it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wrpc_broker::{AppendOptions, Broker, ConsumeOptions, Delivery, ProduceOptions};
use wrpc_broker_contract::Factory;
use wrpc_broker_contract::restart::{self, ServerRecipe};

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

/// The suite's restart scenario on a `redis-server` of the test's own, preferably on port 6391,
/// persisting every write (AOF with `appendfsync always`, no RDB snapshots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_nothing() -> anyhow::Result<()> {
    let server = ServerRecipe::new("redis-server", "apt-get install redis-server", 6391)
        .args(["--port", "{port}", "--bind", "127.0.0.1", "--dir", "{data}"])
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .args(["--save", ""])
        .url("redis://127.0.0.1:{port}")
        .option("queue.visibilityMs", "1000");
    restart::a_server_restart_loses_nothing(server).await
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
}
