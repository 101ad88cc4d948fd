"""`wrpc:broker/log` on the store's logs: one store log `{prefix}/log/{topic}` per topic, a
single partition (0) whose offsets are the store's. An entry's id is `{epoch}:{offset}`, the
epoch being the one the store keeps for that log, so every instance mints the same ids and a
foreign id is recognised.
"""

import componentize_py_async_support
import wit_world
from componentize_py_types import Err
from wit_world.exports import log
from wit_world.imports import store, types

from . import relay
from .config import Config, bad_request, config, gone, is_epoch, store_error


def parse(text: str) -> tuple[str, int]:
    """Split an id `{epoch}:{offset}` into its parts; anything else is a bad request."""
    epoch, colon, offset = text.rpartition(":")
    malformed = bad_request(f"malformed id `{text}`: expected `epoch:offset`")
    if not colon or not is_epoch(epoch) or not offset.isascii() or not offset.isdigit():
        raise malformed
    value = int(offset)
    if value >= 2**64:
        raise malformed
    return epoch, value


def _entry(epoch: str, e: store.LogEntry) -> log.Entry:
    """A stored entry as the broker's entry."""
    return log.Entry(
        id=f"{epoch}:{e.offset}",
        pos=types.Position(partition=0, offset=e.offset),
        value=e.value,
        headers=e.headers,
        key=e.key,
    )


def _open(cfg: Config, topic: str) -> tuple[str, store.LogInfo]:
    """Open (or create) the log of `topic`."""
    name = cfg.name("log", topic)
    return name, store.log_open(name, cfg.new_log_epoch(), cfg.max_entries)


def _start_offset(info: store.LogInfo, origin: types.Start) -> int:
    """The offset a read from `origin` starts at, checked against the log's state."""
    if isinstance(origin, types.Start_Earliest):
        return info.first
    if isinstance(origin, types.Start_Latest):
        return info.next
    text = origin.value
    epoch, offset = parse(text)
    if epoch != info.epoch:
        raise gone(
            f"id `{text}` was minted by another log (epoch {epoch}, this log has {info.epoch})"
        )
    start = min(offset + 1, 2**64 - 1)
    if start > info.next:
        raise bad_request(f"id `{text}` is past the tip (next offset {info.next})")
    if start < info.first:
        raise gone(f"id `{text}` is older than the retained history (oldest offset {info.first})")
    return start


async def append(topic: str, batch: list[log.RecordIn]) -> list[str]:
    """`log.append`: one store append for the batch; one id per record."""
    cfg = config()
    name = cfg.name("log", topic)
    if not batch:
        return []
    records = [store.LogRecord(value=r.value, headers=r.headers, key=r.key) for r in batch]
    info, first = store.log_append(name, cfg.new_log_epoch(), cfg.max_entries, records)
    return [f"{info.epoch}:{offset}" for offset in range(first, first + len(records))]


def parse_id(text: str) -> None:
    """`log.parse-id`: the syntax of an id, without the store."""
    parse(text)


async def read_range(topic: str, origin: types.Start, limit: int) -> log.Page:
    """`log.range`: up to `limit` entries from `origin`, and whether the page reached the tip."""
    if limit == 0:
        raise bad_request("limit must be at least 1")
    cfg = config()
    name, info = _open(cfg, topic)
    start = _start_offset(info, origin)
    try:
        info, entries = store.log_read(name, start, limit)
    except Err as e:
        raise Err(store_error(e.value))
    # Trimmed between the open and the read: the store clamped the read forward.
    if isinstance(origin, types.Start_After) and entries and entries[0].offset != start:
        raise gone(
            f"id `{origin.value}` is older than the retained history "
            f"(oldest offset {entries[0].offset})"
        )
    done = not entries or entries[-1].offset + 1 >= info.next
    return log.Page(entries=[_entry(info.epoch, e) for e in entries], done=done)


async def tail(topic: str, origin: types.Start) -> tuple[list[types.Position], object]:
    """`log.tail`: the start position, and a stream of every entry from it on."""
    cfg = config()
    name, info = _open(cfg, topic)
    start = _start_offset(info, origin)
    follow = await store.log_follow(name, start)
    writer, reader = wit_world.log_entry_stream()
    epoch = info.epoch

    def convert(batch: list[store.LogEntry]) -> list[log.Entry]:
        return [_entry(epoch, e) for e in batch]

    componentize_py_async_support.spawn(relay.pump(follow, writer, convert))
    return [types.Position(partition=0, offset=start)], reader
