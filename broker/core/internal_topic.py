"""What every internal compacted topic's store does with its log: write a list of keyed
records as batches, and replay a partition from its log start to rebuild a cache.

``__consumer_offsets`` (``broker.groups.offset_store``) and ``__transaction_state``
(``broker.transactions.txn_log``) keep their state the same way, as Kafka's coordinators
do: the log is the store, a cache in memory is what it says, and a broker that becomes a
partition's leader replays the partition. The record formats are theirs; the batching and
the replay loop are here, once.

Replay reads through ``PartitionLog.read`` and ``decode_batch``; a batch that cannot be
decoded is logged and skipped (its records lost to this cache, never guessed at), control
batches (transaction markers) are skipped, and each record goes to the caller's ``apply``
in offset order. Pure apart from reading the log; thread-safe if ``apply`` is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import BatchBuilder, decode_batch, iter_batch_headers

__all__ = ["BATCH_TARGET_BYTES", "record_batches", "replay"]

log = logging.getLogger(__name__)

# A write of many records becomes several batches, each well under max.message.bytes.
BATCH_TARGET_BYTES = 256 * 1024
_READ_BYTES = 1 << 20


def record_batches(records: Sequence[tuple[bytes, bytes | None]], timestamp_ms: int) -> bytes:
    """Concatenated batches holding ``records`` (key, value or None for a tombstone), each
    about ``BATCH_TARGET_BYTES`` at most."""
    out: list[bytes] = []
    builder = BatchBuilder()
    for key, value in records:
        if builder.record_count and builder.estimated_size_bytes() >= BATCH_TARGET_BYTES:
            out.append(builder.build())
            builder = BatchBuilder()
        builder.append(timestamp_ms, key, value)
    out.append(builder.build())
    return b"".join(out)


def replay(
    partition_log: PartitionLog,
    apply: Callable[[int, bytes | None, bytes | None], None],
) -> int:
    """Feed every record of ``partition_log`` (offset, key, value) to ``apply``, oldest
    first; returns how many records were read."""
    offset = partition_log.log_start_offset
    end = partition_log.log_end_offset
    count = 0
    while offset < end:
        data = partition_log.read(offset, _READ_BYTES).records
        if not data:
            break
        for position, header in iter_batch_headers(data):
            if header.is_control:
                offset = max(offset, header.next_offset)
                continue
            try:
                _, batch_records = decode_batch(data, position)
            except CorruptRecordError as exc:
                log.error(
                    "%s: skipping undecodable batch at %d: %s",
                    partition_log,
                    header.base_offset,
                    exc,
                )
                batch_records = []
            for record in batch_records:
                if record.offset >= offset:
                    count += 1
                    apply(record.offset, record.key, record.value)
            offset = max(offset, header.next_offset)
    return count
