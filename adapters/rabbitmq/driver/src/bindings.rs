//! `wrpc:amqp/client` for components: each import is a thin call on a lapin channel of the
//! driver's connection; a consumer becomes a guest-read stream fed in batches by a task of its
//! own (nothing here waits on the Store's task).

use std::future::Future;
use std::time::Duration;

use lapin::ExchangeKind;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicNackOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use wasmtime::component::{Accessor, HasSelf, Linker, StreamReader};

use super::{AmqpDriver, convert};
use wrpc_broker_runtime::sandbox::Ctx;
use wrpc_broker_runtime::streams::BatchProducer;

wasmtime::component::bindgen!({
    inline: "package wrpc:host-amqp; world driver { import wrpc:amqp/client@0.1.0; }",
    path: "../wit",
    imports: { default: trappable },
});

pub(crate) use wrpc::amqp::client as wit;

/// How long one broker call may take (a queue a restarted node has not brought back yet takes
/// publishes without confirming them; the adapter tries again).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

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
/// `basic.consume` with `(channel, queue, no-ack, exclusive, arguments)`; its tag and a stream
/// of its deliveries as `map` makes them.
async fn consumed_as<T, U>(
    accessor: &Accessor<T, HasSelf<Ctx>>,
    (channel, queue, no_ack, exclusive, arguments): (u64, String, bool, bool, wit::FieldTable),
    map: fn(wit::Delivery) -> U,
) -> wasmtime::Result<Result<(String, StreamReader<U>), wit::AmqpError>>
where
    U: wasmtime::component::Lower + wasmtime::component::Lift + Send + Sync + 'static,
{
    let consumed = run(accessor, |d| async move {
        d.consume(channel, queue, no_ack, exclusive, arguments)
            .await
    })
    .await?;
    let (tag, deliveries) = match consumed {
        Ok(consumed) => consumed,
        Err(e) => return Ok(Err(e)),
    };
    let stream = accessor
        .with(|mut access| StreamReader::new(&mut access, BatchProducer::new(deliveries, map)))?;
    Ok(Ok((tag, stream)))
}

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

    async fn publish_batch(
        accessor: &Accessor<T, Self>,
        channel: u64,
        exchange: String,
        routing_key: String,
        mandatory: bool,
        messages: Vec<wit::Message>,
    ) -> wasmtime::Result<Result<Vec<wit::Confirm>, wit::AmqpError>> {
        run(accessor, |d| async move {
            d.publish_batch(channel, exchange, routing_key, mandatory, messages)
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
        consumed_as(
            accessor,
            (channel, queue, no_ack, exclusive, arguments),
            |d| d,
        )
        .await
    }

    async fn consume_bodies(
        accessor: &Accessor<T, Self>,
        channel: u64,
        queue: String,
        exclusive: bool,
        arguments: wit::FieldTable,
    ) -> wasmtime::Result<Result<(String, StreamReader<Vec<u8>>), wit::AmqpError>> {
        let consume = (channel, queue, true, exclusive, arguments);
        consumed_as(accessor, consume, |d| d.body).await
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
