"""A classic group comes back after its single-node broker restarts (issue #27): two members
join and sync over the Kafka wire (kafka-python's protocol classes on raw sockets, so that
every step is the test's), the broker restarts on the same data directory within their
session, and both keep their member ids, generation and assignments: their heartbeats are
answered NONE, DescribeGroups shows the group Stable as before, a SyncGroup hands each its
assignment again, and their commits are accepted. Nobody rejoins.

The state-machine rules (sessions restarted at the load, a dead member expired by its
session, an emptied group coming back empty) are in ``tests/broker/test_groups_metadata.py``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kafka.protocol.admin.groups import DescribeGroupsRequest, DescribeGroupsResponse
from kafka.protocol.consumer import OffsetCommitResponse
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)

from tests.kafka import raw
from tests.kafka.conftest import unique
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 20.0
SESSION_MS = 30_000  # the restart fits well inside it


@pytest.fixture
def broker() -> Iterator[InProcessBroker]:
    settings = {"kafka.listen": "127.0.0.1:0", "group.initial.rebalance.delay.ms": 0}
    with InProcessBroker(settings=settings) as running:
        yield running


def _connect(broker: InProcessBroker) -> socket.socket:
    port = broker.server.kafka_port
    assert port is not None
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    sock.settimeout(TIMEOUT_S)
    return sock


def _call(sock: socket.socket, request: Any, response_class: Any) -> Any:
    answer = raw.call(sock, request, "test-persistence")
    assert answer is not None, "the broker hung up"
    return response_class[request.version].decode(answer, header=True)


def _join(sock: socket.socket, group: str, member_id: str) -> Any:
    request = JoinGroupRequest[5](
        group_id=group,
        session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=SESSION_MS,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[JoinGroupRequest[5].JoinGroupRequestProtocol(name="range", metadata=b"m")],
    )
    return _call(sock, request, JoinGroupResponse)


def _sync(sock: socket.socket, group: str, joined: Any, assignments: dict[str, bytes]) -> Any:
    assignment_class = SyncGroupRequest[3].SyncGroupRequestAssignment
    request = SyncGroupRequest[3](
        group_id=group,
        generation_id=joined.generation_id,
        member_id=joined.member_id,
        group_instance_id=None,
        assignments=[assignment_class(member_id=m, assignment=a) for m, a in assignments.items()],
    )
    return _call(sock, request, SyncGroupResponse)


def _heartbeat(sock: socket.socket, group: str, member_id: str, generation: int) -> int:
    request = HeartbeatRequest[3](
        group_id=group, generation_id=generation, member_id=member_id, group_instance_id=None
    )
    return int(_call(sock, request, HeartbeatResponse).error_code)


def _describe(sock: socket.socket, group: str) -> Any:
    request = DescribeGroupsRequest[4](groups=[group], include_authorized_operations=False)
    (described,) = _call(sock, request, DescribeGroupsResponse).groups
    return described


def test_a_restarted_broker_brings_its_classic_group_back(broker: InProcessBroker) -> None:
    group = unique("restart")
    with _connect(broker) as a_sock, _connect(broker) as b_sock:
        a_id = _join(a_sock, group, "").member_id  # MEMBER_ID_REQUIRED (v5)
        a = _join(a_sock, group, a_id)
        assert a.error_code == 0
        assert _sync(a_sock, group, a, {a_id: b"solo"}).assignment == b"solo"
        b_id = _join(b_sock, group, "").member_id
        with ThreadPoolExecutor(1) as pool:
            b_joining = pool.submit(_join, b_sock, group, b_id)  # parked: "a" must rejoin
            # "a" learns of the rebalance from a heartbeat once b's JoinGroup has arrived
            # (until then its heartbeats are answered NONE): REBALANCE_IN_PROGRESS.
            deadline = time.monotonic() + TIMEOUT_S
            while _heartbeat(a_sock, group, a_id, a.generation_id) != 27:
                assert time.monotonic() < deadline, "b's JoinGroup never started a rebalance"
                time.sleep(0.05)
            a = _join(a_sock, group, a_id)
            b = b_joining.result(TIMEOUT_S)
            assert (a.error_code, b.error_code) == (0, 0)
            assert a.leader == a_id
            b_syncing = pool.submit(_sync, b_sock, group, b, {})
            assert _sync(a_sock, group, a, {a_id: b"pa", b_id: b"pb"}).assignment == b"pa"
            assert b_syncing.result(TIMEOUT_S).assignment == b"pb"
        before = _describe(a_sock, group)
        assert before.group_state == "Stable"

    broker.restart()

    with _connect(broker) as a_sock, _connect(broker) as b_sock:
        generation = a.generation_id
        assert _heartbeat(a_sock, group, a_id, generation) == 0
        assert _heartbeat(b_sock, group, b_id, generation) == 0
        after = _describe(a_sock, group)
        assert (after.error_code, after.group_state, after.protocol_data) == (0, "Stable", "range")
        assert sorted((m.member_id, m.member_assignment) for m in after.members) == sorted(
            (m.member_id, m.member_assignment) for m in before.members
        )
        # A member whose SyncGroup answer was lost asks again: the same assignment.
        assert _sync(b_sock, group, b, {}).assignment == b"pb"
        topic = unique("t")
        with AdminClient(broker.address) as admin:
            admin.create_topic(topic, 1)
        commit = raw.offset_commit_request(group, topic, {0: (5, -1)})
        commit.generation_id_or_member_epoch = generation
        commit.member_id = a_id
        answer = raw.call(a_sock, commit, "test-persistence")
        assert answer is not None
        committed = OffsetCommitResponse[commit.version].decode(answer, header=True)
        (answered,) = committed.topics
        assert [p.error_code for p in answered.partitions] == [0]  # member and generation known
