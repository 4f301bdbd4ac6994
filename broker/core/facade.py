"""The broker's domain behind one facade: ``BrokerCore``, one method per operation, over
plain Python values; no wire type here.

``BrokerCore`` builds and owns the log manager, the produce and fetch paths
(``broker.core.produce``, ``broker.core.fetch``), the purgatories of delayed operations
(``broker.core.delayed``: parked fetches, ``acks=all`` produces waiting for the group fsync,
DeleteRecords waiting for the followers), the group coordinator (``broker.groups``), the
quotas and the metrics; the broker's role (placement, topic administration, producer ids) is
its ``broker.core.membership``. The operations are grouped by concept in services the facade
delegates to: topics (``broker.core.topics``), offsets and producers
(``broker.core.offsets``), groups (``broker.groups.manager``). The facade's topic and
config calls (``TopicCalls``, ``broker.core.facade_topics``) and its group operations
(``GroupCalls``, ``broker.core.facade_groups``) are mixed in from their own modules; this
one keeps construction, the data path, transactions between brokers, quotas, metrics and
shutdown. It is listener-neutral:
errors are ``TidelogError`` classes with stable codes that each listener renders once
(``broker.core.errors``). The gRPC listener (``broker.grpc.service``) and the Kafka listener
(``broker.kafka``) call the same methods through the request pipeline
(``broker.core.pipeline``).

Nothing here waits on a client's behalf. A fetch that must wait is parked
(``start_fetch`` / ``step_fetch``, see ``broker.core.fetch``) and an ``acks=all`` produce is
answered through a callback once durable (``complete``): the listener chooses how to
wait without a thread (an asyncio future) or with one (``fetch``, ``produce``).

Shutdown (``broker.core.gate``): ``close`` refuses new operations (``ShuttingDownError``,
which the listeners answer as unavailable), answers every parked fetch, waits for the
operations in flight to finish (so that no append races the closing of the logs), lets
the group fsync answer the produces it was asked for, stops the group expiry timer, then
closes the log manager, which flushes, writes checkpoints and the clean-shutdown marker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

from tidelog.broker.config import BrokerConfig
from tidelog.broker.core.acl import parse_principals
from tidelog.broker.core.acl_store import Acls, LocalAclStore
from tidelog.broker.core.auth import Authenticator
from tidelog.broker.core.configs import (
    BrokerConfigStore,
    Configs,
    LocalBrokerConfigStore,
)
from tidelog.broker.core.delayed import DelayedOperations
from tidelog.broker.core.delete_records import DeletionAnswer
from tidelog.broker.core.errors import ShuttingDownError
from tidelog.broker.core.facade_groups import GroupCalls
from tidelog.broker.core.facade_topics import TopicCalls
from tidelog.broker.core.fetch import (
    FetchPath,
    FetchSpec,
    PartitionFetched,
    PendingFetch,
)
from tidelog.broker.core.gate import OperationGate
from tidelog.broker.core.group_fsync import GroupFsync
from tidelog.broker.core.membership import Membership, TopicAdmin
from tidelog.broker.core.meta_properties import ensure_meta_properties
from tidelog.broker.core.metrics import BrokerMetrics, GroupLagGauges, PartitionGauges
from tidelog.broker.core.offsets import (
    EpochEndAnswer,
    EpochQuery,
    OffsetAnswer,
    OffsetQuery,
    Offsets,
    PartitionProducers,
    RecordsDeleted,
    RecordsToDelete,
)
from tidelog.broker.core.partitions import PartitionRegistry, open_partitions
from tidelog.broker.core.placement import (
    LocalPlacement,
    Placement,
)
from tidelog.broker.core.produce import (
    Acks,
    Deliver,
    PartitionAppend,
    PartitionProduced,
    PartitionRecords,
    ProducePath,
)
from tidelog.broker.core.producer_ids import ProducerIdManager, ProducerIdSource
from tidelog.broker.core.quotas import QuotaEntity, QuotaManager, QuotaWindow
from tidelog.broker.core.share_dlq import CoreDeadLetters, cluster_routes
from tidelog.broker.core.share_ops import ShareOps, ShareParts, open_share_parts
from tidelog.broker.core.throttle import ReplicationThrottle
from tidelog.broker.core.topics import (
    Topics,
)
from tidelog.broker.core.user_admin import UserAdmin
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.groups.manager import (
    GroupManager,
)
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC
from tidelog.broker.tls import InterBrokerChannels
from tidelog.broker.transactions.coordinator import Transactions, open_transactions
from tidelog.broker.transactions.markers import TxnMarker, answers_by_marker
from tidelog.broker.transactions.txn_log import TRANSACTION_STATE_TOPIC
from tidelog.storage.clock import Clock, SystemClock
from tidelog.storage.errors import (
    InvalidRequestError,
)
from tidelog.storage.log_manager import LogManager

__all__ = ["BrokerCore", "TopicAdmin", "open_partitions"]

log = logging.getLogger(__name__)


class BrokerCore(TopicCalls, GroupCalls):
    """Everything a broker does, minus the network. Thread-safe.

    Build with ``open``; ``close`` once. The topic and config calls come from
    ``TopicCalls`` (``broker.core.facade_topics``), the group operations from
    ``GroupCalls`` (``broker.core.facade_groups``).
    """

    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        partitions: PartitionRegistry,
        membership: Membership,
        metrics: BrokerMetrics,
        groups: GroupManager,
        delayed: DelayedOperations,
        group_fsync: GroupFsync,
        quotas: QuotaManager,
        authenticator: Authenticator | None,
        acls: Acls | None = None,
        broker_configs: BrokerConfigStore | None = None,
        transactions: Transactions | None = None,
        shares: ShareParts | None = None,
    ) -> None:
        self.config = config
        # Transactions (broker.transactions, issue #28): the coordinator of the
        # __transaction_state partitions this broker leads (a single node: all); the check
        # (or v2's implicit add) of a transactional batch with its id's coordinator,
        # wherever that is (``RoutedVerify`` in a cluster); the markers this broker writes
        # as a partition's leader. None: a core built without ``open`` (transactional
        # requests refused).
        self._txn = transactions
        self.transactions = None if transactions is None else transactions.coordinator
        # Placement, topic administration and producer ids: the broker's role, which
        # changes (joining -> joined) inside this one object (broker.core.membership).
        self.membership = membership
        self.quotas = quotas
        self.metrics = metrics
        self._clock = clock
        # Every hosted partition (broker.core.partitions), shared with the replica manager
        # in cluster mode.
        self._partitions = partitions
        logs = partitions.logs
        self._logs = logs
        # Authentication (broker.core.auth): every listener asks it for each call's principal.
        # None (a core built without ``open``): every call is served unauthenticated.
        self.authenticator = authenticator
        # SCRAM user administration over the authenticator's store (broker.core.user_admin):
        # gRPC's user calls and Kafka's KIP-554 APIs both call it. None without one.
        self.user_admin = UserAdmin(authenticator.users) if authenticator is not None else None
        self._groups = groups
        fetch_purgatory = delayed.fetch
        self._fetch_purgatory = fetch_purgatory
        self._produce_purgatory = delayed.produce
        self._group_fsync = group_fsync
        # Authorization (broker.grpc.authorize): disabled unless authorizer.enabled.
        self.acls = acls or Acls(LocalAclStore.in_memory(), enabled=False)
        self._replication_throttle = ReplicationThrottle(
            config.leader_replication_throttled_rate, clock
        )
        self._fetch = FetchPath(
            partitions,
            fetch_purgatory,
            metrics,
            clock,
            fetch_max_bytes=config.fetch_max_bytes,
            fetch_max_wait_ms=config.fetch_max_wait_ms,
            check_leader=self._check_leader,
            # leader.replication.throttled.rate, dynamic (``configs.on_applied`` below).
            throttle=self._replication_throttle,
        )
        self._produce = ProducePath(
            partitions,
            self._fetch.on_append,
            delayed.produce,
            group_fsync,
            metrics,
            check_leader=self._check_leader,
            batch_times=config.batch_times_enabled,
            clock=clock,
            verify=None if transactions is None else transactions.verify,
            add_partition=None if transactions is None else transactions.add,
        )
        self._gate = OperationGate()
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        # The operations, by concept; the methods below delegate to them.
        self.topics = Topics(config, logs, membership, groups, metrics, self._gate)
        # Dynamic configs (broker.core.configs): a single node's broker-configs.json, or
        # ZooKeeper's /config/brokers once a cluster broker joined (``use_store``).
        self.configs = Configs(
            config,
            logs,
            self.topics,
            membership,
            broker_configs or LocalBrokerConfigStore.in_memory(),
        )
        self.configs.on_applied(
            lambda applied: self._replication_throttle.set_rate(
                applied.leader_replication_throttled_rate
            )
        )
        self._deletions = delayed.delete_records
        self.offsets = Offsets(partitions, membership, self._gate, self._deletions, clock)
        metrics.add_partition_collector(self._partition_gauges, fetch_purgatory.parked)
        metrics.add_group_collector(self._group_lag_gauges, self._group_members)
        # Share groups (issue #32, broker.core.share_ops): None for a core built without
        # ``open`` (share requests refused). Its timer starts here and stops in ``close``.
        # The dead-letter transactions (broker.core.share_dlq); in a cluster their steps
        # go to the brokers that serve them. Closed with the shares.
        self._dead_letters = (
            None
            if self.transactions is None or shares is None
            else CoreDeadLetters(
                self.transactions,
                self._produce,
                self.topics,
                logs,
                cluster_routes(config.broker_id, membership, InterBrokerChannels(config.security))
                if partitions.replicated
                else None,
            )
        )
        self.shares = (
            None
            if shares is None
            else ShareOps(
                shares,
                config,
                partitions,
                membership,
                groups,
                self._gate,
                fetch_purgatory,
                clock,
                dead_letters=self._dead_letters,
            )
        )

    @classmethod
    def open(
        cls,
        config: BrokerConfig,
        clock: Clock | None = None,
        metrics: BrokerMetrics | None = None,
        membership: Membership | None = None,
        partitions: PartitionRegistry | None = None,
        delayed: DelayedOperations | None = None,
    ) -> BrokerCore:
        """Open (recovering) the data directory, load the committed offsets and start the
        background work (storage tasks, group session expiry).

        ``membership``: the broker's role (``broker.core.membership``); None: a single node's,
        built here (it leads everything, producer ids from the data directory). A cluster
        broker passes ``Membership.joining`` and the assembly (``broker.assembly``) makes
        it join once the node has the cluster's view.

        ``partitions`` and ``delayed``: the partition registry over the opened data
        directory and the purgatories it tells of progress (``open_partitions``), built
        by the assembly before the core; both or neither (None: built here the same
        way). The log manager is the core's to close either way.

        Raises:
            StorageError: the data directory is unusable.
            InvalidConfigError: the SCRAM credentials file is unreadable.
        """
        clock = clock or SystemClock()
        if partitions is None or delayed is None:
            if partitions is not None or delayed is not None:
                raise ValueError("BrokerCore.open: pass both partitions and delayed, or neither")
            partitions, delayed = open_partitions(config, clock)
        logs = partitions.logs
        fetch_purgatory = delayed.fetch
        produce_purgatory = delayed.produce

        def produce_durable(topic: str, partition: int) -> None:
            produce_purgatory.check_and_complete((topic, partition))

        def appended(topic: str, partition: int) -> None:
            fetch_purgatory.check_and_complete((topic, partition))

        group_fsync = GroupFsync(produce_durable)
        try:
            users = FileUserStore.open(logs.data_dir)
            acls = Acls(
                LocalAclStore.open(logs.data_dir),
                enabled=config.authorizer_enabled,
                super_users=parse_principals(config.super_users or ""),
                allow_if_no_acl=config.allow_everyone_if_no_acl_found,
            )
            quotas = QuotaManager.open(
                logs.data_dir,
                QuotaWindow(
                    samples=config.quota_window_num,
                    sample_ms=config.quota_window_size_seconds * 1000,
                ),
                clock,
            )
            if membership is None:
                # Cluster mode: the cluster id comes from ZooKeeper (ClusterNode.start
                # checks it).
                cluster_id = (
                    ensure_meta_properties(logs.data_dir, config.broker_id)
                    if config.zookeeper_connect is None
                    else ""
                )
                membership = Membership.single_node(
                    LocalPlacement(config.broker_id, cluster_id, config.broker_rack),
                    ProducerIdManager.open(logs.data_dir, clock, config.producer_id_expiration_ms),
                )
            authenticator = Authenticator(config.security, membership.users(users), clock)
            broker_configs = (
                LocalBrokerConfigStore.open(logs.data_dir)
                if config.zookeeper_connect is None
                else LocalBrokerConfigStore.in_memory()
            )
            groups = GroupManager.open(
                logs,
                clock,
                config.group_config(),
                on_append=appended,
                registry=partitions,
            )
            shares = open_share_parts(config, partitions, clock, groups, appended)
            share_store = shares.store

            def marker_written(topic: str, partition: int, producer_id: int, commit: bool) -> None:
                # A durable marker ends what a transaction wrote to an internal topic:
                # TxnOffsetCommit's offsets, a dead-letter transaction's share state.
                if topic == OFFSETS_TOPIC:
                    groups.store.end_transaction(partition, producer_id, commit)
                elif topic == SHARE_STATE_TOPIC:
                    share_store.end_transaction(partition, producer_id, commit)

            built = open_transactions(
                config,
                partitions,
                clock,
                membership,
                lambda group: (OFFSETS_TOPIC, groups.store.partition_for(group)),
                appended,
                marker_written,
            )
            transactions = built
            logs.start_background()
            groups.start()
            transactions.coordinator.start()
            fetch_purgatory.start()
            delayed.delete_records.start()
            group_fsync.start()
        except BaseException:
            fetch_purgatory.close()
            group_fsync.close()
            logs.close()
            raise
        return cls(
            config,
            clock,
            partitions,
            membership,
            metrics or BrokerMetrics(),
            groups,
            delayed,
            group_fsync,
            quotas,
            authenticator,
            acls,
            broker_configs,
            transactions,
            shares,
        )

    # --- cluster mode: replication ----------------------------------------------------------

    def became_leader(self, topic: str, partition: int) -> None:
        """This broker now leads the partition: an offsets partition's groups (committed
        offsets and classic membership) are loaded from its replicated log (their
        coordinator moved here); ``GroupManager.unload_resigned`` does the reverse. A
        ``__transaction_state`` partition's transactional ids likewise
        (``TransactionCoordinator.load_partition``, which also finishes the prepared
        commits and aborts; ``unload_resigned`` the reverse)."""
        if topic == OFFSETS_TOPIC:
            self._groups.reload_partition(partition)
        elif topic == TRANSACTION_STATE_TOPIC and self.transactions is not None:
            self.transactions.load_partition(partition)
        if self.shares is not None:
            self.shares.became_leader(topic, partition)

    # --- transactions between brokers -------------------------------------------------------

    def verify_transactional(
        self, transactional_id: str, producer_id: int, producer_epoch: int, tp: tuple[str, int]
    ) -> str:
        """KIP-890's check that ``tp`` is in the producer's ongoing transaction, asked of
        the id's coordinator wherever it is: ``""`` or Kafka's error name (a coordinator
        that cannot answer: ``NOT_COORDINATOR``, ``COORDINATOR_NOT_AVAILABLE``...)."""
        if self._txn is None:
            return "COORDINATOR_NOT_AVAILABLE"
        with self._gate.operation():
            return self._txn.verify(transactional_id, producer_id, producer_epoch, tp)

    def add_transactional(
        self, transactional_id: str, producer_id: int, producer_epoch: int, tp: tuple[str, int]
    ) -> str:
        """Transactions v2's implicit AddPartitionsToTxn (KIP-890 part 2: a Produce v12 or
        TxnOffsetCommit v5 naming a partition), asked of the id's coordinator wherever it
        is: ``""`` once ``tp`` is in the transaction, or Kafka's error name."""
        if self._txn is None:
            return "COORDINATOR_NOT_AVAILABLE"
        with self._gate.operation():
            return self._txn.add(transactional_id, producer_id, producer_epoch, tp)

    def verify_txn_partition(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        tp: tuple[str, int],
        *,
        add: bool = False,
    ) -> str:
        """The coordinator's half of a verification (``add``: v2's implicit add) another
        broker asked for: this broker's own answer (``NOT_COORDINATOR`` unless it
        coordinates the id)."""
        if self.transactions is None:
            return "NOT_COORDINATOR"
        with self._gate.operation():
            check = self.transactions.add_partition if add else self.transactions.verify_partition
            return check(transactional_id, producer_id, producer_epoch, tp)

    def write_txn_markers(
        self, markers: Sequence[TxnMarker]
    ) -> list[Mapping[tuple[str, int], str]]:
        """WriteTxnMarkers, the partition leader's side: each marker written (as an
        ``acks=all`` append) to its partitions this broker leads; per marker, per partition
        ``""`` or Kafka's error name (``NOT_LEADER_OR_FOLLOWER`` elsewhere,
        ``TRANSACTION_COORDINATOR_FENCED`` for a deposed coordinator's marker...)."""
        if self._txn is None:
            return [dict.fromkeys(m.partitions, "NOT_LEADER_OR_FOLLOWER") for m in markers]
        with self._gate.operation():
            return answers_by_marker(self._txn.markers, markers)

    @property
    def placement(self) -> Placement:
        """Where partitions live and who leads them, as the role says now."""
        return self.membership.placement

    @property
    def topic_admin(self) -> TopicAdmin | None:
        """Cluster mode's topic administration (the controller, through the node); None
        on a single node, which administers its own topics."""
        return self.membership.topic_admin

    @property
    def producer_ids(self) -> ProducerIdSource:
        """Where ``InitProducerId`` draws ids: the data directory's file on a single node,
        ZooKeeper once a cluster broker joined (``broker.cluster.producer_ids``)."""
        return self.membership.producer_ids

    def _check_leader(self, topic: str, partition: int) -> None:
        self.placement.check_leader(topic, partition)

    @property
    def partitions(self) -> PartitionRegistry:
        """Every hosted partition: the registry the replica manager shares (cluster mode)."""
        return self._partitions

    @property
    def logs(self) -> LogManager:
        """The log manager (replica fetchers, tests and benchmarks; not the servicer)."""
        return self._logs

    @property
    def groups(self) -> GroupManager:
        """The group coordinator (for tests; the servicer never uses it)."""
        return self._groups

    # --- the shutdown gate ------------------------------------------------------------

    def _operation(self) -> AbstractContextManager[None]:
        """Run one operation unless closing; ``close`` waits for those in flight."""
        return self._gate.operation()

    def begin_close(self) -> None:
        """Refuse new operations and answer waiting long polls now. Idempotent."""
        self._gate.begin_close()
        self._fetch_purgatory.close()
        self._deletions.close()  # waiting DeleteRecords answer as timed out

    def close(self, timeout_ms: int = 30_000) -> None:
        """``begin_close``, wait for work in flight, then close the logs. Idempotent.

        Operations still running after ``timeout_ms`` are logged and the logs closed anyway
        (an fsync stuck that long means the disk is gone).
        """
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closed.set()
        self.begin_close()
        if not self._gate.wait_idle(timeout_ms / 1000.0):
            log.error("closing with %d operations still in flight", self._gate.in_flight)
        self._group_fsync.close(timeout_ms)
        self._produce_purgatory.close()
        if self.transactions is not None:
            self.transactions.stop()
        if self.shares is not None:
            self.shares.close()
        if self._dead_letters is not None:
            self._dead_letters.close()
        self._groups.close()
        self._logs.close()

    # --- data -----------------------------------------------------------------------------

    def wall_ms(self) -> int:
        """The broker's wall clock (listeners stamp a produce request's received time)."""
        return self._clock.wall_ms()

    def produce(
        self, partitions: Sequence[PartitionRecords], acks: Acks
    ) -> list[PartitionProduced]:
        """Append and answer per ``acks``, blocking this thread for ``acks=all``."""
        with self._operation():
            appends = self._produce.append(partitions)
        return self.complete_blocking(appends, acks)

    def append(self, partitions: Sequence[PartitionRecords]) -> list[PartitionAppend]:
        """Step 1 of a produce (streams pipeline it with ``complete``)."""
        with self._operation():
            return self._produce.append(partitions)

    def append_inline(self, partitions: Sequence[PartitionRecords]) -> list[PartitionAppend]:
        """Step 1 on the caller's thread (an event loop) for the leading partitions that
        can be appended without blocking; the caller appends the rest with ``append``
        (``ProducePath.append_inline``). The gate is entered directly, not through
        ``_operation``'s context manager: this runs once a small produce, on the loop."""
        gate = self._gate
        if not gate.try_enter():
            raise ShuttingDownError("the broker is shutting down")
        try:
            return self._produce.append_inline(partitions)
        finally:
            gate.leave()

    def complete(self, appends: Sequence[PartitionAppend], acks: Acks, deliver: Deliver) -> None:
        """Step 2 of a produce: ``deliver`` gets the answers once durable per ``acks``.

        Never blocks: ``acks=all`` parks a delayed produce that the group fsync completes
        (``deliver`` then runs on the fsync thread; it must not block either).
        """
        self._produce.complete(appends, acks, deliver)

    def complete_blocking(
        self, appends: Sequence[PartitionAppend], acks: Acks
    ) -> list[PartitionProduced]:
        """``complete``, blocking this thread until answered (``produce``, tests)."""
        return self._produce.complete_blocking(appends, acks)

    def start_fetch(
        self, spec: FetchSpec, *, wake: Callable[[], None], wait_cap_ms: int | None = None
    ) -> PendingFetch:
        """Begin a fetch that ``step_fetch`` drives (``broker.core.fetch`` shows the loop).

        Raises:
            ShuttingDownError: the broker is stopping.
            InvalidRequestError: negative limits.
        """
        with self._operation():
            return self._fetch.begin(spec, wake, wait_cap_ms)

    def step_fetch(self, pending: PendingFetch) -> list[PartitionFetched] | None:
        """Read now: the answers, or None when parked (``pending.wake`` follows).

        A fetch begun before the broker started to stop is answered at once with what it
        last read, never refused: stopping answers waiting long polls.
        """
        if not self._gate.try_enter():
            return self._fetch.step(pending, closing=True)
        try:
            return self._fetch.step(pending)
        finally:
            self._gate.leave()

    def cancel_fetch(self, pending: PendingFetch) -> None:
        """The fetch's call ended: drop its parked operation. Idempotent."""
        self._fetch.cancel(pending)

    def parked_operations(self) -> dict[str, int]:
        """Parked delayed operations by purgatory (for the metrics)."""
        return {
            "fetch": self._fetch_purgatory.parked(),
            "produce": self._produce_purgatory.parked(),
            "delete_records": self._deletions.parked(),
        }

    def list_offsets(self, queries: Sequence[OffsetQuery]) -> list[OffsetAnswer]:
        """``Offsets.list_offsets``."""
        return self.offsets.list_offsets(queries)

    def offsets_for_leader_epochs(self, queries: Sequence[EpochQuery]) -> list[EpochEndAnswer]:
        """``Offsets.offsets_for_leader_epochs``."""
        return self.offsets.offsets_for_leader_epochs(queries)

    def init_producer_id(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """A new idempotent producer id (-1, -1) or a bumped epoch for an existing one."""
        with self._operation():
            return self.producer_ids.init(producer_id, producer_epoch)

    def init_keyed_producer_id(self, key: str) -> tuple[int, int]:
        """The producer id of ``key`` (stable) and its current epoch, not bumped."""
        with self._operation():
            return self.producer_ids.init_keyed(key)

    def describe_producers(
        self, partitions: Sequence[tuple[str, int]], producer_id: int | None
    ) -> list[PartitionProducers]:
        """``Offsets.describe_producers``."""
        return self.offsets.describe_producers(partitions, producer_id)

    def delete_records(
        self, requests: Sequence[RecordsToDelete], timeout_ms: int
    ) -> list[RecordsDeleted]:
        """``Offsets.delete_records`` (DeleteRecords, KIP-107), blocking until answered."""
        return self.offsets.delete_records(requests, timeout_ms)

    def start_delete_records(
        self, requests: Sequence[RecordsToDelete], timeout_ms: int, deliver: DeletionAnswer
    ) -> None:
        """``Offsets.start_delete_records``: ``deliver`` gets the answers (must not block)."""
        self.offsets.start_delete_records(requests, timeout_ms, deliver)

    # --- client quotas (broker.core.quotas) ------------------------------------------------

    def alter_client_quotas(
        self,
        client_id: str,
        set_values: Mapping[str, float],
        delete: Sequence[str],
        *,
        user: str | None = None,
    ) -> None:
        """Set and remove quotas of a client id, a user, or a user with a client id
        (``<default>`` in either place: all without their own; ``broker.core.quotas``).

        Raises:
            InvalidRequestError: an unknown quota name, a value that is not positive, or
                neither a user nor a client id.
        """
        if not client_id and not user:
            raise InvalidRequestError("a quota needs a client id, a user, or both")
        entity = QuotaEntity(user or None, client_id or None)
        with self._operation():
            self.quotas.alter(entity, set_values, list(delete))

    def describe_client_quotas(
        self,
        client_id: str | None,
        *,
        user: str | None = None,
        include_users: bool = False,
    ) -> dict[QuotaEntity, dict[str, float]]:
        """The quotas set, by entity: those of ``client_id`` and ``user`` when given;
        entities with a user part only with ``include_users``."""
        with self._operation():
            return self.quotas.describe_entities(
                user=user, client_id=client_id, users=include_users or user is not None
            )

    # --- metrics ----------------------------------------------------------------------------

    def _group_lag_gauges(self) -> list[GroupLagGauges]:
        return [
            GroupLagGauges(g.group_id, g.tp.topic, g.tp.partition, g.committed_offset, g.lag)
            for g in self._groups.lag()
        ]

    def _group_members(self) -> list[tuple[str, int]]:
        return [(g.group_id, g.members) for g in self._groups.list_groups()]

    def _partition_gauges(self) -> list[PartitionGauges]:
        return [
            PartitionGauges(
                plog.topic,
                plog.partition,
                plog.log_start_offset,
                plog.log_end_offset,
                plog.high_watermark,
                plog.size_bytes,
                plog.segment_count,
            )
            for plog in self._logs.logs()
        ]
