"""Three timestamps per record (DESIGN.md): producers whose wall clocks are hours off,
a real broker, and what consumers see: the corrected time on the broker's clock, within
the request's round trip, before and after a restart and after compaction."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client import Consumer, Producer, TopicPartition
from tidelog.client.admin import AdminClient
from tidelog.client.keyed_producer import KeyedProducer, ProducerRecord
from tidelog.client.types import ConsumerRecord
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.cleaner import LogCleaner
from tidelog.storage.clock import SystemClock
from tidelog.storage.records import encode_batch

HOUR_MS = 3_600_000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    # The test runs the cleaner itself, when it wants (no background pass racing it).
    settings = {"log.cleaner.enable": False}
    with InProcessBroker(tmp_path / "data", settings=settings) as running:
        yield running


def _create(broker: InProcessBroker, name: str, **config: str) -> None:
    with AdminClient(broker.address, request_timeout_ms=10_000) as admin:
        admin.create_topic(name, 1, config)


def _read_all(broker: InProcessBroker, topic: str, count: int) -> list[ConsumerRecord]:
    tp = TopicPartition(topic, 0)
    records: list[ConsumerRecord] = []
    with Consumer(broker.address, fetch_max_wait_ms=50) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        for _ in range(400):  # bounded: each poll waits at most 100 ms
            records += consumer.poll(timeout_ms=100)
            if len(records) >= count:
                break
    return records


def _produce_skewed(
    broker: InProcessBroker, topic: str, skew_ms: int, keys: list[bytes]
) -> tuple[int, int]:
    """Send one record per key from a producer whose clock is ``skew_ms`` off; returns the
    real wall-clock bounds (before the first send, after the last answer)."""

    def device_clock() -> int:
        return _wall_ms() + skew_ms

    before = _wall_ms()
    with Producer(broker.address, linger_ms=5, wall_clock=device_clock) as producer:
        for key in keys:  # one request (one batch) each: several segments to compact
            producer.send(topic, key=key, value=b"v").result(timeout=30)  # never fails/hangs
    return before, _wall_ms()


def _check_corrected(records: list[ConsumerRecord], skew_ms: int, before: int, after: int) -> None:
    for record in records:
        assert record.sent_timestamp_ms is not None
        assert record.received_timestamp_ms is not None
        # The device's own times carry its skew; the broker's does not.
        assert before + skew_ms <= record.timestamp_ms <= record.sent_timestamp_ms
        assert record.sent_timestamp_ms <= after + skew_ms
        assert before <= record.received_timestamp_ms <= after
        assert record.corrected_timestamp_ms == (
            record.timestamp_ms + record.received_timestamp_ms - record.sent_timestamp_ms
        )
        # On the broker's clock: between the send() call and the broker's receipt.
        assert before <= record.corrected_timestamp_ms <= record.received_timestamp_ms


@pytest.mark.parametrize("skew_ms", [5 * HOUR_MS, -7 * HOUR_MS])
def test_injected_device_clock_is_corrected_across_restart_and_compaction(
    broker: InProcessBroker, skew_ms: int
) -> None:
    topic = "phones"
    _create(
        broker,
        topic,
        **{
            "cleanup.policy": "compact",
            "segment.bytes": "200",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "0",
        },
    )
    keys = [b"k%d" % (i % 4) for i in range(24)]
    before, after = _produce_skewed(broker, topic, skew_ms, keys)
    records = _read_all(broker, topic, len(keys))
    assert [r.key for r in records] == keys
    _check_corrected(records, skew_ms, before, after)

    broker.restart()
    again = _read_all(broker, topic, len(keys))
    assert again == records

    log = broker.server.core.logs.get_log(topic, 0)
    log.roll()  # every batch in a sealed segment: all of them cleanable
    assert LogCleaner(broker.data_dir, SystemClock()).clean_log(log, force=True).cleaned
    survivors = _read_all(broker, topic, 1)
    assert 0 < len(survivors) < len(records)
    by_offset = {r.offset: r for r in records}
    for record in survivors:
        assert record == by_offset[record.offset]  # every time kept through compaction


_FAST_CLOCK_PRODUCER = textwrap.dedent(
    """
    import sys, time
    SKEW_NS = int(sys.argv[3]) * 1_000_000
    real = time.time_ns
    # The client's wall clock (time.time_ns), patched before it is imported. Not
    # time.time: gRPC turns timeouts into absolute deadlines with it for its C core, which
    # reads the real clock, so shifting only the Python side would expire every call.
    time.time_ns = lambda: real() + SKEW_NS
    from tidelog.client import Producer
    with Producer(sys.argv[1], linger_ms=5) as producer:
        futures = [producer.send(sys.argv[2], value=b"p%d" % i) for i in range(10)]
        for future in futures:
            future.result(timeout=30)
    print("sent")
    """
)


@pytest.mark.parametrize("skew_ms", [6 * HOUR_MS, -3 * HOUR_MS])
def test_a_separate_producer_process_with_a_skewed_wall_clock(
    broker: InProcessBroker, skew_ms: int
) -> None:
    topic = "devices"
    _create(broker, topic)
    before = _wall_ms()
    done = subprocess.run(
        [sys.executable, "-c", _FAST_CLOCK_PRODUCER, broker.address, topic, str(skew_ms)],
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard, not a timing assertion
        check=False,
    )
    after = _wall_ms()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "sent"
    records = _read_all(broker, topic, 10)
    assert len(records) == 10
    _check_corrected(records, skew_ms, before, after)
    broker.restart()
    assert _read_all(broker, topic, 10) == records


def test_requests_without_a_send_time_have_none_and_the_record_time(
    broker: InProcessBroker,
) -> None:
    topic = "legacy"
    _create(broker, topic)
    before = _wall_ms()
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        batches = encode_batch([(1_000, None, b"a")]) + encode_batch([(2_000, None, b"b")])
        request = pb.ProduceRequest(
            acks=1,
            topics=[
                pb.ProduceTopicData(
                    topic=topic, partitions=[pb.ProducePartitionData(partition=0, records=batches)]
                )
            ],
        )
        response = stub.Produce(request, timeout=10)
        assert response.results[0].error_code == ""
    after = _wall_ms()
    records = _read_all(broker, topic, 2)
    assert [(r.timestamp_ms, r.corrected_timestamp_ms) for r in records] == [
        (1_000, 1_000),
        (2_000, 2_000),
    ]
    for record in records:
        assert record.sent_timestamp_ms is None
        assert record.received_timestamp_ms is not None
        assert before <= record.received_timestamp_ms <= after


def test_every_batch_of_a_request_gets_the_request_times(broker: InProcessBroker) -> None:
    topic = "multi"
    _create(broker, topic)
    sent = 123_456_789
    with grpc.insecure_channel(broker.address) as channel:
        stub: Callable[..., pb.ProduceResponse] = pb_grpc.BrokerStub(channel).Produce
        batches = b"".join(encode_batch([(1_000 * i, None, b"x")]) for i in range(1, 4))
        request = pb.ProduceRequest(
            acks=1,
            sent_timestamp_ms=sent,
            topics=[
                pb.ProduceTopicData(
                    topic=topic, partitions=[pb.ProducePartitionData(partition=0, records=batches)]
                )
            ],
        )
        assert stub(request, timeout=10).results[0].error_code == ""
    records = _read_all(broker, topic, 3)
    received = {r.received_timestamp_ms for r in records}
    assert len(received) == 1
    (received_ms,) = received
    assert received_ms is not None
    assert [r.sent_timestamp_ms for r in records] == [sent] * 3
    assert [r.corrected_timestamp_ms for r in records] == [
        1_000 * i + received_ms - sent for i in range(1, 4)
    ]


def test_a_broker_with_batch_times_off_stores_none(tmp_path: Path) -> None:
    settings = {"log.batch.times.enable": False}
    with InProcessBroker(tmp_path / "plain", settings=settings) as plain:
        _create(plain, "plain")
        with Producer(plain.address, linger_ms=1) as producer:
            producer.send("plain", value=b"x", timestamp_ms=5_000).result(timeout=30)
        (record,) = _read_all(plain, "plain", 1)
        assert record.sent_timestamp_ms is None
        assert record.received_timestamp_ms is None
        assert record.corrected_timestamp_ms == record.timestamp_ms == 5_000
        assert not any((tmp_path / "plain" / "plain-0").glob("*.batchtimes")) or all(
            p.stat().st_size == 0 for p in (tmp_path / "plain" / "plain-0").glob("*.batchtimes")
        )


def test_the_keyed_producer_stamps_its_send_time(broker: InProcessBroker) -> None:
    _create(broker, "keyed")
    before = _wall_ms()
    with KeyedProducer(broker.address, "job:0") as producer:
        tp = TopicPartition("keyed", 0)
        assert producer.write_once({tp: [ProducerRecord(b"k", b"v")]}, epoch=0).written == 1
    after = _wall_ms()
    (record,) = _read_all(broker, "keyed", 1)
    assert record.sent_timestamp_ms is not None
    assert before <= record.sent_timestamp_ms <= after
    assert record.received_timestamp_ms is not None
    assert record.corrected_timestamp_ms == (
        record.timestamp_ms + record.received_timestamp_ms - record.sent_timestamp_ms
    )
