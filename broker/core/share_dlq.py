"""The dead-letter transactions of share groups (``broker.share.dead_letter``), run as a
transactional producer would run them over the wire (``CoreDeadLetters``, the
``DeadLetterSink`` the share-partition manager is built with): each step on this broker
when it is the one to serve it (its own transaction coordinator, its own produce path),
on the broker that is otherwise (``ClusterRoutes``: ``broker.cluster.dlq_peers``'s
gRPC calls).

Per transaction: InitProducerId for the share partition's transactional id (a new epoch
every time: it fences and aborts anything an earlier attempt or leader left open, and
sequences start at 0), AddPartitionsToTxn of the dead-letter partition and the share
partition's ``__share_group_state`` partition, the copies appended as transactional
batches (about 256 KiB each) in one append through the produce path (the coordinator's
verification included, ``acks=all``), the archiving written by the caller's ``archive``
(a transactional state write), then EndTxn(commit). A failure before EndTxn answered
aborts (best effort: an abort that fails is left to the transaction timeout or the next
InitProducerId of the id) and raises.
InitProducerId and AddPartitionsToTxn answered ``CONCURRENT_TRANSACTIONS`` (the previous
transaction's markers still being written) are retried for up to
``_CONCURRENT_RETRY_MS``.

The dead-letter topic is created when missing (``Topics.create_topic``: one partition,
the broker's default replication factor), as Kafka Connect's dead-letter queue is.

Decided, **in a cluster** (``ClusterRoutes``), where the transactional id's coordinator
(the leader of its ``__transaction_state`` partition), the dead-letter partition's leader
and the share coordinator (the leader of the key's ``__share_group_state`` partition)
may each be another broker than the share partition's leader that runs the transaction:

* Each step goes where this broker's view says it is served, looked up per step:
  InitProducerId, AddPartitionsToTxn and EndTxn to the id's coordinator, the copies to
  the dead-letter partition's leader (``GrpcDeadLetterPeers``: the clients' own calls
  over the inter-broker channel; why those, and not Tidelog's client ``Producer``, is
  there), the archiving to the share coordinator as a transactional
  WriteShareGroupState (``RoutedShareState.write_transactional``). The coordinator and
  the leaders check the transaction as a client's (fencing, KIP-890 verification of the
  copies' partition): exactly once needs nothing new from them.
* A step that fails (a role moved, a broker unreachable) aborts the attempt as on a
  single node; the records stay to be dead-lettered and the pass retries with its
  backoff. An abort that cannot reach the coordinator is left to the next attempt's
  InitProducerId (it fences and aborts) or to a loading leader's ``fence``.
* **EndTxn(commit) that fails without an answer** (the coordinator unreachable, moving,
  timing out) may have decided the commit. It is asked again (at the coordinator the view
  names then) until ``_COMMIT_RETRY_MS``: a retry of a decided commit answers success
  (``CONCURRENT_TRANSACTIONS`` while its markers are written, retried too). Only an
  answer that the transaction cannot commit (fenced, ``INVALID_TXN_STATE``) or running
  out of time ends in an abort and a retry of the records, so a commit is never
  mistaken for an abort while the coordinator answers within that time.
* The dead-letter topic's partition count comes from this broker's view of the cluster
  (a broker need not hold a replica of it); a missing topic is created through
  ``Topics.create_topic`` (forwarded to the controller like any creation).

Test hook (tests only; nothing happens unless set): ``TIDELOG_DLQ_TEST_STOP_AT=after_copy``
kills the broker process with SIGKILL once a transaction's copies and archiving are
written and before EndTxn, after writing ``DLQ test hook: killed at after_copy`` to
stderr; read where it is reached, as ``client.cdc.testhooks`` reads its own.

Thread-safe: holds nothing but its collaborators (one transaction per share partition
at a time is the caller's, under the share partition's lock).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tidelog.broker.cluster.dlq_peers import GrpcDeadLetterPeers
from tidelog.broker.core.membership import Membership
from tidelog.broker.core.produce import Acks, PartitionRecords, ProducePath
from tidelog.broker.core.topics import Topics
from tidelog.broker.share.dead_letter import DeadLetterBatch, copy_batches
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC
from tidelog.broker.tls import InterBrokerChannels
from tidelog.broker.transactions.coordinator import TransactionCoordinator
from tidelog.broker.transactions.txn_log import TRANSACTION_STATE_TOPIC
from tidelog.storage.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from tidelog.storage.log_manager import LogManager

__all__ = ["STOP_ENV", "ClusterRoutes", "CoreDeadLetters", "cluster_routes"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

STOP_ENV = "TIDELOG_DLQ_TEST_STOP_AT"
_TRANSACTION_TIMEOUT_MS = 30_000
_CONCURRENT_RETRY_MS = 5_000
_CONCURRENT_PAUSE_S = 0.01
_COMMIT_RETRY_MS = 20_000
_COMMIT_PAUSE_S = 0.2


@dataclass(frozen=True, slots=True)
class ClusterRoutes:
    """Where a cluster broker's dead-letter transaction steps go (module docstring):
    ``leader_of`` a partition's leader in this broker's view (-1: none);
    ``partitions_of`` a topic's partition count in it (None: no such topic)."""

    broker_id: int
    leader_of: Callable[[str, int], int]
    partitions_of: Callable[[str], int | None]
    peers: GrpcDeadLetterPeers


class CoreDeadLetters:
    """``DeadLetterSink`` over this broker's transaction coordinator and produce path, or
    (``routes``) the other brokers' where they serve a step."""

    def __init__(
        self,
        coordinator: TransactionCoordinator,
        produce: ProducePath,
        topics: Topics,
        logs: LogManager,
        routes: ClusterRoutes | None = None,
    ) -> None:
        self._coordinator = coordinator
        self._produce = produce
        self._topics = topics
        self._logs = logs
        self._routes = routes

    def write(self, batch: DeadLetterBatch, archive: Callable[[tuple[int, int]], None]) -> None:
        tid = batch.transactional_id
        topic = batch.dead_letter_topic
        target = (topic, batch.partition % self._partitions(topic))
        producer_id, epoch = _retrying(lambda: self._init(tid))
        try:
            _retrying(
                lambda: self._add(
                    tid, producer_id, epoch, [target, (SHARE_STATE_TOPIC, batch.state_partition)]
                )
            )
            data = copy_batches(batch, producer_id, epoch, 0)
            if data:
                self._append(tid, target, data)
            archive((producer_id, epoch))
            _stop_point("after_copy")
        except BaseException:
            self._abort(tid, producer_id, epoch)
            raise
        try:
            self._commit(tid, producer_id, epoch)
        except BaseException:
            self._abort(tid, producer_id, epoch)
            raise

    def fence(self, transactional_id: str) -> None:
        try:
            self._init(transactional_id)
        except Exception as exc:
            log.info("dead-letter transaction %s: fencing answered %s", transactional_id, exc)

    def close(self) -> None:
        """Close the channels to other brokers (the core's close)."""
        if self._routes is not None:
            self._routes.peers.close()

    # --- the steps, wherever they are served ---------------------------------------------

    def _init(self, tid: str) -> tuple[int, int]:
        where = self._coordinator_of(tid)
        if where is None:
            return self._coordinator.init_producer_id(tid, _TRANSACTION_TIMEOUT_MS)
        assert self._routes is not None
        return self._routes.peers.init_producer_id(where, tid, _TRANSACTION_TIMEOUT_MS)

    def _add(
        self, tid: str, producer_id: int, epoch: int, partitions: list[tuple[str, int]]
    ) -> None:
        where = self._coordinator_of(tid)
        if where is None:
            self._coordinator.add_partitions(tid, producer_id, epoch, partitions)
            return
        assert self._routes is not None
        self._routes.peers.add_partitions(where, tid, producer_id, epoch, partitions)

    def _end(self, tid: str, producer_id: int, epoch: int, commit: bool) -> None:
        where = self._coordinator_of(tid)
        if where is None:
            self._coordinator.end_transaction(tid, producer_id, epoch, commit)
            return
        assert self._routes is not None
        self._routes.peers.end_transaction(where, tid, producer_id, epoch, commit)

    def _commit(self, tid: str, producer_id: int, epoch: int) -> None:
        """EndTxn(commit), asked again while it fails without deciding (module
        docstring)."""
        deadline = time.monotonic() + _COMMIT_RETRY_MS / 1000
        while True:
            try:
                self._end(tid, producer_id, epoch, True)
                return
            except (
                ConcurrentTransactionsError,
                CoordinatorNotAvailableError,
                CoordinatorLoadInProgressError,
                NotCoordinatorError,
            ) as exc:
                if time.monotonic() >= deadline:
                    raise
                log.info("dead-letter transaction %s: commit answered %s; again", tid, exc)
                time.sleep(_COMMIT_PAUSE_S)

    def _abort(self, tid: str, producer_id: int, epoch: int) -> None:
        try:
            self._end(tid, producer_id, epoch, False)
        except Exception as exc:  # left to the timeout or the next InitProducerId
            log.info("dead-letter transaction %s: abort failed: %s", tid, exc)

    def _coordinator_of(self, tid: str) -> int | None:
        """The broker coordinating ``tid``; None: this one."""
        if self._routes is None:
            return None
        partition = self._coordinator.partition_for(tid)
        leader = self._routes.leader_of(TRANSACTION_STATE_TOPIC, partition)
        if leader == self._routes.broker_id:
            return None
        if leader < 0:
            raise CoordinatorNotAvailableError(
                f"{TRANSACTION_STATE_TOPIC}-{partition} (the coordinator of {tid}) has no leader"
            )
        return leader

    def _partitions(self, topic: str) -> int:
        known = self._partition_count(topic)
        if known is not None:
            return known
        try:
            # As Kafka Connect's dead-letter queue: created when missing, one partition.
            self._topics.create_topic(topic, 1, {})
            log.info("created dead-letter topic %s", topic)
        except TopicAlreadyExistsError:
            pass
        known = self._partition_count(topic)
        if known is None:
            raise UnknownTopicOrPartitionError(f"dead-letter topic {topic} is not known yet")
        return known

    def _partition_count(self, topic: str) -> int | None:
        if self._routes is not None:
            return self._routes.partitions_of(topic)
        try:
            return self._logs.topic(topic).partitions
        except UnknownTopicOrPartitionError:
            return None

    def _append(self, tid: str, target: tuple[str, int], data: bytes) -> None:
        if self._routes is not None:
            leader = self._routes.leader_of(*target)
            if leader != self._routes.broker_id:
                if leader < 0:
                    raise NotLeaderOrFollowerError(f"{target[0]}-{target[1]} has no leader")
                self._routes.peers.produce(leader, tid, target, data)
                return
        part = PartitionRecords(target[0], target[1], data, acks_all=True, transactional_id=tid)
        appends = self._produce.append([part])
        [answer] = self._produce.complete_blocking(appends, Acks.ALL)
        if answer.error_code:
            raise error_for_code(answer.error_code, answer.error_message)


def cluster_routes(
    broker_id: int, membership: Membership, channels: InterBrokerChannels
) -> ClusterRoutes:
    """A cluster broker's routes, read from ``membership``'s view per call."""

    def leader_of(topic: str, partition: int) -> int:
        try:
            return membership.placement.partition(topic, partition).leader
        except Exception:  # not in the view (yet): no leader known
            return -1

    def partitions_of(topic: str) -> int | None:
        known = membership.placement.topics()
        return None if known is None else known.get(topic)

    def address_of(wanted: int) -> str | None:
        for broker in membership.placement.cluster().brokers:
            if broker.broker_id == wanted:
                return f"{broker.host}:{broker.port}"
        return None

    return ClusterRoutes(
        broker_id, leader_of, partitions_of, GrpcDeadLetterPeers(channels, address_of)
    )


def _retrying(call: Callable[[], _T]) -> _T:
    """``call``, again while it answers ``CONCURRENT_TRANSACTIONS`` (the id's previous
    transaction is completing), for up to ``_CONCURRENT_RETRY_MS``."""
    deadline = time.monotonic() + _CONCURRENT_RETRY_MS / 1000
    while True:
        try:
            return call()
        except ConcurrentTransactionsError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(_CONCURRENT_PAUSE_S)


def _stop_point(point: str) -> None:
    if os.environ.get(STOP_ENV) != point:
        return
    sys.stderr.write(f"DLQ test hook: killed at {point}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
