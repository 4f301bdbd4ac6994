"""The history of a fault-test run: what every workload client did and saw (issue #29).

A history is a sequence of operations, each recorded once, when it completes, by the
client thread that ran it. Every operation carries ``start_ns`` (just before the call) and
``end_ns`` (when its outcome was known), both from one monotonic clock of the test
process; operation A *precedes* B in real time when ``A.end_ns < B.start_ns``.

Operations (all frozen, keyword-only dataclasses, so immutable and safe to share):

* ``Send``: one record produced. ``outcome`` is ``ok`` (acknowledged, with its
  ``offset``), ``failed`` (definitely not written: refused before any write, e.g. a
  non-retriable error on the first attempt) or ``unknown`` (timed out or indeterminate:
  it may or may not be in the log). ``idempotent`` says the producer had idempotence on;
  ``transactional`` says the send belongs to a transaction that a later ``TxnCommit`` or
  ``TxnAbort`` of the same producer names by value.
* ``Poll``: the records one consumer's poll returned for one partition, in the order
  returned (a poll that returns several partitions is recorded as one ``Poll`` each).
* ``Seek``: a consumer's position in a partition was set to ``offset`` (assignment from
  the committed offset, an explicit seek, a reset after an out-of-range error). A consumer
  that reads a partition again after losing it must record a ``Seek`` first, and resets
  must be seen to be recorded: run consumers with ``auto_offset_reset="none"``, and on
  ``OffsetOutOfRangeError`` seek to the beginning and record where that put them.
* ``Commit``: a group offset commit for one partition; ``outcome`` as for ``Send``.
  ``reset`` marks a deliberate move of the committed offset (possibly backwards).
* ``FinalRead``: a whole partition read back at the end, with every fault healed: its
  ``log_start_offset``, ``log_end_offset`` and every record between them.
* ``TxnCommit`` / ``TxnAbort``: the end of a transaction, naming the values it sent.
* ``Note``: free text for people (the seed, the fault schedule); the checker ignores it.
* Share groups (issue #32; ``tests.faults.share_checker`` judges them, the checker above
  ignores them): ``ShareGroupSettings`` (the group's lock duration and delivery limit),
  ``ShareFetch`` (the records of one partition one share consumer's poll acquired, with
  each one's delivery count), ``ShareAck`` (one acknowledgement kind for some offsets of
  one partition, with its outcome: ``failed`` when the broker refused it, which applies
  none of it), ``ShareLeave`` (a member closed: the broker releases what it held) and
  ``Crash`` (a broker, ``target="broker"``, or a member was killed).

Workload assumptions the checker relies on: every value is a string sent by exactly one
``Send`` (values are unique across the run); each consumer and each producer is driven by
one thread; a ``producer_id`` names one producer session (a producer closed and opened
again, or one that resets its idempotence state, takes a new id); consumers read
committed data only (up to the high watermark, and with transactions in
``read_committed`` isolation, as the final reads do).

The JSON lines form is one object per operation with an ``"op"`` field naming its class
(``send``, ``poll``, ...) and the dataclass fields; records are ``[offset, value]`` pairs.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO, TypeAlias, get_args

Outcome: TypeAlias = Literal["ok", "failed", "unknown"]
OUTCOMES: frozenset[str] = frozenset(get_args(Outcome))
Record: TypeAlias = tuple[int, str]
"""One record as read: ``(offset, value)``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Send:
    """One record produced, with its outcome (``offset`` exactly when ``ok``)."""

    producer_id: str
    topic: str
    partition: int
    value: str
    outcome: Outcome
    offset: int | None
    start_ns: int
    end_ns: int
    idempotent: bool = True
    transactional: bool = False

    def __post_init__(self) -> None:
        _check_outcome(self.outcome)
        if (self.outcome == "ok") != (self.offset is not None):
            raise ValueError(f"a send has an offset exactly when its outcome is ok: {self}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Poll:
    """The records of one partition that one poll returned, as ``(offset, value)``."""

    consumer: str
    topic: str
    partition: int
    records: tuple[Record, ...]
    start_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Seek:
    """A consumer's position in a partition was set to ``offset``."""

    consumer: str
    topic: str
    partition: int
    offset: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Commit:
    """A group offset commit for one partition; ``reset`` marks a deliberate move."""

    group: str
    consumer: str
    topic: str
    partition: int
    offset: int
    outcome: Outcome
    start_ns: int
    end_ns: int
    reset: bool = False

    def __post_init__(self) -> None:
        _check_outcome(self.outcome)


@dataclass(frozen=True, slots=True, kw_only=True)
class FinalRead:
    """A whole partition read back at the end, every fault healed."""

    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    records: tuple[Record, ...]
    start_ns: int
    end_ns: int

    def __post_init__(self) -> None:
        previous = self.log_start_offset - 1
        for offset, _ in self.records:
            if not previous < offset < self.log_end_offset:
                raise ValueError(
                    f"final read of {self.topic}-{self.partition}: offset {offset} out of "
                    f"order or outside [{self.log_start_offset}, {self.log_end_offset})"
                )
            previous = offset


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnCommit:
    """A transaction's commit, naming every value it sent."""

    producer_id: str
    values: tuple[str, ...]
    outcome: Outcome
    start_ns: int
    end_ns: int

    def __post_init__(self) -> None:
        _check_outcome(self.outcome)


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnAbort:
    """A transaction's abort, naming every value it sent."""

    producer_id: str
    values: tuple[str, ...]
    outcome: Outcome
    start_ns: int
    end_ns: int

    def __post_init__(self) -> None:
        _check_outcome(self.outcome)


@dataclass(frozen=True, slots=True, kw_only=True)
class Note:
    """Free text (the seed, the fault schedule); the checker ignores it."""

    text: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareGroupSettings:
    """The share group's settings the share checker judges redeliveries by."""

    group: str
    lock_ms: int
    delivery_limit: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareFetch:
    """The records of one partition that one share consumer's poll acquired, as
    ``(offset, value)``, and each one's delivery count (1 the first)."""

    member: str
    topic: str
    partition: int
    records: tuple[Record, ...]
    delivery_counts: tuple[int, ...]
    start_ns: int
    end_ns: int

    def __post_init__(self) -> None:
        if len(self.records) != len(self.delivery_counts):
            raise ValueError(f"a delivery count for every record: {self}")


ShareKind: TypeAlias = Literal["accept", "release", "reject"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareAck:
    """One acknowledgement kind for ``offsets`` of one partition, by one member."""

    member: str
    topic: str
    partition: int
    offsets: tuple[int, ...]
    kind: ShareKind
    outcome: Outcome
    start_ns: int
    end_ns: int

    def __post_init__(self) -> None:
        _check_outcome(self.outcome)
        if self.kind not in ("accept", "release", "reject"):
            raise ValueError(f"unknown acknowledgement kind {self.kind!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareLeave:
    """A share consumer closed (its records released by the broker at once)."""

    member: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Crash:
    """``target`` (``"broker"``, or a member's name) was killed at ``start_ns``; up again
    (a broker) at ``end_ns``."""

    target: str
    start_ns: int
    end_ns: int


Op: TypeAlias = (
    Send | Poll | Seek | Commit | FinalRead | TxnCommit | TxnAbort | Note
    | ShareGroupSettings | ShareFetch | ShareAck | ShareLeave | Crash
)  # fmt: skip
History: TypeAlias = Sequence[Op]

_NAMES: dict[type[Any], str] = {
    Send: "send",
    Poll: "poll",
    Seek: "seek",
    Commit: "commit",
    FinalRead: "final-read",
    TxnCommit: "txn-commit",
    TxnAbort: "txn-abort",
    Note: "note",
    ShareGroupSettings: "share-group",
    ShareFetch: "share-fetch",
    ShareAck: "share-ack",
    ShareLeave: "share-leave",
    Crash: "crash",
}
_CLASSES: dict[str, type[Any]] = {name: cls for cls, name in _NAMES.items()}
_TUPLE_FIELDS = frozenset({"records", "values", "offsets", "delivery_counts"})


def _check_outcome(outcome: str) -> None:
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {sorted(OUTCOMES)}, not {outcome!r}")


class Recorder:
    """Collects a history from many client threads. Thread-safe.

    ``clock_ns`` is the monotonic clock every ``start_ns``/``end_ns`` must come from
    (``now_ns()``); tests pass a manual one.
    """

    def __init__(self, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._ops: list[Op] = []

    def now_ns(self) -> int:
        return self._clock_ns()

    def record(self, op: Op) -> None:
        """Append ``op``; call it when the operation completes, from the thread that ran it."""
        with self._lock:
            self._ops.append(op)

    def history(self) -> tuple[Op, ...]:
        """A snapshot of everything recorded so far, in recording order."""
        with self._lock:
            return tuple(self._ops)


def to_json(op: Op) -> dict[str, Any]:
    """One operation as a JSON-ready dict (``"op"`` names its class)."""
    fields = {field.name: getattr(op, field.name) for field in dataclasses.fields(op)}
    for name in _TUPLE_FIELDS & fields.keys():
        fields[name] = [list(item) if isinstance(item, tuple) else item for item in fields[name]]
    return {"op": _NAMES[type(op)], **fields}


def from_json(obj: dict[str, Any]) -> Op:
    """The operation ``to_json`` made ``obj`` from.

    Raises ``ValueError`` for an unknown ``"op"`` or a malformed field.
    """
    fields = dict(obj)
    name = fields.pop("op", None)
    cls = _CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown operation {name!r}")
    if "records" in fields:
        fields["records"] = tuple((int(offset), str(value)) for offset, value in fields["records"])
    if "values" in fields:
        fields["values"] = tuple(str(value) for value in fields["values"])
    for name_ in ("offsets", "delivery_counts"):
        if name_ in fields:
            fields[name_] = tuple(int(number) for number in fields[name_])
    try:
        op: Op = cls(**fields)
    except TypeError as error:
        raise ValueError(f"malformed {name} operation: {error}") from error
    return op


def dump_jsonl(history: Iterable[Op], out: TextIO) -> None:
    """Write ``history`` to ``out``, one JSON object per line."""
    for op in history:
        out.write(json.dumps(to_json(op), separators=(",", ":")))
        out.write("\n")


def load_jsonl(lines: Iterable[str]) -> tuple[Op, ...]:
    """Parse a history written by ``dump_jsonl``; blank lines are skipped.

    Raises ``ValueError`` naming the line of the first malformed operation.
    """
    ops: list[Op] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            ops.append(from_json(json.loads(line)))
        except (ValueError, TypeError, AttributeError) as error:
            raise ValueError(f"line {number}: {error}") from error
    return tuple(ops)


def save(history: Iterable[Op], path: Path) -> None:
    """Write ``history`` to ``path`` as JSON lines (a plain write: it is a test artefact)."""
    with path.open("w", encoding="utf-8") as out:
        dump_jsonl(history, out)


def load(path: Path) -> tuple[Op, ...]:
    with path.open(encoding="utf-8") as lines:
        return load_jsonl(lines)
