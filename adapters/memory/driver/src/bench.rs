//! The native side for the memory broker: the `wrpc:memory` store called directly, with the
//! calls the memory adapter makes for each operation.

use std::sync::Arc;
use std::time::Instant;

use crate::store::{LogRecord, MemoryStore, Packet, Queued};
use anyhow::Context as _;
use wrpc_broker_runtime::pages::{PageSize, entry_bytes};

use wrpc_broker_runtime::bench::{
    APPEND_BATCH, CATCH_UP, FAN_OUT_PAYLOADS, NativeBench, QUEUE_BATCH, Sample, Tally, Workload,
    fan_out_round, joined, timed, unique,
};

/// The memory store, used natively.
pub struct Native {
    store: Arc<MemoryStore>,
}

/// Retention the adapter uses by default.
const MAX_ENTRIES: u32 = 10_000;

fn record(payload: &[u8]) -> LogRecord {
    LogRecord {
        value: payload.to_vec(),
        headers: vec![],
        key: None,
    }
}

impl Native {
    /// The native side of `store`.
    pub fn new(store: Arc<MemoryStore>) -> Self {
        Self { store }
    }

    pub async fn log_append(&self, work: &Workload, in_flight: usize) -> anyhow::Result<Sample> {
        let topic = unique("native-append");
        let deadline = Instant::now() + work.slice;
        let started = Instant::now();
        let workers = (0..in_flight).map(|_| {
            let (store, topic, payload) = (self.store.clone(), topic.clone(), work.payload.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    store.log_append(&topic, "bench", MAX_ENTRIES, vec![record(&payload)]);
                    latencies.push(t.elapsed());
                    if latencies.len() % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                Ok(latencies)
            })
        });
        joined(started, workers).await
    }

    pub async fn log_append_batch(&self, work: &Workload) -> anyhow::Result<Sample> {
        let topic = unique("native-batch");
        timed(work.slice, || async {
            let batch = (0..APPEND_BATCH).map(|_| record(&work.payload)).collect();
            self.store.log_append(&topic, "bench", MAX_ENTRIES, batch);
            tokio::task::yield_now().await;
            Ok(APPEND_BATCH as u64)
        })
        .await
    }

    pub async fn log_catch_up(&self, work: &Workload) -> anyhow::Result<Sample> {
        let topic = unique("native-catchup");
        for _ in 0..CATCH_UP / 250 {
            self.store.log_append(
                &topic,
                "bench",
                MAX_ENTRIES,
                (0..250).map(|_| record(&work.payload)).collect(),
            );
        }
        timed(work.slice, || {
            let (store, topic) = (self.store.clone(), topic.clone());
            async move {
                let (mut offset, mut read, mut size) = (0, 0, PageSize::default());
                while read < CATCH_UP {
                    let (_, page) = store.log_read(&topic, offset, size.limit())?;
                    let bytes = page
                        .iter()
                        .map(|e| entry_bytes(&e.value, e.key.as_deref(), &e.headers))
                        .sum();
                    size.after_page(page.len(), bytes);
                    offset += page.len() as u64;
                    read += page.len();
                }
                Ok(read as u64)
            }
        })
        .await
    }

    pub async fn log_live(&self, work: &Workload) -> anyhow::Result<Sample> {
        let topic = unique("native-live");
        let info = self.store.log_open(&topic, "bench", MAX_ENTRIES);
        let mut follower = self.store.log_follow(&topic, info.next);
        let started = Instant::now();
        let mut sample = Sample::default();
        while started.elapsed() < work.slice {
            let t = Instant::now();
            self.store
                .log_append(&topic, "bench", MAX_ENTRIES, vec![record(&work.payload)]);
            follower.next_batch(1).await.context("follower ended")?;
            sample.latencies.push(t.elapsed());
            sample.ops += 1;
        }
        sample.elapsed = started.elapsed();
        Ok(sample)
    }

    pub async fn queue_round_trip(&self, work: &Workload, prefetch: u32) -> anyhow::Result<Sample> {
        let name = unique("native-queue");
        let mut sample = timed(work.slice, || {
            let (store, name, payload) = (self.store.clone(), name.clone(), work.payload.clone());
            async move {
                let batch = (0..QUEUE_BATCH)
                    .map(|_| Queued {
                        body: payload.clone(),
                        headers: vec![],
                        delay_ms: 0,
                    })
                    .collect();
                store.queue_push(&name, batch)?;
                let mut done = 0;
                while done < QUEUE_BATCH {
                    let leased = store.queue_receive(&name, prefetch, 30_000, 1000).await;
                    let receipts: Vec<u64> = leased.iter().map(|r| r.receipt).collect();
                    for result in store.queue_ack(&name, &receipts) {
                        result?;
                    }
                    done += receipts.len() as u64;
                }
                Ok(QUEUE_BATCH)
            }
        })
        .await?;
        sample.latencies.clear();
        Ok(sample)
    }

    pub async fn request_reply(&self, work: &Workload) -> anyhow::Result<Sample> {
        let (service, inbox) = (unique("native-rr"), unique("native-inbox"));
        let mut requests = self.store.inbox_listen(&service, None);
        let server = {
            let store = self.store.clone();
            tokio::spawn(async move {
                while let Some(batch) = requests.next_batch(64).await {
                    for packet in batch {
                        let Some(reply_to) = packet.reply_to.clone() else {
                            continue;
                        };
                        let reply = Packet {
                            body: packet.body,
                            headers: vec![],
                            correlation_id: packet.correlation_id,
                            reply_to: None,
                        };
                        let _ = store.inbox_send(&reply_to, reply, 5000).await;
                    }
                }
            })
        };
        let mut replies = self.store.inbox_listen(&inbox, None);
        let started = Instant::now();
        let mut sample = Sample::default();
        let mut correlation = 0u64;
        while started.elapsed() < work.slice {
            correlation += 1;
            let t = Instant::now();
            let request = Packet {
                body: work.payload.clone(),
                headers: vec![],
                correlation_id: Some(correlation.to_string()),
                reply_to: Some(inbox.clone()),
            };
            self.store.inbox_send(&service, request, 5000).await?;
            replies.next_batch(1).await.context("reply inbox ended")?;
            sample.latencies.push(t.elapsed());
            sample.ops += 1;
        }
        sample.elapsed = started.elapsed();
        server.abort();
        Ok(sample)
    }

    pub async fn fan_out(&self, work: &Workload, subscribers: usize) -> anyhow::Result<Sample> {
        let channel = unique("native-room");
        let received = Arc::new(Tally::default());
        let tasks: Vec<_> = (0..subscribers)
            .map(|_| {
                let mut subscription = self.store.channel_subscribe(&channel);
                let received = received.clone();
                tokio::spawn(async move {
                    while let Some(batch) = subscription.next_batch(256).await {
                        received.add(batch.len() as u64);
                    }
                })
            })
            .collect();
        let mut sample = timed(work.slice, || {
            let (store, channel, received, payload) = (
                self.store.clone(),
                channel.clone(),
                received.clone(),
                work.payload.clone(),
            );
            async move {
                fan_out_round(&received, subscribers, async {
                    for _ in 0..FAN_OUT_PAYLOADS {
                        store.channel_publish(&channel, vec![payload.clone()]);
                    }
                    Ok(())
                })
                .await
            }
        })
        .await?;
        for task in tasks {
            task.abort();
        }
        sample.latencies.clear();
        Ok(sample)
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
