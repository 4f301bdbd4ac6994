"""The pure membership engine (``client.group_member``), without a broker.

Example tests walk through the protocol's steps; a hypothesis state machine drives the
engine with arbitrary answers, fencing, failures, slow and out-of-order revocations and
subscription changes, against a model of what the application holds, and checks the
rules the broker relies on: a partition is never reported released before the
application finished revoking it, the callbacks alternate per partition, one heartbeat is
in flight at most, and with a steady answer the member converges on it.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidelog.client.group_member import (
    GroupMembership,
    HeartbeatAnswer,
    HeartbeatRequest,
    MemberEvent,
    MemberState,
)
from tidelog.client.types import TopicPartition

T0, T1, T2, T3 = (TopicPartition("t", p) for p in range(4))
SESSION_MS = 1_000


def member(now_ms: int = 0, max_poll_interval_ms: int | None = None) -> GroupMembership:
    return GroupMembership(
        ["t"],
        session_timeout_ms=SESSION_MS,
        retry_backoff_ms=50,
        now_ms=now_ms,
        max_poll_interval_ms=max_poll_interval_ms,
    )


def answer(epoch: int, *tps: TopicPartition, interval_ms: int = 100) -> HeartbeatAnswer:
    return HeartbeatAnswer("m1", epoch, interval_ms, frozenset(tps))


def test_join_assign_then_heartbeat_at_the_brokers_interval() -> None:
    m = member()
    request = m.start_heartbeat(0)
    assert request is not None
    assert (request.member_id, request.member_epoch, request.owned) == ("", 0, ())
    assert request.subscription == ("t",)
    assert m.start_heartbeat(0) is None  # one in flight at most
    events = m.on_answer(answer(1, T0, T1, interval_ms=250), 10)
    assert events == [MemberEvent("assign", (T0, T1), 0)]
    assert m.next_heartbeat_ms() == 260
    assert m.start_heartbeat(259) is None
    request = m.start_heartbeat(260)
    assert request is not None
    assert (request.member_id, request.member_epoch, request.owned) == ("m1", 1, (T0, T1))


def test_revoked_partitions_are_reported_until_the_application_is_done() -> None:
    m = member()
    m.start_heartbeat(0)
    m.on_answer(answer(1, T0, T1, T2, T3), 0)
    m.start_heartbeat(100)
    events = m.on_answer(answer(1, T0, T1), 100)
    assert events == [MemberEvent("revoke", (T2, T3), 0)]
    # Heartbeats go on meanwhile, still listing T2 and T3, and revoke nothing twice.
    request = m.start_heartbeat(200)
    assert request is not None
    assert request.owned == (T0, T1, T2, T3)
    assert m.on_answer(answer(1, T0, T1), 200) == []
    m.revocation_done([T2, T3], 0, 250)
    assert m.next_heartbeat_ms() == 250  # at once, not at the interval
    request = m.start_heartbeat(250)
    assert request is not None
    assert request.owned == (T0, T1)


def test_a_revocation_done_while_a_heartbeat_is_in_flight_sends_the_next_at_once() -> None:
    m = member()
    m.start_heartbeat(0)
    m.on_answer(answer(1, T0, T1), 0)
    m.start_heartbeat(100)
    revoke = m.on_answer(answer(1, T0), 100)
    m.start_heartbeat(200)  # in flight, still owns T1
    m.revocation_done([T1], revoke[0].generation, 210)
    assert m.next_heartbeat_ms() is None  # in flight
    m.on_answer(answer(1, T0), 220)
    assert m.next_heartbeat_ms() == 220


def test_a_partition_revoked_and_granted_again_is_revoked_then_assigned() -> None:
    m = member()
    m.start_heartbeat(0)
    m.on_answer(answer(1, T0, T1), 0)
    m.start_heartbeat(100)
    assert m.on_answer(answer(1, T0), 100) == [MemberEvent("revoke", (T1,), 0)]
    m.start_heartbeat(200)
    assert m.on_answer(answer(2, T0, T1), 200) == []  # still being revoked
    m.revocation_done([T1], 0, 210)
    m.start_heartbeat(210)
    assert m.on_answer(answer(2, T0, T1), 220) == [MemberEvent("assign", (T1,), 0)]


def test_fencing_loses_everything_and_rejoins_with_the_same_id() -> None:
    m = member()
    m.start_heartbeat(0)
    m.on_answer(answer(1, T0, T1), 0)
    m.start_heartbeat(100)
    revoke = m.on_answer(answer(1, T0), 100)
    m.start_heartbeat(200)
    assert m.on_fenced(210) == [MemberEvent("lose", (T0, T1), 0)]
    m.revocation_done([T1], revoke[0].generation, 220)  # too late: ignored
    request = m.start_heartbeat(220)
    assert request is not None
    assert (request.member_id, request.member_epoch, request.owned) == ("m1", 0, ())
    assert m.on_answer(answer(3, T1), 230) == [MemberEvent("assign", (T1,), 1)]


def test_no_answer_for_the_session_timeout_loses_the_partitions() -> None:
    m = member()
    m.start_heartbeat(0)
    m.on_answer(answer(1, T0), 0)
    now = 100
    lost: list[MemberEvent] = []
    while now < 3 * SESSION_MS:
        due = m.next_heartbeat_ms()
        assert due is not None
        now = max(now, due)
        assert m.start_heartbeat(now) is not None
        events = m.on_failure(now)
        if events:
            lost.append(events[0])
            break
    assert lost == [MemberEvent("lose", (T0,), 0)]
    assert SESSION_MS <= now < SESSION_MS + 1_100  # backoff is capped at 1 s
    request = m.start_heartbeat(m.next_heartbeat_ms() or 0)
    assert request is not None
    assert request.member_epoch == 0


def test_failures_back_off_exponentially_up_to_a_second() -> None:
    m = member()
    gaps = []
    now = 0
    for _ in range(8):
        assert m.start_heartbeat(now) is not None
        m.on_failure(now)
        due = m.next_heartbeat_ms()
        assert due is not None
        gaps.append(due - now)
        now = due
    assert gaps == [50, 100, 200, 400, 800, 1000, 1000, 1000]


def test_leaving_sends_epoch_minus_one_once() -> None:
    m = member()
    m.start_heartbeat(0)
    m.on_answer(answer(1, T0), 0)
    m.leave(50)
    request = m.start_heartbeat(50)
    assert request is not None
    assert (request.member_id, request.member_epoch, request.owned) == ("m1", -1, ())
    assert m.on_answer(HeartbeatAnswer("m1", -1, 0, frozenset()), 60) == []
    assert m.state is MemberState.LEFT
    assert m.next_heartbeat_ms() is None


def test_leaving_while_the_join_is_in_flight_leaves_as_the_new_member() -> None:
    m = member()
    m.start_heartbeat(0)
    m.leave(5)
    assert m.on_answer(answer(1, T0), 10) == []  # granted nothing: leaving
    request = m.start_heartbeat(10)
    assert request is not None
    assert (request.member_id, request.member_epoch) == ("m1", -1)


def test_a_member_that_never_joined_has_nothing_to_leave() -> None:
    m = member()
    m.leave(0)
    assert m.state is MemberState.LEFT
    assert m.start_heartbeat(0) is None


def test_a_subscription_change_heartbeats_at_once() -> None:
    m = member()
    m.start_heartbeat(0)
    m.on_answer(answer(1, T0), 0)
    m.set_subscription(["t", "u"], 30)
    request = m.start_heartbeat(30)
    assert request is not None
    assert request.subscription == ("t", "u")


def test_a_member_whose_application_stops_polling_leaves_and_rejoins_when_it_polls() -> None:
    m = member(max_poll_interval_ms=1_000)
    m.start_heartbeat(0)
    m.on_answer(answer(1, T0, T1, interval_ms=300), 0)
    m.polled(400)
    assert m.next_wakeup_ms() == 300  # the next heartbeat
    m.start_heartbeat(300)
    m.on_answer(answer(1, T0, T1, interval_ms=3_000), 300)
    assert m.next_wakeup_ms() == 1_400  # the poll deadline comes first
    assert m.check_poll_interval(1_399) == []
    assert m.check_poll_interval(1_400) == [MemberEvent("lose", (T0, T1), 0)]
    request = m.start_heartbeat(1_400)
    assert request is not None
    assert (request.member_id, request.member_epoch, request.owned) == ("m1", -1, ())
    m.on_answer(HeartbeatAnswer("m1", -1, 0, frozenset()), 1_410)
    assert m.state is MemberState.IDLE
    assert m.next_wakeup_ms() is None  # nothing to do until the application polls
    m.polled(5_000)
    request = m.start_heartbeat(5_000)
    assert request is not None
    assert (request.member_id, request.member_epoch, request.owned) == ("m1", 0, ())
    assert m.on_answer(answer(4, T1), 5_010) == [MemberEvent("assign", (T1,), 1)]


def test_a_poll_while_the_leave_is_in_flight_rejoins_once_it_is_answered() -> None:
    m = member(max_poll_interval_ms=1_000)
    m.start_heartbeat(0)
    m.on_answer(answer(1, T0, interval_ms=5_000), 0)
    assert m.check_poll_interval(1_000) == [MemberEvent("lose", (T0,), 0)]
    m.start_heartbeat(1_000)
    m.polled(1_005)
    m.on_answer(HeartbeatAnswer("m1", -1, 0, frozenset()), 1_010)
    request = m.start_heartbeat(1_010)
    assert request is not None
    assert (request.member_id, request.member_epoch) == ("m1", 0)


def test_closing_a_member_that_left_for_not_polling_sends_nothing() -> None:
    m = member(max_poll_interval_ms=1_000)
    m.start_heartbeat(0)
    m.on_answer(answer(1, T0), 0)
    m.check_poll_interval(1_000)
    m.start_heartbeat(1_000)
    m.on_answer(HeartbeatAnswer("m1", -1, 0, frozenset()), 1_010)
    m.leave(1_020)
    assert m.state is MemberState.LEFT
    assert m.start_heartbeat(1_020) is None


UNIVERSE = [TopicPartition(topic, p) for topic in ("a", "b") for p in range(3)]


class MembershipMachine(RuleBasedStateMachine):
    """The engine against a model of the application and of what the broker was told."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.m = member(max_poll_interval_ms=3_000)
        self.last_request: HeartbeatRequest | None = None
        self.app_held: set[TopicPartition] = set()  # after running every event so far
        self.pending: list[MemberEvent] = []  # revocations the application has not finished
        self.epoch = 0

    def _run(self, events: list[MemberEvent]) -> None:
        for event in events:
            parts = set(event.partitions)
            assert parts
            assert event.partitions == tuple(sorted(parts))
            if event.kind == "assign":
                assert not parts & self.app_held, "assigned a partition already held"
                self.app_held |= parts
            elif event.kind == "revoke":
                assert parts <= self.app_held, "revoked a partition not held"
                self.pending.append(event)
            else:
                assert event.kind == "lose"
                assert parts <= self.app_held
                self.app_held -= parts
                self.pending = []  # their revocations are moot

    @rule(ms=st.integers(0, 2_000))
    def advance(self, ms: int) -> None:
        self.now += ms

    def _send(self) -> bool:
        due = self.m.next_heartbeat_ms()
        if due is None:
            return self.m.in_flight
        self.now = max(self.now, due)
        request = self.m.start_heartbeat(self.now)
        assert request is not None
        self.last_request = request
        assert self.m.start_heartbeat(self.now) is None  # one in flight at most
        # Never reported released while the application still revokes it.
        being_revoked = {tp for e in self.pending for tp in e.partitions}
        assert being_revoked <= set(request.owned)
        assert self.app_held <= set(request.owned)
        return True

    @rule(assignment=st.frozensets(st.sampled_from(UNIVERSE)))
    def answered(self, assignment: frozenset[TopicPartition]) -> None:
        if self._send():
            self._answer(assignment)

    def _answer(self, assignment: frozenset[TopicPartition]) -> None:
        assert self.last_request is not None
        if self.last_request.member_epoch == -1:  # the broker answers a leave so
            events = self.m.on_answer(HeartbeatAnswer("m1", -1, 0, frozenset()), self.now)
            assert events == []
            return
        self.epoch += 1
        self._run(self.m.on_answer(answer(self.epoch, *assignment), self.now))

    @rule()
    def app_polls(self) -> None:
        self.m.polled(self.now)

    @rule()
    def poll_interval_checked(self) -> None:
        self._run(self.m.check_poll_interval(self.now))

    @rule()
    def fenced(self) -> None:
        if self._send():
            self._run(self.m.on_fenced(self.now))

    @rule()
    def failed(self) -> None:
        if self._send():
            self._run(self.m.on_failure(self.now))

    @precondition(lambda self: self.pending)
    @rule(index=st.integers(0, 10))
    def finish_revocation(self, index: int) -> None:
        event = self.pending.pop(index % len(self.pending))
        self.app_held -= set(event.partitions)
        self.m.revocation_done(event.partitions, event.generation, self.now)
        due = self.m.next_heartbeat_ms()
        assert self.m.in_flight or (due is not None and due <= self.now)

    @rule(topics=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, unique=True))
    def resubscribe(self, topics: list[str]) -> None:
        self.m.set_subscription(topics, self.now)

    @rule(assignment=st.frozensets(st.sampled_from(UNIVERSE)))
    def converges(self, assignment: frozenset[TopicPartition]) -> None:
        """With the same answer every time and revocations finished, owned == answer."""
        self.app_polls()
        for _ in range(4):
            if self._send():
                self._answer(assignment)
            while self.pending:
                self.finish_revocation(0)
        assert self.m.owned == set(assignment) == self.app_held
        assert not self.m.revoking

    @invariant()
    def revoking_is_owned(self) -> None:
        assert self.m.revoking <= self.m.owned
        assert {tp for e in self.pending for tp in e.partitions} == self.m.revoking
        assert self.app_held <= self.m.owned


MembershipMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestMembership = MembershipMachine.TestCase
