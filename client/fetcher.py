"""The consumer's pure engine: positions, fetch planning, and fetched bytes to records.

Per assigned partition (``PartitionState``) the consumer keeps two offsets:

- ``position``: the next offset the application gets (what ``Consumer.position`` says);
- ``fetch_position``: where the next fetch starts. It runs ahead of ``position`` by the
  fetched bytes not yet handed out, so the next fetch is on its way while the
  application works on this one (prefetch, at most ``max_prefetch`` answers per
  partition).

``seek`` (and a reset) moves both and gives the partition a new ``epoch``: answers of
fetches sent before it carry the old epoch and are dropped, as are prefetched bytes.
Epochs come from one counter per consumer, never reused, not even by a partition that
is assigned again after it left. (This ``epoch`` is the consumer's own; the *leader*
epochs below are the broker's.)

Leader epochs (KIP-320): ``position_epoch`` is the leader epoch of the batch the record
before ``position`` came from (-1: unknown), what a commit stores as the committed
leader epoch. A position that comes with a leader epoch from somewhere else (a
committed offset), or whose partition got a new leader, is *awaiting validation*: it is
not fetched until the leader's ``OffsetForLeaderEpoch`` answer for ``position_epoch``
shows the log still holds it (``check_position``). The rule is Kafka's
(``SubscriptionState.maybeCompleteValidation``): the epoch ends at or after the position:
valid; it ends before the position: the log was truncated under it, and the first
offset that may differ is that end; no common epoch at all (-1): truncated, where
unknown.

``CompletedFetch`` holds one partition's fetched bytes and hands out records lazily, one
batch decoded at a time (``take``): records below the position are skipped (the broker
returns whole batches, so the first one may start before the fetch offset), control
batches are skipped, and after a batch the position moves to the batch's next offset,
which steps over offsets that compaction removed (gaps) and over emptied batches.

read_committed (issue #28): the broker serves only offsets below the last stable offset
and names the aborted transactions the answer overlaps, ``(producer id, first offset)``;
``AbortedFilter`` drops their batches with Kafka's algorithm (Java's ``CompletedFetch``,
reference ``transactions.md`` 7.3): walking the batches in offset order, a transaction
whose first offset is at or below a batch's last offset makes its producer "aborted"
until that producer's ABORT marker; a transactional data batch of an aborted producer is
skipped whole, and the position steps over it as over a control batch. The decision is
made on batch headers (and the marker's key), before any record is decoded, so it holds
alike for the C codec and the pure-Python one, for ``take`` and ``take_columns``.

Pure and not thread-safe: the consumer guards ``SubscriptionState`` with its lock; a
``CompletedFetch`` belongs to the thread that polls.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from tidelog.client.types import ConsumerRecord, TopicPartition
from tidelog.storage.batch_times import decode_wire
from tidelog.storage.columns import ColumnBuilder, decode_batch_into
from tidelog.storage.control import read_marker
from tidelog.storage.errors import TidelogError
from tidelog.storage.records import (
    NO_PRODUCER_ID,
    BatchHeader,
    decode_batch_as,
    iter_batch_headers,
    read_header,
    split_whole_batches,
)

__all__ = [
    "AbortedFilter",
    "CompletedFetch",
    "FetchTarget",
    "PartitionState",
    "SubscriptionState",
    "Truncation",
    "check_position",
    "next_fetch_offset",
]

# A batch the fetch answer gave no times for: sent and received unknown.
_UNKNOWN_TIMES: tuple[int | None, int | None] = (None, None)


@dataclass(slots=True)
class PartitionState:
    """What the consumer knows of one assigned partition."""

    position: int | None = None
    fetch_position: int | None = None
    reset: str | None = None  # a pending "earliest"/"latest" reset
    epoch: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1  # as the last fetch saw it; -1 unknown
    log_start_offset: int = -1
    in_flight: bool = False
    paused: bool = False
    retry_at_ms: int = 0
    buffered: int = 0  # fetched answers not yet handed out (in the consumer's queue)
    position_epoch: int = -1  # leader epoch of the record before ``position``; -1 unknown
    awaiting_validation: bool = False  # not fetched until OffsetForLeaderEpoch agrees
    leader_epoch: int = -1  # the leader epoch the metadata named last; -1 not seen yet


@dataclass(frozen=True, slots=True)
class FetchTarget:
    """One partition of a fetch request."""

    tp: TopicPartition
    fetch_offset: int
    epoch: int


class SubscriptionState:
    """Assigned partitions and their states, in assignment order. Not thread-safe."""

    def __init__(self) -> None:
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.subscription: tuple[str, ...] | None = None  # subscribe() topics, if any
        # Epochs come from one counter for every partition state this consumer ever
        # makes, so a partition assigned again never reuses an epoch of its earlier
        # state: an answer fetched under the old assignment can never pass for a new one.
        self._epochs = itertools.count(1)

    def assign(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Make ``tps`` the assignment; kept partitions keep their state.

        Returns the partitions that were dropped.
        """
        wanted = list(dict.fromkeys(tps))
        dropped = [tp for tp in self.partitions if tp not in set(wanted)]
        self.partitions = {
            tp: self.partitions.get(tp) or PartitionState(epoch=next(self._epochs)) for tp in wanted
        }
        return dropped

    def state(self, tp: TopicPartition) -> PartitionState:
        """The state of an assigned partition; ``KeyError`` naming it otherwise."""
        try:
            return self.partitions[tp]
        except KeyError:
            raise KeyError(f"{tp} is not assigned to this consumer") from None

    def seek(
        self, tp: TopicPartition, offset: int, leader_epoch: int = -1, *, validate: bool = False
    ) -> None:
        """Read ``tp`` from ``offset`` next; prefetched bytes are dropped.

        ``leader_epoch``: the leader epoch of the record before ``offset`` (a committed
        offset's, or where a truncation was found), -1 if unknown. ``validate``: check
        the position with ``OffsetForLeaderEpoch`` before fetching (only with an epoch).
        """
        state = self.state(tp)
        state.position = offset
        state.fetch_position = offset
        state.reset = None
        state.position_epoch = leader_epoch
        state.awaiting_validation = validate and leader_epoch >= 0
        self._invalidate(state)

    def leader_changed(self, tp: TopicPartition, leader_epoch: int) -> bool:
        """The metadata names ``leader_epoch`` as ``tp``'s leader epoch now. A newer one
        than before means a new leader, whose log may be shorter: a position with a known
        epoch then awaits validation (prefetched bytes are dropped, the position kept).
        Returns whether it does. Unassigned partitions are ignored."""
        state = self.partitions.get(tp)
        if state is None or leader_epoch < 0:
            return False
        previous, state.leader_epoch = state.leader_epoch, leader_epoch
        if previous < 0 or leader_epoch <= previous:
            return False
        if state.position is None or state.position_epoch < 0 or state.awaiting_validation:
            return False
        state.awaiting_validation = True
        state.fetch_position = state.position
        self._invalidate(state)
        return True

    def needs_validation(self) -> dict[TopicPartition, tuple[int, int]]:
        """Positions awaiting validation: ``(position, position_epoch)`` per partition."""
        return {
            tp: (s.position, s.position_epoch)
            for tp, s in self.partitions.items()
            if s.awaiting_validation and s.position is not None
        }

    def validated(self, tp: TopicPartition) -> None:
        """The leader agreed with ``tp``'s position: fetch it again."""
        state = self.state(tp)
        state.awaiting_validation = False
        state.retry_at_ms = 0

    def request_reset(self, tp: TopicPartition, strategy: str | None) -> None:
        """Forget ``tp``'s position; it is looked up again (``strategy`` or the default)."""
        state = self.state(tp)
        state.position = None
        state.fetch_position = None
        state.reset = strategy
        state.position_epoch = -1
        state.awaiting_validation = False
        self._invalidate(state)

    def _invalidate(self, state: PartitionState) -> None:
        state.epoch = next(self._epochs)
        state.buffered = 0  # what is queued carries the old epoch and is dropped when reached
        state.retry_at_ms = 0

    def needs_position(self) -> list[TopicPartition]:
        return [tp for tp, s in self.partitions.items() if s.position is None]

    def fetch_targets(self, now_ms: int, max_prefetch: int) -> tuple[list[FetchTarget], bool]:
        """Partitions to fetch now, and whether some were left out for a full buffer."""
        targets = []
        capped = False
        for tp, state in self.partitions.items():
            if (
                state.fetch_position is None
                or state.in_flight
                or state.paused
                or state.awaiting_validation
            ):
                continue
            if state.buffered >= max_prefetch:
                capped = True
                continue
            if now_ms < state.retry_at_ms:
                continue
            targets.append(FetchTarget(tp, state.fetch_position, state.epoch))
        return targets, capped

    def next_retry_ms(self) -> int | None:
        waits = [s.retry_at_ms for s in self.partitions.values() if s.retry_at_ms]
        return min(waits) if waits else None


@dataclass(frozen=True, slots=True)
class Truncation:
    """The leader's log no longer holds a position: ``divergent_offset`` is the first
    offset that may differ (None: unknown, no common leader epoch), written at
    ``divergent_epoch`` (-1 with it)."""

    position: int
    divergent_offset: int | None
    divergent_epoch: int = -1


def check_position(position: int, end_epoch: int, end_offset: int) -> Truncation | None:
    """Judge ``position`` against the leader's ``OffsetForLeaderEpoch`` answer for the
    position's leader epoch: ``(end_epoch, end_offset)`` is the largest epoch <= it that
    the leader knows and where that epoch ends. None: the position is valid."""
    if end_offset < 0 or end_epoch < 0:
        return Truncation(position, None)
    if end_offset < position:
        return Truncation(position, end_offset, end_epoch)
    return None


def next_fetch_offset(records: bytes, fetch_offset: int) -> tuple[int, int]:
    """``(next offset, whole-batch bytes)`` of fetched ``records`` read from ``fetch_offset``.

    The next fetch starts after the last whole batch (a partial tail is never counted);
    without a whole batch it starts at ``fetch_offset`` again.
    """
    whole = split_whole_batches(records)
    next_offset = fetch_offset
    for _, header in iter_batch_headers(memoryview(records)[:whole], validate=False):
        next_offset = max(next_offset, header.next_offset)
    return next_offset, whole


class AbortedFilter:
    """Which batches of one read_committed fetch answer belong to aborted transactions.

    Built from the answer's ``aborted_transactions`` (``(producer id, first offset)``);
    ``skips`` is asked about every batch of the answer in offset order (asking again
    about the same batch, as a decode retried after an error does, answers the same).
    Kafka's rule, reference ``transactions.md`` 7.3. Not thread-safe.
    """

    __slots__ = ("_aborted_pids", "_pending")

    def __init__(self, aborted_transactions: Iterable[tuple[int, int]]) -> None:
        # A min-heap by first offset: a transaction counts from the first batch that
        # reaches its first offset.
        self._pending = [(first, pid) for pid, first in aborted_transactions]
        heapq.heapify(self._pending)
        self._aborted_pids: set[int] = set()

    def skips(self, data: bytes, position: int, header: BatchHeader) -> bool:
        """Whether the batch at ``position`` of ``data`` (its ``header``) is aborted data.

        A control batch is never "skipped" here (the caller never hands one out anyway);
        its ABORT marker ends its producer's aborted transaction, so that producer's
        later transactions count again. Raises ``CorruptRecordError`` for a marker whose
        record does not decode.
        """
        pid = header.producer_id
        if pid == NO_PRODUCER_ID:
            return False
        pending = self._pending
        while pending and pending[0][0] <= header.last_offset:
            self._aborted_pids.add(heapq.heappop(pending)[1])
        if pid not in self._aborted_pids:
            return False
        if header.is_control:
            marker = read_marker(data, position)
            if marker is not None and not marker.commit:
                self._aborted_pids.discard(pid)
            return False
        return header.is_transactional


class CompletedFetch:
    """One partition's answer to one fetch: records handed out lazily. Not thread-safe.

    ``error`` set means the fetch failed (e.g. ``OffsetOutOfRangeError``); it is seen in
    order, after the answers fetched before it. ``aborted_transactions`` (read_committed
    answers only; None reads everything, as read_uncommitted): the batches of those
    transactions are skipped (``AbortedFilter``).
    """

    __slots__ = (
        "_aborted",
        "_batch_next_offset",
        "_check_crcs",
        "_cursor",
        "_end",
        "_pending",
        "_pending_epoch",
        "_pending_index",
        "_pending_position",
        "_times",
        "data",
        "epoch",
        "error",
        "fetch_offset",
        "last_epoch",
        "next_offset",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        epoch: int,
        fetch_offset: int,
        data: bytes,
        *,
        next_offset: int | None = None,
        whole_bytes: int | None = None,
        check_crcs: bool = True,
        error: TidelogError | None = None,
        batch_times: bytes = b"",
        aborted_transactions: Iterable[tuple[int, int]] | None = None,
    ) -> None:
        self.tp = tp
        # Nothing to filter without an aborted transaction in the answer.
        self._aborted = AbortedFilter(aborted_transactions) if aborted_transactions else None
        # Batch last offset -> (sent_ms, received_ms), from the fetch answer's batch_times.
        self._times = decode_wire(batch_times) if batch_times else {}
        self.epoch = epoch
        self.fetch_offset = fetch_offset
        self.data = data
        self.error = error
        if next_offset is None or whole_bytes is None:
            next_offset, whole_bytes = next_fetch_offset(data, fetch_offset)
        self.next_offset = next_offset
        self._end = whole_bytes
        self._cursor = 0
        self._pending: list[ConsumerRecord] = []  # the decoded batch being handed out
        self._pending_index = 0
        self._pending_position = 0  # where the batch of _pending starts in data
        self._batch_next_offset = fetch_offset
        self._check_crcs = check_crcs
        self._pending_epoch = -1  # the leader epoch of the batch of _pending
        # The leader epoch of the batch of the last record handed out (None: none yet):
        # the consumer's ``position_epoch`` after it.
        self.last_epoch: int | None = None

    @property
    def exhausted(self) -> bool:
        return self._cursor >= self._end and self._pending_index >= len(self._pending)

    def take(self, position: int, max_records: int) -> tuple[list[ConsumerRecord], int]:
        """Up to ``max_records`` records at or after ``position``; returns the new position.

        A batch is decoded whole, straight into ``ConsumerRecord``s (``decode_batch_as``),
        and handed out in slices.

        Raises ``CorruptRecordError`` for a batch that does not decode (or fails its CRC
        with ``check_crcs``).
        """
        out: list[ConsumerRecord] = []
        data = self.data
        prefix = (self.tp.topic, self.tp.partition)
        while len(out) < max_records:
            pending = self._pending
            index = self._pending_index
            if index < len(pending):
                stop = min(index + max_records - len(out), len(pending))
                if index or stop < len(pending) or out:
                    out += pending[index:stop]
                else:
                    out = pending  # the whole batch: no copy
                self._pending_index = stop
                self.last_epoch = self._pending_epoch
                position = pending[stop - 1].offset + 1
                if stop >= len(pending):
                    position = max(position, self._batch_next_offset)
                    self._pending = []
                    self._pending_index = 0
                continue
            if self._cursor >= self._end:
                break
            header = read_header(data, self._cursor)
            batch_next = header.base_offset + header.last_offset_delta + 1
            # Asked of every batch, in order: the filter's state follows the markers.
            aborted = self._aborted is not None and self._aborted.skips(data, self._cursor, header)
            if batch_next <= position:
                self._cursor += header.batch_length + 12  # wholly before the position
                continue
            if header.is_control or header.records_count == 0 or aborted:
                self._cursor += header.batch_length + 12
                position = batch_next  # nothing for the application: step over it
                continue
            _, records = decode_batch_as(
                data,
                self._cursor,
                ConsumerRecord,
                prefix,
                times=self._times.get(batch_next - 1, _UNKNOWN_TIMES),
                validate=self._check_crcs,
            )
            self._pending_position = self._cursor
            self._pending_epoch = header.partition_leader_epoch
            self._cursor += header.batch_length + 12
            self._batch_next_offset = batch_next
            if records and records[0].offset < position:
                records = [r for r in records if r.offset >= position]
            self._pending = records
            self._pending_index = 0
            if not records:
                position = max(position, batch_next)
        return out, position

    def take_columns(
        self,
        position: int,
        builder: ColumnBuilder,
        max_records: int,
        batch_times: list[tuple[int, int | None, int | None]] | None = None,
    ) -> int:
        """``take``, with the records decoded into ``builder``'s columns; the new position.

        ``batch_times``: gets ``(rows, sent_ms, received_ms)`` for each batch decoded into
        the builder, in order (the builder's rows, batch by batch, with their batch's
        times: columns have no per-record object to carry them).

        Whole batches: the builder may end up past ``max_records`` by up to one batch
        (``take`` slices; columns are cut by the caller). Records ``take`` decoded but did
        not hand out yet go first. Raises ``CorruptRecordError`` as ``take`` does for a
        batch that does not decode, when it is the first one (else the rows before it are
        handed out and it is met again by the next call); nothing of it is added.
        """
        start_rows = builder.rows
        data = self.data
        if self._pending_index < len(self._pending):
            # The rest of the batch `take` was handing out: decoded again, from where the
            # position is now.
            before = builder.rows
            decode_batch_into(
                builder, data, self._pending_position, validate=False, min_offset=position
            )
            if batch_times is not None:
                sent, received = self._times.get(self._batch_next_offset - 1, _UNKNOWN_TIMES)
                batch_times.append((builder.rows - before, sent, received))
            position = max(position, self._batch_next_offset)
            self._pending = []
            self._pending_index = 0
            if builder.rows > before:
                self.last_epoch = self._pending_epoch
        while builder.rows - start_rows < max_records and self._cursor < self._end:
            header = read_header(data, self._cursor)
            batch_next = header.base_offset + header.last_offset_delta + 1
            aborted = self._aborted is not None and self._aborted.skips(data, self._cursor, header)
            if batch_next <= position:
                self._cursor += header.batch_length + 12  # wholly before the position
                continue
            if header.is_control or header.records_count == 0 or aborted:
                self._cursor += header.batch_length + 12
                position = batch_next  # nothing for the application: step over it
                continue
            before = builder.rows
            try:
                decode_batch_into(
                    builder, data, self._cursor, validate=self._check_crcs, min_offset=position
                )
                if batch_times is not None:
                    sent, received = self._times.get(batch_next - 1, _UNKNOWN_TIMES)
                    batch_times.append((builder.rows - before, sent, received))
            except TidelogError:
                if builder.rows > start_rows:
                    break  # hand out what came before; the bad batch is met again next time
                raise
            self._cursor += header.batch_length + 12
            if builder.rows > before:
                self.last_epoch = header.partition_leader_epoch
            position = max(position, batch_next)  # past every record of the batch
        return position
