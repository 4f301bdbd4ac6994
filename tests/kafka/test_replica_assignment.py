"""Manual replica assignments on a single node (issue #27): CreateTopics ``assignments``
and CreatePartitions ``assignments`` through confluent-kafka's and kafka-python's admin
clients (the Kafka listener), Tidelog's ``AdminClient`` (gRPC) and ``tidelog topics``.

A single node is broker 0: an assignment naming only it is taken (and its partitions are
written and read where it says), any other broker is Kafka's
``INVALID_REPLICA_ASSIGNMENT``, with Kafka's message. The cluster side is
``tests/broker/cluster/test_replica_assignment_processes.py``.
"""

from __future__ import annotations

from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient as ConfluentAdmin
from confluent_kafka.admin import NewPartitions, NewTopic
from kafka.admin import KafkaAdminClient

from tests.cli import tidelog
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.transport import Transport
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import (
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
)

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 30
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_REQUEST = 42
UNKNOWN = "The manual partition assignment includes broker 1, but no such broker is registered."
TWICE = "The manual partition assignment includes the broker 0 more than once."


@pytest.fixture(scope="module")
def confluent(kafka_broker: KafkaBroker) -> ConfluentAdmin:
    return ConfluentAdmin({"bootstrap.servers": kafka_broker.bootstrap})


@pytest.fixture(scope="module")
def kafka_python(kafka_broker: KafkaBroker) -> Any:
    client = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    yield client
    client.close()


@pytest.fixture(scope="module")
def admin(kafka_broker: KafkaBroker) -> Any:
    with AdminClient(kafka_broker.address) as client:
        yield client


# librdkafka wants the partition count beside an assignment (it checks the two agree) and
# sends Kafka's -1 for it.


def confluent_error(future: Any) -> confluent_kafka.KafkaError:
    with pytest.raises(confluent_kafka.KafkaException) as caught:
        future.result(timeout=TIMEOUT_S)
    error: confluent_kafka.KafkaError = caught.value.args[0]
    return error


def test_confluent_creates_and_grows_a_topic_on_the_named_broker(
    kafka_broker: KafkaBroker, confluent: ConfluentAdmin, admin: AdminClient
) -> None:
    name = unique("assigned")
    futures = confluent.create_topics([NewTopic(name, 2, replica_assignment=[[0], [0]])])
    assert futures[name].result(timeout=TIMEOUT_S) is None
    described = admin.describe_topic(name)
    assert [(p.leader, p.replicas) for p in described.partitions] == [(0, (0,)), (0, (0,))]
    grown = confluent.create_partitions([NewPartitions(name, 3, replica_assignment=[[0]])])
    assert grown[name].result(timeout=TIMEOUT_S) is None
    assert [p.replicas for p in admin.describe_topic(name).partitions] == [(0,)] * 3
    # The new partition takes records where the assignment put it.
    with Producer(kafka_broker.address, acks="all") as producer:
        producer.send(name, b"on the assigned replica", partition=2)
        producer.flush(timeout_ms=TIMEOUT_S * 1000)
    with Consumer(kafka_broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(name, 2)])
        values: list[bytes] = []
        for _ in range(50):
            values += [r.value for r in consumer.poll(timeout_ms=200)]
            if values:
                break
    assert values == [b"on the assigned replica"]


def test_confluent_gets_kafkas_refusals(confluent: ConfluentAdmin, admin: AdminClient) -> None:
    names = {unique("unknown"): [[1]], unique("twice"): [[0, 0]]}
    futures = confluent.create_topics(
        [NewTopic(n, len(lists), replica_assignment=lists) for n, lists in names.items()]
    )
    errors = {n: confluent_error(f) for n, f in futures.items()}
    assert {e.code() for e in errors.values()} == {
        confluent_kafka.KafkaError.INVALID_REPLICA_ASSIGNMENT
    }
    unknown, twice = names
    assert errors[unknown].str() == UNKNOWN
    assert errors[twice].str() == TWICE
    assert not {t.name for t in admin.list_topics()} & set(names)

    name = unique("grown")
    admin.create_topic(name, 1)
    futures = confluent.create_partitions([NewPartitions(name, 3, replica_assignment=[[0]])])
    error = confluent_error(futures[name])
    assert error.code() == confluent_kafka.KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert error.str() == (
        "Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified."
    )
    futures = confluent.create_partitions([NewPartitions(name, 2, replica_assignment=[[1]])])
    assert confluent_error(futures[name]).str() == UNKNOWN
    assert len(admin.describe_topic(name).partitions) == 1


def test_confluent_validate_only_checks_the_assignment_and_creates_nothing(
    confluent: ConfluentAdmin, admin: AdminClient
) -> None:
    good, bad = unique("checked"), unique("refused")
    futures = confluent.create_topics(
        [NewTopic(good, 1, replica_assignment=[[0]]), NewTopic(bad, 1, replica_assignment=[[2]])],
        validate_only=True,
    )
    assert futures[good].result(timeout=TIMEOUT_S) is None
    assert confluent_error(futures[bad]).code() == (
        confluent_kafka.KafkaError.INVALID_REPLICA_ASSIGNMENT
    )
    assert not {t.name for t in admin.list_topics()} & {good, bad}
    admin.create_topic(good, 1)
    futures = confluent.create_partitions(
        [NewPartitions(good, 2, replica_assignment=[[0, 0]])], validate_only=True
    )
    assert confluent_error(futures[good]).str() == TWICE
    futures = confluent.create_partitions(
        [NewPartitions(good, 2, replica_assignment=[[0]])], validate_only=True
    )
    assert futures[good].result(timeout=TIMEOUT_S) is None
    assert len(admin.describe_topic(good).partitions) == 1


def test_kafka_python_assignments_and_the_minus_one_rule(
    kafka_python: Any, admin: AdminClient
) -> None:
    name = unique("kafka-python")
    answer = kafka_python.create_topics({name: {"assignments": {0: [0], 1: [0]}}})
    assert [(t["name"], t["error_code"]) for t in answer["topics"]] == [(name, 0)]
    assert len(admin.describe_topic(name).partitions) == 2
    kafka_python.create_partitions({name: {"count": 4, "assignments": [[0], [0]]}})
    assert len(admin.describe_topic(name).partitions) == 4

    refused = {
        unique("with-count"): {"num_partitions": 2, "assignments": {0: [0]}},
        unique("with-factor"): {"replication_factor": 1, "assignments": {0: [0]}},
        unique("gap"): {"assignments": {0: [0], 2: [0]}},
        unique("empty"): {"assignments": {0: []}},
    }
    answer = kafka_python.create_topics(refused, raise_errors=False)
    found = {t["name"]: (t["error_code"], t["error_message"]) for t in answer["topics"]}
    with_count, with_factor, gap, empty = refused
    assert found[with_count] == (
        INVALID_REQUEST,
        "A manual partition assignment was specified, but numPartitions was not set to -1.",
    )
    assert found[with_factor] == (
        INVALID_REQUEST,
        "A manual partition assignment was specified, but replication factor was not set to -1.",
    )
    assert found[gap] == (
        INVALID_REPLICA_ASSIGNMENT,
        "partitions should be a consecutive 0-based integer sequence",
    )
    assert found[empty] == (
        INVALID_REPLICA_ASSIGNMENT,
        "The manual partition assignment includes an empty replica list.",
    )
    answer = kafka_python.create_partitions(
        {name: {"count": 5, "assignments": [[3]]}}, raise_errors=False
    )
    assert [(r.error_code, r.error_message) for r in answer.results] == [
        (INVALID_REPLICA_ASSIGNMENT, UNKNOWN.replace("broker 1", "broker 3"))
    ]


def test_tidelogs_admin_client(admin: AdminClient) -> None:
    name = unique("tidelog")
    created = admin.create_topic(name, replica_assignment=[[0], [0], [0]])
    assert [p.replicas for p in created.partitions] == [(0,)] * 3
    assert admin.create_partitions(name, 4, replica_assignment=[[0]]) == 4
    assert admin.create_partitions(name, 5, replica_assignment=[[0]], validate_only=True) == 5
    with pytest.raises(InvalidReplicaAssignmentError, match="only 1 assignment"):
        admin.create_partitions(name, 6, replica_assignment=[[0]])
    with pytest.raises(InvalidReplicaAssignmentError, match="broker 0 more than once"):
        admin.create_partitions(name, 5, replica_assignment=[[0, 0]])
    assert len(admin.describe_topic(name).partitions) == 4
    with pytest.raises(InvalidReplicaAssignmentError) as caught:
        admin.create_topic(unique("refused"), replica_assignment=[[1]])
    assert str(caught.value) == UNKNOWN
    with pytest.raises(InvalidReplicaAssignmentError, match="more than once"):
        admin.create_topic(unique("refused"), replica_assignment=[[0, 0]])
    # The client refuses what it can see is wrong before sending.
    with pytest.raises(ValueError, match="leave partitions and replication_factor None"):
        admin.create_topic(unique("refused"), 2, replica_assignment=[[0]])
    with pytest.raises(ValueError, match="a list per partition"):
        admin.create_topic(unique("refused"), replica_assignment=[])
    # Without an assignment, a single node still keeps one replica.
    with pytest.raises(InvalidReplicationFactorError):
        admin.create_topic(unique("refused"), 1, replication_factor=2)


def test_the_command_line(kafka_broker: KafkaBroker, admin: AdminClient) -> None:
    address = kafka_broker.address
    name = unique("cli")
    made = tidelog("topics", "create", name, "--replica-assignment", "0,0", "--bootstrap", address)
    assert made.returncode == 0, made.stderr
    assert "with 2 partition(s)" in made.stderr
    # Kafka's form for growth: every partition's list, the existing ones ignored.
    grown = tidelog(
        "topics", "alter", name, "--partitions", "3", "--replica-assignment", "0,0,0",
        "--bootstrap", address,
    )  # fmt: skip
    assert grown.returncode == 0, grown.stderr
    # Only the new partitions' lists.
    grown = tidelog(
        "topics", "alter", name, "--partitions", "4", "--replica-assignment", "0",
        "--bootstrap", address,
    )  # fmt: skip
    assert grown.returncode == 0, grown.stderr
    assert [p.replicas for p in admin.describe_topic(name).partitions] == [(0,)] * 4
    refused = tidelog(
        "topics", "create", unique("cli"), "--replica-assignment", "0:1", "--bootstrap", address
    )
    assert refused.returncode != 0
    assert "INVALID_REPLICA_ASSIGNMENT" in refused.stderr or "no such broker" in refused.stderr
    usage = tidelog(
        "topics", "create", unique("cli"), "--replica-assignment", "0", "--partitions", "1",
        "--bootstrap", address,
    )  # fmt: skip
    assert usage.returncode == 2
    assert "leave out --partitions" in usage.stderr
    malformed = tidelog("topics", "create", unique("cli"), "--replica-assignment", "0:x")
    assert malformed.returncode == 2
    assert "must look like 1:2,2:3,3:1" in malformed.stderr


def test_grpc_refuses_a_count_or_a_factor_beside_an_assignment(
    kafka_broker: KafkaBroker, admin: AdminClient
) -> None:
    """The gRPC listener's 0 is Kafka's -1 (unset); anything else beside an assignment is
    Kafka's INVALID_REQUEST, whatever client sends it."""
    transport = Transport(kafka_broker.address, client_id="assign-grpc", request_timeout_ms=10_000)
    try:
        assignment = [pb.ReplicaList(brokers=[0])]
        refused = {
            "replication factor was not set to -1": pb.CreateTopicRequest(
                name=unique("grpc"), replication_factor=1, replica_assignment=assignment
            ),
            "numPartitions was not set to -1": pb.CreateTopicRequest(
                name=unique("grpc"), partitions=1, replica_assignment=assignment
            ),
        }
        for message, request in refused.items():
            with pytest.raises(InvalidRequestError, match=message):
                transport.call(transport.stub.CreateTopic, request, what="CreateTopic")
            assert request.name not in {t.name for t in admin.list_topics()}
    finally:
        transport.close()
