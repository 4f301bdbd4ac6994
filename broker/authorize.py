"""What each RPC needs the caller to be allowed, checked against the ACLs (``broker.acl``).

Kafka's mapping of requests to operations, resource by resource:

======================  =====================================================================
RPC                     needs
======================  =====================================================================
Produce(Stream)         WRITE on each topic (refused partitions answer
                        TOPIC_AUTHORIZATION_FAILED, the others are written)
Fetch(Stream)           READ on each topic, per partition; a follower's fetch CLUSTER_ACTION
ListOffsets             DESCRIBE on each topic named
OffsetForLeaderEpoch    DESCRIBE on each topic named (Kafka's rule for a consumer)
Metadata, ListTopics    DESCRIBE on a topic to see it (others are left out; one asked for
                        by name answers TOPIC_AUTHORIZATION_FAILED)
CreateTopic             CREATE on the cluster or on the topic
DeleteTopic             DELETE on the topic
DescribeTopic           DESCRIBE on the topic
AlterTopicConfig        ALTER_CONFIGS on the topic
CreatePartitions        ALTER on each topic
InitProducerId          IDEMPOTENT_WRITE on the cluster, or WRITE on some topic
DescribeProducers       READ on each topic
ConsumerGroupHeartbeat  READ on the group
OffsetCommit            READ on the group and on each topic
OffsetFetch             DESCRIBE on the group (and on each topic named)
FindCoordinator         DESCRIBE on the group
ListGroups              DESCRIBE on a group to see it
DescribeGroup           DESCRIBE on the group
ResetGroupOffsets       READ on the group and on each topic named
DeleteGroup             DELETE on the group
AlterClientQuotas       ALTER_CONFIGS on the cluster
DescribeClientQuotas    DESCRIBE_CONFIGS on the cluster
ElectLeaders            ALTER on the cluster
ControlledShutdown      CLUSTER_ACTION on the cluster
CreateAcls, DeleteAcls  ALTER on the cluster
DescribeAcls            DESCRIBE on the cluster
======================  =====================================================================

A refused call raises the resource type's ``*AuthorizationFailedError`` and is recorded
in the audit log (``broker.audit``). With the
authorizer disabled nothing here costs more than one attribute read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from broker.acl import CLUSTER_NAME, Operation, ResourceType
from broker.acl_store import Acls
from broker.audit import audit
from broker.context import RequestContext
from proto.tidelog.v1 import broker_pb2 as pb
from storage.errors import NotAuthorizedError, TopicAuthorizationFailedError

__all__ = ["authorize_call", "filter_response", "topic_gate"]

_Rule = Callable[["_Check", Any], None]


class _Check:
    """One call's principal and host against the ACLs; raising and auditing denials."""

    def __init__(self, acls: Acls, method: str, context: RequestContext) -> None:
        self.acls = acls
        self.method = method
        self.principal = context.principal
        self.host = context.host

    def allowed(self, operation: Operation, kind: ResourceType, name: str) -> bool:
        return self.acls.allowed(self.principal, self.host, operation, kind, name)

    def need(self, operation: Operation, kind: ResourceType, name: str = CLUSTER_NAME) -> None:
        try:
            self.acls.check(self.principal, self.host, operation, kind, name)
        except NotAuthorizedError as exc:
            audit_denied(self.method, self.principal, self.host, operation, kind, name)
            raise exc from None

    def topics(self, operation: Operation, names: Iterable[str]) -> None:
        for name in dict.fromkeys(names):
            self.need(operation, ResourceType.TOPIC, name)


def audit_denied(
    method: str,
    principal: str | None,
    host: str,
    operation: Operation,
    kind: ResourceType,
    name: str,
) -> None:
    """One audit line (``broker.audit``): who was refused what, when, from where."""
    audit(
        {
            "event": "authorization_denied",
            "principal": principal or "User:ANONYMOUS",
            "host": host,
            "rpc": method,
            "operation": operation.value,
            "resource_type": kind.value,
            "resource_name": name,
        }
    )


def _init_producer_id(check: _Check, request: pb.InitProducerIdRequest) -> None:
    if check.allowed(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME):
        return
    if check.acls.allowed_any(check.principal, check.host, Operation.WRITE, ResourceType.TOPIC):
        return
    check.need(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER)


def _create_topic(check: _Check, request: pb.CreateTopicRequest) -> None:
    if check.allowed(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME):
        return
    check.need(Operation.CREATE, ResourceType.TOPIC, request.name)


def _group(operation: Operation) -> _Rule:
    def rule(check: _Check, request: Any) -> None:
        check.need(operation, ResourceType.GROUP, request.group_id)

    return rule


def _cluster(operation: Operation) -> _Rule:
    def rule(check: _Check, request: Any) -> None:
        check.need(operation, ResourceType.CLUSTER)

    return rule


def _offset_commit(check: _Check, request: pb.OffsetCommitRequest) -> None:
    check.need(Operation.READ, ResourceType.GROUP, request.group_id)
    check.topics(Operation.READ, (o.topic for o in request.offsets))


def _offset_fetch(check: _Check, request: pb.OffsetFetchRequest) -> None:
    check.need(Operation.DESCRIBE, ResourceType.GROUP, request.group_id)
    check.topics(Operation.DESCRIBE, (t.topic for t in request.partitions))


def _reset_group_offsets(check: _Check, request: pb.ResetGroupOffsetsRequest) -> None:
    check.need(Operation.READ, ResourceType.GROUP, request.group_id)
    check.topics(Operation.READ, (t.topic for t in request.partitions))


_RULES: dict[str, _Rule] = {
    "CreateTopic": _create_topic,
    "DeleteTopic": lambda c, r: c.need(Operation.DELETE, ResourceType.TOPIC, r.name),
    "DescribeTopic": lambda c, r: c.need(Operation.DESCRIBE, ResourceType.TOPIC, r.name),
    "AlterTopicConfig": lambda c, r: c.need(Operation.ALTER_CONFIGS, ResourceType.TOPIC, r.name),
    "CreatePartitions": lambda c, r: c.topics(Operation.ALTER, (t.name for t in r.topics)),
    "ListOffsets": lambda c, r: c.topics(Operation.DESCRIBE, (p.topic for p in r.partitions)),
    "OffsetForLeaderEpoch": lambda c, r: c.topics(
        Operation.DESCRIBE, (p.topic for p in r.partitions)
    ),
    "InitProducerId": _init_producer_id,
    "DescribeProducers": lambda c, r: c.topics(Operation.READ, (t.topic for t in r.partitions)),
    "ConsumerGroupHeartbeat": _group(Operation.READ),
    "OffsetCommit": _offset_commit,
    "OffsetFetch": _offset_fetch,
    "FindCoordinator": _group(Operation.DESCRIBE),
    "DescribeGroup": _group(Operation.DESCRIBE),
    "ResetGroupOffsets": _reset_group_offsets,
    "DeleteGroup": _group(Operation.DELETE),
    "AlterClientQuotas": _cluster(Operation.ALTER_CONFIGS),
    "DescribeClientQuotas": _cluster(Operation.DESCRIBE_CONFIGS),
    "ElectLeaders": _cluster(Operation.ALTER),
    "ControlledShutdown": _cluster(Operation.CLUSTER_ACTION),
    "CreateAcls": _cluster(Operation.ALTER),
    "DeleteAcls": _cluster(Operation.ALTER),
    "DescribeAcls": _cluster(Operation.DESCRIBE),
    # SCRAM users, as Kafka's AlterUserScramCredentials / DescribeUserScramCredentials;
    # Authenticate has no rule: anyone may log in.
    "UpsertUser": _cluster(Operation.ALTER),
    "DeleteUser": _cluster(Operation.ALTER),
    "ListUsers": _cluster(Operation.DESCRIBE),
}


def authorize_call(acls: Acls, method: str, request: Any, context: RequestContext) -> None:
    """Raise unless the caller may make this unary call (the table in the module)."""
    if not acls.enabled:
        return
    rule = _RULES.get(method)
    if rule is not None:
        rule(_Check(acls, method, context), request)


def filter_response(acls: Acls, method: str, response: Any, context: RequestContext) -> Any:
    """Leave out of a listing what the caller may not describe (Metadata, ListTopics,
    ListGroups); a topic asked for by name answers TOPIC_AUTHORIZATION_FAILED."""
    if not acls.enabled:
        return response
    check = _Check(acls, method, context)
    if method == "ListTopics":
        kept = [
            t
            for t in response.topics
            if check.allowed(Operation.DESCRIBE, ResourceType.TOPIC, t.name)
        ]
        del response.topics[:]
        response.topics.extend(kept)
    elif method == "ListGroups":
        kept = [
            g
            for g in response.groups
            if check.allowed(Operation.DESCRIBE, ResourceType.GROUP, g.group_id)
        ]
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
    such refusal is audited as a refused DescribeTopic is."""
    if not acls.enabled:
        return response
    check = _Check(acls, "Metadata", context)
    named = set(request.topics)
    kept = []
    for topic in response.topics:
        if check.allowed(Operation.DESCRIBE, ResourceType.TOPIC, topic.name):
            kept.append(topic)
        elif topic.name in named:
            audit_denied(
                "Metadata",
                check.principal,
                check.host,
                Operation.DESCRIBE,
                ResourceType.TOPIC,
                topic.name,
            )
            kept.append(
                pb.TopicMetadata(name=topic.name, error_code=TopicAuthorizationFailedError.code)
            )
    del response.topics[:]
    response.topics.extend(kept)
    return response


def topic_gate(
    acls: Acls | None, context: RequestContext | None, operation: Operation, method: str
) -> Callable[[str], NotAuthorizedError | None] | None:
    """For the data path: a function telling, per topic, the error that refuses it (None
    when allowed); None when nothing is checked (no authorizer)."""
    if acls is None or context is None or not acls.enabled:
        return None
    check = _Check(acls, method, context)
    decided: dict[str, NotAuthorizedError | None] = {}

    def gate(topic: str) -> NotAuthorizedError | None:
        if topic not in decided:
            try:
                check.need(operation, ResourceType.TOPIC, topic)
                decided[topic] = None
            except NotAuthorizedError as exc:
                decided[topic] = exc
        return decided[topic]

    return gate


def replica_gate(acls: Acls | None, context: RequestContext | None) -> NotAuthorizedError | None:
    """A follower's fetch needs CLUSTER_ACTION on the cluster."""
    if acls is None or context is None or not acls.enabled:
        return None
    try:
        _Check(acls, "Fetch", context).need(Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
    except NotAuthorizedError as exc:
        return exc
    return None
