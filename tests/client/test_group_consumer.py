"""Group members in this process against a real broker: commits, callbacks, restarts.

The members are driven from the test's thread (a ``Consumer`` is used from one thread),
polling in turn; ``test_group_processes.py`` has the multi-process scenarios. Group
timeouts are short (heartbeat 100 ms, sessions of 2 s) so rebalances take milliseconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.client.groups import GROUP_SETTINGS, member, poll_until, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, TopicPartition
from tidelog.client.types import ConsumerRecord
from tidelog.storage.errors import GroupNotEmptyError, InvalidRequestError, StaleMemberEpochError


@pytest.fixture(scope="module")
def group_broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings=GROUP_SETTINGS) as running:
        yield running


def test_callbacks_run_in_poll_on_the_callers_thread_and_on_revoke_can_commit(
    group_broker: InProcessBroker,
) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("cb", 4)
    produce(address, "cb", 4, 5)
    calls: list[tuple[str, str, list[int], str]] = []

    def listener(
        name: str, kind: str, consumer: Callable[[], Consumer]
    ) -> Callable[[list[TopicPartition]], None]:
        def callback(partitions: list[TopicPartition]) -> None:
            calls.append(
                (name, kind, [tp.partition for tp in partitions], threading.current_thread().name)
            )
            if kind == "revoke":  # positions of revoked partitions can still be committed
                c = consumer()
                c.commit({tp: c.position(tp) for tp in partitions})

        return callback

    a = member(address, "cb-group", enable_auto_commit=False)
    b = member(address, "cb-group", enable_auto_commit=False)
    a.subscribe(
        "cb",
        on_assign=listener("a", "assign", lambda: a),
        on_revoke=listener("a", "revoke", lambda: a),
    )
    seen: list[ConsumerRecord] = []
    poll_until([a], lambda: len(seen) == 20, sink=seen)
    assert calls == [("a", "assign", [0, 1, 2, 3], threading.current_thread().name)]
    b.subscribe(
        "cb",
        on_assign=listener("b", "assign", lambda: b),
        on_revoke=listener("b", "revoke", lambda: b),
    )
    poll_until([a, b], lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
    (revoke,) = [c for c in calls if c[1] == "revoke"]
    moved = revoke[2]
    assert len(moved) == 2
    assert calls[-1] == ("b", "assign", moved, threading.current_thread().name)
    assert {tp.partition for tp in b.assignment()} == set(moved)
    # a committed in on_revoke, so b starts where a stopped: nothing is read twice.
    for p in moved:
        assert b.committed(TopicPartition("cb", p)) == 5
        assert b.position(TopicPartition("cb", p)) == 5
    # A partition the member does not hold cannot be committed by it.
    with pytest.raises(StaleMemberEpochError):
        a.commit({TopicPartition("cb", moved[0]): 1})
    a.close()
    b.close()


def test_a_commit_with_a_stale_epoch_is_retried_after_the_next_heartbeat(
    group_broker: InProcessBroker,
) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("stale", 1)
    tp = TopicPartition("stale", 0)
    with member(address, "stale-group", enable_auto_commit=False) as consumer:
        consumer.subscribe("stale")
        poll_until([consumer], lambda: bool(consumer.assignment()))
        assert consumer._group is not None
        coordinator = consumer._group.coordinator
        real_member = coordinator.member
        stale = [True]

        def member_once_stale() -> tuple[str, int]:
            member_id, epoch = real_member()
            if stale.pop() if stale else False:
                return member_id, epoch + 5  # an epoch the broker never gave
            return member_id, epoch

        coordinator.member = member_once_stale  # type: ignore[method-assign]
        consumer.commit({tp: 0})
        assert not stale  # the stale epoch was used, refused, and the retry went through
        assert consumer.committed(tp) == 0


def test_committed_offsets_survive_a_broker_restart_and_members_rejoin() -> None:
    lost: list[list[int]] = []
    assigned: list[list[int]] = []
    with InProcessBroker(settings=GROUP_SETTINGS) as broker:
        address = broker.address
        with AdminClient(address) as admin:
            admin.create_topic("restart", 2)
        produce(address, "restart", 2, 10)
        consumer = member(address, "restart-group", enable_auto_commit=False)
        consumer.subscribe(
            "restart",
            on_assign=lambda ps: assigned.append([tp.partition for tp in ps]),
            on_lost=lambda ps: lost.append([tp.partition for tp in ps]),
        )
        seen: list[ConsumerRecord] = []
        poll_until([consumer], lambda: len(seen) == 20, sink=seen)
        consumer.commit()
        broker.restart()
        with AdminClient(address) as admin:
            for p in range(2):
                assert admin.describe_group("restart-group").partitions[p].committed_offset == 10
        # The restarted broker forgot the member: it loses its partitions, rejoins, and
        # resumes from the committed offsets.
        poll_until([consumer], lambda: bool(lost) and len(assigned) == 2, sink=seen)
        assert lost == [[0, 1]]
        assert assigned == [[0, 1], [0, 1]]
        produce(address, "restart", 2, 3)
        poll_until([consumer], lambda: len(seen) == 26, sink=seen)
        assert sorted((r.partition, r.offset) for r in seen[20:]) == [
            (p, o) for p in range(2) for o in range(10, 13)
        ]
        consumer.close()
        with AdminClient(address) as admin:
            group = admin.describe_group("restart-group")
        assert group.members == ()
        assert [(p.committed_offset, p.lag) for p in group.partitions] == [(10, 3), (10, 3)]


def test_lag_is_log_end_minus_committed(group_broker: InProcessBroker) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("lag", 3)
        produce(address, "lag", 3, 7)
        with member(address, "lag-group", enable_auto_commit=False) as consumer:
            consumer.subscribe("lag")
            poll_until([consumer], lambda: len(consumer.assignment()) == 3)
            consumer.commit({TopicPartition("lag", 0): 2, TopicPartition("lag", 1): 7})
            group = admin.describe_group("lag-group")
            assert group.state == "Stable"
            (only,) = group.members
            assert sorted(only.assignment) == [TopicPartition("lag", p) for p in range(3)]
            rows = {p.tp.partition: p for p in group.partitions}
            assert {p: (r.committed_offset, r.log_end_offset, r.lag) for p, r in rows.items()} == {
                0: (2, 7, 5),
                1: (7, 7, 0),
                2: (None, 7, 7),  # nothing committed: all that is readable
            }
            assert {r.member_id for r in rows.values()} == {only.member_id}
            with pytest.raises(GroupNotEmptyError):
                admin.reset_group_offsets("lag-group", "lag", to_earliest=True)


def test_unsubscribe_leaves_the_group_and_assign_works_outside_it(
    group_broker: InProcessBroker,
) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("unsub", 2)
        produce(address, "unsub", 2, 3)
        revoked: list[list[int]] = []
        with member(address, "unsub-group") as consumer:
            consumer.subscribe(
                "unsub", on_revoke=lambda ps: revoked.append([tp.partition for tp in ps])
            )
            seen: list[ConsumerRecord] = []
            poll_until([consumer], lambda: len(seen) == 6, sink=seen)
            consumer.unsubscribe()
            assert revoked == [[0, 1]]
            assert consumer.assignment() == set()
            assert admin.describe_group("unsub-group").members == ()
            # auto-commit committed what was read when leaving
            assert consumer.committed(TopicPartition("unsub", 1)) == 3
            consumer.assign([TopicPartition("unsub", 0)])
            assert consumer.position(TopicPartition("unsub", 0)) == 3
            consumer.commit({TopicPartition("unsub", 0): 1})  # allowed: the group is empty
            assert consumer.committed(TopicPartition("unsub", 0)) == 1


def test_commit_never_skips_records_the_iterator_has_not_handed_out(
    group_broker: InProcessBroker,
) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("iter", 1)
    produce(address, "iter", 1, 10)
    tp = TopicPartition("iter", 0)
    with member(address, "iter-group", enable_auto_commit=False, consumer_timeout_ms=5_000) as c:
        c.subscribe("iter")
        taken = [record for _, record in zip(range(3), c, strict=False)]
        assert [r.offset for r in taken] == [0, 1, 2]
        assert c.position(tp) == 10  # poll fetched all ten; seven wait in the iterator
        c.commit()
        assert c.committed(tp) == 3


def test_a_heartbeat_the_broker_refuses_for_good_is_raised_from_poll(
    group_broker: InProcessBroker,
) -> None:
    with member(group_broker.address, "g" * 40_000) as consumer:
        consumer.subscribe("anything")
        deadline = time.monotonic() + 10
        with pytest.raises(InvalidRequestError, match="group_id longer"):  # noqa: PT012
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=100)
        consumer.poll(timeout_ms=0)  # raised once (until the next refusal); goes on


def test_a_member_that_stops_polling_hands_its_partitions_over_and_rejoins(
    group_broker: InProcessBroker,
) -> None:
    address = group_broker.address
    admin = AdminClient(address)
    admin.create_topic("idle", 2)
    lost: list[list[int]] = []
    with (
        member(address, "idle-group") as busy,
        member(address, "idle-group", max_poll_interval_ms=600) as stuck,
    ):
        busy.subscribe("idle")
        stuck.subscribe("idle", on_lost=lambda ps: lost.append([tp.partition for tp in ps]))
        poll_until([busy, stuck], lambda: len(busy.assignment()) == len(stuck.assignment()) == 1)
        held = stuck.assignment()
        start = time.monotonic()
        poll_until([busy], lambda: len(busy.assignment()) == 2)  # stuck does not poll
        assert 0.5 < time.monotonic() - start < 5
        assert len(admin.describe_group("idle-group").members) == 1
        assert lost == []  # the callback runs in stuck's next poll, not before
        poll_until([busy, stuck], lambda: len(busy.assignment()) == len(stuck.assignment()) == 1)
        assert lost == [[tp.partition for tp in held]]
    admin.close()
