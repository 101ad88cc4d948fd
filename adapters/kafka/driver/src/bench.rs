//! The native side for Kafka: what the Kafka adapter issues, issued directly with `rdkafka`:
//! idempotent `acks=all` produces awaiting each delivery report to a one-partition topic for
//! the log (a batch: every record produced at once); catch-up as the adapter's `range`: per
//! page (sized as the host's readers size theirs), the watermarks and an assign-mode reader
//! from the page's offset, closed in the background after the page (as the driver's readers
//! are); a live read by one assign-mode
//! reader from the high watermark; for the queue, a batch produced at once to a four-partition
//! topic (the host's produce batch, every delivery report awaited), consumed by a
//! range-assigned group member, joined before the clock starts, that commits synchronously
//! once per `prefetch` records the next offset of each partition they came from (the
//! adapter's settlements of a batch share a commit per partition), one commit in flight while
//! it goes on taking records; produces keyed by channel to a one-partition topic read by one
//! assign-mode reader from the high watermark, its payloads fanned out locally, for the
//! backplane. There is no direct row (the adapter exports no direct).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use wrpc_broker_runtime::pages::PageSize;

use crate::client::{self, blocking, consumer_config};
use wrpc_broker_runtime::bench::{
    APPEND_BATCH, BenchFuture, CATCH_UP, FAN_OUT_PAYLOADS, NativeBench, QUEUE_BATCH, Sample,
    Workload, shared_subscription, timed, unique,
};

/// How long the bench waits for one record.
const WAIT: Duration = Duration::from_secs(10);
/// A commit in flight off the runtime.
type Commit = tokio::task::JoinHandle<Result<(), crate::bindings::wit::KafkaError>>;

/// Commit `list` synchronously for `consumer`, off the runtime (the driver's commit).
fn spawn_commit(consumer: &Arc<StreamConsumer>, list: TopicPartitionList) -> Commit {
    let consumer = consumer.clone();
    tokio::task::spawn_blocking(move || {
        consumer
            .commit(&list, CommitMode::Sync)
            .map_err(crate::convert::error)
    })
}

/// Wait for a commit spawned off the runtime.
async fn committed(commit: Commit) -> anyhow::Result<()> {
    commit.await?.map_err(|e| anyhow::anyhow!("commit: {e:?}"))
}

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

    /// Produce `count` records of `payload` to `topic` at once and await every report.
    async fn send_all(&self, topic: &str, count: usize, payload: &[u8]) -> anyhow::Result<()> {
        let sends = (0..count).map(|_| self.send(topic, None, payload));
        for sent in futures::future::join_all(sends).await {
            sent?;
        }
        Ok(())
    }

    /// Batches of [`APPEND_BATCH`] to a one-partition topic, one at a time: every record
    /// produced at once, every delivery report awaited (the adapter's batch append).
    pub async fn log_append_batch(&self, work: &Workload) -> anyhow::Result<Sample> {
        let name = unique("native-batch");
        self.topic(&name, 1).await?;
        let sample = timed(work.slice, || async {
            self.send_all(&name, APPEND_BATCH, &work.payload).await?;
            Ok(APPEND_BATCH as u64)
        })
        .await;
        self.drop_topic(&name).await?;
        sample
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
        let name = unique("native-queue");
        self.topic(&name, 4).await?;
        let mut config = consumer_config(&self.bootstrap, &name);
        config.set("partition.assignment.strategy", "range");
        let consumer: Arc<StreamConsumer> = Arc::new(config.create()?);
        consumer.subscribe(&[name.as_str()])?;
        // Join the group before the clock starts (the adapter's consumer has joined when the
        // row's clock starts): one record through and committed.
        self.send(&name, None, &work.payload).await?;
        let first = tokio::time::timeout(WAIT, consumer.recv())
            .await
            .context("no record within 10 s")??;
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(
            first.topic(),
            first.partition(),
            Offset::Offset(first.offset() + 1),
        )?;
        drop(first);
        committed(spawn_commit(&consumer, list)).await?;
        let mut sample = Sample::default();
        let mut in_flight: Option<Commit> = None;
        let started = Instant::now();
        while started.elapsed() < work.slice {
            self.send_all(&name, QUEUE_BATCH as usize, &work.payload)
                .await?;
            // Each `prefetch` records taken, one commit of the next offset of every partition
            // they came from: what the adapter's coalesced commits of a settled batch amount to.
            // As in the driver, one commit is in flight at a time and the records keep coming
            // meanwhile (the adapter's settlements wait on the member's commit lock, its
            // deliveries do not). As the adapter's row, a batch counts once its records are taken.
            let mut next: std::collections::BTreeMap<(String, i32), i64> = Default::default();
            for taken in 1..=QUEUE_BATCH {
                {
                    let m = tokio::time::timeout(WAIT, consumer.recv())
                        .await
                        .context("no record within 10 s")??;
                    next.insert((m.topic().to_string(), m.partition()), m.offset() + 1);
                }
                if !taken.is_multiple_of(u64::from(prefetch.max(1))) && taken < QUEUE_BATCH {
                    continue;
                }
                let mut list = TopicPartitionList::new();
                for ((topic, partition), offset) in std::mem::take(&mut next) {
                    list.add_partition_offset(&topic, partition, Offset::Offset(offset))?;
                }
                if let Some(previous) = in_flight.take() {
                    committed(previous).await?;
                }
                in_flight = Some(spawn_commit(&consumer, list));
            }
            sample.ops += QUEUE_BATCH;
        }
        if let Some(last) = in_flight {
            committed(last).await?;
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

    /// An assign-mode reader of partition 0 of `topic` from `offset`, as the adapter's.
    fn reader(&self, topic: &str, offset: Offset) -> anyhow::Result<StreamConsumer> {
        let mut config = consumer_config(&self.bootstrap, "wrpc-readers");
        config.set("auto.offset.reset", "error");
        let reader: StreamConsumer = config.create()?;
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(topic, 0, offset)?;
        reader.assign(&list)?;
        Ok(reader)
    }

    /// Close `reader` off the runtime (closing blocks).
    async fn close(reader: StreamConsumer) {
        let _ = blocking(move || {
            drop(reader);
            Ok(())
        })
        .await;
    }

    /// Take `count` records from `reader`.
    async fn take(reader: &StreamConsumer, count: u64) -> anyhow::Result<()> {
        for _ in 0..count {
            tokio::time::timeout(WAIT, reader.recv())
                .await
                .context("no record within 10 s")??;
        }
        Ok(())
    }

    /// The high watermark of partition 0 of `topic`, asked as the driver asks (again while the
    /// partition's leader is not known yet: the topic may have been created a moment ago).
    async fn high(&self, topic: &str) -> anyhow::Result<i64> {
        let (producer, topic) = (self.producer.clone(), topic.to_string());
        let marks = blocking(move || {
            use rdkafka::producer::Producer as _;
            client::watermarks_waiting(producer.client(), &topic).map_err(crate::convert::error)
        })
        .await
        .map_err(|e| anyhow::anyhow!("watermarks: {e:?}"))?;
        let first = marks
            .first()
            .context("watermarks: the topic has no partition")?;
        i64::try_from(first.high).context("watermarks: the high watermark is out of range")
    }

    pub async fn log_catch_up(&self, work: &Workload) -> anyhow::Result<Sample> {
        let name = unique("native-catchup");
        self.topic(&name, 1).await?;
        for _ in 0..CATCH_UP / 250 {
            self.send_all(&name, 250, &work.payload).await?;
        }
        let sample = timed(work.slice, || async {
            let (mut read, mut size) = (0u64, PageSize::default());
            while read < CATCH_UP as u64 {
                let high = self.high(&name).await?;
                ensure!(high >= CATCH_UP as i64, "{name}: high watermark {high}");
                let reader = self.reader(&name, Offset::Offset(read as i64))?;
                let page = u64::from(size.limit()).min(CATCH_UP as u64 - read);
                let taken = Self::take(&reader, page).await;
                // As the driver's readers: closed off the runtime, not waited for.
                tokio::task::spawn_blocking(move || drop(reader));
                taken?;
                read += page;
                // The host sizes pages by their entries' bytes: a payload each here.
                size.after_page(page as usize, page as usize * work.payload.len());
            }
            Ok(read)
        })
        .await;
        self.drop_topic(&name).await?;
        sample
    }

    pub async fn log_live(&self, work: &Workload) -> anyhow::Result<Sample> {
        let name = unique("native-live");
        self.topic(&name, 1).await?;
        let reader = self.reader(&name, Offset::Offset(self.high(&name).await?))?;
        let sample = timed(work.slice, || async {
            self.send(&name, None, &work.payload).await?;
            Self::take(&reader, 1).await?;
            Ok(1)
        })
        .await;
        Self::close(reader).await;
        self.drop_topic(&name).await?;
        sample
    }

    pub async fn fan_out(&self, work: &Workload, subscribers: usize) -> anyhow::Result<Sample> {
        // One reader for the channel, shared by every local subscriber, as the host does.
        let name = unique("native-bp");
        self.topic(&name, 1).await?;
        let reader = self.reader(&name, Offset::Offset(self.high(&name).await?))?;
        let deliveries = futures::stream::unfold(reader, |reader| async move {
            let payload = match reader.recv().await {
                Ok(m) if m.key() == Some(b"room".as_slice()) => m.payload().map(<[u8]>::to_vec),
                Ok(_) => None,
                Err(_) => return None,
            };
            Some((payload, reader))
        })
        .filter_map(|payload| futures::future::ready(payload.map(Arc::new)));
        let sample = shared_subscription(work, subscribers, deliveries, || async {
            for _ in 0..FAN_OUT_PAYLOADS {
                self.send(&name, Some(b"room"), &work.payload).await?;
            }
            Ok(())
        })
        .await;
        self.drop_topic(&name).await?;
        sample
    }
}

/// The bench's native side, shared by its in-flight workers.
pub struct Shared(pub Arc<Native>);

impl NativeBench for Shared {
    fn log_append<'a>(&'a self, work: &'a Workload, in_flight: usize) -> BenchFuture<'a> {
        Box::pin(async move { self.0.log_append(work, in_flight).await.map(Some) })
    }

    fn log_append_batch<'a>(&'a self, work: &'a Workload) -> BenchFuture<'a> {
        Box::pin(async move { self.0.log_append_batch(work).await.map(Some) })
    }

    fn queue_round_trip<'a>(&'a self, work: &'a Workload, prefetch: u32) -> BenchFuture<'a> {
        Box::pin(async move { self.0.queue_round_trip(work, prefetch).await.map(Some) })
    }

    fn log_catch_up<'a>(&'a self, work: &'a Workload) -> BenchFuture<'a> {
        Box::pin(async move { self.0.log_catch_up(work).await.map(Some) })
    }

    fn log_live<'a>(&'a self, work: &'a Workload) -> BenchFuture<'a> {
        Box::pin(async move { self.0.log_live(work).await.map(Some) })
    }

    fn fan_out<'a>(&'a self, work: &'a Workload, subscribers: usize) -> BenchFuture<'a> {
        Box::pin(async move { self.0.fan_out(work, subscribers).await.map(Some) })
    }
}
