"""The security and quota calls of ``AdminClient`` (``client.admin``): ACLs, SCRAM users
and client quotas.

``SecurityAdminCalls`` is mixed into ``AdminClient`` and is not used alone. ACLs and users
are shared by a cluster through ZooKeeper, so they go to any broker, over the gRPC
transport (they are not in the ``Connection`` protocol yet: ``InvalidRequestError`` on
another connection); a SCRAM password never leaves the process (a salt and the salted
password are sent). Client quotas are a limit per broker, as Kafka's: changes go to every
live broker, and a description merges every live broker's answer, the lowest broker id's
winning where they disagree (with a warning naming the entity).

Thread-safe, as ``AdminClient`` is.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from tidelog.client.acls import AclBinding, AclFilter
from tidelog.client.connection import Connection
from tidelog.client.grpc_connection import GrpcConnection
from tidelog.client.routing import ClusterConnections
from tidelog.client.security import salted_credential
from tidelog.client.types import (
    QuotaEntity,
)
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import (
    InvalidRequestError,
)

__all__ = ["SecurityAdminCalls"]

log = logging.getLogger(__name__)


class SecurityAdminCalls:
    """``AdminClient``'s ACL, user and quota calls. Thread-safe; needs ``_connections``."""

    _connections: ClusterConnections

    # --- ACLs ----------------------------------------------------------------------------

    def create_acls(self, bindings: Iterable[AclBinding], *, timeout_ms: int | None = None) -> None:
        """Add ACL bindings (kept if already there). Needs ALTER on the cluster; raises
        ``SecurityDisabledError`` on a broker without an authorizer, ``InvalidRequestError``
        for a malformed binding."""
        request = pb.CreateAclsRequest(acls=[b.to_wire() for b in bindings])
        self._on_any_grpc("CreateAcls", request, timeout_ms)

    def describe_acls(
        self, acl_filter: AclFilter | None = None, *, timeout_ms: int | None = None
    ) -> list[AclBinding]:
        """The bindings matching ``acl_filter`` (all without one). Needs DESCRIBE on the
        cluster."""
        request = (acl_filter or AclFilter()).to_wire()
        answer = self._on_any_grpc("DescribeAcls", request, timeout_ms)
        return [AclBinding.from_wire(b) for b in answer.acls]

    def delete_acls(
        self, acl_filter: AclFilter, *, timeout_ms: int | None = None
    ) -> list[AclBinding]:
        """Remove the bindings matching ``acl_filter``; returns them. Needs ALTER on the
        cluster."""
        answer = self._on_any_grpc("DeleteAcls", acl_filter.to_wire(), timeout_ms)
        return [AclBinding.from_wire(b) for b in answer.deleted]

    def _on_any_grpc(self, method: str, request: object, timeout_ms: int | None) -> Any:
        """A call not in the ``Connection`` protocol yet (ACLs, users) on any broker (a
        cluster shares them through ZooKeeper), over the connection's gRPC transport."""

        def call(connection: Connection, timeout: int) -> Any:
            if not isinstance(connection, GrpcConnection):
                raise InvalidRequestError(f"{method} needs a gRPC connection")
            transport = connection.transport
            return transport.call(
                getattr(transport.stub, method), request, what=method, timeout_ms=timeout
            )

        return self._connections.run(
            self._connections.route_any(), call, what=method, timeout_ms=timeout_ms
        )

    # --- client quotas --------------------------------------------------------------------

    def alter_client_quotas(
        self,
        client_id: str | None = None,
        quotas: Mapping[str, float] | None = None,
        delete: Iterable[str] = (),
        *,
        user: str | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        """Set ``quotas`` and remove the ``delete`` ones of a client id, a user, or a user
        with a client id (Kafka's ``AlterClientQuotas``; ``"<default>"`` in either place:
        every client id or user without an entry of its own).

        Quotas: ``producer_byte_rate`` and ``consumer_byte_rate`` (bytes per second),
        ``request_percentage`` (percent of one broker storage thread). A client over a
        quota gets its answers late by the throttle time. For each quota the most
        specific entity that sets it applies, in Kafka's order (user and client id, user,
        default user, client id, default client: ``docs/security.md``); the clients one
        entity matches share its rate (a user's quota binds all its client ids together).
        The user is the authenticated principal's name; without authentication it is
        ``ANONYMOUS``. Raises ``InvalidRequestError`` for an unknown quota name, a value
        that is not positive, or neither a user nor a client id.

        As in Kafka a quota is a limit per broker: each broker throttles the traffic it
        serves. In a cluster the change is sent to every live broker (asked again until
        the timeout if one cannot be reached); each keeps it in its data directory. A
        broker down at the time, or one that joins later, does not get it
        (``docs/cluster.md``, "Known gaps"): set it again then.
        """
        if not client_id and not user:
            raise InvalidRequestError("a quota needs a client id, a user, or both")
        set_quotas = {k: float(v) for k, v in (quotas or {}).items()}
        keys = list(delete)
        entity = QuotaEntity(user, client_id)
        self._connections.run_on_every_broker(
            lambda connection, timeout: connection.alter_client_quotas(
                client_id or "", set_quotas, keys, user=user or "", timeout_ms=timeout
            ),
            what=f"AlterClientQuotas {entity}",
            timeout_ms=timeout_ms,
        )

    def describe_client_quotas(
        self, client_id: str | None = None, *, timeout_ms: int | None = None
    ) -> dict[str, dict[str, float]]:
        """The quotas of client ids (entities without a user), by client id: one client
        id's, or every one's if None. ``describe_quotas`` lists users' too."""
        found = self.describe_quotas(client_id=client_id, users=False, timeout_ms=timeout_ms)
        return {e.client_id: v for e, v in found.items() if e.client_id is not None}

    def describe_quotas(
        self,
        *,
        user: str | None = None,
        client_id: str | None = None,
        users: bool = True,
        timeout_ms: int | None = None,
    ) -> dict[QuotaEntity, dict[str, float]]:
        """The quotas set, by entity: those of ``user`` and ``client_id`` when given
        (``"<default>"`` names the default entity); ``users`` False leaves out entities
        with a user part.

        Every live broker is asked. Where brokers disagree (one missed a change while it
        was down) the lowest broker id's quotas are shown and a warning is logged naming
        the entity.
        """
        answers = self._connections.run_on_every_broker(
            lambda connection, timeout: connection.describe_client_quotas(
                client_id or "", user=user or "", include_users=users, timeout_ms=timeout
            ),
            what="DescribeClientQuotas",
            timeout_ms=timeout_ms,
        )
        merged: dict[QuotaEntity, dict[str, float]] = {}
        for _, quotas in sorted(answers.items()):
            for entity, values in quotas.items():
                if users or entity.user is None:
                    merged.setdefault(entity, values)
        for entity in merged:
            if any(quotas.get(entity) != merged[entity] for quotas in answers.values()):
                log.warning(
                    "%s has different quotas on different brokers: %s",
                    entity,
                    {broker_id: quotas.get(entity, {}) for broker_id, quotas in answers.items()},
                )
        return dict(sorted(merged.items(), key=lambda item: _entity_order(item[0])))

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
        request = pb.UpsertUserRequest(
            name=name,
            mechanism=mechanism,
            iterations=iterations,
            salt=salt,
            salted_password=salted,
        )
        self._on_any_grpc("UpsertUser", request, timeout_ms)

    def delete_user(
        self, name: str, mechanism: str | None = None, *, timeout_ms: int | None = None
    ) -> None:
        """Delete the user (every mechanism, or only ``mechanism``'s credential).

        Raises ``ResourceNotFoundError`` if there is no such user (or credential).
        """
        request = pb.DeleteUserRequest(name=name, mechanism=mechanism or "")
        self._on_any_grpc("DeleteUser", request, timeout_ms)

    def list_users(self, *, timeout_ms: int | None = None) -> dict[str, dict[str, int]]:
        """Every SCRAM user: name -> {mechanism: iterations}. No credential is shown."""
        answer = self._on_any_grpc("ListUsers", pb.ListUsersRequest(), timeout_ms)
        return {
            user.name: dict(zip(user.mechanisms, user.iterations, strict=False))
            for user in answer.users
        }


def _entity_order(entity: QuotaEntity) -> tuple[int, str, str]:
    """Users first, then client ids; by name."""
    return (entity.user is None, entity.user or "", entity.client_id or "")
