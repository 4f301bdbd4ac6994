"""What a flush fsyncs (issue #31, ``Segment.fsync``): the produce path's flush syncs the
log, its batch times and aborted-transaction index, but not the active segment's offset
and time indexes, which recovery rebuilds from the log after an unclean stop; a roll
syncs the sealed segment's indexes and a clean close the active one's, since a clean
restart trusts them. Every fsync is recorded at the operating-system boundary (the calls
still reach the OS)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.storage.conftest import (
    crash,
    log_config,
    make_batch,
    open_log,
    read_values,
    reopen_clean,
)
from tidelog.storage.batch_times import BatchTimes
from tidelog.storage.clock import ManualClock
from tidelog.storage.partition_log import PartitionLog


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The file names fsynced, in order."""
    names: list[str] = []
    real_fsync = os.fsync

    def spy_fsync(fd: int) -> None:
        real_fsync(fd)
        names.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))

    monkeypatch.setattr(os, "fsync", spy_fsync)
    return names


def _fill(log: PartitionLog, start: int, count: int) -> None:
    for i in range(start, start + count):
        log.append(make_batch([b"value-%04d" % i]), BatchTimes(i, i))


def _config(**overrides: object) -> object:
    # An index entry every batch or two, so a flush has index entries to (not) sync.
    return log_config(index_interval_bytes=64, **overrides)


def test_a_flush_syncs_the_log_and_its_times_not_the_active_indexes(
    log_dir: Path, clock: ManualClock, synced: list[str]
) -> None:
    log = open_log(log_dir, clock, _config())  # type: ignore[arg-type]
    _fill(log, 0, 20)
    assert len(log.segments[0].offset_index) > 5  # entries to write, and not to sync
    synced.clear()
    log.flush()
    base = f"{0:020d}"
    assert sorted(synced) == [f"{base}.batchtimes", f"{base}.log"]
    assert log.recovery_point == 20
    log.close()


def test_a_roll_syncs_the_sealed_segments_indexes(
    log_dir: Path, clock: ManualClock, synced: list[str]
) -> None:
    batch = make_batch([b"value-0000"])
    log = open_log(log_dir, clock, _config(segment_bytes=10 * len(batch)))  # type: ignore[arg-type]
    _fill(log, 0, 10)
    log.flush()
    synced.clear()
    _fill(log, 10, 1)  # rolls
    assert [s.base_offset for s in log.segments] == [0, 10]
    sealed = f"{0:020d}"
    assert {f"{sealed}.index", f"{sealed}.timeindex"} <= set(synced)
    log.close()


def test_a_clean_close_syncs_the_active_indexes(
    log_dir: Path, clock: ManualClock, synced: list[str]
) -> None:
    log = open_log(log_dir, clock, _config())  # type: ignore[arg-type]
    _fill(log, 0, 20)
    log.flush()
    synced.clear()
    reopened = reopen_clean(log, clock)
    base = f"{0:020d}"
    assert {f"{base}.index", f"{base}.timeindex"} <= set(synced)
    assert read_values(reopened) == [b"value-%04d" % i for i in range(20)]
    reopened.close()


def test_recovery_rebuilds_active_indexes_a_crash_lost(log_dir: Path, clock: ManualClock) -> None:
    """The flush moved the recovery point to the log end without syncing the active
    segment's indexes; a power loss that took them (here: emptied, as an unsynced file
    can come back) leaves recovery to rebuild them from the log, entry for entry."""
    log = open_log(log_dir, clock, _config())  # type: ignore[arg-type]
    _fill(log, 0, 40)
    log.flush()
    assert log.recovery_point == 40
    active = log.segments[-1]
    active.write_pending()
    index_path, time_path = active.offset_index.path, active.time_index.path
    before = (index_path.read_bytes(), time_path.read_bytes())
    assert all(before)
    crash(log_dir)
    os.truncate(index_path, 0)
    os.truncate(time_path, 0)
    # The checkpoint said everything was durable: the recovery point is the log end.
    reopened = open_log(
        log_dir,
        clock,
        _config(),  # type: ignore[arg-type]
        recovery_point=40,
        had_clean_shutdown=False,
    )
    assert reopened.log_end_offset == 40
    reopened.segments[-1].write_pending()
    assert (index_path.read_bytes(), time_path.read_bytes()) == before
    assert read_values(reopened, 25) == [b"value-%04d" % i for i in range(25, 40)]
    reopened.close()
