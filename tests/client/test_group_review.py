"""Adversarial tests of the consumer-group client: hand-offs, fencing, closing, callbacks.

Each test pins one property a group consumer must keep whatever the timing (a partition
is never consumed past a revocation, nothing is skipped after a reassignment, a fenced
member cannot commit, ``close`` is bounded), against a real in-process broker with short
group timeouts (heartbeat 100 ms, sessions of 2 s). Members are driven from the test's
thread, polling in turn, except where a test needs a member that does not poll.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from tests.client.groups import (
    GROUP_SETTINGS,
    SESSION_TIMEOUT_MS,
    member,
    poll_until,
    produce,
    wait_for,
)
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, TopicPartition
from tidelog.client.connection import Connection
from tidelog.client.coordinator import ConsumerCoordinator
from tidelog.client.errors import ClosedError
from tidelog.client.group_member import GroupMembership, HeartbeatAnswer, MemberEvent
from tidelog.client.grpc_connection import grpc_connections
from tidelog.client.types import ConsumerRecord
from tidelog.storage.errors import (
    FencedMemberEpochError,
    InternalError,
    OffsetOutOfRangeError,
)


@pytest.fixture(scope="module")
def group_broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings=GROUP_SETTINGS) as running:
        yield running


@pytest.fixture
def restartable() -> Iterator[InProcessBroker]:
    """A broker of the test's own, which it may stop and restart."""
    with InProcessBroker(settings=GROUP_SETTINGS) as running:
        yield running


def coordinator_of(consumer: Consumer) -> ConsumerCoordinator:
    assert consumer._group is not None
    return consumer._group.coordinator


def rejoined_with(consumer: Consumer, tps: set[TopicPartition]) -> Callable[[], bool]:
    """The heartbeat thread was fenced and got ``tps`` back (the app did not poll yet)."""
    coordinator = coordinator_of(consumer)

    def check() -> bool:
        with coordinator._lock:
            membership = coordinator._membership
            return membership.generation >= 1 and membership.owned == tps

    return check


def heartbeat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tidelog-heartbeat")]


# --- prefetched data and positions across a hand-off ------------------------------------


def test_prefetched_records_of_a_lost_partition_never_skip_records_after_it_comes_back(
    restartable: InProcessBroker,
) -> None:
    """Data fetched in the old generation must not be handed out in the new one.

    The member holds a second prefetched answer (offsets 10..19) when the broker
    restarts; it is fenced, rejoins and gets the partition back at the committed offset
    1 while the application is busy. Its next polls must deliver 1, 2, ... in order,
    not jump to the stale prefetched answer.
    """
    address = restartable.address
    with AdminClient(address) as admin:
        admin.create_topic("stale-prefetch", 1)
    tp = TopicPartition("stale-prefetch", 0)
    produce(address, "stale-prefetch", 1, 10)
    with member(address, "stale-prefetch-g", enable_auto_commit=False) as consumer:
        consumer.subscribe("stale-prefetch")
        first: list[ConsumerRecord] = []
        deadline = time.monotonic() + 15
        while not first:
            assert time.monotonic() < deadline
            first = consumer.poll(timeout_ms=50, max_records=1)
        assert [r.offset for r in first] == [0]
        consumer.commit()  # committed 1
        produce(address, "stale-prefetch", 1, 10)  # answered to the prefetch: 10..19
        wait_for(lambda: bool(consumer._fetches._completed))
        restartable.restart()
        wait_for(rejoined_with(consumer, {tp}))
        seen: list[ConsumerRecord] = []
        poll_until([consumer], lambda: any(r.offset == 19 for r in seen), sink=seen)
        assert [r.offset for r in seen] == list(range(1, 20))


def test_records_before_a_failing_partition_are_returned_not_swallowed(
    group_broker: InProcessBroker,
) -> None:
    """An error on one partition must not lose the records collected for another.

    Kafka's fetcher returns what it collected and raises at the next poll; raising at
    once would move the position past records the application never got, and a commit
    would then skip them.
    """
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("swallow", 2)
    produce(address, "swallow", 2, 5)
    good, bad = TopicPartition("swallow", 0), TopicPartition("swallow", 1)
    with member(address, "swallow-g", auto_offset_reset="none", enable_auto_commit=False) as c:
        c.assign([good, bad])
        c.seek(good, 0)
        c.seek(bad, 1_000)  # outside the log: OFFSET_OUT_OF_RANGE, and no reset
        got: list[ConsumerRecord] = []
        errors = 0
        deadline = time.monotonic() + 10
        while (len(got) < 5 or not errors) and time.monotonic() < deadline:
            try:
                got += c.poll(timeout_ms=50)
            except OffsetOutOfRangeError:
                errors += 1
            # whatever happened, the position never runs ahead of what was returned
            assert c.position(good) == len([r for r in got if r.partition == 0])
        assert [r.offset for r in got] == [0, 1, 2, 3, 4]
        assert errors >= 1


# --- fencing ---------------------------------------------------------------------------


def test_commit_after_the_membership_was_lost_raises_until_the_loss_is_handled(
    restartable: InProcessBroker,
) -> None:
    """A member fenced (here: broker restart) must not commit its old positions.

    The heartbeat thread has already rejoined and got the same partition back, so the
    broker would accept the new epoch; but the application has not run ``on_lost`` yet
    and its positions belong to the old membership: ``commit`` raises and commits
    nothing. After the next ``poll`` ran ``on_lost`` (and the new assignment), commits
    work again.
    """
    address = restartable.address
    with AdminClient(address) as admin:
        admin.create_topic("fenced", 1)
    tp = TopicPartition("fenced", 0)
    produce(address, "fenced", 1, 10)
    lost: list[list[TopicPartition]] = []
    with member(address, "fenced-g", enable_auto_commit=False) as consumer:
        consumer.subscribe("fenced", on_lost=lost.append)
        seen: list[ConsumerRecord] = []
        poll_until([consumer], lambda: len(seen) == 10, sink=seen)
        consumer.commit({tp: 4})
        restartable.restart()
        wait_for(rejoined_with(consumer, {tp}))
        with pytest.raises(FencedMemberEpochError, match="lost"):
            consumer.commit()
        with pytest.raises(FencedMemberEpochError):
            consumer.commit({tp: 7})
        assert consumer.committed(tp) == 4
        again: list[ConsumerRecord] = []
        poll_until([consumer], lambda: len(again) == 6, sink=again)
        assert lost == [[tp]]
        assert [r.offset for r in again] == [4, 5, 6, 7, 8, 9]  # from the commit on
        consumer.commit({tp: 6})
        assert consumer.committed(tp) == 6


# --- closing ---------------------------------------------------------------------------


def test_close_while_the_broker_is_down_returns_within_its_timeout(
    restartable: InProcessBroker,
) -> None:
    address = restartable.address
    with AdminClient(address) as admin:
        admin.create_topic("down", 2)
    produce(address, "down", 2, 3)
    before = set(heartbeat_threads())
    consumer = member(address, "down-g", request_timeout_ms=10_000)
    consumer.subscribe("down")
    seen: list[ConsumerRecord] = []
    poll_until([consumer], lambda: len(seen) == 6, sink=seen)
    restartable.stop()
    start = time.monotonic()
    consumer.close(timeout_ms=1_000)
    elapsed = time.monotonic() - start
    # one timeout for the commit, one for the leave: never request_timeout_ms
    assert elapsed < 2.8, elapsed
    wait_for(lambda: set(heartbeat_threads()) <= before, timeout_s=2)


def test_no_threads_left_after_close(group_broker: InProcessBroker) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("threads", 2)
    produce(address, "threads", 2, 3)
    before = set(threading.enumerate())
    consumer = member(address, "threads-g")
    consumer.subscribe("threads")
    seen: list[ConsumerRecord] = []
    poll_until([consumer], lambda: len(seen) == 6, sink=seen)
    consumer.close()

    def leaked() -> list[str]:
        new = set(threading.enumerate()) - before
        # The broker's own threads (the listener's event loop and storage threads) start
        # lazily and outlive a client.
        return sorted(t.name for t in new if not t.name.startswith(("tidelog-grpc", "tidelog-io")))

    deadline = time.monotonic() + 3
    while leaked() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert leaked() == []


# --- hand-offs between members -----------------------------------------------------------


def test_hand_offs_never_share_a_partition_nor_skip_a_record(
    group_broker: InProcessBroker,
) -> None:
    """Members join and leave while reading: ownership stays disjoint, nothing is skipped.

    Driven from one thread, so the deliveries have one global order: per partition each
    record handed out is at most one past the furthest handed out before (a new owner
    starts at or before where the last one stopped: at-least-once, no gap), and after
    every poll the members' assignments are disjoint.
    """
    address = group_broker.address
    partitions, per_partition = 6, 300
    with AdminClient(address) as admin:
        admin.create_topic("handoff", partitions)
    produce(address, "handoff", partitions, per_partition)
    settings = {"max_poll_records": 7, "auto_commit_interval_ms": 50}
    members = {name: member(address, "handoff-g", **settings) for name in "abc"}
    furthest = dict.fromkeys(range(partitions), -1)
    delivered: set[tuple[int, int]] = set()
    active: list[str] = []

    def step_until(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 15
        while not condition():
            assert time.monotonic() < deadline, sorted(furthest.items())
            for name in list(active):
                records = members[name].poll(timeout_ms=5)
                held = members[name].assignment()
                for record in records:
                    # nothing of a partition revoked in this poll (prefetched or not)
                    assert TopicPartition(record.topic, record.partition) in held
                    assert record.offset <= furthest[record.partition] + 1, (name, record)
                    furthest[record.partition] = max(furthest[record.partition], record.offset)
                    delivered.add((record.partition, record.offset))
                owned = [members[n].assignment() for n in active]
                for i, one in enumerate(owned):
                    for other in owned[i + 1 :]:
                        assert not one & other

    def holds(counts: dict[str, int]) -> Callable[[], bool]:
        return lambda: all(len(members[n].assignment()) == k for n, k in counts.items())

    for name in "ab":
        members[name].subscribe("handoff")
        active.append(name)
    step_until(holds({"a": 3, "b": 3}))
    members["c"].subscribe("handoff")
    active.append("c")
    step_until(holds({"a": 2, "b": 2, "c": 2}))
    members["a"].close()
    active.remove("a")
    step_until(holds({"b": 3, "c": 3}))
    members["b"].unsubscribe()
    active.remove("b")
    step_until(lambda: len(delivered) == partitions * per_partition)
    assert min(furthest.values()) == per_partition - 1
    for name in "bc":
        members[name].close()


def test_close_during_a_rebalance_commits_revokes_once_and_hands_everything_over(
    group_broker: InProcessBroker,
) -> None:
    """``close`` with a revocation queued but not run yet: the step runs (commit,
    ``on_revoke``), the rest is revoked, and the other member resumes at the commits."""
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("close-mid", 4)
    produce(address, "close-mid", 4, 5)
    revoked: list[TopicPartition] = []
    a = member(address, "close-mid-g")
    b = member(address, "close-mid-g")
    a.subscribe("close-mid", on_revoke=revoked.extend)
    seen: list[ConsumerRecord] = []
    poll_until([a], lambda: len(seen) == 20, sink=seen)
    b.subscribe("close-mid")
    b.poll(timeout_ms=0)
    wait_for(lambda: bool(coordinator_of(a)._events))  # a's revocation, queued
    a.close()  # the revocation is queued, not run: close runs it
    assert sorted(revoked) == [TopicPartition("close-mid", p) for p in range(4)]
    again: list[ConsumerRecord] = []
    poll_until([b], lambda: len(b.assignment()) == 4, sink=again)
    produce(address, "close-mid", 4, 1)
    poll_until([b], lambda: len(again) >= 4, sink=again)
    assert sorted((r.partition, r.offset) for r in again) == [(p, 5) for p in range(4)]
    b.close()


def test_unsubscribe_then_subscribe_again_resumes_at_the_commit(
    group_broker: InProcessBroker,
) -> None:
    """Data prefetched before ``unsubscribe`` must not come back after ``subscribe``."""
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("resub", 1)
    tp = TopicPartition("resub", 0)
    produce(address, "resub", 1, 10)
    with member(address, "resub-g", enable_auto_commit=False) as consumer:
        consumer.subscribe("resub")
        first: list[ConsumerRecord] = []
        deadline = time.monotonic() + 15
        while not first:
            assert time.monotonic() < deadline
            first = consumer.poll(timeout_ms=50, max_records=2)
        consumer.commit()
        produce(address, "resub", 1, 10)  # answered to the prefetch: 10..19
        wait_for(lambda: bool(consumer._fetches._completed))
        consumer.unsubscribe()
        consumer.subscribe("resub")
        wait_for(lambda: coordinator_of(consumer).owned() == {tp})  # granted, not polled
        seen: list[ConsumerRecord] = []
        poll_until([consumer], lambda: any(r.offset == 19 for r in seen), sink=seen)
        assert [r.offset for r in seen] == list(range(2, 20))
        assert consumer.committed(tp) == 2


def test_a_subscribed_topic_created_later_is_assigned_and_read(
    group_broker: InProcessBroker,
) -> None:
    address = group_broker.address
    assigned: list[TopicPartition] = []
    with member(address, "later-g") as consumer:
        consumer.subscribe(["later-a", "later-b"], on_assign=assigned.extend)
        with AdminClient(address) as admin:
            admin.create_topic("later-a", 1)
            poll_until([consumer], lambda: len(consumer.assignment()) == 1)
            admin.create_topic("later-b", 2)
        produce(address, "later-b", 2, 3)
        seen: list[ConsumerRecord] = []
        poll_until([consumer], lambda: len(seen) == 6, sink=seen)
        assert sorted(assigned) == [
            TopicPartition("later-a", 0),
            TopicPartition("later-b", 0),
            TopicPartition("later-b", 1),
        ]


# --- callbacks ---------------------------------------------------------------------------


def test_on_assign_can_seek_and_a_raising_callback_finishes_its_step(
    group_broker: InProcessBroker,
) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("cb-edge", 2)
    produce(address, "cb-edge", 2, 10)
    holder: list[Consumer] = []

    def seek_then_fail(partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            holder[0].seek(tp, 7)
        raise RuntimeError("on_assign failed")

    def revoke_fails(partitions: list[TopicPartition]) -> None:
        raise RuntimeError("on_revoke failed")

    a = member(address, "cb-edge-g", enable_auto_commit=False)
    holder.append(a)
    a.subscribe("cb-edge", on_assign=seek_then_fail, on_revoke=revoke_fails)
    deadline = time.monotonic() + 15
    with pytest.raises(RuntimeError, match="on_assign failed"):  # noqa: PT012
        while time.monotonic() < deadline:
            a.poll(timeout_ms=20)
    seen: list[ConsumerRecord] = []
    poll_until([a], lambda: len(seen) == 6, sink=seen)  # the step finished: it reads
    assert sorted((r.partition, r.offset) for r in seen) == [
        (p, o) for p in range(2) for o in range(7, 10)
    ]
    b = member(address, "cb-edge-g")
    b.subscribe("cb-edge")
    errors: list[BaseException] = []

    def poll_a() -> None:
        try:
            a.poll(timeout_ms=20)
        except RuntimeError as exc:
            errors.append(exc)

    deadline = time.monotonic() + 15
    while len(b.assignment()) != 1:
        assert time.monotonic() < deadline
        poll_a()
        b.poll(timeout_ms=20)
    assert [str(e) for e in errors] == ["on_revoke failed"]  # the revocation still finished
    assert len(a.assignment()) == 1
    b.close()
    a.close()


def test_an_interrupted_on_revoke_still_releases_the_partitions(
    group_broker: InProcessBroker,
) -> None:
    """``KeyboardInterrupt`` (not an ``Exception``) out of ``on_revoke``: the partitions
    are still released, or the other member would wait for the rebalance timeout."""
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("interrupt", 2)
    interrupts = [KeyboardInterrupt()]

    def on_revoke(partitions: list[TopicPartition]) -> None:
        if interrupts:
            raise interrupts.pop()

    a = member(address, "interrupt-g")
    b = member(address, "interrupt-g")
    a.subscribe("interrupt", on_revoke=on_revoke)
    poll_until([a], lambda: len(a.assignment()) == 2)
    b.subscribe("interrupt")
    deadline = time.monotonic() + 10
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012
        while time.monotonic() < deadline:
            a.poll(timeout_ms=20)
            b.poll(timeout_ms=20)
    poll_until([a, b], lambda: len(a.assignment()) == len(b.assignment()) == 1, timeout_s=5)
    b.close()
    a.close()


# --- auto-commit ---------------------------------------------------------------------------


def test_auto_commit_waits_for_its_interval_and_then_commits_what_was_returned(
    group_broker: InProcessBroker,
) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("auto", 1)
    tp = TopicPartition("auto", 0)
    produce(address, "auto", 1, 10)
    interval_ms = 1_500
    start = time.monotonic()
    with member(address, "auto-g", auto_commit_interval_ms=interval_ms) as consumer:
        consumer.subscribe("auto")
        seen: list[ConsumerRecord] = []
        poll_until([consumer], lambda: len(seen) == 10, sink=seen)
        if time.monotonic() - start < interval_ms / 1000 - 0.3:
            assert consumer.committed(tp) is None
        poll_until([consumer], lambda: consumer.committed(tp) == 10, timeout_s=5)
        assert time.monotonic() - start >= interval_ms / 1000


# --- the heartbeat thread and poll -------------------------------------------------------


def test_a_revocation_queued_while_poll_is_busy_runs_within_that_poll(
    group_broker: InProcessBroker,
) -> None:
    """Events queued while ``poll`` is not waiting (here: during ``on_assign``) must not
    miss their wake-up: the revocation runs in the same ``poll``, not after its timeout."""
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("wakeup", 2)
    a = member(address, "wakeup-g", enable_auto_commit=False)
    b = member(address, "wakeup-g", enable_auto_commit=False)
    stop = threading.Event()
    revoked_at: list[float] = []
    queued_at: list[float] = []

    def run_b() -> None:  # b has its own thread: a's poll below blocks this one
        b.subscribe("wakeup")
        while not stop.is_set():
            b.poll(timeout_ms=20)

    helper = threading.Thread(target=run_b)

    def on_assign(partitions: list[TopicPartition]) -> None:
        if not helper.is_alive() and not stop.is_set():
            helper.start()
            wait_for(lambda: bool(coordinator_of(a)._events), timeout_s=5)  # a revoke
            queued_at.append(time.monotonic())

    a.subscribe(
        "wakeup", on_assign=on_assign, on_revoke=lambda _: revoked_at.append(time.monotonic())
    )
    try:
        start = time.monotonic()
        while not revoked_at:
            assert time.monotonic() - start < 10
            a.poll(timeout_ms=2_500)
            if queued_at:
                break
        assert revoked_at, "the revocation waited for the next poll"
        assert revoked_at[0] - queued_at[0] < 1.5, "the revocation waited for the timeout"
    finally:
        stop.set()
        if helper.is_alive():
            helper.join()
        b.close()
        a.close()


def test_poll_returns_within_its_timeout_while_the_broker_is_down_and_a_commit_is_due(
    restartable: InProcessBroker,
) -> None:
    """Auto-commit runs inside ``poll``: it must not hold ``poll`` past its timeout for
    ``request_timeout_ms`` while the broker is unreachable."""
    address = restartable.address
    with AdminClient(address) as admin:
        admin.create_topic("poll-down", 1)
    produce(address, "poll-down", 1, 3)
    consumer = member(
        address, "poll-down-g", auto_commit_interval_ms=100, request_timeout_ms=10_000
    )
    try:
        consumer.subscribe("poll-down")
        seen: list[ConsumerRecord] = []
        poll_until([consumer], lambda: len(seen) == 3, sink=seen)
        restartable.stop()
        time.sleep(0.15)  # an auto-commit is due
        for _ in range(3):
            start = time.monotonic()
            consumer.poll(timeout_ms=300)
            assert time.monotonic() - start < 1.5
    finally:
        consumer.close(timeout_ms=500)


def test_close_interrupted_in_on_revoke_still_leaves_the_group(
    group_broker: InProcessBroker,
) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("close-interrupt", 1)

        def on_revoke(partitions: list[TopicPartition]) -> None:
            raise KeyboardInterrupt

        before = set(heartbeat_threads())
        consumer = member(address, "close-interrupt-g")
        consumer.subscribe("close-interrupt", on_revoke=on_revoke)
        poll_until([consumer], lambda: len(consumer.assignment()) == 1)
        with pytest.raises(KeyboardInterrupt):
            consumer.close()
        # no member left behind heartbeating for a consumer that is going away
        assert admin.describe_group("close-interrupt-g").members == ()
        wait_for(lambda: set(heartbeat_threads()) <= before, timeout_s=2)
        consumer.close()


def test_a_revocation_overtaken_by_a_loss_only_calls_on_lost(
    restartable: InProcessBroker,
) -> None:
    """A revoke step still queued when the membership is lost: the partitions are lost,
    not revoked. Only ``on_lost`` runs (no ``on_revoke`` of partitions someone else may
    own already, no commit), so per partition the callbacks still alternate."""
    address = restartable.address
    with AdminClient(address) as admin:
        admin.create_topic("overtaken", 2)
    produce(address, "overtaken", 2, 3)
    calls: list[tuple[str, list[int]]] = []

    def record(kind: str) -> Callable[[list[TopicPartition]], None]:
        return lambda partitions: calls.append((kind, [tp.partition for tp in partitions]))

    a = member(address, "overtaken-g")
    b = member(address, "overtaken-g")
    try:
        a.subscribe(
            "overtaken",
            on_assign=record("assign"),
            on_revoke=record("revoke"),
            on_lost=record("lost"),
        )
        seen: list[ConsumerRecord] = []
        poll_until([a], lambda: len(seen) == 6, sink=seen)
        a.commit()
        b.subscribe("overtaken")  # b's heartbeat thread joins without b polling
        wait_for(lambda: bool(coordinator_of(a)._events))  # a's revoke, not run
        restartable.restart()
        wait_for(lambda: coordinator_of(a)._membership.generation >= 1)
        poll_until([a], lambda: len(calls) >= 3)
        assert calls[:2] == [("assign", [0, 1]), ("lost", [0, 1])]
    finally:
        b.close(timeout_ms=1_000)
        a.close(timeout_ms=1_000)


# --- a member cut off from the broker ----------------------------------------------------


class CuttableProxy:
    """A TCP forwarder to the broker whose ``cut`` drops every connection and refuses
    new ones: the member behind it is cut off while the broker stays up for the rest."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=self._pipe, args=(source, sink), daemon=True)
                self._threads.append(thread)
                thread.start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close alone does not
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()


def test_a_member_cut_off_gives_its_partitions_up_within_the_session_timeout(
    group_broker: InProcessBroker,
) -> None:
    """The broker reassigns a silent member's partitions after the session timeout; the
    member must have given them up (``on_lost``) by then, not one heartbeat call later.

    The heartbeat that finds the broker unreachable is retried until its deadline
    (``request_timeout_ms`` here, below the session timeout): it must not run past the
    session, which starts when the last answered heartbeat was sent.
    """
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("cut", 2)
    proxy = CuttableProxy(address)
    lost_at: list[float] = []
    a = member(proxy.address, "cut-g", request_timeout_ms=1_500, enable_auto_commit=False)
    try:
        a.subscribe("cut", on_lost=lambda _: lost_at.append(time.monotonic()))
        poll_until([a], lambda: len(a.assignment()) == 2)
        answers = coordinator_of(a)._membership.answers
        wait_for(lambda: coordinator_of(a)._membership.answers > answers)
        cut_at = time.monotonic()  # the last answered heartbeat was sent before this
        proxy.cut()
        poll_until([a], lambda: bool(lost_at), timeout_s=6)
        assert lost_at[0] - cut_at < SESSION_TIMEOUT_MS / 1000 + 0.3
    finally:
        a.close(timeout_ms=200)


def test_the_session_runs_from_sending_the_last_answered_heartbeat() -> None:
    """Pure: the member's session deadline is never later than the broker's."""
    tp = TopicPartition("t", 0)
    m = GroupMembership(["t"], session_timeout_ms=1_000, retry_backoff_ms=50, now_ms=0)
    assert m.session_deadline_ms() is None  # nothing at stake yet
    assert m.start_heartbeat(0) is not None
    m.on_answer(HeartbeatAnswer("m1", 1, 100, frozenset({tp})), 40)  # a slow answer
    assert m.session_deadline_ms() == 1_000  # from the send at 0, not the answer at 40
    assert m.start_heartbeat(140) is not None
    assert m.on_failure(990) == []
    assert m.start_heartbeat(1_040) is not None  # after the backoff (50 ms)
    assert m.on_failure(1_040) == [MemberEvent("lose", (tp,), 0)]
    assert m.session_deadline_ms() is None


# --- the heartbeat thread under faults it did not cause ----------------------------------


class FaultyHeartbeats:
    """A connection factory: real gRPC connections whose next heartbeats fail as told
    (``failures`` may be added to at any time)."""

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self._connect = grpc_connections(
            client_id="faulty", request_timeout_ms=5_000, reconnect_backoff_max_ms=1_000
        )

    def __call__(self, address: str) -> Connection:
        return cast(Connection, _FaultyConnection(self._connect(address), self))


class _FaultyConnection:
    def __init__(self, real: Connection, owner: FaultyHeartbeats) -> None:
        self._real = real
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        if self._owner.failures:
            raise self._owner.failures.pop(0)
        return self._real.heartbeat(*args, **kwargs)


def test_a_heartbeat_cancelled_by_the_other_side_is_retried(
    group_broker: InProcessBroker,
) -> None:
    topic = "cancelled-heartbeat"
    with AdminClient(group_broker.address) as admin:
        admin.create_topic(topic, partitions=2)
    # What a broker shutting down does to a call in flight (CANCELLED): the thread used
    # to take it for the consumer's own close and stop heartbeating for good.
    faulty = FaultyHeartbeats([ClosedError("ConsumerGroupHeartbeat was cancelled")] * 2)
    with member(group_broker.address, "g-cancelled", connection_factory=faulty) as consumer:
        consumer.subscribe([topic])
        poll_until([consumer], lambda: len(consumer.assignment()) == 2)
        assert coordinator_of(consumer)._thread.is_alive()


def test_a_crashed_heartbeat_thread_drops_the_partitions_and_says_so(
    group_broker: InProcessBroker,
) -> None:
    topic = "crashed-heartbeat"
    with AdminClient(group_broker.address) as admin:
        admin.create_topic(topic, partitions=2)
    lost: list[set[TopicPartition]] = []
    faulty = FaultyHeartbeats([])
    with member(group_broker.address, "g-crashed", connection_factory=faulty) as consumer:
        consumer.subscribe([topic], on_lost=lambda tps: lost.append(set(tps)))
        poll_until([consumer], lambda: len(consumer.assignment()) == 2)
        faulty.failures.append(RuntimeError("a bug"))
        wait_for(lambda: not coordinator_of(consumer)._thread.is_alive())
        with pytest.raises(InternalError, match=r"heartbeat thread .* failed"):
            poll_until([consumer], lambda: False, timeout_s=5)
        assert lost == [{TopicPartition(topic, 0), TopicPartition(topic, 1)}]
        assert consumer.assignment() == set()
