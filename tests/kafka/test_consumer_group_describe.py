"""ConsumerGroupDescribe (KIP-848) over the Kafka listener: confluent-kafka's
``describe_consumer_groups`` of a group its ``group.protocol=consumer`` member joined (the
core's own coordinator), a raw request for the fields librdkafka does not surface, and
``GROUP_ID_NOT_FOUND`` for a group that is not a consumer group."""

from __future__ import annotations

import io
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from kio.schema.consumer_group_describe.v0.request import ConsumerGroupDescribeRequest
from kio.schema.consumer_group_describe.v0.response import ConsumerGroupDescribeResponse
from kio.serial import entity_reader, entity_writer

from tests.kafka import raw
from tests.kafka.clients import TIMEOUT_S
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.broker.kafka.kip848 import topic_id
from tidelog.client import AdminClient

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def member(kafka_broker: KafkaBroker) -> Iterator[tuple[str, str]]:
    """A confluent-kafka KIP-848 member of a new group on a new 2-partition topic, with
    its assignment received: (topic, group)."""
    topic, group_id = unique("cgd"), unique("cgd-group")
    with AdminClient(kafka_broker.address) as admin:
        admin.create_topic(topic, 2)
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": group_id,
            "group.protocol": "consumer",
            "client.id": "describe-me",
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + TIMEOUT_S
    while not consumer.assignment():
        assert time.monotonic() < deadline, "no assignment"
        consumer.poll(0.2)
    try:
        yield topic, group_id
    finally:
        consumer.close()


def _describe(kafka_broker: KafkaBroker, group_id: str) -> Any:
    """One raw ConsumerGroupDescribe v0 (kafka-python has no class for it: kio writes the
    body, the flexible header v2 is written here); the one group's answer."""
    body = io.BytesIO()
    entity_writer(ConsumerGroupDescribeRequest)(
        body,
        ConsumerGroupDescribeRequest(group_ids=(group_id,), include_authorized_operations=True),
    )
    client_id = b"test-cgd"
    header = struct.pack(">hhih", 69, 0, 1, len(client_id)) + client_id + b"\x00"
    frame = header + body.getvalue()
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        answer = raw.read_frame(sock)
    assert answer is not None, "the broker hung up"
    # Response header v1: the correlation id, then an empty tagged-field section.
    assert struct.unpack_from(">i", answer)[0] == 1
    response, _ = entity_reader(ConsumerGroupDescribeResponse)(answer, 5)
    (described,) = response.groups
    return described


def test_a_kip848_group_is_described(kafka_broker: KafkaBroker, member: tuple[str, str]) -> None:
    topic, group_id = member
    described = _describe(kafka_broker, group_id)
    assert (described.error_code, described.group_state) == (0, "Stable")
    assert described.assignment_epoch == described.group_epoch >= 1
    assert described.assignor_name == "uniform"
    (m,) = described.members
    assert (m.client_id, list(m.subscribed_topic_names)) == ("describe-me", [topic])
    (assigned,) = m.assignment.topic_partitions
    assert (assigned.topic_name, sorted(assigned.partitions)) == (topic, [0, 1])
    assert assigned.topic_id == topic_id(topic)
    assert m.target_assignment.topic_partitions[0].partitions == assigned.partitions
    assert described.authorized_operations > 0  # asked for: every operation (no authorizer)


def test_confluent_describes_the_kip848_group(
    kafka_broker: KafkaBroker, member: tuple[str, str]
) -> None:
    _, group_id = member
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    (future,) = admin.describe_consumer_groups([group_id]).values()
    described = future.result(TIMEOUT_S)
    assert described.type == confluent_kafka.ConsumerGroupType.CONSUMER
    (m,) = described.members
    assert m.client_id == "describe-me"
    assert sorted(tp.partition for tp in m.assignment.topic_partitions) == [0, 1]


def test_a_group_that_is_not_a_consumer_group_is_not_found(kafka_broker: KafkaBroker) -> None:
    group_id = unique("offsets-only")
    kafka_broker.broker.server.core.create_topic(group_id, 1, {})
    described = _describe(kafka_broker, group_id)
    assert (described.error_code, described.members) == (69, ())  # GROUP_ID_NOT_FOUND
