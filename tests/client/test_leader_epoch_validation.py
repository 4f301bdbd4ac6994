"""The consumer's side of KIP-320 (issue #25 item 3): it commits the leader epoch of the
last record it consumed, and checks a position against the leader's log
(OffsetForLeaderEpoch) when it resumes from a committed offset or its partition gets a
new leader, going back to where the log diverged, resetting, or raising
``LogTruncationError`` (``auto_offset_reset='none'``) as Kafka's consumer does.

The rule is pure (``check_position``); the consumer is driven against the in-memory
cluster, whose ``truncate`` plays an unclean leader election, and against a real broker
(``InProcessBroker``), which keeps the epochs a producer stamped when it runs alone.
"""

from __future__ import annotations

import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.client import Consumer, Producer
from tidelog.client.errors import LogTruncationError
from tidelog.client.fetcher import CompletedFetch, Truncation, check_position
from tidelog.client.testing import InMemoryCluster
from tidelog.client.types import ConsumerRecord, TopicPartition
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.columns import new_column_builder
from tidelog.storage.errors import (
    InvalidRequestError,
    OffsetOutOfRangeError,
)
from tidelog.storage.records import BatchBuilder

pytestmark = pytest.mark.timeout(60)

TP = TopicPartition("t", 0)


# --- the rule -------------------------------------------------------------------------------


def test_a_position_inside_its_epoch_is_valid() -> None:
    assert check_position(10, 3, 10) is None  # the epoch ends exactly at the position
    assert check_position(10, 3, 25) is None


def test_an_epoch_ending_before_the_position_is_a_truncation() -> None:
    assert check_position(10, 2, 6) == Truncation(10, 6, 2)


def test_no_common_epoch_is_a_truncation_at_an_unknown_offset() -> None:
    assert check_position(10, -1, -1) == Truncation(10, None)


# --- which epoch a position has ------------------------------------------------------------


def _batch(base_offset: int, epoch: int, count: int) -> bytes:
    builder = BatchBuilder(base_offset=base_offset, partition_leader_epoch=epoch)
    for i in range(count):
        builder.append(1_000 + i, None, b"v%d" % (base_offset + i))
    return builder.build()


def test_the_position_epoch_is_the_epoch_of_the_last_batch_handed_out() -> None:
    data = _batch(0, 4, 2) + _batch(2, 7, 2)
    fetch = CompletedFetch(TP, 1, 0, data)
    assert fetch.last_epoch is None
    records, position = fetch.take(0, 1)
    assert (position, fetch.last_epoch) == (1, 4)
    records, position = fetch.take(position, 2)  # the rest of batch 1, then batch 2's first
    assert [r.offset for r in records] == [1, 2]
    assert (position, fetch.last_epoch) == (3, 7)
    columns = CompletedFetch(TP, 1, 0, data)
    assert columns.take_columns(0, new_column_builder(False), 100) == 4
    assert columns.last_epoch == 7


# --- the consumer against the in-memory cluster -------------------------------------------


def _produce(cluster: InMemoryCluster, count: int, prefix: bytes = b"r") -> None:
    with Producer(
        cluster.nodes[0].address, connection_factory=cluster.connect, linger_ms=0
    ) as producer:
        for i in range(count):  # one batch each: every offset is a batch boundary
            producer.send(TP.topic, b"%s%d" % (prefix, i), partition=0).result(timeout=10)


def _consumer(cluster: InMemoryCluster, reset: str = "earliest") -> Consumer:
    return Consumer(
        cluster.nodes[0].address,
        connection_factory=cluster.connect,
        group_id="g",
        auto_offset_reset=reset,
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
        retry_backoff_ms=10,
        metadata_max_age_ms=100,
    )


def _read(consumer: Consumer, count: int) -> list[ConsumerRecord]:
    records: list[ConsumerRecord] = []
    for _ in range(100):
        records += consumer.poll(timeout_ms=50)
        if len(records) >= count:
            break
    return records


def _cluster() -> InMemoryCluster:
    cluster = InMemoryCluster(1)
    cluster.add_topic("t", 1)
    return cluster


def test_a_commit_carries_the_epoch_of_the_last_record_consumed() -> None:
    cluster = _cluster()
    _produce(cluster, 3)  # at leader epoch 0
    cluster.move_leader(TP, 0)  # a new leader epoch (1), same broker
    _produce(cluster, 2, b"s")
    with _consumer(cluster) as consumer:
        consumer.assign([TP])
        assert [r.offset for r in _read(consumer, 2)][:2] == [0, 1]
        consumer.seek(TP, 3)  # a seek forgets the epoch (Kafka's seek(offset) too)
        consumer.commit()
        connection = cluster.connect(cluster.nodes[0].address)
        committed = connection.fetch_committed_offsets("g", [TP], timeout_ms=None)
        assert (committed[TP].offset, committed[TP].leader_epoch) == (3, -1)
        assert [r.offset for r in _read(consumer, 2)] == [3, 4]
        consumer.commit()
        committed = connection.fetch_committed_offsets("g", [TP], timeout_ms=None)
        assert (committed[TP].offset, committed[TP].leader_epoch) == (5, 1)


def _consume_and_commit(cluster: InMemoryCluster, count: int) -> None:
    with _consumer(cluster) as consumer:
        consumer.assign([TP])
        assert len(_read(consumer, count)) == count
        consumer.commit()
    committed = cluster.connect(cluster.nodes[0].address).fetch_committed_offsets(
        "g", [TP], timeout_ms=None
    )
    assert (committed[TP].offset, committed[TP].leader_epoch) == (count, 0)


def test_resuming_past_a_truncation_reads_on_from_where_the_log_diverged() -> None:
    cluster = _cluster()
    _produce(cluster, 6)
    _consume_and_commit(cluster, 6)
    cluster.truncate(TP, 3)  # records 3..5 are gone; epoch 1 starts at 3
    _produce(cluster, 2, b"new")  # 3, 4 at epoch 1
    with _consumer(cluster) as consumer:
        consumer.assign([TP])
        records = _read(consumer, 2)
        # Without validation it would wait at 6, past the log end, and then reset to
        # the beginning; Kafka's consumer goes back to the first divergent offset.
        assert [(r.offset, r.value) for r in records] == [(3, b"new0"), (4, b"new1")]
        assert consumer.position(TP) == 5
    assert cluster.calls_to(0, "offsets_for_leader_epochs") >= 1


def test_with_no_reset_policy_a_truncation_raises_until_the_application_seeks() -> None:
    cluster = _cluster()
    _produce(cluster, 6)
    _consume_and_commit(cluster, 6)
    cluster.truncate(TP, 3)
    _produce(cluster, 5, b"new")  # the log end (8) is past the old position again
    with _consumer(cluster, reset="none") as consumer:
        consumer.assign([TP])
        with pytest.raises(LogTruncationError) as raised:
            _read(consumer, 1)
        assert raised.value.divergent_offsets == {TP: 3}
        assert isinstance(raised.value, OffsetOutOfRangeError)  # as Kafka's
        with pytest.raises(LogTruncationError):
            consumer.position(TP)  # still unvalidated: raised again
        consumer.seek(TP, 3)
        assert [r.value for r in _read(consumer, 5)] == [b"new%d" % i for i in range(5)]


def test_a_valid_committed_position_is_read_on() -> None:
    cluster = _cluster()
    _produce(cluster, 2)
    _consume_and_commit(cluster, 2)  # committed 2 at epoch 0
    cluster.move_leader(TP, 0)  # a clean leader change: epoch 0 ended at 2, the position
    _produce(cluster, 2, b"s")
    with _consumer(cluster, reset="none") as consumer:
        consumer.assign([TP])
        assert [r.offset for r in _read(consumer, 2)] == [2, 3]


def test_a_broker_without_offset_for_leader_epoch_leaves_positions_unchecked() -> None:
    cluster = _cluster()
    _produce(cluster, 2)
    _consume_and_commit(cluster, 2)
    _produce(cluster, 1, b"s")
    # What an older broker answers (gRPC UNIMPLEMENTED, which the client reads as this).
    cluster.fail_next("offsets_for_leader_epochs", InvalidRequestError("unimplemented"))
    with _consumer(cluster, reset="none") as consumer:
        consumer.assign([TP])
        assert [r.offset for r in _read(consumer, 1)] == [2]


def test_a_truncation_under_a_running_consumer_is_found_after_the_leader_change() -> None:
    cluster = _cluster()
    _produce(cluster, 6)
    with _consumer(cluster) as consumer:
        consumer.assign([TP])
        assert len(_read(consumer, 6)) == 6  # position 6, epoch 0
        cluster.truncate(TP, 4)  # the new leader (epoch 1) lost 4 and 5
        _produce(cluster, 4, b"new")  # 4..7: past the old position, so no out-of-range
        records = _read(consumer, 4)
        # Kafka's behaviour: back to 4, the first divergent offset, and read the new
        # records; without validation the consumer would have skipped new0 and new1.
        assert [(r.offset, r.value) for r in records] == [(4 + i, b"new%d" % i) for i in range(4)]


# --- a real broker ----------------------------------------------------------------------------


def test_against_a_real_broker_the_batch_epoch_is_committed_and_validated() -> None:
    """A broker running alone keeps the epoch a producer stamped (no leader ever stamps
    there), so the whole path runs: the epoch of the consumed batch is committed, read
    back over gRPC, and checked by OffsetForLeaderEpoch when another consumer resumes."""
    with InProcessBroker() as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t", partitions=1)
        produce(stub, "t", 0, _batch(0, 3, 2))
        produce(stub, "t", 0, _batch(0, 5, 2))

        def consumer() -> Consumer:
            return Consumer(
                broker.address, group_id="g", auto_offset_reset="none", enable_auto_commit=False
            )

        with consumer() as first:
            first.assign([TP])
            first.seek(TP, 0)
            assert [r.offset for r in _read(first, 3)][:3] == [0, 1, 2]
            first.seek(TP, 3)
            first.commit()  # a sought position: no epoch
            answer = stub.OffsetFetch(pb.OffsetFetchRequest(group_id="g"), timeout=TIMEOUT_S)
            assert [(o.offset, o.leader_epoch) for o in answer.offsets] == [(3, -1)]
            assert [r.offset for r in _read(first, 1)] == [3]
            first.commit()
            answer = stub.OffsetFetch(pb.OffsetFetchRequest(group_id="g"), timeout=TIMEOUT_S)
            assert [(o.offset, o.leader_epoch) for o in answer.offsets] == [(4, 5)]
        produce(stub, "t", 0, _batch(0, 5, 1))
        with consumer() as second:
            second.assign([TP])
            assert [r.offset for r in _read(second, 1)] == [4]
        # A committed position past the end of its epoch on the leader: a truncation,
        # found by the broker's OffsetForLeaderEpoch answer (epoch 5 ends at 5).
        stub.OffsetCommit(
            pb.OffsetCommitRequest(
                group_id="g",
                offsets=[pb.CommittedOffset(topic="t", partition=0, offset=9, leader_epoch=5)],
            ),
            timeout=TIMEOUT_S,
        )
        with consumer() as third:
            third.assign([TP])
            with pytest.raises(LogTruncationError) as raised:
                third.position(TP)
            assert raised.value.divergent_offsets == {TP: 5}
