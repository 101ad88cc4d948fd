//! The native side for RabbitMQ: what the RabbitMQ adapter sends, sent directly with `lapin`:
//! confirmed publishes to a stream queue for the log; confirmed, persistent, mandatory
//! publishes to a quorum queue and a manual-ack consumer at `basic.qos(prefetch)` for the
//! queue; a mandatory, confirmed publish to a direct exchange with `reply_to` and an echoing
//! responder for direct; confirmed publishes to a direct exchange and a bound exclusive queue
//! for the backplane; log reads as the adapter's: a stream consumer (`x-stream-offset`, credit
//! 1000) per catch-up page, one for a live tail. (The adapter's appends also wait for their
//! read-back consumer to tell the offset, which a plain client that needs no ids skips.)

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ExchangeKind};

use wrpc_broker_runtime::bench::{
    CATCH_UP, FAN_OUT_PAYLOADS, NativeBench, QUEUE_BATCH, Sample, Workload, shared_subscription,
    timed, unique,
};

/// The host's page size for a catch-up read (`host/src/log`).
const PAGE: u64 = 256;
/// The credit of the adapter's stream readers (`adapters/rabbitmq/src/log`).
const READ_PREFETCH: u16 = 1_000;

/// A client of the RabbitMQ node the broker uses.
pub struct Native {
    connection: Connection,
}

/// Queue arguments `x-queue-type: kind`.
fn typed(kind: &str) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString(kind.into()));
    args
}

/// Publish and wait for the broker's ack (a return or a nack is an error).
async fn publish(
    channel: &Channel,
    exchange: &str,
    key: &str,
    payload: &[u8],
    properties: BasicProperties,
) -> anyhow::Result<()> {
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let confirm = channel
        .basic_publish(exchange.into(), key.into(), options, payload, properties)
        .await?
        .await?;
    ensure!(
        matches!(confirm, Confirmation::Ack(None)),
        "{key}: not taken: {confirm:?}"
    );
    Ok(())
}

impl Native {
    /// Connect to `url`.
    pub async fn new(url: &str) -> anyhow::Result<Self> {
        let url = crate::with_vhost(url);
        Ok(Self {
            connection: Connection::connect(&url, Default::default()).await?,
        })
    }

    /// A channel in confirm mode.
    async fn confirming(&self) -> anyhow::Result<Channel> {
        let channel = self.connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(channel)
    }

    /// Declare durable queue `name` of type `kind`.
    async fn declare(&self, channel: &Channel, name: &str, kind: &str) -> anyhow::Result<()> {
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(name.into(), options, typed(kind))
            .await?;
        Ok(())
    }

    pub async fn log_append(&self, work: &Workload, in_flight: usize) -> anyhow::Result<Sample> {
        let name = unique("native-append");
        let setup = self.confirming().await?;
        self.declare(&setup, &name, "stream").await?;
        let deadline = Instant::now() + work.slice;
        let started = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..in_flight {
            let (channel, name, payload) =
                (self.confirming().await?, name.clone(), work.payload.clone());
            workers.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let properties = BasicProperties::default()
                        .with_message_id(uuid_like().into())
                        .with_delivery_mode(2);
                    publish(&channel, "", &name, &payload, properties).await?;
                    latencies.push(t.elapsed());
                }
                anyhow::Ok(latencies)
            }));
        }
        let mut sample = Sample::default();
        for worker in futures::future::join_all(workers).await {
            let latencies = worker??;
            sample.ops += latencies.len() as u64;
            sample.latencies.extend(latencies);
        }
        sample.elapsed = started.elapsed();
        setup
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(sample)
    }

    /// Fill stream `name` with [`CATCH_UP`] entries, 250 confirmed publishes in flight.
    async fn fill(&self, channel: &Channel, name: &str, work: &Workload) -> anyhow::Result<()> {
        for _ in 0..CATCH_UP / 250 {
            let mut confirms = Vec::new();
            for _ in 0..250 {
                let properties = BasicProperties::default()
                    .with_message_id(uuid_like().into())
                    .with_delivery_mode(2);
                let options = BasicPublishOptions::default();
                confirms.push(
                    channel
                        .basic_publish("".into(), name.into(), options, &work.payload, properties)
                        .await?,
                );
            }
            for confirm in futures::future::join_all(confirms).await {
                ensure!(
                    matches!(confirm?, Confirmation::Ack(None)),
                    "{name}: not taken"
                );
            }
        }
        Ok(())
    }

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

    /// Take `count` deliveries from `consumer`, acknowledging them at the end (the broker's
    /// credit only, as the adapter's readers do).
    async fn take(consumer: &mut lapin::Consumer, count: u64) -> anyhow::Result<()> {
        let mut last = None;
        for _ in 0..count {
            let next = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await;
            let delivery = next
                .context("no delivery within 10 s")?
                .context("the consumer ended")??;
            last = Some(delivery);
        }
        if let Some(delivery) = last {
            delivery.ack(BasicAckOptions { multiple: true }).await?;
        }
        Ok(())
    }

    pub async fn log_catch_up(&self, work: &Workload) -> anyhow::Result<Sample> {
        let name = unique("native-catchup");
        let setup = self.confirming().await?;
        self.declare(&setup, &name, "stream").await?;
        self.fill(&setup, &name, work).await?;
        // What the adapter's `range` does for each page the host asks: a consumer from the
        // page's first offset (from the entry the page's `after` id names, to check it), its
        // page taken, the channel closed.
        let sample = timed(work.slice, || async {
            let mut read = 0u64;
            while read < CATCH_UP as u64 {
                let (offset, check) = match read {
                    0 => (AMQPValue::LongString("first".into()), 0),
                    n => (AMQPValue::LongLongInt(n as i64 - 1), 1),
                };
                let (channel, mut consumer) = self.reader(&name, offset).await?;
                let page = PAGE.min(CATCH_UP as u64 - read);
                Self::take(&mut consumer, page + check).await?;
                channel.close(200, "page read".into()).await?;
                read += page;
            }
            Ok(read)
        })
        .await;
        setup
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await?;
        sample
    }

    pub async fn log_live(&self, work: &Workload) -> anyhow::Result<Sample> {
        let name = unique("native-live");
        let channel = self.confirming().await?;
        self.declare(&channel, &name, "stream").await?;
        let (reading, mut consumer) = self
            .reader(&name, AMQPValue::LongString("next".into()))
            .await?;
        let mut sample = Sample::default();
        let started = Instant::now();
        while started.elapsed() < work.slice {
            let t = Instant::now();
            let properties = BasicProperties::default()
                .with_message_id(uuid_like().into())
                .with_delivery_mode(2);
            publish(&channel, "", &name, &work.payload, properties).await?;
            Self::take(&mut consumer, 1).await?;
            sample.latencies.push(t.elapsed());
            sample.ops += 1;
        }
        sample.elapsed = started.elapsed();
        reading.close(200, "done".into()).await?;
        channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(sample)
    }

    pub async fn queue_round_trip(&self, work: &Workload, prefetch: u32) -> anyhow::Result<Sample> {
        let name = unique("native-queue");
        let producer = self.confirming().await?;
        self.declare(&producer, &name, "quorum").await?;
        let consumer_channel = self.connection.create_channel().await?;
        consumer_channel
            .basic_qos(
                u16::try_from(prefetch).unwrap_or(u16::MAX),
                BasicQosOptions::default(),
            )
            .await?;
        let mut deliveries = consumer_channel
            .basic_consume(
                name.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut sample = Sample::default();
        let started = Instant::now();
        while started.elapsed() < work.slice {
            for _ in 0..QUEUE_BATCH {
                let properties = BasicProperties::default().with_delivery_mode(2);
                publish(&producer, "", &name, &work.payload, properties).await?;
            }
            for _ in 0..QUEUE_BATCH {
                let next = tokio::time::timeout(Duration::from_secs(10), deliveries.next()).await;
                let delivery = next
                    .context("no delivery within 10 s")?
                    .context("the consumer ended")??;
                delivery.ack(BasicAckOptions::default()).await?;
            }
            sample.ops += QUEUE_BATCH;
        }
        sample.elapsed = started.elapsed();
        producer
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(sample)
    }

    /// A server-named exclusive queue bound to `exchange` with `key`, consumed without acks.
    async fn bound(
        &self,
        channel: &Channel,
        exchange: &str,
        key: &str,
    ) -> anyhow::Result<lapin::Consumer> {
        let options = QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..QueueDeclareOptions::default()
        };
        let queue = channel
            .queue_declare("".into(), options, FieldTable::default())
            .await?;
        channel
            .queue_bind(
                queue.name().clone(),
                exchange.into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let options = BasicConsumeOptions {
            no_ack: true,
            exclusive: true,
            ..BasicConsumeOptions::default()
        };
        Ok(channel
            .basic_consume(
                queue.name().clone(),
                "".into(),
                options,
                FieldTable::default(),
            )
            .await?)
    }

    /// A durable direct exchange of this run.
    async fn exchange(&self, channel: &Channel, prefix: &str) -> anyhow::Result<String> {
        let name = unique(prefix);
        let options = ExchangeDeclareOptions {
            auto_delete: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                name.as_str().into(),
                ExchangeKind::Direct,
                options,
                FieldTable::default(),
            )
            .await?;
        Ok(name)
    }

    pub async fn request_reply(&self, work: &Workload) -> anyhow::Result<Sample> {
        let channel = self.confirming().await?;
        let exchange = self.exchange(&channel, "native-dx").await?;
        let (address, inbox) = ("service", "inbox");
        let mut requests = self.bound(&channel, &exchange, address).await?;
        let mut replies = self.bound(&channel, &exchange, inbox).await?;
        let responder = {
            let (channel, exchange) = (self.confirming().await?, exchange.clone());
            tokio::spawn(async move {
                while let Some(Ok(request)) = requests.next().await {
                    let Some(to) = request.properties.reply_to().clone() else {
                        continue;
                    };
                    let mut properties = BasicProperties::default();
                    if let Some(id) = request.properties.correlation_id() {
                        properties = properties.with_correlation_id(id.clone());
                    }
                    let _ =
                        publish(&channel, &exchange, to.as_str(), &request.data, properties).await;
                }
            })
        };
        let mut sample = Sample::default();
        let started = Instant::now();
        while started.elapsed() < work.slice {
            let t = Instant::now();
            let properties = BasicProperties::default()
                .with_correlation_id(sample.ops.to_string().into())
                .with_reply_to(inbox.into())
                .with_expiration("5000".into());
            publish(&channel, &exchange, address, &work.payload, properties).await?;
            let next = tokio::time::timeout(Duration::from_secs(10), replies.next()).await;
            next.context("no reply within 10 s")?
                .context("the reply consumer ended")??;
            sample.ops += 1;
            sample.latencies.push(t.elapsed());
        }
        sample.elapsed = started.elapsed();
        responder.abort();
        Ok(sample)
    }

    pub async fn fan_out(&self, work: &Workload, subscribers: usize) -> anyhow::Result<Sample> {
        // One bound queue for the room, shared by every local subscriber, as the host does.
        let channel = self.confirming().await?;
        let exchange = self.exchange(&channel, "native-bp").await?;
        let deliveries = self
            .bound(&channel, &exchange, "room")
            .await?
            .take_while(|d| futures::future::ready(d.is_ok()))
            .filter_map(|d| futures::future::ready(d.ok().map(|d| std::sync::Arc::new(d.data))));
        shared_subscription(work, subscribers, deliveries, || async {
            for _ in 0..FAN_OUT_PAYLOADS {
                channel
                    .basic_publish(
                        exchange.as_str().into(),
                        "room".into(),
                        BasicPublishOptions::default(),
                        &work.payload,
                        BasicProperties::default(),
                    )
                    .await?
                    .await?;
            }
            Ok(())
        })
        .await
    }
}

/// A message id as the adapter's (`generate-id` mints a fresh one per entry).
fn uuid_like() -> String {
    unique("m")
}

impl NativeBench for Native {
    wrpc_broker_runtime::native_bench_rows!(
        log_append(in_flight: usize),
        log_catch_up(),
        log_live(),
        queue_round_trip(prefetch: u32),
        request_reply(),
        fan_out(subscribers: usize),
    );
}
