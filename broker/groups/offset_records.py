"""The record format of the ``__consumer_offsets`` topic, and which partition a group uses.

One record per committed (group, topic, partition), laid out after Kafka's
``OffsetCommitKey`` version 1 and ``OffsetCommitValue`` version 3 (non-flexible versions,
``reference/kafka-internals.md`` 5.1). All integers big-endian; a string is an int16 byte
length followed by that many UTF-8 bytes::

    key                                   value
    offset size field                     offset size field
         0    2 version int16 = 1              0    2 version int16 = 3
         2    2 group length int16             2    8 offset int64 (next offset to read)
         4    n group                         10    4 leader epoch int32 (-1: none)
       4+n    2 topic length int16            14    2 metadata length int16
       6+n    m topic                         16    k metadata
     6+n+m    4 partition int32             16+k    8 commit timestamp int64 (wall ms)

The leader epoch is the committer's ``committed_leader_epoch`` (KIP-320): the epoch of the
leader that wrote the last record the consumer read, which a consumer resuming from this
offset uses to detect a truncated log (OffsetForLeaderEpoch). Tidelog always wrote value
version 3, but until issue #25 with the epoch forced to -1; such records read back as "no
epoch", which is what they are. Values are written as version 3 only; the older versions
Kafka wrote are also read, as Kafka reads them (no leader epoch in any of them)::

    version 0 and 2: offset int64, metadata string, commit timestamp int64
    version 1:       offset int64, metadata string, commit timestamp int64,
                     expire timestamp int64 (ignored: Kafka 2.1 dropped per-offset expiry)

The key's version doubles as the record type, as in Kafka: 1 is an offset commit; other
versions (Kafka's group metadata records, say) are not offset commits and readers skip
them. A *tombstone*, the key with a null value, deletes the committed offset (a deleted
group, or a deleted topic); compaction keeps only the latest record of each key and later
drops the tombstones, so the topic stays about as large as the set of live offsets.

A group's records all go to one partition, ``crc32(group id as UTF-8) % partitions`` (a
stable hash: Python's own ``hash`` of a string changes between processes).

Pure and thread-safe.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from tidelog.broker.groups.assignor import TopicPartition

__all__ = [
    "KEY_VERSION",
    "MAX_STRING_BYTES",
    "NO_LEADER_EPOCH",
    "VALUE_VERSION",
    "OffsetKey",
    "OffsetValue",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
    "partition_for",
]

KEY_VERSION = 1
VALUE_VERSION = 3
NO_LEADER_EPOCH = -1
MAX_STRING_BYTES = 0x7FFF  # an int16 length

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_VALUE_HEAD = struct.Struct(">hqi")  # version, offset, leader epoch
_INT64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class OffsetKey:
    """The key of an offset commit record."""

    group_id: str
    tp: TopicPartition


@dataclass(frozen=True, slots=True)
class OffsetValue:
    """A committed offset: the next offset to read, the client's metadata string, when it
    was committed (wall-clock ms) and the leader epoch of the last record the committer
    consumed (``NO_LEADER_EPOCH``: unknown)."""

    offset: int
    metadata: str
    commit_timestamp_ms: int
    leader_epoch: int = NO_LEADER_EPOCH


def partition_for(group_id: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition holding ``group_id``'s offsets."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    return zlib.crc32(group_id.encode("utf-8")) % partitions


def _string(text: str, what: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > MAX_STRING_BYTES:
        raise ValueError(f"{what} is {len(data)} bytes; the most is {MAX_STRING_BYTES}")
    return _INT16.pack(len(data)) + data


def _read_string(data: bytes, position: int, what: str) -> tuple[str, int]:
    if position + 2 > len(data):
        raise ValueError(f"offset record truncated before the {what} length")
    (length,) = _INT16.unpack_from(data, position)
    start = position + 2
    if length < 0 or start + length > len(data):
        raise ValueError(f"offset record has a bad {what} length {length}")
    try:
        return data[start : start + length].decode("utf-8"), start + length
    except UnicodeDecodeError:
        raise ValueError(f"offset record {what} is not UTF-8") from None


def encode_key(group_id: str, tp: TopicPartition) -> bytes:
    """The record key for ``group_id``'s offset of ``tp``.

    Raises ``ValueError`` for a group id or topic longer than 32767 UTF-8 bytes or a
    partition outside int32.
    """
    if not 0 <= tp.partition <= 0x7FFFFFFF:
        raise ValueError(f"partition {tp.partition} is not a non-negative int32")
    return b"".join(
        (
            _INT16.pack(KEY_VERSION),
            _string(group_id, "group id"),
            _string(tp.topic, "topic"),
            _INT32.pack(tp.partition),
        )
    )


def decode_key(data: bytes) -> OffsetKey | None:
    """The offset key in ``data``; None for a key of another record type (version).

    Raises ``ValueError`` for a truncated or malformed offset commit key.
    """
    if len(data) < 2:
        raise ValueError("offset record key shorter than its version")
    (version,) = _INT16.unpack_from(data, 0)
    if version not in (0, KEY_VERSION):  # Kafka writes offset commit keys as 0 or 1
        return None
    group_id, position = _read_string(data, 2, "group id")
    topic, position = _read_string(data, position, "topic")
    if position + 4 != len(data):
        raise ValueError("offset record key has a bad length")
    (partition,) = _INT32.unpack_from(data, position)
    return OffsetKey(group_id, TopicPartition(topic, partition))


def encode_value(value: OffsetValue) -> bytes:
    """The record value (version 3). Raises ``ValueError`` for out-of-range fields."""
    if not 0 <= value.offset < 2**63:
        raise ValueError(f"offset {value.offset} is not a non-negative int64")
    if not NO_LEADER_EPOCH <= value.leader_epoch <= 0x7FFFFFFF:
        raise ValueError(f"leader epoch {value.leader_epoch} is not -1 or a non-negative int32")
    return b"".join(
        (
            _VALUE_HEAD.pack(VALUE_VERSION, value.offset, value.leader_epoch),
            _string(value.metadata, "metadata"),
            _INT64.pack(value.commit_timestamp_ms),
        )
    )


def decode_value(data: bytes) -> OffsetValue:
    """Decode a value of version 0 to 3 (see the module; versions 0-2 have no leader
    epoch and read as ``NO_LEADER_EPOCH``). Raises ``ValueError`` for another version or
    bad bytes."""
    if len(data) < 2:
        raise ValueError("offset record value truncated")
    (version,) = _INT16.unpack_from(data, 0)
    if version == VALUE_VERSION:
        if len(data) < _VALUE_HEAD.size:
            raise ValueError("offset record value truncated")
        _, offset, leader_epoch = _VALUE_HEAD.unpack_from(data, 0)
        position = _VALUE_HEAD.size
    elif version in (0, 1, 2):
        if len(data) < 10:
            raise ValueError("offset record value truncated")
        (offset,) = _INT64.unpack_from(data, 2)
        leader_epoch, position = NO_LEADER_EPOCH, 10
    else:
        raise ValueError(f"offset record value version {version} is not supported")
    metadata, position = _read_string(data, position, "metadata")
    trailing = 16 if version == 1 else 8  # version 1 also has an expire timestamp
    if position + trailing != len(data):
        raise ValueError("offset record value has a bad length")
    (timestamp_ms,) = _INT64.unpack_from(data, position)
    return OffsetValue(offset, metadata, timestamp_ms, max(leader_epoch, NO_LEADER_EPOCH))
