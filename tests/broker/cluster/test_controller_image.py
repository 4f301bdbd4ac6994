"""A new controller reconciles from its broker's metadata image (issue #34, step 3), against
a real ZooKeeper: each "broker" is a ``ClusterStore`` session with a ``MetadataWatcher``
and a ``Controller`` fed by it (``image=watcher.image_read``), as ``broker.cluster.node``
wires them.

- the image, once settled, holds exactly what reading ZooKeeper gives
  (``store_batch.read_cluster``: assignments, configs, states with version and zxid);
- a failover decided from it elects the same way;
- an image older than ZooKeeper (an ISR a leader shrank since) cannot undo that change:
  the compare-and-set fails for that partition and a fresh read decides it;
- the placements Metadata reads (``ClusterPlacement.partition``) are the same objects
  while nothing of their partition changed, and follow every change.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster import controller as controller_module
from tidelog.broker.cluster.controller import Controller, ControllerSettings
from tidelog.broker.cluster.metadata import MetadataWatcher
from tidelog.broker.cluster.node import ClusterPlacement
from tidelog.broker.cluster.session import SessionFence
from tidelog.broker.cluster.store import ClusterStore
from tidelog.broker.cluster.store_batch import ClusterRead
from tidelog.broker.cluster.testing import ZooKeeperServer
from tidelog.broker.cluster.znodes import BrokerRegistration, PartitionState
from tidelog.storage.clock import SystemClock

_chroots = itertools.count()
_WAIT_MS = 10_000


@dataclass
class Broker:
    broker_id: int
    store: ClusterStore
    watcher: MetadataWatcher
    controller: Controller
    dead: bool = False

    def die(self) -> None:
        if not self.dead:
            self.dead = True
            self.controller.stop()
            self.watcher.stop()
            self.store.close()


Image = Callable[[int], ClusterRead | None]


@pytest.fixture
def start(zookeeper: ZooKeeperServer) -> Iterator[Callable[..., Broker]]:
    connect = f"{zookeeper.connect_string}/image-{next(_chroots)}"
    started: list[Broker] = []

    def start_broker(
        broker_id: int,
        image: Callable[[MetadataWatcher], Image] | None = None,
        store_class: type[ClusterStore] = ClusterStore,
    ) -> Broker:
        store = store_class.connect(connect, session_timeout_ms=4_000)
        store.register_broker(
            BrokerRegistration(broker_id, "127.0.0.1", 7000 + broker_id), timeout_ms=5_000
        )
        watcher = MetadataWatcher(store)
        controller = Controller(
            store,
            ControllerSettings(broker_id, admin_timeout_ms=10_000),
            SystemClock(),
            rng=random.Random(1),
            image=watcher.image_read if image is None else image(watcher),
        )
        watcher.start()
        controller.start()
        broker = Broker(broker_id, store, watcher, controller)
        started.append(broker)
        return broker

    yield start_broker
    for broker in started:
        broker.die()


def _controller(brokers: list[Broker]) -> Broker:
    eventually(lambda: sum(b.controller.is_controller for b in brokers) == 1, 10.0)
    return next(b for b in brokers if b.controller.is_controller)


def _state(broker: Broker, topic: str, partition: int) -> PartitionState:
    found = broker.store.read_partition_state(topic, partition)
    assert found is not None
    return found[0]


def _settled_image(broker: Broker) -> ClusterRead:
    """The watcher's image once it matches ZooKeeper (watches fire asynchronously)."""
    found: list[ClusterRead] = []

    def same() -> bool:
        image = broker.watcher.image_read(_WAIT_MS)
        found[:] = [] if image is None else [image]
        return image is not None and image == broker.store.read_cluster()

    eventually(same, 10.0)
    return found[0]


def test_the_settled_image_is_what_reading_zookeeper_gives(start: Callable[..., Broker]) -> None:
    brokers = [start(i) for i in (1, 2, 3)]
    controller = _controller(brokers)
    controller.controller.create_topic("kept", 4, 3, {"cleanup.policy": "compact"})
    controller.controller.create_topic("gone", 2, 2, {})
    image = _settled_image(brokers[0])
    assert set(image.assignments) >= {"kept", "gone"}
    assert image.configs["kept"] == {"cleanup.policy": "compact"}
    assert len([k for k in image.states if k[0] == "kept"]) == 4

    controller.controller.delete_topic("gone")
    victim = next(b for b in brokers if b is not controller and b is not brokers[0])
    victim.die()  # its partitions' leaders and ISRs change: new versions and zxids
    eventually(
        lambda: all(victim.broker_id not in _state(controller, "kept", p).isr for p in range(4)),
        10.0,
    )
    image = _settled_image(brokers[0])
    assert "gone" not in image.assignments
    assert all(victim.broker_id not in s[0].isr for k, s in image.states.items() if k[0] == "kept")


def test_a_failover_decided_from_the_image_elects_among_the_survivors(
    start: Callable[..., Broker],
) -> None:
    used: list[bool] = []

    def recorded(watcher: MetadataWatcher) -> Image:
        def image(timeout_ms: int) -> ClusterRead | None:
            found = watcher.image_read(timeout_ms)
            used.append(found is not None)
            return found

        return image

    brokers = [start(i, image=recorded) for i in (1, 2, 3)]
    first = _controller(brokers)
    first.controller.create_topic("r", 6, 3, {})
    for broker in brokers:
        _settled_image(broker)
    epoch = first.controller.epoch
    first.die()
    survivors = [b for b in brokers if b is not first]
    second = _controller(survivors)
    assert second.controller.epoch == epoch + 1
    assert used[-1], "the new controller read ZooKeeper: its image was not current"
    ids = {b.broker_id for b in survivors}
    eventually(lambda: all(_state(second, "r", p).leader in ids for p in range(6)), 10.0)
    assert all(first.broker_id not in _state(second, "r", p).isr for p in range(6))


def test_an_image_older_than_zookeeper_cannot_undo_a_newer_isr(
    start: Callable[..., Broker],
) -> None:
    """The next controller (broker 2 or 3) is handed an image read before a leader shrank
    an ISR: its write for that partition fails the compare-and-set, and the fresh read
    that follows keeps the shrink while electing."""
    first = start(1)
    _controller([first])
    held: list[ClusterRead] = []
    asked: list[int] = []

    def stale(_watcher: MetadataWatcher) -> Image:
        def image(timeout_ms: int) -> ClusterRead | None:
            asked.append(timeout_ms)
            return held[0] if held else None

        return image

    second, third = start(2, image=stale), start(3, image=stale)
    first.controller.create_topic("s", 6, 3, {})
    led_by_2 = [p for p in range(6) if _state(first, "s", p).leader == 2]
    assert led_by_2, "broker 2 leads nothing"
    partition = led_by_2[0]
    held.append(first.store.read_cluster())  # the image broker 2 will decide from
    # As a leader would (``ClusterStore.update_isr``): broker 2 drops broker 3.
    found = first.store.read_partition_state("s", partition)
    assert found is not None
    state, version = found
    assert 3 in state.isr
    first.store.update_isr("s", partition, replace(state, isr=(2, 1)), version)
    first.die()
    second = _controller([second, third])
    # Elected is not yet reconciled: its first reconcile runs on its event thread.
    eventually(lambda: bool(asked), 10.0)
    eventually(lambda: all(_state(second, "s", p).leader in (2, 3) for p in range(6)), 10.0)
    # Broker 1 (dead) is out of every ISR; the shrink is kept, not undone by the image.
    eventually(lambda: _state(second, "s", partition).isr == (2,), 10.0)
    assert all(1 not in _state(second, "s", p).isr for p in range(6))


def test_a_placement_is_the_same_object_until_its_partition_changes(
    start: Callable[..., Broker],
) -> None:
    """``ClusterPlacement.partition`` hands out one object while nothing of the
    partition changed (Metadata compares them by identity), and a new one when its
    state or this broker's cut-off from ZooKeeper does."""
    brokers = [start(i) for i in (1, 2, 3)]
    controller = _controller(brokers)
    controller.controller.create_topic("p", 3, 3, {})
    watcher = brokers[0].watcher
    assert watcher.wait_for(
        lambda m: "p" in m.topics and all(s is not None for s in m.topics["p"].states.values()),
        _WAIT_MS,
    )
    fence = SessionFence()
    placement = ClusterPlacement(1, "cluster", watcher, brokers[0].store, fence)
    first = [placement.partition("p", p) for p in range(3)]
    controller.controller.create_topic("other", 1, 1, {})  # a re-read, "p" unchanged
    assert watcher.wait_for(lambda m: "other" in m.topics, _WAIT_MS)
    assert all(placement.partition("p", p) is first[p] for p in range(3))

    led_by_1 = [p for p in range(3) if first[p].leader == 1]
    assert led_by_1, "broker 1 leads nothing"
    fence.cut("a test")
    cut = placement.partition("p", led_by_1[0])
    assert cut.leader == -1  # cut off: it vouches for no leadership of its own
    fence.restore()
    assert placement.partition("p", led_by_1[0]).leader == 1

    victim = next(b for b in brokers if b.broker_id == 3)
    victim.die()
    assert watcher.wait_for(
        lambda m: all(3 not in s.isr for s in m.topics["p"].states.values() if s is not None),
        _WAIT_MS,
    )
    after = [placement.partition("p", p) for p in range(3)]
    assert all(3 not in a.isr for a in after)
    assert all(a is not f for a, f in zip(after, first, strict=True))


def test_a_controlled_shutdown_from_a_stale_image_decides_the_changed_partition_again(
    start: Callable[..., Broker], caplog: pytest.LogCaptureFixture
) -> None:
    """``shutdown_moves.move_off``: decided from the image, the partition whose ISR a
    leader shrank since fails its compare-and-set and is moved in the round read from
    ZooKeeper, keeping the shrink; every other one is moved from the image."""
    held: list[ClusterRead] = []

    def stale(_watcher: MetadataWatcher) -> Image:
        return lambda _timeout_ms: held[0] if held else None

    first = start(1, image=stale)
    _controller([first])
    brokers = [first, start(2), start(3)]
    eventually(lambda: len(first.store.live_brokers_view().epochs) == 3, 10.0)
    first.controller.create_topic("c", 6, 3, {})
    led_by_2 = [p for p in range(6) if _state(first, "c", p).leader == 2]
    assert led_by_2, "broker 2 leads nothing"
    partition = led_by_2[0]
    held.append(first.store.read_cluster())
    found = first.store.read_partition_state("c", partition)
    assert found is not None
    state, version = found
    first.store.update_isr("c", partition, replace(state, isr=(2, 1)), version)

    with caplog.at_level(logging.INFO, logger="tidelog.broker.cluster.controller"):
        assert first.controller.controlled_shutdown(2) == 0
        # The leaderships first (the changed one decided again), answered; the ISRs of
        # the partitions broker 2 follows right after.
        led = len(led_by_2)
        assert f"leaderships image: {led} written, 1 failed; zookeeper: 1 written" in caplog.text
        eventually(lambda: "followers image: " in caplog.text, 10.0)
    assert f"followers image: {6 - led} written, 0 failed" in caplog.text
    states = [_state(first, "c", p) for p in range(6)]
    assert all(s.leader != 2 and 2 not in s.isr for s in states), states
    assert states[partition].leader == 1
    assert states[partition].isr == (1,)  # broker 3 stays out: the shrink was kept
    assert brokers[1].controller.is_controller is False


class _HeldReconcileStore(ClusterStore):
    """Holds the reconcile that takes broker 3 out of the ISRs: its first round of
    election writes until ``release_first``, every later round until ``release_rest``
    (``set_partition_states`` is where a round is written)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_entered = threading.Event()
        self.release_first = threading.Event()
        self.release_rest = threading.Event()
        self.rounds = 0

    def set_partition_states(self, lease: Any, writes: Sequence[Any]) -> Any:
        if any(3 not in w[2].isr and 2 in w[2].isr for w in writes):  # the reconcile's
            self.rounds += 1
            held = self.release_first if self.rounds == 1 else self.release_rest
            self.first_entered.set()
            assert held.wait(20), "never released"
        return super().set_partition_states(lease, writes)


def test_a_controlled_shutdown_is_served_between_the_write_rounds_of_a_long_event(
    start: Callable[..., Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``controller_events.UrgentLane``: a controlled shutdown asked while the controller
    writes a reconcile's elections is answered after the round in progress, not after
    the whole event (at 10,000 partitions those ran 13-40 s, past the stopping broker's
    15 s bound); the reconcile's later rounds then fail where it moved something, and
    are decided again."""
    monkeypatch.setattr(controller_module, "_WRITE_CHUNK", 1)
    first = start(1, store_class=_HeldReconcileStore)
    store = first.store
    assert isinstance(store, _HeldReconcileStore)
    _controller([first])
    second, third = start(2), start(3)
    eventually(lambda: len(store.live_brokers_view().epochs) == 3, 10.0)
    first.controller.create_topic("u", 4, 3, {})
    eventually(lambda: all(len(_state(first, "u", p).isr) == 3 for p in range(4)), 10.0)
    third.die()  # a brokers event: a reconcile of four writes, one per round
    assert store.first_entered.wait(10)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(first.controller.controlled_shutdown, 2)
        time.sleep(0.3)  # queued in the lane (a put) before the first round is written
        store.release_first.set()
        try:
            assert answer.result(10) == 0  # while the reconcile's other rounds are held
        finally:
            store.release_rest.set()
    assert all(_state(first, "u", p).leader != 2 for p in range(4))
    # The reconcile decided again what the shutdown made stale: broker 1 leads each
    # partition (broker 3's too), broker 3 out of every ISR.
    eventually(lambda: all(_state(first, "u", p).isr == (1,) for p in range(4)), 10.0)
    assert all(_state(first, "u", p).leader == 1 for p in range(4))
    assert second.controller.is_controller is False
