"""SCRAM users: where the stored credentials live (``broker.core.scram.ScramCredential``).

Two stores behind one protocol, ``UserStore``:

- ``FileUserStore``, a single node: ``<data dir>/scram-credentials.json``, written
  atomically (``storage.files.atomic_write``: temp file, fsync, rename, fsync the
  directory) and made readable by the owner only. ``tidelog users add NAME --password-file F
  --data-dir D`` writes it before the broker first starts (the first super user);
- ``ZooKeeperUserStore``, cluster mode: Kafka's ``/config/users/<name>`` znodes, read by
  every broker at each login (logins are rare; no cache to go stale), with the data
  directory's file as the fallback for a user made there before the cluster had any.

Both keep Kafka's JSON, per user::

    {"version": 1,
     "config": {"SCRAM-SHA-256": "salt=..,stored_key=..,server_key=..,iterations=4096"}}

(the file holds ``{"version": 1, "users": {NAME: <that config>}}``). No password, nor
anything a client could log in with, is ever stored (``broker.core.scram``).

Thread-safe: each store owns a lock (``FileUserStore._lock`` guards its map and file).
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tidelog.broker.core.scram import MECHANISMS, ScramCredential, ScramError
from tidelog.storage.errors import InvalidConfigError, InvalidRequestError
from tidelog.storage.files import atomic_write

if TYPE_CHECKING:
    from tidelog.broker.cluster.store import ClusterStore

__all__ = [
    "CREDENTIALS_FILE",
    "FileUserStore",
    "UserStore",
    "ZooKeeperUserStore",
    "check_user_name",
]

CREDENTIALS_FILE = "scram-credentials.json"
_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,249}$")


def check_user_name(name: str) -> str:
    """A user name: 1-249 of letters, digits, ``. _ @ -``. Raises ``InvalidRequestError``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequestError(
            f"invalid user name {name!r}: 1-249 letters, digits, '.', '_', '@' or '-'"
        )
    return name


def _encode_user(credentials: dict[str, ScramCredential]) -> dict[str, object]:
    return {
        "version": 1,
        "config": {m: c.to_text() for m, c in sorted(credentials.items())},
    }


def _decode_user(document: object, where: str) -> dict[str, ScramCredential]:
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        raise InvalidConfigError(f"{where}: not a SCRAM user document")
    out: dict[str, ScramCredential] = {}
    for mechanism, text in document["config"].items():
        if mechanism in MECHANISMS and isinstance(text, str):
            try:
                out[mechanism] = ScramCredential.from_text(mechanism, text)
            except ScramError as exc:
                raise InvalidConfigError(f"{where}: {exc}") from None
    return out


class UserStore(Protocol):
    """Where SCRAM credentials live. Implementations are thread-safe."""

    def get(self, name: str, mechanism: str) -> ScramCredential | None:
        """The user's credential for ``mechanism``, or None."""
        ...

    def upsert(self, name: str, credential: ScramCredential) -> None:
        """Add or replace the user's credential for ``credential.mechanism``."""
        ...

    def delete(self, name: str, mechanism: str | None) -> bool:
        """Remove one mechanism's credential (None: the whole user); False if absent."""
        ...

    def users(self) -> dict[str, dict[str, ScramCredential]]:
        """Every user's credentials by mechanism."""
        ...


class FileUserStore:
    """The data directory's credentials file. Thread-safe. Build with ``open``."""

    def __init__(self, path: Path, users: dict[str, dict[str, ScramCredential]]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._users = users  # guarded by _lock

    @classmethod
    def open(cls, data_dir: str | Path) -> FileUserStore:
        """Read ``<data_dir>/scram-credentials.json`` (none yet: no users).

        Raises ``InvalidConfigError`` if the file exists and is not a credentials file.
        """
        path = Path(data_dir) / CREDENTIALS_FILE
        users: dict[str, dict[str, ScramCredential]] = {}
        try:
            document = json.loads(path.read_bytes())
        except FileNotFoundError:
            return cls(path, users)
        except (OSError, ValueError) as exc:
            raise InvalidConfigError(f"cannot read {path}: {exc}") from None
        if not isinstance(document, dict) or not isinstance(document.get("users"), dict):
            raise InvalidConfigError(f"{path}: not a SCRAM credentials file")
        for name, entry in document["users"].items():
            users[name] = _decode_user(entry, f"{path} user {name}")
        return cls(path, users)

    def get(self, name: str, mechanism: str) -> ScramCredential | None:
        with self._lock:
            return self._users.get(name, {}).get(mechanism)

    def upsert(self, name: str, credential: ScramCredential) -> None:
        check_user_name(name)
        with self._lock:
            users = {n: dict(c) for n, c in self._users.items()}
            users.setdefault(name, {})[credential.mechanism] = credential
            self._write_locked(users)

    def delete(self, name: str, mechanism: str | None) -> bool:
        with self._lock:
            if name not in self._users or (
                mechanism is not None and mechanism not in self._users[name]
            ):
                return False
            users = {n: dict(c) for n, c in self._users.items()}
            if mechanism is None:
                del users[name]
            else:
                del users[name][mechanism]
                if not users[name]:
                    del users[name]
            self._write_locked(users)
            return True

    def users(self) -> dict[str, dict[str, ScramCredential]]:
        with self._lock:
            return {n: dict(c) for n, c in self._users.items()}

    def _write_locked(self, users: dict[str, dict[str, ScramCredential]]) -> None:
        document = {
            "version": 1,
            "users": {n: _encode_user(c) for n, c in sorted(users.items())},
        }
        atomic_write(self.path, json.dumps(document, indent=1).encode())
        os.chmod(self.path, 0o600)  # salted hashes only, still nobody else's business
        self._users = users


class ZooKeeperUserStore:
    """Kafka's ``/config/users/<name>`` znodes, shared by every broker. Thread-safe
    (kazoo is); ``fallback`` (the data directory's file) answers for users not there."""

    def __init__(self, store: ClusterStore, fallback: FileUserStore | None = None) -> None:
        self._store = store
        self._fallback = fallback

    def _read(self, name: str) -> dict[str, ScramCredential] | None:
        data = self._store.read_user(name)
        if data is None:
            return None
        try:
            document = json.loads(data)
        except ValueError:
            raise InvalidConfigError(f"/config/users/{name}: not JSON") from None
        return _decode_user(document, f"/config/users/{name}")

    def get(self, name: str, mechanism: str) -> ScramCredential | None:
        found = self._read(name)
        if found is None:
            return self._fallback.get(name, mechanism) if self._fallback else None
        return found.get(mechanism)

    def upsert(self, name: str, credential: ScramCredential) -> None:
        check_user_name(name)
        credentials = self._read(name) or {}
        credentials[credential.mechanism] = credential
        self._store.write_user(name, json.dumps(_encode_user(credentials)).encode())

    def delete(self, name: str, mechanism: str | None) -> bool:
        credentials = self._read(name)
        if credentials is None or (mechanism is not None and mechanism not in credentials):
            return False
        if mechanism is not None:
            del credentials[mechanism]
        if mechanism is None or not credentials:
            return self._store.delete_user(name)
        self._store.write_user(name, json.dumps(_encode_user(credentials)).encode())
        return True

    def users(self) -> dict[str, dict[str, ScramCredential]]:
        out = self._fallback.users() if self._fallback else {}
        for name in self._store.user_names():
            found = self._read(name)
            if found is not None:
                out[name] = found
        return out
