"""Writing transaction markers to partitions (the leader's side of Kafka's
WriteTxnMarkers), for the coordinator's ``MarkerWriter`` seam: ``LocalMarkers`` writes to
the partitions this broker leads, ``ClusterMarkers`` (cluster mode) sends each other
partition's marker to its leader, where ``LocalMarkers`` writes it.

For each partition: the marker is appended as the leader (``Partition.
append_marker_as_leader``: role and leader epoch checked, epoch stamped), fsynced, and
in cluster mode waited for until the in-sync replicas hold it (the high watermark passed
it), as an ``acks=all`` write (each step for all the transaction's partitions before the
next: the fsyncs run in parallel, the replication waits overlap); then the partition's
readers are woken (``on_append``: a read_committed fetch parked at the last stable
offset may move on), and for a ``__consumer_offsets`` partition the group coordinator
makes the transaction's pending offsets committed or drops them (``on_marker``). A
marker is idempotent for the coordinator: a second COMMIT of a transaction the partition
already closed changes nothing but one more control record. A marker whose coordinator
epoch is older than one the partition saw for that producer is refused
``TRANSACTION_COORDINATOR_FENCED`` by the partition's producer state (a deposed
coordinator's late marker).

Per partition the answer is ``""`` (written, or the topic is gone: Kafka's coordinator
drops a deleted partition from the pending set too) or the error's Kafka name, which the
coordinator retries or gives up on (``broker.transactions.coordinator``).

Cluster mode (``ClusterMarkers``): the partitions are grouped by their leader in this
broker's view, read for every round (nothing cached: a leader that moved is found on the
coordinator's retry); this broker's own go to ``LocalMarkers`` directly, the others' in
one ``WriteTxnMarkers`` call per leader over the inter-broker channel, all leaders at
once (``TxnPeers``, ``broker.cluster.txn_peers``), as Kafka's
``TransactionMarkerChannelManager`` sends one request per destination broker. A
partition without a leader, or whose leader cannot be reached or answers late, is
``NOT_LEADER_OR_FOLLOWER`` (retried by the coordinator).

Verification (KIP-890 part 1) in cluster mode (``RoutedVerify``): a leader asks the
coordinator of the transactional id, the leader of its ``__transaction_state`` partition
in this broker's view now: itself directly, another broker over the same channel. Nothing
is cached: each transactional batch is checked against the coordinator's state of the
moment. A coordinator that cannot answer (no leader, unreachable, not loaded) is one of
``NOT_COORDINATOR``, ``COORDINATOR_NOT_AVAILABLE``, ``COORDINATOR_LOAD_IN_PROGRESS``,
which the produce path answers as retriable.

Thread-safe (the partitions are; the rest holds no state).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol

from tidelog.broker.core.group_fsync import flush_all, fsync_pool
from tidelog.broker.core.partition import Partition
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.storage.errors import TidelogError, UnknownTopicOrPartitionError

__all__ = [
    "ClusterMarkers",
    "LocalMarkers",
    "RoutedVerify",
    "TxnMarker",
    "TxnPeers",
    "answers_by_marker",
]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_REPLICATION_WAIT_MS = 30_000
_NO_LEADER = "NOT_LEADER_OR_FOLLOWER"  # retried by the coordinator on the next leader
_NO_COORDINATOR = "COORDINATOR_NOT_AVAILABLE"
_MAX_EPOCH = 32767  # a producer epoch is an int16, never negative in a marker


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """One transaction's marker for some partitions (an entry of WriteTxnMarkers)."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]


class TxnPeers(Protocol):
    """Transaction calls to another broker of the cluster (``broker.cluster.txn_peers``).
    Neither raises: a broker that cannot be reached is an error name per partition."""

    def write_txn_markers(
        self, broker_id: int, markers: Sequence[TxnMarker]
    ) -> list[dict[TopicPartition, str]]:
        """WriteTxnMarkers to ``broker_id``: per marker, per partition ``""`` or Kafka's
        error name."""
        ...

    def verify_txn_partition(
        self,
        broker_id: int,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        tp: TopicPartition,
        *,
        add: bool = False,
    ) -> str:
        """The coordinator ``broker_id``'s verification of ``tp`` in the producer's
        transaction (``add``: transactions v2's implicit add of it): ``""`` or Kafka's
        error name."""
        ...


class LocalMarkers:
    """Writes markers to this broker's own partitions (a single node leads them all)."""

    def __init__(
        self,
        registry: PartitionRegistry,
        on_append: Callable[[str, int], None],
        on_marker: Callable[[str, int, int, bool], None] | None = None,
    ) -> None:
        self._registry = registry
        self._on_append = on_append
        self._pool = fsync_pool("tidelog-marker-fsync")
        # (topic, partition, producer id, commit) once a marker is durable: the group
        # coordinator makes the transaction's pending offsets committed (or drops them).
        self._on_marker = on_marker

    def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Collection[TopicPartition],
        *,
        gone_is_written: bool = True,
    ) -> dict[TopicPartition, str]:
        """``gone_is_written``: a partition this broker does not have is done (a single
        node: its topic was deleted); False on a leader asked by another broker, whose
        view may be ahead of this one's (``NOT_LEADER_OR_FOLLOWER``: retried)."""
        out: dict[TopicPartition, str] = {}
        appended: list[tuple[TopicPartition, Partition, int]] = []
        for topic, index in sorted(partitions):
            try:
                partition = self._registry.get(topic, index)
            except UnknownTopicOrPartitionError:
                # deleted since: nothing left to mark
                out[(topic, index)] = "" if gone_is_written else _NO_LEADER
                continue
            try:
                offset = partition.append_marker_as_leader(
                    producer_id, producer_epoch, commit, coordinator_epoch
                )
            except TidelogError as exc:
                self._refused((topic, index), producer_id, commit, exc, out)
                continue
            appended.append(((topic, index), partition, offset))
        # Every marker appended first, then made durable together (one round of
        # parallel fsyncs), then waited for by the replicas together: a transaction's
        # markers cost about one partition's wait, not one per partition.
        failures = flush_all([(p.log, offset + 1) for _, p, offset in appended], self._pool)
        durable: list[tuple[TopicPartition, Partition, int]] = []
        for (tp, partition, offset), failed in zip(appended, failures, strict=True):
            if isinstance(failed, TidelogError):
                self._refused(tp, producer_id, commit, failed, out)
            elif failed is not None:
                raise failed
            else:
                durable.append((tp, partition, offset))
                if partition.replicated:
                    self._on_append(*tp)  # wakes the followers' fetches
        for tp, partition, offset in durable:
            if partition.replicated:
                try:
                    partition.wait_replicated(offset + 1, _REPLICATION_WAIT_MS)
                except TidelogError as exc:
                    self._refused(tp, producer_id, commit, exc, out)
                    continue
            if self._on_marker is not None:
                self._on_marker(tp[0], tp[1], producer_id, commit)
            self._on_append(*tp)
            out[tp] = ""
        return out

    @staticmethod
    def _refused(
        tp: TopicPartition,
        producer_id: int,
        commit: bool,
        exc: TidelogError,
        out: dict[TopicPartition, str],
    ) -> None:
        log.info(
            "%s-%d: %s marker of producer %d refused: %s",
            tp[0],
            tp[1],
            "COMMIT" if commit else "ABORT",
            producer_id,
            exc,
        )
        out[tp] = exc.code


class ClusterMarkers:
    """Cluster mode's ``MarkerWriter``: this broker's partitions through ``local``, the
    others' through their leaders (module docstring). Thread-safe."""

    def __init__(
        self,
        broker_id: int,
        local: LocalMarkers,
        leader_of: Callable[[str, int], int | None],
        peers: Callable[[], TxnPeers | None],
    ) -> None:
        self._broker_id = broker_id
        self._local = local
        # The leader of a partition in this broker's view now (-1: none; None: the
        # partition is not in the view, its topic deleted: nothing left to mark).
        self._leader_of = leader_of
        # The inter-broker calls (None: the broker has not joined its cluster yet).
        self._peers = peers
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tidelog-markers-to")

    def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Collection[TopicPartition],
    ) -> dict[TopicPartition, str]:
        by_leader: dict[int, list[TopicPartition]] = {}
        out: dict[TopicPartition, str] = {}
        for tp in sorted(partitions):
            leader = self._leader_of(*tp)
            if leader is None:
                out[tp] = ""
                continue
            by_leader.setdefault(leader, []).append(tp)
        marker = TxnMarker(producer_id, producer_epoch, commit, coordinator_epoch, ())

        def send(leader: int, tps: list[TopicPartition]) -> Mapping[TopicPartition, str]:
            if leader == self._broker_id:
                return self._local.write_markers(
                    producer_id, producer_epoch, commit, coordinator_epoch, tps
                )
            peers = self._peers()
            if leader < 0 or peers is None:
                return dict.fromkeys(tps, _NO_LEADER)
            answered = peers.write_txn_markers(leader, [replace(marker, partitions=tuple(tps))])
            results = answered[0] if answered else {}
            return {tp: results.get(tp, _NO_LEADER) for tp in tps}

        # The leaders at once (each writes, fsyncs and waits for its replicas): the
        # transaction's markers take the slowest leader's time, not their sum.
        if len(by_leader) == 1:
            out.update(send(*next(iter(by_leader.items()))))
        else:
            for answer in self._pool.map(lambda item: send(*item), by_leader.items()):
                out.update(answer)
        return out


class RoutedVerify:
    """Cluster mode's verification of a transactional batch (module docstring), or with
    ``add`` transactions v2's implicit add (KIP-890 part 2): a callable for
    ``ProducePath`` and TxnOffsetCommit. Thread-safe."""

    def __init__(
        self,
        broker_id: int,
        partition_for: Callable[[str], int],
        local: Callable[[str, int, int, TopicPartition], str],
        leader_of: Callable[[str, int], int | None],
        peers: Callable[[], TxnPeers | None],
        state_topic: str,
        *,
        add: bool = False,
    ) -> None:
        self._broker_id = broker_id
        self._add = add  # transactions v2: the coordinator adds the partition if missing
        self._partition_for = partition_for  # the id's __transaction_state partition
        self._local = local  # this broker's coordinator's answer
        self._leader_of = leader_of
        self._peers = peers
        self._state_topic = state_topic

    def __call__(
        self, transactional_id: str, producer_id: int, producer_epoch: int, tp: TopicPartition
    ) -> str:
        partition = self._partition_for(transactional_id)
        coordinator = self._leader_of(self._state_topic, partition)
        if coordinator == self._broker_id:
            return self._local(transactional_id, producer_id, producer_epoch, tp)
        peers = self._peers()
        if coordinator is None or coordinator < 0 or peers is None:
            return _NO_COORDINATOR
        return peers.verify_txn_partition(
            coordinator, transactional_id, producer_id, producer_epoch, tp, add=self._add
        )


def answers_by_marker(
    local: LocalMarkers, markers: Sequence[TxnMarker]
) -> list[Mapping[TopicPartition, str]]:
    """The leader's side of WriteTxnMarkers: each marker written to its partitions that
    this broker leads (others: ``NOT_LEADER_OR_FOLLOWER``, from the partition). A marker
    no coordinator could have sent (a negative producer id, an epoch outside 0..32767, a
    coordinator epoch outside int32) is ``INVALID_REQUEST`` for each of its partitions,
    and written nowhere."""
    return [
        local.write_markers(
            m.producer_id,
            m.producer_epoch,
            m.commit,
            m.coordinator_epoch,
            m.partitions,
            gone_is_written=False,
        )
        if _well_formed(m)
        else dict.fromkeys(m.partitions, "INVALID_REQUEST")
        for m in markers
    ]


def _well_formed(marker: TxnMarker) -> bool:
    return (
        marker.producer_id >= 0
        and 0 <= marker.producer_epoch <= _MAX_EPOCH
        and -(2**31) <= marker.coordinator_epoch < 2**31
    )
