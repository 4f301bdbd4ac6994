"""ACL checks on the Kafka listener: the request being handled is a neutral operation
(``broker.core.operations.KAFKA_APIS``, by api key), decided by the one policy table
(``broker.core.operations.authorize``) with the same ACLs, principals and audit lines as the
gRPC listener, and answered with Kafka's error numbers.

Handlers name only the resources (``topic(...)``, ``group(...)``, ``cluster()``); what
each needs is the table's business, never the handler's. Listings (Metadata without
names, ListGroups) are filtered with ``visible``: silently, no audit line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from tidelog.broker.core.acl import Operation
from tidelog.broker.core.operations import (
    KAFKA_APIS,
    Resource,
    authorize,
    authorized_operations,
    topic,
)
from tidelog.broker.core.operations import visible as visible_names
from tidelog.broker.kafka.errors import error_code_for
from tidelog.broker.kafka.listener import Connection
from tidelog.storage.errors import NotAuthorizedError

__all__ = ["UNKNOWN_OPERATIONS", "denied", "gate", "operations_bits", "refusals", "visible"]

# Kafka's "not asked for" value of an ``*_authorized_operations`` field (KIP-430).
UNKNOWN_OPERATIONS = -(2**31)

# Kafka's AclOperation codes: bit ``code`` of an ``*_authorized_operations`` field.
_CODES: dict[Operation, int] = {
    Operation.READ: 3,
    Operation.WRITE: 4,
    Operation.CREATE: 5,
    Operation.DELETE: 6,
    Operation.ALTER: 7,
    Operation.DESCRIBE: 8,
    Operation.CLUSTER_ACTION: 9,
    Operation.DESCRIBE_CONFIGS: 10,
    Operation.ALTER_CONFIGS: 11,
    Operation.IDEMPOTENT_WRITE: 12,
}


def _request(conn: Connection, operation: str | None) -> tuple[str, str]:
    """The audit line's api name and the operation of the request being handled."""
    api, neutral = KAFKA_APIS[conn.api_key]
    return api, operation or neutral


def refusals(
    conn: Connection,
    resources: Iterable[Resource],
    *,
    operation: str | None = None,
    whole: bool = False,
) -> dict[Resource, int]:
    """Per resource, 0 if the caller may, else Kafka's authorization error code (each
    refusal audited once). ``operation``: another operation than the request's own (a
    Metadata request's auto-creation is ``create_topics``); ``whole``: see
    ``broker.core.operations.authorize``."""
    api, neutral = _request(conn, operation)
    decisions = authorize(conn.core.acls, conn.context, api, neutral, resources, whole=whole)
    return {
        resource: 0 if error is None else error_code_for(error.code)
        for resource, error in decisions.items()
    }


def denied(conn: Connection, resource: Resource, *, operation: str | None = None) -> int:
    """0 if the caller may act on ``resource`` in this request, else Kafka's error code
    (audited)."""
    return refusals(conn, [resource], operation=operation)[resource]


def visible(conn: Connection, names: Sequence[str]) -> list[str]:
    """The entries of this request's listing the caller may see (silently filtered)."""
    _, neutral = _request(conn, None)
    return visible_names(conn.core.acls, conn.context, neutral, names)


def gate(conn: Connection) -> Callable[[str], NotAuthorizedError | None]:
    """Per topic, the error that refuses it on the data path (None: allowed), for the
    request being handled (Produce, Fetch); decided and audited once per topic."""
    acls = conn.core.acls
    if not acls.enabled:
        return _allowed
    api, neutral = _request(conn, None)
    context = conn.context
    decided: dict[str, NotAuthorizedError | None] = {}

    def refuse(name: str) -> NotAuthorizedError | None:
        if name not in decided:
            resource = topic(name)
            decided[name] = authorize(acls, context, api, neutral, [resource])[resource]
        return decided[name]

    return refuse


def _allowed(topic: str) -> None:
    return None


def operations_bits(conn: Connection, resource: Resource, asked: bool) -> int:
    """KIP-430: the caller's authorized operations on ``resource`` as Kafka's bit field
    (bit = Kafka's AclOperation code), or ``UNKNOWN_OPERATIONS`` when not ``asked``."""
    if not asked:
        return UNKNOWN_OPERATIONS
    allowed = authorized_operations(conn.core.acls, conn.context, resource)
    return sum(1 << _CODES[op] for op in allowed)
