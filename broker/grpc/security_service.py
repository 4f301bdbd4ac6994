"""The gRPC handlers of the security RPCs: ``Authenticate`` and the SCRAM user calls.

Plain functions ``(core, request, context) -> response`` like the rest of
``broker.grpc.service``'s table (which includes ``SECURITY_HANDLERS``): convert, call
``core.authenticator`` (``broker.core.auth``) or its user store (``broker.core.users``),
convert back. User changes are written to the audit log (``broker.core.audit``) with who
made them and from where; a credential never appears in a log or an answer
(``ListUsers`` gives names, mechanisms and iteration counts only).

Who may change users is the authorizer's business (``ALTER`` on the cluster); these
handlers only do the work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidelog.broker.core.audit import audit
from tidelog.broker.core.auth import Authenticator
from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.core.scram import MECHANISMS, ScramError, credential_from_salted
from tidelog.broker.core.users import check_user_name
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import InvalidRequestError, ResourceNotFoundError

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


def _mechanism(name: str) -> str:
    mechanism = name.upper()
    if mechanism not in MECHANISMS:
        raise InvalidRequestError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {name!r}")
    return mechanism


def _upsert_user(
    core: BrokerCore, request: pb.UpsertUserRequest, context: RequestContext
) -> pb.UpsertUserResponse:
    users = _authenticator(core).users
    name = check_user_name(request.name)
    mechanism = _mechanism(request.mechanism)
    if len(request.salt) < 16 or not request.salted_password:
        raise InvalidRequestError("UpsertUser needs a salt of 16 bytes or more and SaltedPassword")
    try:
        credential = credential_from_salted(
            mechanism, request.salt, request.iterations, request.salted_password
        )
    except ScramError as exc:
        raise InvalidRequestError(str(exc)) from None
    users.upsert(name, credential)
    audit(
        {
            "event": "user_upserted",
            "user": name,
            "mechanism": mechanism,
            "iterations": request.iterations,
            "principal": context.principal,
            "peer": context.peer,
            "listener": context.listener,
        }
    )
    return pb.UpsertUserResponse()


def _delete_user(
    core: BrokerCore, request: pb.DeleteUserRequest, context: RequestContext
) -> pb.DeleteUserResponse:
    users = _authenticator(core).users
    mechanism = _mechanism(request.mechanism) if request.mechanism else None
    if not users.delete(request.name, mechanism):
        raise ResourceNotFoundError(
            f"no user {request.name!r}" + (f" with {mechanism}" if mechanism else "")
        )
    audit(
        {
            "event": "user_deleted",
            "user": request.name,
            "mechanism": mechanism,
            "principal": context.principal,
            "peer": context.peer,
            "listener": context.listener,
        }
    )
    return pb.DeleteUserResponse()


def _list_users(
    core: BrokerCore, request: pb.ListUsersRequest, context: RequestContext
) -> pb.ListUsersResponse:
    users = _authenticator(core).users.users()
    return pb.ListUsersResponse(
        users=[
            pb.UserCredentials(
                name=name,
                mechanisms=sorted(credentials),
                iterations=[credentials[m].iterations for m in sorted(credentials)],
            )
            for name, credentials in sorted(users.items())
        ]
    )


SECURITY_HANDLERS: dict[str, Callable[[BrokerCore, Any, RequestContext], Any]] = {
    "Authenticate": _authenticate,
    "UpsertUser": _upsert_user,
    "DeleteUser": _delete_user,
    "ListUsers": _list_users,
}
