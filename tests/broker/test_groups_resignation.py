"""A broker that stops leading an offsets partition forgets its groups (cluster mode,
``GroupManager.unload_resigned``, Kafka's ``onResignation``): classic groups with their
parked requests, KIP-848 groups with their deadlines, and the cached offsets; the
listings leave them out from the moment leadership moved. One broker (id 1) of a
replicated registry, its roles set by hand as the replica manager sets them, on a manual
clock; ``tests/kafka/test_cluster_coordinator_moves.py`` does the same across brokers.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.broker.core.partition import Partition
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.classic import ClassicError, JoinRequest, JoinResult
from tidelog.broker.groups.coordinator import HeartbeatRequest
from tidelog.broker.groups.manager import GroupConfig, GroupManager, OffsetCommitEntry
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC, OffsetStoreConfig
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import (
    CoordinatorLoadInProgressError,
    GroupIdNotFoundError,
    UnknownMemberIdError,
)
from tidelog.storage.log_manager import LogManager, LogManagerConfig

CLASSIC = "classic-group"
MODERN = "modern-group"
TOPIC = "events"
CONFIG = GroupConfig(offsets=OffsetStoreConfig(num_partitions=1), initial_rebalance_delay_ms=0)


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[LogManager]:
    with LogManager.open(
        tmp_path, LogManagerConfig(cleaner_enabled=False), ManualClock()
    ) as opened:
        opened.create_topic(TOPIC, 2, {})
        yield opened


def _open(logs: LogManager) -> tuple[GroupManager, Partition]:
    registry = PartitionRegistry(logs, 1, logs.clock, replicated=True)
    manager = GroupManager.open(logs, logs.clock, CONFIG, registry=registry)
    return manager, registry.get(OFFSETS_TOPIC, 0)


def _lead(manager: GroupManager, leadership: Partition, epoch: int) -> None:
    """What the replica manager does: take the role, then load (``became_leader``)."""
    leadership.make_leader(epoch, (1, 2), (1,))
    manager.reload_partition(0)


def _join(manager: GroupManager, member_id: str = "") -> concurrent.futures.Future[JoinResult]:
    return manager.classic.join(
        JoinRequest(
            group_id=CLASSIC,
            member_id=member_id,
            group_instance_id=None,
            client_id="c",
            client_host="h",
            session_timeout_ms=30_000,
            rebalance_timeout_ms=30_000,
            protocol_type="consumer",
            protocols=(("range", b"sub"),),
            require_known_member_id=True,
        )
    )


def _groups_with_members(manager: GroupManager) -> str:
    """A classic group with a member and a KIP-848 group with a member, each with a
    committed offset; returns the KIP-848 member's id."""
    first = _join(manager).result(0)
    assert first.error is ClassicError.MEMBER_ID_REQUIRED
    assert _join(manager, first.member_id).result(0).error is ClassicError.NONE
    answer = manager.heartbeat(
        HeartbeatRequest(MODERN, "", 0, frozenset({TOPIC}), frozenset(), 30_000, 30_000)
    )
    assert answer.assignment
    entry = [OffsetCommitEntry(TopicPartition(TOPIC, 0), 7)]
    manager.commit_offsets(CLASSIC, "", -1, entry)
    manager.commit_offsets(MODERN, answer.member_id, answer.member_epoch, entry)
    return answer.member_id


def test_a_resigned_partition_s_groups_are_unloaded_and_not_listed(logs: LogManager) -> None:
    manager, leadership = _open(logs)
    _lead(manager, leadership, 3)
    modern_member = _groups_with_members(manager)
    assert {g.group_id for g in manager.list_groups()} == {CLASSIC, MODERN}
    assert manager.unload_resigned() == []  # still the leader: nothing to do

    leadership.make_follower(2, 4)  # a preferred election moved the partition to broker 2
    # Listed nowhere here from now on, before the unload has run.
    assert manager.list_groups() == []
    assert manager.lag() == []

    assert manager.unload_resigned() == [0]
    assert manager.classic.describe(CLASSIC) is None
    assert not manager.classic.has_groups()
    with pytest.raises(GroupIdNotFoundError):
        manager.describe_consumer_group(MODERN)
    assert manager.store.offsets(CLASSIC) == {}
    assert manager.store.offsets(MODERN) == {}
    with pytest.raises(CoordinatorLoadInProgressError):
        manager.store.check_loaded(0)
    assert manager.store.loaded_partitions() == []
    # No timer left: past every session, nothing expires (a KIP-848 removal otherwise).
    clock = logs.clock
    assert isinstance(clock, ManualClock)
    clock.advance(60_000)
    assert manager.expire() == []
    assert manager.unload_resigned() == []  # once

    # Leading again (after broker 2 did): the offsets and the classic group come back
    # from the log; the KIP-848 member, unknown here now, rejoins.
    _lead(manager, leadership, 5)
    assert manager.store.offsets(CLASSIC)[TopicPartition(TOPIC, 0)].offset == 7
    assert {g.group_id for g in manager.list_groups()} == {CLASSIC, MODERN}
    with pytest.raises(UnknownMemberIdError):
        manager.heartbeat(
            HeartbeatRequest(MODERN, modern_member, 1, frozenset({TOPIC}), frozenset())
        )


def test_a_parked_join_is_answered_not_coordinator(logs: LogManager) -> None:
    manager, leadership = _open(logs)
    _lead(manager, leadership, 3)
    first = _join(manager).result(0)
    a = _join(manager, first.member_id).result(0)
    second = _join(manager).result(0)
    b_join = _join(manager, second.member_id)  # a rebalance: waits for "a" to rejoin
    assert not b_join.done()
    leadership.resign()  # the ZooKeeper session was lost
    manager.unload_resigned()
    assert b_join.result(0).error is ClassicError.NOT_COORDINATOR
    assert a.error is ClassicError.NONE


def test_an_isr_change_or_a_later_leadership_is_not_unloaded(logs: LogManager) -> None:
    manager, leadership = _open(logs)
    _lead(manager, leadership, 3)
    _groups_with_members(manager)
    leadership.make_leader(4, (1, 2), (1, 2))  # an ISR change bumps the epoch: still leading
    assert manager.unload_resigned() == []
    manager.reload_partition(0)
    assert manager.classic.describe(CLASSIC) is not None
    assert {g.group_id for g in manager.list_groups()} == {CLASSIC, MODERN}
    # Lost and led again before the expiry thread looked: the reload replaced the state,
    # and the unload finds the partition led.
    leadership.make_follower(2, 5)
    _lead(manager, leadership, 6)
    assert manager.unload_resigned() == []
    assert manager.store.offsets(MODERN)[TopicPartition(TOPIC, 0)].offset == 7
    with pytest.raises(GroupIdNotFoundError):  # KIP-848 groups met elsewhere: forgotten
        manager.describe_consumer_group(MODERN)


def test_a_restarted_broker_lists_only_what_it_leads(logs: LogManager) -> None:
    manager, leadership = _open(logs)
    _lead(manager, leadership, 3)
    _groups_with_members(manager)
    manager.close()
    # Restarted: every committed offset is read at open, and none is shown before this
    # broker leads the partition again (it comes back as a follower).
    restarted, leadership = _open(logs)
    assert restarted.list_groups() == []
    assert restarted.store.group_ids() == []
    leadership.make_follower(2, 4)
    assert restarted.list_groups() == []
    _lead(restarted, leadership, 5)
    assert {g.group_id for g in restarted.list_groups()} == {CLASSIC, MODERN}
