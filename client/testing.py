"""An in-memory cluster for unit tests of the client's routing: no sockets, no threads.

``InMemoryCluster`` holds brokers, topics with a leader per partition, log end offsets,
committed offsets and group coordinators, and answers the ``client.connection.Connection``
calls the way a real cluster does when things move:

- a partition call sent to a broker that does not lead it: ``NotLeaderOrFollowerError``;
  to an offline partition (``kill`` its leader): ``LeaderNotAvailableError``;
- a group call sent to a broker that is not the group's coordinator:
  ``NotCoordinatorError``;
- an admin topic call sent to a broker that is not the controller: ``NotControllerError``;
- any call to a killed broker: ``BrokerUnavailableError``.

Tests move leaders (``move_leader``), coordinators and the controller, kill and revive
brokers, and read ``calls`` to see which broker answered what.

Thread-safe: one lock guards the whole cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from client.cluster import (
    NO_LEADER,
    BrokerNode,
    ClusterMetadata,
    PartitionMetadata,
    TopicMetadata,
)
from client.connection import Connection, ListOffsetsResult
from client.group_member import HeartbeatAnswer, HeartbeatRequest
from client.types import PartitionDescription, TopicDescription, TopicPartition
from storage.errors import (
    BrokerUnavailableError,
    ClosedError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    LeaderNotAvailableError,
    NotControllerError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    TidelogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

__all__ = ["InMemoryCluster", "InMemoryConnection"]


@dataclass(slots=True)
class _Partition:
    leader: int
    replicas: tuple[int, ...]
    leader_epoch: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0


@dataclass(slots=True)
class _Topic:
    partitions: list[_Partition]
    config: dict[str, str] = field(default_factory=dict)


class InMemoryCluster:
    """Brokers ``0..brokers-1`` at ``mem-<id>:<9000+id>``; broker 0 is the controller.

    Thread-safe. ``connect`` is a ``ConnectionFactory`` for ``ClusterConnections``.
    """

    def __init__(self, brokers: int = 3) -> None:
        if brokers < 1:
            raise ValueError(f"brokers must be >= 1, got {brokers}")
        self._lock = threading.Lock()
        self.nodes = {i: BrokerNode(i, f"mem-{i}", 9000 + i) for i in range(brokers)}
        self._alive = set(self.nodes)
        self.controller_id = 0
        self._topics: dict[str, _Topic] = {}
        self._committed: dict[str, dict[TopicPartition, int]] = {}
        self._coordinators: dict[str, int] = {}
        self.calls: list[tuple[int, str]] = []  # (broker id, call) in order, guarded by _lock

    @property
    def bootstrap(self) -> str:
        """Every broker's address, as a bootstrap list."""
        return ",".join(node.address for node in self.nodes.values())

    def connect(self, address: str) -> Connection:
        for node in self.nodes.values():
            if node.address == address:
                return InMemoryConnection(self, node.id)
        return InMemoryConnection(self, None, address)

    # --- what tests change ----------------------------------------------------------------

    def add_topic(self, name: str, partitions: int, *, leaders: Sequence[int] = ()) -> None:
        """A topic whose partition ``p`` is led by ``leaders[p]`` (default round-robin)."""
        with self._lock:
            self._add_topic_locked(name, partitions, leaders)

    def _add_topic_locked(self, name: str, partitions: int, leaders: Sequence[int]) -> None:
        ids = sorted(self.nodes)
        self._topics[name] = _Topic(
            [
                _Partition(
                    leader=leaders[p] if p < len(leaders) else ids[p % len(ids)],
                    replicas=(leaders[p] if p < len(leaders) else ids[p % len(ids)],),
                )
                for p in range(partitions)
            ]
        )

    def append(self, tp: TopicPartition, records: int) -> None:
        """Grow ``tp``'s log by ``records`` offsets."""
        with self._lock:
            self._partition_locked(tp).log_end_offset += records

    def move_leader(self, tp: TopicPartition, broker_id: int) -> None:
        """``broker_id`` leads ``tp`` from now on (the leader epoch grows)."""
        with self._lock:
            partition = self._partition_locked(tp)
            partition.leader = broker_id
            partition.replicas = (broker_id,)
            partition.leader_epoch += 1

    def set_coordinator(self, group_id: str, broker_id: int) -> None:
        with self._lock:
            self._coordinators[group_id] = broker_id

    def set_controller(self, broker_id: int) -> None:
        with self._lock:
            self.controller_id = broker_id

    def kill(self, broker_id: int) -> None:
        """The broker stops answering; partitions it led go offline (replication 1)."""
        with self._lock:
            self._alive.discard(broker_id)
            if self.controller_id == broker_id:
                self.controller_id = NO_LEADER
            for topic in self._topics.values():
                for partition in topic.partitions:
                    if partition.leader == broker_id:
                        partition.leader = NO_LEADER

    def revive(self, broker_id: int) -> None:
        """The broker answers again and leads the partitions it holds."""
        with self._lock:
            self._alive.add(broker_id)
            for topic in self._topics.values():
                for partition in topic.partitions:
                    if partition.leader == NO_LEADER and broker_id in partition.replicas:
                        partition.leader = broker_id
                        partition.leader_epoch += 1

    def committed(self, group_id: str) -> dict[TopicPartition, int]:
        with self._lock:
            return dict(self._committed.get(group_id, {}))

    def calls_to(self, broker_id: int, call: str | None = None) -> int:
        """How many calls ``broker_id`` answered (or refused), of kind ``call`` if given."""
        with self._lock:
            return sum(1 for b, c in self.calls if b == broker_id and call in (None, c))

    # --- what connections ask (the lock is taken by the caller) ---------------------------

    def _partition_locked(self, tp: TopicPartition) -> _Partition:
        topic = self._topics.get(tp.topic)
        if topic is None or not 0 <= tp.partition < len(topic.partitions):
            raise UnknownTopicOrPartitionError(f"{tp} does not exist")
        return topic.partitions[tp.partition]

    def _check_leader_locked(self, broker_id: int, tp: TopicPartition) -> _Partition:
        partition = self._partition_locked(tp)
        if partition.leader == NO_LEADER:
            raise LeaderNotAvailableError(f"{tp} has no leader")
        if partition.leader != broker_id:
            raise NotLeaderOrFollowerError(f"broker {broker_id} does not lead {tp}")
        return partition

    def _check_coordinator_locked(self, broker_id: int, group_id: str) -> None:
        if self._coordinators.setdefault(group_id, min(self.nodes)) != broker_id:
            raise NotCoordinatorError(f"broker {broker_id} does not coordinate {group_id}")

    def _check_controller_locked(self, broker_id: int) -> None:
        if self.controller_id != broker_id:
            raise NotControllerError(f"broker {broker_id} is not the controller")

    def _description_locked(self, name: str) -> TopicDescription:
        topic = self._topics.get(name)
        if topic is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return TopicDescription(
            name,
            tuple(
                PartitionDescription(
                    p,
                    part.log_start_offset,
                    part.log_end_offset,
                    part.log_end_offset,
                    0,
                    1,
                    leader=part.leader,
                    replicas=part.replicas,
                    isr=part.replicas if part.leader != NO_LEADER else (),
                    leader_epoch=part.leader_epoch,
                )
                for p, part in enumerate(topic.partitions)
            ),
            dict(topic.config),
        )

    def _metadata_locked(self, broker_id: int) -> ClusterMetadata:
        return ClusterMetadata(
            cluster_id="in-memory",
            controller_id=self.controller_id,
            broker_id=broker_id,
            brokers={i: n for i, n in self.nodes.items() if i in self._alive},
            topics={
                name: TopicMetadata(
                    name,
                    tuple(
                        PartitionMetadata(
                            p,
                            part.leader,
                            part.leader_epoch,
                            part.replicas,
                            part.replicas if part.leader != NO_LEADER else (),
                        )
                        for p, part in enumerate(topic.partitions)
                    ),
                )
                for name, topic in self._topics.items()
            },
        )


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
        self, queries: Mapping[TopicPartition, int], *, timeout_ms: int | None
    ) -> dict[TopicPartition, ListOffsetsResult]:
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
    ) -> dict[TopicPartition, TidelogError]:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_coordinator_locked(self._enter("commit_offsets"), group_id)
            cluster._committed.setdefault(group_id, {}).update(offsets)
            return {}

    def fetch_committed(
        self, group_id: str, partitions: Iterable[TopicPartition], *, timeout_ms: int | None
    ) -> dict[TopicPartition, int]:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_coordinator_locked(self._enter("fetch_committed"), group_id)
            committed = cluster._committed.get(group_id, {})
            return {tp: committed[tp] for tp in partitions if tp in committed}

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
            cluster._add_topic_locked(name, partitions or 1, ())
            cluster._topics[name].config.update(config)
            return cluster._description_locked(name)

    def delete_topic(self, name: str, *, timeout_ms: int | None) -> None:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_controller_locked(self._enter("delete_topic"))
            if cluster._topics.pop(name, None) is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

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

    def create_partitions(
        self, topic: str, total_count: int, *, validate_only: bool, timeout_ms: int | None
    ) -> int:
        cluster = self._cluster
        with cluster._lock:
            cluster._check_controller_locked(self._enter("create_partitions"))
            found = cluster._topics.get(topic)
            if found is None:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
            if total_count <= len(found.partitions):
                raise InvalidPartitionsError(f"{topic} has {len(found.partitions)} partitions")
            if not validate_only:
                ids = sorted(i for i in cluster.nodes if i in cluster._alive)
                for p in range(len(found.partitions), total_count):
                    leader = ids[p % len(ids)]
                    found.partitions.append(_Partition(leader=leader, replicas=(leader,)))
            return total_count

    def close(self) -> None:
        self._closed = True
