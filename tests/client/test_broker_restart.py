"""A broker killed (SIGKILL) and restarted under a running producer and consumer.

The broker runs as a subprocess (``tests.kafka.broker_process.BrokerProcess``) so that it
can really be killed.
The idempotent producer must deliver every record exactly once: requests in flight when
the broker died are retried with the same bytes and sequence numbers, and the restarted
broker (which rebuilt its producer state from the log) answers a batch it already stored
with the original offsets instead of storing it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.kafka.broker_process import BrokerProcess
from tidelog.client import AdminClient, Consumer, OutOfOrderSequenceError, Producer, TopicPartition
from tidelog.client.types import ConsumerRecord
from tidelog.storage.records import iter_batch_headers


@pytest.fixture
def broker_process(tmp_path: Path) -> BrokerProcess:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    yield broker  # type: ignore[misc]
    broker.stop()


def test_kill_and_restart_under_a_running_producer_stores_each_record_once(
    broker_process: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tidelog.client")
    address = broker_process.address
    with AdminClient(address, request_timeout_ms=10_000) as admin:
        admin.create_topic("restart", 2)
    total = 12_000
    producer = Producer(
        address,
        linger_ms=2,
        batch_size=8_192,
        retry_backoff_ms=50,
        request_timeout_ms=5_000,
        delivery_timeout_ms=60_000,
    )
    futures = []
    sent_enough = threading.Event()

    def send_all() -> None:
        for i in range(total):
            futures.append(producer.send("restart", value=b"%d" % i, key=b"%d" % (i % 97)))
            if i % 100 == 0:
                time.sleep(0.005)  # a steady stream, so the kill lands mid-flight
            if i == total // 3:
                sent_enough.set()

    # A consumer reads all along, through the restart.
    seen: list[ConsumerRecord] = []
    stop_reading = threading.Event()

    def read_all_along() -> None:
        with Consumer(address, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
            consumer.assign([TopicPartition("restart", p) for p in (0, 1)])
            while not stop_reading.is_set() and len(seen) < total:
                seen.extend(consumer.poll(timeout_ms=100))

    sender = threading.Thread(target=send_all)
    reader = threading.Thread(target=read_all_along)
    sender.start()
    reader.start()
    assert sent_enough.wait(30)
    broker_process.kill()
    time.sleep(0.3)  # records pile up and requests fail meanwhile
    broker_process.start()  # same port, same data: recovery from an unclean stop
    sender.join(60)
    producer.flush(timeout_ms=60_000)
    producer.close()

    offsets = [f.result(timeout=0) for f in futures]  # every send succeeded
    assert len({(m.partition, m.offset) for m in offsets}) == total

    with Consumer(address, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        consumer.assign([TopicPartition("restart", p) for p in (0, 1)])
        stored: list[ConsumerRecord] = []
        deadline = time.monotonic() + 30
        while len(stored) < total and time.monotonic() < deadline:
            stored += consumer.poll(timeout_ms=200)
        stored += consumer.poll(timeout_ms=300)  # anything stored twice would be here
    counts = Counter(r.value for r in stored)
    assert len(stored) == total, f"{len(stored) - total:+d} records"
    assert set(counts.values()) == {1}
    assert sorted(int(v or b"") for v in counts) == list(range(total))

    reader.join(30)
    stop_reading.set()
    assert Counter(r.value for r in seen) == counts  # the live reader saw the same log
    # The restart really hit requests in flight (or records waiting to be sent).
    assert any(
        "retrying" in message or "produce stream" in message for message in caplog.messages
    ), caplog.messages


def test_a_broker_that_lost_acknowledged_records_fails_the_next_batch_clearly(
    broker_process: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """After an unclean restart that cut acknowledged batches off the log, the broker
    answers the producer's next batch ``OUT_OF_ORDER_SEQUENCE_NUMBER``. As Kafka's, the
    producer fails that batch with ``OutOfOrderSequenceError`` (it cannot know what was
    lost) rather than silently rewriting sequences, then starts the partition over under
    a new producer id, so later records go through."""
    caplog.set_level(logging.INFO, logger="tidelog.client")
    address = broker_process.address
    with AdminClient(address, request_timeout_ms=10_000) as admin:
        admin.create_topic("lossy", 1)
    producer = Producer(address, linger_ms=0, acks=1, retry_backoff_ms=20)
    for i in range(3):
        assert producer.send("lossy", b"%d" % i).result(timeout=10).offset == i
    broker_process.kill()
    # Lose the last acknowledged batch, as an OS crash would lose unflushed pages.
    (segment,) = (broker_process.data_dir / "lossy-0").glob("*.log")
    data = segment.read_bytes()
    positions = [position for position, _ in iter_batch_headers(data, validate=False)]
    segment.write_bytes(data[: positions[-1]])
    broker_process.start()

    lost = producer.send("lossy", b"after the loss")
    with pytest.raises(OutOfOrderSequenceError):
        lost.result(timeout=20)
    assert producer.send("lossy", b"next").result(timeout=20).offset == 2
    producer.close()
    with Consumer(address, auto_offset_reset="earliest", fetch_max_wait_ms=50) as consumer:
        consumer.assign([TopicPartition("lossy", 0)])
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + 10
        while len(records) < 3 and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=100)
    assert [r.value for r in records] == [b"0", b"1", b"next"]
    assert any("new producer id" in m for m in caplog.messages)
