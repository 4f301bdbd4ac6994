"""One share partition's delivery state on the partition leader (KIP-932's
``SharePartition``): which records of a topic partition a share group has handed out, to
whom, until when, how often, and which are done.

The model, in Kafka's words:

* the **share-partition start offset** (SPSO): below it every record is done
  (acknowledged or archived) or gone from the log;
* the **share-partition end offset** (SPEO): the first offset never handed out. Tidelog's
  is exclusive, as every end offset in Tidelog is (Kafka reports the last in-flight
  offset, inclusive: ours minus one);
* between them, the **in-flight records**, each in one state: Available (may be handed
  out), Acquired (by one member, until its lock deadline), Acknowledged, Archived (never
  delivered again) with a **delivery count** (how often it was acquired).

Transitions (Kafka's ``RecordState`` ids 0, 1, 2, 4 and ``AcknowledgeType`` ids):

* ``acquire``: Available records in the window first (redeliveries, oldest first), then
  new records from the log at SPEO (``RecordSource``: only up to the high watermark, or
  the last stable offset and without aborted transactions for ``read_committed``), at most
  ``max_records`` and never more than ``max_record_locks`` records in the window
  (``share.partition.max.record.locks``; Kafka may overshoot by one batch, Tidelog
  stops at the limit). Each acquisition counts as a delivery.
* ``acknowledge`` of records acquired by that member: ACCEPT -> Acknowledged, REJECT and
  GAP -> Archived, RELEASE -> Available (delivery count kept), and Tidelog's own RETURN
  (gRPC only, never on the Kafka listener) -> Available with the delivery count the
  acquisition added taken back: a record a consumer fetched ahead and gives back unseen
  (it closes) was not delivered, so it neither counts towards the delivery limit nor is
  archived by it (Kafka 4.1 did the same for every record a closing share session
  released, KAFKA-17541, and went back to counting them, KAFKA-19972, because its
  consumer does not fetch ahead; Tidelog's does, and its client knows which records it
  never handed out). Anything else in the ranges
  (not acquired, acquired by another member, lock expired) fails the whole call with
  ``INVALID_RECORD_STATE`` and changes nothing.
* lock expiry (``expire``, and first thing in every operation, at the ``now_ms`` passed
  in) and ``release_member`` (the member left or was fenced): Acquired -> Available.
* A record released or expired with ``delivery_count >= delivery_count_limit``
  (``share.delivery.count.limit``) is Archived instead: it was delivered that often.
* With a dead-letter topic (``SharePartitionConfig.dead_letter``), a REJECT and the
  delivery limit do not archive: the record becomes **to be dead-lettered** (Tidelog's
  own states ``records.DEAD_LETTER_REJECTED`` / ``DEAD_LETTER_LIMIT``, persisted with the
  reason), neither deliverable nor done (SPSO stays below it). ``dead_letter_pending``
  lists such records and ``archive_dead_lettered`` plans their archiving, which the
  caller writes in the same transaction as their copies (``broker.share.dead_letter``).
  A GAP always archives (nothing was delivered).
* SPSO moves forward over the done prefix, and to the log start offset when retention,
  DeleteRecords or truncation removed records (``follow_log_start``: what is below is
  gone, so archived); an admin reset (``reset_start_offset``) moves it anywhere and drops
  every in-flight record.

Offsets in the window that are not records a consumer sees (control batches, offsets
compacted away, records of aborted transactions under ``read_committed``) are **gaps**:
never handed out, held as no entry at all (so a compacted topic's holes cost nothing),
and treated as done. Kafka hands such offsets to the client, which acknowledges them as
GAP; Tidelog archives them itself, and accepts a GAP for them.

The in-flight records are held as **runs** (``broker.share.runs``): ranges of
consecutive offsets in one state, with one delivery count and, while acquired, one member
and deadline. An operation costs by the runs it touches, never by the window's offsets: an
acquisition of 500 new records is one run, an acknowledgement range rewrites the runs it
covers (splitting at most the two at its ends), lock expiry is not looked for before the
earliest deadline. ``records()`` still gives one ``InFlight`` an offset, for admins and
tests.

Every operation is **planned, then applied**: it returns a ``Transition`` (the window's
runs after it, the new offsets, what was acquired, and ``durable``: the state batches
whose persisted form changed, found by one walk over the runs before and after) without
changing anything, and ``apply`` makes it current. The caller writes ``durable`` to
``__share_group_state`` between the two (``broker.share.partition_manager``), so no
acknowledgement is answered, and no record is handed out, before the state saying so is
durable: a crash loses only what nobody was told. Acquisitions are persisted too (as
Available with the incremented delivery count): a restarted or new leader redelivers what
was in flight with its delivery count kept. Kafka 4.1 persists a delivery only when the
record's state next changes, so its counts can fall behind after a failover; Tidelog's
never do (one write per acquire is the price).

Pure: no I/O (the log is read through the ``RecordSource`` passed in), no clock (``now_ms``
is passed in). Not thread-safe: one lock per share partition is the caller's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tidelog.broker.share.records import (
    ACKNOWLEDGED,
    ARCHIVED,
    AVAILABLE,
    DEAD_LETTER_LIMIT,
    DEAD_LETTER_REJECTED,
    DEAD_LETTER_STATES,
    ShareSnapshot,
    StateBatch,
    merge,
)
from tidelog.broker.share.runs import (
    ACQUIRED,
    Run,
    diff_durable,
    join,
    persisted_batches,
    split_at,
)
from tidelog.storage.errors import InvalidRecordStateError, InvalidRequestError

__all__ = [
    "ACCEPT",
    "ACQUIRED",
    "GAP",
    "REJECT",
    "RELEASE",
    "RETURN",
    "Acknowledgement",
    "AcquiredRange",
    "InFlight",
    "RecordSource",
    "Run",
    "Scan",
    "SharePartition",
    "SharePartitionConfig",
    "SharePartitionStats",
    "Transition",
    "check_acknowledgements",
]

# Kafka's AcknowledgeType ids.
GAP = 0
ACCEPT = 1
RELEASE = 2
REJECT = 3
# Tidelog's own: given back unseen (module docstring). Far from Kafka's ids (4 is KIP-1222's
# RENEW) so that a later Kafka type never means something else here.
RETURN = 100
_KINDS = (GAP, ACCEPT, RELEASE, REJECT, RETURN)
_DONE = (ACKNOWLEDGED, ARCHIVED)


@dataclass(frozen=True, slots=True, kw_only=True)
class SharePartitionConfig:
    """A share group's settings for its partitions, Kafka's names and defaults:
    ``share.record.lock.duration.ms`` 30,000, ``share.delivery.count.limit`` 5,
    ``share.partition.max.record.locks`` 2,000 (Kafka 4.1's broker default for
    ``group.share.partition.max.record.locks``), ``share.auto.offset.reset`` latest,
    ``share.isolation.level`` read_uncommitted; ``dead_letter_topic``: the group's
    ``errors.deadletterqueue.topic.name`` (Tidelog's own; "" for none)."""

    record_lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    max_record_locks: int = 2_000
    auto_offset_reset: str = "latest"
    isolation_level: str = "read_uncommitted"
    dead_letter_topic: str = ""

    def __post_init__(self) -> None:
        if self.record_lock_duration_ms < 1:
            raise ValueError("share.record.lock.duration.ms must be at least 1")
        if not 1 <= self.delivery_count_limit <= 0x7FFF:
            raise ValueError("share.delivery.count.limit must be in [1, 32767]")
        if self.max_record_locks < 1:
            raise ValueError("share.partition.max.record.locks must be at least 1")
        if self.auto_offset_reset not in ("latest", "earliest"):
            raise ValueError("share.auto.offset.reset must be latest or earliest")
        if self.isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError("share.isolation.level must be read_uncommitted or read_committed")

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"

    @property
    def dead_letter(self) -> bool:
        """Whether the group has a dead-letter topic."""
        return bool(self.dead_letter_topic)


@dataclass(frozen=True, slots=True)
class Scan:
    """What a ``RecordSource`` found from an offset: the offsets of deliverable records
    (ascending), and ``next_offset``: everything below it was looked at, so an offset
    in the scanned range that is not in ``offsets`` is a gap."""

    offsets: tuple[int, ...]
    next_offset: int


class RecordSource(Protocol):
    """The partition log, as a share partition reads it
    (``broker.share.partition_source.LogRecordSource`` over a real log)."""

    def log_start_offset(self) -> int:
        """The first offset the log still holds."""
        ...

    def limit_offset(self) -> int:
        """How far records may be handed out: the high watermark, or the last stable
        offset for read_committed."""
        ...

    def scan(self, from_offset: int, max_count: int) -> Scan:
        """Up to ``max_count`` deliverable offsets from ``from_offset`` (at or above the
        log start) below ``limit_offset``."""
        ...


@dataclass(frozen=True, slots=True)
class InFlight:
    """One in-flight record: its state, delivery count, and while Acquired, by whom and
    until when (``deadline_ms``, on the caller's clock)."""

    state: int
    delivery_count: int
    member_id: str = ""
    deadline_ms: int = 0

    @property
    def persisted_state(self) -> int:
        """The state as ``__share_group_state`` keeps it: an acquisition's lock is
        memory only, so Acquired is kept as Available."""
        return AVAILABLE if self.state == ACQUIRED else self.state


@dataclass(frozen=True, slots=True)
class AcquiredRange:
    """Consecutive records handed to a member by one ``acquire``, all with one delivery
    count (Kafka's ShareFetch ``AcquiredRecords``); gaps split ranges."""

    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    """``first_offset``..``last_offset`` (inclusive) acknowledged as ``kind`` (ACCEPT,
    RELEASE, REJECT or GAP)."""

    first_offset: int
    last_offset: int
    kind: int


@dataclass(frozen=True, slots=True)
class Transition:
    """A planned change of one share partition (see the module docstring): apply it with
    ``SharePartition.apply`` after writing ``durable`` (and ``start_offset`` when
    ``start_moved``). ``runs``: the whole window after it (``broker.share.runs``);
    ``changed``: whether any record's state, or the window, changed."""

    base_version: int
    runs: tuple[Run, ...]
    start_offset: int
    end_offset: int
    acquired: tuple[AcquiredRange, ...]
    durable: tuple[StateBatch, ...]
    start_moved: bool
    changed: bool
    reset: bool = False
    dead_lettered: int = 0  # records archived by their dead-letter transaction

    @property
    def needs_write(self) -> bool:
        """Whether the persisted state changes (else nothing need be written)."""
        return bool(self.durable) or self.start_moved or self.reset


@dataclass(frozen=True, slots=True)
class SharePartitionStats:
    """What an admin sees of one share partition (``SharePartition.stats``): SPSO, SPEO,
    the in-flight records by state, ``delivery_counts`` (delivery count -> records in the
    window with it, ascending) and ``dead_lettered`` (records copied to the group's
    dead-letter topic since this share partition was loaded here)."""

    start_offset: int
    end_offset: int
    acquired: int
    available: int
    acknowledged: int
    archived: int
    delivery_counts: tuple[tuple[int, int], ...]
    dead_lettered: int


class SharePartition:
    """One share partition's in-flight state, as runs (``broker.share.runs``). Not
    thread-safe (see the module docstring). Build with ``new`` or ``from_snapshot``."""

    def __init__(
        self,
        config: SharePartitionConfig,
        start_offset: int,
        end_offset: int,
        runs: Sequence[Run] = (),
    ) -> None:
        """``runs``: the in-flight records (sorted, disjoint, within the window)."""
        self.config = config
        self._start = start_offset
        self._end = end_offset
        self._runs: tuple[Run, ...] = tuple(runs)
        self._next_deadline = _next_deadline(self._runs)
        self._version = 0
        # Records archived by a committed dead-letter transaction since this share
        # partition was loaded here (memory only: the partition's ``dead_lettered`` stat).
        self.dead_lettered = 0

    @classmethod
    def new(cls, config: SharePartitionConfig, start_offset: int) -> SharePartition:
        """A share partition nothing was delivered from yet, starting at ``start_offset``
        (the auto offset reset's answer, or an admin's)."""
        return cls(config, start_offset, start_offset)

    @classmethod
    def from_snapshot(cls, config: SharePartitionConfig, snapshot: ShareSnapshot) -> SharePartition:
        """The state ``snapshot`` describes (a reload): every record Available,
        Acknowledged or Archived with its delivery count (Available at the delivery
        limit: Archived, or to be dead-lettered with a dead-letter topic); SPEO after the
        last batch. A record persisted as to be dead-lettered stays so (its transaction
        never committed: it is dead-lettered again), or, once the group has no
        dead-letter topic any more, is archived."""
        start = snapshot.start_offset
        runs: list[Run] = []
        end = start
        limit = config.delivery_count_limit
        for batch in merge((), snapshot.batches, start):  # sorted, disjoint, cut at start
            state = batch.delivery_state
            if state == AVAILABLE and batch.delivery_count >= limit:
                # In flight at its last delivery when the leader went: that delivery
                # ended as an expired lock would, so the record is archived.
                state = DEAD_LETTER_LIMIT if config.dead_letter else ARCHIVED
            elif state in DEAD_LETTER_STATES and not config.dead_letter:
                state = ARCHIVED
            runs.append(Run(batch.first_offset, batch.last_offset, state, batch.delivery_count))
            end = max(end, batch.last_offset + 1)
        for batch in snapshot.batches:  # SPEO: after every batch, even those below SPSO
            end = max(end, batch.last_offset + 1)
        runs = join(runs)
        first = _first_undone(runs, start, end)
        return cls(config, first, end, [r for r in runs if r.last >= first])

    # --- reads ----------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """SPSO: every offset below it is done or gone."""
        return self._start

    @property
    def end_offset(self) -> int:
        """SPEO (exclusive): the first offset never handed out."""
        return self._end

    def runs(self) -> tuple[Run, ...]:
        """The in-flight records as runs (sorted, disjoint; gaps are in none)."""
        return self._runs

    def records(self) -> dict[int, InFlight]:
        """The in-flight records by offset (gaps have no entry): one object an offset,
        for admins and tests, never on the hot path."""
        out: dict[int, InFlight] = {}
        for run in self._runs:
            record = InFlight(run.state, run.deliveries, run.member, run.deadline)
            for offset in range(run.first, run.last + 1):
                out[offset] = record
        return out

    def persisted_view(self) -> tuple[int, tuple[StateBatch, ...]]:
        """``(SPSO, state batches)`` as ``__share_group_state`` would hold them: what a
        reload rebuilds (acquisitions as Available)."""
        return self._start, persisted_batches(
            (r.first, r.last, r.persisted_state, r.deliveries) for r in self._runs
        )

    def stats(self) -> SharePartitionStats:
        """The admin's view: counts by state and the delivery-count histogram of the
        records in the window (gaps have no entry, so count nowhere). A record waiting for
        its dead-letter copy counts as archived: it is never delivered again."""
        by_state = dict.fromkeys((ACQUIRED, AVAILABLE, ACKNOWLEDGED, ARCHIVED), 0)
        histogram: dict[int, int] = {}
        for run in self._runs:
            state = ARCHIVED if run.state in DEAD_LETTER_STATES else run.state
            by_state[state] = by_state.get(state, 0) + run.size
            histogram[run.deliveries] = histogram.get(run.deliveries, 0) + run.size
        return SharePartitionStats(
            self._start,
            self._end,
            by_state[ACQUIRED],
            by_state[AVAILABLE],
            by_state[ACKNOWLEDGED],
            by_state[ARCHIVED],
            tuple(sorted(histogram.items())),
            self.dead_lettered,
        )

    def acquired_count(self) -> int:
        return sum(r.size for r in self._runs if r.state == ACQUIRED)

    def dead_letter_pending(self, max_records: int) -> list[tuple[int, InFlight]]:
        """Up to ``max_records`` records to be dead-lettered, oldest first."""
        pending: list[tuple[int, InFlight]] = []
        for run in self._runs:
            if run.state in DEAD_LETTER_STATES:
                record = InFlight(run.state, run.deliveries)
                for offset in range(run.first, run.last + 1):
                    if len(pending) == max_records:
                        return pending
                    pending.append((offset, record))
        return pending

    # --- operations (planned; see apply) ---------------------------------------------

    def acquire(
        self, member_id: str, max_records: int, now_ms: int, source: RecordSource
    ) -> Transition:
        """Hand up to ``max_records`` records to ``member_id``, locked until ``now_ms`` +
        the lock duration; locks past their deadline expire first, and SPSO follows the
        log start. Raises ``ValueError`` for a bad ``max_records`` or member id."""
        if max_records < 1:
            raise ValueError("max_records must be at least 1")
        if not member_id:
            raise ValueError("a member id is required")
        work = _Work(self, now_ms)
        work.follow_log_start(source.log_start_offset())
        deadline = now_ms + self.config.record_lock_duration_ms
        runs = work.runs
        taken: list[AcquiredRange] = []
        left = max_records
        i = 0
        while left and i < len(runs):  # redeliveries first, oldest first
            run = runs[i]
            if run.state == AVAILABLE:
                if run.size > left:
                    split_at(runs, run.first + left)
                    run = runs[i]
                count = run.deliveries + 1
                runs[i] = Run(run.first, run.last, ACQUIRED, count, member_id, deadline)
                taken.append(AcquiredRange(run.first, run.last, count))
                left -= run.size
            i += 1
        room = min(left, self.config.max_record_locks - sum(r.size for r in runs))
        if room > 0 and work.end < source.limit_offset():
            scan = source.scan(work.end, room)
            for first, last in _consecutive(scan.offsets):
                runs.append(Run(first, last, ACQUIRED, 1, member_id, deadline))
                taken.append(AcquiredRange(first, last, 1))
            work.end = max(work.end, scan.next_offset)
        return work.finish(_ranges(taken))

    def acknowledge(
        self, member_id: str, acknowledgements: Sequence[Acknowledgement], now_ms: int
    ) -> Transition:
        """Apply ``member_id``'s acknowledgements, all or none (each range applied to the
        runs it covers, splitting only at its ends).

        Raises:
            InvalidRequestError: a range is empty or backwards, ranges overlap or are out
                of order, or a kind is unknown.
            InvalidRecordStateError: an offset in a range is not a record acquired by
                ``member_id`` whose lock is live at ``now_ms`` (gaps in the window excepted).
        """
        check_acknowledgements(acknowledgements)
        work = _Work(self, now_ms)
        runs = work.runs
        config = self.config
        for ack in acknowledgements:
            if ack.first_offset < work.start or ack.last_offset >= work.end:
                raise InvalidRecordStateError(
                    f"offsets {ack.first_offset}..{ack.last_offset} are not all in flight "
                    f"(in flight: {work.start}..{work.end - 1})"
                )
            i = split_at(runs, ack.first_offset)
            j = split_at(runs, ack.last_offset + 1)
            for k in range(i, j):  # gaps between the runs: never handed out, done
                run = runs[k]
                if run.state != ACQUIRED or run.member != member_id:
                    raise InvalidRecordStateError(
                        f"offset {run.first} is not acquired by member {member_id}"
                    )
                runs[k] = _after(run, ack.kind, config)
        return work.finish(())

    def release_member(self, member_id: str, now_ms: int) -> Transition:
        """Give back every record ``member_id`` holds (it left or was fenced): Available,
        delivery count kept, or Archived at the delivery limit."""
        work = _Work(self, now_ms)
        runs = work.runs
        for i, run in enumerate(runs):
            if run.state == ACQUIRED and run.member == member_id:
                runs[i] = _after(run, RELEASE, self.config)
        return work.finish(())

    def expire(self, now_ms: int, log_start_offset: int | None = None) -> Transition:
        """Expire the locks past their deadline at ``now_ms`` (and, given the log start
        offset, follow it: records below it are gone)."""
        work = _Work(self, now_ms)
        if log_start_offset is not None:
            work.follow_log_start(log_start_offset)
        return work.finish(())

    def archive_dead_lettered(self, offsets: Sequence[int], now_ms: int) -> Transition:
        """Plan the archiving of ``offsets`` (records to be dead-lettered) once their
        copies are in the dead-letter topic: written in the copies' transaction, applied
        once it committed. Raises ``ValueError`` for an offset not to be dead-lettered."""
        work = _Work(self, now_ms)
        runs = work.runs
        for first, last in _consecutive(sorted(set(offsets))):
            i = split_at(runs, first)
            j = split_at(runs, last + 1)
            expected = first
            for k in range(i, j):
                run = runs[k]
                if run.first != expected or run.state not in DEAD_LETTER_STATES:
                    raise ValueError(f"offset {expected} is not to be dead-lettered")
                runs[k] = Run(run.first, run.last, ARCHIVED, run.deliveries)
                expected = run.last + 1
            if expected != last + 1:
                raise ValueError(f"offset {expected} is not to be dead-lettered")
        finished = work.finish(())
        return dataclasses.replace(finished, dead_lettered=len(offsets))

    def reset_start_offset(self, offset: int) -> Transition:
        """An admin reset (alter share group offsets): SPSO = SPEO = ``offset``, every
        in-flight record dropped; written as a new snapshot with the next state epoch.
        That the group has no member is the caller's check (Kafka: ``NON_EMPTY_GROUP``)."""
        if offset < 0:
            raise ValueError("a start offset cannot be negative")
        return Transition(self._version, (), offset, offset, (), (), True, True, reset=True)

    def apply(self, transition: Transition) -> None:
        """Make ``transition`` current. Raises ``ValueError`` if the state changed since it
        was planned (a bug: plan and apply under one lock)."""
        if transition.base_version != self._version:
            raise ValueError("a share partition transition applied out of turn")
        self._runs = transition.runs
        self._next_deadline = _next_deadline(self._runs)
        self._start = transition.start_offset
        self._end = transition.end_offset
        self._version += 1
        self.dead_lettered += transition.dead_lettered


class _Work:
    """An operation being planned: a copy of the share partition's runs (locks past
    their deadline already expired), changed in place; ``finish`` turns it into a
    ``Transition`` (the partition itself is untouched until ``apply``)."""

    def __init__(self, partition: SharePartition, now_ms: int) -> None:
        self._partition = partition
        self.runs = list(partition._runs)
        self.start = partition._start
        self.end = partition._end
        self._start_moved = False
        if partition._next_deadline <= now_ms:  # else no lock can have expired
            config = partition.config
            for i, run in enumerate(self.runs):
                if run.state == ACQUIRED and run.deadline <= now_ms:
                    self.runs[i] = _after(run, RELEASE, config)

    def follow_log_start(self, log_start_offset: int) -> None:
        if log_start_offset > self.start:
            i = split_at(self.runs, log_start_offset)
            del self.runs[:i]
            self.start = log_start_offset
            self.end = max(self.end, log_start_offset)
            self._start_moved = True

    def finish(self, acquired: tuple[AcquiredRange, ...]) -> Transition:
        partition = self._partition
        runs = join(self.runs)
        start = _first_undone(runs, self.start, self.end)
        if runs and runs[0].last < start:
            runs = [r for r in runs if r.last >= start]  # the done prefix: below SPSO
        before = partition._runs
        new = tuple(runs)
        return Transition(
            partition._version,
            new,
            start,
            self.end,
            acquired,
            diff_durable(before, new, start),
            self._start_moved or start != partition._start,
            new != before or start != partition._start or self.end != partition._end,
        )


def _first_undone(runs: Sequence[Run], start: int, end: int) -> int:
    """SPSO: the first record at or above ``start`` not done, else ``max(start, end)``."""
    for run in runs:
        if run.last >= start and run.state not in _DONE:
            return max(run.first, start)
    return max(start, end)


def _next_deadline(runs: Iterable[Run]) -> float:
    """The earliest lock deadline among ``runs`` (infinity: none acquired)."""
    return min((r.deadline for r in runs if r.state == ACQUIRED), default=math.inf)


def _after(run: Run, kind: int, config: SharePartitionConfig) -> Run:
    """An acquired run once acknowledged as ``kind`` (or its lock expired: RELEASE);
    with a dead-letter topic, a REJECT or the delivery limit makes it to be dead-lettered
    (REJECT wins as the reason when both hold: the consumer said why)."""
    count = run.deliveries
    if kind == RETURN:
        return Run(run.first, run.last, AVAILABLE, max(count - 1, 0))
    if kind == ACCEPT:
        state = ACKNOWLEDGED
    elif kind == GAP:
        state = ARCHIVED
    elif kind == REJECT:
        state = DEAD_LETTER_REJECTED if config.dead_letter else ARCHIVED
    elif count >= config.delivery_count_limit:
        state = DEAD_LETTER_LIMIT if config.dead_letter else ARCHIVED
    else:
        state = AVAILABLE
    return Run(run.first, run.last, state, count)


def _consecutive(offsets: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending ``offsets`` as ``(first, last)`` ranges of consecutive offsets (one
    comparison when they are all consecutive, as a producer's batches are)."""
    if not offsets:
        return []
    if offsets[-1] - offsets[0] + 1 == len(offsets):
        return [(offsets[0], offsets[-1])]
    out: list[tuple[int, int]] = []
    first = last = offsets[0]
    for offset in offsets[1:]:
        if offset != last + 1:
            out.append((first, last))
            first = offset
        last = offset
    out.append((first, last))
    return out


def _ranges(taken: Sequence[AcquiredRange]) -> tuple[AcquiredRange, ...]:
    """Acquired ranges sorted, contiguous neighbours with one delivery count joined."""
    out: list[AcquiredRange] = []
    for r in sorted(taken, key=lambda r: r.first_offset):
        last = out[-1] if out else None
        if (
            last is not None
            and last.last_offset + 1 == r.first_offset
            and last.delivery_count == r.delivery_count
        ):
            out[-1] = AcquiredRange(last.first_offset, r.last_offset, r.delivery_count)
        else:
            out.append(r)
    return tuple(out)


def check_acknowledgements(acknowledgements: Sequence[Acknowledgement]) -> None:
    """Refuse a malformed ShareAcknowledge before anything is applied.

    Raises:
        InvalidRequestError: a kind is unknown, a range is empty or backwards, or the
            ranges overlap or are out of order.
    """
    previous = -1
    for ack in acknowledgements:
        if ack.kind not in _KINDS:
            raise InvalidRequestError(f"unknown acknowledge type {ack.kind}")
        if ack.first_offset < 0 or ack.last_offset < ack.first_offset:
            raise InvalidRequestError(
                f"bad acknowledgement range {ack.first_offset}..{ack.last_offset}"
            )
        if ack.first_offset <= previous:
            raise InvalidRequestError("acknowledgement ranges overlap or are out of order")
        previous = ack.last_offset
