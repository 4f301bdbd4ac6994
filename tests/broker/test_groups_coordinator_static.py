"""Static members of KIP-848 groups (``instance_id``) in the coordinator's state machine:
a member leaving with epoch -2 keeps its partitions for its session and its next
incarnation takes them over without moving anyone else; a live instance id is not
released; a replaced incarnation is fenced. Pure: a manual ``now_ms``."""

from __future__ import annotations

import pytest

from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.coordinator import (
    LEAVE_STATIC_EPOCH,
    CoordinatorConfig,
    GroupCoordinator,
    HeartbeatAnswer,
    HeartbeatRequest,
)
from tidelog.storage.errors import (
    FencedInstanceIdError,
    UnknownMemberIdError,
    UnreleasedInstanceIdError,
)

CONFIG = CoordinatorConfig(
    heartbeat_interval_ms=50,
    session_timeout_ms=500,
    min_session_timeout_ms=100,
    max_session_timeout_ms=1_000,
)
TOPICS = {"t": 4}


def _beat(
    coordinator: GroupCoordinator,
    member_id: str,
    epoch: int,
    instance_id: str | None,
    owned: frozenset[TopicPartition] = frozenset(),
    now_ms: int = 0,
) -> HeartbeatAnswer:
    request = HeartbeatRequest(
        "g", member_id, epoch, frozenset({"t"}), owned, instance_id=instance_id
    )
    return coordinator.heartbeat(request, now_ms, TOPICS)


def _settle(coordinator: GroupCoordinator, answers: dict[str, HeartbeatAnswer]) -> None:
    """Heartbeat every member with what it was given until nothing changes."""
    for _ in range(10):
        for instance, answer in list(answers.items()):
            answers[instance] = _beat(
                coordinator, answer.member_id, answer.member_epoch, instance, answer.assignment
            )


def test_a_static_member_leaving_for_now_keeps_its_partitions_for_its_next_incarnation() -> None:
    coordinator = GroupCoordinator(CONFIG)
    answers = {i: _beat(coordinator, "", 0, i) for i in ("a", "b")}
    _settle(coordinator, answers)
    a, b = answers["a"], answers["b"]
    assert len(a.assignment) == len(b.assignment) == 2
    epoch_before = coordinator.view("g").group_epoch
    left = _beat(coordinator, a.member_id, LEAVE_STATIC_EPOCH, "a", a.assignment)
    assert left.member_epoch == LEAVE_STATIC_EPOCH
    # The other member is not given a's partitions while a is away.
    assert _beat(coordinator, b.member_id, b.member_epoch, "b", b.assignment) == b
    again = _beat(coordinator, "", 0, "a", now_ms=100)
    assert again.member_id != a.member_id
    assert (again.member_epoch, again.assignment) == (a.member_epoch, a.assignment)
    assert coordinator.view("g").group_epoch == epoch_before  # nobody rebalanced
    assert _beat(coordinator, b.member_id, b.member_epoch, "b", b.assignment) == b
    with pytest.raises(FencedInstanceIdError):
        _beat(coordinator, a.member_id, a.member_epoch, "a", a.assignment)
    view = {m.instance_id: m.member_id for m in coordinator.view("g").members}
    assert view == {"a": again.member_id, "b": b.member_id}


def test_a_live_instance_id_is_not_released_and_an_unknown_one_is_unknown() -> None:
    coordinator = GroupCoordinator(CONFIG)
    _beat(coordinator, "", 0, "a")
    with pytest.raises(UnreleasedInstanceIdError):
        _beat(coordinator, "", 0, "a")
    with pytest.raises(UnknownMemberIdError):
        _beat(coordinator, "someone", 3, "nobody")


def test_a_static_member_away_past_its_session_is_removed() -> None:
    coordinator = GroupCoordinator(CONFIG)
    answers = {i: _beat(coordinator, "", 0, i) for i in ("a", "b")}
    _settle(coordinator, answers)
    a, b = answers["a"], answers["b"]
    _beat(coordinator, a.member_id, LEAVE_STATIC_EPOCH, "a", a.assignment)
    assert coordinator.expire(CONFIG.session_timeout_ms - 1, TOPICS) == []
    _beat(coordinator, b.member_id, b.member_epoch, "b", b.assignment, now_ms=400)
    removed = coordinator.expire(CONFIG.session_timeout_ms, TOPICS)
    assert [r.member_id for r in removed] == [a.member_id]
    answer = _beat(coordinator, b.member_id, b.member_epoch, "b", b.assignment, now_ms=600)
    assert len(answer.assignment) == 4
    # The instance id is free: the next "a" is a new member, and a rebalance.
    fresh = _beat(coordinator, "", 0, "a", now_ms=600)
    assert fresh.assignment == frozenset()


def test_a_permanent_leave_removes_a_static_member_at_once() -> None:
    coordinator = GroupCoordinator(CONFIG)
    a = _beat(coordinator, "", 0, "a")
    _beat(coordinator, a.member_id, -1, "a")
    assert coordinator.view("g").members == ()
    assert _beat(coordinator, "", 0, "a").member_epoch > 0
