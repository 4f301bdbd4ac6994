"""The admin's group logic without sockets: lag and reset targets (pure); calls that every
live broker must answer (``ClusterConnections.run_on_every_broker``); group calls that
follow a moving coordinator and take log offsets from the leaders, against the in-memory
cluster."""

from __future__ import annotations

import pytest

from tests.client.test_routing import ManualClock, _connections
from tidelog.client.admin import AdminClient
from tidelog.client.connection import Connection
from tidelog.client.group_admin import (
    alter_group_offsets,
    delete_group,
    delete_offsets,
    describe_group,
    list_group_offsets,
    list_groups,
    partition_lag,
    reset_group_offsets,
    reset_offset,
)
from tidelog.client.routing import ClusterConnections
from tidelog.client.testing import InMemoryCluster
from tidelog.client.types import QuotaEntity, TopicPartition
from tidelog.storage.errors import BrokerUnavailableError, UnknownTopicOrPartitionError


def test_lag_counts_from_the_committed_offset_or_the_log_start() -> None:
    assert partition_lag(4, 0, 10) == 6
    assert partition_lag(None, 3, 10) == 7  # nothing committed: the whole log is to read
    assert partition_lag(10, 0, 10) == 0
    assert partition_lag(None, 0, -1) == -1  # the leader could not say
    assert partition_lag(4, 0, -1) == -1


@pytest.mark.parametrize(
    ("target", "found", "expected"),
    [
        (("earliest", 0), None, 3),
        (("latest", 0), None, 10),
        (("offset", 7), None, 7),
        (("offset", 1), None, 3),  # clamped to the log start
        (("offset", 99), None, 10),  # clamped to the log end
        (("timestamp", 1_000), 5, 5),
        (("timestamp", 1_000), None, 10),  # no record that recent: the log end
    ],
)
def test_reset_offset(target: tuple[str, int], found: int | None, expected: int) -> None:
    assert reset_offset(target, 3, 10, found) == expected  # type: ignore[arg-type]


def test_every_live_broker_is_asked_once_and_a_dead_one_is_dropped_after_a_refresh() -> None:
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 3)
    clock = ManualClock()
    connections = _connections(cluster, clock)
    connections.metadata()  # brokers 0, 1, 2 cached
    cluster.kill(2)
    asked: list[str] = []

    def call(connection: Connection, timeout_ms: int) -> str:
        if connection.address == cluster.nodes[2].address:
            # As the gRPC transport does: an unreachable broker is waited for until the
            # call's deadline.
            clock.now_ms += timeout_ms
        connection.describe_topic("t", timeout_ms=timeout_ms)  # the dead broker raises
        asked.append(connection.address)
        return connection.address

    answers = connections.run_on_every_broker(call, what="test", timeout_ms=5_000)
    assert sorted(answers) == [0, 1]
    assert sorted(asked) == sorted({cluster.nodes[0].address, cluster.nodes[1].address})
    # Asked last, the dead broker got half of the time left, not all of it: one backoff,
    # then the refreshed metadata without broker 2.
    assert clock.slept == [100]
    assert clock.now_ms == 2_500 + 100


def test_a_call_every_broker_refuses_is_raised_at_once() -> None:
    cluster = InMemoryCluster(2)
    connections = _connections(cluster, ManualClock())

    def call(connection: Connection, timeout_ms: int) -> None:
        connection.describe_topic("missing", timeout_ms=timeout_ms)

    with pytest.raises(UnknownTopicOrPartitionError):
        connections.run_on_every_broker(call, what="test", timeout_ms=5_000)


def test_a_broker_that_stays_unreachable_fails_the_call_at_its_timeout() -> None:
    cluster = InMemoryCluster(2)
    cluster.add_topic("t", 1)
    clock = ManualClock()
    connections = _connections(cluster, clock)
    dead = cluster.nodes[1].address

    def call(connection: Connection, timeout_ms: int) -> None:
        if connection.address == dead:
            raise BrokerUnavailableError("unreachable")

    with pytest.raises(BrokerUnavailableError):
        connections.run_on_every_broker(call, what="test", timeout_ms=2_000)
    assert sum(clock.slept) == 2_000


def _group_cluster() -> tuple[InMemoryCluster, ManualClock, ClusterConnections]:
    """Topic ``t``: partition p led by broker p, 10 * (p + 1) records; group ``g``
    coordinated by broker 0 with 4 committed on every partition."""
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 3)
    for p in range(3):
        cluster.append(TopicPartition("t", p), 10 * (p + 1))
    clock = ManualClock()
    connections = _connections(cluster, clock)
    alter_group_offsets(connections, "g", dict.fromkeys(TPS, 4), 5_000)
    return cluster, clock, connections


TPS = [TopicPartition("t", p) for p in range(3)]


def test_lag_comes_from_each_leader_not_from_the_coordinator() -> None:
    cluster, _, connections = _group_cluster()
    # The coordinator (broker 0) alone would say log end 0 for partitions 1 and 2.
    assert [
        p.log_end_offset
        for p in cluster.connect(cluster.nodes[0].address)
        .describe_group("g", timeout_ms=None)
        .partitions
    ] == [10, 0, 0]
    described = describe_group(connections, "g", None)
    assert [(p.committed_offset, p.log_end_offset, p.lag) for p in described.partitions] == [
        (4, 10, 6),
        (4, 20, 16),
        (4, 30, 26),
    ]
    assert [cluster.calls_to(b, "list_offsets") for b in range(3)] == [1, 1, 1]


def test_group_calls_follow_a_coordinator_that_moved() -> None:
    cluster, clock, connections = _group_cluster()
    assert list_group_offsets(connections, "g", None, 5_000) == dict.fromkeys(TPS, 4)
    cluster.set_coordinator("g", 2)  # the client still remembers broker 0
    assert reset_group_offsets(connections, "g", "t", ("latest", 0), 5_000) == {
        TPS[0]: 10,
        TPS[1]: 20,
        TPS[2]: 30,
    }
    assert cluster.committed("g") == {TPS[0]: 10, TPS[1]: 20, TPS[2]: 30}
    assert clock.slept == [100]  # one NOT_COORDINATOR, then FindCoordinator again
    assert cluster.calls_to(2, "commit_offsets") == 1
    cluster.set_coordinator("g", 1)
    assert {p.lag for p in describe_group(connections, "g", None).partitions} == {0}
    assert [g.group_id for g in list_groups(connections, None)] == ["g"]
    cluster.set_coordinator("g", 0)
    assert delete_offsets(connections, "g", [TPS[0]], None) == {TPS[0]: None}
    assert cluster.committed("g") == {TPS[1]: 20, TPS[2]: 30}
    assert cluster.calls_to(0, "delete_offsets") == 1
    delete_group(connections, "g", None)
    assert cluster.committed("g") == {}


def test_resets_resolve_targets_at_the_leaders_and_leave_unknown_partitions_out() -> None:
    cluster, _, connections = _group_cluster()
    cluster.move_leader(TPS[2], 0)  # the coordinator leads it now; the answer must not care
    assert reset_group_offsets(connections, "g", None, ("offset", 15), 5_000) == {
        TPS[0]: 10,  # clamped to the log end
        TPS[1]: 15,
        TPS[2]: 15,
    }
    with pytest.raises(UnknownTopicOrPartitionError):
        reset_group_offsets(
            connections, "g", [TPS[0], TopicPartition("t", 7)], ("earliest", 0), 5_000
        )
    assert cluster.committed("g")[TPS[0]] == 0  # the known partition was moved
    with pytest.raises(UnknownTopicOrPartitionError):
        reset_group_offsets(connections, "g", "nope", ("earliest", 0), 5_000)


def test_list_groups_merges_the_groups_of_every_coordinator() -> None:
    cluster, _, connections = _group_cluster()
    for broker_id, group_id in ((1, "h"), (2, "i")):
        cluster.set_coordinator(group_id, broker_id)
        alter_group_offsets(connections, group_id, {TPS[0]: 1}, 5_000)
    assert [(g.group_id, g.state) for g in list_groups(connections, None)] == [
        ("g", "Empty"),
        ("h", "Empty"),
        ("i", "Empty"),
    ]
    assert [cluster.calls_to(b, "list_groups") for b in range(3)] == [1, 1, 1]


def test_the_admin_client_sets_quotas_on_every_broker_and_follows_coordinators() -> None:
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 3)
    for p in range(3):
        cluster.append(TopicPartition("t", p), 10)
    with AdminClient(
        cluster.nodes[1].address, connection_factory=cluster.connect, request_timeout_ms=5_000
    ) as admin:
        admin.alter_client_quotas("etl", {"producer_byte_rate": 1e6})
        etl = QuotaEntity(None, "etl")
        assert cluster.quotas == {b: {etl: {"producer_byte_rate": 1e6}} for b in range(3)}
        assert admin.describe_client_quotas() == {"etl": {"producer_byte_rate": 1e6}}
        admin.alter_group_offsets("g", dict.fromkeys(TPS, 3))
        cluster.set_coordinator("g", 2)
        assert [p.lag for p in admin.describe_group("g").partitions] == [7, 7, 7]
        assert admin.reset_group_offsets("g", "t", to_earliest=True) == dict.fromkeys(TPS, 0)
        assert [g.group_id for g in admin.list_groups()] == ["g"]
        assert [t.name for t in admin.list_topics()] == ["t"]
        admin.delete_group("g")
        assert cluster.committed("g") == {}


def test_a_partition_whose_leader_died_shows_lag_minus_one_at_once() -> None:
    cluster, clock, connections = _group_cluster()
    connections.metadata()  # still shows broker 2 leading t-2
    cluster.kill(2)
    described = describe_group(connections, "g", 5_000)
    assert [(p.log_end_offset, p.lag) for p in described.partitions] == [
        (10, 6),
        (20, 16),
        (-1, -1),
    ]
    assert clock.slept == []  # no waiting for it: a view, asked again at will


def test_a_leader_that_does_not_know_a_new_topic_yet_is_asked_again() -> None:
    """CI: a topic just created, described at once: a broker knew it, but the leader of
    some of its partitions had not applied it yet and answered UNKNOWN_TOPIC_OR_PARTITION,
    which failed the whole describe. That leader's view is behind: ask it again."""
    cluster = InMemoryCluster(3)
    cluster.add_topic("t", 3, leaders=[0, 1, 2])
    cluster.fail_next(
        "describe_topic", UnknownTopicOrPartitionError("unknown topic 't'"), broker_id=1
    )
    with AdminClient(
        cluster.nodes[0].address, connection_factory=cluster.connect, request_timeout_ms=5_000
    ) as admin:
        described = admin.describe_topic("t")
    assert [p.leader for p in described.partitions] == [0, 1, 2]
    assert cluster.calls_to(1, "describe_topic") == 2  # refused once, then answered
