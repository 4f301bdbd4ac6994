"""Manual replica assignments in a four-broker cluster (issue #27): CreateTopics and
CreatePartitions with ``assignments``, through confluent-kafka's and kafka-python's admin
clients (the Kafka listener), Tidelog's ``AdminClient`` and ``tidelog topics``.

The controller writes the lists as given: each partition's replicas are the named
brokers, its leader the first of them, and records produced with ``acks=all`` land in the
data directories of exactly those brokers. Every refusal is Kafka's code and message.

Every wait is bounded.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient as ConfluentAdmin
from confluent_kafka.admin import NewPartitions, NewTopic
from kafka.admin import KafkaAdminClient

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Producer
from tidelog.storage.errors import InvalidReplicaAssignmentError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
TIMEOUT_S = 30
INVALID_REPLICA_ASSIGNMENT = 39
_topics = itertools.count()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {
        "offsets.topic.num.partitions": 2,
        "offsets.topic.replication.factor": 2,
        "auto.leader.rebalance.enable": "false",
    }
    with LocalCluster(brokers=4, kafka=True, settings=settings) as running:
        with admin(running) as client:
            eventually(lambda: len(client.describe_cluster().brokers) == 4, 60)
        yield running


def admin(cluster: LocalCluster) -> AdminClient:
    return AdminClient(cluster.bootstrap, request_timeout_ms=15_000)


def confluent(cluster: LocalCluster) -> ConfluentAdmin:
    return ConfluentAdmin({"bootstrap.servers": cluster.kafka_bootstrap})


def name() -> str:
    return f"assigned-{next(_topics)}"


def placement(cluster: LocalCluster, topic: str, count: int) -> list[tuple[int, tuple[int, ...]]]:
    """(leader, replicas) of each of the topic's ``count`` partitions, once the answering
    broker's view has them all (it learns a growth by its watch, a moment after the
    controller wrote it) and every replica is in sync."""
    with admin(cluster) as client:

        def settled() -> bool:
            partitions = client.describe_topic(topic).partitions
            return len(partitions) == count and all(
                set(p.isr) == set(p.replicas) for p in partitions
            )

        eventually(settled, 60)
        return [(p.leader, tuple(p.replicas)) for p in client.describe_topic(topic).partitions]


def log_bytes(cluster: LocalCluster, broker: int, topic: str, index: int) -> int:
    directory = cluster.data_dir(broker) / f"{topic}-{index}"
    return sum(f.stat().st_size for f in directory.glob("*.log")) if directory.exists() else 0


def lands_on(cluster: LocalCluster, topic: str, lists: list[list[int]]) -> None:
    """Produce to every partition with acks=all; each partition's records are then in the
    data directories of its named brokers, and only theirs."""
    with Producer(cluster.bootstrap, acks="all") as producer:
        for partition in range(len(lists)):
            producer.send(topic, b"x" * 100, partition=partition)
        producer.flush(timeout_ms=60_000)
    for partition, replicas in enumerate(lists):
        for broker in cluster.broker_ids:
            if broker in replicas:
                eventually(
                    lambda b=broker, p=partition: log_bytes(cluster, b, topic, p) > 0,  # type: ignore[misc]
                    30,
                )
            else:
                assert log_bytes(cluster, broker, topic, partition) == 0, (partition, broker)


def confluent_error(future: Any) -> confluent_kafka.KafkaError:
    with pytest.raises(confluent_kafka.KafkaException) as caught:
        future.result(timeout=TIMEOUT_S)
    error: confluent_kafka.KafkaError = caught.value.args[0]
    return error


def test_confluent_places_a_topic_and_its_growth_where_it_says(cluster: LocalCluster) -> None:
    topic = name()
    lists = [[1, 2], [3, 4], [4, 1]]
    client = confluent(cluster)
    futures = client.create_topics([NewTopic(topic, 3, replica_assignment=lists)])
    assert futures[topic].result(timeout=TIMEOUT_S) is None
    assert placement(cluster, topic, len(lists)) == [(r[0], tuple(r)) for r in lists]
    grown = [[2, 3], [3, 1]]
    futures = client.create_partitions([NewPartitions(topic, 5, replica_assignment=grown)])
    assert futures[topic].result(timeout=TIMEOUT_S) is None
    lists += grown
    assert placement(cluster, topic, len(lists)) == [(r[0], tuple(r)) for r in lists]
    lands_on(cluster, topic, lists)


def test_confluent_gets_kafkas_refusals(cluster: LocalCluster) -> None:
    client = confluent(cluster)
    refused = {
        name(): ([[1, 9]], "includes broker 9, but no such broker is registered."),
        name(): ([[2, 2]], "includes the broker 2 more than once."),
        name(): (
            [[1, 2], [3]],
            "includes a partition with 1 replica(s), but this is not consistent with "
            "previous partitions, which have 2 replica(s).",
        ),
    }
    futures = client.create_topics(
        [NewTopic(t, len(lists), replica_assignment=lists) for t, (lists, _) in refused.items()]
    )
    for topic, (_, message) in refused.items():
        error = confluent_error(futures[topic])
        assert error.code() == confluent_kafka.KafkaError.INVALID_REPLICA_ASSIGNMENT, topic
        assert error.str() == f"The manual partition assignment {message}"
    with admin(cluster) as tidelog_admin:
        assert not {t.name for t in tidelog_admin.list_topics()} & set(refused)

    topic = name()
    futures = client.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2]])])
    assert futures[topic].result(timeout=TIMEOUT_S) is None
    growth = [
        (
            3,
            [[3, 4]],
            "Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified.",
        ),
        (
            2,
            [[1, 2, 3]],
            "The manual partition assignment includes a partition with 3 replica(s), but "
            "this is not consistent with previous partitions, which have 2 replica(s).",
        ),
        (
            2,
            [[1, 7]],
            "The manual partition assignment includes broker 7, but no such broker is registered.",
        ),
    ]
    for total, lists, message in growth:
        futures = client.create_partitions([NewPartitions(topic, total, replica_assignment=lists)])
        error = confluent_error(futures[topic])
        assert error.code() == confluent_kafka.KafkaError.INVALID_REPLICA_ASSIGNMENT
        assert error.str() == message
    # validate_only: checked against the brokers, nothing created.
    futures = client.create_partitions(
        [NewPartitions(topic, 2, replica_assignment=[[3, 4]])], validate_only=True
    )
    assert futures[topic].result(timeout=TIMEOUT_S) is None
    futures = client.create_partitions(
        [NewPartitions(topic, 2, replica_assignment=[[3, 8]])], validate_only=True
    )
    assert confluent_error(futures[topic]).code() == (
        confluent_kafka.KafkaError.INVALID_REPLICA_ASSIGNMENT
    )
    assert placement(cluster, topic, 1) == [(1, (1, 2))]


def test_kafka_python_creates_and_grows(cluster: LocalCluster) -> None:
    topic = name()
    kafka_admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        answer = kafka_admin.create_topics({topic: {"assignments": {0: [4, 3, 2], 1: [1, 2, 3]}}})
        assert [t["error_code"] for t in answer["topics"]] == [0]
        kafka_admin.create_partitions({topic: {"count": 3, "assignments": [[2, 4, 1]]}})
        answer = kafka_admin.create_topics(
            {name(): {"assignments": {0: [1, 2], 1: [1, 5]}}}, raise_errors=False
        )
    finally:
        kafka_admin.close()
    assert [(t["error_code"], t["error_message"]) for t in answer["topics"]] == [
        (
            INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes broker 5, but no such broker is registered.",
        )
    ]
    lists = [[4, 3, 2], [1, 2, 3], [2, 4, 1]]
    assert placement(cluster, topic, len(lists)) == [(r[0], tuple(r)) for r in lists]
    lands_on(cluster, topic, lists)


def tidelog(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidelog.client.cli", *args, "--bootstrap", cluster.bootstrap],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )


def test_tidelogs_admin_client_and_command_line(cluster: LocalCluster) -> None:
    topic = name()
    with admin(cluster) as client:
        created = client.create_topic(topic, replica_assignment=[[3, 1], [1, 4]])
        assert [tuple(p.replicas) for p in created.partitions] == [(3, 1), (1, 4)]
        assert client.create_partitions(topic, 3, replica_assignment=[[4, 2]]) == 3
        with pytest.raises(InvalidReplicaAssignmentError, match="broker 6, but no such"):
            client.create_topic(name(), replica_assignment=[[6, 1]])
        with pytest.raises(InvalidReplicaAssignmentError, match="which have 2 replica"):
            client.create_partitions(topic, 4, replica_assignment=[[4]])
    assert placement(cluster, topic, 3) == [(3, (3, 1)), (1, (1, 4)), (4, (4, 2))]

    cli_topic = name()
    made = tidelog(cluster, "topics", "create", cli_topic, "--replica-assignment", "1:2,2:3,3:1")
    assert made.returncode == 0, made.stderr
    grown = tidelog(
        cluster, "topics", "alter", cli_topic, "--partitions", "4",
        "--replica-assignment", "1:2,2:3,3:1,4:3",
    )  # fmt: skip
    assert grown.returncode == 0, grown.stderr
    lists = [[1, 2], [2, 3], [3, 1], [4, 3]]
    assert placement(cluster, cli_topic, len(lists)) == [(r[0], tuple(r)) for r in lists]
    refused = tidelog(
        cluster, "topics", "alter", cli_topic, "--partitions", "5", "--replica-assignment", "4"
    )
    assert refused.returncode != 0
    assert "which have 2 replica(s)" in refused.stderr
