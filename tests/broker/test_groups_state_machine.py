"""The coordinator against a model of its clients, as a hypothesis rule-based state machine.

Clients join, heartbeat, lose answers, are slow to give partitions up, change their
subscription, leave, stop heartbeating (the clock moves and sessions expire); topics appear,
grow and go away. After every step:

* no partition is held (assigned or still revoking) by two members of the coordinator;
* every client owns only what the coordinator says its member holds, so no partition is
  ever consumed by two clients at once.

The ``settle`` rule then lets every active client heartbeat like a well-behaved consumer
for a while: the group must converge, every subscribed partition owned by exactly one
client and each client owning exactly its target.

A client here follows the contract ``docs/groups.md`` gives the client library: one
heartbeat in flight; ``owned`` is everything it still holds; it consumes only partitions of
the latest answer (plus those it is still giving up); on ``FENCED_MEMBER_EPOCH`` /
``UNKNOWN_MEMBER_ID``, or once its own session has run out, it drops everything and
rejoins with epoch 0.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidelog.broker.groups.assignor import TopicPartition, partitions_of
from tidelog.broker.groups.coordinator import (
    CoordinatorConfig,
    GroupCoordinator,
    GroupState,
    HeartbeatRequest,
)
from tidelog.storage.errors import FencedMemberEpochError, UnknownMemberIdError

GROUP = "g"
SESSION_MS = 500
REBALANCE_MS = 300  # below the session, so slow revokers get removed, not just expired
CONFIG = CoordinatorConfig(
    heartbeat_interval_ms=50,
    session_timeout_ms=SESSION_MS,
    min_session_timeout_ms=100,
    max_session_timeout_ms=1_000,
)
CLIENTS = [f"c{i}" for i in range(4)]
TOPIC_NAMES = ["a", "b"]
subscriptions = st.frozensets(st.sampled_from(TOPIC_NAMES), min_size=1)


@dataclass
class Client:
    """What one consumer believes."""

    name: str
    active: bool = False  # wants to be a member
    member_id: str = ""
    epoch: int = 0
    owned: frozenset[TopicPartition] = frozenset()
    subscription: frozenset[str] = field(default_factory=lambda: frozenset({"a"}))

    def drop(self) -> None:
        """Lost membership: give up everything, rejoin with epoch 0 and the same id."""
        self.owned = frozenset()
        self.epoch = 0


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        numbers = itertools.count()
        self.coordinator = GroupCoordinator(CONFIG, lambda: f"m{next(numbers)}")
        self.clients = {name: Client(name) for name in CLIENTS}
        self.topics: dict[str, int] = {"a": 3, "b": 2}
        self.now_ms = 0

    # --- helpers ----------------------------------------------------------------------------

    def heartbeat(self, client: Client, *, lose: bool = False, slow: bool = False) -> None:
        """One heartbeat, as the manager runs it: expire the group's overdue members first."""
        self.expire(group_only=True)
        request = HeartbeatRequest(
            GROUP,
            client.member_id,
            client.epoch,
            client.subscription,
            client.owned,
            session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=REBALANCE_MS,
        )
        try:
            answer = self.coordinator.heartbeat(request, self.now_ms, self.topics)
        except (FencedMemberEpochError, UnknownMemberIdError) as exc:
            event(f"heartbeat refused: {exc.code}")
            client.drop()
            return
        if lose:
            return  # the coordinator acted; the client never heard of it
        client.member_id = answer.member_id
        client.epoch = answer.member_epoch
        # Take everything granted; give up what was taken away, unless slow (a long
        # on_revoke): then it keeps consuming those until a later heartbeat.
        kept_revoking = (client.owned - answer.assignment) if slow else frozenset()
        client.owned = answer.assignment | kept_revoking

    def expire(self, *, group_only: bool = False) -> None:
        removed = self.coordinator.expire(self.now_ms, self.topics, GROUP if group_only else None)
        for removal in removed:
            event(f"member removed: {removal.reason} timeout")
        gone = {r.member_id for r in removed}
        for client in self.clients.values():
            if client.member_id in gone:
                # Its own session timer ran out no later than the coordinator's.
                client.drop()

    def active(self) -> list[Client]:
        return [c for c in self.clients.values() if c.active]

    # --- rules ------------------------------------------------------------------------------

    @rule(name=st.sampled_from(CLIENTS), topics=subscriptions)
    def join(self, name: str, topics: frozenset[str]) -> None:
        client = self.clients[name]
        if client.active:
            return
        client.active = True
        client.subscription = topics
        client.epoch = 0
        client.owned = frozenset()
        self.heartbeat(client)

    @rule(name=st.sampled_from(CLIENTS), lose=st.booleans(), slow=st.booleans())
    def heartbeat_rule(self, name: str, lose: bool, slow: bool) -> None:
        client = self.clients[name]
        if client.active:
            self.heartbeat(client, lose=lose, slow=slow)

    @rule(name=st.sampled_from(CLIENTS), topics=subscriptions)
    def resubscribe(self, name: str, topics: frozenset[str]) -> None:
        client = self.clients[name]
        if client.active:
            client.subscription = topics
            self.heartbeat(client)

    @rule(name=st.sampled_from(CLIENTS))
    def leave(self, name: str) -> None:
        client = self.clients[name]
        if not client.active or client.epoch == 0:
            return
        client.owned = frozenset()  # on_revoke runs before the leave heartbeat
        client.epoch = -1
        self.heartbeat(client)
        client.active = False
        client.member_id = ""
        client.epoch = 0

    @rule(ms=st.integers(0, 700))
    def time_passes(self, ms: int) -> None:
        self.now_ms += ms
        self.expire()

    @rule(topic=st.sampled_from(TOPIC_NAMES), partitions=st.integers(0, 5))
    def topic_changes(self, topic: str, partitions: int) -> None:
        if partitions == 0:
            self.topics.pop(topic, None)
        else:
            self.topics[topic] = partitions

    @precondition(lambda self: any(c.active for c in self.clients.values()))
    @rule()
    def settle(self) -> None:
        # Enough rounds for ghosts (members whose join answer was lost) to expire.
        for _ in range(2 * SESSION_MS // 100 + 4):
            self.now_ms += 100
            for client in self.active():
                self.heartbeat(client)
        view = self.coordinator.view(GROUP)
        clients = self.active()
        assert sorted(m.member_id for m in view.members) == sorted(c.member_id for c in clients)
        assert view.state is GroupState.STABLE
        targets = {m.member_id: m.target for m in view.members}
        for client in clients:
            assert client.owned == targets[client.member_id]
        subscribed = {t for c in clients for t in c.subscription if t in self.topics}
        expected = partitions_of({t: self.topics[t] for t in subscribed})
        owned = [tp for c in clients for tp in c.owned]
        assert sorted(owned) == sorted(expected)
        event(f"settled with {len(clients)} member(s)")

    # --- invariants ---------------------------------------------------------------------------

    @invariant()
    def coordinator_never_grants_a_partition_twice(self) -> None:
        seen: set[TopicPartition] = set()
        for member in self.coordinator.view(GROUP).members:
            holds = member.assigned | member.revoking
            assert not member.assigned & member.revoking
            assert seen.isdisjoint(holds), f"{seen & holds} held twice"
            seen |= holds

    @invariant()
    def clients_own_only_what_their_member_holds(self) -> None:
        holds = {m.member_id: m.assigned | m.revoking for m in self.coordinator.view(GROUP).members}
        seen: set[TopicPartition] = set()
        for client in self.clients.values():
            if client.owned:
                assert client.owned <= holds.get(client.member_id, frozenset())
                assert seen.isdisjoint(client.owned), "two clients consume one partition"
                seen |= client.owned


GroupMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestGroupMachine = GroupMachine.TestCase
