"""Building RecordBatch v2 bytes: the producer's and the log cleaner's path.

Split from ``storage.records`` (which re-exports ``BatchBuilder`` and ``encode_batch``, so
``storage.records`` stays the one import point for the format); the byte layout is drawn
in that module's docstring. This module uses the layout's private constants from there on
purpose: they are one format, kept in two files only for size.

Each ``append`` encodes its record straight into one bytearray, using a table of
precomputed varints for small lengths and deltas: the producer's hot loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import crc32c

from tidelog.storage.compression import compress_records, max_compressed_bytes
from tidelog.storage.native import NATIVE, native
from tidelog.storage.records import (
    _CONTROL_FLAG,
    _CRC_PREFIX,
    _CRC_TAIL,
    _DELETE_HORIZON_FLAG,
    _INT16_MAX,
    _INT16_MIN,
    _MAX_BATCH_LENGTH,
    _MIN_BATCH_LENGTH,
    _TRANSACTIONAL_FLAG,
    HEADER_SIZE,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    SUPPORTED_COMPRESSION,
    BatchHeader,
    Compression,
    TimestampType,
)
from tidelog.storage.varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    NONNEGATIVE_VARINTS,
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
)

__all__ = ["BatchBuilder", "builder_like", "encode_batch"]


class BatchBuilder:
    """Accumulates records and builds one batch. Not thread-safe.

    Each ``append`` encodes its record straight into one bytearray, relative to the base
    timestamp (the first record's, unless ``base_timestamp`` is given), so ``build`` is one
    header pack, one CRC pass and, for a codec, one compression call.
    """

    __slots__ = (
        "_base_offset",
        "_base_sequence",
        "_base_timestamp",
        "_buf",
        "_compression",
        "_count",
        "_is_control",
        "_is_transactional",
        "_last_offset_delta",
        "_max_timestamp",
        "_partition_leader_epoch",
        "_producer_epoch",
        "_producer_id",
        "_timestamp_type",
    )

    def __init__(
        self,
        *,
        compression: Compression = Compression.NONE,
        timestamp_type: TimestampType = TimestampType.CREATE_TIME,
        base_offset: int = 0,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        is_transactional: bool = False,
        is_control: bool = False,
        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
        base_timestamp: int | None = None,
    ) -> None:
        """Raises ``ValueError`` for an unsupported codec or an out-of-range field."""
        compression = Compression(compression)
        if compression not in SUPPORTED_COMPRESSION:
            raise ValueError(f"unsupported compression {compression.name}")
        _check_range("base_offset", base_offset, 0, INT64_MAX)
        _check_range("producer_id", producer_id, INT64_MIN, INT64_MAX)
        _check_range("producer_epoch", producer_epoch, _INT16_MIN, _INT16_MAX)
        _check_range("base_sequence", base_sequence, INT32_MIN, INT32_MAX)
        _check_range("partition_leader_epoch", partition_leader_epoch, INT32_MIN, INT32_MAX)
        if base_timestamp is not None:
            _check_range("base_timestamp", base_timestamp, INT64_MIN, INT64_MAX)
        self._compression = compression
        self._timestamp_type = TimestampType(timestamp_type)
        self._base_offset = base_offset
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        self._is_transactional = is_transactional
        # Control batches (transaction markers, ``storage.control``) are built by the broker.
        self._is_control = is_control
        self._partition_leader_epoch = partition_leader_epoch
        self._base_timestamp = base_timestamp
        self._buf = bytearray()
        self._count = 0
        self._last_offset_delta = -1
        self._max_timestamp = INT64_MIN

    @property
    def record_count(self) -> int:
        return self._count

    def append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
        *,
        offset_delta: int | None = None,
    ) -> int:
        """Encode one record; return the offset delta it got.

        The default delta is the previous one + 1 (0 first). An explicit ``offset_delta``
        must exceed the previous one: the cleaner rebuilds batches whose surviving records
        keep their offsets. Raises ``ValueError`` for a delta that does not increase or
        exceed int32, a timestamp outside int64 or a timestamp delta outside int64.
        """
        last = self._last_offset_delta
        if offset_delta is None:
            delta = last + 1
        else:
            delta = offset_delta
            if delta <= last:
                raise ValueError(f"offset delta {delta} does not exceed the previous {last}")
        if delta > 0x7FFFFFFF:
            raise ValueError(f"offset delta {delta} exceeds int32")
        if not -0x8000000000000000 <= timestamp_ms <= 0x7FFFFFFFFFFFFFFF:
            raise ValueError(f"timestamp {timestamp_ms} is not an int64")
        base = self._base_timestamp
        if base is None:
            base = timestamp_ms
        table = NONNEGATIVE_VARINTS
        n = timestamp_ms - base
        timestamp_bytes = table[n] if 0 <= n < 8192 else encode_varlong(n)
        delta_bytes = table[delta] if delta < 8192 else encode_varint(delta)
        if key is None:
            key_bytes = b"\x01"  # varint(-1)
            key = b""
        else:
            n = len(key)
            key_bytes = table[n] if n < 8192 else encode_varint(n)
        if value is None:
            value_bytes = b"\x01"
            value = b""
        else:
            n = len(value)
            value_bytes = table[n] if n < 8192 else encode_varint(n)
        header_bytes = _encode_headers(headers) if headers else b"\x00"
        body = b"".join(
            (
                b"\x00",
                timestamp_bytes,
                delta_bytes,
                key_bytes,
                key,
                value_bytes,
                value,
                header_bytes,
            )
        )
        n = len(body)
        length_bytes = table[n] if n < 8192 else encode_varint(n)
        # Nothing above changed the builder, so a ValueError leaves it as it was.
        buf = self._buf
        buf += length_bytes
        buf += body
        self._base_timestamp = base
        if timestamp_ms > self._max_timestamp:
            self._max_timestamp = timestamp_ms
        self._count += 1
        self._last_offset_delta = delta
        return delta

    def extend(
        self,
        timestamps: Sequence[int],
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        headers: Sequence[Sequence[tuple[str, bytes | None]]],
        *,
        pure: bool = False,
    ) -> None:
        """Append records at the next offset deltas: ``append`` for each in turn, faster.

        The producer's path: the four sequences are one batch's columns (record ``i`` is
        ``timestamps[i], keys[i], values[i], headers[i]``). The same bytes as ``append``
        in a loop: the C extension's loop when it is built (``storage.native``), else
        (or with ``pure=True``) the pure-Python one, about 60% of ``append``'s time: no
        call per record, and the builder's state is updated once. Raises ``ValueError``
        as ``append`` does, or for columns of different lengths, and ``TypeError`` for a
        key, value or header of the wrong type; then nothing is appended.
        """
        count = len(timestamps)
        if not len(keys) == len(values) == len(headers) == count:
            raise ValueError("the columns must have the same length")
        if not count:
            return
        first = self._last_offset_delta + 1
        if first + count - 1 > 0x7FFFFFFF:
            raise ValueError(f"offset delta {first + count - 1} exceeds int32")
        low, high = min(timestamps), max(timestamps)
        if low < -0x8000000000000000 or high > 0x7FFFFFFFFFFFFFFF:
            raise ValueError(f"timestamp {low if low < 0 else high} is not an int64")
        base = self._base_timestamp
        if base is None:
            base = timestamps[0]
        if NATIVE and not pure:
            # Appends to the builder's own buffer, and truncates it back on an error.
            native.encode_records_into(self._buf, timestamps, keys, values, headers, base, first)
            self._base_timestamp = base
            if high > self._max_timestamp:
                self._max_timestamp = high
            self._count += count
            self._last_offset_delta = first + count - 1
            return
        table = NONNEGATIVE_VARINTS
        out = bytearray()
        delta = first
        # The body repeats append's encoding inline on purpose: a call per record is what
        # this method saves. test_extend_builds_the_bytes_of_append_in_a_loop keeps the
        # two byte for byte equal.
        for timestamp_ms, key, value, record_headers in zip(
            timestamps, keys, values, headers, strict=True
        ):
            n = timestamp_ms - base
            timestamp_bytes = table[n] if 0 <= n < 8192 else encode_varlong(n)
            delta_bytes = table[delta] if delta < 8192 else encode_varint(delta)
            if key is None:
                key_bytes = b"\x01"  # varint(-1)
                key = b""
            else:
                n = len(key)
                key_bytes = table[n] if n < 8192 else encode_varint(n)
            if value is None:
                value_bytes = b"\x01"
                value = b""
            else:
                n = len(value)
                value_bytes = table[n] if n < 8192 else encode_varint(n)
            record = b"".join(
                (
                    b"\x00",  # attributes
                    timestamp_bytes,
                    delta_bytes,
                    key_bytes,
                    key,
                    value_bytes,
                    value,
                    _encode_headers(record_headers) if record_headers else b"\x00",
                )
            )
            n = len(record)
            out += table[n] if n < 8192 else encode_varint(n)
            out += record
            delta += 1
        # Nothing above changed the builder, so a ValueError leaves it as it was.
        self._buf += out
        self._base_timestamp = base
        if high > self._max_timestamp:
            self._max_timestamp = high
        self._count += count
        self._last_offset_delta = delta - 1

    def estimated_size_bytes(self) -> int:
        """An upper bound on ``len(build())`` (without a delete horizon), in O(1).

        The exact uncompressed size, or for a codec its worst case for records that do not
        shrink (``storage.compression.max_compressed_bytes``).
        """
        return HEADER_SIZE + max_compressed_bytes(self._compression, len(self._buf))

    def build(
        self,
        *,
        last_offset_delta: int | None = None,
        delete_horizon_ms: int | None = None,
        max_timestamp_ms: int | None = None,
    ) -> bytes:
        """Return the batch bytes. The builder is left as it was (build is repeatable).

        ``last_offset_delta`` (>= the last record's delta) keeps a batch's original last
        offset after the cleaner dropped records. ``delete_horizon_ms`` sets attribute bit
        6 and stores the horizon in ``baseTimestamp``; record deltas are re-encoded against
        it so every record keeps its timestamp. ``max_timestamp_ms`` (>= every record's
        timestamp) overrides ``maxTimestamp``, e.g. to keep an emptied batch's.

        An empty builder builds, as Kafka's ``writeEmptyHeader``, an uncompressed batch of
        0 records with ``baseTimestamp`` -1 (or the horizon), and needs
        ``last_offset_delta``. Raises ``ValueError`` for an out-of-range argument, an empty
        builder without ``last_offset_delta`` or a batch past int32 bytes.
        """
        count = self._count
        if last_offset_delta is None:
            if count == 0:
                raise ValueError("an empty batch needs last_offset_delta")
            last_offset_delta = self._last_offset_delta
        elif not max(self._last_offset_delta, 0) <= last_offset_delta <= INT32_MAX:
            raise ValueError(f"last_offset_delta {last_offset_delta} is out of range")
        if self._base_offset + last_offset_delta > INT64_MAX:
            raise ValueError("the batch's last offset overflows int64")
        max_timestamp = self._max_timestamp if count else NO_TIMESTAMP
        if max_timestamp_ms is not None:
            if count and max_timestamp_ms < max_timestamp:
                raise ValueError(f"max_timestamp_ms {max_timestamp_ms} is below {max_timestamp}")
            _check_range("max_timestamp_ms", max_timestamp_ms, INT64_MIN, INT64_MAX)
            max_timestamp = max_timestamp_ms
        attributes = (
            self._timestamp_type << 3
            | (_TRANSACTIONAL_FLAG * self._is_transactional)
            | (_CONTROL_FLAG * self._is_control)
        )
        records: bytes | bytearray = self._buf
        base_timestamp = self._base_timestamp if count else NO_TIMESTAMP
        assert base_timestamp is not None  # set by the first append
        if delete_horizon_ms is not None:
            _check_range("delete_horizon_ms", delete_horizon_ms, INT64_MIN, INT64_MAX)
            attributes |= _DELETE_HORIZON_FLAG
            if count and delete_horizon_ms != base_timestamp:
                records = _rebase_timestamps(self._buf, base_timestamp - delete_horizon_ms)
            base_timestamp = delete_horizon_ms
        if count and self._compression != Compression.NONE:
            # An empty batch stays uncompressed, as Kafka's writeEmptyHeader.
            attributes |= self._compression
            records = compress_records(self._compression, records)
        if _MIN_BATCH_LENGTH + len(records) > _MAX_BATCH_LENGTH:
            raise ValueError(f"a batch of {len(records)} record bytes exceeds int32 length")
        tail = _CRC_TAIL.pack(
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            self._producer_id,
            self._producer_epoch,
            self._base_sequence,
            count,
        )
        crc = crc32c.crc32c(records, crc32c.crc32c(tail))
        head = _CRC_PREFIX.pack(
            self._base_offset,
            _MIN_BATCH_LENGTH + len(records),
            self._partition_leader_epoch,
            MAGIC,
            crc,
        )
        return b"".join((head, tail, records))


def _encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    out = bytearray(encode_varint(len(headers)))
    for key, value in headers:
        if not isinstance(key, str):  # as the C encoder: a TypeError, not AttributeError
            raise TypeError(f"a header key must be a str, not {type(key).__name__}")
        key_bytes = key.encode("utf-8")
        out += encode_varint(len(key_bytes))
        out += key_bytes
        if value is None:
            out += b"\x01"
        else:
            out += encode_varint(len(value))
            out += value
    return bytes(out)


def _rebase_timestamps(records: bytearray, shift: int) -> bytearray:
    """Re-encode our own records with every timestamp delta moved by ``shift``."""
    out = bytearray()
    pos = 0
    end = len(records)
    while pos < end:
        length, pos = decode_varint(records, pos)
        record_end = pos + length
        timestamp_delta, after = decode_varlong(records, pos + 1)
        moved = timestamp_delta + shift
        if not INT64_MIN <= moved <= INT64_MAX:
            raise ValueError("a timestamp is too far from the delete horizon for int64 deltas")
        body = b"\x00" + encode_varlong(moved) + records[after:record_end]
        out += encode_varint(len(body))
        out += body
        pos = record_end
    return out


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name} {value} is outside [{low}, {high}]")


def builder_like(header: BatchHeader, compression: Compression) -> BatchBuilder:
    """A builder for a stored batch rebuilt in ``compression`` (the cleaner's rounds, a
    topic's ``compression.type``): ``header``'s base offset and timestamp, timestamp
    type, producer id, epoch and base sequence, transactional and control flags and leader epoch.
    Deltas against the original base timestamp keep every record's encoding."""
    return BatchBuilder(
        compression=compression,
        timestamp_type=header.timestamp_type,
        base_offset=header.base_offset,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        is_transactional=header.is_transactional,
        is_control=header.is_control,
        partition_leader_epoch=header.partition_leader_epoch,
        base_timestamp=header.base_timestamp,
    )


def encode_batch(
    records: Iterable[tuple[int, bytes | None, bytes | None]],
    *,
    compression: Compression = Compression.NONE,
    base_offset: int = 0,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
) -> bytes:
    """Build one batch of ``(timestamp_ms, key, value)`` records at consecutive offsets.

    A convenience for tests and tools. Raises ``ValueError`` as ``BatchBuilder`` does,
    including for no records at all.
    """
    builder = BatchBuilder(
        compression=compression, base_offset=base_offset, timestamp_type=timestamp_type
    )
    for timestamp_ms, key, value in records:
        builder.append(timestamp_ms, key, value)
    return builder.build()
