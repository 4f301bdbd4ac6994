"""A consumer group over a topic that grows: two members of a two-partition topic, the
topic grows to four partitions, and the group rebalances so that all four are owned,
disjointly, two each, and the records written to the new partitions are read, each once.

The broker notices the new count at the group's next heartbeat and bumps the group epoch
(``docs/groups.md``); the members need no metadata refresh of their own. Members are
driven from the test's thread, polling in turn (a ``Consumer`` is used from one thread).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.client.groups import GROUP_SETTINGS, member, poll_until, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, TopicPartition
from tidelog.client.types import ConsumerRecord


@pytest.fixture(scope="module")
def group_broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings=GROUP_SETTINGS) as running:
        yield running


def test_two_members_own_all_four_partitions_after_the_topic_grows(
    group_broker: InProcessBroker,
) -> None:
    address = group_broker.address
    topic = "grow"
    with AdminClient(address) as admin:
        admin.create_topic(topic, 2)
    produce(address, topic, range(2), 5)
    a, b = (member(address, "grow-group", auto_commit_interval_ms=100) for _ in range(2))
    seen: list[ConsumerRecord] = []
    try:
        a.subscribe(topic)
        b.subscribe(topic)

        def split(partitions: int, records: int) -> Callable[[], bool]:
            def done() -> bool:
                owned_a, owned_b = a.assignment(), b.assignment()
                return (
                    len(owned_a) == len(owned_b) == partitions // 2
                    and not owned_a & owned_b
                    and len(seen) >= records
                )

            return done

        poll_until([a, b], split(2, 10), timeout_s=20, sink=seen)
        assert a.assignment() | b.assignment() == {TopicPartition(topic, p) for p in range(2)}

        with AdminClient(address) as admin:
            assert admin.create_partitions(topic, 4) == 4
        produce(address, topic, range(2, 4), 5)
        poll_until([a, b], split(4, 20), timeout_s=20, sink=seen)

        owned_a, owned_b = a.assignment(), b.assignment()
        assert owned_a | owned_b == {TopicPartition(topic, p) for p in range(4)}
        assert not owned_a & owned_b
        assert (len(owned_a), len(owned_b)) == (2, 2)
        # Everything was read; the new partitions from their start, and only once (nobody
        # held them before, so the rebalance granted them without a revocation).
        assert {r.value for r in seen} == {f"{p}-{i}".encode() for p in range(4) for i in range(5)}
        assert sorted((r.partition, r.offset) for r in seen if r.partition >= 2) == [
            (p, i) for p in (2, 3) for i in range(5)
        ]
        with AdminClient(address) as admin:
            described = admin.describe_group("grow-group")
        assert described.state == "Stable"
        held = sorted(tp.partition for m in described.members for tp in m.assignment)
        assert held == [0, 1, 2, 3]
    finally:
        a.close()
        b.close()
