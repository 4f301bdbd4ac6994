"""The gRPC handlers of the security RPCs: ``Authenticate``, the SCRAM user calls and the
ACL calls (``CreateAcls``, ``DescribeAcls``, ``DeleteAcls``).

Plain functions ``(core, request, context) -> response`` like the rest of
``broker.grpc.service``'s table (which includes ``SECURITY_HANDLERS``): convert, call
``core.authenticator`` (``broker.core.auth``) or ``core.user_admin``
(``broker.core.user_admin``, which Kafka's KIP-554 APIs call too), convert back. User
changes are written to the audit log there, with who made them and from where; a
credential never appears in a log or an answer
(``ListUsers`` gives names, mechanisms and iteration counts only).

Who may change users or ACLs is the authorizer's business (``ALTER`` on the cluster);
these handlers only do the work. ACL changes go to ``core.acls`` (``broker.core.acl_store``)
with the caller's principal, which it records; an empty or ``ANY`` field of a filter
matches everything, and a new binding's pattern type defaults to LITERAL, as Kafka's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidelog.broker.core.acl import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    parse_enum,
)
from tidelog.broker.core.auth import Authenticator
from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.core.user_admin import UserAdmin
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import InvalidRequestError

__all__ = ["SECURITY_HANDLERS"]


def _authenticator(core: BrokerCore) -> Authenticator:
    if core.authenticator is None:
        raise InvalidRequestError("this broker runs without authentication")
    return core.authenticator


def _authenticate(
    core: BrokerCore, request: pb.AuthenticateRequest, context: RequestContext
) -> pb.AuthenticateResponse:
    authenticator = _authenticator(core)
    step = authenticator.authenticate(
        context,
        request.mechanism,
        request.auth_bytes,
        request.handshake_id,
        tls=authenticator.config.tls,
    )
    return pb.AuthenticateResponse(
        auth_bytes=step.auth_bytes,
        handshake_id=step.handshake_id,
        complete=step.complete,
        session_token=step.session_token,
        session_lifetime_ms=step.session_lifetime_ms,
        principal=step.principal,
    )


def _user_admin(core: BrokerCore) -> UserAdmin:
    _authenticator(core)
    assert core.user_admin is not None  # built with the authenticator
    return core.user_admin


def _upsert_user(
    core: BrokerCore, request: pb.UpsertUserRequest, context: RequestContext
) -> pb.UpsertUserResponse:
    _user_admin(core).upsert(
        request.name,
        request.mechanism,
        salt=request.salt,
        iterations=request.iterations,
        salted_password=request.salted_password,
        context=context,
    )
    return pb.UpsertUserResponse()


def _delete_user(
    core: BrokerCore, request: pb.DeleteUserRequest, context: RequestContext
) -> pb.DeleteUserResponse:
    _user_admin(core).delete(request.name, request.mechanism or None, context=context)
    return pb.DeleteUserResponse()


def _list_users(
    core: BrokerCore, request: pb.ListUsersRequest, context: RequestContext
) -> pb.ListUsersResponse:
    users = _user_admin(core).users()
    return pb.ListUsersResponse(
        users=[
            pb.UserCredentials(
                name=name,
                mechanisms=sorted(iterations),
                iterations=[iterations[m] for m in sorted(iterations)],
            )
            for name, iterations in sorted(users.items())
        ]
    )


def _acl_binding(binding: AclBinding) -> pb.AclBinding:
    return pb.AclBinding(
        resource_type=binding.resource_type.value,
        resource_name=binding.resource_name,
        pattern_type=binding.pattern_type.value,
        principal=binding.principal,
        host=binding.host,
        operation=binding.operation.value,
        permission=binding.permission.value,
    )


def _acl_filter(request: pb.AclFilter) -> AclFilter:
    def pick(kind: Any, value: str, what: str) -> Any:
        if not value or value.upper() == "ANY":
            return None
        return parse_enum(kind, value, what)

    return AclFilter(
        principal=request.principal or None,
        host=request.host or None,
        operation=pick(Operation, request.operation, "operation"),
        permission=pick(Permission, request.permission, "permission"),
        resource_type=pick(ResourceType, request.resource_type, "resource type"),
        resource_name=request.resource_name or None,
        pattern_type=pick(PatternType, request.pattern_type, "pattern type"),
    )


def _create_acls(
    core: BrokerCore, request: pb.CreateAclsRequest, context: RequestContext
) -> pb.CreateAclsResponse:
    core.acls.create(
        [
            AclBinding.parse(
                principal=a.principal,
                host=a.host,
                operation=a.operation,
                permission=a.permission,
                resource_type=a.resource_type,
                resource_name=a.resource_name,
                pattern_type=a.pattern_type or "LITERAL",
            )
            for a in request.acls
        ],
        context.principal,
    )
    return pb.CreateAclsResponse()


def _describe_acls(
    core: BrokerCore, request: pb.AclFilter, context: RequestContext
) -> pb.DescribeAclsResponse:
    found = core.acls.describe(_acl_filter(request))
    return pb.DescribeAclsResponse(acls=[_acl_binding(b) for b in found])


def _delete_acls(
    core: BrokerCore, request: pb.AclFilter, context: RequestContext
) -> pb.DeleteAclsResponse:
    removed = core.acls.delete(_acl_filter(request), context.principal)
    return pb.DeleteAclsResponse(deleted=[_acl_binding(b) for b in removed])


SECURITY_HANDLERS: dict[str, Callable[[BrokerCore, Any, RequestContext], Any]] = {
    "Authenticate": _authenticate,
    "UpsertUser": _upsert_user,
    "DeleteUser": _delete_user,
    "ListUsers": _list_users,
    "CreateAcls": _create_acls,
    "DescribeAcls": _describe_acls,
    "DeleteAcls": _delete_acls,
}
