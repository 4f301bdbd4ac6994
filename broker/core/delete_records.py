"""DeleteRecords (KIP-107) without a thread per waiting request: Kafka's
``DelayedDeleteRecords`` over the core's purgatory (``broker.core.delayed``).

A request moves each partition's log start offset on its leader at once
(``Partition.delete_records``: checkpointed before anything is answered), then waits until
every in-sync replica's log start reached it (``Partition.low_watermark``). The wait is a
parked ``DelayedDeleteRecords``, watched under its partitions' keys in the
``delete_records`` purgatory: nothing waits on its behalf. It completes

* when every partition is final: its low watermark reached the target, or it failed (this
  broker stopped leading it: ``NOT_LEADER_OR_FOLLOWER``). Each follower's fetch reports its
  log start; the leader's ``Partition.on_follower_fetch`` then tells the registry's
  listeners (``notify_progress``), which re-check this purgatory. The follower learns the
  new start from the answer to a fetch the leader parked: the move wakes that fetch at
  once (``Partition.delete_records`` notifies too, and a parked follower fetch completes
  when the leader's log start moves, ``broker.core.fetch``), so the answer comes after two
  fetch round trips, not after a fetch wait (``replica.fetch.wait.max.ms``);
* at its deadline (the request's ``timeout_ms``): partitions not reached answer
  ``REQUEST_TIMED_OUT`` (their leader's log start has moved all the same; the followers
  follow), as Kafka's purgatory expires it; ``timeout_ms`` 0 answers at once;
* when the broker stops (the purgatory closes): as at the deadline.

``deliver`` gets the answers in request order, once, on the thread that completed the
operation (a fetch handler's, the reaper, the caller's own when nothing had to wait): it
must not block. The Kafka listener resolves an asyncio future with it (no thread held);
the gRPC listener's unary handlers run on its executor and use ``delete_records``, which
blocks that thread on an event, bounded by the request's timeout (a rare administrative
call; the unary path has no asynchronous hand-off for one call alone yet).

Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidelog.broker.core.delayed import DelayedOperation, Purgatory
from tidelog.broker.core.errors import partition_error
from tidelog.broker.core.gate import OperationGate
from tidelog.broker.core.membership import Membership
from tidelog.broker.core.partition import Partition
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.storage.clock import Clock
from tidelog.storage.errors import InvalidRequestError, KafkaTimeoutError

__all__ = [
    "DelayedDeleteRecords",
    "DeletionAnswer",
    "RecordDeletion",
    "RecordsDeleted",
    "RecordsToDelete",
]

# The blocking form's margin past the deadline before it expires the operation itself
# (a purgatory whose reaper is not running: a core built without ``open``).
_BLOCKING_MARGIN_MS = 5_000


@dataclass(frozen=True, slots=True)
class RecordsToDelete:
    """``DeleteRecords`` for one partition: every record below ``offset`` (-1: the high
    watermark)."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class RecordsDeleted:
    """One partition's answer to ``delete_records``: the low watermark (the smallest log
    start offset of the in-sync replicas), or an error (then -1)."""

    topic: str
    partition: int
    low_watermark: int = -1
    error_code: str = ""
    error_message: str = ""


# Gets a DeleteRecords' answers, in request order, once; must not block (module docstring).
DeletionAnswer = Callable[[list[RecordsDeleted]], None]


def _failed(topic: str, partition: int, exc: BaseException) -> RecordsDeleted:
    code, message = partition_error(exc)
    return RecordsDeleted(topic, partition, error_code=code, error_message=message)


def _final(partition: Partition, target: int) -> RecordsDeleted | None:
    """The partition's answer if it is final now (reached, or failed), else None."""
    try:
        low = partition.low_watermark()
    except Exception as exc:  # no longer the leader
        return _failed(partition.topic, partition.partition, exc)
    return RecordsDeleted(partition.topic, partition.partition, low) if low >= target else None


class DelayedDeleteRecords(DelayedOperation):
    """A DeleteRecords waiting for the in-sync replicas' log starts. Thread-safe.

    ``answers`` holds the request's answers in order, None where a partition waits;
    ``waiting`` says which: (index in ``answers``, the partition, the low watermark it
    must reach)."""

    __slots__ = ("_answers", "_deliver", "_waiting")

    def __init__(
        self,
        deadline_ms: int,
        answers: list[RecordsDeleted | None],
        waiting: list[tuple[int, Partition, int]],
        deliver: DeletionAnswer,
    ) -> None:
        super().__init__(deadline_ms)
        self._answers = answers
        self._waiting = waiting
        self._deliver = deliver

    @property
    def keys(self) -> list[tuple[str, int]]:
        """The partitions it waits on, as the purgatories key them."""
        return list(dict.fromkeys((p.topic, p.partition) for _, p, _ in self._waiting))

    def is_satisfied(self) -> bool:
        return all(_final(partition, target) is not None for _, partition, target in self._waiting)

    def on_complete(self) -> None:
        answers = list(self._answers)
        for index, partition, target in self._waiting:
            answer = _final(partition, target)
            if answer is None:
                answer = _failed(
                    partition.topic,
                    partition.partition,
                    KafkaTimeoutError(
                        f"{partition.topic}-{partition.partition}: the in-sync replicas' log "
                        f"start offsets did not all reach {target} in time (the leader's has)"
                    ),
                )
            answers[index] = answer
        self._deliver([a for a in answers if a is not None])


class RecordDeletion:
    """DeleteRecords on the partitions this broker leads. Thread-safe."""

    def __init__(
        self,
        partitions: PartitionRegistry,
        membership: Membership,
        gate: OperationGate,
        purgatory: Purgatory[tuple[str, int]],
        clock: Clock,
    ) -> None:
        self._partitions = partitions
        self._membership = membership
        self._gate = gate
        self._purgatory = purgatory
        self._clock = clock

    def start(
        self,
        requests: Sequence[RecordsToDelete],
        timeout_ms: int,
        deliver: DeletionAnswer,
    ) -> DelayedDeleteRecords:
        """Move every partition's log start now; ``deliver`` gets the answers once final
        or at ``timeout_ms`` (module docstring). Errors are per partition (a partition
        named twice is answered twice, the larger offset winning). Never blocks on the
        followers. Returns the operation (parked, or completed already).

        Raises:
            InvalidRequestError: a negative ``timeout_ms`` (nothing moved).
            ShuttingDownError: the broker is stopping (nothing moved).
        """
        if timeout_ms < 0:
            raise InvalidRequestError(f"timeout_ms must not be negative, got {timeout_ms}")
        answers: list[RecordsDeleted | None] = []
        waiting: list[tuple[int, Partition, int]] = []
        with self._gate.operation():
            for index, request in enumerate(requests):
                try:
                    self._membership.placement.check_leader(request.topic, request.partition)
                    leader = self._partitions.get(request.topic, request.partition)
                    waiting.append((index, leader, leader.delete_records(request.offset)))
                    answers.append(None)
                except Exception as exc:
                    answers.append(_failed(request.topic, request.partition, exc))
        deadline_ms = self._clock.monotonic_ms() + timeout_ms
        operation = DelayedDeleteRecords(deadline_ms, answers, waiting, deliver)
        if timeout_ms == 0 and not operation.is_satisfied():
            operation.force_complete(expired=True)  # Kafka's purgatory, expiring at once
            return operation
        # The wait runs outside the shutdown gate: a broker stopping closes the
        # purgatory (answered as timed out) and resigns its partitions.
        self._purgatory.try_complete_else_watch(operation, operation.keys)
        return operation

    def wait(self, requests: Sequence[RecordsToDelete], timeout_ms: int) -> list[RecordsDeleted]:
        """``start``, blocking the calling thread until answered (at most ``timeout_ms``
        and a margin: if the purgatory's timer is not running, the operation is expired
        here). Raises what ``start`` raises."""
        answered: list[list[RecordsDeleted]] = []
        done = threading.Event()

        def deliver(answers: list[RecordsDeleted]) -> None:
            answered.append(answers)
            done.set()

        operation = self.start(requests, timeout_ms, deliver)
        if not done.wait((timeout_ms + _BLOCKING_MARGIN_MS) / 1000):
            assert operation.deadline_ms is not None
            self._purgatory.expire_due(operation.deadline_ms)  # completes and unwatches it
        done.wait()
        return answered[0]
