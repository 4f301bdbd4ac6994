"""Partition reassignment (KIP-455) in a four-broker cluster on racks a, a, b, b.

* an RF=2 partition moves to the two other brokers under an idempotent ``acks=all`` load
  (``workload``): every acknowledged record is read back after, in order, none twice,
  and the old replicas' copies are deleted;
* the controller is killed while a reassignment is in progress (the adding replicas are
  throttled by ``follower.replication.throttled.rate`` and the leader's
  ``leader.replication.throttled.rate``, so it lasts): the next controller finishes it
  from what ZooKeeper holds;
* kafka-python's ``alter_partition_reassignments`` / ``list_partition_reassignments``
  against the Kafka listener, with Kafka's errors (confluent-kafka's Python AdminClient has
  no such methods); racks in Metadata (kafka-python's ``describe_cluster``), in Tidelog's
  ``describe_cluster`` and in rack-aware placement;
* ``tidelog reassign generate|execute|verify`` and ``tidelog brokers decommission``.

Every wait is bounded.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import kafka.errors
import pytest
from confluent_kafka.admin import AdminClient as ConfluentAdmin
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.broker.cluster.workload import Workload
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.types import PartitionDescription

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
RACKS = {1: "a", 2: "a", 3: "b", 4: "b"}
THROTTLE_BYTES = 100_000  # bytes/s an adding replica fetches
RECORDS = 1_500  # of 1 KB: a throttled move of them lasts about 15 s
_topics = itertools.count()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {
        "replica.lag.time.max.ms": 3_000,
        "replica.fetch.backoff.ms": 200,
        "offsets.topic.num.partitions": 2,
        "offsets.topic.replication.factor": 2,
        "auto.leader.rebalance.enable": "false",
        "follower.replication.throttled.rate": THROTTLE_BYTES,
        "leader.replication.throttled.rate": THROTTLE_BYTES,
    }
    with LocalCluster(
        brokers=4,
        kafka=True,
        session_timeout_ms=3_000,
        settings=settings,
        broker_settings={b: {"broker.rack": r} for b, r in RACKS.items()},
    ) as running:
        yield running


def admin(cluster: LocalCluster) -> AdminClient:
    return AdminClient(cluster.bootstrap, request_timeout_ms=15_000)


def partition(cluster: LocalCluster, topic: str, index: int = 0) -> PartitionDescription:
    with admin(cluster) as client:
        return client.describe_topic(topic).partitions[index]


def new_topic(cluster: LocalCluster, partitions: int = 1, factor: int = 2) -> str:
    name = f"moved-{next(_topics)}"
    for broker in cluster.broker_ids:
        if not cluster.is_running(broker):
            cluster.start_broker(broker)
    with admin(cluster) as client:
        eventually(lambda: len(client.describe_cluster().brokers) == 4, 60)
        client.create_topic(
            name, partitions, {"min.insync.replicas": "2"}, replication_factor=factor
        )
        eventually(
            lambda: all(len(p.isr) == factor for p in client.describe_topic(name).partitions),
            60,
        )
    return name


def log_bytes(cluster: LocalCluster, broker: int, topic: str, index: int = 0) -> int:
    directory = cluster.data_dir(broker) / f"{topic}-{index}"
    return sum(f.stat().st_size for f in directory.glob("*.log")) if directory.exists() else 0


def reassignment_done(cluster: LocalCluster, topic: str, target: tuple[int, ...]) -> bool:
    with admin(cluster) as client:
        moving = client.list_partition_reassignments([TopicPartition(topic, 0)])
        found = client.describe_topic(topic).partitions[0]
    return not moving and tuple(found.replicas) == target and set(found.isr) == set(target)


def test_racks_are_reported_and_spread(cluster: LocalCluster) -> None:
    with admin(cluster) as client:
        described = {b.id: b.rack for b in client.describe_cluster().brokers}
    assert described == RACKS
    kafka_admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        brokers = kafka_admin.describe_cluster()["brokers"]  # from Metadata
    finally:
        kafka_admin.close()
    assert {b["broker_id"]: b["rack"] for b in brokers} == RACKS
    # confluent-kafka's describe_cluster asks DescribeCluster (API 60).
    confluent = ConfluentAdmin({"bootstrap.servers": cluster.kafka_bootstrap})
    nodes = confluent.describe_cluster(request_timeout=30).result(timeout=30).nodes
    assert {n.id: n.rack for n in nodes} == RACKS
    shown = tidelog(cluster, "cluster", "describe")
    assert shown.returncode == 0, shown.stderr
    table = shown.stdout.splitlines()[2:]
    assert table[0].split() == ["BROKER", "HOST", "PORT", "RACK", "CONTROLLER"]
    assert {int(line.split()[0]): line.split()[3] for line in table[1:]} == RACKS
    topic = new_topic(cluster, partitions=4)
    with admin(cluster) as client:
        for p in client.describe_topic(topic).partitions:
            assert {RACKS[r] for r in p.replicas} == {"a", "b"}, p.replicas


def test_a_partition_moves_to_other_replicas_under_acks_all_load(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    before = partition(cluster, topic)
    target = tuple(b for b in cluster.broker_ids if b not in before.replicas)
    load = Workload(cluster.bootstrap, topic, 1).start()
    try:
        load.wait_for_acks(300)
        with admin(cluster) as client:
            results = client.alter_partition_reassignments({TopicPartition(topic, 0): target})
        assert results == {TopicPartition(topic, 0): None}
        eventually(lambda: reassignment_done(cluster, topic, target), 120)
        load.wait_for_acks(300)
    finally:
        load.stop()
    counts = load.check()
    assert counts["acknowledged"] >= 600
    after = partition(cluster, topic)
    assert after.leader in target
    assert after.leader_epoch > before.leader_epoch
    for old in before.replicas:
        eventually(lambda old=old: log_bytes(cluster, old, topic) == 0, 30)  # type: ignore[misc]
    for new in target:
        assert log_bytes(cluster, new, topic) > 0


def test_the_next_controller_finishes_a_reassignment(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    value = b"x" * 1_000
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(RECORDS):  # 1.5 MB: about 15 s for a throttled adding replica
            producer.send(topic, value, key=str(i).encode())
        producer.flush(timeout_ms=60_000)
    before = partition(cluster, topic)
    target = tuple(b for b in cluster.broker_ids if b not in before.replicas)
    tp = KafkaTopicPartition(topic, 0)
    kafka_admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        assert kafka_admin.alter_partition_reassignments({tp: list(target)}) == {tp: None}
        moving = kafka_admin.list_partition_reassignments([tp])
    finally:
        kafka_admin.close()
    assert moving[tp]["adding_replicas"] == list(target)
    assert moving[tp]["removing_replicas"] == list(before.replicas)
    assert moving[tp]["replicas"] == [*target, *before.replicas]

    with admin(cluster) as client:
        controller = client.describe_cluster().controller_id
    cluster.kill(controller, signal.SIGKILL)
    with admin(cluster) as client:
        eventually(lambda: client.describe_cluster().controller_id not in (-1, controller), 60)
        # Still in progress after the failover, then done by the new controller.
        assert TopicPartition(topic, 0) in client.list_partition_reassignments()
        successor = client.describe_cluster().controller_id
    cluster.start_broker(controller)  # it may be a target replica: the move needs it
    eventually(lambda: reassignment_done(cluster, topic, target), 120)
    with admin(cluster) as client:
        assert client.describe_cluster().controller_id == successor
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        keys: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(keys) < RECORDS:
            assert time.monotonic() < deadline, f"read {len(keys)} of {RECORDS}"
            keys += [r.key or b"" for r in consumer.poll(timeout_ms=500)]
    assert keys == [str(i).encode() for i in range(RECORDS)]


def test_kafka_errors_of_a_reassignment(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    replicas = list(partition(cluster, topic).replicas)
    tp = KafkaTopicPartition(topic, 0)
    kafka_admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        answer = kafka_admin.alter_partition_reassignments(
            {
                tp: None,  # nothing to cancel
                KafkaTopicPartition(topic, 7): replicas,
                KafkaTopicPartition("no-such-topic", 0): replicas,
            }
        )
        assert answer[tp] is kafka.errors.NoReassignmentInProgressError
        assert answer[KafkaTopicPartition(topic, 7)] is kafka.errors.UnknownTopicOrPartitionError
        assert (
            answer[KafkaTopicPartition("no-such-topic", 0)]
            is kafka.errors.UnknownTopicOrPartitionError
        )
        for bad in ([replicas[0], replicas[0]], [replicas[0], 99]):
            refused = kafka_admin.alter_partition_reassignments({tp: bad})
            assert refused[tp] is kafka.errors.InvalidReplicationAssignmentError, bad
        assert kafka_admin.list_partition_reassignments([tp]) == {}
    finally:
        kafka_admin.close()
    assert list(partition(cluster, topic).replicas) == replicas


def tidelog(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidelog.client.cli", *args, "--bootstrap", cluster.bootstrap],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )


def test_generate_execute_verify_and_decommission(cluster: LocalCluster, tmp_path: Path) -> None:
    topic = new_topic(cluster, partitions=4)
    with admin(cluster) as client:
        before = {p.partition: tuple(p.replicas) for p in client.describe_topic(topic).partitions}
    # Without broker 4: only the partitions it holds move, and each keeps its other replica.
    generated = tidelog(cluster, "reassign", "generate", "--brokers", "1,2,3", "--topics", topic)
    assert generated.returncode == 0, generated.stderr
    plan = json.loads(generated.stdout)
    moved = {e["partition"]: tuple(e["replicas"]) for e in plan["partitions"]}
    assert set(moved) == {p for p, r in before.items() if 4 in r}
    for p, replicas in moved.items():
        assert 4 not in replicas
        assert len(set(replicas)) == 2
        assert set(before[p]) - {4} <= set(replicas)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(generated.stdout)
    executed = tidelog(cluster, "reassign", "execute", "--plan", str(plan_file))
    assert executed.returncode == 0, executed.stderr

    def verified() -> bool:
        return tidelog(cluster, "reassign", "verify", "--plan", str(plan_file)).returncode == 0

    eventually(verified, 120, interval_s=1)

    # Decommission broker 3: every replica it holds, of every topic, moves elsewhere.
    done = tidelog(cluster, "brokers", "decommission", "3", "--wait", "--timeout-ms", "180000")
    assert done.returncode == 0, done.stdout + done.stderr
    with admin(cluster) as client:
        for summary in client.list_topics(include_internal=True):
            for p in client.describe_topic(summary.name).partitions:
                assert 3 not in p.replicas, (summary.name, p)
    cluster.kill(3, signal.SIGTERM)
    with Producer(cluster.bootstrap, acks="all") as producer:
        producer.send(topic, b"after", partition=0).result(timeout=30)
    cluster.start_broker(3)


def test_a_cancelled_move_goes_back_to_the_old_replicas(cluster: LocalCluster) -> None:
    topic = new_topic(cluster)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(RECORDS):  # the throttled adding replicas need seconds for this
            producer.send(topic, b"y" * 1_000, key=str(i).encode())
        producer.flush(timeout_ms=60_000)
    before = partition(cluster, topic)
    target = tuple(b for b in cluster.broker_ids if b not in before.replicas)
    tp = TopicPartition(topic, 0)
    with admin(cluster) as client:
        assert client.alter_partition_reassignments({tp: target}) == {tp: None}
        moving = client.list_partition_reassignments()
    assert moving[tp].target == target
    cancelled = tidelog(cluster, "reassign", "cancel")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert "cancelled" in cancelled.stdout
    with admin(cluster) as client:
        assert client.list_partition_reassignments() == {}
        again = client.alter_partition_reassignments({tp: None})
    assert again[tp] is not None
    assert again[tp].code == "NO_REASSIGNMENT_IN_PROGRESS"
    # The controller has written the cancel; the broker answering metadata learns it by
    # its ZooKeeper watch, a moment later (as a Kafka broker learns by UpdateMetadata).
    eventually(lambda: tuple(partition(cluster, topic).replicas) == tuple(before.replicas), 30)
    after = partition(cluster, topic)
    assert tuple(after.replicas) == tuple(before.replicas)
    assert set(after.isr) <= set(before.replicas)
    assert after.leader in before.replicas
    assert after.log_end_offset == RECORDS
    for old in target:  # the adding replicas' partial copies go
        eventually(lambda old=old: log_bytes(cluster, old, topic) == 0, 30)  # type: ignore[misc]
