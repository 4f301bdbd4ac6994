"""The pure half of the events: LSN spelling and column values as JSON scalars."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client.cdc.events import column_json, format_lsn, parse_lsn


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
