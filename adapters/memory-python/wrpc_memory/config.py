"""Options, store names and errors: what `init` configures and every export reads.

Everything lasting lives in the store; this module keeps only the configuration of the
instance (lost on a trap, set again by the next `init`).
"""

import re
from dataclasses import dataclass
from typing import Optional

from componentize_py_types import Err
from wit_world.imports import host, store, types

DEFAULT_PREFIX = "wrpc"
"""The default of option `prefix`."""

VISIBILITY_MS = "queue.visibilityMs"
"""The option naming a consumer's lease, the same name on every broker."""

OPTIONS = [
    (
        "retention.maxEntries",
        "10000",
        "Entries kept per topic in the logs this adapter creates; older ones are trimmed.",
    ),
    (
        "epoch",
        "",
        "Stamped into the ids of every log this adapter creates"
        " (default: a fresh random id per log).",
    ),
    ("prefix", DEFAULT_PREFIX, "Namespace of every log, queue and channel name in the store."),
    (
        VISIBILITY_MS,
        "30000",
        "Lease a consumer takes on a delivery; renewed every third of it until settled.",
    ),
]
"""The options this adapter takes: (name, default, doc); `describe` lists them."""

_EPOCH = re.compile(r"[A-Za-z0-9_-]+")
_NUMBER = re.compile(r"\+?[0-9]+")
U32_MAX = 2**32 - 1
"""The largest `u32`."""


def bad_request(message: str) -> Err:
    """A `bad-request` error, to raise."""
    return Err(types.Error_BadRequest(message))


def gone(message: str) -> Err:
    """A `gone` error (410), to raise."""
    return Err(types.Error_Gone(message))


def closed(message: str) -> Err:
    """A `closed` error, to raise."""
    return Err(types.Error_Closed(message))


def is_epoch(text: str) -> bool:
    """Whether `text` is a valid log epoch: `[A-Za-z0-9_-]+` (ASCII)."""
    return text.isascii() and _EPOCH.fullmatch(text) is not None


def store_error(e: store.StoreError) -> types.Error:
    """A store error as a broker error: the same kind and message."""
    if isinstance(e, store.StoreError_BadRequest):
        return types.Error_BadRequest(e.value)
    if isinstance(e, store.StoreError_Unavailable):
        return types.Error_Unavailable(e.value)
    if isinstance(e, store.StoreError_Refused):
        return types.Error_Refused(e.value)
    return types.Error_Timeout(e.value)


def _read_options(given: list[tuple[str, str]]) -> dict[str, str]:
    """The given options checked against the table: unknown or repeated names are bad requests."""
    seen: dict[str, str] = {}
    for name, value in given:
        if name in seen:
            raise bad_request(f"option `{name}` given twice")
        seen[name] = value
    known = [name for name, _, _ in OPTIONS]
    unknown = [name for name, _ in given if name not in known]
    if unknown:
        raise bad_request(
            f"unknown option(s): {', '.join(unknown)} (this adapter takes: {', '.join(known)})"
        )
    defaults = {name: default for name, default, _ in OPTIONS}
    return {**defaults, **seen}


def _at_least(options: dict[str, str], name: str, least: int) -> int:
    """Option `name` as a `u32` of at least `least`."""
    text = options[name]
    digits = text.strip()
    if not _NUMBER.fullmatch(digits) or int(digits) > U32_MAX:
        raise bad_request(
            f"option `{name}`: cannot read `{text}`: not a number from 0 to {U32_MAX}"
        )
    value = int(digits)
    if value < least:
        raise bad_request(f"option `{name}` must be at least {least}")
    return value


@dataclass(frozen=True)
class Config:
    """What `init` configured; fixed for the life of the instance."""

    generation: int
    """The instance generation, stamped into every delivery tag."""
    prefix: str
    """Namespace of every store name."""
    max_entries: int
    """Retention of the logs this adapter creates."""
    epoch: Optional[str]
    """Epoch of every log this adapter creates; none: a fresh id per log."""
    visibility_ms: int
    """The lease a queue consumer takes, in milliseconds."""

    @staticmethod
    def from_options(generation: int, given: list[tuple[str, str]]) -> "Config":
        """Read `init`'s options; an unknown option or a bad value is a bad request naming it."""
        options = _read_options(given)
        config = Config(
            generation=generation,
            prefix=options["prefix"],
            max_entries=_at_least(options, "retention.maxEntries", 1),
            epoch=options["epoch"] or None,
            visibility_ms=_at_least(options, VISIBILITY_MS, 1),
        )
        if not config.prefix:
            raise bad_request("option `prefix` must not be empty")
        if config.epoch is not None and not is_epoch(config.epoch):
            raise bad_request(f"option `epoch`: `{config.epoch}` is not [A-Za-z0-9_-]+")
        return config

    def new_log_epoch(self) -> str:
        """The epoch for a log created now (the store uses it only if the log is new)."""
        return self.epoch if self.epoch is not None else host.generate_id()

    def name(self, kind: str, name: str) -> str:
        """The store name of `name` in namespace `kind` (`log`, `queue`, `chan`)."""
        if not name:
            raise bad_request(f"empty {kind} name")
        return f"{self.prefix}/{kind}/{name}"


_CONFIG: Optional[Config] = None


def configure(config: Config) -> None:
    """Keep the configuration `init` read."""
    global _CONFIG
    _CONFIG = config


def config() -> Config:
    """The configuration, or `closed` before `init`."""
    if _CONFIG is None:
        raise closed("the adapter was not initialised")
    return _CONFIG


def prefix_or_default() -> str:
    """The configured prefix, or the default before `init`."""
    return _CONFIG.prefix if _CONFIG is not None else DEFAULT_PREFIX
