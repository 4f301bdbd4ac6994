"""Client configuration: one frozen, keyword-only dataclass per component.

``ProducerConfig``, ``ConsumerConfig`` and ``AdminConfig`` are validated when built (a bad
value raises ``ValueError`` naming the setting) and have a ``from_mapping`` parser for
settings that arrive as text (the command line, Spark options). Names are kafka-python's
keyword names; ``from_mapping`` also accepts Kafka's dotted names (``linger.ms``,
``bootstrap.servers``, ``compression.type``) and rejects unknown keys with the list of
known ones. Defaults follow the Java client (reference section 8.1) except where a
comment says why not.

Pure and thread-safe (immutable values).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tidelog.client.cluster import parse_bootstrap_list
from tidelog.client.security import check_settings as check_security_settings

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "ISOLATION_LEVELS",
    "AdminConfig",
    "ConsumerConfig",
    "ProducerConfig",
    "parse_acks",
    "parse_bootstrap",
    "resolve_config",
]

DEFAULT_BOOTSTRAP = "127.0.0.1:7410"

ISOLATION_LEVELS: dict[str, int] = {"read_uncommitted": 0, "read_committed": 1}
"""Kafka's isolation levels by name, to the number Fetch and ListOffsets carry."""

_INT32_MAX = 2**31 - 1

# Aliases that from_mapping accepts besides the field names and their dotted forms.
_ALIASES = {
    "compression_type": "compression",
    "max_in_flight_requests": "max_in_flight_requests_per_connection",
    # Security: the Java clients' and librdkafka's names for the same settings.
    "ssl_ca_location": "ssl_cafile",
    "ssl_certificate_location": "ssl_certfile",
    "ssl_key_location": "ssl_keyfile",
    "sasl_username": "sasl_plain_username",
    "sasl_password": "sasl_plain_password",
}


def parse_bootstrap(value: str) -> str:
    """Check a bootstrap list ``HOST:PORT[,HOST:PORT...]`` (IPv6 as ``[::1]:PORT``).

    Returns it normalised (blanks dropped, duplicates once): ``"a:1, b:2"`` is
    ``"a:1,b:2"``. Any one live broker of the list is enough to find the others. Raises
    ``ValueError`` for anything else.
    """
    return ",".join(parse_bootstrap_list(value))


def parse_acks(value: int | str) -> int:
    """``0``, ``1`` or ``-1``; accepts ``"all"`` and ``"-1"``/``"0"``/``"1"`` as text."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "all":
            return -1
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"acks must be 0, 1 or 'all', got {value!r}") from None
    if isinstance(value, bool) or value not in (0, 1, -1):
        raise ValueError(f"acks must be 0, 1 or 'all', got {value!r}")
    return value


def _check_security(config: Any) -> None:
    """Normalise and validate the security settings (``client.security``)."""
    object.__setattr__(config, "security_protocol", str(config.security_protocol).upper())
    object.__setattr__(config, "sasl_mechanism", str(config.sasl_mechanism).upper())
    check_security_settings(
        config.security_protocol,
        config.sasl_mechanism,
        config.sasl_plain_username,
        config.sasl_plain_password,
        config.ssl_certfile,
        config.ssl_keyfile,
    )


def _check(name: str, ok: bool, requirement: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{name} {requirement}, got {value!r}")


def _check_ints(config: object, minimums: Mapping[str, int]) -> None:
    for name, minimum in minimums.items():
        value = getattr(config, name)
        _check(
            name,
            isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
            f"must be an integer >= {minimum}",
            value,
        )
        _check(name, value <= _INT32_MAX, "must fit in an int32", value)


_ConfigT = TypeVar("_ConfigT")


def _from_mapping(cls: type[_ConfigT], settings: Mapping[str, object]) -> _ConfigT:
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for raw_key, raw_value in settings.items():
        key = raw_key.strip().replace(".", "_").replace("-", "_")
        key = _ALIASES.get(key, key)
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ValueError(f"unknown {cls.__name__} setting {raw_key!r}; known: {known}")
        values[key] = _coerce(key, hints[key], raw_value)
    return cls(**values)


def resolve_config(
    parse: Callable[[Mapping[str, object]], _ConfigT],
    bootstrap_servers: str,
    config: _ConfigT | None,
    settings: Mapping[str, object],
) -> _ConfigT:
    """The facades' one rule: a ready ``config`` or keyword settings, never both.

    Raises:
        ValueError: both were given, or (from ``parse``) a setting is unknown or bad.
    """
    if config is None:
        return parse({"bootstrap_servers": bootstrap_servers, **settings})
    if settings:
        raise ValueError("pass either config= or keyword settings, not both")
    return config


def _coerce(name: str, hint: object, value: object) -> object:
    """Turn text into the field's type; other values pass through to validation."""
    if not isinstance(value, str):
        return value
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    text = value.strip()
    if type(None) in options and text.lower() in ("", "none", "null"):
        return None
    if bool in options:
        lowered = text.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if int in options and str not in options:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {value!r}") from None
    return text


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerConfig:
    """Everything a ``Producer`` obeys.

    - ``acks``: 0 (answer at once, learn nothing), 1 (appended), -1/"all" (fsynced);
    - ``batch_size``: bytes of records per partition batch before it is sent at once;
      ``linger_ms``: how long a batch waits for more records otherwise;
    - ``buffer_memory``: bytes of records waiting or in flight; a full buffer blocks
      ``send`` up to ``max_block_ms``, then raises ``BufferExhaustedError``;
    - ``retries``/``retry_backoff_ms``: retriable failures are retried (same bytes, same
      sequence numbers) until ``retries`` or ``delivery_timeout_ms`` runs out;
    - ``enable_idempotence``: the broker stores a retried batch once; needs
      ``max_in_flight_requests_per_connection <= 5`` and ``acks`` != 0 (the idempotent
      default ``acks="all"`` as Kafka's);
    - ``max_request_size``: the largest request (and so the largest record) sent;
    - ``transactional_id``: a transactional producer (``client.transactions``), which
      needs ``enable_idempotence`` and ``acks="all"``; ``transaction_timeout_ms``: how long
      the coordinator lets one of its transactions stay open before it aborts it.
    """

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    client_id: str = "tidelog-producer"
    acks: int | str = -1
    linger_ms: int = 5  # Kafka 4.0's default (KIP-1030)
    # Larger than Kafka's 16 KiB: a request costs ~0.5-1 ms in grpcio however small it is,
    # so small batches cap throughput long before bytes do (DESIGN.md's measurements).
    batch_size: int = 256 * 1024
    # Smaller than Kafka's 32 MiB on purpose: every queued record is a future that the
    # garbage collector walks on each full collection, so a full 32 MiB buffer of small
    # records (~250k futures) cost ~15% of throughput in full collections; 4 MiB (16
    # batches) keeps the pipeline full (measured: 255k -> 312k records/s, 116-byte records).
    buffer_memory: int = 4 * 1024 * 1024
    max_block_ms: int = 60_000
    compression: str | None = None
    retries: int = _INT32_MAX
    retry_backoff_ms: int = 100
    request_timeout_ms: int = 30_000
    delivery_timeout_ms: int = 120_000
    max_in_flight_requests_per_connection: int = 5
    enable_idempotence: bool = True
    max_request_size: int = 1024 * 1024
    metadata_max_age_ms: int = 300_000
    reconnect_backoff_max_ms: int = 1_000
    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000  # Kafka's default
    # Security (client.security, docs/security.md): kafka-python's names.
    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    sasl_mechanism: str = "SCRAM-SHA-512"
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bootstrap_servers", parse_bootstrap(self.bootstrap_servers))
        _check_security(self)
        object.__setattr__(self, "acks", parse_acks(self.acks))
        _check_ints(
            self,
            {
                "linger_ms": 0,
                "batch_size": 1,
                "buffer_memory": 1024,
                "max_block_ms": 0,
                "retries": 0,
                "retry_backoff_ms": 0,
                "request_timeout_ms": 1,
                "delivery_timeout_ms": 1,
                "max_in_flight_requests_per_connection": 1,
                "max_request_size": 1024,
                "metadata_max_age_ms": 0,
                "reconnect_backoff_max_ms": 1,
                "transaction_timeout_ms": 1,
            },
        )
        if self.transactional_id is not None:
            _check(
                "transactional_id",
                isinstance(self.transactional_id, str) and bool(self.transactional_id),
                "must be a non-empty string or None",
                self.transactional_id,
            )
            # As Kafka's producer: a transactional producer is idempotent, with acks=all.
            if not self.enable_idempotence:
                raise ValueError("transactional_id needs enable_idempotence=True")
            if self.acks != -1:
                raise ValueError("transactional_id needs acks='all'")
        _check(
            "compression",
            self.compression in (None, "none", "gzip", "snappy", "lz4", "zstd"),
            "must be 'gzip', 'snappy', 'lz4', 'zstd' or None",
            self.compression,
        )
        if self.compression == "none":
            object.__setattr__(self, "compression", None)
        _check("client_id", isinstance(self.client_id, str), "must be a string", self.client_id)
        _check(
            "enable_idempotence",
            isinstance(self.enable_idempotence, bool),
            "must be True or False",
            self.enable_idempotence,
        )
        if self.enable_idempotence:
            if self.max_in_flight_requests_per_connection > 5:
                raise ValueError(
                    "max_in_flight_requests_per_connection must be <= 5 with "
                    "enable_idempotence (the broker remembers 5 batches per producer)"
                )
            if self.acks == 0:
                raise ValueError("enable_idempotence needs acks=1 or acks='all', not acks=0")
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ValueError(
                "delivery_timeout_ms must be >= linger_ms + request_timeout_ms, got "
                f"{self.delivery_timeout_ms} < {self.linger_ms} + {self.request_timeout_ms}"
            )

    @property
    def acks_value(self) -> int:
        """``acks`` as the wire integer (0, 1 or -1)."""
        assert isinstance(self.acks, int)
        return self.acks

    @classmethod
    def from_mapping(cls, settings: Mapping[str, object]) -> ProducerConfig:
        """Build from names (or Kafka's dotted names) to values or text; rejects unknowns."""
        return _from_mapping(cls, settings)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig:
    """Everything a ``Consumer`` obeys.

    - ``group_id``: the consumer group; needed for ``commit``/``committed``. With it,
      ``subscribe`` joins the group and the partitions are shared among its members
      (``session_timeout_ms`` without a heartbeat removes a member; the broker sets the
      heartbeat interval; a member that does not ``poll`` for ``max_poll_interval_ms``
      gives its partitions up and leaves until its next ``poll``);
    - ``auto_offset_reset``: where to start without a committed offset or after
      ``OFFSET_OUT_OF_RANGE``: ``earliest``, ``latest`` or ``none`` (raise
      ``OffsetOutOfRangeError``);
    - ``fetch_min_bytes``/``fetch_max_wait_ms``: the broker's long poll;
      ``fetch_max_bytes``/``max_partition_fetch_bytes``: soft size limits per fetch;
    - ``max_poll_records``: the most records one ``poll`` returns;
    - ``check_crcs``: verify each batch's CRC-32C on receipt;
    - ``consumer_timeout_ms``: iterating the consumer stops (``StopIteration``) after this
      long without a record; None iterates forever;
    - ``group_instance_id``: a static member (Kafka's ``group.instance.id``, KIP-345):
      ``close`` keeps its partitions for ``session_timeout_ms`` and a consumer started
      again with the same id gets them back without a rebalance of the others; a second
      live consumer with the same id fences the first (``FencedInstanceIdError``);
    - ``isolation_level``: ``read_uncommitted`` (default, as Kafka's Java client and
      kafka-python; librdkafka defaults to read_committed) reads up to the high
      watermark, the data records of open and aborted transactions included;
      ``read_committed`` reads up to the last stable offset and never hands out a record
      of an aborted transaction (``client.fetcher``); its ``end_offsets`` and
      ``seek_to_end`` are the last stable offset (issue #28, ``docs/transactions.md``).
      Control records (transaction markers) are never handed out at either level.
    """

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    client_id: str = "tidelog-consumer"
    group_id: str | None = None
    group_instance_id: str | None = None
    auto_offset_reset: str = "latest"
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 52_428_800
    max_partition_fetch_bytes: int = 1_048_576
    max_poll_records: int = 500
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000  # also sent as the rebalance timeout, as Kafka's
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    metadata_max_age_ms: int = 300_000
    reconnect_backoff_max_ms: int = 1_000
    check_crcs: bool = True
    consumer_timeout_ms: int | None = None  # iteration stops after this long without records
    isolation_level: str = "read_uncommitted"
    # Security (client.security, docs/security.md): kafka-python's names.
    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    sasl_mechanism: str = "SCRAM-SHA-512"
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bootstrap_servers", parse_bootstrap(self.bootstrap_servers))
        _check_security(self)
        if self.consumer_timeout_ms is not None:
            _check_ints(self, {"consumer_timeout_ms": 0})
        _check_ints(
            self,
            {
                "auto_commit_interval_ms": 1,
                "fetch_min_bytes": 0,
                "fetch_max_wait_ms": 0,
                "fetch_max_bytes": 1,
                "max_partition_fetch_bytes": 1,
                "max_poll_records": 1,
                "session_timeout_ms": 1,
                "heartbeat_interval_ms": 1,
                "max_poll_interval_ms": 1,
                "request_timeout_ms": 1,
                "retry_backoff_ms": 0,
                "metadata_max_age_ms": 0,
                "reconnect_backoff_max_ms": 1,
            },
        )
        _check(
            "auto_offset_reset",
            self.auto_offset_reset in ("earliest", "latest", "none"),
            "must be 'earliest', 'latest' or 'none'",
            self.auto_offset_reset,
        )
        _check(
            "isolation_level",
            self.isolation_level in ISOLATION_LEVELS,
            "must be 'read_uncommitted' or 'read_committed'",
            self.isolation_level,
        )
        _check(
            "group_id",
            self.group_id is None or (isinstance(self.group_id, str) and self.group_id != ""),
            "must be a non-empty string or None",
            self.group_id,
        )
        _check(
            "group_instance_id",
            self.group_instance_id is None
            or (
                isinstance(self.group_instance_id, str)
                and self.group_instance_id != ""
                and self.group_id is not None
            ),
            "must be a non-empty string, and needs a group_id",
            self.group_instance_id,
        )
        _check("client_id", isinstance(self.client_id, str), "must be a string", self.client_id)
        for name in ("enable_auto_commit", "check_crcs"):
            value = getattr(self, name)
            _check(name, isinstance(value, bool), "must be True or False", value)
        if self.request_timeout_ms <= self.fetch_max_wait_ms:
            raise ValueError(
                "request_timeout_ms must exceed fetch_max_wait_ms (a long poll must answer "
                f"before its deadline), got {self.request_timeout_ms} <= "
                f"{self.fetch_max_wait_ms}"
            )
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be below session_timeout_ms")

    @classmethod
    def from_mapping(cls, settings: Mapping[str, object]) -> ConsumerConfig:
        """Build from names (or Kafka's dotted names) to values or text; rejects unknowns."""
        return _from_mapping(cls, settings)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminConfig:
    """Everything an ``AdminClient`` obeys."""

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    client_id: str = "tidelog-admin"
    request_timeout_ms: int = 30_000
    reconnect_backoff_max_ms: int = 1_000
    # Security (client.security, docs/security.md): kafka-python's names.
    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    sasl_mechanism: str = "SCRAM-SHA-512"
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bootstrap_servers", parse_bootstrap(self.bootstrap_servers))
        _check_security(self)
        _check_ints(self, {"request_timeout_ms": 1, "reconnect_backoff_max_ms": 1})
        _check("client_id", isinstance(self.client_id, str), "must be a string", self.client_id)

    @classmethod
    def from_mapping(cls, settings: Mapping[str, object]) -> AdminConfig:
        """Build from names (or Kafka's dotted names) to values or text; rejects unknowns."""
        return _from_mapping(cls, settings)
