"""The neutral request pipeline's vocabulary: operations, their policy, and the steps every
listener takes through it (issue #26).

Each request a listener decodes becomes one *operation* named here, whatever the wire:
gRPC's ``CreateTopic`` and Kafka's CreateTopics (api key 19) are both ``create_topics``.
``OPERATIONS`` is the one policy table, keyed by operation name: which ACL operation each
resource kind the request names needs, and Kafka's exceptions to "every resource
separately" (``broker.core.acl`` has the ACLs themselves). Then each listener calls, in order:

- ``authorize(acls, context, listener, rpc, operation, resources)``: one decision per
  explicit resource; one audit line per refusal (``broker.core.audit``), none per allowed one;
- ``visible(...)``: the entries of a listing the caller may see, filtered silently (a
  listing is not a request to see what it leaves out: no audit line);
- ``record_quota(quotas, context, quota, value)``: the one place a listener meters a
  quota (``broker.core.quotas``);
- ``observe(metrics, listener, operation, outcome, seconds)``: the one place a finished
  request is counted (``tidelog_operations_total`` and its latency histogram, labelled by
  operation, listener and outcome).

The rules follow Kafka's ``AclAuthorizer`` use in ``KafkaApis``:

=========================  =================================================================
operation                  needs
=========================  =================================================================
produce                    WRITE on each topic (refused partitions only are refused); a
                           transactional produce WRITE on its transactional id too
fetch                      READ on each topic; a follower's CLUSTER_ACTION on the cluster
list_offsets               DESCRIBE on each topic
offset_for_leader_epoch    DESCRIBE on each topic; a follower's CLUSTER_ACTION
metadata                   DESCRIBE on each named topic (TOPIC_AUTHORIZATION_FAILED); a
                           listing leaves the others out silently
create_topics              CREATE on the cluster, or else on the topic
delete_topics              DELETE on each topic
create_partitions          ALTER on each topic
describe_configs           DESCRIBE_CONFIGS on each topic, on the cluster (a broker) or on
                           the group (a GROUP resource, as Kafka 4.x)
alter_configs              ALTER_CONFIGS on each topic, on the cluster or on the group
init_producer_id           IDEMPOTENT_WRITE on the cluster, or else WRITE on some topic
init_transactions          WRITE on the transactional id (InitProducerId with one)
add_partitions_to_txn      WRITE on the transactional id and on each topic; the brokers'
                           batched form (v4+, KIP-890) CLUSTER_ACTION on the cluster
add_offsets_to_txn         WRITE on the transactional id, READ on the group
txn_offset_commit          WRITE on the transactional id, READ on the group and each topic
end_txn                    WRITE on the transactional id
describe_transactions      DESCRIBE on each transactional id
list_transactions          each transactional id filtered silently (DESCRIBE)
describe_producers         READ on each topic
describe_log_dirs          DESCRIBE on the cluster
delete_records             DELETE on each topic (DeleteRecords, KIP-107)
find_coordinator           DESCRIBE on the group (a transaction coordinator: on the id)
join_group, sync_group,    READ on the group
heartbeat, leave_group,
consumer_group_heartbeat
offset_commit              READ on the group and on each topic
offset_fetch               DESCRIBE on the group and on each named topic; every committed
                           partition: topics the caller may not describe left out silently
reset_group_offsets        READ on the group and on each topic
list_groups                DESCRIBE on the cluster, or else each group filtered silently
describe_groups            DESCRIBE on each group
delete_groups              DELETE on each group
offset_delete              DELETE on the group, READ on each topic (refused per topic)
share_group_heartbeat      READ on the group and on each subscribed topic (issue #32)
share_fetch,               READ on the group and on each topic named (KIP-932's
share_acknowledge          ShareFetch / ShareAcknowledge)
describe_share_group       DESCRIBE on the group
describe_share_group_      DESCRIBE on the group and on each topic named (refused per
offsets                    topic); every share partition: topics the caller may not
                           describe left out silently
alter_share_group_offsets  READ on the group and on each topic (refused per topic)
delete_share_group_        DELETE on the group, READ on each topic (refused per topic;
offsets                    Kafka's AuthorizerIntegrationTest's table for 90-92)
share_group_state          CLUSTER_ACTION on the cluster (a share partition's leader reads
                           and writes its state at the share coordinator: brokers only, as
                           Kafka's Read/Initialize/WriteShareGroupState; the group's
                           coordinator's ReadShareGroupStateSummary, DeleteShareGroupState
                           and DescribeSharePartition at a leader: issue #32's admin)
describe_client_quotas     DESCRIBE_CONFIGS on the cluster
alter_client_quotas        ALTER_CONFIGS on the cluster
elect_leaders              ALTER on the cluster
alter_partition_           ALTER on the cluster
reassignments
list_partition_            DESCRIBE on the cluster
reassignments
controlled_shutdown        CLUSTER_ACTION on the cluster
envelope                   CLUSTER_ACTION on the cluster (a topic admin call another
                           broker forwarded to the controller, KIP-590; the original
                           caller was authorized there)
write_txn_markers          CLUSTER_ACTION on the cluster (a transaction coordinator's
                           markers to a partition leader: brokers only, as Kafka's)
verify_txn_partition       CLUSTER_ACTION on the cluster (a leader's KIP-890 check with a
                           transactional id's coordinator: brokers only)
describe_acls              DESCRIBE on the cluster
create_acls, delete_acls   ALTER on the cluster
describe_users             DESCRIBE on the cluster (DescribeUserScramCredentials)
alter_users                ALTER on the cluster (AlterUserScramCredentials)
api_versions, sasl_*,      nothing: anyone may ask (authentication has its own audit lines)
authenticate,
describe_cluster
=========================  =================================================================

What a caller may do with one resource, asked for by a Kafka client (KIP-430:
Metadata's and DescribeCluster's ``include_*_authorized_operations``, DescribeGroups'
``include_authorized_operations``), is ``authorized_operations``: each operation Kafka
supports on that kind of resource, decided as a request's would be (an ALLOW of READ also
allows DESCRIBE...), with no audit line (Kafka does not log these either); with the
authorizer off, every one.

Where each listener's requests map: ``KAFKA_API_OPERATIONS`` (api key -> operation) and
``GRPC_METHOD_OPERATIONS`` (method -> operation); a test fails when an advertised API or
a service method has no entry (``tests/broker/parity/test_tables.py``).

Thread-safe: the tables are read-only; the functions hold no state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tidelog.broker.core.acl import CLUSTER_NAME, Operation, ResourceType
from tidelog.broker.core.acl_store import Acls
from tidelog.broker.core.audit import audit
from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.metrics import BrokerMetrics
from tidelog.broker.core.quotas import QuotaManager
from tidelog.storage.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    NotAuthorizedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)

__all__ = [
    "GRPC_METHOD_OPERATIONS",
    "KAFKA_APIS",
    "KAFKA_API_OPERATIONS",
    "KAFKA_API_VARIANTS",
    "OPERATIONS",
    "Policy",
    "Resource",
    "authorize",
    "authorized_operations",
    "cluster",
    "first_refusal",
    "group",
    "observe",
    "record_quota",
    "topic",
    "transactional_id",
    "visible",
]


@dataclass(frozen=True, slots=True)
class Resource:
    """One resource a request names: a topic, a group, or the cluster."""

    kind: ResourceType
    name: str


def topic(name: str) -> Resource:
    return Resource(ResourceType.TOPIC, name)


def group(name: str) -> Resource:
    return Resource(ResourceType.GROUP, name)


def cluster() -> Resource:
    return Resource(ResourceType.CLUSTER, CLUSTER_NAME)


def transactional_id(name: str) -> Resource:
    return Resource(ResourceType.TRANSACTIONAL_ID, name)


@dataclass(frozen=True, slots=True)
class Policy:
    """What one operation needs.

    Attributes:
        needs: per resource kind the request may name, the ACL operation it needs.
        or_on_cluster: a topic resource is also allowed by this ACL operation on the
            cluster (CreateTopics: CREATE on the cluster, or else on the topic). The
            cluster's refusal is not final, so it is never audited.
        or_on_any_topic: a cluster resource is also allowed by this ACL operation on some
            topic (InitProducerId: IDEMPOTENT_WRITE, or else WRITE on some topic).
        lists: the resource kind a listing of this operation filters silently.
        listing_on_cluster: DESCRIBE on the cluster shows every entry of the listing
            (ListGroups).
    """

    needs: Mapping[ResourceType, Operation] = field(default_factory=dict)
    or_on_cluster: Operation | None = None
    or_on_any_topic: Operation | None = None
    lists: ResourceType | None = None
    listing_on_cluster: bool = False


_T, _G, _C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
_X = ResourceType.TRANSACTIONAL_ID
_PUBLIC = Policy()

OPERATIONS: Mapping[str, Policy] = {
    "produce": Policy({_T: Operation.WRITE, _X: Operation.WRITE}),
    "fetch": Policy({_T: Operation.READ, _C: Operation.CLUSTER_ACTION}),
    "list_offsets": Policy({_T: Operation.DESCRIBE}),
    "offset_for_leader_epoch": Policy({_T: Operation.DESCRIBE, _C: Operation.CLUSTER_ACTION}),
    "metadata": Policy({_T: Operation.DESCRIBE}, lists=_T),
    "create_topics": Policy({_T: Operation.CREATE}, or_on_cluster=Operation.CREATE),
    "delete_topics": Policy({_T: Operation.DELETE}),
    "create_partitions": Policy({_T: Operation.ALTER}),
    "describe_configs": Policy(
        {
            _T: Operation.DESCRIBE_CONFIGS,
            _C: Operation.DESCRIBE_CONFIGS,
            _G: Operation.DESCRIBE_CONFIGS,
        }
    ),
    "alter_configs": Policy(
        {_T: Operation.ALTER_CONFIGS, _C: Operation.ALTER_CONFIGS, _G: Operation.ALTER_CONFIGS}
    ),
    "init_producer_id": Policy({_C: Operation.IDEMPOTENT_WRITE}, or_on_any_topic=Operation.WRITE),
    "describe_producers": Policy({_T: Operation.READ}),
    "init_transactions": Policy({_X: Operation.WRITE}),
    "add_partitions_to_txn": Policy(
        {_X: Operation.WRITE, _T: Operation.WRITE, _C: Operation.CLUSTER_ACTION}
    ),
    "add_offsets_to_txn": Policy({_X: Operation.WRITE, _G: Operation.READ}),
    "txn_offset_commit": Policy({_X: Operation.WRITE, _G: Operation.READ, _T: Operation.READ}),
    "end_txn": Policy({_X: Operation.WRITE}),
    "describe_transactions": Policy({_X: Operation.DESCRIBE}),
    "list_transactions": Policy(lists=_X),
    "describe_log_dirs": Policy({_C: Operation.DESCRIBE}),
    "delete_records": Policy({_T: Operation.DELETE}),
    "find_coordinator": Policy({_G: Operation.DESCRIBE, _X: Operation.DESCRIBE}),
    "join_group": Policy({_G: Operation.READ}),
    "sync_group": Policy({_G: Operation.READ}),
    "heartbeat": Policy({_G: Operation.READ}),
    "leave_group": Policy({_G: Operation.READ}),
    "consumer_group_heartbeat": Policy({_G: Operation.READ}),
    "offset_commit": Policy({_G: Operation.READ, _T: Operation.READ}),
    "offset_fetch": Policy({_G: Operation.DESCRIBE, _T: Operation.DESCRIBE}, lists=_T),
    "reset_group_offsets": Policy({_G: Operation.READ, _T: Operation.READ}),
    "list_groups": Policy(lists=_G, listing_on_cluster=True),
    "describe_groups": Policy({_G: Operation.DESCRIBE}),
    "delete_groups": Policy({_G: Operation.DELETE}),
    "offset_delete": Policy({_G: Operation.DELETE, _T: Operation.READ}),
    "share_group_heartbeat": Policy({_G: Operation.READ, _T: Operation.READ}),
    "share_fetch": Policy({_G: Operation.READ, _T: Operation.READ}),
    "share_acknowledge": Policy({_G: Operation.READ, _T: Operation.READ}),
    "describe_share_group": Policy({_G: Operation.DESCRIBE}),
    "describe_share_group_offsets": Policy(
        {_G: Operation.DESCRIBE, _T: Operation.DESCRIBE}, lists=_T
    ),
    "alter_share_group_offsets": Policy({_G: Operation.READ, _T: Operation.READ}),
    "delete_share_group_offsets": Policy({_G: Operation.DELETE, _T: Operation.READ}),
    "share_group_state": Policy({_C: Operation.CLUSTER_ACTION}),
    "describe_client_quotas": Policy({_C: Operation.DESCRIBE_CONFIGS}),
    "alter_client_quotas": Policy({_C: Operation.ALTER_CONFIGS}),
    "elect_leaders": Policy({_C: Operation.ALTER}),
    "alter_partition_reassignments": Policy({_C: Operation.ALTER}),
    "list_partition_reassignments": Policy({_C: Operation.DESCRIBE}),
    "controlled_shutdown": Policy({_C: Operation.CLUSTER_ACTION}),
    "envelope": Policy({_C: Operation.CLUSTER_ACTION}),
    "write_txn_markers": Policy({_C: Operation.CLUSTER_ACTION}),
    "verify_txn_partition": Policy({_C: Operation.CLUSTER_ACTION}),
    "describe_acls": Policy({_C: Operation.DESCRIBE}),
    "create_acls": Policy({_C: Operation.ALTER}),
    "delete_acls": Policy({_C: Operation.ALTER}),
    "describe_users": Policy({_C: Operation.DESCRIBE}),
    "alter_users": Policy({_C: Operation.ALTER}),
    "api_versions": _PUBLIC,
    "sasl_handshake": _PUBLIC,
    "sasl_authenticate": _PUBLIC,
    "authenticate": _PUBLIC,
    "describe_cluster": _PUBLIC,
}

# Every api key the Kafka listener advertises (``broker.kafka.versions.ADVERTISED``): its
# Kafka name (the audit line's ``rpc``) and its operation.
KAFKA_APIS: Mapping[int, tuple[str, str]] = {
    0: ("Produce", "produce"),
    1: ("Fetch", "fetch"),
    2: ("ListOffsets", "list_offsets"),
    3: ("Metadata", "metadata"),
    8: ("OffsetCommit", "offset_commit"),
    9: ("OffsetFetch", "offset_fetch"),
    10: ("FindCoordinator", "find_coordinator"),
    11: ("JoinGroup", "join_group"),
    12: ("Heartbeat", "heartbeat"),
    13: ("LeaveGroup", "leave_group"),
    14: ("SyncGroup", "sync_group"),
    15: ("DescribeGroups", "describe_groups"),
    16: ("ListGroups", "list_groups"),
    17: ("SaslHandshake", "sasl_handshake"),
    18: ("ApiVersions", "api_versions"),
    19: ("CreateTopics", "create_topics"),
    20: ("DeleteTopics", "delete_topics"),
    21: ("DeleteRecords", "delete_records"),
    22: ("InitProducerId", "init_producer_id"),
    23: ("OffsetForLeaderEpoch", "offset_for_leader_epoch"),
    32: ("DescribeConfigs", "describe_configs"),
    33: ("AlterConfigs", "alter_configs"),
    35: ("DescribeLogDirs", "describe_log_dirs"),
    36: ("SaslAuthenticate", "sasl_authenticate"),
    37: ("CreatePartitions", "create_partitions"),
    42: ("DeleteGroups", "delete_groups"),
    43: ("ElectLeaders", "elect_leaders"),
    44: ("IncrementalAlterConfigs", "alter_configs"),
    45: ("AlterPartitionReassignments", "alter_partition_reassignments"),
    46: ("ListPartitionReassignments", "list_partition_reassignments"),
    47: ("OffsetDelete", "offset_delete"),
    50: ("DescribeUserScramCredentials", "describe_users"),
    51: ("AlterUserScramCredentials", "alter_users"),
    60: ("DescribeCluster", "describe_cluster"),
    61: ("DescribeProducers", "describe_producers"),
    68: ("ConsumerGroupHeartbeat", "consumer_group_heartbeat"),
    69: ("ConsumerGroupDescribe", "describe_groups"),
    76: ("ShareGroupHeartbeat", "share_group_heartbeat"),
    77: ("ShareGroupDescribe", "describe_share_group"),
    78: ("ShareFetch", "share_fetch"),
    79: ("ShareAcknowledge", "share_acknowledge"),
    90: ("DescribeShareGroupOffsets", "describe_share_group_offsets"),
    91: ("AlterShareGroupOffsets", "alter_share_group_offsets"),
    92: ("DeleteShareGroupOffsets", "delete_share_group_offsets"),
    24: ("AddPartitionsToTxn", "add_partitions_to_txn"),
    25: ("AddOffsetsToTxn", "add_offsets_to_txn"),
    26: ("EndTxn", "end_txn"),
    28: ("TxnOffsetCommit", "txn_offset_commit"),
    65: ("DescribeTransactions", "describe_transactions"),
    66: ("ListTransactions", "list_transactions"),
    27: ("WriteTxnMarkers", "write_txn_markers"),
}
# Operations a Kafka api serves besides its own, chosen by the request's content: an
# InitProducerId naming a transactional id is ``init_transactions`` (WRITE on the id, as
# Kafka's), not ``init_producer_id``.
KAFKA_API_VARIANTS: Mapping[str, int] = {"init_transactions": 22}
KAFKA_API_OPERATIONS: Mapping[int, str] = {key: op for key, (_, op) in KAFKA_APIS.items()}

# Every method of ``tidelog.v1.Broker`` (the gRPC listener).
GRPC_METHOD_OPERATIONS: Mapping[str, str] = {
    "CreateTopic": "create_topics",
    "DeleteTopic": "delete_topics",
    "ListTopics": "metadata",
    "DescribeTopic": "metadata",
    "AlterTopicConfig": "alter_configs",
    "DescribeConfigs": "describe_configs",
    "IncrementalAlterConfigs": "alter_configs",
    "CreatePartitions": "create_partitions",
    "ElectLeaders": "elect_leaders",
    "AlterPartitionReassignments": "alter_partition_reassignments",
    "ListPartitionReassignments": "list_partition_reassignments",
    "ControlledShutdown": "controlled_shutdown",
    "Envelope": "envelope",
    "CreateAcls": "create_acls",
    "DescribeAcls": "describe_acls",
    "DeleteAcls": "delete_acls",
    "Produce": "produce",
    "ProduceStream": "produce",
    "Fetch": "fetch",
    "FetchStream": "fetch",
    "ListOffsets": "list_offsets",
    "OffsetForLeaderEpoch": "offset_for_leader_epoch",
    "InitProducerId": "init_producer_id",
    "DescribeProducers": "describe_producers",
    "DescribeLogDirs": "describe_log_dirs",
    "DeleteRecords": "delete_records",
    "ConsumerGroupHeartbeat": "consumer_group_heartbeat",
    "OffsetCommit": "offset_commit",
    "OffsetFetch": "offset_fetch",
    "ListGroups": "list_groups",
    "DescribeGroup": "describe_groups",
    "ResetGroupOffsets": "reset_group_offsets",
    "DeleteGroup": "delete_groups",
    "OffsetDelete": "offset_delete",
    "Metadata": "metadata",
    "FindCoordinator": "find_coordinator",
    "AlterClientQuotas": "alter_client_quotas",
    "DescribeClientQuotas": "describe_client_quotas",
    "Authenticate": "authenticate",
    "UpsertUser": "alter_users",
    "DeleteUser": "alter_users",
    "ListUsers": "describe_users",
    "InitTransactions": "init_transactions",
    "AddPartitionsToTxn": "add_partitions_to_txn",
    "AddOffsetsToTxn": "add_offsets_to_txn",
    "EndTxn": "end_txn",
    "TxnOffsetCommit": "txn_offset_commit",
    "DescribeTransactions": "describe_transactions",
    "ListTransactions": "list_transactions",
    "WriteTxnMarkers": "write_txn_markers",
    "VerifyTxnPartition": "verify_txn_partition",
    "ShareGroupHeartbeat": "share_group_heartbeat",
    "ShareFetch": "share_fetch",
    "ShareFetchStream": "share_fetch",
    "ShareAcknowledge": "share_acknowledge",
    "DescribeShareGroup": "describe_share_group",
    "DescribeShareGroupOffsets": "describe_share_group_offsets",
    "AlterShareGroupOffsets": "alter_share_group_offsets",
    "DeleteShareGroupOffsets": "delete_share_group_offsets",
    "ReadShareGroupState": "share_group_state",
    "InitializeShareGroupState": "share_group_state",
    "WriteShareGroupState": "share_group_state",
    "ReadShareGroupStateSummary": "share_group_state",
    "DeleteShareGroupState": "share_group_state",
    "DescribeSharePartition": "share_group_state",
}

_ERRORS: Mapping[ResourceType, type[NotAuthorizedError]] = {
    ResourceType.TOPIC: TopicAuthorizationFailedError,
    ResourceType.GROUP: GroupAuthorizationFailedError,
    ResourceType.CLUSTER: ClusterAuthorizationFailedError,
    ResourceType.TRANSACTIONAL_ID: TransactionalIdAuthorizationFailedError,
}


def authorize(
    acls: Acls,
    context: RequestContext,
    rpc: str,
    operation: str,
    resources: Iterable[Resource],
    *,
    whole: bool = False,
) -> dict[Resource, NotAuthorizedError | None]:
    """Decide, per explicit resource of one request, whether the caller may (the policy
    of ``operation`` in ``OPERATIONS``); each refusal is audited once, the allowed ones
    not at all.

    Args:
        acls: the broker's ACLs; with the authorizer off everything is allowed and
            nothing is looked up.
        context: the caller (principal, host) and the listener (``context.listener``).
        rpc: the listener's own name for the request (``CreateTopic``, ``CreateTopics``),
            kept in the audit line.
        operation: a key of ``OPERATIONS``.
        resources: what the request names; duplicates are decided (and audited) once.
        whole: the request is refused as a whole by its first refused resource (a gRPC
            unary call; Kafka's group APIs by their group): the resources after it are
            neither decided nor audited (they answer None).

    Returns:
        resource -> None (allowed) or the error that refuses it (Kafka's
        ``*_AUTHORIZATION_FAILED`` for its kind), in the order first named.

    Raises:
        KeyError: ``operation`` is not in the table (a listener bug).
        ValueError: the operation does not apply to a resource of that kind.
    """
    policy = OPERATIONS[operation]
    named = list(dict.fromkeys(resources))
    decisions: dict[Resource, NotAuthorizedError | None] = dict.fromkeys(named)
    if not acls.enabled:
        return decisions
    principal, host = context.principal, context.host
    for resource in named:
        needed = policy.needs.get(resource.kind)
        if needed is None:
            raise ValueError(f"{operation} names no {resource.kind.value} resource")
        if acls.allowed(principal, host, needed, resource.kind, resource.name):
            continue
        if (
            resource.kind == ResourceType.TOPIC
            and policy.or_on_cluster is not None
            and acls.allowed(principal, host, policy.or_on_cluster, _C, CLUSTER_NAME)
        ):
            continue
        if (
            resource.kind == ResourceType.CLUSTER
            and policy.or_on_any_topic is not None
            and acls.allowed_any(principal, host, policy.or_on_any_topic, _T)
        ):
            continue
        _audit_denied(context, rpc, operation, needed, resource)
        # The message Acls.check has always given.
        what = "the cluster" if resource.kind is _C else repr(resource.name)
        decisions[resource] = _ERRORS[resource.kind](
            f"{principal or 'User:ANONYMOUS'} may not {needed.value} "
            f"{resource.kind.value.lower()} {what}"
        )
        if whole:
            break
    return decisions


# The operations Kafka supports per resource kind (its ``AclEntry.supportedOperations``,
# less the delegation-token ones Tidelog has no resource for).
_SUPPORTED: Mapping[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (
        Operation.READ,
        Operation.WRITE,
        Operation.CREATE,
        Operation.DELETE,
        Operation.ALTER,
        Operation.DESCRIBE,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Operation.READ, Operation.DELETE, Operation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Operation.WRITE, Operation.DESCRIBE),
    ResourceType.CLUSTER: (
        Operation.CREATE,
        Operation.ALTER,
        Operation.DESCRIBE,
        Operation.CLUSTER_ACTION,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
    ),
}


def authorized_operations(
    acls: Acls, context: RequestContext, resource: Resource
) -> frozenset[Operation]:
    """The operations the caller may perform on ``resource`` (KIP-430), of those Kafka
    supports on its kind; not audited. Every one with the authorizer off."""
    supported = _SUPPORTED[resource.kind]
    if not acls.enabled:
        return frozenset(supported)
    principal, host = context.principal, context.host
    return frozenset(
        op for op in supported if acls.allowed(principal, host, op, resource.kind, resource.name)
    )


def first_refusal(decisions: Mapping[Resource, NotAuthorizedError | None]) -> None:
    """Raise the first refusal among ``decisions`` (a request refused as a whole)."""
    for error in decisions.values():
        if error is not None:
            raise error


def visible(acls: Acls, context: RequestContext, operation: str, names: Sequence[str]) -> list[str]:
    """The entries of a listing (``operation``'s ``lists`` kind) the caller may see, in
    order; the others are left out silently: no audit line, no error."""
    policy = OPERATIONS[operation]
    kind = policy.lists
    if kind is None:
        raise ValueError(f"{operation} is not a listing")
    if not acls.enabled:
        return list(names)
    principal, host = context.principal, context.host
    if policy.listing_on_cluster and acls.allowed(
        principal, host, Operation.DESCRIBE, _C, CLUSTER_NAME
    ):
        return list(names)
    return [n for n in names if acls.allowed(principal, host, Operation.DESCRIBE, kind, n)]


def _audit_denied(
    context: RequestContext, rpc: str, operation: str, needed: Operation, resource: Resource
) -> None:
    audit(
        {
            "event": "authorization_denied",
            "principal": context.principal or "User:ANONYMOUS",
            "host": context.host,
            "listener": context.listener,
            "rpc": rpc,
            "request": operation,
            "operation": needed.value,
            "resource_type": resource.kind.value,
            "resource_name": resource.name,
        }
    )


def record_quota(quotas: QuotaManager, context: RequestContext, quota: str, value: float) -> int:
    """Meter ``value`` against the caller's ``quota`` (user and client id); the throttle
    time in ms it asks for (0: none). The one call both listeners make."""
    return quotas.record(context.client_id, quota, value, user=context.user)


def observe(
    metrics: BrokerMetrics, listener: str, operation: str, outcome: str, seconds: float
) -> None:
    """Count one finished request: ``outcome`` is ``OK`` or the error code that failed it
    as a whole (a refused partition inside an answered request is ``OK``: its audit line
    tells)."""
    metrics.observe_operation(listener, operation, outcome, seconds)
