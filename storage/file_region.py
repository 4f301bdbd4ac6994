"""A range of whole batches in a segment file, sent to a socket without being read.

The zero-copy fetch (issue #31, ``docs/performance.md``): a read that would return the
stored bytes of a partition (``Segment.read``) can instead return where they are
(``Segment.read_region``), and the Kafka listener hands that range to ``os.sendfile``
through ``loop.sendfile``: the kernel moves the bytes from the page cache to the socket
and the broker never copies, allocates or even sees them, as Kafka's ``FileRecords``.

A region owns a file descriptor of its own, opened when it is made: a *new* read-only
open file description of the segment's file (through ``/proc/self/fd``; ``os.dup`` where
there is no ``/proc``, which shares the segment's offset, harmless as the segment only
appends with ``O_APPEND`` and reads with ``pread``). So the region stays valid when the
segment is closed, renamed or unlinked afterwards (retention, compaction's swap, a
deleted topic), as an open ``FileChannel`` keeps Kafka's valid: the bytes it names are
immutable once appended. The one change it cannot survive is a truncation below its end
(a follower truncating a diverged log, which never serves consumers past its high
watermark): ``sendfile`` then sends fewer bytes than the response promised, and the
listener closes the connection, as Kafka does when its ``FileRecords`` shrank under a
send.

Close every region (``close``); one that is dropped unclosed closes its descriptor when
collected (a backstop, not the plan: the fetch path closes what it made). Not
thread-safe.
"""

from __future__ import annotations

import os

from tidelog.storage.errors import CorruptRecordError

__all__ = ["FileRegion"]


def _open_again(fd: int) -> int:
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return os.dup(fd)


class FileRegion:
    """``length`` bytes of whole batches from ``position`` of a segment file.

    ``next_offset``: the offset after the region's last batch; ``records_count``: the
    records its batches hold (both from the batch headers, for the fetch path's aborted
    transactions and metrics, without reading the records).
    """

    __slots__ = ("_fd", "length", "next_offset", "position", "records_count")

    def __init__(
        self, fd: int, position: int, length: int, next_offset: int, records_count: int
    ) -> None:
        self._fd = _open_again(fd)
        self.position = position
        self.length = length
        self.next_offset = next_offset
        self.records_count = records_count

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"FileRegion(fd={self._fd}, position={self.position}, length={self.length})"

    def fileno(self) -> int:
        """The region's own descriptor (``loop.sendfile`` sends from it)."""
        if self._fd < 0:
            raise ValueError("the region is closed")
        return self._fd

    def seek(self, offset: int, whence: int = 0) -> int:
        """``loop.sendfile`` moves a file's position after sending; a region has none
        (every read is positional), so this does nothing."""
        return offset

    def read(self) -> bytes:
        """The region's bytes (the copying path: TLS listeners, tests).

        Raises:
            CorruptRecordError: the file is shorter than the region (truncated since).
        """
        data = os.pread(self.fileno(), self.length, self.position)
        if len(data) != self.length:
            raise CorruptRecordError(
                f"file region at {self.position} shrank: {len(data)} of {self.length} bytes"
            )
        return data

    def close(self) -> None:
        """Close the descriptor. Idempotent."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
