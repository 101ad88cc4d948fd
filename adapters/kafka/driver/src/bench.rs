//! The native side for Kafka: what the Kafka adapter issues, issued directly with `rdkafka`:
//! idempotent `acks=all` produces awaiting each delivery report to a one-partition topic for
//! the log; a batch produced to a four-partition topic, consumed by a range-assigned group
//! member that commits each message's next offset synchronously for the queue; produces keyed
//! by channel to a one-partition topic read by an assign-mode reader from the high watermark
//! for the backplane. There is no direct row (the adapter exports no direct).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::client::{self, blocking, consumer_config};
use wrpc_broker_runtime::bench::{
    BenchFuture, FAN_OUT_PAYLOADS, NativeBench, QUEUE_BATCH, Sample, Workload, unique,
};

/// How long the bench waits for one record.
const WAIT: Duration = Duration::from_secs(10);

/// Clients of the cluster the broker uses.
pub struct Native {
    bootstrap: String,
    producer: FutureProducer,
    admin: AdminClient<DefaultClientContext>,
}

impl Native {
    /// Clients of the cluster at `url`.
    pub async fn new(url: &str) -> anyhow::Result<Self> {
        let bootstrap = client::bootstrap_servers(url).map_err(anyhow::Error::msg)?;
        Ok(Self {
            producer: client::producer(&bootstrap).map_err(anyhow::Error::msg)?,
            admin: client::admin(&bootstrap).map_err(anyhow::Error::msg)?,
            bootstrap,
        })
    }

    /// Create topic `name` with `partitions` partitions.
    async fn topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        for answer in self
            .admin
            .create_topics([&topic], &AdminOptions::new())
            .await?
        {
            answer.map_err(|(name, code)| anyhow::anyhow!("creating {name}: {code}"))?;
        }
        Ok(())
    }

    /// Delete topic `name`.
    async fn drop_topic(&self, name: &str) -> anyhow::Result<()> {
        self.admin
            .delete_topics(&[name], &AdminOptions::new())
            .await?;
        Ok(())
    }

    /// Produce one record and await its delivery report.
    async fn send(&self, topic: &str, key: Option<&[u8]>, payload: &[u8]) -> anyhow::Result<()> {
        let mut record = FutureRecord::<[u8], [u8]>::to(topic).payload(payload);
        if let Some(key) = key {
            record = record.key(key);
        }
        self.producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| anyhow::anyhow!("produce to {topic}: {e}"))?;
        Ok(())
    }

    pub async fn log_append(
        self: &Arc<Self>,
        work: &Workload,
        in_flight: usize,
    ) -> anyhow::Result<Sample> {
        let name = unique("native-append");
        self.topic(&name, 1).await?;
        let deadline = Instant::now() + work.slice;
        let started = Instant::now();
        let workers = (0..in_flight).map(|_| {
            let (native, name, payload) = (self.clone(), name.clone(), work.payload.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    native.send(&name, None, &payload).await?;
                    latencies.push(t.elapsed());
                }
                anyhow::Ok(latencies)
            })
        });
        let sample =
            wrpc_broker_runtime::bench::joined(started, workers.collect::<Vec<_>>()).await?;
        self.drop_topic(&name).await?;
        Ok(sample)
    }

    pub async fn queue_round_trip(&self, work: &Workload, prefetch: u32) -> anyhow::Result<Sample> {
        let _ = prefetch;
        let name = unique("native-queue");
        self.topic(&name, 4).await?;
        let mut config = consumer_config(&self.bootstrap, &name);
        config.set("partition.assignment.strategy", "range");
        let consumer: Arc<StreamConsumer> = Arc::new(config.create()?);
        consumer.subscribe(&[name.as_str()])?;
        let mut sample = Sample::default();
        let started = Instant::now();
        while started.elapsed() < work.slice {
            for _ in 0..QUEUE_BATCH {
                self.send(&name, None, &work.payload).await?;
            }
            for _ in 0..QUEUE_BATCH {
                let (topic, partition, offset) = {
                    let m = tokio::time::timeout(WAIT, consumer.recv())
                        .await
                        .context("no record within 10 s")??;
                    (m.topic().to_string(), m.partition(), m.offset())
                };
                let mut list = TopicPartitionList::new();
                list.add_partition_offset(&topic, partition, Offset::Offset(offset + 1))?;
                let consumer = consumer.clone();
                blocking(move || {
                    consumer
                        .commit(&list, CommitMode::Sync)
                        .map_err(crate::convert::error)
                })
                .await
                .map_err(|e| anyhow::anyhow!("commit: {e:?}"))?;
            }
            sample.ops += QUEUE_BATCH;
        }
        sample.elapsed = started.elapsed();
        let _ = blocking(move || {
            drop(consumer);
            Ok(())
        })
        .await;
        self.drop_topic(&name).await?;
        Ok(sample)
    }

    pub async fn fan_out(
        &self,
        work: &Workload,
        subscribers: usize,
    ) -> anyhow::Result<Option<Sample>> {
        // One reader per subscription, as the adapter's; the 1000-subscriber row has no
        // native side.
        if subscribers != 1 {
            return Ok(None);
        }
        let name = unique("native-bp");
        self.topic(&name, 1).await?;
        let reader: StreamConsumer = consumer_config(&self.bootstrap, "wrpc-readers").create()?;
        // From the beginning of the fresh topic: `End` resolves only when the reader first
        // fetches, after the first round's records may already be there.
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&name, 0, Offset::Beginning)?;
        reader.assign(&list)?;
        let mut sample = Sample::default();
        let started = Instant::now();
        {
            let mut records = reader.stream();
            while started.elapsed() < work.slice {
                for _ in 0..FAN_OUT_PAYLOADS {
                    self.send(&name, Some(b"room"), &work.payload).await?;
                }
                let mut got = 0;
                while got < FAN_OUT_PAYLOADS {
                    let m = tokio::time::timeout(WAIT, records.next())
                        .await
                        .context("no payload within 10 s")?
                        .context("the reader ended")??;
                    ensure!(
                        m.key() == Some(b"room".as_slice()),
                        "a record of another channel"
                    );
                    got += 1;
                }
                sample.ops += FAN_OUT_PAYLOADS;
            }
        }
        sample.elapsed = started.elapsed();
        let _ = blocking(move || {
            drop(reader);
            Ok(())
        })
        .await;
        self.drop_topic(&name).await?;
        Ok(Some(sample))
    }
}

/// The bench's native side, shared by its in-flight workers.
pub struct Shared(pub Arc<Native>);

impl NativeBench for Shared {
    fn log_append<'a>(&'a self, work: &'a Workload, in_flight: usize) -> BenchFuture<'a> {
        Box::pin(async move { self.0.log_append(work, in_flight).await.map(Some) })
    }

    fn queue_round_trip<'a>(&'a self, work: &'a Workload, prefetch: u32) -> BenchFuture<'a> {
        Box::pin(async move { self.0.queue_round_trip(work, prefetch).await.map(Some) })
    }

    fn fan_out<'a>(&'a self, work: &'a Workload, subscribers: usize) -> BenchFuture<'a> {
        Box::pin(self.0.fan_out(work, subscribers))
    }
}
