"""The log of one topic-partition: ordered segments, offsets, appends, reads, recovery.

A ``PartitionLog`` owns a directory ``<topic>-<partition>`` of segments sorted by base
offset; the last one is *active* and takes appends. It tracks:

* ``log_start_offset``: the first offset a reader may ask for (rises with retention);
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
  re-validates only the segments from the one holding it.

Appends validate each batch's framing, magic, CRC and size, check idempotent-producer
sequences, assign offsets by rewriting each batch's 8-byte base offset (LogAppendTime
topics also get the broker's time, which means a CRC recomputation) and write the bytes.
Records are never decoded on the append or read path.

Concurrency: one lock (``_lock``) serialises appends, rolls, truncation and segment-list
changes. Reads take it only to snapshot the segment list and the active segment's size, then
read with ``pread`` outside it. The segment list is copy-on-write, so a snapshot stays
valid. Segments removed by retention or compaction keep their file descriptors open until
``file.delete.delay.ms`` has passed, so a reader holding an old snapshot can still finish.
Flushes hold a second lock (``_flush_lock``) and fsync outside ``_lock``: concurrent
``flush`` callers share one fsync (group commit). ``truncate_to`` takes both (in that
order), and the recovery point changes only under ``_lock``. The idempotence state
(``ProducerStateTable``, not thread-safe) is reached only through locked methods here.
Every creation, rename and unlink of segment files is followed by an fsync of the
directory before the operation returns, so a crash cannot bring back a deleted segment
or lose a new one. Thread-safe.

On-disk crash safety for compaction swaps follows Kafka (``LocalLog.replaceSegments``):
``.cleaned`` files are renamed ``.swap`` in descending offset order, replaced segments are
renamed ``.deleted``, then ``.swap`` suffixes are stripped; ``open`` finishes or discards
whatever a crash interrupted.
"""

from __future__ import annotations

import bisect
import dataclasses
import errno
import logging
import operator
import os
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from storage.batch_times import BATCH_TIMES_SUFFIX, BatchTimes, decode_wire
from storage.clock import Clock
from storage.config import LogConfig
from storage.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidRequestError,
    LogDirFullError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
    UnsupportedCompressionTypeError,
)
from storage.files import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TMP_SUFFIX,
    atomic_write,
    base_offset_from_name,
    fsync_dir,
    make_dir_durable,
    offset_file_name,
)
from storage.leader_epoch import UNDEFINED_EPOCH, EpochEntry, LeaderEpochCache
from storage.producer_state import ProducerStateTable, ProducerSummary
from storage.records import (
    NO_TIMESTAMP,
    SUPPORTED_COMPRESSION,
    BatchHeader,
    decode_batch,
    iter_batch_headers,
    set_base_offset,
    set_log_append_time,
)
from storage.retention import SegmentInfo, plan_retention
from storage.segment import BatchPosition, Segment

__all__ = ["AppendResult", "PartitionLog", "ReadResult"]

log = logging.getLogger(__name__)

SNAPSHOT_SUFFIX = ".snapshot"
_MAX_RELATIVE_OFFSET = 2**31 - 1
_SNAPSHOTS_KEPT = 2
_BASE_OFFSET = struct.Struct(">q")  # a batch's first 8 bytes, outside its CRC
# partitionLeaderEpoch: after baseOffset (8) and batchLength (4), outside the CRC.
_EPOCH_AT = 12
_EPOCH = struct.Struct(">i")
# Every BatchHeader field but the first (base_offset), to rebuild a header with a new base
# offset at half the cost of dataclasses.replace (per batch, on the append path).
_HEADER_FIELDS = [f.name for f in dataclasses.fields(BatchHeader)]
assert _HEADER_FIELDS[0] == "base_offset", _HEADER_FIELDS
_HEADER_AFTER_BASE_OFFSET = operator.attrgetter(*_HEADER_FIELDS[1:])
# Recovery must not judge stored batches by today's max.message.bytes: the limit can be
# lowered after they were accepted. Framing, the file's size and the CRC decide validity.
_RECOVERY_MAX_BATCH_BYTES = 2**31 - 1


class _ReadView(NamedTuple):
    """The segment list, its base offsets and the log start, as one immutable value."""

    segments: list[Segment]
    bases: list[int]
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append did. ``duplicate``: an idempotent retry answered from the original."""

    base_offset: int
    last_offset: int
    log_append_time_ms: int
    record_count: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole stored batches (the first may begin before the offset asked for)."""

    records: bytes
    high_watermark: int
    log_start_offset: int
    # The returned batches' sent/received times, ``storage.batch_times`` wire entries.
    batch_times: bytes = b""


class PartitionLog:
    """The segments of one topic-partition. Thread-safe."""

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
        self._config = config
        self._clock = clock
        # The segments, their base offsets and the log start, published as one value so
        # that a lock-free ``read`` sees them consistent (``_set_segments`` replaces it).
        self._view = _ReadView(segments, [s.base_offset for s in segments], log_start_offset)
        self._recovery_point = recovery_point
        self._producer_state = producer_state
        self._leader_epochs = leader_epochs or LeaderEpochCache()
        # None: not replicated, the high watermark is the log end offset.
        self._high_watermark = high_watermark
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending_deletes: list[tuple[int, Segment]] = []
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

        Recovery validates every batch from the segment holding ``recovery_point`` to the
        end, truncates at the first invalid byte and drops every later segment; segments
        whose index files are missing or damaged get them rebuilt. Interrupted compaction
        swaps are finished or discarded. ``high_watermark``: a replicated log's checkpointed
        high watermark (None: not replicated, or not known yet). Raises ``StorageError`` if
        the directory is unusable.
        """
        try:
            make_dir_durable(directory)  # its name, not only its files, before any ack
            bases = cls._clean_directory(directory, config)
        except OSError as exc:
            raise StorageError(f"cannot open log directory {directory}: {exc}") from exc
        segments: list[Segment] = []
        truncated_at: int | None = None
        for base in bases:
            if truncated_at is not None:
                log.warning("%s: deleting segment %d after a truncated one", directory, base)
                for path in Segment.paths(directory, base):
                    _unlink(path)
                continue
            # Recover from the segment holding the recovery point to the end.
            recover = not had_clean_shutdown and _next_base(bases, base) > recovery_point
            segment, truncated = Segment.open(
                directory,
                base,
                index_interval_bytes=config.index_interval_bytes,
                index_max_bytes=config.segment_index_bytes,
                max_message_bytes=_RECOVERY_MAX_BATCH_BYTES,
                recover=recover,
                # Without compaction offsets have no gaps; above the recovery point
                # (written in this configuration, not yet durable) a gap is damage.
                contiguous_from=None if config.compact else recovery_point,
            )
            segments.append(segment)
            if truncated:
                log.warning("%s: recovery cut %d bytes from segment %d", directory, truncated, base)
                truncated_at = base
            elif (
                recover
                and not config.compact
                and base != bases[-1]
                and recovery_point <= segment.next_offset < _next_base(bases, base)
            ):
                # The crash took whole batches off the end of a sealed segment (its size
                # was not durable yet): nothing to cut, but a hole before the next segment.
                # Without compaction, whose holes are legitimate, that is lost data, and
                # what follows it must go too, so the log stays a prefix of what was written.
                log.warning(
                    "%s: segment %d ends at %d, below the next segment: batches were lost",
                    directory,
                    base,
                    segment.next_offset,
                )
                truncated_at = base
        now_ms = clock.wall_ms()
        # An empty segment in the middle (e.g. compaction emptied it) is fine; an empty log
        # needs one segment to append to.
        log_end = segments[-1].next_offset if segments else log_start_offset
        if segments:
            log_start_offset = max(log_start_offset, segments[0].base_offset)
        if log_end < log_start_offset:
            for segment in segments:
                segment.delete_files()
            segments = []
        if not segments:
            segments.append(
                Segment.create(
                    directory,
                    log_start_offset,
                    index_interval_bytes=config.index_interval_bytes,
                    index_max_bytes=config.segment_index_bytes,
                    now_ms=now_ms,
                )
            )
            fsync_dir(directory)
        log_end = segments[-1].next_offset
        epochs = LeaderEpochCache.read(directory) or LeaderEpochCache()
        epochs.truncate_from_end(log_end)
        epochs.truncate_from_start(log_start_offset)
        if high_watermark is not None:
            high_watermark = min(max(high_watermark, log_start_offset), log_end)
        instance = cls(
            directory,
            topic,
            partition,
            config,
            clock,
            segments,
            log_start_offset=log_start_offset,
            recovery_point=min(recovery_point, log_end) if had_clean_shutdown else 0,
            producer_state=ProducerStateTable(),
            leader_epochs=epochs,
            high_watermark=high_watermark,
        )
        instance._load_producer_state()
        if not had_clean_shutdown:
            # What recovery validated is now fsynced, so the next recovery starts here.
            instance.flush()
        else:
            instance._recovery_point = log_end
        return instance

    @staticmethod
    def _clean_directory(directory: Path, config: LogConfig) -> list[int]:
        """Remove leftovers, finish or discard interrupted swaps; return segment bases."""
        names = os.listdir(directory)
        for name in names:
            if name.endswith((DELETED_SUFFIX, TMP_SUFFIX)):
                _unlink(directory / name)
        names = os.listdir(directory)
        cleaned = [n for n in names if n.endswith(CLEANED_SUFFIX)]
        swaps = sorted(
            base_offset_from_name(n) for n in names if n.endswith(LOG_SUFFIX + SWAP_SUFFIX)
        )
        if cleaned:
            # A crash while renaming .cleaned -> .swap: the swap is incomplete; discard it
            # (those .swap files whose offset is >= the smallest .cleaned, and the .cleaned).
            smallest = min(base_offset_from_name(n) for n in cleaned)
            for name in cleaned:
                _unlink(directory / name)
            for base in [b for b in swaps if b >= smallest]:
                for path in Segment.paths(directory, base, SWAP_SUFFIX):
                    _unlink(path)
            swaps = [b for b in swaps if b < smallest]
        if swaps:
            # Every .swap is complete: finish the swap. The replaced range runs from the
            # smallest swap base to the largest swap segment's next offset.
            swap_end = 0
            for base in swaps:
                segment, _ = Segment.open(
                    directory,
                    base,
                    index_interval_bytes=config.index_interval_bytes,
                    index_max_bytes=config.segment_index_bytes,
                    max_message_bytes=_RECOVERY_MAX_BATCH_BYTES,
                    recover=True,
                    suffix=SWAP_SUFFIX,
                )
                swap_end = max(swap_end, segment.next_offset)
                segment.close()
            names = os.listdir(directory)
            for name in names:
                if name.endswith(LOG_SUFFIX) and swaps[0] <= base_offset_from_name(name) < swap_end:
                    for path in Segment.paths(directory, base_offset_from_name(name)):
                        _unlink(path)
            for base in swaps:
                for swap_path, final in zip(
                    Segment.paths(directory, base, SWAP_SUFFIX),
                    Segment.paths(directory, base),
                    strict=True,
                ):
                    if swap_path.exists():
                        os.replace(swap_path, final)
            fsync_dir(directory)
        # A crash while stripping .swap from one segment's four files leaves its index
        # .swap files behind its final .log; no .log.swap names them, so nothing above
        # does. The log is final and missing indexes are rebuilt, so they can go.
        for name in os.listdir(directory):
            if name.endswith(SWAP_SUFFIX):
                _unlink(directory / name)
        names = os.listdir(directory)
        bases = sorted(base_offset_from_name(n) for n in names if n.endswith(LOG_SUFFIX))
        # Index files without a log are stale.
        known = {offset_file_name(b, "") for b in bases}
        for name in names:
            if (
                name.endswith((".index", ".timeindex", BATCH_TIMES_SUFFIX))
                and name.split(".", 1)[0] not in known
            ):
                _unlink(directory / name)
        return bases

    def _load_producer_state(self) -> None:
        """Newest usable snapshot, plus the batch headers after it (no record decoding)."""
        log_end = self.log_end_offset
        snapshots = sorted(
            (base_offset_from_name(p.name), p) for p in self.directory.glob("*" + SNAPSHOT_SUFFIX)
        )
        table, start = ProducerStateTable(), self._segments[0].base_offset
        for offset, path in reversed(snapshots):
            if offset > log_end:
                _unlink(path)  # covers data that recovery cut off
                continue
            try:
                table, start = ProducerStateTable.from_bytes(path.read_bytes())
                break
            except (OSError, ValueError) as exc:
                log.warning("%s: ignoring producer snapshot %s: %s", self, path, exc)
        for segment in self._segments:
            if segment.next_offset <= start:
                continue
            position = 0
            if start > segment.base_offset:
                position = segment.find_position(start) or 0
            for batch in segment.iter_batches(position):
                if batch.header.base_offset >= start:
                    table.update(batch.header, batch.header.max_timestamp)
        self._producer_state = table

    # ================================================================== properties

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def high_watermark(self) -> int:
        tracked = self._high_watermark
        return self._segments[-1].next_offset if tracked is None else tracked

    @property
    def replicated(self) -> bool:
        """Whether the high watermark is tracked (cluster mode) rather than the log end."""
        return self._high_watermark is not None

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segments(self) -> Sequence[Segment]:
        """A snapshot of the segments, oldest first (the last one is active)."""
        return self._segments

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
            self._config = config

    # ================================================================== append

    def append(
        self, records: bytes, times: BatchTimes | None = None, *, leader_epoch: int | None = None
    ) -> AppendResult:
        """Validate, assign offsets to and store one or more concatenated batches.

        ``times``: when the request carrying them was sent (producer clock) and received
        (broker clock), kept for every batch in the segment's ``.batchtimes`` sidecar
        (None: nothing is stored; readers see unknown times). ``leader_epoch``: a
        replicated partition's leader stamps its epoch into every batch (None: the
        producer's value is kept, as on a single node).

        Raises:
            CorruptRecordError: bad framing, magic, CRC, or inconsistent header fields.
            RecordTooLargeError: a batch larger than ``max.message.bytes``.
            InvalidRequestError: an empty request, or a transactional or control batch.
            OutOfOrderSequenceError, InvalidProducerEpochError: idempotence violations.
            FencedLeaderEpochError: ``leader_epoch`` is older than the log's newest epoch.
            LogDirFullError, StorageError: the write failed; nothing was stored.
        """
        if not records:
            raise InvalidRequestError("no record batches to append")
        config = self._config
        batches = [
            BatchPosition(position, header)
            for position, header in iter_batch_headers(records, validate=True)
        ]
        for batch in batches:
            _check_produced_batch(records, batch, config)
        with self._lock:
            if self._closed:
                raise StorageError(f"{self} is closed")
            try:
                return self._append_locked(records, batches, config, times, leader_epoch)
            except OSError as exc:  # a roll's file work, or a flush.messages flush
                raise _io_error(exc, f"{self}: append failed") from exc

    def _append_locked(
        self,
        records: bytes,
        batches: list[BatchPosition],
        config: LogConfig,
        times: BatchTimes | None,
        leader_epoch: int | None,
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
        if all(d is not None for d in duplicates):
            originals = [d for d in duplicates if d is not None]
            return AppendResult(
                originals[0].base_offset, originals[-1].last_offset, -1, 0, duplicate=True
            )
        # Keep only the new batches; duplicates among them are already stored.
        kept = [b for b, d in zip(batches, duplicates, strict=True) if d is None]
        now_ms = self._clock.wall_ms()
        append_time = now_ms if config.log_append_time else -1
        offset = self.log_end_offset
        # The producer's bytes are written as they are, in pieces (one writev): only the
        # 8-byte base offset of each batch is new, and copying a 1 MiB request to patch 8
        # bytes cost about a tenth of the append. LogAppendTime changes the CRC, so those
        # batches are copied and rewritten.
        view = memoryview(records)
        parts: list[bytes | bytearray | memoryview] = []
        assigned: list[BatchPosition] = []
        position = 0
        record_count = 0
        max_timestamp = NO_TIMESTAMP
        for batch in kept:
            header = batch.header
            start, size = batch.position, header.size_bytes
            if append_time >= 0:
                rewritten = bytearray(view[start : start + size])
                set_base_offset(rewritten, 0, offset)
                set_log_append_time(rewritten, 0, append_time)
                header = dataclasses.replace(header, base_offset=offset, max_timestamp=append_time)
                if leader_epoch is not None:
                    _EPOCH.pack_into(rewritten, _EPOCH_AT, leader_epoch)
                    header = dataclasses.replace(header, partition_leader_epoch=leader_epoch)
                parts.append(rewritten)
            elif leader_epoch is not None:
                parts.append(_BASE_OFFSET.pack(offset))
                parts.append(view[start + _BASE_OFFSET.size : start + _EPOCH_AT])
                parts.append(_EPOCH.pack(leader_epoch))
                parts.append(view[start + _EPOCH_AT + _EPOCH.size : start + size])
                header = dataclasses.replace(
                    header, base_offset=offset, partition_leader_epoch=leader_epoch
                )
            else:
                parts.append(_BASE_OFFSET.pack(offset))
                parts.append(view[start + _BASE_OFFSET.size : start + size])
                header = BatchHeader(offset, *_HEADER_AFTER_BASE_OFFSET(header))
            assigned.append(BatchPosition(position, header))
            position += size
            offset = header.next_offset
            record_count += header.records_count
            max_timestamp = max(max_timestamp, header.max_timestamp)
        first_offset = assigned[0].header.base_offset
        if leader_epoch is not None and leader_epoch > self._leader_epochs.latest_epoch:
            self._assign_epoch_locked(leader_epoch, first_offset)
        segment = self._maybe_roll_locked(position, first_offset, offset - 1, max_timestamp, config)
        segment.append(parts, assigned, times)
        for batch in assigned:
            self._producer_state.update(batch.header, now_ms)
        self._unflushed_records += record_count
        result = AppendResult(first_offset, offset - 1, append_time, record_count, False)
        if config.flush_messages > 0 and self._unflushed_records >= config.flush_messages:
            # Every segment with unflushed data, not only the active one: a roll may have
            # sealed one since the last flush, and the new recovery point covers them all.
            for dirty in [s for s in self._segments if s.next_offset > self._recovery_point]:
                dirty.write_pending()
                dirty.fsync()
            self._recovery_point = self.log_end_offset
            self._unflushed_records = 0
        return result

    # ================================================================== replication

    def append_as_follower(self, records: bytes, batch_times: bytes = b"") -> int:
        """Append a leader's batches unchanged (offsets, epochs, CRCs); the new log end.

        ``batch_times``: the fetch answer's sent/received times (``storage.batch_times``
        wire entries), kept for the batches they name. Batches wholly below the log end
        offset (a repeated fetch) are skipped; the first new batch must start at or after
        the log end (compaction may have left a gap on the leader). Sequences are not
        checked (the leader did), but the idempotence state is updated, so a follower that
        becomes leader still recognises retried batches. Epochs the batches carry extend
        the leader-epoch cache.

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
            kept = [b for b in batches if b.header.last_offset >= log_end]
            if not kept:
                return log_end
            if kept[0].header.base_offset < log_end:
                raise CorruptRecordError(
                    f"{self}: the leader's batch {kept[0].header.base_offset}.."
                    f"{kept[0].header.last_offset} overlaps the log end {log_end}"
                )
            first = kept[0].position
            previous = log_end - 1
            assigned = []
            max_timestamp = NO_TIMESTAMP
            for batch in kept:
                header = batch.header
                if header.base_offset <= previous:
                    raise CorruptRecordError(f"{self}: the leader's offsets go backwards")
                previous = header.last_offset
                assigned.append(BatchPosition(batch.position - first, header))
                max_timestamp = max(max_timestamp, header.max_timestamp)
            end = kept[-1].position + kept[-1].header.size_bytes
            now_ms = self._clock.wall_ms()
            times = None
            if times_by_offset:
                times = [
                    BatchTimes(*(-1 if t is None else t for t in found))
                    if (found := times_by_offset.get(b.header.last_offset)) is not None
                    else BatchTimes()
                    for b in assigned
                ]
            try:
                for batch in assigned:
                    epoch = batch.header.partition_leader_epoch
                    if epoch >= 0 and epoch > self._leader_epochs.latest_epoch:
                        self._assign_epoch_locked(epoch, batch.header.base_offset)
                segment = self._maybe_roll_locked(
                    end - first,
                    assigned[0].header.base_offset,
                    assigned[-1].header.last_offset,
                    max_timestamp,
                    self._config,
                )
                segment.append([memoryview(records)[first:end]], assigned, times)
            except OSError as exc:
                raise _io_error(exc, f"{self}: follower append failed") from exc
            for batch in assigned:
                self._producer_state.update(batch.header, now_ms)
                self._unflushed_records += batch.header.records_count
            return self.log_end_offset

    def _assign_epoch_locked(self, epoch: int, start_offset: int) -> None:
        if self._leader_epochs.assign(epoch, start_offset):
            self._leader_epochs.write(self.directory)

    def begin_leader_epoch(self, epoch: int) -> None:
        """This broker leads from now on at ``epoch``: record it at the log end (Kafka's
        ``becomeLeader``), so followers asking for the previous epoch learn where it ended
        even before the new leader writes anything. Raises ``StorageError``."""
        with self._lock:
            if epoch > self._leader_epochs.latest_epoch:
                try:
                    self._assign_epoch_locked(epoch, self.log_end_offset)
                except OSError as exc:
                    raise _io_error(exc, f"{self}: writing the leader-epoch checkpoint") from exc

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch in this log (-1 if none)."""
        with self._lock:
            return self._leader_epochs.latest_epoch

    def epoch_entries(self) -> list[EpochEntry]:
        """The leader-epoch cache, oldest first (a copy)."""
        with self._lock:
            return self._leader_epochs.entries

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
                start = self._log_start_offset
            self._high_watermark = min(max(start, self._log_start_offset), self.log_end_offset)
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

    def _maybe_roll_locked(
        self,
        incoming_bytes: int,
        first_offset: int,
        last_offset: int,
        max_timestamp: int,
        config: LogConfig,
    ) -> Segment:
        active = self._segments[-1]
        if active.is_empty:
            return active
        reference = active.first_batch_timestamp_ms
        if reference == NO_TIMESTAMP or max_timestamp == NO_TIMESTAMP:
            waited = self._clock.wall_ms() - active.created_ms
        else:
            waited = max_timestamp - reference
        if (
            active.size_bytes > config.segment_bytes - incoming_bytes
            or waited > config.segment_ms
            or active.index_is_full
            or last_offset - active.base_offset > _MAX_RELATIVE_OFFSET
        ):
            return self._roll_locked(first_offset)
        return active

    def roll(self) -> Segment:
        """Start a new active segment at the log end offset (no-op if the active is empty)."""
        with self._lock:
            try:
                return self._roll_locked(self.log_end_offset)
            except OSError as exc:
                raise _io_error(exc, f"{self}: roll failed") from exc

    def _roll_locked(self, base_offset: int) -> Segment:
        active = self._segments[-1]
        if active.is_empty:
            return active
        active.write_pending()
        segment = Segment.create(
            self.directory,
            base_offset,
            index_interval_bytes=self._config.index_interval_bytes,
            index_max_bytes=self._config.segment_index_bytes,
            now_ms=self._clock.wall_ms(),
        )
        self._set_segments([*self._segments, segment])
        # The snapshot's atomic write ends with an fsync of this directory, which also
        # makes the new segment's four files durable: a crash cannot lose them.
        self._write_producer_snapshot_locked(base_offset)
        log.debug("%s: rolled to segment %d", self, base_offset)
        return segment

    def _write_producer_snapshot_locked(self, offset: int) -> None:
        path = self.directory / offset_file_name(offset, SNAPSHOT_SUFFIX)
        atomic_write(path, self._producer_state.to_bytes(offset))
        snapshots = sorted(self.directory.glob("*" + SNAPSHOT_SUFFIX))
        first_base = self._segments[0].base_offset
        # Keep the newest few, and none that only covers deleted segments.
        for old in snapshots[:-_SNAPSHOTS_KEPT]:
            if base_offset_from_name(old.name) < first_base or len(snapshots) > _SNAPSHOTS_KEPT:
                _unlink(old)

    def _set_segments(self, segments: list[Segment], log_start_offset: int | None = None) -> None:
        """Copy-on-write replacement of the segment list and, if given, the log start
        offset, in one store; readers keep the view they loaded."""
        start = self._log_start_offset if log_start_offset is None else log_start_offset
        self._view = _ReadView(segments, [s.base_offset for s in segments], start)

    @property
    def _segments(self) -> list[Segment]:
        return self._view.segments

    @property
    def _bases(self) -> list[int]:
        return self._view.bases

    @property
    def _log_start_offset(self) -> int:
        return self._view.log_start_offset

    # ================================================================== read

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None) -> ReadResult:
        """Whole batches from the one holding ``offset``, about ``max_bytes`` of them.

        The first batch is returned whole even if larger than ``max_bytes``. Reading at the
        log end offset returns no bytes. Offsets that compaction removed are skipped: the
        read starts at the next surviving batch. ``max_offset``: return only batches that
        start below it (consumers pass the high watermark; an offset between it and the
        log end reads nothing, as Kafka's fetch does).

        Raises:
            OffsetOutOfRangeError: ``offset`` is below the log start or above the log end.
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
        high_watermark = self.high_watermark
        if offset == log_end:
            return ReadResult(b"", high_watermark, log_start)
        stop = len(segments)
        stop_position: int | None = None
        if max_offset is not None and max_offset < log_end:
            if offset >= max_offset:
                return ReadResult(b"", high_watermark, log_start)
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
            data, times = segment.read_with_times(offset, max_bytes, limit)
            if data:
                return ReadResult(data, high_watermark, log_start, times)
        return ReadResult(b"", high_watermark, log_start)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record with a timestamp >= ``timestamp_ms``.

        None when every record is older. Uses the time indexes, then decodes the few
        batches that may hold the answer.
        """
        with self._lock:
            segments = self._segments
            log_start = self._log_start_offset
        for segment in segments:
            if segment.max_timestamp_ms < timestamp_ms or segment.next_offset <= log_start:
                continue
            found = segment.offset_for_timestamp(timestamp_ms, log_start)
            if found is not None:
                return found
        return None

    # ================================================================== flush

    def flush(self, up_to_offset: int | None = None) -> None:
        """fsync everything appended (or at least up to ``up_to_offset``).

        Returns at once if the recovery point is already past ``up_to_offset``. Callers that
        arrive while another fsync runs wait for it and usually find their data covered:
        concurrent producers share fsyncs.
        """
        target = self.log_end_offset if up_to_offset is None else up_to_offset
        if self._recovery_point >= target:
            return
        with self._flush_lock:
            if self._recovery_point >= target:
                return
            with self._lock:
                end = self.log_end_offset
                dirty = [s for s in self._segments if s.next_offset > self._recovery_point]
                try:
                    for segment in dirty:
                        segment.write_pending()
                except OSError as exc:
                    raise _io_error(exc, f"{self}: writing index entries failed") from exc
                self._unflushed_records = 0
            try:
                for segment in dirty:
                    segment.fsync()
            except OSError as exc:
                raise _io_error(exc, f"{self}: fsync failed") from exc
            with self._lock:
                # truncate_to takes _flush_lock too, so the log cannot have been cut below
                # `end` during the fsync; the recovery point moves under _lock only.
                self._recovery_point = max(self._recovery_point, end)
                self._last_flush_ms = self._clock.monotonic_ms()

    def flush_sealed(self) -> None:
        """fsync segments that stopped being active (Kafka flushes them after a roll)."""
        with self._lock:
            active_base = self._segments[-1].base_offset
        if self._recovery_point < active_base:
            self.flush(active_base)

    def maybe_flush_by_time(self) -> None:
        """fsync if ``flush.ms`` is set and the oldest unflushed data is that old."""
        flush_ms = self._config.flush_ms
        if flush_ms < 0 or self._recovery_point >= self.log_end_offset:
            return
        if self._clock.monotonic_ms() - self._last_flush_ms >= flush_ms:
            self.flush()

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
                keep = [
                    s for s in self._segments if s.base_offset < offset or s is self._segments[0]
                ]
                for segment in self._segments[len(keep) :]:
                    self._schedule_delete_locked(segment)
                keep[-1].truncate_to(offset)
                self._set_segments(keep, min(self._log_start_offset, keep[-1].next_offset))
                self._recovery_point = min(self._recovery_point, self.log_end_offset)
                if self._high_watermark is not None:
                    self._high_watermark = min(self._high_watermark, self.log_end_offset)
                before = self._leader_epochs.entries
                self._leader_epochs.truncate_from_end(self.log_end_offset)
                if self._leader_epochs.entries != before:
                    self._leader_epochs.write(self.directory)
                for snapshot in self.directory.glob("*" + SNAPSHOT_SUFFIX):
                    if base_offset_from_name(snapshot.name) > self.log_end_offset:
                        _unlink(snapshot)
                fsync_dir(self.directory)
            except OSError as exc:
                raise _io_error(exc, f"{self}: truncation failed") from exc
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
                for segment in self._segments:
                    self._schedule_delete_locked(segment)
                fresh = Segment.create(
                    self.directory,
                    offset,
                    index_interval_bytes=self._config.index_interval_bytes,
                    index_max_bytes=self._config.segment_index_bytes,
                    now_ms=self._clock.wall_ms(),
                )
                self._set_segments([fresh], offset)
                self._recovery_point = offset
                if self._high_watermark is not None:
                    self._high_watermark = offset
                self._leader_epochs = LeaderEpochCache()
                self._leader_epochs.write(self.directory)
                for snapshot in self.directory.glob("*" + SNAPSHOT_SUFFIX):
                    _unlink(snapshot)
                fsync_dir(self.directory)
            except OSError as exc:
                raise _io_error(exc, f"{self}: full truncation failed") from exc
            self._producer_state = ProducerStateTable()
        log.warning("%s: truncated fully; the log now starts empty at %d", self, offset)

    # ================================================================== retention

    def delete_old_segments(self) -> int:
        """Apply retention (time, size, below log start); returns segments deleted.

        The log start offset moves to the first surviving segment's base offset.
        """
        with self._lock:
            config = self._config
            now_ms = self._clock.wall_ms()
            infos = [
                SegmentInfo(
                    s.base_offset,
                    s.next_offset,
                    s.size_bytes,
                    s.max_timestamp_ms if s.max_timestamp_ms != NO_TIMESTAMP else s.created_ms,
                )
                for s in self._segments
            ]
            count = plan_retention(
                infos,
                log_start_offset=self._log_start_offset,
                high_watermark=self.high_watermark,
                retention_ms=config.retention_ms,
                retention_bytes=config.retention_bytes,
                delete_policy=config.delete,
                now_ms=now_ms,
            )
            if count == 0:
                return 0
            if count == len(self._segments):
                try:
                    self._roll_locked(self.log_end_offset)
                except OSError as exc:
                    raise _io_error(exc, f"{self}: roll before retention failed") from exc
            doomed = self._segments[:count]
            kept = self._segments[count:]
            self._set_segments(kept, max(self._log_start_offset, kept[0].base_offset))
            try:
                # Epochs wholly below the new log start go; the one covering it starts
                # there (Kafka's truncateFromStart), so leader and follower caches agree.
                before = self._leader_epochs.entries
                self._leader_epochs.truncate_from_start(self._log_start_offset)
                if self._leader_epochs.entries != before:
                    self._leader_epochs.write(self.directory)
                for segment in doomed:
                    self._schedule_delete_locked(segment)
                # Durable renames: after a crash a segment is either still in the log
                # (and retention runs again) or .deleted (and open() removes it), never
                # back under its name once the log start offset passed it.
                fsync_dir(self.directory)
            except OSError as exc:
                raise _io_error(exc, f"{self}: retention failed") from exc
            log.info(
                "%s: retention deleted %d segment(s); log start offset now %d",
                self,
                count,
                self._log_start_offset,
            )
            return count

    def _schedule_delete_locked(self, segment: Segment) -> None:
        segment.rename_suffix(DELETED_SUFFIX)
        segment.deleted = True
        deadline = self._clock.monotonic_ms() + self._config.file_delete_delay_ms
        self._pending_deletes.append((deadline, segment))

    def delete_expired_files(self, *, force: bool = False) -> int:
        """Unlink ``.deleted`` segments whose delay has passed (all of them with ``force``)."""
        now = self._clock.monotonic_ms()
        with self._lock:
            due = [s for deadline, s in self._pending_deletes if force or deadline <= now]
            self._pending_deletes = [
                (d, s) for d, s in self._pending_deletes if not (force or d <= now)
            ]
        for segment in due:
            segment.delete_files()
        if due:
            fsync_dir(self.directory)
        return len(due)

    # ================================================================== compaction support

    def new_cleaned_segment(self, base_offset: int) -> Segment:
        """An empty ``.cleaned`` segment for the log cleaner to fill."""
        return Segment.create(
            self.directory,
            base_offset,
            index_interval_bytes=self._config.index_interval_bytes,
            index_max_bytes=self._config.segment_index_bytes,
            now_ms=self._clock.wall_ms(),
            suffix=CLEANED_SUFFIX,
        )

    def replace_segments(self, new: Sequence[Segment], old: Sequence[Segment]) -> bool:
        """Atomically swap cleaned segments in for the ``old`` ones they replace.

        ``new`` are ``.cleaned`` segments, already written and fsynced, covering exactly the
        offsets of ``old`` (consecutive non-active segments). Returns False, deleting
        ``new``, if ``old`` are no longer all in the log (retention got there first) or the
        log is closed.
        """
        # Step 3 must strip .swap lowest offset first: a crash then leaves .swap only on the
        # highest new segments, and open() deletes old .log files only from the lowest
        # remaining .swap up, never a new segment that already has its final name.
        new = sorted(new, key=lambda s: s.base_offset)
        with self._lock:
            current = self._segments
            ids = [id(s) for s in current]
            try:
                start = ids.index(id(old[0]))
            except ValueError:
                start = -1
            if (
                self._closed
                or start < 0
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
                self._schedule_delete_locked(segment)
            # 3. strip .swap.
            for segment in new:
                segment.rename_suffix("")
            fsync_dir(self.directory)
            self._set_segments([*current[:start], *new, *current[start + len(old) :]])
            return True

    # ================================================================== closing

    def close(self) -> None:
        """Flush, snapshot producer state, close every file. Idempotent."""
        if self._closed:
            return
        self.flush()
        with self._lock:
            self._closed = True
            try:
                self._write_producer_snapshot_locked(self.log_end_offset)
                for segment in self._segments:
                    segment.close()
            except OSError as exc:
                raise _io_error(exc, f"{self}: close failed") from exc
        self.delete_expired_files(force=True)

    def delete(self) -> None:
        """Close and remove every file of this log, and the directory."""
        with self._lock:
            self._closed = True
            for segment in self._segments:
                segment.delete_files()
            self._set_segments([])
        self.delete_expired_files(force=True)
        for path in self.directory.iterdir():
            _unlink(path)
        try:
            self.directory.rmdir()
        except OSError:
            log.warning("%s: could not remove %s", self, self.directory)


def _check_produced_batch(records: bytes, batch: BatchPosition, config: LogConfig) -> None:
    """Reject what a producer may not send (before any state changes)."""
    header: BatchHeader = batch.header
    if header.size_bytes > config.max_message_bytes:
        raise RecordTooLargeError(
            f"batch at position {batch.position} is {header.size_bytes} bytes; the limit "
            f"(max.message.bytes) is {config.max_message_bytes}"
        )
    if header.is_transactional or header.is_control:
        raise InvalidRequestError("transactional and control batches are not supported")
    codec = header.compression
    if codec not in SUPPORTED_COMPRESSION:
        raise UnsupportedCompressionTypeError(
            f"batch at position {batch.position} is compressed with {codec.name.lower()}, "
            "which this broker does not store"
        )
    if header.records_count <= 0:
        raise CorruptRecordError(f"batch at position {batch.position} holds no records")
    if header.last_offset_delta != header.records_count - 1:
        raise CorruptRecordError(
            f"batch at position {batch.position}: last offset delta "
            f"{header.last_offset_delta} does not match {header.records_count} records"
        )
    if config.compact:
        # The cleaner decodes every record of a compacted log, and one batch it cannot
        # decode sets the partition aside for good (never compacted again until a
        # restart): so a compacted topic takes only batches whose records decode. Kafka's
        # LogValidator decodes the records of compacted topics at produce too. Other
        # topics keep the rule of storing batches undecoded (readers refuse a bad one).
        decode_batch(records, batch.position, validate=False)  # CRC checked already


def _io_error(exc: OSError, what: str) -> StorageError:
    """The storage error for a failed file operation: ``LogDirFullError`` (retriable) when
    the disk is full, else ``StorageError``, so the broker can tell a client to retry."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return LogDirFullError(f"{what}: no space left on the log directory's disk")
    return StorageError(f"{what}: {exc}")


def _next_base(bases: list[int], base: int) -> int:
    i = bases.index(base)
    return bases[i + 1] if i + 1 < len(bases) else 2**63 - 1


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
