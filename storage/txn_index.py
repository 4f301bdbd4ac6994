"""The ``.txnindex`` file: one segment's aborted transactions (Kafka's ``TransactionIndex``).

A read_committed consumer must drop the records of aborted transactions. It learns which
from the fetch answer's ``aborted_transactions`` (producer id, first offset), which the
broker reads here. When a partition appends an ABORT marker at offset ``M`` for a
transaction that began at ``F``, it adds one entry to the ``.txnindex`` of the segment that
holds the marker (named like its ``.log``, suffix ``.txnindex``). COMMIT markers add
nothing.

Byte layout: a sequence of 34-byte entries, no header, big-endian (Kafka's ``AbortedTxn``)::

    offset  size  field
    0       2     version             int16, 0
    2       8     producer_id         int64
    10      8     first_offset        int64  the transaction's first offset (F)
    18      8     last_offset         int64  the ABORT marker's offset (M)
    26      8     last_stable_offset  int64  the LSO once this transaction completed

``last_stable_offset`` is the first offset of the oldest transaction of *another* producer
still open when the marker was appended, else ``M + 1`` (``ProducerStateManager``'s
``lastStableOffset(completedTxn)``): a fetch that collects entries up to an upper bound can
stop at the first entry whose value is at or past that bound, because no transaction
aborted later can have started before it.

Entries are in strictly increasing ``last_offset`` order. The file is created lazily, on
the first entry: most segments never see an abort. Decisions:

* Opening keeps the longest valid prefix (whole entries, version 0, ``first_offset <=
  last_offset``, ``last_offset`` inside the segment and increasing) and reports whether
  anything was cut (``needs_rebuild``): the loader then rebuilds the segment's entries from the
  log, as a damaged offset index is rebuilt, because a cut entry cannot be recovered from
  the file itself (Kafka's ``sanityCheck`` fails the index the same way).
* An entry is kept in memory before it is written; a write that fails (a full disk) marks
  the file stale and the next ``append`` or ``fsync`` rewrites it whole, so the flush that
  would move the recovery point past the marker fails until the entry is on disk. After a
  crash the segments from the recovery point on are rebuilt from the log anyway.
* ``collect`` is Kafka's ``collectAbortedTxns``: entries with ``last_offset >=
  fetch_offset`` and ``first_offset < upper_bound``, and whether the search may stop.

Thread-safety: one writer (the partition lock held) and lock-free readers: the entry list
is only appended to, and replaced whole (copy-on-write) by ``truncate_to`` and ``reset``.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.storage.errors import LogDirFullError, StorageError

__all__ = [
    "ENTRY",
    "TXN_INDEX_SUFFIX",
    "AbortedTxn",
    "TransactionIndex",
    "decode_entries",
    "encode_entries",
]

log = logging.getLogger(__name__)

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")
_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One aborted transaction: who, where it began, its marker, the LSO after it."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_entries(entries: Iterable[AbortedTxn]) -> bytes:
    """The file bytes of ``entries``, in order."""
    return b"".join(
        ENTRY.pack(_VERSION, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)
        for e in entries
    )


def decode_entries(data: bytes, base_offset: int) -> tuple[list[AbortedTxn], bool]:
    """The valid prefix of a file's bytes, and whether anything after it was dropped."""
    kept: list[AbortedTxn] = []
    whole = len(data) - len(data) % ENTRY.size
    last = -1
    for version, producer_id, first, last_offset, lso in ENTRY.iter_unpack(data[:whole]):
        if (
            version != _VERSION
            or first > last_offset
            or last_offset < base_offset
            or last_offset <= last
        ):
            return kept, True
        kept.append(AbortedTxn(producer_id, first, last_offset, lso))
        last = last_offset
    return kept, whole != len(data)


class TransactionIndex:
    """One segment's aborted transactions, in memory and in its ``.txnindex`` file.

    Not thread-safe for writers; readers see a consistent list (module docstring).
    """

    def __init__(self, path: Path, base_offset: int, entries: Sequence[AbortedTxn] = ()) -> None:
        self.path = path
        self.base_offset = base_offset
        self._entries: list[AbortedTxn] = list(entries)
        self._fd = -1
        # The file lacks entries the list has (a failed write): rewritten whole next time.
        self._stale = False
        # Opening cut a damaged tail: the loader rebuilds this segment's entries.
        self.needs_rebuild = False

    @classmethod
    def open(cls, path: Path, base_offset: int) -> TransactionIndex:
        """Read an existing file (a missing one is an empty index); see ``needs_rebuild``."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return cls(path, base_offset)
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc
        entries, damaged = decode_entries(data, base_offset)
        index = cls(path, base_offset, entries)
        if damaged:
            log.warning("%s: damaged after %d entries; rebuilding from the log", path, len(entries))
            index.needs_rebuild = True
            index._stale = True  # the file is rewritten from what is rebuilt
        return index

    @property
    def entries(self) -> list[AbortedTxn]:
        """The entries, oldest first (the list itself: never mutated in place)."""
        return self._entries

    @property
    def last_offset(self) -> int | None:
        """The last entry's marker offset, or None when there is none."""
        return self._entries[-1].last_offset if self._entries else None

    def append(self, entry: AbortedTxn) -> None:
        """Add an entry; its ``last_offset`` must be past the last entry's.

        The entry is visible at once; a failed write is logged and retried by the next
        ``append`` or ``fsync`` (module docstring). Raises ``ValueError`` for an entry out
        of order.
        """
        if self._entries and entry.last_offset <= self._entries[-1].last_offset:
            raise ValueError(
                f"{self.path}: aborted transaction at {entry.last_offset} does not follow "
                f"{self._entries[-1].last_offset}"
            )
        # Readers may hold the old list: build a new one (the lists are short).
        self._entries = [*self._entries, entry]
        try:
            if self._stale:
                self._rewrite()
            else:
                fd = self._open_fd()
                data = encode_entries([entry])
                os.pwrite(fd, data, (len(self._entries) - 1) * ENTRY.size)
        except (OSError, StorageError) as exc:
            self._stale = True
            log.warning("%s: aborted transaction not written yet: %s", self.path, exc)

    def collect(self, fetch_offset: int, upper_bound: int) -> tuple[list[AbortedTxn], bool]:
        """Aborted transactions overlapping ``[fetch_offset, upper_bound)``; and True when
        an entry's ``last_stable_offset`` reached ``upper_bound`` (later segments cannot
        add any), Kafka's ``collectAbortedTxns``."""
        found: list[AbortedTxn] = []
        for entry in self._entries:
            if entry.last_offset >= fetch_offset and entry.first_offset < upper_bound:
                found.append(entry)
            if entry.last_stable_offset >= upper_bound:
                return found, True
        return found, False

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or past ``offset`` (a log truncation)."""
        keep = [e for e in self._entries if e.last_offset < offset]
        if len(keep) == len(self._entries):
            return
        self._entries = keep
        if self._stale:
            self._rewrite_or_mark()
            return
        # What stays is a prefix of the file: cut it, never rewrite what stays (a crash
        # mid-rewrite could lose entries below the recovery point).
        try:
            os.truncate(self.path, len(keep) * ENTRY.size)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._stale = True
            log.warning("%s: not cut yet: %s", self.path, exc)

    def reset(self) -> None:
        """Drop every entry (before a rebuild from the log)."""
        self.needs_rebuild = False
        if not self._entries and not self._stale and not self.path.exists():
            return
        self._entries = []
        self._rewrite_or_mark()

    def fsync(self) -> None:
        """Make the entries durable (rewriting a stale file first). Raises ``OSError`` or
        ``StorageError``."""
        if self._stale:
            self._rewrite()
        if self._fd >= 0:
            os.fsync(self._fd)

    def rename(self, path: Path) -> None:
        """Move the file (if it exists) to ``path``; later writes go there."""
        try:
            os.replace(self.path, path)
        except FileNotFoundError:
            pass
        self.path = path

    def close(self) -> None:
        if self._fd >= 0:
            try:
                if self._stale:
                    self._rewrite()
            except (OSError, StorageError) as exc:
                log.warning("%s: not rewritten on close: %s", self.path, exc)
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        """Close and unlink the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------------ file work

    def _open_fd(self) -> int:
        if self._fd < 0:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise LogDirFullError(f"no space left creating {self.path}") from exc
                raise StorageError(f"cannot open {self.path}: {exc}") from exc
        return self._fd

    def _rewrite(self) -> None:
        data = encode_entries(self._entries)
        if not data and self._fd < 0 and not self.path.exists():
            self._stale = False
            return
        fd = self._open_fd()
        os.ftruncate(fd, 0)
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], written)
        self._stale = False

    def _rewrite_or_mark(self) -> None:
        try:
            self._rewrite()
        except (OSError, StorageError) as exc:
            self._stale = True
            log.warning("%s: not rewritten yet: %s", self.path, exc)
