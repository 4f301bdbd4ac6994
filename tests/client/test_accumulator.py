"""The record accumulator: batching, readiness, draining, retries, memory. Pure, no I/O."""

from __future__ import annotations

from tidelog.client.accumulator import (
    APPENDED,
    NEW_BATCH,
    NO_ROOM,
    RecordAccumulator,
    estimate_record_size,
)
from tidelog.client.idempotence import SequenceTable
from tidelog.client.types import TopicPartition
from tidelog.storage.records import Compression, decode_batch

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def _accumulator(**overrides: int | bool | Compression) -> RecordAccumulator[str]:
    settings: dict[str, int | bool | Compression] = {
        "batch_size": 1000,
        "buffer_memory": 10_000,
        "linger_ms": 5,
        "max_in_flight": 5,
    }
    settings.update(overrides)
    return RecordAccumulator(**settings)  # type: ignore[arg-type]


def _append(
    acc: RecordAccumulator[str], tp: TopicPartition, value: bytes, now_ms: int, handle: str = "h"
) -> int:
    size = estimate_record_size(None, value, ())
    return acc.append(tp, 1_000 + now_ms, None, value, (), size, handle, now_ms)


def test_records_fill_a_batch_until_batch_size() -> None:
    acc = _accumulator(batch_size=200)
    assert _append(acc, TP0, b"x" * 80, 0) == NEW_BATCH
    assert _append(acc, TP0, b"x" * 80, 0) == APPENDED
    assert _append(acc, TP0, b"x" * 80, 0) == NEW_BATCH  # would pass 200 bytes
    batches = acc.queued(TP0)
    assert [b.record_count for b in batches] == [2, 1]


def test_a_record_larger_than_batch_size_gets_a_batch_of_its_own() -> None:
    acc = _accumulator(batch_size=50)
    assert _append(acc, TP0, b"x" * 500, 0) == NEW_BATCH
    assert _append(acc, TP0, b"y", 0) == NEW_BATCH
    assert [b.record_count for b in acc.queued(TP0)] == [1, 1]


def test_a_batch_lingers_then_is_ready() -> None:
    acc = _accumulator(linger_ms=5)
    _append(acc, TP0, b"a", now_ms=100)
    check = acc.ready(102)
    assert check.partitions == []
    assert check.next_check_ms == 105
    assert acc.ready(105).partitions == [TP0]


def test_a_full_batch_is_ready_at_once() -> None:
    acc = _accumulator(batch_size=100, linger_ms=1_000)
    _append(acc, TP0, b"x" * 90, 0)
    assert acc.ready(0).partitions == [TP0]


def test_flush_and_close_make_everything_ready() -> None:
    acc = _accumulator(linger_ms=1_000)
    _append(acc, TP0, b"a", 0)
    acc.begin_flush()
    assert acc.ready(0).partitions == [TP0]
    acc.end_flush()
    assert acc.ready(0).partitions == []
    acc.close()
    assert acc.ready(0).partitions == [TP0]


def test_buffer_memory_refuses_a_record_that_does_not_fit_until_freed() -> None:
    acc = _accumulator(buffer_memory=300, batch_size=100)
    assert _append(acc, TP0, b"x" * 120, 0) == NEW_BATCH
    assert _append(acc, TP0, b"x" * 120, 0) == NEW_BATCH
    used = acc.used_bytes
    assert _append(acc, TP0, b"x" * 120, 0) == NO_ROOM
    assert acc.used_bytes == used  # nothing changed
    (first,) = acc.drain([TP0], 10_000)
    acc.complete(first)
    assert acc.used_bytes == used - first.size_bytes
    assert _append(acc, TP0, b"x" * 120, 0) == NEW_BATCH


def test_reserved_bytes_count_against_the_buffer() -> None:
    acc = _accumulator(buffer_memory=200)
    assert acc.reserve(150)
    assert not acc.reserve(100)
    assert _append(acc, TP0, b"x" * 60, 0) == NO_ROOM
    acc.release(150)
    assert _append(acc, TP0, b"x" * 60, 0) == NEW_BATCH


def test_drain_takes_one_batch_per_partition_within_the_request_size() -> None:
    acc = _accumulator(batch_size=100, linger_ms=0)
    for tp in (TP0, TP1):
        _append(acc, tp, b"x" * 80, 0)
        _append(acc, tp, b"x" * 80, 0)
    ready = acc.ready(0).partitions
    assert sorted(ready) == [TP0, TP1]
    first = acc.drain(ready, max_request_bytes=10_000)
    assert sorted(b.tp for b in first) == [TP0, TP1]
    assert acc.in_flight(TP0) == 1
    # A request that only fits one batch still takes one, never zero.
    second = acc.drain(acc.ready(0).partitions, max_request_bytes=1)
    assert len(second) == 1


def test_drain_rotates_which_partition_goes_first() -> None:
    acc = _accumulator(batch_size=100, linger_ms=0)
    for _ in range(4):
        for tp in (TP0, TP1):
            _append(acc, tp, b"x" * 90, 0)
    firsts = set()
    for _ in range(2):
        ready = acc.ready(0).partitions
        batches = acc.drain(ready, max_request_bytes=1)
        firsts.add(batches[0].tp)
        for batch in batches:
            acc.complete(batch)
    assert firsts == {TP0, TP1}


def test_without_idempotence_a_partition_has_one_batch_in_flight() -> None:
    acc = _accumulator(batch_size=100, linger_ms=0, ordered_single_flight=True)
    for _ in range(3):
        _append(acc, TP0, b"x" * 90, 0)
    (batch,) = acc.drain(acc.ready(0).partitions, 10_000)
    assert acc.ready(0).partitions == []
    acc.complete(batch)
    assert acc.ready(0).partitions == [TP0]


def test_with_idempotence_up_to_max_in_flight_batches_per_partition() -> None:
    acc = _accumulator(batch_size=100, linger_ms=0, max_in_flight=2)
    for _ in range(4):
        _append(acc, TP0, b"x" * 90, 0)
    acc.drain(acc.ready(0).partitions, 10_000)
    acc.drain(acc.ready(0).partitions, 10_000)
    assert acc.in_flight(TP0) == 2
    assert acc.ready(0).partitions == []


def test_sequences_are_given_at_first_drain_and_kept_on_retry() -> None:
    acc = _accumulator(batch_size=100, linger_ms=0)
    table = SequenceTable()
    table.set_producer_id(42, 0)
    for _ in range(4):
        _append(acc, TP0, b"x" * 30, 0)  # 47 bytes each: two per batch
    (first,) = acc.drain(acc.ready(0).partitions, 10_000, table.assign)
    (second,) = acc.drain(acc.ready(0).partitions, 10_000, table.assign)
    assert (first.producer_id, first.base_sequence) == (42, 0)
    assert (second.producer_id, second.base_sequence) == (42, 2)
    data = acc.encode(first)
    acc.reenqueue(second, retry_at_ms=50)
    acc.reenqueue(first, retry_at_ms=50)
    # Retries go out in sequence order, after the backoff, with the very same bytes.
    assert acc.ready(49).partitions == []
    assert acc.ready(49).next_check_ms == 50
    (again,) = acc.drain(acc.ready(50).partitions, 10_000, table.assign)
    assert again is first
    assert acc.encode(again) is data
    assert again.attempts == 2


def test_a_retry_waits_for_the_batches_in_flight_before_it() -> None:
    acc = _accumulator(batch_size=100, linger_ms=0)
    for _ in range(2):
        _append(acc, TP0, b"x" * 90, 0)
    (first,) = acc.drain(acc.ready(0).partitions, 10_000)
    (second,) = acc.drain(acc.ready(0).partitions, 10_000)
    acc.reenqueue(first, retry_at_ms=0)
    assert acc.ready(0).partitions == []  # the second is still in flight
    acc.reenqueue(second, retry_at_ms=0)
    assert acc.ready(0).partitions == [TP0]
    assert acc.queued(TP0) == [first, second]


def test_new_records_never_join_a_batch_that_was_sent() -> None:
    acc = _accumulator(batch_size=1000, linger_ms=0)
    _append(acc, TP0, b"a", 0)
    (batch,) = acc.drain(acc.ready(0).partitions, 10_000)
    acc.reenqueue(batch, retry_at_ms=0)
    assert _append(acc, TP0, b"b", 0) == NEW_BATCH
    assert [b.record_count for b in acc.queued(TP0)] == [1, 1]


def test_encode_builds_the_records_as_one_batch() -> None:
    acc = _accumulator(compression=Compression.LZ4)
    acc.append(TP0, 1_000, b"k", b"v1", (("h", b"x"),), 40, "a", 0)
    acc.append(TP0, 1_005, None, None, (), 40, "b", 0)
    (batch,) = acc.drain([TP0], 10_000)
    header, records = decode_batch(acc.encode(batch))
    assert header.compression == Compression.LZ4
    assert [(r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in records] == [
        (0, 1_000, b"k", b"v1", (("h", b"x"),)),
        (1, 1_005, None, None, ()),
    ]


def test_expire_takes_out_batches_past_the_delivery_timeout() -> None:
    acc = _accumulator(batch_size=100)
    _append(acc, TP0, b"x" * 90, now_ms=0)
    _append(acc, TP0, b"x" * 90, now_ms=50)
    assert acc.next_expiry_ms(100) == 100
    expired = acc.expire(now_ms=100, delivery_timeout_ms=100)
    assert [b.created_ms for b in expired] == [0]
    assert [b.created_ms for b in acc.queued(TP0)] == [50]


def test_incomplete_and_abort_all() -> None:
    acc = _accumulator(batch_size=100, linger_ms=0)
    _append(acc, TP0, b"x" * 90, 0)
    _append(acc, TP1, b"x" * 90, 0)
    (sent,) = acc.drain([TP0], 10_000)
    assert len(acc.incomplete()) == 2
    aborted = acc.abort_all()
    assert [b.tp for b in aborted] == [TP1]
    for batch in aborted:
        acc.deallocate(batch)
    acc.complete(sent)
    assert acc.incomplete() == []
    assert acc.used_bytes == 0
