"""Test helpers for transactions: transactional batches, and a read_committed reader.

``read_committed`` applies the filtering Kafka's consumers apply (Java's ``CompletedFetch``,
kafka-python's fetcher; reference ``transactions.md`` section 7.3) to what
``PartitionLog.read`` and ``PartitionLog.aborted_transactions`` return, the way a
read_committed fetch will serve them: data up to the last stable offset.
"""

from __future__ import annotations

import heapq

from tidelog.storage.control import read_marker
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import (
    NO_PRODUCER_ID,
    BatchBuilder,
    Record,
    decode_batch,
    iter_batch_headers,
    split_whole_batches,
)

T0 = 1_700_000_000_000


def txn_batch(
    producer_id: int,
    epoch: int,
    sequence: int,
    values: list[bytes],
    *,
    keys: list[bytes] | None = None,
    transactional: bool = True,
) -> bytes:
    """One batch of ``values`` from ``producer_id`` (transactional unless told not)."""
    builder = BatchBuilder(
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        is_transactional=transactional,
    )
    for i, value in enumerate(values):
        builder.append(T0, None if keys is None else keys[i], value)
    return builder.build()


def read_committed(
    log: PartitionLog, start: int | None = None, max_bytes: int = 300
) -> list[Record]:
    """Every record a read_committed consumer gets from ``start`` up to the LSO."""
    offset = log.log_start_offset if start is None else start
    stable = log.last_stable_offset
    out: list[Record] = []
    while offset < stable:
        data = log.read(offset, max_bytes, max_offset=stable).records
        whole = data[: split_whole_batches(data)]
        if not whole:
            break
        headers = list(iter_batch_headers(whole, validate=True))
        upper = headers[-1][1].next_offset
        aborted = [(first, pid) for pid, first in log.aborted_transactions(offset, upper)]
        heapq.heapify(aborted)
        aborted_pids: set[int] = set()
        for position, header in headers:
            if header.producer_id != NO_PRODUCER_ID:
                while aborted and aborted[0][0] <= header.last_offset:
                    aborted_pids.add(heapq.heappop(aborted)[1])
                if header.is_control:
                    marker = read_marker(whole, position)
                    if marker is not None and not marker.commit:
                        aborted_pids.discard(header.producer_id)
                    continue
                if header.is_transactional and header.producer_id in aborted_pids:
                    continue
            if header.is_control:
                continue
            _, records = decode_batch(whole, position)
            out.extend(r for r in records if r.offset >= offset)
        offset = upper
    return out


def read_uncommitted(log: PartitionLog) -> list[Record]:
    """Every data record up to the high watermark (control batches skipped)."""
    offset, out = log.log_start_offset, []
    while offset < log.high_watermark:
        data = log.read(offset, 1 << 20, max_offset=log.high_watermark).records
        whole = data[: split_whole_batches(data)]
        headers = list(iter_batch_headers(whole, validate=True))
        for position, header in headers:
            if not header.is_control:
                _, records = decode_batch(whole, position)
                out.extend(r for r in records if r.offset >= offset)
        offset = headers[-1][1].next_offset
    return out
