//! `wrpc:redis/client` for components: each import is a thin call into the broker's
//! [`Connections`](super::connection::Connections); replies become flat pre-order frames and a
//! subscription becomes a guest-read stream fed in batches.

use redis::Value;
use wasmtime::component::{Accessor, HasSelf, Linker, StreamReader};

use super::RedisDriver;
use super::connection::{CallError, server_text};
use super::pubsub::Subscription;
use wrpc_broker_runtime::sandbox::Ctx;
use wrpc_broker_runtime::streams::BatchProducer;

wasmtime::component::bindgen!({
    inline: "package wrpc:host-redis; world driver { import wrpc:redis/client@0.1.0; }",
    path: "../wit",
    imports: { default: trappable },
});

use wrpc::redis::client as wit;

/// Link `wrpc:redis/client` into `linker`.
pub fn add_to_linker(linker: &mut Linker<Ctx>) -> wasmtime::Result<()> {
    wit::add_to_linker::<_, HasSelf<Ctx>>(linker, |ctx| ctx)
}

/// The connection lent to the calling component.
fn redis(ctx: &mut Ctx) -> wasmtime::Result<&RedisDriver> {
    ctx.lent::<RedisDriver>()
        .ok_or_else(|| wasmtime::Error::msg("the redis driver is not configured for this adapter"))
}

fn redis_of<T>(accessor: &Accessor<T, HasSelf<Ctx>>) -> wasmtime::Result<RedisDriver> {
    accessor.with(|mut access| redis(access.get()).cloned())
}

fn error(e: CallError) -> wit::RedisError {
    match e {
        CallError::ConnectionLost(m) | CallError::Loading(m) => wit::RedisError::ConnectionLost(m),
        CallError::Server(m) => wit::RedisError::Server(m),
        CallError::Refused(m) => wit::RedisError::Refused(m),
        CallError::Invalid(m) => wit::RedisError::Invalid(m),
    }
}

/// A reply as pre-order frames.
fn frames(value: Value) -> Vec<wit::Frame> {
    let mut out = Vec::new();
    flatten(value, &mut out);
    out
}

fn len(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn flatten(value: Value, out: &mut Vec<wit::Frame>) {
    match value {
        Value::Nil => out.push(wit::Frame::Nil),
        Value::Int(i) => out.push(wit::Frame::Int(i)),
        Value::BulkString(b) => out.push(wit::Frame::Bulk(b)),
        Value::SimpleString(s) => out.push(wit::Frame::Simple(s)),
        Value::Okay => out.push(wit::Frame::Simple("OK".into())),
        Value::Array(items) | Value::Set(items) => {
            out.push(wit::Frame::Array(len(items.len())));
            items.into_iter().for_each(|v| flatten(v, out));
        }
        Value::Map(entries) => {
            out.push(wit::Frame::Pairs(len(entries.len())));
            for (k, v) in entries {
                flatten(k, out);
                flatten(v, out);
            }
        }
        Value::Attribute { data, .. } => flatten(*data, out),
        Value::Double(d) => out.push(wit::Frame::Double(d)),
        Value::Boolean(b) => out.push(wit::Frame::Boolean(b)),
        Value::VerbatimString { text, .. } => out.push(wit::Frame::Bulk(text.into_bytes())),
        Value::Push { kind, data } => {
            out.push(wit::Frame::Array(len(data.len() + 1)));
            out.push(wit::Frame::Bulk(kind.to_string().into_bytes()));
            data.into_iter().for_each(|v| flatten(v, out));
        }
        e @ Value::ServerError(_) => out.push(wit::Frame::Error(server_text(e))),
        #[allow(unreachable_patterns)]
        other => out.push(wit::Frame::Bulk(format!("{other:?}").into_bytes())),
    }
}

impl wit::Host for Ctx {
    fn generation(&mut self) -> wasmtime::Result<u64> {
        Ok(redis(self)?.generation())
    }
}

impl<T> wit::HostWithStore<T> for HasSelf<Ctx> {
    async fn command(
        accessor: &Accessor<T, Self>,
        args: Vec<Vec<u8>>,
    ) -> wasmtime::Result<Result<Vec<wit::Frame>, wit::RedisError>> {
        let redis = redis_of(accessor)?;
        let reply = redis.conns.command(&args).await;
        Ok(reply.map(frames).map_err(error))
    }

    async fn pipeline(
        accessor: &Accessor<T, Self>,
        commands: Vec<Vec<Vec<u8>>>,
    ) -> wasmtime::Result<Result<Vec<Vec<wit::Frame>>, wit::RedisError>> {
        let redis = redis_of(accessor)?;
        let replies = redis.conns.pipeline(&commands).await;
        Ok(replies
            .map(|values| values.into_iter().map(frames).collect())
            .map_err(error))
    }

    async fn blocking(
        accessor: &Accessor<T, Self>,
        args: Vec<Vec<u8>>,
    ) -> wasmtime::Result<Result<Vec<wit::Frame>, wit::RedisError>> {
        let redis = redis_of(accessor)?;
        let reply = redis.conns.blocking(&args).await;
        Ok(reply.map(frames).map_err(error))
    }

    async fn subscribe(
        accessor: &Accessor<T, Self>,
        channel: Vec<u8>,
    ) -> wasmtime::Result<Result<(u64, StreamReader<Vec<u8>>), wit::RedisError>> {
        let redis = redis_of(accessor)?;
        let (id, stream, unsubscribed) = match redis.conns.subscribe(&channel).await {
            Ok(subscribed) => subscribed,
            Err(e) => {
                return Ok(Err(error(e)));
            }
        };
        let subscription = Subscription::new(id, stream, unsubscribed, redis.conns.clone());
        accessor.with(|mut access| {
            StreamReader::new(&mut access, BatchProducer::new(subscription, |p| p))
                .map(|reader| Ok((id, reader)))
        })
    }

    async fn unsubscribe(accessor: &Accessor<T, Self>, subscription: u64) -> wasmtime::Result<()> {
        let redis = redis_of(accessor)?;
        redis.conns.unsubscribe(subscription).await;
        Ok(())
    }
}
