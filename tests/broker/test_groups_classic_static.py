"""The classic group state machine (``broker.groups.classic``) on a manual clock: static
membership (KIP-345) and ``group.initial.rebalance.delay.ms``. No sockets: the Kafka
clients' view of the same rules is in ``tests/kafka/test_static_membership.py``."""

from __future__ import annotations

import concurrent.futures

import pytest

from tidelog.broker.groups.classic import (
    ClassicError,
    ClassicGroups,
    JoinRequest,
    JoinResult,
    SyncResult,
)
from tidelog.storage.clock import ManualClock

pytestmark = pytest.mark.timeout(30)

SESSION_MS = 10_000
GROUP = "g"


def _join(
    groups: ClassicGroups,
    member_id: str = "",
    instance_id: str | None = None,
    metadata: bytes = b"m",
    protocols: tuple[str, ...] = ("range",),
) -> concurrent.futures.Future[JoinResult]:
    return groups.join(
        JoinRequest(
            group_id=GROUP,
            member_id=member_id,
            group_instance_id=instance_id,
            client_id="c",
            client_host="h",
            session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=20_000,
            protocol_type="consumer",
            protocols=tuple((name, metadata) for name in protocols),
            require_known_member_id=True,
        )
    )


def _now(future: concurrent.futures.Future[JoinResult]) -> JoinResult:
    assert future.done(), "the join is still parked"
    return future.result()


def _synced(future: concurrent.futures.Future[SyncResult]) -> SyncResult:
    assert future.done(), "the sync is still parked"
    return future.result()


def _stable_pair(groups: ClassicGroups) -> tuple[JoinResult, JoinResult]:
    """Static member "a" (the leader) and dynamic member "b", stable, each one partition."""
    a = _now(_join(groups, instance_id="a"))  # no MEMBER_ID_REQUIRED for a static member
    assert a.error is ClassicError.NONE
    first = _join(groups)
    b_id = _now(first).member_id
    b_join = _join(groups, b_id)  # b joins: a must rejoin
    a_join = _join(groups, a.member_id, "a")
    a, b = _now(a_join), _now(b_join)
    assert a.leader == a.member_id
    leader_sync = groups.sync(
        GROUP, a.member_id, a.generation_id, {a.member_id: b"pa", b.member_id: b"pb"}, "a"
    )
    assert _synced(leader_sync).assignment == b"pa"
    assert _synced(groups.sync(GROUP, b.member_id, b.generation_id, {})).assignment == b"pb"
    return a, b


def test_a_static_member_joins_without_member_id_required() -> None:
    groups = ClassicGroups(ManualClock(), initial_rebalance_delay_ms=0)
    joined = _now(_join(groups, instance_id="i1"))
    assert joined.error is ClassicError.NONE
    assert joined.member_id
    assert joined.leader == joined.member_id
    dynamic = _now(_join(groups))
    assert dynamic.error is ClassicError.MEMBER_ID_REQUIRED


def test_a_restarted_static_member_keeps_its_assignment_without_a_rebalance() -> None:
    clock = ManualClock()
    groups = ClassicGroups(clock, initial_rebalance_delay_ms=0)
    a, b = _stable_pair(groups)
    clock.advance(SESSION_MS // 2)  # restarted within its session
    again = _now(_join(groups, instance_id="a"))
    assert again.error is ClassicError.NONE
    assert again.member_id != a.member_id
    assert again.generation_id == a.generation_id  # no new generation
    # The leader as it was: the new incarnation computes no assignment.
    assert again.leader == a.member_id
    assert again.members == ()
    synced = groups.sync(GROUP, again.member_id, again.generation_id, {}, "a")
    assert _synced(synced).assignment == b"pa"
    # The other member never hears of it.
    assert groups.heartbeat(GROUP, b.member_id, b.generation_id) is ClassicError.NONE
    # The old incarnation is fenced everywhere.
    old = (GROUP, a.member_id, a.generation_id)
    assert groups.heartbeat(*old, "a") is ClassicError.FENCED_INSTANCE_ID
    assert groups.check_commit(*old, "a") is ClassicError.FENCED_INSTANCE_ID
    assert _synced(groups.sync(*old, {}, "a")).error is ClassicError.FENCED_INSTANCE_ID
    assert _now(_join(groups, a.member_id, "a")).error is ClassicError.FENCED_INSTANCE_ID
    assert groups.leave(GROUP, a.member_id, "a") is ClassicError.FENCED_INSTANCE_ID
    assert groups.heartbeat(GROUP, again.member_id, a.generation_id, "a") is ClassicError.NONE
    described = groups.describe(GROUP)
    assert described is not None
    assert {(m.member_id, m.group_instance_id) for m in described.members} == {
        (again.member_id, "a"),
        (b.member_id, None),
    }


def test_a_static_member_rejoining_with_new_metadata_rebalances() -> None:
    groups = ClassicGroups(ManualClock(), initial_rebalance_delay_ms=0)
    a, b = _stable_pair(groups)
    parked = _join(groups, instance_id="a", metadata=b"other topics")
    assert not parked.done()  # a rebalance: b must rejoin
    assert groups.heartbeat(GROUP, b.member_id, b.generation_id) is (
        ClassicError.REBALANCE_IN_PROGRESS
    )
    _join(groups, b.member_id)
    assert _now(parked).generation_id == a.generation_id + 1


def test_leave_by_instance_id_and_expiry_remove_a_static_member() -> None:
    clock = ManualClock()
    groups = ClassicGroups(clock, initial_rebalance_delay_ms=0)
    _a, b = _stable_pair(groups)
    assert groups.leave(GROUP, "", "nobody") is ClassicError.UNKNOWN_MEMBER_ID
    assert groups.leave(GROUP, "", "a") is ClassicError.NONE
    assert not groups.has_instance(GROUP, "a")
    assert groups.heartbeat(GROUP, b.member_id, b.generation_id) is (
        ClassicError.REBALANCE_IN_PROGRESS
    )
    # Back, then silent past its session: removed, the others rebalance.
    back = _join(groups, instance_id="a")
    _join(groups, b.member_id)
    a2 = _now(back)
    assert a2.leader == b.member_id  # the leader left: b leads now
    _synced(groups.sync(GROUP, b.member_id, a2.generation_id, {}))
    _synced(groups.sync(GROUP, a2.member_id, a2.generation_id, {}, "a"))
    for _ in range(3):
        clock.advance(SESSION_MS // 2)
        assert groups.heartbeat(GROUP, b.member_id, a2.generation_id) in (
            ClassicError.NONE,
            ClassicError.REBALANCE_IN_PROGRESS,
        )
        groups.expire()
    assert not groups.has_instance(GROUP, "a")
    assert groups.heartbeat(GROUP, a2.member_id, a2.generation_id, "a") is (
        ClassicError.UNKNOWN_MEMBER_ID
    )


def test_the_first_rebalance_waits_for_members_starting_together() -> None:
    clock = ManualClock()
    groups = ClassicGroups(clock, initial_rebalance_delay_ms=3_000)
    first = _join(groups, instance_id="a")
    clock.advance(2_000)
    groups.expire()
    assert not first.done()
    second = _join(groups, instance_id="b")
    clock.advance(1_000)  # the first delay passes; a member came during it: once more
    groups.expire()
    assert not first.done()
    assert not second.done()
    clock.advance(3_000)
    groups.expire()
    a, b = _now(first), _now(second)
    assert a.generation_id == b.generation_id == 1  # one assignment for both
    assert len(a.members) == 2
    # Only an empty group waits: a later member rebalances at once once all rejoin.
    third = _join(groups, instance_id="c")
    _join(groups, a.member_id, "a")
    _join(groups, b.member_id, "b")
    assert _now(third).generation_id == 2


def test_the_initial_delay_is_bounded_by_the_rebalance_timeout() -> None:
    clock = ManualClock()
    groups = ClassicGroups(clock, initial_rebalance_delay_ms=3_000)
    first = _join(groups, instance_id="m0")
    for i in range(1, 20):  # a member every 2.5 s: each delay sees a newcomer
        clock.advance(2_500)
        _join(groups, instance_id=f"m{i}")
        groups.expire()
        if first.done():
            break
    assert first.done()
    assert clock.monotonic_ms() <= 20_000 + 3_000  # the rebalance timeout (20 s), plus a tick
