"""The run-based ``SharePartition`` (``broker.share.runs``) against the per-offset one it
replaced (``per_offset_reference.py``: one object an offset, every operation over the
whole window), operation by operation, on random histories (Hypothesis).

A history: records produced (some offsets gaps, as markers and compaction leave),
members acquiring, acknowledging (ranges built from what they hold, split at random
points and given random kinds, and ranges picked at random, most of them refused),
leaving, locks expiring on the clock, retention moving the log start, dead-letter
transactions archiving, and reloads from the persisted view. After every operation both
must agree exactly: the error raised (type and message), or the transition (acquired
ranges, the state batches to write, the start and end offsets, whether the start moved
and whether anything changed), and once applied the records offset by offset, the
statistics, the persisted view and the records waiting to be dead-lettered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.broker.share import per_offset_reference as reference
from tidelog.broker.share.partition import (
    ACCEPT,
    ACQUIRED,
    GAP,
    REJECT,
    RELEASE,
    RETURN,
    Acknowledgement,
    Scan,
    SharePartition,
    SharePartitionConfig,
)
from tidelog.broker.share.records import ARCHIVED, AVAILABLE, ShareSnapshot

MEMBERS = ("m1", "m2", "m3")
LOCK_MS = 1_000
CONFIGS = (
    SharePartitionConfig(
        record_lock_duration_ms=LOCK_MS, delivery_count_limit=2, max_record_locks=12
    ),
    SharePartitionConfig(
        record_lock_duration_ms=LOCK_MS,
        delivery_count_limit=3,
        max_record_locks=30,
        dead_letter_topic="dlq",
    ),
)


@dataclass
class FakeLog:
    """A partition log as a share partition reads it: records up to ``limit``, some
    offsets gaps, the start moved by retention."""

    start: int = 0
    limit: int = 0
    gaps: set[int] = field(default_factory=set)

    def log_start_offset(self) -> int:
        return self.start

    def limit_offset(self) -> int:
        return self.limit

    def scan(self, from_offset: int, max_count: int) -> Scan:
        found: list[int] = []
        for offset in range(from_offset, self.limit):
            if offset not in self.gaps:
                found.append(offset)
                if len(found) == max_count:
                    return Scan(tuple(found), offset + 1)
        return Scan(tuple(found), max(self.limit, from_offset))


KINDS = st.sampled_from((ACCEPT, RELEASE, REJECT, GAP, RETURN))
OPS = st.one_of(
    st.tuples(st.just("produce"), st.integers(1, 8), st.sets(st.integers(0, 7), max_size=3)),
    st.tuples(st.just("acquire"), st.sampled_from(MEMBERS), st.integers(1, 9)),
    st.tuples(
        st.just("ack_held"),
        st.sampled_from(MEMBERS),
        st.lists(st.tuples(st.integers(1, 4), KINDS), min_size=1, max_size=4),
    ),
    st.tuples(
        st.just("ack_any"),
        st.sampled_from(MEMBERS),
        st.lists(st.tuples(st.integers(-2, 30), st.integers(0, 3), KINDS), max_size=3),
    ),
    st.tuples(st.just("release"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("expire"), st.booleans()),
    st.tuples(st.just("retention"), st.integers(1, 5)),
    st.tuples(st.just("dead_letter"), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("reload")),
)


def _call(partition: Any, op: tuple[Any, ...], arg: Any, now: int, log: FakeLog) -> Any:
    """``op`` on ``partition`` (either implementation); ``arg``: the acknowledgements,
    the offsets to archive, or the log start to follow."""
    kind = op[0]
    if kind == "acquire":
        return partition.acquire(op[1], op[2], now, log)
    if kind in ("ack_held", "ack_any"):
        return partition.acknowledge(op[1], arg, now)
    if kind == "release":
        return partition.release_member(op[1], now)
    if kind == "expire":
        return partition.expire(now, arg)
    return partition.archive_dead_lettered(arg, now)


def _outcome(
    partition: Any, op: tuple[Any, ...], arg: Any, now: int, log: FakeLog
) -> tuple[str, Any]:
    try:
        return "ok", _call(partition, op, arg, now, log)
    except Exception as exc:  # ValueError, InvalidRecordStateError, InvalidRequestError
        return "error", (type(exc).__name__, str(exc))


def _same_transition(new: Any, old: Any) -> None:
    assert new.acquired == old.acquired
    assert new.durable == old.durable
    assert (new.start_offset, new.end_offset, new.start_moved) == (
        old.start_offset,
        old.end_offset,
        old.start_moved,
    )
    assert new.needs_write == old.needs_write
    assert new.dead_lettered == old.dead_lettered


def _same_state(new: SharePartition, old: Any) -> None:
    assert (new.start_offset, new.end_offset) == (old.start_offset, old.end_offset)
    assert new.records() == old.records()
    assert new.stats() == old.stats()
    assert new.persisted_view() == old.persisted_view()
    assert new.dead_letter_pending(100) == old.dead_letter_pending(100)
    assert new.acquired_count() == old.acquired_count()


def _held_acks(old: Any, member: str, cuts: list[tuple[int, int]]) -> list[Acknowledgement]:
    """Ranges over what ``member`` holds, consecutive pieces of ``cuts``' lengths."""
    records = old.records().items()
    held = sorted(o for o, r in records if r.state == ACQUIRED and r.member_id == member)
    acks = []
    i = 0
    for length, kind in cuts:
        if i >= len(held):
            break
        piece = held[i : i + length]
        acks.append(Acknowledgement(piece[0], piece[-1], kind))
        i += length
    return acks


@settings(max_examples=400, deadline=None)
@given(config=st.sampled_from(CONFIGS), ops=st.lists(OPS, max_size=40), steps=st.data())
def test_runs_agree_with_the_per_offset_reference(
    config: SharePartitionConfig, ops: list[tuple[Any, ...]], steps: st.DataObject
) -> None:
    log = FakeLog()
    new = SharePartition.new(config, 0)
    old = reference.SharePartition.new(config, 0)
    now = 0
    for op in ops:
        now += steps.draw(st.sampled_from((0, 0, 1, 400, LOCK_MS)), label="advance ms")
        kind = op[0]
        if kind == "produce":
            _, count, gaps = op
            log.gaps.update(log.limit + g for g in gaps if g < count)
            log.limit += count
            continue
        if kind == "retention":
            log.start = min(log.start + op[1], log.limit)
            continue
        if kind == "reload":
            start, batches = new.persisted_view()
            snapshot = ShareSnapshot(0, 0, 0, start, 0, 0, batches)
            new = SharePartition.from_snapshot(config, snapshot)
            old = reference.SharePartition.from_snapshot(config, snapshot)
            _same_state(new, old)
            continue
        if kind == "ack_held":
            arg: Any = _held_acks(old, op[1], op[2])
        elif kind == "ack_any":
            arg = [Acknowledgement(f, f + n, k) for f, n, k in op[2]]
        elif kind == "dead_letter":
            arg = [o for o, _ in old.dead_letter_pending(op[1])]
            if op[2]:
                arg.append(old.end_offset + 1)  # never to be dead-lettered: refused
        else:
            arg = log.start if kind == "expire" and op[1] else None
        before = (old.start_offset, old.end_offset, old.records())
        got_new = _outcome(new, op, arg, now, log)
        got_old = _outcome(old, op, arg, now, log)
        assert got_new[0] == got_old[0], (got_new, got_old)
        if got_old[0] == "error":
            assert got_new == got_old
        else:
            _same_transition(got_new[1], got_old[1])
            new.apply(got_new[1])
            old.apply(got_old[1])
            after = (old.start_offset, old.end_offset, old.records())
            assert got_new[1].changed == (after != before)
        _same_state(new, old)


def test_a_record_returned_unseen_is_not_counted_as_delivered() -> None:
    """RETURN (Tidelog's own kind, a consumer giving back records it fetched ahead and
    never handed out): Available again with the acquisition's delivery taken back, so it
    is not archived by the limit and its next delivery has the count it would have had."""
    config = CONFIGS[0]  # delivery limit 2
    log = FakeLog(limit=3)
    partition = SharePartition.new(config, 0)

    def acquire(member: str) -> list[tuple[int, int, int]]:
        transition = partition.acquire(member, 3, 0, log)
        partition.apply(transition)
        return [(r.first_offset, r.last_offset, r.delivery_count) for r in transition.acquired]

    def ack(member: str, kind: int) -> None:
        partition.apply(partition.acknowledge(member, [Acknowledgement(0, 2, kind)], 0))

    assert acquire("m1") == [(0, 2, 1)]
    ack("m1", RETURN)
    assert {
        o: (r.state, r.delivery_count) for o, r in partition.records().items()
    } == dict.fromkeys(range(3), (AVAILABLE, 0))
    assert acquire("m2") == [(0, 2, 1)]  # the first delivery still
    ack("m2", RELEASE)
    assert acquire("m1") == [(0, 2, 2)]  # at the limit now
    ack("m1", RETURN)  # unseen: back to 1, Available, not archived
    assert {r.state for r in partition.records().values()} == {AVAILABLE}
    assert acquire("m3") == [(0, 2, 2)]
    ack("m3", RELEASE)  # seen at the limit: archived
    assert {r.state for r in partition.records().values()} <= {ARCHIVED}
    start, batches = partition.persisted_view()
    assert start == 3
    assert not batches
