"""Describing and altering topic and broker configs (Kafka's DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs), listener-neutral; ``BrokerCore.configs``.

Topics: a topic's overrides are its dynamic config. They are stored where topics are:
``topics.json`` in the data directory on a single node, ``/config/topics/<t>`` in
ZooKeeper in a cluster (``Topics.alter_topic_config``; every broker's metadata watcher
applies them to its logs). Changing ``cleanup.policy`` on a live topic takes effect at
the cleaner's next pass (it reads each log's config every pass) and at the next append (a
compacted topic refuses key-less records, ``storage.log_validator``).

Brokers: the dynamic broker configs are the topic defaults of ``config_keys.
DYNAMIC_BROKER_KEYS`` and the replication throttles of ``DYNAMIC_BROKER_SETTINGS``, for one
broker (entity ``"<id>"``) or every broker (entity
``DEFAULT_ENTITY``, resource name ``""``), kept in a ``BrokerConfigStore``: a single
node's ``broker-configs.json`` in the data directory (``LocalBrokerConfigStore``), a
cluster's ``/config/brokers/<entity>`` znodes (``broker.cluster.broker_configs``), which
every broker watches. Whenever the store changes, the broker rebuilds its topic defaults
(static settings under the dynamic default under its own dynamic values) and swaps them
into the log manager (``LogManager.set_defaults``), and tells whoever registered with
``on_applied`` (``AppliedConfigs``): the leader's replication throttle, and in a cluster
the replica fetchers' throttle and the controller's election defaults
(``min.insync.replicas``, ``unclean.leader.election.enable``: Kafka's controller reads
its own broker's config). No restart.

A broker resource names this broker (its id) or the cluster default (``""``); another
broker's id is ``INVALID_REQUEST`` with Kafka's words, for describing and for altering
alike, as Kafka's ZooKeeper-mode broker answers (``ConfigHelper.describeConfigs`` and
``ZkAdminManager.getBrokerId``, apache/kafka ``core/src/main/scala/kafka/server/``:
"Unexpected broker id, expected N[ or empty string], but received M"; a name that is not
a number: "Broker id must be an integer, but it is: X"). Kafka's clients send a broker's
resource to that broker; so does Tidelog's AdminClient. Validation, in order: unknown or
non-dynamic keys and bad values ``INVALID_CONFIG``; APPEND/SUBTRACT on a key that is not
a list ``INVALID_CONFIG``; a key named twice ``INVALID_REQUEST``; ``min.insync.replicas``
above a topic's replication factor and an internal topic made non-compacted
``POLICY_VIOLATION``. ``validate_only`` runs every check and stores nothing.

Thread-safe: one lock orders read-modify-write of the broker store; topic changes go
through ``Topics``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tidelog.broker.config import BrokerConfig
from tidelog.broker.core.config_keys import (
    DYNAMIC_BROKER_KEYS,
    DYNAMIC_BROKER_SETTINGS,
    LIST_KEYS,
    TOPIC_KEYS,
    ConfigEntry,
    check_dynamic_broker_config,
    check_replication_policy,
    dynamic_broker_settings,
    dynamic_topic_defaults,
    resolve_broker_key,
    resolve_topic_key,
)
from tidelog.broker.core.membership import Membership
from tidelog.broker.core.topics import Topics
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import (
    InvalidConfigError,
    InvalidRequestError,
    PolicyViolationError,
    StorageError,
)
from tidelog.storage.files import atomic_write
from tidelog.storage.log_manager import LogManager

__all__ = [
    "BROKER_CONFIGS_FILE",
    "DEFAULT_ENTITY",
    "AlterOp",
    "AppliedConfigs",
    "BrokerConfigStore",
    "ConfigChange",
    "Configs",
    "LocalBrokerConfigStore",
    "ResourceKind",
    "apply_changes",
]

log = logging.getLogger(__name__)

BROKER_CONFIGS_FILE = "broker-configs.json"
DEFAULT_ENTITY = "<default>"  # Kafka's name for the cluster-wide default entity
_VERSION = 1


class ResourceKind(enum.IntEnum):
    """What a config belongs to (Kafka's ConfigResource type numbers)."""

    TOPIC = 2
    BROKER = 4
    GROUP = 32  # a group's configs, at its coordinator (``broker.core.group_configs``)


class AlterOp(enum.IntEnum):
    """An incremental change (Kafka's AlterConfigOp numbers)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """One key to change: ``value`` is None for DELETE."""

    name: str
    op: AlterOp
    value: str | None = None


@dataclass(frozen=True, slots=True)
class AppliedConfigs:
    """What a broker applies after a change of its dynamic configs."""

    topic_defaults: LogConfig
    leader_replication_throttled_rate: int
    follower_replication_throttled_rate: int


class BrokerConfigStore(Protocol):
    """Where dynamic broker configs are kept, per entity (``DEFAULT_ENTITY`` or an id)."""

    def read(self, entity: str) -> dict[str, str]:
        """The entity's dynamic configs (empty if none)."""
        ...

    def write(self, entity: str, configs: Mapping[str, str]) -> None:
        """Replace the entity's dynamic configs (durably, before returning)."""
        ...

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every change, whoever made it."""
        ...


class LocalBrokerConfigStore:
    """A single node's dynamic broker configs: ``broker-configs.json`` in the data
    directory, ``{"version": 1, "configs": {"<default>": {...}, "0": {...}}}``, written
    with ``atomic_write``. Thread-safe."""

    def __init__(self, path: Path | None, entities: dict[str, dict[str, str]]) -> None:
        self._path = path
        self._entities = entities
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    @classmethod
    def open(cls, data_dir: Path) -> LocalBrokerConfigStore:
        """Read the file if there is one. Raises ``InvalidConfigError`` if it does not parse."""
        path = data_dir / BROKER_CONFIGS_FILE
        entities: dict[str, dict[str, str]] = {}
        if path.exists():
            try:
                document = json.loads(path.read_bytes())
                if document.get("version") != _VERSION:
                    raise ValueError(f"version {document.get('version')!r}")
                entities = {
                    str(entity): {str(k): str(v) for k, v in configs.items()}
                    for entity, configs in document["configs"].items()
                }
            except (ValueError, KeyError, AttributeError, TypeError) as exc:
                raise InvalidConfigError(f"{path} does not parse: {exc}") from exc
        return cls(path, entities)

    @classmethod
    def in_memory(cls) -> LocalBrokerConfigStore:
        """A store that keeps nothing on disk (a cluster broker before it joins)."""
        return cls(None, {})

    def read(self, entity: str) -> dict[str, str]:
        with self._lock:
            return dict(self._entities.get(entity, {}))

    def write(self, entity: str, configs: Mapping[str, str]) -> None:
        with self._lock:
            entities = dict(self._entities)
            if configs:
                entities[entity] = dict(configs)
            else:
                entities.pop(entity, None)
            if self._path is not None:
                data = json.dumps({"version": _VERSION, "configs": entities}, sort_keys=True)
                try:
                    atomic_write(self._path, data.encode())
                except OSError as exc:
                    raise StorageError(f"cannot write {self._path.name}: {exc}") from exc
            self._entities = entities
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback()

    def on_change(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._callbacks.append(callback)


def apply_changes(
    current: Mapping[str, str],
    changes: Sequence[ConfigChange],
    *,
    incremental: bool,
    current_value: Callable[[str], str | None],
) -> dict[str, str]:
    """The dynamic configs after ``changes``. Pure.

    ``incremental`` False is the legacy AlterConfigs: the result is exactly the SET keys
    (every other key reset). ``current_value(key)``: what APPEND and SUBTRACT start from
    when the key has no dynamic value (its effective value).

    Raises ``InvalidRequestError`` (a key twice, an unknown op), ``InvalidConfigError``
    (APPEND or SUBTRACT on a key that is not a list; SET without a value).
    """
    names = [c.name for c in changes]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidRequestError(f"config keys named more than once: {', '.join(repeated)}")
    result = {} if not incremental else dict(current)
    for change in changes:
        if change.op == AlterOp.DELETE:
            result.pop(change.name, None)
            continue
        if change.value is None:
            if not incremental:
                continue  # AlterConfigs: a null value resets the key
            raise InvalidConfigError(f"{change.name}: {change.op.name} needs a value")
        if change.op == AlterOp.SET:
            result[change.name] = change.value
            continue
        if change.name not in LIST_KEYS:
            raise InvalidConfigError(
                f"{change.name}: {change.op.name} applies only to list-valued keys "
                f"({', '.join(sorted(LIST_KEYS))})"
            )
        base = result.get(change.name)
        if base is None:
            base = current_value(change.name) or ""
        items = [i.strip() for i in base.split(",") if i.strip()]
        given = [i.strip() for i in change.value.split(",") if i.strip()]
        if change.op == AlterOp.APPEND:
            items += [i for i in given if i not in items]
        else:
            items = [i for i in items if i not in given]
        result[change.name] = ",".join(items)
    return result


class Configs:
    """Config description and changes for one broker. Thread-safe."""

    def __init__(
        self,
        config: BrokerConfig,
        logs: LogManager,
        topics: Topics,
        membership: Membership,
        store: BrokerConfigStore,
    ) -> None:
        self._config = config
        self._logs = logs
        self._topics = topics
        self._membership = membership
        self._lock = threading.Lock()
        self._store = store
        self._entity = str(config.broker_id)
        # The static topic defaults, with the broker-level unclean.leader.election.enable
        # (a BrokerConfig field, not one of its log.* defaults).
        self._static = dataclasses.replace(
            config.log_defaults,
            unclean_leader_election_enable=config.unclean_leader_election_enable,
        )
        static = config.to_mapping()
        self._static_settings = {k: int(static.get(k, "0")) for k in DYNAMIC_BROKER_SETTINGS}
        self._listeners: list[Callable[[AppliedConfigs], None]] = []
        self._apply_lock = threading.RLock()
        self._applied: AppliedConfigs | None = None
        store.on_change(self._apply_quietly)
        self._apply()

    def on_applied(self, callback: Callable[[AppliedConfigs], None]) -> None:
        """Call ``callback`` now with what is applied, and after every change of it."""
        with self._apply_lock:
            with self._lock:
                self._listeners.append(callback)
                applied = self._applied
            if applied is not None:
                callback(applied)

    def use_store(self, store: BrokerConfigStore) -> None:
        """Cluster mode, once joined: keep dynamic broker configs in ``store`` (watched)
        from now on, and apply what it holds."""
        with self._lock:
            self._store = store
        store.on_change(self._apply_quietly)
        self._apply()

    def _apply_quietly(self) -> None:
        # A watch thread or the writer's: a bad document must not stop the broker.
        try:
            self._apply()
        except Exception:
            log.exception("cannot apply the dynamic broker configs; keeping the last ones")

    def _apply(self) -> None:
        # One apply at a time, reads and notifications together: two threads (a watch and
        # a writer) must not hand the listeners an older state after a newer one.
        with self._apply_lock:
            with self._lock:
                store = self._store
            default, this_broker = store.read(DEFAULT_ENTITY), store.read(self._entity)
            defaults = dynamic_topic_defaults(self._static, default, this_broker)
            if defaults != self._logs.config.defaults:
                log.info("dynamic broker configs changed: applying the new topic defaults")
                self._logs.set_defaults(defaults)
            settings = dynamic_broker_settings(self._static_settings, default, this_broker)
            applied = AppliedConfigs(
                defaults,
                settings["leader.replication.throttled.rate"],
                settings["follower.replication.throttled.rate"],
            )
            with self._lock:
                if applied == self._applied:
                    return
                self._applied = applied
                listeners = list(self._listeners)
            for listener in listeners:
                listener(applied)

    # --- describe -------------------------------------------------------------------

    def describe(
        self, kind: ResourceKind, name: str, keys: Sequence[str] | None = None
    ) -> list[ConfigEntry]:
        """Every key of a topic or a broker (or only ``keys``), with sources and synonyms.

        Raises ``UnknownTopicOrPartitionError``, ``InvalidTopicError``,
        ``InvalidRequestError`` (another broker's id, a name that is not an id).
        """
        if kind == ResourceKind.TOPIC:
            entries = self._describe_topic(name)
        else:
            entries = self._describe_broker(name)
        wanted = None if keys is None else set(keys)
        return [e for e in entries if wanted is None or e.name in wanted]

    def _dynamic(self) -> tuple[dict[str, str], dict[str, str]]:
        with self._lock:
            store = self._store
        return store.read(DEFAULT_ENTITY), store.read(self._entity)

    def _describe_topic(self, name: str) -> list[ConfigEntry]:
        overrides = self._topics.topic_metadata(name).overrides
        default, this_broker = self._dynamic()
        static = self._static
        return [
            resolve_topic_key(key, overrides, static, default, this_broker)
            for key in sorted(TOPIC_KEYS)
        ]

    def _entity_of(self, name: str) -> str:
        # Kafka's words (ConfigHelper.describeConfigs, ZkAdminManager.getBrokerId).
        if name == "":
            return DEFAULT_ENTITY
        try:
            int(name)
        except ValueError:
            raise InvalidRequestError(f"Broker id must be an integer, but it is: {name}") from None
        if name != self._entity:
            raise InvalidRequestError(
                f"Unexpected broker id, expected {self._entity} or empty string, but "
                f"received {name}: send a broker's configs to that broker"
            )
        return name

    def _describe_broker(self, name: str) -> list[ConfigEntry]:
        entity = self._entity_of(name)
        default, this_broker = self._dynamic()
        if entity == DEFAULT_ENTITY:
            # Kafka describes the default entity by its dynamic values only.
            entries = []
            for key in sorted(default):
                entry = resolve_broker_key(key, None, default, {})
                entries.append(dataclasses.replace(entry, synonyms=entry.synonyms[:1]))
            return entries
        secret = ("password", "secret", "key")
        static = self._config.to_mapping()
        return [
            resolve_broker_key(
                key, value, default, this_broker, sensitive=any(s in key for s in secret)
            )
            for key, value in sorted(static.items())
        ]

    # --- alter ----------------------------------------------------------------------

    def alter(
        self,
        kind: ResourceKind,
        name: str,
        changes: Sequence[ConfigChange],
        *,
        incremental: bool,
        validate_only: bool = False,
    ) -> None:
        """Change one resource's dynamic configs (see the module docstring).

        Raises ``InvalidConfigError``, ``InvalidRequestError``, ``PolicyViolationError``,
        ``UnknownTopicOrPartitionError``; in cluster mode ``NotControllerError`` for a
        topic change on another broker than the controller... as ``Topics`` does.
        """
        if kind == ResourceKind.TOPIC:
            self._alter_topic(name, changes, incremental=incremental, validate_only=validate_only)
        else:
            self._alter_broker(name, changes, incremental=incremental, validate_only=validate_only)

    def _alter_topic(
        self,
        name: str,
        changes: Sequence[ConfigChange],
        *,
        incremental: bool,
        validate_only: bool,
    ) -> None:
        meta = self._topics.topic_metadata(name)
        current = dict(meta.overrides)
        effective = meta.config.to_mapping()
        overrides = apply_changes(
            current, changes, incremental=incremental, current_value=effective.get
        )
        parsed = LogConfig.from_mapping(overrides, self._logs.config.defaults)
        if meta.internal and not parsed.compact:
            raise PolicyViolationError(
                f"{name} is an internal topic: its cleanup.policy must include compact "
                "(the committed offsets live there)"
            )
        replicas = self._membership.placement.partition(name, 0).replicas
        check_replication_policy(overrides, max(len(replicas), 1), name)
        if validate_only or overrides == current:
            return
        removed = [k for k in current if k not in overrides]
        self._topics.alter_topic_config(name, overrides, removed)

    def _alter_broker(
        self,
        name: str,
        changes: Sequence[ConfigChange],
        *,
        incremental: bool,
        validate_only: bool,
    ) -> None:
        entity = self._entity_of(name)
        with self._lock:
            store = self._store
        current = store.read(entity)
        if entity == DEFAULT_ENTITY:
            defaults = dynamic_topic_defaults(self._static, current, {})
        else:
            defaults = self._logs.config.defaults
        topic_values = defaults.to_mapping()

        def effective(key: str) -> str | None:  # APPEND/SUBTRACT start: list keys only
            topic_key = DYNAMIC_BROKER_KEYS.get(key)
            return None if topic_key is None else topic_values[topic_key]

        configs = apply_changes(current, changes, incremental=incremental, current_value=effective)
        check_dynamic_broker_config(configs)
        if validate_only or configs == current:
            return
        store.write(entity, configs)
        self._apply()
