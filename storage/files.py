"""File naming and crash-safe file writes for the log directory.

Segment files are named by their base offset as 20 zero-padded decimal digits, so that
``ls`` order is offset order (Kafka's ``LogFileUtils``)::

    00000000000000000000.log         batches
    00000000000000000000.index       sparse offset index
    00000000000000000000.timeindex   sparse time index
    <name>.cleaned                   compaction output still being written
    <name>.swap                      compaction output ready to replace old segments
    <name>.deleted                   files waiting to be unlinked

Partition directories are ``<topic>-<partition>``; topic names are validated so that no name
can leave the data directory.

``atomic_write`` is the one way state files are written: temp file, fsync, ``os.replace``,
fsync the directory. A crash at any point leaves either the old file or the new one, plus
perhaps a ``*.tmp`` that recovery removes.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections.abc import Callable
from pathlib import Path

from tidelog.storage.errors import InvalidTopicError

__all__ = [
    "CLEANED_SUFFIX",
    "DELETED_SUFFIX",
    "INDEX_SUFFIX",
    "LOG_SUFFIX",
    "SWAP_SUFFIX",
    "TIME_INDEX_SUFFIX",
    "TMP_SUFFIX",
    "atomic_write",
    "base_offset_from_name",
    "fsync_dir",
    "make_dir_durable",
    "offset_file_name",
    "parse_partition_dir",
    "partition_dir_name",
    "validate_topic_name",
]

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
TMP_SUFFIX = ".tmp"

MAX_TOPIC_NAME_LENGTH = 249
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def validate_topic_name(name: object) -> str:
    """Return ``name`` if it is a legal topic name, else raise ``InvalidTopicError``.

    Legal: 1 to 249 characters of ``[A-Za-z0-9._-]``, and not ``.`` or ``..``. The alphabet
    has no path separator, so a legal name cannot escape the data directory.
    """
    if not isinstance(name, str):
        raise InvalidTopicError(f"topic name must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidTopicError("topic name is empty")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters long; the limit is {MAX_TOPIC_NAME_LENGTH}"
        )
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if _TOPIC_NAME.fullmatch(name) is None:
        bad = sorted({c for c in name if not re.fullmatch(r"[A-Za-z0-9._-]", c)})
        raise InvalidTopicError(
            f"topic name {name!r} has illegal characters {''.join(bad)!r}; "
            "allowed are ASCII letters, digits, '.', '_' and '-'"
        )
    return name


def offset_file_name(base_offset: int, suffix: str) -> str:
    """``00000000000000000042.log`` for (42, ".log")."""
    return f"{base_offset:020d}{suffix}"


def base_offset_from_name(name: str) -> int:
    """The offset a segment file is named by: the digits before the first dot."""
    return int(name.split(".", 1)[0])


def partition_dir_name(topic: str, partition: int) -> str:
    """``events-3`` for ("events", 3)."""
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """Split ``<topic>-<partition>`` on the last dash; None if it is not such a name."""
    topic, dash, number = name.rpartition("-")
    if not dash or not number.isdigit():
        return None
    try:
        validate_topic_name(topic)
    except InvalidTopicError:
        return None
    return topic, int(number)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that creations, renames and unlinks in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_file_system(path: str | os.PathLike[str]) -> None:
    """Make everything written on the file system holding the directory ``path`` durable,
    in one call (Linux ``syncfs(2)``; ``os.sync`` where it is missing): many files written
    with ``atomic_write(sync=False)`` for the price of one flush, not two fsyncs each.
    Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncfs = _syncfs()
        if syncfs is None:
            os.sync()
        elif syncfs(fd) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno), os.fspath(path))
    finally:
        os.close(fd)


@functools.cache
def _syncfs() -> Callable[[int], int] | None:
    try:
        syncfs: Callable[[int], int] = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    return syncfs


def make_dir_durable(path: str | os.PathLike[str]) -> bool:
    """Create the directory ``path`` and its missing parents so that their names survive a
    crash; returns whether any was created (False: it existed already).

    A directory's name is an entry in its parent, durable only once the parent is fsynced
    (POSIX; ext4 often commits it with a later fsync of a file inside, but nothing
    promises that). Without this a partition created just before an ``acks=all`` produce
    kept its fsynced segment but lost the directory holding it at a power cut (issue #29's
    lossy filesystem found it). Each created level's parent is fsynced, top down, before
    the function returns. A concurrent creator of the same directory is harmless.
    """
    target = Path(path)
    missing: list[Path] = []
    probe = target
    while not probe.is_dir():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        fsync_dir(directory.parent)
    return bool(missing)


def atomic_write(path: str | os.PathLike[str], data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content.

    Order: write ``path.tmp``, fsync it, ``os.replace`` onto ``path``, fsync the directory.
    On failure (``OSError``, often ENOSPC) the old file is untouched and the temp file
    removed. ``sync`` False skips both fsyncs: the caller makes the file durable itself
    (``sync_file_system``, once for many files) before anything relies on it; an OS crash
    before then may leave the old file, the new one, or an unreadable one (a process
    crash loses nothing: the page cache survives it).
    """
    target = Path(path)
    tmp = target.with_name(target.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        # A full disk (ENOSPC) is the usual cause: the partial temp file would hold the
        # little space left until the next start's cleanup (issue #29's disk-full fault).
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync:
        fsync_dir(target.parent)
