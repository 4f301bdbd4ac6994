"""The group coordinator's state machine: joins, reconciliation, fencing, expiry, commits.

Pure tests with a manual ``now_ms``: no broker, no threads, no sleeping.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.coordinator import (
    CoordinatorConfig,
    GroupCoordinator,
    GroupState,
    HeartbeatAnswer,
    HeartbeatRequest,
)
from tidelog.storage.errors import (
    FencedMemberEpochError,
    GroupNotEmptyError,
    InvalidRequestError,
    StaleMemberEpochError,
    UnknownMemberIdError,
)

CONFIG = CoordinatorConfig(
    heartbeat_interval_ms=50,
    session_timeout_ms=500,
    min_session_timeout_ms=100,
    max_session_timeout_ms=1_000,
)
TOPICS = {"t": 4}


def tps(*partitions: int, topic: str = "t") -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(topic, p) for p in partitions)


def counter_ids() -> Callable[[], str]:
    numbers = itertools.count()
    return lambda: f"member-{next(numbers)}"


@pytest.fixture
def coordinator() -> GroupCoordinator:
    return GroupCoordinator(CONFIG, counter_ids())


def beat(
    coordinator: GroupCoordinator,
    answer: HeartbeatAnswer | None,
    *,
    owned: frozenset[TopicPartition] | None = None,
    now_ms: int = 0,
    topics: dict[str, int] | None = None,
    subscribe: frozenset[str] = frozenset({"t"}),
    group: str = "g",
    epoch: int | None = None,
    rebalance_timeout_ms: int = 0,
) -> HeartbeatAnswer:
    """Heartbeat as the member of ``answer`` (join if None), owning what it was given."""
    request = HeartbeatRequest(
        group_id=group,
        member_id=answer.member_id if answer is not None else "",
        member_epoch=epoch if epoch is not None else (answer.member_epoch if answer else 0),
        subscribed_topics=subscribe,
        owned=owned if owned is not None else (answer.assignment if answer else frozenset()),
        session_timeout_ms=500,
        rebalance_timeout_ms=rebalance_timeout_ms,
    )
    return coordinator.heartbeat(request, now_ms, TOPICS if topics is None else topics)


def settle(
    coordinator: GroupCoordinator, answers: list[HeartbeatAnswer], rounds: int = 4
) -> list[HeartbeatAnswer]:
    for _ in range(rounds):
        answers = [beat(coordinator, a) for a in answers]
    return answers


# --- joining and sharing -------------------------------------------------------------------


def test_first_member_gets_an_id_epoch_and_everything(coordinator: GroupCoordinator) -> None:
    a = beat(coordinator, None)
    assert a.member_id == "member-0"
    assert a.member_epoch == 1
    assert a.heartbeat_interval_ms == 50
    assert a.assignment == tps(0, 1, 2, 3)
    assert coordinator.view("g").state is GroupState.STABLE


def test_groups_from_before_a_restart_are_granted_nothing_until_the_hold_ends() -> None:
    assert CONFIG.startup_grant_delay_ms == 100  # interval 50, plus as much again
    assert CoordinatorConfig().startup_grant_delay_ms == 6_000  # 5 s, plus 1 s at most
    coordinator = GroupCoordinator(CONFIG, counter_ids(), held_groups=["g"], hold_until_ms=1_100)
    a = beat(coordinator, None, now_ms=1_000)
    assert a.assignment == frozenset()
    a = beat(coordinator, a, now_ms=1_099)
    assert a.assignment == frozenset()
    assert beat(coordinator, None, group="new", now_ms=1_000).assignment == tps(0, 1, 2, 3)
    a = beat(coordinator, a, now_ms=1_100)
    assert a.assignment == tps(0, 1, 2, 3)


def test_a_second_member_gets_partitions_only_once_released(coordinator: GroupCoordinator) -> None:
    a = beat(coordinator, None)
    b = beat(coordinator, None)
    assert b.member_epoch == 2
    assert b.assignment == frozenset()  # its target is still held by a
    assert coordinator.view("g").state is GroupState.RECONCILING

    a = beat(coordinator, a)  # a still owns all four: told to keep two, epoch unchanged
    assert len(a.assignment) == 2
    assert a.member_epoch == 1
    b = beat(coordinator, b)  # nothing released yet
    assert b.assignment == frozenset()

    a = beat(coordinator, a)  # a reports owning only its two: released, epoch moves on
    assert a.member_epoch == 2
    b = beat(coordinator, b)
    assert len(b.assignment) == 2
    assert a.assignment.isdisjoint(b.assignment)
    assert a.assignment | b.assignment == tps(0, 1, 2, 3)
    assert coordinator.view("g").state is GroupState.STABLE


def test_revoked_partitions_are_released_only_by_a_later_heartbeat(
    coordinator: GroupCoordinator,
) -> None:
    a = beat(coordinator, None)
    b = beat(coordinator, None)
    # a reports owning nothing in the heartbeat that revokes: still not released, since
    # a cannot have seen the revocation yet.
    a = beat(coordinator, a, owned=frozenset())
    b = beat(coordinator, b)
    assert b.assignment == frozenset()
    a = beat(coordinator, a)
    b = beat(coordinator, b)
    assert len(b.assignment) == 2


def test_leave_gives_the_partitions_to_the_others(coordinator: GroupCoordinator) -> None:
    a, b = settle(coordinator, [beat(coordinator, None), beat(coordinator, None)])
    left = beat(coordinator, a, owned=frozenset(), epoch=-1)
    assert left.member_epoch == -1
    assert left.assignment == frozenset()
    (b,) = settle(coordinator, [b], rounds=1)
    assert b.assignment == tps(0, 1, 2, 3)
    # Leaving is idempotent.
    assert beat(coordinator, a, owned=frozenset(), epoch=-1).member_epoch == -1


def test_the_last_member_leaving_forgets_the_group(coordinator: GroupCoordinator) -> None:
    a = beat(coordinator, None)
    beat(coordinator, a, epoch=-1, owned=frozenset())
    assert coordinator.group_ids() == []
    assert coordinator.view("g").state is GroupState.EMPTY


def test_session_expiry_reassigns(coordinator: GroupCoordinator) -> None:
    a, b = settle(coordinator, [beat(coordinator, None), beat(coordinator, None)])
    assert coordinator.next_deadline_ms() == 500
    assert coordinator.expire(499, TOPICS) == []
    b = beat(coordinator, b, now_ms=400)  # b keeps its session alive, a does not
    removed = coordinator.expire(500, TOPICS)
    assert [(r.member_id, r.reason) for r in removed] == [(a.member_id, "session")]
    b = beat(coordinator, b, now_ms=600)
    assert b.assignment == tps(0, 1, 2, 3)
    with pytest.raises(UnknownMemberIdError):
        beat(coordinator, a, now_ms=600)


def test_a_member_that_never_revokes_is_removed_after_its_rebalance_timeout(
    coordinator: GroupCoordinator,
) -> None:
    a = beat(coordinator, None, rebalance_timeout_ms=300)
    b = beat(coordinator, None)
    stubborn = tps(0, 1, 2, 3)
    beat(coordinator, a, owned=stubborn, now_ms=100, rebalance_timeout_ms=300)  # revoke starts
    beat(coordinator, a, owned=stubborn, now_ms=350, rebalance_timeout_ms=300)
    b = beat(coordinator, b, now_ms=350)
    assert b.assignment == frozenset()
    removed = coordinator.expire(400, TOPICS)
    assert [(r.member_id, r.reason) for r in removed] == [(a.member_id, "rebalance")]
    assert beat(coordinator, b, now_ms=400).assignment == stubborn


def test_a_second_group_is_independent(coordinator: GroupCoordinator) -> None:
    a = beat(coordinator, None, group="g")
    x = beat(coordinator, None, group="h")
    assert a.assignment == x.assignment == tps(0, 1, 2, 3)
    assert coordinator.group_ids() == ["g", "h"]


# --- changes that rebalance ----------------------------------------------------------------


def test_subscription_change_bumps_the_epoch_and_rebalances(coordinator: GroupCoordinator) -> None:
    topics = {"t": 2, "u": 2}
    a = beat(coordinator, None, topics=topics)
    assert a.assignment == tps(0, 1)
    a = beat(coordinator, a, topics=topics, subscribe=frozenset({"t", "u"}))
    assert a.member_epoch == 2
    assert a.assignment == tps(0, 1) | tps(0, 1, topic="u")
    a = beat(coordinator, a, topics=topics, subscribe=frozenset({"u"}))
    assert a.assignment == tps(0, 1, topic="u")  # t revoked by omission
    assert a.member_epoch == 2
    a = beat(coordinator, a, topics=topics, subscribe=frozenset({"u"}))
    assert a.member_epoch == 3


def test_new_topics_and_partitions_rebalance(coordinator: GroupCoordinator) -> None:
    a = beat(coordinator, None, topics={}, subscribe=frozenset({"later"}))
    assert a.assignment == frozenset()
    a = beat(coordinator, a, topics={"later": 2}, subscribe=frozenset({"later"}))
    assert a.assignment == tps(0, 1, topic="later")
    a = beat(coordinator, a, topics={"later": 3}, subscribe=frozenset({"later"}))
    assert a.assignment == tps(0, 1, 2, topic="later")
    a = beat(coordinator, a, topics={}, subscribe=frozenset({"later"}))
    assert a.assignment == frozenset()  # the topic was deleted


# --- fencing --------------------------------------------------------------------------------


def test_unknown_member_and_fenced_epochs(coordinator: GroupCoordinator) -> None:
    a = beat(coordinator, None)
    with pytest.raises(UnknownMemberIdError):
        beat(coordinator, HeartbeatAnswer("stranger", 1, 0, frozenset()))
    with pytest.raises(FencedMemberEpochError):
        beat(coordinator, a, epoch=a.member_epoch + 1)
    with pytest.raises(InvalidRequestError):
        beat(coordinator, a, epoch=-2)
    with pytest.raises(InvalidRequestError):
        beat(coordinator, HeartbeatAnswer("", 3, 0, frozenset()))
    with pytest.raises(InvalidRequestError):
        beat(coordinator, None, group="")


def test_the_previous_epoch_is_tolerated_once_when_an_answer_was_lost(
    coordinator: GroupCoordinator,
) -> None:
    a = beat(coordinator, None)  # epoch 1
    b = beat(coordinator, None)  # group epoch 2
    a = beat(coordinator, a)  # revoking, still 1
    a2 = beat(coordinator, a)  # released: epoch 2; pretend this answer was lost
    assert a2.member_epoch == 2
    again = beat(coordinator, a)  # epoch 1 again, owning a subset of its assignment
    assert again.member_epoch == 2
    # Owning something it was not given with the old epoch is fenced.
    with pytest.raises(FencedMemberEpochError):
        beat(coordinator, a, owned=tps(0, 1, 2, 3))
    assert b.member_epoch == 2


def test_a_fenced_member_rejoins_with_its_id_and_epoch_zero(coordinator: GroupCoordinator) -> None:
    a = beat(coordinator, None)
    rejoined = beat(coordinator, a, epoch=0, owned=frozenset())
    assert rejoined.member_id == a.member_id
    assert rejoined.member_epoch == 2
    assert rejoined.assignment == tps(0, 1, 2, 3)
    assert len(coordinator.view("g").members) == 1


def test_session_timeouts_are_clamped() -> None:
    assert CONFIG.session_timeout_for(0) == 500
    assert CONFIG.session_timeout_for(5) == 100
    assert CONFIG.session_timeout_for(10_000) == 1_000
    with pytest.raises(ValueError, match="heartbeat"):
        CoordinatorConfig(heartbeat_interval_ms=100, min_session_timeout_ms=100)


# --- commits ---------------------------------------------------------------------------------


def test_commit_validation(coordinator: GroupCoordinator) -> None:
    a, b = settle(coordinator, [beat(coordinator, None), beat(coordinator, None)])
    everything = tps(0, 1, 2, 3)
    assert coordinator.check_commit("g", a.member_id, a.member_epoch, a.assignment) == frozenset()
    assert coordinator.check_commit("g", a.member_id, a.member_epoch, everything) == b.assignment
    with pytest.raises(StaleMemberEpochError):
        coordinator.check_commit("g", a.member_id, a.member_epoch - 1, a.assignment)
    with pytest.raises(UnknownMemberIdError):
        coordinator.check_commit("g", "stranger", 1, a.assignment)
    with pytest.raises(GroupNotEmptyError):
        coordinator.check_commit("g", "", -1, everything)
    assert coordinator.check_commit("empty", "", -1, everything) == frozenset()
    with pytest.raises(GroupNotEmptyError):
        coordinator.require_empty("g")


def test_a_member_may_commit_what_it_is_revoking(coordinator: GroupCoordinator) -> None:
    a = beat(coordinator, None)
    beat(coordinator, None)
    a_now = beat(coordinator, a)  # two partitions now revoking, epoch unchanged
    revoking = a.assignment - a_now.assignment
    assert len(revoking) == 2
    assert coordinator.check_commit("g", a.member_id, a_now.member_epoch, revoking) == frozenset()
    a_after = beat(coordinator, a_now)  # released
    assert coordinator.check_commit("g", a.member_id, a_after.member_epoch, revoking) == revoking
