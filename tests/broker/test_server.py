"""The daemon around the service: health, reflection, metrics, limits, shutdown."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.broker.conftest import TIMEOUT_S, create_topic, error_code, fetch, make_batch, produce
from tidelog.broker.server import BROKER_SERVICE_NAME, ListenError
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Producer
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.checkpoint import CLEAN_SHUTDOWN_MARKER


def test_health_reports_serving_then_not_serving() -> None:
    broker = InProcessBroker().start()
    try:
        with broker.channel() as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", BROKER_SERVICE_NAME):
                answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
            watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            broker.stop()
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        broker.stop()


def test_server_reflection_describes_the_service(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
    )
    names = {s.name for s in next(answers).list_services_response.service}
    assert {BROKER_SERVICE_NAME, "grpc.health.v1.Health"} <= names
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    service = pool.FindServiceByName(BROKER_SERVICE_NAME)
    assert "Produce" in {m.name for m in service.methods}


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def _sample(text: str, prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(prefix + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no sample {prefix!r} in the scrape")


def test_metrics_per_broker_registry() -> None:
    with InProcessBroker(metrics=True) as one, InProcessBroker(metrics=True) as two:
        assert one.metrics_port is not None
        assert two.metrics_port is not None
        assert one.metrics_port != two.metrics_port
        with one.channel() as channel:
            stub = pb_grpc.BrokerStub(channel)
            create_topic(stub, "events", 2)
            batch = make_batch([b"a", b"b", b"c"])
            produce(stub, "events", 1, batch)
            assert fetch(stub, "events", 1, 0).records == batch
        text = _scrape(one.metrics_port)
        assert _sample(text, 'tidelog_bytes_in_total{topic="events"}') == len(batch)
        assert _sample(text, 'tidelog_records_in_total{topic="events"}') == 3
        assert _sample(text, 'tidelog_bytes_out_total{topic="events"}') == len(batch)
        assert _sample(text, 'tidelog_records_out_total{topic="events"}') == 3
        assert _sample(text, 'tidelog_log_end_offset{partition="1",topic="events"}') == 3
        assert _sample(text, 'tidelog_log_segments{partition="0",topic="events"}') == 1
        assert _sample(text, 'tidelog_requests_total{code="OK",method="Produce"}') == 1
        assert _sample(text, 'tidelog_request_duration_seconds_count{method="Fetch"}') == 1
        assert "events" not in _scrape(two.metrics_port)  # registries are separate
        with one.channel() as channel:
            stub = pb_grpc.BrokerStub(channel)
            assert produce(stub, "events", 9, batch).error_code == "UNKNOWN_TOPIC_OR_PARTITION"
            stub.DeleteTopic(pb.DeleteTopicRequest(name="events"), timeout=TIMEOUT_S)
        text = _scrape(one.metrics_port)
        assert _sample(text, 'tidelog_produce_errors_total{code="UNKNOWN_TOPIC_OR_PARTITION"}') == 1
        assert 'topic="events"' not in text  # a deleted topic's series are gone


def test_metrics_are_off_by_default_in_tests(broker: InProcessBroker) -> None:
    assert broker.metrics_port is None


def test_a_port_in_use_is_a_clear_error(broker: InProcessBroker) -> None:
    with pytest.raises(ListenError, match="cannot listen"):
        InProcessBroker(port=broker.port).start()


def test_calls_after_shutdown_began_are_unavailable(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t")
        broker.server.core.begin_close()
        with pytest.raises(grpc.RpcError) as info:
            produce(stub, "t", 0, make_batch([b"late"]))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_code(info.value) is None  # no code: the same as a broker that is gone


def test_a_new_broker_has_no_groups(stub: pb_grpc.BrokerStub) -> None:
    # The group RPCs are served (tests/broker/test_groups_*.py cover them).
    assert list(stub.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S).groups) == []


def test_stop_is_idempotent_and_the_data_dir_is_removed() -> None:
    broker = InProcessBroker().start()
    data_dir = broker.data_dir
    broker.stop()
    broker.stop()
    assert not data_dir.exists()


def test_a_given_data_dir_is_kept_and_reopened(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t")
        produce(stub, "t", 0, make_batch([b"kept"]))
    assert (tmp_path / CLEAN_SHUTDOWN_MARKER).exists()
    with InProcessBroker(tmp_path) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        assert fetch(stub, "t", 0, 0).high_watermark == 1


def test_an_open_produce_stream_does_not_hold_a_graceful_stop() -> None:
    """A producer keeps its stream open between sends; the stop ends it (``UNAVAILABLE``,
    after answering what it read) instead of waiting for it for the whole grace period
    (issue #29, bug 2 of ``docs/reliability.md``)."""
    grace_ms = 20_000
    broker = InProcessBroker().start()
    try:
        with AdminClient(broker.address) as admin:
            admin.create_topic("open-stream", 1)
        with Producer(broker.address, linger_ms=0, retries=0) as producer:
            producer.send("open-stream", b"sent", partition=0).result(TIMEOUT_S)  # stream open
            started = time.monotonic()
            broker.stop(grace_ms)
            took_ms = (time.monotonic() - started) * 1000
            producer.flush(5_000)  # nothing left to send: the stream's end fails nothing
        assert took_ms < grace_ms / 4, f"the stop took {took_ms:.0f} ms"
    finally:
        broker.stop()
