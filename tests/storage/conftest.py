"""Shared fixtures and helpers for the storage engine's tests.

Everything runs on real files in pytest's temporary directories. Two helpers deserve a
word:

* ``crash(directory)`` simulates a process dying: it closes, at the OS level, every file
  descriptor this process holds on files under ``directory``, exactly what the kernel does
  when a process exits. Nothing of the log object's in-memory state (index entries not yet
  handed to the OS, producer state) reaches the disk. The crashed object must never be used
  again (its descriptor numbers may be reused by whatever opens next).
* ``tmpfs`` mounts a tiny tmpfs (we run as root in CI) so a test can fill a disk for real;
  it skips with the reason when mounting is not permitted.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import crc32c
import lz4.frame
import pytest

from tidelog.storage.clock import ManualClock
from tidelog.storage.config import LogConfig
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import (
    HEADER_SIZE,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchBuilder,
    Compression,
    Record,
    TimestampType,
    decode_records,
    encode_batch,
    split_whole_batches,
)

T0 = 1_700_000_000_000  # ManualClock's default wall time
TOPIC = "events"


def make_batch(
    values: Sequence[bytes | None],
    *,
    timestamp_ms: int = T0,
    timestamps: Sequence[int] | None = None,
    keys: Sequence[bytes | None] | None = None,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
) -> bytes:
    """One batch of ``values`` (timestamps ``timestamp_ms`` or ``timestamps``, keys None)."""
    builder = BatchBuilder(
        compression=compression,
        timestamp_type=timestamp_type,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    for i, value in enumerate(values):
        ts = timestamps[i] if timestamps is not None else timestamp_ms
        key = keys[i] if keys is not None else None
        builder.append(ts, key, value)
    return builder.build()


def values(count: int, start: int = 0, size: int = 0) -> list[bytes]:
    """``count`` distinct values ``b"v<n>"``, padded with ``.`` to ``size`` bytes."""
    return [f"v{n}".encode().ljust(size, b".") for n in range(start, start + count)]


def read_all(log: PartitionLog, start: int | None = None, max_bytes: int = 200) -> list[Record]:
    """Every record from ``start`` (default: the log start) to the log end.

    Fetches with a small ``max_bytes`` the way a consumer does: each fetch starts at the
    next offset wanted, records below it (the front of a batch) are dropped, a partial
    batch at the end of a response is ignored. Checks along the way that every fetch makes
    progress and that records come back in strictly increasing offset order.
    """
    offset = log.log_start_offset if start is None else start
    out: list[Record] = []
    while offset < log.log_end_offset:
        data = log.read(offset, max_bytes).records
        assert data, f"empty read at {offset} below the log end {log.log_end_offset}"
        whole = data[: split_whole_batches(data)]
        assert whole, f"read at {offset} returned no whole batch"
        fetched = [r for r in decode_records(whole) if r.offset >= offset]
        assert fetched, f"read at {offset} made no progress"
        for record in fetched:
            assert not out or record.offset > out[-1].offset
            out.append(record)
        offset = fetched[-1].offset + 1
    return out


def read_values(log: PartitionLog, start: int | None = None) -> list[bytes | None]:
    return [r.value for r in read_all(log, start)]


def log_config(**overrides: object) -> LogConfig:
    """A ``LogConfig`` from Kafka-named keys, with ``_`` standing for ``.``.

    ``log_config(segment_bytes=1000)`` is ``LogConfig.from_mapping({"segment.bytes": 1000})``.
    """
    return LogConfig.from_mapping({k.replace("_", "."): v for k, v in overrides.items()})


def open_log(
    directory: Path,
    clock: ManualClock,
    config: LogConfig | None = None,
    **kwargs: object,
) -> PartitionLog:
    """``PartitionLog.open`` of ``events-0`` in ``directory`` (kwargs passed through)."""
    return PartitionLog.open(
        directory,
        TOPIC,
        0,
        config if config is not None else LogConfig(),
        clock,
        **kwargs,  # type: ignore[arg-type]
    )


def reopen_clean(
    log: PartitionLog, clock: ManualClock, config: LogConfig | None = None
) -> PartitionLog:
    """Close ``log`` and open it again as after an orderly shutdown (checkpoints kept)."""
    log_start, directory = log.log_start_offset, log.directory
    log.close()
    return open_log(
        directory,
        clock,
        config or log.config,
        log_start_offset=log_start,
        recovery_point=log.recovery_point,
        had_clean_shutdown=True,
    )


def reopen_unclean(
    log: PartitionLog,
    clock: ManualClock,
    config: LogConfig | None = None,
    *,
    log_start_offset: int = 0,
    recovery_point: int = 0,
) -> PartitionLog:
    """Crash ``log`` (see ``crash``) and open it again as after an unclean stop."""
    directory, old_config = log.directory, log.config
    crash(directory)
    return open_log(
        directory,
        clock,
        config or old_config,
        log_start_offset=log_start_offset,
        recovery_point=recovery_point,
        had_clean_shutdown=False,
    )


def open_descriptors(directory: Path) -> dict[int, str]:
    """This process's descriptors open on ``directory`` or a file under it -> the path."""
    root = str(directory.resolve())
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the descriptor that listed the directory, already gone
        if target == root or target.startswith(root + os.sep):
            found[int(name)] = target
    return found


def crash(directory: Path) -> int:
    """Close every descriptor this process has open on a file under ``directory``.

    This is what the kernel does to a dying process; see the module docstring. Returns how
    many descriptors were closed.
    """
    closed = 0
    for fd in open_descriptors(directory):
        try:
            os.close(fd)
            closed += 1
        except OSError:
            pass
    return closed


def segment_files(directory: Path, suffix: str = ".log") -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(suffix))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall_ms=T0)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / f"{TOPIC}-0"


@contextlib.contextmanager
def scratch_dir(parent: Path) -> Iterator[Path]:
    """A fresh directory per hypothesis example (function fixtures are shared by them)."""
    path = Path(tempfile.mkdtemp(dir=parent, prefix=f"ex-{uuid.uuid4().hex[:8]}-"))
    try:
        yield path
    finally:
        crash(path)  # whatever the example left open
        shutil.rmtree(path, ignore_errors=True)


def mount_tmpfs(path: Path, size_bytes: int) -> str | None:
    """Mount a tmpfs of ``size_bytes`` at ``path``; None on success, else why not."""
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return "no mount command"
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        return f"cannot mount a tmpfs here ({result.stderr.strip() or result.returncode})"
    return None


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs under ``tmp_path``: a disk a test can fill. Skips if unavailable."""
    mount_point = tmp_path / "tmpfs"
    reason = mount_tmpfs(mount_point, 1024 * 1024)
    if reason is not None:
        pytest.skip(f"full-disk test needs a tmpfs mount (run as root): {reason}")
    try:
        yield mount_point
    finally:
        crash(mount_point)
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill_disk(path: Path, free_bytes: int) -> Path:
    """Fill the file system holding ``path`` until about ``free_bytes`` remain."""
    filler = path / "filler"
    stat = os.statvfs(path)
    available = stat.f_bavail * stat.f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(available - free_bytes, 0))
    return filler


def fill_disk_completely(path: Path) -> list[Path]:
    """Fill the file system holding ``path`` to the last byte; returns the filler files."""
    fillers = [fill_disk(path, 0), path / "filler-rest"]
    fd = os.open(fillers[1], os.O_WRONLY | os.O_CREAT)
    try:
        assert write_until_error(fd) == errno.ENOSPC
    finally:
        os.close(fd)
    return fillers


def write_until_error(fd: int) -> int | None:
    while True:
        try:
            os.write(fd, b"\0" * 512)
        except OSError as exc:
            return exc.errno


def lz4_batch(payload: bytes, records_count: int = 1) -> bytes:
    """A valid batch frame whose LZ4 body decompresses to ``payload``."""
    template = bytearray(encode_batch([(T0, None, b"x")], compression=Compression.LZ4))
    body = lz4.frame.compress(payload, block_linked=False, store_size=False)
    batch = template[:HEADER_SIZE] + body
    batch[8:12] = (len(batch) - 12).to_bytes(4, "big")
    batch[57:61] = records_count.to_bytes(4, "big")
    batch[17:21] = crc32c.crc32c(bytes(batch[21:])).to_bytes(4, "big")
    return bytes(batch)


def with_codec(batch: bytes, codec: Compression) -> bytes:
    """``batch`` marked as compressed with ``codec`` (the body is not), CRC fixed."""
    marked = bytearray(batch)
    marked[22] |= codec
    marked[17:21] = crc32c.crc32c(bytes(marked[21:])).to_bytes(4, "big")
    return bytes(marked)
