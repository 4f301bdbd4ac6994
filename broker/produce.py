"""The produce path: append batches to partition logs and keep the ``acks`` promise.

A produce request is split in two steps so that a stream can pipeline them:

1. ``append``: per partition, ``PartitionLog.append`` (which validates framing, CRC, size
   and idempotent-producer sequences and assigns offsets), then wake the fetches waiting on
   that partition. After this the records are readable, and in the page cache.
2. ``complete``: keep the durability promise of ``acks`` and build the answers:

   - ``acks=0``: answers at once and tells nothing (offsets -1, no error), as a Kafka
     producer with ``acks=0`` learns nothing; failures are counted in the metrics and
     logged at debug level;
   - ``acks=1``: answers with the offsets once appended;
   - ``acks=all`` (-1): fsyncs every partition written up to its last offset first.
     ``PartitionLog.flush`` groups concurrent callers into one fsync, so producers running
     in parallel share fsyncs (group commit), and a stream's next request is appended
     while the previous one's fsync runs.

A failure is reported per partition; the other partitions of the request are unaffected.
Internal topics (``__consumer_offsets``) refuse produce requests (``INVALID_TOPIC_EXCEPTION``,
as Kafka): only the broker writes them.
The broker never decodes records here; it only counts batch bytes and records.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from broker.errors import partition_error
from broker.fetch_waiters import FetchWaiters
from broker.metrics import BrokerMetrics
from storage.errors import InvalidRequestError, InvalidTopicError
from storage.log_manager import LogManager
from storage.partition_log import AppendResult, PartitionLog

__all__ = [
    "Acks",
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
    """One partition's part of a produce request: concatenated RecordBatch v2 bytes."""

    topic: str
    partition: int
    records: bytes


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


class ProducePath:
    """Appends and durability for produce requests. Thread-safe (its parts are)."""

    def __init__(self, logs: LogManager, waiters: FetchWaiters, metrics: BrokerMetrics) -> None:
        self._logs = logs
        self._waiters = waiters
        self._metrics = metrics

    def produce(
        self, partitions: Sequence[PartitionRecords], acks: Acks
    ) -> list[PartitionProduced]:
        """Append and complete in one go (the unary ``Produce``)."""
        return self.complete(self.append(partitions), acks)

    def append(self, partitions: Sequence[PartitionRecords]) -> list[PartitionAppend]:
        """Step 1: append each partition's batches, in request order; never raises."""
        return [self._append_one(p) for p in partitions]

    def _append_one(self, part: PartitionRecords) -> PartitionAppend:
        try:
            # Internal topics (__consumer_offsets) are written by the broker only; the
            # prefix test keeps the metadata lookup off the common path.
            if part.topic.startswith("__") and self._logs.topic(part.topic).internal:
                raise InvalidTopicError(f"cannot produce to internal topic {part.topic}")
            partition_log = self._logs.get_log(part.topic, part.partition)
            result = partition_log.append(part.records)
        except Exception as exc:
            code, _ = partition_error(exc)
            self._metrics.produce_errors.labels(code).inc()
            log.debug("produce to %s-%d refused: %s", part.topic, part.partition, code)
            return PartitionAppend(part.topic, part.partition, None, exc, None)
        if not result.duplicate:
            self._metrics.bytes_in.labels(part.topic).inc(len(part.records))
            self._metrics.records_in.labels(part.topic).inc(result.record_count)
            self._waiters.notify(part.topic, part.partition)
        return PartitionAppend(part.topic, part.partition, result, None, partition_log)

    def complete(self, appends: Sequence[PartitionAppend], acks: Acks) -> list[PartitionProduced]:
        """Step 2: make the appends as durable as ``acks`` asks and build the answers.

        Blocks for fsyncs with ``acks=all``; an fsync cannot be interrupted, so this has no
        timeout of its own (one fsync of the unflushed tail per partition, grouped).
        """
        if acks == Acks.NONE:
            return [PartitionProduced(a.topic, a.partition) for a in appends]
        flush_errors: dict[int, BaseException] = {}
        if acks == Acks.ALL:
            flush_errors = self._flush(appends)
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

    def _flush(self, appends: Sequence[PartitionAppend]) -> dict[int, BaseException]:
        """fsync each written log up to its last appended offset; errors by ``id(log)``."""
        targets: dict[int, tuple[PartitionLog, int]] = {}
        for append in appends:
            if append.log is None or append.result is None:
                continue
            # flush(n) makes offsets below n durable: last_offset + 1 covers the batch.
            end = append.result.last_offset + 1
            previous = targets.get(id(append.log))
            if previous is None or previous[1] < end:
                targets[id(append.log)] = (append.log, end)
        errors: dict[int, BaseException] = {}
        started = time.perf_counter()
        for key, (partition_log, end) in targets.items():
            try:
                partition_log.flush(end)
            except Exception as exc:
                errors[key] = exc
        if targets:
            self._metrics.flush_wait.observe(time.perf_counter() - started)
        return errors
