"""Keepalive: the broker drops connections whose peer stopped answering, and accepts pings.

A vanished client (host crash, no FIN or RST) is played by ``FreezableProxy``: a TCP proxy
on 127.0.0.1 that, once frozen, stops moving bytes in both directions but keeps every
socket open, so the broker sees a connection that is up and silent. A stream holds no
thread, but a parked operation and the connection's place in ``max.connections``: two
frozen streams (a parked long poll and an idle produce stream) must give both back once
the broker has cancelled them (``tests/broker/test_serving.py`` checks the same for a
lone parked fetch). The same proxy checks that the client notices a silent broker, and a
client pinging at its own pace over a long idle poll must keep its stream (no GOAWAY
too_many_pings). Each of these fails without the keepalive options.
"""

from __future__ import annotations

import queue
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from tests.broker.conftest import create_topic, make_batch, produce_request
from tidelog.broker.assembly import grpc_options as _grpc_options
from tidelog.broker.config import BrokerConfig
from tidelog.broker.testing import InProcessBroker
from tidelog.client.transport import Transport
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import BrokerUnavailableError

_SHORT_KEEPALIVE = {
    "connections.keepalive.time.ms": 300,
    "connections.keepalive.timeout.ms": 1_000,  # generous: CI machines stall
}


class FreezableProxy:
    """Forwards TCP connections to ``127.0.0.1:upstream_port``; ``freeze`` stops all bytes.

    Not thread-safe (one owner); ``close`` once.
    """

    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self._frozen = threading.Event()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def freeze(self) -> None:
        """Stop forwarding in both directions; the sockets stay open (no FIN, no RST)."""
        self._frozen.set()

    def close(self) -> None:
        self._closing.set()
        for thread in self._threads:
            thread.join(5.0)
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                downstream, _ = self._listener.accept()
            except TimeoutError:
                continue
            upstream = socket.create_connection(("127.0.0.1", self._upstream_port))
            with self._lock:
                self._sockets += [downstream, upstream]
            for source, target in ((downstream, upstream), (upstream, downstream)):
                pump = threading.Thread(target=self._pump, args=(source, target), daemon=True)
                self._threads.append(pump)
                pump.start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        while not self._closing.is_set():
            if self._frozen.is_set():
                self._closing.wait(0.05)
                continue
            readable, _, _ = select.select([source], [], [], 0.05)
            if not readable or self._frozen.is_set():
                continue
            try:
                data = source.recv(65536)
                if not data:
                    target.shutdown(socket.SHUT_WR)
                    return
                target.sendall(data)
            except OSError:
                return


@pytest.fixture
def proxies() -> Iterator[list[FreezableProxy]]:
    proxies: list[FreezableProxy] = []
    yield proxies
    for proxy in proxies:
        proxy.close()


def _parked_fetches(broker: InProcessBroker) -> int:
    return broker.server.core.parked_operations()["fetch"]


def _within(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``condition`` (the broker's own counters) holds within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_streams_of_a_silent_client_are_cancelled_and_free_what_they_held(
    proxies: list[FreezableProxy],
) -> None:
    with InProcessBroker(settings=_SHORT_KEEPALIVE) as broker, broker.channel() as direct:
        direct_stub = pb_grpc.BrokerStub(direct)
        create_topic(direct_stub, "t")
        proxy = FreezableProxy(broker.port)
        proxies.append(proxy)
        # A plain channel without keepalive of its own: only the broker's pings are tested.
        with grpc.insecure_channel(proxy.address) as remote:
            remote_stub = pb_grpc.BrokerStub(remote)
            # Stream 1: a FetchStream in a long poll on an empty partition.
            fetches: queue.SimpleQueue[pb.FetchRequest | None] = queue.SimpleQueue()
            fetch_answers = remote_stub.FetchStream(iter(fetches.get, None))
            partitions = [pb.FetchPartition(topic="t", partition=0, fetch_offset=0)]
            fetches.put(pb.FetchRequest(correlation_id=1, partitions=partitions))
            assert next(fetch_answers).correlation_id == 1  # the handler runs
            fetches.put(
                pb.FetchRequest(
                    correlation_id=2, max_wait_ms=30_000, min_bytes=1, partitions=partitions
                )
            )
            # Stream 2: an open ProduceStream, idle after its first request.
            produces: queue.SimpleQueue[pb.ProduceRequest | None] = queue.SimpleQueue()
            produce_answers = remote_stub.ProduceStream(iter(produces.get, None))
            produces.put(produce_request("t", 0, make_batch([b"v"]), correlation_id=7))
            assert next(produce_answers).correlation_id == 7
            # The answer woke the long poll; park the next one.
            answer = next(fetch_answers)
            assert answer.correlation_id == 2
            fetches.put(
                pb.FetchRequest(
                    correlation_id=3,
                    max_wait_ms=30_000,
                    min_bytes=1,
                    partitions=[pb.FetchPartition(topic="t", partition=0, fetch_offset=1)],
                )
            )
            assert _within(lambda: _parked_fetches(broker) == 1, 5.0), "the poll never parked"
            assert broker.server.admission.connections == 1  # the proxied one

            proxy.freeze()
            # 300 ms quiet + 1 s unanswered ping, then the calls end: the parked fetch and
            # the connection's place are given back (with no keepalive, after 30 s).
            assert _within(lambda: _parked_fetches(broker) == 0, 5.0), "the poll still parked"
            assert _within(lambda: broker.server.admission.connections == 0, 5.0), (
                "the frozen connection still counts"
            )
            # The broker still serves a new client.
            direct_stub.ListTopics(pb.ListTopicsRequest(), timeout=5.0)
            fetch_answers.cancel()
            produce_answers.cancel()
            fetches.put(None)  # ends the request iterators
            produces.put(None)


def test_client_pinging_at_the_accepted_interval_keeps_its_stream() -> None:
    with InProcessBroker(settings=_SHORT_KEEPALIVE) as broker:
        with broker.channel() as direct:
            create_topic(pb_grpc.BrokerStub(direct), "t")
        # The client's own options, pinging every second (gRPC's floor for a client; the
        # broker accepts one per 300 ms here): a 7 s long poll with no data either way
        # sees 7 pings. gRPC's default server policy (one per 5 minutes, GOAWAY
        # too_many_pings after 2 strikes) ends the stream about 5 s in (measured: the
        # first pings of a new connection do not count).
        transport = Transport(
            broker.address,
            client_id="keepalive-test",
            request_timeout_ms=10_000,
            keepalive_time_ms=1_000,
        )
        try:
            stream = transport.open_stream(transport.stub.FetchStream, "FetchStream")
            answers = stream.responses()
            partitions = [pb.FetchPartition(topic="t", partition=0, fetch_offset=0)]
            started = time.monotonic()
            stream.send(
                pb.FetchRequest(
                    correlation_id=1, max_wait_ms=7_000, min_bytes=1, partitions=partitions
                )
            )
            assert next(answers).correlation_id == 1
            assert time.monotonic() - started >= 6.5  # it did wait, pinging meanwhile
            stream.send(pb.FetchRequest(correlation_id=2, partitions=partitions))
            assert next(answers).correlation_id == 2  # the stream is still usable
            stream.close()
            assert list(answers) == []
            # Unary calls on the same connection work too.
            transport.call(transport.stub.ListTopics, pb.ListTopicsRequest(), what="ListTopics")
        finally:
            transport.close()


def test_client_notices_a_silent_broker(proxies: list[FreezableProxy]) -> None:
    # The broker's own pings are 30 s apart here: only the client's can end the stream.
    with InProcessBroker() as broker:
        with broker.channel() as direct:
            create_topic(pb_grpc.BrokerStub(direct), "t")
        proxy = FreezableProxy(broker.port)
        proxies.append(proxy)
        transport = Transport(
            proxy.address,
            client_id="keepalive-test",
            request_timeout_ms=10_000,
            keepalive_time_ms=300,  # gRPC's client floor is 1 s
            keepalive_timeout_ms=1_000,
        )
        try:
            stream = transport.open_stream(transport.stub.FetchStream, "FetchStream")
            answers = stream.responses()
            partitions = [pb.FetchPartition(topic="t", partition=0, fetch_offset=0)]
            stream.send(pb.FetchRequest(correlation_id=1, partitions=partitions))
            assert next(answers).correlation_id == 1
            stream.send(
                pb.FetchRequest(
                    correlation_id=2, max_wait_ms=30_000, min_bytes=1, partitions=partitions
                )
            )
            outcome: list[BaseException | object] = []

            def read() -> None:
                try:
                    outcome.append(next(answers))
                except BaseException as exc:  # the stream's error is the outcome
                    outcome.append(exc)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            proxy.freeze()
            reader.join(5.0)
            assert outcome, "the client did not notice the silent broker within 5 s"
            assert isinstance(outcome[0], BrokerUnavailableError)
        finally:
            transport.close()


def test_default_settings_give_the_documented_options() -> None:
    options = dict(_grpc_options(BrokerConfig()))
    assert options["grpc.keepalive_time_ms"] == 30_000
    assert options["grpc.keepalive_timeout_ms"] == 20_000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    # The client pings every 30 s: the broker must accept that, with room for timer slack.
    assert options["grpc.http2.min_ping_interval_without_data_ms"] <= 30_000 // 2
    short = dict(_grpc_options(BrokerConfig(connections_keepalive_time_ms=300)))
    assert short["grpc.http2.min_ping_interval_without_data_ms"] == 300
