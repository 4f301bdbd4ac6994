"""The source's columns (Spark's Kafka source's) and records to Arrow.

=================  ========================================  =============================
column             Spark type                                from
=================  ========================================  =============================
``key``            binary                                    record key (null if none)
``value``          binary                                    record value (null: tombstone)
``topic``          string
``partition``      int
``offset``         long
``timestamp``      timestamp                                 record timestamp (ms, UTC);
                                                             ``correctedTimestamp`` with
                                                             ``useCorrectedTimestamp``
``timestampType``  int                                       0 CreateTime, 1 LogAppendTime
``sentTimestamp``  timestamp                                 producer clock at send (null
                                                             if unknown)
``receivedTimestamp`` timestamp                              broker clock at receipt (null
                                                             if unknown)
``correctedTimestamp`` timestamp                             record timestamp + received -
                                                             sent (the record timestamp if
                                                             either is unknown)
``headers``        array<struct<key: string, value: binary>> only with ``includeHeaders``;
                                                             null when a record has none
=================  ========================================  =============================

The three times (``DESIGN.md``, "Three timestamps per record") come per batch: the
correction is one number for every record of a batch.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
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

from tidelog.client.columns import ColumnBuffers
from tidelog.client.types import ConsumerRecord

__all__ = ["arrow_schema", "columns_to_arrow", "records_to_arrow", "source_schema"]

_HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
_TIMESTAMP = pa.timestamp("us", tz="UTC")


# Scalars made from buffers, never from Python values: ``pyarrow.scalar`` (and ``pa.array``
# of a list, and a Python number passed to a compute function) imports pandas when it is
# installed, which costs a fresh Spark Python worker a second or more of its first task.
def _int_scalar(arrow_type: pa.DataType, code: str, value: int) -> pa.Scalar:
    return pa.Array.from_buffers(arrow_type, 1, [None, pa.py_buffer(array(code, [value]))])[0]


def _string_scalar(text: str) -> pa.Scalar:
    data = text.encode()
    offsets = pa.py_buffer(array("i", [0, len(data)]))
    return pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(data)])[0]


_THOUSAND = _int_scalar(pa.int64(), "q", 1000)


def _micros(values: Sequence[int | None]) -> pa.Array:
    return pa.array([None if v is None else v * 1000 for v in values], _TIMESTAMP)


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
        StructField("sentTimestamp", TimestampType()),
        StructField("receivedTimestamp", TimestampType()),
        StructField("correctedTimestamp", TimestampType()),
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
        pa.field("sentTimestamp", _TIMESTAMP),
        pa.field("receivedTimestamp", _TIMESTAMP),
        pa.field("correctedTimestamp", _TIMESTAMP),
    ]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(_HEADER_TYPE)))
    return pa.schema(fields)


def records_to_arrow(
    records: Sequence[ConsumerRecord],
    timestamp_type: int,
    include_headers: bool,
    use_corrected: bool = False,
) -> pa.RecordBatch:
    """One Arrow batch of ``records``, column by column. ``use_corrected``: the
    ``timestamp`` column holds the corrected timestamps."""
    count = len(records)
    corrected = _micros([r.corrected_timestamp_ms for r in records])
    topic = records[0].topic if records else ""
    partition = records[0].partition if records else 0
    columns: list[pa.Array] = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([topic] * count, pa.string()),
        pa.array([partition] * count, pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        corrected if use_corrected else _micros([r.timestamp_ms for r in records]),
        pa.array([timestamp_type] * count, pa.int32()),
        _micros([r.sent_timestamp_ms for r in records]),
        _micros([r.received_timestamp_ms for r in records]),
        corrected,
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
    batch_times: Sequence[tuple[int, int | None, int | None]] = (),
    use_corrected: bool = False,
) -> pa.RecordBatch:
    """The Arrow batch of decoded columns (``Consumer.poll_columns``), as
    ``records_to_arrow`` builds it from records: the same schema, the same values.

    ``batch_times``: ``(rows, sent_ms, received_ms)`` per batch of the rows, in order, as
    ``Consumer.poll_columns`` reports them (rows not covered have unknown times); the
    three-timestamps columns are built from them with one vectorised add per column.

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
    sent, received, corrected = _time_columns(
        pa.Array.from_buffers(pa.int64(), count, [None, buffer(columns.timestamps)]),
        batch_times,
    )
    arrays: list[pa.Array] = [
        binary(columns.key_validity, columns.key_offsets, columns.key_data, count),
        binary(columns.value_validity, columns.value_offsets, columns.value_data, count),
        pa.repeat(_string_scalar(topic), count),
        pa.repeat(_int_scalar(pa.int32(), "i", partition), count),
        pa.Array.from_buffers(pa.int64(), count, [None, buffer(columns.offsets)]),
        corrected if use_corrected else timestamps_ms.cast(_TIMESTAMP),
        pa.repeat(_int_scalar(pa.int32(), "i", timestamp_type), count),
        sent,
        received,
        corrected,
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


def _time_columns(
    timestamps_ms: pa.Array, batch_times: Sequence[tuple[int, int | None, int | None]]
) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Sent, received and corrected timestamp columns (Spark's microseconds) for rows whose
    record timestamps are ``timestamps_ms`` (int64), from per-batch ``batch_times``.

    The per-batch values become run-end encoded arrays (one run a batch), decoded by
    Arrow: no Python object per row, and no ``pyarrow.array`` of a Python list, which
    imports pandas when it is installed (about a second in a fresh Spark Python worker).
    """
    count = len(timestamps_ms)
    run_ends = array("i")
    sent = array("q")
    received = array("q")
    shifts = array("q")
    sent_valid = array("b")
    received_valid = array("b")
    covered = 0
    for rows, sent_ms, received_ms in batch_times:
        rows = min(rows, count - covered)
        if rows <= 0:
            continue
        covered += rows
        run_ends.append(covered)
        sent.append(sent_ms or 0)
        received.append(received_ms or 0)
        sent_valid.append(sent_ms is not None)
        received_valid.append(received_ms is not None)
        shifts.append(0 if sent_ms is None or received_ms is None else received_ms - sent_ms)
    if covered < count:  # rows the caller gave no times for
        run_ends.append(count)
        sent.append(0)
        received.append(0)
        sent_valid.append(False)
        received_valid.append(False)
        shifts.append(0)
    runs = len(run_ends)
    ends = pa.Array.from_buffers(pa.int32(), runs, [None, pa.py_buffer(run_ends)])
    run_type = pa.run_end_encoded(pa.int32(), pa.int64())

    def spread(values: array[int], valid: array[int] | None = None) -> pa.Array:
        bitmap = None
        if valid is not None and not all(valid):  # int8 flags to Arrow's validity bitmap
            flags = pa.Array.from_buffers(pa.int8(), runs, [None, pa.py_buffer(valid)])
            bitmap = flags.cast(pa.bool_()).buffers()[1]
        per_run = pa.Array.from_buffers(pa.int64(), runs, [bitmap, pa.py_buffer(values)])
        encoded = pa.Array.from_buffers(run_type, count, [None], children=[ends, per_run])
        return pc.run_end_decode(encoded)

    corrected = pc.add_checked(timestamps_ms, spread(shifts))
    return (
        pc.multiply_checked(spread(sent, sent_valid), _THOUSAND).cast(_TIMESTAMP),
        pc.multiply_checked(spread(received, received_valid), _THOUSAND).cast(_TIMESTAMP),
        pc.multiply_checked(corrected, _THOUSAND).cast(_TIMESTAMP),
    )
