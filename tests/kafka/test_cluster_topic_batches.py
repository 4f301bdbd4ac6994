"""CreateTopics and DeleteTopics of 100 topics at once on a three-broker cluster (issue #34).

Before the batches (``broker.cluster.topic_batches``), one CreateTopics of 100 topics of
4 partitions at replication factor 3 got no answer within confluent-kafka's 60 s, every
topic ``_TIMED_OUT``: each topic cost the controller an event, a transaction and a wait,
and every broker re-read the whole cluster one znode at a time after each. Here the same
request, from confluent-kafka and from kafka-python, is answered within the clients' 30 s
request timeout with every topic created, and every partition is then led in the
answering broker's own view (the batch answers only once it is); CreatePartitions and
DeleteTopics of the 100 likewise. A request answered by a broker other than the
controller (forwarded as one call) is led there when answered; ``timeout_ms`` 0 answers
at once, as Kafka's; a topic named twice is ``INVALID_REQUEST``.

Real broker processes on a real ZooKeeper (``LocalCluster(kafka=True)``); every wait is
bounded.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient as ConfluentAdmin
from confluent_kafka.admin import NewTopic as ConfluentTopic
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.kafka import raw
from tests.kafka.conftest import unique
from tidelog import client
from tidelog.broker.cluster.testing import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CLIENT_TIMEOUT_S = 30  # "well within 30 s": the clients give up at 30 s
TOPICS = 100
PARTITIONS = 4
_INVALID_REQUEST = 42


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(brokers=3, kafka=True) as running:
        yield running


def _call(cluster: LocalCluster, broker_id: int, request: Any) -> bytes:
    host, port = cluster.kafka_address(broker_id).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.settimeout(60)
        answer = raw.call(sock, request, "test-topic-batches")
    assert answer is not None, "the broker closed the connection"
    return answer


def _metadata(cluster: LocalCluster, broker_id: int) -> dict[str, list[Any]]:
    """Every topic's partitions in ``broker_id``'s Metadata (v7)."""
    found = MetadataResponse[7].decode(
        _call(cluster, broker_id, MetadataRequest[7](topics=None)), header=True
    )
    return {t.name: list(t.partitions) for t in found.topics if not t.error_code}


def _all_led(
    cluster: LocalCluster, broker_id: int, names: list[str], partitions: int = PARTITIONS
) -> bool:
    shown = _metadata(cluster, broker_id)
    return all(
        len(shown.get(n, [])) == partitions
        and all(not p.error_code and p.leader_id >= 0 for p in shown[n])
        for n in names
    )


def _none_listed(cluster: LocalCluster, broker_id: int, names: list[str]) -> bool:
    shown = _metadata(cluster, broker_id)
    return not any(n in shown for n in names)


def _controller(cluster: LocalCluster) -> int:
    with client.AdminClient(cluster.bootstrap) as admin:
        return admin.describe_cluster().controller_id


def _names(prefix: str, count: int = TOPICS) -> list[str]:
    base = unique(prefix)
    return [f"{base}-{i:03d}" for i in range(count)]


def test_confluent_creates_and_deletes_100_topics_in_one_request_each(
    cluster: LocalCluster,
) -> None:
    names = _names("confluent")
    admin = ConfluentAdmin({"bootstrap.servers": cluster.kafka_bootstrap})
    futures = admin.create_topics(
        [ConfluentTopic(n, PARTITIONS, 3) for n in names],
        operation_timeout=CLIENT_TIMEOUT_S,
        request_timeout=CLIENT_TIMEOUT_S,
    )
    failed = {}
    for name, future in futures.items():
        try:
            future.result()
        except Exception as exc:
            failed[name] = str(exc)
    assert failed == {}
    for broker_id in cluster.broker_ids:  # the others' views follow the controller's
        eventually(lambda b=broker_id: _all_led(cluster, b, names))

    futures = admin.delete_topics(
        names, operation_timeout=CLIENT_TIMEOUT_S, request_timeout=CLIENT_TIMEOUT_S
    )
    for name, future in futures.items():
        try:
            future.result()
        except Exception as exc:
            failed[name] = str(exc)
    assert failed == {}
    for broker_id in cluster.broker_ids:
        eventually(lambda b=broker_id: _none_listed(cluster, b, names))


def test_kafka_python_creates_grows_and_deletes_100_topics_led_when_answered(
    cluster: LocalCluster,
) -> None:
    names = _names("kpython")
    admin = KafkaAdminClient(
        bootstrap_servers=cluster.kafka_bootstrap, request_timeout_ms=CLIENT_TIMEOUT_S * 1000
    )
    try:
        created = admin.create_topics(
            {n: {"num_partitions": PARTITIONS, "replication_factor": 3} for n in names},
            timeout_ms=CLIENT_TIMEOUT_S * 1000,
        )
        assert {t["name"]: t["error_code"] for t in created["topics"]} == dict.fromkeys(names, 0)
        # kafka-python sent it to the controller, whose view had every partition led
        # before it answered.
        assert _all_led(cluster, _controller(cluster), names)

        # One CreatePartitions growing all 100 to twice the partitions: one batch too.
        grown = admin.create_partitions(
            dict.fromkeys(names, 2 * PARTITIONS), timeout_ms=CLIENT_TIMEOUT_S * 1000
        )
        assert {r.name: r.error_code for r in grown.results} == dict.fromkeys(names, 0)
        assert _all_led(cluster, _controller(cluster), names, 2 * PARTITIONS)

        deleted = admin.delete_topics(names, timeout_ms=CLIENT_TIMEOUT_S * 1000)
        assert {t["name"]: t["error_code"] for t in deleted["topics"]} == dict.fromkeys(names, 0)
        assert _none_listed(cluster, _controller(cluster), names)
    finally:
        admin.close()


def _create_request(names: list[str], timeout_ms: int) -> Any:
    return CreateTopicsRequest[5](
        topics=[
            CreateTopicsRequest.CreatableTopic(
                name=n,
                num_partitions=PARTITIONS,
                replication_factor=3,
                assignments=[],
                configs=[],
            )
            for n in names
        ],
        timeout_ms=timeout_ms,
        validate_only=False,
    )


def test_a_non_controller_answers_a_batch_once_its_own_view_has_it_led(
    cluster: LocalCluster,
) -> None:
    other = next(b for b in cluster.broker_ids if b != _controller(cluster))
    names = _names("elsewhere", 30)
    answer = CreateTopicsResponse[5].decode(
        _call(cluster, other, _create_request(names, 30_000)), header=True
    )
    assert {t.name: t.error_code for t in answer.topics} == dict.fromkeys(names, 0)
    assert {t.num_partitions for t in answer.topics} == {PARTITIONS}
    assert _all_led(cluster, other, names)

    gone = DeleteTopicsResponse[4].decode(
        _call(cluster, other, DeleteTopicsRequest[4](topic_names=names, timeout_ms=30_000)),
        header=True,
    )
    assert {r.name: r.error_code for r in gone.responses} == dict.fromkeys(names, 0)
    assert _none_listed(cluster, other, names)


def test_timeout_zero_answers_at_once_and_a_topic_named_twice_is_refused(
    cluster: LocalCluster,
) -> None:
    names = _names("nowait", 20)
    answer = CreateTopicsResponse[5].decode(
        _call(cluster, _controller(cluster), _create_request(names, 0)), header=True
    )
    # Created, not waited for (Kafka: "the request returns immediately"): no counts yet.
    assert {t.name: (t.error_code, t.num_partitions) for t in answer.topics} == dict.fromkeys(
        names, (0, -1)
    )
    for broker_id in cluster.broker_ids:
        eventually(lambda b=broker_id: _all_led(cluster, b, names))

    twice = unique("twice")
    once = unique("once")
    answer = CreateTopicsResponse[5].decode(
        _call(cluster, _controller(cluster), _create_request([twice, once, twice], 30_000)),
        header=True,
    )
    assert [(t.name, t.error_code) for t in answer.topics] == [
        (twice, _INVALID_REQUEST),
        (once, 0),
        (twice, _INVALID_REQUEST),
    ]
    assert twice not in _metadata(cluster, _controller(cluster))
