"""The share partition as it was before runs (``broker.share.runs``): one ``InFlight``
an offset, every operation over the whole window. Slow and obviously right: the reference
``test_partition_runs.py`` checks the run-based ``SharePartition`` against, operation by
operation. Kept as it was (only its imports changed, and RETURN added with the kind)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tidelog.broker.share.partition import (
    ACCEPT,
    ACQUIRED,
    GAP,
    REJECT,
    RELEASE,
    RETURN,
    Acknowledgement,
    AcquiredRange,
    InFlight,
    RecordSource,
    SharePartitionConfig,
    SharePartitionStats,
    check_acknowledgements,
)
from tidelog.broker.share.records import (
    ACKNOWLEDGED,
    ARCHIVED,
    AVAILABLE,
    DEAD_LETTER_LIMIT,
    DEAD_LETTER_REJECTED,
    DEAD_LETTER_STATES,
    ShareSnapshot,
    StateBatch,
)
from tidelog.storage.errors import InvalidRecordStateError

_DONE = (ACKNOWLEDGED, ARCHIVED)


@dataclass(frozen=True, slots=True)
class Transition:
    """A planned change of one share partition (see the module docstring): apply it with
    ``SharePartition.apply`` after writing ``durable`` (and ``start_offset`` when
    ``start_moved``)."""

    base_version: int
    records: Mapping[int, InFlight | None]  # offset -> new state (None: dropped)
    start_offset: int
    end_offset: int
    acquired: tuple[AcquiredRange, ...]
    durable: tuple[StateBatch, ...]
    start_moved: bool
    reset: bool = False
    dead_lettered: int = 0  # records archived by their dead-letter transaction

    @property
    def needs_write(self) -> bool:
        """Whether the persisted state changes (else nothing need be written)."""
        return bool(self.durable) or self.start_moved or self.reset


class SharePartition:
    """One share partition's in-flight state. Not thread-safe (see the module docstring).
    Build with ``new`` or ``from_snapshot``."""

    def __init__(
        self,
        config: SharePartitionConfig,
        start_offset: int,
        end_offset: int,
        records: dict[int, InFlight],
    ) -> None:
        self.config = config
        self._start = start_offset
        self._end = end_offset
        self._records = records
        self._version = 0
        # Records archived by a committed dead-letter transaction since this share
        # partition was loaded here (memory only: the partition's ``dead_lettered`` stat).
        self.dead_lettered = 0

    @classmethod
    def new(cls, config: SharePartitionConfig, start_offset: int) -> SharePartition:
        """A share partition nothing was delivered from yet, starting at ``start_offset``
        (the auto offset reset's answer, or an admin's)."""
        return cls(config, start_offset, start_offset, {})

    @classmethod
    def from_snapshot(cls, config: SharePartitionConfig, snapshot: ShareSnapshot) -> SharePartition:
        """The state ``snapshot`` describes (a reload): every record Available,
        Acknowledged or Archived with its delivery count (Available at the delivery
        limit: Archived, or to be dead-lettered with a dead-letter topic); SPEO after the
        last batch. A record persisted as to be dead-lettered stays so (its transaction
        never committed: it is dead-lettered again), or, once the group has no
        dead-letter topic any more, is archived."""
        records: dict[int, InFlight] = {}
        end = snapshot.start_offset
        limit = config.delivery_count_limit
        for batch in snapshot.batches:
            state = batch.delivery_state
            if state == AVAILABLE and batch.delivery_count >= limit:
                # In flight at its last delivery when the leader went: that delivery
                # ended as an expired lock would, so the record is archived.
                state = DEAD_LETTER_LIMIT if config.dead_letter else ARCHIVED
            elif state in DEAD_LETTER_STATES and not config.dead_letter:
                state = ARCHIVED
            for offset in range(
                max(batch.first_offset, snapshot.start_offset), batch.last_offset + 1
            ):
                records[offset] = InFlight(state, batch.delivery_count)
            end = max(end, batch.last_offset + 1)
        partition = cls(config, snapshot.start_offset, end, records)
        start = partition._first_undone(records, snapshot.start_offset, end)
        for offset in [o for o in records if o < start]:
            del records[offset]
        partition._start = start
        return partition

    # --- reads ----------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """SPSO: every offset below it is done or gone."""
        return self._start

    @property
    def end_offset(self) -> int:
        """SPEO (exclusive): the first offset never handed out."""
        return self._end

    def records(self) -> dict[int, InFlight]:
        """A copy of the in-flight records by offset (gaps have no entry)."""
        return dict(self._records)

    def persisted_view(self) -> tuple[int, tuple[StateBatch, ...]]:
        """``(SPSO, state batches)`` as ``__share_group_state`` would hold them: what a
        reload rebuilds (acquisitions as Available)."""
        return self._start, _batches(self._records.items())

    def stats(self) -> SharePartitionStats:
        """The admin's view: counts by state and the delivery-count histogram of the
        records in the window (gaps have no entry, so count nowhere). A record waiting for
        its dead-letter copy counts as archived: it is never delivered again."""
        by_state = dict.fromkeys((ACQUIRED, AVAILABLE, ACKNOWLEDGED, ARCHIVED), 0)
        histogram: dict[int, int] = {}
        for record in self._records.values():
            state = ARCHIVED if record.state in DEAD_LETTER_STATES else record.state
            by_state[state] = by_state.get(state, 0) + 1
            histogram[record.delivery_count] = histogram.get(record.delivery_count, 0) + 1
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
        return sum(1 for r in self._records.values() if r.state == ACQUIRED)

    def dead_letter_pending(self, max_records: int) -> list[tuple[int, InFlight]]:
        """Up to ``max_records`` records to be dead-lettered, oldest first."""
        pending = sorted((o, r) for o, r in self._records.items() if r.state in DEAD_LETTER_STATES)
        return pending[:max_records]

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
        taken: list[tuple[int, int]] = []
        for offset in sorted(o for o, r in work.items() if r.state == AVAILABLE):
            if len(taken) == max_records:
                break
            record = work.get(offset)
            assert record is not None
            count = record.delivery_count + 1
            work.set(offset, InFlight(ACQUIRED, count, member_id, deadline))
            taken.append((offset, count))
        room = min(max_records - len(taken), self.config.max_record_locks - work.size())
        if room > 0 and work.end < source.limit_offset():
            scan = source.scan(work.end, room)
            for offset in scan.offsets:
                work.set(offset, InFlight(ACQUIRED, 1, member_id, deadline))
                taken.append((offset, 1))
            work.end = max(work.end, scan.next_offset)
        return work.finish(_ranges(taken))

    def acknowledge(
        self, member_id: str, acknowledgements: Sequence[Acknowledgement], now_ms: int
    ) -> Transition:
        """Apply ``member_id``'s acknowledgements, all or none.

        Raises:
            InvalidRequestError: a range is empty or backwards, ranges overlap or are out
                of order, or a kind is unknown.
            InvalidRecordStateError: an offset in a range is not a record acquired by
                ``member_id`` whose lock is live at ``now_ms`` (gaps in the window excepted).
        """
        check_acknowledgements(acknowledgements)
        work = _Work(self, now_ms)
        for ack in acknowledgements:
            if ack.first_offset < work.start or ack.last_offset >= work.end:
                raise InvalidRecordStateError(
                    f"offsets {ack.first_offset}..{ack.last_offset} are not all in flight "
                    f"(in flight: {work.start}..{work.end - 1})"
                )
            for offset in range(ack.first_offset, ack.last_offset + 1):
                record = work.get(offset)
                if record is None:
                    continue  # a gap: never handed out, already done
                if record.state != ACQUIRED or record.member_id != member_id:
                    raise InvalidRecordStateError(
                        f"offset {offset} is not acquired by member {member_id}"
                    )
                work.set(offset, _after(record, ack.kind, self.config))
        return work.finish(())

    def release_member(self, member_id: str, now_ms: int) -> Transition:
        """Give back every record ``member_id`` holds (it left or was fenced): Available,
        delivery count kept, or Archived at the delivery limit."""
        work = _Work(self, now_ms)
        for offset, record in list(work.items()):
            if record.state == ACQUIRED and record.member_id == member_id:
                work.set(offset, _after(record, RELEASE, self.config))
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
        for offset in offsets:
            record = work.get(offset)
            if record is None or record.state not in DEAD_LETTER_STATES:
                raise ValueError(f"offset {offset} is not to be dead-lettered")
            work.set(offset, InFlight(ARCHIVED, record.delivery_count))
        finished = work.finish(())
        return Transition(
            finished.base_version,
            finished.records,
            finished.start_offset,
            finished.end_offset,
            (),
            finished.durable,
            finished.start_moved,
            dead_lettered=len(offsets),
        )

    def reset_start_offset(self, offset: int) -> Transition:
        """An admin reset (alter share group offsets): SPSO = SPEO = ``offset``, every
        in-flight record dropped; written as a new snapshot with the next state epoch.
        That the group has no member is the caller's check (Kafka: ``NON_EMPTY_GROUP``)."""
        if offset < 0:
            raise ValueError("a start offset cannot be negative")
        dropped: dict[int, InFlight | None] = dict.fromkeys(self._records)
        return Transition(self._version, dropped, offset, offset, (), (), True, reset=True)

    def apply(self, transition: Transition) -> None:
        """Make ``transition`` current. Raises ``ValueError`` if the state changed since it
        was planned (a bug: plan and apply under one lock)."""
        if transition.base_version != self._version:
            raise ValueError("a share partition transition applied out of turn")
        for offset, record in transition.records.items():
            if record is None or offset < transition.start_offset:
                self._records.pop(offset, None)
            else:
                self._records[offset] = record
        for offset in [o for o in self._records if o < transition.start_offset]:
            del self._records[offset]
        self._start = transition.start_offset
        self._end = transition.end_offset
        self._version += 1
        self.dead_lettered += transition.dead_lettered

    @staticmethod
    def _first_undone(records: Mapping[int, InFlight], start: int, end: int) -> int:
        undone = [o for o, r in records.items() if o >= start and r.state not in _DONE]
        return min(undone) if undone else max(start, end)


class _Work:
    """An overlay on a share partition while an operation is planned: reads see the
    changes made so far; ``finish`` turns them into a ``Transition``."""

    def __init__(self, partition: SharePartition, now_ms: int) -> None:
        self._partition = partition
        self._base = partition._records
        self._changes: dict[int, InFlight | None] = {}
        self.start = partition._start
        self.end = partition._end
        self._start_moved = False
        config = partition.config
        for offset, record in partition._records.items():
            if record.state == ACQUIRED and record.deadline_ms <= now_ms:
                self.set(offset, _after(record, RELEASE, config))

    def get(self, offset: int) -> InFlight | None:
        if offset in self._changes:
            return self._changes[offset]
        return self._base.get(offset)

    def set(self, offset: int, record: InFlight | None) -> None:
        self._changes[offset] = record

    def items(self) -> Iterable[tuple[int, InFlight]]:
        offsets = set(self._base) | set(self._changes)
        for offset in offsets:
            record = self.get(offset)
            if record is not None and offset >= self.start:
                yield offset, record

    def size(self) -> int:
        return sum(1 for _ in self.items())

    def follow_log_start(self, log_start_offset: int) -> None:
        if log_start_offset > self.start:
            for offset, _ in list(self.items()):
                if offset < log_start_offset:
                    self.set(offset, None)
            self.start = log_start_offset
            self.end = max(self.end, log_start_offset)
            self._start_moved = True

    def finish(self, acquired: tuple[AcquiredRange, ...]) -> Transition:
        current = dict(self.items())
        start = SharePartition._first_undone(current, self.start, self.end)
        start_moved = self._start_moved or start != self._partition._start
        durable: list[tuple[int, InFlight]] = []
        for offset, record in self._changes.items():
            if record is None or offset < start:
                continue
            before = self._base.get(offset)
            if before is None or (before.persisted_state, before.delivery_count) != (
                record.persisted_state,
                record.delivery_count,
            ):
                durable.append((offset, record))
        return Transition(
            self._partition._version,
            dict(self._changes),
            start,
            self.end,
            acquired,
            _batches(durable),
            start_moved,
        )


def _after(record: InFlight, kind: int, config: SharePartitionConfig) -> InFlight:
    """An acquired record once acknowledged as ``kind`` (or its lock expired: RELEASE);
    with a dead-letter topic, a REJECT or the delivery limit makes it to be dead-lettered
    (REJECT wins as the reason when both hold: the consumer said why)."""
    count = record.delivery_count
    if kind == RETURN:  # given back unseen: the acquisition's delivery taken back
        return InFlight(AVAILABLE, max(count - 1, 0))
    if kind == ACCEPT:
        return InFlight(ACKNOWLEDGED, count)
    if kind == GAP:
        return InFlight(ARCHIVED, count)
    if kind == REJECT:
        return InFlight(DEAD_LETTER_REJECTED if config.dead_letter else ARCHIVED, count)
    if count >= config.delivery_count_limit:
        return InFlight(DEAD_LETTER_LIMIT if config.dead_letter else ARCHIVED, count)
    return InFlight(AVAILABLE, count)


def _batches(records: Iterable[tuple[int, InFlight]]) -> tuple[StateBatch, ...]:
    """``records`` as state batches, neighbours of equal state and count joined
    (``records.coalesce`` of one batch a record, without building those: in the no-work benchmark
    this was a fifth of the broker's GIL-held samples, py-spy)."""
    runs: list[list[int]] = []  # first, last, state, count
    for offset, record in sorted(records, key=lambda item: item[0]):
        state, count = record.persisted_state, record.delivery_count
        last = runs[-1] if runs else None
        if last is not None and last[1] + 1 == offset and last[2] == state and last[3] == count:
            last[1] = offset
        else:
            runs.append([offset, offset, state, count])
    return tuple(StateBatch(*run) for run in runs)


def _ranges(taken: Sequence[tuple[int, int]]) -> tuple[AcquiredRange, ...]:
    out: list[AcquiredRange] = []
    for offset, count in sorted(taken):
        last = out[-1] if out else None
        if last is not None and last.last_offset + 1 == offset and last.delivery_count == count:
            out[-1] = AcquiredRange(last.first_offset, offset, count)
        else:
            out.append(AcquiredRange(offset, offset, count))
    return tuple(out)
