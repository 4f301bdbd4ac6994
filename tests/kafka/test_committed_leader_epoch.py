"""The committed leader epoch (KIP-320, issue #25 item 3) over the Kafka listener: what
OffsetCommit stores, OffsetFetch returns (and Tidelog's own OffsetFetch too), through raw
requests, kafka-python and confluent-kafka; and OffsetForLeaderEpoch, advertised and
answered."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import kafka
import kafka.admin
import pytest
from kafka.protocol.consumer import (
    OffsetCommitResponse,
    OffsetFetchResponse,
    OffsetForLeaderEpochResponse,
)
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaTopicPartition

from tests.kafka import raw
from tests.kafka.clients import TIMEOUT_S, Out, produce
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)


def _topic(broker: KafkaBroker, partitions: int = 2) -> str:
    topic = unique("epoch")
    admin = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([kafka.admin.NewTopic(topic, partitions, 1)])
    finally:
        admin.close()
    return topic


@pytest.fixture
def sock(kafka_broker: KafkaBroker) -> Iterator[socket.socket]:
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as connection:
        connection.settimeout(TIMEOUT_S)
        yield connection


def _call(sock: socket.socket, request: Any, response_class: Any) -> Any:
    answer = raw.call(sock, request, "test-epoch")
    assert answer is not None, "the broker hung up"
    return response_class[request.version].decode(answer, header=True)


def _committed(sock: socket.socket, group: str, topic: str, version: int) -> dict[int, Any]:
    request = raw.offset_fetch_request(group, topic, [0, 1], version=version)
    answer = _call(sock, request, OffsetFetchResponse)
    assert answer.error_code == 0
    (entry,) = answer.topics
    return {
        p.partition_index: (p.committed_offset, p.committed_leader_epoch, p.metadata)
        for p in entry.partitions
    }


@pytest.mark.parametrize("fetch_version", [5, 7])
def test_raw_offset_commit_and_fetch_keep_the_leader_epoch(
    kafka_broker: KafkaBroker, sock: socket.socket, fetch_version: int
) -> None:
    topic, group = _topic(kafka_broker), unique("g")
    request = raw.offset_commit_request(group, topic, {0: (5, 1), 1: (7, 2)})
    answer = _call(sock, request, OffsetCommitResponse)
    assert [p.error_code for t in answer.topics for p in t.partitions] == [0, 0]
    assert _committed(sock, group, topic, fetch_version) == {0: (5, 1, "m"), 1: (7, 2, "m")}


def test_the_two_listeners_share_the_epoch(kafka_broker: KafkaBroker, sock: socket.socket) -> None:
    topic, group = _topic(kafka_broker), unique("g")
    _call(sock, raw.offset_commit_request(group, topic, {0: (5, 3)}), OffsetCommitResponse)
    with kafka_broker.broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        answer = stub.OffsetFetch(pb.OffsetFetchRequest(group_id=group), timeout=TIMEOUT_S)
        assert [(o.partition, o.offset, o.leader_epoch) for o in answer.offsets] == [(0, 5, 3)]
        stub.OffsetCommit(
            pb.OffsetCommitRequest(
                group_id=group,
                offsets=[pb.CommittedOffset(topic=topic, partition=1, offset=8, leader_epoch=4)],
            ),
            timeout=TIMEOUT_S,
        )
    assert _committed(sock, group, topic, 7)[1] == (8, 4, "")


def test_kafka_python_reads_back_the_committed_leader_epoch(kafka_broker: KafkaBroker) -> None:
    topic, group = _topic(kafka_broker), unique("g")
    tp = KafkaTopicPartition(topic, 0)
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap, group_id=group, enable_auto_commit=False
    )
    try:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(5, "m", 2)})
        assert consumer.committed(tp, metadata=True) == OffsetAndMetadata(5, "m", 2)
    finally:
        consumer.close()


def test_confluent_kafka_reads_back_the_committed_leader_epoch(kafka_broker: KafkaBroker) -> None:
    topic, group = _topic(kafka_broker), unique("g")
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.commit(
            offsets=[confluent_kafka.TopicPartition(topic, 0, 5, leader_epoch=2)],
            asynchronous=False,
        )
        (found,) = consumer.committed([confluent_kafka.TopicPartition(topic, 0)], TIMEOUT_S)
        assert (found.offset, found.leader_epoch, found.error) == (5, 2, None)
    finally:
        consumer.close()


@pytest.mark.parametrize("version", [3, 4])
def test_offset_for_leader_epoch_is_answered(
    kafka_broker: KafkaBroker, sock: socket.socket, version: int
) -> None:
    topic = _topic(kafka_broker, partitions=1)
    produce(
        "kafka-python",
        kafka_broker.bootstrap,
        kafka_broker.address,
        topic,
        [Out(None, b"r%d" % i, partition=0) for i in range(3)],
    )
    request = raw.offset_for_leader_epoch_request(topic, {0: 0, 5: 0}, version=version)
    answer = _call(sock, request, OffsetForLeaderEpochResponse)
    (entry,) = answer.topics
    found = {p.partition: (p.error_code, p.leader_epoch, p.end_offset) for p in entry.partitions}
    # A single broker stamps no epochs, so no leader change cut its log: epoch 0 ends
    # at the log end. Partition 5 does not exist (UNKNOWN_TOPIC_OR_PARTITION, 3).
    assert found == {0: (0, 0, 3), 5: (3, -1, -1)}
