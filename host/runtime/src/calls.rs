//! Typed calls into a running adapter, one per WIT export: each runs inside the instance,
//! answers `unsupported` when the component lacks the capability, and turns returned streams
//! into tokio channels of batches (or, for `log.tail` and `direct.listen`, any [`BatchSink`]).

use std::sync::Arc;

use tokio::sync::mpsc;

use super::instance::AdapterInstance;
use super::streams::{BatchSink, CHANNEL_BATCHES, Forward};
use tokio_util::sync::PollSender;
use wasmtime::component::{Accessor, Func, Lift, Lower, StreamReader, TypedFunc};

use super::sandbox::Ctx;

use crate::bindings::{direct, log, queue, types};
use crate::error::{Error, Result};

/// Drain a guest-written stream into a channel of batches (read inside the instance).
fn forward<T: Send + Sync + wasmtime::component::Lift + 'static>(
    accessor: &Accessor<Ctx>,
    reader: StreamReader<T>,
) -> wasmtime::Result<mpsc::Receiver<Vec<T>>> {
    let (tx, rx) = mpsc::channel(CHANNEL_BATCHES);
    forward_into(accessor, reader, PollSender::new(tx))?;
    Ok(rx)
}

/// Drain a guest-written stream into `sink` (read inside the instance).
fn forward_into<T: Send + Sync + wasmtime::component::Lift + 'static>(
    accessor: &Accessor<Ctx>,
    reader: StreamReader<T>,
    sink: impl BatchSink<T>,
) -> wasmtime::Result<()> {
    accessor.with(|mut access| reader.pipe(&mut access, Forward::to(sink)))
}

fn missing(capability: &str) -> Error {
    Error::Unsupported(format!(
        "the adapter does not export the `{capability}` capability"
    ))
}

/// Call `func`, a `(string, list<T>) -> result<R, error>` export, lowering its list from an
/// `Arc<[T]>`: a caller that may send a batch again (after a trap) shares it instead of
/// copying it.
///
/// # Safety
/// `func` must be the export whose generated signature is `(String, Vec<T>) ->
/// Result<R, types::Error>`. wasmtime lowers `Arc<[T]>` exactly as `Vec<T>` (it forwards
/// `Arc<X>` to `X` and `Vec<T>` to `[T]`).
async unsafe fn call_shared_list<T, R>(
    accessor: &Accessor<Ctx>,
    func: Func,
    name: String,
    list: Arc<[T]>,
) -> wasmtime::Result<Result<R>>
where
    T: Lower + Send + Sync + 'static,
    R: Lift + Send + Sync + 'static,
{
    // SAFETY: the caller's promise above.
    let typed = unsafe {
        TypedFunc::<(String, Arc<[T]>), (std::result::Result<R, types::Error>,)>::new_unchecked(
            func,
        )
    };
    let (answer,) = typed.call_concurrent(accessor, (name, list)).await?;
    Ok(answer.map_err(Error::from))
}

/// Raw calls: what an adapter exports, with no host machinery on top (the contract suite uses
/// these to check an adapter's own contract; the public API builds on them).
impl AdapterInstance {
    /// `log.append`. The batch is lowered from the shared slice: the caller keeps an `Arc` of
    /// it to send again after a trap, with no copy of the payloads per attempt.
    pub async fn log_append(
        &self,
        topic: String,
        batch: impl Into<Arc<[log::RecordIn]>>,
    ) -> Result<Vec<String>> {
        let batch = batch.into();
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(log) = &exports.log else {
                    return Ok(Err(missing("log")));
                };
                // SAFETY: generated as `(String, Vec<_>) -> Result<_, Error>`.
                unsafe { call_shared_list(accessor, *log.func_append().func(), topic, batch).await }
            })
        })
        .await
    }

    /// `log.parse-id`.
    pub async fn log_parse_id(&self, text: String) -> Result<()> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(log) = &exports.log else {
                    return Ok(Err(missing("log")));
                };
                // The generated `func_parse_id` borrows its `&str`, which `call_concurrent` cannot
                // hold; an owned `String` lowers exactly like `&str` (WIT `string`).
                // SAFETY: same WIT signature, `string` param as `String` instead of `&str`.
                let parse_id = unsafe {
                    TypedFunc::<(String,), (std::result::Result<(), types::Error>,)>::new_unchecked(
                        *log.func_parse_id().func(),
                    )
                };
                let (parsed,) = parse_id.call_concurrent(accessor, (text,)).await?;
                Ok(parsed.map_err(Error::from))
            })
        })
        .await
    }

    /// `log.range`.
    pub async fn log_range(
        &self,
        topic: String,
        origin: types::Start,
        limit: u32,
    ) -> Result<log::Page> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(log) = &exports.log else {
                    return Ok(Err(missing("log")));
                };
                Ok(log
                    .call_range(accessor, topic, origin, limit)
                    .await?
                    .map_err(Error::from))
            })
        })
        .await
    }

    /// `log.tail`: the reader's positions and a channel of entry batches.
    pub async fn log_tail(
        &self,
        topic: String,
        origin: types::Start,
    ) -> Result<(Vec<types::Position>, mpsc::Receiver<Vec<log::Entry>>)> {
        let (tx, rx) = mpsc::channel(CHANNEL_BATCHES);
        let positions = self
            .log_tail_into(topic, origin, PollSender::new(tx))
            .await?;
        Ok((positions, rx))
    }

    /// `log.tail` into `sink`: the reader's positions; each batch of entries goes into the
    /// sink as the instance reads it from the guest's stream (no task in between).
    pub async fn log_tail_into(
        &self,
        topic: String,
        origin: types::Start,
        sink: impl BatchSink<log::Entry>,
    ) -> Result<Vec<types::Position>> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(log) = &exports.log else {
                    return Ok(Err(missing("log")));
                };
                match log.call_tail(accessor, topic, origin).await? {
                    Err(e) => Ok(Err(e.into())),
                    Ok((positions, reader)) => {
                        forward_into(accessor, reader, sink)?;
                        Ok(Ok(positions))
                    }
                }
            })
        })
        .await
    }

    /// `backplane.publish`, lowered from the shared slice (as [`Self::log_append`]).
    pub async fn backplane_publish(
        &self,
        channel: String,
        payloads: impl Into<Arc<[Vec<u8>]>>,
    ) -> Result<()> {
        let payloads = payloads.into();
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(backplane) = &exports.backplane else {
                    return Ok(Err(missing("backplane")));
                };
                // SAFETY: generated as `(String, Vec<_>) -> Result<_, Error>`.
                unsafe {
                    call_shared_list(
                        accessor,
                        *backplane.func_publish().func(),
                        channel,
                        payloads,
                    )
                    .await
                }
            })
        })
        .await
    }

    /// `backplane.subscribe`: a channel of payload batches; drop it to unsubscribe.
    pub async fn backplane_subscribe(
        &self,
        channel: String,
    ) -> Result<mpsc::Receiver<Vec<Vec<u8>>>> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(backplane) = &exports.backplane else {
                    return Ok(Err(missing("backplane")));
                };
                match backplane.call_subscribe(accessor, channel).await? {
                    Err(e) => Ok(Err(e.into())),
                    Ok(reader) => Ok(Ok(forward(accessor, reader)?)),
                }
            })
        })
        .await
    }

    /// `queue.produce`, lowered from the shared slice (as [`Self::log_append`]).
    pub async fn queue_produce(
        &self,
        queue_name: String,
        batch: impl Into<Arc<[queue::Message]>>,
    ) -> Result<()> {
        let batch = batch.into();
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(queue) = &exports.queue else {
                    return Ok(Err(missing("queue")));
                };
                // SAFETY: generated as `(String, Vec<_>) -> Result<_, Error>`.
                unsafe {
                    call_shared_list(accessor, *queue.func_produce().func(), queue_name, batch)
                        .await
                }
            })
        })
        .await
    }

    /// `queue.consume`: the consumer id and a channel of delivery batches.
    pub async fn queue_consume(
        &self,
        queue_name: String,
        opts: queue::ConsumeOptions,
    ) -> Result<(queue::ConsumerId, mpsc::Receiver<Vec<queue::Delivery>>)> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(queue) = &exports.queue else {
                    return Ok(Err(missing("queue")));
                };
                match queue.call_consume(accessor, queue_name, opts).await? {
                    Err(e) => Ok(Err(e.into())),
                    Ok((id, reader)) => Ok(Ok((id, forward(accessor, reader)?))),
                }
            })
        })
        .await
    }

    /// `queue.settle`: one result per settlement, in order.
    pub async fn queue_settle(
        &self,
        consumer: queue::ConsumerId,
        batch: Vec<(types::Tag, queue::Settlement)>,
    ) -> Result<Vec<Result<()>>> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(queue) = &exports.queue else {
                    return Ok(Err(missing("queue")));
                };
                let results = queue.call_settle(accessor, consumer, batch).await?;
                Ok(Ok(results
                    .into_iter()
                    .map(|r| r.map_err(Error::from))
                    .collect()))
            })
        })
        .await
    }

    /// `queue.healthy`.
    pub async fn queue_healthy(&self, consumer: queue::ConsumerId) -> Result<Option<bool>> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(queue) = &exports.queue else {
                    return Ok(Err(missing("queue")));
                };
                let (healthy,) = queue
                    .func_healthy()
                    .call_concurrent(accessor, (consumer,))
                    .await?;
                Ok(Ok(healthy))
            })
        })
        .await
    }

    /// `queue.stop`.
    pub async fn queue_stop(&self, consumer: queue::ConsumerId) -> Result<()> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(queue) = &exports.queue else {
                    return Ok(Err(missing("queue")));
                };
                queue.call_stop(accessor, consumer).await?;
                Ok(Ok(()))
            })
        })
        .await
    }

    /// `queue.depth`: messages of the queue not yet done.
    pub async fn queue_depth(&self, queue_name: String) -> Result<u64> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(queue) = &exports.queue else {
                    return Ok(Err(missing("queue")));
                };
                Ok(queue
                    .call_depth(accessor, queue_name)
                    .await?
                    .map_err(Error::from))
            })
        })
        .await
    }

    /// `direct.inbox`.
    pub async fn direct_inbox(&self) -> Result<String> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(direct) = &exports.direct else {
                    return Ok(Err(missing("direct")));
                };
                let (inbox,) = direct.func_inbox().call_concurrent(accessor, ()).await?;
                Ok(Ok(inbox))
            })
        })
        .await
    }

    /// `direct.send`.
    pub async fn direct_send(
        &self,
        address: String,
        packet: direct::Packet,
        timeout_ms: u32,
    ) -> Result<()> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(direct) = &exports.direct else {
                    return Ok(Err(missing("direct")));
                };
                Ok(direct
                    .call_send(accessor, address, packet, timeout_ms)
                    .await?
                    .map_err(Error::from))
            })
        })
        .await
    }

    /// `direct.listen`: the listener id and a channel of packet batches.
    pub async fn direct_listen(
        &self,
        address: String,
        group: Option<String>,
    ) -> Result<(direct::ListenerId, mpsc::Receiver<Vec<direct::Packet>>)> {
        let (tx, rx) = mpsc::channel(CHANNEL_BATCHES);
        let id = self
            .direct_listen_into(address, group, PollSender::new(tx))
            .await?;
        Ok((id, rx))
    }

    /// `direct.listen` into `sink`: the listener id; each batch of packets goes into the sink
    /// as the instance reads it from the guest's stream (no task in between).
    pub async fn direct_listen_into(
        &self,
        address: String,
        group: Option<String>,
        sink: impl BatchSink<direct::Packet>,
    ) -> Result<direct::ListenerId> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(direct) = &exports.direct else {
                    return Ok(Err(missing("direct")));
                };
                match direct.call_listen(accessor, address, group).await? {
                    Err(e) => Ok(Err(e.into())),
                    Ok((id, reader)) => {
                        forward_into(accessor, reader, sink)?;
                        Ok(Ok(id))
                    }
                }
            })
        })
        .await
    }

    /// `direct.healthy`.
    pub async fn direct_healthy(&self, listener: direct::ListenerId) -> Result<Option<bool>> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(direct) = &exports.direct else {
                    return Ok(Err(missing("direct")));
                };
                let (healthy,) = direct
                    .func_healthy()
                    .call_concurrent(accessor, (listener,))
                    .await?;
                Ok(Ok(healthy))
            })
        })
        .await
    }

    /// `direct.stop`.
    pub async fn direct_stop(&self, listener: direct::ListenerId) -> Result<()> {
        self.call(move |accessor, exports| {
            Box::pin(async move {
                let Some(direct) = &exports.direct else {
                    return Ok(Err(missing("direct")));
                };
                direct.call_stop(accessor, listener).await?;
                Ok(Ok(()))
            })
        })
        .await
    }
}
