"""What every internal compacted topic's store does with its log: write a list of keyed
records as batches, append them durably (and replicated), refuse to serve a partition
until its cache is loaded, and replay a partition from its log start to rebuild a cache.

``__consumer_offsets`` (``broker.groups.offset_store``) and ``__transaction_state``
(``broker.transactions.txn_log``) keep their state the same way, as Kafka's coordinators
do: the log is the store, a cache in memory is what it says, and a broker that becomes a
partition's leader replays the partition. The record formats are theirs; the batching and
the replay loop are here, once.

A write (``append_durably``) is appended as the partition's leader (refused elsewhere,
stamped with the leader epoch), fsynced, and in cluster mode waited for until the in-sync
replicas hold it (the high watermark passed it), before the store changes its cache and
anyone acts on it. A store serves a partition (``check_loaded``) only once it loaded it at
this broker's current leader epoch and the high watermark has reached what that load
read: a new leader's log may end with records the old leader appended but never
acknowledged, which a second failover could take back.

Resignation (``unload_resigned``): a broker that stops leading a partition forgets what
its store loaded of it (Kafka's ``onResignation``). The role change is not signalled to
the stores: each polls its loaded partitions against the leadership from a thread of
its own, and nothing depends on the unload having run, because every request is refused
by the leadership check first. The groups (``GroupManager``) and the transaction
coordinator use the one helper.

Replay reads through ``PartitionLog.read`` and ``decode_batch``; a batch that cannot be
decoded is logged and skipped (its records lost to this cache, never guessed at), control
batches (transaction markers) are skipped, and each record goes to the caller's ``apply``
in offset order. Pure apart from reading the log; thread-safe if ``apply`` is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from tidelog.broker.core.partition import Partition
from tidelog.storage.control import read_marker
from tidelog.storage.errors import CoordinatorLoadInProgressError, CorruptRecordError
from tidelog.storage.partition_log import AppendResult, PartitionLog
from tidelog.storage.records import BatchBuilder, decode_batch, iter_batch_headers

__all__ = [
    "BATCH_TARGET_BYTES",
    "Entry",
    "append_durably",
    "append_unsynced",
    "check_loaded",
    "make_durable",
    "record_batches",
    "replay",
    "unload_resigned",
]

_T = TypeVar("_T")

log = logging.getLogger(__name__)

# A write of many records becomes several batches, each well under max.message.bytes.
BATCH_TARGET_BYTES = 256 * 1024
_READ_BYTES = 1 << 20
_REPLICATION_WAIT_MS = 30_000


def record_batches(
    records: Sequence[tuple[bytes, bytes | None]],
    timestamp_ms: int,
    transaction: tuple[int, int] | None = None,
) -> bytes:
    """Concatenated batches holding ``records`` (key, value or None for a tombstone), each
    about ``BATCH_TARGET_BYTES`` at most. ``transaction``: (producer id, epoch) of the
    transaction they belong to (TxnOffsetCommit): transactional batches, no sequence."""

    def builder() -> BatchBuilder:
        if transaction is None:
            return BatchBuilder()
        return BatchBuilder(
            producer_id=transaction[0], producer_epoch=transaction[1], is_transactional=True
        )

    out: list[bytes] = []
    current = builder()
    for key, value in records:
        if current.record_count and current.estimated_size_bytes() >= BATCH_TARGET_BYTES:
            out.append(current.build())
            current = builder()
        current.append(timestamp_ms, key, value)
    out.append(current.build())
    return b"".join(out)


def append_durably(
    target: Partition,
    records: Sequence[tuple[bytes, bytes | None]],
    timestamp_ms: int,
    on_append: Callable[[str, int], None] | None,
    transaction: tuple[int, int] | None = None,
) -> AppendResult:
    """Append ``records`` to ``target`` as its leader, fsync them and, replicated, wait
    until the in-sync replicas hold them; ``on_append`` (topic, partition) wakes the
    followers' fetches meanwhile; ``transaction`` as ``record_batches``. Raises what the
    append, the fsync and the wait raise (``NotLeaderOrFollowerError``,
    ``NotEnoughReplicasError``, ``KafkaTimeoutError``, ``StorageError``)."""
    result = append_unsynced(target, records, timestamp_ms, transaction)
    make_durable(target, result.last_offset + 1, on_append)
    return result


def append_unsynced(
    target: Partition,
    records: Sequence[tuple[bytes, bytes | None]],
    timestamp_ms: int,
    transaction: tuple[int, int] | None = None,
) -> AppendResult:
    """The first half of ``append_durably``: append ``records`` to ``target`` as its
    leader, nothing more. A store that appends under a lock and makes the append durable
    after releasing it (``make_durable``) lets writers that arrive meanwhile share one
    fsync and one replication wait (group commit, ``broker.share.state_log``)."""
    batches = record_batches(records, timestamp_ms, transaction)
    return target.append_as_leader(batches, acks_all=True)


def make_durable(target: Partition, end: int, on_append: Callable[[str, int], None] | None) -> None:
    """The second half of ``append_durably``: fsync ``target`` below offset ``end`` and,
    replicated, wait until the in-sync replicas hold it. ``PartitionLog.flush`` is a group
    commit already: a caller that arrives while an fsync runs waits for it and usually
    finds its offsets covered by the next one, or by that one."""
    target.log.flush(end)  # flush(n) makes the offsets below n durable
    if target.replicated:
        if on_append is not None:
            on_append(target.topic, target.partition)
        target.wait_replicated(end, _REPLICATION_WAIT_MS)


def check_loaded(target: Partition, loaded: tuple[int, int] | None, what: str) -> None:
    """Cluster mode: ``CoordinatorLoadInProgressError`` unless ``loaded`` (the leader
    epoch a store loaded ``target`` at, and the log end it read) is this broker's current
    epoch and the high watermark has reached that end. A no-op on a single node.
    ``what``: what the store keeps there (for the message)."""
    if not target.replicated:
        return
    epoch = target.leader_epoch
    name = f"{target.topic}-{target.partition}"
    if epoch is None or loaded is None or loaded[0] != epoch:
        raise CoordinatorLoadInProgressError(f"{name}: this broker is still loading its {what}")
    high_watermark = target.log.high_watermark
    if high_watermark < loaded[1]:
        raise CoordinatorLoadInProgressError(
            f"{name}: waiting for the in-sync replicas to hold the {what} loaded (high "
            f"watermark {high_watermark}, loaded to {loaded[1]})"
        )


def unload_resigned(
    loaded: Callable[[], Sequence[int]],
    leads: Callable[[int], bool],
    roles_lock: threading.Lock,
    unload: Callable[[int], _T],
) -> list[tuple[int, _T]]:
    """Cluster mode: ``unload`` every partition in ``loaded()`` that this broker no longer
    ``leads``; each unloaded partition with what ``unload`` returned.

    Each check and unload runs under ``roles_lock``, which the store's loads (on
    becoming leader) hold too, and leadership is read under it: a load runs after its
    ``make_leader``, so an unload that saw "not leading" cannot land after the load of a
    later leadership."""
    unloaded = []
    for partition in loaded():
        with roles_lock:
            if leads(partition) or partition not in loaded():
                continue
            unloaded.append((partition, unload(partition)))
    return unloaded


Entry = tuple[int, bytes | None, bytes | None]  # offset, key, value


def replay(
    partition_log: PartitionLog,
    apply: Callable[[int, bytes | None, bytes | None], None],
    pending: dict[int, list[Entry]] | None = None,
) -> int:
    """Feed every record of ``partition_log`` (offset, key, value) to ``apply``, oldest
    first; returns how many records were read.

    Records of transactional batches (TxnOffsetCommit's) are held per producer id until
    that producer's marker: a COMMIT applies them then, in order, an ABORT drops them.
    Those still undecided at the log end are left in ``pending`` (producer id -> its
    records), for the store to hold as pending; without ``pending`` they are dropped."""
    held: dict[int, list[Entry]] = {} if pending is None else pending
    offset = partition_log.log_start_offset
    end = partition_log.log_end_offset
    count = 0
    while offset < end:
        data = partition_log.read(offset, _READ_BYTES).records
        if not data:
            break
        for position, header in iter_batch_headers(data):
            if header.is_control:
                if header.next_offset > offset:
                    _end_transaction(data, position, header.producer_id, held, apply)
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
            fresh = [(r.offset, r.key, r.value) for r in batch_records if r.offset >= offset]
            count += len(fresh)
            if header.is_transactional:
                held.setdefault(header.producer_id, []).extend(fresh)
            else:
                for entry in fresh:
                    apply(*entry)
            offset = max(offset, header.next_offset)
    return count


def _end_transaction(
    data: bytes,
    position: int,
    producer_id: int,
    held: dict[int, list[Entry]],
    apply: Callable[[int, bytes | None, bytes | None], None],
) -> None:
    try:
        marker = read_marker(data, position)
    except CorruptRecordError as exc:
        log.error("skipping an undecodable control batch of producer %d: %s", producer_id, exc)
        return
    if marker is None:
        return
    entries = held.pop(producer_id, [])
    if marker.commit:
        for entry in entries:
            apply(*entry)
