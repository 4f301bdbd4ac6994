"""The pieces of the dead-letter topic below the broker (``broker.share.dead_letter``):
the share partition's to-be-dead-lettered states, and transactional writes to
``__share_group_state`` pending until their marker, over a real log manager.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tidelog.broker.share.dead_letter import DeadLetter, DeadLetterBatch, copy_batches
from tidelog.broker.share.partition import (
    REJECT,
    RELEASE,
    Acknowledgement,
    Scan,
    SharePartition,
    SharePartitionConfig,
)
from tidelog.broker.share.records import (
    ARCHIVED,
    DEAD_LETTER_LIMIT,
    DEAD_LETTER_REJECTED,
    ShareStateKey,
    StateBatch,
)
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC, ShareStateLog, ShareStateLogConfig
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import CoordinatorLoadInProgressError
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.records import Record, decode_batch, iter_batch_headers

KEY = ShareStateKey("workers", uuid.uuid5(uuid.NAMESPACE_URL, "jobs"), 0)
PRODUCER = 7


class _Source:
    """Ten records, offsets 0..9."""

    def log_start_offset(self) -> int:
        return 0

    def limit_offset(self) -> int:
        return 10

    def scan(self, from_offset: int, max_count: int) -> Scan:
        offsets = tuple(range(from_offset, min(10, from_offset + max_count)))
        return Scan(offsets, from_offset + len(offsets))


def _apply(share: SharePartition, transition: object) -> None:
    share.apply(transition)  # type: ignore[arg-type]


def test_reject_and_the_limit_wait_to_be_dead_lettered_then_archive() -> None:
    config = SharePartitionConfig(delivery_count_limit=1, dead_letter_topic="dlq")
    share = SharePartition.new(config, 0)
    _apply(share, share.acquire("m", 3, 0, _Source()))
    acks = [Acknowledgement(0, 0, REJECT), Acknowledgement(1, 1, RELEASE)]
    transition = share.acknowledge("m", acks, 1)
    assert transition.durable == (
        StateBatch(0, 0, DEAD_LETTER_REJECTED, 1),
        StateBatch(1, 1, DEAD_LETTER_LIMIT, 1),
    )
    _apply(share, transition)
    # Neither deliverable nor done: the start stays, only offset 2 (expired later) and
    # new records come out.
    assert share.start_offset == 0
    assert [o for o, _ in share.dead_letter_pending(10)] == [0, 1]
    acquired = share.acquire("n", 10, 10**9, _Source()).acquired
    assert 0 not in {o for r in acquired for o in range(r.first_offset, r.last_offset + 1)}
    archive = share.archive_dead_lettered([0, 1], 2)
    # A done prefix: written as the start offset moving past it.
    assert (archive.start_offset, archive.start_moved, archive.durable) == (2, True, ())
    _apply(share, archive)
    assert share.dead_letter_pending(10) == []
    assert share.dead_lettered == 2
    assert share.start_offset == 2
    with pytest.raises(ValueError, match="not to be dead-lettered"):
        share.archive_dead_lettered([2], 3)


def test_without_a_dead_letter_topic_reject_archives() -> None:
    share = SharePartition.new(SharePartitionConfig(), 0)
    _apply(share, share.acquire("m", 1, 0, _Source()))
    _apply(share, share.acquire("m", 1, 0, _Source()))  # offset 1 stays in flight
    transition = share.acknowledge("m", [Acknowledgement(0, 0, REJECT)], 1)
    assert (transition.start_offset, transition.durable) == (1, ())  # archived: done


def _open(path: Path, clock: ManualClock) -> tuple[LogManager, ShareStateLog]:
    logs = LogManager.open(path, LogManagerConfig(cleaner_enabled=False), clock)
    return logs, ShareStateLog.open(logs, ShareStateLogConfig(num_partitions=1))


def _marker(logs: LogManager, commit: bool) -> None:
    logs.get_log(SHARE_STATE_TOPIC, 0).append_marker(PRODUCER, 0, commit, 0)


@pytest.mark.parametrize("commit", [True, False])
def test_a_transactional_write_is_pending_until_its_marker_across_restarts(
    tmp_path: Path, commit: bool
) -> None:
    clock = ManualClock()
    logs, store = _open(tmp_path, clock)
    try:
        store.initialize(KEY, 0, 0)
        store.write(KEY, 0, -1, (StateBatch(0, 1, DEAD_LETTER_REJECTED, 1),))
        store.write_transactional(KEY, 0, -1, (StateBatch(0, 1, ARCHIVED, 1),), (PRODUCER, 0))
        for _ in range(2):  # before and after a restart: pending, never guessed at
            assert store.has_pending(KEY)
            assert store.read(KEY).batches == (StateBatch(0, 1, DEAD_LETTER_REJECTED, 1),)  # type: ignore[union-attr]
            with pytest.raises(CoordinatorLoadInProgressError):
                store.read_state(KEY, 0)
            # A snapshot written meanwhile does not let pruning drop the pending write.
            assert store.prune(0) <= 2
            logs.close()
            logs, store = _open(tmp_path, clock)
        _marker(logs, commit)
        store.end_transaction(0, PRODUCER, commit)
        wanted = ARCHIVED if commit else DEAD_LETTER_REJECTED
        for _ in range(2):  # decided, and replayed the same way
            assert not store.has_pending(KEY)
            assert store.read_state(KEY, 0).batches == (StateBatch(0, 1, wanted, 1),)  # type: ignore[union-attr]
            logs.close()
            logs, store = _open(tmp_path, clock)
    finally:
        logs.close()


def test_copies_are_cut_into_batches_with_consecutive_sequences() -> None:
    letters = tuple(
        DeadLetter(o, "rejected", 1, Record(o, 1_000 + o, b"k", b"x" * 100_000, (("h", b"v"),)))
        for o in range(10)
    )
    gone = DeadLetter(10, "delivery-limit", 5, None)  # retention took it: no copy
    batch = DeadLetterBatch("g", "jobs", 3, "dlq", (*letters, gone), 0)
    data = copy_batches(batch, PRODUCER, 2, 0)
    headers = [h for _, h in iter_batch_headers(data)]
    assert len(headers) > 1  # ~1 MB of copies: several batches
    assert all(h.is_transactional and h.producer_id == PRODUCER for h in headers)
    sequences = [h.base_sequence for h in headers]
    counts = [h.records_count for h in headers]
    assert sequences == [sum(counts[:i]) for i in range(len(counts))]
    copies = [r for at, _ in iter_batch_headers(data) for r in decode_batch(data, at)[1]]
    assert [r.timestamp_ms for r in copies] == [1_000 + o for o in range(10)]
    assert dict(copies[4].headers) == {
        "h": b"v",
        "tidelog.dlq.group": b"g",
        "tidelog.dlq.topic": b"jobs",
        "tidelog.dlq.partition": b"3",
        "tidelog.dlq.offset": b"4",
        "tidelog.dlq.reason": b"rejected",
        "tidelog.dlq.delivery.count": b"1",
    }
    assert copy_batches(DeadLetterBatch("g", "jobs", 3, "dlq", (gone,), 0), 1, 0, 0) == b""
