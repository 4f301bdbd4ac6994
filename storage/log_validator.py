"""Checking appended batches and assigning their offsets (Kafka's ``LogValidator``).

Pure functions on bytes and integers, no file, lock or clock: ``PartitionLog`` calls them
under its partition lock, with the log end offset and the time it read.

* ``check_produced_batch``: what a producer may not send (size, control batches: markers
  are the broker's, ``PartitionLog.append_marker``; unsupported codecs, inconsistent
  counts; for compacted topics, records that do not decode or have no key), checked
  before any state changes.
* ``recompress``: a topic whose ``compression.type`` names a codec stores every produced
  batch in it (Kafka's ``LogValidator``): a batch in another codec is rebuilt, its
  records, offsets deltas, timestamps and producer fields kept, its CRC recomputed;
  ``producer`` keeps batches as sent.
* ``assign_offsets``: a leader's append. Each batch gets its base offset written into its
  first 8 bytes (outside the CRC), the leader's epoch if given (also outside the CRC), and
  for LogAppendTime topics the broker's time (inside the CRC: those batches are copied and
  their CRC recomputed). The result is the pieces to write with one ``writev`` and the
  batches' new headers at their positions in the written bytes.
* ``place_follower_batches``: a follower's append. The leader's batches keep their offsets;
  those wholly below the log end are skipped, the rest must start at or after it and never
  go backwards.

Thread-safety: stateless, safe from any thread. Crash consistency: none here (no I/O).
"""

from __future__ import annotations

import dataclasses
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from tidelog.storage.batch_builder import builder_like
from tidelog.storage.batch_times import BatchTimes
from tidelog.storage.compression import Compression
from tidelog.storage.config import UNBOUNDED_MS, LogConfig
from tidelog.storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidRequestError,
    InvalidTimestampError,
    RecordTooLargeError,
    UnsupportedCompressionTypeError,
)
from tidelog.storage.records import (
    NO_TIMESTAMP,
    SUPPORTED_COMPRESSION,
    BatchHeader,
    decode_batch,
    iter_batch_headers,
    set_base_offset,
    set_log_append_time,
    validate_batch,
)
from tidelog.storage.segment import BatchPosition

__all__ = [
    "AssignedBatches",
    "FollowerBatches",
    "assign_offsets",
    "check_produced_batch",
    "follower_batch_times",
    "place_follower_batches",
    "recompress",
    "validated_batches",
]

_BASE_OFFSET = struct.Struct(">q")  # a batch's first 8 bytes, outside its CRC
# partitionLeaderEpoch: after baseOffset (8) and batchLength (4), outside the CRC.
_EPOCH_AT = 12
_EPOCH = struct.Struct(">i")
# Every BatchHeader field but the first (base_offset), to rebuild a header with a new base
# offset at half the cost of dataclasses.replace (per batch, on the append path).
_HEADER_FIELDS = [f.name for f in dataclasses.fields(BatchHeader)]
assert _HEADER_FIELDS[0] == "base_offset", _HEADER_FIELDS
_HEADER_AFTER_BASE_OFFSET = operator.attrgetter(*_HEADER_FIELDS[1:])


@dataclass(frozen=True, slots=True)
class AssignedBatches:
    """A leader's batches with offsets assigned, ready for ``Segment.append``.

    ``parts``: the bytes to write, in order; ``batches``: each batch's new header at its
    position in those bytes; ``size_bytes``: their total; ``next_offset``: the offset
    after the last batch; ``max_timestamp``: the largest batch max timestamp.
    """

    parts: list[bytes | bytearray | memoryview]
    batches: list[BatchPosition]
    size_bytes: int
    next_offset: int
    record_count: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class FollowerBatches:
    """The new part of a leader's batches: ``records[start:end]``, with each batch's
    header at its position relative to ``start``, and their largest max timestamp."""

    start: int
    end: int
    batches: list[BatchPosition]
    max_timestamp: int


def check_produced_batch(
    records: bytes, batch: BatchPosition, config: LogConfig, now_ms: int
) -> None:
    """Reject what a producer may not send (before any state changes).

    Raises:
        RecordTooLargeError: larger than ``max.message.bytes``.
        InvalidRequestError: a control batch (end-transaction markers are written by the
            partition's leader only, ``PartitionLog.append_marker``).
        UnsupportedCompressionTypeError: a codec this broker does not store.
        CorruptRecordError: no records, a count that disagrees with the last offset
            delta, or (compacted topics) records that do not decode.
        InvalidTimestampError: a CreateTime record outside ``now_ms`` minus
            ``message.timestamp.before.max.ms`` to ``now_ms`` plus
            ``message.timestamp.after.max.ms``.
    """
    header: BatchHeader = batch.header
    if header.size_bytes > config.max_message_bytes:
        raise RecordTooLargeError(
            f"batch at position {batch.position} is {header.size_bytes} bytes; the limit "
            f"(max.message.bytes) is {config.max_message_bytes}"
        )
    if header.is_control:
        raise InvalidRequestError("control batches are written by the broker, not producers")
    codec = header.compression
    if codec not in SUPPORTED_COMPRESSION:
        raise UnsupportedCompressionTypeError(
            f"batch at position {batch.position} is compressed with {codec.name.lower()}, "
            "which this broker does not store"
        )
    if header.records_count <= 0:
        raise CorruptRecordError(f"batch at position {batch.position} holds no records")
    if header.last_offset_delta != header.records_count - 1:
        raise CorruptRecordError(
            f"batch at position {batch.position}: last offset delta "
            f"{header.last_offset_delta} does not match {header.records_count} records"
        )
    _check_timestamps(records, batch, config, now_ms)
    if config.compact:
        # The cleaner decodes every record of a compacted log, and one batch it cannot
        # decode sets the partition aside for good (never compacted again until a
        # restart): so a compacted topic takes only batches whose records decode. Kafka's
        # LogValidator decodes the records of compacted topics at produce too. Other
        # topics keep the rule of storing batches undecoded (readers refuse a bad one).
        _, decoded = decode_batch(records, batch.position, validate=False)  # CRC checked
        # Kafka's rule: a compacted topic keeps the latest value *per key*, so a record
        # without a key has no place in it (the cleaner would drop it silently). Checked
        # on the live config, so a topic made compact refuses key-less records from then.
        for record in decoded:
            if record.key is None:
                raise InvalidRecordError(
                    f"batch at position {batch.position}: record at offset delta "
                    f"{record.offset - header.base_offset} has no key; a compacted topic "
                    "(cleanup.policy=compact) only accepts keyed records"
                )


_CODECS = {
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


def decompresses(batches: list[BatchPosition], config: LogConfig) -> bool:
    """Whether validating or storing ``batches`` decompresses any of them: a compressed
    batch whose records ``check_produced_batch`` decodes (a compacted topic's keys,
    ``message.timestamp.before.max.ms``'s lower bound) or one ``recompress`` rebuilds in
    the topic's codec. A few KiB of compressed records can hold megabytes: the inline
    produce leaves such work to a thread (issue #31)."""
    decodes = config.compact or (
        not config.log_append_time and config.message_timestamp_before_max_ms < UNBOUNDED_MS
    )
    if decodes and any(b.header.compression != Compression.NONE for b in batches):
        return True
    target = _CODECS.get(config.compression_type)
    return target is not None and any(b.header.compression != target for b in batches)


def recompress(
    records: bytes, batches: list[BatchPosition], config: LogConfig
) -> tuple[bytes, list[BatchPosition]]:
    """``records`` with every batch in the topic's ``compression.type`` (unchanged when it
    is ``producer`` or every batch is in that codec already), and the batches' positions
    in the result. Call after ``check_produced_batch``.

    Raises:
        RecordTooLargeError: a rebuilt batch is larger than ``max.message.bytes``.
        CorruptRecordError: records that do not decode.
    """
    target = _CODECS.get(config.compression_type)
    if target is None or all(b.header.compression == target for b in batches):
        return records, batches
    pieces: list[bytes] = []
    for batch in batches:
        header = batch.header
        data = records[batch.position : batch.position + header.size_bytes]
        if header.compression != target:
            data = _rebuilt(data, target)
            if len(data) > config.max_message_bytes:
                raise RecordTooLargeError(
                    f"batch at position {batch.position} is {len(data)} bytes in "
                    f"{config.compression_type} (compression.type); the limit "
                    f"(max.message.bytes) is {config.max_message_bytes}"
                )
        pieces.append(data)
    joined = b"".join(pieces)
    return joined, [
        BatchPosition(position, header)
        for position, header in iter_batch_headers(joined, validate=False)
    ]


def _rebuilt(batch: bytes, codec: Compression) -> bytes:
    header, decoded = decode_batch(batch, 0, validate=False)  # the CRC was checked
    builder = builder_like(header, codec)
    for record in decoded:
        builder.append(
            record.timestamp_ms,
            record.key,
            record.value,
            record.headers,
            offset_delta=record.offset - header.base_offset,
        )
    return builder.build(
        last_offset_delta=header.last_offset_delta, max_timestamp_ms=header.max_timestamp
    )


def _check_timestamps(records: bytes, batch: BatchPosition, config: LogConfig, now_ms: int) -> None:
    """KIP-937's bounds on CreateTime records (skipped for LogAppendTime topics, whose
    records take the broker's time, and for records without a timestamp). The header's
    max timestamp decides the upper bound; the lower one decodes the records, only when
    it is set."""
    header = batch.header
    if config.log_append_time:
        return
    before, after = config.message_timestamp_before_max_ms, config.message_timestamp_after_max_ms
    if after < UNBOUNDED_MS and header.max_timestamp > now_ms + after:
        raise InvalidTimestampError(
            f"batch at position {batch.position}: timestamp {header.max_timestamp} is more "
            f"than message.timestamp.after.max.ms ({after}) after the broker's time {now_ms}"
        )
    if before >= UNBOUNDED_MS:
        return
    _, decoded = decode_batch(records, batch.position, validate=False)  # CRC checked
    for record in decoded:
        if record.timestamp_ms != NO_TIMESTAMP and record.timestamp_ms < now_ms - before:
            raise InvalidTimestampError(
                f"batch at position {batch.position}: timestamp {record.timestamp_ms} of the "
                f"record at offset delta {record.offset - header.base_offset} is more than "
                f"message.timestamp.before.max.ms ({before}) before the broker's time {now_ms}"
            )


def validated_batches(records: bytes) -> list[BatchPosition]:
    """Each of the concatenated batches in ``records`` with its header, every batch
    validated (``records.validate_batch``: framing, magic, CRC-32C, codec, counts), as
    ``PartitionLog.append`` needs them (or takes them from a caller that read them). A
    loop rather than ``iter_batch_headers``' generator: this runs once per produced
    partition (issue #31's per-request Python).

    Raises:
        CorruptRecordError: as ``validate_batch``, for the first bad batch; also for
            empty ``records`` (``append`` refuses those as an invalid request first).
    """
    out = []
    position, end = 0, len(records)
    while True:
        header = validate_batch(records, position)
        out.append(BatchPosition(position, header))
        position += header.size_bytes
        if position >= end:
            return out


def assign_offsets(
    records: bytes,
    kept: Sequence[BatchPosition],
    offset: int,
    *,
    append_time: int,
    leader_epoch: int | None,
) -> AssignedBatches:
    """Give the batches ``kept`` (non-empty, positions in ``records``) dense offsets from
    ``offset``; ``append_time`` >= 0 stamps LogAppendTime, ``leader_epoch`` (not None)
    stamps the leader's epoch. ``records`` is not modified."""
    # The producer's bytes are written as they are, in pieces (one writev): only the
    # 8-byte base offset of each batch is new, and copying a 1 MiB request to patch 8
    # bytes cost about a tenth of the append. LogAppendTime changes the CRC, so those
    # batches are copied and rewritten.
    view = memoryview(records)
    parts: list[bytes | bytearray | memoryview] = []
    assigned: list[BatchPosition] = []
    position = 0
    record_count = 0
    max_timestamp = NO_TIMESTAMP
    for batch in kept:
        header = batch.header
        start, size = batch.position, header.size_bytes
        if append_time >= 0:
            rewritten = bytearray(view[start : start + size])
            set_base_offset(rewritten, 0, offset)
            set_log_append_time(rewritten, 0, append_time)
            header = dataclasses.replace(header, base_offset=offset, max_timestamp=append_time)
            if leader_epoch is not None:
                _EPOCH.pack_into(rewritten, _EPOCH_AT, leader_epoch)
                header = dataclasses.replace(header, partition_leader_epoch=leader_epoch)
            parts.append(rewritten)
        elif leader_epoch is not None:
            parts.append(_BASE_OFFSET.pack(offset))
            parts.append(view[start + _BASE_OFFSET.size : start + _EPOCH_AT])
            parts.append(_EPOCH.pack(leader_epoch))
            parts.append(view[start + _EPOCH_AT + _EPOCH.size : start + size])
            header = dataclasses.replace(
                header, base_offset=offset, partition_leader_epoch=leader_epoch
            )
        else:
            parts.append(_BASE_OFFSET.pack(offset))
            parts.append(view[start + _BASE_OFFSET.size : start + size])
            header = BatchHeader(offset, *_HEADER_AFTER_BASE_OFFSET(header))
        assigned.append(BatchPosition(position, header))
        position += size
        offset = header.next_offset
        record_count += header.records_count
        max_timestamp = max(max_timestamp, header.max_timestamp)
    return AssignedBatches(parts, assigned, position, offset, record_count, max_timestamp)


def place_follower_batches(
    batches: Sequence[BatchPosition], log_end: int, owner: object
) -> FollowerBatches | None:
    """The part of a leader's ``batches`` past ``log_end``, or None if none is.

    Raises ``CorruptRecordError`` (naming ``owner``) if the first new batch starts below
    ``log_end`` or the offsets go backwards.
    """
    kept = [b for b in batches if b.header.last_offset >= log_end]
    if not kept:
        return None
    if kept[0].header.base_offset < log_end:
        raise CorruptRecordError(
            f"{owner}: the leader's batch {kept[0].header.base_offset}.."
            f"{kept[0].header.last_offset} overlaps the log end {log_end}"
        )
    first = kept[0].position
    previous = log_end - 1
    assigned = []
    max_timestamp = NO_TIMESTAMP
    for batch in kept:
        header = batch.header
        if header.base_offset <= previous:
            raise CorruptRecordError(f"{owner}: the leader's offsets go backwards")
        previous = header.last_offset
        assigned.append(BatchPosition(batch.position - first, header))
        max_timestamp = max(max_timestamp, header.max_timestamp)
    end = kept[-1].position + kept[-1].header.size_bytes
    return FollowerBatches(first, end, assigned, max_timestamp)


def follower_batch_times(
    times_by_offset: dict[int, tuple[int | None, int | None]], batches: Sequence[BatchPosition]
) -> list[BatchTimes] | None:
    """The sent/received times to store for a follower's ``batches``, from the fetch
    answer's entries keyed by last offset (None: the answer carried none)."""
    if not times_by_offset:
        return None
    return [
        BatchTimes(*(-1 if t is None else t for t in found))
        if (found := times_by_offset.get(b.header.last_offset)) is not None
        else BatchTimes()
        for b in batches
    ]
