"""The config keys Kafka's admin tools see, as pure tables and functions (no I/O).

Three things live here, each a table over Kafka's names:

* ``TOPIC_KEYS``: every topic key Tidelog serves (``storage.config.LogConfig``), with its
  Kafka config type (DescribeConfigs v3+ ``config_type``), one line of documentation and
  its broker synonym: the broker key whose value is the topic's default (Kafka's
  ``LogConfig.TopicConfigSynonyms``: ``retention.ms`` <- ``log.retention.ms``).
* ``DYNAMIC_BROKER_KEYS``: the broker keys that are topic defaults and that an
  AlterConfigs / IncrementalAlterConfigs on a broker resource may change without a
  restart: every broker synonym of a topic key, applied live by swapping the log
  manager's defaults (``LogManager.set_defaults``): every topic without an override
  follows at once. ``min.insync.replicas`` and ``unclean.leader.election.enable`` are
  among them, as in Kafka: the controller reads its own broker's current defaults at
  every election (``broker.cluster.controller.Controller.set_topic_defaults``).
* ``DYNAMIC_BROKER_SETTINGS``: the other broker keys that change live, as in Kafka:
  ``leader.replication.throttled.rate`` (the leader's ``ReplicationThrottle``) and
  ``follower.replication.throttled.rate`` (the replica fetchers). Every other broker
  setting (listeners, quotas' windows, thread counts...) answers ``INVALID_CONFIG``
  naming the keys that can change.
* ``resolve_topic_key`` / ``resolve_broker_key``: Kafka's precedence, most specific first:
  a topic's override (``DYNAMIC_TOPIC_CONFIG``), this broker's dynamic value
  (``DYNAMIC_BROKER_CONFIG``), the cluster-wide dynamic default
  (``DYNAMIC_DEFAULT_BROKER_CONFIG``), the broker's settings file
  (``STATIC_BROKER_CONFIG``), the built-in default (``DEFAULT_CONFIG``). The answer is the
  effective entry and its synonyms in that order, as Kafka lists them.

"Set in the settings file" is read as "differs from the built-in default": ``BrokerConfig``
keeps no record of which keys the file named, and a key set to its default value answers
``DEFAULT_CONFIG``, which is what it is in effect.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass

from tidelog.storage.config import LogConfig
from tidelog.storage.errors import InvalidConfigError, PolicyViolationError

__all__ = [
    "DYNAMIC_BROKER_KEYS",
    "DYNAMIC_BROKER_SETTINGS",
    "LIST_KEYS",
    "TOPIC_KEYS",
    "ConfigEntry",
    "ConfigSynonym",
    "ConfigType",
    "KeyInfo",
    "Source",
    "broker_key_info",
    "check_dynamic_broker_config",
    "check_replication_policy",
    "dynamic_broker_settings",
    "dynamic_topic_defaults",
    "resolve_broker_key",
    "resolve_topic_key",
]


class Source(enum.IntEnum):
    """Where a config value comes from (Kafka's ConfigSource numbers)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    GROUP_CONFIG = 8  # set on a group (Kafka 4.x, KIP-848)


class ConfigType(enum.IntEnum):
    """A value's type (Kafka's DescribeConfigs ``config_type`` numbers)."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    """One place a key's value could come from, and the value it has there."""

    name: str
    value: str | None
    source: Source


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One key of a DescribeConfigs answer."""

    name: str
    value: str | None
    source: Source
    read_only: bool
    sensitive: bool
    config_type: ConfigType
    documentation: str
    synonyms: tuple[ConfigSynonym, ...] = ()


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A topic key: its type, one line of documentation, its broker synonym."""

    config_type: ConfigType
    documentation: str
    broker_key: str


_L, _I, _S, _D, _B, _LIST = (
    ConfigType.LONG,
    ConfigType.INT,
    ConfigType.STRING,
    ConfigType.DOUBLE,
    ConfigType.BOOLEAN,
    ConfigType.LIST,
)

TOPIC_KEYS: dict[str, KeyInfo] = {
    "cleanup.policy": KeyInfo(
        _LIST,
        "delete, compact or both: delete old segments, keep the latest record per key, or both",
        "log.cleanup.policy",
    ),
    "delete.retention.ms": KeyInfo(
        _L, "how long a compacted topic keeps tombstones", "log.cleaner.delete.retention.ms"
    ),
    "file.delete.delay.ms": KeyInfo(
        _L,
        "how long a deleted segment's files wait before unlinking",
        "log.segment.delete.delay.ms",
    ),
    "flush.messages": KeyInfo(
        _L, "fsync after this many records (-1: never by count)", "log.flush.interval.messages"
    ),
    "flush.ms": KeyInfo(
        _L, "fsync when unflushed data is this old (-1: never by time)", "log.flush.interval.ms"
    ),
    "index.interval.bytes": KeyInfo(
        _I, "bytes of log between two offset index entries", "log.index.interval.bytes"
    ),
    "compression.type": KeyInfo(
        _S,
        "producer (store batches as sent) or the codec to store them in: uncompressed, "
        "gzip, snappy, lz4, zstd (the broker recompresses other batches)",
        "compression.type",
    ),
    "message.timestamp.before.max.ms": KeyInfo(
        _L,
        "refuse a CreateTime record this far behind the broker's clock (KIP-937)",
        "log.message.timestamp.before.max.ms",
    ),
    "message.timestamp.after.max.ms": KeyInfo(
        _L,
        "refuse a CreateTime record this far ahead of the broker's clock (KIP-937)",
        "log.message.timestamp.after.max.ms",
    ),
    "max.message.bytes": KeyInfo(
        _I, "the largest record batch the topic accepts", "message.max.bytes"
    ),
    "message.timestamp.type": KeyInfo(
        _S,
        "CreateTime (the producer's) or LogAppendTime (the broker's)",
        "log.message.timestamp.type",
    ),
    "min.cleanable.dirty.ratio": KeyInfo(
        _D, "compact once this share of the log is uncompacted", "log.cleaner.min.cleanable.ratio"
    ),
    "max.compaction.lag.ms": KeyInfo(
        _L,
        "compact a log whose oldest uncompacted record is this old, whatever its dirty "
        "ratio (KIP-354)",
        "log.cleaner.max.compaction.lag.ms",
    ),
    "min.compaction.lag.ms": KeyInfo(
        _L, "records younger than this are not compacted", "log.cleaner.min.compaction.lag.ms"
    ),
    "min.insync.replicas": KeyInfo(
        _I,
        "in-sync replicas an acks=all produce needs (at most the replication factor)",
        "min.insync.replicas",
    ),
    "retention.bytes": KeyInfo(
        _L,
        "delete old segments past this size per partition (-1: no limit)",
        "log.retention.bytes",
    ),
    "retention.ms": KeyInfo(
        _L, "delete segments older than this (-1: keep forever)", "log.retention.ms"
    ),
    "segment.bytes": KeyInfo(_I, "roll the active segment at this size", "log.segment.bytes"),
    "segment.index.bytes": KeyInfo(
        _I, "the largest offset or time index of a segment", "log.index.size.max.bytes"
    ),
    "segment.ms": KeyInfo(_L, "roll the active segment once it spans this long", "log.roll.ms"),
    "unclean.leader.election.enable": KeyInfo(
        _B,
        "elect an out-of-sync replica rather than none (may lose records)",
        "unclean.leader.election.enable",
    ),
}

# Keys whose value is a comma-separated list: the ones APPEND and SUBTRACT apply to.
LIST_KEYS = frozenset({"cleanup.policy", "log.cleanup.policy"})

# Broker key -> the topic key it is the default of, for the keys changed without restart.
DYNAMIC_BROKER_KEYS: dict[str, str] = {info.broker_key: key for key, info in TOPIC_KEYS.items()}

# The dynamic broker keys that are not topic defaults: bytes per second, 0 (the built-in
# default) for no throttle. Kafka's default is Long.MAX_VALUE, "no throttle" too.
DYNAMIC_BROKER_SETTINGS: dict[str, KeyInfo] = {
    "leader.replication.throttled.rate": KeyInfo(
        _L,
        "bytes/s a leader serves to a reassignment's adding replicas, for the whole "
        "broker (0: no throttle)",
        "leader.replication.throttled.rate",
    ),
    "follower.replication.throttled.rate": KeyInfo(
        _L,
        "bytes/s a reassignment's adding replica fetches, for the whole broker (0: no throttle)",
        "follower.replication.throttled.rate",
    ),
}
_SETTING_BUILT_IN = "0"

_BUILT_IN = LogConfig().to_mapping()


def broker_key_info(broker_key: str) -> KeyInfo | None:
    """The type and documentation of a dynamic broker key, else None."""
    if broker_key in DYNAMIC_BROKER_SETTINGS:
        return DYNAMIC_BROKER_SETTINGS[broker_key]
    for info in TOPIC_KEYS.values():
        if info.broker_key == broker_key:
            return info
    return None


def check_dynamic_broker_config(configs: Mapping[str, str]) -> None:
    """Raise ``InvalidConfigError`` unless every key may change live and parses."""
    for key in configs:
        if key not in DYNAMIC_BROKER_KEYS and key not in DYNAMIC_BROKER_SETTINGS:
            live = ", ".join(sorted([*DYNAMIC_BROKER_KEYS, *DYNAMIC_BROKER_SETTINGS]))
            raise InvalidConfigError(
                f"broker config {key!r} cannot be changed while the broker runs on Tidelog "
                f"(set it in the settings file and restart); dynamic keys: {live}"
            )
    LogConfig.from_mapping(
        {DYNAMIC_BROKER_KEYS[k]: v for k, v in configs.items() if k in DYNAMIC_BROKER_KEYS}
    )
    for key, value in configs.items():
        if key in DYNAMIC_BROKER_SETTINGS:
            _parse_rate(key, value)


def _parse_rate(key: str, value: str) -> int:
    try:
        rate = int(value)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"{key}: {value!r} is not a whole number of bytes/s") from None
    if rate < 0:
        raise InvalidConfigError(f"{key}: {rate} is negative (0: no throttle)")
    return rate


def dynamic_broker_settings(
    static: Mapping[str, int], default: Mapping[str, str], this_broker: Mapping[str, str]
) -> dict[str, int]:
    """The values of ``DYNAMIC_BROKER_SETTINGS`` a broker applies: its own dynamic value,
    else the cluster-wide dynamic default, else ``static`` (its settings file). A stored
    value that does not parse is skipped (the next source applies)."""
    out = {}
    for key in DYNAMIC_BROKER_SETTINGS:
        value = static.get(key, 0)
        for source in (default, this_broker):
            if key in source:
                try:
                    value = _parse_rate(key, source[key])
                except InvalidConfigError:
                    continue
        out[key] = value
    return out


def dynamic_topic_defaults(
    static: LogConfig, default: Mapping[str, str], this_broker: Mapping[str, str]
) -> LogConfig:
    """The topic defaults a broker applies: its static ``log.*`` defaults under the
    cluster-wide dynamic ``default`` under its own dynamic ``this_broker`` values.
    Raises ``InvalidConfigError`` for a value that does not parse."""
    merged = {**default, **this_broker}
    return LogConfig.from_mapping(
        {DYNAMIC_BROKER_KEYS[k]: v for k, v in merged.items() if k in DYNAMIC_BROKER_KEYS},
        static,
    )


def _broker_chain(
    broker_key: str,
    static_value: str | None,
    default: Mapping[str, str],
    this_broker: Mapping[str, str],
    built_in: str | None,
) -> list[ConfigSynonym]:
    chain = []
    if broker_key in this_broker:
        dynamic = this_broker[broker_key]
        chain.append(ConfigSynonym(broker_key, dynamic, Source.DYNAMIC_BROKER_CONFIG))
    if broker_key in default:
        chain.append(
            ConfigSynonym(broker_key, default[broker_key], Source.DYNAMIC_DEFAULT_BROKER_CONFIG)
        )
    if static_value is not None and static_value != built_in:
        chain.append(ConfigSynonym(broker_key, static_value, Source.STATIC_BROKER_CONFIG))
    if built_in is not None:
        chain.append(ConfigSynonym(broker_key, built_in, Source.DEFAULT_CONFIG))
    return chain


def resolve_topic_key(
    key: str,
    overrides: Mapping[str, str],
    static: LogConfig,
    default: Mapping[str, str],
    this_broker: Mapping[str, str],
) -> ConfigEntry:
    """A topic key's effective entry with every synonym, most specific first."""
    info = TOPIC_KEYS[key]
    static_values = static.to_mapping()
    chain = []
    if key in overrides:
        chain.append(ConfigSynonym(key, overrides[key], Source.DYNAMIC_TOPIC_CONFIG))
    chain.extend(
        _broker_chain(info.broker_key, static_values[key], default, this_broker, _BUILT_IN[key])
    )
    # Values as LogConfig writes them ("delete,compact" -> "compact,delete", "TRUE" ->
    # "true"), whatever spelling was stored.
    chain = [dataclasses.replace(s, value=_normalise(key, s.value)) for s in chain]
    first = chain[0]
    return ConfigEntry(
        key,
        first.value,
        first.source,
        False,
        False,
        info.config_type,
        info.documentation,
        tuple(chain),
    )


def _normalise(topic_key: str, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return LogConfig.from_mapping({topic_key: value}).to_mapping()[topic_key]
    except InvalidConfigError:
        return value  # shown as stored; a change that sets it is refused


def resolve_broker_key(
    key: str,
    static_value: str | None,
    default: Mapping[str, str],
    this_broker: Mapping[str, str],
    *,
    sensitive: bool = False,
) -> ConfigEntry:
    """A broker key's effective entry: dynamic keys with their chain, the others as the
    static settings say (read-only)."""
    topic_key = DYNAMIC_BROKER_KEYS.get(key)
    info = broker_key_info(key)
    dynamic = topic_key is not None or key in DYNAMIC_BROKER_SETTINGS
    built_in = _BUILT_IN[topic_key] if topic_key is not None else _SETTING_BUILT_IN
    if not dynamic:
        chain = [ConfigSynonym(key, static_value, Source.STATIC_BROKER_CONFIG)]
    else:
        chain = _broker_chain(key, static_value, default, this_broker, built_in)
    first = chain[0]
    return ConfigEntry(
        key,
        None if sensitive else first.value,
        first.source,
        not dynamic,
        sensitive,
        info.config_type if info is not None else ConfigType.STRING,
        info.documentation if info is not None else "a broker setting (settings file, restart)",
        tuple(chain),
    )


def check_replication_policy(
    overrides: Mapping[str, str], replication_factor: int, topic: str
) -> None:
    """Refuse a topic's own ``min.insync.replicas`` above its replication factor: such a
    topic would answer every ``acks=all`` produce ``NOT_ENOUGH_REPLICAS`` for ever. Kafka
    lets it through; Tidelog refuses it when the topic is created or configured
    (``PolicyViolationError``, Kafka's ``POLICY_VIOLATION``). Only the topic's override is
    checked: a broker-wide default above some topic's factor is the operator's choice.
    A value that does not parse is left to ``LogConfig`` (``INVALID_CONFIG``)."""
    value = overrides.get("min.insync.replicas")
    if value is None:
        return
    try:
        wanted = int(value)
    except (TypeError, ValueError):
        return
    if wanted > replication_factor:
        raise PolicyViolationError(
            f"topic {topic!r}: min.insync.replicas {wanted} is above its replication "
            f"factor {replication_factor}; acks=all produces could never succeed"
        )
