"""Routing against the in-memory cluster: calls follow leaders, coordinators and the
controller when they move, and an offline partition fails clearly at the timeout."""

from __future__ import annotations

import pytest

from client.offsets import commit_offsets, fetch_committed, list_offsets, partitions_of
from client.routing import ClusterConnections
from client.testing import InMemoryCluster
from client.types import TopicPartition
from storage.errors import (
    BrokerUnavailableError,
    InvalidReplicationFactorError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    NotCoordinatorError,
    UnknownTopicOrPartitionError,
)


class ManualClock:
    """Time moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now_ms = 0
        self.slept: list[int] = []

    def monotonic_ms(self) -> int:
        return self.now_ms

    def sleep_ms(self, duration_ms: int) -> None:
        self.slept.append(duration_ms)
        self.now_ms += duration_ms


def _connections(
    cluster: InMemoryCluster, clock: ManualClock, bootstrap: str | None = None
) -> ClusterConnections:
    return ClusterConnections(
        bootstrap or cluster.nodes[0].address,
        cluster.connect,
        request_timeout_ms=5_000,
        metadata_max_age_ms=60_000,
        monotonic_ms=clock.monotonic_ms,
        sleep_ms=clock.sleep_ms,
    )


def test_each_partition_is_asked_of_its_leader() -> None:
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 3)  # partition p led by broker p
    for p in range(3):
        cluster.append(TopicPartition("t", p), 10 * (p + 1))
    clock = ManualClock()
    connections = _connections(cluster, clock)
    tps = [TopicPartition("t", p) for p in range(3)]
    answers = list_offsets(connections, dict.fromkeys(tps, -1), None)
    assert answers == {tp: (10 * (tp.partition + 1), -1) for tp in tps}
    assert [cluster.calls_to(b, "list_offsets") for b in range(3)] == [1, 1, 1]
    assert clock.slept == []


def test_a_moved_leader_is_followed_after_a_metadata_refresh() -> None:
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 1, leaders=[0])
    tp = TopicPartition("t", 0)
    cluster.append(tp, 5)
    clock = ManualClock()
    connections = _connections(cluster, clock)
    assert list_offsets(connections, {tp: -1}, None) == {tp: (5, -1)}
    cluster.move_leader(tp, 2)
    cluster.append(tp, 1)
    assert list_offsets(connections, {tp: -1}, None) == {tp: (6, -1)}
    assert cluster.calls_to(0, "list_offsets") == 2  # the second one refused
    assert cluster.calls_to(2, "list_offsets") == 1
    assert clock.slept == [100]


def test_an_offline_partition_fails_with_leader_not_available_at_the_timeout() -> None:
    cluster = InMemoryCluster(2)
    cluster.add_topic("t", 2)
    clock = ManualClock()
    connections = _connections(cluster, clock)
    cluster.kill(1)
    with pytest.raises(LeaderNotAvailableError, match="t-1"):
        list_offsets(connections, {TopicPartition("t", 1): -1}, 3_000)
    assert clock.now_ms == 3_000
    assert clock.slept[:5] == [100, 200, 400, 800, 1_000]  # backing off, no storm
    # The other partition is still served.
    assert list_offsets(connections, {TopicPartition("t", 0): -2}, 3_000) == {
        TopicPartition("t", 0): (0, -1)
    }


def test_a_revived_broker_is_found_again() -> None:
    cluster = InMemoryCluster(2)
    cluster.add_topic("t", 2)
    clock = ManualClock()
    connections = _connections(cluster, clock)
    tp = TopicPartition("t", 1)
    cluster.kill(1)
    with pytest.raises(LeaderNotAvailableError):
        list_offsets(connections, {tp: -1}, 500)
    cluster.revive(1)
    assert list_offsets(connections, {tp: -1}, 5_000) == {tp: (0, -1)}


def test_bootstrap_list_skips_a_dead_broker() -> None:
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 1, leaders=[2])
    cluster.kill(0)
    clock = ManualClock()
    connections = _connections(cluster, clock, bootstrap=cluster.bootstrap)
    assert connections.metadata().broker_id == 1
    assert partitions_of(connections, "t", None) == [0]


def test_no_live_bootstrap_broker_is_a_clear_error() -> None:
    cluster = InMemoryCluster(2)
    cluster.kill(0)
    cluster.kill(1)
    connections = _connections(cluster, ManualClock(), bootstrap=cluster.bootstrap)
    with pytest.raises(BrokerUnavailableError, match="no broker of mem-0:9000,mem-1:9001"):
        connections.metadata()


def test_unknown_partition_is_not_retried() -> None:
    cluster = InMemoryCluster(1)
    clock = ManualClock()
    with pytest.raises(UnknownTopicOrPartitionError):
        list_offsets(_connections(cluster, clock), {TopicPartition("nope", 0): -1}, 5_000)
    assert clock.slept == []


def test_group_calls_follow_the_coordinator() -> None:
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 1)
    tp = TopicPartition("t", 0)
    cluster.set_coordinator("g", 1)
    clock = ManualClock()
    connections = _connections(cluster, clock)
    commit_offsets(connections, "g", {tp: 3}, member_id="", member_epoch=-1, timeout_ms=5_000)
    assert cluster.committed("g") == {tp: 3}
    cluster.set_coordinator("g", 2)
    commit_offsets(connections, "g", {tp: 4}, member_id="", member_epoch=-1, timeout_ms=5_000)
    assert fetch_committed(connections, "g", [tp], 5_000) == {tp: 4}
    assert cluster.calls_to(1, "commit_offsets") == 2  # the second refused
    assert cluster.calls_to(2, "commit_offsets") == 1
    assert cluster.calls_to(2, "fetch_committed") == 1
    # Its broker dies and the group moves: found again.
    cluster.kill(2)
    cluster.set_coordinator("g", 0)
    assert fetch_committed(connections, "g", [tp], 5_000) == {tp: 4}


def test_admin_calls_follow_the_controller() -> None:
    cluster = InMemoryCluster(3)
    clock = ManualClock()
    connections = _connections(cluster, clock)

    def create(name: str, replication_factor: int = 1) -> object:
        return connections.run(
            connections.route_controller(),
            lambda c, t: c.create_topic(name, 2, replication_factor, {}, timeout_ms=t),
            what="CreateTopic",
        )

    create("a")
    cluster.set_controller(2)
    create("b")
    assert cluster.calls_to(0, "create_topic") == 2
    assert cluster.calls_to(2, "create_topic") == 1
    with pytest.raises(InvalidReplicationFactorError):
        create("c", 3)


def test_a_deadline_cutting_a_retry_short_raises_the_refusal_before_it() -> None:
    """Retrying a refused call until the timeout, the last attempt is often cut off by the
    deadline (a loaded machine): the caller learns why the call failed (the coordinator
    refused), not merely that the last attempt ran out of time."""
    cluster = InMemoryCluster(1)
    clock = ManualClock()
    connections = _connections(cluster, clock)
    attempts: list[int] = []

    def call(connection: object, timeout: int) -> None:
        attempts.append(timeout)
        if len(attempts) == 1:
            raise NotCoordinatorError("broker 0 is not the coordinator of g")
        clock.now_ms += timeout  # no answer before the deadline
        raise KafkaTimeoutError("OffsetFetch g: no answer before the deadline")

    route = connections.route_any()
    with pytest.raises(NotCoordinatorError, match="not the coordinator") as raised:
        connections.run(route, call, what="OffsetFetch g", timeout_ms=600, group_id="g")
    assert isinstance(raised.value.__cause__, KafkaTimeoutError)
    assert attempts == [600, 500]
    # Without an earlier refusal, running out of time is the whole story.

    def silent(connection: object, timeout: int) -> None:
        clock.now_ms += timeout
        raise KafkaTimeoutError("OffsetFetch g: no answer before the deadline")

    with pytest.raises(KafkaTimeoutError):
        connections.run(route, silent, what="OffsetFetch g", timeout_ms=600, group_id="g")
