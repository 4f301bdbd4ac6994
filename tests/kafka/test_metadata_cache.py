"""Metadata's cached topic entries (``broker.kafka.metadata_cache``) answer the same bytes
as encoding every entry afresh, at every Metadata version the listener serves, while the
topics change between the calls (new topics, new partitions, a deletion, and in a
cluster a leader change), so an entry served stale would differ.

Each comparison asks the real listener over a socket twice in a row: with the cache (warm
from the rounds before) and with it switched off (``TopicEntries.enabled``: every entry
built and encoded per request, the code before the cache). Nothing changes the topics
between the two.
"""

from __future__ import annotations

import io
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from kio.serial import entity_reader, entity_writer

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.kafka import raw
from tests.kafka.conftest import unique
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.broker.core.placement import PartitionPlacement
from tidelog.broker.core.topics import MetadataTopic
from tidelog.broker.kafka.codec import EncodedItems, build, encode_response, is_flexible, to_plain
from tidelog.broker.kafka.codec import _request_schema as request_schema
from tidelog.broker.kafka.codec import _response_schema as response_schema
from tidelog.broker.kafka.listener import KafkaListener
from tidelog.broker.kafka.metadata_cache import TopicEntries
from tidelog.broker.kafka.versions import ADVERTISED
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient

_METADATA = 3
_LOW, _HIGH = ADVERTISED[_METADATA]
_TIMEOUT_S = 30.0


def _frame(version: int, body: dict[str, Any], correlation_id: int) -> bytes:
    """A Metadata request of ``version`` (header v1, or v2 for flexible versions)."""
    name = b"test-metadata-cache"
    header = struct.pack(">hhih", _METADATA, version, correlation_id, len(name)) + name
    if is_flexible(_METADATA, version):
        header += b"\0"
    schema = request_schema(_METADATA, version)
    out = io.BytesIO()
    out.write(header)
    entity_writer(schema)(out, build(schema, body))
    data = out.getvalue()
    return struct.pack(">i", len(data)) + data


def _requests(version: int, names: list[str]) -> list[dict[str, Any]]:
    """Every shape of request a version can send: all topics, some by name, and (v8+)
    asking for the authorized operations too."""
    every: dict[str, Any] = {"topics": [] if version == 0 else None}
    named: dict[str, Any] = {"topics": [{"name": n} for n in names]}
    shapes = [every, named]
    if version >= 4:
        for shape in (every, named):
            shape["allow_auto_topic_creation"] = False
    if version >= 8:
        shapes += [{**s, "include_topic_authorized_operations": True} for s in shapes]
        shapes.append({**every, "include_cluster_authorized_operations": True})
    return shapes


def _ask(address: str, version: int, body: dict[str, Any]) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=_TIMEOUT_S) as sock:
        sock.settimeout(_TIMEOUT_S)
        sock.sendall(_frame(version, body, 7))
        answer = raw.read_frame(sock)
    assert answer is not None, "the broker closed the connection"
    return answer


def _compare(listener: KafkaListener, address: str, names: list[str]) -> int:
    """Every version and request shape, cached then uncached; the cache's hits."""
    entries: TopicEntries = listener.metadata_entries
    hits = entries.hits
    for version in range(_LOW, _HIGH + 1):
        for body in _requests(version, names):
            cached = _ask(address, version, body)
            entries.enabled = False
            try:
                fresh = _ask(address, version, body)
            finally:
                entries.enabled = True
            assert cached == fresh, f"v{version} {body}: the cached answer differs"
    return entries.hits - hits


def _topics(answer: bytes, version: int) -> dict[str, Any]:
    offset = 5 if is_flexible(_METADATA, version) else 4  # the response header
    entity, _ = entity_reader(response_schema(_METADATA, version))(answer, offset)
    plain = to_plain(entity)
    return {t["name"]: t for t in plain["topics"]}


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings={"kafka.listen": "127.0.0.1:0"}) as b:
        yield b


def test_the_same_bytes_as_uncached_while_topics_change(broker: InProcessBroker) -> None:
    listener = broker.server.kafka
    assert listener is not None
    address = f"127.0.0.1:{listener.port}"
    grown, dropped, kept = unique("grown"), unique("dropped"), unique("kept")
    names = [grown, dropped, kept, unique("never-created")]
    with AdminClient(broker.address) as admin:
        admin.create_topic(grown, partitions=2)
        admin.create_topic(dropped, partitions=1)
        admin.create_topic(kept, partitions=3)
        _compare(listener, address, names)
        assert _compare(listener, address, names) > 0, "the second round hit nothing"

        admin.create_partitions(grown, 5)
        assert _compare(listener, address, names) > 0
        answer = _topics(_ask(address, _HIGH, {"topics": None}), _HIGH)
        assert len(answer[grown]["partitions"]) == 5

        admin.delete_topic(dropped)
        assert _compare(listener, address, names) > 0
        answer = _topics(_ask(address, _HIGH, {"topics": None}), _HIGH)
        assert dropped not in answer
        assert kept in answer


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_same_bytes_as_uncached_across_a_leader_change() -> None:
    """A cluster of two broker processes and an in-process third (whose listener the test
    switches): the first broker killed, its partitions get new leaders and the brokers
    list shrinks; the third's cached entries must follow."""
    require_zookeeper()
    with LocalCluster(2, kafka=True, session_timeout_ms=3_000) as cluster:
        settings = {
            "broker.id": 3,
            "zookeeper.connect": f"{cluster.zookeeper.connect_string}/tidelog",
            "zookeeper.session.timeout.ms": 3_000,
            "kafka.listen": "127.0.0.1:0",
        }
        with InProcessBroker(settings=settings) as third:
            listener = third.server.kafka
            assert listener is not None
            address = f"127.0.0.1:{listener.port}"
            topic = unique("moved")

            def led_by() -> dict[int, int]:
                answer = _topics(_ask(address, _HIGH, {"topics": [{"name": topic}]}), _HIGH)
                return {p["partition_index"]: p["leader_id"] for p in answer[topic]["partitions"]}

            with AdminClient(third.address) as admin:
                eventually(lambda: len(admin.describe_cluster().brokers) == 3, timeout_s=_TIMEOUT_S)
                admin.create_topic(topic, partitions=6, replication_factor=3)
            eventually(lambda: all(leader > 0 for leader in led_by().values()), _TIMEOUT_S)
            before = led_by()
            assert 1 in before.values(), f"broker 1 leads nothing: {before}"
            _compare(listener, address, [topic])
            assert _compare(listener, address, [topic]) > 0, "the second round hit nothing"

            cluster.kill(1)
            eventually(
                lambda: all(leader in (2, 3) for leader in led_by().values()),
                timeout_s=_TIMEOUT_S,
            )
            assert _compare(listener, address, [topic]) > 0


@pytest.mark.parametrize("count", [0, 1, 130])
def test_spliced_entries_encode_as_kio_would(count: int) -> None:
    """The splice itself (``codec.EncodedItems``), no broker: at every version, with no
    topic, one, and enough that a compact array's length takes two varint bytes."""
    placement = PartitionPlacement(2, 4, (2, 1, 3), (2, 1), ())
    topics = [
        MetadataTopic(f"t{i}", "", (placement,) * (i % 3), internal=i == 0) for i in range(count)
    ]
    brokers = {1: ("h1", 9092), 2: ("h2", 9093)}
    operations = [-2147483648 if i % 2 else 0b1000 for i in range(count)]
    for version in range(_LOW, _HIGH + 1):
        body = {
            "brokers": [{"node_id": 1, "host": "h1", "port": 9092, "rack": None}],
            "cluster_id": "c",
            "controller_id": 1,
            "cluster_authorized_operations": 7,
            "throttle_time": 3,
        }
        plain = TopicEntries(enabled=False).answer(topics, operations, brokers, version)
        spliced = TopicEntries().answer(topics, operations, brokers, version)
        assert isinstance(spliced, EncodedItems)
        expected = encode_response(_METADATA, version, 9, {**body, "topics": plain})
        assert encode_response(_METADATA, version, 9, {**body, "topics": spliced}) == expected
