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

Group calls (``describe_group``, ``reset_group_offsets``, ``delete_group``) go to the
group's coordinator (found with ``FindCoordinator``, followed on ``NOT_COORDINATOR``);
``list_groups`` asks every broker. An older broker without groups answers
``InvalidRequestError``. Changing a group's offsets is refused while it has members
(``GroupNotEmptyError``): stop its consumers first.

Thread-safe (the channel is); ``close`` when done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar

from client.acls import AclBinding, AclFilter
from client.cluster import BrokerNode, parse_bootstrap_list
from client.config import DEFAULT_BOOTSTRAP, AdminConfig, resolve_config
from client.connection import Connection, GrpcConnection, grpc_connections
from client.offsets import list_offsets
from client.routing import ClusterConnections
from client.security import ClientSecurity, salted_credential
from client.transport import Transport
from client.types import (
    OffsetAndTimestamp,
    TopicDescription,
    TopicPartition,
    TopicSummary,
)
from proto.tidelog.v1 import broker_pb2 as pb
from storage.errors import InvalidRequestError, error_for_code

__all__ = [
    "AdminClient",
    "BrokerNode",
    "ClusterDescription",
    "GroupDescription",
    "GroupMember",
    "GroupPartitionLag",
    "GroupSummary",
    "OffsetSpec",
]

OffsetSpec = Literal["earliest", "latest"] | int
"""What ``list_offsets`` looks for: the log start, the log end, or a timestamp (ms)."""

_SPECIAL_OFFSETS = {"earliest": -2, "latest": -1}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    """``AdminClient.describe_cluster``: the brokers by id and the controller (-1: none)."""

    cluster_id: str
    controller_id: int
    brokers: tuple[BrokerNode, ...]


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    state: str
    members: int


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    client_id: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class GroupPartitionLag:
    tp: TopicPartition
    committed_offset: int | None
    log_end_offset: int
    lag: int
    member_id: str


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    group_epoch: int
    members: tuple[GroupMember, ...]
    partitions: tuple[GroupPartitionLag, ...]


class AdminClient:
    """Administers one broker. Thread-safe.

    Args:
        bootstrap_servers: ``HOST:PORT`` of the broker.
        config: a whole ``AdminConfig`` instead of keyword settings.
        **settings: ``AdminConfig`` fields (``request_timeout_ms``, ``client_id``).
    """

    def __init__(
        self,
        bootstrap_servers: str = DEFAULT_BOOTSTRAP,
        *,
        config: AdminConfig | None = None,
        **settings: object,
    ) -> None:
        config = resolve_config(AdminConfig.from_mapping, bootstrap_servers, config, settings)
        self.config = config
        # Group and quota calls still go to the first broker of the bootstrap list; topic
        # calls are routed (controller, leaders) through ``_connections``.
        self._transport = Transport(
            parse_bootstrap_list(config.bootstrap_servers)[0],
            client_id=config.client_id,
            request_timeout_ms=config.request_timeout_ms,
            reconnect_backoff_max_ms=config.reconnect_backoff_max_ms,
            security=ClientSecurity.of(config),
        )
        self._stub = self._transport.stub
        self._connections = ClusterConnections(
            config.bootstrap_servers,
            grpc_connections(
                client_id=config.client_id,
                request_timeout_ms=config.request_timeout_ms,
                reconnect_backoff_max_ms=config.reconnect_backoff_max_ms,
                reuse=self._transport,
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
                BrokerNode(b.id, b.host, b.port)
                for b in sorted(metadata.brokers.values(), key=lambda b: b.id)
            ),
        )

    # --- topics ---------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        config: Mapping[str, object] | None = None,
        *,
        replication_factor: int | None = None,
        timeout_ms: int | None = None,
    ) -> TopicDescription:
        """Create a topic; ``partitions`` None takes the broker's ``num.partitions``,
        ``replication_factor`` None its ``default.replication.factor``.

        Sent to the controller (retried there on ``NOT_CONTROLLER`` until the timeout).
        Config values may be given as numbers; they travel as text. Raises
        ``TopicAlreadyExistsError``, ``InvalidTopicError``, ``InvalidConfigError``,
        ``InvalidPartitionsError``, ``InvalidReplicationFactorError`` (more replicas than
        brokers: a single node keeps 1).
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
        text = _text_config(config)
        return self._on_controller(
            lambda c, t: c.create_topic(
                name, partitions or 0, replication_factor or 0, text, timeout_ms=t
            ),
            f"CreateTopic {name}",
            timeout_ms,
        )

    def delete_topic(self, name: str, *, timeout_ms: int | None = None) -> None:
        """Delete a topic and its data. ``UnknownTopicOrPartitionError`` if there is none."""
        self._on_controller(
            lambda c, t: c.delete_topic(name, timeout_ms=t), f"DeleteTopic {name}", timeout_ms
        )

    def elect_preferred_leaders(self, *, timeout_ms: int | None = None) -> int:
        """Move every partition's leadership back to its preferred replica (the first of
        its replicas) where that replica is alive and in sync; returns how many moved.
        Sent to the controller. ``InvalidRequestError`` on a single node."""
        return self._on_controller(
            lambda c, t: c.elect_preferred_leaders(timeout_ms=t), "ElectLeaders", timeout_ms
        )

    # --- ACLs ----------------------------------------------------------------------------

    def create_acls(self, bindings: Iterable[AclBinding], *, timeout_ms: int | None = None) -> None:
        """Add ACL bindings (kept if already there). Needs ALTER on the cluster; raises
        ``SecurityDisabledError`` on a broker without an authorizer, ``InvalidRequestError``
        for a malformed binding."""
        self._transport.call(
            self._stub.CreateAcls,
            pb.CreateAclsRequest(acls=[b.to_wire() for b in bindings]),
            what="CreateAcls",
            timeout_ms=timeout_ms,
        )

    def describe_acls(
        self, acl_filter: AclFilter | None = None, *, timeout_ms: int | None = None
    ) -> list[AclBinding]:
        """The bindings matching ``acl_filter`` (all without one). Needs DESCRIBE on the
        cluster."""
        answer = self._transport.call(
            self._stub.DescribeAcls,
            (acl_filter or AclFilter()).to_wire(),
            what="DescribeAcls",
            timeout_ms=timeout_ms,
        )
        return [AclBinding.from_wire(b) for b in answer.acls]

    def delete_acls(
        self, acl_filter: AclFilter, *, timeout_ms: int | None = None
    ) -> list[AclBinding]:
        """Remove the bindings matching ``acl_filter``; returns them. Needs ALTER on the
        cluster."""
        answer = self._transport.call(
            self._stub.DeleteAcls, acl_filter.to_wire(), what="DeleteAcls", timeout_ms=timeout_ms
        )
        return [AclBinding.from_wire(b) for b in answer.deleted]

    def list_topics(
        self, *, include_internal: bool = False, timeout_ms: int | None = None
    ) -> list[TopicSummary]:
        """Every topic with its partition count, sorted by name."""
        answer = self._transport.call(
            self._stub.ListTopics,
            pb.ListTopicsRequest(include_internal=include_internal),
            what="ListTopics",
            timeout_ms=timeout_ms,
        )
        return sorted(
            (TopicSummary(t.name, t.partitions, t.internal) for t in answer.topics),
            key=lambda t: t.name,
        )

    def describe_topic(self, name: str, *, timeout_ms: int | None = None) -> TopicDescription:
        """Partitions (log start and end offsets, size; leader, replicas, ISR, leader
        epoch) and every effective config."""
        return self._connections.run(
            self._connections.route_any(),
            lambda c, t: c.describe_topic(name, timeout_ms=t),
            what=f"DescribeTopic {name}",
            timeout_ms=timeout_ms,
        )

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

    def create_partitions(
        self,
        topic: str,
        total_count: int,
        *,
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

        Raises ``ValueError`` for a count below 1; ``UnknownTopicOrPartitionError`` for
        no such topic; ``InvalidPartitionsError`` when ``total_count`` is not larger than
        the current count or above the broker's limit; ``InvalidRequestError`` for an
        internal topic (``__consumer_offsets``).
        """
        if not isinstance(total_count, int) or isinstance(total_count, bool) or total_count < 1:
            raise ValueError(f"total_count must be a positive int, got {total_count!r}")
        return self._on_controller(
            lambda c, t: c.create_partitions(
                topic, total_count, validate_only=validate_only, timeout_ms=t
            ),
            f"CreatePartitions {topic}",
            timeout_ms,
        )

    def _on_controller(
        self, call: Callable[[Connection, int], T], what: str, timeout_ms: int | None
    ) -> T:
        """``call`` on the controller, following it on ``NOT_CONTROLLER``."""
        return self._connections.run(
            self._connections.route_controller(), call, what=what, timeout_ms=timeout_ms
        )

    # --- offsets --------------------------------------------------------------------------

    def list_offsets(
        self, queries: Mapping[TopicPartition, OffsetSpec], *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition: the log start (``"earliest"``), the log end (``"latest"``), or
        the first offset whose timestamp is at or after an int timestamp in ms.

        For earliest/latest the timestamp is -1. None where no record is that recent.
        """
        queries_ms: dict[TopicPartition, int] = {}
        for tp, spec in queries.items():
            if isinstance(spec, str):
                if spec not in _SPECIAL_OFFSETS:
                    raise ValueError(
                        f"offset spec must be 'earliest', 'latest' or ms, got {spec!r}"
                    )
                timestamp = _SPECIAL_OFFSETS[spec]
            elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
                timestamp = spec
            else:
                raise ValueError(f"offset spec must be 'earliest', 'latest' or ms, got {spec!r}")
            queries_ms[tp] = timestamp
        answers = list_offsets(self._connections, queries_ms, timeout_ms)
        return {
            tp: None if offset < 0 else OffsetAndTimestamp(offset, timestamp)
            for tp, (offset, timestamp) in answers.items()
        }

    # --- consumer groups ------------------------------------------------------------------

    def list_groups(self, *, timeout_ms: int | None = None) -> list[GroupSummary]:
        """Every consumer group with its state and member count, sorted by id."""
        # Each broker knows the groups it coordinates: ask every one (a single node: one).
        metadata = self._connections.metadata(timeout_ms=timeout_ms)
        found: dict[str, GroupSummary] = {}
        for node in sorted(metadata.brokers.values(), key=lambda b: b.id):
            transport = _transport_of(
                self._connections.connection_to(self._connections.address_of(node))
            )
            answer = transport.call(
                transport.stub.ListGroups,
                pb.ListGroupsRequest(),
                what="ListGroups",
                timeout_ms=timeout_ms,
            )
            for g in answer.groups:
                found.setdefault(g.group_id, GroupSummary(g.group_id, g.state, g.members))
        return sorted(found.values(), key=lambda g: g.group_id)

    def describe_group(self, group_id: str, *, timeout_ms: int | None = None) -> GroupDescription:
        """Members, assignment, and per-partition committed offset and lag."""
        answer = self._on_coordinator(
            group_id,
            "DescribeGroup",
            pb.DescribeGroupRequest(group_id=group_id),
            timeout_ms,
        )
        return GroupDescription(
            group_id=answer.group_id,
            state=answer.state,
            group_epoch=answer.group_epoch,
            members=tuple(
                GroupMember(
                    member_id=m.member_id,
                    client_id=m.client_id,
                    member_epoch=m.member_epoch,
                    subscribed_topics=tuple(m.subscribed_topic_names),
                    assignment=tuple(
                        TopicPartition(a.topic, p) for a in m.assignment for p in a.partitions
                    ),
                )
                for m in answer.members
            ),
            partitions=tuple(
                GroupPartitionLag(
                    tp=TopicPartition(p.topic, p.partition),
                    committed_offset=None if p.committed_offset < 0 else p.committed_offset,
                    log_end_offset=p.log_end_offset,
                    lag=p.lag,
                    member_id=p.member_id,
                )
                for p in answer.partitions
            ),
        )

    def reset_group_offsets(
        self,
        group_id: str,
        partitions: str | Iterable[TopicPartition] | None = None,
        *,
        to_earliest: bool = False,
        to_latest: bool = False,
        to_offset: int | None = None,
        to_timestamp_ms: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, int]:
        """Move an empty group's committed offsets; returns the new offset per partition.

        Args:
            group_id: the group; it must have no members.
            partitions: a topic name (all of its partitions), some partitions, or None
                (every partition the group has committed).
            to_earliest, to_latest, to_offset, to_timestamp_ms: exactly one target: the
                log start, the log end, an offset (clamped to [log start, log end], as
                Kafka's tool does), or the first offset with a timestamp at or after the
                one given in ms (the log end if there is none).

        Raises ``ValueError`` for no target, several, or a negative one;
        ``GroupNotEmptyError`` while the group has members; a partition's error
        (``UnknownTopicOrPartitionError``) after the other partitions were moved.
        """
        targets = {
            "to_earliest": to_earliest or None,
            "to_latest": to_latest or None,
            "to_offset": to_offset,
            "to_timestamp_ms": to_timestamp_ms,
        }
        chosen = {k: v for k, v in targets.items() if v is not None}
        if len(chosen) != 1:
            raise ValueError(
                "reset_group_offsets takes exactly one of to_earliest, to_latest, to_offset, "
                f"to_timestamp_ms; got {sorted(chosen) or 'none'}"
            )
        for name in ("to_offset", "to_timestamp_ms"):
            value = chosen.get(name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
            ):
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        request = pb.ResetGroupOffsetsRequest(group_id=group_id, partitions=_selection(partitions))
        if to_earliest:
            request.to_earliest = True
        elif to_latest:
            request.to_latest = True
        elif to_offset is not None:
            request.to_offset = to_offset
        else:
            assert to_timestamp_ms is not None
            request.to_timestamp_ms = to_timestamp_ms
        answer = self._on_coordinator(group_id, "ResetGroupOffsets", request, timeout_ms)
        out: dict[TopicPartition, int] = {}
        error: Exception | None = None
        for entry in answer.offsets:
            tp = TopicPartition(entry.topic, entry.partition)
            if entry.error_code:
                error = error or error_for_code(entry.error_code, f"{tp}: {entry.error_message}")
            else:
                out[tp] = entry.offset
        if error is not None:
            raise error
        return dict(sorted(out.items()))

    def delete_group(self, group_id: str, *, timeout_ms: int | None = None) -> None:
        """Delete an empty group and its committed offsets.

        Raises ``GroupNotEmptyError`` while it has members, ``GroupIdNotFoundError`` if
        it has no committed offsets.
        """
        self._on_coordinator(
            group_id, "DeleteGroup", pb.DeleteGroupRequest(group_id=group_id), timeout_ms
        )

    def _on_coordinator(
        self, group_id: str, method: str, request: object, timeout_ms: int | None
    ) -> Any:
        """A group call on the group's coordinator, following it on ``NOT_COORDINATOR``.

        Group administration is not in the ``Connection`` protocol yet: it goes over the
        coordinator's gRPC transport directly.
        """
        what = f"{method} {group_id}"

        def call(connection: Connection, timeout: int) -> Any:
            transport = _transport_of(connection)
            return transport.call(
                getattr(transport.stub, method), request, what=what, timeout_ms=timeout
            )

        return self._connections.run(
            self._connections.route_coordinator(group_id),
            call,
            what=what,
            timeout_ms=timeout_ms,
            group_id=group_id,
        )

    # --- lifecycle ------------------------------------------------------------------------

    # --- client quotas --------------------------------------------------------------------

    def alter_client_quotas(
        self,
        client_id: str,
        quotas: Mapping[str, float] | None = None,
        delete: Iterable[str] = (),
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """Set ``quotas`` and remove the ``delete`` ones of a client id (``"<default>"``:
        every client id without quotas of its own), Kafka's ``AlterClientQuotas``.

        Quotas: ``producer_byte_rate`` and ``consumer_byte_rate`` (bytes per second),
        ``request_percentage`` (percent of one broker storage thread). A client over a
        quota gets its answers late by the throttle time. Raises ``InvalidRequestError``
        for an unknown quota name or a value that is not positive.
        """
        self._transport.call(
            self._stub.AlterClientQuotas,
            pb.AlterClientQuotasRequest(
                client_id=client_id,
                set={k: float(v) for k, v in (quotas or {}).items()},
                delete=list(delete),
            ),
            what=f"AlterClientQuotas {client_id}",
            timeout_ms=timeout_ms,
        )

    def describe_client_quotas(
        self, client_id: str | None = None, *, timeout_ms: int | None = None
    ) -> dict[str, dict[str, float]]:
        """The quotas set, by client id: one client id's, or every one's if None."""
        answer = self._transport.call(
            self._stub.DescribeClientQuotas,
            pb.DescribeClientQuotasRequest(client_id=client_id or ""),
            what="DescribeClientQuotas",
            timeout_ms=timeout_ms,
        )
        return {entry.client_id: dict(entry.quotas) for entry in answer.entries}

    # --- SCRAM users (docs/security.md) --------------------------------------------------

    def upsert_user(
        self,
        name: str,
        password: str,
        mechanism: str = "SCRAM-SHA-256",
        *,
        iterations: int = 4096,
        timeout_ms: int | None = None,
    ) -> None:
        """Create the user or replace its ``mechanism`` credential.

        The password never leaves this process: a random salt and SaltedPassword
        (PBKDF2, ``iterations`` >= 4096) are sent, from which the broker keeps StoredKey
        and ServerKey (Kafka's AlterUserScramCredentials). Raises ``ValueError`` for a
        bad mechanism or iteration count, ``InvalidRequestError`` for a bad name.
        """
        salt, salted = salted_credential(mechanism, password, iterations)
        self._transport.call(
            self._stub.UpsertUser,
            pb.UpsertUserRequest(
                name=name,
                mechanism=mechanism,
                iterations=iterations,
                salt=salt,
                salted_password=salted,
            ),
            what="UpsertUser",
            timeout_ms=timeout_ms,
        )

    def delete_user(
        self, name: str, mechanism: str | None = None, *, timeout_ms: int | None = None
    ) -> None:
        """Delete the user (every mechanism, or only ``mechanism``'s credential).

        Raises ``ResourceNotFoundError`` if there is no such user (or credential).
        """
        self._transport.call(
            self._stub.DeleteUser,
            pb.DeleteUserRequest(name=name, mechanism=mechanism or ""),
            what="DeleteUser",
            timeout_ms=timeout_ms,
        )

    def list_users(self, *, timeout_ms: int | None = None) -> dict[str, dict[str, int]]:
        """Every SCRAM user: name -> {mechanism: iterations}. No credential is shown."""
        answer = self._transport.call(
            self._stub.ListUsers, pb.ListUsersRequest(), what="ListUsers", timeout_ms=timeout_ms
        )
        return {
            user.name: dict(zip(user.mechanisms, user.iterations, strict=False))
            for user in answer.users
        }

    def close(self) -> None:
        """Close the connection. Idempotent."""
        self._connections.close()
        self._transport.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


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


def _selection(partitions: str | Iterable[TopicPartition] | None) -> list[pb.TopicPartitions]:
    """A topic (all partitions: an empty list), partitions by topic, or nothing (all)."""
    if partitions is None:
        return []
    if isinstance(partitions, str):
        return [pb.TopicPartitions(topic=partitions)]
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        if not isinstance(tp, TopicPartition):
            raise TypeError(f"expected TopicPartitions or a topic name, got {tp!r}")
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    if not by_topic:
        raise ValueError("no partitions given (None means every committed partition)")
    return [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]


def _transport_of(connection: Connection) -> Transport:
    """The gRPC transport under ``connection`` (the admin's group calls need it)."""
    if not isinstance(connection, GrpcConnection):
        raise InvalidRequestError("group administration needs a gRPC connection")
    return connection.transport
