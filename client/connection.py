"""The connection layer: what the client says to one broker, in domain values.

``Connection`` is the seam (a ``typing.Protocol``): calls take and return the values of
``client.types`` and ``client.cluster``, never protobuf. Two implementations:

- ``client.grpc_connection.GrpcConnection``: one ``client.transport.Transport`` (the
  only module that touches grpc) plus the protobuf conversions
  (``client.grpc_conversions``);
- ``client.testing.InMemoryCluster``: brokers in memory whose leaders can move, for unit
  tests of routing without sockets.

Per-partition errors come back as values (``ListOffsetsResult.error``) rather than being
raised, so the router (``client.routing``) can send just the failed partitions to their
new leader. A call's own failure is raised as the exact ``TidelogError``.

Every call the client makes is in the protocol: produce and fetch (unary and streams),
offsets, groups (membership, commits, administration), topics, quotas, metadata.

This module holds the seam only: the protocol, its call and answer values (frozen
dataclasses) and ``ConnectionFactory``; it imports neither grpc nor protobuf. An
implementation must be thread-safe: the facades call one connection from several threads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tidelog.client.cluster import BrokerNode, ClusterMetadata
from tidelog.client.group_member import HeartbeatAnswer, HeartbeatRequest
from tidelog.client.types import (
    AlterConfigOp,
    ConfigEntry,
    ConfigResource,
    GroupDescription,
    GroupSummary,
    LogDirDescription,
    PartitionReassignment,
    QuotaEntity,
    TopicDescription,
    TopicPartition,
    TopicSummary,
)
from tidelog.storage.errors import TidelogError

__all__ = [
    "CommittedOffset",
    "Connection",
    "ConnectionFactory",
    "EpochEndResult",
    "FetchAnswer",
    "FetchCall",
    "FetchResult",
    "FetchStream",
    "ListOffsetsResult",
    "PartitionProduceResult",
    "ProduceAnswer",
    "ProduceCall",
    "ProduceStream",
    "ProducerState",
]


@dataclass(frozen=True, slots=True)
class ListOffsetsResult:
    """One partition's ``ListOffsets`` answer: offset -1 when no record is that recent."""

    offset: int = -1
    timestamp_ms: int = -1
    error: TidelogError | None = None


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A group's committed offset (the next to read) and the leader epoch of the last
    record consumed before it (KIP-320; -1: unknown, not validated on resume)."""

    offset: int
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class EpochEndResult:
    """One partition's ``OffsetForLeaderEpoch`` answer: the largest epoch <= the one
    asked for that the leader knows and where it ends; both -1 when it knows none."""

    leader_epoch: int = -1
    end_offset: int = -1
    error: TidelogError | None = None


@dataclass(frozen=True, slots=True)
class ProduceCall:
    """One produce request on a stream: record-batch bytes per partition."""

    correlation_id: int
    acks: int
    timeout_ms: int
    batches: Sequence[tuple[TopicPartition, bytes]]
    # The producer's wall clock as the request leaves (three timestamps); None: unknown.
    sent_timestamp_ms: int | None = None
    # The leader epoch the producer's metadata names per partition (Kafka's
    # CurrentLeaderEpoch): a broker at another epoch refuses, and the producer refreshes.
    leader_epochs: Mapping[TopicPartition, int] = field(default_factory=dict)
    # A transactional producer's id (its batches are transactional; client.transactions).
    transactional_id: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionProduceResult:
    """One partition's answer: where its batch landed, or its error."""

    base_offset: int = -1
    log_append_time_ms: int = -1
    duplicate: bool = False
    error: TidelogError | None = None


@dataclass(frozen=True, slots=True)
class ProduceAnswer:
    """The answer to one ``ProduceCall``, matched by ``correlation_id``."""

    correlation_id: int
    results: Mapping[TopicPartition, PartitionProduceResult]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class ProducerState:
    """What a partition remembers of one idempotent producer (``DescribeProducers``):
    its epoch, the sequence of its last record (-1: none remembered), the broker's time of
    its last append and the offset of its last record (-1 where not known); for a
    transactional producer the coordinator epoch of its last marker here (-1: none) and
    the first offset of its open transaction (-1: none open)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int = -1
    last_offset: int = -1
    coordinator_epoch: int = -1
    current_txn_start_offset: int = -1


class ProduceStream(Protocol):
    """An open produce stream to one broker: ``send`` from any thread, one reader.

    ``responses()`` yields the answers in order and raises the ``TidelogError`` that
    broke the stream; ``close`` half-closes it, ``cancel`` ends it at once.
    """

    def send(self, call: ProduceCall) -> None: ...

    def responses(self) -> Iterator[ProduceAnswer]: ...

    def close(self) -> None: ...

    def cancel(self) -> None: ...


@dataclass(frozen=True, slots=True)
class FetchCall:
    """One fetch on a stream: per partition ``(tp, fetch_offset, partition_max_bytes)``.

    The broker answers once ``min_bytes`` are there or ``max_wait_ms`` passed (long poll).
    """

    correlation_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partitions: Sequence[tuple[TopicPartition, int, int]]
    # As ``ProduceCall.leader_epochs``: fences a consumer reading with stale metadata.
    leader_epochs: Mapping[TopicPartition, int] = field(default_factory=dict)
    # Kafka's isolation level (``config.ISOLATION_LEVELS``): 1 read_committed reads up to
    # the last stable offset and is told the aborted transactions (issue #28).
    isolation_level: int = 0


@dataclass(frozen=True, slots=True)
class FetchResult:
    """One partition's fetched bytes (whole stored batches), or its error."""

    tp: TopicPartition
    records: bytes
    high_watermark: int = -1
    log_start_offset: int = -1
    error: TidelogError | None = None
    # Each returned batch's (last offset, sent ms, received ms), packed
    # (storage.batch_times's wire entries): the three timestamps.
    batch_times: bytes = b""
    # Below it every transaction is decided (-1: unknown); read_committed fetches stop there.
    last_stable_offset: int = -1
    # read_committed fetches: (producer id, first offset) of each aborted transaction the
    # records overlap, which the consumer skips (``client.fetcher``).
    aborted_transactions: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """The answer to one ``FetchCall``."""

    correlation_id: int
    results: Sequence[FetchResult]


class FetchStream(Protocol):
    """An open fetch stream to one broker; as ``ProduceStream``."""

    def send(self, call: FetchCall) -> None: ...

    def responses(self) -> Iterator[FetchAnswer]: ...

    def close(self) -> None: ...

    def cancel(self) -> None: ...


class Connection(Protocol):
    """What a client asks one broker. Every call takes a timeout in ms (None: default)."""

    @property
    def address(self) -> str: ...

    def metadata(
        self, topics: Sequence[str] = (), *, include_internal: bool, timeout_ms: int | None
    ) -> ClusterMetadata:
        """Brokers, controller and leaders; ``topics`` empty: every topic."""
        ...

    def find_coordinator(self, group_id: str, *, timeout_ms: int | None) -> BrokerNode:
        """The broker coordinating ``group_id``."""
        ...

    def list_offsets(
        self,
        queries: Mapping[TopicPartition, int],
        *,
        timeout_ms: int | None,
        isolation_level: int = 0,
    ) -> dict[TopicPartition, ListOffsetsResult]:
        """Per partition -2 earliest, -1 latest, else a timestamp in ms. Latest is the high
        watermark, or the last stable offset with ``isolation_level`` 1 (read_committed)."""
        ...

    def commit_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, int],
        *,
        member_id: str,
        member_epoch: int,
        timeout_ms: int | None,
        leader_epochs: Mapping[TopicPartition, int] | None = None,
    ) -> dict[TopicPartition, TidelogError]:
        """Commit; returns the partitions that failed with their errors.
        ``leader_epochs``: the committed leader epoch of some partitions (KIP-320)."""
        ...

    def fetch_committed(
        self, group_id: str, partitions: Iterable[TopicPartition], *, timeout_ms: int | None
    ) -> dict[TopicPartition, int]:
        """Committed offsets (partitions without one are left out); ``partitions`` empty:
        every partition the group has committed."""
        ...

    def fetch_committed_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition],
        *,
        timeout_ms: int | None,
        require_stable: bool = False,
    ) -> dict[TopicPartition, CommittedOffset]:
        """``fetch_committed`` with each offset's committed leader epoch.
        ``require_stable``: ``UnstableOffsetCommitError`` for an offset pending in an
        undecided transaction (KIP-447)."""
        ...

    def offsets_for_leader_epochs(
        self, queries: Mapping[TopicPartition, tuple[int, int]], *, timeout_ms: int | None
    ) -> dict[TopicPartition, EpochEndResult]:
        """``OffsetForLeaderEpoch`` at the leader: per partition ``(leader epoch to look
        up, current leader epoch from the metadata or -1)``."""
        ...

    def heartbeat(
        self,
        group_id: str,
        request: HeartbeatRequest,
        *,
        client_id: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        timeout_ms: int | None,
    ) -> HeartbeatAnswer:
        """One ``ConsumerGroupHeartbeat`` to the group's coordinator."""
        ...

    def list_topics(self, *, include_internal: bool, timeout_ms: int | None) -> list[TopicSummary]:
        """The topics this broker knows, with their partition counts."""
        ...

    def list_groups(self, *, timeout_ms: int | None) -> list[GroupSummary]:
        """The groups this broker coordinates (members or committed offsets)."""
        ...

    def describe_group(self, group_id: str, *, timeout_ms: int | None) -> GroupDescription:
        """Members, assignment and committed offsets, as the coordinator sees them.

        ``log_end_offset`` and ``lag`` are the coordinator's own figures: right only for
        the partitions it leads (``client.group_admin`` takes them from the leaders).
        """
        ...

    def delete_group(self, group_id: str, *, timeout_ms: int | None) -> None:
        """Delete an empty group and its committed offsets."""
        ...

    def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition], *, timeout_ms: int | None
    ) -> dict[TopicPartition, TidelogError | None]:
        """Delete some of a group's committed offsets (Kafka's OffsetDelete): per partition
        None (deleted, or none was committed) or its error
        (``GroupSubscribedToTopicError``, ``UnknownTopicOrPartitionError``)."""
        ...

    def alter_client_quotas(
        self,
        client_id: str,
        set_quotas: Mapping[str, float],
        delete: Sequence[str],
        *,
        user: str = "",
        timeout_ms: int | None,
    ) -> None:
        """Set and remove quotas of a client id, a user, or both ("": not given) on this
        broker."""
        ...

    def describe_client_quotas(
        self,
        client_id: str,
        *,
        user: str = "",
        include_users: bool = False,
        timeout_ms: int | None,
    ) -> dict[QuotaEntity, dict[str, float]]:
        """This broker's quotas by entity (``client_id``, ``user`` "": any); entities with
        a user part only with ``include_users``."""
        ...

    def describe_topic(self, name: str, *, timeout_ms: int | None) -> TopicDescription: ...

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str],
        *,
        replica_assignment: Sequence[Sequence[int]] = (),
        timeout_ms: int | None,
    ) -> TopicDescription:
        """``partitions`` 0 and ``replication_factor`` 0: the broker's defaults.
        ``replica_assignment``: partition i's brokers, preferred leader first (with it,
        ``partitions`` and ``replication_factor`` are 0)."""
        ...

    def delete_topic(self, name: str, *, timeout_ms: int | None) -> None: ...

    def elect_leaders(
        self,
        unclean: bool,
        partitions: Iterable[TopicPartition] | None,
        *,
        timeout_ms: int | None,
    ) -> dict[TopicPartition, TidelogError | None]:
        """Kafka's ElectLeaders on the controller, preferred or ``unclean``: per partition
        None (elected) or why not (``ElectionNotNeededError``...). ``partitions`` None:
        every partition; the answer names only those that needed an election."""
        ...

    def alter_partition_reassignments(
        self,
        targets: Mapping[TopicPartition, Sequence[int] | None],
        *,
        timeout_ms: int | None,
    ) -> dict[TopicPartition, TidelogError | None]:
        """Kafka's AlterPartitionReassignments on the controller: per partition None
        (started, or cancelled for a None target) or why not."""
        ...

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None, *, timeout_ms: int | None
    ) -> dict[TopicPartition, PartitionReassignment]:
        """Kafka's ListPartitionReassignments on the controller (None: every partition)."""
        ...

    def alter_topic_config(
        self,
        name: str,
        set_config: Mapping[str, str],
        delete: Sequence[str],
        *,
        timeout_ms: int | None,
    ) -> TopicDescription: ...

    def create_partitions(
        self,
        topic: str,
        total_count: int,
        *,
        validate_only: bool,
        replica_assignment: Sequence[Sequence[int]] = (),
        timeout_ms: int | None,
    ) -> int:
        """Grow ``topic``; returns the new partition count. ``replica_assignment``: one
        broker list per new partition (empty: placed by the broker)."""
        ...

    def describe_configs(
        self, resource: ConfigResource, keys: Sequence[str], *, timeout_ms: int | None
    ) -> list[ConfigEntry]:
        """Every config of ``resource`` (or only ``keys``), with sources and synonyms."""
        ...

    def incremental_alter_configs(
        self,
        resource: ConfigResource,
        changes: Sequence[AlterConfigOp],
        *,
        validate_only: bool,
        timeout_ms: int | None,
    ) -> None:
        """Apply ``changes`` to ``resource``'s dynamic configs."""
        ...

    def init_producer_id(
        self, *, producer_key: str = "", timeout_ms: int | None
    ) -> tuple[int, int]:
        """An idempotent producer id and its epoch: a new one, or the key's own."""
        ...

    def describe_log_dirs(
        self, partitions: Iterable[TopicPartition] | None, *, timeout_ms: int | None
    ) -> LogDirDescription:
        """This broker's log directory with the copies it holds of ``partitions`` (None:
        of every partition); raises the directory's error (``KafkaStorageError``)."""
        ...

    def describe_producers(
        self,
        partitions: Iterable[TopicPartition],
        producer_id: int | None,
        *,
        timeout_ms: int | None,
    ) -> dict[TopicPartition, list[ProducerState] | TidelogError]:
        """What each partition remembers of ``producer_id`` (None: of every producer), or
        the partition's error."""
        ...

    def delete_records(
        self, offsets: Mapping[TopicPartition, int], *, timeout_ms: int | None
    ) -> dict[TopicPartition, int | TidelogError]:
        """``DeleteRecords`` at the leader: per partition, delete every record below its
        offset (-1: the high watermark); the low watermark, or the partition's error."""
        ...

    def produce(self, call: ProduceCall, *, timeout_ms: int | None) -> ProduceAnswer:
        """One unary produce (the keyed producer's; ``Producer`` uses a stream)."""
        ...

    def open_produce_stream(self) -> ProduceStream:
        """A produce stream (never blocks; fails at once if the broker is unreachable)."""
        ...

    def open_fetch_stream(self) -> FetchStream:
        """A fetch stream (never blocks; fails at once if the broker is unreachable)."""
        ...

    def close(self) -> None: ...


class ConnectionFactory(Protocol):
    """Opens a ``Connection`` to one ``HOST:PORT`` (no I/O until the first call)."""

    def __call__(self, address: str) -> Connection: ...
