"""Sparse offset and time indexes of one segment.

Byte layout (big-endian, Kafka's entry sizes; no header, no checksum: an index is rebuilt
from its ``.log`` whenever it is missing or fails the sanity check)::

    .index      entry = int32 relative_offset | int32 position          (8 bytes)
    .timeindex  entry = int64 timestamp_ms    | int32 relative_offset   (12 bytes)

``relative_offset`` is ``offset - segment base offset``; ``position`` is a byte position in
the ``.log``.

Offset index entries map the *base* offset of a batch to the position where that batch
starts, one entry whenever more than ``index.interval.bytes`` were appended since the last
one. (Kafka keys an entry by the last offset of the appended set, a leftover of the v0/v1
wrapper format; keying by the base offset makes a lookup land on the batch that holds the
target, or just before it, with the same guarantees.)

Time index entry ``(T, O)`` says: every record before offset ``O``'s batch, and that batch
itself, has a timestamp <= ``T``. Entries are appended with the offset index entries, and
only when ``T`` grows, so both columns increase strictly.

Entries are held in memory (``array('q')``, 8 bytes an entry, bisect-searchable) and the
file is appended to on ``flush``; the in-memory copy is the truth for lookups. Neither class
is thread-safe: the owning ``Segment``'s caller (``PartitionLog``) serialises writers.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

__all__ = ["CorruptIndexError", "OffsetIndex", "TimeIndex"]

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
OFFSET_ENTRY_BYTES = _OFFSET_ENTRY.size
TIME_ENTRY_BYTES = _TIME_ENTRY.size


class CorruptIndexError(Exception):
    """An index file fails its sanity check; the caller rebuilds it from the log."""


class _IndexFile:
    """Append-on-flush persistence shared by both indexes."""

    def __init__(self, path: Path, entry_bytes: int) -> None:
        self.path = path
        self._entry_bytes = entry_bytes
        self._pending = bytearray()
        self._fd = -1
        # Whether bytes were written through _fd since its last fsync. A flush fsyncs
        # every dirty segment's files, and most flushes add no index entry (one per
        # index.interval.bytes): an fsync of a file with nothing written since the last
        # one makes nothing more durable, so it is skipped (it cost a third of a share
        # state write's flush, docs/share-groups.md).
        self._unsynced = False

    def _open(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def read_all(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""

    def add(self, entry: bytes) -> None:
        self._pending += entry

    def write_pending(self) -> None:
        """Hand pending entries to the OS (page cache); no fsync."""
        if self._pending:
            fd = self._open()
            # A nearly full disk accepts part of a write: keep the rest pending, so the
            # file never holds a torn entry followed by misaligned ones.
            while self._pending:
                self._unsynced = True
                written = os.write(fd, self._pending)
                del self._pending[:written]

    def fsync(self) -> None:
        if self._fd >= 0 and self._unsynced:
            os.fsync(self._fd)
            self._unsynced = False  # only once the fsync succeeded

    def rewrite(self, content: bytes) -> None:
        """Replace the file's content (after truncation or a rebuild)."""
        self.close()
        self._pending.clear()
        with open(self.path, "wb") as f:
            f.write(content)
        self._fd = -1

    def rename(self, path: Path) -> None:
        self.write_pending()
        os.replace(self.path, path)
        self.path = path

    def close(self) -> None:
        # Pending entries go out even if the file was never opened for writing (a fresh
        # or just rewritten index): close promises the file holds every entry.
        self.write_pending()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class OffsetIndex:
    """Sparse map from a batch's base offset to its byte position in the segment's log."""

    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max_entries
        self._offsets = array("q")
        self._positions = array("q")
        self._file = _IndexFile(path, OFFSET_ENTRY_BYTES)

    @classmethod
    def open(
        cls, path: Path, base_offset: int, max_entries: int, log_size_bytes: int
    ) -> OffsetIndex:
        """Load an index file, or start an empty one if there is none.

        Raises:
            CorruptIndexError: the length is not a whole number of entries, entries do not
                increase, or a position lies past the end of the log.
        """
        index = cls(path, base_offset, max_entries)
        data = index._file.read_all()
        if len(data) % OFFSET_ENTRY_BYTES:
            raise CorruptIndexError(f"{path}: {len(data)} bytes is not a multiple of 8")
        last_offset, last_position = -1, -1
        for relative_offset, position in _OFFSET_ENTRY.iter_unpack(data):
            if relative_offset <= last_offset or position <= last_position:
                raise CorruptIndexError(f"{path}: entries do not increase")
            if position >= log_size_bytes:
                raise CorruptIndexError(f"{path}: position {position} past the log end")
            index._offsets.append(base_offset + relative_offset)
            index._positions.append(position)
            last_offset, last_position = relative_offset, position
        return index

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def is_full(self) -> bool:
        """No room for another entry within ``segment.index.bytes``."""
        return len(self._offsets) >= self.max_entries

    def append(self, offset: int, position: int) -> None:
        """Add an entry; offsets and positions must be greater than the last entry's."""
        if self._offsets and (offset <= self._offsets[-1] or position <= self._positions[-1]):
            raise ValueError(f"index entry ({offset}, {position}) does not increase")
        # The lookup key last: a lock-free ``lookup`` that finds the offset finds its
        # position too.
        self._positions.append(position)
        self._offsets.append(offset)
        self._file.add(_OFFSET_ENTRY.pack(offset - self.base_offset, position))

    def lookup(self, offset: int) -> tuple[int, int]:
        """The entry with the largest offset <= ``offset``, or ``(base_offset, 0)``."""
        i = bisect_right(self._offsets, offset) - 1
        if i < 0:
            return self.base_offset, 0
        try:
            return self._offsets[i], self._positions[i]
        except IndexError:  # a truncation ran under this lock-free lookup: scan from 0
            return self.base_offset, 0

    def last_entry(self) -> tuple[int, int]:
        """The last entry, or ``(base_offset, 0)`` when empty."""
        if not self._offsets:
            return self.base_offset, 0
        return self._offsets[-1], self._positions[-1]

    def truncate_to(self, offset: int) -> None:
        """Drop every entry whose offset is >= ``offset``."""
        i = bisect_left(self._offsets, offset)
        if i == len(self._offsets):
            return
        del self._offsets[i:]
        del self._positions[i:]
        self._file.rewrite(
            b"".join(
                _OFFSET_ENTRY.pack(o - self.base_offset, p)
                for o, p in zip(self._offsets, self._positions, strict=True)
            )
        )

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        self._offsets = array("q")
        self._positions = array("q")
        self._file.rewrite(b"")

    def write_pending(self) -> None:
        self._file.write_pending()

    def fsync(self) -> None:
        self._file.fsync()

    def rename(self, path: Path) -> None:
        self._file.rename(path)

    def close(self) -> None:
        self._file.close()

    def delete(self) -> None:
        self._file.delete()

    @property
    def path(self) -> Path:
        return self._file.path


class TimeIndex:
    """Sparse map from the largest timestamp so far to the batch offset where it was seen."""

    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max_entries
        self._timestamps = array("q")
        self._offsets = array("q")
        self._file = _IndexFile(path, TIME_ENTRY_BYTES)

    @classmethod
    def open(cls, path: Path, base_offset: int, max_entries: int, next_offset: int) -> TimeIndex:
        """Load a time index file, or start an empty one.

        Raises:
            CorruptIndexError: a partial entry, entries that do not increase, or an offset
                at or past ``next_offset`` (the segment's end).
        """
        index = cls(path, base_offset, max_entries)
        data = index._file.read_all()
        if len(data) % TIME_ENTRY_BYTES:
            raise CorruptIndexError(f"{path}: {len(data)} bytes is not a multiple of 12")
        last_ts, last_offset = None, -1
        for timestamp, relative_offset in _TIME_ENTRY.iter_unpack(data):
            offset = base_offset + relative_offset
            if (last_ts is not None and timestamp <= last_ts) or offset < last_offset:
                raise CorruptIndexError(f"{path}: entries do not increase")
            if offset >= next_offset:
                raise CorruptIndexError(f"{path}: offset {offset} past the segment end")
            index._timestamps.append(timestamp)
            index._offsets.append(offset)
            last_ts, last_offset = timestamp, offset
        return index

    def __len__(self) -> int:
        return len(self._timestamps)

    @property
    def is_full(self) -> bool:
        """Full one slot early: the last slot is kept for the entry written at roll."""
        return len(self._timestamps) >= self.max_entries - 1

    def maybe_append(self, timestamp_ms: int, offset: int) -> None:
        """Add ``(timestamp_ms, offset)`` if the timestamp is greater than the last entry's."""
        if self._timestamps and timestamp_ms <= self._timestamps[-1]:
            return
        if self._offsets and offset < self._offsets[-1]:
            raise ValueError(f"time index offset {offset} goes backwards")
        self._offsets.append(offset)
        self._timestamps.append(timestamp_ms)  # the lookup key last (see OffsetIndex)
        self._file.add(_TIME_ENTRY.pack(timestamp_ms, offset - self.base_offset))

    def lookup_before(self, timestamp_ms: int) -> tuple[int, int] | None:
        """The last entry whose timestamp is strictly below ``timestamp_ms``, if any.

        Every record before that entry's offset has a timestamp below ``timestamp_ms``, so a
        search for the first record at or after ``timestamp_ms`` may start at that batch.
        """
        i = bisect_left(self._timestamps, timestamp_ms) - 1
        if i < 0:
            return None
        try:
            return self._timestamps[i], self._offsets[i]
        except IndexError:  # a truncation ran under this lock-free lookup
            return None

    def last_entry(self) -> tuple[int, int] | None:
        if not self._timestamps:
            return None
        return self._timestamps[-1], self._offsets[-1]

    def truncate_to(self, offset: int) -> None:
        """Drop every entry whose offset is >= ``offset``."""
        i = bisect_left(self._offsets, offset)
        if i == len(self._offsets):
            return
        del self._timestamps[i:]
        del self._offsets[i:]
        self._file.rewrite(
            b"".join(
                _TIME_ENTRY.pack(t, o - self.base_offset)
                for t, o in zip(self._timestamps, self._offsets, strict=True)
            )
        )

    def reset(self) -> None:
        self._timestamps = array("q")
        self._offsets = array("q")
        self._file.rewrite(b"")

    def write_pending(self) -> None:
        self._file.write_pending()

    def fsync(self) -> None:
        self._file.fsync()

    def rename(self, path: Path) -> None:
        self._file.rename(path)

    def close(self) -> None:
        self._file.close()

    def delete(self) -> None:
        self._file.delete()

    @property
    def path(self) -> Path:
        return self._file.path
