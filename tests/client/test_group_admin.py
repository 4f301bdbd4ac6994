"""The admin's group logic without sockets: lag and reset targets (pure), and calls that
every live broker must answer (``ClusterConnections.run_on_every_broker``) against the
in-memory cluster."""

from __future__ import annotations

import pytest

from client.connection import Connection
from client.group_admin import partition_lag, reset_offset
from client.testing import InMemoryCluster
from storage.errors import BrokerUnavailableError, UnknownTopicOrPartitionError
from tests.client.test_routing import ManualClock, _connections


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
