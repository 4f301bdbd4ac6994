"""The transaction coordinator: drives ``broker.transactions.state`` over ``TxnLog``.

Listener-neutral and blocking (the listeners call it on their executor threads, as every
core call). For each request about a transactional id it

1. checks that this broker coordinates the id (it leads the id's ``__transaction_state``
   partition, ``NOT_COORDINATOR`` otherwise) and has loaded that partition
   (``COORDINATOR_LOAD_IN_PROGRESS``);
2. refuses with ``CONCURRENT_TRANSACTIONS`` if another transition of the id is being
   written (one transition at a time, as Kafka's ``pendingState``);
3. asks the state machine for a decision and, for a ``Write``, appends it durably and
   replicated (``TxnLog.write``) before it answers: the cache and the caller only ever
   see transitions that survive a failover.

Completion. A Prepare state, once written, is handed to a marker thread: it writes the
COMMIT or ABORT marker to every partition of the transaction through a ``MarkerWriter``
(the local partition logs on a single node; WriteTxnMarkers to the leaders in a cluster),
retrying the partitions that fail with a retriable error until all are done, then writes
the Complete state. EndTxn is answered after the Prepare write, before the markers, as
Kafka's. Markers are idempotent on the partitions, so a marker written twice (a retry, or
a new coordinator finishing the work after a failover) changes nothing. The transaction
stays in its Prepare state until the Complete write, so a new InitProducerId or EndTxn in
the meantime is ``CONCURRENT_TRANSACTIONS`` (retriable). ``marker_threads`` (4) threads
complete transactions, so a leader slow to take one transaction's marker does not hold
up the others' (Kafka sends markers asynchronously per destination broker); one id is
never on two of them at once: a late duplicate could otherwise write a finished
transaction's marker after the next transaction of the same epoch began on a partition
(transactions v1), closing that one there.

Timers (one thread): every ``abort_interval_ms`` the Ongoing transactions past their
timeout are fenced and aborted (``fence_timed_out``: the epoch is bumped, so the
producer's next call is ``PRODUCER_FENCED``), and ids idle past ``id_expiration_ms`` are
removed (a tombstone).

Failover (cluster mode): ``load_partition`` (this broker became the leader of a
``__transaction_state`` partition: ``BrokerCore.became_leader``) replays it and hands every
prepared transaction to the marker thread, which finishes it with the markers carrying
the partition's new leader epoch as coordinator epoch; ``unload_resigned`` (the timer
thread, at least every second) forgets the ids of partitions this broker stopped leading
(their queued completions are dropped when they come up: the new coordinator finishes
them). Requests about an id whose partition this broker does not lead are
``NOT_COORDINATOR``, and ``COORDINATOR_LOAD_IN_PROGRESS`` until it has loaded it at its
current leader epoch and the high watermark reached what it loaded. Markers go to each
partition's leader (``broker.transactions.markers.ClusterMarkers``); a marker that fails
with a retriable error is sent again, to whichever broker leads the partition then.

Errors raised are ``storage.errors`` classes by Kafka's names (``error_for_code``). An
append that fails is answered as Kafka maps it (``reference/transactions.md`` 9):
``NOT_COORDINATOR`` when this broker lost the partition or its disk failed,
``COORDINATOR_NOT_AVAILABLE`` when too few replicas or a timeout stopped it.

Thread-safe: one lock guards the set of ids with a transition in flight; the writes run
outside it (``TxnLog`` orders them per partition).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from tidelog.broker.config import BrokerConfig
from tidelog.broker.core.internal_topic import unload_resigned
from tidelog.broker.core.membership import Membership
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.transactions import state as machine
from tidelog.broker.transactions.markers import ClusterMarkers, LocalMarkers, RoutedVerify, TxnPeers
from tidelog.broker.transactions.state import Answer, Decision, Refuse, TxnMetadata, TxnState, Write
from tidelog.broker.transactions.txn_log import TRANSACTION_STATE_TOPIC, TxnLog, TxnLogConfig
from tidelog.storage.clock import Clock
from tidelog.storage.errors import (
    KafkaTimeoutError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    StorageError,
    TidelogError,
    UnknownTopicOrPartitionError,
    error_for_code,
)

__all__ = [
    "MarkerWriter",
    "TransactionCoordinator",
    "Transactions",
    "TxnCoordinatorConfig",
    "open_transactions",
    "txn_log_config",
]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# Marker results that mean "someone newer owns this transaction": stop sending its markers.
_FENCED = frozenset({"INVALID_PRODUCER_EPOCH", "TRANSACTION_COORDINATOR_FENCED"})
# Cluster mode: how often the timer thread looks for partitions this broker stopped leading
# (real time only paces it, as the groups' expiry thread).
_RESIGN_CHECK_MS = 1_000


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnCoordinatorConfig:
    """Kafka's ``transaction.*`` broker settings (``reference/transactions.md`` 2.1)."""

    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms
    # transaction.abort.timed.out.transaction.cleanup.interval.ms
    abort_interval_ms: int = 10_000
    marker_retry_backoff_ms: int = 100
    # Transactions completed at once (threads writing markers; one id on one at a time).
    marker_threads: int = 4

    def __post_init__(self) -> None:
        for name in ("max_timeout_ms", "id_expiration_ms", "abort_interval_ms", "marker_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")


class MarkerWriter(Protocol):
    """Writes transaction markers to partitions (a seam: the single node's writes to its
    own logs, the cluster's sends WriteTxnMarkers to each partition's leader)."""

    def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Collection[TopicPartition],
    ) -> Mapping[TopicPartition, str]:
        """Write one marker to each partition; per partition ``""`` (written, or the
        partition is gone) or Kafka's error name. Blocking, bounded in time."""
        raise NotImplementedError


class TransactionCoordinator:
    """Coordinates the transactional ids of the ``__transaction_state`` partitions this
    broker leads. ``start`` runs its marker and timer threads; ``stop`` ends them."""

    def __init__(
        self,
        txn_log: TxnLog,
        allocate: Callable[[], int],
        markers: MarkerWriter,
        registry: PartitionRegistry,
        clock: Clock,
        config: TxnCoordinatorConfig | None = None,
        *,
        group_partition: Callable[[str], TopicPartition],
    ) -> None:
        self._log = txn_log
        self._allocate_id = allocate  # a fresh producer id (epoch 0), never handed out again
        self._markers = markers
        self._registry = registry
        self._clock = clock
        self._config = config or TxnCoordinatorConfig()
        self._group_partition = group_partition
        self._lock = threading.Lock()
        self._roles_lock = threading.Lock()  # loading and unloading partitions
        self._pending: set[str] = set()  # ids with a transition being written
        self._completions: queue.Queue[str | None] = queue.Queue()
        # Ids a marker thread is completing now -> whether it was asked again meanwhile
        # (then it goes back on the queue when that thread is done: never two at once).
        self._completing: dict[str, bool] = {}
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the marker and timer threads and finish every prepared transaction the
        log holds (a restart between a Prepare and its Complete)."""
        for metadata in self._log.all():
            if metadata.state.is_prepare:
                self._completions.put(metadata.transactional_id)
        threads = [(f"markers-{i}", self._run_markers) for i in range(self._config.marker_threads)]
        for name, target in [*threads, ("timers", self._run_timers)]:
            thread = threading.Thread(target=target, name=f"tidelog-txn-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stopped.set()
        for _ in range(self._config.marker_threads):
            self._completions.put(None)
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads.clear()

    def load_partition(self, partition: int) -> None:
        """This broker became the leader of ``__transaction_state`` partition ``partition``:
        load it and finish its prepared transactions. Raises ``StorageError``."""
        with self._roles_lock:
            loaded = self._log.reload_partition(partition)
        for metadata in loaded:
            if metadata.state.is_prepare:
                self._completions.put(metadata.transactional_id)

    def unload_partition(self, partition: int) -> None:
        with self._roles_lock:
            self._log.unload_partition(partition)

    def unload_resigned(self) -> list[int]:
        """Cluster mode: forget the ids of every loaded partition this broker no longer
        leads (Kafka's ``onResignation``); the partitions unloaded. As the groups do
        (``GroupManager.unload_resigned``, whose rules this follows): run by the timer
        thread at least every ``_RESIGN_CHECK_MS``, and nothing depends on it having run,
        because every request about an id is refused ``NOT_COORDINATOR`` by the
        leadership check first, and a queued completion of a resigned partition is
        dropped when it comes up. The one helper of both
        (``broker.core.internal_topic.unload_resigned``), under ``_roles_lock`` with
        ``load_partition``."""
        unloaded = unload_resigned(
            self._log.loaded_partitions,
            self._log.leads,
            self._roles_lock,
            self._log.unload_partition,
        )
        for partition, _ in unloaded:
            log.info(
                "%s-%d: no longer its leader; its transactional ids unloaded",
                TRANSACTION_STATE_TOPIC,
                partition,
            )
        return [partition for partition, _ in unloaded]

    def partition_for(self, transactional_id: str) -> int:
        """The ``__transaction_state`` partition whose leader coordinates the id."""
        return self._log.partition_for(transactional_id)

    # --- the client's calls ------------------------------------------------------------

    def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        *,
        expected_producer_id: int = -1,
        expected_epoch: int = -1,
    ) -> tuple[int, int]:
        """InitProducerId with a transactional id: ``(producer_id, epoch)``. Fences older
        instances; an ongoing transaction is aborted first (``CONCURRENT_TRANSACTIONS``
        until that is done: the client retries)."""
        if not transactional_id:
            raise error_for_code("INVALID_REQUEST", "the transactional id is empty")
        now = self._clock.wall_ms()
        decision = self._transit(
            transactional_id,
            lambda current: machine.init_producer_id(
                current,
                transactional_id=transactional_id,
                timeout_ms=timeout_ms,
                max_timeout_ms=self._config.max_timeout_ms,
                now_ms=now,
                allocate=self._allocate,
                expected_producer_id=expected_producer_id,
                expected_epoch=expected_epoch,
            ),
        )
        return _identity(decision)

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> None:
        """AddPartitionsToTxn: the partitions join the transaction (it begins with the
        first)."""
        wanted = list(partitions)
        now = self._clock.wall_ms()
        self._transit(
            transactional_id,
            lambda current: machine.add_partitions(current, producer_id, epoch, wanted, now),
        )

    def add_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group_id: str
    ) -> None:
        """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition joins."""
        self.add_partitions(transactional_id, producer_id, epoch, [self._group_partition(group_id)])

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, str]:
        """The verify-only AddPartitionsToTxn: per partition ``""`` or Kafka's error name."""
        self._check_coordinator(transactional_id)
        return machine.verify_partitions(
            self._log.get(transactional_id), producer_id, epoch, partitions
        )

    def verify_partition(
        self, transactional_id: str, producer_id: int, epoch: int, tp: TopicPartition
    ) -> str:
        """One partition's verification (the produce path's check of a transactional
        batch): ``""`` or Kafka's error name; never raises (a coordinator that cannot
        answer is ``NOT_COORDINATOR``'s or ``COORDINATOR_LOAD_IN_PROGRESS``'s name)."""
        try:
            return self.verify_partitions(transactional_id, producer_id, epoch, [tp])[tp]
        except TidelogError as exc:
            return exc.code

    def add_partition(
        self, transactional_id: str, producer_id: int, epoch: int, tp: TopicPartition
    ) -> str:
        """A transactions v2 producer's implicit AddPartitionsToTxn (KIP-890 part 2: its
        Produce v12 or TxnOffsetCommit v5 names a partition its transaction does not hold
        yet): ``""`` once the partition is in, or Kafka's error name; never raises, as
        ``verify_partition``."""
        try:
            self.add_partitions(transactional_id, producer_id, epoch, [tp])
        except TidelogError as exc:
            return exc.code
        return ""

    def end_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        commit: bool,
        *,
        client_version: int = 0,
    ) -> tuple[int, int]:
        """EndTxn: the transaction is decided (Prepare written) when this returns; the
        markers follow. Returns the identity the producer continues with (v2: bumped)."""
        now = self._clock.wall_ms()
        decision = self._transit(
            transactional_id,
            lambda current: machine.end_transaction(
                current,
                producer_id,
                epoch,
                commit,
                now,
                client_version=client_version,
                allocate=self._allocate,
            ),
        )
        return _identity(decision)

    def describe(self, transactional_ids: Iterable[str]) -> dict[str, TxnMetadata | BaseException]:
        """DescribeTransactions: each id's state, or the error for it
        (``TRANSACTIONAL_ID_NOT_FOUND``, ``NOT_COORDINATOR``, ...)."""
        out: dict[str, TxnMetadata | BaseException] = {}
        for tid in transactional_ids:
            try:
                self._check_coordinator(tid)
                found = self._log.get(tid)
                if found is None:
                    raise error_for_code(
                        "TRANSACTIONAL_ID_NOT_FOUND", f"no transactional id {tid!r}"
                    )
                out[tid] = found
            except TidelogError as exc:
                out[tid] = exc
        return out

    def list_transactions(
        self,
        states: Collection[str] = (),
        producer_ids: Collection[int] = (),
        min_duration_ms: int = -1,
    ) -> list[TxnMetadata]:
        """ListTransactions: the ids this broker coordinates, filtered by state name
        (``"Ongoing"``), producer id, and (KIP-994) running for at least
        ``min_duration_ms`` (-1: no filter)."""
        now = self._clock.wall_ms()
        out = []
        for metadata in self._log.all():
            if not self._owns(self._log.partition_for(metadata.transactional_id)):
                continue
            if states and metadata.state.kafka_name not in states:
                continue
            if producer_ids and metadata.producer_id not in producer_ids:
                continue
            if min_duration_ms >= 0 and (
                metadata.start_ms < 0 or now - metadata.start_ms < min_duration_ms
            ):
                continue
            out.append(metadata)
        return out

    # --- transitions -------------------------------------------------------------------

    def _owns(self, partition: int) -> bool:
        return self._log.leads(partition)

    def _check_coordinator(self, transactional_id: str) -> int:
        partition = self._log.partition_for(transactional_id)
        if not self._owns(partition):
            raise error_for_code(
                "NOT_COORDINATOR",
                f"this broker does not coordinate {TRANSACTION_STATE_TOPIC}-{partition}",
            )
        self._log.check_loaded(partition)
        return partition

    def _transit(
        self, transactional_id: str, decide: Callable[[TxnMetadata | None], Decision]
    ) -> Decision:
        """Decide and, for a ``Write``, write; raise a refusal as its error."""
        self._check_coordinator(transactional_id)
        with self._lock:
            if transactional_id in self._pending:
                raise error_for_code(
                    "CONCURRENT_TRANSACTIONS", f"{transactional_id} is changing state; retry"
                )
            current = self._log.get(transactional_id)
            decision = decide(current)
            if isinstance(decision, Refuse):
                raise error_for_code(decision.error, decision.message)
            if isinstance(decision, Answer):
                return decision
            machine.check_transition(
                None if current is None or current.state is TxnState.DEAD else current,
                decision.metadata,
            )
            self._pending.add(transactional_id)
        try:
            self._write(decision.metadata)
        finally:
            with self._lock:
                self._pending.discard(transactional_id)
        if decision.metadata.state.is_prepare:
            self._completions.put(transactional_id)
        if decision.error:
            raise error_for_code(decision.error, f"{transactional_id}: retry when it completes")
        return decision

    def _write(self, metadata: TxnMetadata) -> None:
        try:
            self._log.write(metadata)
        except (NotLeaderOrFollowerError, StorageError, UnknownTopicOrPartitionError) as exc:
            raise error_for_code("NOT_COORDINATOR", str(exc)) from exc
        except (
            NotEnoughReplicasError,
            NotEnoughReplicasAfterAppendError,
            KafkaTimeoutError,
        ) as exc:
            raise error_for_code("COORDINATOR_NOT_AVAILABLE", str(exc)) from exc

    def _allocate(self) -> int:
        return self._allocate_id()

    # --- threads -----------------------------------------------------------------------

    def _run_markers(self) -> None:
        while not self._stopped.is_set():
            tid = self._completions.get()
            if tid is None:
                return
            with self._lock:
                if tid in self._completing:  # another thread has it: it goes again after
                    self._completing[tid] = True
                    continue
                self._completing[tid] = False
            try:
                self._complete(tid)
            except Exception:  # the thread must outlive one failure
                log.exception("transaction %s: completing failed; retrying later", tid)
                self._stopped.wait(self._config.marker_retry_backoff_ms / 1000)
                self._completions.put(tid)
            finally:
                with self._lock:
                    if self._completing.pop(tid):
                        self._completions.put(tid)

    def _complete(self, tid: str) -> None:
        """Write the markers of ``tid``'s prepared transaction, then its Complete state."""
        partition = self._log.partition_for(tid)
        if not self._owns(partition):
            return  # the new coordinator finishes it
        prepared = self._log.get(tid)
        if prepared is None or not prepared.state.is_prepare:
            return
        commit = prepared.state is TxnState.PREPARE_COMMIT
        remaining = set(prepared.partitions)
        while remaining:
            results = self._markers.write_markers(
                prepared.producer_id,
                prepared.producer_epoch,
                commit,
                self._log.coordinator_epoch(partition),
                remaining,
            )
            fenced = {tp: e for tp, e in results.items() if e in _FENCED}
            if fenced:
                log.warning("transaction %s: markers refused %s; giving up on it", tid, fenced)
                return
            remaining = {tp for tp in remaining if results.get(tp, "UNKNOWN_SERVER_ERROR")}
            if remaining:
                if self._stopped.wait(self._config.marker_retry_backoff_ms / 1000):
                    return
                if not self._owns(partition):
                    return
        while True:
            try:
                self._transit(tid, lambda current: _completion(current, prepared, self._clock))
                return
            except TidelogError as exc:
                if exc.code != "CONCURRENT_TRANSACTIONS" or self._stopped.is_set():
                    raise
            self._stopped.wait(self._config.marker_retry_backoff_ms / 1000)

    def _run_timers(self) -> None:
        interval_ms = self._config.abort_interval_ms
        next_round = time.monotonic() + interval_ms / 1000
        while not self._stopped.wait(min(interval_ms, _RESIGN_CHECK_MS) / 1000):
            try:
                self.unload_resigned()
                if time.monotonic() >= next_round:
                    next_round = time.monotonic() + interval_ms / 1000
                    self.abort_timed_out()
                    self.expire_ids()
            except Exception:  # the next round tries again
                log.exception("transaction timers failed; trying again next round")

    def abort_timed_out(self) -> int:
        """Fence and abort every Ongoing transaction past its timeout; how many."""
        now = self._clock.wall_ms()
        count = 0
        for metadata in self._log.all():
            if metadata.state is not TxnState.ONGOING:
                continue
            tid = metadata.transactional_id
            try:
                decision = self._transit(tid, lambda current: _timed_out(current, now))
            except TidelogError as exc:
                log.info("transaction %s: not aborted this round: %s", tid, exc)
                continue
            if isinstance(decision, Write):
                count += 1
                log.info(
                    "transaction %s (producer %d) timed out after %d ms: aborting",
                    tid,
                    metadata.producer_id,
                    metadata.timeout_ms,
                )
        return count

    def expire_ids(self) -> int:
        """Remove ids idle past ``transactional.id.expiration.ms``; how many."""
        now = self._clock.wall_ms()
        count = 0
        for metadata in self._log.all():
            if not metadata.state.is_idle:
                continue
            try:
                decision = self._transit(
                    metadata.transactional_id,
                    lambda current: _expired(current, now, self._config.id_expiration_ms),
                )
            except TidelogError:
                continue
            count += isinstance(decision, Write)
        return count


def _timed_out(current: TxnMetadata | None, now_ms: int) -> Decision:
    fenced = None if current is None else machine.fence_timed_out(current, now_ms)
    return Answer() if fenced is None else fenced


def _expired(current: TxnMetadata | None, now_ms: int, expiration_ms: int) -> Decision:
    dead = None if current is None else machine.expire(current, now_ms, expiration_ms)
    return Answer() if dead is None else dead


def _completion(current: TxnMetadata | None, prepared: TxnMetadata, clock: Clock) -> Decision:
    """The Complete state of ``prepared`` if it is still what the log holds."""
    if current is None or current != prepared:
        return Answer()  # someone else moved it on (a fence, a failover): nothing to do
    return machine.complete(current, clock.wall_ms())


def _identity(decision: Decision) -> tuple[int, int]:
    if isinstance(decision, Refuse):  # _transit raised already
        raise error_for_code(decision.error, decision.message)
    return decision.producer_id, decision.producer_epoch


@dataclass(frozen=True, slots=True)
class Transactions:
    """A broker's transaction parts (``open_transactions``)."""

    coordinator: TransactionCoordinator
    # KIP-890's check of a transactional batch with its id's coordinator, wherever it is,
    # and transactions v2's implicit add of its partition (part 2).
    verify: Callable[[str, int, int, TopicPartition], str]
    add: Callable[[str, int, int, TopicPartition], str]
    # The markers this broker writes as a partition's leader (WriteTxnMarkers).
    markers: LocalMarkers


def open_transactions(
    config: BrokerConfig,
    registry: PartitionRegistry,
    clock: Clock,
    membership: Membership,
    group_partition: Callable[[str], TopicPartition],
    on_append: Callable[[str, int], None],
    on_marker: Callable[[str, int, int, bool], None],
) -> Transactions:
    """A broker's coordinator (not started), its verification and its marker writer.

    ``__transaction_state`` is opened (created on the first start) in the broker's data
    directory. A single node writes markers to its own partitions (``LocalMarkers``) and
    verifies with its own coordinator; a cluster broker (``zookeeper.connect``) sends
    other leaders' markers to them and asks the id's coordinator wherever it is
    (``ClusterMarkers``, ``RoutedVerify``: the leaders in ``membership``'s view now, the
    calls through its ``txn_peers``), and coordinates nothing until it leads a partition
    of the topic (``load_partition``). ``on_append`` wakes a partition's fetches;
    ``on_marker`` (topic, partition, producer id, commit) follows a durable marker (the
    group coordinator's pending offsets). Raises ``StorageError``.
    """
    local = LocalMarkers(registry, on_append, on_marker)
    replicated = config.zookeeper_connect is not None
    leader_of = functools.partial(_leader_of, membership)

    def peers() -> TxnPeers | None:
        return membership.role.txn_peers

    markers: MarkerWriter = local
    if replicated:
        markers = ClusterMarkers(config.broker_id, local, leader_of, peers)
    coordinator = TransactionCoordinator(
        TxnLog.open(registry.logs, txn_log_config(config), registry=registry, on_append=on_append),
        lambda: membership.producer_ids.init(-1, -1)[0],
        markers,
        registry,
        clock,
        TxnCoordinatorConfig(
            max_timeout_ms=config.transaction_max_timeout_ms,
            id_expiration_ms=config.transactional_id_expiration_ms,
            abort_interval_ms=config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
        ),
        group_partition=group_partition,
    )
    if not replicated:
        return Transactions(
            coordinator, coordinator.verify_partition, coordinator.add_partition, local
        )

    def routed(
        local_check: Callable[[str, int, int, TopicPartition], str], add: bool
    ) -> RoutedVerify:
        return RoutedVerify(
            config.broker_id,
            coordinator.partition_for,
            local_check,
            leader_of,
            peers,
            TRANSACTION_STATE_TOPIC,
            add=add,
        )

    return Transactions(
        coordinator,
        routed(coordinator.verify_partition, False),
        routed(coordinator.add_partition, True),
        local,
    )


def _leader_of(membership: Membership, topic: str, partition: int) -> int | None:
    """The leader of a partition in this broker's view now: -1 for none (or while the
    broker is still joining its cluster), None for a partition the view does not have
    (its topic deleted)."""
    role = membership.role
    if not role.joined:
        return -1
    known = role.placement.topics()
    if known is not None and not 0 <= partition < known.get(topic, 0):
        return None
    return role.placement.partition(topic, partition).leader


def txn_log_config(config: BrokerConfig) -> TxnLogConfig:
    """``__transaction_state``'s settings from the broker's (``transaction.state.log.*``)."""
    return TxnLogConfig(
        num_partitions=config.transaction_state_log_num_partitions,
        segment_bytes=config.offsets_topic_segment_bytes,
        min_isr=config.transaction_state_log_min_isr,
    )
