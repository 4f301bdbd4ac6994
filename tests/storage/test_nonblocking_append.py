"""``PartitionLog.append(blocking=False)`` (issue #31's inline produce): it appends as a
blocking append does, or gives up with ``AppendWouldBlockError`` before changing anything
when it would wait (a held partition lock, a roll, a ``flush.messages`` fsync); the
validation (CRC included) is the same either way."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.storage.conftest import log_config, make_batch, open_log, read_values
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.partition_log import AppendWouldBlockError
from tidelog.storage.records import Compression


def test_a_nonblocking_append_is_an_append(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    first = log.append(make_batch([b"a", b"b"]), blocking=False)
    second = log.append(make_batch([b"c"]))
    assert (first.base_offset, first.last_offset, second.base_offset) == (0, 1, 2)
    assert read_values(log) == [b"a", b"b", b"c"]
    log.close()


def test_a_held_lock_gives_up_and_changes_nothing(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    log.append(make_batch([b"a"]))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        # A real holder of the partition lock: a flush writing index entries, a
        # retention pass, a blocking append of a large request on another thread.
        with log._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        with pytest.raises(AppendWouldBlockError):
            log.append(make_batch([b"b"]), blocking=False)
    finally:
        release.set()
        holder.join()
    assert log.log_end_offset == 1
    assert log.append(make_batch([b"b"]), blocking=False).base_offset == 1
    assert read_values(log) == [b"a", b"b"]
    log.close()


def test_a_roll_is_left_to_a_blocking_append(log_dir: Path, clock: ManualClock) -> None:
    batch = make_batch([b"x" * 100])
    log = open_log(log_dir, clock, log_config(segment_bytes=2 * len(batch)))
    log.append(batch, blocking=False)
    log.append(batch, blocking=False)
    with pytest.raises(AppendWouldBlockError):
        log.append(batch, blocking=False)  # the active segment is full
    assert ([s.base_offset for s in log.segments], log.log_end_offset) == ([0], 2)
    assert log.append(batch).base_offset == 2  # blocking: rolls
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.close()


def test_a_flush_messages_fsync_is_left_to_a_blocking_append(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock, log_config(flush_messages=1))
    with pytest.raises(AppendWouldBlockError):
        log.append(make_batch([b"a"]), blocking=False)
    assert log.log_end_offset == 0
    log.append(make_batch([b"a"]))
    assert log.recovery_point == 1
    log.close()


def test_a_nonblocking_append_checks_the_crc(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    damaged = bytearray(make_batch([b"hello"]))
    damaged[-1] ^= 0xFF  # inside the records, covered by the CRC
    with pytest.raises(CorruptRecordError):
        log.append(bytes(damaged), blocking=False)
    assert log.log_end_offset == 0
    log.close()


def test_decompression_is_left_to_a_blocking_append(log_dir: Path, clock: ManualClock) -> None:
    """A few KiB of compressed records can hold megabytes: a compressed batch to a
    compacted topic (keys checked) and one the topic's ``compression.type`` rebuilds are
    appended blocking; an uncompressed one to a compacted topic is checked inline."""
    keyed = {"keys": [b"k"]}
    gzip = make_batch([b"v"], compression=Compression.GZIP, **keyed)  # type: ignore[arg-type]
    plain = make_batch([b"v"], **keyed)  # type: ignore[arg-type]
    compacted = open_log(log_dir / "compacted", clock, log_config(cleanup_policy="compact"))
    with pytest.raises(AppendWouldBlockError):
        compacted.append(gzip, blocking=False)
    assert compacted.append(plain, blocking=False).base_offset == 0
    assert compacted.append(gzip).base_offset == 1
    compacted.close()
    bounded = open_log(
        log_dir / "bounded", clock, log_config(message_timestamp_before_max_ms=10**12)
    )
    with pytest.raises(AppendWouldBlockError):
        bounded.append(gzip, blocking=False)  # the lower bound decodes every record
    assert bounded.append(plain, blocking=False).base_offset == 0
    bounded.close()
    rebuilt = open_log(log_dir / "rebuilt", clock, log_config(compression_type="zstd"))
    with pytest.raises(AppendWouldBlockError):
        rebuilt.append(plain, blocking=False)
    assert rebuilt.log_end_offset == 0
    assert rebuilt.append(plain).base_offset == 0
    rebuilt.close()
