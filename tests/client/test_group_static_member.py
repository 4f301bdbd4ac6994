"""Tidelog's own consumer as a static member (``group_instance_id``, KIP-345 over the
KIP-848 heartbeat): closing leaves for now (epoch -2), and a consumer started again with
the same instance id within the session gets its partitions back while the others keep
theirs and run no callback; a second live consumer with the same id fences the first.
Members are driven from the test's thread, polling in turn."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from tests.client.groups import GROUP_SETTINGS, member, poll_until, produce
from tidelog.broker.groups.coordinator import HeartbeatRequest
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, TopicPartition
from tidelog.client.cli import main
from tidelog.client.config import ConsumerConfig
from tidelog.client.group_member import (
    LEAVE_STATIC_EPOCH,
    GroupMembership,
    HeartbeatAnswer,
    MemberState,
)
from tidelog.client.types import ConsumerRecord
from tidelog.storage.errors import FencedInstanceIdError

pytestmark = pytest.mark.timeout(120)

SESSION_MS = 6_000  # a restart fits in it on a loaded machine
SETTINGS = {**GROUP_SETTINGS, "group.consumer.session.timeout.ms": SESSION_MS}


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings=SETTINGS) as running:
        yield running


Events = list[tuple[str, tuple[int, ...]]]


def _static(broker: InProcessBroker, group: str, instance_id: str, events: Events) -> Consumer:
    consumer = member(
        broker.address, group, group_instance_id=instance_id, session_timeout_ms=SESSION_MS
    )

    def record(kind: str) -> Callable[[list[TopicPartition]], None]:
        return lambda tps: events.append((kind, tuple(tp.partition for tp in tps)))

    consumer.subscribe(
        "static", on_assign=record("assign"), on_revoke=record("revoke"), on_lost=record("lost")
    )
    return consumer


def _held(events: Events) -> set[int]:
    held: set[int] = set()
    for kind, partitions in events:
        if kind == "assign":
            held |= set(partitions)
        else:
            held -= set(partitions)
    return held


def test_a_restarted_static_consumer_gets_its_partitions_back(
    broker: InProcessBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    with AdminClient(broker.address) as admin:
        if "static" not in {t.name for t in admin.list_topics()}:
            admin.create_topic("static", 6)
    events: dict[str, Events] = {name: [] for name in ("a", "b", "c")}
    consumers = {name: _static(broker, "g-restart", name, events[name]) for name in events}
    seen: list[ConsumerRecord] = []
    poll_until(
        list(consumers.values()),
        lambda: all(len(_held(e)) == 2 for e in events.values()),
        sink=seen,
    )
    before = {name: list(e) for name, e in events.items()}
    held_by_c = _held(events["c"])
    consumers["c"].close()
    time.sleep(1.0)  # away for ten heartbeats of the others
    again: Events = []
    consumers["c"] = _static(broker, "g-restart", "c", again)
    others = [consumers["a"], consumers["b"]]
    poll_until([*others, consumers["c"]], lambda: bool(_held(again)), sink=seen)
    assert _held(again) == held_by_c
    produce(broker.address, "static", 6, 3)
    poll_until([*others, consumers["c"]], lambda: len(seen) >= 18, sink=seen)
    assert events["a"] == before["a"]
    assert events["b"] == before["b"]
    described = broker.server.core.describe_group("g-restart")
    assert sorted(m.instance_id or "" for m in described.members) == ["a", "b", "c"]
    with AdminClient(broker.address) as admin:
        shown = admin.describe_group("g-restart")
    assert sorted(m.instance_id or "" for m in shown.members) == ["a", "b", "c"]
    assert main(["groups", "describe", "g-restart", "--bootstrap", broker.address]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert rows[1][:3] == ["MEMBER", "INSTANCE", "CLIENT"]
    assert sorted(row[1] for row in rows[2:5]) == ["a", "b", "c"]
    for consumer in consumers.values():
        consumer.close()


def test_a_second_consumer_with_a_live_instance_id_takes_over_once_the_first_closes(
    broker: InProcessBroker,
) -> None:
    with AdminClient(broker.address) as admin:
        if "static" not in {t.name for t in admin.list_topics()}:
            admin.create_topic("static", 6)
    first_events: Events = []
    first = _static(broker, "g-fence", "dup", first_events)
    poll_until([first], lambda: len(_held(first_events)) == 6)
    first.poll(timeout_ms=0)
    # While the first is live the second's join is refused (UNRELEASED_INSTANCE_ID) and
    # retried; closing the first (for now: epoch -2) hands the instance over.
    second_events: Events = []
    second = _static(broker, "g-fence", "dup", second_events)
    first.close()
    poll_until([second], lambda: len(_held(second_events)) == 6)
    second.close()


def test_a_replaced_incarnation_is_fenced_for_good() -> None:
    membership = GroupMembership(
        ["t"], session_timeout_ms=1_000, retry_backoff_ms=50, now_ms=0, instance_id="i"
    )
    request = membership.start_heartbeat(0)
    assert request is not None
    assert request.instance_id == "i"
    events = membership.on_answer(
        HeartbeatAnswer("m", 1, 100, frozenset({TopicPartition("t", 0)})), 0
    )
    assert [e.kind for e in events] == ["assign"]
    lost = membership.on_instance_fenced(10)
    assert [e.kind for e in lost] == ["lose"]
    assert membership.state is MemberState.LEFT
    assert membership.start_heartbeat(1_000) is None


def test_closing_a_static_member_leaves_for_now() -> None:
    membership = GroupMembership(
        ["t"], session_timeout_ms=1_000, retry_backoff_ms=50, now_ms=0, instance_id="i"
    )
    membership.start_heartbeat(0)
    membership.on_answer(HeartbeatAnswer("m", 1, 100, frozenset()), 0)
    membership.leave(5)
    request = membership.start_heartbeat(5)
    assert request is not None
    assert (request.member_epoch, request.instance_id) == (LEAVE_STATIC_EPOCH, "i")
    membership.on_answer(HeartbeatAnswer("m", LEAVE_STATIC_EPOCH, 100, frozenset()), 6)
    assert membership.state is MemberState.LEFT
    # Leaving for not polling stays a leave for good (-1): a stuck application's
    # partitions must go to the others.
    polled = GroupMembership(
        ["t"],
        session_timeout_ms=1_000,
        retry_backoff_ms=50,
        now_ms=0,
        instance_id="i",
        max_poll_interval_ms=100,
    )
    polled.start_heartbeat(0)
    polled.on_answer(HeartbeatAnswer("m", 1, 100, frozenset()), 0)
    polled.check_poll_interval(200)
    request = polled.start_heartbeat(200)
    assert request is not None
    assert request.member_epoch == -1


def test_fenced_instance_surfaces_from_poll(broker: InProcessBroker) -> None:
    """The broker fences an incarnation whose instance id was taken over: the old one's
    next heartbeat gets FENCED_INSTANCE_ID and its poll raises it."""
    with AdminClient(broker.address) as admin:
        if "static" not in {t.name for t in admin.list_topics()}:
            admin.create_topic("static", 6)
    old_events: Events = []
    old = _static(broker, "g-fenced", "x", old_events)
    poll_until([old], lambda: len(_held(old_events)) == 6)
    # Take the instance over behind the old consumer's back: a -2 leave in its name,
    # then a new incarnation joins (as a restart on another machine would, after a
    # network partition kept the old one from hearing of it).
    core = broker.server.core
    (view,) = core.describe_group("g-fenced").members
    core.consumer_group_heartbeat(
        HeartbeatRequest(
            "g-fenced", view.member_id, -2, frozenset({"static"}), frozenset(), instance_id="x"
        )
    )
    core.consumer_group_heartbeat(
        HeartbeatRequest("g-fenced", "", 0, frozenset({"static"}), frozenset(), instance_id="x")
    )
    with pytest.raises(FencedInstanceIdError):
        poll_until([old], lambda: False, timeout_s=10)
    assert old_events[-1][0] == "lost"
    old.close()


def test_group_instance_id_needs_a_group_and_a_name() -> None:
    with pytest.raises(ValueError, match="group_instance_id"):
        ConsumerConfig(group_instance_id="i")
    with pytest.raises(ValueError, match="group_instance_id"):
        ConsumerConfig(group_id="g", group_instance_id="")
    config = ConsumerConfig.from_mapping({"group.id": "g", "group.instance.id": "i"})
    assert config.group_instance_id == "i"
