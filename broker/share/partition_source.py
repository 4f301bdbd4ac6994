"""A share partition's view of its topic partition's log: which offsets hold records a
share consumer may be handed (``broker.share.partition.RecordSource`` over a
``PartitionLog``).

Deliverable: data records below the high watermark (``share.isolation.level``
read_uncommitted), or below the last stable offset and outside aborted transactions
(read_committed, Kafka 4.1's ``share.isolation.level``). Control batches (transaction
markers), offsets compaction removed and, under read_committed, the records of aborted
transactions are gaps. Aborted transactions are found as Kafka's consumer finds them: the
log's aborted-transaction index gives each aborted producer's first offset; from there
that producer's transactional batches are skipped until its ABORT marker.

Reads through ``PartitionLog.read`` (lock-free) and ``aborted_transactions``. Thread-safe
as the log is.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tidelog.broker.share.partition import Scan
from tidelog.storage.control import read_marker
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import BatchHeader, decode_batch, iter_batch_headers

__all__ = ["LogRecordSource"]

log = logging.getLogger(__name__)

_READ_BYTES = 1 << 20


class LogRecordSource:
    """``RecordSource`` over one partition log. Thread-safe."""

    def __init__(self, partition_log: PartitionLog, *, read_committed: bool) -> None:
        self._log = partition_log
        self._read_committed = read_committed

    def log_start_offset(self) -> int:
        return self._log.log_start_offset

    def limit_offset(self) -> int:
        if self._read_committed:
            return self._log.last_stable_offset
        return self._log.high_watermark

    def scan(self, from_offset: int, max_count: int) -> Scan:
        """Up to ``max_count`` deliverable offsets from ``from_offset`` below the limit.
        A compacted batch that does not decode is logged and treated as a gap (its
        records are never handed out). Raises ``OffsetOutOfRangeError`` when
        ``from_offset`` is below the log start (retention raced the caller: it follows
        the start, and asks again)."""
        limit = self.limit_offset()
        offset = from_offset
        found: list[int] = []
        aborted_first: list[tuple[int, int]] = []
        if self._read_committed:
            # (first offset, producer id), oldest first: activated as batches pass them.
            aborted_first = sorted(
                (first, pid) for pid, first in self._log.aborted_transactions(offset, limit)
            )
        aborting: set[int] = set()
        while offset < limit and len(found) < max_count:
            data = self._log.read(offset, _READ_BYTES, max_offset=limit).records
            before = offset
            for position, header in iter_batch_headers(data):
                if header.base_offset >= limit:
                    break
                while aborted_first and aborted_first[0][0] <= header.last_offset:
                    aborting.add(aborted_first.pop(0)[1])
                if header.is_control:
                    if header.producer_id in aborting and _is_abort(data, position):
                        aborting.discard(header.producer_id)
                elif not (header.is_transactional and header.producer_id in aborting):
                    for record_offset in _offsets(data, position, header, offset):
                        if offset <= record_offset < limit:
                            found.append(record_offset)
                            if len(found) == max_count:
                                return Scan(tuple(found), record_offset + 1)
                offset = max(offset, min(header.next_offset, limit))
            if offset == before:
                break  # nothing more below the limit (an empty read)
        return Scan(tuple(found), max(offset, from_offset))


def _is_abort(data: bytes, position: int) -> bool:
    try:
        marker = read_marker(data, position)
    except CorruptRecordError:
        return False
    return marker is not None and not marker.commit


def _offsets(data: bytes, position: int, header: BatchHeader, start: int) -> Sequence[int]:
    """The offsets of the batch's records (from ``start`` on, at least). A batch holding
    as many records as its offset span (every batch a producer wrote; compaction leaves
    fewer) holds exactly ``base_offset..last_offset``: the header says so and nothing is
    decoded (decoding the whole batch on every acquisition was a fifth of the broker's
    time in ``benchmarks/share_bench.py``). Only a compacted batch is decoded. Either
    way ``iter_batch_headers`` has checked the batch's CRC."""
    if header.records_count == header.last_offset_delta + 1:
        return range(max(header.base_offset, start), header.next_offset)
    try:
        _, records = decode_batch(data, position)
    except CorruptRecordError as exc:
        log.error("share fetch: skipping undecodable batch at %d: %s", header.base_offset, exc)
        return []
    return [r.offset for r in records]
