"""Tests for log compaction (``storage.compaction``, ``storage.cleaner``) and its swap.

Logs live in real temporary directories and time is a ``ManualClock``. The property test
checks each round against a small model of Kafka's rules written here from the reference
(section 3.4), independently of the cleaner: which records a round keeps, which batches
get a delete horizon, and that replaying the log from offset 0 rebuilds the latest state.
The crash tests build, file by file, the directory a crash would leave at each step of the
swap and reopen it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offsets, write_offsets
from tidelog.storage.cleaner import LogCleaner
from tidelog.storage.clock import ManualClock
from tidelog.storage.compaction import (
    OFFSET_MAP_ENTRY_BYTES,
    CleanableRange,
    CleaningRules,
    OffsetMap,
    SegmentSummary,
    add_batch_to_offset_map,
    choose_log_to_clean,
    clean_batch,
    compaction_delay_ms,
    group_segments,
    plan_cleanable_range,
    should_retain_record,
)
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import (
    BatchBuilder,
    BatchHeader,
    Compression,
    Record,
    TimestampType,
    decode_batch,
    encode_batch,
    iter_batch_headers,
    read_header,
    validate_batch,
)
from tidelog.storage.segment import Segment

T0 = 1_700_000_000_000
RETENTION_MS = 1_000  # delete.retention.ms in most tests

FAST = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ====================================================================== helpers


def compact_config(**overrides: object) -> LogConfig:
    base: dict[str, object] = {
        "cleanup.policy": "compact",
        "segment.bytes": 300,
        "delete.retention.ms": RETENTION_MS,
        "file.delete.delay.ms": 0,
    }
    base.update(overrides)
    return LogConfig.from_mapping(base)


def open_log(directory: Path, clock: ManualClock, config: LogConfig) -> PartitionLog:
    return PartitionLog.open(directory, "t", 0, config, clock)


def append(
    log: PartitionLog,
    clock: ManualClock,
    records: Sequence[tuple[bytes | None, bytes | None]],
    *,
    timestamp_ms: int | None = None,
) -> int:
    """Append one batch of ``(key, value)`` records; returns its base offset.

    A compacted log refuses key-less records (#27); they reach one only from before it
    was made compact (a live ``cleanup.policy`` change), so such a batch is appended as
    the log was then, and the cleaner still meets them.
    """
    ts = clock.wall_ms() if timestamp_ms is None else timestamp_ms
    batch = encode_batch([(ts, k, v) for k, v in records])
    config = log.config
    if not (config.compact and any(k is None for k, _ in records)):
        return log.append(batch).base_offset
    log.update_config(dataclasses.replace(config, cleanup_policy="delete"))
    try:
        return log.append(batch).base_offset
    finally:
        log.update_config(config)


def read_batches(log: PartitionLog) -> list[tuple[BatchHeader, list[Record]]]:
    """Every stored batch from the log start, through the public read path."""
    out: list[tuple[BatchHeader, list[Record]]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20).records
        if not data:
            break
        for position, _ in iter_batch_headers(data):
            header, records = decode_batch(data, position)
            if header.last_offset >= offset:
                out.append((header, records))
                offset = header.next_offset
    return out


def read_all(log: PartitionLog) -> list[Record]:
    return [record for _, records in read_batches(log) for record in records]


def replay(records: Sequence[Record]) -> dict[bytes, bytes]:
    """What a consumer rebuilds from a compacted topic: key -> value, tombstones delete."""
    state: dict[bytes, bytes] = {}
    for record in records:
        if record.key is None:
            continue
        if record.value is None:
            state.pop(record.key, None)
        else:
            state[record.key] = record.value
    return state


# ====================================================================== pure: rules


def record(offset: int, key: bytes | None, value: bytes | None) -> Record:
    return Record(offset, T0, key, value)


def map_of(entries: dict[bytes, int]) -> OffsetMap:
    offset_map = OffsetMap(100)
    for key, offset in entries.items():
        assert offset_map.put(key, offset)
    return offset_map


@pytest.mark.parametrize(
    ("rec", "horizon", "expected"),
    [
        (record(20, b"a", b"v"), None, True),  # at or past the map's end: kept
        (record(20, None, b"v"), None, True),  # even without a key
        (record(5, None, b"v"), None, False),  # keyless below the end: dropped
        (record(5, b"a", b"v"), None, False),  # superseded by offset 9
        (record(9, b"a", b"v"), None, True),  # the latest of its key
        (record(3, b"z", b"v"), None, True),  # key unknown to the map: already clean
        (record(9, b"a", None), None, True),  # tombstone, no horizon yet
        (record(9, b"a", None), T0 + 1, True),  # tombstone before its horizon
        (record(9, b"a", None), T0, False),  # tombstone at its horizon
        (record(9, b"a", b"v"), T0 - 5, True),  # a value ignores the horizon
    ],
)
def test_should_retain_record(rec: Record, horizon: int | None, expected: bool) -> None:
    offset_map = map_of({b"a": 9, b"b": 12})
    assert (
        should_retain_record(
            rec, offset_map=offset_map, map_end_offset=20, delete_horizon_ms=horizon, now_ms=T0
        )
        is expected
    )


def test_offset_map_is_bounded_and_stops_mid_batch() -> None:
    offset_map = OffsetMap(2)
    assert offset_map.put(b"a", 0)
    assert offset_map.put(b"b", 1)
    assert offset_map.put(b"a", 2)  # an update needs no room
    assert not offset_map.put(b"c", 3)
    assert len(offset_map) == 2
    assert offset_map.get(b"a") == 2
    assert offset_map.get(b"c") == -1
    assert offset_map.latest_offset == 2
    with pytest.raises(ValueError, match="at least one"):
        OffsetMap(0)

    header, records = decode_batch(
        encode_batch([(T0, b"x", b"1"), (T0, None, b"2"), (T0, b"y", b"3"), (T0, b"z", b"4")])
    )
    small = OffsetMap(2)
    assert add_batch_to_offset_map(small, header, records, start_offset=0)
    assert small.latest_offset == 2  # the last record it took; the round ends at 3
    assert small.end_offset(0) == 3

    roomy = OffsetMap(10)
    assert not add_batch_to_offset_map(roomy, header, records, start_offset=1)
    assert roomy.get(b"x") == -1  # below the start offset
    assert roomy.latest_offset == 3
    assert roomy.end_offset(0) == 4
    assert OffsetMap(1).end_offset(7) == 7  # covers nothing: ends at the first dirty offset


def summary(base: int, end: int, size: int, max_ts: int = T0) -> SegmentSummary:
    return SegmentSummary(base, end, end, size, max_ts)


def test_plan_cleanable_range_checkpoint_and_ratio() -> None:
    segments = [
        summary(0, 10, 100),
        summary(10, 20, 100),
        summary(20, 30, 100),
        summary(30, 35, 50),
    ]
    fresh = plan_cleanable_range(
        segments,
        checkpoint_offset=None,
        log_start_offset=0,
        log_end_offset=35,
        now_ms=T0,
        min_compaction_lag_ms=0,
    )
    assert fresh == CleanableRange(0, 30, 0, 300)
    assert fresh.dirty_ratio == 1.0
    half = plan_cleanable_range(
        segments,
        checkpoint_offset=15,
        log_start_offset=0,
        log_end_offset=35,
        now_ms=T0,
        min_compaction_lag_ms=0,
    )
    # the segment holding offset 15 counts as clean and as cleanable, as in Kafka
    assert half == CleanableRange(15, 30, 200, 200)
    assert half.dirty_ratio == 0.5
    for bad in (36, -1):
        reset = plan_cleanable_range(
            segments,
            checkpoint_offset=bad,
            log_start_offset=0,
            log_end_offset=35,
            now_ms=T0,
            min_compaction_lag_ms=0,
        )
        assert reset.first_dirty_offset == 0
    clean = plan_cleanable_range(
        segments,
        checkpoint_offset=30,
        log_start_offset=0,
        log_end_offset=35,
        now_ms=T0,
        min_compaction_lag_ms=0,
    )
    assert clean.cleanable_bytes == 0
    assert clean.dirty_ratio == 0.0
    with pytest.raises(ValueError, match="segment"):
        plan_cleanable_range(
            [],
            checkpoint_offset=None,
            log_start_offset=0,
            log_end_offset=0,
            now_ms=T0,
            min_compaction_lag_ms=0,
        )


def test_plan_cleanable_range_min_compaction_lag() -> None:
    lag = 10_000
    segments = [
        summary(0, 10, 100, max_ts=T0 - 1),  # clean section: its age does not matter
        summary(10, 20, 100, max_ts=T0 - 20_000),
        summary(20, 30, 100, max_ts=T0 - 5_000),  # too new
        summary(30, 40, 100, max_ts=T0 - 20_000),
        summary(40, 45, 50, max_ts=T0),
    ]
    plan = plan_cleanable_range(
        segments,
        checkpoint_offset=10,
        log_start_offset=0,
        log_end_offset=45,
        now_ms=T0,
        min_compaction_lag_ms=lag,
    )
    assert plan.first_uncleanable_offset == 20
    assert plan.cleanable_bytes == 100
    later = plan_cleanable_range(
        segments,
        checkpoint_offset=10,
        log_start_offset=0,
        log_end_offset=45,
        now_ms=T0 + 5_001,
        min_compaction_lag_ms=lag,
    )
    assert later.first_uncleanable_offset == 40


def test_choose_log_to_clean() -> None:
    assert choose_log_to_clean([]) is None
    low = CleanableRange(0, 10, 300, 100)  # 0.25
    high = CleanableRange(0, 10, 100, 300)  # 0.75
    at_min = CleanableRange(0, 10, 100, 100)  # 0.5: not strictly above 0.5
    empty = CleanableRange(10, 10, 100, 0)
    assert choose_log_to_clean([(low, 0.5, False), (high, 0.5, False), (at_min, 0.5, False)]) == 1
    assert choose_log_to_clean([(low, 0.2, False), (at_min, 0.5, False), (empty, 0.0, False)]) == 0
    assert choose_log_to_clean([(at_min, 0.5, False), (empty, 0.0, False)]) is None
    # KIP-354: past max.compaction.lag.ms a log is cleaned whatever its ratio, not if empty.
    assert choose_log_to_clean([(at_min, 0.5, True), (empty, 0.0, True)]) == 0


def test_group_segments() -> None:
    sizes = [summary(0, 10, 100), summary(10, 20, 100), summary(20, 30, 100), summary(30, 40, 250)]
    assert group_segments(sizes, max_segment_bytes=300, max_index_bytes=1000) == [(0, 3), (3, 4)]
    big = [summary(0, 10, 500), summary(10, 20, 10)]
    assert group_segments(big, max_segment_bytes=300, max_index_bytes=1000) == [(0, 1), (1, 2)]
    indexed = [
        SegmentSummary(0, 10, 10, 10, T0, offset_index_bytes=80),
        SegmentSummary(10, 20, 20, 10, T0, offset_index_bytes=80),
        SegmentSummary(20, 30, 30, 10, T0, time_index_bytes=200),
    ]
    assert group_segments(indexed, max_segment_bytes=1000, max_index_bytes=100) == [
        (0, 1),
        (1, 2),
        (2, 3),
    ]
    far = [
        summary(0, 10, 10),
        summary(2**31 - 5, 2**31 + 10, 10),
        summary(2**31 + 10, 2**31 + 20, 0),
    ]
    # relative offsets must fit int32; an empty segment joins regardless
    assert group_segments(far, max_segment_bytes=1000, max_index_bytes=1000) == [(0, 1), (1, 3)]
    assert group_segments([], max_segment_bytes=1, max_index_bytes=1) == []


# ====================================================================== pure: clean_batch


def rules(
    entries: dict[bytes, int],
    *,
    map_end: int = 1_000,
    round_end: int = -1,
    now_ms: int = T0,
    max_batch_bytes: int = 1 << 20,
    producers: dict[int, int] | None = None,
) -> CleaningRules:
    known = producers or {}
    return CleaningRules(
        offset_map=map_of(entries),
        map_end_offset=map_end,
        round_end_offset=round_end,
        now_ms=now_ms,
        delete_retention_ms=RETENTION_MS,
        max_batch_bytes=max_batch_bytes,
        producer_last_offset=known.get,
    )


def test_clean_batch_copies_a_batch_with_nothing_to_drop() -> None:
    batch = encode_batch([(T0, b"a", b"1"), (T0 + 1, b"b", b"2")], base_offset=10)
    assert clean_batch(batch, rules({b"a": 10, b"b": 11})) is batch


def test_clean_batch_rebuild_keeps_offsets_and_producer_fields() -> None:
    builder = BatchBuilder(
        compression=Compression.LZ4,
        base_offset=100,
        producer_id=7,
        producer_epoch=3,
        base_sequence=40,
        partition_leader_epoch=9,
    )
    for i, key in enumerate([b"a", b"b", b"a", b"c", b"b"]):
        builder.append(T0 + i, key, b"v%d" % i, [("h", b"x")])
    original = builder.build()
    cleaned = clean_batch(original, rules({b"a": 102, b"b": 104, b"c": 50}))
    assert cleaned is not None
    header = validate_batch(cleaned)
    before = read_header(original)
    assert header.base_offset == 100
    assert header.last_offset_delta == before.last_offset_delta == 4
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 3, 40)
    assert header.last_sequence == before.last_sequence
    assert header.partition_leader_epoch == 9
    assert header.compression == Compression.LZ4
    assert header.delete_horizon_ms is None
    _, records = decode_batch(cleaned)
    assert [(r.offset, r.key, r.value, r.timestamp_ms) for r in records] == [
        (102, b"a", b"v2", T0 + 2),
        (103, b"c", b"v3", T0 + 3),
        (104, b"b", b"v4", T0 + 4),
    ]
    assert all(r.headers == (("h", b"x"),) for r in records)
    # dropping the last record keeps the batch's last offset, hence its last sequence
    tail_dropped = clean_batch(original, rules({b"a": 102, b"b": 999, b"c": 50}))
    assert tail_dropped is not None
    header = validate_batch(tail_dropped)
    assert header.records_count == 2
    assert header.last_offset == 104
    assert header.last_sequence == before.last_sequence


def test_clean_batch_tombstone_gets_a_horizon_then_expires() -> None:
    original = encode_batch([(T0 - 50, b"a", b"old"), (T0 - 40, b"a", None)], base_offset=0)
    first = clean_batch(original, rules({b"a": 1}))
    assert first is not None
    header, records = decode_batch(first)
    assert header.delete_horizon_ms == T0 + RETENTION_MS
    assert [(r.offset, r.value, r.timestamp_ms) for r in records] == [(1, None, T0 - 40)]
    # a later round before the horizon keeps it byte for byte
    assert clean_batch(first, rules({}, now_ms=T0 + RETENTION_MS - 1)) is first
    # at the horizon the tombstone goes, and with it the batch
    assert clean_batch(first, rules({}, now_ms=T0 + RETENTION_MS)) is None


def test_clean_batch_empty_batches_kept_only_when_kafka_would() -> None:
    def producer_batch(base_offset: int) -> bytes:
        builder = BatchBuilder(base_offset=base_offset, producer_id=5, base_sequence=0)
        builder.append(T0, b"a", b"1")
        builder.append(T0, b"a", b"2")
        return builder.build()

    superseded = {b"a": 99}
    assert clean_batch(producer_batch(10), rules(superseded)) is None
    assert clean_batch(producer_batch(10), rules(superseded, producers={5: 99})) is None
    for kept in (
        clean_batch(producer_batch(10), rules(superseded, producers={5: 11})),
        clean_batch(producer_batch(10), rules(superseded, round_end=12)),
    ):
        assert kept is not None
        header = validate_batch(kept)
        assert header.records_count == 0
        assert (header.base_offset, header.last_offset) == (10, 11)
        assert header.max_timestamp == T0
    plain = encode_batch([(T0, b"a", b"1")], base_offset=3)
    assert clean_batch(plain, rules(superseded, producers={-1: 3})) is None
    # an empty batch an earlier round kept is dropped once it no longer matters
    empty = clean_batch(producer_batch(10), rules(superseded, round_end=12))
    assert empty is not None
    assert clean_batch(empty, rules(superseded, round_end=12)) is empty
    assert clean_batch(empty, rules(superseded, round_end=50)) is None


def test_clean_batch_log_append_time() -> None:
    batch = bytearray(
        encode_batch(
            [(T0, b"a", b"1"), (T0, b"b", b"2")],
            base_offset=0,
            timestamp_type=TimestampType.LOG_APPEND_TIME,
        )
    )
    cleaned = clean_batch(bytes(batch), rules({b"a": 5, b"b": 1}))
    assert cleaned is not None
    header, records = decode_batch(cleaned)
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == T0
    assert [(r.offset, r.key, r.timestamp_ms) for r in records] == [(1, b"b", T0)]


def test_clean_batch_keeps_a_batch_that_would_outgrow_the_limit() -> None:
    tombstones = encode_batch([(T0 - 10_000_000, b"k%d" % i, None) for i in range(50)])
    grown = clean_batch(tombstones, rules({}))
    assert grown is not None
    assert len(grown) > len(tombstones)
    assert clean_batch(tombstones, rules({}, max_batch_bytes=len(tombstones))) is tombstones


def test_clean_batch_rejects_records_that_do_not_decompress() -> None:
    batch = bytearray(encode_batch([(T0, b"a", b"1")]))
    gzip_batch(batch)
    with pytest.raises(CorruptRecordError, match="bad gzip data"):
        clean_batch(bytes(batch), rules({}))


def gzip_batch(batch: bytearray) -> None:
    """Mark a batch gzip-compressed (its payload is not gzip; only decoding notices)."""
    batch[22] |= Compression.GZIP
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))


# ====================================================================== logs: basics


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall_ms=T0)


def test_clean_log_keeps_latest_values_and_offsets(tmp_path: Path, clock: ManualClock) -> None:
    log = open_log(tmp_path / "t-0", clock, compact_config())
    history: list[tuple[bytes | None, bytes | None]] = []
    for i in range(60):
        key = b"k%d" % (i % 7)
        value = None if i % 11 == 10 else b"v%d" % i
        history.append((key, value))
        append(log, clock, [(key, value)])
    before = read_all(log)
    end = log.log_end_offset
    segments_before = log.segment_count
    active_base = log.segments[-1].base_offset
    cleaner = LogCleaner(tmp_path, clock)

    result = cleaner.clean_log(log, force=True)

    assert result.cleaned
    assert result.first_dirty_offset == 0
    assert result.first_uncleanable_offset == result.end_offset == active_base
    assert log.log_end_offset == end
    assert result.bytes_after < result.bytes_before
    # full segments are not merged (groups are planned on their old sizes); the next round
    # merges the now small ones, as Kafka's does
    assert log.segment_count == segments_before
    assert cleaner.clean_log(log, force=True).cleaned
    assert log.segment_count < segments_before
    after = read_all(log)
    assert set(after) <= set(before)
    offsets = [r.offset for r in after]
    assert offsets == sorted(set(offsets))
    assert [r for r in after if r.offset >= active_base] == [
        r for r in before if r.offset >= active_base
    ]
    latest = {r.key: r for r in before if r.offset < active_base}
    assert [r for r in after if r.offset < active_base] == sorted(
        latest.values(), key=lambda r: r.offset
    )
    assert replay(after) == replay(before)
    assert result.records_read == active_base
    assert result.records_retained == len(latest)
    # after a restart the same records come back
    log.close()
    reopened = open_log(tmp_path / "t-0", clock, compact_config())
    assert read_all(reopened) == after
    reopened.close()


def test_clean_log_without_force_needs_a_dirty_ratio(tmp_path: Path, clock: ManualClock) -> None:
    config = compact_config(**{"min.cleanable.dirty.ratio": 0.5, "segment.bytes": 10_000})
    log = open_log(tmp_path / "t-0", clock, config)
    for i in range(20):
        append(log, clock, [(b"k%d" % (i % 3), b"v")])
    log.roll()
    cleaner = LogCleaner(tmp_path, clock)
    assert cleaner.clean_log(log).cleaned  # ratio 1.0 on a log never cleaned
    assert not cleaner.clean_log(log).cleaned  # nothing dirty any more
    append(log, clock, [(b"k0", b"w")])
    log.roll()
    result = cleaner.clean_log(log)  # a little dirt on a mostly clean log
    assert not result.cleaned
    assert 0.0 < result.dirty_ratio <= 0.5
    delete_log = PartitionLog.open(tmp_path / "d-0", "d", 0, LogConfig(segment_bytes=100), clock)
    for _ in range(5):
        append(delete_log, clock, [(b"k", b"v")])
    assert not cleaner.clean_log(delete_log).cleaned  # not compacted
    log.close()
    delete_log.close()


def test_active_segment_never_touched(tmp_path: Path, clock: ManualClock) -> None:
    log = open_log(tmp_path / "t-0", clock, compact_config(**{"segment.bytes": 10_000}))
    for i in range(10):
        append(log, clock, [(b"k", b"v%d" % i)])
    before = read_all(log)
    result = LogCleaner(tmp_path, clock).clean_log(log, force=True)
    assert not result.cleaned
    assert result.first_uncleanable_offset == 0
    assert read_all(log) == before
    log.close()


def test_min_compaction_lag(tmp_path: Path, clock: ManualClock) -> None:
    lag = 10_000
    log = open_log(tmp_path / "t-0", clock, compact_config(**{"min.compaction.lag.ms": lag}))
    for i in range(12):  # old records
        append(log, clock, [(b"k%d" % (i % 2), b"old%d" % i)], timestamp_ms=T0 - 20_000)
    log.roll()
    young_base = log.log_end_offset
    for i in range(12):  # young records, superseding the old ones
        append(log, clock, [(b"k%d" % (i % 2), b"new%d" % i)], timestamp_ms=T0 - 1_000)
    log.roll()
    append(log, clock, [(b"x", b"active")])
    before = read_all(log)
    cleaner = LogCleaner(tmp_path, clock)

    first = cleaner.clean_log(log, force=True)

    assert first.first_uncleanable_offset == young_base
    after = read_all(log)
    assert [r for r in after if r.offset >= young_base] == [
        r for r in before if r.offset >= young_base
    ]
    # the old section is deduplicated within itself only: one record per key survives
    assert [r.value for r in after if r.offset < young_base] == [b"old10", b"old11"]

    clock.advance(8_999)  # the young records are 9.999 s old: still within the lag
    assert cleaner.clean_log(log, force=True).first_uncleanable_offset == young_base
    clock.advance(1)
    second = cleaner.clean_log(log, force=True)
    assert second.cleaned
    assert second.first_uncleanable_offset == log.segments[-1].base_offset
    assert [r.value for r in read_all(log)] == [b"new10", b"new11", b"active"]
    log.close()


def test_max_compaction_lag_cleans_a_log_below_its_dirty_ratio(
    tmp_path: Path, clock: ManualClock
) -> None:
    """KIP-354: once the oldest dirty record is older than max.compaction.lag.ms, the log
    is cleaned (by ``clean_once`` and ``clean_log``) although its dirty ratio is below
    min.cleanable.dirty.ratio; before that, not."""
    config = compact_config(
        **{
            "min.cleanable.dirty.ratio": 0.99,
            "max.compaction.lag.ms": 60_000,
            "segment.bytes": 10_000,
        }
    )
    log = open_log(tmp_path / "t-0", clock, config)
    cleaner = LogCleaner(tmp_path, clock)
    for i in range(20):
        append(log, clock, [(b"k%d" % (i % 4), b"v%d" % i)])
    log.roll()
    assert cleaner.clean_once([log]) == 1  # never cleaned: ratio 1.0
    append(log, clock, [(b"k0", b"late")])  # a little dirt: ratio far below 0.99
    log.roll()
    append(log, clock, [(b"x", b"active")])
    assert cleaner.clean_once([log]) == 0
    assert not cleaner.clean_log(log).cleaned
    clock.advance(60_001)  # the dirty record is now older than max.compaction.lag.ms
    assert cleaner.clean_once([log]) == 1
    assert [r.value for r in read_all(log)] == [b"v17", b"v18", b"v19", b"late", b"active"]
    log.close()


def test_compaction_delay_ms() -> None:
    segments = [
        SegmentSummary(0, 10, 10, 100, T0, first_batch_timestamp_ms=T0 - 5_000),
        SegmentSummary(10, 20, 20, 100, T0, first_batch_timestamp_ms=T0 - 2_000),
        SegmentSummary(20, 25, 25, 50, T0, first_batch_timestamp_ms=T0 - 9_999),  # active
    ]
    assert compaction_delay_ms(segments, 0, T0, 1_000) == 4_000  # the oldest dirty: -5 s
    assert compaction_delay_ms(segments, 10, T0, 1_000) == 1_000  # segment 0 clean
    assert compaction_delay_ms(segments, 10, T0, 3_000) == 0  # not past the lag yet
    assert compaction_delay_ms(segments, 20, T0, 0) == 0  # only the active one is dirty


def test_tombstone_lifecycle(tmp_path: Path, clock: ManualClock) -> None:
    log = open_log(tmp_path / "t-0", clock, compact_config(**{"delete.retention.ms": 5_000}))
    append(log, clock, [(b"gone", b"1")])
    append(log, clock, [(b"keep", b"1")])
    tombstone_offset = append(log, clock, [(b"gone", None)])
    log.roll()
    append(log, clock, [(b"other", b"1")])
    cleaner = LogCleaner(tmp_path, clock)

    cleaner.clean_log(log, force=True)

    batches = {h.base_offset: (h, rs) for h, rs in read_batches(log)}
    header, records = batches[tombstone_offset]
    assert [r.value for r in records] == [None]  # survives the first cleaning
    assert header.delete_horizon_ms == T0 + 5_000
    assert [r.value for r in read_all(log) if r.key == b"gone"] == [None]
    assert replay(read_all(log)) == {b"keep": b"1", b"other": b"1"}

    clock.advance(4_999)
    log.roll()
    cleaner.clean_log(log, force=True)
    assert tombstone_offset in {r.offset for r in read_all(log)}

    clock.advance(1)
    append(log, clock, [(b"more", b"1")])
    log.roll()
    cleaner.clean_log(log, force=True)
    assert tombstone_offset not in {r.offset for r in read_all(log)}
    assert replay(read_all(log)) == {b"keep": b"1", b"other": b"1", b"more": b"1"}
    log.close()


def test_small_offset_map_cleans_in_several_rounds(tmp_path: Path, clock: ManualClock) -> None:
    log = open_log(tmp_path / "t-0", clock, compact_config())
    for round_ in range(3):
        for k in range(10):
            append(log, clock, [(b"k%d" % k, b"r%d" % round_)])
    log.roll()
    append(log, clock, [(b"active", b"1")])
    before = read_all(log)
    active_base = log.segments[-1].base_offset
    cleaner = LogCleaner(tmp_path, clock, dedupe_buffer_bytes=3 * OFFSET_MAP_ENTRY_BYTES)

    first = cleaner.clean_log(log, force=True)

    assert first.cleaned
    assert first.offset_map_full
    assert first.end_offset == 3  # k0, k1, k2 mapped, then full at k3
    assert [r for r in read_all(log) if r.offset >= first.end_offset] == [
        r for r in before if r.offset >= first.end_offset
    ]
    rounds = 1
    result = first
    while result.end_offset < active_base:
        result = cleaner.clean_log(log, force=True)
        assert result.first_dirty_offset < result.end_offset
        rounds += 1
    assert rounds > 3
    assert replay(read_all(log)) == replay(before)
    assert [r.value for r in read_all(log)] == [b"r2"] * 10 + [b"1"]
    with pytest.raises(ValueError, match="dedupe_buffer_bytes"):
        LogCleaner(tmp_path, clock, dedupe_buffer_bytes=OFFSET_MAP_ENTRY_BYTES - 1)
    log.close()


def test_cleaner_offset_checkpoint(tmp_path: Path, clock: ManualClock) -> None:
    log = open_log(tmp_path / "t-0", clock, compact_config())
    for i in range(20):
        append(log, clock, [(b"k%d" % (i % 4), b"v")])
    first = LogCleaner(tmp_path, clock).clean_log(log, force=True)
    checkpoint = tmp_path / CLEANER_OFFSET_CHECKPOINT
    assert read_offsets(checkpoint) == {("t", 0): first.end_offset}

    for i in range(20):
        append(log, clock, [(b"k%d" % (i % 4), b"w")])
    second = LogCleaner(tmp_path, clock).clean_log(log, force=True)  # a restarted cleaner
    assert second.first_dirty_offset == first.end_offset
    assert read_offsets(checkpoint) == {("t", 0): second.end_offset}

    write_offsets(checkpoint, {("t", 0): log.log_end_offset + 100})
    assert LogCleaner(tmp_path, clock).clean_log(log, force=True).first_dirty_offset == 0
    checkpoint.write_text("garbage\n")
    assert LogCleaner(tmp_path, clock).clean_log(log, force=True).first_dirty_offset == 0
    log.close()


def test_clean_once_picks_the_dirtiest_and_sets_broken_logs_aside(
    tmp_path: Path, clock: ManualClock
) -> None:
    config = compact_config(**{"min.cleanable.dirty.ratio": 0.1})
    logs = {
        name: PartitionLog.open(tmp_path / f"{name}-0", name, 0, config, clock)
        for name in ("dirty", "dirtier", "broken")
    }
    deleted = PartitionLog.open(tmp_path / "del-0", "del", 0, LogConfig(segment_bytes=100), clock)
    for i in range(20):
        append(deleted, clock, [(b"k", b"v")])
        append(logs["dirty"], clock, [(b"k%d" % (i % 2), b"v")])
        append(logs["dirtier"], clock, [(b"k%d" % (i % 2), b"v")])
        append(logs["broken"], clock, [(b"k%d" % (i % 2), b"v")])
    cleaner = LogCleaner(tmp_path, clock)
    assert cleaner.clean_log(logs["dirty"], force=True).cleaned
    assert cleaner.clean_log(logs["dirtier"], force=True).cleaned
    for i in range(10):  # dirtier gets more new data than dirty
        append(logs["dirtier"], clock, [(b"k%d" % (i % 2), b"w")])
        if i < 4:
            append(logs["dirty"], clock, [(b"k%d" % (i % 2), b"w")])
    for log in logs.values():
        log.roll()
    # A batch marked gzip whose records are not (the CRC vouches for it: a bad producer).
    active = logs["broken"].segments[-1]
    position = active.size_bytes
    logs["broken"].append(encode_batch([(T0, b"k", b"v")]))
    logs["broken"].roll()
    broken = bytearray(active.read_range(position, active.size_bytes))
    gzip_batch(broken)
    with open(active.log_path, "r+b") as file:
        file.seek(position)
        file.write(broken)
    everything = [*logs.values(), deleted]

    dirty_before = read_all(logs["dirty"])
    checkpoint = tmp_path / CLEANER_OFFSET_CHECKPOINT

    assert cleaner.clean_once(everything) == 0  # "broken" is the dirtiest (never cleaned)
    assert cleaner.clean_once(everything) == 1  # "broken" set aside: "dirtier" is next
    assert read_all(logs["dirty"]) == dirty_before
    assert [r.value for r in read_all(logs["dirtier"])] == [b"w", b"w"]
    assert read_offsets(checkpoint)[("dirtier", 0)] == logs["dirtier"].segments[-1].base_offset
    assert cleaner.clean_once(everything) == 1
    assert [r.value for r in read_all(logs["dirty"])] == [b"w", b"w"]
    assert cleaner.clean_once(everything) == 0
    assert ("broken", 0) not in read_offsets(checkpoint)
    with pytest.raises(CorruptRecordError):
        cleaner.clean_log(logs["broken"], force=True)
    assert not list((tmp_path / "broken-0").glob("*.cleaned"))
    for log in everything:
        log.close()


def test_clean_once_returns_zero_when_nothing_is_dirty(tmp_path: Path, clock: ManualClock) -> None:
    log = open_log(tmp_path / "t-0", clock, compact_config())
    for i in range(20):
        append(log, clock, [(b"k%d" % (i % 3), b"v")])
    cleaner = LogCleaner(tmp_path, clock)
    assert cleaner.clean_once([log]) == 1
    assert cleaner.clean_once([log]) == 0
    assert cleaner.clean_once([]) == 0
    # a partition that is gone loses its checkpoint entry
    assert read_offsets(tmp_path / CLEANER_OFFSET_CHECKPOINT) == {}
    log.close()


def test_idempotent_retry_is_still_a_duplicate_after_compaction(
    tmp_path: Path, clock: ManualClock
) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory, clock, compact_config())

    def producer_batch(sequence: int, key: bytes) -> bytes:
        builder = BatchBuilder(producer_id=42, producer_epoch=0, base_sequence=sequence)
        builder.append(clock.wall_ms(), key, b"p%d" % sequence)
        builder.append(clock.wall_ms(), key, b"p%d'" % sequence)
        return builder.build()

    originals = [log.append(producer_batch(seq, b"p")) for seq in (0, 2, 4)]
    for i in range(15):  # plain records supersede every record the producer wrote
        append(log, clock, [(b"p", b"plain%d" % i)])
    log.roll()
    append(log, clock, [(b"x", b"active")])
    LogCleaner(tmp_path, clock).clean_log(log, force=True)

    producer_batches = [h for h, _ in read_batches(log) if h.producer_id == 42]
    # only the producer's last batch stays, emptied, with its offsets and sequences
    assert [
        (h.base_offset, h.last_offset, h.records_count, h.base_sequence) for h in producer_batches
    ] == [(originals[-1].base_offset, originals[-1].last_offset, 0, 4)]
    retry = log.append(producer_batch(4, b"p"))
    assert retry.duplicate
    assert retry.base_offset == originals[-1].base_offset

    # after a restart that rebuilds producer state from the log alone
    log.close()
    for snapshot in directory.glob("*.snapshot"):
        snapshot.unlink()
    reopened = open_log(directory, clock, compact_config())
    retry = reopened.append(producer_batch(4, b"p"))
    assert retry.duplicate
    assert retry.last_offset == originals[-1].last_offset
    assert not reopened.append(producer_batch(6, b"p")).duplicate  # sequence continues
    reopened.close()


def test_compact_delete_obeys_retention(tmp_path: Path, clock: ManualClock) -> None:
    config = {
        "cleanup.policy": "compact,delete",
        "retention.ms": "60000",
        "segment.bytes": "300",
        "min.cleanable.dirty.ratio": "0.01",
        "file.delete.delay.ms": "0",
    }
    manager = LogManager.open(tmp_path, LogManagerConfig(), clock)
    assert isinstance(manager.cleaner, LogCleaner)
    manager.create_topic("cd", 1, config)
    log = manager.get_log("cd", 0)
    for i in range(30):
        append(log, clock, [(b"old%d" % (i % 3), b"v%d" % i)])
    log.roll()
    clock.advance(30_000)
    # Cleaned 30 s after writing: most old segments come out empty, and an empty segment
    # must still look 30 s old to retention, or it would hold back every segment after it.
    assert manager.run_cleaner() == 1
    assert replay(read_all(log)) == {b"old0": b"v27", b"old1": b"v28", b"old2": b"v29"}
    for i in range(30):
        append(log, clock, [(b"new%d" % (i % 3), b"w%d" % i)])
    log.roll()
    manager.close()  # the cleaned segments' age must survive a restart too
    clock.advance(31_000)  # the old records are 61 s old, the new ones 31 s
    manager = LogManager.open(tmp_path, LogManagerConfig(), clock)
    log = manager.get_log("cd", 0)

    assert manager.run_retention() > 0
    assert log.log_start_offset == 30
    assert replay(read_all(log)) == {b"new0": b"w27", b"new1": b"w28", b"new2": b"w29"}
    assert isinstance(manager.cleaner, LogCleaner)
    result = manager.cleaner.clean_log(log)
    assert result.cleaned
    assert result.first_dirty_offset == 30  # the checkpoint, now the log start
    assert [r.value for r in read_all(log)] == [b"w27", b"w28", b"w29"]
    clock.advance(30_000)
    assert manager.run_retention() > 0  # cleaned segments keep their records' age
    assert read_all(log) == []
    manager.close()


def test_log_manager_attaches_a_cleaner_only_when_enabled(
    tmp_path: Path, clock: ManualClock
) -> None:
    enabled = LogManager.open(tmp_path / "a", LogManagerConfig(), clock)
    assert isinstance(enabled.cleaner, LogCleaner)
    assert enabled.cleaner.data_dir == enabled.data_dir
    enabled.close()
    disabled = LogManager.open(tmp_path / "b", LogManagerConfig(cleaner_enabled=False), clock)
    assert disabled.cleaner is None
    assert disabled.run_cleaner() == 0
    disabled.close()


# ====================================================================== property


@dataclass
class ModelRecord:
    record: Record
    batch: int  # base offset of its batch


KEYS = st.sampled_from([b"a", b"b", b"c", b"d", None])
VALUES = st.one_of(st.none(), st.binary(min_size=1, max_size=6))
BATCHES = st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=3)
ROUNDS = st.lists(
    st.tuples(st.lists(BATCHES, min_size=1, max_size=14), st.integers(0, 2 * RETENTION_MS)),
    min_size=1,
    max_size=3,
)


@FAST
@given(rounds=ROUNDS)
def test_compaction_matches_the_model(
    rounds: list[tuple[list[list[tuple[bytes | None, bytes | None]]], int]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        check_rounds(Path(tmp), rounds)


def check_rounds(
    tmp: Path, rounds: list[tuple[list[list[tuple[bytes | None, bytes | None]]], int]]
) -> None:
    clock = ManualClock(wall_ms=T0)
    log = open_log(tmp / "t-0", clock, compact_config(**{"segment.bytes": 200}))
    cleaner = LogCleaner(tmp, clock)
    model: list[ModelRecord] = []
    horizons: dict[int, int] = {}  # batch base offset -> delete horizon
    history: list[Record] = []
    spans: set[tuple[int, int]] = set()  # (base offset, last offset) of every batch written
    first_dirty = 0
    for batches, advance_ms in rounds:
        for batch in batches:
            base = append(log, clock, batch)
            spans.add((base, base + len(batch) - 1))
            for i, (key, value) in enumerate(batch):
                rec = Record(base + i, clock.wall_ms(), key, value)
                model.append(ModelRecord(rec, base))
                history.append(rec)
        clock.advance(advance_ms)
        before = read_all(log)
        log_end = log.log_end_offset
        active_base = log.segments[-1].base_offset
        now = clock.wall_ms()

        result = cleaner.clean_log(log, force=True)

        # The model: Kafka's rules over the records, independent of the cleaner.
        map_end = max(active_base, first_dirty)
        latest: dict[bytes, int] = {}
        for m in model:
            if first_dirty <= m.record.offset < map_end and m.record.key is not None:
                latest[m.record.key] = m.record.offset
        kept: list[ModelRecord] = []
        for m in model:
            r = m.record
            horizon = horizons.get(m.batch)
            if r.offset >= map_end or (
                r.key is not None
                and r.offset >= latest.get(r.key, -1)
                and (r.value is not None or horizon is None or now < horizon)
            ):
                kept.append(m)
        for m in kept:
            if m.record.offset < map_end and m.record.value is None and m.batch not in horizons:
                horizons[m.batch] = now + RETENTION_MS
        model = kept
        first_dirty = map_end

        after = read_all(log)
        assert result.first_uncleanable_offset == active_base
        assert result.end_offset == map_end
        assert after == [m.record for m in model]
        assert log.log_end_offset == log_end
        offsets = [r.offset for r in after]
        assert offsets == sorted(set(offsets))
        assert set(after) <= set(before)
        assert [r for r in after if r.offset >= active_base] == [
            r for r in before if r.offset >= active_base
        ]
        assert replay(after) == replay(history)
        for header, _ in read_batches(log):
            assert (header.base_offset, header.last_offset) in spans
            if header.base_offset < map_end:
                assert header.delete_horizon_ms == horizons.get(header.base_offset)
    log.close()


# ====================================================================== crash safety


class SnapshottingLog(PartitionLog):
    """A partition log that copies its directory just before and after each swap.

    Each copy is what a crash at that moment would leave on disk (everything is fsynced
    by then), so reopening it shows what such a crash does.
    """

    snapshots: list[tuple[str, Path]]

    def replace_segments(self, new: Sequence[Segment], old: Sequence[Segment]) -> bool:
        snapshots = self.__dict__.setdefault("snapshots", [])
        target = self.directory.parent / f"crash-{len(snapshots)}" / self.directory.name
        shutil.copytree(self.directory, target)
        snapshots.append(("before swap", target))
        swapped = super().replace_segments(new, old)
        target = self.directory.parent / f"crash-{len(snapshots)}" / self.directory.name
        shutil.copytree(self.directory, target)
        snapshots.append(("after swap", target))
        return swapped


def test_a_crash_before_or_after_the_swap_is_all_or_nothing(
    tmp_path: Path, clock: ManualClock
) -> None:
    config = compact_config(**{"segment.bytes": 1_000})
    log = SnapshottingLog.open(tmp_path / "t-0", "t", 0, config, clock)
    for i in range(40):
        append(log, clock, [(b"k%d" % (i % 4), b"v%d" % i)])
        if i % 3 == 2:
            log.roll()
    before = read_all(log)
    result = LogCleaner(tmp_path, clock).clean_log(log, force=True)
    assert len(result.new_base_offsets) >= 2  # several groups
    after = read_all(log)
    log.close()
    assert isinstance(log, SnapshottingLog)
    assert log.snapshots
    for moment, directory in log.snapshots:
        reopened = open_log(directory, clock, config)
        assert read_all(reopened) == (before if moment == "before swap" else after), moment
        reopened.close()


@dataclass(frozen=True)
class Swap:
    """A finished round: the files before and after, and which segments it replaced."""

    before_files: dict[str, bytes]
    after_files: dict[str, bytes]
    old_bases: tuple[int, ...]
    new_bases: tuple[int, ...]
    before: list[Record]
    after: list[Record]
    log_end: int


SEGMENT_EXTENSIONS = (".log", ".index", ".timeindex", ".batchtimes")


def snapshot_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def segment_names(base: int) -> list[str]:
    return [f"{base:020d}{ext}" for ext in SEGMENT_EXTENSIONS]


def make_swap(directory: Path, clock: ManualClock) -> Swap:
    # Small segments (rolled by hand) so that a round merges several into each group.
    config = compact_config(**{"segment.bytes": 1_000})
    log = open_log(directory, clock, config)
    for i in range(70):
        key = b"k%d" % (i % 6)
        append(log, clock, [(key, None if i % 9 == 8 else b"v%d" % i)])
        if i % 3 == 2:
            log.roll()
    before = read_all(log)
    log_end = log.log_end_offset
    log.close()
    before_files = snapshot_files(directory)
    log = open_log(directory, clock, config)
    result = LogCleaner(directory.parent, clock).clean_log(log, force=True)
    assert result.cleaned
    assert len(result.new_base_offsets) >= 3
    assert len(result.replaced_base_offsets) > len(result.new_base_offsets)
    after = read_all(log)
    assert after != before
    log.close()
    return Swap(
        before_files,
        snapshot_files(directory),
        result.replaced_base_offsets,
        result.new_base_offsets,
        before,
        after,
        log_end,
    )


def crash_state(swap: Swap, step: str) -> Iterator[tuple[str, bytes]]:
    """The files a crash at ``step`` of the swap leaves (see ``PartitionLog.replace_segments``).

    Steps: ``writing`` (some .cleaned written, the last one cut short), ``cleaned`` (all
    written), ``renaming`` (.cleaned -> .swap, highest first, stopped halfway, one segment
    in the middle of its four files), ``swapped`` (all .swap, old untouched),
    ``deleting`` (all .swap, old -> .deleted stopped halfway), ``finishing`` (old all
    .deleted, .swap stripped from the lowest ones, one segment halfway), ``done`` (the
    .deleted files not yet unlinked).
    """
    new = list(swap.new_bases)
    old = list(swap.old_bases)
    new_files = {name for base in new for name in segment_names(base)}
    old_files = {name for base in old for name in segment_names(base)}
    for name, data in swap.before_files.items():
        if name in old_files:
            continue
        yield name, data

    def old_as(suffix_of: dict[str, str]) -> Iterator[tuple[str, bytes]]:
        for name in sorted(old_files):
            yield name + suffix_of.get(name, ""), swap.before_files[name]

    def new_as(suffix_of: dict[str, str]) -> Iterator[tuple[str, bytes]]:
        for name in sorted(new_files):
            yield name + suffix_of.get(name, ""), swap.after_files[name]

    half_new = len(new) // 2
    half_old = len(old) // 2
    if step == "writing":
        yield from old_as({})
        for base in new[: half_new + 1]:
            for name in segment_names(base):
                data = swap.after_files[name]
                yield name + ".cleaned", data[: len(data) // 2] if base == new[half_new] else data
    elif step == "cleaned":
        yield from old_as({})
        yield from new_as(dict.fromkeys(new_files, ".cleaned"))
    elif step == "renaming":
        yield from old_as({})
        suffixes = {}
        for i, base in enumerate(new):
            names = segment_names(base)
            if i > half_new:
                suffixes.update(dict.fromkeys(names, ".swap"))
            elif i == half_new:  # log renamed, indexes not yet
                suffixes.update({names[0]: ".swap"})
                suffixes.update(dict.fromkeys(names[1:], ".cleaned"))
            else:
                suffixes.update(dict.fromkeys(names, ".cleaned"))
        yield from new_as(suffixes)
    elif step == "swapped":
        yield from old_as({})
        yield from new_as(dict.fromkeys(new_files, ".swap"))
    elif step == "deleting":
        suffixes = {}
        for i, base in enumerate(old):
            names = segment_names(base)
            if i < half_old:
                suffixes.update(dict.fromkeys(names, ".deleted"))
            elif i == half_old:
                suffixes.update({names[0]: ".deleted"})
        yield from old_as(suffixes)
        yield from new_as(dict.fromkeys(new_files, ".swap"))
    elif step == "finishing":
        yield from old_as(dict.fromkeys(old_files, ".deleted"))
        suffixes = {}
        for i, base in enumerate(new):
            names = segment_names(base)
            if i > half_new:
                suffixes.update(dict.fromkeys(names, ".swap"))
            elif i == half_new:  # its .batchtimes stripped first (Segment.rename_suffix)
                suffixes.update(dict.fromkeys(names[:3], ".swap"))
        yield from new_as(suffixes)
    elif step == "done":
        yield from old_as(dict.fromkeys(old_files, ".deleted"))
        yield from new_as({})
    else:
        raise AssertionError(step)


ROLLED_BACK = ("writing", "cleaned", "renaming")
ROLLED_FORWARD = ("swapped", "deleting", "finishing", "done")


@pytest.fixture(scope="module")
def swap(tmp_path_factory: pytest.TempPathFactory) -> Swap:
    return make_swap(tmp_path_factory.mktemp("swap") / "t-0", ManualClock(wall_ms=T0))


@pytest.mark.parametrize("step", ROLLED_BACK + ROLLED_FORWARD)
def test_crash_during_swap_leaves_a_correct_log(
    swap: Swap, step: str, tmp_path: Path, clock: ManualClock
) -> None:
    directory = tmp_path / "t-0"
    directory.mkdir()
    names = set()
    for name, data in crash_state(swap, step):
        assert name not in names, name
        names.add(name)
        (directory / name).write_bytes(data)
    assert any(n.endswith((".cleaned", ".swap", ".deleted")) for n in names)

    log = open_log(directory, clock, compact_config())

    expected = swap.before if step in ROLLED_BACK else swap.after
    assert read_all(log) == expected
    assert log.log_end_offset == swap.log_end
    leftovers = [
        p.name for p in directory.iterdir() if p.suffix in (".cleaned", ".swap", ".deleted")
    ]
    assert leftovers == []
    # and the log cleans on as usual
    LogCleaner(tmp_path, clock).clean_log(log, force=True)
    assert replay(read_all(log)) == replay(swap.before)
    log.close()


class RetentionFirstLog(PartitionLog):
    """A log whose retention runs just as the cleaner swaps: the race the swap must lose."""

    def replace_segments(self, new: Sequence[Segment], old: Sequence[Segment]) -> bool:
        assert self.delete_old_segments() > 0
        return super().replace_segments(new, old)


def test_retention_wins_a_race_with_the_cleaner(tmp_path: Path, clock: ManualClock) -> None:
    config = compact_config(**{"cleanup.policy": "compact,delete", "retention.ms": 60_000})
    directory = tmp_path / "t-0"
    log = RetentionFirstLog.open(directory, "t", 0, config, clock)
    for i in range(20):
        append(log, clock, [(b"k%d" % (i % 2), b"v%d" % i)], timestamp_ms=T0 - 120_000)
    log.roll()
    for i in range(20):
        append(log, clock, [(b"k%d" % (i % 2), b"w%d" % i)])
    log.roll()
    expected = [r for r in read_all(log) if r.value is not None and r.value.startswith(b"w")]

    result = LogCleaner(tmp_path, clock).clean_log(log, force=True)

    assert not result.cleaned
    assert read_all(log) == expected  # retention's work, and nothing of the cleaner's
    assert not list(directory.glob("*.cleaned"))
    assert not list(directory.glob("*.swap"))
    assert read_offsets(tmp_path / CLEANER_OFFSET_CHECKPOINT) == {}
    log.close()


def test_no_swap_into_a_closed_log(tmp_path: Path, clock: ManualClock) -> None:
    log = open_log(tmp_path / "t-0", clock, compact_config())
    for i in range(10):
        append(log, clock, [(b"k", b"v%d" % i)])
    old = list(log.segments[:-1])
    cleaned = log.new_cleaned_segment(old[0].base_offset)
    log.close()  # e.g. the topic is being deleted while the cleaner works

    assert not log.replace_segments([cleaned], old)

    assert not list((tmp_path / "t-0").glob("*.cleaned"))
    assert not list((tmp_path / "t-0").glob("*.swap"))


@pytest.mark.parametrize("step", ["renaming", "deleting", "finishing"])
def test_crash_during_swap_through_the_log_manager(
    swap: Swap, step: str, tmp_path: Path, clock: ManualClock
) -> None:
    manager = LogManager.open(tmp_path, LogManagerConfig(), clock)
    manager.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": "300"})
    manager.close()
    directory = tmp_path / "t-0"
    shutil.rmtree(directory)
    directory.mkdir()
    for name, data in crash_state(swap, step):
        (directory / name).write_bytes(data)
    os.unlink(tmp_path / ".tidelog_cleanshutdown")  # a crash leaves no marker

    manager = LogManager.open(tmp_path, LogManagerConfig(), clock)

    log = manager.get_log("t", 0)
    assert read_all(log) == (swap.before if step in ROLLED_BACK else swap.after)
    assert log.log_end_offset == swap.log_end
    manager.close()
