"""Managing SCRAM users, listener-neutral: the one core call behind gRPC's ``UpsertUser``,
``DeleteUser``, ``ListUsers`` and Kafka's DescribeUserScramCredentials (key 50) and
AlterUserScramCredentials (key 51, KIP-554).

The credential arrives salted: the client picks the salt and iterations and sends
SaltedPassword (PBKDF2 of the password), as Kafka's admin clients do; the broker derives
StoredKey and ServerKey from it (``broker.core.scram.credential_from_salted``) and stores
those only (``broker.core.users``: a single node's data directory, ZooKeeper's
``/config/users`` in a cluster, read by every broker at each login, so a change made
through one broker is the next login's on every broker).

Kafka's rules for a batch (``alter``), per user, with Kafka's error names as the result
codes (``broker.kafka.errors.kafka_code`` turns them into numbers):

- a user whose (user, mechanism) pair appears twice in the request, among deletions and
  upsertions together, gets ``DUPLICATE_RESOURCE`` and none of its changes apply
  (Kafka: "a user credential cannot be altered twice in the same request");
- an empty or invalid user name: ``UNACCEPTABLE_CREDENTIAL``; a mechanism other than
  SCRAM-SHA-256 (1) or SCRAM-SHA-512 (2): ``UNSUPPORTED_SASL_MECHANISM``; iterations
  outside 4096..16384, a salt under 16 bytes or an empty salted password:
  ``UNACCEPTABLE_CREDENTIAL``; deleting a credential that does not exist:
  ``RESOURCE_NOT_FOUND``. A user with any of these gets the first one and nothing of it
  changes; the other users of the request are applied.

``describe`` names users (None or empty: every user with a credential); a user named twice
gets ``DUPLICATE_RESOURCE``, an unknown one ``RESOURCE_NOT_FOUND``.

Authorization (ALTER or DESCRIBE on the cluster) is the pipeline's (``operations.py``'s
``alter_users`` / ``describe_users``); changes are written to the audit log here, with who
made them. Thread-safe: the store is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidelog.broker.core.audit import audit
from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.scram import (
    MAX_ITERATIONS,
    MECHANISMS,
    MIN_ITERATIONS,
    ScramError,
    credential_from_salted,
)
from tidelog.broker.core.users import UserStore, check_user_name
from tidelog.storage.errors import InvalidRequestError, ResourceNotFoundError

__all__ = [
    "MECHANISM_NUMBERS",
    "MIN_SALT_BYTES",
    "UserAdmin",
    "UserChange",
    "UserDescription",
]

# Kafka's ScramMechanism type numbers (0 is UNKNOWN).
MECHANISM_NUMBERS: dict[str, int] = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MIN_SALT_BYTES = 16


@dataclass(frozen=True, slots=True)
class UserChange:
    """One alteration of a batch: an upsertion (``salted_password`` set) or a deletion.
    ``mechanism`` is the name as given (an unknown one is refused per user)."""

    name: str
    mechanism: str
    iterations: int = 0
    salt: bytes = b""
    salted_password: bytes | None = None

    @property
    def is_upsertion(self) -> bool:
        return self.salted_password is not None


@dataclass(frozen=True, slots=True)
class UserDescription:
    """A described user: mechanism -> iterations, or the error code (Kafka's name) and
    message that stand for it."""

    name: str
    iterations: dict[str, int]
    error: str = ""
    message: str | None = None


class _RefusedError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class UserAdmin:
    """Upsert, delete and describe SCRAM users over a ``UserStore``. Thread-safe."""

    def __init__(self, users: UserStore) -> None:
        self._users = users

    # The gRPC calls: one change each, errors raised.

    def upsert(
        self,
        name: str,
        mechanism: str,
        *,
        salt: bytes,
        iterations: int,
        salted_password: bytes,
        context: RequestContext,
    ) -> None:
        """Add or replace one credential. Raises ``InvalidRequestError`` for a bad name,
        mechanism, salt or iteration count."""
        change = UserChange(name, mechanism.upper(), iterations, salt, salted_password)
        try:
            self._apply([change], context)
        except _RefusedError as exc:
            raise InvalidRequestError(exc.message) from None

    def delete(self, name: str, mechanism: str | None, *, context: RequestContext) -> None:
        """Remove one mechanism's credential, or the whole user (None). Raises
        ``ResourceNotFoundError`` if there is none, ``InvalidRequestError`` for an unknown
        mechanism."""
        if mechanism is not None and mechanism.upper() not in MECHANISMS:
            raise InvalidRequestError(_unsupported(mechanism))
        mechanism = mechanism.upper() if mechanism is not None else None
        if not self._users.delete(name, mechanism):
            raise ResourceNotFoundError(
                f"no user {name!r}" + (f" with {mechanism}" if mechanism else "")
            )
        _audit_deleted(name, mechanism, context)

    def users(self) -> dict[str, dict[str, int]]:
        """Every user: mechanism -> iterations (never a credential)."""
        return {
            name: {m: c.iterations for m, c in credentials.items()}
            for name, credentials in self._users.users().items()
        }

    # Kafka's batches: per-user results.

    def describe(self, names: Sequence[str] | None) -> list[UserDescription]:
        """Kafka's DescribeUserScramCredentials: the named users (None or empty: all)."""
        everyone = self.users()
        if not names:
            return [
                UserDescription(n, dict(sorted(m.items()))) for n, m in sorted(everyone.items())
            ]
        out: list[UserDescription] = []
        counted = {name: names.count(name) for name in dict.fromkeys(names)}
        for name, count in counted.items():
            if count > 1:
                out.append(
                    UserDescription(
                        name,
                        {},
                        "DUPLICATE_RESOURCE",
                        "Cannot describe SCRAM credentials for the same user twice in a "
                        "single request",
                    )
                )
            elif name not in everyone:
                out.append(
                    UserDescription(
                        name,
                        {},
                        "RESOURCE_NOT_FOUND",
                        "Attempt to describe a user credential that does not exist",
                    )
                )
            else:
                out.append(UserDescription(name, dict(sorted(everyone[name].items()))))
        return out

    def alter(
        self, changes: Sequence[UserChange], context: RequestContext
    ) -> dict[str, tuple[str, str | None]]:
        """Kafka's AlterUserScramCredentials: every user of ``changes`` -> (error code or
        "", message). See the module docstring for the rules."""
        by_user: dict[str, list[UserChange]] = {}
        for change in changes:
            by_user.setdefault(change.name, []).append(change)
        results: dict[str, tuple[str, str | None]] = {}
        for name, mine in by_user.items():
            pairs = [c.mechanism for c in mine]
            if len(pairs) != len(set(pairs)):
                results[name] = (
                    "DUPLICATE_RESOURCE",
                    "A user credential cannot be altered twice in the same request",
                )
                continue
            try:
                self._apply(mine, context)
            except _RefusedError as exc:
                results[name] = (exc.code, exc.message)
            else:
                results[name] = ("", None)
        return results

    def _apply(self, changes: Sequence[UserChange], context: RequestContext) -> None:
        """Check every change of one user, then apply them all (none if one is refused).
        Raises ``_RefusedError``."""
        existing = self.users()
        credentials = []
        for change in changes:
            if not change.name:
                raise _RefusedError("UNACCEPTABLE_CREDENTIAL", "Username must not be empty")
            try:
                check_user_name(change.name)
            except InvalidRequestError as exc:
                raise _RefusedError("UNACCEPTABLE_CREDENTIAL", str(exc)) from None
            if change.mechanism not in MECHANISMS:
                raise _RefusedError("UNSUPPORTED_SASL_MECHANISM", _unsupported(change.mechanism))
            if not change.is_upsertion:
                if change.mechanism not in existing.get(change.name, {}):
                    raise _RefusedError(
                        "RESOURCE_NOT_FOUND",
                        "Attempt to delete a user credential that does not exist",
                    )
                continue
            if not MIN_ITERATIONS <= change.iterations <= MAX_ITERATIONS:
                raise _RefusedError(
                    "UNACCEPTABLE_CREDENTIAL",
                    f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, "
                    f"got {change.iterations}",
                )
            if len(change.salt) < MIN_SALT_BYTES or not change.salted_password:
                raise _RefusedError(
                    "UNACCEPTABLE_CREDENTIAL",
                    f"a credential needs a salt of {MIN_SALT_BYTES} bytes or more and a "
                    "salted password",
                )
            try:
                credentials.append(
                    credential_from_salted(
                        change.mechanism, change.salt, change.iterations, change.salted_password
                    )
                )
            except ScramError as exc:
                raise _RefusedError("UNACCEPTABLE_CREDENTIAL", str(exc)) from None
        for change in changes:
            if not change.is_upsertion:
                self._users.delete(change.name, change.mechanism)
                _audit_deleted(change.name, change.mechanism, context)
        for credential, change in zip(
            credentials, [c for c in changes if c.is_upsertion], strict=True
        ):
            self._users.upsert(change.name, credential)
            audit(
                {
                    "event": "user_upserted",
                    "user": change.name,
                    "mechanism": change.mechanism,
                    "iterations": change.iterations,
                    "principal": context.principal,
                    "peer": context.peer,
                    "listener": context.listener,
                }
            )


def _unsupported(mechanism: str) -> str:
    return f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}"


def _audit_deleted(name: str, mechanism: str | None, context: RequestContext) -> None:
    audit(
        {
            "event": "user_deleted",
            "user": name,
            "mechanism": mechanism,
            "principal": context.principal,
            "peer": context.peer,
            "listener": context.listener,
        }
    )
