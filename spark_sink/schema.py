"""The source's columns (Spark's Kafka source's) and records to Arrow.

=================  ========================================  =============================
column             Spark type                                from
=================  ========================================  =============================
``key``            binary                                    record key (null if none)
``value``          binary                                    record value (null: tombstone)
``topic``          string
``partition``      int
``offset``         long
``timestamp``      timestamp                                 record timestamp (ms, UTC)
``timestampType``  int                                       0 CreateTime, 1 LogAppendTime
``headers``        array<struct<key: string, value: binary>> only with ``includeHeaders``;
                                                             null when a record has none
=================  ========================================  =============================
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from client.columns import ColumnBuffers
from client.types import ConsumerRecord

__all__ = ["arrow_schema", "columns_to_arrow", "records_to_arrow", "source_schema"]

_HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])


def source_schema(include_headers: bool) -> StructType:
    """The Spark schema of the source."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema ``records_to_arrow`` produces (Spark's mapping of the above)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(_HEADER_TYPE)))
    return pa.schema(fields)


def records_to_arrow(
    records: Sequence[ConsumerRecord], timestamp_type: int, include_headers: bool
) -> pa.RecordBatch:
    """One Arrow batch of ``records``, column by column."""
    count = len(records)
    topic = records[0].topic if records else ""
    partition = records[0].partition if records else 0
    columns: list[pa.Array] = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([topic] * count, pa.string()),
        pa.array([partition] * count, pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp_ms * 1000 for r in records], pa.timestamp("us", tz="UTC")),
        pa.array([timestamp_type] * count, pa.int32()),
    ]
    if include_headers:
        columns.append(
            pa.array(
                [
                    [{"key": k, "value": v} for k, v in r.headers] if r.headers else None
                    for r in records
                ],
                pa.list_(_HEADER_TYPE),
            )
        )
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


def columns_to_arrow(
    columns: ColumnBuffers,
    topic: str,
    partition: int,
    timestamp_type: int,
    include_headers: bool,
) -> pa.RecordBatch:
    """The Arrow batch of decoded columns (``Consumer.poll_columns``), as
    ``records_to_arrow`` builds it from records: the same schema, the same values.

    The columns' buffers become the arrays' buffers (``pyarrow.Array.from_buffers``, no
    copy, no Python object per record); only the timestamps are converted, from
    milliseconds to Spark's microseconds, by a checked cast.
    """
    count = columns.rows
    buffer = pa.py_buffer

    def binary(
        validity: bytes | bytearray, offsets: bytes | bytearray, data: bytes | bytearray, rows: int
    ) -> pa.Array:
        return pa.Array.from_buffers(
            pa.binary(), rows, [buffer(validity), buffer(offsets), buffer(data)]
        )

    timestamps_ms = pa.Array.from_buffers(
        pa.timestamp("ms", tz="UTC"), count, [None, buffer(columns.timestamps)]
    )
    arrays: list[pa.Array] = [
        binary(columns.key_validity, columns.key_offsets, columns.key_data, count),
        binary(columns.value_validity, columns.value_offsets, columns.value_data, count),
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(partition, pa.int32()), count),
        pa.Array.from_buffers(pa.int64(), count, [None, buffer(columns.offsets)]),
        timestamps_ms.cast(pa.timestamp("us", tz="UTC")),
        pa.repeat(pa.scalar(timestamp_type, pa.int32()), count),
    ]
    if include_headers:
        entries = columns.header_entries
        assert columns.header_list_offsets is not None  # a builder made with headers
        keys = pa.Array.from_buffers(
            pa.string(),
            entries,
            [None, buffer(columns.header_key_offsets or b""), buffer(columns.header_key_data)],
        )
        values = binary(
            columns.header_value_validity or b"",
            columns.header_value_offsets or b"",
            columns.header_value_data or b"",
            entries,
        )
        headers = pa.StructArray.from_arrays([keys, values], fields=list(_HEADER_TYPE))
        arrays.append(
            pa.Array.from_buffers(
                pa.list_(_HEADER_TYPE),
                count,
                [buffer(columns.header_list_validity or b""), buffer(columns.header_list_offsets)],
                children=[headers],
            )
        )
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))
