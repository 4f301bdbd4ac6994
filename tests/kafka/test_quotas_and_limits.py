"""Quotas and connection limits on the Kafka listener, as on the gRPC one (Kafka's names):
``max.connections.per.ip`` closes a connection past the limit at once and counts the
gRPC listener's connections too; ``producer_byte_rate`` and ``consumer_byte_rate`` answer
with ``throttle_time_ms`` (KIP-219) and hold the client back, per client id. Raw requests
on sockets, so what the broker answers is seen as sent."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceResponse

from tests.kafka.conftest import unique
from tests.kafka.raw import call, fetch_request, produce_request
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Producer
from tidelog.storage.errors import MaxConnectionsPerIpError

pytestmark = pytest.mark.timeout(120)
TIMEOUT_S = 20


@pytest.fixture(scope="module")
def limited() -> Iterator[InProcessBroker]:
    settings = {"kafka.listen": "127.0.0.1:0", "max.connections.per.ip": 3}
    with InProcessBroker(settings=settings) as broker:
        yield broker


def _kafka_address(broker: InProcessBroker) -> tuple[str, int]:
    port = broker.server.kafka_port
    assert port is not None
    return "127.0.0.1", port


def _connect(broker: InProcessBroker) -> socket.socket:
    sock = socket.create_connection(_kafka_address(broker), timeout=TIMEOUT_S)
    sock.settimeout(TIMEOUT_S)
    return sock


def _api_versions(sock: socket.socket) -> bool:
    """Whether the broker answered ApiVersions on ``sock`` (False: it hung up)."""
    frame = call(sock, ApiVersionsRequest[0](), "limits")
    return frame is not None and ApiVersionsResponse[0].decode(frame, header=True).error_code == 0


def test_a_connection_past_max_connections_per_ip_is_closed_at_once(
    limited: InProcessBroker,
) -> None:
    kept = [_connect(limited) for _ in range(3)]
    try:
        assert all(_api_versions(sock) for sock in kept)
        with _connect(limited) as refused:
            assert not _api_versions(refused)  # closed without an answer
        # One count for both listeners: a gRPC client from the same address is refused.
        refusal = pytest.raises(MaxConnectionsPerIpError, match=r"max\.connections\.per\.ip=3")
        with AdminClient(limited.address, request_timeout_ms=2_000) as admin, refusal:
            admin.list_topics()
    finally:
        for sock in kept:
            sock.close()
    # Below the limit again: a new connection is served (the broker noticed the closes).
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        with _connect(limited) as again:
            if _api_versions(again):
                break
        assert time.monotonic() < deadline, "no connection served after the others closed"
        time.sleep(0.1)


def test_a_producer_over_its_byte_rate_is_told_to_wait(limited: InProcessBroker) -> None:
    topic = unique("quota-in")
    with AdminClient(limited.address) as admin:
        admin.create_topic(topic, 1)
        admin.alter_client_quotas("slow-producer", {"producer_byte_rate": 20_000})
    throttles: dict[str, int] = {}
    for client_id in ("free-producer", "slow-producer"):
        with _connect(limited) as sock:
            frame = call(sock, produce_request(topic, b"x" * 220_000, acks=1), client_id)
            assert frame is not None
            answer = ProduceResponse[7].decode(frame, header=True)
            (partition,) = answer.responses[0].partition_responses
            assert partition.error_code == 0  # appended all the same
            throttles[client_id] = answer.throttle_time_ms
    # 220 kB measured over the 10 s a new meter spans: 22 kB/s against 20 kB/s, so about
    # a tenth of the span (Kafka's formula); the quota binds its client id only.
    assert throttles["free-producer"] == 0
    assert 500 <= throttles["slow-producer"] <= 11_000
    assert limited.server.core.quotas.throttled_ms()["producer_byte_rate"] > 0


def test_a_consumer_over_its_byte_rate_is_told_to_wait(limited: InProcessBroker) -> None:
    topic = unique("quota-out")
    with AdminClient(limited.address) as admin:
        admin.create_topic(topic, 1)
        admin.alter_client_quotas("slow-consumer", {"consumer_byte_rate": 20_000})
    with Producer(limited.address) as producer:
        for _ in range(4):
            producer.send(topic, b"y" * 60_000, partition=0)
        producer.flush(TIMEOUT_S * 1000)
    fetch = fetch_request(topic, max_bytes=10_000_000)
    throttles: dict[str, int] = {}
    with _connect(limited) as sock:
        for client_id in ("free-consumer", "slow-consumer"):
            frame = call(sock, fetch, client_id)
            assert frame is not None
            answer = FetchResponse[11].decode(frame, header=True)
            (partition,) = answer.responses[0].partitions
            assert partition.error_code == 0
            assert len(partition.records) > 200_000  # everything came back, throttled or not
            throttles[client_id] = answer.throttle_time_ms
    assert throttles["free-consumer"] == 0
    assert throttles["slow-consumer"] > 0
