"""``ReplicationThrottle``: the leader's byte budget for a reassignment's adding replicas,
on a manual clock; and ``Partition.throttled_follower`` naming who goes through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.core.throttle import ReplicationThrottle
from tidelog.storage.clock import ManualClock
from tidelog.storage.log_manager import LogManager, LogManagerConfig


def test_the_budget_is_the_rate_with_a_second_of_credit() -> None:
    clock = ManualClock(monotonic_ms=10_000)
    throttle = ReplicationThrottle(1_000, clock)  # 1,000 bytes/s
    assert throttle.grant(5_000) == 1_000  # one second of credit, no more
    throttle.charge(1_000)
    assert throttle.grant(5_000) == 0  # spent
    clock.advance(500)
    assert throttle.grant(5_000) == 500
    throttle.charge(2_000)  # a read may exceed its grant by a batch: debt
    clock.advance(1_000)
    assert throttle.grant(5_000) == 0
    clock.advance(1_000)
    assert throttle.grant(100) == 100
    clock.advance(60_000)
    assert throttle.grant(5_000) == 1_000  # idle time does not pile up past the credit
    with pytest.raises(ValueError, match="positive"):
        ReplicationThrottle(-1, clock)


def test_a_rate_set_while_running_applies_at_once_and_zero_turns_it_off() -> None:
    clock = ManualClock(monotonic_ms=10_000)
    throttle = ReplicationThrottle(0, clock)  # the default: off
    assert not throttle.active
    assert throttle.grant(5_000) == 5_000
    throttle.charge(5_000)  # nothing owed while off
    throttle.set_rate(1_000)  # a dynamic leader.replication.throttled.rate
    assert throttle.active
    assert throttle.grant(5_000) == 1_000
    throttle.charge(1_000)
    assert throttle.grant(5_000) == 0
    throttle.set_rate(2_000)  # a new rate starts with a fresh budget
    assert throttle.grant(5_000) == 2_000
    throttle.set_rate(0)
    assert not throttle.active
    assert throttle.grant(5_000) == 5_000


def test_only_adding_replicas_of_a_led_partition_are_throttled(tmp_path: Path) -> None:
    clock = ManualClock()
    with LogManager.open(tmp_path, LogManagerConfig(), clock) as logs:
        logs.create_topic("t", 1, {})
        partition = PartitionRegistry(logs, 1, clock, replicated=True).get("t", 0)
        partition.make_leader(3, (3, 1, 2), (1, 2), adding=(3,))
        assert partition.throttled_follower(3)
        assert not partition.throttled_follower(2)
        assert partition.update_replicas(3, (3, 1), ())  # the move completed
        assert not partition.throttled_follower(3)
        partition.make_follower(2, 4)
        assert not partition.throttled_follower(3)
