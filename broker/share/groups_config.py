"""Share-group settings: the broker's ``group.share.*`` and each group's own configs.

``ShareGroupConfig`` is what the broker dictates, with Kafka's names and defaults
(KIP-932): ``group.share.session.timeout.ms`` (45 s, within ``group.share.min/max.session
.timeout.ms``, 45-60 s), ``group.share.heartbeat.interval.ms`` (5 s, within 5-15 s),
``group.share.max.size`` (200 members), ``group.share.record.lock.duration.ms`` (30 s, within
15 s - 1 h) and ``group.share.delivery.count.limit`` (5). Kafka requires a max size of at
least 10; Tidelog takes 1 and up (the bound protects nothing here, and small groups make
small tests).

Group configs (Kafka's resource type GROUP, set with IncrementalAlterConfigs in Kafka 4.1)
override them per group, plus two settings that exist only per group::

    share.auto.offset.reset          latest | earliest | by_duration:<ISO 8601 duration>
                                     where a share-partition starts (default latest)
    share.isolation.level            read_uncommitted | read_committed (default
                                     read_uncommitted)
    share.session.timeout.ms         within group.share.min/max.session.timeout.ms
    share.heartbeat.interval.ms      within group.share.min/max.heartbeat.interval.ms
    share.record.lock.duration.ms    within group.share.min/max.record.lock.duration.ms
    share.delivery.count.limit       2 .. 10 (Kafka 4.2's group config)
    errors.deadletterqueue.topic.name  a topic name, not internal (``__``), or "" for
                                     none (KIP-1191's name; ``broker.share.dead_letter``)

Where they live: Kafka keeps group configs in its metadata log (ConfigRecord). Tidelog
stores them with the group's records in ``__consumer_offsets`` (record type 1000,
``broker.share.groups_records``): they move with the group's coordinator, reload with it,
survive restarts, and are deleted with the group. A group id may carry configs before its
group exists (as in Kafka); the heartbeat interval and session timeout apply from the next
heartbeat on.

Frozen values, thread-safe; pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from tidelog.storage.errors import InvalidConfigError, InvalidTopicError
from tidelog.storage.files import validate_topic_name

__all__ = [
    "AUTO_OFFSET_RESET",
    "BROKER_KEYS",
    "DEAD_LETTER_TOPIC",
    "DELIVERY_COUNT_LIMIT",
    "GROUP_CONFIG_NAMES",
    "HEARTBEAT_INTERVAL",
    "ISOLATION_LEVEL",
    "RECORD_LOCK_DURATION",
    "SESSION_TIMEOUT",
    "ShareGroupConfig",
    "ShareGroupSettings",
    "parse_duration_ms",
    "resolve_settings",
    "validate_group_configs",
]

AUTO_OFFSET_RESET = "share.auto.offset.reset"
ISOLATION_LEVEL = "share.isolation.level"
SESSION_TIMEOUT = "share.session.timeout.ms"
HEARTBEAT_INTERVAL = "share.heartbeat.interval.ms"
RECORD_LOCK_DURATION = "share.record.lock.duration.ms"
DELIVERY_COUNT_LIMIT = "share.delivery.count.limit"
DEAD_LETTER_TOPIC = "errors.deadletterqueue.topic.name"
GROUP_CONFIG_NAMES = frozenset(
    {
        AUTO_OFFSET_RESET,
        ISOLATION_LEVEL,
        SESSION_TIMEOUT,
        HEARTBEAT_INTERVAL,
        RECORD_LOCK_DURATION,
        DELIVERY_COUNT_LIMIT,
        DEAD_LETTER_TOPIC,
    }
)
_ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
_DELIVERY_COUNT_LIMITS = (2, 10)
# ISO 8601 durations as Java's Duration.parse reads them (PnDTnHnMn.nS), non-negative.
_DURATION = re.compile(
    r"P(?:(?P<days>\d+)D)?(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d{1,9})?)S)?)?",
    re.IGNORECASE,
)

# Broker key -> (field, lower bound).
_BROKER_KEYS = {
    "group.share.session.timeout.ms": ("session_timeout_ms", 1),
    "group.share.min.session.timeout.ms": ("min_session_timeout_ms", 1),
    "group.share.max.session.timeout.ms": ("max_session_timeout_ms", 1),
    "group.share.heartbeat.interval.ms": ("heartbeat_interval_ms", 1),
    "group.share.min.heartbeat.interval.ms": ("min_heartbeat_interval_ms", 1),
    "group.share.max.heartbeat.interval.ms": ("max_heartbeat_interval_ms", 1),
    "group.share.max.size": ("max_size", 1),
    "group.share.record.lock.duration.ms": ("record_lock_duration_ms", 1),
    "group.share.min.record.lock.duration.ms": ("min_record_lock_duration_ms", 1),
    "group.share.max.record.lock.duration.ms": ("max_record_lock_duration_ms", 1),
    "group.share.delivery.count.limit": ("delivery_count_limit", 2),
}
# The broker keys ``ShareGroupConfig.from_mapping`` takes (``broker.share.settings``).
BROKER_KEYS = frozenset(_BROKER_KEYS)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareGroupConfig:
    """The broker's share-group settings (Kafka's ``group.share.*``), validated."""

    session_timeout_ms: int = 45_000
    min_session_timeout_ms: int = 45_000
    max_session_timeout_ms: int = 60_000
    heartbeat_interval_ms: int = 5_000
    min_heartbeat_interval_ms: int = 5_000
    max_heartbeat_interval_ms: int = 15_000
    max_size: int = 200
    record_lock_duration_ms: int = 30_000
    min_record_lock_duration_ms: int = 15_000
    max_record_lock_duration_ms: int = 3_600_000
    delivery_count_limit: int = 5

    def __post_init__(self) -> None:
        for name, low, value, high in (
            ("session.timeout.ms", self.min_session_timeout_ms, self.session_timeout_ms,
             self.max_session_timeout_ms),
            ("heartbeat.interval.ms", self.min_heartbeat_interval_ms,
             self.heartbeat_interval_ms, self.max_heartbeat_interval_ms),
            ("record.lock.duration.ms", self.min_record_lock_duration_ms,
             self.record_lock_duration_ms, self.max_record_lock_duration_ms),
        ):  # fmt: skip
            if not 1 <= low <= value <= high:
                raise InvalidConfigError(
                    f"group.share.{name} must be within group.share.min.{name} and "
                    f"group.share.max.{name} (got {low} <= {value} <= {high})"
                )
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise InvalidConfigError(
                "group.share.heartbeat.interval.ms must be below group.share.session.timeout.ms"
            )
        if not 1 <= self.max_size <= 1000:
            raise InvalidConfigError("group.share.max.size must be 1..1000")
        low, high = _DELIVERY_COUNT_LIMITS
        if not low <= self.delivery_count_limit <= high:
            raise InvalidConfigError(f"group.share.delivery.count.limit must be {low}..{high}")

    @classmethod
    def from_mapping(cls, settings: Mapping[str, object]) -> ShareGroupConfig:
        """Build from Kafka-named ``group.share.*`` settings (strings or integers) on top
        of the defaults. Raises ``InvalidConfigError`` for an unknown key or bad value."""
        unknown = sorted(set(settings) - set(_BROKER_KEYS))
        if unknown:
            known = ", ".join(sorted(_BROKER_KEYS))
            raise InvalidConfigError(f"unknown share group setting {unknown[0]!r}; known: {known}")
        changes = {
            _BROKER_KEYS[key][0]: _int(key, value, _BROKER_KEYS[key][1])
            for key, value in settings.items()
        }
        return cls(**changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareGroupSettings:
    """One group's effective settings: its configs over the broker's defaults.
    ``auto_offset_reset`` is ``latest``, ``earliest`` or ``by_duration:...`` (see
    ``parse_duration_ms``); ``dead_letter_topic`` "" for none."""

    auto_offset_reset: str = "latest"
    isolation_level: str = "read_uncommitted"
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    record_lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    dead_letter_topic: str = ""


def resolve_settings(configs: Mapping[str, str], broker: ShareGroupConfig) -> ShareGroupSettings:
    """A group's settings from its (validated) configs and the broker's defaults."""
    return ShareGroupSettings(
        auto_offset_reset=configs.get(AUTO_OFFSET_RESET, "latest").lower(),
        isolation_level=configs.get(ISOLATION_LEVEL, "read_uncommitted").lower(),
        session_timeout_ms=int(configs.get(SESSION_TIMEOUT, broker.session_timeout_ms)),
        heartbeat_interval_ms=int(configs.get(HEARTBEAT_INTERVAL, broker.heartbeat_interval_ms)),
        record_lock_duration_ms=int(
            configs.get(RECORD_LOCK_DURATION, broker.record_lock_duration_ms)
        ),
        delivery_count_limit=int(configs.get(DELIVERY_COUNT_LIMIT, broker.delivery_count_limit)),
        dead_letter_topic=configs.get(DEAD_LETTER_TOPIC, ""),
    )


def validate_group_configs(configs: Mapping[str, str], broker: ShareGroupConfig) -> None:
    """Check a group's configs as they would be after a change (every name known, every
    value valid, the heartbeat interval below the session timeout).

    Raises:
        InvalidConfigError: the first problem found, naming the config.
    """
    for name in sorted(configs):
        if name not in GROUP_CONFIG_NAMES:
            raise InvalidConfigError(
                f"unknown group config {name!r}; known: {', '.join(sorted(GROUP_CONFIG_NAMES))}"
            )
    reset = configs.get(AUTO_OFFSET_RESET)
    if reset is not None and reset.lower() not in ("latest", "earliest"):
        prefix = "by_duration:"
        if not reset.lower().startswith(prefix):
            raise InvalidConfigError(
                f"{AUTO_OFFSET_RESET} must be latest, earliest or by_duration:<ISO 8601 "
                f"duration>, got {reset!r}"
            )
        parse_duration_ms(reset[len(prefix) :])
    level = configs.get(ISOLATION_LEVEL)
    if level is not None and level.lower() not in _ISOLATION_LEVELS:
        raise InvalidConfigError(f"{ISOLATION_LEVEL} must be one of {_ISOLATION_LEVELS}")
    for name, low, high in (
        (SESSION_TIMEOUT, broker.min_session_timeout_ms, broker.max_session_timeout_ms),
        (HEARTBEAT_INTERVAL, broker.min_heartbeat_interval_ms, broker.max_heartbeat_interval_ms),
        (RECORD_LOCK_DURATION, broker.min_record_lock_duration_ms,
         broker.max_record_lock_duration_ms),
        (DELIVERY_COUNT_LIMIT, *_DELIVERY_COUNT_LIMITS),
    ):  # fmt: skip
        if name in configs and not low <= _int(name, configs[name], 0) <= high:
            raise InvalidConfigError(f"{name} must be within {low} and {high}")
    settings = resolve_settings(configs, broker)
    if settings.heartbeat_interval_ms >= settings.session_timeout_ms:
        raise InvalidConfigError(f"{HEARTBEAT_INTERVAL} must be below {SESSION_TIMEOUT}")
    topic = configs.get(DEAD_LETTER_TOPIC, "")
    if topic:
        try:
            validate_topic_name(topic)
        except InvalidTopicError as exc:
            raise InvalidConfigError(f"{DEAD_LETTER_TOPIC}: {exc}") from None
        if topic.startswith("__"):
            # The internal topics (__consumer_offsets, __transaction_state,
            # __share_group_state) and any later one: the broker's own, never a sink.
            raise InvalidConfigError(
                f"{DEAD_LETTER_TOPIC}: {topic!r} is an internal topic name (starts with __)"
            )


def parse_duration_ms(text: str) -> int:
    """An ISO 8601 duration (``PnDTnHnMn.nS``, as Java's ``Duration.parse``; days, hours,
    minutes, seconds with up to 9 decimals) in whole milliseconds. Raises
    ``InvalidConfigError`` for anything else, a negative duration included."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or text.strip().upper() in ("P", "PT") or text.strip().upper().endswith("T"):
        raise InvalidConfigError(f"{text!r} is not an ISO 8601 duration such as P1DT2H30M")
    days, hours, minutes = (int(match.group(g) or 0) for g in ("days", "hours", "minutes"))
    seconds = match.group("seconds") or "0"
    whole, _, fraction = seconds.partition(".")
    millis = int((fraction + "000")[:3]) if fraction else 0
    return ((days * 24 + hours) * 60 + minutes) * 60_000 + int(whole) * 1000 + millis


def _int(key: str, value: object, low: int) -> int:
    if isinstance(value, bool):
        raise InvalidConfigError(f"{key} must be an integer, got {value!r}")
    try:
        number = int(str(value))
    except ValueError:
        raise InvalidConfigError(f"{key} must be an integer, got {value!r}") from None
    if number < low:
        raise InvalidConfigError(f"{key} must be at least {low}, got {number}")
    return number
