"""Crash recovery, leftovers, topic administration and a full disk.

Crashes are simulated with ``crash()`` (every descriptor under the directory closed, the
log object abandoned with whatever it had not handed to the OS) followed by damage to the
unflushed part of the files: a cut at a random byte or a random range overwritten with
garbage, which is what an unclean stop can leave (reference 1.7: the OS does not order
size updates and data blocks).
"""

from __future__ import annotations

import errno
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.conftest import (
    T0,
    crash,
    fill_disk,
    fill_disk_completely,
    log_config,
    make_batch,
    open_log,
    read_all,
    read_values,
    scratch_dir,
    segment_files,
    values,
)
from tidelog.storage.checkpoint import CLEAN_SHUTDOWN_MARKER
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    LogDirFullError,
    RecordTooLargeError,
    StorageError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import encode_batch, read_header

RECOVERY = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def check_indexes_point_at_batches(log: PartitionLog) -> None:
    """Every offset-index entry on disk names a batch start with that base offset."""
    for segment in log.segments:
        path = log.directory / f"{segment.base_offset:020d}.index"
        assert path.exists(), path
        data = path.read_bytes()
        assert len(data) % 8 == 0
        log_bytes = (log.directory / f"{segment.base_offset:020d}.log").read_bytes()
        for relative, position in struct.iter_unpack(">ii", data):
            header = read_header(log_bytes, position)
            assert header.base_offset == segment.base_offset + relative
        assert (log.directory / f"{segment.base_offset:020d}.timeindex").exists()


# ---------------------------------------------------------------------- crash property


@dataclass(frozen=True)
class CrashScenario:
    batches: list[int]  # records per batch
    flush_after: int  # flush after this batch (-1 or past the end: never)
    segment_bytes: int
    index_interval: int
    mode: str  # cut | garbage | garbage-append | none
    segment_choice: int  # which segment with unflushed bytes gets the damage
    position_choice: int  # where in its unflushed bytes
    garbage: bytes
    drop_indexes: bool  # also delete the damaged segment's index files


crash_scenarios = st.builds(
    CrashScenario,
    batches=st.lists(st.integers(1, 4), min_size=1, max_size=30),
    flush_after=st.integers(-1, 30),
    segment_bytes=st.integers(200, 3000),
    index_interval=st.integers(1, 500),
    mode=st.sampled_from(["cut", "garbage", "garbage-append", "none"]),
    segment_choice=st.integers(0, 10**6),
    position_choice=st.integers(0, 10**6),
    garbage=st.binary(min_size=1, max_size=64),
    drop_indexes=st.booleans(),
)


@RECOVERY
@given(scenario=crash_scenarios)
def test_crash_recovery_keeps_a_prefix_and_everything_flushed(
    tmp_path: Path, scenario: CrashScenario
) -> None:
    with scratch_dir(tmp_path) as directory:
        clock = ManualClock(T0)
        config = log_config(
            segment_bytes=scenario.segment_bytes, index_interval_bytes=scenario.index_interval
        )
        log = open_log(directory, clock, config)
        written: list[bytes | None] = []
        flushed_end = 0
        for i, count in enumerate(scenario.batches):
            batch_values = values(count, start=len(written), size=1 + (len(written) * 7) % 40)
            log.append(make_batch(batch_values, timestamp_ms=T0 + i))
            written.extend(batch_values)
            if i == scenario.flush_after:
                log.flush()
                flushed_end = len(written)
        recovery_point = log.recovery_point
        assert recovery_point == flushed_end
        # Where flushed data ends in each segment: damage may only fall after it.
        unflushed = []
        for segment in log.segments:
            if segment.next_offset <= recovery_point or segment.size_bytes == 0:
                continue
            start = 0
            if segment.base_offset < recovery_point:
                found = segment.find_position(recovery_point, batch_start=True)
                assert found is not None
                start = found
            if start < segment.size_bytes:
                unflushed.append((segment.base_offset, start, segment.size_bytes))
        crash(directory)

        if unflushed and scenario.mode != "none":
            base, start, size = unflushed[scenario.segment_choice % len(unflushed)]
            position = start + scenario.position_choice % (size - start)
            with open(directory / f"{base:020d}.log", "r+b") as f:
                if scenario.mode == "cut":
                    f.truncate(position)
                elif scenario.mode == "garbage":
                    f.seek(position)
                    f.write(scenario.garbage[: size - position])
                else:  # torn write: the file grew but the new blocks hold junk
                    f.seek(0, os.SEEK_END)
                    f.write(scenario.garbage)
            if scenario.drop_indexes:
                (directory / f"{base:020d}.index").unlink()
                (directory / f"{base:020d}.timeindex").unlink()

        log = open_log(directory, clock, config, recovery_point=recovery_point)
        got = read_all(log)
        readable = [r.value for r in got]
        assert readable == written[: len(readable)], "recovery kept something not written"
        assert [r.offset for r in got] == list(range(len(got)))
        assert len(readable) >= recovery_point, "recovery lost flushed records"
        assert log.log_end_offset == len(readable)
        assert log.recovery_point == log.log_end_offset  # recovered data is fsynced
        check_indexes_point_at_batches(log)
        # Appendable at the log end, and the result survives a clean restart.
        end = log.log_end_offset
        assert log.append(make_batch([b"after"], timestamp_ms=T0 + 999)).base_offset == end
        log.close()
        log = open_log(directory, clock, config, recovery_point=end + 1, had_clean_shutdown=True)
        assert read_values(log) == [*readable, b"after"]
        check_indexes_point_at_batches(log)
        log.close()


def test_recovery_deletes_segments_after_a_damaged_one(log_dir: Path, clock: ManualClock) -> None:
    config = log_config(segment_bytes=300)
    log = open_log(log_dir, clock, config)
    for i in range(20):
        log.append(make_batch(values(1, i, size=50)))
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 4
    crash(log_dir)
    victim = log_dir / f"{bases[1]:020d}.log"
    with open(victim, "r+b") as f:
        f.seek(70)  # inside the segment's first batch's records
        f.write(b"\xff\xfe")
    log = open_log(log_dir, clock, config)  # recovery point 0: everything is re-validated
    assert log.log_end_offset == bases[1]
    assert [p.name for p in segment_files(log_dir)] == [
        f"{bases[0]:020d}.log",
        f"{bases[1]:020d}.log",
    ]
    assert read_values(log) == values(bases[1], size=50)
    assert log.append(make_batch([b"x"])).base_offset == bases[1]
    log.close()


def test_flushed_segments_below_the_recovery_point_are_not_rescanned(
    log_dir: Path, clock: ManualClock
) -> None:
    # Recovery starts at the segment holding the recovery point (Kafka's rule); a sealed,
    # flushed segment is trusted. Proven by a CRC-damaged batch that stays unnoticed there.
    config = log_config(segment_bytes=300)
    log = open_log(log_dir, clock, config)
    for i in range(12):
        log.append(make_batch(values(1, i, size=50)))
    log.flush()
    recovery_point = log.recovery_point
    first = log.segments[0]
    crash(log_dir)
    with open(log_dir / f"{first.base_offset:020d}.log", "r+b") as f:
        f.seek(70)
        f.write(b"\xff")  # a CRC-covered byte of the first batch
    log = open_log(log_dir, clock, config, recovery_point=recovery_point)
    assert log.log_end_offset == 12
    log.close()
    crash(log_dir)
    log = open_log(log_dir, clock, config, recovery_point=0)  # now it is re-validated
    assert log.log_end_offset == 0
    log.close()


def test_missing_index_files_are_rebuilt_after_a_crash(log_dir: Path, clock: ManualClock) -> None:
    config = log_config(segment_bytes=600, index_interval_bytes=100)
    log = open_log(log_dir, clock, config)
    for i in range(30):
        log.append(make_batch(values(2, 2 * i), timestamp_ms=T0 + i))
    log.flush()
    crash(log_dir)
    indexes = [*segment_files(log_dir, ".index"), *segment_files(log_dir, ".timeindex")]
    originals = {p.name: p.read_bytes() for p in indexes}
    assert sum(map(len, originals.values())) > 0
    for path in indexes:
        path.unlink()
    log = open_log(log_dir, clock, config, recovery_point=60)  # all flushed: only the
    # missing indexes force a rescan
    assert read_values(log) == values(60)
    assert log.offset_for_timestamp(T0 + 17) == (34, T0 + 17)
    check_indexes_point_at_batches(log)
    log.close()
    # Rebuilt by the rule appending used: the same bytes.
    assert {p.name: p.read_bytes() for p in indexes} == originals


# ---------------------------------------------------------------------- leftovers, marker


def test_stray_tmp_deleted_and_orphan_files_removed_on_open(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock, log_config(segment_bytes=200))
    for i in range(6):
        log.append(make_batch(values(1, i, size=50)))
    log.close()
    strays = [
        "00000000000000000000.log.deleted",
        "00000000000000000000.index.deleted",
        "00000000000000000099.timeindex.deleted",
        "00000000000000000003.snapshot.tmp",
        "whatever.tmp",
        "00000000000000000777.index",  # an index without its log
        "00000000000000000777.timeindex",
    ]
    for name in strays:
        (log_dir / name).write_bytes(b"junk")
    log = open_log(log_dir, clock)
    left = {p.name for p in log_dir.iterdir()}
    assert not left & set(strays)
    assert read_values(log) == values(6, size=50)
    log.close()


def test_data_dir_tmp_files_removed_on_open(tmp_path: Path, clock: ManualClock) -> None:
    data = tmp_path / "data"
    LogManager.open(data, clock=clock).close()
    # A crash inside atomic_write leaves the temp file next to the target.
    for name in ("topics.json.tmp", "recovery-point-offset-checkpoint.tmp"):
        (data / name).write_bytes(b"half")
    manager = LogManager.open(data, clock=clock)
    assert not list(data.glob("*.tmp"))
    manager.close()


def test_clean_shutdown_marker_is_removed_on_open(tmp_path: Path, clock: ManualClock) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 1)
    manager.get_log("t", 0).append(make_batch(values(3)))
    manager.close()
    assert (data / CLEAN_SHUTDOWN_MARKER).exists()

    manager = LogManager.open(data, clock=clock)
    # Gone at once: a crash from here on (even while loading) must count as unclean.
    assert not (data / CLEAN_SHUTDOWN_MARKER).exists()
    crash(data)
    # What only a recovery notices: a well-framed batch with a bad CRC at the tail. A clean
    # open reads headers only; an unclean one validates every unflushed batch.
    bad = bytearray(make_batch([b"evil"]))
    bad[-1] ^= 0xFF
    bad[0:8] = (3).to_bytes(8, "big")
    with open(data / "t-0" / "00000000000000000000.log", "ab") as f:
        f.write(bad)
    manager = LogManager.open(data, clock=clock)
    log = manager.get_log("t", 0)
    assert log.log_end_offset == 3
    assert read_values(log) == values(3)
    manager.close()


def test_clean_restart_keeps_everything_without_rescanning(
    tmp_path: Path, clock: ManualClock
) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 2, {"segment.bytes": "500"})
    for p in range(2):
        for i in range(20):
            manager.get_log("t", p).append(make_batch(values(2, 2 * i), timestamp_ms=T0 + i))
    manager.close()
    manager = LogManager.open(data, clock=clock)
    for p in range(2):
        log = manager.get_log("t", p)
        assert read_values(log) == values(40)
        assert log.recovery_point == log.log_end_offset == 40
        assert log.offset_for_timestamp(T0 + 7) == (14, T0 + 7)
    manager.close()


# ---------------------------------------------------------------------- topics


@pytest.mark.parametrize(
    "name",
    ["../x", "a/b", "", "x" * 250, ".", "..", "/abs", "a\\b", "sp ace", "é", "nul\x00", "..\\x"],
)
def test_invalid_topic_names_rejected_and_nothing_created(
    tmp_path: Path, clock: ManualClock, name: str
) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    outside_before = sorted(p.name for p in tmp_path.iterdir())
    inside_before = sorted(p.name for p in data.iterdir())
    with pytest.raises(InvalidTopicError):
        manager.create_topic(name, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == outside_before
    assert sorted(p.name for p in data.iterdir()) == inside_before
    assert manager.topics() == []
    manager.close()


def test_longest_and_odd_legal_topic_names(tmp_path: Path, clock: ManualClock) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    for name in ["x" * 249, "...", "a-1", "a", "_-.", "A.b_C-9"]:
        manager.create_topic(name, 2)
        manager.get_log(name, 1).append(make_batch([name.encode()]))
    manager.close()
    manager = LogManager.open(data, clock=clock)
    assert sorted(t.name for t in manager.topics()) == sorted(
        ["x" * 249, "...", "a-1", "a", "_-.", "A.b_C-9"]
    )
    assert read_values(manager.get_log("a-1", 1)) == [b"a-1"]
    assert read_values(manager.get_log("a", 1)) == [b"a"]
    assert all(p.parent == data for p in data.iterdir())
    manager.close()


def test_duplicate_topic_rejected(tmp_path: Path, clock: ManualClock) -> None:
    manager = LogManager.open(tmp_path / "data", clock=clock)
    manager.create_topic("t", 2, {"retention.ms": "1000"})
    manager.get_log("t", 0).append(make_batch([b"keep"]))
    with pytest.raises(TopicAlreadyExistsError):
        manager.create_topic("t", 5)
    meta = manager.topic("t")
    assert (meta.partitions, meta.config.retention_ms) == (2, 1000)
    assert read_values(manager.get_log("t", 0)) == [b"keep"]
    manager.close()


@pytest.mark.parametrize(
    "config",
    [
        {"no.such.key": "1"},
        {"partitions": "3"},
        {"segment.bytes": "abc"},
        {"segment.bytes": "-5"},
        {"segment.bytes": "1.5"},
        {"retention.ms": "-2"},
        {"retention.bytes": "lots"},
        {"cleanup.policy": "zip"},
        {"message.timestamp.type": "WallTime"},
        {"min.cleanable.dirty.ratio": "1.5"},
        {"max.message.bytes": "-1"},
        {"retention.ms": "1000", "typo.ms": "5"},
    ],
)
def test_bad_topic_config_rejected_and_nothing_created(
    tmp_path: Path, clock: ManualClock, config: dict[str, str]
) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    before = sorted(p.name for p in data.iterdir())
    with pytest.raises(InvalidConfigError):
        manager.create_topic("t", 1, config)
    assert sorted(p.name for p in data.iterdir()) == before
    assert manager.topics() == []
    manager.close()


def test_alter_config_validates_and_applies(tmp_path: Path, clock: ManualClock) -> None:
    manager = LogManager.open(tmp_path / "data", clock=clock)
    manager.create_topic("t", 1, {"retention.ms": "1000"})
    with pytest.raises(InvalidConfigError):
        manager.alter_topic_config("t", {"retention.ms": "soon"})
    with pytest.raises(InvalidConfigError):
        manager.alter_topic_config("t", {"bogus": "1"})
    with pytest.raises(InvalidConfigError):
        manager.alter_topic_config("t", {}, delete=["bogus"])
    assert manager.topic("t").config.retention_ms == 1000
    manager.alter_topic_config("t", {"max.message.bytes": "100"}, delete=["retention.ms"])
    assert manager.get_log("t", 0).config.max_message_bytes == 100
    assert manager.topic("t").config.retention_ms == 7 * 24 * 3600 * 1000
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.alter_topic_config("nope", {"retention.ms": "1"})
    manager.close()
    manager = LogManager.open(tmp_path / "data", clock=clock)
    assert dict(manager.topic("t").overrides) == {"max.message.bytes": "100"}
    manager.close()


def test_bad_partition_counts_and_unknown_partitions(tmp_path: Path, clock: ManualClock) -> None:
    manager = LogManager.open(tmp_path / "data", LogManagerConfig(num_partitions=3), clock)
    for count in (-1, 10_001):
        with pytest.raises(InvalidPartitionsError):
            manager.create_topic(f"t{count}", count)
    assert manager.create_topic("default").partitions == 3
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.get_log("default", 3)
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.get_log("nope", 0)
    manager.close()


def test_delete_topic_removes_its_data_and_a_new_one_starts_empty(
    tmp_path: Path, clock: ManualClock
) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 2, {"segment.bytes": "200"})
    manager.create_topic("t-1", 1)  # its directory "t-1-0" must survive deleting "t"
    for p in range(2):
        for i in range(10):
            manager.get_log("t", p).append(make_batch(values(1, i, size=40)))
    manager.get_log("t-1", 0).append(make_batch([b"other"]))
    manager.delete_topic("t")
    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == ["t-1-0"]
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.get_log("t", 0)
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.delete_topic("t")
    manager.create_topic("t", 1)
    log = manager.get_log("t", 0)
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    log.append(make_batch([b"new"]))
    manager.close()
    manager = LogManager.open(data, clock=clock)
    assert read_values(manager.get_log("t", 0)) == [b"new"]
    assert read_values(manager.get_log("t-1", 0)) == [b"other"]
    assert [t.name for t in manager.topics()] == ["t", "t-1"]
    manager.close()


def test_recreated_topic_survives_a_crash_despite_old_checkpoints(
    tmp_path: Path, clock: ManualClock
) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 1, {"segment.bytes": "200", "retention.ms": "1000"})
    log = manager.get_log("t", 0)
    for i in range(20):
        log.append(make_batch(values(1, i, size=40), timestamp_ms=T0))
    clock.advance(5000)
    manager.run_retention()
    assert log.log_start_offset == 20
    manager.write_checkpoints()  # the scheduler's periodic task
    manager.delete_topic("t")
    manager.create_topic("t", 1)
    log = manager.get_log("t", 0)
    log.append(make_batch(values(3)))
    log.flush()  # acknowledged with acks=all
    crash(data)
    manager = LogManager.open(data, clock=clock)
    log = manager.get_log("t", 0)
    assert (log.log_start_offset, log.log_end_offset) == (0, 3)
    assert read_values(log) == values(3)
    manager.close()


def test_orphan_and_half_deleted_directories_removed_on_open(
    tmp_path: Path, clock: ManualClock
) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 1)
    manager.close()
    (data / "ghost-0").mkdir()
    (data / "ghost-0" / "00000000000000000000.log").write_bytes(b"")
    (data / "t-7").mkdir()  # a partition the topic does not have
    (data / "t-0.0123abcd-delete").mkdir()
    manager = LogManager.open(data, clock=clock)
    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == ["t-0"]
    manager.close()


def test_topic_metadata_written_atomically(tmp_path: Path, clock: ManualClock) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 3, {"retention.ms": "5"})
    document = json.loads((data / "topics.json").read_text())
    assert document["topics"]["t"]["partitions"] == 3
    assert document["topics"]["t"]["config"] == {"retention.ms": "5"}
    manager.close()


# ---------------------------------------------------------------------- full disk


def test_full_disk_raises_log_dir_full_and_recovers(tmpfs: Path) -> None:
    clock = ManualClock(T0)
    data = tmpfs / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 1, {"segment.bytes": str(10**6)})
    log = manager.get_log("t", 0)
    log.append(make_batch([b"a" * 1000]))
    log.flush()
    filler = fill_disk(tmpfs, 64 * 1024)
    stored: list[bytes | None] = [b"a" * 1000]
    batch = make_batch([b"b" * 30_000])
    error = None
    for _ in range(100):
        try:
            log.append(batch)
        except LogDirFullError as exc:
            error = exc
            break
        stored.append(b"b" * 30_000)
    assert error is not None, "the disk never filled up"
    assert error.retriable
    # Nothing half-written: the file holds exactly the acknowledged batches.
    segment = log.segments[-1]
    assert os.path.getsize(data / "t-0" / "00000000000000000000.log") == segment.size_bytes
    assert log.log_end_offset == len(stored)
    assert read_values(log) == stored
    # Still full: still refused, still consistent.
    with pytest.raises(LogDirFullError):
        log.append(batch)
    assert log.log_end_offset == len(stored)
    filler.unlink()
    assert log.append(batch).base_offset == len(stored)
    stored.append(b"b" * 30_000)
    log.flush()
    assert read_values(log) == stored
    manager.close()
    manager = LogManager.open(data, clock=clock)
    assert read_values(manager.get_log("t", 0)) == stored
    manager.close()


def test_full_disk_during_roll_and_flush(tmpfs: Path) -> None:
    clock = ManualClock(T0)
    data = tmpfs / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 1, {"segment.bytes": "40000", "index.interval.bytes": "100"})
    log = manager.get_log("t", 0)
    stored: list[bytes | None] = []
    filler = fill_disk(tmpfs, 200 * 1024)
    failures = 0
    for i in range(200):
        value = f"{i}".encode().ljust(9000, b".")
        try:
            log.append(make_batch([value]))
            stored.append(value)
        except LogDirFullError:
            failures += 1
        try:
            log.flush()
        except LogDirFullError:
            failures += 1
        assert log.log_end_offset == len(stored)
    assert failures > 0, "the disk never filled up"
    assert log.segment_count > 1
    assert read_values(log) == stored
    filler.unlink()
    log.append(make_batch([b"end"]))
    stored.append(b"end")
    assert read_values(log) == stored
    manager.close()
    manager = LogManager.open(data, clock=clock)
    assert read_values(manager.get_log("t", 0)) == stored
    manager.close()


def test_enospc_is_what_the_tmpfs_reports(tmpfs: Path) -> None:
    # Guards the two tests above: the fixture really produces ENOSPC.
    filler = fill_disk(tmpfs, 0)
    fd = os.open(tmpfs / "more", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError, match="No space left") as caught:
            os.write(fd, b"\0" * 65536)
    finally:
        os.close(fd)
    assert caught.value.errno == errno.ENOSPC
    filler.unlink()


def test_every_write_path_reports_a_full_disk_as_log_dir_full(tmpfs: Path) -> None:
    clock = ManualClock(T0)
    data = tmpfs / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 1, {"segment.bytes": "3000", "index.interval.bytes": "10"})
    log = manager.get_log("t", 0)
    stored: list[bytes | None] = []
    for i in range(5):  # index entries pending, never handed to the OS yet
        stored.append(f"{i}".encode().ljust(500, b"."))
        log.append(make_batch([stored[-1]]))
    fillers = fill_disk_completely(tmpfs)

    with pytest.raises(LogDirFullError):
        log.append(make_batch([b"y" * 500]))  # needs a roll: new files, a snapshot
    with pytest.raises(LogDirFullError):
        log.roll()
    with pytest.raises(LogDirFullError):
        log.flush()
    with pytest.raises(LogDirFullError):
        manager.write_checkpoints()
    with pytest.raises(LogDirFullError):
        manager.create_topic("u", 1)
    assert [t.name for t in manager.topics()] == ["t"]
    assert log.log_end_offset == len(stored)
    assert read_values(log) == stored

    for filler in fillers:
        filler.unlink()
    stored.append(b"y" * 500)
    log.append(make_batch([stored[-1]]))
    log.flush()
    assert log.recovery_point == len(stored)
    manager.create_topic("u", 1)
    manager.close()
    manager = LogManager.open(data, clock=clock)
    assert read_values(manager.get_log("t", 0)) == stored
    assert [t.name for t in manager.topics()] == ["t", "u"]
    manager.close()


def test_failed_topic_creation_is_rolled_back(tmp_path: Path, clock: ManualClock) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    # An I/O failure at the third partition: a file sits where its directory must go.
    (data / "t-2").write_bytes(b"in the way")
    with pytest.raises(StorageError):
        manager.create_topic("t", 4)
    assert manager.topics() == []
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.get_log("t", 0)
    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == []
    manager.close()
    manager = LogManager.open(data, clock=clock)
    assert manager.topics() == []
    (data / "t-2").unlink()
    manager.create_topic("t", 4)
    assert [manager.get_log("t", p).log_end_offset for p in range(4)] == [0, 0, 0, 0]
    manager.close()


def test_lowering_max_message_bytes_does_not_make_recovery_drop_data(
    tmp_path: Path, clock: ManualClock
) -> None:
    # Batches accepted under the old limit are valid data, not corruption.
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 1)
    log = manager.get_log("t", 0)
    stored: list[bytes | None] = [b"x" * 5000, b"small", b"y" * 5000]
    for value in stored:
        log.append(make_batch([value]))
    manager.alter_topic_config("t", {"max.message.bytes": "1000"})
    crash(data)
    manager = LogManager.open(data, clock=clock)
    log = manager.get_log("t", 0)
    assert read_values(log) == stored
    with pytest.raises(RecordTooLargeError):
        log.append(make_batch([b"z" * 5000]))
    manager.close()


def test_sealed_segment_that_lost_whole_batches_ends_the_log(
    log_dir: Path, clock: ManualClock
) -> None:
    # A crash can drop the last batches of a sealed, unflushed segment exactly at a batch
    # boundary (its size was not durable) while the next segment's data survived. Nothing
    # is invalid, yet keeping the next segment would leave a hole in the offsets.
    config = log_config(segment_bytes=300)
    log = open_log(log_dir, clock, config)
    for i in range(12):
        log.append(make_batch(values(1, i, size=50)))
    log.flush(up_to_offset=1)
    log.append(make_batch([b"tail"]))
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 3
    first_batch = log.segments[0].find_position(1, batch_start=True)
    assert first_batch is not None
    crash(log_dir)
    with open(log_dir / f"{bases[0]:020d}.log", "r+b") as f:
        f.truncate(first_batch)  # keeps offset 0 only
    log = open_log(log_dir, clock, config, recovery_point=1)
    assert log.log_end_offset == 1
    assert read_values(log) == values(1, size=50)
    assert [p.name for p in segment_files(log_dir)] == [f"{bases[0]:020d}.log"]
    assert log.append(make_batch([b"next"])).base_offset == 1
    log.close()


def test_damaged_base_offset_is_caught_by_recovery(log_dir: Path, clock: ManualClock) -> None:
    # The base offset lies outside the CRC: only the offsets' continuity betrays damage
    # confined to those 8 bytes.
    log = open_log(log_dir, clock)
    log.append(make_batch([b"a", b"b"]))
    log.flush()
    position = log.segments[0].size_bytes
    log.append(make_batch([b"c"]))
    log.append(make_batch([b"d"]))
    crash(log_dir)
    with open(log_dir / "00000000000000000000.log", "r+b") as f:
        f.seek(position + 4)
        f.write(b"\x01")  # offset 2 becomes 2 + 2**24
    log = open_log(log_dir, clock, recovery_point=2)
    assert read_values(log) == [b"a", b"b"]
    assert log.append(make_batch([b"c2"])).base_offset == 2
    log.close()


@pytest.mark.parametrize("policy", ["delete", "compact"])
def test_offset_gaps_are_damage_only_without_compaction(
    log_dir: Path, clock: ManualClock, policy: str
) -> None:
    # Compaction leaves gaps between batches; a log without it never has any.
    log_dir.mkdir(parents=True)
    batches = [
        encode_batch([(T0, b"k", b"a")], base_offset=0),
        encode_batch([(T0, b"k", b"b")], base_offset=5),
    ]
    (log_dir / "00000000000000000000.log").write_bytes(b"".join(batches))
    log = open_log(log_dir, clock, log_config(cleanup_policy=policy))
    expected = [0, 5] if policy == "compact" else [0]
    assert [r.offset for r in read_all(log)] == expected
    log.close()
