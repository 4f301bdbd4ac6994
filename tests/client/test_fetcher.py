"""Positions, fetch planning and turning fetched bytes into records. Pure."""

from __future__ import annotations

import struct

import crc32c
import pytest

from tidelog.client.columns import ColumnBuilder, finish_columns, new_column_builder
from tidelog.client.fetcher import CompletedFetch, SubscriptionState, next_fetch_offset
from tidelog.client.types import TopicPartition
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.records import BatchBuilder, set_base_offset

TP = TopicPartition("t", 0)


def _batch(
    base_offset: int,
    values: list[bytes],
    deltas: list[int] | None = None,
    last_offset_delta: int | None = None,
) -> bytes:
    builder = BatchBuilder(base_offset=base_offset)
    for i, value in enumerate(values):
        delta = None if deltas is None else deltas[i]
        builder.append(1_000 + i, None, value, offset_delta=delta)
    return builder.build(last_offset_delta=last_offset_delta)


def _empty_batch(base_offset: int, last_offset_delta: int) -> bytes:
    return BatchBuilder(base_offset=base_offset).build(last_offset_delta=last_offset_delta)


def _control_batch(base_offset: int) -> bytes:
    """A commit marker: a batch with attribute bit 5 set (the CRC recomputed)."""
    data = bytearray(_batch(base_offset, [b""]))
    attributes = struct.unpack_from(">h", data, 21)[0] | 0x20
    struct.pack_into(">h", data, 21, attributes)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


def _fetch(data: bytes, fetch_offset: int = 0) -> CompletedFetch:
    return CompletedFetch(TP, epoch=0, fetch_offset=fetch_offset, data=data)


def test_take_hands_out_records_in_order_in_chunks() -> None:
    fetch = _fetch(_batch(0, [b"a", b"b", b"c"]) + _batch(3, [b"d"]))
    records, position = fetch.take(0, 2)
    assert [(r.offset, r.value) for r in records] == [(0, b"a"), (1, b"b")]
    assert position == 2
    records, position = fetch.take(position, 10)
    assert [(r.offset, r.value) for r in records] == [(2, b"c"), (3, b"d")]
    assert position == 4
    assert fetch.exhausted
    assert records[0].topic == "t"
    assert records[0].partition == 0
    assert records[0].timestamp_ms == 1_002
    assert records[0].key is None


def test_records_before_the_position_inside_a_batch_are_skipped() -> None:
    fetch = _fetch(_batch(10, [b"a", b"b", b"c", b"d"]), fetch_offset=12)
    records, position = fetch.take(12, 100)
    assert [r.offset for r in records] == [12, 13]
    assert position == 14


def test_whole_batches_before_the_position_are_skipped_without_decoding() -> None:
    garbage = bytearray(_batch(0, [b"a"]))
    garbage[-1] ^= 0xFF  # corrupt, but wholly before the position: never decoded
    fetch = _fetch(bytes(garbage) + _batch(1, [b"b"]), fetch_offset=1)
    records, position = fetch.take(1, 100)
    assert [r.value for r in records] == [b"b"]
    assert position == 2


def test_compaction_gaps_move_the_position_past_the_batch() -> None:
    # Offsets 0 and 3 survive in a batch whose last offset was 5 (4 and 5 removed).
    fetch = _fetch(_batch(0, [b"a", b"d"], [0, 3], last_offset_delta=5) + _batch(6, [b"g"]))
    records, position = fetch.take(0, 1)
    assert [r.offset for r in records] == [0]
    assert position == 1
    records, position = fetch.take(position, 1)
    assert [r.offset for r in records] == [3]
    assert position == 6  # the batch is done: past the removed 4 and 5
    records, position = fetch.take(position, 10)
    assert [r.offset for r in records] == [6]
    # Seeking into a gap returns the next surviving record.
    again = _fetch(_batch(0, [b"a", b"d"], deltas=[0, 3]))
    assert [r.offset for r in again.take(1, 10)[0]] == [3]


def test_empty_and_control_batches_are_stepped_over() -> None:
    fetch = _fetch(_empty_batch(0, 4) + _control_batch(5) + _batch(6, [b"x"]))
    records, position = fetch.take(0, 10)
    assert [r.offset for r in records] == [6]
    assert position == 7
    only_markers = _fetch(_empty_batch(0, 4) + _control_batch(5))
    assert only_markers.take(0, 10) == ([], 6)


def test_a_corrupt_batch_raises() -> None:
    data = bytearray(_batch(0, [b"abc"]))
    data[-2] ^= 0xFF
    with pytest.raises(Exception, match="CRC"):
        _fetch(bytes(data)).take(0, 10)


def test_next_fetch_offset_ignores_a_partial_tail() -> None:
    data = _batch(0, [b"a", b"b"]) + _batch(2, [b"c"])
    assert next_fetch_offset(data, 0) == (3, len(data))
    cut = data[:-5]
    next_offset, whole = next_fetch_offset(cut, 0)
    assert next_offset == 2
    assert whole == len(_batch(0, [b"a", b"b"]))
    assert next_fetch_offset(b"", 9) == (9, 0)


def test_broker_rewritten_base_offsets_are_used() -> None:
    data = bytearray(_batch(0, [b"a"]))
    set_base_offset(data, 0, 41)
    records, position = _fetch(bytes(data), fetch_offset=41).take(41, 10)
    assert [r.offset for r in records] == [41]
    assert position == 42


def test_subscription_positions_epochs_and_prefetch() -> None:
    state = SubscriptionState()
    other = TopicPartition("t", 1)
    state.assign([TP, other])
    assert state.needs_position() == [TP, other]
    state.seek(TP, 5)
    targets, capped = state.fetch_targets(now_ms=0, max_prefetch=2)
    assert [(t.tp, t.fetch_offset) for t in targets] == [(TP, 5)]
    assert not capped
    tp_state = state.partitions[TP]
    epoch = tp_state.epoch
    tp_state.buffered = 2
    assert state.fetch_targets(0, 2) == ([], True)
    state.seek(TP, 7)  # drops what was fetched: a new epoch
    assert tp_state.epoch > epoch
    assert tp_state.buffered == 0
    state.request_reset(TP, "earliest")
    assert tp_state.position is None
    assert tp_state.reset == "earliest"
    dropped = state.assign([other])
    assert dropped == [TP]
    with pytest.raises(KeyError, match="not assigned"):
        state.seek(TP, 1)
    # Assigned again: a fresh state whose epoch no earlier state of it ever had.
    used = {epoch, tp_state.epoch, state.partitions[other].epoch}
    state.assign([other, TP])
    assert state.partitions[TP] is not tp_state
    assert state.partitions[TP].epoch not in used
    assert state.partitions[TP].epoch > max(used)


def test_paused_and_backed_off_partitions_are_not_fetched() -> None:
    state = SubscriptionState()
    state.assign([TP])
    state.seek(TP, 0)
    state.partitions[TP].paused = True
    assert state.fetch_targets(0, 2)[0] == []
    state.partitions[TP].paused = False
    state.partitions[TP].retry_at_ms = 100
    assert state.fetch_targets(50, 2)[0] == []
    assert state.next_retry_ms() == 100
    assert len(state.fetch_targets(100, 2)[0]) == 1


# --- take_columns: the same records, as columns -------------------------------------------


def _column_offsets(builder: ColumnBuilder) -> list[int]:
    return list(memoryview(finish_columns(builder).offsets).cast("q"))


@pytest.mark.parametrize("pure", [False, True], ids=["native", "pure"])
@pytest.mark.parametrize("start", [0, 1, 3, 5, 6, 7])
def test_take_columns_takes_what_take_would(pure: bool, start: int) -> None:
    data = (
        _batch(0, [b"a", b"d"], [0, 3], last_offset_delta=5)  # a compacted batch: 0, 3
        + _empty_batch(6, 0)
        + _control_batch(7)
        + _batch(8, [b"x", b"y"])
    )
    expected, expected_position = _fetch(data, start).take(start, 100)
    builder = new_column_builder(True, pure=pure)
    fetch = _fetch(data, start)
    position = fetch.take_columns(start, builder, 100)
    assert fetch.exhausted
    assert position == expected_position == 10
    columns = finish_columns(builder)
    assert list(memoryview(columns.offsets).cast("q")) == [r.offset for r in expected]
    assert columns.value_data == b"".join(r.value or b"" for r in expected)


def test_take_columns_goes_on_where_take_stopped() -> None:
    data = _batch(0, [b"a", b"b", b"c"]) + _batch(3, [b"d"])
    fetch = _fetch(data)
    records, position = fetch.take(0, 1)
    assert [r.offset for r in records] == [0]
    builder = new_column_builder(False)
    position = fetch.take_columns(position, builder, 1)  # the rest of the batch, whole
    assert (position, _column_offsets(builder)) == (3, [1, 2])
    position = fetch.take_columns(position, builder, 10)
    assert (position, _column_offsets(builder)) == (4, [3])
    assert fetch.exhausted


def test_take_columns_of_a_corrupt_batch_raises_and_adds_nothing() -> None:
    data = bytearray(_batch(1, [b"abc"]))
    data[-2] ^= 0xFF
    builder = new_column_builder(False)
    fetch = _fetch(_batch(0, [b"ok"]) + bytes(data))
    assert fetch.take_columns(0, builder, 10) == 1  # the good batch before it
    assert _column_offsets(builder) == [0]
    with pytest.raises(CorruptRecordError, match="CRC"):
        fetch.take_columns(1, builder, 10)
    assert builder.rows == 0
    assert not fetch.exhausted
