"""Long-poll Fetch through the Kafka listener: parked in the core's fetch purgatory, woken
by an append, holding no thread while it waits."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from kafka.protocol.consumer import FetchResponse

from tests.broker.cluster.waiting import eventually
from tests.kafka.clients import Out, produce
from tests.kafka.conftest import KafkaBroker, unique
from tests.kafka.raw import fetch_request, frame, read_frame

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 20.0


def _fetch_frame(topic: str, correlation_id: int, max_wait_ms: int) -> bytes:
    return frame(fetch_request(topic, max_wait_ms=max_wait_ms), "long-poll", correlation_id)


def _read_response(sock: socket.socket) -> bytes:
    found = read_frame(sock)
    assert found is not None, "connection closed"
    return found


def test_parked_fetches_hold_no_thread_and_wake_on_append(kafka_broker: KafkaBroker) -> None:
    topic = unique("poll")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    threads_before = threading.active_count()
    parked_before = kafka_broker.broker.server.core.parked_operations()["fetch"]
    sockets = []
    try:
        for i in range(40):
            sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
            sock.sendall(_fetch_frame(topic, i, max_wait_ms=15_000))
            sockets.append(sock)
        # All 40 wait in the purgatory; the process gained no thread per connection (at
        # most the listener's pool of num.io.threads, which runs the reads).
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            parked = kafka_broker.broker.server.core.parked_operations()["fetch"]
            if parked - parked_before >= 40:
                break
            time.sleep(0.05)
        assert parked - parked_before >= 40
        io_threads = kafka_broker.broker.config.num_io_threads
        assert io_threads < 40
        assert threading.active_count() <= threads_before + io_threads
        started = time.monotonic()
        produce(
            "kafka-python",
            kafka_broker.bootstrap,
            kafka_broker.address,
            topic,
            [Out(None, b"wake up", partition=0)],
        )
        for i, sock in enumerate(sockets):
            decoded = FetchResponse[11].decode(_read_response(sock), header=True)
            assert decoded.header.correlation_id == i
            (partition,) = decoded.responses[0].partitions
            assert partition.error_code == 0
            assert partition.high_watermark == 1
            assert b"wake up" in bytes(partition.records)
        # Answered on the append, long before the 15 s wait.
        assert time.monotonic() - started < 10
    finally:
        for sock in sockets:
            sock.close()


def test_a_fetch_with_nothing_to_read_waits_max_wait(kafka_broker: KafkaBroker) -> None:
    topic = unique("wait")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        started = time.monotonic()
        sock.sendall(_fetch_frame(topic, 1, max_wait_ms=700))
        decoded = FetchResponse[11].decode(_read_response(sock), header=True)
        waited = time.monotonic() - started
    (partition,) = decoded.responses[0].partitions
    assert partition.error_code == 0
    assert not partition.records
    assert 0.6 <= waited < 5


def _parked_fetches(kafka_broker: KafkaBroker) -> int:
    return kafka_broker.broker.server.core.parked_operations()["fetch"]


def test_a_parked_fetch_is_freed_when_the_client_hangs_up(kafka_broker: KafkaBroker) -> None:
    """Not at its deadline (30 s here, ``fetch.max.wait.ms``'s default): at once."""
    topic = unique("hangup")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    before = _parked_fetches(kafka_broker)
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    try:
        sock.sendall(_fetch_frame(topic, 1, max_wait_ms=30_000))
        eventually(lambda: _parked_fetches(kafka_broker) == before + 1, timeout_s=TIMEOUT_S)
    finally:
        sock.close()
    eventually(lambda: _parked_fetches(kafka_broker) == before, timeout_s=5.0)
    # The listener goes on serving.
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as again:
        again.sendall(_fetch_frame(topic, 2, max_wait_ms=0))
        decoded = FetchResponse[11].decode(_read_response(again), header=True)
    assert decoded.header.correlation_id == 2


def test_a_request_pipelined_behind_a_parked_fetch_is_answered_after_it(
    kafka_broker: KafkaBroker,
) -> None:
    """The hang-up watch reads the next request while the fetch is parked: it is kept,
    and answered after the fetch, in order."""
    topic = unique("pipelined")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    before = _parked_fetches(kafka_broker)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(_fetch_frame(topic, 1, max_wait_ms=30_000))
        eventually(lambda: _parked_fetches(kafka_broker) == before + 1, timeout_s=TIMEOUT_S)
        # Sent in two pieces: the watch may take the first alone.
        second = _fetch_frame(topic, 2, max_wait_ms=0)
        sock.sendall(second[:7])
        time.sleep(0.2)
        sock.sendall(second[7:])
        produce(
            "kafka-python",
            kafka_broker.bootstrap,
            kafka_broker.address,
            topic,
            [Out(None, b"wake up", partition=0)],
        )
        first = FetchResponse[11].decode(_read_response(sock), header=True)
        then = FetchResponse[11].decode(_read_response(sock), header=True)
    assert (first.header.correlation_id, then.header.correlation_id) == (1, 2)
    assert b"wake up" in bytes(first.responses[0].partitions[0].records)
    assert b"wake up" in bytes(then.responses[0].partitions[0].records)
