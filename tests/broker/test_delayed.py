"""The purgatory (``broker.core.delayed``) and the core's parked fetches and produces.

Unit tests: a manual clock, real temporary directories for the core, no sockets, and
nothing sleeps to wait for a deadline (the reaper is not started; ``expire_due`` is).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.broker.conftest import make_batch
from tidelog.broker.config import BrokerConfig
from tidelog.broker.core.delayed import DelayedOperation, Purgatory
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.core.fetch import FetchSpec, PartitionFetched, PartitionFetchSpec
from tidelog.broker.core.produce import Acks, PartitionProduced, PartitionRecords
from tidelog.storage.clock import ManualClock


class Flag(DelayedOperation):
    """Satisfied once ``ready`` is set; records how it completed."""

    def __init__(self, deadline_ms: int | None) -> None:
        super().__init__(deadline_ms)
        self.ready = False
        self.completions: list[bool] = []  # the ``expired`` flag of each completion

    def is_satisfied(self) -> bool:
        return self.ready

    def on_complete(self) -> None:
        self.completions.append(self.expired)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def purgatory(clock: ManualClock) -> Iterator[Purgatory[str]]:
    purgatory: Purgatory[str] = Purgatory("test", clock)
    yield purgatory
    purgatory.close()


def test_a_satisfied_operation_completes_at_once_and_is_never_parked(
    purgatory: Purgatory[str],
) -> None:
    op = Flag(deadline_ms=100)
    op.ready = True
    assert purgatory.try_complete_else_watch(op, ["a"])
    assert op.completions == [False]
    assert purgatory.parked() == 0


def test_an_event_completes_only_the_satisfied_operations_of_its_key(
    purgatory: Purgatory[str],
) -> None:
    on_a, other_on_a, on_b = Flag(1_000), Flag(1_000), Flag(1_000)
    assert not purgatory.try_complete_else_watch(on_a, ["a"])
    assert not purgatory.try_complete_else_watch(other_on_a, ["a"])
    assert not purgatory.try_complete_else_watch(on_b, ["b"])
    assert purgatory.parked() == 3
    on_a.ready = on_b.ready = True
    assert purgatory.check_and_complete("a") == 1
    assert (on_a.completions, other_on_a.completions, on_b.completions) == ([False], [], [])
    assert purgatory.parked() == 2
    assert purgatory.check_and_complete("a") == 0  # once only
    assert on_a.completions == [False]


def test_an_operation_watched_under_several_keys_completes_once(
    purgatory: Purgatory[str],
) -> None:
    op = Flag(1_000)
    assert not purgatory.try_complete_else_watch(op, ["a", "b", "a"])
    op.ready = True
    assert purgatory.check_and_complete("b") == 1
    assert purgatory.check_and_complete("a") == 0
    assert op.completions == [False]
    assert purgatory.parked() == 0


def test_deadlines_expire_in_order_on_the_clock(
    clock: ManualClock, purgatory: Purgatory[str]
) -> None:
    early, late, forever = Flag(100), Flag(200), Flag(None)
    for op in (late, early, forever):
        assert not purgatory.try_complete_else_watch(op, ["a"])
    assert purgatory.expire_due() == 0
    clock.advance(100)
    assert purgatory.expire_due() == 1
    assert (early.completions, late.completions) == ([True], [])
    clock.advance(100)
    assert purgatory.expire_due() == 1
    assert late.completions == [True]
    assert forever.completions == []
    assert purgatory.parked() == 1


def test_a_cancelled_operation_never_completes_and_frees_its_place(
    clock: ManualClock, purgatory: Purgatory[str]
) -> None:
    op = Flag(100)
    assert not purgatory.try_complete_else_watch(op, ["a"])
    assert purgatory.cancel(op)
    assert not purgatory.cancel(op)
    assert purgatory.parked() == 0
    op.ready = True
    assert purgatory.check_and_complete("a") == 0
    clock.advance(1_000)
    assert purgatory.expire_due() == 0
    assert op.completions == []


def test_cancelled_timers_do_not_pile_up(clock: ManualClock, purgatory: Purgatory[str]) -> None:
    for _ in range(10_000):
        op = Flag(1_000_000)
        purgatory.try_complete_else_watch(op, ["a"])
        purgatory.cancel(op)
    purgatory.expire_due()  # the rebuild happens on the timer's path
    assert len(purgatory._timers) <= 2_048
    assert purgatory.parked() == 0


def test_close_completes_everything_now_and_later(purgatory: Purgatory[str]) -> None:
    waiting = Flag(None)
    assert not purgatory.try_complete_else_watch(waiting, ["a"])
    purgatory.close()
    assert waiting.completions == [True]
    late = Flag(None)
    assert purgatory.try_complete_else_watch(late, ["a"])
    assert late.completions == [True]


def test_the_reaper_thread_expires_without_being_asked(clock: ManualClock) -> None:
    purgatory: Purgatory[str] = Purgatory("reaper", clock)
    purgatory.start()
    try:
        done = threading.Event()

        class Signal(Flag):
            def on_complete(self) -> None:
                super().on_complete()
                done.set()

        op = Signal(50)
        assert not purgatory.try_complete_else_watch(op, ["a"])
        clock.advance(50)
        assert done.wait(10)  # the reaper re-reads the manual clock within 200 ms
        assert op.completions == [True]
    finally:
        purgatory.close()


# --- the core's parked fetches and produces ---------------------------------------------


@pytest.fixture
def core(tmp_path: Path, clock: ManualClock) -> Iterator[BrokerCore]:
    core = BrokerCore.open(BrokerConfig(data_dir=tmp_path), clock)
    core.create_topic("t", 1, {})
    yield core
    core.close()


def _long_poll(offset: int = 0, wait_ms: int = 10_000) -> FetchSpec:
    return FetchSpec([PartitionFetchSpec("t", 0, offset)], max_wait_ms=wait_ms, min_bytes=1)


def test_a_fetch_parks_and_an_append_wakes_it(core: BrokerCore) -> None:
    woken = threading.Event()
    pending = core.start_fetch(_long_poll(), wake=woken.set)
    assert core.step_fetch(pending) is None
    assert core.parked_operations()["fetch"] == 1
    assert not woken.is_set()
    core.produce([PartitionRecords("t", 0, make_batch([b"v"]))], Acks.LEADER)
    assert woken.is_set()  # on the appending thread, no thread waited
    assert core.parked_operations()["fetch"] == 0
    answers = core.step_fetch(pending)
    assert answers is not None
    assert answers[0].records


def test_an_append_between_the_read_and_the_park_still_wakes_the_fetch(
    core: BrokerCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append that lands after the fetch read (nothing) and before it parks: its
    wake-up finds no watcher, so the park itself must see the log grew. (The end offsets
    used to be taken after the read, counting such a record as seen: the fetch slept to
    its deadline.)"""
    fetch_path = core._fetch
    read_all = fetch_path._read_all

    def read_then_append(
        spec: FetchSpec, parts: Sequence[PartitionFetchSpec]
    ) -> list[PartitionFetched]:
        answers = read_all(spec, parts)
        monkeypatch.setattr(fetch_path, "_read_all", read_all)  # once
        core.produce([PartitionRecords("t", 0, make_batch([b"late"]))], Acks.LEADER)
        return answers

    monkeypatch.setattr(fetch_path, "_read_all", read_then_append)
    woken = threading.Event()
    pending = core.start_fetch(_long_poll(), wake=woken.set)
    assert core.step_fetch(pending) is None  # read nothing, parked
    assert woken.is_set()  # completed by the park's own check, not by its deadline
    answers = core.step_fetch(pending)
    assert answers is not None
    assert answers[0].records


def test_a_parked_fetch_expires_at_its_deadline(core: BrokerCore, clock: ManualClock) -> None:
    woken = threading.Event()
    pending = core.start_fetch(_long_poll(wait_ms=500), wake=woken.set)
    assert core.step_fetch(pending) is None
    clock.advance(499)
    assert core._fetch_purgatory.expire_due() == 0
    clock.advance(1)
    assert core._fetch_purgatory.expire_due() == 1
    assert woken.is_set()
    answers = core.step_fetch(pending)
    assert answers is not None
    assert answers[0].records == b""


def test_a_cancelled_fetch_leaves_nothing_parked(core: BrokerCore) -> None:
    woken = threading.Event()
    pending = core.start_fetch(_long_poll(), wake=woken.set)
    assert core.step_fetch(pending) is None
    core.cancel_fetch(pending)
    assert core.parked_operations()["fetch"] == 0
    core.produce([PartitionRecords("t", 0, make_batch([b"v"]))], Acks.LEADER)
    assert not woken.is_set()


def test_closing_answers_a_parked_fetch_without_reading(core: BrokerCore) -> None:
    woken = threading.Event()
    pending = core.start_fetch(_long_poll(), wake=woken.set)
    assert core.step_fetch(pending) is None
    core.begin_close()
    assert woken.is_set()
    answers = core.step_fetch(pending)
    assert answers is not None
    assert answers[0].records == b""


def test_acks_all_is_answered_by_the_group_fsync(core: BrokerCore) -> None:
    appends = core.append([PartitionRecords("t", 0, make_batch([b"a", b"b"]))])
    delivered = threading.Event()
    box: list[list[PartitionProduced]] = []

    def deliver(answers: list[PartitionProduced]) -> None:
        box.append(answers)
        delivered.set()

    core.complete(appends, Acks.ALL, deliver)
    assert delivered.wait(10)
    assert [(a.error_code, a.base_offset) for a in box[0]] == [("", 0)]
    assert core.logs.get_log("t", 0).recovery_point >= 2
    assert core.parked_operations()["produce"] == 0


def test_acks_1_is_answered_on_the_calling_thread(core: BrokerCore) -> None:
    appends = core.append([PartitionRecords("t", 0, make_batch([b"a"]))])
    box: list[list[PartitionProduced]] = []
    core.complete(appends, Acks.LEADER, box.append)
    assert [(a.error_code, a.base_offset) for a in box[0]] == [("", 0)]


class CountedFlag(Flag):
    """A ``Flag`` that counts its full checks."""

    def __init__(self, deadline_ms: int | None) -> None:
        super().__init__(deadline_ms)
        self.checks = 0

    def is_satisfied(self) -> bool:
        self.checks += 1
        return super().is_satisfied()


def test_a_park_with_no_event_since_the_state_was_taken_skips_its_checks(
    purgatory: Purgatory[str],
) -> None:
    """``quiet_since``: the stamp read before the operation's state was taken. No event
    since: nothing it watches moved, its full checks are skipped (a follower's parked
    session fetch walked 3,333 partitions twice per park, issue #34), and a later event
    still completes it through the watch."""
    stamp = purgatory.stamp
    op = CountedFlag(deadline_ms=100)
    assert not purgatory.try_complete_else_watch(op, ["a", "b"], quiet_since=stamp)
    assert op.checks == 0
    op.ready = True
    assert purgatory.check_and_complete("b") == 1
    assert op.completions == [False]


def test_an_event_after_the_state_was_taken_makes_the_park_check(
    purgatory: Purgatory[str],
) -> None:
    """An event between taking the state and parking (on any key: its watcher was not
    there yet) changes the stamp: the park checks, and completes what moved."""
    stamp = purgatory.stamp
    op = CountedFlag(deadline_ms=100)
    op.ready = True  # the state moved after it was taken...
    assert purgatory.check_and_complete("a") == 0  # ...and its event found no watcher
    assert purgatory.try_complete_else_watch(op, ["a"], quiet_since=stamp)
    assert op.checks == 1
    assert op.completions == [False]
    assert purgatory.parked() == 0
    # Without a stamp (quiet_since None) the checks always run.
    other = CountedFlag(deadline_ms=100)
    assert not purgatory.try_complete_else_watch(other, ["c"])
    assert other.checks == 2
