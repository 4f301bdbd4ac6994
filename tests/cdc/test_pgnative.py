"""The C path of ``ChangeAssembler.feed_payload`` (``client/cdc/_pgnative.c``) against the
pure-Python one: random relations and transactions, encoded as pgoutput bytes, give the
same records byte for byte, or the same error, through both.

Runs where the extension is built (``make venv`` builds it); ``TIDELOG_PURE_PYTHON`` or
no compiler skip it, as the pure path is then the only one."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cdc.test_pgoutput import encode
from tidelog.client.cdc import events
from tidelog.client.cdc.events import NATIVE, ChangeAssembler, ChangeRecord, ChangeUnit
from tidelog.client.cdc.pgoutput import (
    Begin,
    Binary,
    Column,
    Commit,
    Delete,
    Insert,
    Message,
    Relation,
    Toast,
    TupleValue,
    Update,
)

pytestmark = pytest.mark.skipif(not NATIVE, reason="client.cdc._pgnative is not in use")

EXAMPLES = int(os.environ.get("TIDELOG_FUZZ_EXAMPLES", "300"))

# Type OID -> text outputs to draw from (besides arbitrary text): canonical and not.
TYPES: dict[int, st.SearchStrategy[str]] = {
    21: st.integers(-(2**15), 2**15 - 1).map(str),
    23: st.one_of(st.integers(-(2**31), 2**31 - 1).map(str), st.sampled_from(["-0", "007"])),
    20: st.one_of(
        st.integers(-(2**63), 2**63 - 1).map(str), st.sampled_from([" 5", "1_0", "x", ""])
    ),
    16: st.sampled_from(["t", "f"]),
    700: st.sampled_from(["1.5", "NaN", "Infinity", "-0", "3.4028235e+38"]),
    701: st.one_of(st.floats().map(repr), st.sampled_from(["1e-320", "nan"])),
    1700: st.sampled_from(["12.30", "0.5", "NaN", "1e400", "123456789012345678901", "-3"]),
    1184: st.sampled_from(["2026-01-02 03:04:05+00", "infinity", "2026-01-02 03:04:05.5+05:30"]),
    1114: st.sampled_from(["2026-01-02 03:04:05", "-infinity"]),
    25: st.text(),
    1043: st.text(st.characters(max_codepoint=0x7F)),
    1042: st.text(st.characters(codec="utf-8"), max_size=5).map(lambda t: t.ljust(8)),
    114: st.just('{"a": [1, "\\u0000"]}'),
}

names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1)


@st.composite
def relations(draw: st.DrawFn, oid: int) -> tuple[Relation, tuple[str, ...]]:
    column_names = draw(st.lists(names, min_size=1, max_size=6, unique=True))
    types = [draw(st.sampled_from(sorted(TYPES))) for _ in column_names]
    columns = tuple(Column(n, t, -1, False) for n, t in zip(column_names, types, strict=True))
    key = draw(
        st.one_of(
            st.lists(st.sampled_from(column_names), min_size=1, max_size=3, unique=True),
            st.just(["not a column"]),  # the Python path's CdcError
        )
    )
    return Relation(oid, draw(names), draw(names), "d", columns), tuple(key)


@st.composite
def tuples(draw: st.DrawFn, relation: Relation) -> tuple[TupleValue, ...]:
    width = len(relation.columns)
    if draw(st.integers(0, 30)) == 0:
        width = draw(st.integers(0, width + 2))  # a count other than the Relation's
    values: list[TupleValue] = []
    for index in range(width):
        type_oid = relation.columns[index % len(relation.columns)].type_oid
        choice = draw(st.integers(0, 20))
        if choice == 0:
            values.append(None)
        elif choice == 1:
            values.append(Toast.UNCHANGED)
        elif choice == 2:
            values.append(Binary(draw(st.binary(max_size=8))))
        elif choice == 3:
            values.append(draw(st.binary(max_size=8)))  # maybe not UTF-8
        elif choice == 4:
            values.append(draw(st.text(max_size=8)).encode())
        else:
            values.append(draw(TYPES[type_oid]).encode())
    return tuple(values)


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[bytes], dict[str, tuple[str, ...]]]:
    keys: dict[str, tuple[str, ...]] = {}
    payloads: list[bytes] = []
    shapes: list[Relation] = []
    for oid in range(1, draw(st.integers(1, 3)) + 1):
        relation, key = draw(relations(oid))
        relation = Relation(oid, relation.schema, f"t{oid}", "d", relation.columns)
        keys[relation.name] = key
        shapes.append(relation)
        payloads.append(encode(relation))
    for xid in range(draw(st.integers(1, 3))):
        payloads.append(encode(Begin(draw(st.integers(0, 2**64 - 1)), 10**15, xid)))
        for _ in range(draw(st.integers(0, 6))):
            relation = draw(st.sampled_from(shapes))
            kind = draw(st.sampled_from(["I", "U", "UK", "UO", "DK", "DO"]))
            oid = relation.oid if draw(st.integers(0, 30)) else 999  # sometimes unknown
            message: Message
            if kind == "I":
                message = Insert(oid, draw(tuples(relation)))
            elif kind == "U":
                message = Update(oid, None, None, draw(tuples(relation)))
            elif kind.startswith("U"):
                message = Update(oid, kind[1], draw(tuples(relation)), draw(tuples(relation)))
            else:
                message = Delete(oid, kind[1], draw(tuples(relation)))
            payload = encode(message)
            cut = draw(st.integers(0, 40))
            if cut == 0:
                payload = payload[: draw(st.integers(1, len(payload)))]
            elif cut == 1:
                payload += b"\0"
            payloads.append(payload)
        payloads.append(encode(Commit(0, 1, 2, 10**15)))
    return payloads, keys


def _run(assembler: ChangeAssembler, payload: bytes, native: bool) -> object:
    try:
        if native:
            return assembler.feed_payload(payload)
        from tidelog.client.cdc.pgoutput import decode

        return assembler.feed(decode(payload))
    except Exception as exc:  # the error itself is what is compared
        return (type(exc), str(exc))


@settings(max_examples=EXAMPLES, deadline=None)
@given(streams())
def test_the_c_path_gives_the_python_paths_records_and_errors(
    stream: tuple[list[bytes], dict[str, tuple[str, ...]]],
) -> None:
    payloads, keys = stream
    c_path = ChangeAssembler("pg", lambda relation: keys[relation.name])
    python_path = ChangeAssembler("pg", lambda relation: keys[relation.name], native=False)
    for payload in payloads:
        assert _run(c_path, payload, True) == _run(python_path, payload, False)


def test_the_c_path_takes_the_common_changes_and_declines_the_rest() -> None:
    """Not vacuous: the common shapes do go through C (records appended, True), the
    others are declined with nothing appended."""
    relation = Relation(5, "public", "orders", "d", (Column("id", 23, -1, True),
                                                     Column("note", 25, -1, False)))  # fmt: skip
    assembler = ChangeAssembler("pg", lambda relation: ("id",))
    assembler.feed(relation)
    specs = assembler._specs  # the C function's own argument
    records: list[ChangeRecord] = []
    head = b'{"lsn": "0/1", "txid": 1, "ts_ms": 0, "snapshot": false, "schema": '
    take = events._NATIVE_ENCODE
    assert take is not None
    assert take(encode(Insert(5, (b"7", 'a\n"✓'.encode()))), specs, head, records)
    assert take(encode(Delete(5, "K", (b"7", None))), specs, head, records)
    assert [r.key for r in records] == [b'{"id": 7}'] * 3
    assert json.loads(records[0].value or b"")["after"] == {"id": 7, "note": 'a\n"✓'}
    assert records[2].value is None
    assert not take(encode(Update(5, "K", (b"7", None), (b"8", b"x"))), specs, head, records)
    assert not take(encode(Insert(6, (b"7", b"x"))), specs, head, records)
    assert not take(encode(Insert(5, (b"7", b"\xff"))), specs, head, records)
    assert len(records) == 3
    unit = ChangeUnit(tuple(records), None)
    assert unit.records[0] == ChangeRecord("pg.public.orders", b'{"id": 7}', records[0].value)
