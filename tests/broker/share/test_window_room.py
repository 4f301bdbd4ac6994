"""A full in-flight window that gains room wakes the fetches waiting on it (issue #32's
acknowledgement overhead): an acknowledgement that moves the share-partition start
offset says so (``SharePartitionManager.begin_acknowledge``), and the broker's share
operations then move what a parked ShareFetch watches (``ShareOps._marks``: the
purgatory's probe), as a RELEASE does. Before, a member whose fetch found the window
full slept out its whole wait although the window was free a moment later (Kafka
completes its delayed share fetches on acknowledgements too). An acknowledgement that
leaves the start where it was (records after the oldest in-flight ones) moves nothing.
Real broker in process, real log; no timing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tidelog.broker.core.share_ops import ShareAckRange, ShareFetched, ShareFetchSpec
from tidelog.broker.share.partition import ACCEPT, Acknowledgement
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Producer
from tidelog.storage.types import TopicPartition

G, T = "window-room", "jobs"
WINDOW = 100  # group.share.partition.max.record.locks, Kafka's smallest


@pytest.fixture
def broker() -> Iterator[InProcessBroker]:
    settings = {"group.share.partition.max.record.locks": WINDOW}
    with InProcessBroker(settings=settings) as running:
        with AdminClient(running.address) as admin:
            admin.create_topic(T, 1)
        yield running


def _acquired(fetched: list[ShareFetched]) -> list[tuple[int, int]]:
    return [(r.first_offset, r.last_offset) for f in fetched for r in f.acquired]


def test_an_acknowledgement_moving_the_start_moves_what_waiting_fetches_watch(
    broker: InProcessBroker,
) -> None:
    shares = broker.server.core.shares
    assert shares is not None
    tp = TopicPartition(T, 0)

    def fetch(member: str, acks: tuple[ShareAckRange, ...] = ()) -> list[tuple[int, int]]:
        fetched, acknowledged = shares.fetch(
            ShareFetchSpec(G, member, (tp,), acks, max_records=WINDOW // 2)
        )
        assert all(not a.error_code for a in acknowledged)
        return _acquired(fetched)

    assert fetch("a") == []  # the share partition starts at the (empty) log's end
    with Producer(broker.address) as producer:
        for i in range(2 * WINDOW):
            producer.send(T, b"%d" % i, partition=0)
        producer.flush()
    first, second = fetch("a"), fetch("b")
    assert (first, second) == ([(0, 49)], [(50, 99)])
    assert fetch("c") == []  # the window is full: such a fetch waits (max_wait_ms > 0)

    watched = shares._marks([tp])
    shares.acknowledge(G, "b", [ShareAckRange(T, 0, 50, 99, ACCEPT)])
    assert shares._marks([tp]) == watched  # not the oldest: no room, nothing to wake
    assert fetch("c") == []

    shares.acknowledge(G, "a", [ShareAckRange(T, 0, 0, 49, ACCEPT)])
    assert shares._marks([tp]) != watched  # the start moved past 99: a waiting fetch looks
    assert fetch("c") == [(100, 149)]


def test_begin_acknowledge_says_whether_the_start_moved(broker: InProcessBroker) -> None:
    shares = broker.server.core.shares
    assert shares is not None
    manager = shares.partitions
    manager.acquire(G, T, 0, "a", 1)  # first use: starts at the log's end
    with Producer(broker.address) as producer:
        for i in range(4):
            producer.send(T, b"%d" % i, partition=0)
        producer.flush()
    assert [(r.first_offset, r.last_offset) for r in manager.acquire(G, T, 0, "a", 4)] == [(0, 3)]
    wait, moved = manager.begin_acknowledge(G, T, 0, "a", [Acknowledgement(2, 3, ACCEPT)])
    wait()
    assert not moved  # 0 and 1 still in flight
    wait, moved = manager.begin_acknowledge(G, T, 0, "a", [Acknowledgement(0, 1, ACCEPT)])
    wait()
    assert moved
