"""The Kafka listener in cluster mode: three real broker processes with Kafka listeners on a
real ZooKeeper (``LocalCluster(kafka=True)``), driven by kafka-python and confluent-kafka.

Every broker's Metadata lists all three brokers' Kafka endpoints and the same leaders,
replicas, ISR and epochs as the gRPC view; a non-leader answers a produce with
``NOT_LEADER_OR_FOLLOWER``; a non-controller forwards a CreateTopics to the controller
(``broker.cluster.forwarding``) and answers it;
every broker names the same group coordinator's Kafka endpoint, and only it serves the
group; and after the group's coordinator, which also leads a partition, is SIGKILLed, an
idempotent ``acks=all`` producer and the consumer group follow the new leaders with
nothing acknowledged lost. That test kills a broker, so it runs last (the module's
cluster is not restarted). Every wait is bounded; the module takes 15-30 s.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient as ConfluentAdmin
from confluent_kafka.admin import NewTopic as ConfluentTopic
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
)
from kafka.protocol.consumer import HeartbeatRequest, HeartbeatResponse
from kafka.protocol.metadata import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceResponse

from tests.broker.cluster.conftest import require_zookeeper
from tests.kafka import raw
from tests.kafka.conftest import unique
from tidelog import client
from tidelog.broker.cluster.testing import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

TIMEOUT_S = 20.0
_NOT_LEADER_OR_FOLLOWER = 6
_TOPIC_ALREADY_EXISTS = 36
_LEADER_NOT_AVAILABLE = 5
_NOT_COORDINATOR = 16
_UNKNOWN_MEMBER_ID = 25
_GROUP_ID_NOT_FOUND = 69


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(brokers=3, kafka=True, session_timeout_ms=3_000) as running:
        yield running


def survivor_of(cluster: LocalCluster, victim: int) -> int:
    """A broker other than ``victim``."""
    return next(b for b in cluster.broker_ids if b != victim)


def eventually(check: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout_s:.0f} s"
        time.sleep(0.1)


def create_topic(cluster: LocalCluster, name: str, partitions: int, factor: int) -> None:
    """Through confluent-kafka's admin client (it sends CreateTopics to the controller);
    returns once every running broker's Metadata shows every partition with a leader (the
    controller answers once its own view has the topic; the others' views follow)."""
    admin = ConfluentAdmin({"bootstrap.servers": cluster.kafka_bootstrap})
    # min.insync.replicas above the replication factor is refused (POLICY_VIOLATION).
    config = {"min.insync.replicas": str(min(2, factor))}
    topic = ConfluentTopic(name, partitions, factor, config=config)
    futures = admin.create_topics([topic], operation_timeout=TIMEOUT_S, request_timeout=TIMEOUT_S)
    futures[name].result(TIMEOUT_S)

    def everywhere() -> bool:
        for broker_id in cluster.broker_ids:
            (found,) = kafka_metadata(cluster, broker_id, name).topics
            if found.error_code or len(found.partitions) != partitions:
                return False
            if any(p.error_code or p.leader_id < 0 for p in found.partitions):
                return False
        return True

    eventually(everywhere, f"{name} in every broker's view")


def kafka_metadata(cluster: LocalCluster, broker_id: int, topic: str) -> Any:
    """Metadata v7 (leader epochs) from one broker, on a raw connection."""
    request = MetadataRequest[7](topics=[MetadataRequest.MetadataRequestTopic(name=topic)])
    return MetadataResponse[7].decode(_call(cluster, broker_id, request), header=True)


def _call(cluster: LocalCluster, broker_id: int, request: Any) -> bytes:
    """One request on a new connection to ``broker_id``'s Kafka listener; the response
    frame (header and body)."""
    host, port = cluster.kafka_address(broker_id).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        answer = raw.call(sock, request, "test-cluster")
    assert answer is not None, "the broker closed the connection"
    return answer


def test_every_broker_lists_every_broker_with_kafka_python_and_confluent(
    cluster: LocalCluster,
) -> None:
    expected = {
        (b, "127.0.0.1", int(cluster.kafka_address(b).rsplit(":", 1)[1]))
        for b in cluster.broker_ids
    }
    controller = client.AdminClient(cluster.bootstrap).describe_cluster().controller_id
    for broker_id in cluster.broker_ids:
        # Bootstrapped from one broker only: the others come from its Metadata.
        admin = ConfluentAdmin({"bootstrap.servers": cluster.kafka_address(broker_id)})
        answer = admin.list_topics(timeout=TIMEOUT_S)
        assert {(b.id, b.host, b.port) for b in answer.brokers.values()} == expected
        assert answer.controller_id == controller
    kafka_python = KafkaAdminClient(
        bootstrap_servers=cluster.kafka_address(2), request_timeout_ms=int(TIMEOUT_S * 1000)
    )
    try:
        described = kafka_python.describe_cluster()  # DescribeCluster
    finally:
        kafka_python.close()
    assert {(b["broker_id"], b["host"], b["port"]) for b in described["brokers"]} == expected
    assert described["controller_id"] == controller


def test_partitions_answer_the_clusters_leaders_replicas_isr_and_epochs(
    cluster: LocalCluster,
) -> None:
    topic = unique("placed")
    create_topic(cluster, topic, 3, 3)
    grpc_admin = client.AdminClient(cluster.bootstrap)

    def grpc_view() -> dict[int, tuple[int, int, list[int], list[int]]]:
        return {
            p.partition: (p.leader, p.leader_epoch, list(p.replicas), sorted(p.isr))
            for p in grpc_admin.describe_topic(topic).partitions
        }

    eventually(
        lambda: all(len(isr) == 3 for *_, isr in grpc_view().values()), "every replica in sync"
    )
    expected = grpc_view()
    assert len({leader for leader, *_ in expected.values()}) == 3  # one leader per broker
    for broker_id in cluster.broker_ids:
        answer = kafka_metadata(cluster, broker_id, topic)
        (found,) = answer.topics
        assert found.error_code == 0
        got = {
            p.partition_index: (p.leader_id, p.leader_epoch, p.replica_nodes, sorted(p.isr_nodes))
            for p in found.partitions
        }
        assert got == expected, f"broker {broker_id}"
        assert all(p.error_code == 0 and not p.offline_replicas for p in found.partitions)


def test_a_non_leader_refuses_and_a_non_controller_forwards(cluster: LocalCluster) -> None:
    topic = unique("wrong")
    create_topic(cluster, topic, 1, 2)
    (found,) = kafka_metadata(cluster, 1, topic).topics
    (partition,) = found.partitions
    outsider = next(b for b in cluster.broker_ids if b != partition.leader_id)
    produce = raw.produce_request(topic, b"misdirected")
    answer = ProduceResponse[7].decode(_call(cluster, outsider, produce), header=True)
    assert answer.responses[0].partition_responses[0].error_code == _NOT_LEADER_OR_FOLLOWER

    controller = client.AdminClient(cluster.bootstrap).describe_cluster().controller_id
    other = next(b for b in cluster.broker_ids if b != controller)
    elsewhere = unique("elsewhere")
    create = CreateTopicsRequest[4](
        topics=[
            CreateTopicsRequest.CreatableTopic(
                name=elsewhere,
                num_partitions=1,
                replication_factor=1,
                assignments=[],
                configs=[],
            )
        ],
        timeout_ms=5_000,
        validate_only=False,
    )
    created = CreateTopicsResponse[4].decode(_call(cluster, other, create), header=True)
    assert created.topics[0].error_code == 0  # forwarded (it answered NOT_CONTROLLER, 41)
    (shown,) = kafka_metadata(cluster, other, elsewhere).topics
    assert (shown.error_code, len(shown.partitions)) == (0, 1)
    again = CreateTopicsResponse[4].decode(_call(cluster, other, create), header=True)
    assert again.topics[0].error_code == _TOPIC_ALREADY_EXISTS  # the controller's refusal


def test_every_broker_names_the_coordinators_kafka_endpoint(cluster: LocalCluster) -> None:
    group = unique("coordinated")
    found = set()
    for broker_id in cluster.broker_ids:
        request = FindCoordinatorRequest[1](key=group, key_type=0)
        answer = FindCoordinatorResponse[1].decode(_call(cluster, broker_id, request), header=True)
        assert answer.error_code == 0
        found.add((answer.node_id, f"{answer.host}:{answer.port}"))
    ((coordinator, address),) = found  # every broker names the same one
    assert address == cluster.kafka_address(coordinator)
    for broker_id in cluster.broker_ids:
        # A classic group lives on its coordinator only: elsewhere NOT_COORDINATOR.
        request = HeartbeatRequest[0](group_id=group, generation_id=1, member_id="nobody")
        answer = HeartbeatResponse[0].decode(_call(cluster, broker_id, request), header=True)
        expected = _UNKNOWN_MEMBER_ID if broker_id == coordinator else _NOT_COORDINATOR
        assert answer.error_code == expected, f"broker {broker_id}"


def test_a_cluster_serves_transactions(cluster: LocalCluster) -> None:
    """Every broker names the same transaction coordinator (FindCoordinator key type 1:
    the leader of the id's ``__transaction_state`` partition, which the controller
    created) and a transactional producer commits through it
    (``tests/kafka/test_transactions_cluster.py`` has the failure cases)."""
    tid = unique("txn")

    def named() -> set[int]:
        found = set()
        for broker_id in cluster.broker_ids:
            request = FindCoordinatorRequest[1](key=tid, key_type=1)
            frame = _call(cluster, broker_id, request)
            answer = FindCoordinatorResponse[1].decode(frame, header=True)
            found.add(answer.node_id if answer.error_code == 0 else -1)
        return found

    # COORDINATOR_NOT_AVAILABLE until the controller created the topic and its leaders.
    eventually(lambda: len(named()) == 1 and -1 not in named(), "one coordinator named")
    topic = unique("txn-data")
    create_topic(cluster, topic, 1, 3)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": tid}
    )
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, b"atomic")
    producer.commit_transaction(TIMEOUT_S)
    admin = KafkaAdminClient(
        bootstrap_servers=cluster.kafka_bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000)
    )
    try:
        eventually(
            lambda: admin.describe_transactions([tid])[tid].state.value == "CompleteCommit",
            "the commit completed",
        )
    finally:
        admin.close()


def _coordinators(cluster: LocalCluster, broker_id: int, groups: list[str]) -> dict[str, int]:
    """Batched FindCoordinator v4 (KIP-699) asked of ``broker_id``: group -> node id."""
    request = FindCoordinatorRequest[4](key_type=0, coordinator_keys=groups)
    answer = FindCoordinatorResponse[4].decode(_call(cluster, broker_id, request), header=True)
    assert [c.key for c in answer.coordinators] == groups
    for c in answer.coordinators:
        assert c.error_code == 0, c
        assert f"{c.host}:{c.port}" == cluster.kafka_address(c.node_id)
    return {c.key: c.node_id for c in answer.coordinators}


def test_batched_find_coordinator_and_group_deletion_at_the_coordinator_only(
    cluster: LocalCluster,
) -> None:
    groups = [unique("batched") for _ in range(6)]
    answers = [_coordinators(cluster, b, groups) for b in cluster.broker_ids]
    assert all(a == answers[0] for a in answers)  # every broker names the same ones
    group = groups[0]
    coordinator = answers[0][group]
    for broker_id in cluster.broker_ids:
        request = DeleteGroupsRequest[2](groups_names=[group])
        answer = DeleteGroupsResponse[2].decode(_call(cluster, broker_id, request), header=True)
        expected = _GROUP_ID_NOT_FOUND if broker_id == coordinator else _NOT_COORDINATOR
        assert [r.error_code for r in answer.results] == [expected], f"broker {broker_id}"


def test_producer_and_group_follow_a_sigkilled_leader_losing_nothing_acknowledged(
    cluster: LocalCluster,
) -> None:
    topic = unique("failover")
    create_topic(cluster, topic, 3, 3)
    offline_topic = unique("single")  # replication factor 1: offline with its broker
    group = unique("followers")
    create_topic(cluster, offline_topic, 3, 1)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "message.timeout.ms": 40_000,
        }
    )
    acknowledged: set[bytes] = set()
    failed: list[Any] = []

    def delivered(err: Any, message: Any) -> None:
        if err is None:
            acknowledged.add(message.value())
        else:
            failed.append(err)

    def produce(first: int, count: int) -> None:
        for i in range(first, first + count):
            producer.produce(topic, value=b"%06d" % i, key=b"%d" % i, on_delivery=delivered)
            producer.poll(0)
        assert producer.flush(45) == 0, "records left undelivered"

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6_000,
            "heartbeat.interval.ms": 500,
        }
    )
    read: set[bytes] = set()

    def consume_until(wanted: set[bytes], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not wanted <= read and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue  # errors while leaders move are retried by the client
            read.add(message.value())
            consumer.commit(message, asynchronous=True)
        missing = wanted - read
        assert not missing, f"{len(missing)} acknowledged records never read"

    try:
        consumer.subscribe([topic])
        produce(0, 200)
        assert not failed, failed
        assert len(acknowledged) == 200
        consume_until(set(acknowledged), 30)

        (found,) = kafka_metadata(cluster, 1, topic).topics
        # The victim is the group's coordinator and leads a partition of the topic (the
        # three leaders are on three brokers): the group moves too.
        request = FindCoordinatorRequest[1](key=group, key_type=0)
        victim = FindCoordinatorResponse[1].decode(_call(cluster, 1, request), header=True).node_id
        (led,) = [p for p in found.partitions if p.leader_id == victim]
        old_epoch = led.leader_epoch
        # Another group the victim coordinates: an offset deleted there (OffsetDelete,
        # KIP-496) must stay deleted when the coordinator moves (a replicated tombstone).
        candidates = [unique("tombstoned") for _ in range(40)]  # one is the victim's
        coordinated = _coordinators(cluster, survivor_of(cluster, victim), candidates)
        doomed = next(g for g in candidates if coordinated[g] == victim)
        tps = [client.TopicPartition(topic, p) for p in range(3)]
        with client.AdminClient(cluster.bootstrap) as admin:
            admin.alter_group_offsets(doomed, dict.fromkeys(tps, 7))
        kafka_admin = KafkaAdminClient(
            bootstrap_servers=cluster.kafka_bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000)
        )
        try:
            deleted = kafka_admin.delete_group_offsets(doomed, [KafkaTopicPartition(topic, 0)])
        finally:
            kafka_admin.close()
        assert {tp.partition: error.errno for tp, error in deleted.items()} == {0: 0}
        cluster.kill(victim, signal.SIGKILL)
        survivor = next(b for b in cluster.broker_ids if b != victim)

        def moved() -> bool:
            answer = kafka_metadata(cluster, survivor, topic)
            partition = answer.topics[0].partitions[led.partition_index]
            return (
                victim not in {b.node_id for b in answer.brokers}
                and partition.leader_id not in (victim, -1)
                and partition.leader_epoch > old_epoch
            )

        eventually(moved, "a new leader elected and the dead broker unlisted")
        (single,) = kafka_metadata(cluster, survivor, offline_topic).topics
        dead = [p for p in single.partitions if p.replica_nodes == [victim]]
        assert dead, single
        for p in dead:
            assert (p.error_code, p.leader_id, p.offline_replicas) == (
                _LEADER_NOT_AVAILABLE,
                -1,
                [victim],
            )

        produce(200, 200)
        assert not failed, failed
        assert len(acknowledged) == 400
        consume_until(set(acknowledged), 40)
        # The group moved to a survivor with its offsets; the deleted one stays deleted.
        with client.AdminClient(cluster.address(survivor)) as admin:
            assert admin.list_group_offsets(doomed) == {tps[1]: 7, tps[2]: 7}
    finally:
        consumer.close()
        producer.flush(5)
