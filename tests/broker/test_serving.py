"""Serving many clients: waiting calls hold no thread, limits refuse at once with a code.

Integration tests against a real broker on 127.0.0.1 (the asynchronous model, the
default). Load is bounded: at most 500 connections, held by helper processes
(``tests.broker.fetch_holder``) that exit by themselves after two minutes at most. No
assertion measures time: a call either is answered within its deadline or fails.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, error_code, make_batch, produce
from tests.broker.test_keepalive import FreezableProxy
from tidelog.broker.core.context import RequestContext, peer_host
from tidelog.broker.core.limits import Admission, LimitsConfig
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Producer
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import (
    BrokerBusyError,
    MaxConnectionsError,
    MaxConnectionsPerIpError,
    QueuedMaxRequestBytesError,
    QueuedMaxRequestsError,
)

ROOT = Path(__file__).resolve().parents[2]
_OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def _eventually(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Wait for ``condition`` (the broker's own counters); fail with ``what`` if it never
    holds. A liveness bound, not a measurement."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.05)


class _Stream:
    """One connection of its own with one long poll parked on ``topic``-0."""

    def __init__(self, address: str, topic: str) -> None:
        self.channel = grpc.insecure_channel(address, options=_OWN_CONNECTION)
        self._requests: list[pb.FetchRequest] = [
            pb.FetchRequest(
                max_wait_ms=30_000,
                min_bytes=1,
                partitions=[pb.FetchPartition(topic=topic, partition=0, fetch_offset=0)],
            )
        ]
        self.call = pb_grpc.BrokerStub(self.channel).FetchStream(iter(self._requests))

    def close(self) -> None:
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def streams() -> Iterator[list[_Stream]]:
    opened: list[_Stream] = []
    yield opened
    for stream in opened:
        stream.close()


def _parked(broker: InProcessBroker) -> int:
    return broker.server.core.parked_operations()["fetch"]


def test_500_waiting_consumers_leave_producers_and_admin_answered() -> None:
    holders: list[subprocess.Popen[str]] = []
    settings = {"fetch.max.wait.ms": 600_000}
    with InProcessBroker(settings=settings) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "quiet")
        create_topic(stub, "busy")
        try:
            for _ in range(4):
                holders.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "tests.broker.fetch_holder",
                            broker.address,
                            "quiet",
                            "125",
                            "120",
                        ],
                        cwd=ROOT,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            for holder in holders:
                assert holder.stdout is not None
                assert holder.stdout.readline().strip() == "ready"
            _eventually(lambda: _parked(broker) == 500, "500 parked fetches")
            assert broker.server.admission.connections >= 500
            # Every one of them waits; the broker still answers within a second.
            with AdminClient(broker.address, request_timeout_ms=1_000) as admin:
                assert "busy" in {t.name for t in admin.list_topics()}
            with Producer(broker.address, acks="all", request_timeout_ms=1_000) as producer:
                metadata = producer.send("busy", b"value").result(timeout=1)
            assert metadata.offset == 0
            assert _parked(broker) == 500
        finally:
            for holder in holders:
                holder.communicate(timeout=30)  # closes stdin: the holder exits
        _eventually(lambda: _parked(broker) == 0, "the holders' fetches gone")
        _eventually(lambda: broker.server.admission.connections == 0, "connections gone")


def test_a_vanished_client_frees_its_parked_operations() -> None:
    settings = {"connections.keepalive.time.ms": 300, "connections.keepalive.timeout.ms": 1_000}
    with InProcessBroker(settings=settings) as broker, broker.channel() as channel:
        create_topic(pb_grpc.BrokerStub(channel), "t")
        proxy = FreezableProxy(broker.port)
        try:
            stream = _Stream(proxy.address, "t")
            _eventually(lambda: _parked(broker) == 1, "the fetch parked")
            assert broker.server.admission.connections == 1
            proxy.freeze()  # the client's host is gone: no FIN, no RST, silence
            _eventually(lambda: _parked(broker) == 0, "the parked fetch freed", 20)
            _eventually(lambda: broker.server.admission.connections == 0, "connection gone")
            stream.close()
        finally:
            proxy.close()


def test_max_connections_refuses_a_new_connection_with_its_code(
    streams: list[_Stream],
) -> None:
    with InProcessBroker(settings={"max.connections": 2}) as broker, broker.channel() as channel:
        create_topic(pb_grpc.BrokerStub(channel), "t")
        streams += [_Stream(broker.address, "t"), _Stream(broker.address, "t")]
        _eventually(lambda: broker.server.admission.connections == 2, "two connections")
        with grpc.insecure_channel(broker.address, options=_OWN_CONNECTION) as third:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.BrokerStub(third).ListTopics(pb.ListTopicsRequest(), timeout=TIMEOUT_S)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_code(info.value) == "MAX_CONNECTIONS_REACHED"
            assert "max.connections=2" in (info.value.details() or "")
        # The client raises the exact, retriable error.
        with AdminClient(broker.address) as admin, pytest.raises(MaxConnectionsError) as caught:
            admin.list_topics()
        assert isinstance(caught.value, BrokerBusyError)
        assert caught.value.retriable
        streams.pop().close()
        _eventually(lambda: broker.server.admission.connections == 1, "one connection left")
        with AdminClient(broker.address) as admin:
            assert [t.name for t in admin.list_topics()] == ["t"]


def test_max_connections_per_ip_refuses_with_its_code(streams: list[_Stream]) -> None:
    with (
        InProcessBroker(settings={"max.connections.per.ip": 1}) as broker,
        broker.channel() as channel,
    ):
        create_topic(pb_grpc.BrokerStub(channel), "t")
        streams.append(_Stream(broker.address, "t"))
        _eventually(lambda: broker.server.admission.connections == 1, "one connection")
        with AdminClient(broker.address) as admin, pytest.raises(MaxConnectionsPerIpError):
            admin.list_topics()


def test_queued_max_requests_refuses_with_its_code() -> None:
    with (
        InProcessBroker(settings={"queued.max.requests": 1}) as broker,
        broker.channel() as channel,
    ):
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t")
        admission = broker.server.admission
        admission.admit_request()  # the one place is taken (as by a slow request)
        try:
            with pytest.raises(grpc.RpcError) as info:
                stub.ListTopics(pb.ListTopicsRequest(), timeout=TIMEOUT_S)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_code(info.value) == "QUEUED_MAX_REQUESTS_REACHED"
            with AdminClient(broker.address) as admin, pytest.raises(QueuedMaxRequestsError):
                admin.list_topics()
        finally:
            admission.release_request()
        assert stub.ListTopics(pb.ListTopicsRequest(), timeout=TIMEOUT_S).topics


def test_a_fetch_of_at_most_2_mib_is_read_without_the_storage_executor() -> None:
    """Reads of one or two partitions' worth are done on the event loop's thread
    (``grpc_async._INLINE_READ_MAX_BYTES``): they are answered while the executor's queue
    is full, and a larger fetch still queues for the executor and is refused."""
    with (
        InProcessBroker(settings={"queued.max.requests": 1}) as broker,
        broker.channel() as channel,
    ):
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t")
        produce(stub, "t", 0, make_batch([b"a", b"b"]))

        def fetch(partition_max_bytes: int, max_bytes: int = 0) -> pb.FetchResponse:
            request = pb.FetchRequest(
                max_bytes=max_bytes,
                partitions=[
                    pb.FetchPartition(
                        topic="t",
                        partition=0,
                        fetch_offset=0,
                        partition_max_bytes=partition_max_bytes,
                    )
                ],
            )
            answer: pb.FetchResponse = stub.Fetch(request, timeout=TIMEOUT_S)
            return answer

        admission = broker.server.admission
        admission.admit_request()  # the executor's one place is taken
        try:
            assert fetch(0).results[0].records  # the default 1 MiB per partition
            assert fetch(64 << 20, max_bytes=2 << 20).results[0].records
            with pytest.raises(grpc.RpcError) as info:
                fetch(64 << 20)
            assert error_code(info.value) == "QUEUED_MAX_REQUESTS_REACHED"
        finally:
            admission.release_request()
        assert fetch(64 << 20).results[0].records


def test_queued_max_request_bytes_refuses_produce_data_with_its_code() -> None:
    with (
        InProcessBroker(settings={"queued.max.request.bytes": 1_024}) as broker,
        broker.channel() as channel,
    ):
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t")
        admission = broker.server.admission
        admission.admit_bytes(1_000)  # produce data of other clients in flight
        try:
            with pytest.raises(grpc.RpcError) as info:
                produce(stub, "t", 0, make_batch([b"x" * 100]))
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_code(info.value) == "QUEUED_MAX_REQUEST_BYTES_REACHED"
        finally:
            admission.release_bytes(1_000)
        assert produce(stub, "t", 0, make_batch([b"x" * 100])).error_code == ""
        assert admission.queued_bytes == 0


def test_the_serving_metrics_are_exported() -> None:
    with InProcessBroker(metrics=True) as broker, broker.channel() as channel:
        create_topic(pb_grpc.BrokerStub(channel), "t")
        url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            text = response.read().decode()
        for name in (
            "tidelog_connections ",
            "tidelog_queued_requests ",
            "tidelog_queued_request_bytes ",
            'tidelog_parked_operations{purgatory="fetch"}',
            'tidelog_parked_operations{purgatory="produce"}',
        ):
            assert name in text


def test_the_data_path_is_served_with_acks_all() -> None:
    with InProcessBroker() as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t")
        assert produce(stub, "t", 0, make_batch([b"a"]), acks=-1).base_offset == 0
        requests = [
            pb.ProduceRequest(
                correlation_id=i,
                acks=-1,
                topics=[
                    pb.ProduceTopicData(
                        topic="t",
                        partitions=[
                            pb.ProducePartitionData(partition=0, records=make_batch([b"b"]))
                        ],
                    )
                ],
            )
            for i in range(20)
        ]
        answers = list(stub.ProduceStream(iter(requests), timeout=TIMEOUT_S))
        assert [a.correlation_id for a in answers] == list(range(20))
        assert [a.results[0].base_offset for a in answers] == list(range(1, 21))
        assert broker.server.core.logs.get_log("t", 0).recovery_point >= 21


# --- the counters, without a network --------------------------------------------------


def _caller(peer: str) -> RequestContext:
    return RequestContext("grpc", peer)


def test_a_connection_counts_once_whatever_its_calls() -> None:
    admission = Admission(LimitsConfig(max_connections=2, max_connections_per_ip=2))
    first, second = _caller("ipv4:10.0.0.1:1000"), _caller("ipv4:10.0.0.1:1001")
    for _ in range(5):
        admission.open_call(first)
    admission.open_call(second)
    assert admission.connections == 2
    with pytest.raises(MaxConnectionsError):
        admission.open_call(_caller("ipv4:10.0.0.2:1000"))
    for _ in range(5):
        admission.close_call(first)
    assert admission.connections == 1
    admission.open_call(_caller("ipv4:10.0.0.2:1000"))
    assert admission.refusals() == {"MAX_CONNECTIONS_REACHED": 1}


def test_one_large_request_is_admitted_when_nothing_else_is_in_flight() -> None:
    admission = Admission(LimitsConfig(queued_max_request_bytes=100))
    admission.admit_bytes(1_000)
    with pytest.raises(QueuedMaxRequestBytesError):
        admission.admit_bytes(1)
    admission.release_bytes(1_000)
    admission.admit_bytes(60)
    admission.admit_bytes(40)
    with pytest.raises(QueuedMaxRequestBytesError):
        admission.admit_bytes(1)


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.1:5555", "127.0.0.1"),
        ("ipv6:%5B::1%5D:5555", "::1"),
        ("ipv6:[fe80::1]:1", "fe80::1"),
        ("unix:/tmp/sock", "/tmp/sock"),
    ],
)
def test_peer_host(peer: str, host: str) -> None:
    assert peer_host(peer) == host


def test_a_producer_refused_by_a_limit_retries_and_gets_through() -> None:
    with InProcessBroker(settings={"queued.max.request.bytes": 1_024}) as broker:
        with AdminClient(broker.address) as admin:
            admin.create_topic("t", 1)
        admission = broker.server.admission
        admission.admit_bytes(1_000)  # other producers' data in flight
        with Producer(broker.address, acks=1, retry_backoff_ms=50) as producer:
            future = producer.send("t", b"x" * 100)
            _eventually(
                lambda: admission.refusals().get("QUEUED_MAX_REQUEST_BYTES_REACHED", 0) > 0,
                "the producer was refused",
            )
            assert not future.done()  # refused, not failed: the producer retries
            admission.release_bytes(1_000)
            assert future.result(timeout=TIMEOUT_S).offset == 0
