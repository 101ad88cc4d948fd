"""The memory adapter written in Python: every capability of `wrpc:broker` (backplane, log,
queue, direct) on the host's in-process `wrpc:memory/store`, the same mapping as the Rust
adapter in `adapters/memory/`. Nothing lasting lives in the component: log entries, queued
messages, channel and inbox registrations are in the store, which every host instance on the
memory broker shares.

Built with componentize-py 0.25.1 (pinned: it pairs with the host's wasmtime 48; the component
model's async ABI still moves between releases), from this folder:

    pip install componentize-py==0.25.1
    componentize-py -d wit -w adapter componentize app -o memory_python.wasm

`cargo test` at the repository root does this (tests/build.rs) when the sources change.
"""

import componentize_py_async_support
import wit_world
from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import adapter, direct, log, queue
from wit_world.imports import host, store, types

from wrpc_memory import config as cfg
from wrpc_memory import logs, queues, relay

VERSION = "0.1.0"
"""This adapter's version (the workspace's)."""


class Adapter(exports.Adapter):
    """The lifecycle: `describe`, `init`, `close`."""

    def describe(self) -> adapter.Info:
        """What the adapter is and the options it takes. Pure."""
        options = [adapter.OptionInfo(n, d, doc) for n, d, doc in cfg.OPTIONS]
        return adapter.Info(name="memory-python", version=VERSION, broker="memory", options=options)

    async def init(self, generation: int, options: list[tuple[str, str]]) -> None:
        """Read the options; a bad one is a bad request naming it."""
        cfg.configure(cfg.Config.from_options(generation, options))

    async def close(self) -> None:
        """Stop every consumer and listener."""
        await queues.stop_all()
        await relay.stop_all_listeners()


class Backplane(exports.Backplane):
    """Channel `c` is the store channel `{prefix}/chan/{c}`; names are literal."""

    async def publish(self, channel: str, payloads: list[bytes]) -> None:
        """Fan the payloads out to the channel's current subscribers."""
        store.channel_publish(cfg.config().name("chan", channel), payloads)

    async def subscribe(self, channel: str):
        """Subscribe; returns once the store has the subscription."""
        source = await store.channel_subscribe(cfg.config().name("chan", channel))
        writer, reader = wit_world.list_u8_stream()
        componentize_py_async_support.spawn(relay.pump(source, writer, lambda batch: batch))
        return reader


class Log(exports.Log):
    """One store log per topic; see `wrpc_memory.logs`."""

    async def append(self, topic: str, batch: list[log.RecordIn]) -> list[str]:
        """Append a batch, in order; one id per record."""
        return await logs.append(topic, batch)

    def parse_id(self, text: str) -> None:
        """Check an id's syntax (`epoch:offset`)."""
        logs.parse_id(text)

    async def range(self, topic: str, origin: types.Start, limit: int) -> log.Page:
        """Up to `limit` entries from `origin`."""
        return await logs.read_range(topic, origin, limit)

    async def tail(self, topic: str, origin: types.Start):
        """A live reader from `origin`."""
        return await logs.tail(topic, origin)


class Queue(exports.Queue):
    """Store queues with leases; see `wrpc_memory.queues`."""

    async def produce(self, queue: str, batch: list[queue.Message]) -> None:
        """Put a batch on the queue."""
        await queues.produce(queue, batch)

    async def consume(self, queue: str, opts: queue.ConsumeOptions):
        """Start a consumer."""
        return await queues.consume(queue, opts)

    async def settle(self, consumer: int, batch: list) -> list:
        """Apply settlements, one answer each."""
        return await queues.settle(consumer, batch)

    def healthy(self, consumer: int) -> bool | None:
        """Whether the consumer's settlements land."""
        return queues.healthy(consumer)

    async def stop(self, consumer: int) -> None:
        """Stop a consumer, handing back what it holds."""
        await queues.stop(consumer)

    async def depth(self, queue: str) -> int:
        """Messages of the queue not yet done."""
        return await queues.depth(queue)


def _to_store(p: direct.Packet) -> store.Packet:
    """A broker packet as a store packet."""
    return store.Packet(p.body, p.headers, p.correlation_id, p.reply_to)


def _from_store(batch: list[store.Packet]) -> list[direct.Packet]:
    """Store packets as broker packets."""
    return [direct.Packet(p.body, p.headers, p.correlation_id, p.reply_to) for p in batch]


class Direct(exports.Direct):
    """Store inboxes, addresses used verbatim; `inbox()` mints `{prefix}.inbox.{id}`."""

    def inbox(self) -> str:
        """A fresh address. Pure."""
        return f"{cfg.prefix_or_default()}.inbox.{host.generate_id()}"

    async def send(self, address: str, message: direct.Packet, timeout_ms: int) -> None:
        """Deliver to the address's listeners."""
        try:
            await store.inbox_send(address, _to_store(message), timeout_ms)
        except Err as e:
            raise Err(cfg.store_error(e.value))

    async def listen(self, address: str, group: str | None):
        """Listen on an address, competing within `group`."""
        if not address:
            raise cfg.bad_request("empty address")
        subscription, source = await store.inbox_listen(address, group)
        writer, reader = wit_world.direct_packet_stream()
        return relay.spawn_listener(subscription, source, writer, _from_store), reader

    def healthy(self, listener: int) -> bool | None:
        """Whether the listener still relays."""
        return relay.listener_healthy(listener)

    async def stop(self, listener: int) -> None:
        """Stop a listener, handing over what was sent before."""
        await relay.stop_listener(listener)
