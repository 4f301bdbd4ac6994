"""The ordered segments of one partition on local disk (Kafka's ``LocalLog``).

A ``LocalLog`` owns the segment list of a directory ``<topic>-<partition>`` (sorted by base
offset; the last one is *active* and takes appends), the log start offset, the log end
offset (the active segment's next offset), the recovery point (everything below it is
fsynced) and the segments waiting for ``file.delete.delay.ms`` before they are unlinked.
Its file work: rolling, routing reads to segments, truncation, retention's removal of the
oldest segments, and compaction's swap of cleaned segments in for old ones. It knows
nothing of producer state, leader epochs or the high watermark: ``PartitionLog`` keeps
those and calls in here.

Thread-safety: not thread-safe by itself, as Kafka's ``LocalLog`` relies on ``UnifiedLog``.
Every method whose name ends in ``_locked`` must be called with the owning
``PartitionLog``'s partition lock held; the recovery point changes only under it. The
exception is the read path, which takes no lock: the segment list, its base offsets and
the log start offset are published as one immutable ``ReadView`` (copy-on-write, replaced
by one store in ``set_segments_locked``), so one load of ``view`` gives a consistent
triple; ``read`` then loads the active segment's size before its next offset, and an
append publishes its size last (``Segment.append``), so every byte below that size is a
whole batch. Segments dropped from the list keep their file descriptors open (renamed
``.deleted``) until their delay has passed, so a reader holding an old view can finish.

Crash consistency:

* ``roll_locked`` creates the new segment's files but does not fsync the directory; the
  caller must before the roll is acknowledged (``PartitionLog`` writes a producer snapshot
  atomically, which ends with an fsync of this directory).
* ``truncate_to_locked``, ``truncate_fully_locked`` and ``schedule_delete_locked`` rename
  segments ``.deleted`` without an fsync of the directory; the caller does it once, after
  its own file changes, before the operation returns, so a crash cannot bring back a
  deleted segment once the log start or end moved past it.
* ``replace_segments_locked`` follows Kafka's ``LocalLog.replaceSegments``: ``.cleaned``
  files are renamed ``.swap`` in descending offset order, fsync the directory; replaced
  segments are renamed ``.deleted``; ``.swap`` suffixes are stripped lowest offset first;
  fsync the directory. ``storage.log_loader`` finishes or discards whatever a crash
  interrupted.
* ``delete_files`` unlinks ``.deleted`` segments, then fsyncs the directory.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tidelog.storage.clock import Clock
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import LogDirFullError, OffsetOutOfRangeError, StorageError
from tidelog.storage.file_region import FileRegion
from tidelog.storage.files import DELETED_SUFFIX, SWAP_SUFFIX, fsync_dir
from tidelog.storage.records import NO_TIMESTAMP
from tidelog.storage.retention import SegmentInfo, plan_retention
from tidelog.storage.segment import Segment

__all__ = ["LocalLog", "ReadResult", "ReadView", "io_error", "unlink_if_exists"]

log = logging.getLogger(__name__)

_MAX_RELATIVE_OFFSET = 2**31 - 1


class ReadView(NamedTuple):
    """The segment list, its base offsets and the log start, as one immutable value."""

    segments: list[Segment]
    bases: list[int]
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole stored batches (the first may begin before the offset asked for)."""

    records: bytes
    high_watermark: int
    log_start_offset: int
    # The returned batches' sent/received times, ``storage.batch_times`` wire entries.
    batch_times: bytes = b""
    # A zero-copy read (``zero_copy``): where the batches are, ``records`` is empty and
    # ``batch_times`` too (the caller closes the region, ``storage.file_region``).
    region: FileRegion | None = None

    @property
    def size(self) -> int:
        """Bytes of batches returned, in ``records`` or in ``region``."""
        return self.region.length if self.region is not None else len(self.records)


class LocalLog:
    """The segments of one partition and their file work. Not thread-safe: ``_locked``
    methods need the owning ``PartitionLog``'s lock; ``read`` and ``view`` need none."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        clock: Clock,
        segments: list[Segment],
        *,
        log_start_offset: int,
        recovery_point: int,
    ) -> None:
        self.directory = directory
        self.topic = topic
        self.partition = partition
        # Replaced (never mutated) by ``PartitionLog.update_config`` under the lock.
        self.config = config
        self._clock = clock
        # The segments, their base offsets and the log start, published as one value so
        # that a lock-free ``read`` sees them consistent (``set_segments_locked``).
        self._view = ReadView(segments, [s.base_offset for s in segments], log_start_offset)
        # Everything below it is fsynced; changes only under the partition lock.
        self.recovery_point = recovery_point
        self._pending_deletes: list[tuple[int, Segment]] = []

    def __repr__(self) -> str:
        return f"LocalLog({self.topic}-{self.partition})"

    # ================================================================== the published view

    @property
    def view(self) -> ReadView:
        """The segments, their bases and the log start as one consistent value (no lock)."""
        return self._view

    @property
    def segments(self) -> list[Segment]:
        """The segments, oldest first (the last one is active). Never mutated in place."""
        return self._view.segments

    @property
    def active_segment(self) -> Segment:
        return self._view.segments[-1]

    @property
    def log_start_offset(self) -> int:
        return self._view.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._view.segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self._view.segments)

    def set_segments_locked(
        self, segments: list[Segment], log_start_offset: int | None = None
    ) -> None:
        """Copy-on-write replacement of the segment list and, if given, the log start
        offset, in one store; readers keep the view they loaded."""
        start = self._view.log_start_offset if log_start_offset is None else log_start_offset
        self._view = ReadView(segments, [s.base_offset for s in segments], start)

    def create_segment(self, base_offset: int, suffix: str = "") -> Segment:
        """A new empty segment in this directory (its directory entry not yet fsynced).
        Raises ``OSError``."""
        return Segment.create(
            self.directory,
            base_offset,
            index_interval_bytes=self.config.index_interval_bytes,
            index_max_bytes=self.config.segment_index_bytes,
            now_ms=self._clock.wall_ms(),
            suffix=suffix,
        )

    # ================================================================== roll

    def should_roll_locked(
        self, incoming_bytes: int, last_offset: int, max_timestamp: int, config: LogConfig
    ) -> bool:
        """Kafka's ``shouldRoll``: whether an append of ``incoming_bytes`` ending at
        ``last_offset`` needs a new active segment (size, ``segment.ms``, full index, or a
        relative offset past 2**31 - 1). Never for an empty active segment."""
        active = self._view.segments[-1]
        if active.is_empty:
            return False
        reference = active.first_batch_timestamp_ms
        if reference == NO_TIMESTAMP or max_timestamp == NO_TIMESTAMP:
            waited = self._clock.wall_ms() - active.created_ms
        else:
            waited = max_timestamp - reference
        return (
            active.size_bytes > config.segment_bytes - incoming_bytes
            or waited > config.segment_ms
            or active.index_is_full
            or last_offset - active.base_offset > _MAX_RELATIVE_OFFSET
        )

    def roll_locked(self, base_offset: int) -> Segment | None:
        """Seal the active segment and publish a new one at ``base_offset``; the new
        segment, or None (nothing done) if the active segment is empty.

        The directory is not fsynced here: the caller must before acknowledging the roll
        (see the module docstring). Raises ``OSError``.
        """
        active = self._view.segments[-1]
        if active.is_empty:
            return None
        active.write_pending()
        # Sealed segments' indexes are durable: recovery trusts them once the recovery
        # point passes the segment, while the produce path's flushes skip the active
        # segment's (``Segment.fsync``). Two fsyncs a roll, once per segment.bytes.
        active.fsync_indexes()
        segment = self.create_segment(base_offset)
        self.set_segments_locked([*self._view.segments, segment])
        return segment

    # ================================================================== read

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None,
        high_watermark: Callable[[], int],
        zero_copy: bool = False,
    ) -> ReadResult:
        """Whole batches from the one holding ``offset``, about ``max_bytes`` of them.

        No lock (see the module docstring). ``high_watermark`` is called once, after the
        range check, for the value the result carries. ``zero_copy``: the same batches as
        a ``FileRegion`` (``Segment.read_region``), not read. The rest of the contract is
        ``PartitionLog.read``'s. Raises ``OffsetOutOfRangeError``.
        """
        # No lock: the partition lock is held across appends, rolls and the directory
        # fsyncs of retention and cleaning, and a read (on the serving loop's thread for
        # small fetches) must never wait for a disk. One load of the published view gives
        # a consistent segment list and log start; the active segment's size is read
        # before its next offset, and an append publishes its size last
        # (``Segment.append``), so every byte below ``active_size`` is a whole batch.
        segments, bases, log_start = self._view
        active_size = segments[-1].size_bytes
        log_end = segments[-1].next_offset
        if offset < log_start or offset > log_end:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.topic}-{self.partition}: "
                f"log start {log_start}, log end {log_end}"
            )
        hw = high_watermark()
        if offset == log_end:
            return ReadResult(b"", hw, log_start)
        stop = len(segments)
        stop_position: int | None = None
        if max_offset is not None and max_offset < log_end:
            if offset >= max_offset:
                return ReadResult(b"", hw, log_start)
            stop = max(bisect.bisect_right(bases, max_offset) - 1, 0)
            found = segments[stop].find_position(max_offset, batch_start=True)
            stop_position = segments[stop].size_bytes if found is None else found
            stop += 1
        i = max(bisect.bisect_right(bases, offset) - 1, 0)
        max_bytes = max(max_bytes, 1)
        for j in range(i, stop):
            segment = segments[j]
            limit = active_size if j == len(segments) - 1 else None
            if j == stop - 1 and stop_position is not None:
                limit = stop_position if limit is None else min(limit, stop_position)
            if zero_copy:
                region = segment.read_region(offset, max_bytes, limit)
                if region is not None:
                    return ReadResult(b"", hw, log_start, region=region)
                continue
            data, times = segment.read_with_times(offset, max_bytes, limit)
            if data:
                return ReadResult(data, hw, log_start, times)
        return ReadResult(b"", hw, log_start)

    @staticmethod
    def offset_for_timestamp(view: ReadView, timestamp_ms: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record at or after ``timestamp_ms`` in the
        segments of ``view`` (taken by the caller), or None. No lock."""
        log_start = view.log_start_offset
        for segment in view.segments:
            if segment.max_timestamp_ms < timestamp_ms or segment.next_offset <= log_start:
                continue
            found = segment.offset_for_timestamp(timestamp_ms, log_start)
            if found is not None:
                return found
        return None

    @staticmethod
    def max_timestamp(view: ReadView, end_offset: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the record with the largest timestamp between the log
        start of ``view`` and ``end_offset`` (exclusive; a high watermark), the first such
        record where several share it (Kafka's ListOffsets -3, KIP-734), or None when that
        range holds no record. No lock.

        Segments are searched from the largest ``max_timestamp_ms`` down, which usually
        decodes one segment only; a segment's maximum may belong to a record past
        ``end_offset``, so each is searched, not trusted, and the search stops at the first
        segment whose maximum is below the best found."""
        log_start = view.log_start_offset
        candidates = [
            s
            for s in view.segments
            if s.next_offset > log_start and s.base_offset < end_offset and s.size_bytes
        ]
        candidates.sort(key=lambda s: (-s.max_timestamp_ms, s.base_offset))
        best: tuple[int, int] | None = None  # (timestamp, offset)
        for segment in candidates:
            if best is not None and segment.max_timestamp_ms < best[0]:
                break
            found = segment.max_timestamp(log_start, end_offset)
            if found is not None and (best is None or (found[1], -found[0]) > (best[0], -best[1])):
                best = (found[1], found[0])
        return None if best is None else (best[1], best[0])

    # ================================================================== flush

    def dirty_segments_locked(self) -> list[Segment]:
        """The segments holding data above the recovery point (not yet fsynced)."""
        return [s for s in self._view.segments if s.next_offset > self.recovery_point]

    def flush_locked(self) -> None:
        """fsync every dirty segment now, under the lock (``flush.messages``), and move
        the recovery point to the log end. Every segment, not only the active one: a roll
        may have sealed one since the last flush. Raises ``OSError``."""
        active = self._view.segments[-1]
        for dirty in self.dirty_segments_locked():
            dirty.write_pending()
            dirty.fsync(indexes=dirty is not active)  # the active's: Segment.fsync
        self.recovery_point = self.log_end_offset

    # ================================================================== truncation

    def truncate_to_locked(self, offset: int) -> None:
        """Cut the log at ``offset`` (batch granularity): whole segments past it are
        scheduled for deletion, the last kept one is truncated and fsynced, the recovery
        point is capped. The first segment always stays. No directory fsync (the
        caller's: it makes the deletions durable).

        The cut is made durable before this returns: a follower that truncated a diverged
        tail records its new leader's epoch at the cut next (``LeaderEpochCache``, whose
        checkpoint is fsynced), and a power loss that undid the cut but kept that record
        would bring the old tail back under the new epoch, where no leader's
        OffsetForLeaderEpoch answer would find it again (issue #29, seed 202).
        Raises ``OSError``."""
        segments = self._view.segments
        keep = [s for s in segments if s.base_offset < offset or s is segments[0]]
        for segment in segments[len(keep) :]:
            self.schedule_delete_locked(segment)
        if keep[-1].truncate_to(offset):
            keep[-1].fsync()
        self.set_segments_locked(keep, min(self.log_start_offset, keep[-1].next_offset))
        self.recovery_point = min(self.recovery_point, self.log_end_offset)

    def truncate_fully_locked(self, offset: int) -> None:
        """Schedule every segment for deletion and start empty at ``offset`` (the new log
        start, log end and recovery point). No directory fsync (the caller's).
        Raises ``OSError``."""
        for segment in self._view.segments:
            self.schedule_delete_locked(segment)
        fresh = self.create_segment(offset)
        self.set_segments_locked([fresh], offset)
        self.recovery_point = offset

    # ================================================================== retention

    def retention_count_locked(self, *, high_watermark: int, now_ms: int) -> int:
        """How many of the oldest segments retention removes (``storage.retention``'s
        pure plan over this log's segments and configuration)."""
        config = self.config
        infos = [
            SegmentInfo(
                s.base_offset,
                s.next_offset,
                s.size_bytes,
                s.max_timestamp_ms if s.max_timestamp_ms != NO_TIMESTAMP else s.created_ms,
            )
            for s in self._view.segments
        ]
        return plan_retention(
            infos,
            log_start_offset=self.log_start_offset,
            high_watermark=high_watermark,
            retention_ms=config.retention_ms,
            retention_bytes=config.retention_bytes,
            delete_policy=config.delete,
            now_ms=now_ms,
        )

    def remove_oldest_locked(self, count: int) -> list[Segment]:
        """Publish the log without its ``count`` oldest segments (``count`` < the number
        of segments), the log start moved to the first survivor's base at least; the
        removed segments, still to be scheduled for deletion by the caller."""
        segments = self._view.segments
        doomed = segments[:count]
        kept = segments[count:]
        self.set_segments_locked(kept, max(self.log_start_offset, kept[0].base_offset))
        return doomed

    def schedule_delete_locked(self, segment: Segment) -> None:
        """Rename ``segment`` ``.deleted`` and unlink it after ``file.delete.delay.ms``
        (its descriptors stay open for readers). Raises ``OSError``."""
        segment.rename_suffix(DELETED_SUFFIX)
        segment.deleted = True
        deadline = self._clock.monotonic_ms() + self.config.file_delete_delay_ms
        self._pending_deletes.append((deadline, segment))

    @property
    def has_pending_deletes(self) -> bool:
        """Whether any segment waits for its delete (a read without the lock: a hint)."""
        return bool(self._pending_deletes)

    def take_due_deletes_locked(self, now_ms: int, *, force: bool) -> list[Segment]:
        """Remove from the pending list, and return, the segments whose delay passed by
        monotonic ``now_ms`` (all of them with ``force``)."""
        due = [s for deadline, s in self._pending_deletes if force or deadline <= now_ms]
        self._pending_deletes = [
            (d, s) for d, s in self._pending_deletes if not (force or d <= now_ms)
        ]
        return due

    def delete_files(self, due: Sequence[Segment]) -> int:
        """Unlink the files of ``due`` (taken by ``take_due_deletes_locked``), then fsync
        the directory; how many. No lock needed: nothing else holds them. Raises
        ``OSError``."""
        for segment in due:
            segment.delete_files()
        if due:
            fsync_dir(self.directory)
        return len(due)

    # ================================================================== compaction

    def replace_segments_locked(self, new: Sequence[Segment], old: Sequence[Segment]) -> bool:
        """Swap cleaned segments ``new`` (sorted by base offset, ``.cleaned``, written and
        fsynced) in for ``old`` (consecutive non-active segments), in the crash-safe order
        of the module docstring. Returns False, deleting ``new``, if ``old`` are no longer
        all in the log. Raises ``OSError``."""
        current = self._view.segments
        ids = [id(s) for s in current]
        try:
            start = ids.index(id(old[0]))
        except ValueError:
            start = -1
        if (
            start < 0
            or [id(s) for s in current[start : start + len(old)]] != [id(s) for s in old]
            or start + len(old) >= len(current)
        ):
            for segment in new:
                segment.delete_files()
            return False
        # 1. .cleaned -> .swap, highest offset first (see the module docstring).
        for segment in sorted(new, key=lambda s: s.base_offset, reverse=True):
            segment.rename_suffix(SWAP_SUFFIX)
        fsync_dir(self.directory)
        # 2. replaced segments -> .deleted (kept open for readers until the delay).
        for segment in old:
            self.schedule_delete_locked(segment)
        # 3. strip .swap.
        for segment in new:
            segment.rename_suffix("")
        fsync_dir(self.directory)
        self.set_segments_locked([*current[:start], *new, *current[start + len(old) :]])
        return True

    # ================================================================== closing

    def close_locked(self) -> None:
        """Close every segment's files. Raises ``OSError``."""
        for segment in self._view.segments:
            segment.close()

    def delete_locked(self) -> None:
        """Delete every segment's files and publish an empty list (the log is unusable
        afterwards)."""
        for segment in self._view.segments:
            segment.delete_files()
        self.set_segments_locked([])


def io_error(exc: OSError, what: str) -> StorageError:
    """The storage error for a failed file operation: ``LogDirFullError`` (retriable) when
    the disk is full, else ``StorageError``, so the broker can tell a client to retry."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return LogDirFullError(f"{what}: no space left on the log directory's disk")
    return StorageError(f"{what}: {exc}")


def unlink_if_exists(path: Path) -> None:
    """``os.unlink``, ignoring a file that is already gone. Raises other ``OSError``s."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
