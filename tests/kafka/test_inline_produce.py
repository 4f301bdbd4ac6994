"""The inline produce (issue #31, ``broker.kafka.data``): a small request to unreplicated
partitions is appended on the listener's loop, anything that could wait on the thread
pool, and either way the answers, offsets and stored records are what a produce promises
(request order across the two, ``acks=all`` answered only once fsynced)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Producer as KafkaProducer
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from tests.kafka.conftest import KafkaBroker, stored_values, unique
from tests.kafka.raw import frame, read_frame
from tidelog.broker.core.produce import INLINE_APPEND_MAX_BYTES
from tidelog.storage.records import BatchBuilder

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 30.0


def _batch(value: bytes) -> bytes:
    builder = BatchBuilder()
    builder.append(int(time.time() * 1000), None, value)
    return builder.build()


def _produce(bootstrap: str, topic: str, values: dict[int, bytes], acks: int) -> list[Any]:
    """One Produce v7 request of one batch per partition (``values``), on a raw socket;
    each partition's ``(index, error_code, base_offset)`` from the answer."""
    request = ProduceRequest[7](
        acks=acks,
        timeout_ms=5_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=_batch(v))
                    for p, v in values.items()
                ],
            )
        ],
    )
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(frame(request, "inline-test"))
        answer = read_frame(sock)
    assert answer is not None
    response = ProduceResponse[7].decode(answer[4:])  # past the correlation id
    return [
        (p.index, p.error_code, p.base_offset)
        for t in response.responses
        for p in t.partition_responses
    ]


def test_small_produces_are_appended_on_the_loop(kafka_broker: KafkaBroker) -> None:
    topic = unique("inline")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    listener = kafka_broker.broker.server.kafka
    inline, pooled = listener.inline_appends, listener.pool_appends
    producer = KafkaProducer(
        {"bootstrap.servers": kafka_broker.bootstrap, "acks": 1, "linger.ms": 0}
    )
    for i in range(20):
        producer.produce(topic, b"v%d" % i, partition=0)
        assert producer.flush(TIMEOUT_S) == 0
    inlined, pooled = listener.inline_appends - inline, listener.pool_appends - pooled
    assert inlined + pooled == 20
    # The pool takes one only when the log's own periodic work (the log manager's flush
    # and checkpoint rounds) happens to hold the partition lock at that moment.
    assert inlined > pooled
    assert stored_values(kafka_broker.address, topic, 0, 20) == [b"v%d" % i for i in range(20)]


def test_a_large_request_is_appended_on_the_pool(kafka_broker: KafkaBroker) -> None:
    topic = unique("inline-large")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    listener = kafka_broker.broker.server.kafka
    inline, pooled = listener.inline_appends, listener.pool_appends
    value = b"L" * (INLINE_APPEND_MAX_BYTES + 1)
    assert _produce(kafka_broker.bootstrap, topic, {0: value}, 1) == [(0, 0, 0)]
    assert (listener.inline_appends - inline, listener.pool_appends - pooled) == (0, 1)
    assert stored_values(kafka_broker.address, topic, 0, 1) == [value]


def test_a_held_partition_goes_to_the_pool_in_request_order(kafka_broker: KafkaBroker) -> None:
    """Partition 0 free, partition 1's lock held (as a flush or a large append on another
    thread holds it): 0 is appended on the loop (unless the log manager's periodic work
    holds its lock at that moment), 1 and 2 (after it in the request) on the pool once
    the lock is free; every partition answered, each record stored once."""
    topic = unique("inline-held")
    core = kafka_broker.broker.server.core
    core.create_topic(topic, 3, {})
    listener = kafka_broker.broker.server.kafka
    inline, pooled = listener.inline_appends, listener.pool_appends
    held = core.logs.get_log(topic, 1)._lock
    answers: list[Any] = []
    with held:
        sender = threading.Thread(
            target=lambda: answers.extend(
                _produce(kafka_broker.bootstrap, topic, {0: b"a", 1: b"b", 2: b"c"}, -1)
            )
        )
        sender.start()
        deadline = time.monotonic() + 5
        while listener.inline_appends == inline and time.monotonic() < deadline:
            time.sleep(0.01)  # partition 0 went inline; 1 waits for the lock on the pool
        assert not answers  # nothing answered while partition 1 cannot be appended
    sender.join(TIMEOUT_S)
    assert sorted(answers) == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]
    inlined, pooled = listener.inline_appends - inline, listener.pool_appends - pooled
    assert (inlined + pooled, min(pooled, 2)) == (3, 2)  # 1 and 2 on the pool, in order
    for partition, value in enumerate((b"a", b"b", b"c")):
        assert stored_values(kafka_broker.address, topic, partition, 1) == [value]
        # acks=all answered: fsynced past the record, whichever thread appended it.
        assert core.logs.get_log(topic, partition).recovery_point >= 1


def test_an_idempotent_producer_keeps_its_order_inline(kafka_broker: KafkaBroker) -> None:
    topic = unique("inline-idem")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    producer = KafkaProducer(
        {"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True, "linger.ms": 0}
    )
    for i in range(50):
        producer.produce(topic, struct.pack(">i", i), partition=0)
        if i % 7 == 0:
            assert producer.flush(TIMEOUT_S) == 0
    assert producer.flush(TIMEOUT_S) == 0
    got = stored_values(kafka_broker.address, topic, 0, 50)
    assert [struct.unpack(">i", v)[0] for v in got] == list(range(50))
