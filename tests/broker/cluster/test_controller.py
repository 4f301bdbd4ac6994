"""The controller against a real ZooKeeper: brokers are ``ClusterStore`` sessions here.

Each "broker" is a registered session with a ``Controller``; closing a session is a broker
dying (its ephemeral znodes go at once, as after a session expiry).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tidelog.broker.cluster.controller import Controller, ControllerSettings
from tidelog.broker.cluster.election import Elected
from tidelog.broker.cluster.election_writes import wait_until_seen
from tidelog.broker.cluster.forwarding import run_call
from tidelog.broker.cluster.metadata import ClusterMetadata, MetadataWatcher
from tidelog.broker.cluster.store import ClusterStore, StaleStateError
from tidelog.broker.cluster.testing import ZooKeeperServer
from tidelog.broker.cluster.topic_batches import TopicBatches
from tidelog.broker.cluster.znodes import (
    NO_LEADER,
    BrokerRegistration,
    PartitionState,
    TopicAssignment,
)
from tidelog.broker.core.placement import NewTopic
from tidelog.storage.clock import SystemClock
from tidelog.storage.errors import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    KafkaTimeoutError,
    NotControllerError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

_chroots = itertools.count()


@dataclass
class FakeBroker:
    broker_id: int
    store: ClusterStore
    controller: Controller
    connect: str

    dead: bool = False
    watcher: MetadataWatcher | None = None
    views: list[ClusterMetadata] | None = None  # every view its watcher published

    def die(self) -> None:
        if not self.dead:
            self.dead = True
            self.controller.stop()
            if self.watcher is not None:
                self.watcher.stop()
            self.store.close()


@pytest.fixture
def cluster(zookeeper: ZooKeeperServer) -> Iterator[Callable[..., FakeBroker]]:
    connect = f"{zookeeper.connect_string}/controller-{next(_chroots)}"
    started: list[FakeBroker] = []

    def start(broker_id: int, rebalance_ms: int = 0, watch: bool = False) -> FakeBroker:
        """``watch``: with a metadata watcher recording its views, as a broker's (the
        controller then waits on it, ``view_wait``)."""
        store = ClusterStore.connect(connect, session_timeout_ms=4_000)
        store.register_broker(
            BrokerRegistration(broker_id, "127.0.0.1", 7000 + broker_id), timeout_ms=5_000
        )
        views: list[ClusterMetadata] = []
        watcher = MetadataWatcher(store, views.append) if watch else None
        controller = Controller(
            store,
            ControllerSettings(
                broker_id, admin_timeout_ms=10_000, leader_rebalance_interval_ms=rebalance_ms
            ),
            SystemClock(),
            rng=random.Random(1),
            view_wait=None if watcher is None else watcher.wait_for,
        )
        if watcher is not None:
            watcher.start()
        controller.start()
        broker = FakeBroker(broker_id, store, controller, connect, watcher=watcher, views=views)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.die()


def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def controller_of(brokers: list[FakeBroker]) -> FakeBroker:
    eventually(lambda: sum(b.controller.is_controller for b in brokers) == 1)
    return next(b for b in brokers if b.controller.is_controller)


def state(broker: FakeBroker, topic: str, partition: int) -> PartitionState:
    found = broker.store.read_partition_state(topic, partition)
    assert found is not None
    return found[0]


def test_one_controller_spreads_leaders_and_refuses_what_it_cannot(
    cluster: Callable[[int], FakeBroker],
) -> None:
    brokers = [cluster(i) for i in (1, 2, 3)]
    controller = controller_of(brokers)
    other = next(b for b in brokers if b is not controller)
    with pytest.raises(NotControllerError):
        other.controller.create_topic("t", 3, 1, {})
    assignment = controller.controller.create_topic("t", 6, 1, {"retention.ms": "60000"})
    leaders = [state(controller, "t", p).leader for p in range(6)]
    assert sorted(set(leaders)) == [1, 2, 3]
    assert [r[0] for r in assignment.replicas.values()] == leaders
    with pytest.raises(TopicAlreadyExistsError):
        controller.controller.create_topic("t", 1, 1, {})
    with pytest.raises(InvalidReplicationFactorError):
        controller.controller.create_topic("big", 1, 4, {})
    grown = controller.controller.create_partitions("t", 9)
    assert grown.partition_count == 9
    with pytest.raises(InvalidPartitionsError):
        controller.controller.create_partitions("t", 9)
    assert state(controller, "t", 8).leader in (1, 2, 3)


def test_a_dead_brokers_partitions_go_offline_and_come_back(
    cluster: Callable[[int], FakeBroker],
) -> None:
    brokers = [cluster(i) for i in (1, 2, 3)]
    controller = controller_of(brokers)
    controller.controller.create_topic("t", 3, 1, {})
    victim = next(b for b in brokers if b is not controller)
    led = [p for p in range(3) if state(controller, "t", p).leader == victim.broker_id]
    assert led
    epochs = {p: state(controller, "t", p).leader_epoch for p in led}
    victim.die()
    eventually(lambda: all(state(controller, "t", p).leader == NO_LEADER for p in led))
    back = cluster(victim.broker_id)
    eventually(lambda: all(state(back, "t", p).leader == victim.broker_id for p in led))
    assert all(state(back, "t", p).leader_epoch == epochs[p] + 2 for p in led)


def test_controller_failover_and_replicated_elections(
    cluster: Callable[[int], FakeBroker],
) -> None:
    brokers = [cluster(i) for i in (1, 2, 3)]
    first = controller_of(brokers)
    first.controller.create_topic("r", 3, 3, {})
    first_epoch = first.controller.epoch
    first.die()
    survivors = [b for b in brokers if b is not first]
    second = controller_of(survivors)
    assert second.controller.epoch == first_epoch + 1
    for partition in range(3):
        eventually(
            lambda p=partition: state(second, "r", p).leader in (b.broker_id for b in survivors)
        )
        assert first.broker_id not in state(second, "r", partition).isr
    assert second.controller.elect_preferred_leaders() == 0  # preferred ones may be dead


def test_a_dead_brokers_isr_shrinks_wait_until_its_elections_are_seen(
    cluster: Callable[..., FakeBroker],
) -> None:
    """The partitions a dead broker led get new leaders (a new epoch each); those it
    followed lose it from the ISR at the same epoch (KAFKA-15021), written only once the
    controller's own view holds every new leader (``election_writes.wait_until_seen``):
    some view there shows the elections without any shrink."""
    brokers = [cluster(i, watch=True) for i in (1, 2, 3)]
    controller = controller_of(brokers)
    controller.controller.create_topic("w", 6, 3, {})
    victim = next(b for b in brokers if b is not controller)
    before = {p: state(controller, "w", p) for p in range(6)}
    led = [p for p in range(6) if before[p].leader == victim.broker_id]
    followed = [p for p in range(6) if p not in led]
    assert led
    assert followed
    victim.die()
    eventually(lambda: all(victim.broker_id not in state(controller, "w", p).isr for p in range(6)))
    after = {p: state(controller, "w", p) for p in range(6)}
    assert all(after[p].leader_epoch == before[p].leader_epoch + 1 for p in led)
    assert all(after[p].leader != victim.broker_id for p in led)
    assert all(after[p].leader == before[p].leader for p in followed)
    assert all(after[p].leader_epoch == before[p].leader_epoch for p in followed)

    def elected(view: ClusterMetadata) -> bool:
        states = view.topics["w"].states
        return all(
            (s := states[p]) is not None and s.leader_epoch > before[p].leader_epoch for p in led
        )

    def shrunk(view: ClusterMetadata) -> bool:
        states = view.topics["w"].states
        return any((s := states[p]) is not None and len(s.isr) < 3 for p in followed)

    views = [v for v in controller.views or [] if "w" in v.topics]
    assert any(elected(v) and not shrunk(v) for v in views)


def test_waiting_for_elections_to_be_seen_is_bounded(
    cluster: Callable[..., FakeBroker],
) -> None:
    """``wait_until_seen`` against a real watcher: True once the view holds the written
    decisions' epochs (a decision not written is not waited for); False after its bound
    when the view never will (calling ``between`` meanwhile)."""
    broker = cluster(1, watch=True)
    controller_of([broker]).controller.create_topic("b", 2, 1, {})
    assert broker.watcher is not None
    assert broker.watcher.wait_for(lambda v: "b" in v.topics, 10_000)
    now = state(broker, "b", 0)
    seen = Elected(now)
    later = Elected(replace(now, leader_epoch=now.leader_epoch + 1))
    calls: list[int] = []
    written: dict[tuple[str, int], Exception | None] = {("b", 0): None, ("b", 1): None}
    assert wait_until_seen(broker.watcher.wait_for, [("b", 0, seen, 0)], written, 5_000)
    not_written: dict[tuple[str, int], Exception | None] = {("b", 1): StaleStateError("moved")}
    assert wait_until_seen(broker.watcher.wait_for, [("b", 1, later, 0)], not_written, 5_000)
    started = time.monotonic()
    assert not wait_until_seen(
        broker.watcher.wait_for, [("b", 0, later, 0)], written, 300, lambda: calls.append(1)
    )
    assert 0.25 < time.monotonic() - started < 5
    assert len(calls) >= 2


def test_controlled_shutdown_moves_leadership_away(cluster: Callable[[int], FakeBroker]) -> None:
    brokers = [cluster(i) for i in (1, 2, 3)]
    controller = controller_of(brokers)
    controller.controller.create_topic("s", 6, 2, {})
    leaving = next(b for b in brokers if b is not controller)
    assert controller.controller.controlled_shutdown(leaving.broker_id) == 0
    # Answered once the leaderships moved; the ISRs it follows shrink right after.
    assert all(state(controller, "s", p).leader != leaving.broker_id for p in range(6))
    eventually(
        lambda: all(leaving.broker_id not in state(controller, "s", p).isr for p in range(6)),
        10.0,
    )
    assert all(state(controller, "s", p).leader != leaving.broker_id for p in range(6))


def test_a_controlled_shutdown_is_answered_once_the_controllers_view_has_the_new_leaders(
    cluster: Callable[..., FakeBroker],
) -> None:
    """As Kafka's controller tells every broker before it answers the stopping one: the
    answer comes once this broker's view (the proxy for the others') shows none of the
    stopping broker's leaderships, so clients are not sent to it after it stops."""
    brokers = [cluster(i, watch=True) for i in (1, 2, 3)]
    controller = controller_of(brokers)
    controller.controller.create_topic("v", 12, 3, {})
    leaving = next(b for b in brokers if b is not controller)
    assert controller.watcher is not None
    assert controller.watcher.wait_for(
        lambda v: (
            "v" in v.topics
            and any(
                s is not None and s.leader == leaving.broker_id
                for s in v.topics["v"].states.values()
            )
        ),
        10_000,
    )
    assert controller.controller.controlled_shutdown(leaving.broker_id) == 0
    view = controller.watcher.snapshot
    assert all(
        s is not None and s.leader != leaving.broker_id for s in view.topics["v"].states.values()
    )


def test_every_broker_sees_leaders_change(cluster: Callable[[int], FakeBroker]) -> None:
    brokers = [cluster(i) for i in (1, 2, 3)]
    controller = controller_of(brokers)
    watcher = MetadataWatcher(brokers[0].store)
    watcher.start()
    try:
        controller.controller.create_topic("m", 3, 2, {"cleanup.policy": "compact"})
        assert watcher.wait_for(lambda m: "m" in m.topics and len(m.brokers) == 3, 10_000)
        seen = watcher.snapshot
        assert seen.controller_id == controller.broker_id
        assert seen.topics["m"].config == {"cleanup.policy": "compact"}
        victim = next(b for b in brokers if b is not controller and b is not brokers[0])
        victim.die()
        assert watcher.wait_for(
            lambda m: (
                victim.broker_id not in m.brokers
                and all(
                    s is not None and victim.broker_id not in s.isr and s.leader != victim.broker_id
                    for s in m.topics["m"].states.values()
                )
            ),
            10_000,
        )
        controller.controller.delete_topic("m")
        assert watcher.wait_for(lambda m: "m" not in m.topics, 10_000)
    finally:
        watcher.stop()


def test_every_broker_sees_a_topic_config_change_and_nothing_else(
    cluster: Callable[[int], FakeBroker],
) -> None:
    """An altered config is a change of its own znode: every broker's view shows it
    without another change to force a re-read (before, none did, and the controller's
    AlterTopicConfig waited 10 s for its own view and answered INTERNAL)."""
    brokers = [cluster(i) for i in (1, 2)]
    controller = controller_of(brokers)
    watcher = MetadataWatcher(brokers[0].store)
    watcher.start()
    try:
        controller.controller.create_topic("c", 2, 2, {"retention.ms": "1000"})
        assert watcher.wait_for(
            lambda m: "c" in m.topics and all(s is not None for s in m.topics["c"].states.values()),
            10_000,
        )
        controller.controller.alter_topic_config("c", {"retention.ms": "2000"})
        assert watcher.wait_for(lambda m: m.topics["c"].config == {"retention.ms": "2000"}, 5_000)
        controller.controller.alter_topic_config("c", {})
        assert watcher.wait_for(lambda m: m.topics["c"].config == {}, 5_000)
    finally:
        watcher.stop()


def test_leadership_goes_back_to_preferred_replicas_by_itself(
    cluster: Callable[..., FakeBroker],
) -> None:
    """auto.leader.rebalance.enable: a preferred replica back in the ISR leads again
    within an interval, without anyone asking."""
    brokers = [cluster(i, rebalance_ms=300) for i in (1, 2, 3)]
    controller = controller_of(brokers)
    controller.controller.create_topic("r", 3, 3, {})
    preferred = {p: state(controller, "r", p).leader for p in range(3)}
    victim = next(b for b in brokers if b is not controller)
    led = [p for p, leader in preferred.items() if leader == victim.broker_id]
    victim.die()
    eventually(lambda: all(state(controller, "r", p).leader != victim.broker_id for p in led))
    back = cluster(victim.broker_id, rebalance_ms=300)
    # As its replica manager would once caught up: the leaders add it back to the ISR.
    for partition in range(3):
        found = back.store.read_partition_state("r", partition)
        assert found is not None
        current, version = found
        isr = tuple(sorted({*current.isr, victim.broker_id}))
        back.store.update_isr(
            "r",
            partition,
            PartitionState(current.leader, current.leader_epoch, isr, current.controller_epoch),
            version,
        )
    eventually(lambda: all(state(back, "r", p).leader == preferred[p] for p in range(3)))


def test_leaderships_granted_before_the_whole_cluster_restarted_are_granted_again(
    cluster: Callable[[int], FakeBroker],
) -> None:
    """Every broker stops at once, so no controller sees anyone die and the states still
    name the old leaders. After the restart no broker may lead on a grant made to its
    previous life: views show no leader until the controller elects again, at a new epoch
    (a broker that led again at its old epoch served a log tail the next election cut)."""
    brokers = [cluster(i) for i in (1, 2, 3)]
    controller = controller_of(brokers)
    controller.controller.create_topic("b", 6, 3, {})
    before = {p: state(controller, "b", p) for p in range(6)}
    assert all(s.leader in (1, 2, 3) for s in before.values())
    for broker in brokers:  # every controller first: nobody reacts to the deaths
        broker.controller.stop()
    for broker in brokers:
        broker.die()

    # The brokers register again, no controller yet: every state predates its leader.
    store = ClusterStore.connect(brokers[0].connect, session_timeout_ms=4_000)
    watcher = MetadataWatcher(store)
    try:
        store.register_broker(BrokerRegistration(1, "127.0.0.1", 7001), timeout_ms=5_000)
        watcher.start()
        assert watcher.wait_for(lambda m: "b" in m.topics and 1 in m.brokers, 10_000)
        shown = watcher.snapshot.topics["b"].states
        for p, old in before.items():
            now = shown[p]
            assert now is not None
            assert now.leader_epoch == old.leader_epoch
            # Broker 1's grants are from its previous life; 2 and 3 are simply not live.
            assert now.leader == (NO_LEADER if old.leader == 1 else old.leader)
    finally:
        watcher.stop()
        store.close()

    back = [cluster(i) for i in (1, 2, 3)]
    second = controller_of(back)
    for p, old in before.items():
        eventually(lambda p=p, old=old: state(second, "b", p).leader_epoch > old.leader_epoch)
        assert state(second, "b", p).leader in (1, 2, 3)


def test_a_batch_creates_and_deletes_many_topics_with_an_answer_for_each(
    cluster: Callable[[int], FakeBroker],
) -> None:
    brokers = [cluster(i) for i in (1, 2, 3)]
    controller = controller_of(brokers)
    controller.controller.create_topic("there", 1, 1, {})
    names = [f"batch-{i}" for i in range(30)]
    specs = [NewTopic(n, 4, 3, {"retention.ms": "60000"}) for n in names]
    specs += [NewTopic("there", 1, 1, {}), NewTopic("big", 1, 4, {})]
    watcher = MetadataWatcher(brokers[0].store)
    watcher.start()
    try:
        answer = controller.controller.create_topics(specs)
        assert isinstance(answer.pop("there"), TopicAlreadyExistsError)
        assert isinstance(answer.pop("big"), InvalidReplicationFactorError)
        assert sorted(answer) == sorted(names)
        for name, assignment in answer.items():
            assert isinstance(assignment, TopicAssignment)
            for partition, replicas in assignment.replicas.items():
                assert sorted(replicas) == [1, 2, 3]
                assert state(controller, name, partition).leader == replicas[0]

        def every_partition_led(view: ClusterMetadata) -> bool:
            return all(
                name in view.topics
                and all(view.leader(name, p) != NO_LEADER for p in range(4))
                and view.topics[name].config == {"retention.ms": "60000"}
                for name in names
            )

        assert watcher.wait_for(every_partition_led, 10_000)

        gone = controller.controller.delete_topics([*names, "nope"])
        assert isinstance(gone.pop("nope"), UnknownTopicOrPartitionError)
        assert gone == dict.fromkeys(names)
        assert controller.store.topics() == ["there"]
        assert watcher.wait_for(lambda view: sorted(view.topics) == ["there"], 10_000)
    finally:
        watcher.stop()


def test_callers_creating_the_same_topic_at_once_get_one_success(
    cluster: Callable[[int], FakeBroker],
) -> None:
    brokers = [cluster(i) for i in (1, 2)]
    controller = controller_of(brokers).controller
    answers: list[dict[str, object]] = []
    lock = threading.Lock()

    def create(own: str) -> None:
        found = controller.create_topics([NewTopic(own, 1, 2, {}), NewTopic("shared", 2, 2, {})])
        with lock:
            answers.append(found)

    threads = [threading.Thread(target=create, args=(f"own-{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(answers) == 8
    shared = [a["shared"] for a in answers]
    assert sum(isinstance(s, TopicAssignment) for s in shared) == 1
    assert sum(isinstance(s, TopicAlreadyExistsError) for s in shared) == 7
    owns = {name for a in answers for name, v in a.items() if isinstance(v, TopicAssignment)}
    assert owns == {"shared", *(f"own-{i}" for i in range(8))}


def test_topics_still_pending_at_the_timeout_answer_request_timed_out_and_stay_created(
    cluster: Callable[[int], FakeBroker],
) -> None:
    """``TopicBatches`` (the receiving broker's half): a view that never catches up (a
    watcher not started) leaves every created topic pending at ``timeout_ms``: each
    answers ``REQUEST_TIMED_OUT`` (Kafka's), the controller's own errors stay, and the
    topics exist all the same."""
    brokers = [cluster(i) for i in (1, 2)]
    controller = controller_of(brokers)
    controller.controller.create_topic("there", 1, 1, {})
    stale_view = MetadataWatcher(controller.store)

    def on_controller(call: str, arguments: Mapping[str, Any]) -> Any:
        return run_call(controller.controller, call, arguments)

    batches = TopicBatches(on_controller, stale_view)
    specs = [
        NewTopic("late-1", 2, 2, {}),
        NewTopic("late-2", 2, 2, {}),
        NewTopic("there", 1, 1, {}),
    ]
    answer = batches.create_topics(specs, timeout_ms=200)
    assert isinstance(answer["there"], TopicAlreadyExistsError)
    assert isinstance(answer["late-1"], KafkaTimeoutError)
    assert isinstance(answer["late-2"], KafkaTimeoutError)
    assert controller.store.topics() == ["late-1", "late-2", "there"]
    assert batches.create_topics([NewTopic("at-once", 1, 1, {})], timeout_ms=0) == {"at-once": None}
    gone = batches.delete_topics(["late-1", "nope"], timeout_ms=200)
    assert gone["late-1"] is None  # a view that never had it shows it gone
    assert isinstance(gone["nope"], UnknownTopicOrPartitionError)
    assert "late-1" not in controller.store.topics()
