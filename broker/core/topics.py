"""Topics: create, delete, describe, configure and grow them; Kafka's Metadata and
FindCoordinator answers (``BrokerCore`` delegates here).

On a single node the local ``LogManager`` is the truth and is changed here. In cluster
mode topic changes go to the controller (``Membership.topic_admin``, through the node):
the local logs follow when this broker's view of the cluster shows the change
(``apply_cluster_topics``, called by the metadata watcher). Leadership and placement are
the membership's ``placement`` (``broker.core.placement``).

Internal topics (``__consumer_offsets``) cannot be deleted: the committed offsets live
there; nor grown (``LogManager.create_partitions`` refuses): a group's offsets live in
partition ``crc32(group) % count``. Thread-safe; every call runs inside the core's
shutdown gate (``broker.core.gate``).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidelog.broker.config import BrokerConfig
from tidelog.broker.core.config_keys import check_replication_policy
from tidelog.broker.core.errors import partition_error
from tidelog.broker.core.gate import OperationGate
from tidelog.broker.core.membership import Membership
from tidelog.broker.core.metrics import BrokerMetrics
from tidelog.broker.core.placement import (
    BrokerEndpoint,
    ClusterView,
    Growth,
    NewTopic,
    PartitionPlacement,
)
from tidelog.broker.core.replica_assignment import check_growth_assignment, check_topic_assignment
from tidelog.broker.groups.manager import GroupManager
from tidelog.broker.groups.offset_records import partition_for
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.broker.transactions.txn_log import TRANSACTION_STATE_TOPIC
from tidelog.storage.errors import (
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    LeaderNotAvailableError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.files import validate_topic_name
from tidelog.storage.log_manager import LogManager, TopicMetadata

__all__ = [
    "LogDirPartition",
    "LogDirView",
    "MetadataTopic",
    "PartitionCountResult",
    "PartitionView",
    "TopicRequest",
    "TopicView",
    "Topics",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicRequest:
    """One topic of a CreateTopics request, as ``Topics.create_topic`` takes it."""

    name: str
    partitions: int | None
    config: Mapping[str, str]
    replication_factor: int | None = None
    assignment: Sequence[tuple[int, Sequence[int]]] | None = None


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
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicView:
    """A topic as ``DescribeTopic`` shows it: every effective config, defaults included."""

    name: str
    internal: bool
    config: Mapping[str, str]
    partitions: Sequence[PartitionView]


@dataclass(frozen=True, slots=True)
class LogDirPartition:
    """One partition's copy in a log directory (Kafka's DescribeLogDirs): its size on
    disk and how far its log end is behind the high watermark (0 when not behind)."""

    topic: str
    partition: int
    size_bytes: int
    offset_lag: int


@dataclass(frozen=True, slots=True)
class LogDirView:
    """This broker's log directory (it has one) as Kafka's DescribeLogDirs shows it: the
    file system's size and free space, and the partitions asked for that are here."""

    path: str
    total_bytes: int
    usable_bytes: int
    partitions: Sequence[LogDirPartition]
    error_code: str = ""
    error_message: str = ""


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
class PartitionCountResult:
    """One topic's answer to ``create_partitions``: its count now (-1), or an error."""

    name: str
    partitions: int = -1
    error_code: str = ""
    error_message: str = ""


class Topics:
    """The topic operations of one broker. Thread-safe."""

    def __init__(
        self,
        config: BrokerConfig,
        logs: LogManager,
        membership: Membership,
        groups: GroupManager,
        metrics: BrokerMetrics,
        gate: OperationGate,
    ) -> None:
        self._config = config
        self._logs = logs
        self._membership = membership
        self._groups = groups
        self._metrics = metrics
        self._gate = gate

    def create_topic(
        self,
        name: str,
        partitions: int | None,
        config: Mapping[str, str],
        *,
        replication_factor: int | None = None,
        assignment: Sequence[tuple[int, Sequence[int]]] | None = None,
    ) -> TopicView:
        """Create a topic (``partitions`` None or 0: ``num.partitions``; replication
        factor None: ``default.replication.factor``).

        ``assignment``: a manual replica assignment, (partition, replicas) pairs with the
        preferred leader first (``broker.core.replica_assignment`` has the rules; with it
        ``partitions`` and ``replication_factor`` must be None, Kafka's -1). On a single
        node only this broker's id may be named; in a cluster the controller writes the
        lists as given (each partition led by its first replica).

        Raises ``InvalidReplicationFactorError`` for a factor a single node cannot keep
        (more than 1), ``PolicyViolationError`` for a ``min.insync.replicas`` above the
        factor, ``InvalidReplicaAssignmentError`` / ``InvalidRequestError`` for an
        assignment Kafka would refuse, and in cluster mode ``NotControllerError`` on
        another broker than the controller (the client retries there).
        """
        count, factor, placed = self._plan_new_topic(
            name, partitions, config, replication_factor, assignment, validate_only=False
        )
        admin = self._membership.topic_admin
        if admin is None:
            with self._gate.operation():
                meta = self._logs.create_topic(name, count, config)
                return self.view(meta)
        admin.create_topic(name, count, factor, config, assignment=placed)
        return self.describe_topic(name)

    def create_topics(
        self, requests: Sequence[TopicRequest], timeout_ms: int
    ) -> dict[str, TopicView | Exception | None]:
        """CreateTopics of many topics: per topic its view, its error, or None (created
        in a cluster with ``timeout_ms <= 0``: not waited for, as Kafka's).

        Each topic is checked as ``create_topic`` does; in a cluster the valid ones go to
        the controller as one batch and are answered once every partition is led in
        this broker's view, or at ``timeout_ms`` with ``KafkaTimeoutError``
        (``REQUEST_TIMED_OUT``) for those still pending (``broker.cluster.topic_batches``).
        A failure of the whole batch (``NotControllerError``) is raised.
        """
        out: dict[str, TopicView | Exception | None] = {}
        admin = self._membership.topic_admin
        specs: list[NewTopic] = []
        for r in requests:
            try:
                if admin is None:
                    out[r.name] = self.create_topic(
                        r.name,
                        r.partitions,
                        r.config,
                        replication_factor=r.replication_factor,
                        assignment=r.assignment,
                    )
                    continue
                count, factor, placed = self._plan_new_topic(
                    r.name,
                    r.partitions,
                    r.config,
                    r.replication_factor,
                    r.assignment,
                    validate_only=False,
                )
            except Exception as exc:  # the topic's own answer (ValueError: INVALID_REQUEST)
                out[r.name] = exc
                continue
            manual = None if placed is None else sorted(placed.items())
            specs.append(NewTopic(r.name, count, factor, dict(r.config), manual))
        if admin is None or not specs:
            return out
        for name, error in admin.create_topics(specs, timeout_ms).items():
            if error is not None or timeout_ms <= 0:
                out[name] = error
                continue
            try:
                out[name] = self.describe_topic(name)
            except Exception as exc:
                out[name] = exc
        return out

    def validate_new_topic(
        self,
        name: str,
        partitions: int | None,
        config: Mapping[str, str],
        *,
        replication_factor: int | None = None,
        assignment: Sequence[tuple[int, Sequence[int]]] | None = None,
    ) -> tuple[int, int]:
        """CreateTopics' ``validate_only``: every check ``create_topic`` makes, nothing
        created; returns the (partition count, replication factor) it would have. In a
        cluster an assignment's brokers are checked against this broker's view (the
        controller is not asked). Raises as ``create_topic`` (but ``NotControllerError``)."""
        count, factor, _ = self._plan_new_topic(
            name, partitions, config, replication_factor, assignment, validate_only=True
        )
        return count, factor

    def _plan_new_topic(
        self,
        name: str,
        partitions: int | None,
        config: Mapping[str, str],
        replication_factor: int | None,
        assignment: Sequence[tuple[int, Sequence[int]]] | None,
        *,
        validate_only: bool,
    ) -> tuple[int, int, dict[int, tuple[int, ...]] | None]:
        """(count, factor, manual placement or None) of a new topic, every check made."""
        admin = self._membership.topic_admin
        placed: dict[int, tuple[int, ...]] | None = None
        if assignment:
            # A single node knows its one broker; a broker of a cluster leaves the
            # registration check to the controller (its view may lag a broker that just
            # joined), but for validate_only, where its view is all there is.
            registered: set[int] | None = None
            if admin is None or validate_only:
                registered = {b.broker_id for b in self._membership.placement.cluster().brokers}
            placed = check_topic_assignment(
                assignment,
                registered,
                partitions=partitions,
                replication_factor=replication_factor,
            )
            count, factor = len(placed), len(placed[0])
        else:
            factor = replication_factor or self._config.default_replication_factor
            count = partitions or self._config.num_partitions
        if admin is None and factor != 1:
            raise InvalidReplicationFactorError(
                f"replication factor {factor} needs {factor} brokers; this is a single "
                "node (start brokers with zookeeper.connect for a cluster)"
            )
        # A topic's own min.insync.replicas above its factor: POLICY_VIOLATION.
        check_replication_policy(config, factor, name)
        self._logs.validate_new_topic(name, count, config)
        return count, factor, placed

    def elect_leaders(
        self, unclean: bool, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], str]:
        """Kafka's ElectLeaders (KIP-460; the controller runs it,
        ``broker.cluster.controller.Controller.elect_leaders``): per partition "" or
        Kafka's error name. On a single node, where the only replica always leads: every
        named partition of a known topic needs no election (``ELECTION_NOT_NEEDED``), an
        unknown one is ``UNKNOWN_TOPIC_OR_PARTITION``, and "every partition" is nothing.
        ``NotControllerError`` on a cluster broker that is not the controller."""
        admin = self._membership.topic_admin
        if admin is not None:
            return admin.elect_leaders(unclean, partitions)
        counts = {t.name: t.partitions for t in self._logs.topics()}
        return {
            (topic, partition): (
                "ELECTION_NOT_NEEDED"
                if 0 <= partition < counts.get(topic, 0)
                else "UNKNOWN_TOPIC_OR_PARTITION"
            )
            for topic, partition in partitions or ()
        }

    def alter_partition_reassignments(
        self, targets: Mapping[tuple[str, int], Sequence[int] | None]
    ) -> dict[tuple[str, int], str]:
        """Kafka's AlterPartitionReassignments (KIP-455; the controller runs it,
        ``broker.cluster.controller.Controller.alter_partition_reassignments``): per
        partition "" or Kafka's error name. On a single node, the only target a partition
        can have is this broker, which it has already: "" for it, otherwise
        ``INVALID_REPLICA_ASSIGNMENT``; a cancel is ``NO_REASSIGNMENT_IN_PROGRESS``.
        ``NotControllerError`` on a cluster broker that is not the controller."""
        admin = self._membership.topic_admin
        if admin is not None:
            return admin.alter_partition_reassignments(targets)
        counts = {t.name: t.partitions for t in self._logs.topics()}
        out: dict[tuple[str, int], str] = {}
        for (topic, partition), target in targets.items():
            if not 0 <= partition < counts.get(topic, 0):
                out[(topic, partition)] = "UNKNOWN_TOPIC_OR_PARTITION"
            elif target is None:
                out[(topic, partition)] = "NO_REASSIGNMENT_IN_PROGRESS"
            elif tuple(target) == (self._config.broker_id,):
                out[(topic, partition)] = ""
            else:
                out[(topic, partition)] = "INVALID_REPLICA_ASSIGNMENT"
        return out

    def list_partition_reassignments(
        self, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """The partitions being reassigned (``partitions`` None: all), each with its
        replicas, adding and removing replicas; none on a single node."""
        admin = self._membership.topic_admin
        if admin is not None:
            return admin.list_partition_reassignments(partitions)
        return {}

    def elect_preferred_leaders(self) -> int:
        """Move leaderships back to the preferred replicas (cluster mode; the controller
        runs it); returns how many moved. ``InvalidRequestError`` on a single node, where
        the only replica always leads; ``NotControllerError`` on another broker."""
        if self._membership.topic_admin is None:
            raise InvalidRequestError("a single node has no other replica to elect")
        return sum(1 for code in self.elect_leaders(False, None).values() if not code)

    def controlled_shutdown(self, broker_id: int) -> int:
        """The controller's part of a broker's controlled shutdown (cluster mode)."""
        admin = self._membership.topic_admin
        if admin is None:
            raise InvalidRequestError("a single node has no controller to hand leadership to")
        return admin.controlled_shutdown(broker_id)

    def run_forwarded(self, call: str, arguments: Mapping[str, Any]) -> Any:
        """Run a topic admin call another broker forwarded to this one as controller
        (``broker.cluster.forwarding``). ``InvalidRequestError`` on a single node."""
        admin = self._membership.topic_admin
        if admin is None:
            raise InvalidRequestError("a single node has no controller to forward to")
        return admin.run_forwarded(call, arguments)

    def apply_cluster_topics(self, topics: Mapping[str, tuple[int, Mapping[str, str]]]) -> None:
        """Cluster mode: make the local logs match the controller's topics.

        Creates missing topics, grows and reconfigures changed ones, deletes local topics
        the cluster no longer has (internal ones are left alone). Called by the metadata
        watcher after every change; errors are logged per topic, never raised. A burst
        of new (or deleted) topics is one ``LogManager.create_topics`` (or
        ``delete_topics``): ``topics.json`` written once, the logs opened in parallel
        (issue #34: one by one, 250 topics took this broker 25 s).
        """
        with self._gate.operation():
            local = {t.name: t for t in self._logs.topics()}
            missing = [(n, c, cfg) for n, (c, cfg) in topics.items() if n not in local]
            if missing:
                for name, outcome in self._logs.create_topics(missing).items():
                    if isinstance(outcome, Exception):
                        log.error("cannot apply the cluster's topic %s locally: %s", name, outcome)
            for name, (count, config) in topics.items():
                if name not in local:
                    continue
                try:
                    self._apply_cluster_topic(name, count, config, local[name])
                except Exception:
                    log.exception("cannot apply the cluster's topic %s locally", name)
            gone = [n for n, meta in local.items() if n not in topics and not meta.internal]
            if gone:
                try:
                    self._logs.delete_topics(gone)
                except Exception:
                    log.exception("cannot delete local topics %s", gone)
                for name in gone:
                    self._groups.forget_topic(name)
                    self._metrics.forget_topic(name)

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
        admin = self._membership.topic_admin
        with self._gate.operation():
            if self._logs.topic(name).internal:
                raise InvalidRequestError(f"{name} is an internal topic and cannot be deleted")
            if admin is None:
                self._logs.delete_topic(name)
                self._groups.forget_topic(name)
        if admin is not None:
            admin.delete_topic(name)  # the local logs go when this broker's view shows it
        self._metrics.forget_topic(name)

    def delete_topics(self, names: Sequence[str], timeout_ms: int) -> dict[str, Exception | None]:
        """DeleteTopics of many topics: per topic None or its error. In a cluster the
        topics go to the controller as one batch, answered once gone from this broker's
        view or at ``timeout_ms`` with ``KafkaTimeoutError`` for those still pending."""
        admin = self._membership.topic_admin
        out: dict[str, Exception | None] = {}
        batch: list[str] = []
        for name in names:
            try:
                if admin is None:
                    self.delete_topic(name)
                    out[name] = None
                    continue
                with self._gate.operation():
                    if self._logs.topic(name).internal:
                        raise InvalidRequestError(
                            f"{name} is an internal topic and cannot be deleted"
                        )
            except Exception as exc:
                out[name] = exc
                continue
            batch.append(name)
        if admin is None or not batch:
            return out
        for name, error in admin.delete_topics(batch, timeout_ms).items():
            out[name] = error
            if error is None:
                self._metrics.forget_topic(name)
        return out

    def list_topics(self, include_internal: bool) -> list[TopicMetadata]:
        """Every topic, sorted by name; internal ones only if asked."""
        with self._gate.operation():
            return [t for t in self._logs.topics() if include_internal or not t.internal]

    def describe_topic(self, name: str) -> TopicView:
        """A topic with its partitions' offsets and sizes and its effective config.

        Raises ``InvalidTopicError`` for a name no topic can have (Kafka's
        ``INVALID_TOPIC_EXCEPTION``, not "unknown": no retry can help),
        ``UnknownTopicOrPartitionError`` for no such topic, ``LeaderNotAvailableError``
        while a broker is joining its cluster.
        """
        validate_topic_name(name)
        with self._gate.operation():
            self._membership.placement.check_joined()
            return self.view(self._logs.topic(name))

    def topic_metadata(self, name: str) -> TopicMetadata:
        """A topic's partition count, overrides and effective config; raises as
        ``describe_topic``."""
        validate_topic_name(name)
        with self._gate.operation():
            self._membership.placement.check_joined()
            return self._logs.topic(name)

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
        with self._gate.operation():
            known = self._membership.placement.topics()
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
                placed = [self._membership.placement.partition(name, p) for p in range(count)]
                answers.append(MetadataTopic(name, "", tuple(placed), name in internal))
            return self._membership.placement.cluster(), answers

    def find_coordinator(self, key: str, *, transaction: bool = False) -> BrokerEndpoint:
        """The broker coordinating group ``key`` (the leader of its ``__consumer_offsets``
        partition), or with ``transaction`` the transactional id ``key`` (the leader of its
        ``__transaction_state`` partition).

        Raises:
            LeaderNotAvailableError: that partition (or the topic) has no leader right now.
        """
        internal = TRANSACTION_STATE_TOPIC if transaction else OFFSETS_TOPIC
        what = "transactional id" if transaction else "group"
        with self._gate.operation():
            known = self._membership.placement.topics()
            if known is None:
                try:
                    count = self._logs.topic(internal).partitions
                except UnknownTopicOrPartitionError:
                    count = 0
            else:
                count = known.get(internal, 0)
            if count < 1:
                raise LeaderNotAvailableError(f"{internal} does not exist yet")
            partition = partition_for(key, count)
            leader = self._membership.placement.partition(internal, partition).leader
            for endpoint in self._membership.placement.cluster().brokers:
                if endpoint.broker_id == leader:
                    return endpoint
            raise LeaderNotAvailableError(
                f"the coordinator of {what} {key!r} ({internal}-{partition}) has no "
                "leader right now"
            )

    def alter_topic_config(
        self, name: str, set_keys: Mapping[str, str], delete_keys: Iterable[str]
    ) -> TopicView:
        """Set and reset topic config keys; answers the new description."""
        admin = self._membership.topic_admin
        if admin is None:
            with self._gate.operation():
                return self.view(self._logs.alter_topic_config(name, set_keys, delete_keys))
        meta = self._logs.topic(name)
        overrides = {k: v for k, v in meta.overrides.items() if k not in set(delete_keys)}
        overrides.update(set_keys)
        self._logs.validate_topic_config(overrides)
        admin.alter_topic_config(name, overrides)
        return self.describe_topic(name)

    def create_partitions(
        self,
        counts: Sequence[tuple[str, int]],
        *,
        validate_only: bool = False,
        assignments: Mapping[str, Sequence[Sequence[int]]] | None = None,
        timeout_ms: int = 30_000,
    ) -> list[PartitionCountResult]:
        """Grow each named topic to its new total count (Kafka's CreatePartitions).

        In a cluster the topics go to the controller as one batch, answered once every
        partition is led in this broker's view, or at ``timeout_ms`` with
        ``REQUEST_TIMED_OUT`` for those still pending (``broker.cluster.topic_batches``).

        Answered per topic, in request order; a topic named twice is ``INVALID_REQUEST``
        each time (as Kafka). The errors are ``LogManager.create_partitions``'s, and for a
        topic in ``assignments`` (one replica list per new partition, preferred leader
        first) ``INVALID_REPLICA_ASSIGNMENT`` as Kafka's (``broker.core.replica_assignment``:
        one list per new partition, each of the topic's replication factor, no broker
        twice, every broker registered; checked by the controller in a cluster, and
        against this broker's view with ``validate_only``). Producers and consumers see
        the new partitions at their next metadata refresh; the group coordinator bumps
        the epoch of every group subscribed to a grown topic at the group's next
        heartbeat (``docs/groups.md``), so the new partitions get owners.
        """
        wanted = assignments or {}
        admin = self._membership.topic_admin
        with self._gate.operation():
            seen: dict[str, int] = {}
            for name, _ in counts:
                seen[name] = seen.get(name, 0) + 1
            answers: dict[str, PartitionCountResult] = {}
            growths: list[Growth] = []
            for name, count in counts:
                try:
                    if seen[name] > 1:
                        raise InvalidRequestError(f"topic {name!r} is named more than once")
                    meta = self._logs.create_partitions(name, count, validate_only=True)
                    before = self._logs.topic(name).partitions
                    lists = wanted.get(name)
                    if lists is not None:
                        self._check_growth(name, lists, before, count, validate_only)
                    if not validate_only and admin is not None:
                        manual = None if lists is None else [tuple(r) for r in lists]
                        growths.append(Growth(name, count, manual))
                        continue
                    if not validate_only:
                        meta = self._logs.create_partitions(name, count)
                except Exception as exc:
                    code, message = partition_error(exc)
                    answers[name] = PartitionCountResult(
                        name, error_code=code, error_message=message
                    )
                    continue
                answers[name] = PartitionCountResult(name, meta.partitions)
        if growths:
            assert admin is not None
            # One controller batch for every topic (issue #34), as create_topics: not
            # counted by the gate (a close must not wait on the controller's answer).
            try:
                grown = admin.create_partitions_many(growths, timeout_ms)
            except Exception as exc:
                grown = {g.name: exc for g in growths}
            for name, error in grown.items():
                if error is None:
                    answers[name] = PartitionCountResult(name, self._logs.topic(name).partitions)
                else:
                    code, message = partition_error(error)
                    answers[name] = PartitionCountResult(
                        name, error_code=code, error_message=message
                    )
        return [answers[name] for name, _ in counts]

    def _check_growth(
        self,
        name: str,
        lists: Sequence[Sequence[int]],
        current: int,
        total: int,
        validate_only: bool,
    ) -> None:
        """A growth's manual assignment, checked here: in full on a single node (this
        broker is the only one) and for validate_only (this broker's view), its shape
        only otherwise (the controller checks the brokers against ZooKeeper's)."""
        placement = self._membership.placement
        single = self._membership.topic_admin is None
        registered = (
            {b.broker_id for b in placement.cluster().brokers} if single or validate_only else None
        )
        factor = 1 if single else len(placement.partition(name, 0).replicas)
        check_growth_assignment(
            lists, registered, current=current, total=total, replication_factor=factor
        )

    def describe_log_dirs(self, partitions: Sequence[tuple[str, int]] | None) -> LogDirView:
        """Kafka's DescribeLogDirs on this broker: its one data directory, with the
        partitions asked for (None: every partition here, internal ones included) that
        have a copy here; others are left out, as Kafka does. A file system that cannot
        be read answers ``KAFKA_STORAGE_ERROR`` in the view, not an exception."""
        directory = self._logs.data_dir
        with self._gate.operation():
            try:
                usage = shutil.disk_usage(directory)
            except OSError as exc:
                return LogDirView(
                    str(directory), -1, -1, (), "KAFKA_STORAGE_ERROR", f"{directory}: {exc}"
                )
            counts = {t.name: t.partitions for t in self._logs.topics()}
            wanted = (
                [(name, p) for name, count in sorted(counts.items()) for p in range(count)]
                if partitions is None
                else [(t, p) for t, p in dict.fromkeys(partitions) if 0 <= p < counts.get(t, 0)]
            )
            found = []
            for topic, partition in wanted:
                plog = self._logs.get_log(topic, partition)
                found.append(
                    LogDirPartition(
                        topic,
                        partition,
                        plog.size_bytes,
                        max(plog.high_watermark - plog.log_end_offset, 0),
                    )
                )
            return LogDirView(str(directory), usage.total, usage.free, found)

    def view(self, meta: TopicMetadata) -> TopicView:
        """``meta`` as ``DescribeTopic`` shows it: offsets, sizes, placement, config."""
        partitions = []
        for p in range(meta.partitions):
            plog = self._logs.get_log(meta.name, p)
            placed = self._membership.placement.partition(meta.name, p)
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
                    placed.elr,
                    placed.last_known_elr,
                )
            )
        return TopicView(meta.name, meta.internal, meta.config.to_mapping(), partitions)
