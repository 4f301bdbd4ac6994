"""The pure half of the events: LSN spelling and column values as JSON scalars."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client.cdc import events
from tidelog.client.cdc.events import ChangeAssembler, column_json, format_lsn, parse_lsn
from tidelog.client.cdc.pgoutput import (
    PG_EPOCH_MS,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    Relation,
    Toast,
    Update,
    pg_time_to_ms,
)


@given(st.integers(0, 2**64 - 1))
def test_lsn_spelling_round_trips(lsn: int) -> None:
    assert parse_lsn(format_lsn(lsn)) == lsn


def test_lsn_is_spelled_as_postgresql_does() -> None:
    assert format_lsn(0x16B3748) == "0/16B3748"
    assert format_lsn((1 << 32) | 0xA) == "1/A"
    with pytest.raises(ValueError, match="not an LSN"):
        parse_lsn("16B3748")


@pytest.mark.parametrize(
    ("type_oid", "text", "value"),
    [
        (16, "t", True),
        (16, "f", False),
        (23, "-7", -7),
        (20, "9223372036854775807", 9223372036854775807),
        (701, "1.5", 1.5),
        (701, "NaN", "NaN"),
        (701, "-Infinity", "-Infinity"),
        (1700, "12", 12),
        (1700, "0.5", 0.5),
        (1700, "12.30", "12.30"),  # no double holds 12.3 exactly
        (1700, "9007199254740993", "9007199254740993"),  # past 2**53
        (1700, "NaN", "NaN"),
        (1114, "2026-01-02 03:04:05.5", "2026-01-02T03:04:05.5"),
        (1184, "2026-01-02 03:04:05+00", "2026-01-02T03:04:05+00:00"),
        (1184, "2026-01-02 03:04:05+05:30", "2026-01-02T03:04:05+05:30"),
        (1184, "infinity", "infinity"),
        (1082, "2026-01-02", "2026-01-02"),
        (25, "text", "text"),
    ],
)
def test_column_values(type_oid: int, text: str, value: object) -> None:
    assert column_json(type_oid, text) == value
    assert type(column_json(type_oid, text)) is type(value)


def _relation(oid: int, name: str, columns: list[tuple[str, int]]) -> Relation:
    return Relation(oid, "public", name, "d", tuple(Column(c, t, -1, False) for c, t in columns))


def test_assembled_events_are_exactly_what_json_dumps_gives() -> None:
    """The assembler joins each value from pre-encoded parts (docstring's decision): every
    key and value must equal ``json.dumps`` of the same object, byte for byte."""
    keys = {"orders": ("id",), "lines": ("order_id", "line"), "tags": ("tag",)}
    assembler = ChangeAssembler("pg", lambda relation: keys[relation.name])
    feed = [
        _relation(1, "orders", [("id", 23), ("total", 1700), ("paid", 16), ("note", 25)]),
        _relation(2, "lines", [("order_id", 20), ("line", 21), ("sku", 25)]),
        _relation(3, "tags", [("tag", 25), ("at", 1184)]),
        Begin(0x16B3748, 820_000_000_000_000, 77),
        Insert(1, (b"7", b"12.30", b"t", 'Grüße "quoted" \\ ✓'.encode())),
        Update(1, None, None, (b"7", b"0.5", b"f", None)),
        Update(1, "K", (b"7", None, None, None), (b"8", b"1", b"t", Toast.UNCHANGED)),
        Insert(2, (b"7", b"1", b"A-1")),
        Delete(2, "K", (b"7", b"1", None)),
        Insert(3, (b"new", b"2026-01-02 03:04:05+00")),
        Delete(1, "K", (b"8", None, None, None)),
    ]
    units = [unit for message in feed if (unit := assembler.feed(message)) is not None]
    assert units == []
    unit = assembler.feed(Commit(0, 0x16B3748, 0x16B3800, 820_000_000_000_000))
    assert unit is not None
    # 1 + 1 + (d, tombstone, c: the key changed) + 1 + (d, tombstone) + 1 + (d, tombstone)
    assert len(unit.records) == 11
    for record in unit.records:
        assert record.key == json.dumps(json.loads(record.key), ensure_ascii=False).encode()
        if record.value is not None:
            event = json.loads(record.value)
            assert record.value == json.dumps(event, ensure_ascii=False).encode()
            assert list(event) == ["op", "before", "after", "source"]
            assert event["source"] == {
                "lsn": "0/16B3748", "txid": 77, "ts_ms": PG_EPOCH_MS + 820_000_000_000,
                "snapshot": False, "schema": "public", "table": record.topic.split(".")[-1],
            }  # fmt: skip
    first = json.loads(unit.records[0].value or b"")
    note = 'Grüße "quoted" \\ ✓'
    assert first["after"] == {"id": 7, "total": "12.30", "paid": True, "note": note}
    assert [json.loads(r.key) for r in unit.records[5:7]] == [{"order_id": 7, "line": 1}] * 2
    assert json.loads(unit.records[8].key) == {"tag": "new"}
    assert json.loads(unit.records[8].value or b"")["after"]["at"] == "2026-01-02T03:04:05+00:00"


@given(st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**32 - 1))
def test_a_transactions_source_head_is_what_json_dumps_gives(
    lsn: int, time_us: int, xid: int
) -> None:
    source = {
        "lsn": format_lsn(lsn),
        "txid": xid,
        "ts_ms": pg_time_to_ms(time_us),
        "snapshot": False,
    }
    assert events._begin_head(Begin(lsn, time_us, xid)) == events._source_head(source)


timestamps = st.one_of(
    st.text(),
    st.builds(
        "{}{}".format,
        st.sampled_from(["2026-01-02 03:04:05", "2026-01-02 03:04:05.123456", "1-2", "-00"]),
        st.sampled_from(["+00", "-00", "+05:30", "+0530", "-12:+00", "+00 BC", ""]),
    ),
)


@given(timestamps)
def test_the_timestamptz_converter_is_column_json(text: str) -> None:
    assert events._timestamptz(text.encode()) == column_json(1184, text)
