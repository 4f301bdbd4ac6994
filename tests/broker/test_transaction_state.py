"""The transaction coordinator's state machine (``broker.transactions.state``): Kafka's
rules one by one, then a Hypothesis state machine with a zombie producer instance."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidelog.broker.transactions.log_records import decode_value, encode_value
from tidelog.broker.transactions.state import (
    MAX_EPOCH,
    Answer,
    Decision,
    Refuse,
    TxnMetadata,
    TxnState,
    Write,
    add_partitions,
    check_transition,
    complete,
    end_transaction,
    expire,
    fence_timed_out,
    from_log_value,
    init_producer_id,
    to_log_value,
    verify_partitions,
)

MAX_TIMEOUT = 900_000
A = ("out", 0)
B = ("out", 1)


def ids(start: int = 1000) -> itertools.count[int]:
    return itertools.count(start)


def written(decision: Decision, before: TxnMetadata | None) -> TxnMetadata:
    assert isinstance(decision, Write), decision
    check_transition(before, decision.metadata)
    return decision.metadata


def error_of(decision: Decision | None) -> str:
    """The error a refusal names, else what the decision was (so a failure shows it)."""
    return decision.error if isinstance(decision, Refuse) else repr(decision)


def fresh(now: int = 0, timeout: int = 60_000) -> TxnMetadata:
    counter = ids()
    return written(
        init_producer_id(
            None,
            transactional_id="t",
            timeout_ms=timeout,
            max_timeout_ms=MAX_TIMEOUT,
            now_ms=now,
            allocate=lambda: next(counter),
        ),
        None,
    )


def init(current: TxnMetadata | None, now: int, **kwargs: int) -> Decision:
    counter = ids(5000)
    return init_producer_id(
        current,
        transactional_id="t",
        timeout_ms=60_000,
        max_timeout_ms=MAX_TIMEOUT,
        now_ms=now,
        allocate=lambda: next(counter),
        **kwargs,
    )


def test_a_new_id_starts_empty_at_epoch_0_and_each_init_bumps_it() -> None:
    first = fresh()
    assert (first.producer_id, first.producer_epoch, first.state) == (1000, 0, TxnState.EMPTY)
    again = written(init(first, 10), first)
    assert (again.producer_id, again.producer_epoch) == (1000, 1)


def test_a_timeout_above_the_maximum_is_refused() -> None:
    refused = init_producer_id(
        None,
        transactional_id="t",
        timeout_ms=MAX_TIMEOUT + 1,
        max_timeout_ms=MAX_TIMEOUT,
        now_ms=0,
        allocate=lambda: 1,
    )
    assert error_of(refused) == "INVALID_TRANSACTION_TIMEOUT"


def test_init_during_a_transaction_fences_it_by_an_abort_under_a_bumped_epoch() -> None:
    ongoing = written(add_partitions(fresh(), 1000, 0, [A], 5), fresh())
    decision = init(ongoing, 10)
    fenced = written(decision, ongoing)
    assert isinstance(decision, Write)
    assert decision.error == "CONCURRENT_TRANSACTIONS"
    assert (fenced.state, fenced.producer_epoch, fenced.partitions) == (
        TxnState.PREPARE_ABORT,
        1,
        frozenset({A}),
    )
    # The old instance (epoch 0) is fenced from now on; the retry waits for completion.
    stale = end_transaction(fenced, 1000, 0, True, 11)
    assert error_of(stale) == "PRODUCER_FENCED"
    assert isinstance(init(fenced, 12), Refuse)
    done = written(complete(fenced, 13), fenced)
    retried = written(init(done, 14), done)
    assert (retried.state, retried.producer_epoch) == (TxnState.EMPTY, 2)


def test_a_retried_init_with_its_old_epoch_gets_the_same_answer() -> None:
    first = fresh()
    bumped = written(init(first, 1, expected_producer_id=1000, expected_epoch=0), first)
    assert bumped.producer_epoch == 1
    retry = init(bumped, 2, expected_producer_id=1000, expected_epoch=0)
    assert retry == Answer(1000, 1)
    stranger = init(bumped, 3, expected_producer_id=77, expected_epoch=0)
    assert error_of(stranger) == "PRODUCER_FENCED"


def test_an_exhausted_epoch_moves_to_a_new_producer_id() -> None:
    worn = replace(fresh(), producer_epoch=MAX_EPOCH - 1)
    rotated = written(init(worn, 1), worn)
    assert (rotated.producer_id, rotated.producer_epoch) == (5000, 0)
    assert rotated.previous_producer_id == 1000


def test_v1_commit_prepares_then_completes_and_a_retry_is_idempotent() -> None:
    first = fresh()
    ongoing = written(add_partitions(first, 1000, 0, [A, B], 1), first)
    assert ongoing.start_ms == 1
    assert add_partitions(ongoing, 1000, 0, [A], 2) == Answer(1000, 0)  # nothing new
    prepared = written(end_transaction(ongoing, 1000, 0, True, 3), ongoing)
    assert (prepared.state, prepared.producer_epoch) == (TxnState.PREPARE_COMMIT, 0)
    retry = end_transaction(prepared, 1000, 0, True, 4)
    assert error_of(retry) == "CONCURRENT_TRANSACTIONS"
    wrong = end_transaction(prepared, 1000, 0, False, 4)
    assert isinstance(wrong, Refuse)
    done = written(complete(prepared, 5), prepared)
    assert (done.state, done.partitions) == (TxnState.COMPLETE_COMMIT, frozenset())
    assert end_transaction(done, 1000, 0, True, 6) == Answer(1000, 0)
    mismatch = end_transaction(done, 1000, 0, False, 6)
    assert error_of(mismatch) == "INVALID_TXN_STATE"
    empty = end_transaction(first, 1000, 0, True, 6)
    assert error_of(empty) == "INVALID_TXN_STATE"


def test_v2_bumps_the_epoch_at_every_end_and_knows_its_retry() -> None:
    first = fresh()
    ongoing = written(add_partitions(first, 1000, 0, [A], 1), first)
    decision = end_transaction(ongoing, 1000, 0, True, 2, client_version=2)
    prepared = written(decision, ongoing)
    assert isinstance(decision, Write)
    assert decision.producer_epoch == 1
    assert (prepared.producer_epoch, prepared.last_producer_epoch) == (1, 0)
    done = written(complete(prepared, 3), prepared)
    assert end_transaction(done, 1000, 0, True, 4, client_version=2) == Answer(1000, 1)
    # A zombie of the finished transaction (epoch 0) cannot add to the next one.
    late = add_partitions(done, 1000, 0, [B], 5)
    assert error_of(late) == "PRODUCER_FENCED"
    # An abort when unsure, from an idle state, is accepted.
    unsure = written(end_transaction(done, 1000, 1, False, 6, client_version=2), done)
    assert (unsure.state, unsure.producer_epoch) == (TxnState.PREPARE_ABORT, 2)


def test_v2_overflow_finishes_at_the_reserved_epoch_then_moves_to_the_next_id() -> None:
    worn = replace(fresh(), producer_epoch=MAX_EPOCH - 1)
    ongoing = written(add_partitions(worn, 1000, MAX_EPOCH - 1, [A], 1), worn)
    prepared = written(
        end_transaction(
            ongoing, 1000, MAX_EPOCH - 1, True, 2, client_version=2, allocate=lambda: 42
        ),
        ongoing,
    )
    assert (prepared.producer_epoch, prepared.next_producer_id) == (MAX_EPOCH, 42)
    done = written(complete(prepared, 3), prepared)
    assert (done.producer_id, done.producer_epoch, done.previous_producer_id) == (42, 0, 1000)
    # The retry of that EndTxn, under the old identity, is recognised.
    retry = end_transaction(done, 1000, MAX_EPOCH - 1, True, 4, client_version=2)
    assert retry == Answer(42, 0)


def test_a_timed_out_transaction_is_fenced_and_the_producer_learns_it() -> None:
    first = fresh(timeout=1_000)
    ongoing = written(add_partitions(first, 1000, 0, [A], 100), first)
    assert fence_timed_out(ongoing, 1_100) is None
    fenced = written(fence_timed_out(ongoing, 1_101), ongoing)  # type: ignore[arg-type]
    assert (fenced.state, fenced.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    for late in (
        add_partitions(fenced, 1000, 0, [B], 1_102),
        end_transaction(fenced, 1000, 0, True, 1_102),
        end_transaction(fenced, 1000, 0, True, 1_102, client_version=2),
    ):
        assert error_of(late) == "PRODUCER_FENCED", late


def test_verify_only_names_what_was_added() -> None:
    first = fresh()
    ongoing = written(add_partitions(first, 1000, 0, [A], 1), first)
    assert verify_partitions(ongoing, 1000, 0, [A, B]) == {A: "", B: "TRANSACTION_ABORTABLE"}
    assert verify_partitions(ongoing, 1000, 1, [A]) == {A: "PRODUCER_FENCED"}
    assert verify_partitions(None, 1000, 0, [A]) == {A: "INVALID_PRODUCER_ID_MAPPING"}


def test_an_idle_id_expires_as_a_tombstone() -> None:
    first = fresh(now=0)
    assert expire(first, 999, 1_000) is None
    dead = written(expire(first, 1_000, 1_000), first)  # type: ignore[arg-type]
    assert dead.state is TxnState.DEAD
    assert to_log_value(dead) is None
    reborn = written(init(dead, 1_001), None)
    assert reborn.producer_id != first.producer_id


def test_check_transition_refuses_what_kafka_forbids() -> None:
    first = fresh()
    with pytest.raises(ValueError, match="not allowed"):
        check_transition(first, replace(first, state=TxnState.COMPLETE_COMMIT))
    with pytest.raises(ValueError, match="epoch"):
        check_transition(first, replace(first, producer_epoch=5))


states = st.sampled_from(["a", "b"])


class CoordinatorModel(RuleBasedStateMachine):
    """One transactional id, two producer instances ("a" and "b") that init in turns, a
    clock, timeouts and expiry; every decision is applied as the coordinator would."""

    def __init__(self) -> None:
        super().__init__()
        self.current: TxnMetadata | None = None
        self.now = 0
        self.counter = itertools.count(1)
        self.identity: dict[str, tuple[int, int]] = {}
        self.latest: str | None = None
        self.version = {"a": 0, "b": 2}  # "b" speaks transactions v2
        self.added: set[tuple[str, int]] = set()
        self.epochs: dict[int, int] = {}  # highest epoch written per producer id

    def apply(self, decision: Decision) -> Decision:
        if isinstance(decision, Write):
            check_transition(self.current, decision.metadata)
            after = decision.metadata
            assert self.epochs.get(after.producer_id, -1) <= after.producer_epoch
            self.epochs[after.producer_id] = after.producer_epoch
            record = to_log_value(after)
            if record is not None:  # what a reloading coordinator would read back
                reread = from_log_value(after.transactional_id, decode_value(encode_value(record)))
                assert reread == replace(after, last_producer_epoch=-1)
            self.current = None if after.state is TxnState.DEAD else after
        return decision

    @rule(who=states)
    def initialise(self, who: str) -> None:
        self.now += 1
        decision = self.apply(
            init_producer_id(
                self.current,
                transactional_id="t",
                timeout_ms=50,
                max_timeout_ms=MAX_TIMEOUT,
                now_ms=self.now,
                allocate=lambda: next(self.counter),
            )
        )
        if isinstance(decision, Write) and not decision.error:
            self.identity[who] = (decision.producer_id, decision.producer_epoch)
            self.latest = who

    @rule(who=states, partition=st.sampled_from([A, B, ("x", 3)]))
    def add(self, who: str, partition: tuple[str, int]) -> None:
        if who not in self.identity:
            return
        self.now += 1
        pid, epoch = self.identity[who]
        before = self.current
        decision = self.apply(add_partitions(before, pid, epoch, [partition], self.now))
        if not isinstance(decision, Refuse):
            assert who == self.latest, "a fenced instance added a partition"
            if before is None or before.state is not TxnState.ONGOING:
                self.added = set()
            self.added.add(partition)

    @rule(who=states, commit=st.booleans())
    def end(self, who: str, commit: bool) -> None:
        if who not in self.identity:
            return
        self.now += 1
        pid, epoch = self.identity[who]
        before = self.current
        ongoing = before is not None and before.state is TxnState.ONGOING
        decision = self.apply(
            end_transaction(
                before,
                pid,
                epoch,
                commit,
                self.now,
                client_version=self.version[who],
                allocate=lambda: next(self.counter),
            )
        )
        if isinstance(decision, Write):
            assert who == self.latest, "a fenced instance ended a transaction"
            # Every partition added since the transaction began, and no other.
            assert decision.metadata.partitions == (frozenset(self.added) if ongoing else set())
            self.identity[who] = (decision.producer_id, decision.producer_epoch)

    @precondition(lambda self: self.current is not None and self.current.state.is_prepare)
    @rule()
    def markers_written(self) -> None:
        self.now += 1
        assert self.current is not None
        decision = self.apply(complete(self.current, self.now))
        if self.latest is not None and isinstance(decision, Write):
            pid, _ = self.identity[self.latest]
            if decision.metadata.previous_producer_id == pid and decision.producer_epoch == 0:
                self.identity[self.latest] = (decision.producer_id, 0)  # v2 overflow

    @rule(ticks=st.integers(1, 80))
    def time_passes(self, ticks: int) -> None:
        self.now += ticks
        if self.current is not None:
            fenced = fence_timed_out(self.current, self.now)
            if fenced is not None:
                self.apply(fenced)
                self.latest = None  # nobody holds the new epoch
            else:
                dead = expire(self.current, self.now, 500)
                if dead is not None:
                    self.apply(dead)

    @rule()
    def worn_epoch(self) -> None:
        """Jump an idle id's epoch to the edge of exhaustion (as years of restarts would)."""
        if self.current is not None and self.current.state.is_idle and self.latest is None:
            self.current = replace(self.current, producer_epoch=MAX_EPOCH - 1)
            self.epochs[self.current.producer_id] = MAX_EPOCH - 1

    @invariant()
    def complete_and_empty_states_hold_no_partitions(self) -> None:
        if self.current is not None and self.current.state.is_idle:
            assert not self.current.partitions


TestCoordinatorModel = CoordinatorModel.TestCase
TestCoordinatorModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
