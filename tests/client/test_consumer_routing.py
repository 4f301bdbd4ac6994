"""The consumer against the in-memory cluster: each partition is fetched from its leader,
and followed when the leader moves; an offline partition does not stop the others."""

from __future__ import annotations

from tidelog.client import Consumer, Producer
from tidelog.client.testing import InMemoryCluster
from tidelog.client.types import ConsumerRecord, TopicPartition


def _produce(cluster: InMemoryCluster, tp: TopicPartition, values: list[bytes]) -> None:
    with Producer(
        cluster.nodes[0].address, connection_factory=cluster.connect, linger_ms=0
    ) as producer:
        for value in values:
            producer.send(tp.topic, value, partition=tp.partition).result(timeout=10)


def _consumer(cluster: InMemoryCluster) -> Consumer:
    return Consumer(
        cluster.nodes[0].address,
        connection_factory=cluster.connect,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        retry_backoff_ms=10,
    )


def _read(consumer: Consumer, count: int) -> list[ConsumerRecord]:
    records: list[ConsumerRecord] = []
    for _ in range(200):
        records += consumer.poll(timeout_ms=100)
        if len(records) >= count:
            break
    return records


def test_each_partition_is_fetched_from_its_leader() -> None:
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 3)
    tps = [TopicPartition("t", p) for p in range(3)]
    for tp in tps:
        _produce(cluster, tp, [b"%d-%d" % (tp.partition, i) for i in range(3)])
    with _consumer(cluster) as consumer:
        consumer.assign(tps)
        records = _read(consumer, 9)
    assert sorted((r.partition, r.offset, r.value) for r in records) == [
        (p, i, b"%d-%d" % (p, i)) for p in range(3) for i in range(3)
    ]
    assert [cluster.calls_to(b, "fetch") > 0 for b in range(3)] == [True, True, True]


def test_a_moved_leader_is_followed() -> None:
    cluster = InMemoryCluster(2)
    cluster.add_topic("t", 1, leaders=[0])
    tp = TopicPartition("t", 0)
    _produce(cluster, tp, [b"a", b"b"])
    with _consumer(cluster) as consumer:
        consumer.assign([tp])
        assert [r.value for r in _read(consumer, 2)] == [b"a", b"b"]
        cluster.move_leader(tp, 1)
        _produce(cluster, tp, [b"c"])
        assert [r.value for r in _read(consumer, 1)] == [b"c"]
    assert cluster.calls_to(1, "fetch") > 0


def test_an_offline_partition_does_not_stop_the_others() -> None:
    cluster = InMemoryCluster(2)
    cluster.add_topic("t", 2)
    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    _produce(cluster, tps[0], [b"x"])
    with _consumer(cluster) as consumer:
        consumer.assign(tps)
        consumer.seek(tps[0], 0)
        consumer.seek(tps[1], 0)
        cluster.kill(1)
        assert [r.value for r in _read(consumer, 1)] == [b"x"]
        _produce(cluster, tps[0], [b"y"])
        assert [r.value for r in _read(consumer, 1)] == [b"y"]
