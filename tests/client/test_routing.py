"""Routing against the in-memory cluster: calls follow leaders, coordinators and the
controller when they move, and an offline partition fails clearly at the timeout."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import pytest

from tidelog.client.cluster import NO_LEADER, BrokerAvoidance, ClusterMetadata
from tidelog.client.connection import Connection, ConnectionFactory
from tidelog.client.offsets import commit_offsets, fetch_committed, list_offsets, partitions_of
from tidelog.client.routing import ClusterConnections
from tidelog.client.testing import InMemoryCluster
from tidelog.client.types import TopicPartition
from tidelog.storage.errors import (
    BrokerUnavailableError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    NotCoordinatorError,
    OffsetNotAvailableError,
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


def test_the_in_memory_cluster_places_manual_assignments() -> None:
    cluster = InMemoryCluster(3)
    connections = _connections(cluster, ManualClock())

    def on_controller(call: Callable[[Connection, int], Any]) -> Any:
        return connections.run(connections.route_controller(), call, what="admin")

    created = on_controller(
        lambda c, t: c.create_topic("m", 0, 0, {}, replica_assignment=[[2], [1]], timeout_ms=t)
    )
    assert [p.leader for p in created.partitions] == [2, 1]
    grown = on_controller(
        lambda c, t: c.create_partitions(
            "m", 3, validate_only=False, replica_assignment=[[0]], timeout_ms=t
        )
    )
    assert grown == 3
    described = on_controller(lambda c, t: c.describe_topic("m", timeout_ms=t))
    assert [p.replicas for p in described.partitions] == [(2,), (1,), (0,)]
    with pytest.raises(InvalidReplicaAssignmentError):
        on_controller(
            lambda c, t: c.create_topic("n", 0, 0, {}, replica_assignment=[[5]], timeout_ms=t)
        )
    with pytest.raises(InvalidReplicaAssignmentError, match="only 1 assignment"):
        on_controller(
            lambda c, t: c.create_partitions(
                "m", 5, validate_only=False, replica_assignment=[[0]], timeout_ms=t
            )
        )


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


# --- avoiding dead and cut-off brokers (issue #25 item 8, issue #33) ----------------------


class StaleView:
    """A broker whose metadata answers are frozen or say it cannot vouch for any leader
    (a broker cut off from ZooKeeper); every other call goes to the in-memory broker."""

    def __init__(self, inner: Connection, answer: Callable[[], ClusterMetadata]) -> None:
        self._inner = inner
        self._answer = answer

    @property
    def address(self) -> str:
        return self._inner.address

    def metadata(
        self, topics: Sequence[str] = (), *, include_internal: bool, timeout_ms: int | None
    ) -> ClusterMetadata:
        self._inner.metadata(include_internal=include_internal, timeout_ms=timeout_ms)
        return self._answer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def leaderless(metadata: ClusterMetadata) -> ClusterMetadata:
    """``metadata`` as a cut-off broker answers it: no partition has a leader."""
    return dataclasses.replace(
        metadata,
        topics={
            name: dataclasses.replace(
                topic,
                partitions=tuple(
                    dataclasses.replace(p, leader=NO_LEADER, isr=()) for p in topic.partitions
                ),
            )
            for name, topic in metadata.topics.items()
        },
    )


def with_stale_views(
    cluster: InMemoryCluster, answers: Mapping[int, Callable[[], ClusterMetadata]]
) -> ConnectionFactory:
    """``cluster.connect``, with the metadata of the brokers in ``answers`` replaced."""
    by_address = {cluster.nodes[b].address: answer for b, answer in answers.items()}

    def connect(address: str) -> Connection:
        inner = cluster.connect(address)
        answer = by_address.get(address)
        return inner if answer is None else cast(Connection, StaleView(inner, answer))

    return connect


def metadata_askers(cluster: InMemoryCluster) -> list[int]:
    """The brokers asked for metadata, in order."""
    return [broker for broker, call in cluster.calls if call == "metadata"]


def test_calls_for_any_broker_leave_a_dead_broker_for_a_live_one() -> None:
    """The bootstrap broker that answered the metadata dies: the next call for "any
    broker" goes to a live one after one failed attempt, and later calls do not try the
    dead one again (it is backing off), instead of every call waiting out its timeout."""
    cluster = InMemoryCluster(3)
    cluster.add_topic("orders", 2, leaders=[1, 2])
    clock = ManualClock()
    connections = _connections(cluster, clock, bootstrap=cluster.bootstrap)
    assert connections.metadata().broker_id == 0
    cluster.kill(0)

    def list_topics() -> list[str]:
        return [
            t.name
            for t in connections.run(
                connections.route_any(),
                lambda c, t: c.list_topics(include_internal=False, timeout_ms=t),
                what="ListTopics",
            )
        ]

    for _ in range(5):
        assert list_topics() == ["orders"]
    assert cluster.calls_to(0, "list_topics") == 1
    assert clock.now_ms <= 100  # one backoff, not a timeout
    assert partitions_of(connections, "orders", None) == [0, 1]
    assert cluster.calls_to(0, "describe_topic") == 0


def test_a_dead_broker_is_not_asked_for_metadata_first_again() -> None:
    """A broker whose connection failed goes to the end of the list for metadata too."""
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 1, leaders=[2])
    clock = ManualClock()
    connections = _connections(cluster, clock, bootstrap=cluster.bootstrap)
    connections.metadata()
    cluster.kill(0)
    tp = TopicPartition("t", 0)
    for _ in range(3):
        clock.now_ms += 500  # past the metadata backoff, within the dead broker's
        connections.metadata(force=True)
    assert metadata_askers(cluster) == [0, 0, 1, 1, 1]
    assert list_offsets(connections, {tp: -1}, None) == {tp: (0, -1)}


def test_a_cut_off_brokers_answer_sends_the_next_refresh_to_another_broker() -> None:
    """Issue #33: a broker cut off from ZooKeeper answers that no partition has a leader.
    The refresh after it is asked of another broker, which knows the leader."""
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 2, leaders=[1, 2])
    tp = TopicPartition("t", 1)
    cluster.append(tp, 7)
    clock = ManualClock()
    with cluster._lock:
        cut_off = leaderless(cluster._metadata_locked(0))
    connect = with_stale_views(cluster, {0: lambda: cut_off})
    connections = ClusterConnections(
        cluster.bootstrap,
        connect,
        request_timeout_ms=5_000,
        monotonic_ms=clock.monotonic_ms,
        sleep_ms=clock.sleep_ms,
    )
    assert list_offsets(connections, {tp: -1}, None) == {tp: (7, -1)}
    assert metadata_askers(cluster) == [0, 1]
    assert clock.slept == [100]


def test_not_leader_sends_the_next_refresh_to_another_broker() -> None:
    """Issue #33: a broker with a stale view routes a call to itself and refuses it
    (``NOT_LEADER_OR_FOLLOWER``); asking it again would give the same stale answer."""
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 1, leaders=[0])
    tp = TopicPartition("t", 0)
    cluster.append(tp, 3)
    with cluster._lock:
        before = cluster._metadata_locked(0)  # broker 0 leads tp
    cluster.move_leader(tp, 2)
    clock = ManualClock()
    connections = ClusterConnections(
        cluster.bootstrap,
        with_stale_views(cluster, {0: lambda: before}),
        request_timeout_ms=5_000,
        monotonic_ms=clock.monotonic_ms,
        sleep_ms=clock.sleep_ms,
    )
    assert list_offsets(connections, {tp: -1}, None) == {tp: (3, -1)}
    assert cluster.calls_to(0, "list_offsets") == 1
    assert metadata_askers(cluster) == [0, 1]


def test_refreshes_rotate_through_every_known_broker() -> None:
    """When every broker gives an unusable answer, each refresh asks the next one in turn
    (the one asked longest ago), not the first of the list again and again."""
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 1, leaders=[1])
    with cluster._lock:
        cut_off = {b: leaderless(cluster._metadata_locked(b)) for b in range(3)}
    clock = ManualClock()
    connections = ClusterConnections(
        cluster.bootstrap,
        with_stale_views(
            cluster, {b: functools.partial(lambda m: m, m) for b, m in cut_off.items()}
        ),
        request_timeout_ms=5_000,
        monotonic_ms=clock.monotonic_ms,
        sleep_ms=clock.sleep_ms,
    )
    with pytest.raises(LeaderNotAvailableError):
        list_offsets(connections, {TopicPartition("t", 0): -1}, 5_000)
    assert metadata_askers(cluster)[:6] == [0, 1, 2, 0, 1, 2]


def test_a_metadata_failure_names_the_whole_wait_and_the_first_cause() -> None:
    """Issue #25 item 6: asked again and again with the last slices of a deadline, the
    error says how long no broker has answered and why the first attempt failed, not the
    last slice ("within 1 ms")."""
    cluster = InMemoryCluster(2)
    clock = ManualClock()
    connections = _connections(cluster, clock, bootstrap=cluster.bootstrap)
    cluster.kill(0)
    cluster.kill(1)
    for _ in range(3):
        with pytest.raises(BrokerUnavailableError):
            connections.metadata(timeout_ms=1, force=True)
        clock.now_ms += 1_500
    with pytest.raises(BrokerUnavailableError) as raised:
        connections.metadata(timeout_ms=1, force=True)
    message = str(raised.value)
    assert "for 4500 ms" in message, message
    assert "within 1 ms" not in message
    assert "first error: broker at mem-0:9000 is unavailable" in message, message


def test_a_routed_call_that_gives_up_names_the_whole_wait() -> None:
    cluster = InMemoryCluster(2)
    clock = ManualClock()
    connections = _connections(cluster, clock, bootstrap=cluster.bootstrap)
    connections.metadata()
    cluster.kill(0)
    cluster.kill(1)
    with pytest.raises(BrokerUnavailableError) as raised:
        connections.run(
            connections.route_any(),
            lambda c, t: c.list_topics(include_internal=False, timeout_ms=t),
            what="ListTopics",
            timeout_ms=3_000,
        )
    message = str(raised.value)
    assert message.startswith("ListTopics: gave up after 3000 ms"), message
    assert "broker at mem-0:9000 is unavailable" in message, message


def test_broker_avoidance_orders_good_then_suspected_then_backing_off() -> None:
    avoidance = BrokerAvoidance(initial_backoff_ms=1_000, max_backoff_ms=4_000)
    addresses = ["a", "b", "c", "d"]
    assert avoidance.order(addresses, 0) == addresses
    avoidance.unreachable("a", 0)  # backs off until 1 000
    avoidance.suspect("c")
    avoidance.suspect("b")  # suspected after c: asked after c
    assert avoidance.order([*addresses, "a"], 0) == ["d", "c", "b", "a"]
    assert avoidance.order(addresses, 1_000) == ["a", "d", "c", "b"]  # backoff passed
    avoidance.unreachable("a", 1_000)  # the second failure in a row: 2 s
    assert avoidance.backing_off("a", 2_999)
    assert not avoidance.backing_off("a", 3_000)
    for _ in range(5):
        avoidance.unreachable("a", 10_000)
    assert avoidance.backing_off("a", 13_999)  # 10 s at most
    assert not avoidance.backing_off("a", 14_000)
    avoidance.reachable("a")
    avoidance.trusted("c")
    assert avoidance.order(addresses, 10_000) == ["a", "c", "d", "b"]
    with pytest.raises(ValueError, match="initial_backoff_ms"):
        BrokerAvoidance(initial_backoff_ms=0)


def test_offset_not_available_is_asked_again_of_the_same_leader() -> None:
    """A new leader answers OFFSET_NOT_AVAILABLE until its high watermark is known:
    asked again after a backoff (as Kafka's admin client and consumer do), not raised,
    and the broker is not blamed for it."""
    cluster = InMemoryCluster(2)
    cluster.add_topic("t", 1, leaders=[1])
    tp = TopicPartition("t", 0)
    cluster.append(tp, 7)
    clock = ManualClock()
    connections = _connections(cluster, clock)
    cluster.fail_next("list_offsets", OffsetNotAvailableError("t-0: not yet"), times=2)
    assert list_offsets(connections, {tp: -1}, 5_000) == {tp: (7, -1)}
    assert clock.slept == [100, 200]
    assert cluster.calls_to(1, "list_offsets") == 3
    assert cluster.calls_to(0, "list_offsets") == 0


def test_offset_not_available_past_the_timeout_is_raised() -> None:
    cluster = InMemoryCluster(1)
    cluster.add_topic("t", 1)
    clock = ManualClock()
    connections = _connections(cluster, clock)
    cluster.fail_next("list_offsets", OffsetNotAvailableError("t-0: not yet"), times=100)
    with pytest.raises(OffsetNotAvailableError, match="gave up after 2000 ms"):
        list_offsets(connections, {TopicPartition("t", 0): -1}, 2_000)
    assert clock.now_ms == 2_000
