"""The log cleaner: runs compaction rounds on partition logs and does their file work.

What a round cleans and keeps is planned by ``storage.compaction`` (the algorithm and its
Kafka sources are described there). ``LogCleaner`` is the file side, after Kafka's
``LogCleaner``/``LogCleanerManager``:

* ``clean_once(logs)`` (the cleaner thread's pass) picks the compacted log with the highest
  dirty ratio above its ``min.cleanable.dirty.ratio`` and cleans it; ``clean_log`` cleans
  one log now (tests, tools);
* a round snapshots the segment list, builds the offset map from the dirty segments, writes
  one ``.cleaned`` segment per group through ``compaction.clean_batch``, fsyncs each, and
  swaps all of them in with one ``PartitionLog.replace_segments`` call, so that a crash
  leaves the log entirely before or entirely after the round (``PartitionLog.open``
  discards or completes the swap); the round's cleaned output is on disk alongside the old
  segments until the swap;
* the first dirty offset of every partition is kept in ``<data_dir>/cleaner-offset-checkpoint``
  (Kafka's format, ``storage.checkpoint``), written after each swap, read on first use and
  reset to the log start offset when out of range;
* a log whose round fails is set aside until restart, as Kafka marks a partition
  uncleanable, so that one broken log cannot starve the others. A batch that does not
  decode (corrupt, or compressed past ``MAX_DECOMPRESSED_BYTES``) fails the round rather
  than be copied blindly: keeping an older value while its tombstone expires would bring a
  deleted key back. Every codec decodes; a rebuilt batch keeps its codec
  (``storage.compaction``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.storage.batch_times import BatchTimes
from tidelog.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offsets, write_offsets
from tidelog.storage.clock import Clock
from tidelog.storage.compaction import (
    OFFSET_MAP_ENTRY_BYTES,
    CleanableRange,
    CleaningRules,
    OffsetMap,
    SegmentSummary,
    TxnCleaning,
    add_batch_to_offset_map,
    choose_log_to_clean,
    clean_batch,
    compaction_delay_ms,
    group_segments,
    plan_cleanable_range,
)
from tidelog.storage.config import UNBOUNDED_MS
from tidelog.storage.errors import CorruptRecordError, StorageError
from tidelog.storage.index import OFFSET_ENTRY_BYTES, TIME_ENTRY_BYTES
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.partition_txns import collect_aborted
from tidelog.storage.records import (
    NO_TIMESTAMP,
    decode_batch,
    iter_batch_headers,
    read_header,
    split_whole_batches,
)
from tidelog.storage.segment import BatchPosition, Segment

__all__ = ["DEFAULT_DEDUPE_BUFFER_BYTES", "CleanResult", "LogCleaner", "summarize_segments"]

log = logging.getLogger(__name__)

# Kafka's log.cleaner.dedupe.buffer.size. The offset map grows on demand and is dropped
# after each round, so this is a ceiling on a round's peak, not memory held: a small log
# costs only its keys. At OFFSET_MAP_ENTRY_BYTES a key it allows about 760,000 keys a round;
# a log with more distinct dirty keys is cleaned over several rounds.
DEFAULT_DEDUPE_BUFFER_BYTES = 128 * 1024 * 1024
_READ_CHUNK_BYTES = 1024 * 1024  # how much of a segment to read at a time
_WRITE_CHUNK_BYTES = 1024 * 1024  # how much cleaned output to buffer before appending
_UNKNOWN_TIMES = BatchTimes()


def summarize_segments(segments: Sequence[Segment]) -> list[SegmentSummary]:
    """``SegmentSummary`` of each segment (oldest first; the last is treated as active)."""
    summaries: list[SegmentSummary] = []
    for i, segment in enumerate(segments):
        end = segments[i + 1].base_offset if i + 1 < len(segments) else segment.next_offset
        summaries.append(
            SegmentSummary(
                base_offset=segment.base_offset,
                end_offset=end,
                next_offset=segment.next_offset,
                size_bytes=segment.size_bytes,
                max_timestamp_ms=segment.max_timestamp_ms,
                offset_index_bytes=len(segment.offset_index) * OFFSET_ENTRY_BYTES,
                time_index_bytes=len(segment.time_index) * TIME_ENTRY_BYTES,
                first_batch_timestamp_ms=segment.first_batch_timestamp_ms,
            )
        )
    return summaries


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What one ``clean_log`` call did. Immutable.

    ``cleaned`` is True when cleaned segments were swapped in. ``end_offset`` is the first
    offset this round did not clean: the next round's first dirty offset (the first dirty
    offset itself when the round did nothing).
    ``replaced_base_offsets`` and ``new_base_offsets`` name the segments swapped out and in.
    """

    topic: str
    partition: int
    cleaned: bool
    first_dirty_offset: int
    first_uncleanable_offset: int
    dirty_ratio: float
    end_offset: int
    offset_map_full: bool = False
    replaced_base_offsets: tuple[int, ...] = ()
    new_base_offsets: tuple[int, ...] = ()
    bytes_before: int = 0
    bytes_after: int = 0
    records_read: int = 0
    records_retained: int = 0


class LogCleaner:
    """Compacts partition logs; one instance per data directory. Thread-safe.

    One lock serialises rounds and the checkpoint, so the cleaner thread and a test (or a
    tool) calling ``clean_log`` never clean the same log at once. A log whose round fails
    is skipped by ``clean_once`` until restart (Kafka's "uncleanable partitions"), so one
    broken log cannot starve the others; ``clean_log`` still tries it.
    """

    def __init__(
        self,
        data_dir: Path,
        clock: Clock,
        *,
        dedupe_buffer_bytes: int = DEFAULT_DEDUPE_BUFFER_BYTES,
    ) -> None:
        """``dedupe_buffer_bytes`` bounds the offset map (``OFFSET_MAP_ENTRY_BYTES`` a key).

        Raises ``ValueError`` if it cannot hold a single key. No file is read here; the
        checkpoint is loaded on first use.
        """
        if dedupe_buffer_bytes < OFFSET_MAP_ENTRY_BYTES:
            raise ValueError(
                f"dedupe_buffer_bytes {dedupe_buffer_bytes} cannot hold one offset map "
                f"entry ({OFFSET_MAP_ENTRY_BYTES} bytes)"
            )
        self.data_dir = data_dir
        self._clock = clock
        self._map_capacity = dedupe_buffer_bytes // OFFSET_MAP_ENTRY_BYTES
        self._lock = threading.Lock()
        self._offsets: dict[tuple[str, int], int] | None = None
        self._uncleanable: dict[tuple[str, int], PartitionLog] = {}

    # ------------------------------------------------------------------ public

    def clean_once(self, logs: Sequence[PartitionLog]) -> int:
        """Clean the dirtiest compacted log whose dirty ratio exceeds its minimum.

        Returns the number of logs cleaned (0 or 1). Checkpoint entries of partitions not
        in ``logs`` are dropped. A failure is logged and the log set aside; it never
        propagates (this runs on the cleaner thread).
        """
        with self._lock:
            offsets = self._load_offsets_locked()
            present = {(p.topic, p.partition) for p in logs}
            if any(tp not in present for tp in offsets):
                for tp in [tp for tp in offsets if tp not in present]:
                    del offsets[tp]
                self._write_offsets_locked()
            now_ms = self._clock.wall_ms()
            eligible: list[PartitionLog] = []
            candidates: list[tuple[CleanableRange, float, bool]] = []
            # Forget logs set aside that are gone (a deleted and re-created topic starts anew).
            self._uncleanable = {
                tp: p for tp, p in self._uncleanable.items() if any(p is q for q in logs)
            }
            for partition_log in logs:
                tp = (partition_log.topic, partition_log.partition)
                if not partition_log.config.compact or self._uncleanable.get(tp) is partition_log:
                    continue
                segments = list(partition_log.segments)
                if not segments:
                    continue  # deleted while we looked
                cleanable = self._plan(partition_log, segments, now_ms)
                eligible.append(partition_log)
                candidates.append(
                    (
                        cleanable,
                        partition_log.config.min_cleanable_dirty_ratio,
                        self._must_clean(partition_log, segments, cleanable, now_ms),
                    )
                )
            chosen = choose_log_to_clean(candidates)
            if chosen is None:
                return 0
            target = eligible[chosen]
            try:
                result = self._clean_locked(target, force=True)
            except Exception:
                # Any failure (I/O, corrupt or undecodable batches) sets this log aside, as
                # Kafka marks a partition uncleanable, so the others still get cleaned.
                log.exception("%s: compaction failed; not cleaning it again until restart", target)
                self._uncleanable[(target.topic, target.partition)] = target
                return 0
            return 1 if result.cleaned else 0

    def clean_log(self, partition_log: PartitionLog, *, force: bool = False) -> CleanResult:
        """Run one round on ``partition_log`` now.

        Without ``force`` the round runs only if the log is compacted and its dirty ratio
        exceeds ``min.cleanable.dirty.ratio``; with it, whatever its policy and ratio (an
        empty dirty range still rewrites the clean section, which expires tombstones).

        Raises:
            CorruptRecordError: a batch in the range is corrupt (or its records
                decompress past the limit); nothing was changed.
            StorageError, OSError: I/O failed; the log is as it was before the round.
        """
        with self._lock:
            return self._clean_locked(partition_log, force=force)

    # ------------------------------------------------------------------ one round

    def _plan(
        self, partition_log: PartitionLog, segments: list[Segment], now_ms: int
    ) -> CleanableRange:
        offsets = self._load_offsets_locked()
        tp = (partition_log.topic, partition_log.partition)
        checkpoint = offsets.get(tp)
        log_start = partition_log.log_start_offset
        log_end = segments[-1].next_offset
        # Retention moving the log start past the checkpoint is routine for compact,delete.
        if (
            checkpoint is not None
            and not log_start <= checkpoint <= log_end
            and not (checkpoint < log_start and partition_log.config.delete)
        ):
            log.warning(
                "%s: cleaner checkpoint %d is outside [%d, %d]; starting at the log start",
                partition_log,
                checkpoint,
                log_start,
                log_end,
            )
        return plan_cleanable_range(
            summarize_segments(segments),
            checkpoint_offset=checkpoint,
            log_start_offset=log_start,
            log_end_offset=log_end,
            now_ms=now_ms,
            min_compaction_lag_ms=partition_log.config.min_compaction_lag_ms,
            # Never at or beyond the last stable offset (at most the high watermark):
            # every transaction in the range is decided (``storage.compaction``).
            high_watermark=partition_log.last_stable_offset,
        )

    @staticmethod
    def _must_clean(
        partition_log: PartitionLog,
        segments: list[Segment],
        cleanable: CleanableRange,
        now_ms: int,
    ) -> bool:
        """Whether ``max.compaction.lag.ms`` has passed for the log's oldest dirty record."""
        lag = partition_log.config.max_compaction_lag_ms
        if lag >= UNBOUNDED_MS:
            return False
        delay = compaction_delay_ms(
            summarize_segments(segments), cleanable.first_dirty_offset, now_ms, lag
        )
        return delay > 0

    def _clean_locked(self, partition_log: PartitionLog, *, force: bool) -> CleanResult:
        config = partition_log.config
        now_ms = self._clock.wall_ms()
        segments = list(partition_log.segments)  # a snapshot; the last one is active
        if not segments:
            raise StorageError(f"{partition_log} has been deleted")
        cleanable = self._plan(partition_log, segments, now_ms)
        first_dirty = cleanable.first_dirty_offset
        first_uncleanable = cleanable.first_uncleanable_offset
        skipped = CleanResult(
            partition_log.topic,
            partition_log.partition,
            False,
            first_dirty,
            first_uncleanable,
            cleanable.dirty_ratio,
            first_dirty,
        )
        if not force and not (
            config.compact
            and cleanable.cleanable_bytes > 0
            and (
                cleanable.dirty_ratio > config.min_cleanable_dirty_ratio
                or self._must_clean(partition_log, segments, cleanable, now_ms)
            )
        ):
            return skipped

        try:
            return self._run_round(partition_log, segments, cleanable, now_ms, skipped)
        except (OSError, CorruptRecordError):
            if any(segment.deleted for segment in segments[:-1]):
                # Retention deleted segments under this round and their files are gone:
                # a benign race (replace_segments would have refused the swap anyway).
                log.info("%s: segments deleted while cleaning; round abandoned", partition_log)
                return skipped
            raise

    def _run_round(
        self,
        partition_log: PartitionLog,
        segments: list[Segment],
        cleanable: CleanableRange,
        now_ms: int,
        skipped: CleanResult,
    ) -> CleanResult:
        """Offset map, rewrite, swap and checkpoint for a planned round."""
        config = partition_log.config
        first_dirty = cleanable.first_dirty_offset
        first_uncleanable = cleanable.first_uncleanable_offset

        # 1. The offset map over [first dirty, first uncleanable), without aborted data.
        offset_map = OffsetMap(self._map_capacity)
        full = False
        map_txns: TxnCleaning | None = None
        for segment in segments[:-1]:
            if full or segment.base_offset >= first_uncleanable:
                break
            if segment.next_offset <= first_dirty:
                continue
            if map_txns is None:
                map_txns = TxnCleaning(
                    collect_aborted(segments, segment.base_offset, first_uncleanable)
                )
            for batch in _iter_segment_batches(segment):
                header, records = decode_batch(batch)
                # Every batch, in order: the verdicts depend on the batches before.
                aborted = map_txns.on_batch(header, records).discard_data
                if header.last_offset < first_dirty:
                    continue
                if add_batch_to_offset_map(
                    offset_map, header, records, first_dirty, aborted=aborted
                ):
                    full = True
                    break
        map_end = offset_map.end_offset(first_dirty)

        # 2. Which segments to rewrite, grouped.
        old = [s for s in segments[:-1] if s.base_offset < map_end]
        if not old:
            return skipped
        summaries = summarize_segments([*old, segments[len(old)]])[:-1]
        groups = group_segments(
            summaries,
            max_segment_bytes=config.segment_bytes,
            max_index_bytes=config.segment_index_bytes,
        )
        rules = CleaningRules(
            offset_map=offset_map,
            map_end_offset=map_end,
            round_end_offset=old[-1].next_offset,
            now_ms=now_ms,
            delete_retention_ms=config.delete_retention_ms,
            max_batch_bytes=config.max_message_bytes,
            producer_last_offset=partition_log.producer_last_offset,
            transactions=TxnCleaning(
                collect_aborted(segments, old[0].base_offset, old[-1].next_offset)
            ),
        )

        # 3. Write and fsync one .cleaned segment per group, then swap them all in at once.
        new: list[Segment] = []
        records_read = records_retained = 0
        try:
            for start, stop in groups:
                group = old[start:stop]
                cleaned, read, retained = _write_cleaned_segment(partition_log, group, rules)
                new.append(cleaned)
                records_read += read
                records_retained += retained
        except BaseException:
            for segment in new:
                segment.delete_files()
            raise
        swapped = partition_log.replace_segments(new, old)
        result = CleanResult(
            partition_log.topic,
            partition_log.partition,
            swapped,
            first_dirty,
            first_uncleanable,
            cleanable.dirty_ratio,
            map_end,
            offset_map_full=full,
            replaced_base_offsets=tuple(s.base_offset for s in old),
            new_base_offsets=tuple(s.base_offset for s in new),
            bytes_before=sum(s.size_bytes for s in old),
            bytes_after=sum(s.size_bytes for s in new),
            records_read=records_read,
            records_retained=records_retained,
        )
        if not swapped:
            log.info("%s: segments changed while cleaning; round abandoned", partition_log)
            return result
        offsets = self._load_offsets_locked()
        offsets[(partition_log.topic, partition_log.partition)] = map_end
        self._write_offsets_locked()
        log.info(
            "%s: cleaned offsets [%d, %d) (dirty ratio %.2f%s): %d segment(s) of %d bytes "
            "into %d of %d bytes, %d of %d records kept",
            partition_log,
            old[0].base_offset,
            map_end,
            cleanable.dirty_ratio,
            ", offset map full" if full else "",
            len(old),
            result.bytes_before,
            len(new),
            result.bytes_after,
            records_retained,
            records_read,
        )
        return result

    # ------------------------------------------------------------------ checkpoint

    def _load_offsets_locked(self) -> dict[tuple[str, int], int]:
        if self._offsets is None:
            path = self.data_dir / CLEANER_OFFSET_CHECKPOINT
            try:
                self._offsets = read_offsets(path)
            except (OSError, ValueError) as exc:
                # Losing it only means the next rounds treat whole logs as dirty.
                log.warning("ignoring unreadable cleaner checkpoint %s: %s", path, exc)
                self._offsets = {}
        return self._offsets

    def _write_offsets_locked(self) -> None:
        write_offsets(self.data_dir / CLEANER_OFFSET_CHECKPOINT, self._load_offsets_locked())


def _write_cleaned_segment(
    partition_log: PartitionLog, group: Sequence[Segment], rules: CleaningRules
) -> tuple[Segment, int, int]:
    """Copy ``group`` through ``clean_batch`` into one fsynced ``.cleaned`` segment.

    Returns the segment and the records read and kept. On any error the ``.cleaned``
    files are removed and the error propagates.
    """
    cleaned = partition_log.new_cleaned_segment(group[0].base_offset)
    read = retained = 0
    try:
        pending = bytearray()
        positions: list[BatchPosition] = []
        times: list[BatchTimes] = []
        for segment in group:
            # Each surviving batch keeps its sent/received times (found by its original
            # last offset; a batch without an entry stays without times).
            known_times = segment.batch_times.times_by_last_offset()
            for batch in _iter_segment_batches(segment):
                output = clean_batch(batch, rules)
                original = read_header(batch)
                read += original.records_count
                if output is None:
                    continue
                header = read_header(output)
                retained += header.records_count
                positions.append(BatchPosition(len(pending), header))
                times.append(known_times.get(original.last_offset, _UNKNOWN_TIMES))
                pending += output
                if len(pending) >= _WRITE_CHUNK_BYTES:
                    cleaned.append(pending, positions, times)
                    pending = bytearray()
                    positions = []
                    times = []
        if pending:
            cleaned.append(pending, positions, times)
        # An ABORT marker kept because its data is still there keeps its index entry
        # (``storage.compaction``); the group's batches were all seen by now.
        carried = rules.transactions.carried
        for segment in group:
            for entry in segment.txn_index.entries:
                if entry.last_offset in carried:
                    cleaned.txn_index.append(entry)
        cleaned.write_pending()
        cleaned.fsync()
        # Keep the replaced segments' age (Kafka copies the newest one's mtime): retention
        # falls back to it for a segment left without batches, and must not see it as new.
        newest_ms = max(
            s.max_timestamp_ms if s.max_timestamp_ms != NO_TIMESTAMP else s.created_ms
            for s in group
        )
        if newest_ms >= 0:
            os.utime(cleaned.log_path, ns=(newest_ms * 1_000_000, newest_ms * 1_000_000))
            cleaned.created_ms = newest_ms
    except BaseException:
        cleaned.delete_files()
        raise
    log.debug(
        "%s: cleaned segments %s into %s (%d of %d records kept)",
        partition_log,
        [s.base_offset for s in group],
        cleaned,
        retained,
        read,
    )
    return cleaned, read, retained


def _iter_segment_batches(segment: Segment) -> Iterator[bytes]:
    """The bytes of each batch of a non-active segment, read about 1 MiB at a time.

    Raises ``CorruptRecordError`` at a partial or badly framed batch.
    """
    size = segment.size_bytes
    position = 0
    while position < size:
        chunk = segment.read_range(position, min(size, position + _READ_CHUNK_BYTES))
        whole = split_whole_batches(chunk)
        if whole == 0:
            # One batch larger than the chunk: read exactly that batch.
            header = read_header(chunk, 0, whole=False)
            if position + header.size_bytes > size:
                raise CorruptRecordError(
                    f"segment {segment.log_path}: batch at position {position} runs past the end"
                )
            chunk = segment.read_range(position, position + header.size_bytes)
            whole = split_whole_batches(chunk)
            if whole == 0:
                raise CorruptRecordError(
                    f"segment {segment.log_path}: unreadable batch at position {position}"
                )
        for batch_position, header in iter_batch_headers(memoryview(chunk)[:whole], validate=False):
            yield chunk[batch_position : batch_position + header.size_bytes]
        position += whole
