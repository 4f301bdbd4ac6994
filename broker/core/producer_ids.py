"""Producer ids and epochs for idempotent producers (``InitProducerId``).

The broker hands every new idempotent producer a ``(producer_id, epoch 0)`` that is never
handed out again, across restarts, and re-initialising an existing producer bumps its
epoch so that batches from the old instance are fenced (the partition logs reject a lower
epoch once a higher one has written; ``storage/producer_state.py``). The per-partition
sequence check and the de-duplication of retried batches live in ``PartitionLog.append``;
this module only allocates.

State, one small JSON file in the data directory written with ``atomic_write`` before the
answer leaves (so an id handed out is never handed out again, whatever the crash)::

    {"version": 1,
     "next_producer_id": 17,
     "producers": {"12": [3, 1700000000000], ...},   # id -> [epoch, last init wall ms]
     "keys": {"spark:q1:0:0": 12, ...}}              # producer key -> id (optional field)

``producers`` remembers the current epoch of every id initialised or re-initialised within
``producer.id.expiration.ms``; older entries are dropped at the next write (Kafka's
``producer.id.expiration.ms`` plays the same part for its producer state). Re-initialising
an id whose entry expired trusts the epoch the producer sends: the partition logs still
fence any lower epoch.

Re-initialisation rules (``init``):

- ``(-1, -1)``: a new id, epoch 0.
- an id never handed out: ``UnknownProducerIdError``.
- an epoch other than the current one: ``InvalidProducerEpochError`` (another instance
  re-initialised it since: this one is fenced).
- the current epoch: epoch + 1; at the int16 ceiling (32767) a fresh id with epoch 0, as
  Kafka does when an epoch is exhausted.

Keyed producers (``init_keyed``): a caller-chosen key maps to one producer id for as long
as the key is used within ``producer.id.expiration.ms``; every ``init_keyed`` returns the
same id and its current epoch *without* bumping it, and refreshes the key. This is what an
effectively-once writer (the Spark sink, ``docs/spark.md``) builds on: a task that restarts
gets its old identity back and asks the partitions (``DescribeProducers``) how far that
identity got. Keys expire with their id's entry, so the file stays small.

The core sees producer ids through ``ProducerIdSource``. ``ProducerIdManager`` (this
module, the local file) serves a single node; in cluster mode (``zookeeper.connect``)
the broker swaps in ``broker.cluster.producer_ids.ZooKeeperProducerIds`` once it joined
the cluster, and ``UnavailableProducerIds`` until then (a local id could collide with one
another broker hands out).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Protocol

from tidelog.storage.clock import Clock
from tidelog.storage.errors import (
    BrokerUnavailableError,
    InvalidProducerEpochError,
    InvalidRequestError,
    StorageError,
    UnknownProducerIdError,
)
from tidelog.storage.files import atomic_write

__all__ = [
    "MAX_PRODUCER_EPOCH",
    "STATE_FILE_NAME",
    "ProducerIdManager",
    "ProducerIdSource",
    "UnavailableProducerIds",
    "check_init_request",
    "check_producer_key",
]

log = logging.getLogger(__name__)

STATE_FILE_NAME = "producer-ids.json"
MAX_PRODUCER_EPOCH = 32767  # int16, the batch header's producerEpoch field
_VERSION = 1
_MAX_KEY_CHARS = 1024


class ProducerIdSource(Protocol):
    """Where the core gets producer ids from (``InitProducerId``). Thread-safe."""

    def init(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """A new id (``-1, -1``: epoch 0) or the epoch bumped; see the module docstring."""
        ...

    def init_keyed(self, key: str) -> tuple[int, int]:
        """The key's id and current epoch (not bumped); a new id for a new or expired key."""
        ...


def check_init_request(producer_id: int, producer_epoch: int) -> bool:
    """True for a new producer (``-1, -1``), False for a valid re-initialisation.

    Raises ``InvalidRequestError`` for anything else.
    """
    new = producer_id == -1 and producer_epoch == -1
    if not new and (producer_id < 0 or not 0 <= producer_epoch <= MAX_PRODUCER_EPOCH):
        raise InvalidRequestError(
            "InitProducerId needs producer_id and producer_epoch both -1 (a new producer) "
            f"or both valid; got producer_id={producer_id}, epoch={producer_epoch}"
        )
    return new


def check_producer_key(key: str) -> None:
    """Raises ``InvalidRequestError`` unless ``key`` has 1 to 1,024 characters."""
    if not key or len(key) > _MAX_KEY_CHARS:
        raise InvalidRequestError(
            f"producer_key must be 1 to {_MAX_KEY_CHARS} characters, got {len(key)}"
        )


class UnavailableProducerIds:
    """Cluster mode before the broker joined: no ids yet (retriable). Thread-safe."""

    def __init__(self, broker_id: int) -> None:
        self._broker_id = broker_id

    def init(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        raise BrokerUnavailableError(
            f"broker {self._broker_id} is joining the cluster; producer ids are not served yet"
        )

    def init_keyed(self, key: str) -> tuple[int, int]:
        return self.init(-1, -1)


class ProducerIdManager:
    """Allocates producer ids and bumps epochs, persisting before answering. Thread-safe.

    Build with ``open``; the constructor only assigns.
    """

    def __init__(
        self,
        path: Path,
        clock: Clock,
        expiration_ms: int,
        next_producer_id: int,
        producers: dict[int, tuple[int, int]],
        keys: dict[str, int] | None = None,
    ) -> None:
        self._path = path
        self._clock = clock
        self._expiration_ms = expiration_ms
        self._lock = threading.Lock()
        self._next_producer_id = next_producer_id
        self._producers = producers  # id -> (epoch, last init wall ms)
        self._keys = dict(keys or {})  # producer key -> id; live while the id's entry is

    @classmethod
    def open(cls, data_dir: Path, clock: Clock, expiration_ms: int) -> ProducerIdManager:
        """Load the state file from ``data_dir`` (a fresh state if there is none).

        Raises:
            StorageError: the file exists but cannot be read or parsed. The broker refuses
                to start rather than hand out ids twice.
        """
        path = data_dir / STATE_FILE_NAME
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(path, clock, expiration_ms, 0, {})
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror}") from exc
        try:
            document = json.loads(raw)
            if document.get("version") != _VERSION:
                raise ValueError(f"unsupported version {document.get('version')!r}")
            next_id = int(document["next_producer_id"])
            producers = {
                int(pid): (int(entry[0]), int(entry[1]))
                for pid, entry in dict(document["producers"]).items()
            }
            keys = {str(key): int(pid) for key, pid in dict(document.get("keys", {})).items()}
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise StorageError(f"{path} is damaged: {exc}") from exc
        if next_id < 0 or any(pid >= next_id or pid < 0 for pid in (*producers, *keys.values())):
            raise StorageError(f"{path} is inconsistent: ids beyond next_producer_id")
        log.info("producer ids: next %d, %d remembered epochs", next_id, len(producers))
        return cls(path, clock, expiration_ms, next_id, producers, keys)

    @property
    def next_producer_id(self) -> int:
        """The id the next new producer gets."""
        with self._lock:
            return self._next_producer_id

    def init(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """Answer ``InitProducerId``: a new id (``-1, -1``) or a bumped epoch.

        Returns:
            ``(producer_id, producer_epoch)``, durable before this returns.

        Raises:
            InvalidRequestError: only one of the two is -1, or either is below -1.
            UnknownProducerIdError: ``producer_id`` was never handed out by this broker.
            InvalidProducerEpochError: ``producer_epoch`` is not the id's current epoch.
            StorageError: the state could not be written; nothing was handed out.
        """
        new = check_init_request(producer_id, producer_epoch)
        with self._lock:
            now_ms = self._clock.wall_ms()
            if new:
                answer = self._allocate_locked(now_ms)
            else:
                answer = self._bump_locked(producer_id, producer_epoch, now_ms)
            return answer

    def init_keyed(self, key: str) -> tuple[int, int]:
        """Answer a keyed ``InitProducerId``: the key's id and current epoch, never bumped.

        A key seen before (within ``producer.id.expiration.ms`` of its last init) gets its
        id back; a new key gets a new id with epoch 0. Either way the key's entry is
        refreshed and durable before this returns.

        Raises:
            InvalidRequestError: the key is empty or longer than 1,024 characters.
            StorageError: the state could not be written.
        """
        check_producer_key(key)
        with self._lock:
            now_ms = self._clock.wall_ms()
            producer_id = self._keys.get(key)
            entry = None if producer_id is None else self._producers.get(producer_id)
            if producer_id is None or entry is None or self._expired(entry[1], now_ms):
                producer_id, epoch = self._allocate_locked(now_ms, key)
                return producer_id, epoch
            producers = dict(self._producers)
            producers[producer_id] = (entry[0], now_ms)
            self._persist_locked(self._next_producer_id, producers, now_ms)
            return producer_id, entry[0]

    def _allocate_locked(self, now_ms: int, key: str | None = None) -> tuple[int, int]:
        producer_id = self._next_producer_id
        producers = dict(self._producers)
        producers[producer_id] = (0, now_ms)
        self._persist_locked(producer_id + 1, producers, now_ms, key, producer_id)
        log.info("producer id %d allocated (epoch 0)", producer_id)
        return producer_id, 0

    def _bump_locked(self, producer_id: int, epoch: int, now_ms: int) -> tuple[int, int]:
        if producer_id >= self._next_producer_id:
            raise UnknownProducerIdError(f"producer id {producer_id} was never allocated")
        entry = self._producers.get(producer_id)
        if entry is not None and self._expired(entry[1], now_ms):
            entry = None
        current = entry[0] if entry is not None else epoch
        if epoch != current:
            raise InvalidProducerEpochError(
                f"producer id {producer_id}: epoch {epoch} is not the current epoch {current}; "
                "another instance re-initialised this producer"
            )
        if current >= MAX_PRODUCER_EPOCH:
            log.info("producer id %d exhausted its epochs; allocating a new id", producer_id)
            return self._allocate_locked(now_ms)
        producers = dict(self._producers)
        producers[producer_id] = (current + 1, now_ms)
        self._persist_locked(self._next_producer_id, producers, now_ms)
        log.info("producer id %d re-initialised: epoch %d", producer_id, current + 1)
        return producer_id, current + 1

    def _expired(self, last_init_ms: int, now_ms: int) -> bool:
        return now_ms - last_init_ms > self._expiration_ms

    def _persist_locked(
        self,
        next_producer_id: int,
        producers: dict[int, tuple[int, int]],
        now_ms: int,
        new_key: str | None = None,
        new_key_id: int = -1,
    ) -> None:
        """Write the new state, then adopt it: memory never runs ahead of the disk."""
        kept = {pid: e for pid, e in producers.items() if not self._expired(e[1], now_ms)}
        keys = {key: pid for key, pid in self._keys.items() if pid in kept}
        if new_key is not None:
            keys[new_key] = new_key_id
        document: dict[str, object] = {
            "version": _VERSION,
            "next_producer_id": next_producer_id,
            "producers": {str(pid): [e[0], e[1]] for pid, e in sorted(kept.items())},
        }
        if keys:
            document["keys"] = dict(sorted(keys.items()))
        try:
            atomic_write(self._path, json.dumps(document).encode())
        except OSError as exc:
            raise StorageError(f"cannot write {self._path}: {os.strerror(exc.errno or 0)}") from exc
        self._next_producer_id = next_producer_id
        self._producers = kept
        self._keys = keys
