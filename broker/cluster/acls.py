"""ACL bindings in ZooKeeper (cluster mode): one document every broker watches.

The document is ``broker.core.acl_store``'s format in the znode ``/tidelog/acls``. A change is
read-modify-write by compare-and-set on the znode version, retried on a race, so two
brokers adding bindings at once both land. Every broker watches the znode and rebuilds its
``Authorizer`` from each new version, so a binding added through any broker applies on
all within a watch's delay. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from tidelog.broker.cluster.store import ClusterStore, StaleStateError
from tidelog.broker.cluster.znodes import ACLS
from tidelog.broker.core.acl import AclBinding, AclFilter
from tidelog.broker.core.acl_store import decode_acls, encode_acls

__all__ = ["ZooKeeperAclStore"]

log = logging.getLogger(__name__)

_ATTEMPTS = 20


class ZooKeeperAclStore:
    """``broker.core.acl_store.AclStore`` on ZooKeeper."""

    def __init__(self, store: ClusterStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._bindings: list[AclBinding] = []
        self._callbacks: list[Callable[[list[AclBinding]], None]] = []

    @classmethod
    def open(cls, store: ClusterStore) -> ZooKeeperAclStore:
        """Read the document now and watch it from then on. Raises ``StoreError``."""
        acls = cls(store)
        acls._reload()
        store.watch_data(ACLS, lambda _data: acls._reload_quietly())
        return acls

    def _reload_quietly(self) -> None:
        # kazoo's watch thread: a plain read, never a write.
        try:
            self._reload()
        except Exception:
            log.exception("cannot read the ACLs from ZooKeeper; keeping the last ones")

    def _reload(self) -> None:
        found = self._store.read_document(ACLS)
        bindings = [] if found is None else decode_acls(found[0], ACLS)
        with self._lock:
            self._bindings = bindings
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback(list(bindings))

    def bindings(self) -> list[AclBinding]:
        with self._lock:
            return list(self._bindings)

    def on_change(self, callback: Callable[[list[AclBinding]], None]) -> None:
        with self._lock:
            self._callbacks.append(callback)

    def add(self, bindings: Sequence[AclBinding]) -> None:
        self._update(lambda current: (list(dict.fromkeys([*current, *bindings])), []))

    def remove(self, acl_filter: AclFilter) -> list[AclBinding]:
        return self._update(
            lambda current: (
                [b for b in current if not acl_filter.matches(b)],
                [b for b in current if acl_filter.matches(b)],
            )
        )

    def _update(
        self, change: Callable[[list[AclBinding]], tuple[list[AclBinding], list[AclBinding]]]
    ) -> list[AclBinding]:
        for _ in range(_ATTEMPTS):
            found = self._store.read_document(ACLS)
            current = [] if found is None else decode_acls(found[0], ACLS)
            kept, removed = change(current)
            try:
                self._store.write_document(
                    ACLS, encode_acls(kept), -1 if found is None else found[1]
                )
            except StaleStateError:
                continue  # another broker changed them meanwhile: decide again
            self._reload()
            return removed
        raise StaleStateError(f"{ACLS} kept changing; gave up after {_ATTEMPTS} attempts")
