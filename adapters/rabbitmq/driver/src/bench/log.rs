//! The native side's log rows: confirmed publishes to a stream queue, each entry with its
//! epoch header and a message id, and the adapter's read-back (a stream consumer started
//! before the first publish that learns each entry's offset by its message id) before an
//! append counts; reads as the adapter's (a stream consumer from `x-stream-offset`, credit
//! 1000, per catch-up page; one for a live tail).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel};
use tokio::sync::oneshot;

use super::{Native, publish, publish_batch};
use wrpc_broker_runtime::bench::{APPEND_BATCH, CATCH_UP, Sample, Workload, joined, timed, unique};
use wrpc_broker_runtime::pages::PageSize;

/// The credit of the adapter's stream readers (`adapters/rabbitmq/src/log`).
const READ_PREFETCH: u16 = 1_000;
/// A stream reader acknowledges (`multiple`) every this many deliveries, for credit, as the
/// adapter's (`adapters/rabbitmq/src/inbox.rs`).
const ACK_EVERY: u64 = 64;
/// How long an append waits for its read-back, as the adapter's.
const READ_BACK: Duration = Duration::from_secs(10);

/// An entry's properties as the adapter's: persistent, a fresh message id, the epoch header.
fn entry_properties() -> (String, BasicProperties) {
    let id = unique("m");
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from("x-wrpc-epoch"),
        AMQPValue::LongString("native".into()),
    );
    let properties = BasicProperties::default()
        .with_message_id(id.as_str().into())
        .with_delivery_mode(2)
        .with_headers(headers);
    (id, properties)
}

/// A delivery's stream offset (`x-stream-offset`).
fn stream_offset(delivery: &lapin::message::Delivery) -> Option<u64> {
    let headers = delivery.properties.headers().as_ref()?;
    match headers.inner().get("x-stream-offset")? {
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// Where the appended entries' offsets arrive: what the adapter's appender waits for.
struct ReadBack {
    waiting: Arc<Mutex<HashMap<String, oneshot::Sender<u64>>>>,
    channel: Channel,
    task: tokio::task::JoinHandle<()>,
}

impl ReadBack {
    /// Consume stream `name` from `next` (before the first publish), telling each waiter.
    async fn start(native: &Native, name: &str) -> anyhow::Result<Self> {
        let (channel, mut consumer) = native
            .reader(name, AMQPValue::LongString("next".into()))
            .await?;
        let waiting = Arc::new(Mutex::new(HashMap::<String, oneshot::Sender<u64>>::new()));
        let told = waiting.clone();
        let task = tokio::spawn(async move {
            let mut seen = 0u64;
            while let Some(Ok(delivery)) = consumer.next().await {
                let id = delivery.properties.message_id().clone();
                let waiter = id.and_then(|id| told.lock().ok()?.remove(id.as_str()));
                if let (Some(waiter), Some(offset)) = (waiter, stream_offset(&delivery)) {
                    let _ = waiter.send(offset);
                }
                seen += 1;
                if seen.is_multiple_of(ACK_EVERY) {
                    let _ = delivery.ack(BasicAckOptions { multiple: true }).await;
                }
            }
        });
        Ok(Self {
            waiting,
            channel,
            task,
        })
    }

    /// The offset of the entry with message id `id`, once read back (ask before publishing).
    fn expect(&self, id: String) -> impl Future<Output = anyhow::Result<u64>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.insert(id, tx);
        }
        async move {
            let offset = tokio::time::timeout(READ_BACK, rx).await;
            offset
                .context("not read back within 10 s")?
                .context("the read-back consumer ended")
        }
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.task.abort();
        self.channel.close(200, "done".into()).await?;
        Ok(())
    }
}

impl Native {
    /// A consumer of stream `name` from `offset` (`x-stream-offset`) on a channel of its own
    /// with the adapter's credit, as the adapter's readers.
    async fn reader(
        &self,
        name: &str,
        offset: AMQPValue,
    ) -> anyhow::Result<(Channel, lapin::Consumer)> {
        let channel = self.connection.create_channel().await?;
        channel
            .basic_qos(READ_PREFETCH, BasicQosOptions::default())
            .await?;
        let mut args = FieldTable::default();
        args.insert("x-stream-offset".into(), offset);
        let consumer = channel
            .basic_consume(name.into(), "".into(), BasicConsumeOptions::default(), args)
            .await?;
        Ok((channel, consumer))
    }

    /// A durable stream of this run and a confirm channel to it.
    async fn stream(&self, prefix: &str) -> anyhow::Result<(String, Channel)> {
        let name = unique(prefix);
        let channel = self.confirming().await?;
        self.declare(&channel, &name, "stream").await?;
        Ok((name, channel))
    }

    /// Delete stream `name`.
    async fn drop_stream(channel: &Channel, name: &str) -> anyhow::Result<()> {
        channel
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    }

    pub async fn log_append(&self, work: &Workload, in_flight: usize) -> anyhow::Result<Sample> {
        let (name, setup) = self.stream("native-append").await?;
        let read_back = Arc::new(ReadBack::start(self, &name).await?);
        let deadline = Instant::now() + work.slice;
        let started = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..in_flight {
            let (channel, name, payload, read_back) = (
                self.confirming().await?,
                name.clone(),
                work.payload.clone(),
                read_back.clone(),
            );
            workers.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let (id, properties) = entry_properties();
                    let offset = read_back.expect(id);
                    publish(&channel, "", &name, &payload, properties).await?;
                    offset.await?;
                    latencies.push(t.elapsed());
                }
                anyhow::Ok(latencies)
            }));
        }
        let sample = joined(started, workers).await?;
        if let Some(read_back) = Arc::into_inner(read_back) {
            read_back.stop().await?;
        }
        Self::drop_stream(&setup, &name).await?;
        Ok(sample)
    }

    /// Batches of [`APPEND_BATCH`], one at a time: every entry written before the confirms are
    /// awaited, then every offset read back (the adapter's `publish-batch` and appender).
    pub async fn log_append_batch(&self, work: &Workload) -> anyhow::Result<Sample> {
        let (name, channel) = self.stream("native-batch").await?;
        let read_back = ReadBack::start(self, &name).await?;
        let sample = timed(work.slice, || async {
            let (ids, properties): (Vec<_>, Vec<_>) =
                (0..APPEND_BATCH).map(|_| entry_properties()).unzip();
            let offsets: Vec<_> = ids.into_iter().map(|id| read_back.expect(id)).collect();
            publish_batch(&channel, "", &name, true, &work.payload, properties).await?;
            for offset in offsets {
                offset.await?;
            }
            Ok(APPEND_BATCH as u64)
        })
        .await;
        read_back.stop().await?;
        Self::drop_stream(&channel, &name).await?;
        sample
    }

    /// Take `count` deliveries from `consumer`, acknowledging (`multiple`) whenever `seen`, the
    /// consumer's deliveries so far, reaches a multiple of [`ACK_EVERY`] (the broker's credit
    /// only, as the adapter's readers do).
    async fn take(
        consumer: &mut lapin::Consumer,
        count: u64,
        seen: &mut u64,
    ) -> anyhow::Result<()> {
        for _ in 0..count {
            let next = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await;
            let delivery = next
                .context("no delivery within 10 s")?
                .context("the consumer ended")??;
            *seen += 1;
            if seen.is_multiple_of(ACK_EVERY) {
                delivery.ack(BasicAckOptions { multiple: true }).await?;
            }
        }
        Ok(())
    }

    pub async fn log_catch_up(&self, work: &Workload) -> anyhow::Result<Sample> {
        let (name, setup) = self.stream("native-catchup").await?;
        for _ in 0..CATCH_UP / 250 {
            let properties = (0..250).map(|_| entry_properties().1);
            publish_batch(&setup, "", &name, true, &work.payload, properties).await?;
        }
        // What the adapter's `range` does for each page the host asks: a consumer from the
        // page's first offset (from the entry the page's `after` id names, to check it), its
        // page taken, the channel closed.
        let sample = timed(work.slice, || async {
            let (mut read, mut size) = (0u64, PageSize::default());
            while read < CATCH_UP as u64 {
                let (offset, check) = match read {
                    0 => (AMQPValue::LongString("first".into()), 0),
                    n => (AMQPValue::LongLongInt(n as i64 - 1), 1),
                };
                let (channel, mut consumer) = self.reader(&name, offset).await?;
                let page = u64::from(size.limit()).min(CATCH_UP as u64 - read);
                Self::take(&mut consumer, page + check, &mut 0).await?;
                channel.close(200, "page read".into()).await?;
                read += page;
                // The host sizes pages by their entries' bytes: a payload each here.
                size.after_page(page as usize, page as usize * work.payload.len());
            }
            Ok(read)
        })
        .await;
        Self::drop_stream(&setup, &name).await?;
        sample
    }

    /// One append (read back, as the adapter's) and a live tail's delivery of it, repeatedly.
    pub async fn log_live(&self, work: &Workload) -> anyhow::Result<Sample> {
        let (name, channel) = self.stream("native-live").await?;
        let read_back = ReadBack::start(self, &name).await?;
        let (reading, mut consumer) = self
            .reader(&name, AMQPValue::LongString("next".into()))
            .await?;
        let (mut sample, mut seen) = (Sample::default(), 0);
        let started = Instant::now();
        while started.elapsed() < work.slice {
            let t = Instant::now();
            let (id, properties) = entry_properties();
            let offset = read_back.expect(id);
            publish(&channel, "", &name, &work.payload, properties).await?;
            let (offset, taken) = futures::join!(offset, Self::take(&mut consumer, 1, &mut seen));
            offset?;
            taken?;
            sample.latencies.push(t.elapsed());
            sample.ops += 1;
        }
        sample.elapsed = started.elapsed();
        reading.close(200, "done".into()).await?;
        read_back.stop().await?;
        Self::drop_stream(&channel, &name).await?;
        Ok(sample)
    }
}
