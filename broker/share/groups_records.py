"""The share groups' records in ``__consumer_offsets``: membership, assignments, settings.

A share group's state is a handful of records in its partition of the offsets topic
(``partition_for`` of ``broker.groups.offset_records``), stored and reloaded by the offset
store as records of another group kind (``OffsetStore.write_records``): compaction keeps the
latest of each key, a tombstone (null value) deletes it. Record types as Kafka's
``ShareGroup*`` coordinator records (KIP-932), Tidelog's own for the group configs::

    type  key                      value (what it holds)
      10  group, member id         ShareGroupMemberMetadataValue: rack id, client id,
                                   client host, subscribed topic names
      11  group                    ShareGroupMetadataValue: group epoch, and the partition
                                   counts of the subscribed topics the target was made for
      12  group                    ShareGroupTargetAssignmentMetadataValue: assignment epoch
      13  group, member id         ShareGroupTargetAssignmentMemberValue: target partitions
      14  group, member id         ShareGroupCurrentMemberAssignmentValue: member epoch,
                                   previous member epoch, state, assigned partitions
    1000  group                    GroupConfigValue (Tidelog's): the group's configs

Keys are not flexible (as Kafka's): ``type int16``, ``group string``, then for the member
records ``member id string``, a string being an int16 byte length and UTF-8. Values are
flexible, version 0 (the only one), as Kafka's: ``version int16``, then the fields, with
compact strings (unsigned varint byte length + 1, 0 for null), compact arrays (unsigned
varint count + 1) and a tagged-field section (an unsigned varint count, 0 when written;
unknown tags are skipped when read) after the value and after each array element::

    10  rack id compact nullable string, client id, client host, topics [string]
    11  epoch int32, topics [{name string, partitions int32, tags}]
    12  assignment epoch int32
    13  partitions [{topic string, partitions [int32], tags}]
    14  member epoch int32, previous member epoch int32, state int8 (0: stable),
        partitions [{topic string, partitions [int32], tags}]
  1000  configs [{name string, value string, tags}]

Differences from Kafka's layout: Tidelog has no topic ids, so a topic name (compact string)
stands where Kafka writes a topic id (uuid); record 11 keeps the partition counts where
Kafka 4.1 keeps a hash of the subscribed topics' metadata (the counts are what a change is
detected by, and they are small). Record 1000 has no Kafka counterpart: Kafka keeps group
configs in its metadata log (ConfigRecord, resource type GROUP).

Every decoder raises ``ValueError`` for a truncated or malformed record (a record cut
anywhere is refused, never half-read). Pure and thread-safe.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tidelog.broker.groups.offset_records import MAX_STRING_BYTES, SHARE_GROUP_METADATA_TYPE
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.types import TopicPartition
from tidelog.storage.varint import decode_unsigned_varint, encode_unsigned_varint

__all__ = [
    "CONFIG_TYPE",
    "CURRENT_ASSIGNMENT_TYPE",
    "GROUP_METADATA_TYPE",
    "MEMBER_METADATA_TYPE",
    "MEMBER_TYPES",
    "TARGET_MEMBER_TYPE",
    "TARGET_METADATA_TYPE",
    "CurrentAssignmentValue",
    "GroupMetadataValue",
    "MemberMetadataValue",
    "RecordKey",
    "decode_configs",
    "decode_current",
    "decode_group_metadata",
    "decode_key",
    "decode_member_metadata",
    "decode_partitions",
    "decode_target_epoch",
    "encode_configs",
    "encode_current",
    "encode_group_metadata",
    "encode_key",
    "encode_member_metadata",
    "encode_partitions",
    "encode_target_epoch",
]

MEMBER_METADATA_TYPE = 10
GROUP_METADATA_TYPE = SHARE_GROUP_METADATA_TYPE  # 11
TARGET_METADATA_TYPE = 12
TARGET_MEMBER_TYPE = 13
CURRENT_ASSIGNMENT_TYPE = 14
CONFIG_TYPE = 1000
MEMBER_TYPES = frozenset({MEMBER_METADATA_TYPE, TARGET_MEMBER_TYPE, CURRENT_ASSIGNMENT_TYPE})
_GROUP_TYPES = frozenset({GROUP_METADATA_TYPE, TARGET_METADATA_TYPE, CONFIG_TYPE})
VALUE_VERSION = 0
STABLE_STATE = 0  # Kafka's MemberState.STABLE: a share member never waits on a revocation

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class RecordKey:
    """A share record's key: its type, the group, and the member for member records
    ("" for the group's own records)."""

    record_type: int
    group_id: str
    member_id: str = ""


@dataclass(frozen=True, slots=True)
class MemberMetadataValue:
    """Record 10: who a member is and what it subscribes to."""

    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topics: frozenset[str]


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    """Record 11: the group epoch, and the partition counts of the subscribed topics that
    the target assignment was computed with."""

    epoch: int
    topic_counts: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class CurrentAssignmentValue:
    """Record 14: a member's epoch (and the one before, for a lost answer) and the
    partitions it was given."""

    member_epoch: int
    previous_member_epoch: int
    assigned: frozenset[TopicPartition]


# --- keys -------------------------------------------------------------------------------------


def _key_string(text: str, what: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > MAX_STRING_BYTES:
        raise ValueError(f"{what} is {len(data)} bytes; the most is {MAX_STRING_BYTES}")
    return _INT16.pack(len(data)) + data


def encode_key(key: RecordKey) -> bytes:
    """A share record's key bytes. Raises ``ValueError`` for an unknown type, a member id
    missing from (or given to) the wrong type, or a string too long."""
    if key.record_type in MEMBER_TYPES:
        if not key.member_id:
            raise ValueError(f"record type {key.record_type} needs a member id")
        tail = _key_string(key.member_id, "member id")
    elif key.record_type in _GROUP_TYPES:
        if key.member_id:
            raise ValueError(f"record type {key.record_type} has no member id")
        tail = b""
    else:
        raise ValueError(f"{key.record_type} is not a share group record type")
    return _INT16.pack(key.record_type) + _key_string(key.group_id, "group id") + tail


def decode_key(data: bytes) -> RecordKey | None:
    """The key in ``data``; None for a key of a type that is not a share record's.
    Raises ``ValueError`` for a share record key that is cut or malformed."""
    if len(data) < 2:
        raise ValueError("record key shorter than its type")
    (record_type,) = _INT16.unpack_from(data, 0)
    if record_type not in MEMBER_TYPES and record_type not in _GROUP_TYPES:
        return None
    reader = _Reader(data, 2, flexible=False)
    group_id = reader.string("group id")
    member_id = reader.string("member id") if record_type in MEMBER_TYPES else ""
    if group_id is None or member_id is None:
        raise ValueError("share record key has a null string")
    reader.done()
    return RecordKey(record_type, group_id, member_id)


# --- values -----------------------------------------------------------------------------------


class _Writer:
    """Writes one flexible value (module layout)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = [_INT16.pack(VALUE_VERSION)]

    def int8(self, value: int) -> None:
        self.parts.append(_INT8.pack(value))

    def int32(self, value: int, what: str) -> None:
        if not -(2**31) <= value < 2**31:
            raise ValueError(f"{what} {value} is not an int32")
        self.parts.append(_INT32.pack(value))

    def count(self, count: int) -> None:
        self.parts.append(encode_unsigned_varint(count + 1))

    def string(self, text: str | None, what: str) -> None:
        if text is None:
            self.parts.append(b"\x00")
            return
        data = text.encode("utf-8")
        if len(data) > MAX_STRING_BYTES:
            raise ValueError(f"{what} is {len(data)} bytes; the most is {MAX_STRING_BYTES}")
        self.count(len(data))
        self.parts.append(data)

    def no_tags(self) -> None:
        self.parts.append(b"\x00")

    def partitions(self, tps: Iterable[TopicPartition]) -> None:
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        self.count(len(by_topic))
        for topic in sorted(by_topic):
            self.string(topic, "topic")
            numbers = sorted(by_topic[topic])
            self.count(len(numbers))
            for number in numbers:
                self.int32(number, "partition")
            self.no_tags()

    def finish(self) -> bytes:
        self.no_tags()
        return b"".join(self.parts)


class _Reader:
    """Reads one record (a key, not flexible, or a flexible value); every malformation is
    a ``ValueError``."""

    def __init__(self, data: bytes, position: int, *, flexible: bool = True) -> None:
        self.data = data
        self.position = position
        self.flexible = flexible

    def _take(self, size: int, what: str) -> bytes:
        end = self.position + size
        if size < 0 or end > len(self.data):
            raise ValueError(f"share record cut in its {what}")
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def int8(self, what: str) -> int:
        value: int = _INT8.unpack(self._take(1, what))[0]
        return value

    def int32(self, what: str) -> int:
        value: int = _INT32.unpack(self._take(4, what))[0]
        return value

    def uvarint(self, what: str) -> int:
        try:
            value, self.position = decode_unsigned_varint(self.data, self.position)
        except CorruptRecordError as exc:
            raise ValueError(f"share record has a bad {what}: {exc}") from None
        return value

    def count(self, what: str) -> int:
        encoded = self.uvarint(what)
        if encoded == 0:
            raise ValueError(f"share record has a null {what}")
        return encoded - 1

    def string(self, what: str) -> str | None:
        if self.flexible:
            encoded = self.uvarint(what)
            length = None if encoded == 0 else encoded - 1
        else:
            (raw,) = _INT16.unpack(self._take(2, what))
            length = None if raw < 0 else raw
        if length is None:
            return None
        try:
            return self._take(length, what).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"share record {what} is not UTF-8") from None

    def required(self, what: str) -> str:
        text = self.string(what)
        if text is None:
            raise ValueError(f"share record {what} is null")
        return text

    def skip_tags(self) -> None:
        for _ in range(self.uvarint("tagged field count")):
            self.uvarint("tag")
            self._take(self.uvarint("tagged field size"), "tagged field")

    def partitions(self) -> frozenset[TopicPartition]:
        out: set[TopicPartition] = set()
        for _ in range(self.count("topic count")):
            topic = self.required("topic")
            for _ in range(self.count("partition count")):
                out.add(TopicPartition(topic, self.int32("partition")))
            self.skip_tags()
        return frozenset(out)

    def done(self) -> None:
        if self.flexible:
            self.skip_tags()
        if self.position != len(self.data):
            raise ValueError("share record has trailing bytes")


def _value_reader(data: bytes) -> _Reader:
    if len(data) < 2:
        raise ValueError("share record value cut before its version")
    (version,) = _INT16.unpack_from(data, 0)
    if version != VALUE_VERSION:
        raise ValueError(f"share record value version {version} is not supported")
    return _Reader(data, 2)


def encode_member_metadata(value: MemberMetadataValue) -> bytes:
    """Record 10's value. Raises ``ValueError`` for a string too long."""
    out = _Writer()
    out.string(value.rack_id, "rack id")
    out.string(value.client_id, "client id")
    out.string(value.client_host, "client host")
    topics = sorted(value.subscribed_topics)
    out.count(len(topics))
    for topic in topics:
        out.string(topic, "topic")
    return out.finish()


def decode_member_metadata(data: bytes) -> MemberMetadataValue:
    """Record 10's value. Raises ``ValueError``."""
    reader = _value_reader(data)
    rack_id = reader.string("rack id")
    client_id = reader.required("client id")
    client_host = reader.required("client host")
    topics = frozenset(reader.required("topic") for _ in range(reader.count("topic count")))
    reader.done()
    return MemberMetadataValue(rack_id, client_id, client_host, topics)


def encode_group_metadata(value: GroupMetadataValue) -> bytes:
    """Record 11's value. Raises ``ValueError`` for a field out of range."""
    out = _Writer()
    out.int32(value.epoch, "group epoch")
    out.count(len(value.topic_counts))
    for topic in sorted(value.topic_counts):
        out.string(topic, "topic")
        out.int32(value.topic_counts[topic], "partition count")
        out.no_tags()
    return out.finish()


def decode_group_metadata(data: bytes) -> GroupMetadataValue:
    """Record 11's value. Raises ``ValueError``."""
    reader = _value_reader(data)
    epoch = reader.int32("group epoch")
    counts: dict[str, int] = {}
    for _ in range(reader.count("topic count")):
        topic = reader.required("topic")
        counts[topic] = reader.int32("partition count")
        reader.skip_tags()
    reader.done()
    return GroupMetadataValue(epoch, counts)


def encode_target_epoch(epoch: int) -> bytes:
    """Record 12's value. Raises ``ValueError`` for an epoch outside int32."""
    out = _Writer()
    out.int32(epoch, "assignment epoch")
    return out.finish()


def decode_target_epoch(data: bytes) -> int:
    """Record 12's value. Raises ``ValueError``."""
    reader = _value_reader(data)
    epoch = reader.int32("assignment epoch")
    reader.done()
    return epoch


def encode_partitions(partitions: Iterable[TopicPartition]) -> bytes:
    """Record 13's value. Raises ``ValueError`` for a partition outside int32."""
    out = _Writer()
    out.partitions(partitions)
    return out.finish()


def decode_partitions(data: bytes) -> frozenset[TopicPartition]:
    """Record 13's value. Raises ``ValueError``."""
    reader = _value_reader(data)
    partitions = reader.partitions()
    reader.done()
    return partitions


def encode_current(value: CurrentAssignmentValue) -> bytes:
    """Record 14's value (state: stable). Raises ``ValueError`` for a field out of range."""
    out = _Writer()
    out.int32(value.member_epoch, "member epoch")
    out.int32(value.previous_member_epoch, "previous member epoch")
    out.int8(STABLE_STATE)
    out.partitions(value.assigned)
    return out.finish()


def decode_current(data: bytes) -> CurrentAssignmentValue:
    """Record 14's value; any member state is read (a share member is always stable).
    Raises ``ValueError``."""
    reader = _value_reader(data)
    epoch = reader.int32("member epoch")
    previous = reader.int32("previous member epoch")
    reader.int8("member state")
    assigned = reader.partitions()
    reader.done()
    return CurrentAssignmentValue(epoch, previous, assigned)


def encode_configs(configs: Mapping[str, str]) -> bytes:
    """Record 1000's value. Raises ``ValueError`` for a string too long."""
    out = _Writer()
    out.count(len(configs))
    for name in sorted(configs):
        out.string(name, "config name")
        out.string(configs[name], "config value")
        out.no_tags()
    return out.finish()


def decode_configs(data: bytes) -> dict[str, str]:
    """Record 1000's value. Raises ``ValueError``."""
    reader = _value_reader(data)
    configs: dict[str, str] = {}
    for _ in range(reader.count("config count")):
        name = reader.required("config name")
        configs[name] = reader.required("config value")
        reader.skip_tags()
    reader.done()
    return configs
