"""Dynamic broker configs in ZooKeeper (cluster mode): Kafka's ``/config/brokers/<entity>``.

One znode per entity, ``<default>`` (every broker) or a broker id, holding
``{"version": 1, "config": {...}}`` (the format of ``/config/topics/<t>``). A write is a
compare-and-set on the znode version, retried on a race. Every broker watches the two
znodes that concern it (the default and its own id) and calls its change callbacks
(``broker.core.configs.Configs``, which swaps the log manager's topic defaults), so a
change made through any broker reaches every broker within a watch's delay, without a
restart. Thread-safe: ``broker.core.configs.BrokerConfigStore`` on ZooKeeper.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from tidelog.broker.cluster.store import ClusterStore, StaleStateError
from tidelog.broker.cluster.znodes import BROKER_CONFIGS, decode_topic_config, encode_topic_config

__all__ = ["ZooKeeperBrokerConfigStore"]

log = logging.getLogger(__name__)

_ATTEMPTS = 20


def _path(entity: str) -> str:
    return f"{BROKER_CONFIGS}/{entity}"


class ZooKeeperBrokerConfigStore:
    """``BrokerConfigStore`` on ZooKeeper."""

    def __init__(self, store: ClusterStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    @classmethod
    def open(cls, store: ClusterStore, entities: tuple[str, ...]) -> ZooKeeperBrokerConfigStore:
        """Watch ``entities`` (the default and this broker's id) from now on."""
        configs = cls(store)
        for entity in entities:
            store.watch_data(_path(entity), lambda _data: configs._changed())
        return configs

    def _changed(self) -> None:
        # kazoo's watch thread (also once at registration): callbacks only read.
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("applying the dynamic broker configs failed")

    def read(self, entity: str) -> dict[str, str]:
        found = self._store.read_document(_path(entity))
        if found is None:
            return {}
        return decode_topic_config(entity, found[0])

    def write(self, entity: str, configs: Mapping[str, str]) -> None:
        path = _path(entity)
        for _ in range(_ATTEMPTS):
            found = self._store.read_document(path)
            try:
                self._store.write_document(
                    path, encode_topic_config(configs), -1 if found is None else found[1]
                )
            except StaleStateError:
                continue
            return
        raise StaleStateError(f"{path} kept changing; gave up after {_ATTEMPTS} attempts")

    def on_change(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._callbacks.append(callback)
