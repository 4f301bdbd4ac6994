"""The history checker is itself tested (issue #29).

Legal histories come from a simulated correct log (``_Simulation``): producers with and
without idempotence, sends that fail, time out before or after being written, or are
written twice by a plain producer's retry; transactions that commit, abort or end
unknown, with their markers taking offsets; a consumer group whose partitions move
between members, commits that fail or end unknown, resets; retention that moves the log
start. The checker must find nothing in them. Then exactly one anomaly of each kind is
made by hand (``_INJECTIONS``) and must be the only kind reported. A few small histories
written out in full pin down the edges of each definition.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.faults.checker import AnomalyKind, _inversions, check, main
from tests.faults.history import (
    Commit,
    FinalRead,
    History,
    Note,
    Op,
    Outcome,
    Poll,
    Record,
    Recorder,
    Seek,
    Send,
    TxnAbort,
    TxnCommit,
    dump_jsonl,
    load_jsonl,
    save,
)

Tp = tuple[str, int]
_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)


# -- a correct log, simulated ------------------------------------------------------------


@dataclass(slots=True)
class _Entry:
    value: str | None  # None: a transaction marker
    txn: int | None


@dataclass(slots=True)
class _Pending:
    value: str
    tp: Tp
    start_ns: int
    plan: str  # ok, failed, unknown-written, unknown-lost, retried (written twice)
    offsets: list[int] = field(default_factory=list)

    def copies(self) -> int:
        return {"ok": 1, "unknown-written": 1, "retried": 2}.get(self.plan, 0)


@dataclass(slots=True)
class _Producer:
    name: str
    idempotent: bool
    pending: list[_Pending] = field(default_factory=list)


@dataclass(slots=True)
class _Txn:
    number: int
    values: list[str] = field(default_factory=list)
    tps: set[Tp] = field(default_factory=set)


class _Simulation:
    """A correct single-copy log with read_committed consumers, driven by ``rng``."""

    def __init__(self, rng: random.Random, partitions: int) -> None:
        self.rng = rng
        self.tps: list[Tp] = [("t", p) for p in range(partitions)]
        self.logs: dict[Tp, list[_Entry]] = {tp: [] for tp in self.tps}
        self.log_start: dict[Tp, int] = dict.fromkeys(self.tps, 0)
        self.txn_state: dict[int, str] = {}
        self.ops: list[Op] = []
        self.time_ns = 0
        self.values = 0
        self.producers = [
            _Producer("p0", idempotent=True),
            _Producer("p1", idempotent=rng.random() < 0.5),
            _Producer("p2", idempotent=False),
        ]
        self.txn: _Txn | None = None
        self.txns = 0
        self.consumers = ["c0", "c1"]
        self.owner: dict[Tp, str] = {tp: rng.choice(self.consumers) for tp in self.tps}
        self.position: dict[Tp, int] = {}
        self.committed: dict[Tp, int] = {}
        for tp in self.tps:
            self._assign(tp, self.owner[tp])

    def tick(self) -> int:
        self.time_ns += 1
        return self.time_ns

    def new_value(self) -> str:
        self.values += 1
        return f"v{self.values}"

    def visible(self, entry: _Entry) -> bool:
        return entry.value is not None and (
            entry.txn is None or self.txn_state[entry.txn] == "committed"
        )

    def stable_end(self, tp: Tp) -> int:
        """The last stable offset: the first offset of an open transaction, or the end."""
        for offset, entry in enumerate(self.logs[tp]):
            if entry.txn is not None and self.txn_state[entry.txn] == "open":
                return offset
        return len(self.logs[tp])

    def append(self, tp: Tp, entry: _Entry) -> int:
        self.logs[tp].append(entry)
        return len(self.logs[tp]) - 1

    # producers

    def invoke_send(self) -> None:
        producer = self.rng.choice(self.producers)
        plans = ["ok"] * 6 + ["failed", "unknown-written", "unknown-lost"]
        if not producer.idempotent:
            plans.append("retried")
        pending = _Pending(
            self.new_value(), self.rng.choice(self.tps), self.tick(), self.rng.choice(plans)
        )
        producer.pending.append(pending)

    def write_send(self) -> None:
        producer = self.rng.choice(self.producers)
        waiting = [p for p in producer.pending if len(p.offsets) < p.copies()]
        if not waiting:
            return
        # Idempotence keeps one producer's records in send order; a plain producer's
        # requests in flight may land in any order.
        pending = waiting[0] if producer.idempotent else self.rng.choice(waiting)
        pending.offsets.append(self.append(pending.tp, _Entry(pending.value, None)))

    def complete_send(self, producer: _Producer | None = None) -> None:
        producer = producer or self.rng.choice(self.producers)
        done = [p for p in producer.pending if len(p.offsets) == p.copies()]
        if not done:
            return
        pending = self.rng.choice(done)
        producer.pending.remove(pending)
        outcome: Outcome = "ok" if pending.plan in ("ok", "retried") else "failed"
        if pending.plan.startswith("unknown"):
            outcome = "unknown"
        self.ops.append(
            Send(
                producer_id=producer.name,
                topic=pending.tp[0],
                partition=pending.tp[1],
                value=pending.value,
                outcome=outcome,
                offset=self.rng.choice(pending.offsets) if outcome == "ok" else None,
                start_ns=pending.start_ns,
                end_ns=self.tick(),
                idempotent=producer.idempotent,
            )
        )

    def step_transaction(self, end: bool = False) -> None:
        if self.txn is None:
            if end:
                return
            self.txns += 1
            self.txn = _Txn(self.txns)
            self.txn_state[self.txns] = "open"
        txn = self.txn
        if not end and (not txn.values or self.rng.random() < 0.6):
            tp = self.rng.choice(self.tps)
            value, start_ns = self.new_value(), self.tick()
            offset = self.append(tp, _Entry(value, txn.number))
            txn.values.append(value)
            txn.tps.add(tp)
            self.ops.append(
                Send(
                    producer_id="tx",
                    topic=tp[0],
                    partition=tp[1],
                    value=value,
                    outcome="ok",
                    offset=offset,
                    start_ns=start_ns,
                    end_ns=self.tick(),
                    transactional=True,
                )
            )
            return
        how = "commit-ok" if end else self.rng.choice(["commit-ok", "commit-failed", "abort", "?"])
        committed = how == "commit-ok" or (how == "?" and self.rng.random() < 0.5)
        self.txn_state[txn.number] = "committed" if committed else "aborted"
        for tp in sorted(txn.tps):
            self.append(tp, _Entry(None, txn.number))
        start_ns, values = self.tick(), tuple(txn.values)
        if how == "abort":
            self.ops.append(
                TxnAbort(
                    producer_id="tx",
                    values=values,
                    outcome="ok",
                    start_ns=start_ns,
                    end_ns=self.tick(),
                )
            )
        else:
            outcomes: dict[str, Outcome] = {"commit-ok": "ok", "commit-failed": "failed"}
            self.ops.append(
                TxnCommit(
                    producer_id="tx",
                    values=values,
                    outcome=outcomes.get(how, "unknown"),
                    start_ns=start_ns,
                    end_ns=self.tick(),
                )
            )
        self.txn = None

    # consumers

    def _assign(self, tp: Tp, consumer: str) -> None:
        self.owner[tp] = consumer
        offset = max(self.committed.get(tp, 0), self.log_start[tp])
        self.position[tp] = offset
        start = self.tick()
        self.ops.append(
            Seek(
                consumer=consumer,
                topic=tp[0],
                partition=tp[1],
                offset=offset,
                start_ns=start,
                end_ns=self.tick(),
            )
        )

    def poll(self) -> None:
        tp = self.rng.choice(self.tps)
        consumer = self.owner[tp]
        if self.position[tp] < self.log_start[tp]:  # out of range: reset to earliest
            self._assign(tp, consumer)
        start = self.tick()
        position = self.position[tp]
        end = min(self.stable_end(tp), position + self.rng.randint(0, 4))
        records: tuple[Record, ...] = tuple(
            (offset, entry.value)
            for offset in range(position, end)
            if self.visible(entry := self.logs[tp][offset]) and entry.value is not None
        )
        self.position[tp] = max(position, end)
        self.ops.append(
            Poll(
                consumer=consumer,
                topic=tp[0],
                partition=tp[1],
                records=records,
                start_ns=start,
                end_ns=self.tick(),
            )
        )

    def commit(self, reset: bool = False) -> None:
        tp = self.rng.choice(self.tps)
        offset = self.position[tp]
        outcome: Outcome = self.rng.choice(["ok", "ok", "ok", "failed", "unknown"])
        if reset:
            offset, outcome = self.rng.randint(0, offset), "ok"
        if outcome == "ok" or (outcome == "unknown" and self.rng.random() < 0.5):
            self.committed[tp] = offset
        start = self.tick()
        self.ops.append(
            Commit(
                group="g",
                consumer=self.owner[tp],
                topic=tp[0],
                partition=tp[1],
                offset=offset,
                outcome=outcome,
                start_ns=start,
                end_ns=self.tick(),
                reset=reset,
            )
        )
        if reset:
            self._assign(tp, self.owner[tp])

    def rebalance(self) -> None:
        tp = self.rng.choice(self.tps)
        self._assign(tp, self.rng.choice(self.consumers))

    def retention(self) -> None:
        tp = self.rng.choice(self.tps)
        self.log_start[tp] = self.rng.randint(self.log_start[tp], self.stable_end(tp))

    # the run

    def run(self, steps: int) -> tuple[Op, ...]:
        self.ops.append(Note(text="simulated", start_ns=self.tick(), end_ns=self.tick()))
        actions: list[tuple[Callable[[], None], int]] = [
            (self.invoke_send, 8),
            (self.write_send, 8),
            (self.complete_send, 6),
            (self.step_transaction, 3),
            (self.poll, 8),
            (self.commit, 3),
            (lambda: self.commit(reset=True), 1),
            (self.rebalance, 1),
            (self.retention, 1),
        ]
        choices, weights = zip(*actions, strict=True)
        for _ in range(steps):
            self.rng.choices(choices, weights)[0]()
        self.step_transaction(end=True)
        for producer in self.producers:
            for pending in producer.pending:
                while len(pending.offsets) < pending.copies():
                    pending.offsets.append(self.append(pending.tp, _Entry(pending.value, None)))
            while producer.pending:
                self.complete_send(producer)
        for tp in self.tps:
            start = self.log_start[tp]
            self.ops.append(
                FinalRead(
                    topic=tp[0],
                    partition=tp[1],
                    log_start_offset=start,
                    log_end_offset=len(self.logs[tp]),
                    records=tuple(
                        (offset, entry.value)
                        for offset, entry in enumerate(self.logs[tp])
                        if offset >= start and self.visible(entry) and entry.value is not None
                    ),
                    start_ns=self.tick(),
                    end_ns=self.tick(),
                )
            )
        return tuple(self.ops)


@st.composite
def legal_histories(draw: st.DrawFn) -> tuple[Op, ...]:
    # A seeded ``random.Random`` rather than ``st.randoms()``: a simulation makes thousands
    # of choices, and drawing each through hypothesis makes the file ten times slower.
    # Failures print the seed; they do not shrink, but the step count and partitions do.
    seed = draw(st.integers(0, 2**32 - 1), label="seed")
    partitions = draw(st.integers(1, 3), label="partitions")
    steps = draw(st.integers(0, 200), label="steps")
    return _Simulation(random.Random(seed), partitions).run(steps)


# -- one anomaly, made by hand -----------------------------------------------------------


def _tp(op: Send | Poll | Seek | Commit | FinalRead) -> Tp:
    return (op.topic, op.partition)


def _finals(history: History) -> dict[Tp, FinalRead]:
    return {_tp(op): op for op in history if isinstance(op, FinalRead)}


def _replace(history: History, old: Op, new: Op) -> tuple[Op, ...]:
    return tuple(new if op is old else op for op in history)


def _without_record(final: FinalRead, offset: int) -> FinalRead:
    return dataclasses.replace(final, records=tuple(r for r in final.records if r[0] != offset))


def _acknowledged_in_final(history: History) -> Iterator[tuple[Send, FinalRead]]:
    finals = _finals(history)
    for op in history:
        if isinstance(op, Send) and op.outcome == "ok" and not op.transactional:
            final = finals[_tp(op)]
            if (op.offset, op.value) in final.records:
                yield op, final


def inject_lost_write(history: History, rng: random.Random) -> History | None:
    candidates = list(_acknowledged_in_final(history))
    if not candidates:
        return None
    send, final = rng.choice(candidates)
    assert send.offset is not None
    return _replace(history, final, _without_record(final, send.offset))


def inject_divergent_offset(history: History, rng: random.Random) -> History | None:
    finals = _finals(history)
    candidates = [
        (poll, i)
        for poll in history
        if isinstance(poll, Poll)
        for i, (offset, _) in enumerate(poll.records)
        if offset in dict(finals[_tp(poll)].records)
    ]
    if not candidates:
        return None
    poll, i = rng.choice(candidates)
    records = list(poll.records)
    records[i] = (records[i][0], "divergent")
    return _replace(history, poll, dataclasses.replace(poll, records=tuple(records)))


def inject_reorder(history: History, rng: random.Random) -> History | None:
    sends = [op for op in history if isinstance(op, Send) and op.offset is not None]
    pairs = [
        (a, b)
        for a in sends
        for b in sends
        if not a.transactional
        and (a.producer_id, _tp(a)) == (b.producer_id, _tp(b))
        and (a.start_ns if a.idempotent else a.end_ns) < b.start_ns
    ]
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    swap = {(a.offset, a.value): b.value, (b.offset, b.value): a.value}

    def swapped(records: tuple[Record, ...]) -> tuple[Record, ...]:
        return tuple((offset, swap.get((offset, value), value)) for offset, value in records)

    out: list[Op] = []
    for op in history:
        if op is a or op is b:
            op = dataclasses.replace(op, offset=(b if op is a else a).offset)
        elif isinstance(op, Poll | FinalRead) and _tp(op) == _tp(a):
            op = dataclasses.replace(op, records=swapped(op.records))
        out.append(op)
    return tuple(out)


def inject_duplicate(history: History, rng: random.Random) -> History | None:
    candidates = [(s, f) for s, f in _acknowledged_in_final(history) if s.idempotent]
    if not candidates:
        return None
    send, final = rng.choice(candidates)
    end = final.log_end_offset
    copy = dataclasses.replace(
        final, records=(*final.records, (end, send.value)), log_end_offset=end + 1
    )
    return _replace(history, final, copy)


def inject_backwards_commit(history: History, rng: random.Random) -> History | None:
    commits = [op for op in history if isinstance(op, Commit)]
    last_reset: dict[Tp, int] = {}
    for commit in commits:
        if commit.reset:
            last_reset[_tp(commit)] = max(last_reset.get(_tp(commit), -1), commit.end_ns)
    candidates = [
        c
        for c in commits
        if c.outcome == "ok"
        and not c.reset
        and c.offset > 0
        and c.start_ns > last_reset.get(_tp(c), -1)
    ]
    if not candidates:
        return None
    larger = rng.choice(candidates)
    end = max(op.end_ns for op in history)
    smaller = dataclasses.replace(
        larger, offset=larger.offset - 1, start_ns=end + 1, end_ns=end + 2
    )
    return (*history, smaller)


def inject_skipped_record(history: History, rng: random.Random) -> History | None:
    finals = _finals(history)
    streams: dict[tuple[str, Tp], list[tuple[Poll, int] | None]] = {}
    for op in history:
        if isinstance(op, Seek):
            streams.setdefault((op.consumer, _tp(op)), []).append(None)  # a seek: a boundary
        elif isinstance(op, Poll):
            stream = streams.setdefault((op.consumer, _tp(op)), [])
            stream.extend((op, i) for i in range(len(op.records)))
    # A read with something before it in its stream (a seek or a read: either says where
    # reading resumes) and a read right after it: without it, that next read skips it.
    candidates: list[tuple[Poll, int]] = []
    for stream in streams.values():
        for k in range(1, len(stream) - 1):
            read, after = stream[k], stream[k + 1]
            if read is not None and after is not None:
                poll, i = read
                if poll.records[i][0] in dict(finals[_tp(poll)].records):
                    candidates.append(read)
    if not candidates:
        return None
    poll, i = rng.choice(candidates)
    records = poll.records[:i] + poll.records[i + 1 :]
    return _replace(history, poll, dataclasses.replace(poll, records=records))


def inject_nonmonotonic_poll(history: History, rng: random.Random) -> History | None:
    last: dict[tuple[str, Tp], Poll | None] = {}
    for op in history:
        if isinstance(op, Seek):
            last[(op.consumer, _tp(op))] = None
        elif isinstance(op, Poll) and op.records:
            last[(op.consumer, _tp(op))] = op
    candidates = [poll for poll in last.values() if poll is not None]
    if not candidates:
        return None
    poll = rng.choice(candidates)
    end = max(op.end_ns for op in history)
    again = dataclasses.replace(poll, records=poll.records[-1:], start_ns=end + 1, end_ns=end + 2)
    return (*history, again)


def inject_phantom_write(history: History, rng: random.Random) -> History | None:
    candidates = [send for send, _ in _acknowledged_in_final(history)]
    if not candidates:
        return None
    send = rng.choice(candidates)
    return _replace(history, send, dataclasses.replace(send, outcome="failed", offset=None))


def _committed_transactions(history: History) -> Iterator[tuple[TxnCommit, list[Send]]]:
    finals = _finals(history)
    sends = {op.value: op for op in history if isinstance(op, Send)}
    for op in history:
        if isinstance(op, TxnCommit) and op.outcome == "ok":
            txn_sends = [sends[value] for value in op.values]
            if all((s.offset, s.value) in finals[_tp(s)].records for s in txn_sends):
                yield op, txn_sends


def inject_aborted_read(history: History, rng: random.Random) -> History | None:
    candidates = [txn for txn, _ in _committed_transactions(history)]
    if not candidates:
        return None
    txn = rng.choice(candidates)
    aborted = TxnAbort(
        producer_id=txn.producer_id,
        values=txn.values,
        outcome="ok",
        start_ns=txn.start_ns,
        end_ns=txn.end_ns,
    )
    return _replace(history, txn, aborted)


def inject_partial_transaction(history: History, rng: random.Random) -> History | None:
    candidates = [(t, s) for t, s in _committed_transactions(history) if len(s) >= 2]
    if not candidates:
        return None
    _, sends = rng.choice(candidates)
    send = rng.choice(sends)
    assert send.offset is not None
    final = _finals(history)[_tp(send)]
    return _replace(history, final, _without_record(final, send.offset))


_INJECTIONS: dict[AnomalyKind, Callable[[History, random.Random], History | None]] = {
    "lost-write": inject_lost_write,
    "divergent-offset": inject_divergent_offset,
    "reorder": inject_reorder,
    "duplicate": inject_duplicate,
    "backwards-commit": inject_backwards_commit,
    "skipped-record": inject_skipped_record,
    "nonmonotonic-poll": inject_nonmonotonic_poll,
    "phantom-write": inject_phantom_write,
    "aborted-read": inject_aborted_read,
    "partial-transaction": inject_partial_transaction,
}


# -- properties --------------------------------------------------------------------------


@_SETTINGS
@given(legal_histories())
def test_a_correct_log_has_no_anomaly(history: tuple[Op, ...]) -> None:
    report = check(history)
    assert report.anomalies == ()
    counts = report.counts
    sends = [op for op in history if isinstance(op, Send)]
    assert counts.sends == len(sends)
    assert counts.acknowledged + counts.failed + counts.unknown == counts.sends
    assert counts.unknown_appeared + counts.unknown_not_appeared == counts.unknown
    assert counts.failed_appeared == 0
    assert (
        counts.acknowledged_checked
        + counts.acknowledged_beyond_retention
        + counts.acknowledged_unverified
        == sum(1 for s in sends if s.outcome == "ok" and not s.transactional)
    )


@pytest.mark.parametrize("kind", sorted(_INJECTIONS))
@_SETTINGS
@given(history=legal_histories(), seed=st.integers(0, 2**32 - 1))
def test_each_anomaly_made_by_hand_is_caught(
    kind: AnomalyKind, history: tuple[Op, ...], seed: int
) -> None:
    broken = _INJECTIONS[kind](history, random.Random(seed))
    assume(broken is not None)
    assert broken is not None
    report = check(broken)
    assert report.kinds() == {kind}, report.summary()


@_SETTINGS
@given(legal_histories())
def test_a_history_survives_json_lines(history: tuple[Op, ...]) -> None:
    out = io.StringIO()
    dump_jsonl(history, out)
    assert load_jsonl(out.getvalue().splitlines()) == history


@given(
    st.lists(
        st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 5), st.integers(0, 30)),
        max_size=30,
    ),
    st.integers(-1, 30),
)
def test_inversions_match_the_pairwise_definition(
    items: list[tuple[int, int, int, int]], cut: int
) -> None:
    offsets = [offset for offset, _, _, _ in items]
    starts = [start for _, start, _, _ in items]
    ends = [start + length for _, start, length, _ in items]
    cuts = [float(cut if c % 2 else -1) for _, _, _, c in items]
    pairs = _inversions(offsets, before=ends, after=starts, starts=starts, cuts=cuts)
    expected: dict[int, int] = {}
    for j in range(len(items)):
        earlier = [
            i
            for i in range(len(items))
            if ends[i] < starts[j] and starts[i] > cuts[j] and offsets[i] > offsets[j]
        ]
        if earlier:
            expected[j] = max(offsets[i] for i in earlier)
    assert {j: offsets[i] for i, j in pairs} == expected
    for i, j in pairs:
        assert ends[i] < starts[j]
        assert starts[i] > cuts[j]


# -- small histories, written out --------------------------------------------------------


def _send(
    value: str,
    offset: int | None,
    at: tuple[int, int],
    outcome: Outcome = "ok",
    *,
    producer: str = "p",
    idempotent: bool = True,
    transactional: bool = False,
) -> Send:
    return Send(
        producer_id=producer,
        topic="t",
        partition=0,
        value=value,
        outcome=outcome,
        offset=offset,
        start_ns=at[0],
        end_ns=at[1],
        idempotent=idempotent,
        transactional=transactional,
    )


def _final(*records: Record, start: int = 0, end: int | None = None) -> FinalRead:
    last = records[-1][0] + 1 if records else start
    return FinalRead(
        topic="t",
        partition=0,
        log_start_offset=start,
        log_end_offset=last if end is None else end,
        records=records,
        start_ns=1000,
        end_ns=1001,
    )


def _poll(consumer: str, *records: Record, at: int = 0) -> Poll:
    return Poll(
        consumer=consumer, topic="t", partition=0, records=records, start_ns=at, end_ns=at + 1
    )


def _seek(consumer: str, offset: int, at: int = 0) -> Seek:
    return Seek(consumer=consumer, topic="t", partition=0, offset=offset, start_ns=at, end_ns=at)


def _commit(
    offset: int, at: tuple[int, int], outcome: Outcome = "ok", reset: bool = False
) -> Commit:
    return Commit(
        group="g",
        consumer="c",
        topic="t",
        partition=0,
        offset=offset,
        outcome=outcome,
        start_ns=at[0],
        end_ns=at[1],
        reset=reset,
    )


def test_a_lost_write_by_hand() -> None:
    history: list[Op] = [_send("a", 0, (0, 1)), _send("b", 1, (2, 3)), _final((0, "a"), end=2)]
    report = check(history)
    assert report.kinds() == {"lost-write"}
    assert report.anomalies[0].evidence == (history[1], history[2])


def test_an_acknowledged_write_under_the_log_start_is_not_judged() -> None:
    history: list[Op] = [_send("a", 0, (0, 1)), _send("b", 1, (2, 3)), _final((1, "b"), start=1)]
    report = check(history)
    assert report.valid
    assert report.counts.acknowledged_beyond_retention == 1
    assert report.counts.acknowledged_checked == 1


def test_a_divergent_offset_by_hand() -> None:
    history: list[Op] = [_send("a", 0, (0, 1)), _poll("c", (0, "x"), at=2), _final((0, "a"))]
    assert check(history).kinds() == {"divergent-offset"}


def test_a_reorder_by_hand() -> None:
    # Plain producer: b was sent after a was acknowledged, yet sits before it.
    history: list[Op] = [
        _send("a", 1, (0, 1), idempotent=False),
        _send("b", 0, (2, 3), idempotent=False),
        _final((0, "b"), (1, "a")),
    ]
    assert check(history).kinds() == {"reorder"}


def test_concurrent_sends_of_a_plain_producer_may_land_in_any_order() -> None:
    history: list[Op] = [
        _send("a", 1, (0, 3), idempotent=False),
        _send("b", 0, (1, 2), idempotent=False),
        _final((0, "b"), (1, "a")),
    ]
    assert check(history).valid
    idempotent: list[Op] = [
        _send("a", 1, (0, 3)),
        _send("b", 0, (1, 2)),
        _final((0, "b"), (1, "a")),
    ]
    assert check(idempotent).kinds() == {"reorder"}


def test_a_duplicate_by_hand() -> None:
    history: list[Op] = [_send("a", 0, (0, 1)), _final((0, "a"), (1, "a"))]
    assert check(history).kinds() == {"duplicate"}
    plain: list[Op] = [_send("a", 0, (0, 1), idempotent=False), _final((0, "a"), (1, "a"))]
    report = check(plain)
    assert report.valid
    assert report.counts.duplicates_allowed == 1


def test_a_backwards_commit_by_hand() -> None:
    history: list[Op] = [_commit(5, (0, 1)), _commit(3, (2, 3))]
    assert check(history).kinds() == {"backwards-commit"}


def test_commits_may_go_back_after_a_reset_or_when_concurrent_or_failed() -> None:
    assert check([_commit(5, (0, 1)), _commit(0, (2, 3), reset=True), _commit(3, (4, 5))]).valid
    assert check([_commit(5, (0, 3)), _commit(3, (1, 2))]).valid
    assert check([_commit(5, (0, 1)), _commit(3, (2, 3), outcome="failed")]).valid
    # A reset that may have come between the two still excuses them.
    assert check([_commit(5, (0, 2)), _commit(0, (1, 4), reset=True), _commit(3, (3, 5))]).valid
    # One that ended before the larger commit began does not.
    report = check([_commit(0, (0, 1), reset=True), _commit(5, (2, 3)), _commit(3, (4, 5))])
    assert report.kinds() == {"backwards-commit"}


def test_a_skipped_record_by_hand() -> None:
    final = _final((0, "a"), (1, "b"), (2, "c"))
    assert check([_seek("c", 0), _poll("c", (0, "a"), (2, "c")), final]).kinds() == {
        "skipped-record"
    }
    assert check([_seek("c", 0), _poll("c", (1, "b"), (2, "c")), final]).kinds() == {
        "skipped-record"
    }
    # Without a seek, where the consumer began is unknown; after one, it may start anywhere.
    assert check([_poll("c", (1, "b"), (2, "c")), final]).valid
    assert check([_poll("c", (0, "a")), _seek("c", 2), _poll("c", (2, "c")), final]).valid


def test_offsets_absent_from_the_final_read_are_not_skipped() -> None:
    # Offset 1 is a transaction marker or an aborted record: it is in no read.
    final = _final((0, "a"), (2, "c"))
    assert check([_seek("c", 0), _poll("c", (0, "a")), _poll("c", (2, "c")), final]).valid


def test_a_nonmonotonic_poll_by_hand() -> None:
    final = _final((0, "a"), (1, "b"))
    history: list[Op] = [
        _seek("c", 0),
        _poll("c", (0, "a"), (1, "b")),
        _poll("c", (1, "b"), at=2),
        final,
    ]
    assert check(history).kinds() == {"nonmonotonic-poll"}


def test_a_phantom_write_and_unknown_outcomes_by_hand() -> None:
    history: list[Op] = [
        _send("a", None, (0, 1), "failed"),
        _send("b", None, (2, 3), "unknown"),
        _send("c", None, (4, 5), "unknown"),
        _final((0, "a"), (1, "b")),
    ]
    report = check(history)
    assert report.kinds() == {"phantom-write"}
    counts = report.counts
    assert (counts.failed_appeared, counts.unknown_appeared, counts.unknown_not_appeared) == (
        1,
        1,
        1,
    )


def _txn(cls: type[TxnCommit] | type[TxnAbort], outcome: Outcome, *values: str) -> Op:
    return cls(producer_id="tx", values=values, outcome=outcome, start_ns=10, end_ns=11)


def test_an_aborted_read_by_hand() -> None:
    a = _send("a", 0, (0, 1), transactional=True)
    history: list[Op] = [a, _txn(TxnAbort, "ok", "a"), _poll("c", (0, "a"), at=20), _final()]
    assert check(history).kinds() == {"aborted-read"}
    # A transaction whose end is unknown may have committed.
    assert check([a, _txn(TxnCommit, "unknown", "a"), _final((0, "a"))]).valid


def test_a_partial_transaction_by_hand() -> None:
    a = _send("a", 0, (0, 1), transactional=True)
    b = _send("b", 1, (2, 3), transactional=True)
    for end in (_txn(TxnCommit, "ok", "a", "b"), _txn(TxnCommit, "unknown", "a", "b")):
        assert check([a, b, end, _final((0, "a"), end=3)]).kinds() == {"partial-transaction"}
        assert check([a, b, end, _final((0, "a"), (1, "b"), end=3)]).valid
    committed = _txn(TxnCommit, "ok", "a", "b")
    assert check([a, b, committed, _final(end=3)]).kinds() == {"lost-write"}
    unknown = _txn(TxnCommit, "unknown", "a", "b")
    assert check([a, b, unknown, _final(end=3)]).valid


def test_an_abort_that_may_not_have_happened_excuses_nothing_and_blames_nothing() -> None:
    # Conservative: an abort that failed or timed out leaves the transaction's fate
    # unknown, so a read of it is no aborted read; all-or-nothing still holds.
    a = _send("a", 0, (0, 1), transactional=True)
    b = _send("b", 1, (2, 3), transactional=True)
    for outcome in ("failed", "unknown"):
        end = _txn(TxnAbort, outcome, "a", "b")
        assert check([a, b, end, _final((0, "a"), (1, "b"))]).valid
        assert check([a, b, end, _final(end=3)]).valid
        assert check([a, b, end, _final((0, "a"), end=3)]).kinds() == {"partial-transaction"}


def test_every_final_read_must_hold_every_acknowledged_record() -> None:
    a = _send("a", 0, (0, 1))
    whole, empty = _final((0, "a")), _final(end=1)
    report = check([a, whole, empty])
    assert report.kinds() == {"lost-write"}
    assert {anomaly.evidence[-1] for anomaly in report.anomalies} == {empty}


def test_malformed_histories_are_refused() -> None:
    with pytest.raises(ValueError, match="sent twice"):
        check([_send("a", 0, (0, 1)), _send("a", 1, (2, 3))])
    with pytest.raises(ValueError, match="no transactional send"):
        check([_send("a", 0, (0, 1)), _txn(TxnCommit, "ok", "a")])
    with pytest.raises(ValueError, match="offset exactly when"):
        _send("a", None, (0, 1))
    with pytest.raises(ValueError, match="out of order"):
        _final((1, "a"), (0, "b"))
    with pytest.raises(ValueError, match="line 1: unknown operation"):
        load_jsonl(['{"op": "nap"}'])


# -- the recorder and the command line ---------------------------------------------------


def test_the_recorder_keeps_every_operation_from_every_thread() -> None:
    ticks = iter(range(1_000_000))
    lock = threading.Lock()

    def clock_ns() -> int:
        with lock:
            return next(ticks)

    recorder = Recorder(clock_ns)

    def work(producer: str) -> None:
        for i in range(200):
            start_ns = recorder.now_ns()
            recorder.record(
                _send(
                    f"{producer}-{i}",
                    None,
                    (start_ns, recorder.now_ns()),
                    "unknown",
                    producer=producer,
                )
            )

    threads = [threading.Thread(target=work, args=(f"p{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    history = recorder.history()
    assert len(history) == 800
    for n in range(4):
        mine = [op for op in history if isinstance(op, Send) and op.producer_id == f"p{n}"]
        assert [op.value for op in mine] == [f"p{n}-{i}" for i in range(200)]
        assert all(a.end_ns < b.start_ns for a, b in itertools.pairwise(mine))
    assert check(history).counts.unknown_not_appeared == 800


def test_the_command_line_rechecks_a_saved_history(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    written: list[str] = []
    save([_send("a", 0, (0, 1)), _final((0, "a"))], path)
    assert main([str(path)], written.append) == 0
    assert "valid" in written[-1]
    save([_send("a", 0, (0, 1)), _final((0, "b"))], path)
    assert main([str(path)], written.append) == 1
    assert "lost-write" in written[-1]
    path.write_text("not json\n")
    assert main([str(path)], written.append) == 2
    assert main([], written.append) == 2
