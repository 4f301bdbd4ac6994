"""``ClusterStore`` against a real ZooKeeper: registration, election, fencing, CAS."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

from tidelog.broker.cluster.isr_writes import write_isr_batch
from tidelog.broker.cluster.store import (
    ClusterStore,
    ControllerMovedError,
    StaleStateError,
    StoreError,
    split_connect_string,
)
from tidelog.broker.cluster.testing import ZooKeeperServer
from tidelog.broker.cluster.znodes import BrokerRegistration, PartitionState, TopicAssignment

_chroots = itertools.count()


@pytest.fixture
def connect(zookeeper: ZooKeeperServer) -> str:
    """A fresh chroot per test: each test sees an empty cluster."""
    return f"{zookeeper.connect_string}/test-{next(_chroots)}"


@pytest.fixture
def stores(connect: str) -> Iterator[list[ClusterStore]]:
    opened: list[ClusterStore] = []
    yield opened
    for store in opened:
        store.close()


def _open(
    connect: str, stores: list[ClusterStore], session_timeout_ms: int = 4_000
) -> ClusterStore:
    store = ClusterStore.connect(connect, session_timeout_ms=session_timeout_ms)
    stores.append(store)
    return store


def test_connect_strings() -> None:
    assert split_connect_string("a:1,b:2/tidelog/x") == ("a:1,b:2", "/tidelog/x")
    assert split_connect_string("a:1") == ("a:1", "")
    for bad in ("/x", "a:1/", ""):
        with pytest.raises(ValueError, match=r"zookeeper\.connect"):
            split_connect_string(bad)


def test_nothing_listens_is_a_clear_error() -> None:
    with pytest.raises(StoreError, match=r"zookeeper\.connect 127\.0\.0\.1:1"):
        ClusterStore.connect("127.0.0.1:1", connect_timeout_ms=500)


def test_brokers_register_and_vanish_with_their_session(
    connect: str, stores: list[ClusterStore]
) -> None:
    one, two = _open(connect, stores), _open(connect, stores)
    epoch_one = one.register_broker(BrokerRegistration(1, "127.0.0.1", 7001), timeout_ms=1_000)
    epoch_two = two.register_broker(BrokerRegistration(2, "127.0.0.1", 7002), timeout_ms=1_000)
    assert epoch_two > epoch_one  # the creation zxid: a later registration is larger
    assert one.register_broker(BrokerRegistration(1, "127.0.0.1", 7001), timeout_ms=0) == epoch_one
    assert [b.port for b in two.live_brokers().values()] == [7001, 7002]
    one.close()
    stores.remove(one)
    assert list(two.live_brokers()) == [2]
    assert two.cluster_id() == two.cluster_id()  # created once, then read


def test_a_previous_life_is_waited_out_not_deleted(
    connect: str, stores: list[ClusterStore]
) -> None:
    old = _open(connect, stores)
    old.register_broker(BrokerRegistration(1, "127.0.0.1", 7001), timeout_ms=1_000)
    new = _open(connect, stores)
    with pytest.raises(StoreError, match="registered by another session"):
        new.register_broker(BrokerRegistration(1, "127.0.0.1", 7011), timeout_ms=500)
    assert new.live_brokers()[1].port == 7001  # untouched
    old.close()  # the old life ends (a session expiry does the same, later)
    stores.remove(old)
    started = time.monotonic()
    new.register_broker(BrokerRegistration(1, "127.0.0.1", 7011), timeout_ms=5_000)
    assert time.monotonic() - started < 5
    assert new.live_brokers()[1].port == 7011


def test_one_controller_at_a_time_and_a_deposed_one_cannot_write(
    connect: str, stores: list[ClusterStore]
) -> None:
    one, two = _open(connect, stores), _open(connect, stores)
    lease = one.try_become_controller(1, now_ms=0)
    assert lease is not None
    assert lease.epoch == 1
    assert two.try_become_controller(2, now_ms=0) is None
    assert two.controller_id() == 1
    assignment = TopicAssignment("t", "id-t", {0: (1, 2), 1: (2, 1)})
    states = {p: PartitionState(r[0], 0, r, lease.epoch) for p, r in assignment.replicas.items()}
    one.create_topic(lease, assignment, {"retention.ms": "1000"}, states)
    with pytest.raises(StaleStateError):
        one.create_topic(lease, assignment, {}, states)  # already there

    # Broker 1's controller node goes (its session ended, or it resigned) and 2 wins.
    one.resign(lease)
    second = two.try_become_controller(2, now_ms=0)
    assert second is not None
    assert second.epoch == 2
    state, version = one.read_partition_state("t", 0) or (None, -1)
    assert state == states[0]
    with pytest.raises(ControllerMovedError):
        one.set_partition_state(lease, "t", 0, PartitionState(2, 1, (2,), lease.epoch), version)
    assert one.read_partition_state("t", 0) == (states[0], version)  # nothing written
    new_version = two.set_partition_state(
        second, "t", 0, PartitionState(2, 1, (2,), second.epoch), version
    )
    assert two.read_partition_state("t", 0) == (PartitionState(2, 1, (2,), 2), new_version)
    assert two.read_topic("t") == assignment
    assert two.read_topic_config("t") == {"retention.ms": "1000"}
    assert two.topics() == ["t"]


def test_isr_writes_are_compare_and_set(connect: str, stores: list[ClusterStore]) -> None:
    store = _open(connect, stores)
    lease = store.try_become_controller(1, now_ms=0)
    assert lease is not None
    assignment = TopicAssignment("t", "id", {0: (1, 2, 3)})
    store.create_topic(lease, assignment, {}, {0: PartitionState(1, 0, (1, 2, 3), 1)})
    _, version = store.read_partition_state("t", 0) or (None, -1)
    shrunk = PartitionState(1, 0, (1, 2), 1)
    new_version = store.update_isr("t", 0, shrunk, version)
    with pytest.raises(StaleStateError):
        store.update_isr("t", 0, PartitionState(1, 0, (1,), 1), version)  # stale version
    assert store.read_partition_state("t", 0) == (shrunk, new_version)
    store.delete_topic(lease, "t")
    assert store.read_topic("t") is None
    assert store.topics() == []


def test_watches_fire_now_and_after_each_change(connect: str, stores: list[ClusterStore]) -> None:
    store, other = _open(connect, stores), _open(connect, stores)
    seen: list[list[str]] = []
    store.watch_children("/brokers/ids", lambda children: seen.append(sorted(children)))
    other.register_broker(BrokerRegistration(5, "127.0.0.1", 7005), timeout_ms=1_000)
    deadline = time.monotonic() + 5
    while seen[-1:] != [["5"]] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen[0] == []
    assert seen[-1] == ["5"]


def test_elections_of_many_partitions_are_written_together_each_fenced_and_compared(
    connect: str, stores: list[ClusterStore]
) -> None:
    """Issue #34: a broker failure's elections go out as one pipelined batch; a partition
    written meanwhile fails alone, and a deposed controller writes none of them."""
    one, two = _open(connect, stores), _open(connect, stores)
    lease = one.try_become_controller(1, now_ms=0)
    assert lease is not None
    assignment = TopicAssignment("t", "id-t", dict.fromkeys(range(50), (1, 2, 3)))
    first = {p: PartitionState(1, 0, (1, 2, 3), lease.epoch) for p in assignment.replicas}
    one.create_topic(lease, assignment, {}, first)
    read = one.read_partition_states(("t", p) for p in range(50))
    versions = {key: found[1] for key, found in read.items() if found is not None}
    one.update_isr("t", 7, PartitionState(1, 0, (1, 3), lease.epoch), versions[("t", 7)])
    elected = PartitionState(2, 1, (2, 3), lease.epoch)
    outcome = one.set_partition_states(
        lease, [("t", p, elected, versions[("t", p)]) for p in range(50)]
    )
    assert isinstance(outcome.pop(("t", 7)), StaleStateError)
    assert set(outcome.values()) == {None}
    assert len(outcome) == 49
    after = one.read_partition_states(("t", p) for p in range(50))
    assert all(after[("t", p)][0] == elected for p in range(50) if p != 7)  # type: ignore[index]
    assert after[("t", 7)][0] == PartitionState(1, 0, (1, 3), lease.epoch)  # type: ignore[index]

    one.resign(lease)
    assert two.try_become_controller(2, now_ms=0) is not None
    stale = {key: found[1] for key, found in after.items() if found is not None}
    with pytest.raises(ControllerMovedError):
        one.set_partition_states(
            lease,
            [("t", p, PartitionState(3, 2, (3,), lease.epoch), v) for (_, p), v in stale.items()],
        )
    assert one.read_partition_states(stale) == after  # nothing written


def test_isr_changes_of_many_partitions_are_compared_each(
    connect: str, stores: list[ClusterStore]
) -> None:
    store = _open(connect, stores)
    lease = store.try_become_controller(1, now_ms=0)
    assert lease is not None
    assignment = TopicAssignment("t", "id", dict.fromkeys(range(20), (1, 2, 3)))
    store.create_topic(
        lease, assignment, {}, {p: PartitionState(1, 0, (1, 2, 3), 1) for p in range(20)}
    )
    shrunk = PartitionState(1, 0, (1, 2), 1)
    writes = [("t", p, shrunk, 0) for p in range(20)] + [("t", 99, shrunk, 0)]
    store.update_isr("t", 3, PartitionState(1, 0, (1, 3), 1), 0)
    outcome = store.update_isr_many(writes)
    assert isinstance(outcome.pop(("t", 3)), StaleStateError)
    assert isinstance(outcome.pop(("t", 99)), StaleStateError)  # no such partition
    assert set(outcome.values()) == {1}  # the version each written state got
    assert store.read_partition_state("t", 0) == (shrunk, 1)
    assert store.read_partition_state("t", 3) == (PartitionState(1, 0, (1, 3), 1), 1)


def test_a_batch_of_isr_proposals_writes_only_those_whose_leadership_holds(
    connect: str, stores: list[ClusterStore]
) -> None:
    store = _open(connect, stores)
    lease = store.try_become_controller(1, now_ms=0)
    assert lease is not None
    assignment = TopicAssignment("t", "id", dict.fromkeys(range(4), (1, 2, 3)))
    states = {p: PartitionState(1, 4, (1, 2, 3), 1) for p in range(3)}
    states[3] = PartitionState(1, 4, (1, 2), 1)  # the controller dropped 3 at epoch 4
    store.create_topic(lease, assignment, {}, states)
    written = write_isr_batch(
        store,
        lambda _t, _p: 1,
        [
            ("t", 0, 1, 4, (1, 2), (1, 2, 3)),  # holds
            ("t", 1, 1, 3, (1, 2), (1, 2, 3)),  # an older epoch: the leader was replaced since
            ("t", 2, 2, 4, (2,), (1, 2, 3)),  # not the leader
            ("gone", 0, 1, 4, (1,), (1,)),  # no such partition
            # Made from an ISR the znode no longer holds (the leader has not seen the
            # controller's shrink yet): it would put the dead 3 back.
            ("t", 3, 1, 4, (1, 3), (1, 2, 3)),
        ],
    )
    assert written == {("t", 0): 1}  # the version written
    state, _ = store.read_partition_state("t", 0) or (None, -1)
    assert state is not None
    assert state.isr == (1, 2)
    assert store.read_partition_state("t", 1) == (PartitionState(1, 4, (1, 2, 3), 1), 0)
    assert store.read_partition_state("t", 3) == (states[3], 0)
