"""End-transaction markers: the control batch's layout, and what readers accept."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.storage.control import (
    ControlRecordType,
    EndTxnMarker,
    build_marker,
    control_record_type,
    marker_key,
    marker_value,
    parse_marker,
    read_marker,
)
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.records import (
    NO_SEQUENCE,
    BatchBuilder,
    Compression,
    decode_batch,
    encode_batch,
    validate_batch,
)

INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(
    producer_id=st.integers(0, 2**63 - 1),
    epoch=st.integers(0, 2**15 - 1),
    commit=st.booleans(),
    coordinator_epoch=INT32,
    timestamp_ms=st.integers(0, 2**50),
    base_offset=st.integers(0, 2**62),
    leader_epoch=st.integers(-1, 2**31 - 1),
)
def test_a_marker_round_trips_with_kafkas_layout(
    producer_id: int,
    epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
    base_offset: int,
    leader_epoch: int,
) -> None:
    batch = build_marker(
        producer_id,
        epoch,
        commit=commit,
        coordinator_epoch=coordinator_epoch,
        timestamp_ms=timestamp_ms,
        base_offset=base_offset,
        partition_leader_epoch=leader_epoch,
    )
    header = validate_batch(batch)  # the CRC covers the control attributes
    assert header.is_control
    assert header.is_transactional
    assert header.compression == Compression.NONE
    assert (header.producer_id, header.producer_epoch) == (producer_id, epoch)
    assert header.base_sequence == NO_SEQUENCE
    assert (header.records_count, header.base_offset) == (1, base_offset)
    assert header.partition_leader_epoch == leader_epoch
    _, records = decode_batch(batch)
    assert records[0].key == struct.pack(">hh", 0, 1 if commit else 0)
    assert records[0].value == struct.pack(">hi", 0, coordinator_epoch)
    assert records[0].timestamp_ms == timestamp_ms
    assert read_marker(batch) == EndTxnMarker(commit, coordinator_epoch)


@given(commit=st.booleans(), coordinator_epoch=INT32, tail=st.binary(max_size=20))
def test_readers_accept_longer_values_and_newer_versions(
    commit: bool, coordinator_epoch: int, tail: bytes
) -> None:
    value = struct.pack(">hi", 3, coordinator_epoch) + tail
    key = struct.pack(">hh", 2, int(commit)) + tail
    assert parse_marker(key, value) == EndTxnMarker(commit, coordinator_epoch)
    assert parse_marker(marker_key(commit), marker_value(coordinator_epoch)) == EndTxnMarker(
        commit, coordinator_epoch
    )


@pytest.mark.parametrize("kind", [2, 3, 4, 5, 6, 99])
def test_other_control_types_are_no_marker(kind: int) -> None:
    key = struct.pack(">hh", 0, kind)
    assert control_record_type(key) == kind
    assert parse_marker(key, b"anything") is None
    builder = BatchBuilder(is_transactional=True, is_control=True, producer_id=1, producer_epoch=0)
    builder.append(0, key, b"")
    assert read_marker(builder.build()) is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (None, struct.pack(">hi", 0, 1)),
        (b"\x00\x00\x00", struct.pack(">hi", 0, 1)),
        (struct.pack(">hh", -1, 0), struct.pack(">hi", 0, 1)),
        (struct.pack(">hh", 0, ControlRecordType.ABORT), None),
        (struct.pack(">hh", 0, ControlRecordType.COMMIT), b"\x00\x00\x00\x01\x02"),
        (struct.pack(">hh", 0, ControlRecordType.COMMIT), struct.pack(">hi", -2, 1)),
    ],
)
def test_malformed_markers_are_corrupt(key: bytes | None, value: bytes | None) -> None:
    with pytest.raises(CorruptRecordError):
        parse_marker(key, value)


def test_a_data_batch_holds_no_marker() -> None:
    assert read_marker(encode_batch([(0, struct.pack(">hh", 0, 1), b"x")])) is None
