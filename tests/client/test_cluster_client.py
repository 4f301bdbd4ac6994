"""The real client against three real broker processes and a real ZooKeeper.

Every client is given one broker only (the bootstrap list names broker 1): it finds the
others from the metadata, sends each partition's produce and fetch to its leader, sends
topic changes to the controller, follows the group's coordinator, and fails clearly when
a partition is offline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.types import ConsumerRecord
from tidelog.storage.errors import KafkaTimeoutError, LeaderNotAvailableError, TidelogError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(brokers=3, session_timeout_ms=3_000) as running:
        yield running


def eventually(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except TidelogError:
            pass
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def read(consumer: Consumer, count: int, timeout_s: float = 30.0) -> list[ConsumerRecord]:
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        records += consumer.poll(timeout_ms=200)
    return records


def create_spread_topic(admin: AdminClient, name: str, partitions: int) -> dict[int, int]:
    """Create ``name`` (at the controller) once all three brokers are up; its leaders."""
    eventually(lambda: len(admin.describe_cluster().brokers) == 3)
    admin.create_topic(name, partitions, replication_factor=1)
    eventually(lambda: all(p.leader > 0 for p in admin.describe_topic(name).partitions))
    return {p.partition: p.leader for p in admin.describe_topic(name).partitions}


def test_produce_and_consume_across_brokers_with_one_bootstrap_broker(
    cluster: LocalCluster,
) -> None:
    one = cluster.address(1)
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        described = admin.describe_cluster()
        assert sorted(b.id for b in described.brokers) == [1, 2, 3]
        assert described.controller_id in (1, 2, 3)
        leaders = create_spread_topic(admin, "spread", 6)
        assert set(leaders.values()) == {1, 2, 3}  # every broker leads some
        for partition in admin.describe_topic("spread").partitions:
            assert partition.replicas == (partition.leader,)
            assert partition.isr == (partition.leader,)
    with Producer(one, acks="all", linger_ms=5) as producer:
        futures = [producer.send("spread", b"%d" % i, partition=i % 6) for i in range(120)]
        landed = [f.result(timeout=30) for f in futures]
    assert sorted((m.partition, m.offset) for m in landed) == [
        (p, o) for p in range(6) for o in range(20)
    ]
    tps = [TopicPartition("spread", p) for p in range(6)]
    with Consumer(one, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        assert consumer.end_offsets(tps) == dict.fromkeys(tps, 20)  # from each leader
        records = read(consumer, 120)
    assert sorted(int(r.value or b"") for r in records) == list(range(120))  # each once
    assert all(int(r.value or b"") % 6 == r.partition for r in records)


def test_a_group_follows_its_coordinator_through_a_restart(cluster: LocalCluster) -> None:
    one = cluster.address(1)
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        create_spread_topic(admin, "grouped", 3)
    with Producer(one, acks="all") as producer:
        for i in range(30):
            producer.send("grouped", b"%d" % i, partition=i % 3)
    settings = {
        "group_id": "followers",
        "auto_offset_reset": "earliest",
        "session_timeout_ms": 6_000,
        "heartbeat_interval_ms": 200,
        "request_timeout_ms": 20_000,
    }
    with Consumer(one, **settings) as consumer:
        consumer.subscribe(["grouped"])
        assert len(read(consumer, 30)) == 30
        consumer.commit()
        coordinator = consumer._connections.coordinator("followers").address
        broker_id = next(i for i in cluster.broker_ids if cluster.address(i) == coordinator)
        cluster.kill(broker_id)
        cluster.start_broker(broker_id)
        # The group lives on: commits reach the coordinator again, and a new member of the
        # group starts where the first one committed.
        tp = TopicPartition("grouped", 0)
        eventually(lambda: consumer.committed(tp, timeout_ms=2_000) == 10)
    with Producer(one, acks="all") as producer:
        for i in range(30, 33):
            producer.send("grouped", b"%d" % i, partition=i % 3).result(timeout=30)
    with Consumer(one, **settings) as second:
        second.subscribe(["grouped"])
        assert sorted(int(r.value or b"") for r in read(second, 3)) == [30, 31, 32]
    # Group administration finds the coordinator too, whichever broker it is.
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        assert "followers" in {g.group_id for g in admin.list_groups()}
        lag = {p.tp: p.committed_offset for p in admin.describe_group("followers").partitions}
        assert lag[TopicPartition("grouped", 0)] is not None


def test_a_dead_brokers_partitions_fail_clearly_and_come_back(cluster: LocalCluster) -> None:
    one = cluster.address(1)
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        leaders = create_spread_topic(admin, "mortal", 3)
    victim = 3
    on_victim = next(p for p, leader in leaders.items() if leader == victim)
    elsewhere = next(p for p, leader in leaders.items() if leader != victim)
    with Producer(one, acks="all", delivery_timeout_ms=4_000, request_timeout_ms=3_000) as producer:
        producer.send("mortal", b"before", partition=on_victim).result(timeout=30)
        cluster.kill(victim)
        # The first describe after the kill is routed to the dead leader: it asks again
        # until the metadata shows the partition offline, then answers -1 at once. (It
        # used to ask until its request timeout, offline or not: with 60 s that outlasts
        # the 30 s this waits.)
        with AdminClient(one, request_timeout_ms=60_000) as admin:
            eventually(
                lambda: admin.describe_topic("mortal").partitions[on_victim].leader == -1, 30.0
            )
        lost = producer.send("mortal", b"lost", partition=on_victim)
        kept = producer.send("mortal", b"kept", partition=elsewhere)
        assert kept.result(timeout=30).offset == 0
        with pytest.raises(KafkaTimeoutError, match=f"mortal-{on_victim} is offline"):
            lost.result(timeout=30)
    with (
        Consumer(one, request_timeout_ms=2_000) as consumer,
        pytest.raises(LeaderNotAvailableError),
    ):
        consumer.end_offsets([TopicPartition("mortal", on_victim)], timeout_ms=2_000)
    cluster.start_broker(victim)
    with Consumer(one, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("mortal", on_victim)])
        assert [r.value for r in read(consumer, 1)] == [b"before"]  # every record is back
