"""The ``.batchtimes`` sidecar: when each batch of a segment was sent and received.

Tidelog keeps three times per record (``DESIGN.md``, "Three timestamps per record"): the
record's own timestamp (inside the batch), the time the producer sent the request that
carried it (the producer's wall clock) and the time the broker received that request (the
broker's wall clock). The last two are one value per *batch*, and the broker must not
rewrite a producer's batch to store them (the CRC covers the batch, and a Kafka-protocol
front end must serve the stored bytes unchanged). So they live next to the segment, in a
file named like its ``.log`` with the suffix ``.batchtimes``, one fixed-size entry per
appended batch, in append order.

Byte layout: a sequence of 32-byte entries, no header, all fields big-endian signed::

    offset  size  field
    0       8     last_offset    the batch's last offset (aligns the entry with its batch)
    8       8     position       the batch's byte position in the segment's ``.log``
    16      8     sent_ms        producer wall clock at send, -1 when the request had none
    24      8     received_ms    broker wall clock when the request arrived, -1 if unknown

Entries are strictly increasing in both ``last_offset`` and ``position``. A batch without
an entry (segments written before this file existed, or an entry lost in a crash) has
unknown times (``None`` for readers). Crash consistency: the entries of an append are
written right after the batches, under the partition lock, and fsynced with the segment.
Recovery (``valid_prefix``) keeps the longest prefix of whole, increasing entries whose
batches lie within the recovered log; a missing file counts as empty.

On the wire (a fetch answer's ``batch_times``) entries are 24 bytes: the same fields without
``position`` (``WIRE_ENTRY``), aligned with the returned batches by ``last_offset``.

``BatchTimesFile`` is not thread-safe for writers (the owning ``Segment``'s caller holds
the partition lock); readers may call ``wire_entries`` concurrently with an append, because
its in-memory lists are only appended to, and replaced whole (copy-on-write) on truncation.

Open files (issue #34): reads come from memory, so the file's descriptor is needed only to
write. It is opened by the first write (an append or a truncation) and kept until the
segment closes; ``create`` and ``open`` leave it closed. An empty partition's active
segment and every sealed segment read back at start hold none: one descriptor per
partition less (at 10,000 partitions, 10,000 of a broker's 20,000 here). ``fsync`` of a
file never opened since it was read or created has nothing to sync (``create`` writes no
bytes; ``open``'s truncation is fsynced there).
"""

from __future__ import annotations

import bisect
import errno
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.storage.errors import LogDirFullError, StorageError

__all__ = [
    "BATCH_TIMES_SUFFIX",
    "ENTRY",
    "NO_TIME",
    "WIRE_ENTRY",
    "BatchTimes",
    "BatchTimesEntry",
    "BatchTimesFile",
    "decode_wire",
    "encode_entries",
    "valid_prefix",
]

BATCH_TIMES_SUFFIX = ".batchtimes"
NO_TIME = -1
ENTRY = struct.Struct(">qqqq")
WIRE_ENTRY = struct.Struct(">qqq")


@dataclass(frozen=True, slots=True)
class BatchTimes:
    """The two per-batch times of one produce request; ``NO_TIME`` (-1) when unknown."""

    sent_ms: int = NO_TIME
    received_ms: int = NO_TIME


@dataclass(frozen=True, slots=True)
class BatchTimesEntry:
    """One decoded entry of the file."""

    last_offset: int
    position: int
    sent_ms: int
    received_ms: int


def encode_entries(entries: Iterable[BatchTimesEntry]) -> bytes:
    """The file bytes of ``entries`` (in order)."""
    return b"".join(
        ENTRY.pack(e.last_offset, e.position, e.sent_ms, e.received_ms) for e in entries
    )


def valid_prefix(data: bytes, *, log_size: int, next_offset: int) -> list[BatchTimesEntry]:
    """The entries of ``data`` that recovery keeps.

    Whole entries only, strictly increasing in offset and position, each naming a batch
    that starts inside a log of ``log_size`` bytes and ends below ``next_offset``. Stops
    at the first entry that fails (what follows it cannot be trusted either).
    """
    kept: list[BatchTimesEntry] = []
    last_offset = position = -1
    whole = len(data) - len(data) % ENTRY.size
    for fields in ENTRY.iter_unpack(data[:whole]):
        entry = BatchTimesEntry(*fields)
        if (
            entry.last_offset <= last_offset
            or entry.position <= position
            or entry.position >= log_size
            or entry.last_offset >= next_offset
        ):
            break
        kept.append(entry)
        last_offset, position = entry.last_offset, entry.position
    return kept


def decode_wire(data: bytes) -> dict[int, tuple[int | None, int | None]]:
    """A fetch answer's ``batch_times``: batch last offset -> (sent_ms, received_ms).

    ``NO_TIME`` becomes None; a trailing partial entry is ignored.
    """
    whole = len(data) - len(data) % WIRE_ENTRY.size
    return {
        last: (None if sent < 0 else sent, None if received < 0 else received)
        for last, sent, received in WIRE_ENTRY.iter_unpack(data[:whole])
    }


class BatchTimesFile:
    """One segment's ``.batchtimes`` file plus an in-memory copy for reads.

    Not thread-safe for writers; see the module docstring for readers.
    """

    def __init__(self, path: Path, entries: Sequence[BatchTimesEntry]) -> None:
        self.path = path
        self._fd = -1  # opened by the first write (``_writable``)
        self._closed = False
        self._positions = [e.position for e in entries]
        self._wire = bytearray(
            b"".join(WIRE_ENTRY.pack(e.last_offset, e.sent_ms, e.received_ms) for e in entries)
        )

    @classmethod
    def create(cls, path: Path) -> BatchTimesFile:
        """An empty file (truncating a stale one of the same name); no descriptor held."""
        os.close(_open(path, truncate=True))
        return cls(path, [])

    @classmethod
    def open(cls, path: Path, *, log_size: int, next_offset: int) -> BatchTimesFile:
        """Read an existing file (creating it if missing) and cut it to its valid prefix;
        no descriptor held after."""
        fd = _open(path, truncate=False)
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0) if size else b""
            entries = valid_prefix(data, log_size=log_size, next_offset=next_offset)
            if len(entries) * ENTRY.size != size:
                os.ftruncate(fd, len(entries) * ENTRY.size)
                os.fsync(fd)  # the descriptor closes here: nothing else would sync it
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc
        finally:
            os.close(fd)
        return cls(path, entries)

    def _writable(self) -> int:
        """The descriptor, opened now if this is the first write since ``create``/``open``;
        ``StorageError`` once closed (a late write must not create the file again)."""
        if self._closed:
            raise StorageError(f"{self.path} is closed")
        if self._fd < 0:
            self._fd = _open(self.path, truncate=False)
        return self._fd

    def times_by_last_offset(self) -> dict[int, BatchTimes]:
        """Last offset -> times of every entry (the cleaner carries them over)."""
        return {
            last: BatchTimes(sent, received)
            for last, sent, received in WIRE_ENTRY.iter_unpack(bytes(self._wire))
        }

    def append(self, entries: Sequence[BatchTimesEntry]) -> None:
        """Write ``entries`` (after the batches they describe were written).

        Raises ``LogDirFullError`` or ``StorageError``; on failure the file is cut back.
        """
        if not entries:
            return
        if len(entries) == 1:  # one batch: a produce's usual append, packed directly
            e = entries[0]
            data = ENTRY.pack(e.last_offset, e.position, e.sent_ms, e.received_ms)
            wire = WIRE_ENTRY.pack(e.last_offset, e.sent_ms, e.received_ms)
        else:
            data = encode_entries(entries)
            wire = b"".join(
                WIRE_ENTRY.pack(e.last_offset, e.sent_ms, e.received_ms) for e in entries
            )
        start = len(self._positions) * ENTRY.size
        fd = self._writable()
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], start + written)
        except OSError as exc:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise LogDirFullError(f"no space left appending to {self.path}") from exc
            raise StorageError(f"cannot append to {self.path}: {exc}") from exc
        # Wire bytes first: a reader bisects positions, then slices the wire bytes.
        self._wire += wire
        self._positions.extend(e.position for e in entries)

    def wire_entries(self, start_position: int, end_position: int) -> bytes:
        """The wire entries of the batches starting in ``[start_position, end_position)``."""
        positions = self._positions
        wire = self._wire
        first = bisect.bisect_left(positions, start_position)
        last = bisect.bisect_left(positions, end_position)
        return bytes(wire[first * WIRE_ENTRY.size : last * WIRE_ENTRY.size])

    def truncate_to_position(self, position: int) -> None:
        """Drop the entries of batches starting at or after byte ``position`` of the log."""
        keep = bisect.bisect_left(self._positions, position)
        if keep == len(self._positions):
            return
        os.ftruncate(self._writable(), keep * ENTRY.size)
        # Copy-on-write: a concurrent reader keeps the lists it already holds.
        self._positions = self._positions[:keep]
        self._wire = bytearray(self._wire[: keep * WIRE_ENTRY.size])

    def fsync(self) -> None:
        """Make the writes durable; a file not written since ``create``/``open`` has none.

        The descriptor is read once: the flush path calls this outside the partition lock,
        and an append opening the file meanwhile wrote past what that flush covers."""
        fd = self._fd
        if fd >= 0:
            os.fsync(fd)

    def rename(self, path: Path) -> None:
        os.replace(self.path, path)
        self.path = path

    def close(self) -> None:
        self._closed = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _open(path: Path, *, truncate: bool) -> int:
    flags = os.O_RDWR | os.O_CREAT
    if truncate:
        flags |= os.O_TRUNC
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise LogDirFullError(f"no space left creating {path}") from exc
        raise StorageError(f"cannot open {path}: {exc}") from exc
