"""The producer against the in-memory cluster: each partition's batches go to its
leader, follow it when it moves, and fail clearly when the partition is offline."""

from __future__ import annotations

import contextlib

import pytest

from tidelog.client import Producer
from tidelog.client.errors import ClosedError
from tidelog.client.testing import InMemoryCluster
from tidelog.client.types import TopicPartition
from tidelog.storage.errors import (
    ClusterAuthorizationFailedError,
    KafkaTimeoutError,
)
from tidelog.storage.records import decode_records


def _values(cluster: InMemoryCluster, tp: TopicPartition) -> list[bytes | None]:
    return [
        record.value for _, data in cluster.produced.get(tp, []) for record in decode_records(data)
    ]


def _producer(cluster: InMemoryCluster, **settings: object) -> Producer:
    return Producer(
        cluster.nodes[0].address,  # one broker named: it tells of the others
        connection_factory=cluster.connect,
        linger_ms=0,
        retry_backoff_ms=10,
        **settings,
    )


def test_each_partition_goes_to_its_leader() -> None:
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 3)  # partition p led by broker p
    with _producer(cluster) as producer:
        futures = [producer.send("t", f"v{p}".encode(), partition=p) for p in range(3)]
        offsets = [f.result(timeout=10).offset for f in futures]
    assert offsets == [0, 0, 0]
    for p in range(3):
        assert _values(cluster, TopicPartition("t", p)) == [f"v{p}".encode()]
        assert cluster.calls_to(p, "produce") >= 1


def test_a_moved_leader_is_followed_in_order() -> None:
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 1, leaders=[1])
    tp = TopicPartition("t", 0)
    with _producer(cluster) as producer:
        assert producer.send("t", b"a", partition=0).result(timeout=10).offset == 0
        cluster.move_leader(tp, 2)
        futures = [producer.send("t", b"%d" % i, partition=0) for i in range(20)]
        assert [f.result(timeout=10).offset for f in futures] == list(range(1, 21))
    assert _values(cluster, tp) == [b"a", *(b"%d" % i for i in range(20))]
    assert cluster.calls_to(2, "produce") >= 1


def test_an_offline_partition_fails_with_a_clear_message_not_a_hang() -> None:
    cluster = InMemoryCluster(2)
    cluster.add_topic("t", 2)
    with _producer(cluster, delivery_timeout_ms=600, request_timeout_ms=500) as producer:
        assert producer.send("t", b"ok", partition=1).result(timeout=10).offset == 0
        cluster.kill(1)
        lost = producer.send("t", b"lost", partition=1)
        kept = producer.send("t", b"kept", partition=0)
        assert kept.result(timeout=10).offset == 0  # the other partition is unaffected
        with pytest.raises(KafkaTimeoutError, match="t-1 is offline"):
            lost.result(timeout=10)


def test_a_broker_killed_and_revived_gets_the_retried_batch() -> None:
    cluster = InMemoryCluster(2)
    cluster.add_topic("t", 2)
    tp = TopicPartition("t", 1)
    with _producer(cluster) as producer:
        assert producer.send("t", b"before", partition=1).result(timeout=10).offset == 0
        cluster.kill(1)
        future = producer.send("t", b"after", partition=1)
        cluster.revive(1)
        assert future.result(timeout=10).offset == 1
    assert _values(cluster, tp) == [b"before", b"after"]


def test_a_cancelled_producer_id_request_is_retried_not_fatal() -> None:
    """A broker (or proxy) that cancels InitProducerId under load or in a restart is a
    transient failure: the idempotent producer asks again and delivers."""
    cluster = InMemoryCluster(1)
    cluster.add_topic("t", 1)
    cluster.fail_next("init_producer_id", ClosedError("InitProducerId was cancelled"), times=2)
    with _producer(cluster, enable_idempotence=True) as producer:
        assert producer.send("t", b"a", partition=0).result(timeout=10).offset == 0
    assert _values(cluster, TopicPartition("t", 0)) == [b"a"]
    assert cluster.calls_to(0, "init_producer_id") == 3


def test_a_refused_producer_id_fails_the_producer_at_once() -> None:
    cluster = InMemoryCluster(1)
    cluster.add_topic("t", 1)
    cluster.fail_next("init_producer_id", ClusterAuthorizationFailedError("no IDEMPOTENT_WRITE"))
    producer = _producer(cluster, enable_idempotence=True, delivery_timeout_ms=60_000)
    with pytest.raises(ClusterAuthorizationFailedError):
        # At once (the send, or its future if the send came first), never after the
        # delivery timeout.
        producer.send("t", b"a", partition=0).result(timeout=10)
    with contextlib.suppress(ClusterAuthorizationFailedError):
        producer.close()  # its flush may report the fatal error again
    assert _values(cluster, TopicPartition("t", 0)) == []
