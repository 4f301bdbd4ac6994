"""DeleteRecords (KIP-107) over the Kafka listener, with confluent-kafka's and
kafka-python's admin clients: the low watermark per partition, Kafka's error codes, and a
consumer positioned below the new start reset to it."""

from __future__ import annotations

import socket

import confluent_kafka
import confluent_kafka.admin
import kafka
import kafka.errors
import kafka.structs
import pytest
from confluent_kafka import TopicPartition as KafkaTopicPartition
from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse

from tests.kafka import raw
from tests.kafka.clients import TIMEOUT_S
from tests.kafka.conftest import KafkaBroker, unique

pytestmark = pytest.mark.timeout(90)


def _topic_with_records(kafka_broker: KafkaBroker, partitions: int, count: int) -> str:
    topic = unique("delete-records")
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([confluent_kafka.admin.NewTopic(topic, partitions, 1)])[topic].result(
        TIMEOUT_S
    )
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i in range(count):
        producer.produce(topic, b"v%d" % i, partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    return topic


def test_confluent_delete_records(kafka_broker: KafkaBroker) -> None:
    topic = _topic_with_records(kafka_broker, 2, 10)
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    futures = admin.delete_records(
        [
            KafkaTopicPartition(topic, 0, 4),
            KafkaTopicPartition(topic, 1, confluent_kafka.OFFSET_END),
        ]
    )
    lows = {tp.partition: f.result(TIMEOUT_S).low_watermark for tp, f in futures.items()}
    assert lows == {0: 4, 1: 0}
    earliest = admin.list_offsets(
        {KafkaTopicPartition(topic, 0): confluent_kafka.admin.OffsetSpec.earliest()}
    )
    assert [f.result(TIMEOUT_S).offset for f in earliest.values()] == [4]

    (above,) = admin.delete_records([KafkaTopicPartition(topic, 0, 11)]).values()
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        above.result(TIMEOUT_S)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.OFFSET_OUT_OF_RANGE

    # A consumer positioned below the new start is told OFFSET_OUT_OF_RANGE and resets.
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": unique("delete-records-group"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([KafkaTopicPartition(topic, 0, 2)])
        message = None
        for _ in range(50):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                break
        assert message is not None
        assert message.error() is None
        assert (message.offset(), message.value()) == (4, b"v4")
    finally:
        consumer.close()


def test_kafka_python_delete_records(kafka_broker: KafkaBroker) -> None:
    topic = _topic_with_records(kafka_broker, 1, 10)
    admin = kafka.KafkaAdminClient(
        bootstrap_servers=kafka_broker.bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000)
    )
    try:
        tp = kafka.structs.TopicPartition(topic, 0)
        answer = admin.delete_records({tp: 7})
        assert answer[tp]["low_watermark"] == 7
        with pytest.raises(kafka.errors.OffsetOutOfRangeError):
            admin.delete_records({tp: 20})
        assert admin.delete_records({tp: 3})[tp]["low_watermark"] == 7  # never moves down
    finally:
        admin.close()


@pytest.mark.parametrize("version", [0, 1, 2])
def test_raw_requests_answer_per_partition(kafka_broker: KafkaBroker, version: int) -> None:
    """Every advertised version; what the clients check before sending (an unknown
    topic or partition, a negative offset) answered by the broker itself."""
    topic = _topic_with_records(kafka_broker, 1, 5)
    request_class = DeleteRecordsRequest[version]
    topic_class = request_class.DeleteRecordsTopic
    partition_class = topic_class.DeleteRecordsPartition

    def entry(name: str, offsets: dict[int, int]) -> object:
        return topic_class(
            name=name,
            partitions=[partition_class(partition_index=p, offset=o) for p, o in offsets.items()],
        )

    request = request_class(
        topics=[entry(topic, {0: 2, 3: 0}), entry(unique("no-such-topic"), {0: 0})],
        timeout_ms=5_000,
    )
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        answer = raw.call(sock, request, "test-delete-records")
        assert answer is not None, "the broker hung up"
        decoded = DeleteRecordsResponse[version].decode(answer, header=True)
        negative = raw.call(
            sock, request_class(topics=[entry(topic, {0: -2})], timeout_ms=5_000), "test-dr"
        )
        assert negative is not None, "the broker hung up"
        refused = DeleteRecordsResponse[version].decode(negative, header=True)
    found = {
        (t.name == topic, p.partition_index): (p.low_watermark, p.error_code)
        for t in decoded.topics
        for p in t.partitions
    }
    # UNKNOWN_TOPIC_OR_PARTITION is 3; the low watermark of a refused partition is -1.
    assert found == {(True, 0): (2, 0), (True, 3): (-1, 3), (False, 0): (-1, 3)}
    (only,) = [p for t in refused.topics for p in t.partitions]
    assert (only.low_watermark, only.error_code) == (-1, 1)  # OFFSET_OUT_OF_RANGE
