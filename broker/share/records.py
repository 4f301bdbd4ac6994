"""The record format of the ``__share_group_state`` topic (KIP-932), and its merge rule.

Each share partition (group, topic, partition) has two kinds of record, keyed as Kafka's
share coordinator keys them: a **snapshot** (the whole durable state: start offset and
every state batch) and **updates** (the state batches that changed, and the start offset
when it moved), each update applying on top of the snapshot and the updates before it
(``merge``). Laid out after Kafka's ``ShareSnapshotKey``/``ShareSnapshotValue`` (record
type 0) and ``ShareUpdateKey``/``ShareUpdateValue`` (record type 1), version 0, so Kafka's
tools can read the topic. Integers are big-endian.

Key (record type 0 or 1, then version 0 of the key, not flexible)::

    record type int16 (0 snapshot, 1 update)
    group id: int16 byte length + UTF-8, topic id: 16 bytes (UUID), partition int32

Snapshot value (version 0, flexible)::

    version int16 = 0
    snapshot epoch int32, state epoch int32, leader epoch int32, start offset int64,
    create timestamp ms int64, write timestamp ms int64,
    state batches: compact array (unsigned varint count + 1) of
        {first offset int64, last offset int64, delivery state int8, delivery count int16,
         tagged fields (none: varint 0)}
    tagged fields (none written; any read is skipped)

Update value (version 0, flexible)::

    version int16 = 0
    snapshot epoch int32, leader epoch int32, start offset int64 (-1: unchanged),
    state batches (as the snapshot's), tagged fields (Kafka 4.2 adds tag 0,
    DeliveryCompleteCount: skipped when read, never written)

Delivery states, as Kafka persists them: 0 Available, 2 Acknowledged, 4 Archived (an
acquired record is persisted as Available: its lock dies with the leader); and two of
Tidelog's own (Kafka 4.1 has no dead-letter topic; ``broker.share.dead_letter``): 16 to be
dead-lettered, rejected, and 17 to be dead-lettered, delivery limit reached. A record in
either is durably out of delivery but not done: a transaction copies it to the group's
dead-letter topic and archives it (4) at once. The ids stay clear of Kafka's (its byte
may gain states between 5 and 15). A record that
cannot be read raises ``CorruptRecordError`` naming what is wrong (a cut record too): a
loading share coordinator must not guess.

A share partition's records all go to one partition of the topic,
``crc32("group:topic-id:partition") % partitions`` (Kafka hashes the same key string; only
the broker must agree with itself).

Pure and thread-safe.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.varint import decode_unsigned_varint, encode_unsigned_varint

__all__ = [
    "ACKNOWLEDGED",
    "ARCHIVED",
    "AVAILABLE",
    "DEAD_LETTER_LIMIT",
    "DEAD_LETTER_REJECTED",
    "DEAD_LETTER_STATES",
    "SNAPSHOT",
    "UPDATE",
    "ShareSnapshot",
    "ShareStateKey",
    "ShareUpdate",
    "StateBatch",
    "apply_update",
    "coalesce",
    "decode_key",
    "decode_snapshot",
    "decode_update",
    "encode_key",
    "encode_snapshot",
    "encode_update",
    "merge",
    "partition_for",
]

SNAPSHOT = 0  # record type of ShareSnapshotKey/Value
UPDATE = 1  # record type of ShareUpdateKey/Value
VALUE_VERSION = 0

# Persisted delivery states (Kafka's RecordState ids; 1, Acquired, is never persisted).
AVAILABLE = 0
ACKNOWLEDGED = 2
ARCHIVED = 4
# Tidelog's own (module docstring): to be dead-lettered, and why.
DEAD_LETTER_REJECTED = 16
DEAD_LETTER_LIMIT = 17
DEAD_LETTER_STATES = (DEAD_LETTER_REJECTED, DEAD_LETTER_LIMIT)
_PERSISTED_STATES = (AVAILABLE, ACKNOWLEDGED, ARCHIVED, *DEAD_LETTER_STATES)

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_BATCH = struct.Struct(">qqbh")  # first offset, last offset, delivery state, delivery count
_SNAPSHOT_HEAD = struct.Struct(">hiiiqqq")
_UPDATE_HEAD = struct.Struct(">hiiq")


@dataclass(frozen=True, slots=True, order=True)
class ShareStateKey:
    """Which share partition a record is about."""

    group_id: str
    topic_id: uuid.UUID
    partition: int


@dataclass(frozen=True, slots=True)
class StateBatch:
    """Offsets ``first_offset``..``last_offset`` (inclusive) in one persisted state with
    one delivery count (Kafka's ``PersisterStateBatch``)."""

    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int

    def __post_init__(self) -> None:
        if self.first_offset < 0 or self.last_offset < self.first_offset:
            raise ValueError(f"bad state batch offsets {self.first_offset}..{self.last_offset}")
        if self.delivery_state not in _PERSISTED_STATES:
            raise ValueError(f"delivery state {self.delivery_state} is not 0, 2, 4, 16 or 17")
        if not 0 <= self.delivery_count <= 0x7FFF:
            raise ValueError(f"delivery count {self.delivery_count} out of range")


@dataclass(frozen=True, slots=True)
class ShareSnapshot:
    """A share partition's whole durable state (what a snapshot record holds, and what a
    reload of the topic rebuilds). ``batches`` are sorted, disjoint, at or above
    ``start_offset``."""

    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    create_timestamp_ms: int
    write_timestamp_ms: int
    batches: tuple[StateBatch, ...]


@dataclass(frozen=True, slots=True)
class ShareUpdate:
    """What changed (an update record): the batches rewritten, and the start offset when it
    moved (-1: unchanged). Later batches win where they overlap earlier ones."""

    snapshot_epoch: int
    leader_epoch: int
    start_offset: int
    batches: tuple[StateBatch, ...]


def partition_for(key: ShareStateKey, partitions: int) -> int:
    """The ``__share_group_state`` partition holding ``key``'s records."""
    text = f"{key.group_id}:{key.topic_id}:{key.partition}"
    return zlib.crc32(text.encode()) % partitions


def encode_key(record_type: int, key: ShareStateKey) -> bytes:
    """The record key of ``key`` for a snapshot (``SNAPSHOT``) or update (``UPDATE``)
    record. Raises ``ValueError`` for another type or a group id past 32,767 bytes."""
    if record_type not in (SNAPSHOT, UPDATE):
        raise ValueError(f"record type {record_type} is not 0 or 1")
    raw = key.group_id.encode()
    if len(raw) > 0x7FFF:
        raise ValueError("a group id is at most 32,767 bytes of UTF-8")
    return (
        _INT16.pack(record_type)
        + _INT16.pack(len(raw))
        + raw
        + key.topic_id.bytes
        + _INT32.pack(key.partition)
    )


def decode_key(data: bytes) -> tuple[int, ShareStateKey]:
    """``(record type, key)`` of a record key. Raises ``CorruptRecordError`` (a type other
    than 0 or 1 included: Kafka's coordinator ignores those, the caller decides)."""
    reader = _Reader(data, "share state key")
    record_type = reader.int16()
    if record_type not in (SNAPSHOT, UPDATE):
        raise CorruptRecordError(f"share state key of record type {record_type}")
    group_id = reader.string()
    topic_id = uuid.UUID(bytes=reader.take(16))
    partition = reader.int32()
    reader.done()
    return record_type, ShareStateKey(group_id, topic_id, partition)


def encode_snapshot(value: ShareSnapshot) -> bytes:
    """The snapshot record value (version 0) of ``value``."""
    head = _SNAPSHOT_HEAD.pack(
        VALUE_VERSION,
        value.snapshot_epoch,
        value.state_epoch,
        value.leader_epoch,
        value.start_offset,
        value.create_timestamp_ms,
        value.write_timestamp_ms,
    )
    return head + _encode_batches(value.batches) + encode_unsigned_varint(0)


def decode_snapshot(data: bytes) -> ShareSnapshot:
    """A snapshot record value. Raises ``CorruptRecordError``."""
    reader = _Reader(data, "share snapshot value")
    version, snapshot_epoch, state_epoch, leader_epoch, start, created, written = reader.unpack(
        _SNAPSHOT_HEAD
    )
    if version != VALUE_VERSION:
        raise CorruptRecordError(f"share snapshot value version {version} is not 0")
    batches = reader.batches()
    reader.tags()
    reader.done()
    return ShareSnapshot(
        snapshot_epoch, state_epoch, leader_epoch, start, created, written, batches
    )


def encode_update(value: ShareUpdate) -> bytes:
    """The update record value (version 0) of ``value``."""
    head = _UPDATE_HEAD.pack(
        VALUE_VERSION, value.snapshot_epoch, value.leader_epoch, value.start_offset
    )
    return head + _encode_batches(value.batches) + encode_unsigned_varint(0)


def decode_update(data: bytes) -> ShareUpdate:
    """An update record value. Raises ``CorruptRecordError``."""
    reader = _Reader(data, "share update value")
    version, snapshot_epoch, leader_epoch, start = reader.unpack(_UPDATE_HEAD)
    if version != VALUE_VERSION:
        raise CorruptRecordError(f"share update value version {version} is not 0")
    batches = reader.batches()
    reader.tags()
    reader.done()
    return ShareUpdate(snapshot_epoch, leader_epoch, start, batches)


def merge(
    older: Iterable[StateBatch], newer: Iterable[StateBatch], start_offset: int
) -> tuple[StateBatch, ...]:
    """``older`` overlaid with ``newer`` (newer wins on every offset both cover), cut
    below ``start_offset``, as sorted disjoint batches with neighbours of equal state and
    count joined. The rule a reload applies to every update, and a snapshot is written
    from."""
    pieces: list[StateBatch] = []
    for batch in older:
        pieces.extend(_cut(batch, start_offset))
    for batch in newer:
        kept: list[StateBatch] = []
        for old in pieces:
            kept.extend(_subtract(old, batch))
        kept.extend(_cut(batch, start_offset))
        pieces = kept
    pieces.sort(key=lambda b: b.first_offset)
    return _join(pieces)


def apply_update(snapshot: ShareSnapshot, update: ShareUpdate) -> ShareSnapshot:
    """``snapshot`` with ``update`` applied: the start offset moves forward (never back),
    batches merge (``merge``), the leader epoch is the larger."""
    start = snapshot.start_offset
    if update.start_offset >= 0:
        start = max(start, update.start_offset)
    return ShareSnapshot(
        snapshot.snapshot_epoch,
        snapshot.state_epoch,
        max(snapshot.leader_epoch, update.leader_epoch),
        start,
        snapshot.create_timestamp_ms,
        snapshot.write_timestamp_ms,
        merge(snapshot.batches, update.batches, start),
    )


def _cut(batch: StateBatch, start_offset: int) -> list[StateBatch]:
    if batch.last_offset < start_offset:
        return []
    if batch.first_offset >= start_offset:
        return [batch]
    return [StateBatch(start_offset, batch.last_offset, batch.delivery_state, batch.delivery_count)]


def _subtract(old: StateBatch, new: StateBatch) -> list[StateBatch]:
    """The parts of ``old`` that ``new`` does not cover."""
    if new.last_offset < old.first_offset or new.first_offset > old.last_offset:
        return [old]
    out: list[StateBatch] = []
    if old.first_offset < new.first_offset:
        out.append(
            StateBatch(
                old.first_offset, new.first_offset - 1, old.delivery_state, old.delivery_count
            )
        )
    if old.last_offset > new.last_offset:
        out.append(
            StateBatch(new.last_offset + 1, old.last_offset, old.delivery_state, old.delivery_count)
        )
    return out


def coalesce(batches: Sequence[StateBatch]) -> tuple[StateBatch, ...]:
    """Sorted disjoint ``batches`` with neighbours of equal state and count joined."""
    return _join(batches)


def _join(batches: Sequence[StateBatch]) -> tuple[StateBatch, ...]:
    out: list[StateBatch] = []
    for batch in batches:
        last = out[-1] if out else None
        if (
            last is not None
            and last.last_offset + 1 == batch.first_offset
            and (last.delivery_state, last.delivery_count)
            == (batch.delivery_state, batch.delivery_count)
        ):
            out[-1] = StateBatch(
                last.first_offset, batch.last_offset, last.delivery_state, last.delivery_count
            )
        else:
            out.append(batch)
    return tuple(out)


def _encode_batches(batches: Sequence[StateBatch]) -> bytes:
    out = bytearray(encode_unsigned_varint(len(batches) + 1))
    for b in batches:
        out += _BATCH.pack(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
        out += encode_unsigned_varint(0)  # the batch's tagged fields
    return bytes(out)


class _Reader:
    """A cursor over one record's bytes; every read checks the bounds."""

    def __init__(self, data: bytes, what: str) -> None:
        self._data = data
        self._position = 0
        self._what = what

    def take(self, size: int) -> bytes:
        end = self._position + size
        if size < 0 or end > len(self._data):
            raise CorruptRecordError(f"{self._what} ends early (at byte {self._position})")
        chunk = self._data[self._position : end]
        self._position = end
        return chunk

    def unpack(self, shape: struct.Struct) -> tuple[int, ...]:
        return tuple(int(v) for v in shape.unpack(self.take(shape.size)))

    def int16(self) -> int:
        return self.unpack(_INT16)[0]

    def int32(self) -> int:
        return self.unpack(_INT32)[0]

    def uvarint(self) -> int:
        value, self._position = decode_unsigned_varint(self._data, self._position)
        return value

    def string(self) -> str:
        size = self.int16()
        if size < 0:
            raise CorruptRecordError(f"{self._what}: a null string")
        try:
            return self.take(size).decode()
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"{self._what}: a string is not UTF-8") from exc

    def batches(self) -> tuple[StateBatch, ...]:
        count = self.uvarint() - 1
        if count < 0:
            raise CorruptRecordError(f"{self._what}: null state batches")
        out: list[StateBatch] = []
        for _ in range(count):
            first, last, state, delivered = self.unpack(_BATCH)
            self.tags()
            try:
                out.append(StateBatch(first, last, state, delivered))
            except ValueError as exc:
                raise CorruptRecordError(f"{self._what}: {exc}") from exc
        return tuple(out)

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())

    def done(self) -> None:
        if self._position != len(self._data):
            raise CorruptRecordError(
                f"{self._what}: {len(self._data) - self._position} bytes after the last field"
            )
