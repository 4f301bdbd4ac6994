"""``__share_group_state`` records: byte round trips, cut or padded records refused, the
merge rule against a per-offset reference, and one record's exact bytes."""

from __future__ import annotations

import itertools
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.share.records import (
    ACKNOWLEDGED,
    ARCHIVED,
    AVAILABLE,
    SNAPSHOT,
    UPDATE,
    ShareSnapshot,
    ShareStateKey,
    ShareUpdate,
    StateBatch,
    apply_update,
    decode_key,
    decode_snapshot,
    decode_update,
    encode_key,
    encode_snapshot,
    encode_update,
    merge,
)
from tidelog.storage.errors import CorruptRecordError

states = st.sampled_from([AVAILABLE, ACKNOWLEDGED, ARCHIVED])


@st.composite
def batches(draw: st.DrawFn, max_offset: int = 60) -> tuple[StateBatch, ...]:
    """Sorted disjoint batches."""
    cuts = sorted(draw(st.sets(st.integers(0, max_offset), max_size=12)))
    out = []
    for first, last in zip(cuts[::2], cuts[1::2], strict=False):
        out.append(StateBatch(first, last, draw(states), draw(st.integers(0, 7))))
    return tuple(out)


keys = st.builds(
    ShareStateKey,
    st.text(max_size=20),
    st.builds(uuid.UUID, st.uuids().map(str)),
    st.integers(0, 2**31 - 1),
)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
snapshots = st.builds(ShareSnapshot, int32, int32, int32, int64, int64, int64, batches())
updates = st.builds(ShareUpdate, int32, int32, int64, batches())


@given(st.sampled_from([SNAPSHOT, UPDATE]), keys)
def test_key_round_trip(record_type: int, key: ShareStateKey) -> None:
    data = encode_key(record_type, key)
    assert decode_key(data) == (record_type, key)
    for cut in range(len(data)):
        with pytest.raises(CorruptRecordError):
            decode_key(data[:cut])
    with pytest.raises(CorruptRecordError):
        decode_key(data + b"\0")


@given(snapshots)
def test_snapshot_round_trip_and_cuts(snapshot: ShareSnapshot) -> None:
    data = encode_snapshot(snapshot)
    assert decode_snapshot(data) == snapshot
    for cut in range(len(data)):
        with pytest.raises(CorruptRecordError):
            decode_snapshot(data[:cut])
    with pytest.raises(CorruptRecordError):
        decode_snapshot(data + b"\0")


@given(updates)
def test_update_round_trip_and_cuts(update: ShareUpdate) -> None:
    data = encode_update(update)
    assert decode_update(data) == update
    for cut in range(len(data)):
        with pytest.raises(CorruptRecordError):
            decode_update(data[:cut])


def test_update_bytes_are_kafkas_layout() -> None:
    """Version 0, snapshot epoch, leader epoch, start offset, a compact array of one batch
    (first, last, state int8, count int16, no tags), no tags; a 4.2 tagged field
    (DeliveryCompleteCount, tag 0) is read past."""
    update = ShareUpdate(1, 3, 10, (StateBatch(10, 12, ARCHIVED, 5),))
    expected = bytes.fromhex(
        "00000000000100000003000000000000000a02000000000000000a000000000000000c0400050000"
    )
    assert encode_update(update) == expected
    tagged = expected[:-1] + bytes.fromhex("01000400000007")
    assert decode_update(tagged) == update


def test_a_bad_state_or_version_is_refused() -> None:
    good = encode_update(ShareUpdate(0, 0, 0, (StateBatch(0, 0, ACKNOWLEDGED, 1),)))
    bad_state = good[:35] + b"\x01" + good[36:]  # the state byte
    with pytest.raises(CorruptRecordError, match="delivery state"):
        decode_update(bad_state)
    with pytest.raises(CorruptRecordError, match="version"):
        decode_update(b"\x00\x01" + good[2:])
    with pytest.raises(CorruptRecordError, match="record type"):
        decode_key(b"\x00\x02" + encode_key(SNAPSHOT, ShareStateKey("g", uuid.uuid4(), 0))[2:])


def _per_offset(batches: tuple[StateBatch, ...]) -> dict[int, tuple[int, int]]:
    return {
        o: (b.delivery_state, b.delivery_count)
        for b in batches
        for o in range(b.first_offset, b.last_offset + 1)
    }


@given(batches(), st.lists(batches(), max_size=4), st.integers(0, 70))
def test_merge_is_newest_wins_per_offset(
    older: tuple[StateBatch, ...], newer: list[tuple[StateBatch, ...]], start: int
) -> None:
    expected = _per_offset(older)
    merged = older
    for update in newer:
        expected.update(_per_offset(update))
        merged = merge(merged, update, 0)
    expected = {o: v for o, v in expected.items() if o >= start}
    merged = merge(merged, (), start)
    assert _per_offset(merged) == expected
    # Sorted, disjoint, and neighbours of equal state and count joined.
    for a, b in itertools.pairwise(merged):
        assert a.last_offset < b.first_offset
        if a.last_offset + 1 == b.first_offset:
            assert (a.delivery_state, a.delivery_count) != (b.delivery_state, b.delivery_count)


def test_apply_update_never_moves_the_start_back() -> None:
    snapshot = ShareSnapshot(0, 0, 1, 20, 0, 0, (StateBatch(20, 25, AVAILABLE, 1),))
    moved = apply_update(snapshot, ShareUpdate(0, 2, 23, ()))
    assert (moved.start_offset, moved.leader_epoch) == (23, 2)
    assert moved.batches == (StateBatch(23, 25, AVAILABLE, 1),)
    assert apply_update(moved, ShareUpdate(0, 2, 5, ())).start_offset == 23
    assert apply_update(moved, ShareUpdate(0, 2, -1, ())).start_offset == 23
