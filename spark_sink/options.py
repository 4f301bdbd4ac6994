"""Options of the ``tidelog`` source and sink: frozen, picklable, validated when built.

``ReadOptions.from_mapping`` and ``WriteOptions.from_mapping`` take the options Spark
hands the data source (names as Spark's Kafka source where one exists, matched without
regard to case, as Spark does) and reject unknown names and bad values with a
``ValueError`` that names the option. ``docs/spark.md`` has the table.

Both classes are plain values: they travel to executors inside the pickled reader or
writer, and nothing in them opens a connection.

Security (``docs/security.md``): both take Kafka's client property names, with Spark's
``kafka.`` prefix or without (``kafka.security.protocol``, ``kafka.sasl.mechanism``,
``kafka.sasl.jaas.config`` or ``kafka.sasl.username``/``kafka.sasl.password``,
``kafka.ssl.cafile``/``kafka.ssl.certfile``/``kafka.ssl.keyfile``, or librdkafka's
``ssl.ca.location``...: ``client.security.SECURITY_PROPERTY_NAMES``). They become the
client's kafka-python settings (``security_settings``), validated when the options are
built; the password is kept out of ``repr``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.client.cluster import parse_bootstrap_list
from tidelog.client.security import SECURITY_PROPERTY_NAMES, ClientSecurity, settings_from_mapping
from tidelog.client.types import TopicPartition
from tidelog.spark_sink.offsets import OffsetSpec, parse_assign, parse_offset_spec

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "ReadOptions",
    "WriteOptions",
    "epoch_of_batch",
    "include_headers",
]

DEFAULT_BOOTSTRAP = "127.0.0.1:7410"

# Keys Spark itself may put into a data source's options; accepted and ignored.
_SPARK_KEYS = frozenset({"path", "checkpointlocation"})
_BOOTSTRAP_KEYS = ("bootstrap.servers", "kafka.bootstrap.servers")
_ISOLATION_KEYS = ("isolation.level", "kafka.isolation.level")
_ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
_MAX_EPOCH_SPAN = 32767
_LATEST = OffsetSpec("latest")


def _bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name} must be true or false, got {value!r}")


def include_headers(options: Mapping[str, str]) -> bool:
    """The ``includeHeaders`` option (any case), parsed as ``ReadOptions`` parses it.

    ``TidelogDataSource.schema`` needs it before the options are validated; parsing it
    any other way would give Spark a schema without ``headers`` for ``yes`` or ``1``
    while the reader sends the column.
    """
    for key, value in options.items():
        if key.lower() == "includeheaders":
            return _bool("includeHeaders", str(value))
    return False


def _int(name: str, value: str, minimum: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError(f"option {name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"option {name} must be >= {minimum}, got {number}")
    return number


def _normalise(options: Mapping[str, str], known: frozenset[str], what: str) -> dict[str, str]:
    """Lower-cased keys; ``ValueError`` naming every unknown one."""
    out: dict[str, str] = {}
    unknown = []
    for key, value in options.items():
        lowered = key.lower()
        if lowered in _SPARK_KEYS:
            continue
        if lowered not in known:
            unknown.append(key)
            continue
        out[lowered] = str(value)
    if unknown:
        raise ValueError(
            f"unknown tidelog {what} option(s): {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )
    return out


_SECURITY_KEYS = frozenset(
    {*SECURITY_PROPERTY_NAMES, *(f"kafka.{name}" for name in SECURITY_PROPERTY_NAMES)}
)


def _security(options: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The client security settings among ``options`` (sorted pairs: hashable, picklable)."""
    given: dict[str, str] = {}
    for key in sorted(options):
        if key in _SECURITY_KEYS:
            name = key.removeprefix("kafka.")
            if name in given and given[name] != options[key]:
                raise ValueError(f"options {name} and kafka.{name} disagree")
            given[name] = options[key]
    settings = settings_from_mapping(given)
    ClientSecurity(**settings)  # ValueError naming the setting if they do not fit
    return tuple(sorted(settings.items()))


def _bootstrap(options: Mapping[str, str]) -> str:
    given = [options[k] for k in _BOOTSTRAP_KEYS if k in options]
    if len(set(given)) > 1:
        raise ValueError("bootstrap.servers and kafka.bootstrap.servers disagree")
    value = given[0] if given else DEFAULT_BOOTSTRAP
    try:
        return ",".join(parse_bootstrap_list(value))
    except ValueError:
        raise ValueError(
            f"option bootstrap.servers must be HOST:PORT[,HOST:PORT...], got {value!r}"
        ) from None


_READ_KEYS = frozenset(
    {
        *_BOOTSTRAP_KEYS,
        "subscribe",
        "subscribepattern",
        "assign",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "maxoffsetspertrigger",
        "failondataloss",
        "includeheaders",
        "usecorrectedtimestamp",
        "minpartitions",
        "maxrecordsperpartition",
        "requesttimeoutms",
        "fetchmaxbytes",
        *_ISOLATION_KEYS,
        *_SECURITY_KEYS,
    }
)


def _isolation_level(options: Mapping[str, str]) -> str:
    """``isolation.level`` or Spark's ``kafka.isolation.level`` (they must agree)."""
    given = {options[k].strip().lower() for k in _ISOLATION_KEYS if k in options}
    if len(given) > 1:
        raise ValueError("options isolation.level and kafka.isolation.level disagree")
    level = given.pop() if given else "read_uncommitted"
    if level not in _ISOLATION_LEVELS:
        raise ValueError(
            f"option isolation.level must be read_uncommitted or read_committed, got {level!r}"
        )
    return level


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOptions:
    """Everything the reader obeys. Build with ``from_mapping``.

    - exactly one of ``subscribe`` (topics), ``subscribe_pattern`` (a Python regex that
      must match a whole topic name) or ``assign`` (fixed partitions);
    - ``starting``: where a fresh query (or a batch read) begins; ``starting_timestamp_ms``
      overrides it: the first offset with a timestamp at or after it, per partition;
    - ``ending``: batch reads only, where they stop (``latest`` by default);
    - ``max_offsets_per_trigger``: admission control, None for no cap;
    - ``fail_on_data_loss``: raise when retention deleted offsets a batch needs, or else
      skip to the log start and log a warning;
    - ``min_partitions`` / ``max_records_per_partition``: how offset ranges are cut into
      Spark input partitions;
    - ``isolation_level`` (``isolation.level`` or ``kafka.isolation.level``):
      ``read_uncommitted`` (default, as Spark's Kafka source) reads up to the high
      watermark; ``read_committed`` ends every batch at the last stable offset and skips
      the records of aborted transactions (issue #28).
    """

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: tuple[TopicPartition, ...] = ()
    starting: OffsetSpec = _LATEST
    ending: OffsetSpec = _LATEST
    starting_timestamp_ms: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    # The timestamp column holds correctedTimestamp (record time on the broker's clock),
    # so watermarks and windows use it; startingTimestamp still means the record time.
    use_corrected_timestamp: bool = False
    min_partitions: int = 0
    max_records_per_partition: int = 1_000_000
    request_timeout_ms: int = 30_000
    fetch_max_bytes: int = 4 * 1024 * 1024
    isolation_level: str = "read_uncommitted"
    security: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def security_settings(self) -> dict[str, Any]:
        """The client security settings (kafka-python names) for ``Consumer`` & co."""
        return dict(self.security)

    def __post_init__(self) -> None:
        chosen = sum([bool(self.subscribe), self.subscribe_pattern is not None, bool(self.assign)])
        if chosen != 1:
            raise ValueError("set exactly one of the options subscribe, subscribePattern, assign")
        if self.subscribe_pattern is not None:
            try:
                re.compile(self.subscribe_pattern)
            except re.error as exc:
                raise ValueError(f"option subscribePattern is not a regex: {exc}") from None
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger < 1:
            raise ValueError("option maxOffsetsPerTrigger must be >= 1")
        if self.max_records_per_partition < 1:
            raise ValueError("option maxRecordsPerPartition must be >= 1")
        if self.ending.kind == "earliest":
            raise ValueError("option endingOffsets cannot be earliest")
        if self.isolation_level not in _ISOLATION_LEVELS:
            raise ValueError(f"option isolation.level cannot be {self.isolation_level!r}")

    @classmethod
    def from_mapping(cls, options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
        """Parse Spark's options; ``ValueError`` for unknown names and bad values.

        ``startingOffsets`` defaults to ``latest`` for a stream and ``earliest`` for a
        batch read, as Spark's Kafka source; ``endingOffsets`` is refused on a stream.
        """
        o = _normalise(options, _READ_KEYS, "read")
        if streaming and "endingoffsets" in o:
            raise ValueError("option endingOffsets applies to batch reads only")
        default_start = "latest" if streaming else "earliest"
        starting = parse_offset_spec(
            o.get("startingoffsets", default_start), name="startingOffsets"
        )
        if not streaming and starting.kind == "latest":
            raise ValueError("option startingOffsets cannot be latest for a batch read")
        topics = tuple(t.strip() for t in o.get("subscribe", "").split(",") if t.strip())
        return cls(
            bootstrap_servers=_bootstrap(o),
            subscribe=topics,
            subscribe_pattern=o.get("subscribepattern"),
            assign=parse_assign(o["assign"]) if "assign" in o else (),
            starting=starting,
            ending=parse_offset_spec(
                o.get("endingoffsets", "latest"), name="endingOffsets", allow_earliest_offset=False
            ),
            starting_timestamp_ms=(
                _int("startingTimestamp", o["startingtimestamp"], 0)
                if "startingtimestamp" in o
                else None
            ),
            max_offsets_per_trigger=(
                _int("maxOffsetsPerTrigger", o["maxoffsetspertrigger"], 1)
                if "maxoffsetspertrigger" in o
                else None
            ),
            fail_on_data_loss=_bool("failOnDataLoss", o.get("failondataloss", "true")),
            include_headers=_bool("includeHeaders", o.get("includeheaders", "false")),
            use_corrected_timestamp=_bool(
                "useCorrectedTimestamp", o.get("usecorrectedtimestamp", "false")
            ),
            min_partitions=_int("minPartitions", o.get("minpartitions", "0"), 0),
            max_records_per_partition=_int(
                "maxRecordsPerPartition", o.get("maxrecordsperpartition", "1000000"), 1
            ),
            request_timeout_ms=_int("requestTimeoutMs", o.get("requesttimeoutms", "30000"), 1),
            fetch_max_bytes=_int("fetchMaxBytes", o.get("fetchmaxbytes", str(4 << 20)), 1024),
            isolation_level=_isolation_level(o),
            security=_security(o),
        )


_WRITE_KEYS = frozenset(
    {
        *_BOOTSTRAP_KEYS,
        "topic",
        "acks",
        "compression",
        "writeorder",
        "maxbatchrecords",
        "maxbatchbytes",
        "requesttimeoutms",
        "producerkeyprefix",
        *_SECURITY_KEYS,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteOptions:
    """Everything the writer obeys. Build with ``from_mapping``.

    - ``topic``: overrides the ``topic`` column (needed when there is none);
    - ``acks``: ``all`` (default) or ``1``; ``compression``: ``none`` or ``lz4``;
    - ``write_order``: ``sorted`` (default) writes each task's rows in a canonical order
      so that a re-run of the task (whose rows may arrive in another order after a
      shuffle) assigns every row the same sequence number; ``input`` keeps the order the
      rows arrive in, for inputs whose order is deterministic (no shuffle);
    - ``max_batch_records`` / ``max_batch_bytes``: where batches are cut;
    - ``producer_key_prefix``: prefix of the producer keys (default ``spark``).
    """

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    topic: str | None = None
    acks: str = "all"
    compression: str = "none"
    write_order: str = "sorted"
    max_batch_records: int = 10_000
    max_batch_bytes: int = 512 * 1024
    request_timeout_ms: int = 30_000
    producer_key_prefix: str = "spark"
    security: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def security_settings(self) -> dict[str, Any]:
        """The client security settings (kafka-python names) for the producer & co."""
        return dict(self.security)

    def __post_init__(self) -> None:
        if self.acks not in ("all", "1"):
            raise ValueError(f"option acks must be all or 1, got {self.acks!r}")
        if self.compression not in ("none", "lz4"):
            raise ValueError(f"option compression must be none or lz4, got {self.compression!r}")
        if self.write_order not in ("sorted", "input"):
            raise ValueError(f"option writeOrder must be sorted or input: {self.write_order!r}")
        if not self.producer_key_prefix:
            raise ValueError("option producerKeyPrefix must not be empty")

    @classmethod
    def from_mapping(cls, options: Mapping[str, str]) -> WriteOptions:
        """Parse Spark's options; ``ValueError`` for unknown names and bad values."""
        o = _normalise(options, _WRITE_KEYS, "write")
        acks = o.get("acks", "all").strip().lower()
        return cls(
            bootstrap_servers=_bootstrap(o),
            topic=o.get("topic"),
            acks="all" if acks == "-1" else acks,
            compression=o.get("compression", "none").strip().lower(),
            write_order=o.get("writeorder", "sorted").strip().lower(),
            max_batch_records=_int("maxBatchRecords", o.get("maxbatchrecords", "10000"), 1),
            max_batch_bytes=_int("maxBatchBytes", o.get("maxbatchbytes", str(512 << 10)), 1024),
            request_timeout_ms=_int("requestTimeoutMs", o.get("requesttimeoutms", "30000"), 1),
            producer_key_prefix=o.get("producerkeyprefix", "spark"),
            security=_security(o),
        )


def epoch_of_batch(batch_id: int) -> tuple[int, int]:
    """``(generation, epoch)`` of a micro-batch: producer epochs are int16, batch ids not.

    Batch ``b`` writes with epoch ``b % 32767`` under the producer key of generation
    ``b // 32767``, so consecutive batches have increasing epochs under one producer id.
    """
    if batch_id < 0:
        raise ValueError(f"batch id must be >= 0, got {batch_id}")
    return divmod(batch_id, _MAX_EPOCH_SPAN)
