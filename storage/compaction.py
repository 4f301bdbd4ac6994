"""Compaction as a pure plan: what a log cleaner round cleans and which records it keeps.

Sources: ``core/LogCleaner.scala`` / ``log/Cleaner.java`` (``doClean``, ``buildOffsetMap``,
``groupSegmentsBySize``, ``cleanInto``, ``shouldRetainRecord``), ``LogCleanerManager.scala``
(``cleanableOffsets``, ``grabFilthiestCompactedLog``), ``rec/MemoryRecords.java``
(``filterTo``: delete horizon, empty batches) and ``LocalLog.replaceSegments`` (the swap);
summarised in ``reference/kafka-internals.md`` section 3.4.

A compacted log is a *clean* prefix (compacted before) and a *dirty* suffix. One round:

1. **Plan** (``plan_cleanable_range``). The first dirty offset comes from
   ``cleaner-offset-checkpoint`` (the log start offset if missing or out of range). The
   first uncleanable offset is the smaller of the active segment's base offset and the base
   offset of the first dirty segment whose largest timestamp is newer than
   ``now - min.compaction.lag.ms``. Dirty ratio = cleanable bytes / (clean + cleanable
   bytes); ``clean_once`` cleans the log with the highest ratio above
   ``min.cleanable.dirty.ratio``.
2. **Offset map** (``OffsetMap``, ``add_batch_to_offset_map``): scan the dirty range and
   map the MD5 digest of every key to its latest offset. The map is bounded by
   ``dedupe_buffer_bytes``; when it fills, the scan stops mid-batch as Kafka's does and
   this round only cleans up to ``map.end_offset`` (the next round continues from there).
3. **Rewrite** (``group_segments``, ``clean_batch``): every non-active segment holding an
   offset below the map's end is copied, in groups whose total size stays within
   ``segment.bytes`` (and index size within ``segment.index.bytes``), into one ``.cleaned``
   segment per group named after the group's first base offset. Per record
   (``should_retain_record``): keep it if its offset is at or past the map's end; otherwise
   keep it only if it has a key, its offset is at least the map's offset for that key, and
   it has a value or is a tombstone whose batch's delete horizon has not passed. Surviving
   records keep their offsets; a rebuilt batch keeps its base offset, last offset delta
   (so sequence numbers stay continuous, ``MemoryRecordsBuilder.overrideLastOffset``),
   codec, timestamp type, producer id, epoch, base sequence and leader epoch. A batch with
   nothing dropped is copied byte for byte. The first cleaning that keeps a tombstone sets
   its batch's delete horizon to ``now + delete.retention.ms``; a later cleaning drops the
   tombstone once ``now >= horizon``. A batch left empty is dropped unless it is the last
   batch of a producer still in the partition's producer state (its sequence numbers must
   survive) or the last batch of the round (Kafka's ``upperBoundOffsetOfCleaningRound``:
   the cleaned range keeps its end offset, which is what makes the crash recovery below
   exact).
4. **Swap**: each ``.cleaned`` segment is written and fsynced, then all of them are swapped
   in with one ``PartitionLog.replace_segments`` call (``.cleaned`` -> ``.swap`` -> old
   segments ``.deleted`` -> strip ``.swap``), and the checkpoint moves to the map's end.
   ``PartitionLog.open`` discards a swap that crashed before every ``.swap`` existed and
   completes one that crashed after. One call for the whole round, rather than Kafka's one
   per group, means a crash leaves the log either entirely before or entirely after the
   round, at the cost of holding the round's cleaned output on disk until the swap.

**Transactions** (Kafka's cleaner rules, reference ``transactions.md`` section 8):

* Nothing at or beyond the last stable offset is cleaned (the planner's bound is the LSO,
  which is at most the high watermark), so every transaction the cleaner sees is decided
  and the aborted ones are known from the ``.txnindex`` in advance.
* ``TxnCleaning`` walks a pass's batches in offset order with the aborted transactions
  (sorted by first offset): a transactional data batch of a producer whose aborted
  transaction has begun and whose ABORT marker has not been passed yet belongs to that
  aborted transaction. Its records are dropped whatever their keys, and never enter the
  offset map: a committed or plain record is never shadowed by an aborted one. Such a
  batch left empty is still kept when it is its producer's last batch.
* Control batches are never compacted by key. A marker is kept whole while the pass still
  sees a data batch of its transaction; once none is left, the next pass gives it a
  delete horizon (``now + delete.retention.ms``, the tombstone rule), and a pass after the
  horizon drops it (Kafka's ``shouldDiscardBatch``). An ABORT marker kept with data still
  there has its ``.txnindex`` entry carried into the cleaned segment; one whose data is
  gone loses its entry (readers have nothing left to filter). A pass covers the log from
  its start, so "no data seen" means none is left. The round's last batch is never
  dropped (the round's end offset), a marker there waits for a later round.

This module holds the decisions of steps 1-3, on integers, batch bytes and records only;
``storage.cleaner.LogCleaner`` reads and writes the files and does step 4. Thread-safe
(pure functions and immutable values) except ``OffsetMap``, which one round owns.
``clean_batch`` raises for a batch it cannot decode (corrupt, or compressed past
``MAX_DECOMPRESSED_BYTES``), so such a round fails rather than copy it blindly: keeping an
older value while its tombstone expires would bring a deleted key back.

**Codecs.** Every codec decodes (``storage.compression``), and a rebuilt batch is
compressed again with the codec it came in (gzip, snappy, lz4, zstd or none), as Kafka's
cleaner does (``MemoryRecords.filterTo`` builds with the original batch's compression
type). Not lz4 or none for all: the topic's readers chose their clients for the codec
they produce, so a cleaned batch needs nothing a fresh one did not (an old librdkafka or
kafka-python without lz4 still reads it); and a rebuilt batch stays about the size it
was, so it still fits ``max.message.bytes``. Snappy is rewritten in xerial framing (what
Java writes) even if a raw block came in: every client reads it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidelog.storage.batch_builder import builder_like
from tidelog.storage.control import is_marker_batch, parse_marker
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.records import (
    NO_PRODUCER_ID,
    BatchHeader,
    Record,
    TimestampType,
    decode_batch,
)
from tidelog.storage.txn_index import AbortedTxn

__all__ = [
    "OFFSET_MAP_ENTRY_BYTES",
    "CleanableRange",
    "CleaningRules",
    "OffsetMap",
    "SegmentSummary",
    "TxnCleaning",
    "TxnVerdict",
    "add_batch_to_offset_map",
    "choose_log_to_clean",
    "clean_batch",
    "group_segments",
    "plan_cleanable_range",
    "should_retain_record",
]

log = logging.getLogger(__name__)

# What one offset map entry costs in CPython 3.11, measured with tracemalloc: a 16-byte
# digest (49 B) and an int offset (32 B) plus the dict's slot and index; 127-145 B once the
# dict settles, 175 B at the peak of a resize (old and new tables coexist). Kafka's map
# needs 24 B an entry; Python pays about seven times that.
OFFSET_MAP_ENTRY_BYTES = 176
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """What planning needs to know of one segment. Immutable.

    ``end_offset`` is where the segment's offset range ends: the next segment's base
    offset, or for the last (active) segment its next offset. ``next_offset`` is one past
    its last batch (below ``end_offset`` when compaction removed its tail).
    """

    base_offset: int
    end_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp_ms: int
    offset_index_bytes: int = 0
    time_index_bytes: int = 0
    first_batch_timestamp_ms: int = -1  # its first batch's max timestamp (-1: none)


@dataclass(frozen=True, slots=True)
class CleanableRange:
    """The dirty section of a log that can be cleaned now. Immutable.

    ``[first_dirty_offset, first_uncleanable_offset)`` is cleanable (empty when the first
    is not below the second); ``clean_bytes`` and ``cleanable_bytes`` are the sizes of the
    segments overlapping ``[0, first_dirty_offset)`` and the cleanable range (a segment
    straddling the first dirty offset counts in both, as in Kafka's ``LogToClean``).
    """

    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int

    @property
    def dirty_ratio(self) -> float:
        """cleanable / (clean + cleanable) bytes; 0.0 for an empty log."""
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0


def plan_cleanable_range(
    segments: Sequence[SegmentSummary],
    *,
    checkpoint_offset: int | None,
    log_start_offset: int,
    log_end_offset: int,
    now_ms: int,
    min_compaction_lag_ms: int,
    high_watermark: int | None = None,
) -> CleanableRange:
    """Kafka's ``LogCleanerManager.cleanableOffsets`` plus ``LogToClean``'s byte counts.

    ``segments`` are all of the log's segments, oldest first, the active one last.
    ``checkpoint_offset`` (the last round's end, None if there was none) is used as the
    first dirty offset only if it lies in ``[log_start_offset, log_end_offset]``; else the
    log start offset is. ``high_watermark`` (replicated logs): a segment holding offsets
    at or above it is not cleaned, so compaction never rewrites what followers may still
    truncate. Raises ``ValueError`` for an empty ``segments``.
    """
    if not segments:
        raise ValueError("a log has at least one (active) segment")
    if checkpoint_offset is None or not log_start_offset <= checkpoint_offset <= log_end_offset:
        first_dirty = log_start_offset
    else:
        first_dirty = checkpoint_offset
    first_uncleanable = segments[-1].base_offset  # the active segment is never cleaned
    if high_watermark is not None:
        for segment in segments[:-1]:
            if segment.end_offset > high_watermark:
                first_uncleanable = min(first_uncleanable, segment.base_offset)
                break
    if min_compaction_lag_ms > 0:
        newest_cleanable_ms = now_ms - min_compaction_lag_ms
        for segment in segments[:-1]:
            if segment.end_offset <= first_dirty:
                continue  # wholly clean; the lag applies to dirty segments only
            if segment.max_timestamp_ms > newest_cleanable_ms:
                first_uncleanable = min(first_uncleanable, segment.base_offset)
                break
    clean_bytes = sum(s.size_bytes for s in segments if s.base_offset < first_dirty)
    low = min(first_dirty, first_uncleanable)
    cleanable_bytes = sum(
        s.size_bytes for s in segments if s.base_offset < first_uncleanable and s.end_offset > low
    )
    return CleanableRange(first_dirty, first_uncleanable, clean_bytes, cleanable_bytes)


def compaction_delay_ms(
    segments: Sequence[SegmentSummary],
    first_dirty_offset: int,
    now_ms: int,
    max_compaction_lag_ms: int,
) -> int:
    """How long past ``max.compaction.lag.ms`` the log's oldest dirty record is (Kafka's
    ``LogCleanerManager.maxCompactionDelay``, KIP-354): above 0, the log must be cleaned
    whatever its dirty ratio. The oldest dirty record's time is the earliest first-batch
    timestamp of the dirty segments before the active one (those without a timestamp
    are passed over)."""
    times = [
        s.first_batch_timestamp_ms
        for s in segments[:-1]
        if s.end_offset > first_dirty_offset and s.first_batch_timestamp_ms > 0
    ]
    if not times:
        return 0
    clean_until = now_ms - max(max_compaction_lag_ms, 0)
    earliest = min(times)
    return clean_until - earliest if earliest < clean_until else 0


def choose_log_to_clean(
    candidates: Sequence[tuple[CleanableRange, float, bool]],
) -> int | None:
    """Index of the dirtiest eligible ``(range, min_cleanable_dirty_ratio, must_clean)``,
    or None.

    Eligible: some cleanable bytes, and a dirty ratio strictly above the log's minimum or
    ``must_clean`` (its ``compaction_delay_ms`` is above 0); Kafka's
    ``grabFilthiestCompactedLog``. Ties go to the first candidate.
    """
    best: int | None = None
    best_ratio = -1.0
    for i, (cleanable, min_ratio, must_clean) in enumerate(candidates):
        ratio = cleanable.dirty_ratio
        eligible = cleanable.cleanable_bytes > 0 and (ratio > min_ratio or must_clean)
        if eligible and ratio > best_ratio:
            best, best_ratio = i, ratio
    return best


def group_segments(
    segments: Sequence[SegmentSummary], *, max_segment_bytes: int, max_index_bytes: int
) -> list[tuple[int, int]]:
    """Split consecutive segments into groups, each rewritten into one segment.

    Returns half-open index ranges ``(start, stop)`` covering ``segments`` in order. A
    group grows while its total log size stays within ``max_segment_bytes``, each index's
    total within ``max_index_bytes``, and its offsets within int32 of the first base
    offset (relative offsets in the index). A group always holds at least one segment.
    (``Cleaner.groupSegmentsBySize``.)
    """
    groups: list[tuple[int, int]] = []
    start = 0
    while start < len(segments):
        first = segments[start]
        size = first.size_bytes
        offset_index = first.offset_index_bytes
        time_index = first.time_index_bytes
        stop = start + 1
        while stop < len(segments):
            candidate = segments[stop]
            if (
                size + candidate.size_bytes > max_segment_bytes
                or offset_index + candidate.offset_index_bytes > max_index_bytes
                or time_index + candidate.time_index_bytes > max_index_bytes
                or (
                    candidate.size_bytes > 0
                    and candidate.end_offset - 1 - first.base_offset > _INT32_MAX
                )
            ):
                break
            size += candidate.size_bytes
            offset_index += candidate.offset_index_bytes
            time_index += candidate.time_index_bytes
            stop += 1
        groups.append((start, stop))
        start = stop
    return groups


class OffsetMap:
    """Key -> latest offset over the dirty range, bounded in entries. Not thread-safe.

    Keys are stored as their 16-byte MD5 digest, as Kafka's ``SkimpyOffsetMap`` does, so an
    entry costs the same whatever the key's length. Two keys with the same digest would
    share an entry; for MD5 over keys that nobody crafts to collide that risk is
    negligible, and Kafka accepts the same one.
    """

    __slots__ = ("_entries", "capacity", "latest_offset")

    def __init__(self, capacity: int) -> None:
        """``capacity``: the most distinct keys the map may hold (>= 1, else ValueError)."""
        if capacity < 1:
            raise ValueError(f"an offset map needs room for at least one key, got {capacity}")
        self.capacity = capacity
        self.latest_offset = -1
        self._entries: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: bytes, offset: int) -> bool:
        """Map ``key`` to ``offset``; False (nothing changed) if the key is new and the map full."""
        digest = hashlib.md5(key, usedforsecurity=False).digest()
        entries = self._entries
        if digest not in entries and len(entries) >= self.capacity:
            return False
        entries[digest] = offset
        self.latest_offset = offset
        return True

    def get(self, key: bytes) -> int:
        """The latest offset mapped for ``key``, or -1."""
        return self._entries.get(hashlib.md5(key, usedforsecurity=False).digest(), -1)

    def end_offset(self, first_dirty_offset: int) -> int:
        """One past the last offset the map covers (``first_dirty_offset`` if it covers none).

        Records below it are judged against the map; records at or past it are kept.
        """
        return max(self.latest_offset + 1, first_dirty_offset)


@dataclass(frozen=True, slots=True)
class TxnVerdict:
    """What ``TxnCleaning.on_batch`` decided for one batch."""

    discard_data: bool  # a data batch of an aborted transaction: drop its records
    marker_removable: bool  # a marker whose transaction has no data left in the log


_KEEP = TxnVerdict(False, False)


class TxnCleaning:
    """The transactional half of one pass over the log (Kafka's
    ``CleanedTransactionMetadata``). Feed it every batch of the pass, in offset order.

    ``aborted``: the ``.txnindex`` entries overlapping the pass
    (``storage.partition_txns.collect_aborted``). A producer joins the aborted set when a
    batch reaches its aborted transaction's first offset and leaves it at its ABORT marker;
    its transactional data batches in between are aborted data. A marker is removable when
    the pass saw no data batch of its transaction (all of it was removed by earlier passes);
    an ABORT marker kept with data still present has its index entry carried into the
    cleaned segment (``carried``, by marker offset). Not thread-safe; one pass owns it.
    """

    def __init__(self, aborted: Sequence[AbortedTxn] = ()) -> None:
        self._pending = sorted(aborted, key=lambda t: t.first_offset, reverse=True)
        # Producer -> [its aborted transaction's entry, whether the pass saw its data].
        self._aborted: dict[int, list[Any]] = {}
        self._committed: set[int] = set()  # producers whose open data the pass saw
        self.carried: set[int] = set()

    def on_batch(self, header: BatchHeader, records: Sequence[Record]) -> TxnVerdict:
        """The verdict for the next batch of the pass."""
        while self._pending and self._pending[-1].first_offset <= header.last_offset:
            entry = self._pending.pop()
            self._aborted[entry.producer_id] = [entry, False]
        pid = header.producer_id
        if header.is_control:
            if not is_marker_batch(header):
                return _KEEP
            if not records:
                return TxnVerdict(False, True)  # emptied before: nothing to keep
            try:
                marker = parse_marker(records[0].key, records[0].value)
            except CorruptRecordError:
                marker = None
            if marker is None:
                return _KEEP
            if marker.commit:
                saw_data = pid in self._committed
                self._committed.discard(pid)
                return TxnVerdict(False, not saw_data)
            aborted = self._aborted.pop(pid, None)
            if aborted is not None and aborted[1]:
                self.carried.add(header.base_offset)
                return _KEEP
            return TxnVerdict(False, True)
        if not header.is_transactional:
            return _KEEP
        aborted = self._aborted.get(pid)
        if aborted is not None:
            aborted[1] = True
            return TxnVerdict(True, False)
        self._committed.add(pid)
        return _KEEP


def add_batch_to_offset_map(
    offset_map: OffsetMap,
    header: BatchHeader,
    records: Sequence[Record],
    start_offset: int,
    *,
    aborted: bool = False,
) -> bool:
    """Add the keyed records at or after ``start_offset`` of one batch to the map.

    Returns True if the map filled up before the batch was done: the map then covers the
    records up to the last one it took, and the round stops there
    (``Cleaner.buildOffsetMapForSegment``). Control batches and ``aborted`` batches (of
    an aborted transaction, ``TxnCleaning``) add nothing.
    """
    if not header.is_control and not aborted:
        for record in records:
            if (
                record.key is not None
                and record.offset >= start_offset
                and not offset_map.put(record.key, record.offset)
            ):
                return True
    if header.last_offset >= start_offset:
        # Also covers keyless records and batches emptied by an earlier round.
        offset_map.latest_offset = header.last_offset
    return False


def should_retain_record(
    record: Record,
    *,
    offset_map: OffsetMap,
    map_end_offset: int,
    delete_horizon_ms: int | None,
    now_ms: int,
) -> bool:
    """Kafka's ``shouldRetainRecord`` for a v2 batch with horizon ``delete_horizon_ms``.

    Keep a record at or past the map's end. Below it, keep a keyed record that is the
    latest of its key (or whose key the map does not know: the clean section was
    deduplicated already) if it has a value, or if it is a tombstone and its batch has no
    delete horizon yet or ``now_ms`` is before it. Drop keyless records.
    """
    if record.offset >= map_end_offset:
        return True
    if record.key is None:
        return False
    if record.offset < offset_map.get(record.key):
        return False
    if record.value is not None:
        return True
    return delete_horizon_ms is None or now_ms < delete_horizon_ms


def _no_active_producer(producer_id: int) -> int | None:
    return None


@dataclass(frozen=True, slots=True)
class CleaningRules:
    """Everything the per-batch decisions of one round need. Immutable once built.

    ``producer_last_offset(pid)`` answers the last offset of producer ``pid``'s last batch
    if the partition's producer state still knows it, else None. ``round_end_offset`` is
    the next offset of the last batch being rewritten. ``max_batch_bytes`` caps a rebuilt
    batch that grew (see ``clean_batch``). ``transactions``: the pass's
    ``TxnCleaning``, stateful, so ``clean_batch`` must see every batch of the round in
    order (the default knows no aborted transaction).
    """

    offset_map: OffsetMap
    map_end_offset: int
    round_end_offset: int
    now_ms: int
    delete_retention_ms: int
    max_batch_bytes: int
    producer_last_offset: Callable[[int], int | None] = _no_active_producer
    transactions: TxnCleaning = field(default_factory=TxnCleaning)


def clean_batch(batch: bytes, rules: CleaningRules) -> bytes | None:
    """Compact one stored batch: the bytes to write in its place, or None to drop it.

    Returns ``batch`` itself when every record stays and no delete horizon needs setting.
    Otherwise rebuilds it with the surviving records at their offsets (see the module
    docstring for what a rebuilt batch keeps). A tombstone kept in a batch without a
    horizon gives it ``now + delete.retention.ms``; an existing horizon is kept. An empty
    result is kept, as an empty batch, only for the last batch of an active producer or
    of the round.

    Setting a horizon re-encodes timestamp deltas against it, which can grow a batch by a
    few bytes per record. A rebuilt batch larger than both the original and
    ``rules.max_batch_bytes`` (``max.message.bytes``) is not written: no other path stores
    a batch over that limit, and ``Segment.recover`` treats one as damage when handed the
    topic's limit. The batch is kept unchanged instead, with a warning (Kafka writes it and
    warns); its tombstones then wait for a round that can rebuild it.

    Raises ``CorruptRecordError`` for a bad batch (records compressed past the limit too).
    """
    header, records = decode_batch(batch)
    verdict = rules.transactions.on_batch(header, records)
    if header.is_control:
        return _clean_marker(batch, header, records, verdict, rules)
    aborted = verdict.discard_data
    horizon = header.delete_horizon_ms
    kept = [
        record
        for record in records
        if not aborted
        and should_retain_record(
            record,
            offset_map=rules.offset_map,
            map_end_offset=rules.map_end_offset,
            delete_horizon_ms=horizon,
            now_ms=rules.now_ms,
        )
    ]
    if not kept:
        # Also drops a batch an earlier round left empty once it stops mattering.
        last_of_producer = (
            header.producer_id != NO_PRODUCER_ID
            and rules.producer_last_offset(header.producer_id) == header.last_offset
        )
        if not (last_of_producer or header.next_offset == rules.round_end_offset):
            return None
    needs_horizon = horizon is None and any(record.value is None for record in kept)
    if len(kept) == len(records) and not needs_horizon:
        return batch
    if needs_horizon:
        horizon = rules.now_ms + rules.delete_retention_ms
    append_time = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    # Deltas against the original base timestamp (the horizon, if set) keep every
    # surviving record's encoding, so a batch only grows when a horizon is added.
    builder = builder_like(header, header.compression)
    base_offset = header.base_offset
    for record in kept:
        builder.append(
            # A LogAppendTime batch's records all read as its max timestamp.
            header.max_timestamp if append_time else record.timestamp_ms,
            record.key,
            record.value,
            record.headers,
            offset_delta=record.offset - base_offset,
        )
    rebuilt = builder.build(
        last_offset_delta=header.last_offset_delta,
        delete_horizon_ms=horizon,
        max_timestamp_ms=header.max_timestamp if not kept or append_time else None,
    )
    if len(rebuilt) > max(len(batch), rules.max_batch_bytes):
        log.warning(
            "batch at offset %d: cleaned it would be %d bytes, over max.message.bytes %d; "
            "keeping it uncleaned",
            base_offset,
            len(rebuilt),
            rules.max_batch_bytes,
        )
        return batch
    return rebuilt


def _clean_marker(
    batch: bytes,
    header: BatchHeader,
    records: Sequence[Record],
    verdict: TxnVerdict,
    rules: CleaningRules,
) -> bytes | None:
    """A control batch: kept whole until its transaction has no data left, then given a
    delete horizon (``now + delete.retention.ms``, as a tombstone), then dropped once the
    horizon has passed. The round's last batch is kept whole (its offset ends the round)."""
    if not verdict.marker_removable:
        return batch
    horizon = header.delete_horizon_ms
    if horizon is None:
        if not records:
            return batch if header.next_offset == rules.round_end_offset else None
        builder = builder_like(header, header.compression)
        for record in records:
            builder.append(
                record.timestamp_ms,
                record.key,
                record.value,
                record.headers,
                offset_delta=record.offset - header.base_offset,
            )
        return builder.build(
            last_offset_delta=header.last_offset_delta,
            delete_horizon_ms=rules.now_ms + rules.delete_retention_ms,
            max_timestamp_ms=header.max_timestamp,
        )
    if rules.now_ms >= horizon and header.next_offset != rules.round_end_offset:
        return None
    return batch
