"""ACL checks on the Kafka listener: the same ACLs and principals as the gRPC listener
(``broker.acl_store.Acls``, ``broker.authorize``), with Kafka's error numbers.

What each Kafka API needs follows Kafka (and ``broker.authorize``'s table): Produce WRITE
on each topic, Fetch READ, ListOffsets and Metadata DESCRIBE (Metadata leaves out the
topics the caller may not describe, and answers a named one with
``TOPIC_AUTHORIZATION_FAILED``), CreateTopics CREATE on the cluster or the topic,
DeleteTopics DELETE, CreatePartitions ALTER, DescribeConfigs DESCRIBE_CONFIGS,
InitProducerId IDEMPOTENT_WRITE on the cluster or WRITE on some topic, the group APIs
READ on the group (FindCoordinator, OffsetFetch, DescribeGroups and ListGroups DESCRIBE),
OffsetCommit READ on the group and each topic. A refusal is audited like the gRPC
listener's (``broker.authorize.audit_denied``).
"""

from __future__ import annotations

from collections.abc import Callable

from broker.acl import CLUSTER_NAME, Operation, ResourceType
from broker.authorize import audit_denied, topic_gate
from broker.kafka.errors import error_code_for
from broker.kafka.listener import Connection
from storage.errors import NotAuthorizedError

__all__ = ["denied", "gate", "idempotent_write_denied"]

_CODES = {
    ResourceType.TOPIC: "TOPIC_AUTHORIZATION_FAILED",
    ResourceType.GROUP: "GROUP_AUTHORIZATION_FAILED",
    ResourceType.CLUSTER: "CLUSTER_AUTHORIZATION_FAILED",
}


def denied(
    conn: Connection, api: str, operation: Operation, kind: ResourceType, name: str = CLUSTER_NAME
) -> int:
    """0 if the connection's principal may, else Kafka's authorization error (audited)."""
    acls = conn.core.acls
    if not acls.enabled:
        return 0
    context = conn.context
    if acls.allowed(context.principal, context.host, operation, kind, name):
        return 0
    audit_denied(api, context.principal, context.host, operation, kind, name)
    return error_code_for(_CODES.get(kind, "CLUSTER_AUTHORIZATION_FAILED"))


def gate(
    conn: Connection, api: str, operation: Operation
) -> Callable[[str], NotAuthorizedError | None]:
    """Per topic, the error that refuses it on the data path (None: allowed)."""
    found = topic_gate(conn.core.acls, conn.context, operation, api)
    return found if found is not None else _allowed


def _allowed(topic: str) -> None:
    return None


def idempotent_write_denied(conn: Connection) -> int:
    """InitProducerId: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic."""
    acls = conn.core.acls
    context = conn.context
    if not acls.enabled:
        return 0
    principal, host = context.principal, context.host
    if acls.allowed(
        principal, host, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME
    ) or acls.allowed_any(principal, host, Operation.WRITE, ResourceType.TOPIC):
        return 0
    return denied(conn, "InitProducerId", Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER)
