"""Topic-level log configuration, with Kafka's names.

``LogConfig`` is what one partition log obeys. Topics persist only the keys that were set
explicitly (``overrides``); everything else follows the broker's defaults, so changing a
broker default changes every topic that did not override it, as in Kafka.

Keys (Kafka's topic names) and their meaning:

==========================  =====================  ===========================================
key                         default                meaning
==========================  =====================  ===========================================
``partitions``              1                      (topic creation only; not a LogConfig field)
``segment.bytes``           1 GiB                  roll the active segment at this size
``segment.ms``              7 days                 roll once the segment spans this long
``segment.index.bytes``     10 MiB                 roll when an index would grow past this
``index.interval.bytes``    4096                   bytes of log between sparse index entries
``retention.ms``            7 days (-1 = forever)  delete segments older than this
``retention.bytes``         -1 (unbounded)         per-partition size cap
``cleanup.policy``          ``delete``             ``delete``, ``compact`` or ``compact,delete``
``delete.retention.ms``     1 day                  how long tombstones survive compaction
``min.compaction.lag.ms``   0                      records younger than this stay uncompacted
``min.cleanable.dirty.ratio`` 0.5                  compact when the dirty share exceeds it
``max.compaction.lag.ms``   unbounded              compact a log whose oldest dirty record is
                                                   this old, whatever its dirty share (KIP-354)
``max.message.bytes``       1 MiB + 12             largest batch accepted
``message.timestamp.type``  ``CreateTime``         or ``LogAppendTime``
``message.timestamp.before.max.ms`` unbounded      a CreateTime this far behind the broker's
                                                   clock is refused (INVALID_TIMESTAMP)
``message.timestamp.after.max.ms``  unbounded      and this far ahead of it (KIP-937)
``compression.type``        ``producer``           store batches as sent, or recompress them
                                                   (``uncompressed``, ``gzip``, ``snappy``,
                                                   ``lz4``, ``zstd``)
``flush.messages``          -1 (never by count)    fsync after this many records
``flush.ms``                -1 (never by time)     fsync when the oldest unflushed data is this old
``file.delete.delay.ms``    60000                  keep ``.deleted`` files this long
``min.insync.replicas``     1                      in-sync replicas ``acks=all`` needs (cluster)
``unclean.leader.election.enable`` false           elect an out-of-sync replica (cluster)
==========================  =====================  ===========================================

Unknown keys and bad values raise ``InvalidConfigError`` naming the key and the reason;
Kafka's tiered-storage keys (``local.retention.ms``, ``local.retention.bytes``,
``remote.storage.enable``...) are refused by name with the reason (``RESERVED_KEYS``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tidelog.storage.errors import InvalidConfigError

__all__ = [
    "CLEANUP_POLICIES",
    "COMPRESSION_TYPES",
    "RESERVED_KEYS",
    "TIMESTAMP_TYPES",
    "UNBOUNDED_MS",
    "LogConfig",
]

CLEANUP_POLICIES = frozenset({"delete", "compact", "compact,delete"})
TIMESTAMP_TYPES = frozenset({"CreateTime", "LogAppendTime"})
COMPRESSION_TYPES = frozenset({"producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"})

_DAY_MS = 24 * 60 * 60 * 1000
UNBOUNDED_MS = 2**63 - 1  # Kafka's Long.MAX_VALUE: no bound


def _parse_int(key: str, value: str | int, minimum: int) -> int:
    if isinstance(value, bool):
        raise InvalidConfigError(f"{key}: expected an integer, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"{key}: expected an integer, got {value!r}") from None
    if number < minimum:
        raise InvalidConfigError(f"{key}: must be at least {minimum}, got {number}")
    return number


def _parse_ratio(key: str, value: str | float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"{key}: expected a number, got {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise InvalidConfigError(f"{key}: must be between 0 and 1, got {number}")
    return number


def _parse_policy(key: str, value: str) -> str:
    parts = sorted(p.strip() for p in str(value).split(",") if p.strip())
    normalised = ",".join(parts)
    if normalised not in CLEANUP_POLICIES:
        raise InvalidConfigError(
            f"{key}: must be one of delete, compact, compact,delete; got {value!r}"
        )
    return normalised


def _parse_bool(key: str, value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise InvalidConfigError(f"{key} must be true or false, got {value!r}")
    return text == "true"


def _parse_compression_type(key: str, value: str) -> str:
    if value not in COMPRESSION_TYPES:
        known = ", ".join(sorted(COMPRESSION_TYPES))
        raise InvalidConfigError(f"{key}: must be one of {known}, got {value!r}")
    return str(value)


def _parse_timestamp_type(key: str, value: str) -> str:
    if value not in TIMESTAMP_TYPES:
        raise InvalidConfigError(f"{key}: must be CreateTime or LogAppendTime, got {value!r}")
    return str(value)


# Kafka name -> (field name, parser). Minimums follow Kafka's validators.
_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "segment.bytes": ("segment_bytes", lambda k, v: _parse_int(k, v, 14)),
    "segment.ms": ("segment_ms", lambda k, v: _parse_int(k, v, 1)),
    "segment.index.bytes": ("segment_index_bytes", lambda k, v: _parse_int(k, v, 12)),
    "index.interval.bytes": ("index_interval_bytes", lambda k, v: _parse_int(k, v, 0)),
    "retention.ms": ("retention_ms", lambda k, v: _parse_int(k, v, -1)),
    "retention.bytes": ("retention_bytes", lambda k, v: _parse_int(k, v, -1)),
    "cleanup.policy": ("cleanup_policy", _parse_policy),
    "delete.retention.ms": ("delete_retention_ms", lambda k, v: _parse_int(k, v, 0)),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", lambda k, v: _parse_int(k, v, 0)),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", _parse_ratio),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", lambda k, v: _parse_int(k, v, 1)),
    "max.message.bytes": ("max_message_bytes", lambda k, v: _parse_int(k, v, 0)),
    "message.timestamp.type": ("message_timestamp_type", _parse_timestamp_type),
    "message.timestamp.before.max.ms": (
        "message_timestamp_before_max_ms",
        lambda k, v: _parse_int(k, v, 0),
    ),
    "message.timestamp.after.max.ms": (
        "message_timestamp_after_max_ms",
        lambda k, v: _parse_int(k, v, 0),
    ),
    "compression.type": ("compression_type", _parse_compression_type),
    "flush.messages": ("flush_messages", lambda k, v: _parse_int(k, v, -1)),
    "flush.ms": ("flush_ms", lambda k, v: _parse_int(k, v, -1)),
    "file.delete.delay.ms": ("file_delete_delay_ms", lambda k, v: _parse_int(k, v, 0)),
    "min.insync.replicas": ("min_insync_replicas", lambda k, v: _parse_int(k, v, 1)),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", _parse_bool),
}


# Kafka's tiered-storage keys (KIP-405). Tidelog keeps every segment on local disk, so
# these would promise a split between local and remote retention that does not exist;
# they are refused by name rather than as unknown keys, so the message says why.
_TIERED = (
    "tiered storage (KIP-405) is not supported: every segment stays on local disk, "
    "so retention.ms / retention.bytes are the only retention"
)
RESERVED_KEYS: dict[str, str] = dict.fromkeys(
    (
        "local.retention.ms",
        "local.retention.bytes",
        "remote.storage.enable",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
    ),
    _TIERED,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    """The configuration one partition log obeys. Immutable; build with ``from_mapping``."""

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * _DAY_MS
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * _DAY_MS
    retention_bytes: int = -1
    cleanup_policy: str = "delete"
    delete_retention_ms: int = _DAY_MS
    min_compaction_lag_ms: int = 0
    min_cleanable_dirty_ratio: float = 0.5
    max_compaction_lag_ms: int = UNBOUNDED_MS
    max_message_bytes: int = 1024 * 1024 + 12
    message_timestamp_type: str = "CreateTime"
    message_timestamp_before_max_ms: int = UNBOUNDED_MS
    message_timestamp_after_max_ms: int = UNBOUNDED_MS
    compression_type: str = "producer"
    flush_messages: int = -1
    flush_ms: int = -1
    file_delete_delay_ms: int = 60_000
    # Replication (cluster mode): acks=all needs this many in-sync replicas; whether an
    # out-of-sync replica may be elected (the broker's setting when the topic has none).
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False

    @classmethod
    def known_keys(cls) -> frozenset[str]:
        """Every topic configuration key this broker understands."""
        return frozenset(_KEYS)

    @classmethod
    def from_mapping(
        cls, overrides: Mapping[str, Any], defaults: LogConfig | None = None
    ) -> LogConfig:
        """Parse Kafka-named keys on top of ``defaults`` (the built-in defaults if None).

        Raises:
            InvalidConfigError: an unknown key (the message lists the known ones) or a bad value.
        """
        base = defaults if defaults is not None else cls()
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            entry = _KEYS.get(key)
            if key in RESERVED_KEYS:
                raise InvalidConfigError(f"{key}: {RESERVED_KEYS[key]}")
            if entry is None:
                known = ", ".join(sorted(_KEYS))
                raise InvalidConfigError(f"unknown topic config {key!r}; known keys: {known}")
            field, parse = entry
            changes[field] = parse(key, value)
        return dataclasses.replace(base, **changes)

    def to_mapping(self) -> dict[str, str]:
        """Every key with its effective value as a string (Kafka's textual forms)."""
        out: dict[str, str] = {}
        for key, (field, _) in sorted(_KEYS.items()):
            value = getattr(self, field)
            # Kafka's textual booleans are lower case ("false"), as its tools print them.
            out[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return out

    @property
    def compact(self) -> bool:
        """Whether the log cleaner compacts this log."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """Whether time and size retention delete this log's old segments."""
        return "delete" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        """Whether the broker stamps batches with its own time on append."""
        return self.message_timestamp_type == "LogAppendTime"
