"""`wrpc:broker/queue` on the store's queues, with the consumer machinery the Rust adapters
share in their guest SDK: queue `q` is the store queue `{prefix}/queue/{q}`, a delivery is a
store lease of `queue.visibilityMs` that the consumer renews every third of it until settled,
and the attempt travels in `x-wrpc-attempt`.

Settlements: ack → `queue-ack`; retry → push a copy (attempt + 1, the delay), then ack;
release → `queue-nack`; dead-letter → push a copy to the dead-letter queue, then ack. Each
store call is tried again after 10, 20 and 40 ms; a settlement that still fails hands the
message back and answers `refused`.
"""

import unicodedata
from dataclasses import dataclass

import componentize_py_async_support
import wit_world
from componentize_py_types import Err, Ok
from wit_world.exports import queue
from wit_world.imports import host, store, types

from .config import bad_request, config, store_error
from .wake import Latch, Notify

ATTEMPT = "x-wrpc-attempt"
"""The delivery attempt, as decimal text: `1` on the first delivery."""
DEAD_REASON = "x-wrpc-dead-reason"
"""Why a message was dead-lettered: one line of at most `MAX_DEAD_REASON` characters."""
MAX_DEAD_REASON = 512
"""The most characters a dead-letter reason keeps."""
BACKOFF_MS = (10, 20, 40)
"""The pauses before each new try of a failed store call of a settlement."""
RECEIVE_WAIT_MS = 250
"""How long one `queue-receive` waits for a first message."""
RECEIVE_PAUSE_MS = 100
"""How long the pump pauses after a failed receive."""
KEEP_ALIVE_SLICE_MS = 100
"""How often the keep-alive task looks whether its consumer stopped."""

Headers = list[tuple[str, bytes]]


def attempt_of(headers: Headers) -> int:
    """The attempt a message carries in `x-wrpc-attempt`; 1 when absent or unreadable."""
    for name, value in headers:
        if name.lower() == ATTEMPT:
            try:
                text = value.decode("utf-8").strip().removeprefix("+")
                number = int(text) if text.isascii() and text.isdigit() else 0
            except UnicodeDecodeError:
                number = 0
            return number if 1 <= number < 2**32 else 1
    return 1


def with_header(headers: Headers, name: str, value: bytes) -> Headers:
    """The headers with every value of `name` replaced by one `value`."""
    kept = [(k, v) for k, v in headers if k.lower() != name]
    return kept + [(name, value)]


def without_attempt(headers: Headers) -> Headers:
    """The headers without the adapter's own `x-wrpc-attempt` (what a handler sees)."""
    return [(k, v) for k, v in headers if k.lower() != ATTEMPT]


def dead_reason(reason: str) -> str:
    """A dead-letter reason made one line of at most `MAX_DEAD_REASON` characters."""
    line = "".join(" " if unicodedata.category(c) == "Cc" else c for c in reason).strip()
    if len(line) <= MAX_DEAD_REASON:
        return line
    return line[: MAX_DEAD_REASON - 1] + "…"


def _retryable(e: types.Error) -> bool:
    """Whether a failed call is worth another try (not a bad request, stale or closed)."""
    return not isinstance(e, (types.Error_BadRequest, types.Error_Stale, types.Error_Closed))


async def tried(call) -> None:
    """Make a store call; while it fails retryably, try again after each pause of `BACKOFF_MS`."""
    for pause in BACKOFF_MS:
        try:
            call()
            return
        except Err as e:
            if not _retryable(e.value):
                raise
        await host.sleep(pause)
    call()


def _one(results: list) -> None:
    """The single answer of a store call for one receipt, raised if it failed."""
    if not results:
        raise Err(types.Error_Internal("the store answered nothing for a receipt"))
    if isinstance(results[0], Err):
        raise Err(store_error(results[0].value))


def _push(name: str, queued: store.Queued) -> None:
    """Put one message on a store queue."""
    try:
        store.queue_push(name, [queued])
    except Err as e:
        raise Err(store_error(e.value))


@dataclass
class Held:
    """A delivery the consumer holds until it is settled."""

    receipt: int
    body: bytes
    headers: Headers
    attempt: int


_NEXT_SEQ = [1]
_CONSUMERS: dict[int, "Consumer"] = {}
_NEXT_ID = [1]


class Consumer:
    """One live consumer: its ledger of unsettled deliveries under the prefetch bound, the pump
    that receives and writes deliveries, the keep-alive task, and settlement."""

    def __init__(self, name: str, dlq: str, prefetch: int, generation: int, lease_ms: int):
        """A consumer of store queue `name` that holds nothing yet."""
        self.name, self.dlq, self.prefetch = name, dlq, prefetch
        self.generation, self.lease_ms = generation, lease_ms
        self.unsettled: dict[int, Held] = {}
        self.settling = 0
        self.settled_ok = True
        self.stopped = False
        self.room_or_stop = Notify()
        self.ended = Latch()

    def room(self) -> int:
        """How many more deliveries the prefetch allows."""
        return max(0, self.prefetch - len(self.unsettled) - self.settling)

    def _hold(self, r: store.Received) -> queue.Delivery:
        """Record a leased message as unsettled and make its delivery."""
        seq = _NEXT_SEQ[0]
        _NEXT_SEQ[0] += 1
        held = Held(r.receipt, r.body, without_attempt(r.headers), attempt_of(r.headers))
        self.unsettled[seq] = held
        tag = types.Tag(generation=self.generation, seq=seq)
        return queue.Delivery(tag=tag, body=held.body, headers=held.headers, attempt=held.attempt)

    async def pump(self, sink) -> None:
        """Receive while there is room and write deliveries to `sink`, until stopped or the host
        drops the stream; then hand back what is unsettled and end the stream."""
        with sink:
            while not self.stopped:
                room = self.room()
                if room == 0:
                    await self.room_or_stop.wait()
                    continue
                leased = await store.queue_receive(self.name, room, self.lease_ms, RECEIVE_WAIT_MS)
                if not leased:
                    continue
                deliveries = [self._hold(r) for r in leased]
                await sink.write_all(deliveries)
                if sink.reader_dropped:
                    break
        self.stopped = True
        unsettled, self.unsettled = self.unsettled, {}
        if unsettled:
            store.queue_nack(self.name, [h.receipt for h in unsettled.values()], 0)
        self.ended.set()

    async def keep_alive(self) -> None:
        """Extend every unsettled lease every third of the lease, until stopped."""
        period = max(1, self.lease_ms // 3)
        due = host.now_ms() + period
        while not self.stopped:
            await host.sleep(min(KEEP_ALIVE_SLICE_MS, period))
            if self.stopped or host.now_ms() < due:
                continue
            due = host.now_ms() + period
            receipts = [h.receipt for h in self.unsettled.values()]
            if receipts:
                # A lease settled meanwhile answers bad-request; a refused one is tried next time.
                store.queue_extend(self.name, receipts, self.lease_ms)

    async def _apply(self, held: Held, settlement: queue.Settlement) -> None:
        """The store calls of one settlement; a copy is confirmed before the original is acked."""
        ack = lambda: _one(store.queue_ack(self.name, [held.receipt]))  # noqa: E731
        if isinstance(settlement, queue.Settlement_Ack):
            await tried(ack)
        elif isinstance(settlement, queue.Settlement_Release):
            await tried(lambda: _one(store.queue_nack(self.name, [held.receipt], 0)))
        elif isinstance(settlement, queue.Settlement_Retry):
            headers = with_header(held.headers, ATTEMPT, str(held.attempt + 1).encode())
            copy = store.Queued(body=held.body, headers=headers, delay_ms=settlement.value)
            await tried(lambda: _push(self.name, copy))
            await tried(ack)
        else:
            headers = with_header(held.headers, DEAD_REASON, dead_reason(settlement.value).encode())
            headers = with_header(headers, ATTEMPT, str(held.attempt).encode())
            copy = store.Queued(body=held.body, headers=headers, delay_ms=0)
            await tried(lambda: _push(self.dlq, copy))
            await tried(ack)

    async def settle(self, tag: types.Tag, settlement: queue.Settlement) -> None:
        """Settle the delivery `tag`; on failure hand the message back and raise `refused`."""
        if tag.generation != self.generation:
            raise Err(
                types.Error_Stale(
                    f"tag from generation {tag.generation}, this instance is {self.generation}"
                )
            )
        held = self.unsettled.pop(tag.seq, None)
        if held is None:
            raise Err(types.Error_Stale(f"delivery {tag.seq} was already settled or handed back"))
        self.settling += 1
        failure = None
        try:
            await self._apply(held, settlement)
        except Err as e:
            failure = e.value
            store.queue_nack(self.name, [held.receipt], 0)
        self.settling -= 1
        self.settled_ok = failure is None
        self.room_or_stop.notify()
        if failure is not None:
            tries = len(BACKOFF_MS) + 1
            why = f"settlement failed after {tries} tries ({failure!r}); message handed back"
            host.log(types.Level.WARN, why)
            raise Err(types.Error_Refused(why))

    async def stop(self) -> None:
        """Take nothing more; resolve once what was unsettled is handed back."""
        self.stopped = True
        self.room_or_stop.notify()
        await self.ended.wait()


async def produce(name: str, batch: list[queue.Message]) -> None:
    """`queue.produce`: one store push for the batch."""
    store_name = config().name("queue", name)
    if not batch:
        return
    queued = [store.Queued(body=m.body, headers=m.headers, delay_ms=0) for m in batch]
    try:
        store.queue_push(store_name, queued)
    except Err as e:
        raise Err(store_error(e.value))


async def consume(name: str, opts: queue.ConsumeOptions) -> tuple[int, object]:
    """`queue.consume`: start a consumer; its id and its delivery stream."""
    cfg = config()
    dlq = opts.dead_letter if opts.dead_letter is not None else f"{name}.dead"
    store_name, store_dlq = cfg.name("queue", name), cfg.name("queue", dlq)
    if opts.prefetch == 0:
        raise bad_request("prefetch must be at least 1")
    consumer = Consumer(store_name, store_dlq, opts.prefetch, cfg.generation, cfg.visibility_ms)
    consumer_id = _NEXT_ID[0]
    _NEXT_ID[0] += 1
    _CONSUMERS[consumer_id] = consumer
    writer, reader = wit_world.queue_delivery_stream()
    componentize_py_async_support.spawn(consumer.pump(writer))
    componentize_py_async_support.spawn(consumer.keep_alive())
    return consumer_id, reader


async def settle(consumer_id: int, batch: list) -> list:
    """`queue.settle`: one answer per settlement, in order."""
    consumer = _CONSUMERS.get(consumer_id)
    answers = []
    for tag, settlement in batch:
        if consumer is None:
            answers.append(Err(types.Error_Closed(f"consumer {consumer_id} is not live")))
            continue
        try:
            await consumer.settle(tag, settlement)
            answers.append(Ok(None))
        except Err as e:
            answers.append(e)
    return answers


def healthy(consumer_id: int) -> bool | None:
    """`queue.healthy`: false since a settlement failed, until one lands; none if not live."""
    consumer = _CONSUMERS.get(consumer_id)
    return None if consumer is None else consumer.settled_ok


async def stop(consumer_id: int) -> None:
    """`queue.stop`: stop a consumer and wait until it handed back what it held."""
    consumer = _CONSUMERS.get(consumer_id)
    if consumer is not None:
        await consumer.stop()
        _CONSUMERS.pop(consumer_id, None)


async def stop_all() -> None:
    """Stop every live consumer (`close`)."""
    for consumer_id in list(_CONSUMERS):
        await stop(consumer_id)


async def depth(name: str) -> int:
    """`queue.depth`: messages of the queue not yet acknowledged."""
    return store.queue_depth(config().name("queue", name))
