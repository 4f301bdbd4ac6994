"""The log of one topic-partition: the partition lock, appends, epochs, high watermark.

A ``PartitionLog`` is the public face of one partition's log (Kafka's ``UnifiedLog``). It
is built from two lower pieces: ``storage.log_loader`` opens the directory and recovers it
after a crash (``PartitionLog.open``), and ``storage.local_log.LocalLog`` owns the ordered
segments and their file work (roll, read routing, truncation, retention's removals,
compaction swaps, log start/end offsets, recovery point). This module owns what sits above
the segments and the lock that serialises them:

* ``log_start_offset``: the first offset a reader may ask for (rises with retention, and
  with ``increase_log_start_offset``: DeleteRecords, or a follower learning its leader's;
  the segments wholly below it then go at the next retention pass);
* ``log_end_offset``: the offset the next appended record gets;
* ``high_watermark``: what consumers may read. One broker, no replicas: equal to the log
  end offset (``acks`` decides when a producer hears back, not what readers see). A
  replicated log (cluster mode) *tracks* it instead: the leader moves it to the smallest
  log end offset of the in-sync replicas, a follower to what its leader reports, and
  consumers read below it only (``read(max_offset=...)``); it is checkpointed by the log
  manager (``replication-offset-checkpoint``);
* leader epochs (``storage.leader_epoch``): which leader epoch wrote which offsets, from
  the batches' ``partitionLeaderEpoch`` fields, checkpointed in ``leader-epoch-checkpoint``.
  A leader stamps its epoch into every batch it appends (``append(leader_epoch=...)``,
  outside the CRC); a follower appends the leader's batches unchanged
  (``append_as_follower``) and truncates where its epochs diverge from the leader's;
* ``recovery_point``: everything below it is fsynced; recovery after an unclean stop
  re-validates only the segments from the one holding it;
* the producer state (``ProducerStateTable``: idempotence and transactions) and its
  ``.snapshot`` files, written on every roll and on close;
* transactions' partition side (``storage.partition_txns``): transactional batches open a
  transaction, ``append_marker`` (the leader) and ``append_as_follower`` store COMMIT and
  ABORT markers and index aborted transactions in the segments' ``.txnindex``;
  ``last_stable_offset`` and ``aborted_transactions`` are what a read_committed fetch
  needs (it reads with ``max_offset`` = the last stable offset and filters the aborted
  transactions itself, as Kafka's consumers do).

Two parts of the class live in their own modules and are mixed in, because each is a
concept of its own on top of the append path: the replication side
(``storage.partition_log_replication.ReplicationCalls``: follower appends, the leader-epoch
cache and checkpoint, the tracked high watermark, truncation) and the transaction side
(``storage.partition_log_txns.TransactionCalls``: verification, markers, the last stable
offset, aborted transactions). They share this class's lock and state; this module keeps
opening, appends, rolls, reads, flushes, retention, compaction support and closing.

Appends validate each batch's framing, magic, CRC and size, check idempotent-producer
sequences, assign offsets by rewriting each batch's 8-byte base offset (LogAppendTime
topics also get the broker's time, which means a CRC recomputation) and write the bytes;
the byte work is the pure ``storage.log_validator`` (Kafka's ``LogValidator``). Records
are never decoded on the append or read path (except a compacted topic's, on append).

Concurrency: one lock (``_lock``) serialises appends, rolls, truncation and segment-list
changes; every ``LocalLog`` method ending in ``_locked`` is called under it. Reads take no
lock: ``LocalLog`` publishes the segment list, its base offsets and the log start as one
value, and an append publishes the active segment's size last (see ``storage.local_log``).
Segments removed by retention or compaction keep their file descriptors open until
``file.delete.delay.ms`` has passed, so a reader holding an old snapshot can still finish.
Flushes hold a second lock (``_flush_lock``) and fsync outside ``_lock``: concurrent
``flush`` callers share one fsync (group commit). ``truncate_to`` takes both (in that
order), and the recovery point changes only under ``_lock``. The idempotence state
(``ProducerStateTable``, not thread-safe) is reached only through locked methods here.
Thread-safe.

Crash consistency: every creation, rename and unlink of segment files is followed by an
fsync of the directory before the operation returns, so a crash cannot bring back a
deleted segment or lose a new one. A roll's new segment is made durable by the producer
snapshot written right after it (``atomic_write``: temp file, fsync, rename, fsync the
directory). Truncation and retention rename segments ``.deleted``, write the leader-epoch
checkpoint, drop stale snapshots, then fsync the directory once. Compaction swaps follow
Kafka's ``LocalLog.replaceSegments`` (``storage.local_log``); ``open`` finishes or discards
whatever a crash interrupted (``storage.log_loader``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.storage.batch_times import BatchTimes
from tidelog.storage.clock import Clock
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import (
    FencedLeaderEpochError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    StorageError,
)
from tidelog.storage.files import (
    CLEANED_SUFFIX,
    atomic_write,
    base_offset_from_name,
    fsync_dir,
    offset_file_name,
)
from tidelog.storage.leader_epoch import LeaderEpochCache
from tidelog.storage.local_log import LocalLog, ReadResult, io_error, unlink_if_exists
from tidelog.storage.log_loader import SNAPSHOT_SUFFIX, load_log, rebuild_producer_state
from tidelog.storage.log_validator import (
    assign_offsets,
    check_produced_batch,
    decompresses,
    recompress,
    validated_batches,
)
from tidelog.storage.partition_log_replication import ReplicationCalls
from tidelog.storage.partition_log_txns import TransactionCalls
from tidelog.storage.producer_state import (
    ProducerStateTable,
    ProducerSummary,
    VerificationGuard,
)
from tidelog.storage.segment import BatchPosition, Segment

# ReadResult and SNAPSHOT_SUFFIX live in storage.local_log and storage.log_loader since the
# split (issue #26); they stay importable from here.
__all__ = ["AppendResult", "AppendWouldBlockError", "PartitionLog", "ReadResult"]

log = logging.getLogger(__name__)

_SNAPSHOTS_KEPT = 2


class AppendWouldBlockError(Exception):
    """A non-blocking append (``PartitionLog.append(blocking=False)``) would have waited:
    the partition lock is held, or the append needs a roll, a ``flush.messages`` fsync or
    a checkpoint rewrite (file work that may wait for the disk), or decompresses batches
    (work of unbounded size). Nothing was appended and
    nothing changed; append again, blocking, on a thread that may wait. An internal
    signal, never an answer to a client."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append did. ``duplicate``: an idempotent retry answered from the original."""

    base_offset: int
    last_offset: int
    log_append_time_ms: int
    record_count: int
    duplicate: bool


class PartitionLog(TransactionCalls, ReplicationCalls):
    """The log of one topic-partition. Thread-safe.

    The transaction methods come from ``TransactionCalls`` (``storage.partition_log_txns``),
    the replication and truncation methods from ``ReplicationCalls``
    (``storage.partition_log_replication``)."""

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
        producer_state: ProducerStateTable,
        leader_epochs: LeaderEpochCache | None = None,
        high_watermark: int | None = None,
    ) -> None:
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self._clock = clock
        # The segments, log start, recovery point and configuration; guarded by _lock.
        self._local = LocalLog(
            directory,
            topic,
            partition,
            config,
            clock,
            segments,
            log_start_offset=log_start_offset,
            recovery_point=recovery_point,
        )
        self._producer_state = producer_state
        # An append of transactional batches is between publishing them and recording
        # their transactions (read without the lock by ``last_stable_offset``).
        self._opening = False
        self._leader_epochs = leader_epochs or LeaderEpochCache()
        # The checkpoint says more than the cache: a write after a truncation failed
        # (a full disk). Written again before the next append, epoch or close.
        self._epochs_stale = False
        # None: not replicated, the high watermark is the log end offset.
        self._high_watermark = high_watermark
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._unflushed_records = 0
        self._last_flush_ms = clock.monotonic_ms()
        self._closed = False

    def __repr__(self) -> str:
        return f"PartitionLog({self.topic}-{self.partition})"

    # ================================================================== opening

    @classmethod
    def open(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        clock: Clock,
        *,
        log_start_offset: int = 0,
        recovery_point: int = 0,
        had_clean_shutdown: bool = False,
        high_watermark: int | None = None,
    ) -> PartitionLog:
        """Open (creating if needed) and, after an unclean stop, recover a partition log.

        Recovery (``storage.log_loader.load_log``) validates every batch from the segment
        holding ``recovery_point`` to the end, truncates at the first invalid byte and
        drops every later segment; segments whose index files are missing or damaged get
        them rebuilt. Interrupted compaction swaps are finished or discarded.
        ``high_watermark``: a replicated log's checkpointed high watermark (None: not
        replicated, or not known yet). Raises ``StorageError`` if the directory is unusable.
        """
        loaded = load_log(
            directory,
            config,
            clock,
            log_start_offset=log_start_offset,
            recovery_point=recovery_point,
            had_clean_shutdown=had_clean_shutdown,
            high_watermark=high_watermark,
        )
        instance = cls(
            directory,
            topic,
            partition,
            config,
            clock,
            loaded.segments,
            log_start_offset=loaded.log_start_offset,
            recovery_point=loaded.recovery_point,
            producer_state=ProducerStateTable(),
            leader_epochs=loaded.leader_epochs,
            high_watermark=loaded.high_watermark,
        )
        instance._load_producer_state()
        if not had_clean_shutdown:
            # What recovery validated is now fsynced, so the next recovery starts here.
            instance.flush()
        else:
            instance._local.recovery_point = loaded.log_end_offset
        return instance

    def _load_producer_state(self) -> None:
        """Newest usable snapshot, plus the batch headers after it (no record decoding)."""
        local = self._local
        self._producer_state = rebuild_producer_state(
            self.directory, local.segments, local.log_end_offset, self
        )

    # ================================================================== properties

    @property
    def config(self) -> LogConfig:
        return self._local.config

    @property
    def log_start_offset(self) -> int:
        return self._local.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._local.log_end_offset

    @property
    def high_watermark(self) -> int:
        tracked = self._high_watermark
        return self._local.log_end_offset if tracked is None else tracked

    @property
    def replicated(self) -> bool:
        """Whether the high watermark is tracked (cluster mode) rather than the log end."""
        return self._high_watermark is not None

    @property
    def recovery_point(self) -> int:
        return self._local.recovery_point

    @property
    def size_bytes(self) -> int:
        return self._local.size_bytes

    @property
    def segment_count(self) -> int:
        return len(self._local.segments)

    @property
    def segments(self) -> Sequence[Segment]:
        """A snapshot of the segments, oldest first (the last one is active)."""
        return self._local.segments

    def describe_producers(self, producer_id: int | None = None) -> list[ProducerSummary]:
        """What the idempotence state remembers: every producer, or only ``producer_id``.

        Copies, read under the lock: the table is not thread-safe, and ``truncate_to``
        replaces it.
        """
        with self._lock:
            return self._producer_state.describe(producer_id)

    def producer_last_offset(self, producer_id: int) -> int | None:
        """The last offset stored for ``producer_id``'s newest remembered batch, or None.

        The cleaner keeps that batch (Kafka keeps each producer's last batch) so that a
        retry is still recognised as a duplicate after compaction.
        """
        with self._lock:
            entry = self._producer_state.entry(producer_id)
            batches = entry.batches if entry is not None else None
            return batches[-1].last_offset if batches else None

    def expire_producers(self, expiration_ms: int) -> int:
        """Forget idle producers: those whose last batch is older than ``expiration_ms``.

        Kafka's ``producer.id.expiration.ms``: without it the table (and every snapshot)
        grows with each producer that ever wrote here. A late retry of a forgotten
        producer is then checked as a new producer's first batch. Returns how many.
        """
        with self._lock:
            return self._producer_state.expire(self._clock.wall_ms(), expiration_ms)

    def update_config(self, config: LogConfig) -> None:
        """Apply a changed topic configuration to future appends, rolls and retention."""
        with self._lock:
            self._local.config = config

    # ================================================================== append

    def append(
        self,
        records: bytes,
        times: BatchTimes | None = None,
        *,
        leader_epoch: int | None = None,
        verification: Mapping[int, VerificationGuard | None] | None = None,
        blocking: bool = True,
        batches: list[BatchPosition] | None = None,
    ) -> AppendResult:
        """Validate, assign offsets to and store one or more concatenated batches.

        ``times``: when the request carrying them was sent (producer clock) and received
        (broker clock), kept for every batch in the segment's ``.batchtimes`` sidecar
        (None: nothing is stored; readers see unknown times). ``leader_epoch``: a
        replicated partition's leader stamps its epoch into every batch (None: the
        producer's value is kept, as on a single node). ``verification``: the produce
        path verified the transactional batches with the coordinator, starting with these
        guards (producer id -> ``start_verification``'s answer); each is checked under the
        lock (``ProducerStateTable.check_verified``). None: an unverified append (tests,
        internal writers), as Kafka's with verification off. ``blocking`` False: for an
        event loop's thread (issue #31's inline produce), raise ``AppendWouldBlockError``
        rather than wait for the lock, do file work beyond the write itself (a roll, a
        ``flush.messages`` fsync, a stale checkpoint's rewrite) or decompress batches
        (``log_validator.decompresses``); the batches are validated (CRC included) either
        way. ``batches``: ``log_validator.validated_batches(records)``'s answer, from a
        caller that read it already (the produce path: one header walk, not two).

        Raises:
            CorruptRecordError: bad framing, magic, CRC, or inconsistent header fields.
            RecordTooLargeError: a batch larger than ``max.message.bytes``.
            InvalidRequestError: an empty request, or a control batch.
            OutOfOrderSequenceError, InvalidProducerEpochError: idempotence violations.
            InvalidTxnStateError: a non-transactional batch from a producer whose
                transaction is open here, or a verified transactional batch whose guard is
                no longer held.
            FencedLeaderEpochError: ``leader_epoch`` is older than the log's newest epoch.
            LogDirFullError, StorageError: the write failed; nothing was stored.
            AppendWouldBlockError: only with ``blocking`` False; nothing was stored.
        """
        if not records:
            raise InvalidRequestError("no record batches to append")
        config = self._local.config
        if batches is None:
            batches = validated_batches(records)
        if not blocking and decompresses(batches, config):
            raise AppendWouldBlockError(f"{self}: the append decompresses batches")
        now_ms = self._clock.wall_ms()
        for batch in batches:
            check_produced_batch(records, batch, config, now_ms)
        records, batches = recompress(records, batches, config)
        if not self._lock.acquire(blocking=blocking):
            raise AppendWouldBlockError(f"{self}: the partition lock is held")
        try:
            if self._closed:
                raise StorageError(f"{self} is closed")
            if not blocking and (self._epochs_stale or config.flush_messages > 0):
                raise AppendWouldBlockError(f"{self}: the append needs file work")
            try:
                self._rewrite_stale_epochs_locked()
                return self._append_locked(
                    records, batches, config, times, leader_epoch, verification, blocking
                )
            except OSError as exc:  # a roll's file work, or a flush.messages flush
                raise io_error(exc, f"{self}: append failed") from exc
        finally:
            self._lock.release()

    def _append_locked(
        self,
        records: bytes,
        batches: list[BatchPosition],
        config: LogConfig,
        times: BatchTimes | None,
        leader_epoch: int | None,
        verification: Mapping[int, VerificationGuard | None] | None = None,
        blocking: bool = True,
    ) -> AppendResult:
        if leader_epoch is not None and leader_epoch < self._leader_epochs.latest_epoch:
            # The leader moved to a newer epoch between the produce path's check and this
            # append: stamping the old epoch past the new epoch's start would make the
            # log contradict its own epoch cache (followers would truncate for ever).
            raise FencedLeaderEpochError(
                f"{self}: leader epoch {leader_epoch} is older than this log's "
                f"{self._leader_epochs.latest_epoch}; nothing appended"
            )
        state = self._producer_state
        duplicates = state.check_all([b.header for b in batches])
        if all(d is None for d in duplicates):
            kept = batches  # the usual append: nothing here was stored before
        elif all(d is not None for d in duplicates):
            originals = [d for d in duplicates if d is not None]
            return AppendResult(
                originals[0].base_offset, originals[-1].last_offset, -1, 0, duplicate=True
            )
        else:
            # Keep only the new batches; duplicates among them are already stored.
            kept = [b for b, d in zip(batches, duplicates, strict=True) if d is None]
        if verification is not None:
            state.check_verified([b.header for b in kept], verification)
        now_ms = self._clock.wall_ms()
        append_time = now_ms if config.log_append_time else -1
        placed = assign_offsets(
            records, kept, self.log_end_offset, append_time=append_time, leader_epoch=leader_epoch
        )
        assigned, offset, record_count = placed.batches, placed.next_offset, placed.record_count
        first_offset = assigned[0].header.base_offset
        # Asked once: the answer decides both a non-blocking append's give-up and the roll.
        roll = self._local.should_roll_locked(
            placed.size_bytes, offset - 1, placed.max_timestamp, config
        )
        if roll and not blocking:
            raise AppendWouldBlockError(f"{self}: the append needs a roll")
        if leader_epoch is not None and leader_epoch > self._leader_epochs.latest_epoch:
            self._assign_epoch_locked(leader_epoch, first_offset)
        segment = self._roll_locked(first_offset) if roll else self._local.active_segment
        self._opening = any(b.header.is_transactional for b in assigned)
        try:
            segment.append(placed.parts, assigned, times)
            for batch in assigned:
                self._producer_state.update(batch.header, now_ms)
        finally:
            self._opening = False
        self._unflushed_records += record_count
        result = AppendResult(first_offset, offset - 1, append_time, record_count, False)
        if config.flush_messages > 0 and self._unflushed_records >= config.flush_messages:
            # Every segment with unflushed data, not only the active one: a roll may have
            # sealed one since the last flush, and the new recovery point covers them all.
            self._local.flush_locked()
            self._unflushed_records = 0
        return result

    # ================================================================== roll

    def _maybe_roll_locked(
        self,
        incoming_bytes: int,
        first_offset: int,
        last_offset: int,
        max_timestamp: int,
        config: LogConfig,
    ) -> Segment:
        if self._local.should_roll_locked(incoming_bytes, last_offset, max_timestamp, config):
            return self._roll_locked(first_offset)
        return self._local.active_segment

    def roll(self) -> Segment:
        """Start a new active segment at the log end offset (no-op if the active is empty)."""
        with self._lock:
            try:
                return self._roll_locked(self.log_end_offset)
            except OSError as exc:
                raise io_error(exc, f"{self}: roll failed") from exc

    def _roll_locked(self, base_offset: int) -> Segment:
        segment = self._local.roll_locked(base_offset)
        if segment is None:  # the active segment is empty
            return self._local.active_segment
        # The snapshot's atomic write ends with an fsync of this directory, which also
        # makes the new segment's four files durable: a crash cannot lose them.
        try:
            self._write_producer_snapshot_locked(base_offset)
        except OSError as exc:
            # A full disk: the roll stands (the segment is published and may already
            # take this append), a snapshot only spares recovery replaying the headers.
            # The new files' names must still be durable before anything in them is
            # acknowledged; an fsync of the directory needs no space.
            log.warning("%s: producer snapshot at %d not written: %s", self, base_offset, exc)
            fsync_dir(self.directory)
        log.debug("%s: rolled to segment %d", self, base_offset)
        return segment

    def _write_producer_snapshot_locked(self, offset: int) -> None:
        path = self.directory / offset_file_name(offset, SNAPSHOT_SUFFIX)
        atomic_write(path, self._producer_state.to_bytes(offset))
        snapshots = sorted(self.directory.glob("*" + SNAPSHOT_SUFFIX))
        first_base = self._local.segments[0].base_offset
        # Keep the newest few, and none that only covers deleted segments.
        for old in snapshots[:-_SNAPSHOTS_KEPT]:
            if base_offset_from_name(old.name) < first_base or len(snapshots) > _SNAPSHOTS_KEPT:
                unlink_if_exists(old)

    # ================================================================== read

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        zero_copy: bool = False,
    ) -> ReadResult:
        """Whole batches from the one holding ``offset``, about ``max_bytes`` of them.

        The first batch is returned whole even if larger than ``max_bytes``. Reading at the
        log end offset returns no bytes. Offsets that compaction removed are skipped: the
        read starts at the next surviving batch. ``max_offset``: return only batches that
        start below it (consumers pass the high watermark; an offset between it and the
        log end reads nothing, as Kafka's fetch does). ``zero_copy``: the result's
        ``region`` says where the same batches are instead (``storage.file_region``; the
        caller closes it) and ``records`` is empty. Takes no lock (``LocalLog.read``).

        Raises:
            OffsetOutOfRangeError: ``offset`` is below the log start or above the log end.
        """
        return self._local.read(
            offset,
            max_bytes,
            max_offset=max_offset,
            high_watermark=self._current_high_watermark,
            zero_copy=zero_copy,
        )

    def _current_high_watermark(self) -> int:
        # ``high_watermark`` as a callable, read by ``LocalLog.read`` after its range check.
        return self.high_watermark

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record with a timestamp >= ``timestamp_ms``.

        None when every record is older. Uses the time indexes, then decodes the few
        batches that may hold the answer.
        """
        with self._lock:
            view = self._local.view
        return LocalLog.offset_for_timestamp(view, timestamp_ms)

    def max_timestamp(self) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record with the largest timestamp below the
        high watermark (Kafka's ListOffsets -3, KIP-734), or None when there is none."""
        with self._lock:
            view = self._local.view
        return LocalLog.max_timestamp(view, self.high_watermark)

    # ================================================================== flush

    def flush(self, up_to_offset: int | None = None) -> None:
        """fsync everything appended (or at least up to ``up_to_offset``).

        Returns at once if the recovery point is already past ``up_to_offset``. Callers that
        arrive while another fsync runs wait for it and usually find their data covered:
        concurrent producers share fsyncs.
        """
        local = self._local
        target = self.log_end_offset if up_to_offset is None else up_to_offset
        if local.recovery_point >= target:
            return
        with self._flush_lock:
            if local.recovery_point >= target:
                return
            with self._lock:
                end = self.log_end_offset
                dirty = local.dirty_segments_locked()
                active = local.active_segment
                try:
                    for segment in dirty:
                        segment.write_pending()
                except OSError as exc:
                    raise io_error(exc, f"{self}: writing index entries failed") from exc
                self._unflushed_records = 0
            try:
                for segment in dirty:
                    # The active segment's indexes are rebuilt by recovery, not synced
                    # here (``Segment.fsync``): the log and its batch times are.
                    segment.fsync(indexes=segment is not active)
            except OSError as exc:
                raise io_error(exc, f"{self}: fsync failed") from exc
            with self._lock:
                # truncate_to takes _flush_lock too, so the log cannot have been cut below
                # `end` during the fsync; the recovery point moves under _lock only.
                local.recovery_point = max(local.recovery_point, end)
                self._last_flush_ms = self._clock.monotonic_ms()

    def flush_sealed(self) -> None:
        """fsync segments that stopped being active (Kafka flushes them after a roll)."""
        local = self._local
        if local.recovery_point >= local.active_segment.base_offset:
            # The scheduler asks every log every second; almost none rolled since. Read
            # without the lock (a roll right after waits for the next pass), so 10,000
            # idle logs cost attribute reads, not 10,000 lock round trips.
            return
        with self._lock:
            active_base = self._local.active_segment.base_offset
        if self._local.recovery_point < active_base:
            self.flush(active_base)

    def maybe_flush_by_time(self) -> None:
        """fsync if ``flush.ms`` is set and the oldest unflushed data is that old."""
        flush_ms = self._local.config.flush_ms
        if flush_ms < 0 or self._local.recovery_point >= self.log_end_offset:
            return
        if self._clock.monotonic_ms() - self._last_flush_ms >= flush_ms:
            self.flush()

    # ================================================================== retention

    def delete_old_segments(self) -> int:
        """Apply retention (time, size, below log start); returns segments deleted.

        The log start offset moves to the first surviving segment's base offset.
        """
        with self._lock:
            local = self._local
            count = local.retention_count_locked(
                high_watermark=self.high_watermark, now_ms=self._clock.wall_ms()
            )
            if count == 0:
                return 0
            if count == len(local.segments):
                try:
                    self._roll_locked(self.log_end_offset)
                except OSError as exc:
                    raise io_error(exc, f"{self}: roll before retention failed") from exc
            doomed = local.remove_oldest_locked(count)
            try:
                # Epochs wholly below the new log start go; the one covering it starts
                # there (Kafka's truncateFromStart), so leader and follower caches agree.
                # The segments first: they left the view already, and a checkpoint
                # write refused by a full disk must not leave them open and undeleted
                # (a stale checkpoint entry below the log start is cut on open).
                for segment in doomed:
                    local.schedule_delete_locked(segment)
                before = self._leader_epochs.entries
                self._leader_epochs.truncate_from_start(local.log_start_offset)
                if self._leader_epochs.entries != before:
                    self._write_epochs_locked()
                # Durable renames: after a crash a segment is either still in the log
                # (and retention runs again) or .deleted (and open() removes it), never
                # back under its name once the log start offset passed it.
                fsync_dir(self.directory)
            except OSError as exc:
                raise io_error(exc, f"{self}: retention failed") from exc
            log.info(
                "%s: retention deleted %d segment(s); log start offset now %d",
                self,
                count,
                local.log_start_offset,
            )
            return count

    def increase_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset up to ``offset`` (Kafka's
        ``maybeIncrementLogStartOffset``, for DeleteRecords, KIP-107, and for a follower
        that learns its leader's); whether it moved. An offset at or below the current
        log start changes nothing.

        Readers see it at once (one store of the published view): a read below it is
        ``OFFSET_OUT_OF_RANGE`` and ListOffsets earliest answers it. It may fall inside
        a batch, as Kafka's: that batch is still served whole, its records below the new
        start skipped by the consumer. No file is touched but the leader-epoch checkpoint
        (the epoch covering the new start now starts there, as retention does); the
        segments wholly below it go at the next retention pass (``storage.retention``:
        "below the log start"). Durability is the caller's: the log manager's
        ``log-start-offset-checkpoint`` (``LogManager.checkpoint_log_start_offsets``);
        until it is written a crash brings back the old start.

        Raises:
            OffsetOutOfRangeError: ``offset`` is above the high watermark (the log end on
                an unreplicated log): only what readers could see may be deleted.
            StorageError: the leader-epoch checkpoint cannot be written (the log start
                has moved already).
        """
        with self._lock:
            local = self._local
            if offset <= local.log_start_offset:
                return False
            high_watermark = self.high_watermark
            if offset > high_watermark:
                raise OffsetOutOfRangeError(
                    f"{self}: cannot move the log start offset to {offset}, above the "
                    f"high watermark {high_watermark}"
                )
            local.set_segments_locked(local.segments, offset)
            before = self._leader_epochs.entries
            self._leader_epochs.truncate_from_start(offset)
            if self._leader_epochs.entries != before:
                try:
                    self._write_epochs_locked()
                except OSError as exc:
                    raise io_error(exc, f"{self}: writing the leader epochs failed") from exc
        log.info("%s: log start offset moved to %d", self, offset)
        return True

    def delete_expired_files(self, *, force: bool = False) -> int:
        """Unlink ``.deleted`` segments whose delay has passed (all of them with ``force``)."""
        if not self._local.has_pending_deletes:
            # The scheduler asks every log every file.delete check: most have nothing
            # pending, and the lock would contend with the fetches for nothing. A delete
            # queued right after this check waits for the next pass.
            return 0
        now = self._clock.monotonic_ms()
        with self._lock:
            due = self._local.take_due_deletes_locked(now, force=force)
        return self._local.delete_files(due)

    # ================================================================== compaction support

    def new_cleaned_segment(self, base_offset: int) -> Segment:
        """An empty ``.cleaned`` segment for the log cleaner to fill."""
        return self._local.create_segment(base_offset, CLEANED_SUFFIX)

    def replace_segments(self, new: Sequence[Segment], old: Sequence[Segment]) -> bool:
        """Atomically swap cleaned segments in for the ``old`` ones they replace.

        ``new`` are ``.cleaned`` segments, already written and fsynced, covering exactly the
        offsets of ``old`` (consecutive non-active segments). Returns False, deleting
        ``new``, if ``old`` are no longer all in the log (retention got there first) or the
        log is closed. The crash-safe rename order is ``LocalLog.replace_segments_locked``'s.
        """
        # Step 3 must strip .swap lowest offset first: a crash then leaves .swap only on the
        # highest new segments, and open() deletes old .log files only from the lowest
        # remaining .swap up, never a new segment that already has its final name.
        new = sorted(new, key=lambda s: s.base_offset)
        with self._lock:
            if self._closed:
                for segment in new:
                    segment.delete_files()
                return False
            return self._local.replace_segments_locked(new, old)

    # ================================================================== closing

    def close(self) -> None:
        """Flush, snapshot producer state, close every file. Idempotent."""
        if self._closed:
            return
        self.flush()
        with self._lock:
            self._closed = True
            try:
                # A clean restart trusts every index, the active segment's too, which
                # the produce path's flushes leave unsynced (``Segment.fsync``).
                active = self._local.active_segment
                active.write_pending()
                active.fsync_indexes()
                # A stale one that cannot be written fails the close: no clean-shutdown
                # marker, so the next open takes the epochs from the batches.
                self._rewrite_stale_epochs_locked()
                self._write_producer_snapshot_locked(self.log_end_offset)
                self._local.close_locked()
            except OSError as exc:
                raise io_error(exc, f"{self}: close failed") from exc
        self.delete_expired_files(force=True)

    def delete(self) -> None:
        """Close and remove every file of this log, and the directory."""
        with self._lock:
            self._closed = True
            self._local.delete_locked()
        self.delete_expired_files(force=True)
        for path in self.directory.iterdir():
            unlink_if_exists(path)
        try:
            self.directory.rmdir()
        except OSError:
            log.warning("%s: could not remove %s", self, self.directory)
