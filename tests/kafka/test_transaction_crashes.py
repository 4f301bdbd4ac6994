"""Transactions across a SIGKILLed broker (issue #28): a broker process killed while a
transaction is open, and one killed right after a commit was answered, restarted on the
same data directory.

- The open transaction's records are in the log, unfenced and undecided: after the
  restart the partition's producer state has it open again (recovery), the last stable
  offset stays before it, and the coordinator (its Ongoing state reloaded from
  ``__transaction_state``) aborts it at its timeout; records committed after it then
  become readable, and its own never are.
- A commit answered before the kill stays committed: its markers are written after the
  restart if they were not before (the PrepareCommit was durable first).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka.broker_process import BrokerProcess
from tests.kafka.conftest import unique

pytestmark = pytest.mark.timeout(240)

TIMEOUT_S = 30.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    running = BrokerProcess(tmp_path / "data")
    running.start()
    try:
        yield running
    finally:
        running.stop()


def read_committed(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    reader.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                if len(values) >= expected:
                    return values
                continue
            values.append(message.value())
    finally:
        reader.close()
    raise AssertionError(f"read {values} in time, expected {expected} record(s)")


def transactional(bootstrap: str, timeout_ms: int = 60_000) -> Producer:
    made = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": unique("crash"),
            "transaction.timeout.ms": timeout_ms,
        }
    )
    made.init_transactions(TIMEOUT_S)
    return made


def test_an_open_transaction_is_aborted_after_the_broker_is_killed(
    broker: BrokerProcess,
) -> None:
    topic = unique("crash")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept: its futures need it
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(timeout=TIMEOUT_S)
    committed = transactional(broker.bootstrap)
    committed.begin_transaction()
    committed.produce(topic, b"before", partition=0)
    committed.commit_transaction(TIMEOUT_S)
    abandoned = transactional(broker.bootstrap, timeout_ms=3_000)
    abandoned.begin_transaction()
    abandoned.produce(topic, b"abandoned", partition=0)
    abandoned.flush(TIMEOUT_S)
    broker.kill()  # the transaction is open; nobody will finish it but the coordinator
    broker.start()
    after = transactional(broker.bootstrap)
    after.begin_transaction()
    after.produce(topic, b"after", partition=0)
    after.commit_transaction(TIMEOUT_S)
    # Readable only once the abandoned transaction (before it in the log) is aborted.
    assert read_committed(broker.bootstrap, topic, 2) == [b"before", b"after"]


def test_a_commit_answered_before_the_kill_stays_committed(broker: BrokerProcess) -> None:
    topic = unique("crash")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept: its futures need it
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(timeout=TIMEOUT_S)
    producer = transactional(broker.bootstrap)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, f"kept-{i}".encode(), partition=0)
    producer.commit_transaction(TIMEOUT_S)
    broker.kill()  # right after the answer: the markers may or may not be written yet
    broker.start()
    assert read_committed(broker.bootstrap, topic, 3) == [b"kept-0", b"kept-1", b"kept-2"]
