"""Tests for ``PartitionLog``: appends, reads, rolls, timestamps, validation, idempotence,
flushing and retention, on real files with a manual clock."""

from __future__ import annotations

import os
import random
import struct
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.storage.conftest import (
    T0,
    crash,
    log_config,
    make_batch,
    open_log,
    read_all,
    read_values,
    reopen_clean,
    reopen_unclean,
    scratch_dir,
    segment_files,
    values,
)
from tidelog.storage.clock import ManualClock
from tidelog.storage.control import build_marker
from tidelog.storage.errors import (
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    StorageError,
)
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import (
    HEADER_SIZE,
    BatchBuilder,
    Compression,
    TimestampType,
    decode_records,
    iter_batch_headers,
    validate_batch,
)

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DAY_MS = 24 * 3600 * 1000


def dir_state(directory: Path) -> dict[str, bytes]:
    """Every file in ``directory`` with its content (to prove nothing changed)."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def assert_unchanged_and_appendable(
    log: PartitionLog, before: dict[str, bytes], expected: list[bytes | None]
) -> None:
    assert dir_state(log.directory) == before
    assert log.log_end_offset == len(expected)
    assert read_values(log) == expected
    result = log.append(make_batch([b"after"]))
    assert result.base_offset == len(expected)
    assert read_values(log) == [*expected, b"after"]


# ---------------------------------------------------------------------- append and read


def test_new_log_is_empty(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (0, 0, 0)
    assert log.read(0, 1000).records == b""
    assert [p.name for p in segment_files(log_dir)] == ["00000000000000000000.log"]
    log.close()


def test_appends_get_dense_offsets_and_read_back(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    first = log.append(make_batch([b"a", b"b", b"c"]))
    second = log.append(make_batch([b"d"]))
    both = log.append(make_batch([b"e", b"f"]) + make_batch([b"g"]))
    assert (first.base_offset, first.last_offset, first.record_count) == (0, 2, 3)
    assert (second.base_offset, second.last_offset, second.record_count) == (3, 3, 1)
    assert (both.base_offset, both.last_offset, both.record_count) == (4, 6, 3)
    assert not first.duplicate
    assert first.log_append_time_ms == -1
    assert log.log_end_offset == log.high_watermark == 7
    records = read_all(log)
    assert [r.offset for r in records] == list(range(7))
    assert [r.value for r in records] == [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]
    # The stored base offsets were rewritten; the producer's (0) did not survive.
    data = log.read(0, 10_000).records
    assert [h.base_offset for _, h in iter_batch_headers(data)] == [0, 3, 4, 6]
    log.close()


def test_keys_headers_timestamps_and_lz4_survive(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    builder = BatchBuilder(compression=Compression.LZ4)
    builder.append(T0 + 5, b"k1", b"x" * 3000, [("h", b"v"), ("n", None)])
    builder.append(T0 - 7, None, None)
    log.append(builder.build())
    got = read_all(log)
    assert [(r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in got] == [
        (0, T0 + 5, b"k1", b"x" * 3000, (("h", b"v"), ("n", None))),
        (1, T0 - 7, None, None, ()),
    ]
    log.close()


def test_closed_log_refuses_appends(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    log.append(make_batch([b"a"]))
    log.close()
    log.close()  # idempotent
    with pytest.raises(StorageError, match="closed"):
        log.append(make_batch([b"b"]))
    reopened = open_log(log_dir, clock, had_clean_shutdown=True, recovery_point=1)
    assert read_values(reopened) == [b"a"]
    reopened.close()


def test_read_at_end_is_empty_and_out_of_range_raises(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    log.append(make_batch(values(5)))
    result = log.read(5, 1000)
    assert (result.records, result.high_watermark, result.log_start_offset) == (b"", 5, 0)
    for offset in (6, 100, -1):
        with pytest.raises(OffsetOutOfRangeError):
            log.read(offset, 1000)
    log.close()


def test_read_below_log_start_raises(log_dir: Path, clock: ManualClock) -> None:
    config = log_config(segment_bytes=200, retention_ms=1000)
    log = open_log(log_dir, clock, config)
    for i in range(6):
        log.append(make_batch(values(2, start=2 * i), timestamp_ms=T0))
    clock.advance(1001)
    log.append(make_batch([b"new"], timestamp_ms=clock.wall_ms()))
    assert log.delete_old_segments() > 0
    start = log.log_start_offset
    assert start > 0
    with pytest.raises(OffsetOutOfRangeError):
        log.read(start - 1, 1000)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 1000)
    assert read_values(log, start)[-1] == b"new"
    log.close()


def test_first_batch_returned_whole_even_above_max_bytes(log_dir: Path, clock: ManualClock) -> None:
    config = log_config(segment_bytes=5000)
    log = open_log(log_dir, clock, config)
    big = make_batch([b"x" * 3000])
    log.append(make_batch([b"small"]))
    log.append(big)  # offset 1
    log.append(big)  # offset 2, in a new segment (5000 bytes would overflow)
    assert [s.base_offset for s in log.segments] == [0, 2]  # offset 1 sealed, 2 active
    for offset in (1, 2):
        data = log.read(offset, 1).records
        assert len(data) == len(big)
        (record,) = decode_records(data)
        assert record.offset == offset
    # max_bytes 0 still makes progress.
    assert len(log.read(0, 0).records) == len(make_batch([b"small"]))
    log.close()


@PROPERTY
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=25),
    max_bytes=st.integers(1, 600),
    segment_bytes=st.integers(100, 2000),
    data=st.data(),
)
def test_reads_return_whole_batches_within_max_bytes(
    tmp_path: Path,
    sizes: list[int],
    max_bytes: int,
    segment_bytes: int,
    data: st.DataObject,
) -> None:
    with scratch_dir(tmp_path) as directory:
        clock = ManualClock(T0)
        log = open_log(directory, clock, log_config(segment_bytes=segment_bytes))
        expected: list[bytes | None] = []
        for size in sizes:
            batch_values = values(size, start=len(expected))
            log.append(make_batch(batch_values))
            expected.extend(batch_values)
        offset = data.draw(st.integers(0, len(expected) - 1))
        result = log.read(offset, max_bytes).records
        whole = list(iter_batch_headers(result))  # raises on a partial batch
        # The first batch holds the offset; it alone may exceed max_bytes.
        assert whole[0][1].base_offset <= offset <= whole[0][1].last_offset
        assert len(result) <= max(max_bytes, whole[0][1].size_bytes)
        got = [r.value for r in decode_records(result) if r.offset >= offset]
        assert got == expected[offset : offset + len(got)]
        assert read_values(log) == expected
        log.close()


# ---------------------------------------------------------------------- rolling


def test_roll_on_segment_bytes(log_dir: Path, clock: ManualClock) -> None:
    batch = make_batch([b"x" * 100])
    config = log_config(segment_bytes=2 * len(batch))
    log = open_log(log_dir, clock, config)
    for _ in range(7):
        log.append(batch)
    # Two batches fill a segment exactly; the third would overflow it.
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6]
    assert [p.name for p in segment_files(log_dir)] == [f"{base:020d}.log" for base in (0, 2, 4, 6)]
    assert [s.size_bytes for s in log.segments] == [2 * len(batch)] * 3 + [len(batch)]
    assert [os.path.getsize(p) for p in segment_files(log_dir)] == [
        2 * len(batch),
        2 * len(batch),
        2 * len(batch),
        len(batch),
    ]
    assert read_values(log) == [b"x" * 100] * 7
    log.close()


def test_batch_larger_than_segment_bytes_gets_its_own_segment(
    log_dir: Path, clock: ManualClock
) -> None:
    config = log_config(segment_bytes=100)
    log = open_log(log_dir, clock, config)
    log.append(make_batch([b"a"]))
    log.append(make_batch([b"b" * 500]))
    log.append(make_batch([b"c"]))
    assert [s.base_offset for s in log.segments] == [0, 1, 2]
    assert read_values(log) == [b"a", b"b" * 500, b"c"]
    log.close()


def test_roll_on_segment_ms_by_record_timestamps(log_dir: Path, clock: ManualClock) -> None:
    # CreateTime: Kafka measures the span by record timestamps, not the wall clock.
    config = log_config(segment_ms=1000)
    log = open_log(log_dir, clock, config)
    log.append(make_batch([b"a"], timestamp_ms=T0))
    log.append(make_batch([b"b"], timestamp_ms=T0 + 1000))  # exactly segment.ms: no roll
    clock.advance(10 * DAY_MS)  # the wall clock does not matter while records have times
    log.append(make_batch([b"c"], timestamp_ms=T0 + 999))
    assert log.segment_count == 1
    log.append(make_batch([b"d"], timestamp_ms=T0 + 1001))
    assert [s.base_offset for s in log.segments] == [0, 3]
    log.close()


def test_roll_on_segment_ms_with_log_append_time(log_dir: Path, clock: ManualClock) -> None:
    config = log_config(segment_ms=60_000, message_timestamp_type="LogAppendTime")
    log = open_log(log_dir, clock, config)
    log.append(make_batch([b"a"], timestamp_ms=0))
    clock.advance(60_000)
    log.append(make_batch([b"b"], timestamp_ms=0))
    assert log.segment_count == 1
    clock.advance(1)
    log.append(make_batch([b"c"], timestamp_ms=0))
    assert [s.base_offset for s in log.segments] == [0, 2]
    # The new segment's clock starts at its first batch.
    clock.advance(60_000)
    log.append(make_batch([b"d"], timestamp_ms=0))
    assert log.segment_count == 2
    log.close()


def test_roll_when_the_index_is_full(log_dir: Path, clock: ManualClock) -> None:
    # Room for 3 offset-index entries (and 2 time-index entries); an entry every batch.
    config = log_config(segment_index_bytes=24, index_interval_bytes=1)
    log = open_log(log_dir, clock, config)
    for i in range(20):
        log.append(make_batch([b"v"], timestamp_ms=T0 + i))
    assert log.segment_count > 2
    for segment in log.segments:
        assert len(segment.offset_index) <= 3
    assert read_values(log) == [b"v"] * 20
    log.close()


def test_explicit_roll(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    assert log.roll().base_offset == 0  # empty active segment: no-op
    log.append(make_batch(values(3)))
    assert log.roll().base_offset == 3
    assert log.roll().base_offset == 3
    log.append(make_batch(values(1, 3)))
    assert [s.base_offset for s in log.segments] == [0, 3]
    assert read_values(log) == values(4)
    log.close()


# ---------------------------------------------------------------------- timestamps


@st.composite
def timestamped_batches(draw: st.DrawFn) -> list[list[int]]:
    """Batches of record timestamps, not monotonic (producers' clocks disagree)."""
    return draw(
        st.lists(
            st.lists(st.integers(T0 - 50, T0 + 50), min_size=1, max_size=4),
            min_size=1,
            max_size=30,
        )
    )


@PROPERTY
@given(
    batches=timestamped_batches(),
    segment_bytes=st.integers(150, 3000),
    index_interval=st.integers(1, 400),
    data=st.data(),
)
def test_offset_for_timestamp_and_max_timestamp_match_a_scan(
    tmp_path: Path,
    batches: list[list[int]],
    segment_bytes: int,
    index_interval: int,
    data: st.DataObject,
) -> None:
    with scratch_dir(tmp_path) as directory:
        clock = ManualClock(T0)
        config = log_config(segment_bytes=segment_bytes, index_interval_bytes=index_interval)
        log = open_log(directory, clock, config)
        timestamps: list[int] = []
        for batch in batches:
            log.append(make_batch(values(len(batch)), timestamps=batch))
            timestamps.extend(batch)
        reopen = data.draw(st.sampled_from(["none", "clean", "unclean"]))
        log_start = 0
        if reopen == "clean":
            log = reopen_clean(log, clock)
        elif reopen == "unclean":
            # A log start inside the log, anywhere (Kafka's DeleteRecords can put it there).
            log_start = data.draw(st.integers(0, len(timestamps)))
            log = reopen_unclean(log, clock, log_start_offset=log_start)
            assert log.log_start_offset >= log_start
            log_start = log.log_start_offset

        def expected(target: int) -> tuple[int, int] | None:
            for offset in range(log_start, len(timestamps)):
                if timestamps[offset] >= target:
                    return offset, timestamps[offset]
            return None

        targets = {T0 - 51, T0 + 51, *timestamps, *(t + 1 for t in timestamps)}
        for target in sorted(targets):
            assert log.offset_for_timestamp(target) == expected(target), target

        def expected_max(end: int) -> tuple[int, int] | None:
            held = range(log_start, end)
            if not held:
                return None
            top = max(timestamps[o] for o in held)
            return next((o, top) for o in held if timestamps[o] == top)

        # ListOffsets -3 (KIP-734): the first record with the largest timestamp, never
        # one at or past the high watermark (a replicated log's is drawn below its end).
        assert log.max_timestamp() == expected_max(len(timestamps))
        high_watermark = data.draw(st.integers(0, len(timestamps)))
        log.track_high_watermark(high_watermark)
        assert log.max_timestamp() == expected_max(max(high_watermark, log_start))
        log.close()


def test_log_append_time_stamps_clock_time_with_valid_crc(
    log_dir: Path, clock: ManualClock
) -> None:
    config = log_config(message_timestamp_type="LogAppendTime")
    log = open_log(log_dir, clock, config)
    clock.advance(12_345)
    now = clock.wall_ms()
    result = log.append(make_batch([b"a", b"b"], timestamps=[5, 6]))
    assert result.log_append_time_ms == now
    clock.advance(10)
    log.append(make_batch([b"c"], timestamp_ms=T0 + 10**9))
    stored = log.read(0, 10_000).records
    headers = []
    position = 0
    while position < len(stored):
        header = validate_batch(stored, position)  # raises on a bad CRC
        headers.append(header)
        position += header.size_bytes
    assert [h.timestamp_type for h in headers] == [TimestampType.LOG_APPEND_TIME] * 2
    assert [h.max_timestamp for h in headers] == [now, now + 10]
    assert [(r.offset, r.timestamp_ms) for r in read_all(log)] == [
        (0, now),
        (1, now),
        (2, now + 10),
    ]
    # Timestamp lookups see the append times, not the producer's.
    assert log.offset_for_timestamp(now + 1) == (2, now + 10)
    assert log.offset_for_timestamp(6) == (0, now)
    # And they survive a recovery, which re-validates every CRC.
    log = reopen_unclean(log, clock)
    assert [r.timestamp_ms for r in read_all(log)] == [now, now, now + 10]
    log.close()


# ---------------------------------------------------------------------- validation


def test_max_message_bytes_rejects_and_stores_nothing(log_dir: Path, clock: ManualClock) -> None:
    small, big = make_batch([b"ok"]), make_batch([b"x" * 500])
    config = log_config(max_message_bytes=len(big) - 1)
    log = open_log(log_dir, clock, config)
    log.append(small)
    before = dir_state(log_dir)
    with pytest.raises(RecordTooLargeError):
        log.append(big)
    with pytest.raises(RecordTooLargeError):
        log.append(small + big)  # the valid batch in front is not stored either
    assert_unchanged_and_appendable(log, before, [b"ok"])
    # A batch of exactly max.message.bytes is fine.
    exact = log_config(max_message_bytes=len(big))
    log.update_config(exact)
    log.append(big)
    assert read_values(log)[-1] == b"x" * 500
    log.close()


def _flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0xFF]) + data[position + 1 :]


def _bad_inputs() -> dict[str, bytes]:
    good = make_batch([b"one", b"two"])
    empty = BatchBuilder().build(last_offset_delta=0)
    gap = BatchBuilder()
    gap.append(T0, None, b"a")
    gap_batch = gap.build(last_offset_delta=5)  # 1 record claiming offsets 0..5
    return {
        "crc-covered byte flipped": _flip(good, HEADER_SIZE + 3),
        "crc field flipped": _flip(good, 18),
        "attributes flipped": _flip(good, 22),
        "magic 1": good[:16] + b"\x01" + good[17:],
        "truncated": good[:-1],
        "header only": good[:HEADER_SIZE],
        "short garbage": b"\x00\x01\x02",
        "garbage": os.urandom(200),
        "length too long": good[:8] + struct.pack(">i", len(good)) + good[12:],
        "length below header": good[:8] + struct.pack(">i", 10) + good[12:],
        "trailing garbage": good + b"\x00" * 20,
        "second batch cut": good + good[:-5],
        "no records": empty,
        "count does not match last offset delta": gap_batch,
    }


@pytest.mark.parametrize("name", sorted(_bad_inputs()))
def test_corrupt_input_is_rejected_and_the_log_unchanged(
    log_dir: Path, clock: ManualClock, name: str
) -> None:
    log = open_log(log_dir, clock)
    log.append(make_batch([b"first"]))
    before = dir_state(log_dir)
    with pytest.raises(CorruptRecordError):
        log.append(_bad_inputs()[name])
    assert_unchanged_and_appendable(log, before, [b"first"])
    log.close()


def test_empty_requests_and_control_batches_are_invalid(log_dir: Path, clock: ManualClock) -> None:
    """Producers never write markers: only ``append_marker`` (the leader) does."""
    log = open_log(log_dir, clock)
    log.append(make_batch([b"first"]))
    before = dir_state(log_dir)
    with pytest.raises(InvalidRequestError):
        log.append(b"")
    marker = build_marker(1, 0, commit=True, coordinator_epoch=0, timestamp_ms=T0)
    with pytest.raises(InvalidRequestError, match="control batches"):
        log.append(marker)
    assert_unchanged_and_appendable(log, before, [b"first"])
    log.close()


@PROPERTY
@given(
    batch_count=st.integers(1, 4),
    position=st.integers(0, 10_000),
    length=st.integers(1, 30),
    fill=st.binary(min_size=1, max_size=30),
)
def test_damaged_input_is_stored_intact_or_not_at_all(
    tmp_path: Path, batch_count: int, position: int, length: int, fill: bytes
) -> None:
    with scratch_dir(tmp_path) as directory:
        log = open_log(directory, ManualClock(T0))
        log.append(make_batch([b"first"]))
        request = b"".join(make_batch(values(i + 1, start=10 * i)) for i in range(batch_count))
        position %= len(request)
        patch = (fill * length)[:length]
        damaged = request[:position] + patch + request[position + len(patch) :]
        damaged = damaged[: len(request)]
        assume(damaged != request)
        before = dir_state(directory)
        try:
            log.append(damaged)
        except (CorruptRecordError, RecordTooLargeError, InvalidRequestError):
            assert_unchanged_and_appendable(log, before, [b"first"])
        else:
            # Only bytes outside the CRC survive a change: base offset, leader epoch.
            expected = [b"first"]
            for i in range(batch_count):
                expected.extend(values(i + 1, start=10 * i))
            assert read_values(log) == expected
        log.close()


# ---------------------------------------------------------------------- idempotent producer

PID = 4242


def producer_batch(first_seq: int, count: int = 2, epoch: int = 0, tag: str = "") -> bytes:
    return make_batch(
        [f"{tag}s{first_seq + i}".encode() for i in range(count)],
        producer_id=PID,
        producer_epoch=epoch,
        base_sequence=first_seq,
    )


def test_duplicate_retry_gets_original_offsets_and_is_stored_once(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock)
    log.append(make_batch([b"other"]))
    first = log.append(producer_batch(0))
    second = log.append(producer_batch(2))
    assert (first.base_offset, second.base_offset) == (1, 3)
    size = log.size_bytes
    retry = log.append(producer_batch(0))
    assert retry.duplicate
    assert (retry.base_offset, retry.last_offset) == (1, 2)
    retry = log.append(producer_batch(2))
    assert (retry.base_offset, retry.last_offset, retry.duplicate) == (3, 4, True)
    assert log.size_bytes == size
    assert read_values(log) == [b"other", b"s0", b"s1", b"s2", b"s3"]
    log.close()


def test_only_the_last_five_batches_are_remembered(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    for i in range(7):
        log.append(producer_batch(2 * i))
    for i in range(2, 7):
        assert log.append(producer_batch(2 * i)).duplicate
    # The first two batches are forgotten; a retry of them is out of order, not stored.
    with pytest.raises(OutOfOrderSequenceError):
        log.append(producer_batch(0))
    assert log.log_end_offset == 14
    log.close()


def test_out_of_order_sequence_and_old_epoch_rejected(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    log.append(producer_batch(0, epoch=3))
    log.append(producer_batch(2, epoch=3))
    before = dir_state(log_dir)
    with pytest.raises(OutOfOrderSequenceError):
        log.append(producer_batch(5, epoch=3))  # gap
    with pytest.raises(OutOfOrderSequenceError):
        log.append(producer_batch(1, epoch=3))  # overlaps, not a duplicate
    with pytest.raises(InvalidProducerEpochError):
        log.append(producer_batch(4, epoch=2))  # fenced
    with pytest.raises(OutOfOrderSequenceError):
        log.append(producer_batch(4, epoch=4))  # a new epoch starts at 0
    assert dir_state(log_dir) == before
    log.append(producer_batch(4, epoch=3))
    log.append(producer_batch(0, epoch=4, tag="e4"))
    with pytest.raises(InvalidProducerEpochError):
        log.append(producer_batch(6, epoch=3))
    assert read_values(log) == [b"s0", b"s1", b"s2", b"s3", b"s4", b"s5", b"e4s0", b"e4s1"]
    log.close()


def test_consecutive_batches_of_one_producer_in_one_request(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock)
    log.append(producer_batch(0))
    # A producer may send several in-order batches for a partition in one request.
    result = log.append(producer_batch(2) + producer_batch(4) + producer_batch(6))
    assert (result.base_offset, result.last_offset) == (2, 7)
    # Retrying the whole request is answered from the originals, stored once.
    retry = log.append(producer_batch(2) + producer_batch(4) + producer_batch(6))
    assert (retry.base_offset, retry.last_offset, retry.duplicate) == (2, 7, True)
    assert log.log_end_offset == 8
    # A gap inside one request is still out of order, and nothing of it is stored.
    with pytest.raises(OutOfOrderSequenceError):
        log.append(producer_batch(8) + producer_batch(12))
    assert log.log_end_offset == 8
    log.close()


def _producer_history(log: PartitionLog) -> list[tuple[int, int]]:
    """Append 8 batches of PID with rolls in between; returns (base, last) offsets."""
    offsets = []
    for i in range(8):
        result = log.append(producer_batch(2 * i))
        offsets.append((result.base_offset, result.last_offset))
        if i in (2, 5):
            log.roll()  # writes a producer-state snapshot
    return offsets


def _check_producer_state_restored(log: PartitionLog, offsets: list[tuple[int, int]]) -> None:
    end = log.log_end_offset
    for i in range(3, 8):  # the last five
        retry = log.append(producer_batch(2 * i))
        assert retry.duplicate
        assert (retry.base_offset, retry.last_offset) == offsets[i]
    with pytest.raises(OutOfOrderSequenceError):
        log.append(producer_batch(20))
    assert log.log_end_offset == end
    assert log.append(producer_batch(16)).base_offset == end


def test_producer_state_survives_clean_restart(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    offsets = _producer_history(log)
    log = reopen_clean(log, clock)
    _check_producer_state_restored(log, offsets)
    log.close()


@pytest.mark.parametrize("snapshots", ["kept", "deleted", "garbled"])
def test_producer_state_survives_unclean_restart(
    log_dir: Path, clock: ManualClock, snapshots: str
) -> None:
    log = open_log(log_dir, clock)
    offsets = _producer_history(log)
    crash(log_dir)
    found = sorted(log_dir.glob("*.snapshot"))
    assert found, "a roll writes a producer-state snapshot"
    for path in found:
        if snapshots == "deleted":
            path.unlink()
        elif snapshots == "garbled":
            path.write_bytes(b"{not json")
    log = open_log(log_dir, clock)  # unclean: snapshot (if any) + replay of later batches
    _check_producer_state_restored(log, offsets)
    log.close()


def test_producer_state_after_recovery_cuts_the_tail(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    log.append(producer_batch(0))
    log.append(producer_batch(2))
    log.flush()
    log.append(producer_batch(4))  # unflushed, will be lost
    crash(log_dir)
    active = segment_files(log_dir)[-1]
    with open(active, "r+b") as f:
        f.truncate(os.path.getsize(active) - 3)
    log = open_log(log_dir, clock)
    assert log.log_end_offset == 4
    # The lost batch was never stored: the producer's retry of it is new, not a duplicate.
    retry = log.append(producer_batch(4))
    assert (retry.duplicate, retry.base_offset) == (False, 4)
    assert read_values(log) == [b"s0", b"s1", b"s2", b"s3", b"s4", b"s5"]
    log.close()


# ---------------------------------------------------------------------- flushing


def test_flush_moves_the_recovery_point(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    assert log.recovery_point == 0
    log.append(make_batch(values(3)))
    assert log.recovery_point == 0
    log.flush(up_to_offset=2)
    assert log.recovery_point == 3  # a flush covers everything appended so far
    log.append(make_batch(values(2, 3)))
    log.flush(up_to_offset=3)  # already covered: nothing to do
    assert log.recovery_point == 3
    log.flush()
    assert log.recovery_point == 5
    log.close()


def test_flush_messages_flushes_every_n_records(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, log_config(flush_messages=3))
    log.append(make_batch(values(2)))
    assert log.recovery_point == 0
    log.append(make_batch(values(1, 2)))
    assert log.recovery_point == 3
    log.append(make_batch(values(2, 3)))
    assert log.recovery_point == 3
    log.close()


def test_flush_by_time_and_flush_sealed(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, log_config(flush_ms=1000))
    log.append(make_batch(values(2)))
    log.maybe_flush_by_time()
    assert log.recovery_point == 0
    clock.advance(1000)
    log.maybe_flush_by_time()
    assert log.recovery_point == 2
    log.append(make_batch(values(2, 2)))
    log.roll()
    log.append(make_batch(values(1, 4)))
    log.flush_sealed()
    assert log.recovery_point >= 4  # at least the sealed segment
    log.close()
    assert log.recovery_point == 5


# ---------------------------------------------------------------------- retention


def _fill_segments(log: PartitionLog, clock: ManualClock, count: int, per_segment: int = 2) -> None:
    """``count`` segments of ``per_segment`` one-record batches; segment k has timestamp
    T0 + k * 1000 and the clock is moved to match."""
    for k in range(count):
        for _ in range(per_segment):
            start = log.log_end_offset
            # Keyed: a compacted log refuses key-less records (#27).
            batch = make_batch(values(1, start), timestamp_ms=T0 + k * 1000, keys=[b"k%d" % start])
            log.append(batch)
        if k < count - 1:
            log.roll()
    clock.advance(T0 + (count - 1) * 1000 - clock.wall_ms())


def test_retention_by_time(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, log_config(retention_ms=2500, file_delete_delay_ms=5000))
    _fill_segments(log, clock, 5)  # segments at T0 .. T0+4000; now T0+4000
    assert log.delete_old_segments() == 2  # T0 and T0+1000 are more than 2500 ms old
    assert log.log_start_offset == 4
    clock.advance(1000)  # now T0+5000: T0+2000 is 3000 ms old
    assert log.delete_old_segments() == 1
    assert log.log_start_offset == 6
    clock.advance(500)  # T0+3000 is exactly retention.ms old: it stays
    assert log.delete_old_segments() == 0
    assert [s.base_offset for s in log.segments] == [6, 8]
    assert read_values(log) == values(4, 6)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(5, 100)
    clock.advance(1)
    assert log.delete_old_segments() == 1
    assert log.log_start_offset == 8
    log.close()


def test_retention_never_without_delete_policy(log_dir: Path, clock: ManualClock) -> None:
    config = log_config(retention_ms=1, retention_bytes=0, cleanup_policy="compact")
    log = open_log(log_dir, clock, config)
    _fill_segments(log, clock, 3)
    clock.advance(DAY_MS)
    assert log.delete_old_segments() == 0
    assert log.log_start_offset == 0
    log.update_config(log_config(retention_ms=-1, retention_bytes=-1))
    assert log.delete_old_segments() == 0
    log.close()


def test_retention_by_bytes(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, log_config(retention_ms=-1))
    _fill_segments(log, clock, 5)
    sizes = [s.size_bytes for s in log.segments]
    total = sum(sizes)
    # Allow all but 1.5 segments' worth: exactly one whole segment must go.
    log.update_config(log_config(retention_ms=-1, retention_bytes=total - sizes[0] - 1))
    assert log.delete_old_segments() == 1
    assert log.log_start_offset == 2
    # Exactly the size of what is left: nothing more goes.
    log.update_config(log_config(retention_ms=-1, retention_bytes=total - sizes[0]))
    assert log.delete_old_segments() == 0
    # Room for one segment only: all but the newest go.
    log.update_config(log_config(retention_ms=-1, retention_bytes=sizes[-1]))
    assert log.delete_old_segments() == 3
    assert log.log_start_offset == 8
    assert read_values(log) == values(2, 8)
    log.close()


def test_everything_expired_rolls_the_active_segment(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, log_config(retention_ms=1000))
    _fill_segments(log, clock, 3)
    clock.advance(5000)
    assert log.delete_old_segments() == 3
    assert (log.log_start_offset, log.log_end_offset) == (6, 6)
    assert [s.base_offset for s in log.segments] == [6]
    assert log.read(6, 100).records == b""
    assert log.append(make_batch([b"next"])).base_offset == 6
    assert read_values(log) == [b"next"]
    # An empty active segment is never deleted, however old.
    log2 = open_log(log_dir.with_name("other-0"), clock, log_config(retention_ms=1000))
    clock.advance(10_000)
    assert log2.delete_old_segments() == 0
    log2.close()
    log.close()


def test_deleted_files_are_unlinked_after_the_delay(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, log_config(retention_ms=1000, file_delete_delay_ms=60_000))
    _fill_segments(log, clock, 3)
    clock.advance(500)
    assert log.delete_old_segments() == 2
    doomed = sorted(p.name for p in log_dir.iterdir() if p.name.endswith(".deleted"))
    assert doomed == sorted(
        f"{base:020d}{suffix}.deleted"
        for base in (0, 2)
        for suffix in (".log", ".index", ".timeindex", ".batchtimes")
    )
    clock.advance(59_999)
    assert log.delete_expired_files() == 0
    assert all((log_dir / name).exists() for name in doomed)
    clock.advance(1)
    assert log.delete_expired_files() == 2
    assert not [p for p in log_dir.iterdir() if p.name.endswith(".deleted")]
    assert read_values(log) == values(2, 4)
    log.close()


def test_log_start_offset_survives_restart_through_checkpoints(
    tmp_path: Path, clock: ManualClock
) -> None:
    config = LogManagerConfig()
    manager = LogManager.open(tmp_path / "data", config, clock)
    manager.create_topic("t", 1, {"retention.ms": "1000", "segment.bytes": "200"})
    log = manager.get_log("t", 0)
    for i in range(10):
        log.append(make_batch(values(1, i), timestamp_ms=T0))
    clock.advance(2000)
    log.append(make_batch([b"fresh"], timestamp_ms=clock.wall_ms()))
    assert manager.run_retention() > 0
    start = log.log_start_offset
    assert start > 0
    manager.close()

    manager = LogManager.open(tmp_path / "data", config, clock)
    log = manager.get_log("t", 0)
    assert log.log_start_offset == start
    with pytest.raises(OffsetOutOfRangeError):
        log.read(start - 1, 100)
    assert read_values(log)[-1] == b"fresh"
    # Unclean: the checkpoint written by the scheduler's task is what survives.
    for i in range(10):
        log.append(make_batch(values(1, 100 + i), timestamp_ms=T0))
    log.append(make_batch([b"fresh2"], timestamp_ms=clock.wall_ms()))
    clock.advance(2000)
    log.append(make_batch([b"fresh3"], timestamp_ms=clock.wall_ms()))
    assert manager.run_retention() > 0
    start = log.log_start_offset
    manager.write_checkpoints()
    end = log.log_end_offset
    crash(tmp_path / "data")
    manager = LogManager.open(tmp_path / "data", config, clock)
    log = manager.get_log("t", 0)
    assert (log.log_start_offset, log.log_end_offset) == (start, end)
    assert read_values(log)[-1] == b"fresh3"
    manager.close()


def test_concurrent_appends_reads_and_flushes(log_dir: Path, clock: ManualClock) -> None:
    # Thread-safety: readers never see a torn or foreign batch while appends roll segments
    # and flushes run; every record read is the one written at that offset.
    log = open_log(log_dir, clock, log_config(segment_bytes=4000, index_interval_bytes=200))
    total = 600
    errors: list[BaseException] = []
    done = threading.Event()

    def appender() -> None:
        try:
            for i in range(total // 3):
                log.append(make_batch(values(3, start=3 * i)))
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)
        finally:
            done.set()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not done.is_set() or rng.random() < 0.5:
                end = log.log_end_offset
                if end == 0:
                    continue
                offset = rng.randrange(end)
                data = log.read(offset, rng.randrange(1, 3000)).records
                records = [r for r in decode_records(data) if r.offset >= offset]
                assert records
                for record in records:
                    assert record.value == f"v{record.offset}".encode()
        except BaseException as exc:
            errors.append(exc)

    def flusher() -> None:
        try:
            while not done.is_set():
                log.flush()
                assert log.recovery_point <= log.log_end_offset
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=appender), threading.Thread(target=flusher)]
    threads += [threading.Thread(target=reader, args=(seed,)) for seed in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert log.segment_count > 3
    assert read_values(log) == values(total)
    log.close()


# ---------------------------------------------------------------------- DeleteRecords


def test_increase_log_start_offset_hides_and_then_retention_deletes(
    tmp_path: Path, clock: ManualClock
) -> None:
    """DeleteRecords (KIP-107): the log start moves at once (reads below it are out of
    range), segments wholly below it go at the next retention pass, the new start
    survives a crash once checkpointed, and it never moves down or past the log end."""
    manager = LogManager.open(tmp_path, LogManagerConfig(), clock)
    manager.create_topic("dr", 1, {"segment.bytes": "200", "retention.ms": "-1"})
    log = manager.get_log("dr", 0)
    for i in range(6):
        log.append(make_batch(values(2, start=2 * i)))
    segments_before = log.segment_count
    assert segments_before > 2
    middle = log.segments[2].base_offset + 1  # inside the third segment
    assert log.increase_log_start_offset(middle)
    assert log.log_start_offset == middle
    with pytest.raises(OffsetOutOfRangeError):
        log.read(middle - 1, 1000)
    assert read_values(log, middle)[0] == b"v%d" % middle
    assert not log.increase_log_start_offset(middle - 1)  # never moves down
    assert log.log_start_offset == middle
    with pytest.raises(OffsetOutOfRangeError, match="high watermark"):
        log.increase_log_start_offset(log.log_end_offset + 1)
    assert log.segment_count == segments_before  # nothing deleted yet
    manager.checkpoint_log_start_offsets()
    assert manager.run_retention() == 2  # the two segments wholly below it
    assert log.segments[0].base_offset < middle
    assert log.log_start_offset == middle
    # A crash: only the checkpoint written above tells the next open where the log starts.
    crash(tmp_path)
    reopened = LogManager.open(tmp_path, LogManagerConfig(), clock)
    again = reopened.get_log("dr", 0)
    assert again.log_start_offset == middle
    with pytest.raises(OffsetOutOfRangeError):
        again.read(middle - 1, 1000)
    assert read_values(again, middle) == [b"v%d" % n for n in range(middle, 12)]
    # Up to the log end: everything deleted, appends continue at the same offsets.
    assert again.increase_log_start_offset(again.log_end_offset)
    assert again.append(make_batch([b"next"])).base_offset == 12
    reopened.close()
