"""Topic administration forwarded to the controller (#27, KIP-590's idea,
``broker.cluster.forwarding``): a topic admin call that reaches a broker which is not the
controller succeeds there, on both listeners, with the controller's errors; the
controller moving mid-call is retried on the next one.

Every call here is sent to one named broker that is not the controller (raw Kafka
requests, a gRPC connection to that broker only), so the forwarding path is the one
taken; confluent-kafka's AdminClient is bootstrapped on that broker alone as well.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient as KafkaAdminClient
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from kafka.protocol.admin import IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.kafka import raw
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, TopicPartition
from tidelog.client.connection import Connection
from tidelog.client.grpc_connection import grpc_connections
from tidelog.client.types import AlterConfigOp
from tidelog.client.types import ConfigResource as TidelogResource
from tidelog.storage.errors import (
    InvalidPartitionsError,
    TidelogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

pytestmark = pytest.mark.slow
TIMEOUT_MS = 30_000
TIMEOUT_S = TIMEOUT_MS / 1000


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(
        brokers=3,
        session_timeout_ms=3_000,
        kafka=True,
        settings={"auto.create.topics.enable": "true"},
    ) as running:
        yield running


def controller_id(cluster: LocalCluster) -> int:
    with AdminClient(cluster.bootstrap, request_timeout_ms=TIMEOUT_MS) as admin:

        def found() -> int:
            return admin.describe_cluster().controller_id

        eventually(lambda: found() > 0)
        return found()


def not_the_controller(cluster: LocalCluster) -> int:
    controller = controller_id(cluster)
    return next(b for b in cluster.broker_ids if b != controller)


def kafka_call(cluster: LocalCluster, broker_id: int, request: Any) -> bytes:
    host, port = cluster.kafka_address(broker_id).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        answer = raw.call(sock, request, "test-forwarding")
    assert answer is not None, "the broker closed the connection"
    return answer


@contextmanager
def grpc_to(cluster: LocalCluster, broker_id: int) -> Iterator[Connection]:
    """A connection to ``broker_id`` only (no routing: what it answers is its own)."""
    connect = grpc_connections(
        client_id="test-forwarding", request_timeout_ms=TIMEOUT_MS, reconnect_backoff_max_ms=500
    )
    connection = connect(cluster.address(broker_id))
    try:
        yield connection
    finally:
        connection.close()


def test_a_topics_incremental_alter_configs_through_a_non_controllers_kafka_listener(
    cluster: LocalCluster,
) -> None:
    other = not_the_controller(cluster)
    with AdminClient(cluster.bootstrap, request_timeout_ms=TIMEOUT_MS) as admin:
        admin.create_topic("fwd-configs", 2, replication_factor=2)
    # The broker computes the new config from its own view of the topic (its watch on
    # ZooKeeper learns the creation a moment later), then forwards it.
    with grpc_to(cluster, other) as connection:

        def known(c: Connection = connection) -> bool:
            try:
                c.describe_topic("fwd-configs", timeout_ms=TIMEOUT_MS)
            except UnknownTopicOrPartitionError:
                return False
            return True

        eventually(known)
    # A raw IncrementalAlterConfigs v1 to that broker (it answered NOT_CONTROLLER before).
    alter = IncrementalAlterConfigsRequest[1]
    request = alter(
        resources=[
            alter.AlterConfigsResource(
                resource_type=2,
                resource_name="fwd-configs",
                configs=[
                    alter.AlterConfigsResource.AlterableConfig(
                        name="retention.ms", config_operation=0, value="3600000"
                    )
                ],
            )
        ],
        validate_only=False,
    )
    answer = IncrementalAlterConfigsResponse[1].decode(
        kafka_call(cluster, other, request), header=True
    )
    assert [(r.error_code, r.resource_name) for r in answer.responses] == [(0, "fwd-configs")]
    # confluent-kafka's AdminClient, knowing only that broker.
    client = KafkaAdminClient({"bootstrap.servers": cluster.kafka_address(other)})
    resource = ConfigResource(
        ResourceType.TOPIC,
        "fwd-configs",
        incremental_configs=[
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)
        ],
    )
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=TIMEOUT_S)
    # The controller's own error, through the forwarding broker: an unknown topic.
    missing = ConfigResource(
        ResourceType.TOPIC,
        "fwd-no-such-topic",
        incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    (pending,) = client.incremental_alter_configs([missing]).values()
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        pending.result(timeout=TIMEOUT_S)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART
    # Every broker's view (and logs) show both changes.
    for broker_id in cluster.broker_ids:
        with grpc_to(cluster, broker_id) as connection:

            def configured(c: Connection = connection) -> bool:
                config = c.describe_topic("fwd-configs", timeout_ms=TIMEOUT_MS).config
                return (
                    config.get("retention.ms") == "3600000"
                    and config.get("cleanup.policy") == "compact,delete"
                )

            eventually(configured)


def test_metadata_auto_creates_a_topic_through_a_non_controller(cluster: LocalCluster) -> None:
    other = not_the_controller(cluster)
    request = MetadataRequest[7](
        topics=[MetadataRequest.MetadataRequestTopic(name="fwd-auto")],
        allow_auto_topic_creation=True,
    )
    answer = MetadataResponse[7].decode(kafka_call(cluster, other, request), header=True)
    (topic,) = answer.topics
    assert (topic.error_code, topic.name) == (0, "fwd-auto")
    assert len(topic.partitions) >= 1
    # A Kafka producer knowing only that broker writes to a topic nobody created.
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_address(other)})
    delivered: list[Any] = []
    producer.produce("fwd-auto-produced", b"v", on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(TIMEOUT_S) == 0
    assert delivered == [None]


def test_tidelogs_admin_calls_through_a_non_controllers_grpc_listener(
    cluster: LocalCluster,
) -> None:
    other = not_the_controller(cluster)
    with grpc_to(cluster, other) as connection:
        created = connection.create_topic("fwd-grpc", 1, 2, {}, timeout_ms=TIMEOUT_MS)
        assert len(created.partitions) == 1
        with pytest.raises(TopicAlreadyExistsError):
            connection.create_topic("fwd-grpc", 1, 2, {}, timeout_ms=TIMEOUT_MS)
        assert (
            connection.create_partitions("fwd-grpc", 3, validate_only=False, timeout_ms=TIMEOUT_MS)
            == 3
        )
        with pytest.raises(InvalidPartitionsError):
            connection.create_partitions("fwd-grpc", 2, validate_only=False, timeout_ms=TIMEOUT_MS)
        connection.incremental_alter_configs(
            TidelogResource.topic("fwd-grpc"),
            [AlterConfigOp("segment.ms", "set", "600000")],
            validate_only=False,
            timeout_ms=TIMEOUT_MS,
        )
        described = connection.describe_topic("fwd-grpc", timeout_ms=TIMEOUT_MS)
        assert described.config["segment.ms"] == "600000"
        # Answers with data come back decoded: per-partition election results, the
        # controller's UNKNOWN_TOPIC_OR_PARTITION for a partition it does not know.
        elected = connection.elect_leaders(
            False,
            [TopicPartition("fwd-grpc", 0), TopicPartition("fwd-grpc", 9)],
            timeout_ms=TIMEOUT_MS,
        )
        assert isinstance(elected[TopicPartition("fwd-grpc", 9)], UnknownTopicOrPartitionError)
        assert connection.list_partition_reassignments(None, timeout_ms=TIMEOUT_MS) == {}
        connection.delete_topic("fwd-grpc", timeout_ms=TIMEOUT_MS)
        with pytest.raises(UnknownTopicOrPartitionError):
            connection.describe_topic("fwd-grpc", timeout_ms=TIMEOUT_MS)


def test_a_call_made_while_the_controller_dies_goes_to_the_next_one(
    cluster: LocalCluster,
) -> None:
    """The forwarding broker's view still names the dead controller until its session
    expires: the first attempt cannot reach it, the retry goes to the one elected next
    (or runs here, if this broker is elected)."""
    dead = controller_id(cluster)
    other = next(b for b in cluster.broker_ids if b != dead)
    cluster.kill(dead)
    try:
        with grpc_to(cluster, other) as connection:
            created = connection.create_topic("fwd-moved", 1, 2, {}, timeout_ms=TIMEOUT_MS)
            assert len(created.partitions) == 1
    finally:
        cluster.start_broker(dead)
        cluster.wait_converged()

    def everywhere() -> bool:
        for broker_id in cluster.broker_ids:
            with grpc_to(cluster, broker_id) as connection:
                try:
                    connection.describe_topic("fwd-moved", timeout_ms=5_000)
                except TidelogError:
                    return False
        return True

    eventually(everywhere)
