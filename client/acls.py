"""ACL bindings as the client sees them (``AdminClient.create_acls`` and friends).

Plain text fields with Kafka's names, so they read like ``kafka-acls`` output::

    AclBinding("User:alice", "READ", resource_type="TOPIC", resource_name="orders")
    AclBinding("User:bob", "WRITE", resource_name="logs-", pattern_type="PREFIXED",
               permission="DENY")

The broker validates them (``InvalidRequestError`` names what is wrong). An ``AclFilter``
field left None matches anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.proto.tidelog.v1 import broker_pb2 as pb

__all__ = ["CLUSTER", "AclBinding", "AclFilter"]

CLUSTER = "kafka-cluster"  # the one cluster resource's name


@dataclass(frozen=True, slots=True)
class AclBinding:
    """Allow (or deny) ``principal`` from ``host`` ``operation`` on matching resources."""

    principal: str
    operation: str
    resource_type: str = "TOPIC"
    resource_name: str = CLUSTER
    pattern_type: str = "LITERAL"
    permission: str = "ALLOW"
    host: str = "*"

    def to_wire(self) -> pb.AclBinding:
        return pb.AclBinding(
            resource_type=self.resource_type,
            resource_name=self.resource_name,
            pattern_type=self.pattern_type,
            principal=self.principal,
            host=self.host,
            operation=self.operation,
            permission=self.permission,
        )

    @classmethod
    def from_wire(cls, binding: pb.AclBinding) -> AclBinding:
        return cls(
            principal=binding.principal,
            operation=binding.operation,
            resource_type=binding.resource_type,
            resource_name=binding.resource_name,
            pattern_type=binding.pattern_type,
            permission=binding.permission,
            host=binding.host,
        )


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which bindings to describe or delete; None matches anything."""

    principal: str | None = None
    operation: str | None = None
    resource_type: str | None = None
    resource_name: str | None = None
    pattern_type: str | None = None
    permission: str | None = None
    host: str | None = None

    def to_wire(self) -> pb.AclFilter:
        return pb.AclFilter(
            resource_type=self.resource_type or "",
            resource_name=self.resource_name or "",
            pattern_type=self.pattern_type or "",
            principal=self.principal or "",
            host=self.host or "",
            operation=self.operation or "",
            permission=self.permission or "",
        )
