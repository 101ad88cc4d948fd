//! `wrpc:amqp/client` for components: each import is a thin call on a lapin channel of the
//! driver's connection; a consumer becomes a guest-read stream fed in batches by a task of its
//! own (nothing here waits on the Store's task).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Confirmation, ExchangeKind};
use tokio::sync::mpsc;
use wasmtime::component::{Accessor, HasSelf, Linker, StreamReader};

use super::channels::Entry;
use super::{AmqpDriver, REFUSALS, convert};
use wrpc_broker_runtime::sandbox::Ctx;
use wrpc_broker_runtime::streams::{BatchProducer, PollBatch};

wasmtime::component::bindgen!({
    inline: "package wrpc:host-amqp; world driver { import wrpc:amqp/client@0.1.0; }",
    path: "../wit",
    imports: { default: trappable },
});

pub(crate) use wrpc::amqp::client as wit;

/// How long one broker call may take (a queue a restarted node has not brought back yet takes
/// publishes without confirming them; the adapter tries again).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long opening a channel may take (a connection that died unnoticed never answers).
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// Deliveries a consumer's stream holds before its task waits for the guest to read.
const CONSUMER_BUFFER: usize = 512;

/// Link `wrpc:amqp/client` into `linker`.
pub fn add_to_linker(linker: &mut Linker<Ctx>) -> wasmtime::Result<()> {
    wit::add_to_linker::<_, HasSelf<Ctx>>(linker, |ctx| ctx)
}

/// The connection lent to the calling component (and a fresh CPU slice: the guest returned).
fn amqp(ctx: &mut Ctx) -> wasmtime::Result<AmqpDriver> {
    ctx.lent::<AmqpDriver>()
        .cloned()
        .ok_or_else(|| wasmtime::Error::msg("the AMQP driver is not configured for this adapter"))
}

/// The driver lent to the calling component.
fn amqp_of<T>(accessor: &Accessor<T, HasSelf<Ctx>>) -> wasmtime::Result<AmqpDriver> {
    accessor.with(|mut access| amqp(access.get()))
}

/// Run `call` on the driver, bounded by [`CALL_TIMEOUT`]; the guest made progress after.
async fn run<T, R, Fut>(
    accessor: &Accessor<T, HasSelf<Ctx>>,
    call: impl FnOnce(AmqpDriver) -> Fut,
) -> wasmtime::Result<Result<R, wit::AmqpError>>
where
    Fut: Future<Output = Result<R, wit::AmqpError>>,
{
    let driver = amqp_of(accessor)?;
    let answer = match tokio::time::timeout(CALL_TIMEOUT, call(driver)).await {
        Ok(answer) => answer,
        Err(_) => Err(wit::AmqpError::Timeout(format!(
            "the broker did not answer within {CALL_TIMEOUT:?}"
        ))),
    };
    Ok(answer)
}

impl AmqpDriver {
    /// Open channel `id`, or `closed` when it is gone (or `stale` when unknown).
    fn channel(&self, id: u64) -> Result<Arc<Entry>, wit::AmqpError> {
        let entry = self
            .shared
            .channels
            .get(id)
            .ok_or_else(|| wit::AmqpError::Stale(format!("no channel {id}")))?;
        if !entry.is_open() {
            return Err(wit::AmqpError::Closed(wit::CloseReason {
                code: 0,
                text: format!("channel {id} is closed"),
            }));
        }
        Ok(entry)
    }

    /// A settlement on channel `id`: `stale` when the channel is gone (the broker requeued its
    /// deliveries), `refused` when a test armed a refusal for a queue consumed on it.
    fn settling(&self, id: u64) -> Result<Arc<Entry>, wit::AmqpError> {
        let entry = self.channel(id).map_err(|e| match e {
            wit::AmqpError::Closed(why) => wit::AmqpError::Stale(why.text),
            other => other,
        })?;
        if REFUSALS.is_armed()
            && let Some(why) = REFUSALS.refuse(|queue| entry.any_queue(|q| q.contains(queue)))
        {
            return Err(wit::AmqpError::Refused(why));
        }
        Ok(entry)
    }

    async fn open_channel(&self, confirms: bool) -> Result<u64, wit::AmqpError> {
        let (connection, _) = self
            .connection()
            .await
            .map_err(wit::AmqpError::Unavailable)?;
        let channel = tokio::time::timeout(OPEN_TIMEOUT, connection.create_channel())
            .await
            .map_err(|_| wit::AmqpError::Unavailable("opening a channel timed out".into()))?
            .map_err(|e| wit::AmqpError::Unavailable(e.to_string()))?;
        if confirms {
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(convert::error)?;
        }
        Ok(self.shared.channels.insert(channel))
    }

    async fn publish(
        &self,
        id: u64,
        exchange: String,
        routing_key: String,
        mandatory: bool,
        properties: wit::Properties,
        body: Vec<u8>,
    ) -> Result<wit::Confirm, wit::AmqpError> {
        let entry = self.channel(id)?;
        let exchange = convert::short("the exchange name", exchange)?;
        let key = convert::short("the routing key", routing_key)?;
        let properties = convert::properties(properties)?;
        let options = BasicPublishOptions {
            mandatory,
            ..BasicPublishOptions::default()
        };
        let confirm = entry
            .channel
            .basic_publish(exchange, key, options, &body, properties)
            .await
            .map_err(convert::error)?
            .await
            .map_err(convert::error)?;
        Ok(match confirm {
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                wit::Confirm::Returned(wit::CloseReason {
                    code: returned.reply_code,
                    text: returned.reply_text.to_string(),
                })
            }
            Confirmation::Ack(None) | Confirmation::NotRequested => wit::Confirm::Ack,
            Confirmation::Nack(None) => wit::Confirm::Nack,
        })
    }

    async fn consume(
        &self,
        id: u64,
        queue: String,
        no_ack: bool,
        exclusive: bool,
        arguments: wit::FieldTable,
    ) -> Result<(String, Deliveries), wit::AmqpError> {
        let entry = self.channel(id)?;
        let arguments = convert::table(arguments)?;
        let options = BasicConsumeOptions {
            no_ack,
            exclusive,
            ..BasicConsumeOptions::default()
        };
        let name = convert::short("the queue name", queue.clone())?;
        let consumer = entry
            .channel
            .basic_consume(name, "".into(), options, arguments)
            .await
            .map_err(convert::error)?;
        entry.consumes(&queue);
        let tag = consumer.tag().to_string();
        let (tx, rx) = mpsc::channel(CONSUMER_BUFFER);
        tokio::spawn(forward(consumer, entry.channel.clone(), tx));
        Ok((tag, Deliveries(rx)))
    }
}

/// Move a consumer's deliveries into its stream until it ends (cancelled, channel closed) or
/// the stream is dropped (then cancel it).
async fn forward(
    mut consumer: lapin::Consumer,
    channel: lapin::Channel,
    tx: mpsc::Sender<wit::Delivery>,
) {
    loop {
        let next = tokio::select! {
            next = consumer.next() => next,
            () = tx.closed() => break,
        };
        match next {
            Some(Ok(delivery)) => {
                if tx.send(convert::delivery(delivery)).await.is_err() {
                    break;
                }
            }
            Some(Err(e)) => {
                tracing::debug!(consumer = %consumer.tag(), "amqp: consumer ended: {e}");
                return;
            }
            None => return,
        }
    }
    let _ = channel
        .basic_cancel(consumer.tag(), BasicCancelOptions::default())
        .await;
}

/// A consumer's deliveries, as a batch source for its stream.
struct Deliveries(mpsc::Receiver<wit::Delivery>);

impl PollBatch for Deliveries {
    type Item = wit::Delivery;

    fn poll_batch(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<Vec<Self::Item>>> {
        let mut batch = Vec::new();
        match self.0.poll_recv_many(cx, &mut batch, max.max(1)) {
            Poll::Ready(0) => Poll::Ready(None),
            Poll::Ready(_) => Poll::Ready(Some(batch)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The exchange kind named `kind`.
fn exchange_kind(kind: &str) -> ExchangeKind {
    match kind {
        "direct" => ExchangeKind::Direct,
        "fanout" => ExchangeKind::Fanout,
        "topic" => ExchangeKind::Topic,
        "headers" => ExchangeKind::Headers,
        other => ExchangeKind::Custom(other.to_string()),
    }
}

impl wit::Host for Ctx {
    fn generation(&mut self) -> wasmtime::Result<u64> {
        Ok(amqp(self)?.generation())
    }

    fn is_open(&mut self, channel: u64) -> wasmtime::Result<bool> {
        Ok(amqp(self)?.channel(channel).is_ok())
    }
}

impl<T> wit::HostWithStore<T> for HasSelf<Ctx> {
    async fn open_channel(
        accessor: &Accessor<T, Self>,
        confirms: bool,
    ) -> wasmtime::Result<Result<u64, wit::AmqpError>> {
        run(accessor, |d| async move { d.open_channel(confirms).await }).await
    }

    async fn close_channel(accessor: &Accessor<T, Self>, channel: u64) -> wasmtime::Result<()> {
        let closed = run(accessor, |d| async move {
            if let Some(entry) = d.shared.channels.remove(channel)
                && entry.is_open()
            {
                let _ = entry
                    .channel
                    .close(200, "closed by the adapter".into())
                    .await;
            }
            Ok(())
        });
        closed.await.map(|_| ())
    }

    async fn qos(
        accessor: &Accessor<T, Self>,
        channel: u64,
        prefetch: u16,
    ) -> wasmtime::Result<Result<(), wit::AmqpError>> {
        run(accessor, |d| async move {
            let entry = d.channel(channel)?;
            entry
                .channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await
                .map_err(convert::error)
        })
        .await
    }

    async fn exchange_declare(
        accessor: &Accessor<T, Self>,
        channel: u64,
        name: String,
        kind: String,
        durable: bool,
        auto_delete: bool,
    ) -> wasmtime::Result<Result<(), wit::AmqpError>> {
        run(accessor, |d| async move {
            let entry = d.channel(channel)?;
            let options = ExchangeDeclareOptions {
                durable,
                auto_delete,
                ..ExchangeDeclareOptions::default()
            };
            let name = convert::short("the exchange name", name)?;
            entry
                .channel
                .exchange_declare(name, exchange_kind(&kind), options, FieldTable::default())
                .await
                .map_err(convert::error)
        })
        .await
    }

    async fn queue_declare(
        accessor: &Accessor<T, Self>,
        channel: u64,
        name: String,
        options: wit::QueueOptions,
        arguments: wit::FieldTable,
    ) -> wasmtime::Result<Result<wit::QueueInfo, wit::AmqpError>> {
        run(accessor, |d| async move {
            let entry = d.channel(channel)?;
            let flags = QueueDeclareOptions {
                durable: options.durable,
                exclusive: options.exclusive,
                auto_delete: options.auto_delete,
                passive: options.passive,
                nowait: false,
            };
            let queue = entry
                .channel
                .queue_declare(
                    convert::short("the queue name", name)?,
                    flags,
                    convert::table(arguments)?,
                )
                .await
                .map_err(convert::error)?;
            Ok(wit::QueueInfo {
                name: queue.name().to_string(),
                messages: queue.message_count(),
                consumers: queue.consumer_count(),
            })
        })
        .await
    }

    async fn queue_bind(
        accessor: &Accessor<T, Self>,
        channel: u64,
        queue: String,
        exchange: String,
        routing_key: String,
    ) -> wasmtime::Result<Result<(), wit::AmqpError>> {
        run(accessor, |d| async move {
            let entry = d.channel(channel)?;
            entry
                .channel
                .queue_bind(
                    convert::short("the queue name", queue)?,
                    convert::short("the exchange name", exchange)?,
                    convert::short("the routing key", routing_key)?,
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(convert::error)
        })
        .await
    }

    async fn queue_unbind(
        accessor: &Accessor<T, Self>,
        channel: u64,
        queue: String,
        exchange: String,
        routing_key: String,
    ) -> wasmtime::Result<Result<(), wit::AmqpError>> {
        run(accessor, |d| async move {
            let entry = d.channel(channel)?;
            entry
                .channel
                .queue_unbind(
                    convert::short("the queue name", queue)?,
                    convert::short("the exchange name", exchange)?,
                    convert::short("the routing key", routing_key)?,
                    FieldTable::default(),
                )
                .await
                .map_err(convert::error)
        })
        .await
    }

    async fn queue_delete(
        accessor: &Accessor<T, Self>,
        channel: u64,
        queue: String,
    ) -> wasmtime::Result<Result<u32, wit::AmqpError>> {
        run(accessor, |d| async move {
            let entry = d.channel(channel)?;
            entry
                .channel
                .queue_delete(
                    convert::short("the queue name", queue)?,
                    QueueDeleteOptions::default(),
                )
                .await
                .map_err(convert::error)
        })
        .await
    }

    async fn publish(
        accessor: &Accessor<T, Self>,
        channel: u64,
        exchange: String,
        routing_key: String,
        mandatory: bool,
        properties: wit::Properties,
        body: Vec<u8>,
    ) -> wasmtime::Result<Result<wit::Confirm, wit::AmqpError>> {
        run(accessor, |d| async move {
            d.publish(channel, exchange, routing_key, mandatory, properties, body)
                .await
        })
        .await
    }

    async fn consume(
        accessor: &Accessor<T, Self>,
        channel: u64,
        queue: String,
        no_ack: bool,
        exclusive: bool,
        arguments: wit::FieldTable,
    ) -> wasmtime::Result<Result<(String, StreamReader<wit::Delivery>), wit::AmqpError>> {
        let consumed = run(accessor, |d| async move {
            d.consume(channel, queue, no_ack, exclusive, arguments)
                .await
        })
        .await?;
        let (tag, deliveries) = match consumed {
            Ok(consumed) => consumed,
            Err(e) => return Ok(Err(e)),
        };
        let stream = accessor.with(|mut access| {
            StreamReader::new(&mut access, BatchProducer::new(deliveries, |d| d))
        })?;
        Ok(Ok((tag, stream)))
    }

    async fn cancel(
        accessor: &Accessor<T, Self>,
        channel: u64,
        consumer_tag: String,
    ) -> wasmtime::Result<Result<(), wit::AmqpError>> {
        run(accessor, |d| async move {
            let entry = d.channel(channel)?;
            entry
                .channel
                .basic_cancel(
                    convert::short("the consumer tag", consumer_tag)?,
                    BasicCancelOptions::default(),
                )
                .await
                .map_err(convert::error)
        })
        .await
    }

    async fn ack(
        accessor: &Accessor<T, Self>,
        channel: u64,
        delivery_tag: u64,
        multiple: bool,
    ) -> wasmtime::Result<Result<(), wit::AmqpError>> {
        run(accessor, |d| async move {
            let entry = d.settling(channel)?;
            entry
                .channel
                .basic_ack(delivery_tag, BasicAckOptions { multiple })
                .await
                .map_err(|e| wit::AmqpError::Stale(e.to_string()))
        })
        .await
    }

    async fn nack(
        accessor: &Accessor<T, Self>,
        channel: u64,
        delivery_tag: u64,
        multiple: bool,
        requeue: bool,
    ) -> wasmtime::Result<Result<(), wit::AmqpError>> {
        run(accessor, |d| async move {
            let entry = d.settling(channel)?;
            entry
                .channel
                .basic_nack(delivery_tag, BasicNackOptions { multiple, requeue })
                .await
                .map_err(|e| wit::AmqpError::Stale(e.to_string()))
        })
        .await
    }
}
