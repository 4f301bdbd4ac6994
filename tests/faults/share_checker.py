"""The share-group checker of a fault-test history (issue #32): ``check_share(history)``.

Pure, as ``tests.faults.checker`` (which ignores share operations; this ignores the rest
but the ``Send``s). ``python -m tests.faults.share_checker history.jsonl`` re-checks a
saved history (exit status 0 valid, 1 anomalies, 2 unreadable). The operations are in
``tests.faults.history``; the history must hold one ``ShareGroupSettings`` (the lock
duration and delivery limit the broker ran with) and end with a drain: a member that
polled and accepted until nothing came back for longer than a lock.

Words. A *record* is a topic-partition-offset. A *delivery* is one record in a
``ShareFetch``; a *redelivery* a delivery after another of the same record. A *terminal*
acknowledgement is an ACCEPT or REJECT; an acknowledgement *applied* is one whose outcome
is ok. Times are the operations' ``start_ns``/``end_ns`` (one monotonic clock): the
broker acquired a record somewhere inside its fetch's interval, and applied an
acknowledgement somewhere inside its interval.

Anomalies (``ShareAnomaly.kind``):

* ``divergent-record``: a record delivered with another value than a delivery before or
  its acknowledged ``Send`` (value at that offset).
* ``early-redelivery``: a redelivery to anyone with no cause: after the previous delivery
  (to member M) started, and before the redelivery ended, nothing could have made the
  record available: no RELEASE of it by M (applied or unknown), no ``ShareLeave`` or
  ``Crash`` of M, no broker ``Crash``, and less than the lock duration between the
  previous delivery's start and the redelivery's end (the lock cannot have expired).
  This is "a record held by two members at once".
* ``delivery-count``: a redelivery whose delivery count is not above the previous
  delivery's, or a count above the delivery limit.
* ``delivered-after-acknowledgement``: a delivery that started after an applied terminal
  acknowledgement of the record ended (acknowledged or archived records never come back).
* ``acknowledged-twice``: two applied terminal acknowledgements of one record.
* ``acknowledged-by-non-holder``: an acknowledgement applied for member M while another
  member held the record: the record's latest delivery that ended before the
  acknowledgement started went to another member (so M's hold had ended), and no
  delivery to M overlaps the acknowledgement.
* ``unfinished``: a record delivered, or acknowledged as sent (``Send`` ok), that does
  not end acknowledged or archived: no applied terminal acknowledgement; no terminal
  acknowledgement of unknown outcome after its last delivery (which may have applied:
  counted as ``unconfirmed``); and its last delivery count below the limit (at the
  limit, a release or an expiry archives it), even counting the deliveries nobody saw
  (below). A record acknowledged as sent and never delivered at all is ``unfinished``
  too (lost by the share group).

*Unseen deliveries.* An acquisition whose answer is lost counts as a delivery (the broker
made it durable before answering; Kafka counts it too) that no ``ShareFetch`` records: a
broker crash can lose one, and so can a member's acknowledgement of unknown outcome,
whose request may have fetched ahead (``ShareConsumer(fetch_ahead=True)``: a commit
acquires the next poll's records). Each such event after a record's last recorded
delivery may have added one delivery to it (a record is acquired by one request at a
time), so a record whose last recorded count plus those events reaches the limit may
have been archived unseen: counted as ``archived_unseen``, not ``unfinished``.

Counts: records, deliveries and redeliveries, each redelivery's first possible cause
(``by_release``, ``by_leave``, ``by_crash``, ``by_expiry``), how records ended
(``accepted``, ``rejected``, ``archived_at_limit``, ``unconfirmed``), and acknowledgements
refused (``acks_failed``).
"""

from __future__ import annotations

import bisect
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tests.faults.checker import run_checker
from tests.faults.history import (
    Crash,
    History,
    Op,
    Send,
    ShareAck,
    ShareFetch,
    ShareGroupSettings,
    ShareLeave,
)

__all__ = ["ShareAnomaly", "ShareReport", "check_share"]

_Key = tuple[str, int, int]  # topic, partition, offset
_TERMINAL = ("accept", "reject")


@dataclass(frozen=True, slots=True)
class ShareAnomaly:
    """One broken guarantee, a sentence for people, and the operations that show it."""

    kind: str
    detail: str
    evidence: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class ShareReport:
    """The verdict: ``valid`` when there is no anomaly. Immutable."""

    anomalies: tuple[ShareAnomaly, ...]
    counts: dict[str, int]

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def kinds(self) -> frozenset[str]:
        return frozenset(anomaly.kind for anomaly in self.anomalies)

    def summary(self) -> str:
        lines = ["counts: " + ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))]
        lines.append("valid" if self.valid else f"anomalies: {len(self.anomalies)}")
        lines.extend(f"  {a.kind}: {a.detail}" for a in self.anomalies[:50])
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Delivery:
    fetch: ShareFetch
    value: str
    count: int


@dataclass(slots=True)
class _Record:
    deliveries: list[_Delivery] = field(default_factory=list)
    acks: list[ShareAck] = field(default_factory=list)


def check_share(history: History) -> ShareReport:
    """Check ``history`` (the module docstring defines every anomaly). Raises
    ``ValueError`` when it holds no ``ShareGroupSettings``, or several."""
    settings = [op for op in history if isinstance(op, ShareGroupSettings)]
    if len(settings) != 1:
        raise ValueError(f"one ShareGroupSettings needed, found {len(settings)}")
    lock_ns = settings[0].lock_ms * 1_000_000
    limit = settings[0].delivery_limit
    records: dict[_Key, _Record] = defaultdict(_Record)
    sends: dict[_Key, Send] = {}
    unknown_sends = 0
    leaves: dict[str, list[ShareLeave | Crash]] = defaultdict(list)
    broker_crashes: list[Crash] = []
    # Requests whose answer may have been lost, by (member, start): their end.
    lost_answers: dict[tuple[str, int], int] = {}
    for op in history:
        if isinstance(op, ShareFetch):
            for (offset, value), count in zip(op.records, op.delivery_counts, strict=True):
                key = (op.topic, op.partition, offset)
                records[key].deliveries.append(_Delivery(op, value, count))
        elif isinstance(op, ShareAck):
            for offset in op.offsets:
                records[(op.topic, op.partition, offset)].acks.append(op)
            if op.outcome == "unknown":
                lost_answers[(op.member, op.start_ns)] = op.end_ns
        elif isinstance(op, Send):
            if op.outcome == "ok":
                assert op.offset is not None
                sends[(op.topic, op.partition, op.offset)] = op
            elif op.outcome == "unknown":
                unknown_sends += 1
        elif isinstance(op, ShareLeave):
            leaves[op.member].append(op)
        elif isinstance(op, Crash):
            if op.target == "broker":
                broker_crashes.append(op)
                lost_answers[("broker", op.start_ns)] = op.end_ns
            else:
                leaves[op.target].append(op)
    out: list[ShareAnomaly] = []
    tally: dict[str, int] = defaultdict(int)
    tally["unknown_sends"] = unknown_sends
    lost = sorted(lost_answers.values())
    for key in sorted(records.keys() | sends.keys()):
        record = records[key]
        record.deliveries.sort(key=lambda d: (d.fetch.end_ns, d.fetch.start_ns))
        tally["records"] += 1
        tally["deliveries"] += len(record.deliveries)
        _check_values(key, record, sends.get(key), out)
        for previous, current in zip(record.deliveries, record.deliveries[1:], strict=False):
            tally["redeliveries"] += 1
            cause = _cause(key, record, previous, current, lock_ns, leaves, broker_crashes)
            if cause is None:
                out.append(ShareAnomaly(
                    "early-redelivery",
                    f"{_name(key)} delivered to {current.fetch.member} while "
                    f"{previous.fetch.member} held it (no release, leave, crash or expiry)",
                    (previous.fetch, current.fetch),
                ))  # fmt: skip
            else:
                tally[f"by_{cause}"] += 1
            if current.count <= previous.count:
                out.append(ShareAnomaly(
                    "delivery-count",
                    f"{_name(key)}: delivery count {current.count} after {previous.count}",
                    (previous.fetch, current.fetch),
                ))  # fmt: skip
        over = [d for d in record.deliveries if d.count > limit]
        if over:
            out.append(ShareAnomaly(
                "delivery-count",
                f"{_name(key)}: delivery count {over[0].count} past the limit {limit}",
                (over[0].fetch,),
            ))  # fmt: skip
        _check_acks(key, record, out, tally)
        _check_end(key, record, key in sends, limit, lost, out, tally)
    return ShareReport(tuple(out), dict(tally))


def _check_values(key: _Key, record: _Record, send: Send | None, out: list[ShareAnomaly]) -> None:
    values = {d.value for d in record.deliveries} | ({send.value} if send else set())
    if len(values) > 1:
        evidence: tuple[Op, ...] = tuple(d.fetch for d in record.deliveries[:2])
        if send is not None:
            evidence = (send, *evidence)
        out.append(
            ShareAnomaly("divergent-record", f"{_name(key)} holds {sorted(values)}", evidence)
        )


def _cause(
    key: _Key,
    record: _Record,
    previous: _Delivery,
    current: _Delivery,
    lock_ns: int,
    leaves: dict[str, list[ShareLeave | Crash]],
    broker_crashes: list[Crash],
) -> str | None:
    """What may have made the record available again between the two deliveries."""
    member = previous.fetch.member
    after, before = previous.fetch.start_ns, current.fetch.end_ns

    def between(op: Op) -> bool:
        return after < op.end_ns and op.start_ns < before

    if any(
        a.member == member and a.kind == "release" and a.outcome != "failed" and between(a)
        for a in record.acks
    ):
        return "release"
    if any(between(op) for op in leaves.get(member, ())):
        return "leave"
    if any(after < crash.end_ns and crash.start_ns < before for crash in broker_crashes):
        return "crash"
    if before - after >= lock_ns:
        return "expiry"
    return None


def _check_acks(key: _Key, record: _Record, out: list[ShareAnomaly], tally: dict[str, int]) -> None:
    applied = [a for a in record.acks if a.outcome == "ok"]
    tally["acks_failed"] += sum(1 for a in record.acks if a.outcome == "failed")
    terminal = [a for a in applied if a.kind in _TERMINAL]
    if len(terminal) > 1:
        out.append(ShareAnomaly(
            "acknowledged-twice",
            f"{_name(key)} {terminal[0].kind} by {terminal[0].member} and "
            f"{terminal[1].kind} by {terminal[1].member}",
            tuple(terminal[:2]),
        ))  # fmt: skip
    for ack in terminal:
        late = [d for d in record.deliveries if d.fetch.start_ns > ack.end_ns]
        if late:
            out.append(ShareAnomaly(
                "delivered-after-acknowledgement",
                f"{_name(key)} delivered to {late[0].fetch.member} after {ack.member}'s "
                f"{ack.kind} was applied",
                (ack, late[0].fetch),
            ))  # fmt: skip
    for ack in applied:
        earlier = [d for d in record.deliveries if d.fetch.end_ns < ack.start_ns]
        overlapping = any(
            d.fetch.member == ack.member and d.fetch.start_ns <= ack.end_ns
            for d in record.deliveries
            if d not in earlier
        )
        if earlier and earlier[-1].fetch.member != ack.member and not overlapping:
            out.append(ShareAnomaly(
                "acknowledged-by-non-holder",
                f"{_name(key)} {ack.kind} by {ack.member} applied while "
                f"{earlier[-1].fetch.member} held it",
                (earlier[-1].fetch, ack),
            ))  # fmt: skip


def _check_end(
    key: _Key,
    record: _Record,
    sent: bool,
    limit: int,
    lost_answers: list[int],
    out: list[ShareAnomaly],
    tally: dict[str, int],
) -> None:
    """``lost_answers``: the end of every event that may have lost an acquisition's
    answer, sorted (module docstring, "Unseen deliveries")."""
    applied = [a for a in record.acks if a.outcome == "ok" and a.kind in _TERMINAL]
    if applied:
        tally["accepted" if applied[0].kind == "accept" else "rejected"] += 1
        return
    if not record.deliveries:
        if sent:
            out.append(ShareAnomaly("unfinished", f"{_name(key)} never delivered", ()))
        return
    last = record.deliveries[-1]
    if any(
        a.kind in _TERMINAL and a.outcome == "unknown" and a.end_ns > last.fetch.start_ns
        for a in record.acks
    ):
        tally["unconfirmed"] += 1
    elif last.count >= limit:
        tally["archived_at_limit"] += 1
    elif (
        last.count + len(lost_answers) - bisect.bisect_right(lost_answers, last.fetch.start_ns)
        >= limit
    ):
        tally["archived_unseen"] += 1
    else:
        out.append(ShareAnomaly(
            "unfinished",
            f"{_name(key)}: last delivered (count {last.count} of {limit}) to "
            f"{last.fetch.member}, never acknowledged nor archived",
            (last.fetch,),
        ))  # fmt: skip


def _name(key: _Key) -> str:
    return f"{key[0]}-{key[1]}@{key[2]}"


def main(argv: Sequence[str], write: Callable[[str], object] = sys.stdout.write) -> int:
    """``python -m tests.faults.share_checker HISTORY.jsonl``: the report; 0 if valid."""
    return run_checker("tests.faults.share_checker", check_share, argv, write)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
