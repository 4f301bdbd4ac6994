"""Issue #33, step by step: what a broker cut off from ZooKeeper answers, and when.

The placement, the controller and the node's session thread against fakes (no
ZooKeeper, no sockets); the end-to-end case, brokers in network namespaces, is
``tests/faults/test_cut_off_leader.py``.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, cast

import pytest

from tidelog.broker.cluster.controller import Controller, ControllerSettings
from tidelog.broker.cluster.metadata import ClusterMetadata, MetadataWatcher, TopicMetadata
from tidelog.broker.cluster.node import ClusterNode, ClusterPlacement
from tidelog.broker.cluster.session import SessionFence, step_down_delay_ms
from tidelog.broker.cluster.store import ClusterStore
from tidelog.broker.cluster.store_batch import Roots
from tidelog.broker.cluster.znodes import BrokerRegistration, PartitionState, TopicAssignment
from tidelog.broker.config import BrokerConfig
from tidelog.storage.clock import SystemClock
from tidelog.storage.errors import NotControllerError, NotLeaderOrFollowerError

ME, OTHER = 1, 2


def view() -> ClusterMetadata:
    """Broker 1 leads t-0, broker 2 leads t-1; broker 1 is the controller."""
    assignment = TopicAssignment("t", "id-t", {0: (1, 2, 3), 1: (2, 3, 1)})
    states = {0: PartitionState(ME, 4, (1, 2, 3), 1), 1: PartitionState(OTHER, 7, (2, 3, 1), 1)}
    brokers = {b: BrokerRegistration(b, f"10.0.0.{b}", 7410) for b in (1, 2, 3)}
    return ClusterMetadata(brokers, ME, {"t": TopicMetadata(assignment, states, {})})


class FakeWatcher:
    def __init__(self) -> None:
        self.snapshot = view()
        self.refreshes = 0

    def refresh_and_wait(self, timeout_ms: int) -> bool:
        self.refreshes += 1
        return True


def placement(fence: SessionFence) -> ClusterPlacement:
    return ClusterPlacement(ME, "cluster", cast(MetadataWatcher, FakeWatcher()), None, fence)


def test_the_step_down_comes_a_third_of_the_session_timeout_after_suspended() -> None:
    assert step_down_delay_ms(6_000) == 2_000
    assert step_down_delay_ms(18_000) == 6_000
    assert step_down_delay_ms(2) == 1
    with pytest.raises(ValueError, match="at least 1 ms"):
        step_down_delay_ms(0)


def test_a_cut_off_broker_names_no_leader_it_cannot_vouch_for() -> None:
    fence = SessionFence()
    seen = placement(fence)
    assert seen.partition("t", 0).leader == ME
    assert seen.cluster().controller_id == ME
    assert not seen.cluster().cut_off
    seen.check_leader("t", 0)

    assert fence.cut("cut off")
    own, others = seen.partition("t", 0), seen.partition("t", 1)
    assert (own.leader, own.leader_epoch) == (-1, 4)  # LEADER_NOT_AVAILABLE
    assert (others.leader, others.leader_epoch) == (OTHER, 7)  # as last seen
    cluster = seen.cluster()
    assert cluster.controller_id == -1
    assert cluster.cut_off
    assert {b.broker_id for b in cluster.brokers} == {1, 2, 3}  # where else to ask
    with pytest.raises(NotLeaderOrFollowerError, match="cut off"):
        seen.check_leader("t", 0)
    with pytest.raises(NotLeaderOrFollowerError, match="broker 2 does"):
        seen.check_leader("t", 1)

    assert fence.restore()
    assert seen.partition("t", 0).leader == ME
    seen.check_leader("t", 0)


def test_a_cut_off_controller_refuses_admin_calls_at_once() -> None:
    fence = SessionFence()
    store = cast(ClusterStore, object())  # never touched: refused before the event thread
    controller = Controller(store, ControllerSettings(ME), SystemClock(), fence=fence)
    controller._lease = cast(Any, object())  # holding the lease, as after an election
    assert controller.is_controller
    fence.cut("cut off from ZooKeeper")
    assert not controller.is_controller
    started = time.monotonic()
    with pytest.raises(NotControllerError, match="cut off"):
        controller.create_topic("t", 1, 1, {})
    assert time.monotonic() - started < 1.0


class FakeController:
    def __init__(self) -> None:
        self.lost = 0
        self.restored = 0

    def session_lost(self) -> None:
        self.lost += 1

    def session_restored(self) -> None:
        self.restored += 1


class FakeReplicas:
    def __init__(self) -> None:
        self.resigned: list[str] = []

    def resign_all(self, reason: str) -> None:
        self.resigned.append(reason)


def session_node(session_timeout_ms: int) -> tuple[ClusterNode, SessionFence, FakeReplicas]:
    config = BrokerConfig(
        broker_id=ME,
        zookeeper_connect="127.0.0.1:1/tidelog",
        zookeeper_session_timeout_ms=session_timeout_ms,
    )
    fence = SessionFence()
    watcher = FakeWatcher()
    node = ClusterNode(
        config,
        cast(ClusterStore, object()),
        cast(MetadataWatcher, watcher),
        cast(Controller, FakeController()),
        placement(fence),
        fence,
    )
    replicas = FakeReplicas()
    node.replicas = cast(Any, replicas)
    node._session_thread.start()
    return node, fence, replicas


def wait_until(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)


def test_a_blip_shorter_than_the_delay_costs_nothing() -> None:
    node, fence, replicas = session_node(session_timeout_ms=3_000)  # delay 1 s
    try:
        node._on_session_state("SUSPENDED")
        time.sleep(0.2)
        node._on_session_state("CONNECTED")
        time.sleep(1.2)  # past when a step-down would have come
        assert not fence.cut_off
        assert replicas.resigned == []
    finally:
        node._on_session_state("stop")


def test_suspended_past_the_delay_steps_down_and_vouches_again_once_back() -> None:
    node, fence, replicas = session_node(session_timeout_ms=600)  # delay 200 ms
    controller = cast(FakeController, node._controller)
    try:
        suspended_at = time.monotonic()
        node._on_session_state("SUSPENDED")
        wait_until(lambda: fence.cut_off)
        assert time.monotonic() - suspended_at >= 0.19
        assert len(replicas.resigned) == 1
        node._on_session_state("CONNECTED")  # the same session: it survived
        wait_until(lambda: not fence.cut_off)
        assert cast(FakeWatcher, node._watcher).refreshes == 1
        assert controller.restored == 1
        assert controller.lost == 0
    finally:
        node._on_session_state("stop")


def test_a_lost_session_steps_down_at_once() -> None:
    node, fence, replicas = session_node(session_timeout_ms=60_000)
    controller = cast(FakeController, node._controller)
    try:
        node._on_session_state("LOST")
        wait_until(lambda: fence.cut_off)
        assert controller.lost == 1
        assert replicas.resigned == ["ZooKeeper session lost"]
    finally:
        node._on_session_state("stop")


class FakeStore:
    """What ``MetadataWatcher`` reads, counting the reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.gate = threading.Event()
        self.gate.set()

    def read_roots(self) -> Roots:
        self.gate.wait(5)
        self.reads += 1
        return Roots({1: BrokerRegistration(1, "h", 1)}, {1: 1}, [], 1)

    def watch_children(self, path: str, callback: Any) -> None:
        pass

    def watch_data(self, path: str, callback: Any) -> None:
        pass


def test_refresh_and_wait_waits_for_a_read_that_started_after_the_call() -> None:
    store = FakeStore()
    applied: queue.Queue[ClusterMetadata] = queue.Queue()
    watcher = MetadataWatcher(cast(ClusterStore, store), applied.put)
    watcher.start()
    try:
        assert watcher.refresh_and_wait(5_000)
        assert store.reads >= 1
        applied.get(timeout=1)  # forced: handed to the listener though nothing changed
        # A read under way when the call comes does not count: it may predate the call.
        store.gate.clear()
        watcher.refresh()
        time.sleep(0.1)
        reads_before = store.reads
        waiter = threading.Thread(target=lambda: watcher.refresh_and_wait(5_000))
        waiter.start()
        time.sleep(0.1)
        store.gate.set()
        waiter.join(5)
        assert not waiter.is_alive()
        assert store.reads >= reads_before + 2
    finally:
        watcher.stop()
