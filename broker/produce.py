"""The produce path: append batches to partition logs and keep the ``acks`` promise.

A produce request is split in two steps so that a stream can pipeline them:

1. ``append``: per partition, ``PartitionLog.append`` (which validates framing, CRC, size
   and idempotent-producer sequences and assigns offsets), then wake the fetches waiting on
   that partition. After this the records are readable, and in the page cache.
2. ``complete``: keep the durability promise of ``acks`` and deliver the answers to the
   listener's callback:

   - ``acks=0``: answers at once and tells nothing (offsets -1, no error), as a Kafka
     producer with ``acks=0`` learns nothing; failures are counted in the metrics and
     logged at debug level;
   - ``acks=1``: answers with the offsets once appended;
   - ``acks=all`` (-1): a ``DelayedProduce`` parked in the produce purgatory
     (``broker.delayed``) until every partition written is fsynced up to its last
     offset by the group fsync thread (``broker.group_fsync``): producers running in
     parallel share fsyncs, a stream's next request is appended while the previous one's
     fsync runs, and no listener thread waits for the disk.

A failure is reported per partition; the other partitions of the request are unaffected.
Internal topics (``__consumer_offsets``) refuse produce requests (``INVALID_TOPIC_EXCEPTION``,
as Kafka): only the broker writes them.
The broker never decodes records here; it only counts batch bytes and records.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from broker.delayed import DelayedOperation, Purgatory
from broker.errors import partition_error
from broker.group_fsync import DURABLE, PENDING, GroupFsync
from broker.metrics import BrokerMetrics
from storage.batch_times import BatchTimes
from storage.errors import InvalidRequestError, InvalidTopicError, StorageError
from storage.log_manager import LogManager
from storage.partition_log import AppendResult, PartitionLog

__all__ = [
    "Acks",
    "DelayedProduce",
    "Deliver",
    "PartitionAppend",
    "PartitionProduced",
    "PartitionRecords",
    "ProducePath",
    "parse_acks",
]

log = logging.getLogger(__name__)


class Acks(enum.IntEnum):
    """When the broker answers a produce request (Kafka's values)."""

    NONE = 0
    LEADER = 1
    ALL = -1


def parse_acks(value: int) -> Acks:
    """``Acks`` for the wire value; ``InvalidRequestError`` unless it is 0, 1 or -1."""
    try:
        return Acks(value)
    except ValueError:
        raise InvalidRequestError(f"acks must be 0, 1 or -1 (all), got {value}") from None


@dataclass(frozen=True, slots=True)
class PartitionRecords:
    """One partition's part of a produce request: concatenated RecordBatch v2 bytes, and
    the request's sent/received times, stored for every batch (``storage.batch_times``)."""

    topic: str
    partition: int
    records: bytes
    times: BatchTimes | None = None


@dataclass(frozen=True, slots=True)
class PartitionAppend:
    """The outcome of step 1 for one partition: a result, or the error that refused it."""

    topic: str
    partition: int
    result: AppendResult | None
    error: BaseException | None
    log: PartitionLog | None


@dataclass(frozen=True, slots=True)
class PartitionProduced:
    """One partition's answer. ``error_code`` empty means success."""

    topic: str
    partition: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    duplicate: bool = False
    error_code: str = ""
    error_message: str = ""


Deliver = Callable[[list[PartitionProduced]], None]


def _answers(
    appends: Sequence[PartitionAppend], flush_errors: dict[int, BaseException]
) -> list[PartitionProduced]:
    answers = []
    for append in appends:
        error = append.error or flush_errors.get(id(append.log))
        if error is not None:
            code, message = partition_error(error)
            answers.append(
                PartitionProduced(
                    append.topic, append.partition, error_code=code, error_message=message
                )
            )
            continue
        assert append.result is not None
        assert append.log is not None
        answers.append(
            PartitionProduced(
                append.topic,
                append.partition,
                base_offset=append.result.base_offset,
                log_append_time_ms=append.result.log_append_time_ms,
                log_start_offset=append.log.log_start_offset,
                duplicate=append.result.duplicate,
            )
        )
    return answers


class DelayedProduce(DelayedOperation):
    """An ``acks=all`` produce parked until its batches are durable. Thread-safe.

    No deadline: an fsync cannot be interrupted, and the group fsync thread answers every
    request it takes (success or error). A closing purgatory completes it early; the
    partitions still pending then are answered with the shutdown as a storage fault.
    """

    __slots__ = ("_appends", "_deliver", "_fsync", "_started", "_targets", "_wait")

    def __init__(
        self,
        appends: Sequence[PartitionAppend],
        targets: dict[int, tuple[PartitionLog, int]],
        fsync: GroupFsync,
        deliver: Deliver,
        wait: Callable[[float], None],
    ) -> None:
        super().__init__(None)
        self._appends = appends
        self._targets = targets
        self._fsync = fsync
        self._deliver = deliver
        self._wait = wait
        self._started = time.perf_counter()

    def is_satisfied(self) -> bool:
        return all(self._fsync.status(plog, end) != PENDING for plog, end in self._targets.values())

    def on_complete(self) -> None:
        errors: dict[int, BaseException] = {}
        for key, (plog, end) in self._targets.items():
            status = self._fsync.status(plog, end)
            if isinstance(status, BaseException):
                errors[key] = status
            elif status != DURABLE:
                errors[key] = StorageError(f"{plog}: the broker stopped before the fsync")
        if self._targets:
            self._wait(time.perf_counter() - self._started)
        self._deliver(_answers(self._appends, errors))


class ProducePath:
    """Appends and durability for produce requests. Thread-safe (its parts are)."""

    def __init__(
        self,
        logs: LogManager,
        on_append: Callable[[str, int], None],
        purgatory: Purgatory[tuple[str, int]],
        fsync: GroupFsync,
        metrics: BrokerMetrics,
        check_leader: Callable[[str, int], None] | None = None,
        *,
        batch_times: bool = True,
    ) -> None:
        self._logs = logs
        # False (log.batch.times.enable): store no sent/received times at all.
        self._batch_times = batch_times
        # Cluster mode: raises unless this broker leads the partition (broker.placement).
        self._check_leader = check_leader
        self._on_append = on_append
        self._purgatory = purgatory
        self._fsync = fsync
        self._metrics = metrics

    def produce(
        self, partitions: Sequence[PartitionRecords], acks: Acks
    ) -> list[PartitionProduced]:
        """Append and complete in one go, blocking this thread until answered (tests)."""
        return self.complete_blocking(self.append(partitions), acks)

    def append(self, partitions: Sequence[PartitionRecords]) -> list[PartitionAppend]:
        """Step 1: append each partition's batches, in request order; never raises."""
        return [self._append_one(p) for p in partitions]

    def _append_one(self, part: PartitionRecords) -> PartitionAppend:
        try:
            # Internal topics (__consumer_offsets) are written by the broker only; the
            # prefix test keeps the metadata lookup off the common path.
            if part.topic.startswith("__") and self._logs.topic(part.topic).internal:
                raise InvalidTopicError(f"cannot produce to internal topic {part.topic}")
            if self._check_leader is not None:
                self._check_leader(part.topic, part.partition)
            partition_log = self._logs.get_log(part.topic, part.partition)
            result = partition_log.append(part.records, part.times if self._batch_times else None)
        except Exception as exc:
            code, _ = partition_error(exc)
            self._metrics.produce_errors.labels(code).inc()
            log.debug("produce to %s-%d refused: %s", part.topic, part.partition, code)
            return PartitionAppend(part.topic, part.partition, None, exc, None)
        if not result.duplicate:
            self._metrics.bytes_in.labels(part.topic).inc(len(part.records))
            self._metrics.records_in.labels(part.topic).inc(result.record_count)
            self._on_append(part.topic, part.partition)
        return PartitionAppend(part.topic, part.partition, result, None, partition_log)

    def complete(self, appends: Sequence[PartitionAppend], acks: Acks, deliver: Deliver) -> None:
        """Step 2: deliver the answers once the appends are as durable as ``acks`` asks.

        ``deliver`` runs exactly once: on this thread for ``acks`` 0 and 1 (and for
        ``acks=all`` when everything is durable already), else on the group fsync thread.
        It must not block.
        """
        if acks == Acks.NONE:
            deliver([PartitionProduced(a.topic, a.partition) for a in appends])
            return
        if acks == Acks.LEADER:
            deliver(_answers(appends, {}))
            return
        targets: dict[int, tuple[PartitionLog, int]] = {}
        for append in appends:
            if append.log is None or append.result is None:
                continue
            # flush(n) makes offsets below n durable: last_offset + 1 covers the batch.
            end = append.result.last_offset + 1
            previous = targets.get(id(append.log))
            if previous is None or previous[1] < end:
                targets[id(append.log)] = (append.log, end)
        operation = DelayedProduce(
            appends, targets, self._fsync, deliver, self._metrics.flush_wait.observe
        )
        keys = [(plog.topic, plog.partition) for plog, _ in targets.values()]
        if self._purgatory.try_complete_else_watch(operation, keys):
            return
        for plog, end in targets.values():
            self._fsync.request(plog, end)

    def complete_blocking(
        self, appends: Sequence[PartitionAppend], acks: Acks
    ) -> list[PartitionProduced]:
        """``complete``, blocking this thread until the answers are ready."""
        done = threading.Event()
        box: list[list[PartitionProduced]] = []

        def deliver(answers: list[PartitionProduced]) -> None:
            box.append(answers)
            done.set()

        self.complete(appends, acks, deliver)
        done.wait()
        return box[0]
