"""An in-memory cluster for unit tests of the client's routing: no sockets, no threads.

``InMemoryCluster`` holds brokers, topics with a leader per partition, log end offsets,
committed offsets and group coordinators, and answers the ``client.connection.Connection``
calls the way a real cluster does when things move:

- a partition call sent to a broker that does not lead it: ``NotLeaderOrFollowerError``;
  to an offline partition (``kill`` its leader): ``LeaderNotAvailableError``;
- a group call sent to a broker that is not the group's coordinator:
  ``NotCoordinatorError``;
- an admin topic call sent to a broker that is not the controller: ``NotControllerError``;
- any call to a killed broker: ``BrokerUnavailableError``;
- a coordinator describes a group with its own log ends, 0 for the partitions it does
  not lead (as a real one's empty local logs do), and each broker keeps its own client
  quotas (``quotas``);
- a leader stamps its leader epoch into the batches it stores and answers
  ``OffsetForLeaderEpoch`` from its epoch history; ``truncate`` plays an unclean leader
  election that cuts the log under the consumers (KIP-320).

Tests move leaders (``move_leader``), coordinators and the controller, kill and revive
brokers, and read ``calls`` to see which broker answered what.

This module holds the cluster's state and the controls tests drive; the calls themselves
are answered by ``InMemoryConnection`` (``client.in_memory_connection``, re-exported
here), the cluster's other half.

Thread-safe: one lock guards the whole cluster.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence

from tidelog.client.cluster import (
    NO_LEADER,
    BrokerNode,
    ClusterMetadata,
    PartitionMetadata,
    TopicMetadata,
)
from tidelog.client.connection import (
    Connection,
    PartitionProduceResult,
    ProduceCall,
)
from tidelog.client.in_memory_connection import (
    InMemoryConnection,
    InMemoryFetchStream,
    InMemoryPartition,
    InMemoryProduceStream,
    InMemoryTopic,
)
from tidelog.client.types import (
    PartitionDescription,
    QuotaEntity,
    TopicDescription,
    TopicPartition,
)
from tidelog.storage.errors import (
    BrokerUnavailableError,
    InvalidReplicaAssignmentError,
    LeaderNotAvailableError,
    NotControllerError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    TidelogError,
    UnknownTopicOrPartitionError,
)

# InMemoryConnection is defined with the cluster's other half (client.in_memory_connection)
# and re-exported here, where tests and docs import it.
__all__ = ["InMemoryCluster", "InMemoryConnection"]


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
        # (call name, broker id or None: any) -> errors its next calls raise, one each
        # (fail_next).
        self._failures: dict[tuple[str, int | None], list[TidelogError]] = {}
        self.controller_id = 0
        self._topics: dict[str, InMemoryTopic] = {}
        self._committed: dict[str, dict[TopicPartition, int]] = {}
        self._committed_epochs: dict[str, dict[TopicPartition, int]] = {}
        self._coordinators: dict[str, int] = {}
        # broker id -> entity -> quota -> value, as each broker keeps them
        self.quotas: dict[int, dict[QuotaEntity, dict[str, float]]] = {}
        self.calls: list[tuple[int, str]] = []  # (broker id, call) in order, guarded by _lock
        # tp -> (base offset, batch bytes) of every batch appended, in order
        self.produced: dict[TopicPartition, list[tuple[int, bytes]]] = {}
        self._streams: dict[int, list[InMemoryProduceStream | InMemoryFetchStream]] = {}
        self._appended = threading.Condition(self._lock)  # fetches wait here for records
        self._next_producer_id = 999
        self._keyed_ids: dict[str, int] = {}

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
        self._topics[name] = InMemoryTopic(
            [
                InMemoryPartition(
                    leader=leaders[p] if p < len(leaders) else ids[p % len(ids)],
                    replicas=(leaders[p] if p < len(leaders) else ids[p % len(ids)],),
                )
                for p in range(partitions)
            ]
        )

    def _single_replicas_locked(self, assignment: Sequence[Sequence[int]]) -> list[int]:
        """The brokers of a manual assignment, one per partition (this cluster keeps one
        replica of each); ``InvalidReplicaAssignmentError`` for anything else."""
        leaders = []
        for replicas in assignment:
            if len(replicas) != 1 or replicas[0] not in self.nodes:
                raise InvalidReplicaAssignmentError(
                    f"{list(replicas)}: the in-memory cluster keeps one replica, on a known node"
                )
            leaders.append(replicas[0])
        return leaders

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
            partition.new_leader_epoch()

    def truncate(self, tp: TopicPartition, end_offset: int) -> None:
        """An unclean leader election: the new leader's log (same broker here) ends at
        ``end_offset``, a batch boundary; the records after it are gone, and the new
        leader epoch starts there. Consumers past it must notice (OffsetForLeaderEpoch)."""
        with self._lock:
            partition = self._partition_locked(tp)
            kept = [(b, d) for b, d in self.produced.get(tp, []) if b < end_offset]
            if kept and kept[-1][0] + struct.unpack_from(">i", kept[-1][1], 23)[0] >= end_offset:
                raise ValueError(f"{end_offset} is not a batch boundary of {tp}")
            self.produced[tp] = kept
            partition.log_end_offset = end_offset
            partition.epoch_starts = [e for e in partition.epoch_starts if e[1] < end_offset]
            partition.new_leader_epoch()

    def set_coordinator(self, group_id: str, broker_id: int) -> None:
        with self._lock:
            self._coordinators[group_id] = broker_id

    def set_controller(self, broker_id: int) -> None:
        with self._lock:
            self.controller_id = broker_id

    def fail_next(
        self, call: str, error: TidelogError, times: int = 1, *, broker_id: int | None = None
    ) -> None:
        """The next ``times`` calls named ``call`` (``"init_producer_id"``...) raise
        ``error`` on whichever broker they reach (``broker_id``: only on that one)."""
        with self._lock:
            self._failures.setdefault((call, broker_id), []).extend([error] * times)

    def kill(self, broker_id: int) -> None:
        """The broker stops answering; partitions it led go offline (replication 1)."""
        with self._lock:
            self._alive.discard(broker_id)
            for stream in self._streams.pop(broker_id, []):
                stream.break_with(BrokerUnavailableError(f"broker {broker_id} was killed"))
            self._appended.notify_all()
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
                        partition.new_leader_epoch()

    def committed(self, group_id: str) -> dict[TopicPartition, int]:
        with self._lock:
            return dict(self._committed.get(group_id, {}))

    def calls_to(self, broker_id: int, call: str | None = None) -> int:
        """How many calls ``broker_id`` answered (or refused), of kind ``call`` if given."""
        with self._lock:
            return sum(1 for b, c in self.calls if b == broker_id and call in (None, c))

    # --- what connections ask (the lock is taken by the caller) ---------------------------

    def _partition_locked(self, tp: TopicPartition) -> InMemoryPartition:
        topic = self._topics.get(tp.topic)
        if topic is None or not 0 <= tp.partition < len(topic.partitions):
            raise UnknownTopicOrPartitionError(f"{tp} does not exist")
        return topic.partitions[tp.partition]

    def _check_leader_locked(self, broker_id: int, tp: TopicPartition) -> InMemoryPartition:
        partition = self._partition_locked(tp)
        if partition.leader == NO_LEADER:
            raise LeaderNotAvailableError(f"{tp} has no leader")
        if partition.leader != broker_id:
            raise NotLeaderOrFollowerError(f"broker {broker_id} does not lead {tp}")
        return partition

    def _append_locked(
        self, broker_id: int, call: ProduceCall
    ) -> dict[TopicPartition, PartitionProduceResult]:
        """Store each batch of ``call`` that ``broker_id`` leads (one batch per partition)."""
        results: dict[TopicPartition, PartitionProduceResult] = {}
        for tp, records in call.batches:
            try:
                partition = self._check_leader_locked(broker_id, tp)
            except TidelogError as exc:
                results[tp] = PartitionProduceResult(error=exc)
                continue
            base = partition.log_end_offset
            # RecordBatch v2: the base offset is the int64 at byte 0 (outside the CRC),
            # lastOffsetDelta the int32 at byte 23.
            stored = bytearray(records)
            struct.pack_into(">q", stored, 0, base)
            # partitionLeaderEpoch, the int32 at byte 12 (outside the CRC): the leader's.
            struct.pack_into(">i", stored, 12, partition.leader_epoch)
            partition.log_end_offset += struct.unpack_from(">i", records, 23)[0] + 1
            self.produced.setdefault(tp, []).append((base, bytes(stored)))
            results[tp] = PartitionProduceResult(base, -1)
        self._appended.notify_all()
        return results

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
