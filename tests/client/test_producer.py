"""The producer against a real in-process broker."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import defaultdict

import pytest

from tests.client.conftest import TopicFactory
from tidelog.broker.testing import InProcessBroker
from tidelog.client import (
    AdminClient,
    BrokerUnavailableError,
    BufferExhaustedError,
    ClosedError,
    Consumer,
    KafkaTimeoutError,
    Producer,
    RecordMetadata,
    RecordTooLargeError,
    TopicPartition,
    UnknownTopicOrPartitionError,
)
from tidelog.client.partitioner import partition_for_key
from tidelog.client.types import ConsumerRecord


def read_all(address: str, topic: str, partitions: int, expected: int) -> list[ConsumerRecord]:
    """Every record of ``topic`` from offset zero (waits for ``expected`` of them)."""
    records: list[ConsumerRecord] = []
    with Consumer(address, fetch_max_wait_ms=100) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 20
        while len(records) < expected and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=200)
        assert not consumer.poll(timeout_ms=50), "more records than expected"
    return records


def test_send_returns_a_future_of_record_metadata(broker: InProcessBroker, topic: str) -> None:
    with Producer(broker.address, linger_ms=0) as producer:
        future = producer.send(topic, value=b"hello", timestamp_ms=1_700_000_000_000)
        assert isinstance(future, concurrent.futures.Future)
        metadata = future.result(timeout=10)
        assert metadata == RecordMetadata(topic, 0, 0, 1_700_000_000_000)
        second = producer.send(topic, value=b"again").result(timeout=10)
        assert second.offset == 1
        assert abs(second.timestamp_ms - time.time() * 1000) < 60_000


def test_keys_land_on_kafkas_murmur2_partition(
    broker: InProcessBroker, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=5)
    keys = [f"user-{i}".encode() for i in range(40)]
    with Producer(broker.address) as producer:
        futures = {key: producer.send(topic, value=b"v", key=key) for key in keys}
        for key, future in futures.items():
            assert future.result(timeout=10).partition == partition_for_key(key, 5)


def test_explicit_partition_and_keyless_records(
    broker: InProcessBroker, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=3)
    with Producer(broker.address, batch_size=2_000) as producer:
        assert producer.send(topic, b"x", partition=2).result(10).partition == 2
        with pytest.raises(ValueError, match="out of range"):
            producer.send(topic, b"x", partition=3)
        # Keyless: sticky, one partition per batch, all partitions over time.
        futures = [producer.send(topic, b"v" * 100) for _ in range(300)]
        partitions = {f.result(10).partition for f in futures}
    assert partitions == {0, 1, 2}


def test_headers_null_values_and_lz4_round_trip(broker: InProcessBroker, topic: str) -> None:
    with Producer(broker.address, compression="lz4", acks=1) as producer:
        producer.send(topic, value=b"v" * 1000, key=b"k", headers=[("a", b"1"), ("b", None)])
        producer.send(topic, value=None, key=b"tombstone")
        producer.send(topic, value=bytearray(b"bytes-like"))
        producer.flush(timeout_ms=10_000)
    records = read_all(broker.address, topic, 1, 3)
    assert [(r.key, r.value, r.headers) for r in records] == [
        (b"k", b"v" * 1000, (("a", b"1"), ("b", None))),
        (b"tombstone", None, ()),
        (None, b"bytes-like", ()),
    ]


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_acks(broker: InProcessBroker, new_topic: TopicFactory, acks: int | str) -> None:
    topic = new_topic()
    with Producer(broker.address, acks=acks, enable_idempotence=acks != 0) as producer:
        futures = [producer.send(topic, b"%d" % i) for i in range(50)]
        offsets = [f.result(timeout=10).offset for f in futures]
    if acks == 0:
        assert offsets == [-1] * 50  # the broker tells nothing
    else:
        assert offsets == list(range(50))
    assert len(read_all(broker.address, topic, 1, 50)) == 50


def test_callbacks_see_metadata_or_error(broker: InProcessBroker, topic: str) -> None:
    seen: list[tuple[RecordMetadata | None, BaseException | None]] = []
    done = threading.Event()

    def on_delivery(metadata: RecordMetadata | None, error: BaseException | None) -> None:
        seen.append((metadata, error))
        if len(seen) == 2:
            done.set()

    with Producer(broker.address, max_block_ms=300) as producer:
        producer.send(topic, b"ok", callback=on_delivery)
        producer.send("no-such-topic-for-callbacks", b"lost", callback=on_delivery)
        assert done.wait(10)
    (ok,) = [m for m, e in seen if e is None]
    assert ok is not None
    assert ok.topic == topic
    (error,) = [e for m, e in seen if e is not None]
    assert isinstance(error, UnknownTopicOrPartitionError)


def test_many_threads_send_at_once_and_keep_their_order(
    broker: InProcessBroker, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=2)
    threads_count, per_thread = 4, 500
    with Producer(broker.address, linger_ms=2, batch_size=4_096) as producer:

        def work(thread: int) -> None:
            key = f"thread-{thread}".encode()
            for i in range(per_thread):
                producer.send(topic, value=f"{thread}:{i}".encode(), key=key)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads_count)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        producer.flush(timeout_ms=20_000)
    records = read_all(broker.address, topic, 2, threads_count * per_thread)
    by_thread: dict[str, list[int]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        assert record.value is not None
        thread, index = record.value.decode().split(":")
        by_thread[thread].append(int(index))
    assert dict(by_thread.items()) == {
        str(t): list(range(per_thread)) for t in range(threads_count)
    }


def test_flush_waits_and_close_delivers_what_is_queued(broker: InProcessBroker, topic: str) -> None:
    producer = Producer(broker.address, linger_ms=60_000, batch_size=1 << 20)
    futures = [producer.send(topic, b"x") for _ in range(10)]
    time.sleep(0.05)
    assert not any(f.done() for f in futures)  # lingering: a minute
    producer.flush(timeout_ms=10_000)
    assert all(f.done() for f in futures)
    late = producer.send(topic, b"late")
    producer.close()
    assert late.result(0).offset == 10  # close sent it without lingering
    with pytest.raises(ClosedError):
        producer.send(topic, b"after close")
    producer.close()  # idempotent


def test_record_too_large_is_refused_by_send(broker: InProcessBroker, topic: str) -> None:
    with Producer(broker.address, max_request_size=10_000) as producer:
        with pytest.raises(RecordTooLargeError):
            producer.send(topic, b"x" * 20_000)
        with pytest.raises(TypeError):
            producer.send(topic, "text")  # type: ignore[arg-type]


def test_unknown_topic_fails_the_future_after_max_block_ms(broker: InProcessBroker) -> None:
    with Producer(broker.address, max_block_ms=300) as producer:
        started = time.monotonic()
        future = producer.send("does-not-exist", b"x")
        with pytest.raises(UnknownTopicOrPartitionError):
            future.result(timeout=10)
        assert time.monotonic() - started < 5


def send_many(producer: Producer, count: int) -> None:
    for _ in range(count):
        producer.send("t", b"x" * 1_000)


def test_a_full_buffer_blocks_send_then_raises() -> None:
    # Nothing listens here: records can only pile up.
    with Producer(
        "127.0.0.1:9",
        buffer_memory=4_096,
        max_block_ms=200,
        request_timeout_ms=500,
        delivery_timeout_ms=1_000,
        linger_ms=0,
    ) as producer:
        producer.send("t", b"x" * 1_000)
        producer.send("t", b"x" * 1_000)
        started = time.monotonic()
        with pytest.raises(BufferExhaustedError):
            send_many(producer, 10)
        assert 0.15 < time.monotonic() - started < 5


def test_a_broker_that_is_down_fails_records_after_the_timeout_not_a_hang() -> None:
    # Learn the topic's size while the broker is up, then send to a dead address.
    with InProcessBroker() as doomed:
        address = doomed.address
        with AdminClient(address, request_timeout_ms=5_000) as admin:
            admin.create_topic("t", 1)
        producer = Producer(address, linger_ms=0, request_timeout_ms=300, delivery_timeout_ms=1_000)
        assert producer.send("t", b"first").result(timeout=10).offset == 0
    started = time.monotonic()
    future = producer.send("t", b"lost")
    with pytest.raises((BrokerUnavailableError, KafkaTimeoutError)):
        future.result(timeout=10)
    assert time.monotonic() - started < 5
    producer.close(timeout_ms=2_000)


def test_producer_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="unknown ProducerConfig setting"):
        Producer("127.0.0.1:9", lingerms=5)
    with pytest.raises(ValueError, match="bootstrap"):
        Producer("nowhere")
