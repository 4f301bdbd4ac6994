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

Other record types (issue #32) belong to the other group kinds and are kept by the store as
bytes (``offset_store``); ``SHARE_GROUP_METADATA_TYPE`` is the one the consumer-group side
reads: a group id with that record is a share group's, which no consumer group may use.

A group's records all go to one partition, ``crc32(group id as UTF-8) % partitions`` (a
stable hash: Python's own ``hash`` of a string changes between processes).

**Group metadata** (issue #27): a classic group's membership, Kafka's ``GroupMetadataKey``
(version 2, the record type) and ``GroupMetadataValue`` (``GroupMetadataValue.json``,
versions 0-4; 4 is flexible). One record per group, so compaction keeps the latest (its key
never equals an offset key: the version differs). Written as version 3, as Kafka does
(``MetadataVersion.groupMetadataValueVersion``: the highest non-flexible version); every
version 0-4 is read. A null string is a length of -1; bytes have an int32 length; an array
an int32 count::

    key: version int16 = 2, group string

    value (version 3)
        version int16 = 3
        protocol type string          ("consumer"; "" when the group never had one)
        generation int32
        protocol string, nullable     (the chosen assignor; null when Empty)
        leader string, nullable       (member id; null when Empty)
        current state timestamp int64 (wall ms of the last state change; -1 unknown; v2+)
        members int32 count, then per member:
            member id string
            group instance id string, nullable  (v3+; static membership, KIP-345)
            client id string
            client host string
            rebalance timeout int32             (v1+; v0 reads as the session timeout)
            session timeout int32
            subscription bytes                  (the metadata of the chosen protocol)
            assignment bytes                    (what the leader's SyncGroup gave it)

Version 4 has the same fields with compact strings, bytes and arrays (unsigned varint
length + 1, 0 for null) and an empty tagged-field section after the value and after each
member; unknown tagged fields are skipped when read. A tombstone (null value) deletes the
group (DeleteGroups).

Pure and thread-safe.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from tidelog.broker.groups.assignor import TopicPartition
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.varint import decode_unsigned_varint, encode_unsigned_varint

__all__ = [
    "GROUP_METADATA_KEY_VERSION",
    "GROUP_METADATA_VALUE_VERSION",
    "KEY_VERSION",
    "MAX_STRING_BYTES",
    "NO_LEADER_EPOCH",
    "SHARE_GROUP_METADATA_TYPE",
    "VALUE_VERSION",
    "GroupMemberMetadata",
    "GroupMetadataValue",
    "OffsetKey",
    "OffsetValue",
    "decode_group_key",
    "decode_group_value",
    "decode_key",
    "decode_value",
    "encode_group_key",
    "encode_group_value",
    "encode_key",
    "encode_value",
    "partition_for",
]

KEY_VERSION = 1
VALUE_VERSION = 3
NO_LEADER_EPOCH = -1
GROUP_METADATA_KEY_VERSION = 2
GROUP_METADATA_VALUE_VERSION = 3  # Kafka's: the highest non-flexible version
_FLEXIBLE_GROUP_VALUE_VERSION = 4
MAX_STRING_BYTES = 0x7FFF  # an int16 length
# Kafka's ShareGroupMetadataKey record type: the group id is a share group's (issue #32).
SHARE_GROUP_METADATA_TYPE = 11

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


# --- group metadata (classic groups) --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupMemberMetadata:
    """One member of a classic group as its group metadata record keeps it."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    """A classic group's state as of its last completed rebalance (or its emptying):
    Kafka's ``GroupMetadataValue``. ``protocol`` and ``leader`` are None for an empty
    group; ``current_state_timestamp_ms`` is wall-clock ms, -1 when unknown."""

    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int
    members: tuple[GroupMemberMetadata, ...]


def encode_group_key(group_id: str) -> bytes:
    """The group metadata record key of ``group_id``. Raises ``ValueError`` for a group
    id longer than 32767 UTF-8 bytes."""
    return _INT16.pack(GROUP_METADATA_KEY_VERSION) + _string(group_id, "group id")


def decode_group_key(data: bytes) -> str | None:
    """The group id of a group metadata key; None for a key of another record type.
    Raises ``ValueError`` for a truncated or malformed group metadata key."""
    if len(data) < 2:
        raise ValueError("offset record key shorter than its version")
    (version,) = _INT16.unpack_from(data, 0)
    if version != GROUP_METADATA_KEY_VERSION:
        return None
    group_id, position = _read_string(data, 2, "group id")
    if position != len(data):
        raise ValueError("group metadata key has a bad length")
    return group_id


class _Out:
    """Writes one group metadata value of a given version (see the module layout)."""

    def __init__(self, version: int) -> None:
        self.flexible = version >= _FLEXIBLE_GROUP_VALUE_VERSION
        self.parts: list[bytes] = [_INT16.pack(version)]

    def int32(self, value: int, what: str) -> None:
        if not -(2**31) <= value < 2**31:
            raise ValueError(f"group metadata {what} {value} is not an int32")
        self.parts.append(_INT32.pack(value))

    def int64(self, value: int, what: str) -> None:
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"group metadata {what} {value} is not an int64")
        self.parts.append(_INT64.pack(value))

    def length(self, length: int | None) -> None:
        """A string's, bytes' or array's length: None is null (-1, compact 0)."""
        if self.flexible:
            self.parts.append(encode_unsigned_varint(0 if length is None else length + 1))
        else:
            self.parts.append(_INT16.pack(-1 if length is None else length))

    def string(self, text: str | None, what: str) -> None:
        if text is None:
            self.length(None)
            return
        data = text.encode("utf-8")
        if len(data) > MAX_STRING_BYTES:
            raise ValueError(f"{what} is {len(data)} bytes; the most is {MAX_STRING_BYTES}")
        self.length(len(data))
        self.parts.append(data)

    def blob(self, data: bytes) -> None:
        if self.flexible:
            self.parts.append(encode_unsigned_varint(len(data) + 1))
        else:
            self.parts.append(_INT32.pack(len(data)))
        self.parts.append(data)

    def count(self, count: int) -> None:
        if self.flexible:
            self.parts.append(encode_unsigned_varint(count + 1))
        else:
            self.parts.append(_INT32.pack(count))

    def no_tagged_fields(self) -> None:
        if self.flexible:
            self.parts.append(b"\x00")


def encode_group_value(
    value: GroupMetadataValue, version: int = GROUP_METADATA_VALUE_VERSION
) -> bytes:
    """The record value of ``value`` in ``version`` (0-4; the broker writes 3). Fields a
    version lacks are left out (an older version drops the instance ids, the rebalance
    timeouts, the state timestamp).

    Raises ``ValueError`` for another version or a field out of its type's range."""
    if not 0 <= version <= _FLEXIBLE_GROUP_VALUE_VERSION:
        raise ValueError(f"group metadata value version {version} is not 0-4")
    out = _Out(version)
    out.string(value.protocol_type, "protocol type")
    out.int32(value.generation, "generation")
    out.string(value.protocol, "protocol")
    out.string(value.leader, "leader")
    if version >= 2:
        out.int64(value.current_state_timestamp_ms, "current state timestamp")
    out.count(len(value.members))
    for member in value.members:
        out.string(member.member_id, "member id")
        if version >= 3:
            out.string(member.group_instance_id, "group instance id")
        out.string(member.client_id, "client id")
        out.string(member.client_host, "client host")
        if version >= 1:
            out.int32(member.rebalance_timeout_ms, "rebalance timeout")
        out.int32(member.session_timeout_ms, "session timeout")
        out.blob(member.subscription)
        out.blob(member.assignment)
        out.no_tagged_fields()
    out.no_tagged_fields()
    return b"".join(out.parts)


class _In:
    """Reads one group metadata value; every malformation is a ``ValueError``."""

    def __init__(self, data: bytes, version: int) -> None:
        self.data = data
        self.position = 2
        self.flexible = version >= _FLEXIBLE_GROUP_VALUE_VERSION

    def _take(self, size: int, what: str) -> bytes:
        end = self.position + size
        if size < 0 or end > len(self.data):
            raise ValueError(f"group metadata value truncated in the {what}")
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def int32(self, what: str) -> int:
        value: int = _INT32.unpack(self._take(4, what))[0]
        return value

    def int64(self, what: str) -> int:
        value: int = _INT64.unpack(self._take(8, what))[0]
        return value

    def _uvarint(self, what: str) -> int:
        try:
            value, self.position = decode_unsigned_varint(self.data, self.position)
        except CorruptRecordError as exc:
            raise ValueError(f"group metadata value has a bad {what}: {exc}") from None
        return value

    def length(self, what: str, wide: bool = False) -> int | None:
        """A length or count; None for null."""
        if self.flexible:
            encoded = self._uvarint(what)
            return None if encoded == 0 else encoded - 1
        if wide:
            length = self.int32(what)
        else:
            (length,) = _INT16.unpack(self._take(2, what))
        return None if length < 0 else length

    def string(self, what: str) -> str | None:
        length = self.length(what)
        if length is None:
            return None
        try:
            return self._take(length, what).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"group metadata {what} is not UTF-8") from None

    def required(self, what: str) -> str:
        text = self.string(what)
        if text is None:
            raise ValueError(f"group metadata {what} is null")
        return text

    def blob(self, what: str) -> bytes:
        length = self.length(what, wide=True)
        if length is None:
            raise ValueError(f"group metadata {what} is null")
        return self._take(length, what)

    def skip_tagged_fields(self) -> None:
        if not self.flexible:
            return
        for _ in range(self._uvarint("tagged field count")):
            self._uvarint("tag")
            self._take(self._uvarint("tagged field size"), "tagged field")


def decode_group_value(data: bytes) -> GroupMetadataValue:
    """Decode a group metadata value of version 0 to 4 (see the module). Version 0's
    rebalance timeout reads as the session timeout, as Kafka reads it; versions before 2
    have no state timestamp (-1) and before 3 no instance ids (None).

    Raises ``ValueError`` for another version or bad bytes."""
    if len(data) < 2:
        raise ValueError("group metadata value truncated")
    (version,) = _INT16.unpack_from(data, 0)
    if not 0 <= version <= _FLEXIBLE_GROUP_VALUE_VERSION:
        raise ValueError(f"group metadata value version {version} is not supported")
    reader = _In(data, version)
    protocol_type = reader.required("protocol type")
    generation = reader.int32("generation")
    protocol = reader.string("protocol")
    leader = reader.string("leader")
    timestamp_ms = reader.int64("current state timestamp") if version >= 2 else -1
    count = reader.length("member count", wide=True)
    members = []
    for _ in range(count or 0):
        member_id = reader.required("member id")
        instance_id = reader.string("group instance id") if version >= 3 else None
        client_id = reader.required("client id")
        client_host = reader.required("client host")
        rebalance_timeout_ms = reader.int32("rebalance timeout") if version >= 1 else None
        session_timeout_ms = reader.int32("session timeout")
        subscription = reader.blob("subscription")
        assignment = reader.blob("assignment")
        reader.skip_tagged_fields()
        members.append(
            GroupMemberMetadata(
                member_id,
                instance_id,
                client_id,
                client_host,
                session_timeout_ms if rebalance_timeout_ms is None else rebalance_timeout_ms,
                session_timeout_ms,
                subscription,
                assignment,
            )
        )
    reader.skip_tagged_fields()
    if reader.position != len(data):
        raise ValueError("group metadata value has trailing bytes")
    return GroupMetadataValue(
        protocol_type, generation, protocol, leader, timestamp_ms, tuple(members)
    )
