"""``PartitionLog.read`` takes no lock: it never waits for a disk, and it never sees half an
append.

The broker reads small fetches on its event loop's thread; the partition lock is held
across appends, rolls and directory fsyncs, which a loaded disk stretches to seconds. A
read that waited for that lock stalled every call of the listener. Reads instead load one
published view (segments, bases, log start) and bound themselves by a segment size that
an append publishes last, after the batches' index entries and times.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.storage.conftest import log_config, make_batch, open_log
from tidelog.storage.batch_times import BatchTimes, decode_wire
from tidelog.storage.clock import ManualClock
from tidelog.storage.records import iter_batch_headers

WAIT_S = 10.0


@pytest.fixture
def blocked_fsync(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """A disk whose fsyncs stall: ``os.fsync`` called from a thread named ``roller`` waits
    until the test sets ``release`` (``entered`` says it is waiting)."""
    entered = threading.Event()
    release = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if threading.current_thread().name == "roller":
            entered.set()
            release.wait(WAIT_S)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    try:
        yield entered, release
    finally:
        release.set()


def test_a_read_does_not_wait_for_a_roll_stuck_in_fsync(
    log_dir: Path, clock: ManualClock, blocked_fsync: tuple[threading.Event, threading.Event]
) -> None:
    entered, release = blocked_fsync
    log = open_log(log_dir, clock)
    log.append(make_batch([b"a", b"b"]), BatchTimes(10, 20))
    roller = threading.Thread(target=log.roll, name="roller")
    roller.start()
    assert entered.wait(WAIT_S), "the roll never reached its fsync"

    answers = []
    reader = threading.Thread(target=lambda: answers.append(log.read(0, 1 << 20)))
    reader.start()
    reader.join(WAIT_S / 2)
    stuck = reader.is_alive()
    rolling = roller.is_alive()
    release.set()
    roller.join(WAIT_S)
    reader.join(WAIT_S)

    assert not stuck, "the read waited for the partition lock held across the roll's fsync"
    assert rolling, "the roll was not holding its fsync while the read ran"
    (answer,) = answers
    assert [h.base_offset for _, h in iter_batch_headers(answer.records)] == [0]
    assert decode_wire(answer.batch_times) == {1: (10, 20)}
    assert log.segment_count == 2


def test_concurrent_reads_see_whole_appends_with_their_times(
    log_dir: Path, clock: ManualClock
) -> None:
    """A reader racing an appender (rolls every few batches) sees only whole batches, at
    dense offsets from where it asked, each with the times the append stored with it."""
    log = open_log(log_dir, clock, log_config(segment_bytes=4_000))
    batches = 1_500
    done = threading.Event()
    problems: list[str] = []

    def append() -> None:
        try:
            for i in range(batches):
                log.append(make_batch([b"v%d" % i] * 3), BatchTimes(i, i + 1))
        finally:
            done.set()

    appender = threading.Thread(target=append)
    appender.start()
    reads = 0
    while not done.is_set() or reads < 50:
        reads += 1
        end = log.log_end_offset
        start = max(0, end - 30)
        answer = log.read(start, 1 << 20)
        headers = [h for _, h in iter_batch_headers(answer.records)]
        offsets = [h.base_offset for h in headers]
        times = decode_wire(answer.batch_times)
        if offsets and offsets[0] > start:
            problems.append(f"read at {start} began at {offsets[0]}")
        if any(b - a != 3 for a, b in itertools.pairwise(offsets)):
            problems.append(f"offsets not dense from {start}: {offsets}")
        for header in headers:
            i = header.base_offset // 3
            if times.get(header.last_offset) != (i, i + 1):
                problems.append(
                    f"batch {header.base_offset}: times {times.get(header.last_offset)}"
                )
        if len(problems) > 5:
            break
    appender.join(WAIT_S)
    assert problems == []
    assert log.log_end_offset == 3 * batches
    assert log.segment_count > 10


def test_the_end_offset_moves_only_once_the_records_can_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single node's high watermark is the log end: a reader that saw a new end before
    the bytes up to it were readable parked its fetch as if it had read them, and slept to
    its deadline (a 500 ms end-to-end p99.9). Seen from inside an append (its batch-times
    step, after the bytes are written and before the size is published), the end is
    still the old one."""
    plog = open_log(tmp_path, ManualClock())
    plog.append(make_batch([b"first"]), BatchTimes(1, 2))
    segment = plog.segments[-1]
    seen: list[tuple[int, bytes]] = []
    real_append = segment.batch_times.append

    def look_then_append(entries: list) -> None:  # type: ignore[type-arg]
        seen.append((plog.high_watermark, plog.read(1, 1 << 20).records))
        real_append(entries)

    monkeypatch.setattr(segment.batch_times, "append", look_then_append)
    plog.append(make_batch([b"second"]), BatchTimes(3, 4))
    assert seen == [(1, b"")]  # mid-append: neither the end nor the bytes yet
    assert plog.high_watermark == 2
    assert plog.read(1, 1 << 20).records  # once published, both
