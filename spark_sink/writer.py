"""The sink: Spark rows to records, written effectively once.

Columns (Spark's Kafka sink's): ``value`` (string or binary, required; null writes a
tombstone), ``key`` (string or binary, optional), ``topic`` (string; the ``topic`` option
overrides it), ``partition`` (int, optional), ``headers``
(array<struct<key: string, value: binary>>, optional). Other columns are refused, as a
typo in a column name would otherwise drop data silently.

Effectively once (``docs/spark.md`` has the reasoning): every Spark task writes under a
producer key derived from what Spark keeps fixed when it re-runs the task:

- streaming: ``<prefix>:<query id>:<generation>:<task partition>``, with epoch
  ``batch id % 32767`` (generation ``batch id // 32767``); Spark re-runs a failed
  micro-batch with the same batch id and the same input, and gives each task the same
  partition id, after a retry or a query restart alike;
- batch ``df.write``: ``<prefix>:write:<uuid made once on the driver>:<task partition>``,
  epoch 0, which covers task retries within the job.

The task puts its rows in one deterministic order per target partition (``writeOrder``
``sorted``: canonical, independent of the order a shuffle delivers them), then hands them
to ``client.keyed_producer.KeyedProducer.write_once``, which skips what the partition
already stored under that identity and epoch and writes the rest. Rows with neither key
nor partition go to ``murmur2(value) % partitions``: deterministic, unlike a sticky
partitioner, so a re-run puts every row where the first attempt did.

The query id and batch id come from the task's local properties (set by Spark's
micro-batch engine); the connection opens inside ``write`` on the executor.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructType,
)

from tidelog.client.admin import AdminClient
from tidelog.client.keyed_producer import KeyedProducer, ProducerRecord
from tidelog.client.partitioner import partition_for_key
from tidelog.client.security import ClientSecurity
from tidelog.client.types import Header, TopicPartition
from tidelog.spark_sink.options import WriteOptions, epoch_of_batch

__all__ = [
    "TidelogBatchWriter",
    "TidelogCommitMessage",
    "TidelogStreamWriter",
    "canonical_order",
    "check_sink_schema",
    "stream_identity",
]

log = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True)
class TidelogCommitMessage(WriterCommitMessage):
    """What one task did: records stored now, and records a previous attempt stored."""

    partition_id: int
    written: int
    skipped: int


def check_sink_schema(schema: StructType, options: WriteOptions) -> None:
    """``ValueError`` unless the columns are ones the sink knows, with usable types."""
    text_or_binary = (StringType, BinaryType)
    names = {f.name: f.dataType for f in schema.fields}
    if "value" not in names:
        raise ValueError("the tidelog sink needs a value column (string or binary)")
    unknown = sorted(set(names) - {"key", "value", "topic", "partition", "headers"})
    if unknown:
        raise ValueError(
            f"the tidelog sink does not know the column(s) {unknown}; "
            "it writes key, value, topic, partition, headers"
        )
    for name in ("key", "value"):
        if name in names and not isinstance(names[name], text_or_binary):
            raise ValueError(f"column {name} must be string or binary, not {names[name]}")
    if "topic" in names and not isinstance(names["topic"], StringType):
        raise ValueError("column topic must be a string")
    if "partition" in names and not isinstance(names["partition"], IntegerType):
        raise ValueError("column partition must be an int")
    if "headers" in names:
        headers = names["headers"]
        element = headers.elementType if isinstance(headers, ArrayType) else None
        if not isinstance(element, StructType) or [f.name for f in element.fields] != [
            "key",
            "value",
        ]:
            raise ValueError("column headers must be array<struct<key: string, value: binary>>")
    if options.topic is None and "topic" not in names:
        raise ValueError("set the topic option or give the DataFrame a topic column")


def _bytes(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"expected string or binary, got {type(value).__name__}")


def _headers(value: object) -> tuple[Header, ...]:
    if not value:
        return ()
    out = []
    for item in value:  # type: ignore[attr-defined]
        key, header_value = item[0], item[1]
        if key is None:
            # str(None) would write a header named "None"; Kafka's header keys are not null.
            raise ValueError("a row has a header with a null key; header keys must be strings")
        out.append((str(key), _bytes(header_value)))
    return tuple(out)


def _order_key(record: ProducerRecord) -> tuple[object, ...]:
    return (
        record.key is not None,
        record.key or b"",
        record.value is not None,
        record.value or b"",
        tuple((k, v is not None, v or b"") for k, v in record.headers),
    )


def canonical_order(records: Sequence[ProducerRecord]) -> list[ProducerRecord]:
    """``records`` sorted by content: any arrival order of one multiset gives one list."""
    return sorted(records, key=_order_key)


class _PartitionCounts:
    """Partition counts of the topics a task writes, asked once per topic. One task only."""

    def __init__(self, options: WriteOptions) -> None:
        self._options = options
        self._admin: AdminClient | None = None
        self._counts: dict[str, int] = {}

    def count(self, topic: str) -> int:
        found = self._counts.get(topic)
        if found is None:
            if self._admin is None:
                self._admin = AdminClient(
                    self._options.bootstrap_servers,
                    request_timeout_ms=self._options.request_timeout_ms,
                    **self._options.security_settings,
                )
            found = len(self._admin.describe_topic(topic).partitions)
            self._counts[topic] = found
        return found

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()


def write_rows(
    options: WriteOptions, rows: Iterator[Row], producer_key: str, epoch: int, partition_id: int
) -> TidelogCommitMessage:
    """Write one task's rows under ``producer_key``/``epoch``; see the module doc."""
    counts = _PartitionCounts(options)
    by_tp: dict[TopicPartition, list[ProducerRecord]] = {}
    try:
        for row in rows:
            fields = row.asDict(recursive=False)
            topic = options.topic or fields.get("topic")
            if not topic:
                raise ValueError("a row has no topic (null topic column and no topic option)")
            key = _bytes(fields.get("key"))
            value = _bytes(fields.get("value"))
            record = ProducerRecord(key, value, _headers(fields.get("headers")))
            partition = fields.get("partition")
            if partition is None:
                partition = partition_for_key(
                    key if key is not None else value or b"", counts.count(topic)
                )
            by_tp.setdefault(TopicPartition(topic, int(partition)), []).append(record)
    finally:
        counts.close()
    if options.write_order == "sorted":
        by_tp = {tp: canonical_order(rs) for tp, rs in by_tp.items()}
    with KeyedProducer(
        options.bootstrap_servers,
        producer_key,
        acks=options.acks,
        compression=options.compression,
        request_timeout_ms=options.request_timeout_ms,
        max_batch_records=options.max_batch_records,
        max_batch_bytes=options.max_batch_bytes,
        client_id="tidelog-spark-writer",
        security=ClientSecurity(**options.security_settings),
    ) as producer:
        summary = producer.write_once(by_tp, epoch)
    if summary.skipped:
        log.info(
            "%s epoch %d: %d records were already stored by an earlier attempt, %d written",
            producer_key,
            epoch,
            summary.skipped,
            summary.written,
        )
    return TidelogCommitMessage(partition_id, summary.written, summary.skipped)


def stream_identity(
    prefix: str, query_id: str, batch_id: int, partition_id: int
) -> tuple[str, int]:
    """``(producer key, epoch)`` of a streaming task: pure, the same in every attempt.

    Epochs are int16, batch ids are not: batch ``b`` writes with epoch ``b % 32767``
    under the key of generation ``b // 32767`` (``options.epoch_of_batch``).
    """
    generation, epoch = epoch_of_batch(batch_id)
    return f"{prefix}:{query_id}:{generation}:{partition_id}", epoch


def _task() -> TaskContext:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the tidelog sink's write runs inside a Spark task only")
    return context


class TidelogBatchWriter(DataSourceWriter):
    """``df.write.format("tidelog")``: task retries within the job write nothing twice.

    Picklable (options and a write id); ``write`` runs in each task, on its own copy.
    """

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_sink_schema(schema, options)
        self._options = options
        # Made once on the driver and pickled to every task of this write job.
        self._write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Row]) -> TidelogCommitMessage:
        partition_id = _task().partitionId()
        key = f"{self._options.producer_key_prefix}:write:{self._write_id}:{partition_id}"
        return write_rows(self._options, iterator, key, 0, partition_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("tidelog write %s committed: %s", self._write_id, _totals(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("tidelog write %s aborted: %s", self._write_id, _totals(messages))


class TidelogStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("tidelog")``: a re-run micro-batch adds no duplicates.

    Picklable (options only); ``write`` runs in each task, on its own copy.
    """

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_sink_schema(schema, options)
        self._options = options

    def write(self, iterator: Iterator[Row]) -> TidelogCommitMessage:
        task = _task()
        query_id = task.getLocalProperty(QUERY_ID_PROPERTY)
        batch_id = task.getLocalProperty(BATCH_ID_PROPERTY)
        if not query_id or batch_id is None:
            raise RuntimeError(
                "the tidelog stream writer found no query id or batch id in the task's "
                f"local properties ({QUERY_ID_PROPERTY}, {BATCH_ID_PROPERTY})"
            )
        partition_id = task.partitionId()
        key, epoch = stream_identity(
            self._options.producer_key_prefix, query_id, int(batch_id), partition_id
        )
        return write_rows(self._options, iterator, key, epoch, partition_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.info("tidelog micro-batch %d committed: %s", batchId, _totals(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning("tidelog micro-batch %d aborted: %s", batchId, _totals(messages))


def _totals(messages: Sequence[WriterCommitMessage | None]) -> str:
    done = [m for m in messages if isinstance(m, TidelogCommitMessage)]
    written = sum(m.written for m in done)
    skipped = sum(m.skipped for m in done)
    return f"{len(done)} tasks, {written} records written, {skipped} found already stored"
