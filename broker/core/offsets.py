"""Offsets and producers of partitions: Kafka's ListOffsets, OffsetForLeaderEpoch,
DescribeProducers and DeleteRecords (``BrokerCore`` delegates here).

DeleteRecords (KIP-107) moves each partition's log start offset on its leader and
answers once every in-sync replica's followed, without a thread per waiting request
(``broker.core.delete_records``).

ListOffsets and OffsetForLeaderEpoch are answered by the partition's leader only, after
the caller's ``current_leader_epoch`` check (KIP-320: ``FENCED_LEADER_EPOCH`` or
``UNKNOWN_LEADER_EPOCH``), the same check the fetch path makes (``broker.core.fetch``).
Latest is the high watermark: what consumers can read. Errors are per partition.
Thread-safe; every call runs inside the core's shutdown gate (``broker.core.gate``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidelog.broker.core.delayed import Purgatory
from tidelog.broker.core.delete_records import RecordDeletion, RecordsDeleted, RecordsToDelete
from tidelog.broker.core.errors import partition_error
from tidelog.broker.core.gate import OperationGate
from tidelog.broker.core.membership import Membership
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.storage.clock import Clock
from tidelog.storage.errors import InvalidRequestError
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.producer_state import ProducerSummary

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "EpochEndAnswer",
    "EpochQuery",
    "OffsetAnswer",
    "OffsetQuery",
    "Offsets",
    "PartitionProducers",
    "RecordsDeleted",
    "RecordsToDelete",
]

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3  # the record with the largest timestamp (KIP-734)


@dataclass(frozen=True, slots=True)
class OffsetQuery:
    """``ListOffsets`` for one partition: -2 earliest, -1 latest, -3 the largest
    timestamp, else a timestamp."""

    topic: str
    partition: int
    timestamp_ms: int
    current_leader_epoch: int = -1  # the client's view; -1: not checked
    read_committed: bool = False  # latest is the last stable offset (issue #28)


@dataclass(frozen=True, slots=True)
class OffsetAnswer:
    """The found offset (-1 if none), its record's timestamp (-1 for earliest/latest) and
    ``leader_epoch``: the epoch that wrote it, for latest the log's current epoch (-1:
    unknown), as Kafka's ListOffsets v4+ answers it (KIP-320: a consumer that resets its
    position keeps the epoch to validate it after a leader change)."""

    topic: str
    partition: int
    offset: int = -1
    timestamp_ms: int = -1
    error_code: str = ""
    error_message: str = ""
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class EpochQuery:
    """``OffsetForLeaderEpoch`` for one partition: where does ``leader_epoch`` end?"""

    topic: str
    partition: int
    leader_epoch: int
    current_leader_epoch: int = -1  # the client's view; -1: not checked


@dataclass(frozen=True, slots=True)
class EpochEndAnswer:
    """The largest epoch <= the one asked for that the leader's log knows, and the offset
    where it ends (the next epoch's start, or the log end offset); both -1 when the epoch
    asked for is below every known one (Kafka's UNDEFINED_EPOCH_OFFSET)."""

    topic: str
    partition: int
    leader_epoch: int = -1
    end_offset: int = -1
    error_code: str = ""
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class PartitionProducers:
    """One partition's answer to ``describe_producers``: its producers, or an error."""

    topic: str
    partition: int
    producers: tuple[ProducerSummary, ...] = ()
    error_code: str = ""
    error_message: str = ""


class Offsets:
    """The offset and producer lookups of one broker, and its DeleteRecords. Thread-safe.

    ``purgatory`` parks DeleteRecords waiting for the followers (``broker.core.delayed``'s
    ``delete_records``); ``clock`` dates their deadlines."""

    def __init__(
        self,
        partitions: PartitionRegistry,
        membership: Membership,
        gate: OperationGate,
        purgatory: Purgatory[tuple[str, int]],
        clock: Clock,
    ) -> None:
        self._deletion = RecordDeletion(partitions, membership, gate, purgatory, clock)
        self._partitions = partitions
        self._logs = partitions.logs
        self._membership = membership
        self._gate = gate

    def _leader_log(self, topic: str, partition: int, current_leader_epoch: int) -> PartitionLog:
        """The partition's log, here only if this broker leads it and the caller's
        ``current_leader_epoch`` (-1: not checked) is this leader's; raises the routing or
        fencing error otherwise (``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``...)."""
        self._membership.placement.check_leader(topic, partition)
        found = self._partitions.get(topic, partition)
        found.check_epoch(current_leader_epoch)
        return found.log

    def list_offsets(self, queries: Sequence[OffsetQuery]) -> list[OffsetAnswer]:
        """Earliest (-2), latest (-1), the record with the largest timestamp (-3, KIP-734),
        or the first offset with a timestamp >= the one given."""
        with self._gate.operation():
            return [self._list_offset(q) for q in queries]

    def _list_offset(self, query: OffsetQuery) -> OffsetAnswer:
        try:
            plog = self._leader_log(query.topic, query.partition, query.current_leader_epoch)
            if query.timestamp_ms == EARLIEST_TIMESTAMP:
                start = plog.log_start_offset
                epoch = plog.epoch_for_offset(start)
                return OffsetAnswer(query.topic, query.partition, start, leader_epoch=epoch)
            if query.timestamp_ms == LATEST_TIMESTAMP:
                # Kafka answers the leader's current epoch with the high watermark (and
                # read_committed's last stable offset).
                latest = plog.last_stable_offset if query.read_committed else plog.high_watermark
                return OffsetAnswer(
                    query.topic, query.partition, latest, leader_epoch=plog.latest_epoch
                )
            if query.timestamp_ms == MAX_TIMESTAMP:
                found = plog.max_timestamp()  # below the high watermark already
            elif query.timestamp_ms < 0:
                raise InvalidRequestError(
                    f"timestamp_ms must be -3 (max timestamp), -2 (earliest), -1 (latest) "
                    f"or >= 0, got {query.timestamp_ms}"
                )
            else:
                found = plog.offset_for_timestamp(query.timestamp_ms)
        except Exception as exc:
            code, message = partition_error(exc)
            return OffsetAnswer(
                query.topic, query.partition, error_code=code, error_message=message
            )
        if found is not None and found[0] >= plog.high_watermark:
            found = None  # not replicated yet: consumers cannot read it
        if found is None:
            return OffsetAnswer(query.topic, query.partition)
        return OffsetAnswer(
            query.topic,
            query.partition,
            found[0],
            found[1],
            leader_epoch=plog.epoch_for_offset(found[0]),
        )

    def offsets_for_leader_epochs(self, queries: Sequence[EpochQuery]) -> list[EpochEndAnswer]:
        """Kafka's OffsetForLeaderEpoch (KIP-101, KIP-320), as a consumer asks it: per
        partition, on its leader only (``NOT_LEADER_OR_FOLLOWER`` elsewhere), after the
        ``current_leader_epoch`` check (``FENCED_LEADER_EPOCH``/``UNKNOWN_LEADER_EPOCH``),
        ``PartitionLog.end_offset_for_epoch``. The latest epoch ends at the log end
        offset, as in Kafka (a consumer's position never passes the high watermark, so
        the difference cannot make it miss a truncation). Errors are per partition."""
        with self._gate.operation():
            return [self._offset_for_leader_epoch(q) for q in queries]

    def _offset_for_leader_epoch(self, query: EpochQuery) -> EpochEndAnswer:
        try:
            plog = self._leader_log(query.topic, query.partition, query.current_leader_epoch)
            if query.leader_epoch >= 0 and plog.latest_epoch < 0:
                # A log no leader ever stamped (single-node mode keeps each batch's epoch
                # field as its producer wrote it): no leader change ever cut it, so the
                # epoch asked for ends at the log end, not "unknown" (which a consumer
                # would take for a truncation).
                epoch, end_offset = query.leader_epoch, plog.log_end_offset
            else:
                epoch, end_offset = plog.end_offset_for_epoch(query.leader_epoch)
        except Exception as exc:
            code, message = partition_error(exc)
            return EpochEndAnswer(
                query.topic, query.partition, error_code=code, error_message=message
            )
        return EpochEndAnswer(query.topic, query.partition, epoch, end_offset)

    def describe_producers(
        self, partitions: Sequence[tuple[str, int]], producer_id: int | None
    ) -> list[PartitionProducers]:
        """What each partition's idempotence state remembers (Kafka's DescribeProducers),
        on its leader only (a follower's may be behind: ``NOT_LEADER_OR_FOLLOWER``).

        Errors (unknown topic or partition, not the leader) are per partition.
        """
        with self._gate.operation():
            answers = []
            for topic, partition in partitions:
                try:
                    plog = self._leader_log(topic, partition, -1)
                    found = tuple(plog.describe_producers(producer_id))
                except Exception as exc:
                    code, message = partition_error(exc)
                    answers.append(
                        PartitionProducers(topic, partition, error_code=code, error_message=message)
                    )
                    continue
                answers.append(PartitionProducers(topic, partition, found))
            return answers

    def delete_records(
        self, requests: Sequence[RecordsToDelete], timeout_ms: int
    ) -> list[RecordsDeleted]:
        """Kafka's DeleteRecords (KIP-107), blocking the calling thread until answered
        (``RecordDeletion.wait``; the module docstring of ``broker.core.delete_records``)."""
        return self._deletion.wait(requests, timeout_ms)

    def start_delete_records(
        self,
        requests: Sequence[RecordsToDelete],
        timeout_ms: int,
        deliver: Callable[[list[RecordsDeleted]], None],
    ) -> None:
        """DeleteRecords without blocking: ``deliver`` gets the answers once the in-sync
        replicas followed, or at ``timeout_ms`` (``RecordDeletion.start``)."""
        self._deletion.start(requests, timeout_ms, deliver)
