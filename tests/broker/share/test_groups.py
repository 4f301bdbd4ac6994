"""Share-group membership (issue #32, step 2): ``ShareGroupManager`` over a real log manager
and offset store in a temporary directory, time driven by a manual clock. No sockets: the
wire APIs come in a later step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.broker.cluster.waiting import eventually
from tidelog.broker.groups.classic_types import ClassicError, JoinRequest
from tidelog.broker.groups.coordinator import HeartbeatRequest
from tidelog.broker.groups.manager import GroupManager, OffsetCommitEntry
from tidelog.broker.share.groups import ShareGroupManager, TypedGroupListing, list_all_groups
from tidelog.broker.share.groups_config import ShareGroupConfig
from tidelog.broker.share.groups_coordinator import (
    ShareGroupState,
    ShareHeartbeatAnswer,
    ShareHeartbeatRequest,
)
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import (
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    GroupNotEmptyError,
    InvalidConfigError,
    InvalidRequestError,
    UnknownMemberIdError,
)
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.types import TopicPartition

pytestmark = pytest.mark.timeout(60)

GROUP = "workers"
TOPIC = "jobs"
SESSION_MS = 45_000
JOBS = frozenset({TOPIC})


class Broker:
    """One broker's logs, consumer groups and share groups over a data directory."""

    def __init__(self, path: Path, clock: ManualClock, config: ShareGroupConfig) -> None:
        self.logs = LogManager.open(path, LogManagerConfig(cleaner_enabled=False), clock)
        self.groups = GroupManager.open(self.logs, clock)
        self.shares = ShareGroupManager.open(self.logs, clock, self.groups, config)

    def close(self) -> None:
        self.shares.close()
        self.groups.close()
        self.logs.close()

    def beat(
        self,
        member_id: str,
        epoch: int,
        topics: frozenset[str] | None = None,
        group_id: str = GROUP,
    ) -> ShareHeartbeatAnswer:
        if epoch == 0 and topics is None:
            topics = JOBS
        return self.shares.heartbeat(
            ShareHeartbeatRequest(group_id, member_id, epoch, topics, client_id=f"c-{member_id}")
        )


@contextmanager
def broker(
    path: Path, clock: ManualClock, config: ShareGroupConfig | None = None
) -> Iterator[Broker]:
    running = Broker(path, clock, config or ShareGroupConfig())
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _join_all(b: Broker, members: list[str]) -> dict[str, ShareHeartbeatAnswer]:
    """Join every member, then heartbeat each once more so all hold the latest target."""
    answers = {m: b.beat(m, 0) for m in members}
    return {m: b.beat(m, answers[m].member_epoch) for m in members}


def test_more_members_than_partitions_all_fetch_and_every_partition_is_read(
    tmp_path: Path, clock: ManualClock
) -> None:
    with broker(tmp_path, clock) as b:
        b.logs.create_topic(TOPIC, 2)
        members = [f"m{i}" for i in range(4)]
        answers = _join_all(b, members)
        epochs = {a.member_epoch for a in answers.values()}
        assert epochs == {4}  # four joins, four group epochs
        assert all(len(a.assignment) == 1 for a in answers.values())
        readers = Counter(tp for a in answers.values() for tp in a.assignment)
        assert readers == {TopicPartition(TOPIC, 0): 2, TopicPartition(TOPIC, 1): 2}
        view = b.shares.describe_group(GROUP)
        assert view.state is ShareGroupState.STABLE
        assert (view.group_epoch, view.assignment_epoch, view.assignor_name) == (4, 4, "simple")
        assert [m.member_id for m in view.members] == members
        for member in view.members:
            assert member.assignment == member.target == answers[member.member_id].assignment
            assert member.subscribed_topics == JOBS
            assert member.client_id == f"c-{member.member_id}"


def test_a_member_gets_its_whole_target_at_its_next_heartbeat(
    tmp_path: Path, clock: ManualClock
) -> None:
    with broker(tmp_path, clock) as b:
        b.logs.create_topic(TOPIC, 2)
        first = b.beat("a", 0)
        assert (first.member_epoch, first.assignment_changed) == (1, True)
        assert first.assignment == {TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)}
        second = b.beat("b", 0)
        assert (second.member_epoch, len(second.assignment)) == (2, 1)
        # "a" still has both until it heartbeats: then it gets its target at once, no
        # revocation round (a partition is shared, nobody waits for anybody).
        assert b.shares.describe_group(GROUP).members[0].assignment == first.assignment
        caught_up = b.beat("a", 1)
        assert (caught_up.member_epoch, caught_up.assignment_changed) == (2, True)
        assert caught_up.assignment == first.assignment - second.assignment
        steady = b.beat("a", 2)
        assert (steady.member_epoch, steady.assignment_changed) == (2, False)
        assert steady.heartbeat_interval_ms == 5_000


def test_fencing_and_unknown_members(tmp_path: Path, clock: ManualClock) -> None:
    with broker(tmp_path, clock) as b:
        b.logs.create_topic(TOPIC, 2)
        b.beat("a", 0)
        b.beat("b", 0)
        b.beat("a", 1)  # a: epoch 2, previous 1
        b.beat("c", 0)
        assert b.beat("a", 2).member_epoch == 3  # a: epoch 3, previous 2
        # Its previous epoch is a lost answer: accepted, the answer sent again.
        again = b.beat("a", 2)
        assert (again.member_epoch, again.assignment_changed) == (3, True)
        with pytest.raises(FencedMemberEpochError):
            b.beat("a", 4)  # ahead of the coordinator
        with pytest.raises(FencedMemberEpochError):
            b.beat("a", 1)  # neither its epoch nor its previous one
        with pytest.raises(UnknownMemberIdError):
            b.beat("nobody", 3)
        with pytest.raises(GroupIdNotFoundError, match="not found"):
            b.beat("a", 1, group_id="no-such-group")
        # A fenced member rejoins under its own id with epoch 0 and carries on.
        rejoined = b.beat("a", 0)
        assert (rejoined.member_epoch, rejoined.assignment_changed) == (3, True)
        assert len(b.shares.describe_group(GROUP).members) == 3


def test_requests_that_make_no_sense_are_refused(tmp_path: Path, clock: ManualClock) -> None:
    with broker(tmp_path, clock) as b:
        with pytest.raises(InvalidRequestError, match="MemberId"):
            b.beat("", 0)
        with pytest.raises(InvalidRequestError, match="SubscribedTopicNames"):
            b.beat("a", 0, frozenset())
        with pytest.raises(InvalidRequestError, match="member_epoch"):
            b.beat("a", -2)
        with pytest.raises(InvalidRequestError):
            b.shares.heartbeat(ShareHeartbeatRequest("", "a", 0, JOBS))
        assert b.shares.list_groups() == []


def test_leaving_gives_the_partitions_to_the_others_and_an_emptied_group_stays(
    tmp_path: Path, clock: ManualClock
) -> None:
    with broker(tmp_path, clock) as b:
        b.logs.create_topic(TOPIC, 2)
        _join_all(b, ["a", "b", "c", "d"])
        left = b.beat("a", -1)
        assert (left.member_epoch, left.assignment) == (-1, frozenset())
        with pytest.raises(UnknownMemberIdError):
            b.beat("a", -1)
        answers = {m: b.beat(m, 4) for m in ("b", "c", "d")}
        assert {a.member_epoch for a in answers.values()} == {5}
        readers = Counter(tp for a in answers.values() for tp in a.assignment)
        assert readers == {TopicPartition(TOPIC, 0): 2, TopicPartition(TOPIC, 1): 2}
        for member in ("b", "c", "d"):
            b.beat(member, -1)
        view = b.shares.describe_group(GROUP)
        assert (view.state, view.members, view.group_epoch) == (ShareGroupState.EMPTY, (), 8)
        assert [(g.group_id, g.state, g.members) for g in b.shares.list_groups()] == [
            (GROUP, "Empty", 0)
        ]


def test_members_whose_session_ends_are_removed(tmp_path: Path, clock: ManualClock) -> None:
    with broker(tmp_path, clock) as b:
        b.logs.create_topic(TOPIC, 2)
        _join_all(b, ["a", "b", "c"])
        clock.advance(SESSION_MS - 1)
        assert b.beat("a", 3).member_epoch == 3  # a's session starts again
        assert b.shares.expire() == []
        clock.advance(1)
        removed = b.shares.expire()
        assert sorted(r.member_id for r in removed) == ["b", "c"]
        survivor = b.beat("a", 3)
        assert survivor.member_epoch == 5
        assert survivor.assignment == {TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)}
        # A heartbeat expires its own group's overdue members first, without the timer.
        b.beat("d", 0)
        clock.advance(SESSION_MS)
        answer = b.beat("d", 0)  # rejoining: d is known, a's session has ended
        assert [m.member_id for m in b.shares.describe_group(GROUP).members] == ["d"]
        assert len(answer.assignment) == 2
        with pytest.raises(UnknownMemberIdError):
            b.beat("a", survivor.member_epoch)


def test_the_timer_removes_members_whose_session_ended(tmp_path: Path, clock: ManualClock) -> None:
    with broker(tmp_path, clock) as b:
        b.logs.create_topic(TOPIC, 1)
        b.beat("a", 0)
        b.shares.start()
        clock.advance(SESSION_MS)
        eventually(lambda: not b.shares.describe_group(GROUP).members, timeout_s=10)
        assert b.shares.describe_group(GROUP).group_epoch == 2


def test_the_group_size_is_bounded(tmp_path: Path, clock: ManualClock) -> None:
    with broker(tmp_path, clock, ShareGroupConfig(max_size=3)) as b:
        b.logs.create_topic(TOPIC, 1)
        _join_all(b, ["a", "b", "c"])
        with pytest.raises(GroupMaxSizeReachedError):
            b.beat("d", 0)
        assert b.beat("a", 0).member_epoch == 3  # a known member may rejoin
        b.beat("c", -1)
        assert b.beat("d", 0).member_epoch == 5


def test_partitions_and_topics_that_appear_later_are_assigned(
    tmp_path: Path, clock: ManualClock
) -> None:
    with broker(tmp_path, clock) as b:
        answer = b.beat("a", 0, frozenset({TOPIC, "later"}))
        assert (answer.member_epoch, answer.assignment) == (1, frozenset())
        b.logs.create_topic(TOPIC, 1)
        answer = b.beat("a", 1)
        assert (answer.member_epoch, answer.assignment) == (2, {TopicPartition(TOPIC, 0)})
        b.logs.create_partitions(TOPIC, 3)
        b.logs.create_topic("later", 1)
        answer = b.beat("a", 2)
        assert answer.member_epoch == 3
        assert answer.assignment == {
            *(TopicPartition(TOPIC, p) for p in range(3)),
            TopicPartition("later", 0),
        }
        answer = b.beat("a", 3, frozenset({"later"}))  # a new subscription
        assert (answer.member_epoch, answer.assignment) == (4, {TopicPartition("later", 0)})


def test_a_restart_reloads_every_group_as_it_was(tmp_path: Path, clock: ManualClock) -> None:
    with broker(tmp_path, clock) as b:
        b.logs.create_topic(TOPIC, 2)
        b.logs.create_topic("other", 3)
        _join_all(b, [f"m{i}" for i in range(5)])
        b.beat("m2", -1)
        assert b.beat("m0", 5).member_epoch == 6  # caught up; the others are still at 5
        b.beat("x", 0, frozenset({"other"}), group_id="second")
        b.beat("y", 0, frozenset({"other"}), group_id="emptied")
        b.beat("y", -1, group_id="emptied")
        before = {g: b.shares.describe_group(g) for g in (GROUP, "second", "emptied")}
    clock.advance(10 * SESSION_MS)  # a restart takes a while: sessions start again
    with broker(tmp_path, clock) as b:
        after = {g: b.shares.describe_group(g) for g in (GROUP, "second", "emptied")}
        assert after == before
        # The members carry on where they were, without rejoining.
        assert b.beat("m1", 5).member_epoch == 6
        assert b.beat("m0", 6).assignment_changed is False
        assert b.shares.expire() == []


def test_consumer_groups_and_share_groups_never_share_an_id(
    tmp_path: Path, clock: ManualClock
) -> None:
    with broker(tmp_path, clock) as b:
        b.logs.create_topic(TOPIC, 2)
        b.groups.heartbeat(HeartbeatRequest("kip848", "c1", 0, JOBS, frozenset()))
        b.groups.commit_offsets(
            "offsets-only", "", -1, [OffsetCommitEntry(TopicPartition(TOPIC, 0), 5)]
        )
        for taken in ("kip848", "offsets-only"):
            with pytest.raises(GroupIdNotFoundError, match=f"Group {taken} is not a share group"):
                b.beat("s1", 0, group_id=taken)
        b.beat("s1", 0)
        with pytest.raises(GroupIdNotFoundError, match=f"Group {GROUP} is not a consumer group"):
            b.groups.heartbeat(HeartbeatRequest(GROUP, "c1", 0, JOBS, frozenset()))
        joined = b.groups.classic.join(_classic_join(GROUP)).result(timeout=5)
        assert joined.error is ClassicError.INCONSISTENT_GROUP_PROTOCOL
        kip848 = b.groups.describe_consumer_group("kip848").state.value
        assert list_all_groups(b.groups, b.shares) == [
            TypedGroupListing("kip848", "consumer", kip848, 1),
            TypedGroupListing("offsets-only", "consumer", "Empty", 0),
            TypedGroupListing(GROUP, "share", "Stable", 1),
        ]
    # The share group's id stays taken after a restart.
    with broker(tmp_path, clock) as b, pytest.raises(GroupIdNotFoundError, match="consumer"):
        b.groups.heartbeat(HeartbeatRequest(GROUP, "c1", 0, JOBS, frozenset()))


def _classic_join(group_id: str) -> JoinRequest:
    return JoinRequest(
        group_id=group_id,
        member_id="",
        group_instance_id=None,
        client_id="classic",
        client_host="h",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        protocols=(("range", b""),),
        require_known_member_id=False,
    )


def test_group_configs_are_validated_stored_and_obeyed(tmp_path: Path, clock: ManualClock) -> None:
    with broker(tmp_path, clock) as b:
        b.logs.create_topic(TOPIC, 1)
        b.shares.alter_group_configs(
            GROUP,
            {
                "share.auto.offset.reset": "earliest",
                "share.isolation.level": "read_committed",
                "share.heartbeat.interval.ms": "7000",
                "share.session.timeout.ms": "50000",
                "errors.deadletterqueue.topic.name": "jobs-dlq",
            },
        )
        for bad in (
            {"share.auto.offset.reset": "sometimes"},
            {"share.auto.offset.reset": "by_duration:-PT1H"},
            {"share.isolation.level": "read_most"},
            {"share.session.timeout.ms": "1000"},  # below group.share.min.session.timeout.ms
            {"share.heartbeat.interval.ms": "16000"},
            {"errors.deadletterqueue.topic.name": "no/slashes"},
            {"errors.deadletterqueue.topic.name": "__consumer_offsets"},  # internal
            {"no.such.config": "1"},
        ):
            with pytest.raises(InvalidConfigError):
                b.shares.alter_group_configs(GROUP, bad)
        b.shares.alter_group_configs(GROUP, {"share.auto.offset.reset": "by_duration:P1DT2H"})
        answer = b.beat("a", 0)
        assert answer.heartbeat_interval_ms == 7_000
        clock.advance(49_999)
        assert b.shares.expire() == []
        clock.advance(1)
        assert [r.member_id for r in b.shares.expire()] == ["a"]
    with broker(tmp_path, clock) as b:
        settings = b.shares.settings(GROUP)
        assert settings.auto_offset_reset == "by_duration:p1dt2h"
        assert settings.isolation_level == "read_committed"
        assert settings.dead_letter_topic == "jobs-dlq"
        assert (settings.session_timeout_ms, settings.heartbeat_interval_ms) == (50_000, 7_000)
        b.shares.alter_group_configs(GROUP, {"share.isolation.level": None})
        assert "share.isolation.level" not in b.shares.group_configs(GROUP)
        assert b.shares.settings(GROUP).isolation_level == "read_uncommitted"
        assert b.shares.settings("untouched").auto_offset_reset == "latest"


def test_deleting_a_group_frees_its_id(tmp_path: Path, clock: ManualClock) -> None:
    with broker(tmp_path, clock) as b:
        b.logs.create_topic(TOPIC, 1)
        b.beat("a", 0)
        b.shares.alter_group_configs(GROUP, {"share.auto.offset.reset": "earliest"})
        with pytest.raises(GroupNotEmptyError):
            b.shares.delete_group(GROUP)
        b.beat("a", -1)
        gone = b.shares.delete_group(GROUP)
        assert (gone.state, gone.group_epoch) == (ShareGroupState.DEAD, 2)
        with pytest.raises(GroupIdNotFoundError):
            b.shares.describe_group(GROUP)
        with pytest.raises(GroupIdNotFoundError):
            b.shares.delete_group(GROUP)
        assert b.shares.group_configs(GROUP) == {}
    with broker(tmp_path, clock) as b:
        assert b.shares.list_groups() == []
        assert b.groups.store.records_of(GROUP) == {}
        answer = b.groups.heartbeat(HeartbeatRequest(GROUP, "c1", 0, JOBS, frozenset()))
        assert answer.member_epoch == 1  # a consumer group may take the id now
