"""The record format of the ``__transaction_state`` topic, and which partition an id uses.

One record per transactional id, rewritten at every transition of its transaction
(``broker.transactions.state``); compaction keeps the latest. Laid out after Kafka's
``TransactionLogKey`` version 0 and ``TransactionLogValue`` versions 0 and 1
(``reference/transactions.md`` 2.2), so Kafka's own tools can read the topic. Integers are
big-endian.

Key (version 0, not flexible)::

    version int16 = 0, transactional id: int16 byte length + UTF-8

Value, version 1 (flexible; what Tidelog writes)::

    version int16 = 1
    producer id int64, producer epoch int16, transaction timeout ms int32, state int8
    partitions: compact nullable array (unsigned varint length + 1, 0 = null) of
        {topic: compact string (unsigned varint length + 1, UTF-8),
         partition ids: compact array of int32, tagged fields (none: varint 0)}
    last update timestamp ms int64, start timestamp ms int64 (-1: no transaction)
    tagged fields: 0 previous producer id int64, 1 next producer id int64,
                   2 client transaction version int16 (each written only when not its
                   default: -1, -1, 0)

Version 0 (read, never written) is the same without flexibility: strings with int16
lengths, arrays with int32 lengths (-1 = null), and no tagged fields. Version 1 is always
written because transactions v2 (KIP-890) needs the previous and next producer ids, which
only its tagged fields carry; Kafka writes it too once ``transaction.version`` >= 1.

The partitions are null exactly when the state is Empty (as Kafka writes them); a
*tombstone* (the key with a null value) is an expired id. A record that cannot be read
raises ``CorruptRecordError`` naming what is wrong: a loading coordinator must not guess.

An id's records all go to one partition, ``crc32(id as UTF-8) % partitions`` (Kafka uses
Java's ``String.hashCode``; clients never compute it, they ask FindCoordinator, so only
the broker must be consistent with itself, and ``broker.groups.offset_records`` already
uses crc32 for groups).

Pure and thread-safe.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.varint import decode_unsigned_varint, encode_unsigned_varint

__all__ = [
    "KEY_VERSION",
    "VALUE_VERSION",
    "TxnLogValue",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
    "partition_for",
]

KEY_VERSION = 0
VALUE_VERSION = 1

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_HEAD = struct.Struct(">hqhib")  # version, producer id, epoch, timeout, state
_TIMES = struct.Struct(">qq")  # last update, start

_TAG_PREVIOUS_PRODUCER_ID = 0
_TAG_NEXT_PRODUCER_ID = 1
_TAG_CLIENT_VERSION = 2


@dataclass(frozen=True, slots=True)
class TxnLogValue:
    """The stored fields of one transactional id's state (the value of its record)."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: int  # ``TxnState``'s number
    partitions: frozenset[tuple[str, int]] | None  # None only in the Empty state
    last_update_ms: int
    start_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_version: int = 0


def partition_for(transactional_id: str, partitions: int) -> int:
    """The ``__transaction_state`` partition that coordinates ``transactional_id``."""
    return zlib.crc32(transactional_id.encode()) % partitions


def encode_key(transactional_id: str) -> bytes:
    """The record key of ``transactional_id``. Raises ``ValueError`` past 32,767 bytes."""
    raw = transactional_id.encode()
    if len(raw) > 0x7FFF:
        raise ValueError("a transactional id is at most 32,767 bytes of UTF-8")
    return _INT16.pack(KEY_VERSION) + _INT16.pack(len(raw)) + raw


def decode_key(data: bytes) -> str:
    """The transactional id of a record key. Raises ``CorruptRecordError``."""
    reader = _Reader(data, "transaction state key")
    version = reader.int16()
    if version != KEY_VERSION:
        raise CorruptRecordError(f"transaction state key version {version} is not 0")
    transactional_id = reader.string(flexible=False)
    reader.done()
    return transactional_id


def encode_value(value: TxnLogValue) -> bytes:
    """The record value (version 1) of ``value``."""
    out = bytearray(
        _HEAD.pack(
            VALUE_VERSION, value.producer_id, value.producer_epoch, value.timeout_ms, value.state
        )
    )
    if value.partitions is None:
        out += encode_unsigned_varint(0)
    else:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(value.partitions):
            by_topic.setdefault(topic, []).append(partition)
        out += encode_unsigned_varint(len(by_topic) + 1)
        for topic, ids in by_topic.items():
            raw = topic.encode()
            out += encode_unsigned_varint(len(raw) + 1) + raw
            out += encode_unsigned_varint(len(ids) + 1)
            out += b"".join(_INT32.pack(p) for p in ids)
            out += encode_unsigned_varint(0)  # the entry's tagged fields
    out += _TIMES.pack(value.last_update_ms, value.start_ms)
    tags: list[tuple[int, bytes]] = []
    if value.previous_producer_id != -1:
        tags.append((_TAG_PREVIOUS_PRODUCER_ID, _INT64.pack(value.previous_producer_id)))
    if value.next_producer_id != -1:
        tags.append((_TAG_NEXT_PRODUCER_ID, _INT64.pack(value.next_producer_id)))
    if value.client_version != 0:
        tags.append((_TAG_CLIENT_VERSION, _INT16.pack(value.client_version)))
    out += encode_unsigned_varint(len(tags))
    for tag, data in tags:
        out += encode_unsigned_varint(tag) + encode_unsigned_varint(len(data)) + data
    return bytes(out)


def decode_value(data: bytes) -> TxnLogValue:
    """A record value of version 0 or 1. Raises ``CorruptRecordError``."""
    reader = _Reader(data, "transaction state value")
    version = reader.int16()
    if version not in (0, 1):
        raise CorruptRecordError(f"transaction state value version {version} is not 0 or 1")
    flexible = version == 1
    producer_id = reader.int64()
    epoch = reader.int16()
    timeout_ms = reader.int32()
    state = reader.int8()
    count = reader.length(flexible)
    partitions: frozenset[tuple[str, int]] | None = None
    if count >= 0:
        found: set[tuple[str, int]] = set()
        for _ in range(count):
            topic = reader.string(flexible)
            ids = reader.length(flexible)
            if ids < 0:
                raise CorruptRecordError("transaction state value: a null partition list")
            found.update((topic, reader.int32()) for _ in range(ids))
            if flexible:
                reader.skip_tags()
        partitions = frozenset(found)
    last_update_ms = reader.int64()
    start_ms = reader.int64()
    previous, following, client_version = -1, -1, 0
    if flexible:
        for tag, body in reader.tags():
            if tag == _TAG_PREVIOUS_PRODUCER_ID:
                previous = _unpack(_INT64, body, "previous producer id")
            elif tag == _TAG_NEXT_PRODUCER_ID:
                following = _unpack(_INT64, body, "next producer id")
            elif tag == _TAG_CLIENT_VERSION:
                client_version = _unpack(_INT16, body, "client transaction version")
    reader.done()
    return TxnLogValue(
        producer_id,
        epoch,
        timeout_ms,
        state,
        partitions,
        last_update_ms,
        start_ms,
        previous,
        following,
        client_version,
    )


def _unpack(shape: struct.Struct, body: bytes, what: str) -> int:
    if len(body) != shape.size:
        raise CorruptRecordError(f"transaction state value: {what} is {len(body)} bytes")
    return int(shape.unpack(body)[0])


class _Reader:
    """A cursor over one record's bytes; every read checks the bounds."""

    def __init__(self, data: bytes, what: str) -> None:
        self._data = data
        self._position = 0
        self._what = what

    def _take(self, size: int) -> bytes:
        end = self._position + size
        if size < 0 or end > len(self._data):
            raise CorruptRecordError(f"{self._what} ends early (at byte {self._position})")
        chunk = self._data[self._position : end]
        self._position = end
        return chunk

    def int8(self) -> int:
        return int.from_bytes(self._take(1), "big", signed=True)

    def int16(self) -> int:
        return int(_INT16.unpack(self._take(2))[0])

    def int32(self) -> int:
        return int(_INT32.unpack(self._take(4))[0])

    def int64(self) -> int:
        return int(_INT64.unpack(self._take(8))[0])

    def uvarint(self) -> int:
        value, self._position = decode_unsigned_varint(self._data, self._position)
        return value

    def length(self, flexible: bool) -> int:
        """An array's or string's length; -1 when null."""
        return self.uvarint() - 1 if flexible else self.int32()

    def string(self, flexible: bool) -> str:
        size = self.uvarint() - 1 if flexible else self.int16()
        if size < 0:
            raise CorruptRecordError(f"{self._what}: a null string")
        try:
            return self._take(size).decode()
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"{self._what}: a string is not UTF-8") from exc

    def tags(self) -> list[tuple[int, bytes]]:
        return [(self.uvarint(), self._take(self.uvarint())) for _ in range(self.uvarint())]

    def skip_tags(self) -> None:
        self.tags()

    def done(self) -> None:
        if self._position != len(self._data):
            raise CorruptRecordError(
                f"{self._what}: {len(self._data) - self._position} bytes after the last field"
            )
