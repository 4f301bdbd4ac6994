"""The ``__transaction_state`` record format (``broker.transactions.log_records``)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.transactions.log_records import (
    TxnLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from tidelog.storage.errors import CorruptRecordError

_INT64 = st.integers(-(2**63), 2**63 - 1)
_TOPIC = st.text(
    st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters="._-"),
    min_size=1,
    max_size=40,
)
_PARTITIONS = st.frozensets(st.tuples(_TOPIC, st.integers(0, 2**31 - 1)), max_size=12)

values = st.builds(
    TxnLogValue,
    producer_id=_INT64,
    producer_epoch=st.integers(-1, 2**15 - 1),
    timeout_ms=st.integers(1, 2**31 - 1),
    state=st.integers(0, 5),
    partitions=st.none() | _PARTITIONS,
    last_update_ms=_INT64,
    start_ms=_INT64,
    previous_producer_id=_INT64,
    next_producer_id=_INT64,
    client_version=st.integers(0, 2),
)


@given(values)
def test_a_value_reads_back_as_written(value: TxnLogValue) -> None:
    assert decode_value(encode_value(value)) == value


@given(values)
def test_every_cut_value_is_refused_not_guessed(value: TxnLogValue) -> None:
    data = encode_value(value)
    for end in range(len(data)):
        with pytest.raises(CorruptRecordError):
            decode_value(data[:end])
    with pytest.raises(CorruptRecordError, match="after the last field"):
        decode_value(data + b"\x00")


@given(st.text(max_size=200))
def test_a_key_reads_back_as_written(transactional_id: str) -> None:
    key = encode_key(transactional_id)
    assert key[:2] == b"\x00\x00"  # key version 0
    assert decode_key(key) == transactional_id


def test_defaults_write_no_tagged_fields_and_v0_is_read() -> None:
    plain = TxnLogValue(7, 3, 60_000, 0, None, 1_000, -1)
    data = encode_value(plain)
    # version 1, head, null partitions (varint 0), two times, zero tagged fields
    assert (
        data
        == struct.pack(">hqhib", 1, 7, 3, 60_000, 0)
        + b"\x00"
        + struct.pack(">qq", 1_000, -1)
        + b"\x00"
    )
    # Version 0, as Kafka wrote it before transaction.version 1: int32 array lengths,
    # int16 string lengths, no tags.
    v0 = (
        struct.pack(">hqhib", 0, 9, 1, 30_000, 1)
        + struct.pack(">i", 1)
        + struct.pack(">h", 3)
        + b"out"
        + struct.pack(">iii", 2, 0, 4)
        + struct.pack(">qq", 5_000, 4_000)
    )
    assert decode_value(v0) == TxnLogValue(
        9, 1, 30_000, 1, frozenset({("out", 0), ("out", 4)}), 5_000, 4_000
    )


def test_unknown_versions_and_bad_strings_are_refused() -> None:
    with pytest.raises(CorruptRecordError, match="version 2"):
        decode_value(struct.pack(">h", 2) + bytes(40))
    with pytest.raises(CorruptRecordError, match="key version 1"):
        decode_key(struct.pack(">hh", 1, 0))
    with pytest.raises(CorruptRecordError, match="not UTF-8"):
        decode_key(struct.pack(">hh", 0, 1) + b"\xff")


def test_an_id_always_maps_to_the_same_partition_in_range() -> None:
    seen = {partition_for(f"txn-{i}", 50) for i in range(500)}
    assert seen <= set(range(50))
    assert len(seen) > 40  # spread, not all in one partition
    assert partition_for("app-1", 50) == partition_for("app-1", 50)
