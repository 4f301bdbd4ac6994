"""The partition side of transactions: markers, the last stable offset, aborted transactions.

``PartitionLog`` stays the owner of the lock and the segments; this module holds what it
does for transactions (Kafka's ``UnifiedLog`` append path for control batches,
``LocalLog.collectAbortedTransactions`` and ``LogSegment.recover``'s producer-state replay),
as functions it calls under its lock:

* ``apply_batches``: after batches were written to a segment, move the producer state
  (``ProducerStateTable``): data batches open transactions, each end-transaction marker
  ends one; an ABORT that ended a transaction adds an entry to the ``.txnindex`` of the
  segment holding the marker (``storage.txn_index``), whose ``last_stable_offset`` is
  Kafka's: the oldest open transaction of another producer, else the marker's offset + 1.
  Leader appends, follower appends and recovery all go through it, so the three agree.
* ``last_stable_offset``: min(first unstable offset, high watermark); the high watermark
  when there are no transactions; never below the log start offset.
* ``collect_aborted``: Kafka's fetch rule. From the segment holding ``fetch_offset``, the
  entries with ``last_offset >= fetch_offset`` and ``first_offset < upper_bound``, going on
  into later segments until an entry's ``last_stable_offset >= upper_bound``.
* ``replay``: rebuild the producer state from a snapshot's offset to the log end, reading
  only batch headers, and for each control batch its one record (the marker type is in the
  record's key); from ``index_from`` on, the ``.txnindex`` entries are rebuilt too (the
  segments recovery revalidated, or whose index was damaged).

Decisions:

* A marker for a producer with no open transaction here (an empty transaction, or a
  retried marker) is stored in the log as Kafka stores it, changes no transaction and adds
  no index entry; the producer's epoch and coordinator epoch still move to the marker's.
* A control batch whose record does not decode, or holds another control record type (2-6,
  never written here), ends nothing; recovery logs the former and goes on (the batch's CRC
  was checked by recovery; a damaged one was cut).

Not thread-safe: every function runs under the owning ``PartitionLog``'s lock, or on a log
no other thread holds yet (``storage.log_loader``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tidelog.storage.control import EndTxnMarker, is_marker_batch, read_marker
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.producer_state import CompletedTxn, ProducerStateTable
from tidelog.storage.records import BatchHeader
from tidelog.storage.segment import BatchPosition, Segment
from tidelog.storage.txn_index import AbortedTxn

__all__ = [
    "apply_batches",
    "apply_marker",
    "collect_aborted",
    "last_stable_offset",
    "replay",
]

log = logging.getLogger(__name__)


def apply_marker(
    state: ProducerStateTable,
    segment: Segment | None,
    header: BatchHeader,
    marker: EndTxnMarker,
) -> CompletedTxn | None:
    """Record the marker batch ``header`` (stored in ``segment``); the transaction it ended.

    An ABORT that ended a transaction is indexed in ``segment`` (None: not indexed, for a
    replay over a segment whose entries are intact).
    """
    completed = state.complete_txn(
        header.producer_id,
        header.producer_epoch,
        marker.coordinator_epoch,
        header.base_offset,
        commit=marker.commit,
        timestamp_ms=header.max_timestamp,
    )
    if completed is not None and completed.aborted and segment is not None:
        segment.txn_index.append(
            AbortedTxn(
                completed.producer_id,
                completed.first_offset,
                completed.last_offset,
                state.last_stable_offset_of(completed),
            )
        )
    return completed


def apply_batches(
    state: ProducerStateTable,
    segment: Segment,
    records: bytes | bytearray | memoryview,
    batches: Sequence[BatchPosition],
    now_ms: int,
) -> None:
    """Move ``state`` past ``batches`` just written to ``segment``; ``records`` holds their
    bytes at the batches' positions (a control batch's record is read from there).

    Data batches are recorded at ``now_ms`` (the broker's time, as the idempotence state
    always was). A marker whose record does not decode (its CRC was checked) ends nothing
    and is logged: the batches are stored already, and raising would leave the producer
    state behind the log.
    """
    for batch in batches:
        header = batch.header
        if is_marker_batch(header):
            try:
                marker = read_marker(records, batch.position)
            except CorruptRecordError as exc:
                log.warning("unreadable marker at offset %d: %s", header.base_offset, exc)
                continue
            if marker is not None:
                apply_marker(state, segment, header, marker)
        elif not header.is_control:
            state.update(header, now_ms)


def last_stable_offset(
    state: ProducerStateTable, high_watermark: int, log_start_offset: int = 0
) -> int:
    """min(first unstable offset, ``high_watermark``), the first unstable offset raised to
    ``log_start_offset`` when retention or DeleteRecords passed it (Kafka's
    ``maybeIncrementFirstUnstableOffset``: nothing below the log start can be read)."""
    first_unstable = state.first_unstable_offset(high_watermark)
    if first_unstable is None:
        return high_watermark
    return min(max(first_unstable, log_start_offset), high_watermark)


def collect_aborted(
    segments: Sequence[Segment], fetch_offset: int, upper_bound: int
) -> list[AbortedTxn]:
    """The aborted transactions a fetch of ``[fetch_offset, upper_bound)`` must report."""
    start = 0
    for i, segment in enumerate(segments):
        if segment.base_offset <= fetch_offset:
            start = i
        else:
            break
    found: list[AbortedTxn] = []
    for segment in segments[start:]:
        entries, complete = segment.txn_index.collect(fetch_offset, upper_bound)
        found.extend(entries)
        if complete:
            break
    return found


def replay(
    state: ProducerStateTable,
    segments: Sequence[Segment],
    start: int,
    *,
    index_from: int | None = None,
    owner: object = None,
) -> None:
    """Apply every batch from offset ``start`` on to ``state``; rebuild the ``.txnindex``
    entries of the segments whose base offset is ``index_from`` or more (None: none).

    Data batches are recorded at their max timestamp. Raises ``OSError`` from reads.
    """
    for segment in segments:
        if index_from is not None and segment.base_offset >= index_from:
            segment.txn_index.reset()
        if segment.next_offset <= start:
            continue
        indexed = index_from is not None and segment.base_offset >= index_from
        position = 0
        if start > segment.base_offset:
            position = segment.find_position(start) or 0
        for batch in segment.iter_batches(position):
            header = batch.header
            if header.base_offset < start:
                continue
            if not is_marker_batch(header):
                if not header.is_control:
                    state.update(header, header.max_timestamp)
                continue
            absolute = batch.position
            data = segment.read_range(absolute, absolute + header.size_bytes)
            try:
                marker = read_marker(data)
            except CorruptRecordError as exc:
                log.warning(
                    "%s: unreadable marker at offset %d: %s", owner, header.base_offset, exc
                )
                continue
            if marker is not None:
                apply_marker(state, segment if indexed else None, header, marker)
