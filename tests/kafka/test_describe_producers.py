"""DescribeProducers (KIP-664) over the Kafka listener: what the partition's leader
remembers of an idempotent producer, as a raw request sees it (no Python Kafka client
has the call)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from kafka.protocol.admin import DescribeProducersRequest, DescribeProducersResponse

from tests.kafka import raw
from tests.kafka.clients import TIMEOUT_S
from tests.kafka.conftest import KafkaBroker, unique

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sock(kafka_broker: KafkaBroker) -> Iterator[socket.socket]:
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as connection:
        connection.settimeout(TIMEOUT_S)
        yield connection


def _describe(sock: socket.socket, topic: str, partitions: list[int]) -> list[Any]:
    request = DescribeProducersRequest[0](
        topics=[DescribeProducersRequest[0].TopicRequest(name=topic, partition_indexes=partitions)]
    )
    answer = raw.call(sock, request, "test-producers")
    assert answer is not None, "the broker hung up"
    (entry,) = DescribeProducersResponse[0].decode(answer, header=True).topics
    assert entry.name == topic
    return list(entry.partitions)


def test_an_idempotent_producers_state_is_described(
    kafka_broker: KafkaBroker, sock: socket.socket
) -> None:
    topic = unique("producers")
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([confluent_kafka.admin.NewTopic(topic, 2, 1)])[topic].result(TIMEOUT_S)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True, "linger.ms": 0}
    )
    for i in range(3):
        producer.produce(topic, b"v%d" % i, partition=0, timestamp=1_000 + i)
        assert producer.flush(TIMEOUT_S) == 0

    written, untouched, missing = _describe(sock, topic, [0, 1, 7])
    assert (written.partition_index, written.error_code) == (0, 0)
    (state,) = written.active_producers
    assert state.producer_id >= 0
    assert (state.producer_epoch, state.last_sequence) == (0, 2)
    # The broker's time of the last append (Tidelog's producer expiry clock), not the
    # records' own timestamps.
    assert abs(state.last_timestamp - time.time() * 1000) < 60_000
    assert (state.coordinator_epoch, state.current_txn_start_offset) == (-1, -1)
    assert (untouched.partition_index, untouched.error_code) == (1, 0)
    assert untouched.active_producers == []
    assert (missing.partition_index, missing.error_code) == (7, 3)  # UNKNOWN_TOPIC_OR_PARTITION


def test_an_unknown_topic_is_answered_per_partition(sock: socket.socket) -> None:
    (answer,) = _describe(sock, unique("no-such-topic"), [0])
    assert answer.error_code == 3
