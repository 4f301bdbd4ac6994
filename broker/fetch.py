"""The fetch path: read stored batches, long-polling until ``min_bytes`` or ``max_wait_ms``.

A fetch reads every partition it names; if the answer holds at least ``min_bytes`` (or any
partition failed, or ``max_wait_ms`` or ``min_bytes`` is 0, as in Kafka) it returns at
once. Otherwise it registers a ``Waiter`` for those partitions and sleeps on it until an
append to one of them wakes it, the wait runs out, the call ends, or the broker stops; then
it reads again. Appends wake it through ``FetchWaiters.notify``; nothing polls.

Size limits, as Kafka's: the answer holds at most ``max_bytes`` (capped by the broker's
``fetch.max.bytes``) and each partition at most its ``partition_max_bytes`` (1 MiB when 0),
except that the first batch of the first non-empty partition is always returned whole, so
a consumer always progresses past a batch larger than its limits. A later partition whose
first batch does not fit what is left gets no bytes this time (its offsets are still
answered). Bytes are returned as stored: the first batch may start before the fetch offset.

Per-partition failures (unknown partition, ``OFFSET_OUT_OF_RANGE`` for an offset below the
log start or past the log end, negative offsets included) are answered per partition.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from broker.errors import partition_error
from broker.fetch_waiters import FetchWaiters, Waiter
from broker.metrics import BrokerMetrics
from storage.clock import Clock
from storage.errors import CorruptRecordError, InvalidRequestError
from storage.log_manager import LogManager
from storage.records import iter_batch_headers

__all__ = [
    "DEFAULT_PARTITION_MAX_BYTES",
    "FetchPath",
    "FetchSpec",
    "PartitionFetchSpec",
    "PartitionFetched",
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


@dataclass(frozen=True, slots=True)
class FetchSpec:
    """A whole fetch. ``max_bytes`` 0 means the broker's ``fetch.max.bytes``."""

    partitions: Sequence[PartitionFetchSpec]
    max_wait_ms: int = 0
    min_bytes: int = 0
    max_bytes: int = 0

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


class FetchPath:
    """Reads and long polls. Thread-safe (its parts are)."""

    def __init__(
        self,
        logs: LogManager,
        waiters: FetchWaiters,
        metrics: BrokerMetrics,
        clock: Clock,
        *,
        fetch_max_bytes: int,
        fetch_max_wait_ms: int,
    ) -> None:
        self._logs = logs
        self._waiters = waiters
        self._metrics = metrics
        self._clock = clock
        self._fetch_max_bytes = fetch_max_bytes
        self._fetch_max_wait_ms = fetch_max_wait_ms

    def fetch(
        self, spec: FetchSpec, *, waiter: Waiter | None = None, wait_cap_ms: int | None = None
    ) -> list[PartitionFetched]:
        """Answer a fetch, waiting up to ``max_wait_ms`` for ``min_bytes``.

        Args:
            spec: what to read.
            waiter: a waiter the caller can wake (e.g. when the gRPC call is cancelled);
                a fresh one if None.
            wait_cap_ms: cuts the wait short (what is left of the call's own deadline).

        Raises:
            InvalidRequestError: negative limits.
        """
        spec.validate()
        wait_ms = min(spec.max_wait_ms, self._fetch_max_wait_ms)
        if wait_cap_ms is not None:
            wait_ms = min(wait_ms, wait_cap_ms)
        deadline = self._clock.monotonic_ms() + wait_ms
        answers = self._read_all(spec)
        if self._satisfied(spec, answers) or self._clock.monotonic_ms() >= deadline:
            return self._count_out(answers)
        keys = {(p.topic, p.partition) for p in spec.partitions}
        with self._waiters.register(keys, waiter) as registered:
            while True:
                # Clear, then read: an append after the read sets the event again.
                registered.clear()
                answers = self._read_all(spec)
                remaining = deadline - self._clock.monotonic_ms()
                if (
                    self._satisfied(spec, answers)
                    or remaining <= 0
                    or self._waiters.closed
                    or registered.cancelled
                ):
                    return self._count_out(answers)
                registered.wait(remaining)

    @staticmethod
    def _satisfied(spec: FetchSpec, answers: Sequence[PartitionFetched]) -> bool:
        # As Kafka: min_bytes 0 or max_wait_ms 0 answer at once; so does any error.
        if spec.max_wait_ms <= 0 or spec.min_bytes <= 0 or any(a.error_code for a in answers):
            return True
        return sum(len(a.records) for a in answers) >= spec.min_bytes

    def _read_all(self, spec: FetchSpec) -> list[PartitionFetched]:
        remaining = min(spec.max_bytes or self._fetch_max_bytes, self._fetch_max_bytes)
        answers = []
        have_data = False
        for p in spec.partitions:
            budget = min(p.max_bytes or DEFAULT_PARTITION_MAX_BYTES, remaining)
            try:
                partition_log = self._logs.get_log(p.topic, p.partition)
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
                result = partition_log.read(p.fetch_offset, budget)
            except Exception as exc:
                code, message = partition_error(exc)
                answers.append(
                    PartitionFetched(p.topic, p.partition, error_code=code, error_message=message)
                )
                continue
            records = result.records
            if len(records) > budget and have_data:
                # Only the first batch of the whole answer may exceed the limits.
                records = b""
            if records:
                have_data = True
                remaining -= len(records)
            answers.append(
                PartitionFetched(
                    p.topic, p.partition, records, result.high_watermark, result.log_start_offset
                )
            )
        return answers

    def _count_out(self, answers: list[PartitionFetched]) -> list[PartitionFetched]:
        for answer in answers:
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
