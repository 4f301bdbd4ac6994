"""The ``.batchtimes`` sidecar: format, recovery, and its life with the segment
(append, fetch, restart, crash, truncation, retention, compaction)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.conftest import T0, crash, open_descriptors, scratch_dir
from tidelog.storage.batch_times import (
    ENTRY,
    WIRE_ENTRY,
    BatchTimes,
    BatchTimesEntry,
    BatchTimesFile,
    decode_wire,
    encode_entries,
    valid_prefix,
)
from tidelog.storage.cleaner import LogCleaner
from tidelog.storage.clock import ManualClock
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import StorageError
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import encode_batch, iter_batch_headers

FAST = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

_TIMES = st.integers(min_value=-1, max_value=2**62)


@st.composite
def entry_lists(draw: st.DrawFn) -> list[BatchTimesEntry]:
    count = draw(st.integers(min_value=0, max_value=12))
    offset = position = 0
    entries = []
    for _ in range(count):
        offset += draw(st.integers(min_value=1, max_value=1_000))
        position += draw(st.integers(min_value=1, max_value=10_000))
        entries.append(BatchTimesEntry(offset, position, draw(_TIMES), draw(_TIMES)))
    return entries


@FAST
@given(entry_lists())
def test_entries_round_trip(entries: list[BatchTimesEntry]) -> None:
    data = encode_entries(entries)
    assert len(data) == ENTRY.size * len(entries)
    assert valid_prefix(data, log_size=2**62, next_offset=2**62) == entries


@FAST
@given(entry_lists(), st.data())
def test_recovery_cut_at_any_byte_keeps_a_prefix_of_whole_entries(
    entries: list[BatchTimesEntry], data: st.DataObject
) -> None:
    encoded = encode_entries(entries)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded)))
    kept = valid_prefix(encoded[:cut], log_size=2**62, next_offset=2**62)
    assert kept == entries[: cut // ENTRY.size]


@FAST
@given(entry_lists(), st.integers(min_value=0, max_value=200_000), st.integers(0, 20_000))
def test_recovery_drops_entries_past_the_recovered_log(
    entries: list[BatchTimesEntry], log_size: int, next_offset: int
) -> None:
    kept = valid_prefix(encode_entries(entries), log_size=log_size, next_offset=next_offset)
    expected = []
    for entry in entries:
        if entry.position >= log_size or entry.last_offset >= next_offset:
            break
        expected.append(entry)
    assert kept == expected


def test_recovery_stops_at_an_entry_that_goes_back() -> None:
    entries = [BatchTimesEntry(5, 0, 1, 2), BatchTimesEntry(9, 100, 3, 4)]
    data = encode_entries([*entries, BatchTimesEntry(7, 200, 5, 6), BatchTimesEntry(12, 300, 7, 8)])
    assert valid_prefix(data, log_size=1_000, next_offset=100) == entries


def test_wire_entries_decode_unknown_as_none() -> None:
    data = WIRE_ENTRY.pack(4, -1, 77) + WIRE_ENTRY.pack(9, 10, 20) + b"\x00\x01"
    assert decode_wire(data) == {4: (None, 77), 9: (10, 20)}


# ---------------------------------------------------------------------- with a log


def _config(**overrides: object) -> LogConfig:
    base: dict[str, object] = {"segment.bytes": 400, "file.delete.delay.ms": 0}
    base.update(overrides)
    return LogConfig.from_mapping(base)


def _open(directory: Path, clock: ManualClock, config: LogConfig, **kw: object) -> PartitionLog:
    return PartitionLog.open(directory, "t", 0, config, clock, **kw)  # type: ignore[arg-type]


def _times_by_offset(log: PartitionLog) -> dict[int, tuple[int | None, int | None]]:
    """Batch last offset -> times, for every batch read through the public read path."""
    found: dict[int, tuple[int | None, int | None]] = {}
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        if not result.records:
            break
        times = decode_wire(result.batch_times)
        for _, header in iter_batch_headers(result.records):
            if header.last_offset >= offset:
                found[header.last_offset] = times.get(header.last_offset, (None, None))
                offset = header.next_offset
    return found


def _append(log: PartitionLog, key: bytes, times: BatchTimes | None, count: int = 2) -> int:
    batch = encode_batch([(T0, key, b"v" * 30) for _ in range(count)])
    return log.append(batch, times).last_offset


def test_times_are_read_back_across_segments_and_a_clean_restart(tmp_path: Path) -> None:
    clock = ManualClock(wall_ms=T0)
    directory = tmp_path / "t-0"
    log = _open(directory, clock, _config())
    expected: dict[int, tuple[int | None, int | None]] = {}
    for i in range(12):
        sent = None if i % 4 == 3 else T0 + 3_600_000 + i
        received = T0 + i
        last = _append(log, b"k%d" % i, BatchTimes(-1 if sent is None else sent, received))
        expected[last] = (sent, received)
    assert log.segment_count > 2
    assert _times_by_offset(log) == expected
    log.close()
    reopened = _open(directory, clock, _config(), had_clean_shutdown=True)
    assert _times_by_offset(reopened) == expected
    reopened.close()


def test_a_crash_keeps_the_times_of_every_flushed_batch(tmp_path: Path) -> None:
    clock = ManualClock(wall_ms=T0)
    directory = tmp_path / "t-0"
    log = _open(directory, clock, _config(**{"segment.bytes": 100_000}))
    expected = {_append(log, b"a%d" % i, BatchTimes(T0 + i, T0 + 10 * i)): i for i in range(5)}
    log.flush()
    crash(directory)
    reopened = _open(directory, clock, _config(**{"segment.bytes": 100_000}))
    assert _times_by_offset(reopened) == {
        last: (T0 + i, T0 + 10 * i) for last, i in expected.items()
    }
    reopened.close()


def test_a_torn_sidecar_and_a_missing_one_mean_unknown_times(tmp_path: Path) -> None:
    clock = ManualClock(wall_ms=T0)
    directory = tmp_path / "t-0"
    config = _config(**{"segment.bytes": 100_000})
    log = _open(directory, clock, config)
    lasts = [_append(log, b"a%d" % i, BatchTimes(T0 + i, T0 + i)) for i in range(3)]
    log.close()
    sidecar = directory / "00000000000000000000.batchtimes"
    data = sidecar.read_bytes()
    sidecar.write_bytes(data[: ENTRY.size + 5])  # one whole entry and a torn one
    reopened = _open(directory, clock, config)
    assert _times_by_offset(reopened) == {
        lasts[0]: (T0, T0),
        lasts[1]: (None, None),
        lasts[2]: (None, None),
    }
    # New appends still get their times, aligned by offset after the gap.
    last = _append(reopened, b"new", BatchTimes(1, 2))
    assert _times_by_offset(reopened)[last] == (1, 2)
    reopened.close()
    sidecar.unlink()
    again = _open(directory, clock, config)
    assert set(_times_by_offset(again).values()) == {(None, None)}
    again.close()


def test_truncation_drops_the_times_of_removed_batches(tmp_path: Path) -> None:
    clock = ManualClock(wall_ms=T0)
    log = _open(tmp_path / "t-0", clock, _config(**{"segment.bytes": 100_000}))
    lasts = [_append(log, b"a%d" % i, BatchTimes(i, i)) for i in range(4)]
    log.truncate_to(lasts[1] + 1)
    new_last = _append(log, b"b", BatchTimes(99, 100))
    assert _times_by_offset(log) == {lasts[0]: (0, 0), lasts[1]: (1, 1), new_last: (99, 100)}
    log.close()


def test_retention_removes_the_sidecar_with_its_segment(tmp_path: Path) -> None:
    clock = ManualClock(wall_ms=T0)
    directory = tmp_path / "t-0"
    log = _open(directory, clock, _config(**{"retention.bytes": 500}))
    for i in range(15):
        _append(log, b"a%d" % i, BatchTimes(i, i))
    assert log.delete_old_segments() > 0
    log.delete_expired_files(force=True)
    bases = {p.name.split(".")[0] for p in directory.glob("*.log")}
    assert {p.name.split(".")[0] for p in directory.glob("*.batchtimes")} == bases
    log.close()


def test_compaction_keeps_each_surviving_batch_times(tmp_path: Path) -> None:
    clock = ManualClock(wall_ms=T0)
    config = _config(**{"cleanup.policy": "compact", "segment.bytes": 300})
    log = _open(tmp_path / "t-0", clock, config)
    expected: dict[int, tuple[int | None, int | None]] = {}
    for i in range(20):
        last = _append(log, b"k%d" % (i % 3), BatchTimes(T0 + i, T0 + 100 + i), count=1)
        expected[last] = (T0 + i, T0 + 100 + i)
    before = log.size_bytes
    result = LogCleaner(tmp_path, clock).clean_log(log, force=True)
    assert result.cleaned
    assert log.size_bytes < before
    survivors = _times_by_offset(log)
    assert len(survivors) < len(expected)
    assert survivors == {last: expected[last] for last in survivors}


@FAST
@given(st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=8), st.data())
def test_crash_cut_of_the_sidecar_at_any_byte_keeps_a_prefix(
    tmp_path: Path, sizes: list[int], data: st.DataObject
) -> None:
    clock = ManualClock(wall_ms=T0)
    with scratch_dir(tmp_path) as root:
        directory = root / "t-0"
        config = _config(**{"segment.bytes": 100_000})
        log = _open(directory, clock, config)
        lasts = [_append(log, b"k", BatchTimes(i, i + 1), count) for i, count in enumerate(sizes)]
        log.flush()
        crash(directory)
        sidecar = directory / "00000000000000000000.batchtimes"
        content = sidecar.read_bytes()
        cut = data.draw(st.integers(min_value=0, max_value=len(content)))
        sidecar.write_bytes(content[:cut])
        reopened = _open(directory, clock, config)
        whole = cut // ENTRY.size
        assert _times_by_offset(reopened) == {
            last: ((i, i + 1) if i < whole else (None, None)) for i, last in enumerate(lasts)
        }
        reopened.close()


def _held(directory: Path, suffix: str) -> int:
    """Descriptors this process holds on ``directory``'s files ending in ``suffix``."""
    return sum(path.endswith(suffix) for path in open_descriptors(directory).values())


def test_the_sidecar_holds_a_descriptor_only_once_written(tmp_path: Path) -> None:
    """Issue #34: an empty partition and a log read back at start hold no ``.batchtimes``
    descriptor; the first write opens it, and what it writes after is durable."""
    clock = ManualClock(wall_ms=T0)
    directory = tmp_path / "t-0"
    config = _config()
    log = _open(directory, clock, config)
    assert (directory / "00000000000000000000.batchtimes").exists()
    assert (_held(directory, ".log"), _held(directory, ".batchtimes")) == (1, 0)
    log.flush()  # nothing written: nothing to sync, nothing opened
    assert _held(directory, ".batchtimes") == 0
    lasts = [_append(log, b"a%d" % i, BatchTimes(i, i)) for i in range(12)]
    assert log.segment_count > 2
    assert _held(directory, ".batchtimes") == log.segment_count
    log.close()
    reopened = _open(directory, clock, config, had_clean_shutdown=True)
    assert _held(directory, ".batchtimes") == 0
    # A truncation is the first write of a file read back: it opens it, cuts it, and a
    # crash after the flush keeps the cut and the times appended after it.
    reopened.truncate_to(lasts[-2] + 1)
    assert _held(directory, ".batchtimes") == 1
    new_last = _append(reopened, b"b", BatchTimes(99, 100))
    reopened.flush()
    crash(directory)
    after = _open(directory, clock, config)
    assert _times_by_offset(after) == {
        **{last: (i, i) for i, last in enumerate(lasts[:-1])},
        new_last: (99, 100),
    }
    after.close()


def test_a_write_after_close_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.batchtimes"
    sidecar = BatchTimesFile.create(path)
    sidecar.close()
    path.unlink()
    with pytest.raises(StorageError, match="closed"):
        sidecar.append([BatchTimesEntry(0, 0, 1, 2)])
    assert not path.exists()
