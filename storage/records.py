"""The RecordBatch v2 format (magic 2), byte for byte as Kafka's.

The bytes a producer builds are the bytes the log stores and the bytes a consumer decodes.
The client encodes and decodes records (hot loops); the broker only reads headers,
validates (framing + CRC-32C), rewrites the base offset / leader epoch / append time, and
never decodes records on the produce or fetch path; the log cleaner decodes and re-encodes.

Batch (all integers big-endian; "crc" marks the bytes the CRC-32C covers)::

    offset size  field                  crc  notes
         0    8  baseOffset      int64        first offset; the broker rewrites it
         8    4  batchLength     int32        bytes after this field: size = 12 + batchLength
        12    4  partitionLeaderEpoch int32   written by the broker; -1 = none
        16    1  magic           int8         2; read it before trusting the fields above
        17    4  crc             uint32       CRC-32C (Castagnoli) of bytes [21, size)
        21    2  attributes      int16    x   bits 0-2 codec (0 none, 1 gzip, 2 snappy,
                                              3 lz4, 4 zstd), 3 LogAppendTime,
                                              4 transactional, 5 control, 6 delete horizon
        23    4  lastOffsetDelta int32    x   last offset - baseOffset (>= count - 1)
        27    8  baseTimestamp   int64    x   first record's timestamp, or the delete horizon
        35    8  maxTimestamp    int64    x   largest timestamp; the append time if bit 3
        43    8  producerId      int64    x   -1 = none
        51    2  producerEpoch   int16    x   -1 = none
        53    4  baseSequence    int32    x   -1 = none
        57    4  recordsCount    int32    x
        61    -  records                  x   compressed as one payload when codec > 0

Record (varint = zigzag LEB128 int32, varlong = int64; see ``storage.varint``)::

    length            varint   bytes of the rest of this record
    attributes        int8     unused, 0
    timestampDelta    varlong  timestamp - baseTimestamp
    offsetDelta       varint   offset - baseOffset; strictly increasing within a batch
    keyLength, key    varint (-1 = null) + bytes
    valueLength,value varint (-1 = null, a tombstone) + bytes
    headersCount      varint
      headerKeyLength, headerKey      varint + UTF-8 bytes (never null)
      headerValueLength, headerValue  varint (-1 = null) + bytes

Every codec Kafka defines is built and decoded here: gzip, snappy (xerial framing or a raw
block), LZ4 (Kafka's frame: independent 64 KiB blocks, header ``04 22 4D 18 60 40 82``) and
zstd, each payload laid out as ``storage.compression`` draws it. A payload that may
decompress to more than ``MAX_DECOMPRESSED_BYTES`` is refused (``CorruptRecordError``)
before it is decompressed, or for gzip, as soon as its output passes the limit. The broker
frames and validates a compressed batch like any other and stores it as sent.

The record loops run in C (``storage/_native.c``) when the optional extension is built,
and in the pure-Python code below otherwise (``storage.native`` chooses); the Python
code is the reference the C code is tested against (``pure=True`` runs it).

Decoding rules, as Kafka's: a record's offset is ``baseOffset + offsetDelta``; its
timestamp is ``baseTimestamp + timestampDelta`` (wrapped to int64 as Java does), except in
a LogAppendTime batch, where every record's timestamp is the batch ``maxTimestamp``. In a
delete-horizon batch the horizon sits in ``baseTimestamp`` and the builder stores deltas
relative to it, so ``baseTimestamp + delta`` is still each record's own timestamp; we apply
that rule unchanged. Control batches decode like data batches; callers filter them by
``BatchHeader.is_control``. Any malformed byte raises ``CorruptRecordError`` saying what
and at which position, never ``struct.error`` or ``IndexError``.

Everything here is pure and thread-safe except ``BatchBuilder`` (one owner at a time).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import crc32c

from tidelog.storage.compression import MAX_DECOMPRESSED_BYTES, Compression, decompress_records
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.native import NATIVE, native
from tidelog.storage.varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    decode_varint,
    decode_varlong,
)

__all__ = [
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "MAX_DECOMPRESSED_BYTES",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NO_TIMESTAMP",
    "SUPPORTED_COMPRESSION",
    "BatchBuilder",
    "BatchHeader",
    "Compression",
    "Record",
    "TimestampType",
    "decode_batch",
    "decode_batch_as",
    "decode_records",
    "encode_batch",
    "iter_batch_headers",
    "read_header",
    "records_data",
    "set_base_offset",
    "set_log_append_time",
    "set_partition_leader_epoch",
    "split_whole_batches",
    "validate_batch",
]

MAGIC = 2
LOG_OVERHEAD = 12  # baseOffset(8) + batchLength(4): what a scan reads to skip a batch
HEADER_SIZE = 61  # Kafka's RECORD_BATCH_OVERHEAD
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

_INT16_MIN = -(1 << 15)
_INT16_MAX = (1 << 15) - 1
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
_MAX_BATCH_LENGTH = INT32_MAX
_CRC_START = 21  # the CRC covers [attributes, end of batch)
_ATTRIBUTES_OFFSET = 21
_MAX_TIMESTAMP_OFFSET = 35

_CODEC_MASK = 0x07
_LOG_APPEND_TIME_FLAG = 0x08
_TRANSACTIONAL_FLAG = 0x10
_CONTROL_FLAG = 0x20
_DELETE_HORIZON_FLAG = 0x40

_HEADER = struct.Struct(">qiibIhiqqqhii")  # the whole 61-byte header
_FRAMING = struct.Struct(">qiib")  # baseOffset, batchLength, partitionLeaderEpoch, magic
_CRC_PREFIX = struct.Struct(">qiibI")  # the 21 bytes before the CRC'd part
_CRC_TAIL = struct.Struct(">hiqqqhii")  # attributes .. recordsCount (40 bytes)
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")

_Buffer = bytes | bytearray | memoryview
_WritableBuffer = bytearray | memoryview


class TimestampType(enum.IntEnum):
    """Attribute bit 3: who set the timestamps."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


# The codecs this package builds and decodes: all of Kafka's. Codec ids 5-7 are no codec at
# all (``validate_batch`` refuses them as corrupt).
SUPPORTED_COMPRESSION = frozenset(Compression)


class Record(NamedTuple):
    """One decoded record: absolute offset and timestamp. Immutable, thread-safe.

    A named tuple rather than a frozen dataclass: the decoder builds one per record, and
    ``tuple.__new__`` with the fields is the cheapest object Python can build (a slotted
    dataclass costs a call per field).
    """

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


# Rows the decoder builds: ``Record``, or any tuple subclass whose fields are a fixed
# prefix (such as a topic and partition) followed by Record's five fields.
_Row = TypeVar("_Row", bound=tuple[Any, ...])
_new_row = tuple.__new__


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The 61-byte batch header, parsed; records are not touched. Immutable, thread-safe."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size_bytes(self) -> int:
        """Bytes of the whole batch, log overhead included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        """The codec; ``CorruptRecordError`` for ids 5-7, which no codec has."""
        codec = self.attributes & _CODEC_MASK
        if codec > Compression.ZSTD:
            raise CorruptRecordError(f"unknown compression codec id {codec}")
        return Compression(codec)

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & _LOG_APPEND_TIME_FLAG:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_FLAG)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & _DELETE_HORIZON_FLAG)

    @property
    def delete_horizon_ms(self) -> int | None:
        """The tombstone delete horizon the cleaner stored, or None."""
        return self.base_timestamp if self.attributes & _DELETE_HORIZON_FLAG else None

    @property
    def last_sequence(self) -> int:
        """``base_sequence + last_offset_delta``, wrapping past int32 max to 0 as Kafka."""
        base = self.base_sequence
        if base == NO_SEQUENCE:
            return NO_SEQUENCE
        delta = self.last_offset_delta
        if base > INT32_MAX - delta:  # DefaultRecordBatch.incrementSequence
            return delta - (INT32_MAX - base) - 1
        return base + delta


# --- framing, validation, in-place rewrites (the broker's path) ----------------------


def read_header(buf: _Buffer, position: int = 0, *, whole: bool = True) -> BatchHeader:
    """Parse the header of the batch at ``position`` (framing only, no CRC check).

    Raises ``CorruptRecordError`` if fewer than ``HEADER_SIZE`` bytes remain, the magic is
    not 2, ``batchLength`` is below the header's 49 bytes, or (with ``whole``, the default)
    the batch runs past the end of ``buf``. ``whole=False`` is for a caller that read just
    the header from a file and checks the length against the file itself.
    """
    available = len(buf) - position
    if position < 0 or available < HEADER_SIZE:
        raise CorruptRecordError(
            f"batch at position {position}: {max(available, 0)} bytes left, "
            f"a header needs {HEADER_SIZE}"
        )
    fields = _HEADER.unpack_from(buf, position)
    if fields[3] != MAGIC:
        raise CorruptRecordError(f"batch at position {position}: magic {fields[3]}, expected 2")
    batch_length = fields[1]
    if batch_length < _MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batch at position {position}: batchLength {batch_length} is below "
            f"the minimum {_MIN_BATCH_LENGTH}"
        )
    if whole and LOG_OVERHEAD + batch_length > available:
        raise CorruptRecordError(
            f"batch at position {position}: batchLength {batch_length} runs past the end "
            f"of the data ({available} bytes left)"
        )
    return BatchHeader(*fields)


def validate_batch(buf: _Buffer, position: int = 0) -> BatchHeader:
    """``read_header`` plus the checks the broker makes before appending a batch.

    Checks the CRC-32C over bytes ``[position + 21, position + size)``, a known codec id,
    ``records_count >= 0``, ``last_offset_delta >= 0`` and, for a non-empty batch,
    ``last_offset_delta >= records_count - 1``. Does not decode records. Raises
    ``CorruptRecordError`` naming the failed check and the position.
    """
    header = read_header(buf, position)
    end = position + header.size_bytes
    actual = crc32c.crc32c(memoryview(buf)[position + _CRC_START : end])
    if actual != header.crc:
        raise CorruptRecordError(
            f"batch at position {position}: CRC-32C mismatch "
            f"(stored {header.crc:#010x}, computed {actual:#010x})"
        )
    if header.attributes & _CODEC_MASK > Compression.ZSTD:
        raise CorruptRecordError(
            f"batch at position {position}: unknown compression codec id "
            f"{header.attributes & _CODEC_MASK}"
        )
    count = header.records_count
    if count < 0 or header.last_offset_delta < 0 or header.last_offset_delta < count - 1:
        raise CorruptRecordError(
            f"batch at position {position}: recordsCount {count} does not fit "
            f"lastOffsetDelta {header.last_offset_delta}"
        )
    return header


def iter_batch_headers(buf: _Buffer, *, validate: bool = True) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each of the concatenated batches in ``buf``.

    With ``validate`` each batch gets ``validate_batch``, else only ``read_header``. A bad
    or partial batch (including a cut tail) raises ``CorruptRecordError`` when reached;
    use ``split_whole_batches`` first to drop a partial tail on purpose.
    """
    check = validate_batch if validate else read_header
    position = 0
    end = len(buf)
    while position < end:
        header = check(buf, position)
        yield position, header
        position += header.size_bytes


def split_whole_batches(buf: _Buffer) -> int:
    """Length of the longest prefix of ``buf`` made of whole batches.

    Framing only (length, magic; no CRC): used to cut a read at a batch boundary. Stops at
    the first batch that is partial or whose framing is bad; never raises for content.
    """
    position = 0
    end = len(buf)
    unpack = _FRAMING.unpack_from
    while end - position >= HEADER_SIZE:
        _, batch_length, _, magic = unpack(buf, position)
        if magic != MAGIC or batch_length < _MIN_BATCH_LENGTH:
            break
        next_position = position + LOG_OVERHEAD + batch_length
        if next_position > end:
            break
        position = next_position
    return position


def set_base_offset(buf: _WritableBuffer, position: int, base_offset: int) -> None:
    """Rewrite the base offset of the batch at ``position``; the CRC does not cover it.

    Raises ``CorruptRecordError`` if no batch frames at ``position`` and ``ValueError`` if
    the batch's offsets would not fit in [0, int64 max].
    """
    header = read_header(buf, position)
    if base_offset < 0 or base_offset + header.last_offset_delta > INT64_MAX:
        raise ValueError(f"base offset {base_offset} is out of range for this batch")
    _INT64.pack_into(buf, position, base_offset)


def set_partition_leader_epoch(buf: _WritableBuffer, position: int, epoch: int) -> None:
    """Rewrite the partition leader epoch of the batch at ``position`` (not CRC-covered).

    Raises ``CorruptRecordError`` if no batch frames there, ``ValueError`` if ``epoch`` is
    not an int32.
    """
    read_header(buf, position)
    if not INT32_MIN <= epoch <= INT32_MAX:
        raise ValueError(f"partition leader epoch {epoch} is not an int32")
    _INT32.pack_into(buf, position + 12, epoch)


def set_log_append_time(buf: _WritableBuffer, position: int, timestamp_ms: int) -> None:
    """Turn the batch at ``position`` into a LogAppendTime batch stamped ``timestamp_ms``.

    As Kafka's ``setMaxTimestamp``: sets attribute bit 3, writes ``maxTimestamp`` (leaving
    ``baseTimestamp`` and the record deltas alone) and recomputes the CRC. The new CRC
    vouches for whatever bytes are there, so validate the batch first. Raises
    ``CorruptRecordError`` if no batch frames there, ``ValueError`` for a non-int64 time.
    """
    header = read_header(buf, position)
    if not INT64_MIN <= timestamp_ms <= INT64_MAX:
        raise ValueError(f"timestamp {timestamp_ms} is not an int64")
    _INT16.pack_into(buf, position + _ATTRIBUTES_OFFSET, header.attributes | _LOG_APPEND_TIME_FLAG)
    _INT64.pack_into(buf, position + _MAX_TIMESTAMP_OFFSET, timestamp_ms)
    crc = crc32c.crc32c(memoryview(buf)[position + _CRC_START : position + header.size_bytes])
    _UINT32.pack_into(buf, position + 17, crc)


# --- decoding (the consumer's and the cleaner's path) --------------------------------


def decode_batch(
    buf: _Buffer, position: int = 0, *, validate: bool = True, pure: bool = False
) -> tuple[BatchHeader, list[Record]]:
    """Decode the batch at ``position`` into its header and records.

    Records carry absolute offsets and timestamps (see the module docstring for the
    LogAppendTime and delete-horizon rules). ``validate=False`` skips the CRC and count
    checks but decoding stays strict. Raises ``CorruptRecordError`` for any malformed byte
    (varint overrun, a length past the record's end, a count mismatch, trailing bytes, bad
    or oversized compressed data: see ``MAX_DECOMPRESSED_BYTES``).

    The C extension decodes when it is built (``storage.native``); ``pure=True`` runs the
    pure-Python decoder, the reference both are tested against.
    """
    header = validate_batch(buf, position) if validate else read_header(buf, position)
    return header, _decode_body(buf, position, header, Record, None, pure)


def decode_batch_as(
    buf: _Buffer,
    position: int,
    row_type: type[_Row],
    prefix: tuple[Any, Any],
    *,
    times: tuple[int | None, int | None] | None = None,
    validate: bool = True,
    pure: bool = False,
) -> tuple[BatchHeader, list[_Row]]:
    """``decode_batch``, building each record as a ``row_type`` that starts with ``prefix``.

    ``row_type`` is a tuple subclass (a ``NamedTuple``) of seven fields: the two of
    ``prefix`` (the consumer passes its topic and partition), then offset, timestamp_ms,
    key, value and headers as in ``Record``. The consumer's records are built here
    directly, not copied from ``Record``s: the copy was a quarter of the time a fetched
    record cost. Errors and ``pure`` as ``decode_batch``.

    ``times``: the batch's ``(sent_ms, received_ms)`` (``storage.batch_times``; each None
    when unknown). With it ``row_type`` has nine fields: the seven above, then sent and
    received, the same two objects for every record of the batch (the consumer's
    ``ConsumerRecord`` derives the corrected timestamp from them on access: building an
    int per record cost ~12% of decoding).
    """
    if len(prefix) != 2:
        raise ValueError(f"prefix must have two fields, not {len(prefix)}")
    if times is not None and len(times) != 2:
        raise ValueError(f"times must have two fields, not {len(times)}")
    header = validate_batch(buf, position) if validate else read_header(buf, position)
    return header, _decode_body(buf, position, header, row_type, prefix, pure, times)


def decode_records(buf: _Buffer) -> Iterator[Record]:
    """All records of all (validated) batches in ``buf``, in order.

    A partial tail raises ``CorruptRecordError``, as ``iter_batch_headers``; control
    batches are included.
    """
    for position, header in iter_batch_headers(buf, validate=True):
        yield from _decode_body(buf, position, header, Record, None, False)


def _decode_body(
    buf: _Buffer,
    position: int,
    header: BatchHeader,
    row_type: type[_Row],
    prefix: tuple[Any, Any] | None,
    pure: bool,
    times: tuple[int | None, int | None] | None = None,
) -> list[_Row]:
    data, start, end = records_data(buf, position, header)
    append_time = header.max_timestamp if header.attributes & _LOG_APPEND_TIME_FLAG else None
    if NATIVE and not pure:
        return native.decode_records(
            data,
            start,
            end,
            header.records_count,
            header.base_offset,
            header.base_timestamp,
            append_time,
            header.last_offset_delta,
            position,
            row_type,
            prefix,
            times,
        )
    # The pure loop gets the records as their own bytes object even when `buf` is bytes:
    # indexing and slicing bytes is the fastest access Python has, and the copy costs
    # about 1% of decoding the records in it.
    if start or end != len(data) or data.__class__ is not bytes:
        data = bytes(memoryview(data)[start:end])
    return _decode_records(
        data,
        header.records_count,
        header.base_offset,
        header.base_timestamp,
        append_time,
        header.last_offset_delta,
        position,
        row_type,
        prefix,
        times,
    )


def records_data(buf: _Buffer, position: int, header: BatchHeader) -> tuple[_Buffer, int, int]:
    """The records of the batch at ``position`` as ``(data, start, end)``, decompressed.

    For an uncompressed batch ``data`` is ``buf`` itself (no copy) and ``[start, end)`` the
    records' bytes; for a compressed batch it is the decompressed bytes, whole (the C
    decoder and the pure one both start from here, so decompression is one code on both
    paths). Checks what every decoder needs first: ``recordsCount >= 0`` and a last offset
    within int64. Raises ``CorruptRecordError`` for those, for bad or oversized compressed
    data (see ``MAX_DECOMPRESSED_BYTES``) and for codec ids 5-7.
    """
    count = header.records_count
    if count < 0:
        raise CorruptRecordError(f"batch at position {position}: negative recordsCount {count}")
    if header.base_offset + header.last_offset_delta > INT64_MAX:
        raise CorruptRecordError(f"batch at position {position}: last offset overflows int64")
    codec = header.attributes & _CODEC_MASK
    start = position + HEADER_SIZE
    end = position + header.size_bytes
    if codec == Compression.NONE:
        return buf, start, end
    if codec > Compression.ZSTD:
        raise CorruptRecordError(
            f"batch at position {position}: unknown compression codec id {codec}"
        )
    data = decompress_records(Compression(codec), memoryview(buf)[start:end], position)
    return data, 0, len(data)


def _decode_records(
    data: bytes,
    count: int,
    base_offset: int,
    base_timestamp: int,
    append_time: int | None,
    last_offset_delta: int,
    batch_position: int,
    row_type: type[_Row],
    prefix: tuple[Any, Any] | None,
    times: tuple[int | None, int | None] | None = None,
) -> list[_Row]:
    # The hot loop. Every varint gets inline 1- and 2-byte paths (lengths up to 8191,
    # offset deltas up to 8191) and falls back to the strict decoder beyond. Reads may run
    # past a record's end into the next one: the `pos != record_end` check after each
    # record catches that; reads past the data raise IndexError, turned into a
    # CorruptRecordError below.
    pos = 0
    end = len(data)
    records: list[_Row] = []
    append = records.append
    new = _new_row
    read_varint, read_varlong = _slow_varint, _slow_varlong
    cls = row_type
    # Two branches rather than a tuple concatenation per record: `prefix + (...)` would
    # build a second tuple for every record.
    plain = prefix is None
    first, second = (None, None) if prefix is None else prefix
    # With times (and a prefix): rows end with sent and received (see decode_batch_as).
    timed = times is not None and not plain
    sent, received = (None, None) if times is None else times
    previous_delta = -1
    record_start = pos
    # Java's long arithmetic wraps base + delta; only a delta past the 2-byte paths or a
    # base within 8192 of the int64 edges can overflow, so the wrap is a rare post-pass.
    wrap_timestamps = append_time is None and not (
        INT64_MIN + 8192 <= base_timestamp <= INT64_MAX - 8192
    )
    try:
        for _ in range(count):
            record_start = pos
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                c = data[pos + 1]
                if c < 0x80:
                    z = (b & 0x7F) | (c << 7)
                    length = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    length, pos = read_varint(data, pos, batch_position)
            record_end = pos + length
            if record_end > end or length < 6:  # 6 = smallest record: six 1-byte fields
                raise _record_error(
                    batch_position, record_start, f"length {length} is below 6 or runs past the end"
                )
            pos += 1  # attributes: unused
            b = data[pos]
            if b < 0x80:
                timestamp_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                c = data[pos + 1]
                if c < 0x80:
                    z = (b & 0x7F) | (c << 7)
                    timestamp_delta = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    timestamp_delta, pos = read_varlong(data, pos, batch_position)
                    wrap_timestamps = append_time is None
            b = data[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                c = data[pos + 1]
                if c < 0x80:
                    z = (b & 0x7F) | (c << 7)
                    offset_delta = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    offset_delta, pos = read_varint(data, pos, batch_position)
            if offset_delta <= previous_delta or offset_delta > last_offset_delta:
                raise _record_error(
                    batch_position, record_start, f"offset delta {offset_delta} out of order"
                )
            previous_delta = offset_delta
            b = data[pos]
            if b < 0x80:
                key_length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                c = data[pos + 1]
                if c < 0x80:
                    z = (b & 0x7F) | (c << 7)
                    key_length = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    key_length, pos = read_varint(data, pos, batch_position)
            if key_length >= 0:
                key: bytes | None = data[pos : pos + key_length]
                pos += key_length
            elif key_length == -1:
                key = None
            else:
                raise _record_error(batch_position, record_start, f"key length {key_length}")
            b = data[pos]
            if b < 0x80:
                value_length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                c = data[pos + 1]
                if c < 0x80:
                    z = (b & 0x7F) | (c << 7)
                    value_length = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    value_length, pos = read_varint(data, pos, batch_position)
            if value_length >= 0:
                value: bytes | None = data[pos : pos + value_length]
                pos += value_length
            elif value_length == -1:
                value = None
            else:
                raise _record_error(batch_position, record_start, f"value length {value_length}")
            b = data[pos]
            if b == 0:
                headers: tuple[tuple[str, bytes | None], ...] = ()
                pos += 1
            else:
                headers, pos = _decode_headers(data, pos, record_start, record_end, batch_position)
            if pos != record_end:
                raise _record_error(
                    batch_position, record_start, f"fields end at {pos}, length says {record_end}"
                )
            timestamp = base_timestamp + timestamp_delta if append_time is None else append_time
            if plain:
                append(new(cls, (base_offset + offset_delta, timestamp, key, value, headers)))
            elif timed:
                append(
                    new(
                        cls,
                        (
                            first,
                            second,
                            base_offset + offset_delta,
                            timestamp,
                            key,
                            value,
                            headers,
                            sent,
                            received,
                        ),
                    )
                )
            else:
                append(
                    new(
                        cls,
                        (first, second, base_offset + offset_delta, timestamp, key, value, headers),
                    )
                )
    except IndexError:
        raise _record_error(batch_position, record_start, "runs past the end") from None
    if pos != end:
        raise CorruptRecordError(
            f"batch at position {batch_position}: {end - pos} bytes left after "
            f"{count} records (recordsCount too small or trailing garbage)"
        )
    if wrap_timestamps:
        at = 1 if plain else 3  # the timestamp's field
        records = [_wrap_timestamp(cls, record, at) for record in records]
    return records


def _slow_varint(data: bytes, pos: int, batch_position: int) -> tuple[int, int]:
    try:
        return decode_varint(data, pos)
    except CorruptRecordError as exc:
        raise CorruptRecordError(
            f"batch at position {batch_position}: records data: {exc}"
        ) from None


def _slow_varlong(data: bytes, pos: int, batch_position: int) -> tuple[int, int]:
    try:
        return decode_varlong(data, pos)
    except CorruptRecordError as exc:
        raise CorruptRecordError(
            f"batch at position {batch_position}: records data: {exc}"
        ) from None


def _decode_headers(
    data: bytes, pos: int, record_start: int, record_end: int, batch_position: int
) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    count, pos = _slow_varint(data, pos, batch_position)
    if count < 0 or count > record_end - pos:  # each header takes at least 2 bytes
        raise _record_error(batch_position, record_start, f"header count {count}")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        key_length, pos = _slow_varint(data, pos, batch_position)
        if key_length < 0 or pos + key_length > record_end:
            raise _record_error(batch_position, record_start, f"header key length {key_length}")
        try:
            key = data[pos : pos + key_length].decode("utf-8")
        except UnicodeDecodeError:
            raise _record_error(batch_position, record_start, "header key not UTF-8") from None
        pos += key_length
        value_length, pos = _slow_varint(data, pos, batch_position)
        if value_length == -1:
            headers.append((key, None))
        elif 0 <= value_length <= record_end - pos:
            headers.append((key, data[pos : pos + value_length]))
            pos += value_length
        else:
            raise _record_error(batch_position, record_start, f"header value length {value_length}")
    return tuple(headers), pos


def _record_error(batch_position: int, record_position: int, what: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"batch at position {batch_position}: record at byte {record_position} of the "
        f"records data: {what}"
    )


def _wrap_timestamp(row_type: type[_Row], row: _Row, at: int) -> _Row:
    timestamp = ((row[at] - INT64_MIN) & 0xFFFFFFFFFFFFFFFF) + INT64_MIN
    if timestamp == row[at]:
        return row
    return _new_row(row_type, (*row[:at], timestamp, *row[at + 1 :]))


# The encoder lives in its own module for size; it is part of this format and exported
# from here. Imported last: it uses the constants above.
from tidelog.storage.batch_builder import BatchBuilder, encode_batch  # noqa: E402
