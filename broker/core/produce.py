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
     (``broker.core.delayed``) until every partition written is fsynced up to its last
     offset by the group fsync thread (``broker.core.group_fsync``): producers running in
     parallel share fsyncs, a stream's next request is appended while the previous one's
     fsync runs, and no listener thread waits for the disk. On a replicated partition
     (cluster mode) it also waits until the high watermark passes the batch, with at
     least ``min.insync.replicas`` in sync (``Partition.ack_status``), and gives up after
     ``REPLICATION_WAIT_MS`` (``REQUEST_TIMED_OUT``, retriable).

Step 1 may run on a listener's event loop (``append_inline``, issue #31): a small request
(``INLINE_APPEND_MAX_BYTES`` in all) to unreplicated partitions, without a transactional
id, is appended there, saving the two thread hand-offs (loop -> I/O pool -> loop) that
cost more than the append itself. Only what cannot wait: each partition's append is
non-blocking (``PartitionLog.append(blocking=False)``: a held partition lock, a roll, a
``flush.messages`` fsync, a checkpoint rewrite, or decompressing batches (a compacted
topic's keys, per-record timestamp bounds, a topic codec's rebuild: a few KiB can hold
megabytes) make it give up
before changing anything), and a transactional batch (a coordinator round trip) or a
replicated partition (its leader state and followers' locks) is never tried. The
partitions it could not append, from the first one on, are appended by ``append`` on a
thread as before, so the request's order holds. The batches are validated (framing, CRC,
sequences) the same way on either thread: only where the work runs differs. Each
partition's headers are read once, every batch's CRC-32C checked, and shared by the
transactional check and the append (``storage.log_validator.validated_batches``): a
damaged batch is answered ``CORRUPT_MESSAGE`` by the append, after the partition's own
checks as before, and its coordinator is never asked about it: bytes that fail their
CRC cannot be trusted to name a producer, so they neither verify nor (transactions v2)
add a partition to anyone's transaction. (Kafka's verification runs before its
``LogValidator``'s CRC check; nothing is gained by following that order here.)

Each partition is appended through its ``Partition`` (``broker.core.partition``:
``append_as_leader`` checks the role, the client's leader epoch and
``min.insync.replicas``, stamps the leader epoch and moves the high watermark), the same
call on a single node, whose partitions are unreplicated leaders, and in cluster mode.

A failure is reported per partition; the other partitions of the request are unaffected.
Internal topics (``__consumer_offsets``) refuse produce requests (``INVALID_TOPIC_EXCEPTION``,
as Kafka): only the broker writes them. Control batches (transaction markers) are refused
(``INVALID_REQUEST``): only the coordinator writes them. A transactional batch (issue #28)
is appended only if the request names its transactional id and the coordinator confirms
that the partition is in that producer's ongoing transaction (KIP-890 part 1's
verification, asked of the id's coordinator: this broker's own on a single node, in a
cluster whichever broker leads the id's ``__transaction_state`` partition now,
``broker.transactions.markers.RoutedVerify``): a batch nobody's transaction covers would
hold the partition's last stable offset back for good. A transactions v2 producer
(Produce v12+, KIP-890 part 2) sends no AddPartitionsToTxn: its partitions are added to
its transaction by the coordinator here instead (``add_partition``, routed the same way).
Before the coordinator is asked, the partition's producer state hands out a verification
guard, and the append checks it under the partition lock: a marker that lands between
the answer and the append voids it (``storage.producer_state``), so a verified batch can
never open a transaction that has just ended. The coordinator's refusals are answered as
Kafka answers a produce: ``PRODUCER_FENCED`` as ``INVALID_PRODUCER_EPOCH``,
``TRANSACTION_ABORTABLE`` as itself (the Kafka listener answers ``INVALID_TXN_STATE`` to
Produce < v11), and ``CONCURRENT_TRANSACTIONS`` and a coordinator that cannot answer now
(``NOT_COORDINATOR``, ``COORDINATOR_NOT_AVAILABLE``, ``COORDINATOR_LOAD_IN_PROGRESS``: it
moved, is loading, or cannot be reached) as ``NOT_ENOUGH_REPLICAS``, retried by every
client, as Kafka's ``AddPartitionsToTxnManager`` answers them. Without a coordinator (a
core built without one) transactional batches are refused.
The broker never decodes records here; it only counts batch bytes and records.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidelog.broker.core.delayed import DelayedOperation, Purgatory
from tidelog.broker.core.errors import partition_error
from tidelog.broker.core.group_fsync import DURABLE, PENDING, GroupFsync
from tidelog.broker.core.metrics import BrokerMetrics
from tidelog.broker.core.partition import Partition
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.storage.batch_times import BatchTimes
from tidelog.storage.clock import Clock, SystemClock
from tidelog.storage.errors import (
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidRequestError,
    InvalidTopicError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    NotEnoughReplicasError,
    StorageError,
    TransactionAbortableError,
)
from tidelog.storage.log_validator import validated_batches
from tidelog.storage.partition_log import AppendResult, AppendWouldBlockError, PartitionLog
from tidelog.storage.producer_state import VerificationGuard
from tidelog.storage.segment import BatchPosition

__all__ = [
    "INLINE_APPEND_MAX_BYTES",
    "REPLICATION_WAIT_MS",
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

# How long an acks=all produce waits for its followers (Kafka's produce request timeout;
# the producer's own delivery timeout is the bound the user sets).
REPLICATION_WAIT_MS = 30_000

# The largest request (records bytes, all partitions) ``append_inline`` appends on the
# caller's thread: a few batches of small records, whose validation and write take tens
# of microseconds. Larger requests go to a thread: their CRC and copy take longer than a
# hand-off, and an event loop must not be held that long.
INLINE_APPEND_MAX_BYTES = 64 * 1024


class Acks(enum.IntEnum):
    """When the broker answers a produce request (Kafka's values)."""

    NONE = 0
    LEADER = 1
    ALL = -1


# The coordinator's verification: per (transactional id, producer id, epoch, partition)
# "" or Kafka's error name (``TransactionCoordinator.verify_partitions``, one partition).
Verify = Callable[[str, int, int, tuple[str, int]], str]
_PRODUCE_ANSWERS = {
    "PRODUCER_FENCED": InvalidProducerEpochError,
    # TRANSACTION_ABORTABLE is answered as INVALID_TXN_STATE to Produce < v11 by the
    # Kafka listener (the only one that takes transactional batches).
    "TRANSACTION_ABORTABLE": TransactionAbortableError,
    "INVALID_PRODUCER_ID_MAPPING": InvalidTxnStateError,
    "CONCURRENT_TRANSACTIONS": NotEnoughReplicasError,
    "NOT_COORDINATOR": NotEnoughReplicasError,
    "COORDINATOR_NOT_AVAILABLE": NotEnoughReplicasError,
    "COORDINATOR_LOAD_IN_PROGRESS": NotEnoughReplicasError,
}


def _check_transactional(
    part: PartitionRecords,
    batches: list[BatchPosition] | None,
    log: PartitionLog,
    verify: Verify | None,
    add: Verify | None,
) -> dict[int, VerificationGuard | None] | None:
    """Refuse control batches, and transactional ones the coordinator does not confirm
    (module docstring); the verification guards to append with (None: no transactional
    batch). Each producer's guard is taken before the coordinator is asked, so that a
    marker landing before the append voids the answer (``storage.producer_state``).
    ``batches``: the request's validated headers (None: damaged, left to the log's
    append, which reports it as before)."""
    if batches is None:
        return None
    guards: dict[int, VerificationGuard | None] = {}
    checked: set[tuple[int, int]] = set()
    for batch in batches:
        header = batch.header
        if header.is_control:
            raise InvalidRequestError("control batches are written by the broker only")
        if not header.is_transactional:
            continue
        check = add if part.transaction_v2 else verify
        if check is None:
            raise InvalidRequestError("transactional batches need a transaction coordinator")
        if part.transactional_id is None:
            raise InvalidRequestError(
                "a transactional batch in a request without a transactional id"
            )
        identity = (header.producer_id, header.producer_epoch)
        if identity in checked:
            continue
        checked.add(identity)
        guards[header.producer_id] = log.start_verification(
            *identity, epoch_bump=part.transaction_v2
        )
        code = check(part.transactional_id, *identity, (part.topic, part.partition))
        if code:
            raise _PRODUCE_ANSWERS.get(code, InvalidTxnStateError)(
                f"{part.topic}-{part.partition} is not in the ongoing transaction of "
                f"{part.transactional_id!r} (producer {identity[0]} epoch {identity[1]}): {code}"
            )
    return guards if checked else None


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
    acks_all: bool = False
    current_leader_epoch: int = -1  # the client's view of the leader epoch; -1: unchecked
    refused: BaseException | None = None  # the authorizer's answer: not written
    transactional_id: str | None = None  # the request's, for transactional batches
    # Produce v12+ (KIP-890 part 2): a transactions v2 producer, whose partitions join
    # its transaction implicitly (the coordinator adds rather than verifies them).
    transaction_v2: bool = False


@dataclass(frozen=True, slots=True)
class PartitionAppend:
    """The outcome of step 1 for one partition: a result, or the error that refused it."""

    topic: str
    partition: int
    result: AppendResult | None
    error: BaseException | None
    target: Partition | None  # the partition appended to

    @property
    def log(self) -> PartitionLog | None:
        """The log appended to."""
        return None if self.target is None else self.target.log


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
        error = append.error or flush_errors.get(id(append.target))
        if error is not None:
            code, message = partition_error(error)
            answers.append(
                PartitionProduced(
                    append.topic, append.partition, error_code=code, error_message=message
                )
            )
            continue
        assert append.result is not None
        assert append.target is not None
        answers.append(
            PartitionProduced(
                append.topic,
                append.partition,
                base_offset=append.result.base_offset,
                log_append_time_ms=append.result.log_append_time_ms,
                log_start_offset=append.target.log.log_start_offset,
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
        targets: dict[int, tuple[Partition, int]],
        fsync: GroupFsync,
        deliver: Deliver,
        wait: Callable[[float], None],
        deadline_ms: int | None = None,
    ) -> None:
        super().__init__(deadline_ms)
        self._appends = appends
        self._targets = targets
        self._fsync = fsync
        self._deliver = deliver
        self._wait = wait
        self._started = time.perf_counter()

    def _status(self, partition: Partition, end: int) -> str | BaseException:
        # The replication answer first: a leader that stopped leading (a reassignment
        # deletes its log, so the fsync never comes) answers NOT_LEADER_OR_FOLLOWER, whose
        # outcome the producer knows is unknown, not a storage error.
        acked = partition.ack_status(end)
        if isinstance(acked, BaseException):
            return acked
        status = self._fsync.status(partition.log, end)
        if status != DURABLE:
            return status
        return acked

    def is_satisfied(self) -> bool:
        return all(
            self._status(partition, end) != PENDING for partition, end in self._targets.values()
        )

    def on_complete(self) -> None:
        errors: dict[int, BaseException] = {}
        for key, (partition, end) in self._targets.items():
            plog = partition.log
            status = self._status(partition, end)
            if isinstance(status, BaseException):
                errors[key] = status
            elif status != DURABLE and self._fsync.status(plog, end) == DURABLE:
                errors[key] = KafkaTimeoutError(
                    f"{plog.topic}-{plog.partition}: not replicated to the in-sync replicas "
                    f"within {REPLICATION_WAIT_MS} ms"
                )
            elif status != DURABLE:
                errors[key] = StorageError(f"{plog}: the broker stopped before the fsync")
        if self._targets:
            self._wait(time.perf_counter() - self._started)
        self._deliver(_answers(self._appends, errors))


class ProducePath:
    """Appends and durability for produce requests. Thread-safe (its parts are)."""

    def __init__(
        self,
        partitions: PartitionRegistry,
        on_append: Callable[[str, int], None],
        purgatory: Purgatory[tuple[str, int]],
        fsync: GroupFsync,
        metrics: BrokerMetrics,
        check_leader: Callable[[str, int], None] | None = None,
        *,
        batch_times: bool = True,
        clock: Clock | None = None,
        verify: Verify | None = None,
        add_partition: Verify | None = None,
    ) -> None:
        self._partitions = partitions
        # Transactions: the coordinator's check of a transactional batch (None: refused),
        # and for a transactions v2 producer its implicit AddPartitionsToTxn.
        self._verify = verify
        self._add_partition = add_partition
        self._logs = partitions.logs
        self._clock = clock or SystemClock()
        # False (log.batch.times.enable): store no sent/received times at all.
        self._batch_times = batch_times
        # Cluster mode: raises unless this broker leads the partition (broker.core.placement).
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

    def append_inline(self, partitions: Sequence[PartitionRecords]) -> list[PartitionAppend]:
        """Step 1 for the leading partitions of a request that can be appended without
        blocking (module docstring), in request order; the caller appends the rest
        (``partitions[len(answer):]``) with ``append`` on a thread that may wait. Never
        raises; an empty list when the request is too large to try."""
        if sum(len(p.records) for p in partitions) > INLINE_APPEND_MAX_BYTES:
            return []
        out = []
        for part in partitions:
            try:
                out.append(self._append_one(part, blocking=False))
            except AppendWouldBlockError:
                break
        return out

    def _append_one(self, part: PartitionRecords, *, blocking: bool = True) -> PartitionAppend:
        try:
            if not blocking and part.transactional_id is not None:
                raise AppendWouldBlockError("a transactional request asks its coordinator")
            if part.refused is not None:
                raise part.refused
            # Internal topics (__consumer_offsets) are written by the broker only; the
            # prefix test keeps the metadata lookup off the common path.
            if part.topic.startswith("__") and self._logs.topic(part.topic).internal:
                raise InvalidTopicError(f"cannot produce to internal topic {part.topic}")
            if self._check_leader is not None:
                self._check_leader(part.topic, part.partition)
            target = self._partitions.get(part.topic, part.partition)
            if not blocking and target.replicated:
                raise AppendWouldBlockError("a replicated partition is appended on a thread")
            # One walk of the headers (CRC-32C included) for the transactional check and
            # the append. Damaged batches are reported by the append, after the
            # partition's own checks (role, leader epoch, min ISR), as before.
            try:
                batches: list[BatchPosition] | None = validated_batches(part.records)
            except CorruptRecordError:
                batches = None
            guards = _check_transactional(
                part, batches, target.log, self._verify, self._add_partition
            )
            result = target.append_as_leader(
                part.records,
                part.times if self._batch_times else None,
                acks_all=part.acks_all,
                current_leader_epoch=part.current_leader_epoch,
                verification=guards,
                blocking=blocking,
                batches=batches,
            )
        except AppendWouldBlockError:
            raise  # nothing appended: the caller appends this partition on a thread
        except Exception as exc:
            code, _ = partition_error(exc)
            self._metrics.produce_errors.labels(code).inc()
            log.debug("produce to %s-%d refused: %s", part.topic, part.partition, code)
            return PartitionAppend(part.topic, part.partition, None, exc, None)
        if not result.duplicate:
            self._metrics.count_in(part.topic, len(part.records), result.record_count)
            self._on_append(part.topic, part.partition)
        return PartitionAppend(part.topic, part.partition, result, None, target)

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
        targets: dict[int, tuple[Partition, int]] = {}
        replicated = False
        for append in appends:
            if append.target is None or append.result is None:
                continue
            # flush(n) makes offsets below n durable: last_offset + 1 covers the batch.
            end = append.result.last_offset + 1
            previous = targets.get(id(append.target))
            if previous is None or previous[1] < end:
                targets[id(append.target)] = (append.target, end)
            replicated = replicated or append.target.replicated
        # Only waiting for followers can time out; an fsync is never interrupted.
        operation = DelayedProduce(
            appends,
            targets,
            self._fsync,
            deliver,
            self._metrics.flush_wait.observe,
            self._clock.monotonic_ms() + REPLICATION_WAIT_MS if replicated else None,
        )
        keys = [(p.topic, p.partition) for p, _ in targets.values()]
        if self._purgatory.try_complete_else_watch(operation, keys):
            return
        for p, end in targets.values():
            self._fsync.request(p.log, end)

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
