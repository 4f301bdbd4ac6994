"""Incremental cooperative rebalancing (KIP-429) on the Kafka listener's classic groups:
confluent-kafka members with ``cooperative-sticky`` keep every partition that does not
move through a member joining, unsubscribing and subscribing again; only the partitions
that change owner are revoked (never a member's whole assignment), as against Kafka."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import confluent_kafka
import pytest

from tests.kafka.clients import TIMEOUT_S
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.client import AdminClient

pytestmark = pytest.mark.timeout(200)

PARTITIONS = 6


class Member:
    """A cooperative-sticky consumer polled on its own thread, recording its callbacks."""

    def __init__(self, broker: KafkaBroker, group_id: str, name: str) -> None:
        self.name = name
        self.owned: set[int] = set()
        self.revoked: list[set[int]] = []
        self.assigned: list[set[int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._commands: queue.Queue[Callable[[], object]] = queue.Queue()
        self._consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": group_id,
                "partition.assignment.strategy": "cooperative-sticky",
                "client.id": name,
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 500,
            }
        )
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def subscribe(self, topic: str) -> None:
        """Join the group from the polling thread (started on first use)."""
        self._commands.put(
            lambda: self._consumer.subscribe(
                [topic], on_assign=self._on_assign, on_revoke=self._on_revoke
            )
        )
        if not self._thread.is_alive():
            self._thread.start()

    def unsubscribe(self) -> None:
        """Leave the group from the polling thread: librdkafka serves a cooperative
        revocation in ``poll``, and a (un)subscribe from another thread waits on it."""
        self._commands.put(self._consumer.unsubscribe)

    def _on_assign(
        self, consumer: object, partitions: list[confluent_kafka.TopicPartition]
    ) -> None:
        with self._lock:
            got = {p.partition for p in partitions}
            if got:
                self.assigned.append(got)
            self.owned |= got

    def _on_revoke(
        self, consumer: object, partitions: list[confluent_kafka.TopicPartition]
    ) -> None:
        with self._lock:
            lost = {p.partition for p in partitions}
            if lost:
                self.revoked.append(lost)
            self.owned -= lost

    def _poll(self) -> None:
        while not self._stop.is_set():
            while not self._commands.empty():
                self._commands.get()()
            self._consumer.poll(0.1)

    def snapshot(self) -> set[int]:
        with self._lock:
            return set(self.owned)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def _settled(members: list[Member], expected_owners: int) -> bool:
    owned = [m.snapshot() for m in members]
    everything = set().union(*owned)
    disjoint = sum(len(o) for o in owned) == len(everything)
    busy = sum(1 for o in owned if o)
    return everything == set(range(PARTITIONS)) and disjoint and busy == expected_owners


def _wait(members: list[Member], expected_owners: int, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S * 2
    while not _settled(members, expected_owners):
        assert time.monotonic() < deadline, f"{what}: {[m.snapshot() for m in members]}"
        time.sleep(0.2)
    time.sleep(1.5)  # a rebalance in flight would show now
    assert _settled(members, expected_owners), what


@pytest.fixture
def topic(kafka_broker: KafkaBroker) -> Iterator[str]:
    name = unique("coop")
    with AdminClient(kafka_broker.address) as admin:
        admin.create_topic(name, PARTITIONS)
    return name


def test_only_the_partitions_that_move_are_revoked(kafka_broker: KafkaBroker, topic: str) -> None:
    group_id = unique("coop-group")
    a, b, c = (Member(kafka_broker, group_id, n) for n in ("a", "b", "c"))
    try:
        a.subscribe(topic)
        _wait([a], 1, "a alone")
        assert a.revoked == []

        b.subscribe(topic)
        _wait([a, b], 2, "b joined")
        # a gave up exactly what b took, in one revocation; b lost nothing.
        assert a.revoked == [b.snapshot()]
        assert b.revoked == []

        kept_a, kept_b = a.snapshot(), b.snapshot()
        c.subscribe(topic)
        _wait([a, b, c], 3, "c joined")
        # Nobody lost a partition it still owns: revocations are exactly what moved to c.
        assert kept_a - a.snapshot() | kept_b - b.snapshot() == c.snapshot()
        assert a.snapshot() <= kept_a
        assert b.snapshot() <= kept_b
        assert all(len(r) < PARTITIONS for r in a.revoked + b.revoked)

        # c leaves (unsubscribes), then subscribes again: its partitions go to a and b
        # and come back; a and b keep theirs throughout.
        before = {m.name: m.snapshot() for m in (a, b)}
        c.unsubscribe()
        _wait([a, b, c], 2, "c unsubscribed")
        for m in (a, b):
            assert before[m.name] <= m.snapshot(), f"{m.name} lost a partition it kept"
        c.subscribe(topic)
        _wait([a, b, c], 3, "c subscribed again")
        assert all(len(r) < PARTITIONS for r in a.revoked + b.revoked)
    finally:
        for m in (a, b, c):
            m.close()
