"""Issue #33, client side: a producer and a consumer whose first bootstrap broker gives
wrong metadata (cut off from ZooKeeper: no leaders; or a stale view that names itself
leader of a partition that moved) refresh from another broker instead of asking it again
and again. Against the in-memory cluster."""

from __future__ import annotations

from tests.client.test_routing import leaderless, metadata_askers, with_stale_views
from tidelog.client import Consumer, Producer
from tidelog.client.testing import InMemoryCluster
from tidelog.client.types import ConsumerRecord, TopicPartition


def test_a_producer_leaves_a_cut_off_broker_for_one_that_knows_the_leader() -> None:
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 1, leaders=[1])
    with cluster._lock:
        cut_off = leaderless(cluster._metadata_locked(0))
    with Producer(
        cluster.bootstrap,
        connection_factory=with_stale_views(cluster, {0: lambda: cut_off}),
        linger_ms=0,
        retry_backoff_ms=10,
        delivery_timeout_ms=5_000,
        request_timeout_ms=4_000,
    ) as producer:
        assert producer.send("t", b"a", partition=0).result(timeout=10).offset == 0
        assert producer.send("t", b"b", partition=0).result(timeout=10).offset == 1
    askers = metadata_askers(cluster)
    assert askers[0] == 0
    assert set(askers[1:]) <= {1, 2}, askers


def test_a_consumer_leaves_a_broker_with_a_stale_view_of_the_leader() -> None:
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 1, leaders=[0])
    tp = TopicPartition("t", 0)
    with cluster._lock:
        stale = cluster._metadata_locked(0)  # broker 0 leads tp, as it still believes
    cluster.move_leader(tp, 2)
    with Producer(cluster.nodes[2].address, connection_factory=cluster.connect) as producer:
        for i in range(3):
            producer.send("t", b"%d" % i, partition=0).result(timeout=10)
    with Consumer(
        cluster.bootstrap,
        connection_factory=with_stale_views(cluster, {0: lambda: stale}),
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        retry_backoff_ms=10,
    ) as consumer:
        consumer.assign([tp])
        records: list[ConsumerRecord] = []
        for _ in range(100):
            records += consumer.poll(timeout_ms=100)
            if len(records) >= 3:
                break
    assert [r.value for r in records] == [b"0", b"1", b"2"]
