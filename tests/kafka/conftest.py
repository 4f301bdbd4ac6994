"""A real broker with the Kafka listener on 127.0.0.1 (any free ports, a temp data dir),
shared by the tests of a module; each test uses its own topics and groups."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import confluent_kafka
import pytest

from tests.broker.cluster.waiting import eventually
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, TopicPartition


@dataclass(frozen=True)
class KafkaBroker:
    """The running broker and its two addresses."""

    broker: InProcessBroker
    bootstrap: str  # the Kafka listener, HOST:PORT
    address: str  # the gRPC listener (Tidelog's own client), HOST:PORT


@pytest.fixture(scope="module")
def kafka_broker() -> Iterator[KafkaBroker]:
    settings = {
        "kafka.listen": "127.0.0.1:0",
        "num.partitions": 3,
        # KIP-848 members (Tidelog's and Kafka's) learn new assignments sooner.
        "group.consumer.heartbeat.interval.ms": 500,
    }
    with InProcessBroker(settings=settings) as b:
        port = b.server.kafka_port
        assert port is not None
        yield KafkaBroker(b, f"127.0.0.1:{port}", b.address)


def unique(prefix: str) -> str:
    """A topic or group name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def stored_values(address: str, topic: str, partition: int, count: int) -> list[bytes]:
    """Up to ``count`` values of ``topic``-``partition`` from offset 0, read through
    Tidelog's own client at ``address`` (30 s at most)."""
    tp = TopicPartition(topic, partition)
    with Consumer(address) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[bytes] = []
        deadline = time.monotonic() + 30.0
        while len(got) < count and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(timeout_ms=500) if r.value is not None]
    return got


def wait_until_decided(address: str, tp: TopicPartition, timeout_s: float = 30.0) -> int:
    """Wait until every transaction on ``tp`` is decided and its marker written (the last
    stable offset reaches the high watermark), through the gRPC listener at ``address``;
    returns that offset. A committed or aborted transaction's answer comes before its
    markers are written (Kafka's EndTxn does the same), so a test that needs them in the
    log waits here."""
    found: list[int] = []
    with AdminClient(address) as admin:

        def decided() -> bool:
            ends = [
                admin.list_offsets({tp: "latest"}, isolation_level=level)[tp]
                for level in ("read_committed", "read_uncommitted")
            ]
            offsets = {-1 if end is None else end.offset for end in ends}
            found[:] = sorted(offsets)
            return len(offsets) == 1

        eventually(decided, timeout_s)
    return found[0]


def kafka_login_works(config: dict[str, Any], timeout_s: float = 5.0) -> bool:
    """Whether librdkafka logs in with ``config`` and gets an answer (list_topics).

    A refused login is known at librdkafka's first ``_AUTHENTICATION`` error: librdkafka
    keeps retrying it, and a single ``list_topics(timeout=5)`` waited the whole 5 s for
    every wrong password. Any other failure waits up to ``timeout_s``."""
    refused = threading.Event()

    def on_error(error: confluent_kafka.KafkaError) -> None:
        if error.code() == confluent_kafka.KafkaError._AUTHENTICATION:
            refused.set()

    producer = confluent_kafka.Producer({**config, "error_cb": on_error})
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                producer.list_topics(timeout=0.5)
                return True
            except confluent_kafka.KafkaException:
                producer.poll(0)  # serves error_cb
                if refused.is_set() or time.monotonic() >= deadline:
                    return False
    finally:
        producer.flush(1)
