"""Crash-consistency and hostile-input points of issue 11, each failing before its fix.

Directory fsyncs are checked by recording, at the operating-system boundary, every
creation, rename and unlink in a partition directory and every fsync: each change must be
followed by an fsync of its directory before the operation that made it returns (the
calls still reach the OS; nothing inside Tidelog is replaced).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.storage.conftest import T0, lz4_batch, make_batch, open_log, read_values, with_codec
from tidelog.storage.cleaner import LogCleaner
from tidelog.storage.clock import ManualClock
from tidelog.storage.compaction import CleaningRules, OffsetMap, clean_batch
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.log_manager import LogManager
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import (
    HEADER_SIZE,
    MAX_DECOMPRESSED_BYTES,
    Compression,
    decode_batch,
    encode_batch,
)


class Journal:
    """What the process asked the OS to change in directories, and which fsyncs followed."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []  # ("change" | "fsync", directory)

    def unsynced(self, directory: Path) -> int:
        """Changes in ``directory`` with no fsync of it after them."""
        pending = 0
        for kind, where in self.events:
            if where != str(directory):
                continue
            pending = 0 if kind == "fsync" else pending + 1
        return pending

    def changes(self, directory: Path) -> int:
        return sum(1 for kind, where in self.events if kind == "change" and where == str(directory))


@pytest.fixture
def journal(monkeypatch: pytest.MonkeyPatch) -> Journal:
    recorded = Journal()
    real_open, real_replace, real_rename = os.open, os.replace, os.rename
    real_unlink, real_fsync, real_mkdir = os.unlink, os.fsync, os.mkdir

    def parent(path: Any) -> str:
        return str(Path(os.fsdecode(path)).absolute().parent)

    def spy_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        existed = os.path.exists(path)
        fd = real_open(path, flags, *args, **kwargs)
        if flags & os.O_CREAT and not existed:
            recorded.events.append(("change", parent(path)))
        return fd

    def spy_move(real: Callable[..., None]) -> Callable[..., None]:
        def move(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            real(src, dst, *args, **kwargs)
            recorded.events.append(("change", parent(src)))
            recorded.events.append(("change", parent(dst)))

        return move

    def spy_unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        real_unlink(path, *args, **kwargs)
        recorded.events.append(("change", parent(path)))

    def spy_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        real_mkdir(path, *args, **kwargs)
        recorded.events.append(("change", parent(path)))

    def spy_fsync(fd: int) -> None:
        real_fsync(fd)
        target = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(target):
            recorded.events.append(("fsync", target))

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "replace", spy_move(real_replace))
    monkeypatch.setattr(os, "rename", spy_move(real_rename))
    monkeypatch.setattr(os, "unlink", spy_unlink)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "mkdir", spy_mkdir)
    return recorded


def _log(tmp_path: Path, clock: ManualClock, **settings: object) -> PartitionLog:
    config = LogConfig.from_mapping({"segment.bytes": 200, "file.delete.delay.ms": 0, **settings})
    return open_log(tmp_path / "events-0", clock, config)


def _fill(log: PartitionLog, count: int) -> None:
    for i in range(count):
        log.append(make_batch([b"value-%03d" % i] * 3))


# --- directory fsyncs -------------------------------------------------------------------


def test_roll_makes_the_new_segment_files_durable(tmp_path: Path, journal: Journal) -> None:
    log = _log(tmp_path, ManualClock())
    _fill(log, 1)
    journal.events.clear()
    log.roll()
    assert journal.changes(log.directory) >= 3  # .log, .index, .timeindex (and a snapshot)
    assert journal.unsynced(log.directory) == 0
    log.close()


def test_new_partition_and_data_directories_are_durable(tmp_path: Path, journal: Journal) -> None:
    """A partition directory's name lives in the data directory: created for a topic or
    for added partitions, it is fsynced into it before the call returns (before any
    produce could be acknowledged); so is a new data directory in its parent (a power
    cut otherwise kept the fsynced segments and lost the directory holding them)."""
    data_dir = tmp_path / "deep" / "data"
    manager = LogManager.open(data_dir, clock=ManualClock())
    assert journal.changes(tmp_path) == 1
    assert journal.unsynced(tmp_path) == 0
    assert journal.unsynced(tmp_path / "deep") == 0
    journal.events.clear()
    manager.create_topic("fresh", 2)
    manager.create_partitions("fresh", 3)
    assert journal.changes(data_dir) >= 3  # the three partition directories (and topics.json)
    assert journal.unsynced(data_dir) == 0
    manager.close()


def test_retention_renames_and_unlinks_are_durable(tmp_path: Path, journal: Journal) -> None:
    clock = ManualClock()
    log = _log(tmp_path, clock, **{"retention.bytes": 1})
    _fill(log, 10)
    journal.events.clear()
    assert log.delete_old_segments() > 0  # renamed .deleted
    assert journal.changes(log.directory) > 0
    assert journal.unsynced(log.directory) == 0
    assert log.delete_expired_files() > 0  # unlinked
    assert journal.unsynced(log.directory) == 0
    log.close()


def test_truncation_is_durable(tmp_path: Path, journal: Journal) -> None:
    log = _log(tmp_path, ManualClock())
    _fill(log, 10)
    journal.events.clear()
    log.truncate_to(3)
    assert journal.changes(log.directory) > 0
    assert journal.unsynced(log.directory) == 0
    log.close()


def test_the_cleaner_swap_is_durable(tmp_path: Path, journal: Journal) -> None:
    clock = ManualClock(wall_ms=T0)
    config = LogConfig.from_mapping(
        {"cleanup.policy": "compact", "segment.bytes": 200, "file.delete.delay.ms": 0}
    )
    log = PartitionLog.open(tmp_path / "events-0", "events", 0, config, clock)
    for i in range(20):
        log.append(encode_batch([(T0, b"k%d" % (i % 2), b"v%d" % i)]))
    log.roll()
    journal.events.clear()
    assert LogCleaner(tmp_path, clock).clean_log(log, force=True).cleaned
    assert journal.unsynced(log.directory) == 0
    log.delete_expired_files(force=True)
    assert journal.unsynced(log.directory) == 0
    log.close()


# --- truncation and readers ---------------------------------------------------------


def test_truncation_keeps_dropped_segments_readable_until_the_delay(tmp_path: Path) -> None:
    clock = ManualClock()
    log = _log(tmp_path, clock, **{"file.delete.delay.ms": 60_000})
    _fill(log, 10)
    snapshot = list(log.segments)  # what a reader in the middle of a fetch holds
    last = snapshot[-2]
    log.truncate_to(snapshot[1].base_offset)
    # Before issue 11 the dropped segments were unlinked and closed at once.
    assert last.read(last.base_offset, 10_000)
    assert any(p.name.endswith(".deleted") for p in log.directory.iterdir())
    clock.advance(60_000)
    log.delete_expired_files()
    assert not any(p.name.endswith(".deleted") for p in log.directory.iterdir())
    assert read_values(log) == [b"value-000"] * 3
    log.close()


def test_a_flush_racing_a_truncation_never_puts_the_recovery_point_past_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path, ManualClock(), **{"segment.bytes": 1 << 20})
    _fill(log, 10)
    in_fsync = threading.Event()
    release = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if threading.current_thread().name == "flusher":
            in_fsync.set()
            release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    flusher = threading.Thread(target=log.flush, name="flusher")
    flusher.start()
    assert in_fsync.wait(10)
    truncater = threading.Thread(target=log.truncate_to, args=(3,))
    truncater.start()
    truncater.join(0.3)  # it waits for the flush (before the fix it cut the log here)
    release.set()
    flusher.join(10)
    truncater.join(10)
    assert log.log_end_offset == 3
    assert log.recovery_point <= log.log_end_offset
    log.close()


# --- idempotence state ---------------------------------------------------------------


def test_producer_state_is_read_through_locked_copies(tmp_path: Path) -> None:
    log = _log(tmp_path, ManualClock())
    log.append(make_batch([b"a", b"b"], producer_id=5, producer_epoch=0, base_sequence=0))
    assert [s.producer_id for s in log.describe_producers()] == [5]
    assert log.producer_last_offset(5) == 1
    assert log.producer_last_offset(6) is None
    assert not hasattr(log, "producer_state")  # the mutable table is not handed out
    log.close()


# --- hostile batches -------------------------------------------------------------------


def test_an_lz4_bomb_is_a_corrupt_record_not_an_allocation() -> None:
    bomb = lz4_batch(bytes(MAX_DECOMPRESSED_BYTES + 1))
    assert len(bomb) < 1 << 20  # it fits in one produce request
    with pytest.raises(CorruptRecordError, match="over the limit of"):
        decode_batch(bomb)
    rules = CleaningRules(
        offset_map=OffsetMap(100),
        map_end_offset=0,
        round_end_offset=1,
        now_ms=T0,
        delete_retention_ms=0,
        max_batch_bytes=1 << 20,
        producer_last_offset=lambda _: None,
    )
    with pytest.raises(CorruptRecordError, match="over the limit of"):
        clean_batch(bomb, rules)


def test_a_batch_at_the_cap_still_decodes() -> None:
    record = encode_batch([(T0, None, b"v" * 1000)])
    body = record[HEADER_SIZE:]
    assert decode_batch(lz4_batch(body))[1][0].value == b"v" * 1000


@pytest.mark.parametrize(
    "codec", [Compression.GZIP, Compression.SNAPPY, Compression.ZSTD], ids=lambda c: c.name.lower()
)
def test_every_codec_is_appended_and_read_back(tmp_path: Path, codec: Compression) -> None:
    # Once refused at append (the log could not read them back); now stored as sent. A
    # batch only marked with the codec is stored too, as a bad LZ4 one is: the broker does
    # not decode on the produce path, readers refuse it (a compacted log refuses it here).
    log = _log(tmp_path, ManualClock())
    log.append(make_batch([b"a", b"b"], compression=codec))
    log.append(make_batch([b"c"]))
    assert read_values(log) == [b"a", b"b", b"c"]
    log.append(with_codec(make_batch([b"d"]), codec))
    assert log.log_end_offset == 4
    log.close()
    compacted = _log(tmp_path / "compacted", ManualClock(), **{"cleanup.policy": "compact"})
    with pytest.raises(CorruptRecordError, match=f"bad {codec.name.lower()} data"):
        compacted.append(with_codec(make_batch([b"d"], keys=[b"k"]), codec))
    compacted.append(make_batch([b"e"], keys=[b"k"], compression=codec))
    assert read_values(compacted) == [b"e"]
    compacted.close()
