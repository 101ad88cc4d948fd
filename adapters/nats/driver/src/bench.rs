//! The native side for NATS: what the NATS adapter sends, sent directly with `async-nats`:
//! JetStream publishes acknowledged by the server for the log, a work-queue stream with a pull
//! consumer (`$JS.API.CONSUMER.MSG.NEXT`, `+ACK` awaited) for the queue, core request/reply for
//! direct, and core PUB/SUB for the backplane.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::StreamExt;

use wrpc_broker_runtime::bench::{
    BenchFuture, FAN_OUT_PAYLOADS, NativeBench, QUEUE_BATCH, Sample, Workload, joined, reach,
    timed, unique,
};

/// A client of the NATS server the broker uses.
pub struct Native {
    client: async_nats::Client,
}

/// A stream name and subject that NATS accepts.
fn stream_name(prefix: &str) -> String {
    unique(prefix).replace('-', "_")
}

impl Native {
    /// Connect to `url`.
    pub async fn new(url: &str) -> anyhow::Result<Self> {
        Ok(Self {
            client: async_nats::connect(url).await?,
        })
    }

    async fn api(&self, subject: String, body: String) -> anyhow::Result<()> {
        let reply = self.client.request(subject.clone(), body.into()).await?;
        let text = String::from_utf8_lossy(&reply.payload);
        ensure!(!text.contains("\"error\""), "{subject}: {text}");
        Ok(())
    }

    async fn create_stream(&self, name: &str, retention: &str) -> anyhow::Result<()> {
        self.api(
            format!("$JS.API.STREAM.CREATE.{name}"),
            format!(r#"{{"name":"{name}","subjects":["{name}.in"],"retention":"{retention}","max_msgs":10000,"storage":"file"}}"#),
        )
        .await
    }

    async fn delete_stream(&self, name: &str) -> anyhow::Result<()> {
        self.api(format!("$JS.API.STREAM.DELETE.{name}"), String::new())
            .await
    }

    pub async fn log_append(&self, work: &Workload, in_flight: usize) -> anyhow::Result<Sample> {
        let name = stream_name("native_append");
        self.create_stream(&name, "limits").await?;
        let deadline = Instant::now() + work.slice;
        let started = Instant::now();
        let workers = (0..in_flight).map(|_| {
            let (client, subject, payload) = (
                self.client.clone(),
                format!("{name}.in"),
                work.payload.clone(),
            );
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    client
                        .request(subject.clone(), payload.clone().into())
                        .await?;
                    latencies.push(t.elapsed());
                }
                anyhow::Ok(latencies)
            })
        });
        let sample = joined(started, workers).await?;
        self.delete_stream(&name).await?;
        Ok(sample)
    }

    pub async fn queue_round_trip(&self, work: &Workload, prefetch: u32) -> anyhow::Result<Sample> {
        let name = stream_name("native_queue");
        self.create_stream(&name, "workqueue").await?;
        self.api(
            format!("$JS.API.CONSUMER.DURABLE.CREATE.{name}.c"),
            format!(r#"{{"stream_name":"{name}","config":{{"durable_name":"c","ack_policy":"explicit","ack_wait":30000000000,"max_ack_pending":-1}}}}"#),
        )
        .await?;
        let inbox = self.client.new_inbox();
        let mut deliveries = self.client.subscribe(inbox.clone()).await?;
        let mut sample = Sample::default();
        let started = Instant::now();
        while started.elapsed() < work.slice {
            let produced = (0..QUEUE_BATCH).map(|_| {
                self.client
                    .request(format!("{name}.in"), work.payload.clone().into())
            });
            for result in futures::future::join_all(produced).await {
                result?;
            }
            let mut done = 0;
            while done < QUEUE_BATCH {
                let pull = format!(r#"{{"batch":{prefetch},"no_wait":true}}"#);
                self.client
                    .publish_with_reply(
                        format!("$JS.API.CONSUMER.MSG.NEXT.{name}.c"),
                        inbox.clone(),
                        pull.into(),
                    )
                    .await?;
                let mut taken = 0;
                while taken < prefetch {
                    let Ok(Some(message)) =
                        tokio::time::timeout(Duration::from_secs(2), deliveries.next()).await
                    else {
                        break;
                    };
                    if message.status.is_some() {
                        break;
                    }
                    let ack = message
                        .reply
                        .clone()
                        .context("a delivery without an ack subject")?;
                    self.client.request(ack, "+ACK".into()).await?;
                    taken += 1;
                    done += 1;
                }
            }
            sample.ops += QUEUE_BATCH;
        }
        sample.elapsed = started.elapsed();
        self.delete_stream(&name).await?;
        Ok(sample)
    }

    pub async fn request_reply(&self, work: &Workload) -> anyhow::Result<Sample> {
        let subject = stream_name("native_rr");
        let mut requests = self.client.subscribe(subject.clone()).await?;
        let responder = {
            let client = self.client.clone();
            tokio::spawn(async move {
                while let Some(request) = requests.next().await {
                    if let Some(reply) = request.reply {
                        let _ = client.publish(reply, request.payload).await;
                    }
                }
            })
        };
        self.client.flush().await?;
        let sample = timed(work.slice, || {
            let (client, subject, payload) =
                (self.client.clone(), subject.clone(), work.payload.clone());
            async move {
                client.request(subject, payload.into()).await?;
                Ok(1)
            }
        })
        .await;
        responder.abort();
        sample
    }

    pub async fn fan_out(
        &self,
        work: &Workload,
        subscribers: usize,
    ) -> anyhow::Result<Option<Sample>> {
        // One subscription per subscriber, as a plain client would; the 1000-subscriber row has
        // no native side.
        if subscribers != 1 {
            return Ok(None);
        }
        let subject = stream_name("native_room");
        let mut subscription = self.client.subscribe(subject.clone()).await?;
        let received = Arc::new(AtomicU64::new(0));
        let counting = {
            let received = received.clone();
            tokio::spawn(async move {
                while subscription.next().await.is_some() {
                    received.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        self.client.flush().await?;
        let mut sample = timed(work.slice, || {
            let (client, subject, payload, received) = (
                self.client.clone(),
                subject.clone(),
                work.payload.clone(),
                received.clone(),
            );
            async move {
                let target = received.load(Ordering::Relaxed) + FAN_OUT_PAYLOADS;
                for _ in 0..FAN_OUT_PAYLOADS {
                    client
                        .publish(subject.clone(), payload.clone().into())
                        .await?;
                }
                client.flush().await?;
                reach(&received, target, Duration::from_secs(10)).await;
                Ok(FAN_OUT_PAYLOADS)
            }
        })
        .await?;
        counting.abort();
        sample.latencies.clear();
        Ok(Some(sample))
    }
}

impl NativeBench for Native {
    wrpc_broker_runtime::native_bench_rows!(
        log_append(in_flight: usize),
        queue_round_trip(prefetch: u32),
        request_reply(),
    );

    fn fan_out<'a>(&'a self, work: &'a Workload, subscribers: usize) -> BenchFuture<'a> {
        Box::pin(Native::fan_out(self, work, subscribers))
    }
}
