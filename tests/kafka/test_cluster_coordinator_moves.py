"""A former group coordinator answers ``NOT_COORDINATOR`` and lists nothing of the groups
it held (Kafka's ``onResignation``): three broker processes with Kafka listeners on a real
ZooKeeper (``LocalCluster(kafka=True)``), ``__consumer_offsets`` with one partition
replicated on all three (so every group has the same coordinator), automatic leader
rebalancing off (the test moves leadership itself).

A classic group (a confluent-kafka consumer, librdkafka's classic protocol) and a KIP-848
group (Tidelog's own consumer over gRPC) live on coordinator A. A is stopped (SIGTERM: a
controlled shutdown moves its leaderships) and B takes the groups over, serving both.
A restarts and comes back a follower: it lists neither group and describes neither (it
read the offsets topic at start). Then a preferred election gives the partition back to A
while B, still running, holds both groups in memory: B, asked directly (raw Kafka
requests to its Kafka port and raw gRPC calls to its address), answers every group call
``NOT_COORDINATOR`` and lists neither group, while A serves both. Every wait is bounded;
the module takes 30-60 s.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import grpc
import pytest
from kafka.protocol.admin import (
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from tests.broker.cluster.conftest import require_zookeeper
from tests.kafka import raw
from tests.kafka.conftest import unique
from tests.kafka.test_cluster import create_topic
from tidelog import client
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.broker.grpc.errors import ERROR_CODE_METADATA_KEY
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TIMEOUT_S = 30.0
_NOT_COORDINATOR = 16
OFFSETS = client.TopicPartition("__consumer_offsets", 0)


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {"offsets.topic.num.partitions": 1, "auto.leader.rebalance.enable": "false"}
    with LocalCluster(brokers=3, kafka=True, session_timeout_ms=3_000, settings=settings) as c:
        yield c


def _eventually(check: Callable[[], bool], what: str) -> None:
    """``check`` until true; errors of a cluster in motion count as "not yet"."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            if check():
                return
        except (OSError, grpc.RpcError, client.TidelogError, AssertionError):
            pass
        assert time.monotonic() < deadline, f"{what}: not reached in {TIMEOUT_S:.0f} s"
        time.sleep(0.2)


def _kafka(cluster: LocalCluster, broker_id: int, request: Any, response_class: Any) -> Any:
    """One request on a new connection to ``broker_id``'s Kafka listener, decoded."""
    host, port = cluster.kafka_address(broker_id).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        answer = raw.call(sock, request, "test-coordinator-moves")
    assert answer is not None, "the broker closed the connection"
    return response_class[request.version].decode(answer, header=True)


def _coordinator(cluster: LocalCluster, asked: int, group: str) -> int:
    answer = _kafka(
        cluster, asked, FindCoordinatorRequest[1](key=group, key_type=0), FindCoordinatorResponse
    )
    return -1 if answer.error_code else int(answer.node_id)


def _described(cluster: LocalCluster, broker_id: int, groups: list[str]) -> dict[str, Any]:
    request = DescribeGroupsRequest[4](groups=groups, include_authorized_operations=False)
    answer = _kafka(cluster, broker_id, request, DescribeGroupsResponse)
    return {g.group_id: g for g in answer.groups}


def _kafka_listed(cluster: LocalCluster, broker_id: int) -> set[str]:
    answer = _kafka(cluster, broker_id, ListGroupsRequest[2](), ListGroupsResponse)
    assert answer.error_code == 0, answer
    return {g.group_id for g in answer.groups}


_CHANNELS: dict[str, grpc.Channel] = {}


def _grpc(cluster: LocalCluster, broker_id: int) -> broker_pb2_grpc.BrokerStub:
    """A raw stub to ``broker_id`` itself (the AdminClient would route to the group's
    coordinator); channels are closed at the end of the module."""
    address = cluster.address(broker_id)
    if address not in _CHANNELS:
        _CHANNELS[address] = grpc.insecure_channel(address)
    return broker_pb2_grpc.BrokerStub(_CHANNELS[address])


@pytest.fixture(autouse=True)
def _close_channels() -> Iterator[None]:
    yield
    for channel in _CHANNELS.values():
        channel.close()
    _CHANNELS.clear()


def _grpc_listed(cluster: LocalCluster, broker_id: int) -> set[str]:
    answer = _grpc(cluster, broker_id).ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S)
    return {g.group_id for g in answer.groups}


def _grpc_error(call: Callable[[], object]) -> str:
    """The Tidelog error code a gRPC call fails with (its trailing metadata)."""
    with pytest.raises(grpc.RpcError) as failed:
        call()
    error = failed.value
    assert isinstance(error, grpc.Call)
    return dict(error.trailing_metadata() or ()).get(ERROR_CODE_METADATA_KEY, "")


def _serves_both(cluster: LocalCluster, broker_id: int, classic: str, modern: str) -> bool:
    """``broker_id`` coordinates both groups: the classic one with its member (Kafka's
    DescribeGroups), the KIP-848 one with its member (gRPC DescribeGroup), both listed."""
    described = _described(cluster, broker_id, [classic])[classic]
    if described.error_code or described.group_state != "Stable" or len(described.members) != 1:
        return False
    answer = _grpc(cluster, broker_id).DescribeGroup(
        pb.DescribeGroupRequest(group_id=modern), timeout=TIMEOUT_S
    )
    return len(answer.members) == 1 and {classic, modern} <= _kafka_listed(cluster, broker_id)


def _refuses_both(cluster: LocalCluster, broker_id: int, classic: str, modern: str) -> None:
    """Every group call to ``broker_id`` answers NOT_COORDINATOR, on both listeners, and
    neither listing shows the groups."""
    described = _described(cluster, broker_id, [classic, modern])
    assert {g: d.error_code for g, d in described.items()} == {
        classic: _NOT_COORDINATOR,
        modern: _NOT_COORDINATOR,
    }
    assert not {classic, modern} & _kafka_listed(cluster, broker_id)
    heartbeat = HeartbeatRequest[1](group_id=classic, generation_id=1, member_id="m")
    assert _kafka(cluster, broker_id, heartbeat, HeartbeatResponse).error_code == (_NOT_COORDINATOR)
    fetched = _kafka(
        cluster,
        broker_id,
        raw.offset_fetch_request(classic, "t", [0], version=5),
        OffsetFetchResponse,
    )
    assert fetched.error_code == _NOT_COORDINATOR
    stub = _grpc(cluster, broker_id)
    assert not {classic, modern} & _grpc_listed(cluster, broker_id)
    for group in (classic, modern):
        assert (
            _grpc_error(
                lambda g=group: stub.DescribeGroup(pb.DescribeGroupRequest(group_id=g), timeout=5)
            )
            == "NOT_COORDINATOR"
        )
        assert (
            _grpc_error(
                lambda g=group: stub.OffsetFetch(pb.OffsetFetchRequest(group_id=g), timeout=5)
            )
            == "NOT_COORDINATOR"
        )
    join = pb.ConsumerGroupHeartbeatRequest(
        group_id=modern, member_epoch=0, subscribed_topic_names=["t"], session_timeout_ms=30_000
    )
    assert _grpc_error(lambda: stub.ConsumerGroupHeartbeat(join, timeout=5)) == "NOT_COORDINATOR"


def test_a_former_coordinator_refuses_and_does_not_list_the_groups_it_held(
    cluster: LocalCluster,
) -> None:
    topic = unique("moved")
    classic, modern = unique("classic"), unique("modern")
    create_topic(cluster, topic, 2, 3)
    first = _coordinator(cluster, 1, classic)
    assert first == _coordinator(cluster, 1, modern)  # one offsets partition
    with client.AdminClient(cluster.bootstrap) as admin:
        (described,) = admin.describe_topic("__consumer_offsets").partitions
        assert described.leader == first == described.replicas[0]
    kafka_consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": classic,
            "session.timeout.ms": 20_000,
            "auto.offset.reset": "earliest",
        }
    )
    own_consumer = client.Consumer(cluster.bootstrap, group_id=modern, auto_offset_reset="earliest")
    try:
        kafka_consumer.subscribe([topic])
        own_consumer.subscribe([topic])

        def both_assigned() -> bool:
            kafka_consumer.poll(0.1)
            own_consumer.poll(timeout_ms=100)
            return bool(kafka_consumer.assignment()) and bool(own_consumer.assignment())

        _eventually(both_assigned, "both groups' members assigned")
        # Records read and committed by both groups: the offsets topic holds them all.
        with client.Producer(cluster.bootstrap, acks="all") as producer:
            for partition in (0, 1):
                producer.send(topic, value=b"v", partition=partition).result(TIMEOUT_S)
        kafka_read: list[Any] = []
        own_read: list[client.ConsumerRecord] = []

        def both_read() -> bool:
            message = kafka_consumer.poll(0.1)
            if message is not None and message.error() is None:
                kafka_read.append(message)
            own_read.extend(own_consumer.poll(timeout_ms=100))
            return bool(kafka_read) and bool(own_read)

        _eventually(both_read, "records read in both groups")
        kafka_consumer.commit(asynchronous=False)
        own_consumer.commit()
        with client.AdminClient(cluster.bootstrap) as admin:
            assert admin.list_group_offsets(classic)
            assert admin.list_group_offsets(modern)
        _eventually(lambda: _serves_both(cluster, first, classic, modern), "first serves")

        # A controlled shutdown moves the coordinator to B, which then serves both.
        cluster.kill(first, signal.SIGTERM)
        survivor = next(b for b in cluster.broker_ids if b != first)
        _eventually(
            lambda: _coordinator(cluster, survivor, classic) not in (first, -1), "a new coordinator"
        )
        second = _coordinator(cluster, survivor, classic)

        def second_serves() -> bool:
            kafka_consumer.poll(0.1)
            own_consumer.poll(timeout_ms=100)
            return _serves_both(cluster, second, classic, modern)

        _eventually(second_serves, "the second coordinator serves both groups")

        # A restarted: a follower of the offsets partition, it shows nothing of them.
        cluster.start_broker(first)
        cluster.wait_converged()
        with client.AdminClient(cluster.bootstrap) as admin:
            _eventually(
                lambda: first in admin.describe_topic("__consumer_offsets").partitions[0].isr,
                "the restarted broker back in the ISR",
            )
            assert admin.describe_topic("__consumer_offsets").partitions[0].leader == second
            _refuses_both(cluster, first, classic, modern)

            # A preferred election gives the partition back to A; B held both groups.
            assert admin.elect_leaders("preferred", [OFFSETS]) == {OFFSETS: None}
        _eventually(lambda: _coordinator(cluster, second, classic) == first, "A coordinates")

        def first_serves_again() -> bool:
            kafka_consumer.poll(0.1)
            own_consumer.poll(timeout_ms=100)
            return _serves_both(cluster, first, classic, modern)

        _eventually(first_serves_again, "the first coordinator serves both groups again")
        _refuses_both(cluster, second, classic, modern)
    finally:
        own_consumer.close()
        kafka_consumer.close()
