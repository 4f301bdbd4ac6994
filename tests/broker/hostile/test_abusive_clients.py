"""Slow and abusive clients are cut off by limits, not by the broker's memory (issue 15).

One broker process with short connection limits (``ABUSE_SETTINGS``), a correct client
(``Canary``) producing and consuming throughout, and the broker's RSS measured before
and after each abuse:

- slowloris: connections that trickle the HTTP/2 preface a byte at a time, or open and
  say nothing, are closed by ``socket.connection.setup.timeout.ms``; connections set up
  and left without a call by ``connections.max.idle.ms``;
- a client that opens fetch streams, sends requests and never reads the answers: each
  stream is held by HTTP/2 flow control (the broker stops reading its requests while an
  answer waits), so it costs about one answer and a window, never a queue;
- a gRPC message that declares a 2 GiB length (a raw HTTP/2 DATA frame): refused by
  ``socket.request.max.bytes`` when its 5-byte prefix arrives, nothing allocated.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import grpc
import pytest

from tests.broker.hostile import http2
from tests.broker.hostile.canary import Canary
from tests.broker.hostile.process import BrokerProcess
from tests.storage.conftest import make_batch
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(300)

SETUP_TIMEOUT_MS = 2_000
IDLE_MS = 3_000
ABUSE_SETTINGS: dict[str, object] = {
    "socket.connection.setup.timeout.ms": SETUP_TIMEOUT_MS,
    "connections.max.idle.ms": IDLE_MS,
    "fetch.max.wait.ms": 200,
}
RSS_GROWTH_BOUND_BYTES = 64 * 1024 * 1024
# A stream that is not read holds one answer (up to 1 MiB here) and what HTTP/2 flow
# control let through (measured: ~4.5 MiB a stream with 1 MiB answers).
PER_UNREAD_STREAM_BYTES = 8 * 1024 * 1024
SLOWLORIS_CONNECTIONS = 200
NON_READING_STREAMS = 20


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("abuse")
    broker = BrokerProcess(root / "data", root / "broker.log", ABUSE_SETTINGS)
    try:
        with grpc.insecure_channel(broker.address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            for name in ("big",):
                stub.CreateTopic(pb.CreateTopicRequest(name=name, partitions=1), timeout=30)
        yield broker
    finally:
        broker.stop()
    assert broker.tracebacks() == [], "\n\n".join(broker.tracebacks()[:5])


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0)
    try:
        while True:
            if sock.recv(65_536) == b"":
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_slowloris_connections_are_closed_by_the_setup_timeout(target: BrokerProcess) -> None:
    canary = Canary(target.address, topic="canary-1").start()
    rss_before = target.rss_bytes()
    trickling = [http2.connect(target.address) for _ in range(SLOWLORIS_CONNECTIONS)]
    silent = [http2.connect(target.address) for _ in range(SLOWLORIS_CONNECTIONS // 2)]
    started = time.monotonic()
    sent = 0
    # One byte of the preface per connection every 200 ms: never a whole preface.
    while time.monotonic() - started < SETUP_TIMEOUT_MS / 1000 + 3:
        for sock in trickling:
            try:
                sock.send(http2.PREFACE[sent : sent + 1])
            except OSError:
                pass
        sent = min(sent + 1, len(http2.PREFACE) - 2)
        time.sleep(0.2)
    rss_during = target.rss_bytes()
    closed = [_closed_by_peer(sock) for sock in trickling + silent]
    for sock in trickling + silent:
        sock.close()
    problems = canary.stop()
    assert all(closed), f"{closed.count(False)} of {len(closed)} connections still open"
    assert problems == [], problems
    assert rss_during - rss_before < RSS_GROWTH_BOUND_BYTES, (rss_before, rss_during)


def test_an_idle_connection_is_closed_by_connections_max_idle(target: BrokerProcess) -> None:
    sock = http2.connect(target.address)
    sock.sendall(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0, b""))
    kinds = http2.frames_until_closed(sock, IDLE_MS / 1000 + 5)
    sock.close()
    assert http2.GOAWAY in kinds, kinds


def test_a_2_gib_message_is_refused_without_allocating_it(target: BrokerProcess) -> None:
    canary = Canary(target.address, topic="canary-2").start()
    rss_before = target.rss_bytes()
    endings = []
    for _ in range(20):
        sock = http2.connect(target.address)
        sock.sendall(
            http2.PREFACE
            + http2.frame(http2.SETTINGS, 0, 0, b"")
            + http2.request_headers(target.address, "/tidelog.v1.Broker/Produce")
            + http2.frame(http2.DATA, 0, 1, http2.grpc_message_prefix(2**31 - 1) + b"x" * 1000)
        )
        endings.append(http2.frames_until_closed(sock, 10))
        sock.close()
    rss_after = target.rss_bytes()
    problems = canary.stop()
    # Each call ended at once: trailers (RESOURCE_EXHAUSTED) or a reset, not a wait for
    # 2 GiB that never come.
    assert all(
        kinds and kinds[-1] in (http2.HEADERS, http2.RST_STREAM, http2.GOAWAY) for kinds in endings
    ), endings
    assert problems == [], problems
    assert rss_after - rss_before < RSS_GROWTH_BOUND_BYTES, (rss_before, rss_after)


def test_streams_that_are_never_read_cost_one_answer_each(target: BrokerProcess) -> None:
    with grpc.insecure_channel(target.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        value = b"v" * 100_000
        for _ in range(30):  # 3 MB to fetch, 100 kB batches
            stub.Produce(
                pb.ProduceRequest(
                    acks=1,
                    topics=[
                        pb.ProduceTopicData(
                            topic="big",
                            partitions=[
                                pb.ProducePartitionData(partition=0, records=make_batch([value]))
                            ],
                        )
                    ],
                ),
                timeout=30,
            )
    canary = Canary(target.address, topic="canary-3").start()
    rss_before = target.rss_bytes()
    request = pb.FetchRequest(
        max_bytes=1_048_576,
        partitions=[pb.FetchPartition(topic="big", partition=0, partition_max_bytes=1_048_576)],
    )
    channels = [
        grpc.insecure_channel(target.address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(NON_READING_STREAMS)
    ]
    # Each stream asks for the same 1 MiB a thousand times and never reads an answer.
    calls = [
        pb_grpc.BrokerStub(ch).FetchStream(iter([request] * 1_000), timeout=60) for ch in channels
    ]
    time.sleep(5)
    rss_during = target.rss_bytes()
    for call in calls:
        call.cancel()
    for ch in channels:
        ch.close()
    problems = canary.stop()
    assert problems == [], problems
    assert rss_during - rss_before < NON_READING_STREAMS * PER_UNREAD_STREAM_BYTES, (
        rss_before,
        rss_during,
    )
