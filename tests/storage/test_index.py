"""Tests for the sparse offset and time indexes (``storage.index``) and their rebuild.

Lookups are checked against ``bisect`` over the same random entries; files are checked by
reloading them; damaged files must raise ``CorruptIndexError``, and a segment opened over a
missing or damaged index must rebuild exactly the index that appending built.
"""

from __future__ import annotations

import errno
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.conftest import (
    T0,
    fill_disk_completely,
    log_config,
    make_batch,
    open_log,
    read_values,
    scratch_dir,
    segment_files,
    values,
)
from tidelog.storage.clock import ManualClock
from tidelog.storage.index import CorruptIndexError, OffsetIndex, TimeIndex

PROPERTY = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

BASE = 1_000


@st.composite
def offset_entries(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Strictly increasing (relative offset, position) pairs."""
    count = draw(st.integers(0, 60))
    offset_steps = draw(st.lists(st.integers(1, 50), min_size=count, max_size=count))
    position_steps = draw(st.lists(st.integers(1, 5000), min_size=count, max_size=count))
    entries, offset, position = [], -1, -1
    for offset_step, position_step in zip(offset_steps, position_steps, strict=True):
        offset += offset_step
        position += position_step
        entries.append((offset, position))
    return entries


@st.composite
def time_entries(draw: st.DrawFn) -> list[tuple[int, int]]:
    """(timestamp, relative offset) pairs: timestamps strictly, offsets weakly increasing."""
    count = draw(st.integers(0, 60))
    ts_steps = draw(st.lists(st.integers(1, 10_000), min_size=count, max_size=count))
    offset_steps = draw(st.lists(st.integers(0, 30), min_size=count, max_size=count))
    entries, ts, offset = [], T0 - 1, 0
    for ts_step, offset_step in zip(ts_steps, offset_steps, strict=True):
        ts += ts_step
        offset += offset_step
        entries.append((ts, offset))
    return entries


def expected_offset_lookup(entries: list[tuple[int, int]], target: int) -> tuple[int, int]:
    """Largest entry with offset <= target (absolute), or (BASE, 0)."""
    offsets = [BASE + o for o, _ in entries]
    i = bisect_right(offsets, target) - 1
    return (BASE, 0) if i < 0 else (offsets[i], entries[i][1])


def expected_time_lookup(entries: list[tuple[int, int]], target: int) -> tuple[int, int] | None:
    """Last entry with timestamp < target, or None."""
    timestamps = [t for t, _ in entries]
    i = bisect_left(timestamps, target) - 1
    return None if i < 0 else (entries[i][0], BASE + entries[i][1])


def build_offset_index(path: Path, entries: list[tuple[int, int]]) -> OffsetIndex:
    index = OffsetIndex(path, BASE, 10_000)
    for relative, position in entries:
        index.append(BASE + relative, position)
    return index


def build_time_index(path: Path, entries: list[tuple[int, int]]) -> TimeIndex:
    index = TimeIndex(path, BASE, 10_000)
    for ts, relative in entries:
        index.maybe_append(ts, BASE + relative)
    return index


def offset_queries(entries: list[tuple[int, int]]) -> list[int]:
    """Every entry's offset, its neighbours, and points outside the range."""
    points = {BASE - 3, BASE - 1, BASE, BASE + 1}
    for relative, _ in entries:
        points.update({BASE + relative - 1, BASE + relative, BASE + relative + 1})
    points.add(BASE + (entries[-1][0] if entries else 0) + 100)
    return sorted(points)


def time_queries(entries: list[tuple[int, int]]) -> list[int]:
    points = {T0 - 10, T0 - 1, T0, T0 + 10**9}
    for ts, _ in entries:
        points.update({ts - 1, ts, ts + 1})
    return sorted(points)


# ---------------------------------------------------------------------- offset index


@PROPERTY
@given(entries=offset_entries(), extra=st.lists(st.integers(BASE - 10, BASE + 4000), max_size=20))
def test_offset_lookup_matches_bisect(
    tmp_path: Path, entries: list[tuple[int, int]], extra: list[int]
) -> None:
    with scratch_dir(tmp_path) as directory:
        index = build_offset_index(directory / "0.index", entries)
        assert len(index) == len(entries)
        for target in [*offset_queries(entries), *extra]:
            assert index.lookup(target) == expected_offset_lookup(entries, target), target
        expected_last = (BASE + entries[-1][0], entries[-1][1]) if entries else (BASE, 0)
        assert index.last_entry() == expected_last


@PROPERTY
@given(entries=offset_entries())
def test_offset_index_reloads_equal_to_memory(
    tmp_path: Path, entries: list[tuple[int, int]]
) -> None:
    with scratch_dir(tmp_path) as directory:
        path = directory / "0.index"
        index = build_offset_index(path, entries)
        index.write_pending()
        index.close()
        assert (path.stat().st_size if path.exists() else 0) == 8 * len(entries)
        log_size = entries[-1][1] + 1 if entries else 0
        loaded = OffsetIndex.open(path, BASE, 10_000, log_size)
        assert len(loaded) == len(entries)
        for target in offset_queries(entries):
            assert loaded.lookup(target) == index.lookup(target)
        assert loaded.last_entry() == index.last_entry()


@PROPERTY
@given(entries=offset_entries(), cut=st.integers(-5, 1600))
def test_offset_index_truncate_to(tmp_path: Path, entries: list[tuple[int, int]], cut: int) -> None:
    with scratch_dir(tmp_path) as directory:
        path = directory / "0.index"
        index = build_offset_index(path, entries)
        index.write_pending()
        index.truncate_to(BASE + cut)
        kept = [(o, p) for o, p in entries if o < cut]
        assert len(index) == len(kept)
        for target in offset_queries(entries):
            assert index.lookup(target) == expected_offset_lookup(kept, target)
        # The file holds exactly the kept entries, whether or not anything was dropped.
        index.close()
        reloaded = OffsetIndex.open(path, BASE, 10_000, 10**9)
        assert len(reloaded) == len(kept)
        for target in offset_queries(entries):
            assert reloaded.lookup(target) == expected_offset_lookup(kept, target)
        # Appending after a truncation continues from the kept entries.
        next_offset = BASE + (kept[-1][0] if kept else 0) + 1
        next_position = (kept[-1][1] if kept else 0) + 1
        reloaded.append(next_offset, next_position)
        assert reloaded.last_entry() == (next_offset, next_position)


def test_offset_index_rejects_entries_that_do_not_increase(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "0.index", BASE, 100)
    index.append(BASE + 5, 100)
    for offset, position in [(BASE + 5, 200), (BASE + 4, 200), (BASE + 6, 100), (BASE + 6, 99)]:
        with pytest.raises(ValueError, match="does not increase"):
            index.append(offset, position)
    assert len(index) == 1


def test_offset_index_is_full_at_max_entries(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "0.index", BASE, 3)
    for i in range(3):
        assert not index.is_full
        index.append(BASE + i, i * 10 + 1)
    assert index.is_full


def _offset_file(path: Path, entries: list[tuple[int, int]], tail: bytes = b"") -> None:
    path.write_bytes(b"".join(struct.pack(">ii", o, p) for o, p in entries) + tail)


@pytest.mark.parametrize(
    ("entries", "tail", "log_size", "message"),
    [
        pytest.param([(1, 10)], b"\x00" * 3, 1000, "multiple of 8", id="partial-entry"),
        pytest.param([(5, 10), (5, 20)], b"", 1000, "do not increase", id="repeated-offset"),
        pytest.param([(5, 10), (3, 20)], b"", 1000, "do not increase", id="offset-goes-back"),
        pytest.param([(5, 20), (6, 10)], b"", 1000, "do not increase", id="position-goes-back"),
        pytest.param([(-1, 10)], b"", 1000, "do not increase", id="below-base-offset"),
        pytest.param([(5, 10), (9, 1000)], b"", 1000, "past the log end", id="past-log-end"),
        pytest.param([(5, 10)], b"", 0, "past the log end", id="empty-log"),
    ],
)
def test_offset_index_corrupt_files_raise(
    tmp_path: Path, entries: list[tuple[int, int]], tail: bytes, log_size: int, message: str
) -> None:
    path = tmp_path / "0.index"
    _offset_file(path, entries, tail)
    with pytest.raises(CorruptIndexError, match=message):
        OffsetIndex.open(path, BASE, 100, log_size)


def test_offset_index_missing_file_opens_empty(tmp_path: Path) -> None:
    index = OffsetIndex.open(tmp_path / "none.index", BASE, 100, 0)
    assert len(index) == 0
    assert index.lookup(BASE + 7) == (BASE, 0)


# ---------------------------------------------------------------------- time index


@PROPERTY
@given(entries=time_entries(), extra=st.lists(st.integers(T0 - 10, T0 + 700_000), max_size=20))
def test_time_lookup_matches_bisect(
    tmp_path: Path, entries: list[tuple[int, int]], extra: list[int]
) -> None:
    with scratch_dir(tmp_path) as directory:
        index = build_time_index(directory / "0.timeindex", entries)
        assert len(index) == len(entries)
        for target in [*time_queries(entries), *extra]:
            assert index.lookup_before(target) == expected_time_lookup(entries, target), target
        expected_last = (entries[-1][0], BASE + entries[-1][1]) if entries else None
        assert index.last_entry() == expected_last


@PROPERTY
@given(entries=time_entries())
def test_time_index_reloads_equal_to_memory(tmp_path: Path, entries: list[tuple[int, int]]) -> None:
    with scratch_dir(tmp_path) as directory:
        path = directory / "0.timeindex"
        index = build_time_index(path, entries)
        index.close()
        assert (path.stat().st_size if path.exists() else 0) == 12 * len(entries)
        next_offset = BASE + (entries[-1][1] if entries else 0) + 1
        loaded = TimeIndex.open(path, BASE, 10_000, next_offset)
        assert len(loaded) == len(entries)
        for target in time_queries(entries):
            assert loaded.lookup_before(target) == index.lookup_before(target)
        assert loaded.last_entry() == index.last_entry()


@PROPERTY
@given(entries=time_entries(), cut=st.integers(-2, 1900))
def test_time_index_truncate_to(tmp_path: Path, entries: list[tuple[int, int]], cut: int) -> None:
    with scratch_dir(tmp_path) as directory:
        path = directory / "0.timeindex"
        index = build_time_index(path, entries)
        index.write_pending()
        index.truncate_to(BASE + cut)
        kept = [(t, o) for t, o in entries if o < cut]
        assert len(index) == len(kept)
        for target in time_queries(entries):
            assert index.lookup_before(target) == expected_time_lookup(kept, target)
        index.close()
        reloaded = TimeIndex.open(path, BASE, 10_000, 10**9)
        assert len(reloaded) == len(kept)
        for target in time_queries(entries):
            assert reloaded.lookup_before(target) == expected_time_lookup(kept, target)


def test_time_index_appends_only_growing_timestamps(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "0.timeindex", BASE, 100)
    index.maybe_append(T0 + 10, BASE + 1)
    index.maybe_append(T0 + 10, BASE + 2)  # same timestamp: skipped
    index.maybe_append(T0 + 5, BASE + 3)  # older timestamp: skipped
    index.maybe_append(T0 + 11, BASE + 4)
    assert len(index) == 2
    assert index.last_entry() == (T0 + 11, BASE + 4)
    with pytest.raises(ValueError, match="backwards"):
        index.maybe_append(T0 + 12, BASE + 3)


def test_time_index_is_full_one_slot_early(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "0.timeindex", BASE, 3)
    index.maybe_append(T0, BASE)
    assert not index.is_full
    index.maybe_append(T0 + 1, BASE + 1)
    assert index.is_full  # the third slot is kept for the entry written at roll


def _time_file(path: Path, entries: list[tuple[int, int]], tail: bytes = b"") -> None:
    path.write_bytes(b"".join(struct.pack(">qi", t, o) for t, o in entries) + tail)


@pytest.mark.parametrize(
    ("entries", "tail", "next_offset", "message"),
    [
        pytest.param([(T0, 1)], b"\x00" * 5, 100, "multiple of 12", id="partial-entry"),
        pytest.param([(T0, 1), (T0, 2)], b"", 100, "do not increase", id="repeated-timestamp"),
        pytest.param([(T0, 1), (T0 - 1, 2)], b"", 100, "do not increase", id="timestamp-back"),
        pytest.param([(T0, 5), (T0 + 1, 4)], b"", 100, "do not increase", id="offset-back"),
        pytest.param([(T0, 5), (T0 + 1, 100)], b"", 100, "past", id="past-segment-end"),
    ],
)
def test_time_index_corrupt_files_raise(
    tmp_path: Path, entries: list[tuple[int, int]], tail: bytes, next_offset: int, message: str
) -> None:
    path = tmp_path / "0.timeindex"
    _time_file(path, entries, tail)
    with pytest.raises(CorruptIndexError, match=message):
        TimeIndex.open(path, BASE, 100, BASE + next_offset)


# ---------------------------------------------------------------------- rebuild on open


def _damage_truncate_partial(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-3])


def _damage_decreasing(path: Path) -> None:
    data = path.read_bytes()
    size = 12 if path.suffix == ".timeindex" else 8
    assert len(data) >= 2 * size, "the test needs at least two entries"
    # Swap the first two entries: both columns now go backwards.
    path.write_bytes(data[size : 2 * size] + data[:size] + data[2 * size :])


def _damage_past_end(path: Path) -> None:
    if path.suffix == ".timeindex":
        path.write_bytes(path.read_bytes() + struct.pack(">qi", 2**62, 10**6))
    else:
        path.write_bytes(path.read_bytes() + struct.pack(">ii", 10**6, 10**8))


def _damage_delete(path: Path) -> None:
    path.unlink()


def _damage_empty(path: Path) -> None:
    path.write_bytes(b"")


DAMAGE: dict[str, Callable[[Path], None]] = {
    "deleted": _damage_delete,
    "partial-entry": _damage_truncate_partial,
    "decreasing": _damage_decreasing,
    "past-end": _damage_past_end,
    "emptied": _damage_empty,
}


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("which", ["sealed", "active"])
def test_segment_rebuilds_a_damaged_index_on_open(
    log_dir: Path, clock: ManualClock, suffix: str, damage: str, which: str
) -> None:
    # Small index interval: about one index entry every other batch.
    config = log_config(index_interval_bytes=150, segment_bytes=3000)
    log = open_log(log_dir, clock, config)
    written: list[bytes | None] = []
    batch_offsets: list[int] = []
    for i in range(120):
        batch_values = values(1 + i % 3, start=len(written))
        batch_offsets.append(log.append(make_batch(batch_values, timestamp_ms=T0 + i)).base_offset)
        written.extend(batch_values)
    assert log.segment_count >= 3
    log.close()
    originals = {p.name: p.read_bytes() for p in segment_files(log_dir, suffix)}
    target = segment_files(log_dir, suffix)[0 if which == "sealed" else -1]
    DAMAGE[damage](target)

    # A clean open: only the damage can make the segment rescan its log.
    reopened = open_log(
        log_dir, clock, config, recovery_point=len(written), had_clean_shutdown=True
    )
    assert reopened.log_end_offset == len(written)
    assert read_values(reopened) == written
    for i in (0, 1, 37, 60, 118, 119):
        assert reopened.offset_for_timestamp(T0 + i) == (batch_offsets[i], T0 + i)
    reopened.close()
    if damage != "emptied":
        # The rebuilt index is byte for byte the one appending built (same rule). An empty
        # file is a valid, if useless, index, which the segment may keep as it is.
        rebuilt = {p.name: p.read_bytes() for p in segment_files(log_dir, suffix)}
        assert rebuilt == originals


def test_rebuilt_index_serves_lookups_after_more_appends(log_dir: Path, clock: ManualClock) -> None:
    config = log_config(index_interval_bytes=100)
    log = open_log(log_dir, clock, config)
    for i in range(40):
        log.append(make_batch(values(2, start=2 * i), timestamp_ms=T0 + i))
    log.close()
    (log_dir / "00000000000000000000.index").unlink()
    (log_dir / "00000000000000000000.timeindex").unlink()
    log = open_log(log_dir, clock, config, recovery_point=80, had_clean_shutdown=True)
    for i in range(40, 60):
        log.append(make_batch(values(2, start=2 * i), timestamp_ms=T0 + i))
    assert read_values(log) == values(120)
    for offset in (0, 1, 79, 80, 81, 119):
        batch = log.read(offset, 1).records
        assert batch, offset
    assert log.offset_for_timestamp(T0 + 45) == (90, T0 + 45)
    log.close()


def test_full_disk_never_leaves_a_torn_entry(tmpfs: Path) -> None:
    # 341 time-index entries end 4 bytes short of a page: the next entry straddles the page
    # boundary, and on a full tmpfs the write stops at it (a short write, no error).
    path = tmpfs / "00000000000000001000.timeindex"
    index = TimeIndex(path, BASE, 10_000)
    for i in range(341):
        index.maybe_append(T0 + i, BASE + i)
    index.write_pending()
    assert path.stat().st_size == 4092
    fillers = fill_disk_completely(tmpfs)
    for i in range(341, 345):
        index.maybe_append(T0 + i, BASE + i)
    with pytest.raises(OSError, match="No space left") as caught:
        index.write_pending()
    assert caught.value.errno == errno.ENOSPC
    for filler in fillers:
        filler.unlink()
    index.write_pending()  # the rest of the pending bytes, continuing the torn entry
    index.close()
    assert path.stat().st_size == 345 * 12
    loaded = TimeIndex.open(path, BASE, 10_000, BASE + 1000)
    assert len(loaded) == 345
    for target in (T0, T0 + 340, T0 + 341, T0 + 344, T0 + 345):
        assert loaded.lookup_before(target) == index.lookup_before(target)
