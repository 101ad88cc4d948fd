//! The native side for Redis: the commands the Redis adapter issues, sent directly with the
//! `redis` crate — the adapter's own Lua scripts where it sends one (`scripts/append.lua`: the
//! epoch check and `XADD … MAXLEN`; `scripts/range.lua`: a catch-up page with the stream's
//! state), XREAD BLOCK, XREADGROUP + XACK/XDEL, a list per inbox with BLPOP,
//! PUBLISH/SUBSCRIBE.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamReadOptions, StreamReadReply};
use wrpc_broker_runtime::pages::PageSize;

use wrpc_broker_runtime::bench::{
    APPEND_BATCH, CATCH_UP, FAN_OUT_PAYLOADS, NativeBench, QUEUE_BATCH, Sample, Workload, joined,
    shared_subscription, timed, unique,
};

/// The adapter's scripts, sent as it sends them.
const APPEND: &str = include_str!("../../scripts/append.lua");
const RANGE: &str = include_str!("../../scripts/range.lua");
/// What the adapter writes as the `h` field of a record without headers (a zero count).
const NO_HEADERS: &[u8] = &[0; 4];
/// The stream's `MAXLEN`: the adapter's default `retention.maxEntries`.
const MAX_ENTRIES: u32 = 10_000;

/// A call of the adapter's append script on stream `key` (epoch key `epoch`) with `count`
/// records of `payload`, each without headers or key, as the adapter sends them.
fn append_call<'a>(
    script: &'a redis::Script,
    key: &str,
    epoch: &str,
    payload: &[u8],
    count: usize,
) -> redis::ScriptInvocation<'a> {
    let mut call = script.key(key);
    call.key(epoch).arg("native").arg(MAX_ENTRIES);
    for _ in 0..count {
        call.arg(payload).arg(NO_HEADERS).arg("0").arg("");
    }
    call
}

/// A client of the Redis server the broker uses.
pub struct Native {
    client: redis::Client,
}

impl Native {
    /// Connect to `url`.
    pub fn new(url: &str) -> anyhow::Result<Self> {
        Ok(Self {
            client: redis::Client::open(url)?,
        })
    }

    async fn connection(&self) -> anyhow::Result<MultiplexedConnection> {
        Ok(self.client.get_multiplexed_async_connection().await?)
    }

    pub async fn log_append(&self, work: &Workload, in_flight: usize) -> anyhow::Result<Sample> {
        let key = unique("native-append");
        let epoch = format!("{key}:epoch");
        let deadline = Instant::now() + work.slice;
        let started = Instant::now();
        let connection = self.connection().await?;
        let append = redis::Script::new(APPEND);
        let workers = (0..in_flight).map(|_| {
            let (mut connection, key, epoch, payload, append) = (
                connection.clone(),
                key.clone(),
                epoch.clone(),
                work.payload.clone(),
                append.clone(),
            );
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    // The adapter's append script (epoch check, then `XADD … MAXLEN = 0-*`).
                    let _: redis::Value = append_call(&append, &key, &epoch, &payload, 1)
                        .invoke_async(&mut connection)
                        .await?;
                    latencies.push(t.elapsed());
                }
                anyhow::Ok(latencies)
            })
        });
        let sample = joined(started, workers).await?;
        let _: () = connection.clone().del(&[&key, &epoch]).await?;
        Ok(sample)
    }

    /// Batches of [`APPEND_BATCH`], one at a time: one call of the adapter's append script
    /// with every record of the batch, as the adapter sends a batch.
    pub async fn log_append_batch(&self, work: &Workload) -> anyhow::Result<Sample> {
        let key = unique("native-batch");
        let epoch = format!("{key}:epoch");
        let connection = self.connection().await?;
        let append = redis::Script::new(APPEND);
        let sample = timed(work.slice, || {
            let mut connection = connection.clone();
            let call = append_call(&append, &key, &epoch, &work.payload, APPEND_BATCH);
            async move {
                let _: redis::Value = call.invoke_async(&mut connection).await?;
                Ok(APPEND_BATCH as u64)
            }
        })
        .await;
        let _: () = connection.clone().del(&[&key, &epoch]).await?;
        sample
    }

    pub async fn log_catch_up(&self, work: &Workload) -> anyhow::Result<Sample> {
        let key = unique("native-catchup");
        let epoch = format!("{key}:epoch");
        let mut connection = self.connection().await?;
        let _: () = connection.set(&epoch, "native").await?;
        for _ in 0..CATCH_UP / 250 {
            let mut pipe = redis::pipe();
            for _ in 0..250 {
                pipe.cmd("XADD")
                    .arg(&key)
                    .arg("0-*")
                    .arg("v")
                    .arg(&work.payload)
                    .arg("h")
                    .arg(NO_HEADERS)
                    .ignore();
            }
            let _: () = pipe.query_async(&mut connection).await?;
        }
        // The adapter's page: the stream's state and a page of entries (sized as the host's
        // readers size theirs), one script call.
        let range = redis::Script::new(RANGE);
        let sample = timed(work.slice, || {
            let (mut connection, key, epoch, range) =
                (connection.clone(), key.clone(), epoch.clone(), &range);
            async move {
                let mut start = "-".to_string();
                let (mut read, mut size) = (0, PageSize::default());
                loop {
                    let page: (
                        redis::Value,
                        redis::Value,
                        redis::Value,
                        redis::Value,
                        Vec<redis::Value>,
                    ) = range
                        .key(&key)
                        .key(&epoch)
                        .arg(&start)
                        .arg(size.limit())
                        .invoke_async(&mut connection)
                        .await?;
                    let Some(redis::Value::Array(last)) = page.4.last() else {
                        break;
                    };
                    let id: String = redis::from_redis_value(&last[0])?;
                    start = format!("({id}");
                    read += page.4.len();
                    // The host sizes pages by their entries' bytes: a payload each here.
                    size.after_page(page.4.len(), page.4.len() * work.payload.len());
                }
                Ok(read as u64)
            }
        })
        .await;
        let _: () = connection.del(&[&key, &epoch]).await?;
        sample
    }

    pub async fn log_live(&self, work: &Workload) -> anyhow::Result<Sample> {
        let key = unique("native-live");
        let epoch = format!("{key}:epoch");
        let append = redis::Script::new(APPEND);
        let mut writer = self.connection().await?;
        let mut reader = self.client.get_multiplexed_async_connection().await?;
        let mut last = "$".to_string();
        let started = Instant::now();
        let mut sample = Sample::default();
        while started.elapsed() < work.slice {
            let t = Instant::now();
            let read = {
                let options = StreamReadOptions::default().block(1000).count(1);
                let key = key.clone();
                let last = last.clone();
                let mut reader = reader.clone();
                tokio::spawn(async move {
                    let reply: StreamReadReply =
                        reader.xread_options(&[&key], &[&last], &options).await?;
                    anyhow::Ok(reply)
                })
            };
            // XREAD from `$` must be waiting before the XADD; from an id it need not.
            if last == "$" {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // The adapter's append script, as in the append rows.
            let (_, ids): (redis::Value, Vec<String>) =
                append_call(&append, &key, &epoch, &work.payload, 1)
                    .invoke_async(&mut writer)
                    .await?;
            let id = ids
                .into_iter()
                .next()
                .context("the append script gave no id")?;
            let reply = read.await??;
            reply
                .keys
                .first()
                .and_then(|k| k.ids.first())
                .context("XREAD returned nothing")?;
            last = id;
            sample.latencies.push(t.elapsed());
            sample.ops += 1;
        }
        sample.elapsed = started.elapsed();
        let _: () = reader.del(&[&key, &epoch]).await?;
        Ok(sample)
    }

    pub async fn queue_round_trip(&self, work: &Workload, prefetch: u32) -> anyhow::Result<Sample> {
        let key = unique("native-queue");
        let mut connection = self.connection().await?;
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg("g")
            .arg("$")
            .arg("MKSTREAM")
            .query_async(&mut connection)
            .await?;
        let mut sample = timed(work.slice, || {
            let (mut connection, key, payload) =
                (connection.clone(), key.clone(), work.payload.clone());
            async move {
                let mut pipe = redis::pipe();
                for _ in 0..QUEUE_BATCH {
                    pipe.cmd("XADD")
                        .arg(&key)
                        .arg("*")
                        .arg("v")
                        .arg(&payload)
                        .ignore();
                }
                let _: () = pipe.query_async(&mut connection).await?;
                let mut done = 0;
                let options = StreamReadOptions::default()
                    .group("g", "c")
                    .count(prefetch as usize);
                while done < QUEUE_BATCH {
                    let reply: StreamReadReply =
                        connection.xread_options(&[&key], &[">"], &options).await?;
                    let ids: Vec<String> = reply
                        .keys
                        .iter()
                        .flat_map(|k| k.ids.iter().map(|i| i.id.clone()))
                        .collect();
                    if ids.is_empty() {
                        continue;
                    }
                    // What the adapter's ack does: acknowledge, and delete the entries (the
                    // queue's depth is the stream's length), in one round trip.
                    let _: (u64, u64) = redis::pipe()
                        .xack(&key, "g", &ids)
                        .xdel(&key, &ids)
                        .query_async(&mut connection)
                        .await?;
                    done += ids.len() as u64;
                }
                Ok(QUEUE_BATCH)
            }
        })
        .await?;
        let _: () = connection.del(&key).await?;
        sample.latencies.clear();
        Ok(sample)
    }

    pub async fn request_reply(&self, work: &Workload) -> anyhow::Result<Sample> {
        let (requests, replies) = (unique("native-rr"), unique("native-inbox"));
        let server = {
            let client = self.client.clone();
            let (requests, replies) = (requests.clone(), replies.clone());
            tokio::spawn(async move {
                let mut connection = client.get_multiplexed_async_connection().await?;
                loop {
                    let popped: Option<(String, Vec<u8>)> =
                        connection.blpop(&requests, 1.0).await?;
                    if let Some((_, body)) = popped {
                        let _: () = connection.lpush(&replies, body).await?;
                    }
                }
                #[allow(unreachable_code)]
                anyhow::Ok(())
            })
        };
        let mut connection = self.client.get_multiplexed_async_connection().await?;
        let started = Instant::now();
        let mut sample = Sample::default();
        while started.elapsed() < work.slice {
            let t = Instant::now();
            let _: () = connection.lpush(&requests, &work.payload).await?;
            let _: Option<(String, Vec<u8>)> = connection.blpop(&replies, 5.0).await?;
            sample.latencies.push(t.elapsed());
            sample.ops += 1;
        }
        sample.elapsed = started.elapsed();
        server.abort();
        Ok(sample)
    }

    pub async fn fan_out(&self, work: &Workload, subscribers: usize) -> anyhow::Result<Sample> {
        // One SUBSCRIBE for the channel, shared by every local subscriber, as the host does.
        let channel = unique("native-room");
        let mut pubsub = self.client.get_async_pubsub().await?;
        pubsub.subscribe(&channel).await?;
        let deliveries = pubsub
            .into_on_message()
            .map(|message| std::sync::Arc::new(message.get_payload_bytes().to_vec()));
        let connection = self.connection().await?;
        shared_subscription(work, subscribers, deliveries, || {
            let (mut connection, channel, payload) =
                (connection.clone(), channel.clone(), work.payload.clone());
            async move {
                for _ in 0..FAN_OUT_PAYLOADS {
                    let _: u64 = connection.publish(&channel, &payload).await?;
                }
                Ok(())
            }
        })
        .await
    }
}

impl NativeBench for Native {
    wrpc_broker_runtime::native_bench_rows!(
        log_append(in_flight: usize),
        log_append_batch(),
        log_catch_up(),
        log_live(),
        queue_round_trip(prefetch: u32),
        request_reply(),
        fan_out(subscribers: usize),
    );
}
