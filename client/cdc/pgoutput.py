"""A decoder for PostgreSQL's ``pgoutput`` logical replication messages, protocol version 1.

Pure: bytes in, frozen dataclasses out; no socket, no clock. ``decode(payload)`` takes the
body of one XLogData CopyData message (psycopg2's ``ReplicationMessage.payload`` with
``decode=False``) and returns one message. Integers are big-endian, strings are
NUL-terminated (UTF-8: the connector requires a UTF-8 database), times are microseconds
since 2000-01-01 (``pg_time_to_ms`` converts them).

Layout, one message per payload, first byte the message type:

====  ==========  ==============================================================================
byte  message     fields
====  ==========  ==============================================================================
B     Begin       int64 final (commit) LSN, int64 commit time, int32 xid
C     Commit      int8 flags (0), int64 commit LSN, int64 end LSN, int64 commit time
O     Origin      int64 origin commit LSN, string origin name
R     Relation    int32 relation OID, string schema ("" = pg_catalog), string name,
                  int8 replica identity ('d','n','f','i'), int16 ncols, then per column:
                  int8 flags (1 = part of the replica identity), string name,
                  int32 type OID, int32 type modifier
Y     Type        int32 type OID, string schema, string name
I     Insert      int32 relation OID, 'N', TupleData
U     Update      int32 relation OID, optional 'K' (old key) or 'O' (old row) + TupleData,
                  'N' + TupleData
D     Delete      int32 relation OID, 'K' or 'O' + TupleData
T     Truncate    int32 nrels, int8 options (1 CASCADE, 2 RESTART IDENTITY), int32 OID x nrels
====  ==========  ==============================================================================

TupleData: int16 ncols, then per column a kind byte: 'n' NULL, 'u' an unchanged TOASTed
value (no value sent), 't' int32 length + text bytes, 'b' int32 length + binary bytes.

Decision: protocol version 1 only. Version 2 adds streamed in-progress transactions (an
int32 xid before most messages, and Stream Start/Stop/Commit/Abort), 3 two-phase commit,
4 parallel streaming; the connector never asks for them (no ``streaming`` option), so a
large transaction arrives whole after its commit, and any other message type is a
``PgOutputError``, never silently skipped.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

__all__ = [
    "PG_EPOCH_MS",
    "Begin",
    "Binary",
    "Column",
    "Commit",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "PgOutputError",
    "Relation",
    "Toast",
    "Truncate",
    "TupleData",
    "TupleValue",
    "Type",
    "Update",
    "decode",
    "pg_time_to_ms",
]

PG_EPOCH_MS = 946_684_800_000
"""2000-01-01T00:00:00Z in ms since the Unix epoch: PostgreSQL's time zero."""


class PgOutputError(ValueError):
    """A payload that is not a well-formed protocol-1 pgoutput message."""


class Toast(enum.Enum):
    """The value of a column stored out of line and not changed by this UPDATE ('u')."""

    UNCHANGED = "u"


@dataclass(frozen=True, slots=True)
class Binary:
    """A column value in the type's binary send format ('b'; only with ``binary 'on'``)."""

    data: bytes


TupleValue: TypeAlias = bytes | Binary | Toast | None
"""One column: text bytes ('t'), ``Binary`` ('b'), ``Toast.UNCHANGED`` ('u'), None ('n')."""
TupleData: TypeAlias = tuple[TupleValue, ...]


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a Relation; ``key`` is flag bit 1 (part of the replica identity)."""

    name: str
    type_oid: int
    type_modifier: int
    key: bool


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_time_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Relation:
    """A table's shape. Sent before its first change and again after any change to it."""

    oid: int
    schema: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Type:
    oid: int
    schema: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """``old_kind`` is 'K' (old key columns), 'O' (whole old row) or None (no old image)."""

    relation_oid: int
    old_kind: str | None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old_kind: str
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    options: int
    relation_oids: tuple[int, ...]


Message: TypeAlias = Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">bQQq")


def pg_time_to_ms(time_us: int) -> int:
    """A PostgreSQL timestamp (µs since 2000-01-01) as ms since the Unix epoch."""
    return PG_EPOCH_MS + time_us // 1000


class _Reader:
    """A cursor over one payload; every read checks the bounds.

    Decision (issue #30's benchmark, cProfile): a row's columns are read in one loop over
    the payload with ``struct.unpack_from`` and local names, not a method call per byte
    and per length; it was a third of the decoder's time. Message headers keep the small
    methods."""

    __slots__ = ("data", "position")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    def _short(self, size: int) -> PgOutputError:
        return PgOutputError(f"message ends early at byte {self.position} (needs {size} more)")

    def take(self, size: int) -> bytes:
        end = self.position + size
        if size < 0 or end > len(self.data):
            raise self._short(size)
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def unpack(self, layout: struct.Struct) -> tuple[int, ...]:
        position = self.position
        if position + layout.size > len(self.data):
            raise self._short(layout.size)
        values: tuple[int, ...] = layout.unpack_from(self.data, position)
        self.position = position + layout.size
        return values

    def int(self, layout: struct.Struct) -> int:
        return self.unpack(layout)[0]

    def byte(self) -> str:
        position = self.position
        if position >= len(self.data):
            raise self._short(1)
        self.position = position + 1
        return chr(self.data[position])

    def string(self) -> str:
        end = self.data.find(b"\0", self.position)
        if end < 0:
            raise PgOutputError(f"string at byte {self.position} has no terminator")
        text = self.data[self.position : end].decode("utf-8")
        self.position = end + 1
        return text

    def tuple_data(self) -> TupleData:
        count = self.int(_I16)
        if count < 0:
            raise PgOutputError(f"negative column count {count}")
        data = self.data
        size = len(data)
        position = self.position
        length_at = _I32.unpack_from
        values: list[TupleValue] = []
        append = values.append
        for _ in range(count):
            if position >= size:
                self.position = position
                raise self._short(1)
            kind = data[position]
            position += 1
            if kind in (_TEXT, _BINARY):
                if position + 4 > size:
                    self.position = position
                    raise self._short(4)
                length = length_at(data, position)[0]
                position += 4
                end = position + length
                if length < 0 or end > size:
                    self.position = position
                    raise self._short(length)
                append(data[position:end] if kind == _TEXT else Binary(data[position:end]))
                position = end
            elif kind == _NULL:
                append(None)
            elif kind == _UNCHANGED:
                append(Toast.UNCHANGED)
            else:
                self.position = position - 1
                raise PgOutputError(f"unknown column kind {chr(kind)!r}")
        self.position = position
        return tuple(values)

    def finish(self, message: Message) -> Message:
        if self.position != len(self.data):
            raise PgOutputError(
                f"{type(message).__name__} has {len(self.data) - self.position} trailing bytes"
            )
        return message


_TEXT, _BINARY, _NULL, _UNCHANGED = b"t"[0], b"b"[0], b"n"[0], b"u"[0]
_B, _C = b"B"[0], b"C"[0]
_BEGIN_SIZE, _COMMIT_SIZE = 1 + _BEGIN.size, 1 + _COMMIT.size


def decode(payload: bytes) -> Message:
    """Decode one pgoutput message (protocol version 1).

    Raises:
        PgOutputError: an unknown message type, a short or over-long payload, an unknown
            column kind or tuple marker.
    """
    if not payload:
        raise PgOutputError("empty message")
    # Begin and Commit (two of a transaction's messages) at their exact sizes without the
    # reader: the same result; any other size takes the checked path and its errors.
    kind = payload[0]
    if kind == _B and len(payload) == _BEGIN_SIZE:
        return Begin(*_BEGIN.unpack_from(payload, 1))
    if kind == _C and len(payload) == _COMMIT_SIZE:
        return Commit(*_COMMIT.unpack_from(payload, 1))
    reader = _Reader(bytes(payload))
    reader.position = 1
    decoder = _DECODERS.get(payload[0])
    if decoder is None:
        raise PgOutputError(
            f"unsupported pgoutput message type {chr(payload[0])!r} (protocol version 1)"
        )
    return reader.finish(decoder(reader))


def _begin(reader: _Reader) -> Begin:
    final_lsn, commit_time_us, xid = reader.unpack(_BEGIN)
    return Begin(final_lsn, commit_time_us, xid)


def _commit(reader: _Reader) -> Commit:
    flags, commit_lsn, end_lsn, commit_time_us = reader.unpack(_COMMIT)
    return Commit(flags, commit_lsn, end_lsn, commit_time_us)


def _origin(reader: _Reader) -> Origin:
    origin_lsn = reader.int(_U64)
    return Origin(origin_lsn, reader.string())


def _type(reader: _Reader) -> Type:
    return Type(reader.int(_U32), reader.string(), reader.string())


def _insert(reader: _Reader) -> Insert:
    oid = reader.int(_U32)
    marker = reader.byte()
    if marker != "N":
        raise PgOutputError(f"Insert: expected 'N', got {marker!r}")
    return Insert(oid, reader.tuple_data())


def _delete(reader: _Reader) -> Delete:
    oid = reader.int(_U32)
    marker = reader.byte()
    if marker not in ("K", "O"):
        raise PgOutputError(f"Delete: expected 'K' or 'O', got {marker!r}")
    return Delete(oid, marker, reader.tuple_data())


def _truncate(reader: _Reader) -> Truncate:
    count = reader.int(_I32)
    if count < 0:
        raise PgOutputError(f"Truncate: negative relation count {count}")
    options = reader.int(_I8)
    oids = tuple(reader.int(_U32) for _ in range(count))
    return Truncate(options, oids)


def _relation(reader: _Reader) -> Relation:
    oid = reader.int(_U32)
    schema = reader.string()
    name = reader.string()
    identity = reader.byte()
    count = reader.int(_I16)
    if count < 0:
        raise PgOutputError(f"Relation: negative column count {count}")
    columns = []
    for _ in range(count):
        flags = reader.int(_I8)
        column_name = reader.string()
        type_oid = reader.int(_U32)
        modifier = reader.int(_I32)
        columns.append(Column(column_name, type_oid, modifier, bool(flags & 1)))
    # "" is how pgoutput names pg_catalog (proto.c, logicalrep_write_namespace).
    return Relation(oid, schema or "pg_catalog", name, identity, tuple(columns))


def _update(reader: _Reader) -> Update:
    oid = reader.int(_U32)
    marker = reader.byte()
    old_kind: str | None = None
    old: TupleData | None = None
    if marker in ("K", "O"):
        old_kind = marker
        old = reader.tuple_data()
        marker = reader.byte()
    if marker != "N":
        raise PgOutputError(f"Update: expected 'N', got {marker!r}")
    return Update(oid, old_kind, old, reader.tuple_data())


_DECODERS: dict[int, Callable[[_Reader], Message]] = {
    ord(kind): decoder
    for kind, decoder in (
        ("B", _begin),
        ("C", _commit),
        ("O", _origin),
        ("R", _relation),
        ("Y", _type),
        ("I", _insert),
        ("U", _update),
        ("D", _delete),
        ("T", _truncate),
    )
}
