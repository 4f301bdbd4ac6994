"""Records into Arrow-layout column buffers: the Spark source's path, no object per record.

``decode_batch_into`` decodes a batch straight into a column builder: the C extension's
``storage._native.ColumnBuilder`` when it is built, else ``PyColumnBuilder``, its
pure-Python twin (the reference; the differential tests hold both to the same bytes).
``finish_columns`` hands the columns out as ``ColumnBuffers``, bytes laid out as Arrow's
columnar format wants them (little-endian), so ``pyarrow.Array.from_buffers`` wraps them
without a copy (``spark_sink.arrow``); nothing here imports pyarrow::

    offsets            int64 per row
    timestamps         int64 per row, milliseconds
    key, value         validity bitmap (bit i of byte i // 8, least significant first;
                       set = not null), int32 offsets (rows + 1), data
    headers            only with ``include_headers``: list<struct<key: string, value:
                       binary>>, null for a record without headers (as Spark's Kafka
                       source): list validity, int32 list offsets (rows + 1) into the
                       header entries; entry keys: int32 offsets + UTF-8 data (never
                       null); entry values: validity, int32 offsets, data

Arrow's binary offsets are int32, so a builder refuses (``OverflowError``) a batch that
would take a column past 2 GiB; callers finish well before (the Spark reader does at
``_FLUSH_BYTES``). Builders are not thread-safe: one owner.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tidelog.storage.native import NATIVE, native
from tidelog.storage.records import (
    _LOG_APPEND_TIME_FLAG,
    BatchHeader,
    Record,
    _Buffer,
    _decode_records,
    read_header,
    records_data,
    validate_batch,
)

__all__ = [
    "ColumnBuffers",
    "ColumnBuilder",
    "PyColumnBuilder",
    "decode_batch_into",
    "finish_columns",
    "new_column_builder",
]

_INT32_MAX = (1 << 31) - 1


class ColumnBuilder(Protocol):
    """What ``decode_batch_into`` fills: ``PyColumnBuilder`` or the C extension's."""

    @property
    def rows(self) -> int: ...
    @property
    def data_bytes(self) -> int: ...
    @property
    def last_offset(self) -> int | None: ...
    @property
    def include_headers(self) -> bool: ...
    def append_records(
        self,
        buf: _Buffer,
        start: int,
        end: int,
        count: int,
        base_offset: int,
        base_timestamp: int,
        append_time: int | None,
        last_offset_delta: int,
        batch_position: int,
        min_offset: int,
        /,
    ) -> int: ...
    def finish(self) -> tuple[Any, ...]: ...


_Bytes = bytes | bytearray


@dataclass(frozen=True, slots=True)
class ColumnBuffers:
    """The columns of ``rows`` records, as laid out in the module docstring.

    The C builder hands over its own bytearrays (no copy), the pure one bytes; either
    way they are the caller's now, and nothing else writes to them.
    """

    rows: int
    offsets: _Bytes
    timestamps: _Bytes
    key_validity: _Bytes
    key_offsets: _Bytes
    key_data: _Bytes
    value_validity: _Bytes
    value_offsets: _Bytes
    value_data: _Bytes
    header_entries: int = 0
    header_list_validity: _Bytes | None = None
    header_list_offsets: _Bytes | None = None
    header_key_offsets: _Bytes | None = None
    header_key_data: _Bytes | None = None
    header_value_validity: _Bytes | None = None
    header_value_offsets: _Bytes | None = None
    header_value_data: _Bytes | None = None


def new_column_builder(include_headers: bool, *, pure: bool = False) -> ColumnBuilder:
    """An empty builder: the C one when it is built (and ``pure`` is false)."""
    if NATIVE and not pure:
        return native.ColumnBuilder(include_headers)
    return PyColumnBuilder(include_headers)


def finish_columns(builder: ColumnBuilder) -> ColumnBuffers:
    """The builder's columns; the builder is left empty, ready for more."""
    return ColumnBuffers(*builder.finish())


def decode_batch_into(
    builder: ColumnBuilder,
    buf: _Buffer,
    position: int = 0,
    *,
    validate: bool = True,
    min_offset: int = -1,
) -> tuple[BatchHeader, int]:
    """Decode the batch at ``position`` into ``builder``; return its header and rows added.

    Records below ``min_offset`` are decoded (and checked) but not added. All or nothing:
    a batch that does not decode raises ``CorruptRecordError``, as
    ``storage.records.decode_batch`` does for the same bytes, and adds no row.
    """
    header = validate_batch(buf, position) if validate else read_header(buf, position)
    data, start, end = records_data(buf, position, header)
    append_time = header.max_timestamp if header.attributes & _LOG_APPEND_TIME_FLAG else None
    added = builder.append_records(
        data,
        start,
        end,
        header.records_count,
        header.base_offset,
        header.base_timestamp,
        append_time,
        header.last_offset_delta,
        position,
        min_offset,
    )
    return header, added


class _Binary:
    """One nullable binary column being built (pure twin of the C ``BinaryColumn``)."""

    __slots__ = ("count", "data", "offsets", "validity")

    def __init__(self) -> None:
        self.validity = bytearray()
        self.offsets = array("i", [0])
        self.data = bytearray()
        self.count = 0

    def append(self, value: bytes | None) -> None:
        if value is not None and len(self.data) + len(value) > _INT32_MAX:
            raise OverflowError(
                "an Arrow binary column would pass 2 GiB: finish() the builder first"
            )
        if self.count & 7 == 0:
            self.validity.append(0)
        if value is not None:
            self.validity[self.count >> 3] |= 1 << (self.count & 7)
            self.data += value
        self.offsets.append(len(self.data))
        self.count += 1


class PyColumnBuilder:
    """The pure-Python column builder: decodes with ``storage.records``. Not thread-safe."""

    def __init__(self, include_headers: bool = False) -> None:
        self._include_headers = include_headers
        self._reset()

    def _reset(self) -> None:
        self._offsets = array("q")
        self._timestamps = array("q")
        self._keys = _Binary()
        self._values = _Binary()
        self._list_validity = bytearray()
        self._list_offsets = array("i", [0])
        self._header_keys = _Binary()
        self._header_values = _Binary()

    @property
    def rows(self) -> int:
        return len(self._offsets)

    @property
    def data_bytes(self) -> int:
        return (
            len(self._keys.data)
            + len(self._values.data)
            + len(self._header_keys.data)
            + len(self._header_values.data)
        )

    @property
    def last_offset(self) -> int | None:
        return self._offsets[-1] if self._offsets else None

    @property
    def include_headers(self) -> bool:
        return self._include_headers

    def append_records(
        self,
        buf: _Buffer,
        start: int,
        end: int,
        count: int,
        base_offset: int,
        base_timestamp: int,
        append_time: int | None,
        last_offset_delta: int,
        batch_position: int,
        min_offset: int,
        /,
    ) -> int:
        """Decode ``buf[start:end]`` and append the records at or after ``min_offset``."""
        records = _decode_records(
            bytes(memoryview(buf)[start:end]),
            count,
            base_offset,
            base_timestamp,
            append_time,
            last_offset_delta,
            batch_position,
            Record,
            None,
        )
        kept = [r for r in records if r.offset >= min_offset]
        self._append(kept)
        return len(kept)

    def _append(self, records: Sequence[Record]) -> None:
        # Checked before anything is appended: all or nothing, as the C builder.
        if (
            len(self._keys.data) + sum(len(r.key or b"") for r in records) > _INT32_MAX
            or len(self._values.data) + sum(len(r.value or b"") for r in records) > _INT32_MAX
        ):
            raise OverflowError(
                "an Arrow binary column would pass 2 GiB: finish() the builder first"
            )
        for record in records:
            row = len(self._offsets)
            self._offsets.append(record.offset)
            self._timestamps.append(record.timestamp_ms)
            self._keys.append(record.key)
            self._values.append(record.value)
            if self._include_headers:
                if row & 7 == 0:
                    self._list_validity.append(0)
                if record.headers:
                    self._list_validity[row >> 3] |= 1 << (row & 7)
                for key, value in record.headers:
                    self._header_keys.append(key.encode("utf-8"))
                    self._header_values.append(value)
                self._list_offsets.append(self._header_keys.count)

    def finish(self) -> tuple[Any, ...]:
        """The columns as the C builder's ``finish`` returns them; the builder empties."""
        columns: tuple[Any, ...] = (
            self.rows,
            self._offsets.tobytes(),
            self._timestamps.tobytes(),
            bytes(self._keys.validity),
            self._keys.offsets.tobytes(),
            bytes(self._keys.data),
            bytes(self._values.validity),
            self._values.offsets.tobytes(),
            bytes(self._values.data),
        )
        if self._include_headers:
            columns += (
                self._header_keys.count,
                bytes(self._list_validity),
                self._list_offsets.tobytes(),
                self._header_keys.offsets.tobytes(),
                bytes(self._header_keys.data),
                bytes(self._header_values.validity),
                self._header_values.offsets.tobytes(),
                bytes(self._header_values.data),
            )
        self._reset()
        return columns
