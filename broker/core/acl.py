"""Authorization: Kafka's ACL model and its decision rule (``AclAuthorizer``).

An ACL binding allows or denies one principal, from one host (or ``*``), one operation on
resources of one type whose name matches a pattern::

    AclBinding(principal="User:alice", host="*", operation=READ, permission=ALLOW,
               resource_type=TOPIC, resource_name="orders-", pattern_type=PREFIXED)

A request by ``principal`` from ``host`` for ``operation`` on a resource is decided so:

1. a super user (``super.users``) may do anything;
2. a matching DENY binding refuses it (deny wins);
3. a matching ALLOW binding allows it;
4. with no binding at all for the resource (any principal, any operation), it is allowed
   if ``allow.everyone.if.no.acl.found`` (default false: refused);
5. otherwise refused.

Matching, as Kafka: the principal equals the binding's or the binding's is ``User:*``;
the host equals or the binding's is ``*``; the operation equals the binding's or the
binding's is ``ALL``, and an ALLOW for READ, WRITE, DELETE or ALTER also allows DESCRIBE,
one for ALTER_CONFIGS also DESCRIBE_CONFIGS; a LITERAL pattern matches the name itself (or
every name, as ``*``), a PREFIXED one every name that starts with it. An unauthenticated
caller is ``User:ANONYMOUS``.

Pure and immutable: ``Authorizer`` is rebuilt from the stored bindings on every change
(``broker.core.acl_store``). Thread-safe.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tidelog.storage.errors import InvalidRequestError

__all__ = [
    "ANONYMOUS",
    "AclBinding",
    "AclFilter",
    "Authorizer",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
    "parse_enum",
    "parse_principals",
]

ANONYMOUS = "User:ANONYMOUS"
CLUSTER_NAME = "kafka-cluster"  # Kafka's one cluster resource name
WILDCARD = "*"


class ResourceType(enum.Enum):
    TOPIC = "TOPIC"
    GROUP = "GROUP"
    CLUSTER = "CLUSTER"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"  # a transactional producer's id (issue #28)


class Operation(enum.Enum):
    ALL = "ALL"
    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DELETE = "DELETE"
    ALTER = "ALTER"
    DESCRIBE = "DESCRIBE"
    CLUSTER_ACTION = "CLUSTER_ACTION"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    ALTER_CONFIGS = "ALTER_CONFIGS"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"


class Permission(enum.Enum):
    ALLOW = "ALLOW"
    DENY = "DENY"


class PatternType(enum.Enum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


# Kafka: an ALLOW of any of these also allows the key.
_IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset(
        {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
    ),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.ALTER_CONFIGS}),
}


def parse_enum(kind: type[enum.Enum], value: str, what: str) -> enum.Enum:
    """``kind``'s member named ``value`` (any case); ``InvalidRequestError`` if none."""
    try:
        return kind(value.strip().upper())
    except ValueError:
        names = ", ".join(m.value for m in kind)
        raise InvalidRequestError(f"{what} must be one of {names}, got {value!r}") from None


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL. Build from text with ``parse``; ``validate`` checks the fields."""

    principal: str
    host: str
    operation: Operation
    permission: Permission
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType = PatternType.LITERAL

    @classmethod
    def parse(
        cls,
        *,
        principal: str,
        host: str,
        operation: str,
        permission: str,
        resource_type: str,
        resource_name: str,
        pattern_type: str = "LITERAL",
    ) -> AclBinding:
        """A binding from its text fields. Raises ``InvalidRequestError``."""
        binding = cls(
            principal.strip(),
            host.strip() or WILDCARD,
            parse_enum(Operation, operation, "operation"),  # type: ignore[arg-type]
            parse_enum(Permission, permission, "permission"),  # type: ignore[arg-type]
            parse_enum(ResourceType, resource_type, "resource type"),  # type: ignore[arg-type]
            resource_name,
            parse_enum(PatternType, pattern_type or "LITERAL", "pattern type"),  # type: ignore[arg-type]
        )
        binding.validate()
        return binding

    def validate(self) -> None:
        """Raise ``InvalidRequestError`` for a binding Kafka would refuse."""
        kind, _, name = self.principal.partition(":")
        if kind != "User" or not name:
            raise InvalidRequestError(
                f"principal must be User:NAME (or User:*), got {self.principal!r}"
            )
        if not self.resource_name:
            raise InvalidRequestError("resource name must not be empty")
        if self.resource_type is ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise InvalidRequestError(f"the cluster resource is named {CLUSTER_NAME!r}")
        if self.pattern_type is PatternType.PREFIXED and self.resource_name == WILDCARD:
            raise InvalidRequestError("a PREFIXED pattern cannot be '*'")

    def to_json(self) -> dict[str, str]:
        return {
            "principal": self.principal,
            "host": self.host,
            "operation": self.operation.value,
            "permission": self.permission.value,
            "resource_type": self.resource_type.value,
            "resource_name": self.resource_name,
            "pattern_type": self.pattern_type.value,
        }

    @classmethod
    def from_json(cls, document: dict[str, str]) -> AclBinding:
        return cls.parse(**document)

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type is not resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which bindings to describe or delete: None fields match anything. A LITERAL or
    PREFIXED ``pattern_type`` matches bindings of exactly that pattern and name."""

    principal: str | None = None
    host: str | None = None
    operation: Operation | None = None
    permission: Permission | None = None
    resource_type: ResourceType | None = None
    resource_name: str | None = None
    pattern_type: PatternType | None = None

    def matches(self, binding: AclBinding) -> bool:
        return (
            (self.principal is None or self.principal == binding.principal)
            and (self.host is None or self.host == binding.host)
            and (self.operation is None or self.operation is binding.operation)
            and (self.permission is None or self.permission is binding.permission)
            and (self.resource_type is None or self.resource_type is binding.resource_type)
            and (self.resource_name is None or self.resource_name == binding.resource_name)
            and (self.pattern_type is None or self.pattern_type is binding.pattern_type)
        )


def parse_principals(text: str) -> frozenset[str]:
    """``super.users``: ``User:alice;User:bob`` (Kafka separates them with semicolons)."""
    return frozenset(p.strip() for p in text.split(";") if p.strip())


class Authorizer:
    """Decides requests from a fixed set of bindings (see the module). Immutable."""

    def __init__(
        self,
        bindings: Iterable[AclBinding],
        *,
        super_users: frozenset[str] = frozenset(),
        allow_if_no_acl: bool = False,
    ) -> None:
        self.bindings: tuple[AclBinding, ...] = tuple(dict.fromkeys(bindings))
        self._super_users = super_users
        self._allow_if_no_acl = allow_if_no_acl

    def authorize(
        self,
        principal: str | None,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        """Whether ``principal`` from ``host`` may do ``operation`` on the resource."""
        principal = principal or ANONYMOUS
        if principal in self._super_users:
            return True
        relevant = [b for b in self.bindings if b.matches_resource(resource_type, name)]
        if not relevant:
            return self._allow_if_no_acl
        mine = [
            b
            for b in relevant
            if b.principal in (principal, "User:*") and b.host in (host, WILDCARD)
        ]
        if any(
            b.permission is Permission.DENY and b.operation in (operation, Operation.ALL)
            for b in mine
        ):
            return False
        allowed_by = {operation, Operation.ALL, *_IMPLIED_BY.get(operation, ())}
        return any(b.permission is Permission.ALLOW and b.operation in allowed_by for b in mine)

    def authorize_any(
        self, principal: str | None, host: str, operation: Operation, resource_type: ResourceType
    ) -> bool:
        """Whether the principal may do ``operation`` on at least one resource of the
        type (Kafka's rule for idempotent producers: WRITE on any topic). A super user,
        or an ALLOW binding for it that no DENY of the same pattern cancels."""
        principal = principal or ANONYMOUS
        if principal in self._super_users:
            return True
        mine = [
            b
            for b in self.bindings
            if b.resource_type is resource_type
            and b.principal in (principal, "User:*")
            and b.host in (host, WILDCARD)
        ]
        denied = {
            (b.resource_name, b.pattern_type)
            for b in mine
            if b.permission is Permission.DENY and b.operation in (operation, Operation.ALL)
        }
        return any(
            b.permission is Permission.ALLOW
            and b.operation in (operation, Operation.ALL)
            and (b.resource_name, b.pattern_type) not in denied
            and (WILDCARD, PatternType.LITERAL) not in denied
            for b in mine
        )

    def matching(self, acl_filter: AclFilter) -> Sequence[AclBinding]:
        return [b for b in self.bindings if acl_filter.matches(b)]
