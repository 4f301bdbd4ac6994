"""The checker of a fault-test history (issue #29): ``check(history) -> Report``.

Pure: no clock, file or socket; ``python -m tests.faults.checker history.jsonl`` re-checks a
saved history (exit status 0 valid, 1 anomalies, 2 unreadable). The history model and its
assumptions are in ``tests.faults.history``; in short, values are unique, consumers read
committed data, and the final reads see every partition whole after all faults healed.

Words. A *read* is a record returned by a ``Poll`` or a ``FinalRead``. A send's *effective
outcome* is its own outcome, except for a transactional send: ``failed`` if the send
failed or its transaction definitely did not commit (``TxnAbort`` ok, or ``TxnCommit``
failed), ``ok`` if its ``TxnCommit`` is ok, ``unknown`` otherwise (no end recorded, commit
unknown, abort failed or unknown). An *acknowledged* send has effective outcome ``ok``.
A final read *covers* offset ``o`` when ``o >= log_start_offset``: below it, retention may
have removed the record, so nothing is concluded there. A value is *definitely absent*
when a final read of its partition lacks it and covers its offset (its acknowledged
offset, or any offset when that final read starts at 0).

Anomalies (``Anomaly.kind``):

* ``lost-write``: a non-transactional acknowledged send whose value is not at its
  acknowledged offset in a final read of its partition that covers that offset (missing,
  elsewhere, or another value there); or a record read (by a poll, or by another final
  read) at an offset that a final read covers but holds no record at (its value neither
  transactional nor from a send that definitely failed: those are the kinds below),
  consumers reading committed records only; or a transaction that is
  acknowledged, or of which some value was read, whose values are all definitely absent;
  or a send of a committed transaction (effective outcome ok) acknowledged at an offset
  that a final read covers, where that final read holds another value, or holds its
  value at another offset (its absence alone is the transaction's anomaly, below).
* ``divergent-offset``: two reads of one topic-partition-offset with different values.
* ``reorder``: two sends A and B of one producer to one partition, both with outcome ok,
  where A precedes B but ``offset(A) > offset(B)``. *Precedes* means in real time
  (``A.end_ns < B.start_ns``), or for an idempotent producer in send order
  (``A.start_ns < B.start_ns``: a producer is one thread and one producer session, so
  idempotence keeps its order even with several requests in flight).
* ``duplicate``: one value read at two different topic-partition-offsets, its send being
  idempotent or transactional (a plain producer's retries may legally duplicate; those
  are counted as ``duplicates_allowed``).
* ``backwards-commit``: two commits A and B of one group to one partition, both ok and
  neither a reset, where A precedes B in real time and ``B.offset < A.offset``, and no
  reset commit may have come between them (every reset ended before A started or
  started after B ended).
* ``skipped-record``: a consumer read offset ``b`` of a partition right after reading
  ``a`` (or right after a ``Seek`` to ``a``, then counting ``a`` itself as unread) while a
  final read holds a record at an offset strictly between ``a`` and ``b`` (from ``a`` on,
  after a seek). Offsets missing from the final read (aborted records, transaction
  markers, records removed by retention) are never counted as skipped. A consumer that
  stops early has skipped nothing: only records between two reads count.
* ``nonmonotonic-poll``: a consumer read offset ``b <= a`` right after reading ``a``
  (or ``b < a`` right after a seek to ``a``) with no ``Seek`` between.
* ``phantom-write``: a non-transactional send that definitely failed, yet its value is read.
* ``aborted-read``: a transactional send whose effective outcome is failed, yet its
  value is read (by a poll, or in a final read).
* ``partial-transaction``: a transaction not definitely aborted of which some value is in
  a final read and another is definitely absent. A send that definitely failed
  (``produce`` raised: nothing was queued) is no part of what the transaction commits,
  and its absence counts for nothing here.
* ``uncommitted-read``: a poll returned a transactional value and ended before its
  transaction's ``TxnCommit`` started (whatever that commit's outcome): a read_committed
  consumer saw a record before anyone asked to commit it. (A read of a transaction that
  ended with a definite abort is an ``aborted-read``; one ended by an abort that may not
  have happened, or not ended at all, is not judged here.)

Out of scope (the workload must avoid them): compacted topics, records deleted at the
head by anything other than retention (reads below a final read's start are never
judged), a consumer position reset to the latest offset without a ``Seek``.
"""

from __future__ import annotations

import sys
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal, Protocol, TypeAlias

from tests.faults.history import (
    Commit,
    FinalRead,
    History,
    Op,
    Outcome,
    Poll,
    Seek,
    Send,
    TxnAbort,
    TxnCommit,
    load,
)

AnomalyKind: TypeAlias = Literal[
    "lost-write",
    "divergent-offset",
    "reorder",
    "duplicate",
    "backwards-commit",
    "skipped-record",
    "nonmonotonic-poll",
    "phantom-write",
    "aborted-read",
    "partial-transaction",
    "uncommitted-read",
]
Tp: TypeAlias = tuple[str, int]
Txn: TypeAlias = TxnCommit | TxnAbort
_SHOWN_OFFSETS = 5


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One broken guarantee: its kind, a sentence for people, and the operations that show it.

    Immutable.
    """

    kind: AnomalyKind
    detail: str
    evidence: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class Counts:
    """What the history holds. Immutable.

    ``acknowledged``, ``failed`` and ``unknown`` split ``sends`` by effective outcome;
    ``*_appeared`` count those whose value was read at least once (a failed one that
    appeared is also a phantom write or an aborted read). The non-transactional
    acknowledged sends split into ``acknowledged_checked`` (some final read covers their
    offset), ``acknowledged_beyond_retention`` (every final read of their partition
    starts past it) and ``acknowledged_unverified`` (their partition has no final read).
    ``duplicates_allowed`` counts values of plain producers read at several offsets.
    """

    sends: int = 0
    acknowledged: int = 0
    acknowledged_checked: int = 0
    acknowledged_beyond_retention: int = 0
    acknowledged_unverified: int = 0
    failed: int = 0
    failed_appeared: int = 0
    unknown: int = 0
    unknown_appeared: int = 0
    unknown_not_appeared: int = 0
    observed_values: int = 0
    duplicates_allowed: int = 0
    polls: int = 0
    commits: int = 0
    transactions: int = 0


@dataclass(frozen=True, slots=True)
class Report:
    """The checker's verdict: ``valid`` when there is no anomaly. Immutable."""

    anomalies: tuple[Anomaly, ...]
    counts: Counts

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def kinds(self) -> frozenset[AnomalyKind]:
        return frozenset(anomaly.kind for anomaly in self.anomalies)

    def summary(self) -> str:
        lines = [
            "counts: "
            + ", ".join(f"{f.name}={getattr(self.counts, f.name)}" for f in fields(self.counts))
        ]
        by_kind: dict[str, int] = defaultdict(int)
        for anomaly in self.anomalies:
            by_kind[anomaly.kind] += 1
        lines.append(
            "valid"
            if self.valid
            else "anomalies: " + ", ".join(f"{k}={n}" for k, n in by_kind.items())
        )
        lines.extend(f"  {anomaly.kind}: {anomaly.detail}" for anomaly in self.anomalies)
        return "\n".join(lines)


@dataclass(slots=True)
class _Final:
    """A final read with its lookups."""

    read: FinalRead
    by_offset: dict[int, str]
    offsets: list[int]
    values: frozenset[str]

    def covers(self, offset: int | None) -> bool:
        if offset is None:
            return self.read.log_start_offset == 0
        return offset >= self.read.log_start_offset


@dataclass(slots=True)
class _Index:
    """Everything ``check`` looks up, built in one pass over the history."""

    sends: dict[str, Send] = field(default_factory=dict)
    txn_of: dict[str, Txn] = field(default_factory=dict)
    txns: list[Txn] = field(default_factory=list)
    finals: dict[Tp, list[_Final]] = field(default_factory=lambda: defaultdict(list))
    # (tp, offset) -> value -> first op that read it; value -> positions it was read at.
    at: dict[tuple[Tp, int], dict[str, Op]] = field(default_factory=lambda: defaultdict(dict))
    positions: dict[str, dict[tuple[Tp, int], Op]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    streams: dict[tuple[str, Tp], list[Poll | Seek]] = field(
        default_factory=lambda: defaultdict(list)
    )
    commits: dict[tuple[str, Tp], list[Commit]] = field(default_factory=lambda: defaultdict(list))
    polls: int = 0

    def read(self, tp: Tp, records: Iterable[tuple[int, str]], op: Op) -> None:
        for offset, value in records:
            self.at[(tp, offset)].setdefault(value, op)
            self.positions[value].setdefault((tp, offset), op)


def _index(history: History) -> _Index:
    index = _Index()
    for op in history:
        if isinstance(op, Send):
            if op.value in index.sends:
                raise ValueError(f"value {op.value!r} sent twice: values must be unique")
            index.sends[op.value] = op
        elif isinstance(op, Poll):
            tp = (op.topic, op.partition)
            index.polls += 1
            index.read(tp, op.records, op)
            index.streams[(op.consumer, tp)].append(op)
        elif isinstance(op, Seek):
            index.streams[(op.consumer, (op.topic, op.partition))].append(op)
        elif isinstance(op, Commit):
            index.commits[(op.group, (op.topic, op.partition))].append(op)
        elif isinstance(op, FinalRead):
            tp = (op.topic, op.partition)
            by_offset = dict(op.records)
            final = _Final(op, by_offset, sorted(by_offset), frozenset(by_offset.values()))
            index.finals[tp].append(final)
            index.read(tp, op.records, op)
        elif isinstance(op, TxnCommit | TxnAbort):
            index.txns.append(op)
            for value in op.values:
                if value in index.txn_of:
                    raise ValueError(f"value {value!r} ends two transactions")
                index.txn_of[value] = op
    for value in index.txn_of:
        send = index.sends.get(value)
        if send is None or not send.transactional:
            raise ValueError(f"transaction value {value!r} has no transactional send")
    return index


def _effective(send: Send, txn: Txn | None) -> Outcome:
    if not send.transactional or send.outcome == "failed":
        return send.outcome
    if txn is None:
        return "unknown"
    if isinstance(txn, TxnCommit):
        return txn.outcome
    return "failed" if txn.outcome == "ok" else "unknown"


def check(history: History) -> Report:
    """Check ``history`` (see the module docstring for every anomaly's definition).

    Raises ``ValueError`` when the history breaks the workload's assumptions (a value
    sent twice, a transaction naming a value no transactional send sent).
    """
    index = _index(history)
    anomalies: list[Anomaly] = []
    tally: dict[str, int] = defaultdict(int)
    effective = {v: _effective(s, index.txn_of.get(v)) for v, s in index.sends.items()}
    _check_sends(index, effective, anomalies, tally)
    _check_reads(index, effective, anomalies, tally)
    _check_transactions(index, anomalies)
    _check_uncommitted_reads(history, index, anomalies)
    _check_order(index, anomalies)
    _check_commits(index, anomalies)
    _check_streams(index, anomalies)
    tally["observed_values"] = len(index.positions)
    tally["polls"] = index.polls
    tally["commits"] = sum(len(commits) for commits in index.commits.values())
    tally["transactions"] = len(index.txns)
    return Report(tuple(anomalies), Counts(**tally))


def _check_sends(
    index: _Index, effective: dict[str, Outcome], out: list[Anomaly], tally: dict[str, int]
) -> None:
    for value, send in index.sends.items():
        tally["sends"] += 1
        outcome = effective[value]
        read_by = index.positions.get(value)
        seen = next(iter(read_by.values()), None) if read_by else None
        if outcome == "unknown":
            tally["unknown"] += 1
            tally["unknown_appeared" if seen else "unknown_not_appeared"] += 1
        elif outcome == "failed":
            tally["failed"] += 1
            if seen is not None:
                tally["failed_appeared"] += 1
                txn = index.txn_of.get(value)
                kind: AnomalyKind = "aborted-read" if send.transactional else "phantom-write"
                evidence = (send, seen) if txn is None else (send, txn, seen)
                out.append(Anomaly(kind, f"{value!r} definitely not written, yet read", evidence))
        else:
            tally["acknowledged"] += 1
            if not send.transactional:
                _check_acknowledged(index, send, out, tally)
            else:
                _check_committed_offset(index, send, out)


def _check_acknowledged(
    index: _Index, send: Send, out: list[Anomaly], tally: dict[str, int]
) -> None:
    assert send.offset is not None  # outcome ok
    finals = index.finals.get((send.topic, send.partition), [])
    covering = [final for final in finals if final.covers(send.offset)]
    if not finals:
        tally["acknowledged_unverified"] += 1
    elif not covering:
        tally["acknowledged_beyond_retention"] += 1
    else:
        tally["acknowledged_checked"] += 1
    for final in covering:
        found = final.by_offset.get(send.offset)
        if found != send.value:
            where = [p for (tp, p) in index.positions.get(send.value, {}) if tp == _tp(send)]
            out.append(
                Anomaly(
                    "lost-write",
                    f"{send.value!r} acknowledged at {_name(_tp(send))}@{send.offset}; the final "
                    f"read has {found!r} there (value read at offsets {sorted(where)})",
                    (send, final.read),
                )
            )


def _check_committed_offset(index: _Index, send: Send, out: list[Anomaly]) -> None:
    """A committed transactional send: its value where it was acknowledged, if at all (a
    value missing is left to ``_check_transactions``, which judges its transaction whole)."""
    assert send.offset is not None  # outcome ok
    for final in index.finals.get(_tp(send), []):
        if not final.covers(send.offset):
            continue
        found = final.by_offset.get(send.offset)
        if found != send.value and (found is not None or send.value in final.values):
            where = [p for (tp, p) in index.positions.get(send.value, {}) if tp == _tp(send)]
            out.append(
                Anomaly(
                    "lost-write",
                    f"{send.value!r} committed at {_name(_tp(send))}@{send.offset}; the final "
                    f"read has {found!r} there (value read at offsets {sorted(where)})",
                    (send, final.read),
                )
            )


def _check_reads(
    index: _Index, effective: dict[str, Outcome], out: list[Anomaly], tally: dict[str, int]
) -> None:
    for (tp, offset), values in index.at.items():
        if len(values) > 1:
            out.append(
                Anomaly(
                    "divergent-offset",
                    f"{_name(tp)}@{offset} read as {sorted(values)}",
                    tuple(values.values()),
                )
            )
        for value, op in values.items():
            send = index.sends.get(value)
            if effective.get(value) == "failed":
                continue
            if send is not None and send.transactional:
                continue
            for final in index.finals.get(tp, []):
                if final.covers(offset) and offset not in final.by_offset:
                    out.append(
                        Anomaly(
                            "lost-write",
                            f"{value!r} read at {_name(tp)}@{offset}; no record there in a "
                            "final read",
                            (op, final.read),
                        )
                    )
    for value, positions in index.positions.items():
        if len(positions) < 2:
            continue
        send = index.sends.get(value)
        if send is not None and (send.idempotent or send.transactional):
            where = ", ".join(f"{_name(tp)}@{offset}" for tp, offset in sorted(positions))
            out.append(
                Anomaly("duplicate", f"{value!r} read at {where}", (send, *positions.values()))
            )
        else:
            tally["duplicates_allowed"] += 1


def _described(send: Send) -> str:
    """A send for an anomaly's sentence: value, outcome and where it was acknowledged."""
    where = "" if send.offset is None else f" at {_name(_tp(send))}@{send.offset}"
    return f"{send.value!r} ({send.outcome}{where})"


def _check_transactions(index: _Index, out: list[Anomaly]) -> None:
    for txn in index.txns:
        if (isinstance(txn, TxnAbort) and txn.outcome == "ok") or (
            isinstance(txn, TxnCommit) and txn.outcome == "failed"
        ):
            continue  # definitely aborted: any read of it is an aborted read, found above
        visible: list[str] = []
        absent: list[str] = []
        for value in txn.values:
            send = index.sends[value]
            finals = index.finals.get(_tp(send), [])
            if any(value in final.values for final in finals):
                visible.append(value)
            elif send.outcome == "failed":
                continue  # never queued (``produce`` raised): nothing of it to commit
            elif any(final.covers(send.offset) for final in finals):
                absent.append(value)
        if not absent:
            continue
        if visible:
            missing = ", ".join(_described(index.sends[value]) for value in absent)
            out.append(
                Anomaly(
                    "partial-transaction",
                    f"transaction of {txn.producer_id} ({type(txn).__name__} {txn.outcome}): "
                    f"{visible} in the final reads, not {missing}",
                    (txn, *(index.sends[value] for value in absent)),
                )
            )
        elif (isinstance(txn, TxnCommit) and txn.outcome == "ok") or any(
            value in index.positions for value in txn.values
        ):
            out.append(
                Anomaly(
                    "lost-write",
                    f"transaction of {txn.producer_id} committed or read, but none of "
                    f"{absent} is in the final reads",
                    (txn,),
                )
            )


def _check_uncommitted_reads(history: History, index: _Index, out: list[Anomaly]) -> None:
    reported: set[str] = set()
    for op in history:
        if not isinstance(op, Poll):
            continue
        for offset, value in op.records:
            txn = index.txn_of.get(value)
            if isinstance(txn, TxnCommit) and op.end_ns < txn.start_ns and value not in reported:
                reported.add(value)
                out.append(
                    Anomaly(
                        "uncommitted-read",
                        f"{op.consumer} read {value!r} at {_name(_tp(op))}@{offset} before "
                        f"{txn.producer_id} asked to commit it",
                        (index.sends[value], op, txn),
                    )
                )


def _check_order(index: _Index, out: list[Anomaly]) -> None:
    groups: dict[tuple[str, Tp], list[Send]] = defaultdict(list)
    for send in index.sends.values():
        if send.offset is not None:
            groups[(send.producer_id, _tp(send))].append(send)
    for (producer, tp), sends in groups.items():
        in_send_order = all(send.idempotent or send.transactional for send in sends)
        pairs = _inversions(
            [send.offset or 0 for send in sends],
            before=[send.start_ns if in_send_order else send.end_ns for send in sends],
            after=[send.start_ns for send in sends],
            starts=[send.start_ns for send in sends],
            cuts=[float("-inf")] * len(sends),
        )
        for earlier, later in pairs:
            a, b = sends[earlier], sends[later]
            out.append(
                Anomaly(
                    "reorder",
                    f"{producer} sent {a.value!r} before {b.value!r} to {_name(tp)}, but they "
                    f"are at offsets {a.offset} and {b.offset}",
                    (a, b),
                )
            )


def _check_commits(index: _Index, out: list[Anomaly]) -> None:
    for (group, tp), commits in index.commits.items():
        resets = sorted((c.start_ns, c.end_ns) for c in commits if c.reset)
        reset_starts = [start for start, _ in resets]
        # cut(B): the latest end of a reset that may have come before B ended.
        latest_end: list[float] = []
        for _, end in resets:
            latest_end.append(max(latest_end[-1], end) if latest_end else end)
        acked = [c for c in commits if c.outcome == "ok" and not c.reset]
        cuts: list[float] = []
        for commit in acked:
            k = bisect_right(reset_starts, commit.end_ns)
            cuts.append(latest_end[k - 1] if k else float("-inf"))
        pairs = _inversions(
            [c.offset for c in acked],
            before=[c.end_ns for c in acked],
            after=[c.start_ns for c in acked],
            starts=[c.start_ns for c in acked],
            cuts=cuts,
        )
        for earlier, later in pairs:
            a, b = acked[earlier], acked[later]
            out.append(
                Anomaly(
                    "backwards-commit",
                    f"group {group} committed {_name(tp)} at {a.offset}, then at {b.offset}",
                    (a, b),
                )
            )


def _check_streams(index: _Index, out: list[Anomaly]) -> None:
    for (consumer, tp), ops in index.streams.items():
        finals = index.finals.get(tp, [])
        # The first offset the consumer must read next (None before any seek or read), and
        # the op that set it.
        expected: int | None = None
        origin: Poll | Seek | None = None
        for op in ops:
            if isinstance(op, Seek):
                expected, origin = op.offset, op
                continue
            for offset, _ in op.records:
                if expected is not None and origin is not None:
                    if offset < expected:
                        out.append(
                            Anomaly(
                                "nonmonotonic-poll",
                                f"{consumer} read {_name(tp)}@{offset} where it expected "
                                f"{expected} or later, with no seek between",
                                (origin, op),
                            )
                        )
                    else:
                        _skipped(consumer, tp, expected, offset, finals, (origin, op), out)
                expected, origin = offset + 1, op


def _skipped(
    consumer: str,
    tp: Tp,
    low: int,
    high: int,
    finals: Sequence[_Final],
    evidence: tuple[Op, ...],
    out: list[Anomaly],
) -> None:
    for final in finals:
        start = max(low, final.read.log_start_offset)
        missed = final.offsets[bisect_left(final.offsets, start) : bisect_left(final.offsets, high)]
        if missed:
            shown = ", ".join(map(str, missed[:_SHOWN_OFFSETS]))
            more = (
                f" and {len(missed) - _SHOWN_OFFSETS} more" if len(missed) > _SHOWN_OFFSETS else ""
            )
            out.append(
                Anomaly(
                    "skipped-record",
                    f"{consumer} read {_name(tp)}@{high} without reading {shown}{more}",
                    (*evidence, final.read),
                )
            )
            return


def _inversions(
    offsets: Sequence[int],
    *,
    before: Sequence[int],
    after: Sequence[int],
    starts: Sequence[int],
    cuts: Sequence[float],
) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)`` with ``before[i] < after[j]``, ``starts[i] > cuts[j]`` and
    ``offsets[i] > offsets[j]``: for each ``j``, the ``i`` of greatest offset, if any.

    A sweep over ``j`` by ``after`` that adds each ``i`` once ``before[i] < after[j]`` to a
    Fenwick tree of running maxima indexed by descending start, so a prefix of it is
    "started after the cut": O(n log n), where the pairwise loop would take minutes on a
    long run's history.
    """
    count = len(offsets)
    ranks = sorted(set(starts))
    size = len(ranks)
    tree: list[tuple[int, int]] = [(-1, -1)] * (size + 1)
    by_before = sorted(range(count), key=before.__getitem__)
    k = 0
    pairs: list[tuple[int, int]] = []
    for j in sorted(range(count), key=after.__getitem__):
        while k < count and before[by_before[k]] < after[j]:
            i = by_before[k]
            k += 1
            position = size - bisect_left(ranks, starts[i])
            while position <= size:
                tree[position] = max(tree[position], (offsets[i], i))
                position += position & -position
        best = (-1, -1)
        position = size - bisect_right(ranks, cuts[j])
        while position > 0:
            best = max(best, tree[position])
            position -= position & -position
        if best[1] >= 0 and best[0] > offsets[j]:
            pairs.append((best[1], j))
    return pairs


def _tp(op: Send | Poll | Seek | Commit | FinalRead) -> Tp:
    return (op.topic, op.partition)


def _name(tp: Tp) -> str:
    return f"{tp[0]}-{tp[1]}"


class _Checked(Protocol):
    valid: bool

    def summary(self) -> str: ...


def run_checker(
    module: str,
    checker: Callable[[History], _Checked],
    argv: Sequence[str],
    write: Callable[[str], object],
) -> int:
    """``python -m MODULE HISTORY.jsonl`` for a checker: print its report; 0 if valid, 1
    if not, 2 for a bad command line or an unreadable history."""
    if len(argv) != 1:
        write(f"usage: python -m {module} HISTORY.jsonl\n")
        return 2
    try:
        report = checker(load(Path(argv[0])))
    except (OSError, ValueError) as error:
        write(f"cannot check {argv[0]}: {error}\n")
        return 2
    write(report.summary() + "\n")
    return 0 if report.valid else 1


def main(argv: Sequence[str], write: Callable[[str], object] = sys.stdout.write) -> int:
    """``python -m tests.faults.checker HISTORY.jsonl``: print the report; 0 if valid."""
    return run_checker("tests.faults.checker", check, argv, write)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
