"""``AdminClient``: topics, offsets and consumer groups of a broker.

::

    admin = AdminClient("127.0.0.1:7410")
    admin.create_topic("events", partitions=3, config={"retention.ms": "604800000"})
    admin.list_topics(); admin.describe_topic("events"); admin.delete_topic("events")
    admin.create_partitions("events", 6)     # grow to 6 partitions in total
    admin.list_offsets({TopicPartition("events", 0): "latest"})

Every call is one unary RPC with a deadline (``timeout_ms``, default
``request_timeout_ms``): a broker that is down gives ``BrokerUnavailableError`` when it
passes; the broker's refusals come back as their ``TidelogError`` classes
(``TopicAlreadyExistsError``, ``InvalidConfigError``, ``UnknownTopicOrPartitionError``...).
Protobuf types stop here: answers are the frozen dataclasses of ``client.types``.

In a cluster (``client.routing``) topic creation, deletion, growth, elections and
reassignments go to the controller (as Kafka's clients send them; any broker would
forward them there, ``broker.cluster.forwarding``), a topic's config changes to any
broker (as Kafka's clients send them; it forwards them), a broker's configs to that
broker, offsets to each
partition's leader, and group calls (``describe_group``, ``list_group_offsets``,
``alter_group_offsets``, ``reset_group_offsets``, ``delete_group``, ``delete_offsets``)
to the group's
coordinator (found with ``FindCoordinator``, followed when it moves), with lag and reset
targets read from the partitions' leaders (``client.group_admin``). ``list_groups`` and
the client quota calls go to every live broker. An older broker without groups answers
``InvalidRequestError``. Changing a group's offsets is refused while it has members
(``GroupNotEmptyError``): stop its consumers first. Deleting some of them
(``delete_offsets``) is refused only for topics a live member subscribes to
(``GroupSubscribedToTopicError``).

The group calls are written in ``client.admin_groups`` and the ACL, SCRAM user and quota
calls in ``client.admin_security``, mixed into ``AdminClient``: import everything from
here.

Thread-safe (the connections are); ``close`` when done.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Literal, TypeVar

from tidelog.client.admin_groups import GroupAdminCalls
from tidelog.client.admin_security import SecurityAdminCalls
from tidelog.client.admin_transactions import TransactionAdminCalls
from tidelog.client.cluster import BrokerNode
from tidelog.client.config import DEFAULT_BOOTSTRAP, ISOLATION_LEVELS, AdminConfig, resolve_config
from tidelog.client.connection import Connection, ConnectionFactory, ProducerState
from tidelog.client.grpc_connection import grpc_connections
from tidelog.client.offsets import list_offsets
from tidelog.client.routing import ClusterConnections
from tidelog.client.security import ClientSecurity
from tidelog.client.share_admin import ShareGroupAdminCalls
from tidelog.client.types import (
    AlterConfigOp,
    ConfigEntry,
    ConfigResource,
    GroupDescription,
    GroupMember,
    GroupPartitionLag,
    GroupSummary,
    LogDirDescription,
    OffsetAndTimestamp,
    PartitionDescription,
    PartitionReassignment,
    TopicDescription,
    TopicPartition,
    TopicSummary,
)
from tidelog.storage.errors import (
    LeaderNotAvailableError,
    NotLeaderOrFollowerError,
    TidelogError,
    UnknownTopicOrPartitionError,
)

__all__ = [
    "AdminClient",
    "BrokerNode",
    "ClusterDescription",
    "GroupDescription",
    "GroupMember",
    "GroupPartitionLag",
    "GroupSummary",
    "OffsetSpec",
    "ProducerState",
]

OffsetSpec = Literal["earliest", "latest", "max_timestamp"] | int
"""What ``list_offsets`` looks for: the log start, the log end, the largest timestamp, or
a timestamp (ms)."""

_SPECIAL_OFFSETS = {"earliest": -2, "latest": -1, "max_timestamp": -3}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    """``AdminClient.describe_cluster``: the brokers by id and the controller (-1: none)."""

    cluster_id: str
    controller_id: int
    brokers: tuple[BrokerNode, ...]


class AdminClient(GroupAdminCalls, ShareGroupAdminCalls, SecurityAdminCalls, TransactionAdminCalls):
    """Administers a broker or a cluster. Thread-safe.

    The cluster, topic, config, reassignment and offset calls are here; the group calls
    come from ``GroupAdminCalls`` (``client.admin_groups``), the ACL, user and quota
    calls from ``SecurityAdminCalls`` (``client.admin_security``), the transaction calls
    from ``TransactionAdminCalls`` (``client.admin_transactions``).

    Args:
        bootstrap_servers: ``HOST:PORT[,HOST:PORT...]``: any live broker of the cluster.
        config: a whole ``AdminConfig`` instead of keyword settings.
        connection_factory: how to reach a broker (default gRPC); tests pass
            ``client.testing.InMemoryCluster.connect``.
        **settings: ``AdminConfig`` fields (``request_timeout_ms``, ``client_id``).
    """

    def __init__(
        self,
        bootstrap_servers: str = DEFAULT_BOOTSTRAP,
        *,
        config: AdminConfig | None = None,
        connection_factory: ConnectionFactory | None = None,
        **settings: object,
    ) -> None:
        config = resolve_config(AdminConfig.from_mapping, bootstrap_servers, config, settings)
        self.config = config
        # Every call is routed through ``_connections``: topic changes to the controller,
        # partition lookups to leaders, group calls to the group's coordinator, group
        # listings and quotas to every live broker.
        self._connections = ClusterConnections(
            config.bootstrap_servers,
            connection_factory
            or grpc_connections(
                client_id=config.client_id,
                request_timeout_ms=config.request_timeout_ms,
                reconnect_backoff_max_ms=config.reconnect_backoff_max_ms,
                security=ClientSecurity.of(config),
            ),
            request_timeout_ms=config.request_timeout_ms,
        )

    # --- the cluster ----------------------------------------------------------------------

    def describe_cluster(self, *, timeout_ms: int | None = None) -> ClusterDescription:
        """The brokers (id, host, port), sorted by id, and the controller's id (-1: none).

        A single node is a one-broker cluster: broker 0, its own controller.
        """
        metadata = self._connections.metadata(timeout_ms=timeout_ms, force=True)
        return ClusterDescription(
            cluster_id=metadata.cluster_id,
            controller_id=metadata.controller_id,
            brokers=tuple(
                BrokerNode(b.id, b.host, b.port, b.rack)
                for b in sorted(metadata.brokers.values(), key=lambda b: b.id)
            ),
        )

    def describe_log_dirs(
        self,
        broker_ids: Iterable[int] | None = None,
        topics: Iterable[str] | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> dict[int, LogDirDescription]:
        """Each broker's log directory (Kafka's DescribeLogDirs; a Tidelog broker has
        one): the file system's size and free space and the partition copies it holds,
        by broker id. ``broker_ids`` None: every live broker; ``topics`` None: every
        topic's copies. ``KafkaStorageError`` for a directory that cannot be read."""
        wanted_brokers = None if broker_ids is None else set(broker_ids)
        partitions: list[TopicPartition] | None = None
        if topics is not None:
            partitions = [
                TopicPartition(name, p.partition)
                for name in dict.fromkeys(topics)
                for p in self.describe_topic(name, timeout_ms=timeout_ms).partitions
            ]

        def ask(connection: Connection, timeout: int) -> LogDirDescription:
            return connection.describe_log_dirs(partitions, timeout_ms=timeout)

        answers = self._connections.run_on_every_broker(
            ask, what="DescribeLogDirs", timeout_ms=timeout_ms
        )
        return {
            broker_id: found
            for broker_id, found in sorted(answers.items())
            if wanted_brokers is None or broker_id in wanted_brokers
        }

    # --- topics ---------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        config: Mapping[str, object] | None = None,
        *,
        replication_factor: int | None = None,
        replica_assignment: Sequence[Sequence[int]] | None = None,
        timeout_ms: int | None = None,
    ) -> TopicDescription:
        """Create a topic; ``partitions`` None takes the broker's ``num.partitions``,
        ``replication_factor`` None its ``default.replication.factor``.

        ``replica_assignment`` places the replicas by hand (Kafka's manual assignment, as
        confluent-kafka's ``NewTopic(replica_assignment=...)``): entry i lists the broker
        ids of partition i, its preferred leader (and first leader) first. The partition
        count and replication factor come from it, so ``partitions`` and
        ``replication_factor`` must be None. The broker refuses, with
        ``InvalidReplicaAssignmentError``, lists of different lengths, a broker named
        twice in a list, or a broker that is not registered (a single node is broker
        0, or its ``broker.id``).

        Sent to the controller (retried there on ``NOT_CONTROLLER`` until the timeout).
        In a cluster it then waits, within the same timeout, until the metadata this
        client routes by shows every partition with a leader (brokers learn a topic by
        their watch, after the controller made it): the next call on the topic from this
        client finds it. Past the timeout it returns anyway (the topic exists).
        Config values may be given as numbers; they travel as text. Raises
        ``TopicAlreadyExistsError``, ``InvalidTopicError``, ``InvalidConfigError``,
        ``InvalidPartitionsError``, ``InvalidReplicationFactorError`` (more replicas than
        brokers: a single node keeps 1), ``InvalidReplicaAssignmentError``; ``ValueError``
        for an empty ``replica_assignment`` or one given with a count or a factor.
        """
        if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
            raise ValueError(f"partitions must be a positive int, got {partitions!r}")
        if replication_factor is not None and (
            not isinstance(replication_factor, int)
            or isinstance(replication_factor, bool)
            or replication_factor < 1
        ):
            raise ValueError(
                f"replication_factor must be a positive int, got {replication_factor!r}"
            )
        lists = _replica_lists(replica_assignment)
        if replica_assignment is not None and (partitions is not None or replication_factor):
            raise ValueError(
                "replica_assignment gives the partition count and the replication factor: "
                "leave partitions and replication_factor None"
            )
        text = _text_config(config)
        left = self._connections.time_left(timeout_ms)
        created = self._on_controller(
            lambda c, t: c.create_topic(
                name,
                partitions or 0,
                replication_factor or 0,
                text,
                replica_assignment=lists,
                timeout_ms=t,
            ),
            f"CreateTopic {name}",
            left(),
        )
        self._await_leaders(name, len(created.partitions), left)
        return created

    def _await_leaders(self, name: str, count: int, left: Callable[[], int]) -> None:
        """Refresh the metadata until it shows ``count`` partitions of ``name``, each with
        a leader, or the time ``left`` is out (then return: the caller's call succeeded).

        First the controller is asked: it made the topic, so a view of its without the
        topic means the caller may not DESCRIBE it (metadata hides it), and no broker's
        view will ever show it: nothing to wait for."""
        try:
            seen = self._on_controller(
                lambda c, t: c.metadata([name], include_internal=True, timeout_ms=t),
                f"Metadata {name}",
                left(),
            )
        except TidelogError:
            return  # not described to this caller (or no answer): do not wait
        if seen.partition_count(name) is None:
            return
        backoff_s = 0.05
        while True:
            try:
                metadata = self._connections.metadata(timeout_ms=left(), force=True)
            except TidelogError:
                return  # no broker answered: the next call will say so itself
            if metadata.partition_count(name) == count and all(
                metadata.leader_for(TopicPartition(name, p)) is not None for p in range(count)
            ):
                return
            if left() <= int(backoff_s * 1000):
                return
            time.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 0.5)

    def delete_topic(self, name: str, *, timeout_ms: int | None = None) -> None:
        """Delete a topic and its data. ``UnknownTopicOrPartitionError`` if there is none."""
        self._on_controller(
            lambda c, t: c.delete_topic(name, timeout_ms=t), f"DeleteTopic {name}", timeout_ms
        )

    def elect_preferred_leaders(self, *, timeout_ms: int | None = None) -> int:
        """Move every partition's leadership back to its preferred replica (the first of
        its replicas) where that replica is alive and in sync; returns how many moved
        (0 on a single node). Sent to the controller."""
        results = self.elect_leaders("preferred", timeout_ms=timeout_ms)
        return sum(1 for error in results.values() if error is None)

    def elect_leaders(
        self,
        election_type: Literal["preferred", "unclean"] = "preferred",
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, TidelogError | None]:
        """Kafka's ElectLeaders (KIP-460), sent to the controller: ``"preferred"`` makes
        each partition's first replica its leader where it is alive and in sync;
        ``"unclean"`` makes any live replica the leader of a partition that has none,
        even one missing acknowledged records, whatever ``unclean.leader.election.enable``
        says. Per partition None (elected) or the reason it was not:
        ``ElectionNotNeededError``, ``PreferredLeaderNotAvailableError``,
        ``EligibleLeadersNotAvailableError``, ``UnknownTopicOrPartitionError``.
        ``partitions`` None: every partition, and only those that needed an election
        are answered."""
        if election_type not in ("preferred", "unclean"):
            raise ValueError(
                f"election_type must be 'preferred' or 'unclean', got {election_type!r}"
            )
        wanted = None if partitions is None else sorted(set(partitions))
        unclean = election_type == "unclean"
        return self._on_controller(
            lambda c, t: c.elect_leaders(unclean, wanted, timeout_ms=t), "ElectLeaders", timeout_ms
        )

    # --- reassignment --------------------------------------------------------------------

    def alter_partition_reassignments(
        self,
        targets: Mapping[TopicPartition, Sequence[int] | None],
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, TidelogError | None]:
        """Kafka's AlterPartitionReassignments (KIP-455), sent to the controller: move each
        partition to its target replicas (the first becomes the preferred leader), or
        (None) cancel its reassignment. Per partition None (started or cancelled: the move
        itself completes in the background, ``list_partition_reassignments`` shows it
        until then) or why not: ``InvalidReplicaAssignmentError`` (empty, a broker twice,
        a broker not live), ``NoReassignmentInProgressError``,
        ``UnknownTopicOrPartitionError``."""
        wanted: dict[TopicPartition, Sequence[int] | None] = {}
        for tp, target in targets.items():
            if target is not None and not all(
                isinstance(r, int) and not isinstance(r, bool) for r in target
            ):
                raise TypeError(f"{tp}: replicas must be broker ids (int), got {target!r}")
            wanted[tp] = None if target is None else tuple(target)
        return self._on_controller(
            lambda c, t: c.alter_partition_reassignments(wanted, timeout_ms=t),
            "AlterPartitionReassignments",
            timeout_ms,
        )

    def list_partition_reassignments(
        self,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, PartitionReassignment]:
        """Kafka's ListPartitionReassignments, sent to the controller: the partitions (of
        ``partitions``; None: all) being reassigned, with their replicas (the union of
        the old and target ones), adding and removing replicas."""
        wanted = None if partitions is None else sorted(set(partitions))
        return self._on_controller(
            lambda c, t: c.list_partition_reassignments(wanted, timeout_ms=t),
            "ListPartitionReassignments",
            timeout_ms,
        )

    def list_topics(
        self, *, include_internal: bool = False, timeout_ms: int | None = None
    ) -> list[TopicSummary]:
        """Every topic with its partition count, sorted by name."""

        topics = self._connections.run(
            self._connections.route_any(),
            lambda connection, timeout: connection.list_topics(
                include_internal=include_internal, timeout_ms=timeout
            ),
            what="ListTopics",
            timeout_ms=timeout_ms,
        )
        return sorted(topics, key=lambda t: t.name)

    def describe_topic(self, name: str, *, timeout_ms: int | None = None) -> TopicDescription:
        """Partitions (log start and end offsets, size; leader, replicas, ISR, leader
        epoch) and every effective config.

        A broker knows the offsets and size only of the partitions it leads: each
        partition's row comes from its leader (one ``DescribeTopic`` per leading broker,
        routed as ``list_offsets`` is: a leader that died or moved is followed to the
        broker leading the partition now). A partition without a leader (offline) shows
        -1 for its offsets, size and segments.
        """
        left = self._connections.time_left(timeout_ms)
        answered: list[str] = []  # the brokers asked, the one that answered last

        def describe(connection: Connection, timeout: int) -> TopicDescription:
            answered.append(connection.address)
            return connection.describe_topic(name, timeout_ms=timeout)

        try:
            description = self._connections.run(
                self._connections.route_any(),
                describe,
                what=f"DescribeTopic {name}",
                timeout_ms=left(),
            )
        except UnknownTopicOrPartitionError:
            # A broker learns a topic by its watch, after the controller made it: one
            # that does not know it yet may be behind (a topic created a moment ago,
            # CI). The controller's view decides.
            description = self._confirm_on_controller(describe, answered, name, left())
        rows = {p.partition: p for p in description.partitions}

        def offline(tp: TopicPartition) -> PartitionDescription:
            """The row of a partition no live broker leads: offsets, size and segments
            unknown (-1), as the describing broker's row said otherwise."""
            return replace(
                rows[tp.partition],
                leader=-1,
                log_start_offset=-1,
                log_end_offset=-1,
                high_watermark=-1,
                size_bytes=-1,
                segments=-1,
            )

        metadata = self._connections.metadata(timeout_ms=left())
        elsewhere: dict[TopicPartition, int] = {}
        for p in description.partitions:
            if p.leader < 0:
                rows[p.partition] = offline(TopicPartition(name, p.partition))
                continue
            node = metadata.brokers.get(p.leader)
            if node is None or self._connections.address_of(node) != answered[-1]:
                elsewhere[TopicPartition(name, p.partition)] = p.partition

        def from_leader(
            connection: Connection, batch: dict[TopicPartition, int], timeout: int
        ) -> dict[TopicPartition, PartitionDescription | TidelogError]:
            """The rows of ``batch`` this broker leads, as it says; the others are refused
            as ``NOT_LEADER_OR_FOLLOWER`` (asked again after a metadata refresh). A leader
            that does not know the topic yet (a broker found it, so this one's view is
            behind: a topic just created) is asked again too (CI)."""
            try:
                found = {p.partition: p for p in describe(connection, timeout).partitions}
            except UnknownTopicOrPartitionError as exc:
                behind = LeaderNotAvailableError(
                    f"{name}: the broker at {connection.address} does not know it yet ({exc})"
                )
                return dict.fromkeys(batch, behind)
            current = self._connections.metadata(timeout_ms=timeout)
            out: dict[TopicPartition, PartitionDescription | TidelogError] = {}
            for tp, partition in batch.items():
                row = found.get(partition)
                node = None if row is None else current.brokers.get(row.leader)
                if row is None:
                    out[tp] = UnknownTopicOrPartitionError(f"{tp}: no such partition")
                elif node is None or self._connections.address_of(node) != connection.address:
                    out[tp] = NotLeaderOrFollowerError(
                        f"{tp}: the broker at {connection.address} does not lead it"
                    )
                else:
                    out[tp] = row
            return out

        if elsewhere:
            # A leader that died since the describing broker answered: asked again until
            # the metadata names its successor, or no live leader (offline: -1 at once).
            led = self._connections.run_per_leader(
                elsewhere,
                from_leader,
                what=f"DescribeTopic {name}",
                timeout_ms=left(),
                known=True,
                offline=offline,
            )
            for tp, row in led.items():
                rows[tp.partition] = row
        return replace(description, partitions=tuple(rows[p] for p in sorted(rows)))

    def alter_topic_config(
        self,
        name: str,
        config: Mapping[str, object] | None = None,
        delete: Iterable[str] = (),
        *,
        timeout_ms: int | None = None,
    ) -> TopicDescription:
        """Set ``config`` keys and return ``delete`` keys to the broker's defaults."""
        text = _text_config(config)
        keys = list(delete)
        return self._on_controller(
            lambda c, t: c.alter_topic_config(name, text, keys, timeout_ms=t),
            f"AlterTopicConfig {name}",
            timeout_ms,
        )

    def describe_configs(
        self,
        resource: ConfigResource,
        keys: Iterable[str] | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> dict[str, ConfigEntry]:
        """Every config key of a topic, a broker or a group (``ConfigResource.topic(name)``,
        ``ConfigResource.broker(id)``, ``ConfigResource.broker()`` for the cluster-wide
        dynamic defaults, ``ConfigResource.group(group_id)``), or only ``keys``, by name:
        effective value, where it comes from (``source``) and every synonym, most specific
        first (``docs/configs.md``).

        A broker's configs are asked of that broker; a group's of its coordinator; a
        topic's of any broker.
        """
        wanted = list(keys or ())
        return {
            e.name: e
            for e in self._connections.run(
                self._config_route(resource),
                lambda c, t: c.describe_configs(resource, wanted, timeout_ms=t),
                what=f"DescribeConfigs {resource.type} {resource.name!r}",
                timeout_ms=timeout_ms,
            )
        }

    def incremental_alter_configs(
        self,
        resource: ConfigResource,
        changes: Iterable[AlterConfigOp],
        *,
        validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> None:
        """Change a topic's, a broker's or a group's dynamic configs, key by key (Kafka's
        IncrementalAlterConfigs): ``AlterConfigOp("retention.ms", "set", "60000")``,
        ``AlterConfigOp("retention.ms", "delete")``, ``AlterConfigOp("cleanup.policy",
        "append", "compact")``. All or nothing per call; ``validate_only`` checks without
        changing. A broker accepts only the keys it can apply live (``docs/configs.md``);
        others raise ``InvalidConfigError``. A group takes ``set`` and ``delete`` of its
        ``share.*`` configs and ``errors.deadletterqueue.topic.name``
        (``docs/share-groups.md``); anything else raises ``InvalidConfigError``.
        """
        ops = list(changes)
        self._connections.run(
            self._config_route(resource),
            lambda c, t: c.incremental_alter_configs(
                resource, ops, validate_only=validate_only, timeout_ms=t
            ),
            what=f"IncrementalAlterConfigs {resource.type} {resource.name!r}",
            timeout_ms=timeout_ms,
        )

    def _config_route(self, resource: ConfigResource) -> Callable[[int], Connection]:
        if resource.type == "broker" and resource.name:
            broker_id = int(resource.name)
            return lambda t: self._connections.broker(broker_id, t)
        if resource.type == "group":
            # Kept with the group's records, at its coordinator (FindCoordinator).
            return self._connections.route_coordinator(resource.name)
        # A topic's config change goes to any broker, as Kafka's clients send it: one that
        # is not the controller forwards it (broker.cluster.forwarding).
        return self._connections.route_any()

    def create_partitions(
        self,
        topic: str,
        total_count: int,
        *,
        replica_assignment: Sequence[Sequence[int]] | None = None,
        validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> int:
        """Grow ``topic`` to ``total_count`` partitions in total; returns the new count.

        Partitions are only ever added: existing ones keep their records and offsets,
        the new ones start empty. Keys then hash over more partitions, so records of one
        key written before and after may sit in different partitions (as in Kafka).
        Producers and consumers pick the new partitions up at their next metadata
        refresh (``metadata_max_age_ms``); consumer groups rebalance at their next
        heartbeat. ``validate_only`` checks the request and changes nothing.

        ``replica_assignment`` places the new partitions by hand (as confluent-kafka's
        ``NewPartitions(replica_assignment=...)``): one broker-id list per *new*
        partition, in order, each as long as the topic's replication factor, the
        preferred leader first; ``InvalidReplicaAssignmentError`` otherwise (another
        number of lists, another length, a broker twice or not registered).

        Raises ``ValueError`` for a count below 1 or an empty ``replica_assignment``;
        ``UnknownTopicOrPartitionError`` for no such topic; ``InvalidPartitionsError``
        when ``total_count`` is not larger than the current count or above the broker's
        limit; ``InvalidRequestError`` for an internal topic (``__consumer_offsets``).
        """
        if not isinstance(total_count, int) or isinstance(total_count, bool) or total_count < 1:
            raise ValueError(f"total_count must be a positive int, got {total_count!r}")
        lists = _replica_lists(replica_assignment)
        return self._on_controller(
            lambda c, t: c.create_partitions(
                topic,
                total_count,
                validate_only=validate_only,
                replica_assignment=lists,
                timeout_ms=t,
            ),
            f"CreatePartitions {topic}",
            timeout_ms,
        )

    def _confirm_on_controller(
        self,
        describe: Callable[[Connection, int], TopicDescription],
        answered: list[str],
        name: str,
        timeout_ms: int,
    ) -> TopicDescription:
        """``describe`` asked again of the controller after another broker said the
        topic is unknown; re-raises when that broker was the controller (or there is
        none)."""
        metadata = self._connections.metadata(timeout_ms=timeout_ms)
        node = metadata.controller
        if node is None or self._connections.address_of(node) in answered:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        return self._on_controller(describe, f"DescribeTopic {name}", timeout_ms)

    def _on_controller(
        self, call: Callable[[Connection, int], T], what: str, timeout_ms: int | None
    ) -> T:
        """``call`` on the controller, following it on ``NOT_CONTROLLER``."""
        return self._connections.run(
            self._connections.route_controller(), call, what=what, timeout_ms=timeout_ms
        )

    # --- offsets --------------------------------------------------------------------------

    def list_offsets(
        self,
        queries: Mapping[TopicPartition, OffsetSpec],
        *,
        timeout_ms: int | None = None,
        isolation_level: str = "read_uncommitted",
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition: the log start (``"earliest"``), the log end (``"latest"``), the
        record with the largest timestamp (``"max_timestamp"``, the first of several that
        share it; KIP-734), or the first offset whose timestamp is at or after an int
        timestamp in ms.

        ``isolation_level`` (Kafka's ``ListOffsetsOptions``): ``"read_committed"`` makes
        ``"latest"`` the last stable offset instead of the high watermark.

        For earliest/latest the timestamp is -1. None where no record is that recent (or,
        for max_timestamp, where the partition holds no record).
        """
        queries_ms: dict[TopicPartition, int] = {}
        for tp, spec in queries.items():
            if isinstance(spec, str):
                if spec not in _SPECIAL_OFFSETS:
                    raise ValueError(
                        "offset spec must be 'earliest', 'latest', 'max_timestamp' or ms, "
                        f"got {spec!r}"
                    )
                timestamp = _SPECIAL_OFFSETS[spec]
            elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
                timestamp = spec
            else:
                raise ValueError(
                    f"offset spec must be 'earliest', 'latest', 'max_timestamp' or ms, got {spec!r}"
                )
            queries_ms[tp] = timestamp
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(
                f"isolation_level must be 'read_uncommitted' or 'read_committed', "
                f"got {isolation_level!r}"
            )
        answers = list_offsets(
            self._connections,
            queries_ms,
            timeout_ms,
            isolation_level=ISOLATION_LEVELS[isolation_level],
        )
        return {
            tp: None if offset < 0 else OffsetAndTimestamp(offset, timestamp)
            for tp, (offset, timestamp) in answers.items()
        }

    def delete_records(
        self, offsets: Mapping[TopicPartition, int], *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """Delete every record below an offset, per partition (Kafka's DeleteRecords,
        KIP-107): each partition's log start offset moves there on every in-sync
        replica, reads below it answer ``OffsetOutOfRangeError``, ``list_offsets``
        earliest answers it, and the segments wholly below it are removed by the next
        retention pass. ``-1`` stands for the high watermark (everything readable now).

        Returns each partition's low watermark (its replicas' smallest log start; the
        offset asked for, or the current log start where that is already higher).

        Raises ``ValueError`` for an offset below -1, ``TypeError`` for one that is not an
        int; then a partition's error (``OffsetOutOfRangeError`` for an offset above the
        high watermark, ``UnknownTopicOrPartitionError``, ``KafkaTimeoutError`` when a
        follower did not follow within ``timeout_ms``, whose leader moved all the same)
        or the call's (``TopicAuthorizationFailedError``: DELETE on the topic is needed).
        """
        for tp, offset in offsets.items():
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise TypeError(f"{tp}: the offset must be an int, got {offset!r}")
            if offset < -1:
                raise ValueError(
                    f"{tp}: the offset must be >= 0, or -1 for the high watermark; got {offset}"
                )
        if not offsets:
            return {}
        return self._connections.run_per_leader(
            dict(offsets),
            lambda c, batch, t: c.delete_records(batch, timeout_ms=t),
            what="DeleteRecords",
            timeout_ms=timeout_ms,
        )

    def describe_producers(
        self,
        partitions: Iterable[TopicPartition],
        *,
        producer_id: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, list[ProducerState]]:
        """What each partition's leader remembers of its idempotent producers (Kafka's
        DescribeProducers, KIP-664), or of ``producer_id`` only.

        Raises a partition's error (``UnknownTopicOrPartitionError``, ...) or the call's.
        """
        wanted = dict.fromkeys(sorted(set(partitions)), None)
        if not wanted:
            return {}
        return self._connections.run_per_leader(
            wanted,
            lambda c, batch, t: c.describe_producers(batch, producer_id, timeout_ms=t),
            what="DescribeProducers",
            timeout_ms=timeout_ms,
        )

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection. Idempotent."""
        self._connections.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _replica_lists(assignment: Sequence[Sequence[int]] | None) -> list[list[int]]:
    """A manual replica assignment as lists of ints (``[]``: none); ``ValueError`` for an
    empty one or a broker id that is not an int (the broker checks the rest)."""
    if assignment is None:
        return []
    lists = [list(replicas) for replicas in assignment]
    if not lists:
        raise ValueError("replica_assignment needs a list per partition (None: no assignment)")
    for replicas in lists:
        if any(not isinstance(b, int) or isinstance(b, bool) for b in replicas):
            raise ValueError(f"broker ids must be ints, got {replicas!r}")
    return lists


def _text_config(config: Mapping[str, object] | None) -> dict[str, str]:
    if not config:
        return {}
    out = {}
    for key, value in config.items():
        if not isinstance(key, str):
            raise TypeError(f"config keys must be str, got {key!r}")
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        else:
            out[key] = str(value)
    return out
