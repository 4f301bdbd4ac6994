"""What each gRPC call needs the caller to be allowed: each RPC maps to a neutral operation
of ``broker.core.operations`` and the resources its request names; that module's one policy
table decides (the same for the Kafka listener) and writes the audit lines. The
mapping, RPC by RPC:

======================  ==========================  ========================================
RPC                     operation                   resources
======================  ==========================  ========================================
Produce(Stream)         produce                     each topic (refused partitions answer
                                                    TOPIC_AUTHORIZATION_FAILED, the others
                                                    are written)
Fetch(Stream)           fetch                       each topic, per partition; a follower's
                                                    fetch: the cluster
ListOffsets             list_offsets                each topic named
OffsetForLeaderEpoch    offset_for_leader_epoch     each topic named
Metadata, ListTopics    metadata                    a listing (filtered silently); a topic
                                                    named answers TOPIC_AUTHORIZATION_FAILED
DescribeTopic           metadata                    the topic
CreateTopic             create_topics               the topic (or CREATE on the cluster)
DeleteTopic             delete_topics               the topic
AlterTopicConfig        alter_configs               the topic
DescribeConfigs         describe_configs            the topic, the cluster (a broker) or the group
IncrementalAlterConfigs alter_configs               the topic, the cluster (a broker) or the group
CreatePartitions        create_partitions           each topic
InitProducerId          init_producer_id            the cluster (or WRITE on some topic)
DescribeProducers       describe_producers          each topic
DeleteRecords           delete_records              each topic
ConsumerGroupHeartbeat  consumer_group_heartbeat    the group
OffsetCommit            offset_commit               the group, then each topic
OffsetFetch             offset_fetch                the group, then each topic named
FindCoordinator         find_coordinator            the group
ListGroups              list_groups                 a listing (filtered silently)
DescribeGroup           describe_groups             the group
ResetGroupOffsets       reset_group_offsets         the group, then each topic named
DeleteGroup             delete_groups               the group
OffsetDelete            offset_delete               the group, then each topic named
AlterClientQuotas       alter_client_quotas         the cluster
DescribeClientQuotas    describe_client_quotas      the cluster
ElectLeaders            elect_leaders               the cluster
AlterPartitionReass...  alter_partition_reassignments  the cluster
ListPartitionReass...   list_partition_reassignments   the cluster
DescribeLogDirs         describe_log_dirs           the cluster
ControlledShutdown      controlled_shutdown         the cluster
Envelope                envelope                    the cluster (CLUSTER_ACTION: brokers only)
CreateAcls, DeleteAcls  create_acls, delete_acls    the cluster
DescribeAcls            describe_acls               the cluster
UpsertUser, DeleteUser  alter_users                 the cluster
ListUsers               describe_users              the cluster
WriteTxnMarkers         write_txn_markers           the cluster (CLUSTER_ACTION: brokers only)
VerifyTxnPartition      verify_txn_partition        the cluster (CLUSTER_ACTION: brokers only)
Authenticate            authenticate                none: anyone may log in
InitTransactions        init_transactions           the transactional id
AddPartitionsToTxn      add_partitions_to_txn       the transactional id, then each topic
AddOffsetsToTxn         add_offsets_to_txn          the transactional id, then the group
EndTxn                  end_txn                     the transactional id
TxnOffsetCommit         txn_offset_commit           the transactional id, the group, then
                                                    each topic
DescribeTransactions    describe_transactions       each transactional id
ListTransactions        list_transactions           a listing (filtered silently)
ShareGroupHeartbeat     share_group_heartbeat       the group, then each subscribed topic
ShareFetch              share_fetch                 the group, then each topic fetched or
                                                    acknowledged
ShareFetchStream        share_fetch                 each request as a ShareFetch
ShareAcknowledge        share_acknowledge           the group, then each topic acknowledged
DescribeShareGroup      describe_share_group        the group
DescribeShareGroupOf... describe_share_group_offsets  the group, then each topic named
AlterShareGroupOffsets  alter_share_group_offsets   the group, then each topic named
DeleteShareGroupOff...  delete_share_group_offsets  the group, then each topic named
ReadShareGroupState,    share_group_state           the cluster (CLUSTER_ACTION: brokers only)
InitializeShareGr...,
WriteShareGroupState,
ReadShareGroupStat...,
DeleteShareGroupState,
DescribeSharePartition
======================  ==========================  ========================================

A transactional Produce (``transactional_id`` set) needs WRITE on the id as well, refused
for every partition of the request (``transactional_gate``), as the Kafka listener does;
FindCoordinator with ``key_type`` 1 needs DESCRIBE on the transactional id.

A refused unary call is refused by the request pipeline (``broker.core.pipeline``, resources from
``resources_of``) with the first refused resource's ``*AuthorizationFailedError``.
With the authorizer disabled nothing here costs more than one attribute read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tidelog.broker.core.acl import Operation
from tidelog.broker.core.acl_store import Acls
from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.operations import (
    Resource,
    authorize,
    cluster,
    group,
    topic,
    transactional_id,
    visible,
)
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import NotAuthorizedError, TopicAuthorizationFailedError

__all__ = [
    "filter_metadata",
    "filter_response",
    "replica_gate",
    "resources_of",
    "topic_gate",
    "transactional_gate",
]

_Resources = Callable[[Any], list[Resource]]


def _topics(names: Iterable[str]) -> list[Resource]:
    return [topic(name) for name in names]


def _config_resource(resource: Any) -> Resource:
    # A broker resource (type 4, Kafka's BROKER) is the cluster's, a GROUP (32) the
    # group's; anything else names a topic (an unknown type is refused by the handler
    # after this check).
    if resource.type == 32:
        return group(resource.name)
    return cluster() if resource.type == 4 else topic(resource.name)


def _group_and_topics(request: Any, names: Iterable[str]) -> list[Resource]:
    return [group(request.group_id), *_topics(names)]


# RPC -> the resources its request names (the operation: GRPC_METHOD_OPERATIONS).
_RESOURCES: dict[str, _Resources] = {
    "CreateTopic": lambda r: [topic(r.name)],
    "DeleteTopic": lambda r: [topic(r.name)],
    "DescribeTopic": lambda r: [topic(r.name)],
    "AlterTopicConfig": lambda r: [topic(r.name)],
    "DescribeConfigs": lambda r: [_config_resource(r.resource)],
    "IncrementalAlterConfigs": lambda r: [_config_resource(r.resource)],
    "CreatePartitions": lambda r: _topics(t.name for t in r.topics),
    "ListOffsets": lambda r: _topics(p.topic for p in r.partitions),
    "OffsetForLeaderEpoch": lambda r: _topics(p.topic for p in r.partitions),
    "InitProducerId": lambda r: [cluster()],
    "DescribeProducers": lambda r: _topics(t.topic for t in r.partitions),
    "DeleteRecords": lambda r: _topics(p.topic for p in r.partitions),
    "ConsumerGroupHeartbeat": lambda r: [group(r.group_id)],
    "OffsetCommit": lambda r: _group_and_topics(r, (o.topic for o in r.offsets)),
    "OffsetFetch": lambda r: _group_and_topics(r, (t.topic for t in r.partitions)),
    "FindCoordinator": lambda r: [
        transactional_id(r.group_id) if r.key_type == 1 else group(r.group_id)
    ],
    "DescribeGroup": lambda r: [group(r.group_id)],
    "ResetGroupOffsets": lambda r: _group_and_topics(r, (t.topic for t in r.partitions)),
    "DeleteGroup": lambda r: [group(r.group_id)],
    "OffsetDelete": lambda r: _group_and_topics(r, (t.topic for t in r.partitions)),
    "AlterClientQuotas": lambda r: [cluster()],
    "DescribeClientQuotas": lambda r: [cluster()],
    "ElectLeaders": lambda r: [cluster()],
    "AlterPartitionReassignments": lambda r: [cluster()],
    "ListPartitionReassignments": lambda r: [cluster()],
    "DescribeLogDirs": lambda r: [cluster()],
    "ControlledShutdown": lambda r: [cluster()],
    "Envelope": lambda r: [cluster()],
    "CreateAcls": lambda r: [cluster()],
    "DeleteAcls": lambda r: [cluster()],
    "DescribeAcls": lambda r: [cluster()],
    "UpsertUser": lambda r: [cluster()],
    "DeleteUser": lambda r: [cluster()],
    "ListUsers": lambda r: [cluster()],
    "InitTransactions": lambda r: [transactional_id(r.transactional_id)],
    "AddPartitionsToTxn": lambda r: [
        transactional_id(r.transactional_id),
        *_topics(t.topic for t in r.partitions),
    ],
    "AddOffsetsToTxn": lambda r: [transactional_id(r.transactional_id), group(r.group_id)],
    "EndTxn": lambda r: [transactional_id(r.transactional_id)],
    "TxnOffsetCommit": lambda r: [
        transactional_id(r.transactional_id),
        group(r.group_id),
        *_topics(o.topic for o in r.offsets),
    ],
    "DescribeTransactions": lambda r: [transactional_id(t) for t in r.transactional_ids],
    "WriteTxnMarkers": lambda r: [cluster()],
    "VerifyTxnPartition": lambda r: [cluster()],
    "ShareGroupHeartbeat": lambda r: _group_and_topics(r, r.subscribed_topic_names),
    "ShareFetch": lambda r: _group_and_topics(
        r, [*(t.topic for t in r.partitions), *(a.topic for a in r.acknowledgements)]
    ),
    # Each request of the stream (broker.grpc.share_stream asks for it per request).
    "ShareFetchStream": lambda r: _RESOURCES["ShareFetch"](r),
    "ShareAcknowledge": lambda r: _group_and_topics(r, (a.topic for a in r.acknowledgements)),
    "DescribeShareGroup": lambda r: [group(r.group_id)],
    "DescribeShareGroupOffsets": lambda r: _group_and_topics(r, (t.topic for t in r.partitions)),
    "AlterShareGroupOffsets": lambda r: _group_and_topics(r, (o.topic for o in r.offsets)),
    "DeleteShareGroupOffsets": lambda r: _group_and_topics(r, r.topics),
    "ReadShareGroupState": lambda r: [cluster()],
    "InitializeShareGroupState": lambda r: [cluster()],
    "WriteShareGroupState": lambda r: [cluster()],
    "ReadShareGroupStateSummary": lambda r: [cluster()],
    "DeleteShareGroupState": lambda r: [cluster()],
    "DescribeSharePartition": lambda r: [cluster()],
    # Listings are filtered (filter_response, filter_metadata); the data path decides per
    # topic (topic_gate, replica_gate); Authenticate: anyone may log in.
    "ListTopics": lambda r: [],
    "ListGroups": lambda r: [],
    "ListTransactions": lambda r: [],
    "Metadata": lambda r: [],
    "Produce": lambda r: [],
    "ProduceStream": lambda r: [],
    "Fetch": lambda r: [],
    "FetchStream": lambda r: [],
    "Authenticate": lambda r: [],
}


def resources_of(method: str, request: Any) -> list[Resource]:
    """The resources a unary call's request names (the table in the module): what the
    request pipeline (``broker.core.pipeline``) authorizes before the core call."""
    extract = _RESOURCES.get(method)
    return extract(request) if extract is not None else []


def filter_response(acls: Acls, method: str, response: Any, context: RequestContext) -> Any:
    """Leave out of a listing what the caller may not describe (ListTopics, ListGroups,
    OffsetFetch's committed partitions, DescribeShareGroupOffsets' share partitions),
    silently."""
    if not acls.enabled:
        return response
    if method == "ListTopics":
        names = set(visible(acls, context, "metadata", [t.name for t in response.topics]))
        kept = [t for t in response.topics if t.name in names]
        del response.topics[:]
        response.topics.extend(kept)
    elif method == "OffsetFetch":
        # Every committed partition: leave out the topics the caller may not describe
        # (named ones were refused before the call, as Kafka refuses them).
        topics = set(visible(acls, context, "offset_fetch", [o.topic for o in response.offsets]))
        kept_offsets = [o for o in response.offsets if o.topic in topics]
        del response.offsets[:]
        response.offsets.extend(kept_offsets)
    elif method == "DescribeShareGroupOffsets":
        topics = set(
            visible(
                acls, context, "describe_share_group_offsets", [o.topic for o in response.offsets]
            )
        )
        kept_share = [o for o in response.offsets if o.topic in topics]
        del response.offsets[:]
        response.offsets.extend(kept_share)
    elif method == "ListGroups":
        ids = set(visible(acls, context, "list_groups", [g.group_id for g in response.groups]))
        kept = [g for g in response.groups if g.group_id in ids]
        del response.groups[:]
        response.groups.extend(kept)
    return response


def filter_metadata(
    acls: Acls, request: pb.MetadataRequest, response: pb.MetadataResponse, context: RequestContext
) -> pb.MetadataResponse:
    """Metadata: unnamed topics the caller may not describe are left out, silently (a
    listing is not a request to see them); named ones answer TOPIC_AUTHORIZATION_FAILED
    without partitions, whether they exist or not (so nothing leaks: the core's
    UNKNOWN_TOPIC_OR_PARTITION or INVALID_TOPIC_EXCEPTION is replaced too), and each
    such refusal is audited (``broker.core.operations.authorize``)."""
    if not acls.enabled:
        return response
    named = [t.name for t in response.topics if t.name in set(request.topics)]
    decisions = authorize(acls, context, "Metadata", "metadata", _topics(named))
    shown = set(visible(acls, context, "metadata", [t.name for t in response.topics]))
    kept = []
    for t in response.topics:
        if t.name in shown:
            kept.append(t)
        elif decisions.get(topic(t.name)) is not None:
            kept.append(
                pb.TopicMetadata(name=t.name, error_code=TopicAuthorizationFailedError.code)
            )
    del response.topics[:]
    response.topics.extend(kept)
    return response


def topic_gate(
    acls: Acls | None, context: RequestContext | None, operation: Operation, method: str
) -> Callable[[str], NotAuthorizedError | None] | None:
    """For the data path: a function telling, per topic, the error that refuses it (None
    when allowed; decided and audited once per topic); None when nothing is checked (no
    authorizer). ``operation``: WRITE (produce) or READ (fetch); ``method``: the
    listener's name for the request, for the audit line."""
    if acls is None or context is None or not acls.enabled:
        return None
    neutral = "produce" if operation is Operation.WRITE else "fetch"
    decided: dict[str, NotAuthorizedError | None] = {}

    def gate(name: str) -> NotAuthorizedError | None:
        if name not in decided:
            resource = topic(name)
            decided[name] = authorize(acls, context, method, neutral, [resource])[resource]
        return decided[name]

    return gate


def transactional_gate(
    acls: Acls | None, context: RequestContext | None, transactional_id_name: str | None
) -> NotAuthorizedError | None:
    """For a transactional produce: WRITE on its transactional id (Kafka's rule), decided
    and audited once per request; None when allowed, not transactional, or unchecked."""
    if transactional_id_name is None or acls is None or context is None or not acls.enabled:
        return None
    resource = transactional_id(transactional_id_name)
    return authorize(acls, context, "Produce", "produce", [resource])[resource]


def replica_gate(acls: Acls | None, context: RequestContext | None) -> NotAuthorizedError | None:
    """A follower's fetch needs CLUSTER_ACTION on the cluster."""
    if acls is None or context is None or not acls.enabled:
        return None
    return authorize(acls, context, "Fetch", "fetch", [cluster()])[cluster()]
