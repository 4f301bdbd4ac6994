"""A lost answer: the broker stored the batch, the producer never heard, and retries.

A small TCP proxy sits between producer and broker. Armed, it swallows what the broker
sends back and then cuts the connection, so the batch in flight is stored but its answer
is lost. The producer must retry it (same bytes, same sequence) and the broker must answer
the retry with the original offset: the record is stored once.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client import Consumer, Producer, TopicPartition


class CuttingProxy:
    """Forwards 127.0.0.1:port to a target; ``cut_next_answer`` loses one answer."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._armed_at: float | None = None
        self._lock = threading.Lock()
        self._connections: list[tuple[socket.socket, socket.socket]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_next_answer(self, after_s: float = 0.2) -> None:
        """Swallow everything the broker sends from now on, then cut after ``after_s``."""
        with self._lock:
            self._armed_at = time.monotonic()
        threading.Timer(after_s, self._cut).start()

    def _cut(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
            self._armed_at = None
        for client, server in connections:
            for sock in (client, server):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._target_port))
            with self._lock:
                self._connections.append((client, server))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    swallow = answers and self._armed_at is not None
                if not swallow:
                    sink.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self._listener.close()
        self._cut()


@pytest.fixture
def proxy(broker: InProcessBroker) -> CuttingProxy:
    running = CuttingProxy(broker.port)
    yield running  # type: ignore[misc]
    running.close()


def test_a_lost_answer_is_retried_and_stored_once(
    broker: InProcessBroker, proxy: CuttingProxy, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tidelog.client")
    with Producer(f"127.0.0.1:{proxy.port}", linger_ms=0, acks=1, retry_backoff_ms=20) as producer:
        assert producer.send(topic, b"first").result(timeout=10).offset == 0
        proxy.cut_next_answer()
        metadata = producer.send(topic, b"second").result(timeout=10)
        assert metadata.offset == 1  # the original offset, from the duplicate answer
        assert producer.send(topic, b"third").result(timeout=10).offset == 2
    assert any("stored before" in m for m in caplog.messages), caplog.messages
    with Consumer(broker.address, auto_offset_reset="earliest", fetch_max_wait_ms=50) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        records = []
        deadline = time.monotonic() + 10
        while len(records) < 3 and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=100)
        records += consumer.poll(timeout_ms=200)
    assert [r.value for r in records] == [b"first", b"second", b"third"]


def test_without_idempotence_a_lost_answer_stores_the_record_twice(
    broker: InProcessBroker, proxy: CuttingProxy, topic: str
) -> None:
    """Why idempotence is on by default: the same scenario, without it, duplicates."""
    with Producer(
        f"127.0.0.1:{proxy.port}",
        linger_ms=0,
        acks=1,
        retry_backoff_ms=20,
        enable_idempotence=False,
    ) as producer:
        producer.send(topic, b"first").result(timeout=10)
        proxy.cut_next_answer()
        assert producer.send(topic, b"second").result(timeout=10).offset == 2
    with Consumer(broker.address, auto_offset_reset="earliest", fetch_max_wait_ms=50) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        records = []
        deadline = time.monotonic() + 10
        while len(records) < 3 and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=100)
    assert [r.value for r in records] == [b"first", b"second", b"second"]
