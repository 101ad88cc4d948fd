"""Moving a store subscription's items into a stream an export returned (`pump`), and the
listeners of `direct`: ids, a stop that leaves the address first and hands over what was sent
before, and `healthy`.
"""

from dataclasses import dataclass, field
from typing import Any, Callable

import componentize_py_async_support
from wit_world.imports import store

from .wake import Latch

BATCH = 256
"""How many items `pump` reads at a time."""


async def pump(source: Any, sink: Any, convert: Callable[[list], list]) -> None:
    """Copy `source` into `sink`, a batch at a time through `convert`, until either end is
    dropped; then drop both (dropping a store stream unsubscribes, dropping `sink` ends the
    stream the host reads). A dropped `sink` shows only at the next write."""
    with source, sink:
        while True:
            items = await source.read(BATCH)
            batch = convert(items)
            if batch:
                await sink.write_all(batch)
                if sink.reader_dropped:
                    return
            if source.writer_dropped:
                return


@dataclass
class Listener:
    """A live listener: its store subscription, and latches for its stop and its end."""

    subscription: int
    """The store listener id (`inbox-unlisten` takes it)."""
    stopping: bool = False
    """Set by `stop`: the subscription is being taken off the address."""
    ended: Latch = field(default_factory=Latch)
    """Set once the listener's pump has ended."""


_LISTENERS: dict[int, Listener] = {}
_NEXT_ID = [1]


async def _run_listener(listener: Listener, source: Any, sink: Any, convert: Callable) -> None:
    """Relay until the store stream ends (after a stop: once it yielded what was sent before) or
    the host drops the listener's stream; free the subscription if nobody stopped it."""
    await pump(source, sink, convert)
    if not listener.stopping:
        listener.stopping = True
        await store.inbox_unlisten(listener.subscription)
    listener.ended.set()


def spawn_listener(subscription: int, source: Any, sink: Any, convert: Callable) -> int:
    """Register a listener on store subscription `subscription` and start relaying `source` into
    `sink`; returns its id."""
    listener_id = _NEXT_ID[0]
    _NEXT_ID[0] += 1
    listener = Listener(subscription)
    _LISTENERS[listener_id] = listener
    componentize_py_async_support.spawn(_run_listener(listener, source, sink, convert))
    return listener_id


def listener_healthy(listener_id: int) -> bool | None:
    """Whether listener `listener_id` still relays; none for an unknown id."""
    listener = _LISTENERS.get(listener_id)
    return None if listener is None else not listener.ended.is_set()


async def stop_listener(listener_id: int) -> None:
    """Stop a listener: off the address first (a send after this finds nobody), then wait until
    it has handed over what was sent before. Unknown ids are ignored."""
    listener = _LISTENERS.get(listener_id)
    if listener is None:
        return
    if not listener.stopping:
        listener.stopping = True
        await store.inbox_unlisten(listener.subscription)
    await listener.ended.wait()
    _LISTENERS.pop(listener_id, None)


async def stop_all_listeners() -> None:
    """Stop every live listener (`close`)."""
    for listener_id in list(_LISTENERS):
        await stop_listener(listener_id)
