"""The producer's record accumulator: per-partition batches, readiness, buffer accounting.

``send`` appends a record to the last open batch of its partition (``append``); the
sender thread asks which partitions have a batch worth sending (``ready``: full, or older
than ``linger_ms``, or a flush/close/buffer wait is on) and takes at most one batch per
partition for its next request (``drain``). Records are kept as tuples until the batch is
first drained; only then is it encoded (``storage.records.BatchBuilder``), because only
then does it get its producer id and sequence numbers (``client.idempotence``), and the
encoding then stays fixed for every retry. Encoding at drain time also keeps ``send``
cheap: the sender thread does the byte work, once per batch.

Ordering: a partition's batches leave in order. A batch that must be retried goes back to
the front of its queue in sequence order (``reenqueue``) and is not sent again before the
partition has nothing in flight, so the retry lands before the batches after it. Without
idempotence a partition has at most one batch in flight (the only way to keep order
across retries without sequence numbers); with it, up to ``max_in_flight``, since the
broker refuses a batch that skips a sequence.

Memory: every record's estimated size counts against ``buffer_memory`` from ``append``
until its batch is completed or failed (``deallocate``); ``append`` refuses a record
that does not fit, and the producer then waits for memory (backpressure).

Pure: takes ``now_ms``, touches no thread, lock or socket. Not thread-safe (the producer
calls it under its lock).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from tidelog.client.types import Header, TopicPartition
from tidelog.storage.records import (
    HEADER_SIZE,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchBuilder,
    Compression,
)

__all__ = [
    "APPENDED",
    "NEW_BATCH",
    "NO_ROOM",
    "RECORD_OVERHEAD_BYTES",
    "ProducerBatch",
    "ReadyCheck",
    "RecordAccumulator",
    "estimate_record_size",
]

H = TypeVar("H")

# What append did.
NO_ROOM = 0
APPENDED = 1
NEW_BATCH = 2

# Worst case bytes of a record's framing besides key, value and headers for records up to
# 2 MiB: length (3) + attributes (1) + timestamp delta (3) + offset delta (3) + key and
# value lengths (3 each) + header count (1); Kafka's own bound is 21 for any size.
RECORD_OVERHEAD_BYTES = 17


def estimate_record_size(key: bytes | None, value: bytes | None, headers: Sequence[Header]) -> int:
    """An upper bound on a record's encoded size, for batching and buffer accounting."""
    size = RECORD_OVERHEAD_BYTES
    if key is not None:
        size += len(key)
    if value is not None:
        size += len(value)
    for header_key, header_value in headers:
        size += 10 + len(header_key.encode("utf-8"))
        if header_value is not None:
            size += len(header_value)
    return size


class ProducerBatch(Generic[H]):
    """Records of one partition sent (and retried) together. Not thread-safe.

    Records are kept column-wise, index for index: ``timestamps``, ``keys``, ``values``,
    ``headers`` and ``handles`` (the producer's per-record completion handles). Columns
    rather than a tuple per record: no object per record for the garbage collector to
    track while the batch waits. ``data`` is the encoded
    batch, fixed from the first drain on (with ``producer_id``/``base_sequence``).
    """

    __slots__ = (
        "attempts",
        "base_sequence",
        "created_ms",
        "data",
        "handles",
        "headers",
        "in_flight",
        "keys",
        "producer_epoch",
        "producer_id",
        "retry_at_ms",
        "serial",
        "size_bytes",
        "timestamps",
        "tp",
        "values",
    )

    def __init__(self, tp: TopicPartition, created_ms: int, serial: int) -> None:
        self.tp = tp
        self.created_ms = created_ms
        self.serial = serial  # creation order; a partition's batches are sent in it
        self.timestamps: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[Sequence[Header]] = []
        self.handles: list[H] = []
        self.size_bytes = 0
        self.data: bytes | None = None
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.base_sequence = NO_SEQUENCE
        self.attempts = 0
        self.retry_at_ms = 0
        self.in_flight = False

    @property
    def record_count(self) -> int:
        return len(self.timestamps)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + len(self.timestamps) - 1) % 2**31

    def clear_sequence(self) -> None:
        """Forget the identity and bytes: the broker cannot have stored this batch."""
        self.data = None
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.base_sequence = NO_SEQUENCE

    def __repr__(self) -> str:
        return (
            f"ProducerBatch({self.tp}, records={len(self.timestamps)}, "
            f"sequence={self.base_sequence}, attempts={self.attempts})"
        )


@dataclass(frozen=True, slots=True)
class ReadyCheck:
    """Partitions with a batch to send now, and when to look again if none is."""

    partitions: list[TopicPartition]
    next_check_ms: int | None  # None: nothing is waiting on time


# Assigns (producer_id, epoch, base_sequence) to a batch of tp with n records.
SequenceAssigner = Callable[[TopicPartition, int], tuple[int, int, int]]


class RecordAccumulator(Generic[H]):
    """Per-partition queues of batches with buffer accounting. Not thread-safe."""

    def __init__(
        self,
        *,
        batch_size: int,
        buffer_memory: int,
        linger_ms: int,
        compression: Compression = Compression.NONE,
        max_in_flight: int = 5,
        ordered_single_flight: bool = False,
        transactional: bool = False,
    ) -> None:
        """``ordered_single_flight``: at most one batch in flight per partition (for
        producers without idempotence), else up to ``max_in_flight``. ``transactional``:
        batches are encoded with the transactional attribute (a transactional producer)."""
        self._transactional = transactional
        self._batch_size = batch_size
        self._buffer_memory = buffer_memory
        self._linger_ms = linger_ms
        self._compression = compression
        self._partition_in_flight_limit = 1 if ordered_single_flight else max_in_flight
        self._queues: dict[TopicPartition, deque[ProducerBatch[H]]] = {}
        self._in_flight: dict[TopicPartition, int] = {}
        self._used_bytes = 0
        self._flushes = 0
        self._closing = False
        self.waiting_for_memory = False  # set by the producer while a send waits
        self._drain_start = 0
        self._serial = 0
        self._incomplete: dict[int, ProducerBatch[H]] = {}  # by serial: not yet done
        # The batch of each partition that takes appends: the last of its queue, never
        # drained. Kept apart so that append needs one dict lookup.
        self._open: dict[TopicPartition, ProducerBatch[H]] = {}

    # --- appending (the caller's thread, under the producer's lock) --------------------

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    @property
    def buffer_memory(self) -> int:
        return self._buffer_memory

    def append(
        self,
        tp: TopicPartition,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
        size_bytes: int,
        handle: H,
        now_ms: int,
    ) -> int:
        """Add one record to ``tp``'s open batch, or to a new one.

        Returns ``NO_ROOM`` (nothing changed) if ``size_bytes`` does not fit in the buffer
        (a record larger than the whole buffer never fits: the producer refuses those
        first), ``NEW_BATCH`` if the record opened a batch (the sender may have something
        new to wait for), else ``APPENDED``.
        """
        used = self._used_bytes + size_bytes
        if used > self._buffer_memory:
            return NO_ROOM
        status = APPENDED
        batch = self._open.get(tp)
        if batch is None or (batch.size_bytes + size_bytes > self._batch_size and batch.size_bytes):
            batch = self._new_batch(tp, now_ms)
            status = NEW_BATCH
        batch.timestamps.append(timestamp_ms)
        batch.keys.append(key)
        batch.values.append(value)
        batch.headers.append(headers)
        batch.handles.append(handle)
        batch.size_bytes += size_bytes
        self._used_bytes = used
        return status

    def _new_batch(self, tp: TopicPartition, now_ms: int) -> ProducerBatch[H]:
        self._serial += 1
        batch: ProducerBatch[H] = ProducerBatch(tp, now_ms, self._serial)
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
        queue.append(batch)
        self._open[tp] = batch
        self._incomplete[self._serial] = batch
        return batch

    def _close_if_open(self, batch: ProducerBatch[H]) -> None:
        if self._open.get(batch.tp) is batch:
            del self._open[batch.tp]

    # --- sending (the sender thread, under the producer's lock) --------------------------

    def begin_flush(self) -> None:
        """Make every batch ready now, until ``end_flush`` (flushes nest)."""
        self._flushes += 1

    def end_flush(self) -> None:
        self._flushes = max(self._flushes - 1, 0)

    def close(self) -> None:
        """No more appends are expected: send everything without lingering."""
        self._closing = True

    def ready(
        self, now_ms: int, can_send: Callable[[TopicPartition, int], bool] | None = None
    ) -> ReadyCheck:
        """Partitions whose first batch should be sent now.

        A batch is due when it is full (or another batch queues behind it), has lingered
        ``linger_ms``, or a flush, close or memory wait is on; a retried batch when its
        backoff is over and its partition has nothing in flight. A partition at its
        in-flight limit, or refused by ``can_send(tp, batches_in_flight)``, waits.
        """
        hurry = self._flushes > 0 or self._closing or self.waiting_for_memory
        ready: list[TopicPartition] = []
        next_check: int | None = None
        limit = self._partition_in_flight_limit
        in_flight = self._in_flight
        for tp, queue in self._queues.items():
            if not queue:
                continue
            flying = in_flight.get(tp, 0)
            if flying >= limit:
                continue
            batch = queue[0]
            if batch.attempts:
                if flying:
                    continue  # a retry goes out only after what is in flight came back
                if now_ms < batch.retry_at_ms:
                    next_check = _earlier(next_check, batch.retry_at_ms)
                    continue
            elif not (hurry or len(queue) > 1 or batch.size_bytes >= self._batch_size):
                due = batch.created_ms + self._linger_ms
                if now_ms < due:
                    next_check = _earlier(next_check, due)
                    continue
            if can_send is not None and not can_send(tp, flying):
                continue
            ready.append(tp)
        return ReadyCheck(ready, next_check)

    def drain(
        self,
        partitions: Sequence[TopicPartition],
        max_request_bytes: int,
        assign_sequence: SequenceAssigner | None = None,
    ) -> list[ProducerBatch[H]]:
        """Take the first batch of each ready partition for one request.

        At most one batch per partition; stops before ``max_request_bytes`` (but always
        takes one batch). The start rotates so no partition starves. A batch drained for
        the first time gets its identity from ``assign_sequence`` (idempotence); a
        retried batch keeps it, and its bytes. The caller then ``encode``s the batches,
        outside its lock (the records of a drained batch are no longer appended to).
        Drained batches count as in flight until ``complete``/``reenqueue``.
        """
        taken: list[ProducerBatch[H]] = []
        if not partitions:
            return taken
        size = 0
        count = len(partitions)
        start = self._drain_start % count
        self._drain_start += 1
        for i in range(count):
            tp = partitions[(start + i) % count]
            queue = self._queues.get(tp)
            if not queue:
                continue
            batch = queue[0]
            estimate = batch.size_bytes + HEADER_SIZE if batch.data is None else len(batch.data)
            if taken and size + estimate > max_request_bytes:
                continue
            queue.popleft()
            self._close_if_open(batch)
            if (
                batch.data is None
                and assign_sequence is not None
                and batch.base_sequence == NO_SEQUENCE
            ):
                pid, epoch, sequence = assign_sequence(tp, len(batch.timestamps))
                batch.producer_id, batch.producer_epoch = pid, epoch
                batch.base_sequence = sequence
            size += estimate
            batch.attempts += 1
            batch.in_flight = True
            self._in_flight[tp] = self._in_flight.get(tp, 0) + 1
            taken.append(batch)
        return taken

    def encode(self, batch: ProducerBatch[H]) -> bytes:
        """The batch's bytes, encoding them on the first call (then fixed for retries)."""
        if batch.data is not None:
            return batch.data
        builder = BatchBuilder(
            compression=self._compression,
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
            is_transactional=self._transactional,
        )
        builder.extend(batch.timestamps, batch.keys, batch.values, batch.headers)
        batch.data = builder.build()
        return batch.data

    # --- answers (the sender thread, under the producer's lock) -------------------------

    def _landed(self, batch: ProducerBatch[H]) -> None:
        if batch.in_flight:
            batch.in_flight = False
            remaining = self._in_flight.get(batch.tp, 0) - 1
            if remaining > 0:
                self._in_flight[batch.tp] = remaining
            else:
                self._in_flight.pop(batch.tp, None)

    def complete(self, batch: ProducerBatch[H]) -> None:
        """The batch is done (stored or failed for good): release its memory."""
        self._landed(batch)
        self.deallocate(batch)

    def deallocate(self, batch: ProducerBatch[H]) -> None:
        """Release the buffer memory of a batch that is done. Idempotent."""
        if self._incomplete.pop(batch.serial, None) is not None:
            self._used_bytes -= batch.size_bytes

    def reserve(self, size_bytes: int) -> bool:
        """Hold ``size_bytes`` of buffer for a record that waits for its topic's metadata.

        False (nothing held) if they do not fit. ``release`` gives them back.
        """
        if self._used_bytes + size_bytes > self._buffer_memory:
            return False
        self._used_bytes += size_bytes
        return True

    def release(self, size_bytes: int) -> None:
        """Give back bytes taken with ``reserve``."""
        self._used_bytes -= size_bytes

    def has_incomplete(self) -> bool:
        """Whether any batch is not yet completed or failed."""
        return bool(self._incomplete)

    def incomplete(self) -> list[ProducerBatch[H]]:
        """Every batch not yet completed or failed (queued or in flight), oldest first."""
        return list(self._incomplete.values())

    def reenqueue(self, batch: ProducerBatch[H], retry_at_ms: int) -> None:
        """Put a batch back into its queue, in creation order, for a retry.

        Creation order is also sequence order (sequences are given in drain order, and a
        partition drains in creation order), so retries go out in sequence order.
        """
        self._landed(batch)
        batch.retry_at_ms = retry_at_ms
        queue = self._queues.get(batch.tp)
        if queue is None:
            queue = self._queues[batch.tp] = deque()
        position = len(queue)
        for index, queued in enumerate(queue):
            if queued.serial > batch.serial:
                position = index
                break
        queue.insert(position, batch)

    def in_flight(self, tp: TopicPartition) -> int:
        """Batches of ``tp`` drained and not yet back."""
        return self._in_flight.get(tp, 0)

    def total_in_flight(self) -> int:
        return sum(self._in_flight.values())

    def queued(self, tp: TopicPartition) -> list[ProducerBatch[H]]:
        """The batches waiting in ``tp``'s queue, oldest first (a copy)."""
        return list(self._queues.get(tp, ()))

    def remove(self, tp: TopicPartition, batches: Iterable[ProducerBatch[H]]) -> None:
        """Take queued (not in-flight) batches out of ``tp``'s queue."""
        queue = self._queues.get(tp)
        if not queue:
            return
        gone = {id(b) for b in batches}
        for batch in queue:
            if id(batch) in gone:
                self._close_if_open(batch)
        kept = [b for b in queue if id(b) not in gone]
        queue.clear()
        queue.extend(kept)

    def expire(self, now_ms: int, delivery_timeout_ms: int) -> list[ProducerBatch[H]]:
        """Take out queued batches older than ``delivery_timeout_ms``, oldest first.

        A queue is only cut from the front, so what stays keeps its order.
        """
        expired: list[ProducerBatch[H]] = []
        deadline = now_ms - delivery_timeout_ms
        for queue in self._queues.values():
            while queue and queue[0].created_ms <= deadline:
                batch = queue.popleft()
                self._close_if_open(batch)
                expired.append(batch)
        return expired

    def has_undrained(self) -> bool:
        """Whether any batch waits in a queue."""
        return any(self._queues.values())

    def next_expiry_ms(self, delivery_timeout_ms: int) -> int | None:
        """When the oldest queued batch runs out of delivery time."""
        oldest = min((q[0].created_ms for q in self._queues.values() if q), default=None)
        return None if oldest is None else oldest + delivery_timeout_ms

    def abort_all(self) -> list[ProducerBatch[H]]:
        """Take every queued batch out (closing without waiting); in-flight ones stay."""
        aborted = [batch for queue in self._queues.values() for batch in queue]
        self._queues.clear()
        self._open.clear()
        return aborted


def _earlier(current: int | None, candidate: int) -> int:
    return candidate if current is None or candidate < current else current
