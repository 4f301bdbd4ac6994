"""A classic group's membership survives its coordinator's death (issue #27): three broker
processes with Kafka listeners on a real ZooKeeper (``LocalCluster(kafka=True)``),
``__consumer_offsets`` replicated on all three, and two confluent-kafka consumers (the
classic protocol, librdkafka's default) in one group, each recording every assignment and
revocation its client reports (``tests/kafka/test_static_membership.Member``).

The group's coordinator is SIGKILLed, or stopped (SIGTERM: a controlled shutdown that
moves its leaderships first). Its offsets partition gets a new leader, which loads
the group's metadata record with the offsets; the members find it and keep heartbeating
with their member ids and generation. Asserted: neither client reports any revocation or
new assignment after the kill, the generation (``describe_group``, from the new
coordinator) and the members with their assignments (Kafka's DescribeGroups) are what
they were, and records produced after the kill are all consumed.

The members' session (20 s) covers the failover as the clients see it: librdkafka gives
its partitions up by itself when no heartbeat succeeds for a session, whatever the broker
keeps. Every wait is bounded; the module takes 30-60 s.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from kafka.protocol.admin.groups import DescribeGroupsRequest, DescribeGroupsResponse
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from tests.broker.cluster.conftest import require_zookeeper
from tests.kafka import raw
from tests.kafka.conftest import unique
from tests.kafka.test_cluster import create_topic, eventually
from tests.kafka.test_static_membership import Member, _quiet
from tidelog import client
from tidelog.broker.cluster.testing import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TIMEOUT_S = 20.0
SESSION_MS = 20_000
PARTITIONS = 4


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(brokers=3, kafka=True, session_timeout_ms=3_000) as running:
        yield running


def _call(cluster: LocalCluster, broker_id: int, request: Any, response_class: Any) -> Any:
    host, port = cluster.kafka_address(broker_id).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        answer = raw.call(sock, request, "test-group-persistence")
    assert answer is not None, "the broker closed the connection"
    return response_class[request.version].decode(answer, header=True)


def _coordinator(cluster: LocalCluster, asked: int, group: str) -> int:
    request = FindCoordinatorRequest[1](key=group, key_type=0)
    answer = _call(cluster, asked, request, FindCoordinatorResponse)
    return -1 if answer.error_code else int(answer.node_id)


def _members(cluster: LocalCluster, broker_id: int, group: str) -> tuple[str, list[Any]]:
    """(state, sorted (member id, assignment)) from Kafka's DescribeGroups."""
    request = DescribeGroupsRequest[4](groups=[group], include_authorized_operations=False)
    (described,) = _call(cluster, broker_id, request, DescribeGroupsResponse).groups
    assert described.error_code == 0, described
    members = sorted((m.member_id, bytes(m.member_assignment)) for m in described.members)
    return described.group_state, members


def _produce(cluster: LocalCluster, topic: str, tag: str, count: int) -> set[bytes]:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "message.timeout.ms": 40_000,
        }
    )
    failed: list[Any] = []
    values = [f"{tag}-{i}".encode() for i in range(count)]
    for i, value in enumerate(values):
        producer.produce(
            topic,
            value=value,
            partition=i % PARTITIONS,
            on_delivery=lambda err, _: failed.append(err) if err else None,
        )
        producer.poll(0)
    assert producer.flush(45) == 0, "records left undelivered"
    assert not failed, failed
    return set(values)


def _settled(members: list[Member]) -> bool:
    held = [m.held for m in members]
    return all(len(h) == PARTITIONS // 2 for h in held) and len(frozenset().union(*held)) == (
        PARTITIONS
    )


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_members_keep_their_assignment_when_the_coordinator_dies(
    cluster: LocalCluster, signum: signal.Signals
) -> None:
    topic = unique("kept")
    group = unique("survivors")
    create_topic(cluster, topic, PARTITIONS, 3)
    members = [
        Member("confluent-kafka", cluster.kafka_bootstrap, topic, group, None, SESSION_MS)
        for _ in range(2)
    ]
    try:
        eventually(lambda: _settled(members), "two members with two partitions each", 40)
        _quiet(members)  # no rebalance still settling
        first = _produce(cluster, topic, "before", 40)
        eventually(lambda: first <= {v for m in members for v in m.values}, "every record read", 40)
        victim = _coordinator(cluster, 1, group)
        assert victim in cluster.broker_ids
        survivor = next(b for b in cluster.broker_ids if b != victim)
        state, described = _members(cluster, victim, group)
        assert state == "Stable"
        with client.AdminClient(cluster.address(victim)) as admin:
            generation = admin.describe_group(group).group_epoch
        events = [list(m.events) for m in members]

        cluster.kill(victim, signum)
        eventually(
            lambda: _coordinator(cluster, survivor, group) not in (victim, -1),
            "a new coordinator for the group",
            40,
        )
        coordinator = _coordinator(cluster, survivor, group)
        second = _produce(cluster, topic, "after", 40)
        eventually(
            lambda: second <= {v for m in members for v in m.values},
            "every record produced after the kill read",
            60,
        )

        assert [m.fatal for m in members] == [None, None]
        # No revocation, no new assignment: the clients never rebalanced.
        assert [list(m.events) for m in members] == events
        assert _members(cluster, coordinator, group) == ("Stable", described)
        with client.AdminClient(cluster.address(coordinator)) as admin:
            assert admin.describe_group(group).group_epoch == generation
    finally:
        for m in members:
            m._stop.set()
        deadline = time.monotonic() + TIMEOUT_S
        for m in members:
            m._thread.join(max(0.0, deadline - time.monotonic()))
