"""Where ACL bindings are kept, and the broker's authorization front (``Acls``).

* ``LocalAclStore`` (a single node): ``acls.json`` in the data directory, written with
  ``atomic_write`` before a change is answered::

      {"version": 1, "acls": [{"principal": "User:alice", "host": "*",
                               "operation": "READ", "permission": "ALLOW",
                               "resource_type": "TOPIC", "resource_name": "orders",
                               "pattern_type": "LITERAL"}, ...]}

* ``broker.cluster.acls.ZooKeeperAclStore`` (cluster mode): the same document in one
  znode, changed by compare-and-set and watched by every broker, so a binding added on one
  broker applies on all of them within a watch's delay.

``Acls`` holds the current ``Authorizer`` (rebuilt on every change) and the settings
``authorizer.enabled``, ``super.users`` and ``allow.everyone.if.no.acl.found``. With the
authorizer disabled (the default) every request is allowed and the ACL calls answer
``SECURITY_DISABLED``, as Kafka's do. Thread-safe.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

from tidelog.broker.core.acl import AclBinding, AclFilter, Authorizer, Operation, ResourceType
from tidelog.broker.core.audit import audit
from tidelog.storage.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    SecurityDisabledError,
    StorageError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from tidelog.storage.files import atomic_write

__all__ = [
    "ACLS_FILE",
    "AclStore",
    "Acls",
    "LocalAclStore",
    "decode_acls",
    "encode_acls",
]

log = logging.getLogger(__name__)

ACLS_FILE = "acls.json"
_VERSION = 1


def encode_acls(bindings: Iterable[AclBinding]) -> bytes:
    return json.dumps(
        {"version": _VERSION, "acls": [b.to_json() for b in bindings]}, sort_keys=True
    ).encode()


def decode_acls(data: bytes, what: str) -> list[AclBinding]:
    """Raises ``StorageError`` for anything but the documented format."""
    try:
        document = json.loads(data)
        if document.get("version") != _VERSION:
            raise ValueError(f"unsupported version {document.get('version')!r}")
        return [AclBinding.from_json(dict(entry)) for entry in document["acls"]]
    except Exception as exc:  # json, key, type and validation errors alike
        raise StorageError(f"{what} is damaged: {exc}") from exc


class AclStore(Protocol):
    """Durable bindings. Thread-safe."""

    def bindings(self) -> list[AclBinding]: ...

    def add(self, bindings: Sequence[AclBinding]) -> None: ...

    def remove(self, acl_filter: AclFilter) -> list[AclBinding]: ...

    def on_change(self, callback: Callable[[list[AclBinding]], None]) -> None: ...


class LocalAclStore:
    """``acls.json`` in a data directory (``path`` None: memory only, for tests)."""

    def __init__(self, path: Path | None, bindings: list[AclBinding]) -> None:
        self._path = path
        self._bindings = bindings
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[list[AclBinding]], None]] = []

    @classmethod
    def in_memory(cls) -> LocalAclStore:
        """A store that keeps nothing on disk (a core built without a data directory's)."""
        return cls(None, [])

    @classmethod
    def open(cls, data_dir: Path) -> LocalAclStore:
        path = data_dir / ACLS_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(path, [])
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror}") from exc
        return cls(path, decode_acls(raw, str(path)))

    def bindings(self) -> list[AclBinding]:
        with self._lock:
            return list(self._bindings)

    def add(self, bindings: Sequence[AclBinding]) -> None:
        with self._lock:
            self._write_locked(list(dict.fromkeys([*self._bindings, *bindings])))

    def remove(self, acl_filter: AclFilter) -> list[AclBinding]:
        with self._lock:
            removed = [b for b in self._bindings if acl_filter.matches(b)]
            if removed:
                self._write_locked([b for b in self._bindings if not acl_filter.matches(b)])
            return removed

    def on_change(self, callback: Callable[[list[AclBinding]], None]) -> None:
        self._callbacks.append(callback)

    def _write_locked(self, bindings: list[AclBinding]) -> None:
        if self._path is not None:
            try:
                atomic_write(self._path, encode_acls(bindings))
            except OSError as exc:
                raise StorageError(f"cannot write {self._path}: {exc.strerror}") from exc
        self._bindings = bindings
        for callback in self._callbacks:
            callback(list(bindings))


_DENIED = {
    ResourceType.TOPIC: TopicAuthorizationFailedError,
    ResourceType.GROUP: GroupAuthorizationFailedError,
    ResourceType.CLUSTER: ClusterAuthorizationFailedError,
    ResourceType.TRANSACTIONAL_ID: TransactionalIdAuthorizationFailedError,
}


class Acls:
    """The broker's authorization: settings, the store and the current ``Authorizer``."""

    def __init__(
        self,
        store: AclStore,
        *,
        enabled: bool,
        super_users: frozenset[str] = frozenset(),
        allow_if_no_acl: bool = False,
    ) -> None:
        self.enabled = enabled
        self._super_users = super_users
        self._allow_if_no_acl = allow_if_no_acl
        self._store = store
        self._authorizer = self._build(store.bindings())
        store.on_change(self._changed)

    def use_store(self, store: AclStore) -> None:
        """Cluster mode: the ZooKeeper store replaces the local one."""
        self._store = store
        store.on_change(self._changed)
        self._changed(store.bindings())

    def _build(self, bindings: Iterable[AclBinding]) -> Authorizer:
        return Authorizer(
            bindings, super_users=self._super_users, allow_if_no_acl=self._allow_if_no_acl
        )

    def _changed(self, bindings: list[AclBinding]) -> None:
        self._authorizer = self._build(bindings)
        log.info("ACLs: %d binding(s) in force", len(bindings))

    # --- decisions -------------------------------------------------------------------------

    def allowed(
        self,
        principal: str | None,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        if not self.enabled:
            return True
        return self._authorizer.authorize(principal, host, operation, resource_type, name)

    def allowed_any(
        self, principal: str | None, host: str, operation: Operation, resource_type: ResourceType
    ) -> bool:
        if not self.enabled:
            return True
        return self._authorizer.authorize_any(principal, host, operation, resource_type)

    def check(
        self,
        principal: str | None,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> None:
        """Raise the resource type's ``*AuthorizationFailedError`` unless allowed."""
        if self.allowed(principal, host, operation, resource_type, name):
            return
        who = principal or "User:ANONYMOUS"
        what = "the cluster" if resource_type is ResourceType.CLUSTER else repr(name)
        raise _DENIED[resource_type](
            f"{who} may not {operation.value} {resource_type.value.lower()} {what}"
        )

    # --- administration --------------------------------------------------------------------

    def _require_enabled(self) -> None:
        if not self.enabled:
            raise SecurityDisabledError("no authorizer is configured (authorizer.enabled=false)")

    def create(self, bindings: Sequence[AclBinding], principal: str | None = None) -> None:
        self._require_enabled()
        for binding in bindings:
            binding.validate()
        self._store.add(bindings)
        for binding in bindings:
            audit({"event": "acl_created", "principal": principal, **binding.to_json()})

    def describe(self, acl_filter: AclFilter) -> list[AclBinding]:
        self._require_enabled()
        return [b for b in self._store.bindings() if acl_filter.matches(b)]

    def delete(self, acl_filter: AclFilter, principal: str | None = None) -> list[AclBinding]:
        self._require_enabled()
        removed = self._store.remove(acl_filter)
        for binding in removed:
            audit({"event": "acl_deleted", "principal": principal, **binding.to_json()})
        return removed
