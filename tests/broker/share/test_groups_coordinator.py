"""The share coordinator's state machine under random joins, heartbeats, leaves, expiries
and topic changes (Hypothesis): after every step the group's records, applied in order as
the offset store applies them, rebuild exactly the group that produced them, and the
target assignment keeps the assignor's guarantees."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tidelog.broker.share.assignor import sharing
from tidelog.broker.share.groups_coordinator import (
    Changes,
    ShareCoordinator,
    ShareHeartbeatRequest,
)
from tidelog.storage.errors import (
    FencedMemberEpochError,
    GroupMaxSizeReachedError,
    UnknownMemberIdError,
)

pytestmark = pytest.mark.timeout(300)

GROUP = "g"
SESSION_MS = 1_000
MAX_SIZE = 6
MEMBERS = st.sampled_from([f"m{i}" for i in range(8)])
TOPICS = st.frozensets(st.sampled_from(["a", "b"]), min_size=1)


class ShareGroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.coordinator = ShareCoordinator(MAX_SIZE)
        self.now_ms = 0
        self.topics: dict[str, int] = {"a": 2}
        self.epochs: dict[str, int] = {}  # what each member was last told
        self.durable: dict[bytes, bytes] = {}  # the records, as the store would hold them

    def _store(self, changes: Changes) -> None:
        for key, value in changes.items():
            if value is None:
                self.durable.pop(key, None)
            else:
                self.durable[key] = value

    def _beat(self, member: str, epoch: int, topics: frozenset[str] | None) -> None:
        request = ShareHeartbeatRequest(GROUP, member, epoch, topics)
        try:
            answer, changes = self.coordinator.heartbeat(
                request, self.now_ms, self.topics, session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=100,
            )  # fmt: skip
        except (UnknownMemberIdError, FencedMemberEpochError, GroupMaxSizeReachedError):
            self.epochs.pop(member, None)
            return
        self._store(changes)
        if epoch == -1:
            self.epochs.pop(member, None)
        else:
            assert answer.member_epoch > 0
            self.epochs[member] = answer.member_epoch

    @rule(member=MEMBERS, topics=TOPICS)
    def join(self, member: str, topics: frozenset[str]) -> None:
        self._beat(member, 0, topics)

    @rule(member=MEMBERS, topics=st.none() | TOPICS)
    def heartbeat(self, member: str, topics: frozenset[str] | None) -> None:
        if member in self.epochs:
            self._beat(member, self.epochs[member], topics)

    @rule(member=MEMBERS)
    def leave(self, member: str) -> None:
        if member in self.epochs:
            self._beat(member, -1, None)

    @rule(ms=st.integers(0, 2 * SESSION_MS))
    def time_passes(self, ms: int) -> None:
        self.now_ms += ms
        removed, changes = self.coordinator.expire(self.now_ms, self.topics)
        for removal in removed:
            self.epochs.pop(removal.member_id, None)
        for group_changes in changes.values():
            self._store(group_changes)

    @rule(topic=st.sampled_from(["a", "b"]), partitions=st.integers(1, 4))
    def topic_grows_or_appears(self, topic: str, partitions: int) -> None:
        self.topics[topic] = max(self.topics.get(topic, 0), partitions)

    @invariant()
    def records_rebuild_the_group(self) -> None:
        if not self.coordinator.has_group(GROUP):
            assert not self.durable
            return
        view = self.coordinator.view(GROUP)
        fresh = ShareCoordinator(MAX_SIZE)
        assert fresh.load(GROUP, self.durable, 0, SESSION_MS)
        assert fresh.view(GROUP) == view

    @invariant()
    def the_target_shares_every_subscribed_partition(self) -> None:
        if not self.coordinator.has_group(GROUP):
            return
        view = self.coordinator.view(GROUP)
        assert len(view.members) <= MAX_SIZE
        for topic in {t for m in view.members for t in m.subscribed_topics}:
            subscribers = [m for m in view.members if topic in m.subscribed_topics]
            readers = Counter(
                tp.partition for m in subscribers for tp in m.target if tp.topic == topic
            )
            # The partition count the target was made with (the topic may have grown
            # since, until the next heartbeat): every one of its partitions is shared.
            count = len(readers)
            assert set(readers) == set(range(count))
            assert set(readers.values()) <= {sharing(len(subscribers), count)}
        for member in view.members:
            assert all(tp.topic in member.subscribed_topics for tp in member.target)


TestShareGroupMachine = ShareGroupMachine.TestCase
TestShareGroupMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
