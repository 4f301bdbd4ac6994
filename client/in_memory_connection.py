"""The connection half of ``client.testing.InMemoryCluster``: ``InMemoryConnection``
answers every ``client.connection.Connection`` call from the cluster's state, and the
produce and fetch streams it opens.

``InMemoryCluster`` (``client.testing``) owns the state and the controls a test drives
(move a leader, kill a broker, fail the next call); this module owns what a client sees
of it, call by call, with the same refusals a real cluster gives when things move (a
partition call to a non-leader, a group call to a non-coordinator, an admin call to a
non-controller, any call to a killed broker). The two are one component split in two
files: the connection reads and changes the cluster's lock-guarded fields directly,
always under the cluster's one lock, and nothing else may. The records of that state
(``InMemoryPartition``, ``InMemoryTopic``) are defined here because both halves build them
(``create_topic`` on the cluster, ``CreatePartitions`` on a connection).

Thread-safe: every call takes the cluster's lock; a fetch waits on its condition for
records, never sleeping. No sockets and no threads of its own.
"""

from __future__ import annotations

import queue
import struct
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidelog.client.cluster import (
    BrokerNode,
    ClusterMetadata,
)
from tidelog.client.connection import (
    CommittedOffset,
    EpochEndResult,
    FetchAnswer,
    FetchCall,
    FetchResult,
    FetchStream,
    ListOffsetsResult,
    ProduceAnswer,
    ProduceCall,
    ProducerState,
    ProduceStream,
)
from tidelog.client.errors import ClosedError
from tidelog.client.group_member import HeartbeatAnswer, HeartbeatRequest
from tidelog.client.types import (
    AlterConfigOp,
    ConfigEntry,
    ConfigResource,
    GroupDescription,
    GroupPartitionLag,
    GroupSummary,
    LogDirDescription,
    LogDirReplica,
    PartitionReassignment,
    QuotaEntity,
    TopicDescription,
    TopicPartition,
    TopicSummary,
)
from tidelog.storage.errors import (
    BrokerUnavailableError,
    ElectionNotNeededError,
    FencedLeaderEpochError,
    GroupIdNotFoundError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    LeaderNotAvailableError,
    NoReassignmentInProgressError,
    OffsetOutOfRangeError,
    TidelogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

if TYPE_CHECKING:
    from tidelog.client.testing import InMemoryCluster

__all__ = [
    "InMemoryConnection",
    "InMemoryFetchStream",
    "InMemoryPartition",
    "InMemoryProduceStream",
    "InMemoryTopic",
]

_END: object = object()  # ends a stream's queue


@dataclass(slots=True)
class InMemoryPartition:
    leader: int
    replicas: tuple[int, ...]
    leader_epoch: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0
    # (leader epoch, its start offset), both increasing: the leader-epoch cache.
    epoch_starts: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])

    def new_leader_epoch(self) -> None:
        """The next leader starts writing at the log end (Kafka's ``becomeLeader``)."""
        self.leader_epoch += 1
        self.epoch_starts.append((self.leader_epoch, self.log_end_offset))

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        """As ``storage.leader_epoch.LeaderEpochCache.end_offset_for``."""
        known = [e for e in self.epoch_starts if e[0] <= epoch]
        if epoch < 0 or not known:
            return -1, -1
        found = known[-1][0]
        later = [start for e, start in self.epoch_starts if e > found]
        return found, later[0] if later else self.log_end_offset


@dataclass(slots=True)
class InMemoryTopic:
    partitions: list[InMemoryPartition]
    config: dict[str, str] = field(default_factory=dict)


class InMemoryConnection:
    """A ``Connection`` to one broker of an ``InMemoryCluster``. Thread-safe."""

    def __init__(self, cluster: InMemoryCluster, broker_id: int | None, address: str = "") -> None:
        self._cluster = cluster
        self._broker_id = broker_id
        self._address = address if broker_id is None else cluster.nodes[broker_id].address
        self._closed = False

    @property
    def address(self) -> str:
        return self._address

    def _enter(self, call: str) -> int:
        """Record the call; the broker's id, or raise if it cannot answer (lock held)."""
        if self._closed:
            raise ClosedError(f"{call}: the connection is closed")
        cluster = self._cluster
        if self._broker_id is None or self._broker_id not in cluster._alive:
            if self._broker_id is not None:
                cluster.calls.append((self._broker_id, call))
            raise BrokerUnavailableError(f"broker at {self._address} is unavailable")
        cluster.calls.append((self._broker_id, call))
        for key in ((call, self._broker_id), (call, None)):
            failures = cluster._failures.get(key)
            if failures:
                raise failures.pop(0)
        return self._broker_id

    def metadata(
        self, topics: Sequence[str] = (), *, include_internal: bool, timeout_ms: int | None
    ) -> ClusterMetadata:
        with self._cluster._lock:
            return self._cluster._metadata_locked(self._enter("metadata"))

    def find_coordinator(self, group_id: str, *, timeout_ms: int | None) -> BrokerNode:
        cluster = self._cluster
        with cluster._lock:
            self._enter("find_coordinator")
            broker_id = cluster._coordinators.setdefault(group_id, min(cluster.nodes))
            if broker_id not in cluster._alive:
                raise LeaderNotAvailableError(f"the coordinator of {group_id} is offline")
            return cluster.nodes[broker_id]

    def list_offsets(
        self,
        queries: Mapping[TopicPartition, int],
        *,
        timeout_ms: int | None,
        isolation_level: int = 0,
    ) -> dict[TopicPartition, ListOffsetsResult]:
        # No transactions here: the last stable offset is the log end at either level.
        cluster = self._cluster
        with cluster._lock:
            broker_id = self._enter("list_offsets")
            out: dict[TopicPartition, ListOffsetsResult] = {}
            for tp, spec in queries.items():
                try:
                    partition = cluster._check_leader_locked(broker_id, tp)
                except TidelogError as exc:
                    out[tp] = ListOffsetsResult(error=exc)
                    continue
                offset = partition.log_start_offset if spec == -2 else partition.log_end_offset
                out[tp] = ListOffsetsResult(offset, -1)
            return out

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
        cluster = self._cluster
        with cluster._lock:
            cluster._check_coordinator_locked(self._enter("commit_offsets"), group_id)
            cluster._committed.setdefault(group_id, {}).update(offsets)
            epochs = leader_epochs or {}
            cluster._committed_epochs.setdefault(group_id, {}).update(
                {tp: epochs.get(tp, -1) for tp in offsets}
            )
            return {}

    def fetch_committed_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition],
        *,
        timeout_ms: int | None,
        require_stable: bool = False,  # no transactions in memory: always stable
    ) -> dict[TopicPartition, CommittedOffset]:
        found = self.fetch_committed(group_id, partitions, timeout_ms=timeout_ms)
        with self._cluster._lock:
            epochs = self._cluster._committed_epochs.get(group_id, {})
            return {tp: CommittedOffset(offset, epochs.get(tp, -1)) for tp, offset in found.items()}

    def offsets_for_leader_epochs(
        self, queries: Mapping[TopicPartition, tuple[int, int]], *, timeout_ms: int | None
    ) -> dict[TopicPartition, EpochEndResult]:
        cluster = self._cluster
        with cluster._lock:
            broker_id = self._enter("offsets_for_leader_epochs")
            out: dict[TopicPartition, EpochEndResult] = {}
            for tp, (epoch, _) in queries.items():
                try:
                    partition = cluster._check_leader_locked(broker_id, tp)
                except TidelogError as exc:
                    out[tp] = EpochEndResult(error=exc)
                    continue
                out[tp] = EpochEndResult(*partition.end_offset_for(epoch))
            return out

    def fetch_committed(
        self, group_id: str, partitions: Iterable[TopicPartition], *, timeout_ms: int | None
    ) -> dict[TopicPartition, int]:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_coordinator_locked(self._enter("fetch_committed"), group_id)
            committed = cluster._committed.get(group_id, {})
            wanted = list(partitions) or list(committed)
            return {tp: committed[tp] for tp in wanted if tp in committed}

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
        """A one-member group: the member gets every partition of its topics."""
        cluster = self._cluster
        with cluster._lock:
            cluster._check_coordinator_locked(self._enter("heartbeat"), group_id)
            assignment = frozenset(
                TopicPartition(name, p)
                for name in request.subscription
                if name in cluster._topics
                for p in range(len(cluster._topics[name].partitions))
            )
            member_id = request.member_id or f"{client_id}-member"
            return HeartbeatAnswer(member_id, request.member_epoch + 1, 1_000, assignment)

    def list_topics(self, *, include_internal: bool, timeout_ms: int | None) -> list[TopicSummary]:
        with self._cluster._lock:
            self._enter("list_topics")
            return [
                TopicSummary(name, len(topic.partitions))
                for name, topic in sorted(self._cluster._topics.items())
            ]

    def list_groups(self, *, timeout_ms: int | None) -> list[GroupSummary]:
        """The groups with committed offsets that this broker coordinates (no members)."""
        cluster = self._cluster
        with cluster._lock:
            broker_id = self._enter("list_groups")
            return [
                GroupSummary(group_id, "Empty", 0)
                for group_id in sorted(cluster._committed)
                if cluster._coordinators.setdefault(group_id, min(cluster.nodes)) == broker_id
            ]

    def describe_group(self, group_id: str, *, timeout_ms: int | None) -> GroupDescription:
        """As a real coordinator: its log end is its own, 0 for partitions it does not lead."""
        cluster = self._cluster
        with cluster._lock:
            broker_id = self._enter("describe_group")
            cluster._check_coordinator_locked(broker_id, group_id)
            committed = cluster._committed.get(group_id)
            if not committed:
                raise GroupIdNotFoundError(f"no group {group_id!r}")
            partitions = []
            for tp, offset in sorted(committed.items()):
                partition = cluster._partition_locked(tp)
                end = partition.log_end_offset if partition.leader == broker_id else 0
                partitions.append(GroupPartitionLag(tp, offset, end, end - offset, ""))
            return GroupDescription(group_id, "Empty", 0, (), tuple(partitions))

    def delete_group(self, group_id: str, *, timeout_ms: int | None) -> None:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_coordinator_locked(self._enter("delete_group"), group_id)
            cluster._committed_epochs.pop(group_id, None)
            if not cluster._committed.pop(group_id, None):
                raise GroupIdNotFoundError(f"no group {group_id!r}")

    def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition], *, timeout_ms: int | None
    ) -> dict[TopicPartition, TidelogError | None]:
        """As a real coordinator, without members: unknown partitions are refused."""
        cluster = self._cluster
        with cluster._lock:
            cluster._check_coordinator_locked(self._enter("delete_offsets"), group_id)
            committed = cluster._committed.get(group_id)
            if not committed:
                raise GroupIdNotFoundError(f"no group {group_id!r}")
            out: dict[TopicPartition, TidelogError | None] = {}
            for tp in partitions:
                topic = cluster._topics.get(tp.topic)
                if topic is None or not 0 <= tp.partition < len(topic.partitions):
                    out[tp] = UnknownTopicOrPartitionError(f"{tp}: unknown topic or partition")
                    continue
                committed.pop(tp, None)
                cluster._committed_epochs.get(group_id, {}).pop(tp, None)
                out[tp] = None
            return out

    def alter_client_quotas(
        self,
        client_id: str,
        set_quotas: Mapping[str, float],
        delete: Sequence[str],
        *,
        user: str = "",
        timeout_ms: int | None,
    ) -> None:
        cluster = self._cluster
        entity = QuotaEntity(user or None, client_id or None)
        with cluster._lock:
            broker_id = self._enter("alter_client_quotas")
            quotas = cluster.quotas.setdefault(broker_id, {}).setdefault(entity, {})
            quotas.update(set_quotas)
            for key in delete:
                quotas.pop(key, None)
            if not quotas:
                del cluster.quotas[broker_id][entity]

    def describe_client_quotas(
        self,
        client_id: str,
        *,
        user: str = "",
        include_users: bool = False,
        timeout_ms: int | None,
    ) -> dict[QuotaEntity, dict[str, float]]:
        cluster = self._cluster
        with cluster._lock:
            broker_id = self._enter("describe_client_quotas")
            return {
                entity: dict(quotas)
                for entity, quotas in cluster.quotas.get(broker_id, {}).items()
                if (not client_id or entity.client_id == client_id)
                and (not user or entity.user == user)
                and (include_users or user or entity.user is None)
            }

    def describe_topic(self, name: str, *, timeout_ms: int | None) -> TopicDescription:
        with self._cluster._lock:
            self._enter("describe_topic")
            return self._cluster._description_locked(name)

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
        cluster = self._cluster
        with cluster._lock:
            cluster._check_controller_locked(self._enter("create_topic"))
            if name in cluster._topics:
                raise TopicAlreadyExistsError(f"topic {name!r} already exists")
            if replication_factor > 1:
                raise InvalidReplicationFactorError(
                    f"replication factor {replication_factor}: replicas are not kept here"
                )
            leaders = cluster._single_replicas_locked(replica_assignment)
            cluster._add_topic_locked(name, len(leaders) or partitions or 1, leaders)
            cluster._topics[name].config.update(config)
            return cluster._description_locked(name)

    def delete_topic(self, name: str, *, timeout_ms: int | None) -> None:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_controller_locked(self._enter("delete_topic"))
            if cluster._topics.pop(name, None) is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

    def elect_leaders(
        self,
        unclean: bool,
        partitions: Iterable[TopicPartition] | None,
        *,
        timeout_ms: int | None,
    ) -> dict[TopicPartition, TidelogError | None]:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_controller_locked(self._enter("elect_leaders"))
            # The in-memory cluster never moves leaders away from the preferred replica.
            return {
                tp: ElectionNotNeededError(f"{tp}: its leader is the preferred replica")
                for tp in partitions or ()
            }

    def alter_partition_reassignments(
        self,
        targets: Mapping[TopicPartition, Sequence[int] | None],
        *,
        timeout_ms: int | None,
    ) -> dict[TopicPartition, TidelogError | None]:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_controller_locked(self._enter("alter_partition_reassignments"))
            # The in-memory cluster keeps no replica lists to move: every partition is
            # where it is, and nothing is ever being moved.
            return {
                tp: (
                    NoReassignmentInProgressError(f"{tp}: no reassignment in progress")
                    if target is None
                    else InvalidReplicaAssignmentError(f"{tp}: the in-memory cluster cannot move")
                )
                for tp, target in targets.items()
            }

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None, *, timeout_ms: int | None
    ) -> dict[TopicPartition, PartitionReassignment]:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_controller_locked(self._enter("list_partition_reassignments"))
            return {}

    def alter_topic_config(
        self,
        name: str,
        set_config: Mapping[str, str],
        delete: Sequence[str],
        *,
        timeout_ms: int | None,
    ) -> TopicDescription:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_controller_locked(self._enter("alter_topic_config"))
            topic = cluster._topics.get(name)
            if topic is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            topic.config.update(set_config)
            for key in delete:
                topic.config.pop(key, None)
            return cluster._description_locked(name)

    def describe_configs(
        self, resource: ConfigResource, keys: Sequence[str], *, timeout_ms: int | None
    ) -> list[ConfigEntry]:
        # The in-memory cluster keeps only topic overrides: those, as dynamic topic
        # configs (no defaults, no broker configs).
        cluster = self._cluster
        with cluster._lock:
            self._enter("describe_configs")
            if resource.type != "topic":
                raise InvalidRequestError("the in-memory cluster has no broker configs")
            topic = cluster._topics.get(resource.name)
            if topic is None:
                raise UnknownTopicOrPartitionError(f"topic {resource.name!r} does not exist")
            return [
                ConfigEntry(k, v, "DYNAMIC_TOPIC_CONFIG", False, False, "STRING", "")
                for k, v in sorted(topic.config.items())
                if not keys or k in keys
            ]

    def incremental_alter_configs(
        self,
        resource: ConfigResource,
        changes: Sequence[AlterConfigOp],
        *,
        validate_only: bool,
        timeout_ms: int | None,
    ) -> None:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_controller_locked(self._enter("incremental_alter_configs"))
            if resource.type != "topic":
                raise InvalidRequestError("the in-memory cluster has no broker configs")
            topic = cluster._topics.get(resource.name)
            if topic is None:
                raise UnknownTopicOrPartitionError(f"topic {resource.name!r} does not exist")
            if validate_only:
                return
            for change in changes:
                if change.op == "delete":
                    topic.config.pop(change.name, None)
                elif change.op == "set" and change.value is not None:
                    topic.config[change.name] = change.value
                else:
                    raise InvalidRequestError("the in-memory cluster only sets and deletes")

    def create_partitions(
        self,
        topic: str,
        total_count: int,
        *,
        validate_only: bool,
        replica_assignment: Sequence[Sequence[int]] = (),
        timeout_ms: int | None,
    ) -> int:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_controller_locked(self._enter("create_partitions"))
            found = cluster._topics.get(topic)
            if found is None:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
            if total_count <= len(found.partitions):
                raise InvalidPartitionsError(f"{topic} has {len(found.partitions)} partitions")
            given = cluster._single_replicas_locked(replica_assignment)
            if given and len(given) != total_count - len(found.partitions):
                raise InvalidReplicaAssignmentError(
                    f"Attempted to add {total_count - len(found.partitions)} additional "
                    f"partition(s), but only {len(given)} assignment(s) were specified."
                )
            if not validate_only:
                ids = sorted(i for i in cluster.nodes if i in cluster._alive)
                for i, p in enumerate(range(len(found.partitions), total_count)):
                    leader = given[i] if given else ids[p % len(ids)]
                    found.partitions.append(InMemoryPartition(leader=leader, replicas=(leader,)))
            return total_count

    def init_producer_id(
        self, *, producer_key: str = "", timeout_ms: int | None
    ) -> tuple[int, int]:
        cluster = self._cluster
        with cluster._lock:
            self._enter("init_producer_id")
            if producer_key and producer_key in cluster._keyed_ids:
                return cluster._keyed_ids[producer_key], 0
            cluster._next_producer_id += 1
            if producer_key:
                cluster._keyed_ids[producer_key] = cluster._next_producer_id
            return cluster._next_producer_id, 0

    def describe_log_dirs(
        self, partitions: Iterable[TopicPartition] | None, *, timeout_ms: int | None
    ) -> LogDirDescription:
        """The copies this broker holds (it is among the replicas), sized by the bytes
        produced to them; lag 0: the in-memory cluster's replicas never fall behind."""
        cluster = self._cluster
        with cluster._lock:
            broker_id = self._enter("describe_log_dirs")
            wanted = None if partitions is None else set(partitions)
            replicas: dict[TopicPartition, LogDirReplica] = {}
            for name, topic in cluster._topics.items():
                for index, placed in enumerate(topic.partitions):
                    tp = TopicPartition(name, index)
                    if broker_id in placed.replicas and (wanted is None or tp in wanted):
                        size = sum(len(data) for _, data in cluster.produced.get(tp, []))
                        replicas[tp] = LogDirReplica(size, 0)
            return LogDirDescription(f"memory://{broker_id}", 0, 0, replicas)

    def delete_records(
        self, offsets: Mapping[TopicPartition, int], *, timeout_ms: int | None
    ) -> dict[TopicPartition, int | TidelogError]:
        """Moves the fake's log start (every replica at once); -1 is the log end."""
        cluster = self._cluster
        with cluster._lock:
            broker_id = self._enter("delete_records")
            out: dict[TopicPartition, int | TidelogError] = {}
            for tp, offset in offsets.items():
                try:
                    partition = cluster._check_leader_locked(broker_id, tp)
                except TidelogError as exc:
                    out[tp] = exc
                    continue
                target = partition.log_end_offset if offset == -1 else offset
                if not 0 <= target <= partition.log_end_offset:
                    out[tp] = OffsetOutOfRangeError(f"{tp}: cannot delete below {offset}")
                    continue
                partition.log_start_offset = max(partition.log_start_offset, target)
                out[tp] = partition.log_start_offset
            return out

    def describe_producers(
        self,
        partitions: Iterable[TopicPartition],
        producer_id: int | None,
        *,
        timeout_ms: int | None,
    ) -> dict[TopicPartition, list[ProducerState] | TidelogError]:
        """From the batches stored: the last sequence of ``producer_id`` (None: the last
        producer that wrote) per epoch seen last."""
        cluster = self._cluster
        with cluster._lock:
            broker_id = self._enter("describe_producers")
            out: dict[TopicPartition, list[ProducerState] | TidelogError] = {}
            for tp in partitions:
                try:
                    cluster._check_leader_locked(broker_id, tp)
                except TidelogError as exc:
                    out[tp] = exc
                    continue
                states: list[ProducerState] = []
                for _, data in cluster.produced.get(tp, []):
                    # RecordBatch v2: producer id int64 at 43, epoch int16 at 51, base
                    # sequence int32 at 53, lastOffsetDelta int32 at 23.
                    pid, epoch, base = struct.unpack_from(">qhi", data, 43)
                    if producer_id is None or pid == producer_id:
                        last = base + struct.unpack_from(">i", data, 23)[0]
                        states = [ProducerState(pid, epoch, last)]
                out[tp] = states
            return out

    def produce(self, call: ProduceCall, *, timeout_ms: int | None) -> ProduceAnswer:
        cluster = self._cluster
        with cluster._lock:
            broker_id = self._enter("produce")
            return ProduceAnswer(call.correlation_id, cluster._append_locked(broker_id, call))

    def open_fetch_stream(self) -> FetchStream:
        cluster = self._cluster
        stream = InMemoryFetchStream(cluster, self._broker_id)
        with cluster._lock:
            if self._broker_id is None or self._broker_id not in cluster._alive:
                stream.break_with(BrokerUnavailableError(f"broker at {self._address} is down"))
            else:
                cluster._streams.setdefault(self._broker_id, []).append(stream)
        return stream

    def open_produce_stream(self) -> ProduceStream:
        cluster = self._cluster
        stream = InMemoryProduceStream(cluster, self._broker_id)
        with cluster._lock:
            if self._broker_id is None or self._broker_id not in cluster._alive:
                stream.break_with(BrokerUnavailableError(f"broker at {self._address} is down"))
            else:
                cluster._streams.setdefault(self._broker_id, []).append(stream)
        return stream

    def close(self) -> None:
        self._closed = True


class InMemoryProduceStream:
    """Appends on ``send`` (under the cluster's lock) and queues the answer."""

    def __init__(self, cluster: InMemoryCluster, broker_id: int | None) -> None:
        self._cluster = cluster
        self._broker_id = broker_id
        self._answers: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._ended = False

    def break_with(self, error: TidelogError) -> None:
        """The connection is gone: nothing sent from now on arrives (lock held)."""
        self._ended = True
        self._answers.put(error)

    def send(self, call: ProduceCall) -> None:
        cluster = self._cluster
        with cluster._lock:
            if self._ended or self._broker_id not in cluster._alive:
                return  # a broken stream: the reader already got (or gets) its error
            assert self._broker_id is not None
            cluster.calls.append((self._broker_id, "produce"))
            results = cluster._append_locked(self._broker_id, call)
        self._answers.put(ProduceAnswer(call.correlation_id, results))

    def responses(self) -> Iterator[ProduceAnswer]:
        while True:
            item = self._answers.get()
            if item is _END:
                return
            if isinstance(item, TidelogError):
                raise item
            assert isinstance(item, ProduceAnswer)
            yield item

    def close(self) -> None:
        self._ended = True
        self._answers.put(_END)

    def cancel(self) -> None:
        self._ended = True
        self._answers.put(ClosedError("the produce stream was cancelled"))


class InMemoryFetchStream:
    """Answers fetches on the reader's thread: a long poll on the cluster's condition."""

    def __init__(self, cluster: InMemoryCluster, broker_id: int | None) -> None:
        self._cluster = cluster
        self._broker_id = broker_id
        self._calls: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._ended = False

    def break_with(self, error: TidelogError) -> None:
        """The connection is gone (lock held)."""
        self._ended = True
        self._calls.put(error)

    def send(self, call: FetchCall) -> None:
        if not self._ended:
            self._calls.put(call)

    def responses(self) -> Iterator[FetchAnswer]:
        while True:
            item = self._calls.get()
            if item is _END:
                return
            if isinstance(item, TidelogError):
                raise item
            assert isinstance(item, FetchCall)
            answer = self._answer(item)
            if answer is None:  # broken while waiting: its error is queued
                continue
            yield answer

    def _answer(self, call: FetchCall) -> FetchAnswer | None:
        cluster = self._cluster
        deadline = time.monotonic() + call.max_wait_ms / 1000
        with cluster._lock:
            while True:
                if self._ended:
                    return None
                assert self._broker_id is not None
                results = [
                    self._result_locked(tp, offset, call.leader_epochs.get(tp, -1))
                    for tp, offset, _ in call.partitions
                ]
                remaining = deadline - time.monotonic()
                if any(r.records or r.error for r in results) or remaining <= 0:
                    cluster.calls.append((self._broker_id, "fetch"))
                    return FetchAnswer(call.correlation_id, results)
                cluster._appended.wait(remaining)

    def _result_locked(
        self, tp: TopicPartition, fetch_offset: int, leader_epoch: int
    ) -> FetchResult:
        cluster = self._cluster
        assert self._broker_id is not None
        try:
            partition = cluster._check_leader_locked(self._broker_id, tp)
            if 0 <= leader_epoch < partition.leader_epoch:
                # As a real leader: a fetch naming an older leader epoch is fenced.
                raise FencedLeaderEpochError(
                    f"{tp}: leader epoch {leader_epoch} is older than {partition.leader_epoch}"
                )
        except TidelogError as exc:
            return FetchResult(tp, b"", error=exc)
        end = partition.log_end_offset
        if not partition.log_start_offset <= fetch_offset <= end:
            return FetchResult(
                tp,
                b"",
                end,
                partition.log_start_offset,
                OffsetOutOfRangeError(f"{tp}: offset {fetch_offset} is outside [0, {end}]"),
            )
        records = b"".join(
            data
            for base, data in cluster.produced.get(tp, [])
            if base + struct.unpack_from(">i", data, 23)[0] >= fetch_offset
        )
        return FetchResult(tp, records, end, partition.log_start_offset)

    def close(self) -> None:
        self._ended = True
        self._calls.put(_END)
        with self._cluster._lock:
            self._cluster._appended.notify_all()

    def cancel(self) -> None:
        self._ended = True
        self._calls.put(ClosedError("the fetch stream was cancelled"))
        with self._cluster._lock:
            self._cluster._appended.notify_all()
