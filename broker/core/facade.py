"""The broker's domain: one method per RPC, over plain Python values; no gRPC here.

``BrokerCore`` owns the log manager, the produce and fetch paths, the two purgatories of
delayed operations (``broker.core.delayed``: parked fetches, ``acks=all`` produces waiting for
the group fsync), the producer-id allocator, the group coordinator (``broker.groups``)
and the metrics. It is listener-neutral: plain values in, plain values out, errors as
``TidelogError`` classes with stable codes that each listener renders once
(``broker.core.errors``). The gRPC listener (``broker.grpc.service``) converts each request into a
call of one method here and the result back into protobuf; the Kafka listener and replica
fetchers will be more callers of the same methods.

Nothing here waits on a client's behalf. A fetch that must wait is parked
(``start_fetch`` / ``step_fetch``, see ``broker.core.fetch``) and an ``acks=all`` produce is
answered through a callback once durable (``complete``): the listener chooses how to
wait without a thread (an asyncio future) or with one (``fetch``, ``produce``).

Internal topics (``__consumer_offsets``) cannot be deleted: the committed offsets live
there; nor grown (``LogManager.create_partitions`` refuses): a group's offsets live in
partition ``crc32(group) % count``.

Shutdown: ``close`` refuses new operations (``ShuttingDownError``, which the servicer
answers as ``UNAVAILABLE``), answers every parked fetch, waits for the operations in
flight to finish (so that no append races the closing of the logs), lets the group fsync
answer the produces it was asked for, stops the group expiry timer, then closes the log
manager, which flushes, writes checkpoints and the clean-shutdown
marker. Group membership is not persisted: after a restart members get
``UNKNOWN_MEMBER_ID`` and rejoin; committed offsets are in the log.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from broker.config import BrokerConfig
from broker.core.acl import parse_principals
from broker.core.acl_store import Acls, LocalAclStore
from broker.core.auth import Authenticator
from broker.core.delayed import Purgatory
from broker.core.errors import ShuttingDownError, partition_error
from broker.core.fetch import (
    FetchPath,
    FetchSpec,
    PartitionFetched,
    PartitionFetchSpec,
    PendingFetch,
)
from broker.core.group_fsync import GroupFsync
from broker.core.membership import Membership, TopicAdmin
from broker.core.meta_properties import ensure_meta_properties
from broker.core.metrics import BrokerMetrics, GroupLagGauges, PartitionGauges
from broker.core.placement import (
    BrokerEndpoint,
    ClusterView,
    LocalPlacement,
    PartitionPlacement,
    Placement,
)
from broker.core.produce import (
    Acks,
    Deliver,
    PartitionAppend,
    PartitionProduced,
    PartitionRecords,
    ProducePath,
    ReplicationHooks,
)
from broker.core.producer_ids import ProducerIdManager, ProducerIdSource
from broker.core.quotas import QuotaEntity, QuotaManager, QuotaWindow
from broker.core.users import FileUserStore
from broker.groups.coordinator import HeartbeatAnswer, HeartbeatRequest
from broker.groups.manager import (
    GroupDescription,
    GroupListing,
    GroupManager,
    OffsetCommitEntry,
    OffsetResult,
    ResetTarget,
    Selection,
)
from broker.groups.offset_records import partition_for
from broker.groups.offset_store import OFFSETS_TOPIC
from storage.clock import Clock, SystemClock
from storage.errors import (
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    LeaderNotAvailableError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    UnknownTopicOrPartitionError,
)
from storage.files import validate_topic_name
from storage.log_manager import LogManager, TopicMetadata
from storage.partition_log import PartitionLog
from storage.producer_state import ProducerSummary

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "BrokerCore",
    "EpochEndAnswer",
    "EpochQuery",
    "MetadataTopic",
    "OffsetAnswer",
    "OffsetQuery",
    "PartitionCountResult",
    "PartitionProducers",
    "PartitionView",
    "TopicAdmin",
    "TopicView",
]

log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition as ``DescribeTopic`` shows it."""

    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    segments: int
    leader: int = 0
    leader_epoch: int = 0
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicView:
    """A topic as ``DescribeTopic`` shows it: every effective config, defaults included."""

    name: str
    internal: bool
    config: Mapping[str, str]
    partitions: Sequence[PartitionView]


@dataclass(frozen=True, slots=True)
class MetadataTopic:
    """One topic of a Metadata answer: its partitions' placements, in partition order."""

    name: str
    error_code: str = ""
    partitions: tuple[PartitionPlacement, ...] = ()
    internal: bool = False


def _missing_topic_code(name: str) -> str:
    """The error of a topic asked for by name that is not there: unknown (it may yet be
    created, so clients retry), or invalid (it never can be, so they fail at once)."""
    try:
        validate_topic_name(name)
    except InvalidTopicError:
        return InvalidTopicError.code
    return UnknownTopicOrPartitionError.code


@dataclass(frozen=True, slots=True)
class OffsetQuery:
    """``ListOffsets`` for one partition: -2 earliest, -1 latest, else a timestamp."""

    topic: str
    partition: int
    timestamp_ms: int
    current_leader_epoch: int = -1  # the client's view; -1: not checked


@dataclass(frozen=True, slots=True)
class OffsetAnswer:
    """The found offset (-1 if none) and its record's timestamp (-1 for earliest/latest)."""

    topic: str
    partition: int
    offset: int = -1
    timestamp_ms: int = -1
    error_code: str = ""
    error_message: str = ""


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
class PartitionCountResult:
    """One topic's answer to ``create_partitions``: its count now (-1), or an error."""

    name: str
    partitions: int = -1
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


class Replication(ReplicationHooks, Protocol):
    """The replica manager as the core uses it (``broker.cluster.replicas``; cluster mode)."""

    def on_follower_fetch(
        self, replica_id: int, spec: PartitionFetchSpec, plog: PartitionLog
    ) -> tuple[int, int] | None: ...

    def check_epoch(self, topic: str, partition: int, current_leader_epoch: int) -> None: ...

    def wait_replicated(self, plog: PartitionLog, end_offset: int, timeout_ms: int) -> None: ...


class BrokerCore:
    """Everything a broker does, minus the network. Thread-safe.

    Build with ``open``; ``close`` once.
    """

    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        logs: LogManager,
        membership: Membership,
        metrics: BrokerMetrics,
        groups: GroupManager,
        fetch_purgatory: Purgatory[tuple[str, int]],
        produce_purgatory: Purgatory[tuple[str, int]],
        group_fsync: GroupFsync,
        quotas: QuotaManager,
        authenticator: Authenticator | None,
        append_hooks: list[Callable[[str, int], None]] | None = None,
        acls: Acls | None = None,
    ) -> None:
        self.config = config
        # Placement, topic administration and producer ids: the broker's role, which
        # changes (joining -> joined) inside this one object (broker.core.membership).
        self.membership = membership
        self.quotas = quotas
        self.metrics = metrics
        self._clock = clock
        self._logs = logs
        # Authentication (broker.core.auth): every listener asks it for each call's principal.
        # None (a core built without ``open``): every call is served unauthenticated.
        self.authenticator = authenticator
        self._groups = groups
        self._fetch_purgatory = fetch_purgatory
        self._produce_purgatory = produce_purgatory
        self._group_fsync = group_fsync
        self._append_hooks = append_hooks if append_hooks is not None else []
        # Authorization (broker.grpc.authorize): disabled unless authorizer.enabled.
        self.acls = acls or Acls(LocalAclStore.in_memory(), enabled=False)
        self._fetch = FetchPath(
            logs,
            fetch_purgatory,
            metrics,
            clock,
            fetch_max_bytes=config.fetch_max_bytes,
            fetch_max_wait_ms=config.fetch_max_wait_ms,
            check_leader=self._check_leader,
        )
        self._produce = ProducePath(
            logs,
            self._fetch.on_append,
            produce_purgatory,
            group_fsync,
            metrics,
            check_leader=self._check_leader,
            batch_times=config.batch_times_enabled,
            clock=clock,
        )
        self._gate = threading.Condition()
        self._in_flight = 0
        self._closing = False
        self._closed = False
        metrics.add_partition_collector(self._partition_gauges, fetch_purgatory.parked)
        metrics.add_group_collector(self._group_lag_gauges, self._group_members)

    @classmethod
    def open(
        cls,
        config: BrokerConfig,
        clock: Clock | None = None,
        metrics: BrokerMetrics | None = None,
        membership: Membership | None = None,
    ) -> BrokerCore:
        """Open (recovering) the data directory, load the committed offsets and start the
        background work (storage tasks, group session expiry).

        ``membership``: the broker's role (``broker.core.membership``); None: a single node's,
        built here (it leads everything, producer ids from the data directory). A cluster
        broker passes ``Membership.joining`` and the assembly (``broker.assembly``) makes
        it join once the node has the cluster's view.

        Raises:
            StorageError: the data directory is unusable.
            InvalidConfigError: the SCRAM credentials file is unreadable.
        """
        clock = clock or SystemClock()
        logs = LogManager.open(config.data_dir, config.log_manager_config(), clock)
        fetch_purgatory: Purgatory[tuple[str, int]] = Purgatory("fetch", clock)
        produce_purgatory: Purgatory[tuple[str, int]] = Purgatory("produce", clock)

        def produce_durable(topic: str, partition: int) -> None:
            produce_purgatory.check_and_complete((topic, partition))

        # Cluster mode adds the replica manager here (attach_replication): the group
        # coordinator's appends move the offsets partitions' high watermarks too.
        append_hooks: list[Callable[[str, int], None]] = []

        def appended(topic: str, partition: int) -> None:
            fetch_purgatory.check_and_complete((topic, partition))
            for hook in append_hooks:
                hook(topic, partition)

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
                    LocalPlacement(config.broker_id, cluster_id),
                    ProducerIdManager.open(logs.data_dir, clock, config.producer_id_expiration_ms),
                )
            authenticator = Authenticator(config.security, membership.users(users), clock)
            groups = GroupManager.open(
                logs,
                clock,
                config.group_config(),
                on_append=appended,
            )
            logs.start_background()
            groups.start()
            fetch_purgatory.start()
            group_fsync.start()
        except BaseException:
            fetch_purgatory.close()
            group_fsync.close()
            logs.close()
            raise
        return cls(
            config,
            clock,
            logs,
            membership,
            metrics or BrokerMetrics(),
            groups,
            fetch_purgatory,
            produce_purgatory,
            group_fsync,
            quotas,
            authenticator,
            append_hooks,
            acls,
        )

    # --- cluster mode: replication ----------------------------------------------------------

    def attach_replication(self, replicas: Replication) -> None:
        """Cluster mode: route appends, acks and follower reads through the replica
        manager (``broker.cluster.replicas``)."""
        self._produce.replication = replicas
        self._fetch.replica_fetch = replicas.on_follower_fetch
        self._fetch.check_epoch = replicas.check_epoch
        self._append_hooks.append(replicas.after_append)
        self._groups.store.replication = replicas

    def became_leader(self, topic: str, partition: int) -> None:
        """This broker now leads the partition: an offsets partition's groups are loaded
        from its replicated log (their coordinator moved here)."""
        if topic == OFFSETS_TOPIC:
            self._groups.store.reload_partition(partition)

    def replication_progress(self, topic: str, partition: int) -> None:
        """A high watermark or ISR moved, or leadership changed: re-check the produces
        and consumer fetches parked on the partition."""
        self._produce_purgatory.check_and_complete((topic, partition))
        self._fetch_purgatory.check_and_complete((topic, partition))

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

    def _check_coordinator(self, group_id: str, *, confirm: bool = False) -> None:
        """Raise ``NotCoordinatorError`` unless this broker leads the group's offsets
        partition (always true on a single node), ``CoordinatorLoadInProgressError`` while
        it is still loading that partition's groups. ``confirm``: ask ZooKeeper too, not
        only this broker's view (committed offsets must never be read stale: a consumer
        resuming from an old one would commit backwards)."""
        if self.topic_admin is None:
            return
        partition = partition_for(group_id, self._logs.topic(OFFSETS_TOPIC).partitions)
        try:
            if confirm:
                self.placement.confirm_leader(OFFSETS_TOPIC, partition)
            else:
                self.placement.check_leader(OFFSETS_TOPIC, partition)
        except (NotLeaderOrFollowerError, LeaderNotAvailableError) as exc:
            raise NotCoordinatorError(f"group {group_id!r}: {exc}") from None
        # Leading is not enough: the groups must be loaded at this epoch and what was
        # loaded replicated (COORDINATOR_LOAD_IN_PROGRESS until then; offset_store).
        self._groups.store.check_loaded(partition)

    @property
    def logs(self) -> LogManager:
        """The log manager (replica fetchers, tests and benchmarks; not the servicer)."""
        return self._logs

    @property
    def groups(self) -> GroupManager:
        """The group coordinator (for tests; the servicer never uses it)."""
        return self._groups

    # --- the shutdown gate ------------------------------------------------------------

    @contextmanager
    def _operation(self) -> Iterator[None]:
        """Run one operation unless closing; ``close`` waits for those in flight."""
        with self._gate:
            if self._closing:
                raise ShuttingDownError("the broker is shutting down")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._gate:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._gate.notify_all()

    def begin_close(self) -> None:
        """Refuse new operations and answer waiting long polls now. Idempotent."""
        with self._gate:
            self._closing = True
        self._fetch_purgatory.close()

    def close(self, timeout_ms: int = 30_000) -> None:
        """``begin_close``, wait for work in flight, then close the logs. Idempotent.

        Operations still running after ``timeout_ms`` are logged and the logs closed anyway
        (an fsync stuck that long means the disk is gone).
        """
        with self._gate:
            if self._closed:
                return
            self._closed = True
        self.begin_close()
        with self._gate:
            if not self._gate.wait_for(lambda: self._in_flight == 0, timeout_ms / 1000.0):
                log.error("closing with %d operations still in flight", self._in_flight)
        self._group_fsync.close(timeout_ms)
        self._produce_purgatory.close()
        self._groups.close()
        self._logs.close()

    # --- topics ---------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int | None,
        config: Mapping[str, str],
        *,
        replication_factor: int | None = None,
    ) -> TopicView:
        """Create a topic (``partitions`` None or 0: ``num.partitions``; replication
        factor None: ``default.replication.factor``).

        Raises ``InvalidReplicationFactorError`` for a factor a single node cannot keep
        (more than 1), and in cluster mode ``NotControllerError`` on another broker than
        the controller (the client retries there).
        """
        factor = replication_factor or self.config.default_replication_factor
        admin = self.topic_admin
        if admin is None:
            if factor != 1:
                raise InvalidReplicationFactorError(
                    f"replication factor {factor} needs {factor} brokers; this is a single "
                    "node (start brokers with zookeeper.connect for a cluster)"
                )
            with self._operation():
                meta = self._logs.create_topic(name, partitions or None, config)
                return self._view(meta)
        count = partitions or self.config.num_partitions
        self._logs.validate_new_topic(name, count, config)
        admin.create_topic(name, count, factor, config)
        return self.describe_topic(name)

    def elect_preferred_leaders(self) -> int:
        """Move leaderships back to the preferred replicas (cluster mode; the controller
        runs it); returns how many moved. ``InvalidRequestError`` on a single node, where
        the only replica always leads; ``NotControllerError`` on another broker."""
        admin = self.topic_admin
        if admin is None:
            raise InvalidRequestError("a single node has no other replica to elect")
        return admin.elect_preferred_leaders()

    def controlled_shutdown(self, broker_id: int) -> int:
        """The controller's part of a broker's controlled shutdown (cluster mode)."""
        admin = self.topic_admin
        if admin is None:
            raise InvalidRequestError("a single node has no controller to hand leadership to")
        return admin.controlled_shutdown(broker_id)

    def apply_cluster_topics(self, topics: Mapping[str, tuple[int, Mapping[str, str]]]) -> None:
        """Cluster mode: make the local logs match the controller's topics.

        Creates missing topics, grows and reconfigures changed ones, deletes local topics
        the cluster no longer has (internal ones are left alone). Called by the metadata
        watcher after every change; errors are logged per topic, never raised.
        """
        with self._operation():
            local = {t.name: t for t in self._logs.topics()}
            for name, (count, config) in topics.items():
                try:
                    self._apply_cluster_topic(name, count, config, local.get(name))
                except Exception:
                    log.exception("cannot apply the cluster's topic %s locally", name)
            for name, meta in local.items():
                if name not in topics and not meta.internal:
                    try:
                        self._logs.delete_topic(name)
                        self._groups.forget_topic(name)
                    except Exception:
                        log.exception("cannot delete local topic %s", name)
                    self.metrics.forget_topic(name)

    def _apply_cluster_topic(
        self, name: str, count: int, config: Mapping[str, str], meta: TopicMetadata | None
    ) -> None:
        if meta is None:
            self._logs.create_topic(name, count, config)
            return
        if meta.internal:
            return  # created by this broker's group coordinator with the same settings
        if meta.partitions < count:
            self._logs.create_partitions(name, count)
        if dict(meta.overrides) != dict(config):
            removed = [k for k in meta.overrides if k not in config]
            self._logs.alter_topic_config(name, config, removed)

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its data and every group's committed offsets of it.

        Raises:
            InvalidRequestError: an internal topic.
            UnknownTopicOrPartitionError: no such topic.
        """
        admin = self.topic_admin
        with self._operation():
            if self._logs.topic(name).internal:
                raise InvalidRequestError(f"{name} is an internal topic and cannot be deleted")
            if admin is None:
                self._logs.delete_topic(name)
                self._groups.forget_topic(name)
        if admin is not None:
            admin.delete_topic(name)  # the local logs go when this broker's view shows it
        self.metrics.forget_topic(name)

    def list_topics(self, include_internal: bool) -> list[TopicMetadata]:
        """Every topic, sorted by name; internal ones only if asked."""
        with self._operation():
            return [t for t in self._logs.topics() if include_internal or not t.internal]

    def describe_topic(self, name: str) -> TopicView:
        """A topic with its partitions' offsets and sizes and its effective config.

        Raises ``InvalidTopicError`` for a name no topic can have (Kafka's
        ``INVALID_TOPIC_EXCEPTION``, not "unknown": no retry can help),
        ``UnknownTopicOrPartitionError`` for no such topic, ``LeaderNotAvailableError``
        while a broker is joining its cluster.
        """
        validate_topic_name(name)
        with self._operation():
            self.placement.check_joined()
            return self._view(self._logs.topic(name))

    def metadata(
        self, topics: Sequence[str], include_internal: bool
    ) -> tuple[ClusterView, list[MetadataTopic]]:
        """Kafka's Metadata: the cluster and each topic's partition leaders.

        ``topics`` empty: every topic (internal ones only if asked). A topic asked for by
        name that does not exist comes back with ``UNKNOWN_TOPIC_OR_PARTITION``, one whose
        name no topic can have (``storage.files.validate_topic_name``) with
        ``INVALID_TOPIC_EXCEPTION``, as Kafka's: clients fail it at once instead of waiting
        for it to be created. Authorization is the listeners' (it answers first).
        """
        with self._operation():
            known = self.placement.topics()
            if known is None:
                known = {t.name: t.partitions for t in self._logs.topics()}
            internal = {t.name for t in self._logs.topics() if t.internal}
            internal.update(name for name in known if name.startswith("__"))
            names = (
                list(topics)
                if topics
                else [n for n in sorted(known) if include_internal or n not in internal]
            )
            answers = []
            for name in names:
                count = known.get(name)
                if count is None:
                    answers.append(MetadataTopic(name, _missing_topic_code(name)))
                    continue
                placed = [self.placement.partition(name, p) for p in range(count)]
                answers.append(MetadataTopic(name, "", tuple(placed), name in internal))
            return self.placement.cluster(), answers

    def find_coordinator(self, group_id: str) -> BrokerEndpoint:
        """The broker coordinating ``group_id``: the leader of its offsets partition.

        Raises:
            LeaderNotAvailableError: that partition has no leader right now.
        """
        with self._operation():
            known = self.placement.topics()
            if known is None:
                count = self._logs.topic(OFFSETS_TOPIC).partitions
            else:
                count = known.get(OFFSETS_TOPIC, 0)
            if count < 1:
                raise LeaderNotAvailableError(f"{OFFSETS_TOPIC} does not exist yet")
            partition = partition_for(group_id, count)
            leader = self.placement.partition(OFFSETS_TOPIC, partition).leader
            for endpoint in self.placement.cluster().brokers:
                if endpoint.broker_id == leader:
                    return endpoint
            raise LeaderNotAvailableError(
                f"the coordinator of group {group_id!r} ({OFFSETS_TOPIC}-{partition}) has no "
                "leader right now"
            )

    def alter_topic_config(
        self, name: str, set_keys: Mapping[str, str], delete_keys: Iterable[str]
    ) -> TopicView:
        """Set and reset topic config keys; answers the new description."""
        admin = self.topic_admin
        if admin is None:
            with self._operation():
                return self._view(self._logs.alter_topic_config(name, set_keys, delete_keys))
        meta = self._logs.topic(name)
        overrides = {k: v for k, v in meta.overrides.items() if k not in set(delete_keys)}
        overrides.update(set_keys)
        self._logs.validate_topic_config(overrides)
        admin.alter_topic_config(name, overrides)
        return self.describe_topic(name)

    def create_partitions(
        self, counts: Sequence[tuple[str, int]], *, validate_only: bool = False
    ) -> list[PartitionCountResult]:
        """Grow each named topic to its new total count (Kafka's CreatePartitions).

        Answered per topic, in request order; a topic named twice is ``INVALID_REQUEST``
        each time (as Kafka). The errors are ``LogManager.create_partitions``'s. Producers
        and consumers see the new partitions at their next metadata refresh; the group
        coordinator bumps the epoch of every group subscribed to a grown topic at the
        group's next heartbeat (``docs/groups.md``), so the new partitions get owners.
        """
        with self._operation():
            seen: dict[str, int] = {}
            for name, _ in counts:
                seen[name] = seen.get(name, 0) + 1
            answers = []
            for name, count in counts:
                try:
                    if seen[name] > 1:
                        raise InvalidRequestError(f"topic {name!r} is named more than once")
                    meta = self._logs.create_partitions(name, count, validate_only=True)
                    if not validate_only:
                        if self.topic_admin is not None:
                            self.topic_admin.create_partitions(name, count)
                            meta = self._logs.topic(name)
                        else:
                            meta = self._logs.create_partitions(name, count)
                except Exception as exc:
                    code, message = partition_error(exc)
                    answers.append(
                        PartitionCountResult(name, error_code=code, error_message=message)
                    )
                    continue
                answers.append(PartitionCountResult(name, meta.partitions))
            return answers

    def _view(self, meta: TopicMetadata) -> TopicView:
        partitions = []
        for p in range(meta.partitions):
            plog = self._logs.get_log(meta.name, p)
            placed = self.placement.partition(meta.name, p)
            partitions.append(
                PartitionView(
                    p,
                    plog.log_start_offset,
                    plog.log_end_offset,
                    plog.high_watermark,
                    plog.size_bytes,
                    plog.segment_count,
                    placed.leader,
                    placed.leader_epoch,
                    placed.replicas,
                    placed.isr,
                )
            )
        return TopicView(meta.name, meta.internal, meta.config.to_mapping(), partitions)

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
        with self._gate:
            closing = self._closing
            if not closing:
                self._in_flight += 1
        if closing:
            return self._fetch.step(pending, closing=True)
        try:
            return self._fetch.step(pending)
        finally:
            with self._gate:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._gate.notify_all()

    def cancel_fetch(self, pending: PendingFetch) -> None:
        """The fetch's call ended: drop its parked operation. Idempotent."""
        self._fetch.cancel(pending)

    def parked_operations(self) -> dict[str, int]:
        """Parked delayed operations by purgatory (for the metrics)."""
        return {
            "fetch": self._fetch_purgatory.parked(),
            "produce": self._produce_purgatory.parked(),
        }

    def _leader_log(self, topic: str, partition: int, current_leader_epoch: int) -> PartitionLog:
        """The partition's log, here only if this broker leads it and the caller's
        ``current_leader_epoch`` (-1: not checked) is this leader's; raises the routing or
        fencing error otherwise (``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``...)."""
        self.placement.check_leader(topic, partition)
        check = self._fetch.check_epoch
        if check is not None:
            check(topic, partition, current_leader_epoch)
        return self._logs.get_log(topic, partition)

    def list_offsets(self, queries: Sequence[OffsetQuery]) -> list[OffsetAnswer]:
        """Earliest (-2), latest (-1), or first offset with a timestamp >= the one given."""
        with self._operation():
            return [self._list_offset(q) for q in queries]

    def _list_offset(self, query: OffsetQuery) -> OffsetAnswer:
        try:
            plog = self._leader_log(query.topic, query.partition, query.current_leader_epoch)
            if query.timestamp_ms == EARLIEST_TIMESTAMP:
                return OffsetAnswer(query.topic, query.partition, plog.log_start_offset)
            if query.timestamp_ms == LATEST_TIMESTAMP:
                return OffsetAnswer(query.topic, query.partition, plog.high_watermark)
            if query.timestamp_ms < 0:
                raise InvalidRequestError(
                    f"timestamp_ms must be -2 (earliest), -1 (latest) or >= 0, "
                    f"got {query.timestamp_ms}"
                )
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
        return OffsetAnswer(query.topic, query.partition, found[0], found[1])

    def offsets_for_leader_epochs(self, queries: Sequence[EpochQuery]) -> list[EpochEndAnswer]:
        """Kafka's OffsetForLeaderEpoch (KIP-101, KIP-320), as a consumer asks it: per
        partition, on its leader only (``NOT_LEADER_OR_FOLLOWER`` elsewhere), after the
        ``current_leader_epoch`` check (``FENCED_LEADER_EPOCH``/``UNKNOWN_LEADER_EPOCH``),
        ``PartitionLog.end_offset_for_epoch``. The latest epoch ends at the log end
        offset, as in Kafka (a consumer's position never passes the high watermark, so
        the difference cannot make it miss a truncation). Errors are per partition."""
        with self._operation():
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
        """What each partition's idempotence state remembers (Kafka's DescribeProducers).

        Errors (unknown topic or partition) are per partition.
        """
        with self._operation():
            answers = []
            for topic, partition in partitions:
                try:
                    plog = self._logs.get_log(topic, partition)
                    found = tuple(plog.describe_producers(producer_id))
                except Exception as exc:
                    code, message = partition_error(exc)
                    answers.append(
                        PartitionProducers(topic, partition, error_code=code, error_message=message)
                    )
                    continue
                answers.append(PartitionProducers(topic, partition, found))
            return answers

    # --- consumer groups (broker.groups.manager documents each) ---------------------------

    def consumer_group_heartbeat(self, request: HeartbeatRequest) -> HeartbeatAnswer:
        """Join, heartbeat or leave a group; answers epoch, interval and assignment."""
        with self._operation():
            self._check_coordinator(request.group_id)
            return self._groups.heartbeat(request)

    def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        entries: Sequence[OffsetCommitEntry],
    ) -> list[OffsetResult]:
        """Commit offsets as a member, or as an admin of an empty group (no member id)."""
        with self._operation():
            self._check_coordinator(group_id)
            return self._groups.commit_offsets(group_id, member_id, member_epoch, entries)

    def fetch_offsets(self, group_id: str, selection: Selection | None) -> list[OffsetResult]:
        """Committed offsets of a group (-1 where none)."""
        with self._operation():
            self._check_coordinator(group_id, confirm=True)
            return self._groups.fetch_offsets(group_id, selection)

    def list_groups(self) -> list[GroupListing]:
        """Every group with members or committed offsets."""
        with self._operation():
            return self._groups.list_groups()

    def describe_group(self, group_id: str) -> GroupDescription:
        """Members, assignment and per-partition lag of a group."""
        with self._operation():
            self._check_coordinator(group_id)
            return self._groups.describe_group(group_id)

    def reset_group_offsets(
        self, group_id: str, selection: Selection | None, target: ResetTarget
    ) -> list[OffsetResult]:
        """Move an empty group's committed offsets."""
        with self._operation():
            self._check_coordinator(group_id)
            return self._groups.reset_offsets(group_id, selection, target)

    def delete_group(self, group_id: str) -> None:
        """Delete an empty group's committed offsets."""
        with self._operation():
            self._check_coordinator(group_id)
            self._groups.delete_group(group_id)

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
