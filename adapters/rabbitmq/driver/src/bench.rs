//! The native side for RabbitMQ: what the RabbitMQ adapter sends, sent directly with `lapin`:
//! for the log ([`log`]) confirmed publishes to a stream queue with the adapter's read-back;
//! confirmed, persistent, mandatory publishes to a quorum queue and a manual-ack consumer at
//! `basic.qos(prefetch)` for the queue; a mandatory, confirmed publish to a direct exchange
//! with `reply_to` and an echoing responder for direct; confirmed publishes to a direct
//! exchange and a bound exclusive queue for the backplane (one payload at a time, as the
//! bench's component side publishes). A batch is written whole before its confirms are
//! awaited, as the driver's `publish-batch`.

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
    FAN_OUT_PAYLOADS, NativeBench, QUEUE_BATCH, Sample, Workload, shared_subscription, unique,
};

mod log;

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

/// Publish, mandatory, and wait for the broker's ack (a return or a nack is an error).
async fn publish(
    channel: &Channel,
    exchange: &str,
    key: &str,
    payload: &[u8],
    properties: BasicProperties,
) -> anyhow::Result<()> {
    publish_batch(channel, exchange, key, true, payload, [properties]).await
}

/// Publish `payload` to `key` once per item of `properties`, every message written before
/// the confirms are awaited (what the driver's `publish-batch` does); any confirm not a plain
/// ack is an error.
async fn publish_batch(
    channel: &Channel,
    exchange: &str,
    key: &str,
    mandatory: bool,
    payload: &[u8],
    properties: impl IntoIterator<Item = BasicProperties>,
) -> anyhow::Result<()> {
    let options = BasicPublishOptions {
        mandatory,
        ..BasicPublishOptions::default()
    };
    let mut written = Vec::new();
    for properties in properties {
        written.push(
            channel
                .basic_publish(exchange.into(), key.into(), options, payload, properties)
                .await?,
        );
    }
    for confirm in futures::future::join_all(written).await {
        let confirm = confirm?;
        ensure!(
            matches!(
                confirm,
                Confirmation::Ack(None) | Confirmation::NotRequested
            ),
            "{key}: not taken: {confirm:?}"
        );
    }
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
            let properties =
                (0..QUEUE_BATCH).map(|_| BasicProperties::default().with_delivery_mode(2));
            publish_batch(&producer, "", &name, true, &work.payload, properties).await?;
            // Each delivery acked on its own (as the adapter's handlers settle), each ack sent
            // by a task of its own while the next deliveries are taken (at prefetch 1 the next
            // comes after it), not awaited one at a time.
            let mut acks = Vec::with_capacity(QUEUE_BATCH as usize);
            for _ in 0..QUEUE_BATCH {
                let next = tokio::time::timeout(Duration::from_secs(10), deliveries.next()).await;
                let delivery = next
                    .context("no delivery within 10 s")?
                    .context("the consumer ended")??;
                acks.push(tokio::spawn(async move {
                    delivery.ack(BasicAckOptions::default()).await
                }));
            }
            for acked in futures::future::join_all(acks).await {
                acked??;
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
        // Each payload confirmed before the next, as the bench's component side publishes
        // (one backplane call per payload; the other brokers' native sides await each too).
        shared_subscription(work, subscribers, deliveries, || async {
            for _ in 0..FAN_OUT_PAYLOADS {
                let properties = std::iter::once(BasicProperties::default());
                publish_batch(
                    &channel,
                    &exchange,
                    "room",
                    false,
                    &work.payload,
                    properties,
                )
                .await?;
            }
            Ok(())
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
