//! `wrpc:memory/store` for components: each import is a thin call into [`MemoryStore`]; the
//! live ones (follow, receive, subscribe, listen) become guest-read streams fed in batches.

use std::sync::Arc;
use std::task::{Context, Poll};

use wasmtime::component::{Accessor, HasSelf, Linker, StreamReader};

use super::store::{self, ChannelSubscription, InboxListener, LogFollower, MemoryStore};
use wrpc_broker_runtime::sandbox::Ctx;
use wrpc_broker_runtime::streams::{BatchProducer, PollBatch};

wasmtime::component::bindgen!({
    inline: "package wrpc:host-memory; world driver { import wrpc:memory/store@0.1.0; }",
    path: "../wit",
    imports: { default: trappable },
});

use wrpc::memory::store as wit;

/// Link `wrpc:memory/store` into `linker`.
pub fn add_to_linker(linker: &mut Linker<Ctx>) -> wasmtime::Result<()> {
    wit::add_to_linker::<_, HasSelf<Ctx>>(linker, |ctx| ctx)
}

fn no_driver() -> wasmtime::Error {
    wasmtime::Error::msg("the memory driver is not configured for this adapter")
}

/// The connection lent to the calling component.
fn memory(ctx: &mut Ctx) -> wasmtime::Result<&Arc<MemoryStore>> {
    ctx.lent::<Arc<MemoryStore>>().ok_or_else(no_driver)
}

fn memory_of<T>(accessor: &Accessor<T, HasSelf<Ctx>>) -> wasmtime::Result<Arc<MemoryStore>> {
    accessor.with(|mut access| memory(access.get()).cloned())
}

fn error(e: store::StoreError) -> wit::StoreError {
    match e {
        store::StoreError::BadRequest(m) => wit::StoreError::BadRequest(m),
        store::StoreError::Unavailable(m) => wit::StoreError::Unavailable(m),
        store::StoreError::Refused(m) => wit::StoreError::Refused(m),
        store::StoreError::Timeout(m) => wit::StoreError::Timeout(m),
    }
}

fn results(r: Vec<Result<(), store::StoreError>>) -> Vec<Result<(), wit::StoreError>> {
    r.into_iter().map(|r| r.map_err(error)).collect()
}

fn info(i: store::LogInfo) -> wit::LogInfo {
    wit::LogInfo {
        epoch: i.epoch,
        first: i.first,
        next: i.next,
    }
}

fn entry(e: store::LogEntry) -> wit::LogEntry {
    wit::LogEntry {
        offset: e.offset,
        value: e.value,
        headers: e.headers,
        key: e.key,
    }
}

fn packet_out(p: store::Packet) -> wit::Packet {
    wit::Packet {
        body: p.body,
        headers: p.headers,
        correlation_id: p.correlation_id,
        reply_to: p.reply_to,
    }
}

impl PollBatch for LogFollower {
    type Item = store::LogEntry;
    fn poll_batch(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<Vec<Self::Item>>> {
        self.poll_next_batch(cx, max)
    }
}

impl PollBatch for ChannelSubscription {
    type Item = Vec<u8>;
    fn poll_batch(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<Vec<Self::Item>>> {
        self.poll_next_batch(cx, max)
    }
}

impl PollBatch for InboxListener {
    type Item = store::Packet;
    fn poll_batch(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Option<Vec<Self::Item>>> {
        self.poll_next_batch(cx, max)
    }
}

impl wit::Host for Ctx {
    fn log_open(
        &mut self,
        topic: String,
        epoch: String,
        max_entries: u32,
    ) -> wasmtime::Result<wit::LogInfo> {
        Ok(info(memory(self)?.log_open(&topic, &epoch, max_entries)))
    }

    fn log_append(
        &mut self,
        topic: String,
        epoch: String,
        max_entries: u32,
        batch: Vec<wit::LogRecord>,
    ) -> wasmtime::Result<(wit::LogInfo, u64)> {
        let batch = batch
            .into_iter()
            .map(|r| store::LogRecord {
                value: r.value,
                headers: r.headers,
                key: r.key,
            })
            .collect();
        let (i, first) = memory(self)?.log_append(&topic, &epoch, max_entries, batch);
        Ok((info(i), first))
    }

    fn log_read(
        &mut self,
        topic: String,
        offset: u64,
        limit: u32,
    ) -> wasmtime::Result<Result<(wit::LogInfo, Vec<wit::LogEntry>), wit::StoreError>> {
        Ok(memory(self)?
            .log_read(&topic, offset, limit)
            .map(|(i, entries)| (info(i), entries.into_iter().map(entry).collect()))
            .map_err(error))
    }

    fn queue_depth(&mut self, queue: String) -> wasmtime::Result<u64> {
        let stats = memory(self)?.queue_len(&queue);
        Ok((stats.ready + stats.delayed + stats.leased) as u64)
    }

    fn queue_push(
        &mut self,
        queue: String,
        batch: Vec<wit::Queued>,
    ) -> wasmtime::Result<Result<(), wit::StoreError>> {
        let batch = batch
            .into_iter()
            .map(|q| store::Queued {
                body: q.body,
                headers: q.headers,
                delay_ms: q.delay_ms,
            })
            .collect();
        Ok(memory(self)?.queue_push(&queue, batch).map_err(error))
    }

    fn queue_ack(
        &mut self,
        queue: String,
        receipts: Vec<u64>,
    ) -> wasmtime::Result<Vec<Result<(), wit::StoreError>>> {
        Ok(results(memory(self)?.queue_ack(&queue, &receipts)))
    }

    fn queue_nack(
        &mut self,
        queue: String,
        receipts: Vec<u64>,
        delay_ms: u32,
    ) -> wasmtime::Result<Vec<Result<(), wit::StoreError>>> {
        Ok(results(
            memory(self)?.queue_nack(&queue, &receipts, delay_ms),
        ))
    }

    fn queue_extend(
        &mut self,
        queue: String,
        receipts: Vec<u64>,
        visibility_ms: u32,
    ) -> wasmtime::Result<Vec<Result<(), wit::StoreError>>> {
        Ok(results(memory(self)?.queue_extend(
            &queue,
            &receipts,
            visibility_ms,
        )))
    }

    fn channel_publish(
        &mut self,
        channel: String,
        payloads: Vec<Vec<u8>>,
    ) -> wasmtime::Result<u32> {
        Ok(memory(self)?.channel_publish(&channel, payloads))
    }
}

impl<T> wit::HostWithStore<T> for HasSelf<Ctx> {
    async fn log_follow(
        accessor: &Accessor<T, Self>,
        topic: String,
        offset: u64,
    ) -> wasmtime::Result<StreamReader<wit::LogEntry>> {
        let follower = memory_of(accessor)?.log_follow(&topic, offset);
        accessor
            .with(|mut access| StreamReader::new(&mut access, BatchProducer::new(follower, entry)))
    }

    async fn queue_receive(
        accessor: &Accessor<T, Self>,
        queue: String,
        max: u32,
        visibility_ms: u32,
        wait_ms: u32,
    ) -> wasmtime::Result<Vec<wit::Received>> {
        let store = memory_of(accessor)?;
        let got = store
            .queue_receive(&queue, max, visibility_ms, wait_ms)
            .await;
        Ok(got
            .into_iter()
            .map(|r| wit::Received {
                receipt: r.receipt,
                body: r.body,
                headers: r.headers,
            })
            .collect())
    }

    async fn channel_subscribe(
        accessor: &Accessor<T, Self>,
        channel: String,
    ) -> wasmtime::Result<StreamReader<Vec<u8>>> {
        let subscription = memory_of(accessor)?.channel_subscribe(&channel);
        accessor.with(|mut access| {
            StreamReader::new(&mut access, BatchProducer::new(subscription, |p| p))
        })
    }

    async fn inbox_send(
        accessor: &Accessor<T, Self>,
        address: String,
        packet: wit::Packet,
        timeout_ms: u32,
    ) -> wasmtime::Result<Result<(), wit::StoreError>> {
        let store = memory_of(accessor)?;
        let packet = store::Packet {
            body: packet.body,
            headers: packet.headers,
            correlation_id: packet.correlation_id,
            reply_to: packet.reply_to,
        };
        let sent = store.inbox_send(&address, packet, timeout_ms).await;
        Ok(sent.map_err(error))
    }

    async fn inbox_listen(
        accessor: &Accessor<T, Self>,
        address: String,
        group: Option<String>,
    ) -> wasmtime::Result<(u64, StreamReader<wit::Packet>)> {
        let listener = memory_of(accessor)?.inbox_listen(&address, group);
        let id = listener.id();
        accessor.with(|mut access| {
            StreamReader::new(&mut access, BatchProducer::new(listener, packet_out))
                .map(|stream| (id, stream))
        })
    }

    async fn inbox_unlisten(accessor: &Accessor<T, Self>, listener: u64) -> wasmtime::Result<()> {
        memory_of(accessor)?.inbox_unlisten(listener);
        Ok(())
    }
}
