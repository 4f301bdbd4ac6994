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

from client.types import ConsumerRecord

__all__ = ["arrow_schema", "records_to_arrow", "source_schema"]

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
