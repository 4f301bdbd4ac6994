"""The fetch path: read stored batches now, or park the fetch until there is more to read.

A fetch reads every partition it names; if the answer holds at least ``min_bytes`` (or any
partition failed, or ``max_wait_ms`` or ``min_bytes`` is 0, as in Kafka) it is answered at
once. Otherwise it becomes a ``DelayedFetch`` parked in the fetch purgatory
(``broker.core.delayed``) under its partitions, and no thread waits for it: an append to one of
them (``FetchPath.on_append``), its deadline, or the broker stopping completes it, which
calls the listener's ``wake``; the listener then reads again (``step``), and answers or
parks once more. A listener drives one fetch like this::

    pending = core.start_fetch(spec, wake=..., wait_cap_ms=...)
    while (answers := core.step_fetch(pending)) is None:   # None: parked
        <wait for wake, without holding a thread>
    ...                                  # and core.cancel_fetch(pending) if the call ends

A parked fetch is satisfied as soon as the log end offset of one of its partitions moved
away from what the read saw (Kafka's ``DelayedFetch`` compares byte positions; an offset
is enough here, and the re-read decides whether ``min_bytes`` is reached).

Size limits, as Kafka's: the answer holds at most ``max_bytes`` (capped by the broker's
``fetch.max.bytes``) and each partition at most its ``partition_max_bytes`` (1 MiB when 0),
except that the first batch of the first non-empty partition is always returned whole, so
a consumer always progresses past a batch larger than its limits. A later partition whose
first batch does not fit what is left gets no bytes this time (its offsets are still
answered). Bytes are returned as stored: the first batch may start before the fetch offset.

Zero copy (issue #31, ``docs/performance.md``): a fetch with ``FetchSpec.zero_copy`` (the
Kafka listener's on plaintext connections) reads no records: each partition's answer
carries a ``FileRegion`` (``storage.file_region``) naming the same whole batches in the
segment file, with the same limits applied, and the listener sends them with
``sendfile``. The regions are the answer's to close: this module closes those it drops
(a read superseded by the next one of a parked fetch, a partition past the limits), the
listener those it answers with.

Per-partition failures (unknown partition, ``OFFSET_OUT_OF_RANGE`` for an offset below the
log start or past the log end, negative offsets included) are answered per partition.

Incremental fetch sessions (KIP-227, ``broker.core.fetch_sessions``): a fetch with
``FetchSpec.session`` reads the partitions its request named (``partitions``) at its first
step, and every other partition of the session at the offsets the session holds, and is
parked under all of them. A follower's session skips a read where the follower is idle
(``Partition.follower_idle``: in the ISR of the epoch it names, fetching from the log end,
the high watermark and log start as last answered): a few attribute reads, and the
follower counted caught up as the read would have, instead of the per-partition
bookkeeping, leader check and empty read (at 10,000 partitions, the idle brokers' main
cost: issue #34, ``docs/replication.md``). A partition the follower is not idle on (new
records, a moved high watermark or log start, a leadership changed, a member outside the
ISR to be proposed for it) is read as it would be without a session.

Each partition is read through its ``Partition`` (``broker.core.partition``, from the
registry the core was built with). Replicated partitions (cluster mode,
``docs/replication.md``): a consumer reads below the high watermark only, after
``Partition.check_epoch`` (fencing, a new leader's unknown high watermark), and its parked
fetch completes when the high watermark moves; a follower (``FetchSpec.replica_id`` >= 0)
reads up to the log end offset, and each of its reads first goes through
``Partition.on_follower_fetch``, which records how far the follower got (moving the ISR
and the high watermark) and may answer a divergence instead of records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidelog.broker.core.delayed import DelayedOperation, Purgatory
from tidelog.broker.core.errors import partition_error
from tidelog.broker.core.metrics import BrokerMetrics
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.core.throttle import ReplicationThrottle
from tidelog.storage.clock import Clock
from tidelog.storage.errors import CorruptRecordError, InvalidRequestError, OffsetOutOfRangeError
from tidelog.storage.file_region import FileRegion
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import iter_batch_headers

if TYPE_CHECKING:
    from tidelog.broker.core.fetch_sessions import FetchSession

__all__ = [
    "DEFAULT_PARTITION_MAX_BYTES",
    "DelayedFetch",
    "FetchPath",
    "FetchSpec",
    "PartitionFetchSpec",
    "PartitionFetched",
    "PendingFetch",
    "release",
]

log = logging.getLogger(__name__)

DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024  # Kafka's max.partition.fetch.bytes default


@dataclass(frozen=True, slots=True)
class PartitionFetchSpec:
    """One partition to read: from ``fetch_offset``, at most ``max_bytes`` (0 = default)."""

    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int = 0
    # -1: not given. The client's view of the leader epoch (fencing), and a follower's
    # epoch of its last batch (divergence detection).
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    refused: BaseException | None = None  # the authorizer's answer: not read
    # A follower's log start offset (-1: not given), which DeleteRecords waits for.
    log_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class FetchSpec:
    """A whole fetch. ``max_bytes`` 0 means the broker's ``fetch.max.bytes``.
    ``replica_id`` >= 0: a follower broker's fetch; -1: a consumer's."""

    partitions: Sequence[PartitionFetchSpec]
    max_wait_ms: int = 0
    min_bytes: int = 0
    max_bytes: int = 0
    replica_id: int = -1
    # Kafka's isolation level: 0 read_uncommitted (up to the high watermark), 1
    # read_committed (up to the last stable offset, with the aborted transactions).
    isolation_level: int = 0
    # Answer with file regions, not bytes (module docstring; consumers only).
    zero_copy: bool = False
    # An incremental fetch session's (module docstring): ``partitions`` are the ones the
    # request named (read at its first step); the session's others are read unless idle.
    session: FetchSession | None = None

    def validate(self) -> None:
        """Raise ``InvalidRequestError`` for negative limits."""
        for name in ("max_wait_ms", "min_bytes", "max_bytes"):
            if getattr(self, name) < 0:
                raise InvalidRequestError(f"{name} must not be negative")
        for p in self.partitions:
            if p.max_bytes < 0:
                raise InvalidRequestError(
                    f"partition_max_bytes of {p.topic}-{p.partition} must not be negative"
                )


@dataclass(frozen=True, slots=True)
class PartitionFetched:
    """One partition's answer. ``error_code`` empty means success; offsets -1 if unknown."""

    topic: str
    partition: int
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1
    error_code: str = ""
    error_message: str = ""
    # The sent/received times of the batches in ``records`` (``storage.batch_times`` wire
    # entries, aligned by last offset).
    batch_times: bytes = b""
    # A follower's log diverged: the leader's (epoch, end offset) to truncate by.
    diverging: tuple[int, int] | None = None
    # Below it every transaction is decided (-1 unknown); for read_committed fetches, the
    # aborted transactions (producer id, first offset) the records overlap (issue #28).
    last_stable_offset: int = -1
    aborted_transactions: tuple[tuple[int, int], ...] = ()
    # A zero-copy read's batches (``FetchSpec.zero_copy``; ``records`` is then empty).
    region: FileRegion | None = None

    @property
    def size(self) -> int:
        """Bytes of batches answered, in ``records`` or in ``region``."""
        return self.region.length if self.region is not None else len(self.records)


READ_COMMITTED = 1


def release(answers: Sequence[PartitionFetched]) -> None:
    """Close the file regions of ``answers`` (answers that will not be sent)."""
    for answer in answers:
        if answer.region is not None:
            answer.region.close()


def _aborted(
    partition_log: PartitionLog, fetch_offset: int, records: bytes, region: FileRegion | None
) -> tuple[tuple[int, int], ...]:
    """The aborted transactions a read_committed reader of ``records`` or ``region``
    (read from ``fetch_offset``) must know to filter them (Kafka's rule: up to the end of
    the records returned)."""
    if region is not None:
        return tuple(partition_log.aborted_transactions(fetch_offset, region.next_offset))
    if not records:
        return ()
    end = fetch_offset
    for _, header in iter_batch_headers(records, validate=False):
        end = header.next_offset
    return tuple(partition_log.aborted_transactions(fetch_offset, end))


class DelayedFetch(DelayedOperation):
    """A fetch parked until what it may read of one of its partitions grows: the log end
    offset for a follower, the high watermark for a consumer; or, for a follower, until
    the leader's log start offset moves (DeleteRecords: the follower must learn it now,
    not at the fetch's deadline, for the leader's answer waits on it). Thread-safe.

    ``seen``: each partition's log, what a read could reach and its log start offset
    when the fetch read last."""

    __slots__ = ("_by_key", "_replica", "_seen", "_wake")

    def __init__(
        self,
        deadline_ms: int,
        seen: Sequence[tuple[PartitionLog, int, int]],
        wake: Callable[[], None],
        *,
        replica: bool = False,
    ) -> None:
        super().__init__(deadline_ms)
        self._seen = seen
        self._wake = wake
        self._replica = replica
        self._by_key: dict[tuple[str, int], tuple[PartitionLog, int, int]] | None = None

    def is_satisfied(self) -> bool:
        return any(self._moved(*entry) for entry in self._seen)

    def is_satisfied_by(self, key: tuple[str, int]) -> bool:
        by_key = self._by_key
        if by_key is None:  # built at the first event: most parked fetches see none
            by_key = self._by_key = {(e[0].topic, e[0].partition): e for e in self._seen}
        entry = by_key.get(key)
        return entry is not None and self._moved(*entry)

    def _moved(self, plog: PartitionLog, end: int, start: int) -> bool:
        if self._replica:
            return plog.log_end_offset != end or plog.log_start_offset != start
        return plog.high_watermark != end

    def on_complete(self) -> None:
        self._wake()


@dataclass(slots=True, eq=False)
class PendingFetch:
    """One fetch in progress, across its parks. Not thread-safe: one listener drives it.

    ``wake`` is called (from any thread, at most once per park) when the fetch should be
    read again; it must not block.
    """

    spec: FetchSpec
    deadline_ms: int
    wake: Callable[[], None]
    keys: tuple[tuple[str, int], ...]
    operation: DelayedFetch | None = None
    last_answers: list[PartitionFetched] = field(default_factory=list)
    cancelled: bool = False
    # What the last read saw (``FetchPath._ends``): a follower's fetch is answered once
    # the leader's log start moved since.
    seen: list[tuple[PartitionLog, int, int]] = field(default_factory=list)
    reads: int = 0  # steps that read

    def was_cancelled(self) -> bool:
        """Whether ``FetchPath.cancel`` ran (read again: another thread may set it)."""
        return self.cancelled


class FetchPath:
    """Reads, and parks fetches in the fetch purgatory. Thread-safe (its parts are)."""

    def __init__(
        self,
        partitions: PartitionRegistry,
        purgatory: Purgatory[tuple[str, int]],
        metrics: BrokerMetrics,
        clock: Clock,
        *,
        fetch_max_bytes: int,
        fetch_max_wait_ms: int,
        check_leader: Callable[[str, int], None] | None = None,
        throttle: ReplicationThrottle | None = None,
    ) -> None:
        self._partitions = partitions
        # leader.replication.throttled.rate: reads of a reassignment's adding replicas.
        self._throttle = throttle
        self._logs = partitions.logs
        # Cluster mode: raises unless this broker leads the partition (broker.core.placement).
        self._check_leader = check_leader
        self._purgatory = purgatory
        self._metrics = metrics
        self._clock = clock
        self._fetch_max_bytes = fetch_max_bytes
        self._fetch_max_wait_ms = fetch_max_wait_ms

    def on_append(self, topic: str, partition: int) -> None:
        """Complete the fetches parked on ``topic``-``partition`` (called after appends)."""
        self._purgatory.check_and_complete((topic, partition))

    def begin(
        self, spec: FetchSpec, wake: Callable[[], None], wait_cap_ms: int | None = None
    ) -> PendingFetch:
        """Validate ``spec`` and fix its deadline: ``max_wait_ms``, capped by the broker's
        ``fetch.max.wait.ms`` and by ``wait_cap_ms`` (what is left of the call's own
        deadline).

        Raises:
            InvalidRequestError: negative limits.
        """
        spec.validate()
        wait_ms = min(spec.max_wait_ms, self._fetch_max_wait_ms)
        if wait_cap_ms is not None:
            wait_ms = min(wait_ms, wait_cap_ms)
        watched = dict.fromkeys((p.topic, p.partition) for p in spec.partitions)
        if spec.session is not None:
            watched.update(dict.fromkeys(spec.session.partitions))
        keys = tuple(watched)
        return PendingFetch(spec, self._clock.monotonic_ms() + wait_ms, wake, keys)

    def step(
        self, pending: PendingFetch, *, closing: bool = False
    ) -> list[PartitionFetched] | None:
        """Read; answer if satisfied, the deadline passed, the fetch was cancelled or the
        broker is ``closing``; else park it and return None (``pending.wake`` follows).

        While closing nothing is read: the answer is the last read's (an empty one if
        none), so no read races the closing of the logs.
        """
        if closing:
            return self._count_out(pending.last_answers or self._empty(pending.spec))
        # The end offsets are taken before the data is read: an append after this point
        # moves them, so the parked operation completes at once (or this read already
        # holds its records). Taken after the read, an append between the two was
        # counted as seen without being read, and the fetch slept to its deadline. (An
        # append publishes its end offset after its bytes, ``Segment.append``, so an end
        # taken here is never ahead of what the read can reach.) The purgatory's stamp
        # first: unchanged at the park, nothing moved since (``try_complete_else_watch``).
        stamp = self._purgatory.stamp
        idle: list[tuple[PartitionLog, int, int]] = []
        parts: Sequence[PartitionFetchSpec] = pending.spec.partitions
        if pending.spec.session is not None:
            parts, idle = self._session_parts(pending)
        seen = self._ends(parts, pending.spec.replica_id >= 0) + idle
        answers = self._read_all(pending.spec, parts)
        pending.reads += 1
        release(pending.last_answers)  # superseded: never sent
        pending.last_answers = answers
        start_moved = pending.spec.replica_id >= 0 and _start_moved(pending.seen, seen)
        pending.seen = seen
        if (
            pending.cancelled
            or start_moved
            or self._satisfied(pending.spec, answers)
            or self._clock.monotonic_ms() >= pending.deadline_ms
        ):
            return self._count_out(answers)
        if pending.spec.zero_copy:
            # Parked, a fetch holds no descriptors: its next step reads again anyway (and
            # one stopped by the broker closing answers empty).
            release(answers)
            pending.last_answers = []
        operation = DelayedFetch(
            pending.deadline_ms, seen, pending.wake, replica=pending.spec.replica_id >= 0
        )
        pending.operation = operation
        self._purgatory.try_complete_else_watch(operation, pending.keys, quiet_since=stamp)
        if pending.was_cancelled():
            # ``cancel`` ran on another thread between the check above and the parking
            # (it saw no operation yet): forget it now, not at its deadline.
            self._purgatory.cancel(operation)
        return None

    def _session_parts(
        self, pending: PendingFetch
    ) -> tuple[list[PartitionFetchSpec], list[tuple[PartitionLog, int, int]]]:
        """A session fetch's partitions to read, and what the idle ones' reads would
        have seen (``_ends``). The partitions the request named are read at the first
        step; every other one is read unless the fetch is a follower's and the
        follower is idle on it (``Partition.follower_idle``: in the ISR, at the log
        end, the high watermark and log start as last answered), which costs a few
        attribute reads instead of a read (issue #34: 3,333 partitions per follower)."""
        spec = pending.spec
        assert spec.session is not None
        first = pending.reads == 0
        parts = list(spec.partitions) if first else []
        named = {(p.topic, p.partition) for p in parts}
        idle: list[tuple[PartitionLog, int, int]] = []
        replica = spec.replica_id
        get = self._partitions.get
        for key, c in list(spec.session.partitions.items()):
            if key in named:
                continue
            if replica >= 0:
                try:
                    plog = get(*key).follower_idle(
                        replica,
                        c.fetch_offset,
                        c.current_leader_epoch,
                        c.high_watermark,
                        c.log_start_offset,
                    )
                except Exception:  # gone: the read answers why
                    plog = None
                if plog is not None:
                    idle.append((plog, c.fetch_offset, c.log_start_offset))
                    continue
            parts.append(c.spec(key))
        return parts, idle

    def _ends(
        self, parts: Sequence[PartitionFetchSpec], replica: bool
    ) -> list[tuple[PartitionLog, int, int]]:
        """Each partition's log, what a read may reach now (the log end offset for a
        follower, the high watermark for a consumer) and its log start offset."""
        ends = []
        for p in parts:
            try:
                plog = self._logs.get_log(p.topic, p.partition)
            except Exception as exc:  # unknown or deleted: the read's answer says so
                log.debug("%s-%d: not watched: %r", p.topic, p.partition, exc)
                continue
            reach = plog.log_end_offset if replica else plog.high_watermark
            ends.append((plog, reach, plog.log_start_offset))
        return ends

    def cancel(self, pending: PendingFetch) -> None:
        """The call ended: forget the parked operation, if any. Idempotent."""
        pending.cancelled = True
        if pending.operation is not None:
            self._purgatory.cancel(pending.operation)

    @staticmethod
    def _empty(spec: FetchSpec) -> list[PartitionFetched]:
        return [PartitionFetched(p.topic, p.partition) for p in spec.partitions]

    @staticmethod
    def _satisfied(spec: FetchSpec, answers: Sequence[PartitionFetched]) -> bool:
        # As Kafka: min_bytes 0 or max_wait_ms 0 answer at once; so does any error.
        if spec.max_wait_ms <= 0 or spec.min_bytes <= 0 or any(a.error_code for a in answers):
            return True
        return sum(a.size for a in answers) >= spec.min_bytes

    def _read_all(
        self, spec: FetchSpec, parts: Sequence[PartitionFetchSpec]
    ) -> list[PartitionFetched]:
        remaining = min(spec.max_bytes or self._fetch_max_bytes, self._fetch_max_bytes)
        answers = []
        have_data = False
        replica = spec.replica_id >= 0
        for p in parts:
            budget = min(p.max_bytes or DEFAULT_PARTITION_MAX_BYTES, remaining)
            partition_log: PartitionLog | None = None
            try:
                if p.refused is not None:
                    raise p.refused
                if self._check_leader is not None:
                    self._check_leader(p.topic, p.partition)
                partition = self._partitions.get(p.topic, p.partition)
                if not replica:
                    partition.check_epoch(p.current_leader_epoch)
                partition_log = partition.log
                if replica:
                    diverging = partition.on_follower_fetch(
                        spec.replica_id,
                        p.fetch_offset,
                        p.current_leader_epoch,
                        p.last_fetched_epoch,
                        p.log_start_offset,
                    )
                    if diverging is not None:
                        answers.append(
                            PartitionFetched(
                                p.topic,
                                p.partition,
                                high_watermark=partition_log.high_watermark,
                                log_start_offset=partition_log.log_start_offset,
                                diverging=diverging,
                            )
                        )
                        continue
                throttled = (
                    replica
                    and self._throttle is not None
                    and self._throttle.active
                    and partition.throttled_follower(spec.replica_id)
                )
                if throttled and budget > 0:
                    assert self._throttle is not None
                    budget = self._throttle.grant(budget)
                if budget <= 0:
                    answers.append(
                        PartitionFetched(
                            p.topic,
                            p.partition,
                            b"",
                            partition_log.high_watermark,
                            partition_log.log_start_offset,
                        )
                    )
                    continue
                committed = spec.isolation_level == READ_COMMITTED and not replica
                stable = partition_log.last_stable_offset
                result = partition_log.read(
                    p.fetch_offset,
                    budget,
                    max_offset=(
                        None if replica else stable if committed else partition_log.high_watermark
                    ),
                    zero_copy=spec.zero_copy and not replica,
                )
                if throttled:
                    assert self._throttle is not None
                    self._throttle.charge(result.size)
            except Exception as exc:
                code, message = partition_error(exc)
                where = (
                    (partition_log.high_watermark, partition_log.log_start_offset)
                    if isinstance(exc, OffsetOutOfRangeError) and partition_log is not None
                    else (-1, -1)
                )
                answers.append(
                    PartitionFetched(
                        p.topic,
                        p.partition,
                        error_code=code,
                        error_message=message,
                        # Where the log is now: a follower below the log start starts
                        # over there (broker.cluster.fetcher).
                        high_watermark=where[0],
                        log_start_offset=where[1],
                    )
                )
                continue
            records = result.records
            region = result.region
            size = result.size
            if size > budget and have_data:
                # Only the first batch of the whole answer may exceed the limits.
                records = b""
                times = b""
                if region is not None:
                    region.close()
                    region = None
                size = 0
            else:
                times = result.batch_times
            if size:
                have_data = True
                remaining -= size
            answers.append(
                PartitionFetched(
                    p.topic,
                    p.partition,
                    records,
                    result.high_watermark,
                    result.log_start_offset,
                    batch_times=times,
                    last_stable_offset=stable,
                    aborted_transactions=(
                        _aborted(partition_log, p.fetch_offset, records, region)
                        if committed
                        else ()
                    ),
                    region=region,
                )
            )
        return answers

    def _count_out(self, answers: list[PartitionFetched]) -> list[PartitionFetched]:
        for answer in answers:
            if answer.region is not None:
                self._metrics.bytes_out.labels(answer.topic).inc(answer.region.length)
                self._metrics.records_out.labels(answer.topic).inc(answer.region.records_count)
                continue
            if not answer.records:
                continue
            self._metrics.bytes_out.labels(answer.topic).inc(len(answer.records))
            try:
                count = sum(
                    h.records_count for _, h in iter_batch_headers(answer.records, validate=False)
                )
            except CorruptRecordError:
                log.warning("%s-%d: stored bytes do not frame", answer.topic, answer.partition)
                continue
            self._metrics.records_out.labels(answer.topic).inc(count)
        return answers


def _start_moved(
    before: Sequence[tuple[PartitionLog, int, int]], now: Sequence[tuple[PartitionLog, int, int]]
) -> bool:
    """Whether a log start offset moved between two reads of the same fetch (nothing
    moved before its first read)."""
    starts = {id(plog): start for plog, _, start in before}
    return any(id(plog) in starts and start != starts[id(plog)] for plog, _, start in now)
