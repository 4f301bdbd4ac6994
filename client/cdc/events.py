"""Change events: PostgreSQL rows as Debezium-style JSON records, one unit per transaction.

Pure: decoded pgoutput messages (``client.cdc.pgoutput``) and snapshot rows in, records
out; no socket, no clock. The format is DESIGN.md's CDC contract (docs/cdc.md has the
whole story):

- topic ``PREFIX.SCHEMA.TABLE``; key = the primary key as a JSON object (``{"id": 7}``,
  ``json.dumps`` with its default separators, columns in the key's order), so a key's
  bytes never change and compaction and the partitioner see one key per row;
- value = ``{"op": "c"|"u"|"d"|"r", "before": {...}|null, "after": {...}|null,
  "source": {"lsn": "0/16B3748", "txid": 123, "ts_ms": ..., "schema": ..., "table": ...,
  "snapshot": bool}}``; ``lsn`` is the transaction's commit LSN (the snapshot's
  consistent point for ``r``), ``txid`` its xid (null for ``r``), ``ts_ms`` its commit
  time (the snapshot's start for ``r``);
- a delete is followed by a tombstone (same key, null value) so compaction drops the row;
- an UPDATE that changes the primary key is a delete of the old key (and its tombstone)
  then a create of the new one (Debezium's convention);
- ``before`` is the whole old row only with REPLICA IDENTITY FULL; with the default
  identity an update has ``before: null`` and a delete's ``before`` holds the key columns;
- a TOASTed value an UPDATE did not change (pgoutput sends no value for it) is taken from
  the old row when REPLICA IDENTITY FULL sent one, else it is ``UNAVAILABLE_VALUE``
  (Debezium's placeholder);
- TRUNCATE is not an event (Debezium's default): compaction could not drop keys it was
  never told, so it is logged, and docs/cdc.md says to re-snapshot;
- column values are JSON scalars from PostgreSQL's text output: booleans, integers,
  floats (NaN and infinities as strings), numeric as a number only when a double holds
  it exactly (else the string), timestamps ISO 8601 (the connector's sessions run with
  DateStyle ISO and TimeZone UTC), everything else the text itself.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, TypeAlias

from tidelog.client.cdc.pgoutput import (
    Begin,
    Binary,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    Relation,
    Toast,
    Truncate,
    TupleData,
    Type,
    Update,
    decode,
    pg_time_to_ms,
)

if TYPE_CHECKING:
    from tidelog.client.cdc import _pgnative

__all__ = [
    "NATIVE",
    "UNAVAILABLE_VALUE",
    "CdcError",
    "ChangeAssembler",
    "ChangeRecord",
    "ChangeUnit",
    "JsonValue",
    "Position",
    "TableShape",
    "column_json",
    "format_lsn",
    "parse_lsn",
    "read_records",
    "topic_for",
]

log = logging.getLogger(__name__)

UNAVAILABLE_VALUE = "__debezium_unavailable_value"
"""Stands for an unchanged TOASTed value PostgreSQL did not send (Debezium's placeholder)."""

JsonValue: TypeAlias = bool | int | float | str | None

_BOOL, _INT8, _INT2, _INT4, _OID = 16, 20, 21, 23, 26
_FLOAT4, _FLOAT8, _NUMERIC = 700, 701, 1700
_TIMESTAMP, _TIMESTAMPTZ = 1114, 1184
_EXACT_INT_LIMIT = 2**53
_OFFSET = re.compile(r"([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?$")


class CdcError(Exception):
    """The connector cannot go on: a table without a primary key, a dropped slot, a
    malformed stream. The message says what to do."""


@dataclass(frozen=True, slots=True)
class Position:
    """What the connector records in its offsets topic once a unit is durable.

    ``lsn``: the commit end LSN of the last stored transaction (the consistent point right
    after a snapshot); ``snapshot_done``: the initial snapshot is wholly stored;
    ``commit_ts_ms``: that transaction's commit time (0 for a snapshot).
    """

    lsn: int
    snapshot_done: bool
    commit_ts_ms: int = 0


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    topic: str
    key: bytes
    value: bytes | None  # None: a tombstone


@dataclass(frozen=True, slots=True)
class ChangeUnit:
    """What a ``ChangeSink`` stores as one: a PostgreSQL transaction's records (or one
    chunk of a snapshot), in commit order, and the position to record after them
    (None for snapshot chunks before the last). ``snapshot``: a part of the initial
    snapshot (its last unit carries the ``snapshot_done`` position)."""

    records: tuple[ChangeRecord, ...]
    position: Position | None
    snapshot: bool = False


@dataclass(frozen=True, slots=True)
class TableShape:
    """A table as the events see it: its columns (name, type OID) and primary key."""

    schema: str
    name: str
    columns: tuple[tuple[str, int], ...]
    primary_key: tuple[str, ...]


def format_lsn(lsn: int) -> str:
    """``0x16B3748`` as ``"0/16B3748"``: PostgreSQL's spelling (high/low 32 bits, hex)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFF_FFFF:X}"


def parse_lsn(text: str) -> int:
    """``"0/16B3748"`` as an integer. Raises ``ValueError`` for anything else."""
    high, sep, low = text.partition("/")
    if not sep or not high or not low:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(high, 16) << 32) | int(low, 16)


def topic_for(prefix: str, schema: str, table: str) -> str:
    return f"{prefix}.{schema}.{table}"


def column_json(type_oid: int, text: str) -> JsonValue:
    """One column's text output as a JSON scalar (the module docstring's rules)."""
    if type_oid == _BOOL:
        return text == "t"
    if type_oid in (_INT2, _INT4, _INT8, _OID):
        return int(text)
    if type_oid in (_FLOAT4, _FLOAT8):
        value = float(text)
        return value if value == value and abs(value) != float("inf") else text
    if type_oid == _NUMERIC:
        return _numeric(text)
    if type_oid == _TIMESTAMP and text[:1].isdigit():
        return text.replace(" ", "T", 1)
    if type_oid == _TIMESTAMPTZ and text[:1].isdigit():
        return _iso_offset(text.replace(" ", "T", 1))
    return text


def _numeric(text: str) -> JsonValue:
    try:
        number = Decimal(text)
    except InvalidOperation:
        return text
    if not number.is_finite():
        return text
    if number == number.to_integral_value():
        integral = int(number)
        return integral if abs(integral) < _EXACT_INT_LIMIT else text
    as_float = float(number)
    return as_float if Decimal(as_float) == number else text


def _iso_offset(text: str) -> str:
    """``...+00`` as ``...+00:00`` (ISO 8601 wants minutes in the offset)."""
    match = _OFFSET.search(text)
    if match is None:
        return text
    sign, hours, minutes, seconds = match.groups()
    offset = f"{sign}{hours}:{minutes or '00'}" + (f":{seconds}" if seconds else "")
    return text[: match.start()] + offset


# One encoder for every record (``json.dumps`` with an option builds a new one a call);
# rows are flat dicts of scalars, so there is no cycle to check for.
_encode = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode


def _dumps(value: Any) -> bytes:
    return _encode(value).encode("utf-8")


def _key(shape: TableShape, row: dict[str, JsonValue]) -> bytes:
    try:
        return _dumps({c: row[c] for c in shape.primary_key})
    except KeyError:
        missing = [c for c in shape.primary_key if c not in row]
        raise CdcError(
            f"{shape.schema}.{shape.name}: the change lacks primary-key columns {missing} "
            "(is the replica identity an index other than the primary key?)"
        ) from None


def _source_head(source: dict[str, Any]) -> bytes:
    """``source`` (without schema and table) encoded up to where the schema goes: once a
    transaction (or snapshot chunk), shared by its records; ``_source_tail`` ends it."""
    return _dumps(source)[:-1] + b', "schema": '


def _source_tail(shape: TableShape) -> bytes:
    """The end of a ``source`` object: schema and table, once a Relation."""
    return _dumps(shape.schema) + b', "table": ' + _dumps(shape.name) + b"}"


def _source_json(shape: TableShape, source: dict[str, Any]) -> bytes:
    """``json.dumps({**source, "schema": ..., "table": ...})``, in its two parts."""
    return _source_head(source) + _source_tail(shape)


def _value(
    op: str,
    before: dict[str, JsonValue] | None,
    after: dict[str, JsonValue] | None,
    source_json: bytes,
) -> bytes:
    """The event, byte for byte what ``json.dumps({"op": op, "before": before, "after":
    after, "source": source})`` gives, with ``source`` already encoded."""
    return b"".join(
        (
            _OP_HEADS[op],
            b"null" if before is None else _dumps(before),
            b', "after": ',
            b"null" if after is None else _dumps(after),
            b', "source": ',
            source_json,
            b"}",
        )
    )


_OP_HEADS = {op: b'{"op": "%s", "before": ' % op.encode() for op in "cudr"}


def _load_native() -> _pgnative.EncodeChange | None:
    """The C extension's ``encode_change`` (``client/cdc/_pgnative.c``), or None: not built
    (no compiler at install), or ``TIDELOG_PURE_PYTHON`` set as for ``storage.native``, or
    ``TIDELOG_CDC_PURE_PYTHON`` (this extension only: ``benchmarks/cdc_bench.py`` compares
    the two paths with the rest of the process unchanged)."""
    for variable in ("TIDELOG_PURE_PYTHON", "TIDELOG_CDC_PURE_PYTHON"):
        if os.environ.get(variable, "") not in ("", "0"):
            return None
    try:
        from tidelog.client.cdc import _pgnative
    except ImportError:
        return None
    return _pgnative.encode_change


_NATIVE_ENCODE = _load_native()
NATIVE: bool = _NATIVE_ENCODE is not None
"""True when ``ChangeAssembler.feed_payload`` takes the C path for the common changes."""

Converter: TypeAlias = Callable[[bytes], JsonValue]
"""One column's text bytes as its JSON scalar (``column_json`` for its type)."""


def _converter(type_oid: int) -> Converter:
    """``column_json(type_oid, text.decode())`` without the decode and the type tests
    where the type allows: integers parse from bytes, most types are their text."""
    if type_oid in (_INT2, _INT4, _INT8, _OID):
        return int
    if type_oid == _TIMESTAMPTZ:
        return _timestamptz
    if type_oid in (_BOOL, _FLOAT4, _FLOAT8, _NUMERIC, _TIMESTAMP):
        return lambda data: column_json(type_oid, data.decode("utf-8"))
    return _text


def _timestamptz(data: bytes) -> JsonValue:
    """``column_json(_TIMESTAMPTZ, ...)``; the offset ``+00`` (the sessions' TimeZone is
    UTC, so nearly every value) is completed without the regular expression: a text that
    ends in ``+00`` is one the expression matches at that ``+`` (an earlier sign's match
    would have to run through it)."""
    text = data.decode("utf-8")
    if text[:1].isdigit():
        text = text.replace(" ", "T", 1)
        return text + ":00" if text.endswith("+00") else _iso_offset(text)
    return text


def _text(data: bytes) -> str:
    return data.decode("utf-8")


@dataclass(frozen=True, slots=True)
class _Table:
    """A Relation as the assembler uses it: its shape, topic and column converters."""

    shape: TableShape
    topic: str
    names: tuple[str, ...]
    converters: tuple[Converter, ...]
    source_tail: bytes
    key_column: str | None  # the key's one column, when it has one
    key_head: bytes  # ``{"id": `` for it

    def key(self, row: dict[str, JsonValue]) -> bytes:
        """``_key(self.shape, row)``; an integer key of one column without the encoder."""
        if self.key_column is not None:
            value = row.get(self.key_column)
            if type(value) is int:
                return self.key_head + b"%d}" % value
        return _key(self.shape, row)


def read_records(
    prefix: str,
    shape: TableShape,
    rows: Sequence[Sequence[str | None]],
    lsn: int,
    ts_ms: int,
) -> list[ChangeRecord]:
    """Snapshot rows (each column's text output, in ``shape.columns`` order) as ``r``
    events at the snapshot's consistent point ``lsn``."""
    topic = topic_for(prefix, shape.schema, shape.name)
    source = {"lsn": format_lsn(lsn), "txid": None, "ts_ms": ts_ms, "snapshot": True}
    source_json = _source_json(shape, source)
    records = []
    for texts in rows:
        row = {
            name: None if text is None else column_json(type_oid, text)
            for (name, type_oid), text in zip(shape.columns, texts, strict=True)
        }
        records.append(ChangeRecord(topic, _key(shape, row), _value("r", None, row, source_json)))
    return records


PrimaryKeyOf: TypeAlias = Callable[[Relation], tuple[str, ...]]
"""The primary-key columns of a Relation; raises ``CdcError`` when it has none."""


class ChangeAssembler:
    """Turns a stream of pgoutput messages into ``ChangeUnit``s, one per transaction.

    ``feed`` returns the unit when a Commit arrives, None otherwise. Relations are kept
    by OID and replaced whenever a new Relation message arrives (a schema change: later
    rows carry the new columns). ``primary_key`` is asked once per Relation message.
    Not thread-safe (one reader).

    Decision (issue #30's benchmark, ``benchmarks/cdc_bench.py``): every change passes
    here, so what can be done once is: per Relation the topic, each column's converter
    and the end of the ``source`` object (``_Table``); per transaction the start of the
    ``source`` object; the value is joined from those parts and the encoded rows, byte
    for byte what ``json.dumps`` of the whole event gives. Past that, the common changes
    go from bytes to records in C (``feed_payload``; ``client/cdc/_pgnative.c``), this
    class staying the reference and the fallback (``tests/cdc/test_pgnative.py``).
    """

    def __init__(self, prefix: str, primary_key: PrimaryKeyOf, *, native: bool = True) -> None:
        self._prefix = prefix
        self._primary_key = primary_key
        self._tables: dict[int, _Table] = {}
        # ``native=False``: the pure-Python path only (the reference the tests compare with).
        self._encode = _NATIVE_ENCODE if native else None
        self._specs: dict[int, _NativeSpec] = {}  # by OID: what the C path needs of a _Table
        self._source_head: bytes | None = None  # this transaction's, made at its 1st change
        self._records: list[ChangeRecord] = []
        self._begin: Begin | None = None

    @property
    def idle(self) -> bool:
        """No transaction is half received (between Begin and Commit)."""
        return self._begin is None

    def feed_payload(self, payload: bytes) -> ChangeUnit | None:
        """``feed(decode(payload))``: one pgoutput message's bytes. Where the C extension
        is built (``NATIVE``), an Insert, an Update without an old image and a Delete of a
        known relation go through it: the same records, byte for byte, with no message
        object, no row dict and no encoder call. It declines anything else (other shapes,
        malformed payloads, values it cannot write as ``json`` would), which then takes
        the Python path and its errors.

        Raises:
            PgOutputError: a malformed payload.
            CdcError: as ``feed``.
        """
        encode = self._encode
        begin = self._begin
        if encode is not None and begin is not None:
            head = self._source_head
            if head is None:
                head = self._source_head = _begin_head(begin)
            if encode(payload, self._specs, head, self._records):
                return None
        return self.feed(decode(payload))

    def feed(self, message: Message) -> ChangeUnit | None:
        """Take one message; returns the finished unit on Commit.

        Raises:
            CdcError: a change outside Begin/Commit, of an unknown relation, or of a
                table without a primary key.
        """
        kind = type(message)
        if kind is Update or kind is Insert or kind is Delete:  # most messages: first
            self._change(message)  # type: ignore[arg-type]
        elif isinstance(message, Begin):
            self._begin = message
            self._records = []
            self._source_head = None
        elif isinstance(message, Commit):
            if self._begin is None:
                raise CdcError("Commit without Begin in the replication stream")
            unit = ChangeUnit(
                tuple(self._records),
                Position(message.end_lsn, True, pg_time_to_ms(message.commit_time_us)),
            )
            self._begin = None
            self._records = []
            return unit
        elif isinstance(message, Relation):
            columns = tuple((c.name, c.type_oid) for c in message.columns)
            key = self._primary_key(message)
            shape = TableShape(message.schema, message.name, columns, key)
            single = key[0] if len(key) == 1 else None
            table = self._tables[message.oid] = _Table(
                shape,
                topic_for(self._prefix, shape.schema, shape.name),
                tuple(name for name, _ in columns),
                tuple(_converter(type_oid) for _, type_oid in columns),
                _source_tail(shape),
                single,
                b"{" + _dumps(single) + b": " if single is not None else b"",
            )
            spec = _native_spec(table)
            if spec is None:
                self._specs.pop(message.oid, None)
            else:
                self._specs[message.oid] = spec
        elif isinstance(message, Truncate):
            names = [self._table(oid).shape for oid in message.relation_oids]
            log.warning(
                "TRUNCATE of %s is not captured: re-snapshot to drop the rows from the topics",
                ", ".join(f"{s.schema}.{s.name}" for s in names),
            )
        elif isinstance(message, Origin | Type):
            pass  # nothing an event needs: types come as text, origins are not filtered
        return None

    def _table(self, oid: int) -> _Table:
        table = self._tables.get(oid)
        if table is None:
            raise CdcError(f"a change to relation {oid} came before its Relation message")
        return table

    def _change(self, message: Insert | Update | Delete) -> None:
        begin = self._begin
        if begin is None:
            raise CdcError(f"{type(message).__name__} outside a transaction")
        oid = message.relation_oid
        table = self._table(oid)
        topic = table.topic
        head = self._source_head
        if head is None:
            head = self._source_head = _begin_head(begin)
        source = head + table.source_tail
        add = self._records.append
        if isinstance(message, Insert):
            after = _row(table, message.new, None)
            add(ChangeRecord(topic, table.key(after), _value("c", None, after, source)))
        elif isinstance(message, Delete):
            deleted = _row(table, message.old, None, key_only=message.old_kind == "K")
            key = table.key(deleted)
            add(ChangeRecord(topic, key, _value("d", deleted, None, source)))
            add(ChangeRecord(topic, key, None))
        else:
            old_full = message.old if message.old_kind == "O" else None
            after = _row(table, message.new, old_full)
            key = table.key(after)
            before: dict[str, JsonValue] | None = None
            if old_full is not None:
                before = _row(table, old_full, None)
            old = message.old
            if old is not None:
                old_row = before if before is not None else _row(table, old, None, True)
                old_key = table.key(old_row)
                if old_key != key:
                    # The primary key changed: delete the old row, create the new one.
                    add(ChangeRecord(topic, old_key, _value("d", old_row, None, source)))
                    add(ChangeRecord(topic, old_key, None))
                    add(ChangeRecord(topic, key, _value("c", None, after, source)))
                    return
            add(ChangeRecord(topic, key, _value("u", before, after, source)))


def _begin_head(begin: Begin) -> bytes:
    """A transaction's ``source`` object up to its schema: ``_source_head`` of ``{"lsn":
    ..., "txid": ..., "ts_ms": ..., "snapshot": False}``, formatted directly (an LSN's
    spelling, hex digits and "/", and integers need no escaping; tested equal)."""
    return b'{"lsn": "%s", "txid": %d, "ts_ms": %d, "snapshot": false, "schema": ' % (
        format_lsn(begin.final_lsn).encode(),
        begin.xid,
        pg_time_to_ms(begin.commit_time_us),
    )


_NativeSpec: TypeAlias = tuple[
    str, bytes, tuple[bytes, ...], bytes, tuple[Converter, ...], tuple[int, ...], type
]
"""A ``_Table`` as ``_pgnative.encode_change`` takes it (its module docstring): topic,
source tail, each column's ``"name": ``, kinds, converters, the key's column indexes,
the record class."""


def _native_spec(table: _Table) -> _NativeSpec | None:
    """The C path's view of ``table``; None when a key column is not a column (the
    Python path then raises ``CdcError`` for its changes). Kinds: ``i`` the integer
    types (``int``: canonical text is its JSON), ``s`` the types read as their text
    (``_text``), ``o`` the rest, through their converter."""
    names = table.names
    if any(column not in names for column in table.shape.primary_key):
        return None
    kinds = bytes(
        ord("i") if convert is int else ord("s") if convert is _text else ord("o")
        for convert in table.converters
    )
    return (
        table.topic,
        table.source_tail,
        tuple(_dumps(name) + b": " for name in names),
        kinds,
        table.converters,
        tuple(names.index(column) for column in table.shape.primary_key),
        ChangeRecord,
    )


def _row(
    table: _Table, data: TupleData, old: TupleData | None, key_only: bool = False
) -> dict[str, JsonValue]:
    """A tuple as ``{column: value}``; an unchanged TOASTed value is taken from ``old``
    (REPLICA IDENTITY FULL's old row) or becomes ``UNAVAILABLE_VALUE``. ``key_only``: an
    old-key image ('K'), whose other columns are not values (pgoutput sends them null).

    The loop runs once per column of every change: text values (nearly all) take the
    first branch, through the column's converter (``_converter``)."""
    names = table.names
    if len(data) != len(names):
        shape = table.shape
        raise CdcError(
            f"{shape.schema}.{shape.name}: a change with {len(data)} columns, "
            f"its Relation has {len(names)}"
        )
    if old is not None and Toast.UNCHANGED in data:
        data = tuple(o if v is Toast.UNCHANGED else v for v, o in zip(data, old, strict=True))
    key = table.shape.primary_key if key_only else None
    row: dict[str, JsonValue] = {}
    for name, convert, value in zip(names, table.converters, data, strict=True):
        if key is not None and name not in key:
            continue
        if type(value) is bytes:
            row[name] = convert(value)
        elif value is None:
            row[name] = None
        elif isinstance(value, Toast):
            row[name] = UNAVAILABLE_VALUE
        elif isinstance(value, Binary):
            row[name] = value.data.hex()
    return row
