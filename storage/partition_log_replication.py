"""The replication side of ``PartitionLog``: follower appends, leader epochs, the tracked
high watermark, and truncation.

``ReplicationCalls`` is mixed into ``PartitionLog`` (``storage.partition_log``) and is not
used alone: the partition lock, the segments (``storage.local_log.LocalLog``), the producer
state and the epoch cache are the log's, and every method here takes the log's lock as the
rest of it does. It is apart because it is what a replicated partition adds to a single
node's log (Kafka's ``UnifiedLog`` methods for ``ReplicaFetcherThread`` and ``Partition``):

* ``append_as_follower``: a leader's batches stored unchanged (offsets, epochs, CRCs),
  moving the producer state and transactions as on the leader;
* leader epochs (``storage.leader_epoch``): the cache and its ``leader-epoch-checkpoint``,
  which the leader's appends, markers, retention and close also keep through
  ``_assign_epoch_locked``, ``_write_epochs_locked`` and ``_rewrite_stale_epochs_locked``;
  ``begin_leader_epoch``, ``end_offset_for_epoch`` (OffsetsForLeaderEpoch) and
  ``divergence_offset`` (KIP-279) for elections and followers;
* the tracked high watermark (``track_high_watermark``, ``set_high_watermark``);
* truncation: ``truncate_to`` (a follower cut where its epochs diverge, recovery tools)
  and ``truncate_fully_and_start_at`` (a follower below its leader's log start).

Thread-safe, as ``PartitionLog`` is: the locking and crash-consistency rules are in
``storage.partition_log``'s docstring.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from tidelog.storage.batch_times import decode_wire
from tidelog.storage.clock import Clock
from tidelog.storage.errors import StorageError
from tidelog.storage.files import base_offset_from_name, fsync_dir
from tidelog.storage.leader_epoch import UNDEFINED_EPOCH, EpochEntry, LeaderEpochCache
from tidelog.storage.local_log import LocalLog, io_error, unlink_if_exists
from tidelog.storage.log_loader import SNAPSHOT_SUFFIX
from tidelog.storage.log_validator import follower_batch_times, place_follower_batches
from tidelog.storage.partition_txns import apply_batches
from tidelog.storage.producer_state import ProducerStateTable
from tidelog.storage.records import iter_batch_headers
from tidelog.storage.segment import BatchPosition

if TYPE_CHECKING:
    from tidelog.storage.config import LogConfig
    from tidelog.storage.segment import Segment

__all__ = ["ReplicationCalls"]

log = logging.getLogger(__name__)


class ReplicationCalls:
    """``PartitionLog``'s replication methods. Thread-safe; needs the attributes below,
    which ``PartitionLog.__init__`` assigns."""

    directory: Path
    _clock: Clock
    _local: LocalLog
    _producer_state: ProducerStateTable
    _opening: bool
    _leader_epochs: LeaderEpochCache
    _epochs_stale: bool
    _high_watermark: int | None
    _lock: threading.Lock
    _flush_lock: threading.Lock
    _unflushed_records: int
    _closed: bool

    if TYPE_CHECKING:
        # PartitionLog's, used here.
        @property
        def log_end_offset(self) -> int: ...

        @property
        def high_watermark(self) -> int: ...

        def _maybe_roll_locked(
            self,
            incoming_bytes: int,
            first_offset: int,
            last_offset: int,
            max_timestamp: int,
            config: LogConfig,
        ) -> Segment: ...

        def _load_producer_state(self) -> None: ...

    def append_as_follower(self, records: bytes, batch_times: bytes = b"") -> int:
        """Append a leader's batches unchanged (offsets, epochs, CRCs); the new log end.

        ``batch_times``: the fetch answer's sent/received times (``storage.batch_times``
        wire entries), kept for the batches they name. Batches wholly below the log end
        offset (a repeated fetch) are skipped; the first new batch must start at or after
        the log end (compaction may have left a gap on the leader). Sequences are not
        checked (the leader did), but the producer state is updated, so a follower that
        becomes leader still recognises retried batches; transactional batches and markers
        move it as on the leader (``storage.partition_txns``), without the leader's epoch
        checks. Epochs the batches carry extend the leader-epoch cache.

        Raises:
            CorruptRecordError: bad framing or CRC, or offsets that go backwards.
            LogDirFullError, StorageError: the write failed; nothing was stored.
        """
        if not records:
            return self.log_end_offset
        batches = [
            BatchPosition(position, header)
            for position, header in iter_batch_headers(records, validate=True)
        ]
        times_by_offset = decode_wire(batch_times) if batch_times else {}
        with self._lock:
            if self._closed:
                raise StorageError(f"{self} is closed")
            log_end = self.log_end_offset
            placed = place_follower_batches(batches, log_end, self)
            if placed is None:
                return log_end
            first, end, assigned = placed.start, placed.end, placed.batches
            now_ms = self._clock.wall_ms()
            times = follower_batch_times(times_by_offset, assigned)
            self._opening = any(b.header.is_transactional for b in assigned)
            try:
                self._rewrite_stale_epochs_locked()
                for batch in assigned:
                    epoch = batch.header.partition_leader_epoch
                    if epoch >= 0 and epoch > self._leader_epochs.latest_epoch:
                        self._assign_epoch_locked(epoch, batch.header.base_offset)
                segment = self._maybe_roll_locked(
                    end - first,
                    assigned[0].header.base_offset,
                    assigned[-1].header.last_offset,
                    placed.max_timestamp,
                    self._local.config,
                )
                segment.append([memoryview(records)[first:end]], assigned, times)
            except OSError as exc:
                self._opening = False
                raise io_error(exc, f"{self}: follower append failed") from exc
            # Data batches open transactions, markers end them (and index aborts).
            try:
                apply_batches(
                    self._producer_state, segment, memoryview(records)[first:end], assigned, now_ms
                )
            finally:
                self._opening = False
            for batch in assigned:
                self._unflushed_records += batch.header.records_count
            return self.log_end_offset

    def _assign_epoch_locked(self, epoch: int, start_offset: int, *, sync: bool = True) -> None:
        """Record ``epoch`` from ``start_offset`` and write the checkpoint; when the write
        fails (``OSError``) the cache is put back as it was, so it never holds an epoch
        its checkpoint lacks: the batches of that epoch appended later would otherwise
        be unknown to the cache after a clean restart, which trusts the checkpoint
        (issue #29, disk-full)."""
        before = self._leader_epochs.entries
        if self._leader_epochs.assign(epoch, start_offset):
            try:
                self._leader_epochs.write(self.directory, sync=sync)
            except OSError:
                self._leader_epochs = LeaderEpochCache(before)
                raise
            self._epochs_stale = False

    def _write_epochs_locked(self) -> None:
        """Write the leader-epoch checkpoint after the cache lost entries (truncation,
        retention, a moved log start). When the write fails (``OSError``, raised) the
        checkpoint still holds them: it is marked stale and written again before the
        next append, epoch or close (``_rewrite_stale_epochs_locked``), so a clean
        restart, which trusts it, never reads an epoch the log no longer holds; an
        unclean one takes the epochs past its recovery point from the batches anyway."""
        try:
            self._leader_epochs.write(self.directory)
        except OSError:
            self._epochs_stale = True
            raise
        self._epochs_stale = False

    def _rewrite_stale_epochs_locked(self) -> None:
        if self._epochs_stale:
            self._write_epochs_locked()

    def begin_leader_epoch(self, epoch: int, *, sync: bool = True) -> None:
        """This broker leads from now on at ``epoch``: record it at the log end (Kafka's
        ``becomeLeader``), so followers asking for the previous epoch learn where it ended
        even before the new leader writes anything. Raises ``StorageError``.

        ``sync`` False: the checkpoint is written but not fsynced; the caller makes it
        durable (``storage.files.sync_file_system``, once for a batch of new leaders)
        before any record of ``epoch`` can be appended, which is what the checkpoint's
        durability protects (``broker.cluster.replicas``: new leaderships of one view)."""
        with self._lock:
            try:
                self._rewrite_stale_epochs_locked()
                if epoch > self._leader_epochs.latest_epoch:
                    self._assign_epoch_locked(epoch, self.log_end_offset, sync=sync)
            except OSError as exc:
                raise io_error(exc, f"{self}: writing the leader-epoch checkpoint") from exc

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch in this log (-1 if none)."""
        with self._lock:
            return self._leader_epochs.latest_epoch

    def epoch_entries(self) -> list[EpochEntry]:
        """The leader-epoch cache, oldest first (a copy)."""
        with self._lock:
            return self._leader_epochs.entries

    def epoch_for_offset(self, offset: int) -> int:
        """The leader epoch that wrote ``offset`` (-1 before every known epoch), as
        Kafka's ``LeaderEpochFileCache.epochForOffset`` (ListOffsets' ``leader_epoch``)."""
        with self._lock:
            return self._leader_epochs.epoch_for_offset(offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's ``OffsetsForLeaderEpoch``: the largest epoch <= ``epoch`` this log knows
        and the offset where it ends (``(-1, -1)`` below every known epoch)."""
        with self._lock:
            if epoch == UNDEFINED_EPOCH:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH
            return self._leader_epochs.end_offset_for(epoch, self.log_end_offset)

    def divergence_offset(self, leader_epoch: int, leader_end_offset: int) -> int:
        """Where a follower cuts its log after its leader answered that the follower's
        last epoch diverged: ``(leader_epoch, leader_end_offset)`` is the largest epoch the
        leader has at or below the follower's, and where it ends on the leader (KIP-279).
        The cut is the smaller of that end and this log's own end of the same epoch; with
        no common epoch at all (``leader_epoch`` -1), the high watermark."""
        if leader_epoch < 0:
            return self.high_watermark
        own_epoch, own_end = self.end_offset_for_epoch(leader_epoch)
        if own_epoch == leader_epoch:
            return min(leader_end_offset, own_end)
        return min(leader_end_offset, own_end if own_end >= 0 else self.high_watermark)

    def track_high_watermark(self, initial: int | None = None) -> int:
        """Start tracking the high watermark (replicated); returns it.

        It starts at ``initial`` (a checkpoint) or at what is tracked already, else at the
        log start offset, clamped to ``[log start, log end]``.
        """
        with self._lock:
            current = self._high_watermark
            start = initial if initial is not None else current
            if start is None:
                start = self._local.log_start_offset
            self._high_watermark = min(
                max(start, self._local.log_start_offset), self.log_end_offset
            )
            return self._high_watermark

    def set_high_watermark(self, offset: int) -> bool:
        """Move a tracked high watermark up to ``offset`` (capped at the log end offset);
        whether it moved. It never moves down here (only truncation lowers it)."""
        with self._lock:
            current = self._high_watermark
            if current is None:
                raise StorageError(f"{self}: the high watermark is not tracked")
            target = min(offset, self.log_end_offset)
            if target <= current:
                return False
            self._high_watermark = target
            return True

    # ================================================================== truncation

    def truncate_to(self, offset: int) -> None:
        """Remove every batch holding an offset >= ``offset`` (batch granularity, as
        Kafka's ``truncateTo``: a batch straddling ``offset`` goes whole, so the log end
        ends at or below ``offset``).

        Used by recovery tools and tests (and, with replication, by followers); producer
        state is rebuilt from what remains. Whole segments past ``offset`` are renamed
        ``.deleted`` and unlinked after ``file.delete.delay.ms``, as retention does, so a
        reader holding a snapshot of the segment list can finish. Waits for a flush in
        progress (``_flush_lock``), so a flush can never move the recovery point past
        the cut.
        """
        with self._flush_lock, self._lock:
            try:
                # Renames, the cut (fsynced), the new view and recovery point.
                self._local.truncate_to_locked(offset)
            except OSError as exc:
                raise io_error(exc, f"{self}: truncation failed") from exc
            try:
                if self._high_watermark is not None:
                    self._high_watermark = min(self._high_watermark, self.log_end_offset)
                before = self._leader_epochs.entries
                self._leader_epochs.truncate_from_end(self.log_end_offset)
                if self._leader_epochs.entries != before:
                    self._write_epochs_locked()
                for snapshot in self.directory.glob("*" + SNAPSHOT_SUFFIX):
                    if base_offset_from_name(snapshot.name) > self.log_end_offset:
                        unlink_if_exists(snapshot)
                fsync_dir(self.directory)
            except OSError as exc:
                raise io_error(exc, f"{self}: truncation failed") from exc
            finally:
                # The log is cut whatever failed after it (a full disk refusing the
                # epoch checkpoint): the idempotence state must not remember batches
                # that are gone, or their retries would be answered as duplicates
                # and never stored. A stale checkpoint entry past the log end is cut
                # when the log is next opened (``log_loader``).
                self._load_producer_state()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop the whole log and start it empty at ``offset`` (Kafka's
        ``truncateFullyAndStartAt``).

        A follower whose log ends below its leader's log start (retention deleted on the
        leader what the follower never fetched) cannot continue where it is: nothing it
        could fetch joins its log. Every segment is scheduled for deletion as
        ``truncate_to`` does; the new empty segment's base makes ``offset`` the log start,
        log end, high watermark and recovery point; the epoch cache and producer state are
        cleared (what the leader sends next rebuilds them).
        """
        with self._flush_lock, self._lock:
            try:
                # Renames, the new empty segment, the new view and recovery point; no fsync.
                self._local.truncate_fully_locked(offset)
                if self._high_watermark is not None:
                    self._high_watermark = offset
                self._leader_epochs = LeaderEpochCache()
                self._producer_state = ProducerStateTable()
                # Snapshots first: they need no space to go, and a checkpoint write that
                # fails on a full disk must not leave one to reload the old state from.
                for snapshot in self.directory.glob("*" + SNAPSHOT_SUFFIX):
                    unlink_if_exists(snapshot)
                self._write_epochs_locked()
                fsync_dir(self.directory)
            except OSError as exc:
                raise io_error(exc, f"{self}: full truncation failed") from exc
        log.warning("%s: truncated fully; the log now starts empty at %d", self, offset)
