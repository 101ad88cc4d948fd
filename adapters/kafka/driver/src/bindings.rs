//! `wrpc:kafka/client` for components: each import is a thin call on the driver's rdkafka
//! clients, bounded by [`CALL_TIMEOUT`]; readers and members become guest-read streams fed by
//! tasks of their own (nothing here waits on the Store's task).

use std::future::Future;
use std::time::Duration;

use wasmtime::component::{Accessor, HasSelf, Linker, StreamReader};

use super::KafkaDriver;
use wrpc_broker_runtime::sandbox::Ctx;
use wrpc_broker_runtime::streams::{BatchProducer, FilterMap};

wasmtime::component::bindgen!({
    inline: "package wrpc:host-kafka; world driver { import wrpc:kafka/client@0.1.0; }",
    path: "../wit",
    imports: { default: trappable },
});

pub(crate) use wrpc::kafka::client as wit;

/// How long one driver call may take (a join waits for its first assignment within it).
const CALL_TIMEOUT: Duration = Duration::from_secs(40);

/// Link `wrpc:kafka/client` into `linker`.
pub fn add_to_linker(linker: &mut Linker<Ctx>) -> wasmtime::Result<()> {
    wit::add_to_linker::<_, HasSelf<Ctx>>(linker, |ctx| ctx)
}

/// The driver lent to the calling component.
fn kafka(ctx: &mut Ctx) -> wasmtime::Result<KafkaDriver> {
    ctx.lent::<KafkaDriver>()
        .cloned()
        .ok_or_else(|| wasmtime::Error::msg("the Kafka driver is not configured for this adapter"))
}

/// Run `call` on the driver, bounded by [`CALL_TIMEOUT`].
async fn run<T, R, Fut>(
    accessor: &Accessor<T, HasSelf<Ctx>>,
    call: impl FnOnce(KafkaDriver) -> Fut,
) -> wasmtime::Result<Result<R, wit::KafkaError>>
where
    Fut: Future<Output = Result<R, wit::KafkaError>>,
{
    let driver = accessor.with(|mut access| kafka(access.get()))?;
    Ok(
        match tokio::time::timeout(CALL_TIMEOUT, call(driver)).await {
            Ok(answer) => answer,
            Err(_) => Err(wit::KafkaError::Unavailable(format!(
                "the cluster did not answer within {CALL_TIMEOUT:?}"
            ))),
        },
    )
}

impl wit::Host for Ctx {
    fn generation(&mut self) -> wasmtime::Result<u64> {
        kafka(self).map(|_| 1)
    }
}

impl<T> wit::HostWithStore<T> for HasSelf<Ctx> {
    async fn produce(
        accessor: &Accessor<T, Self>,
        records: Vec<wit::Outgoing>,
    ) -> wasmtime::Result<Result<Vec<wit::Delivered>, wit::KafkaError>> {
        run(accessor, |d| async move { d.produce(records).await }).await
    }

    async fn create_topics(
        accessor: &Accessor<T, Self>,
        topics: Vec<(String, u32)>,
        replication: u32,
        configs: Vec<(String, String)>,
    ) -> wasmtime::Result<Result<(), wit::KafkaError>> {
        run(accessor, |d| async move {
            d.create_topics(topics, replication, configs).await
        })
        .await
    }

    async fn delete_topic(
        accessor: &Accessor<T, Self>,
        topic: String,
    ) -> wasmtime::Result<Result<(), wit::KafkaError>> {
        run(accessor, |d| async move { d.delete_topic(topic).await }).await
    }

    async fn describe_topic(
        accessor: &Accessor<T, Self>,
        topic: String,
    ) -> wasmtime::Result<Result<Option<wit::TopicInfo>, wit::KafkaError>> {
        run(accessor, |d| async move { d.describe_topic(topic).await }).await
    }

    async fn watermarks(
        accessor: &Accessor<T, Self>,
        topic: String,
    ) -> wasmtime::Result<Result<Vec<wit::Marks>, wit::KafkaError>> {
        run(accessor, |d| async move { d.watermarks(topic).await }).await
    }

    async fn committed(
        accessor: &Accessor<T, Self>,
        group: String,
        topic: String,
        partitions: u32,
    ) -> wasmtime::Result<Result<Vec<Option<u64>>, wit::KafkaError>> {
        run(accessor, |d| async move {
            d.committed(group, topic, partitions).await
        })
        .await
    }

    async fn read(
        accessor: &Accessor<T, Self>,
        topic: String,
        starts: Vec<(u32, u64)>,
    ) -> wasmtime::Result<Result<StreamReader<wit::Incoming>, wit::KafkaError>> {
        let records = match run(accessor, |d| async move { d.read(topic, starts).await }).await? {
            Ok(records) => records,
            Err(e) => return Ok(Err(e)),
        };
        let stream = accessor.with(|mut access| {
            StreamReader::new(&mut access, BatchProducer::new(records, |r| r))
        })?;
        Ok(Ok(stream))
    }

    async fn read_values(
        accessor: &Accessor<T, Self>,
        topic: String,
        starts: Vec<(u32, u64)>,
        key: Vec<u8>,
    ) -> wasmtime::Result<Result<StreamReader<Vec<u8>>, wit::KafkaError>> {
        let records = match run(accessor, |d| async move { d.read(topic, starts).await }).await? {
            Ok(records) => records,
            Err(e) => return Ok(Err(e)),
        };
        let values = FilterMap::new(records, move |r: wit::Incoming| {
            (r.key.as_deref() == Some(key.as_slice())).then_some(r.value)
        });
        let stream = accessor
            .with(|mut access| StreamReader::new(&mut access, BatchProducer::new(values, |v| v)))?;
        Ok(Ok(stream))
    }

    async fn join(
        accessor: &Accessor<T, Self>,
        group: String,
        topics: Vec<String>,
    ) -> wasmtime::Result<Result<(u64, StreamReader<wit::MemberEvent>), wit::KafkaError>> {
        let (id, events) =
            match run(accessor, |d| async move { d.join(group, topics).await }).await? {
                Ok(joined) => joined,
                Err(e) => return Ok(Err(e)),
            };
        let stream = accessor
            .with(|mut access| StreamReader::new(&mut access, BatchProducer::new(events, |e| e)))?;
        Ok(Ok((id, stream)))
    }

    async fn commit(
        accessor: &Accessor<T, Self>,
        member: u64,
        offsets: Vec<(wit::TopicPartition, u64)>,
    ) -> wasmtime::Result<Result<(), wit::KafkaError>> {
        run(accessor, |d| async move { d.commit(member, offsets).await }).await
    }

    async fn seek(
        accessor: &Accessor<T, Self>,
        member: u64,
        at: wit::TopicPartition,
        offset: u64,
    ) -> wasmtime::Result<Result<(), wit::KafkaError>> {
        run(
            accessor,
            |d| async move { d.seek(member, at, offset).await },
        )
        .await
    }

    async fn pause(
        accessor: &Accessor<T, Self>,
        member: u64,
        at: wit::TopicPartition,
        paused: bool,
    ) -> wasmtime::Result<Result<(), wit::KafkaError>> {
        run(
            accessor,
            |d| async move { d.pause(member, at, paused).await },
        )
        .await
    }

    async fn leave(accessor: &Accessor<T, Self>, member: u64) -> wasmtime::Result<()> {
        run(accessor, |d| async move {
            d.leave(member).await;
            Ok(())
        })
        .await
        .map(|_| ())
    }
}
