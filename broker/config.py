"""Broker configuration: ``BrokerConfig`` and its parsers, with Kafka's broker setting names.

Settings come from three places, later ones winning: a TOML file (``--config``), then
``--set KEY=VALUE`` pairs, then the dedicated flags ``--listen`` and ``--data-dir``. All three
arrive here as one flat mapping of Kafka-style names to values (``from_mapping``); a TOML file
may write the names as dotted keys (``log.retention.ms = 3600000``, which TOML reads as
nested tables) or quoted (``"log.retention.ms" = 3600000``), and ``load_toml`` flattens both.

Broker keys (Kafka's names where Kafka has one), their defaults and meaning, the topic
defaults a broker key sets and the removed keys are in ``broker.config_table``, next to
the table that defines them.

Security settings (``security.protocol``, ``ssl.*``, ``sasl.*``, ``audit.log.file``,
``metrics.ssl.enable``, ``inter.broker.sasl.*``) are ``broker.security_config``'s; the
config holds them as ``security``.

Unknown keys and bad values raise ``InvalidConfigError`` naming the key. So does a removed
key (``broker.config_table.REMOVED_KEYS``), whatever its value, with a message that says
why it went.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidelog.broker.config_table import (
    BROKER_FIELDS,
    GRPC_INT_MAX,
    REMOVED_KEYS,
    TIME_UNIT_KEYS,
    TOPIC_DEFAULT_KEYS,
    broker_keys,
    parse_int,
    parse_str,
)
from tidelog.broker.core.limits import LimitsConfig
from tidelog.broker.groups.coordinator import CoordinatorConfig
from tidelog.broker.groups.manager import GroupConfig
from tidelog.broker.groups.offset_store import OffsetStoreConfig
from tidelog.broker.security_config import PROTOCOLS, SecurityConfig
from tidelog.broker.share.settings import ShareSettings
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import InvalidConfigError
from tidelog.storage.log_manager import LogManagerConfig

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_LISTEN",
    "BrokerConfig",
    "broker_keys",
    "load_toml",
    "parse_listen",
]

DEFAULT_LISTEN = "127.0.0.1:7410"
DEFAULT_DATA_DIR = "./tidelog-data"


_METRICS_PORT_OFFSET = 1_000


def parse_listen(value: str, key: str = "listeners") -> tuple[str, int]:
    """Parse ``HOST:PORT``, ``[IPV6]:PORT`` or ``PLAINTEXT://HOST:PORT`` into (host, port).

    Raises:
        InvalidConfigError: several listeners, another protocol, no port, or a bad port.
    """
    text = value.strip()
    if "," in text:
        raise InvalidConfigError(f"{key}: only one listener is supported, got {value!r}")
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme.upper() not in PROTOCOLS:
            raise InvalidConfigError(
                f"{key}: the protocol must be one of {', '.join(PROTOCOLS)}, got {value!r}"
            )
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise InvalidConfigError(f"{key}: expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, parse_int(key, port_text, 0, 65535)


def listener_protocol(value: str) -> str | None:
    """The ``PROTOCOL://`` of a listener (upper case), or None if it has none."""
    scheme, sep, _ = value.strip().partition("://")
    return scheme.upper() if sep else None


def load_toml(path: str | Path) -> dict[str, object]:
    """Read a TOML settings file into a flat mapping of dotted keys.

    ``log.retention.ms = 5`` (nested tables to TOML) and ``"log.retention.ms" = 5`` (one
    quoted key) both become ``{"log.retention.ms": 5}``.

    Raises:
        InvalidConfigError: the file cannot be read or is not valid TOML, or holds a value
            that is not a string, integer, float or boolean.
    """
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise InvalidConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidConfigError(f"config file {path} is not valid TOML: {exc}") from None
    flat: dict[str, object] = {}

    def walk(prefix: str, table: Mapping[str, Any]) -> None:
        for name, value in table.items():
            key = f"{prefix}.{name}" if prefix else name
            if isinstance(value, dict):
                walk(key, value)
            elif isinstance(value, str | int | float | bool):
                flat[key] = value
            else:
                raise InvalidConfigError(
                    f"{path}: {key} must be a string, number or boolean, got {value!r}"
                )

    walk("", document)
    return flat


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    """Everything the broker daemon obeys. Immutable; build with ``from_mapping``.

    Direct construction validates too and raises ``ValueError`` naming the Kafka key.
    """

    listen_host: str = "127.0.0.1"
    listen_port: int = 7410
    data_dir: Path = field(default_factory=lambda: Path(DEFAULT_DATA_DIR))
    num_partitions: int = 1
    socket_request_max_bytes: int = 104_857_600
    fetch_max_bytes: int = 57_671_680
    fetch_max_wait_ms: int = 30_000
    num_io_threads: int = 64
    max_connections: int = 20_000
    max_connections_per_ip: int = 20_000
    queued_max_requests: int = 500
    queued_max_request_bytes: int = 256 * 1024 * 1024
    max_request_partition_size_limit: int = 20_000
    quota_window_num: int = 11
    quota_window_size_seconds: int = 1
    shutdown_grace_ms: int = 5_000
    connections_keepalive_time_ms: int = 30_000
    connections_keepalive_timeout_ms: int = 20_000
    connections_max_idle_ms: int = 600_000
    socket_connection_setup_timeout_ms: int = 10_000
    producer_id_expiration_ms: int = 86_400_000
    producer_id_expiration_check_interval_ms: int = 600_000
    metrics_port: int | None = None  # None: effective_metrics_port derives it
    metrics_host: str | None = None
    retention_check_interval_ms: int = 300_000
    cleaner_enabled: bool = True
    batch_times_enabled: bool = True
    cleaner_backoff_ms: int = 15_000
    flush_scheduler_interval_ms: int = 1_000
    flush_offset_checkpoint_interval_ms: int = 60_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_min_session_timeout_ms: int = 45_000
    group_consumer_max_session_timeout_ms: int = 60_000
    group_initial_rebalance_delay_ms: int = 3_000
    offsets_topic_num_partitions: int = 5
    offsets_topic_segment_bytes: int = 100 * 1024 * 1024
    offsets_topic_replication_factor: int = 3
    offset_metadata_max_bytes: int = 4_096
    # Transactions (issue #28, docs/transactions.md): Kafka's names and defaults, except 5
    # partitions of __transaction_state (Kafka 50), as for the offsets topic.
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    transaction_state_log_num_partitions: int = 5
    transaction_state_log_min_isr: int = 2
    transaction_state_log_replication_factor: int = 3
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    broker_id: int = 0
    broker_rack: str | None = None  # None: no rack (Kafka's broker.rack)
    # Bytes per second this broker fetches as an adding replica of a reassignment (0:
    # unthrottled; Kafka's default is unlimited too). broker.cluster.fetcher.
    follower_replication_throttled_rate: int = 0
    # Bytes per second a leader serves its partitions' adding replicas, all together (0:
    # unthrottled). broker.core.throttle.
    leader_replication_throttled_rate: int = 0
    zookeeper_connect: str | None = None
    zookeeper_session_timeout_ms: int = 18_000
    zookeeper_connection_timeout_ms: int = 15_000
    advertised_listeners: str | None = None
    kafka_listen: str | None = None  # None: no Kafka listener (broker/kafka)
    kafka_advertised_listen: str | None = None
    # Fetch records sent with sendfile on plaintext Kafka connections (broker.kafka.listener).
    kafka_zero_copy_fetch: bool = True
    max_incremental_fetch_session_cache_slots: int = 1_000
    min_incremental_fetch_session_eviction_ms: int = 120_000
    auto_create_topics_enable: bool = False
    default_replication_factor: int = 1
    unclean_leader_election_enable: bool = False
    controlled_shutdown_enable: bool = True
    authorizer_enabled: bool = False
    super_users: str | None = None
    allow_everyone_if_no_acl_found: bool = False
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_seconds: int = 300
    num_replica_fetchers: int = 1
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_max_bytes: int = 1024 * 1024
    replica_fetch_backoff_ms: int = 1000
    replica_lag_time_max_ms: int = 30_000
    log_defaults: LogConfig = field(default_factory=lambda: LogConfig())
    security: SecurityConfig = field(default_factory=lambda: SecurityConfig())
    # Share groups (issue #32, broker.share.settings: the group.share.* and
    # share.coordinator.* keys, Kafka's names and defaults).
    share: ShareSettings = field(default_factory=lambda: ShareSettings())

    def __post_init__(self) -> None:
        if self.advertised_listeners:
            parse_listen(self.advertised_listeners, "advertised.listeners")  # raises if bad
        if self.kafka_listen:
            parse_listen(self.kafka_listen, "kafka.listen")
        if self.kafka_advertised_listen:
            parse_listen(self.kafka_advertised_listen, "kafka.advertised.listen")
        checks = [
            ("listeners", 0 <= self.listen_port <= 65535),
            ("num.partitions", self.num_partitions >= 1),
            ("socket.request.max.bytes", self.socket_request_max_bytes >= 1024),
            ("fetch.max.bytes", self.fetch_max_bytes >= 1),
            ("fetch.max.wait.ms", self.fetch_max_wait_ms >= 0),
            ("num.io.threads", self.num_io_threads >= 1),
            ("broker.id", 0 <= self.broker_id <= 2**31 - 1),
            ("zookeeper.session.timeout.ms", self.zookeeper_session_timeout_ms >= 1),
            ("zookeeper.connection.timeout.ms", self.zookeeper_connection_timeout_ms >= 1),
            ("default.replication.factor", self.default_replication_factor >= 1),
            ("zookeeper.connect", self.zookeeper_connect is None or bool(self.zookeeper_connect)),
            ("broker.rack", self.broker_rack is None or bool(self.broker_rack.strip())),
            ("max.connections", self.max_connections >= 1),
            ("max.connections.per.ip", self.max_connections_per_ip >= 1),
            ("queued.max.requests", self.queued_max_requests >= 1),
            ("queued.max.request.bytes", self.queued_max_request_bytes >= 1),
            ("max.request.partition.size.limit", self.max_request_partition_size_limit >= 1),
            ("quota.window.num", self.quota_window_num >= 2),
            ("quota.window.size.seconds", self.quota_window_size_seconds >= 1),
            ("shutdown.grace.ms", self.shutdown_grace_ms >= 0),
            (
                "connections.keepalive.time.ms",
                1 <= self.connections_keepalive_time_ms <= GRPC_INT_MAX,
            ),
            (
                "connections.keepalive.timeout.ms",
                1 <= self.connections_keepalive_timeout_ms <= GRPC_INT_MAX,
            ),
            ("connections.max.idle.ms", 1 <= self.connections_max_idle_ms <= GRPC_INT_MAX),
            (
                "socket.connection.setup.timeout.ms",
                1 <= self.socket_connection_setup_timeout_ms <= GRPC_INT_MAX,
            ),
            ("producer.id.expiration.ms", self.producer_id_expiration_ms >= 1),
            (
                "producer.id.expiration.check.interval.ms",
                self.producer_id_expiration_check_interval_ms >= 1,
            ),
            ("metrics.port", self.metrics_port is None or -1 <= self.metrics_port <= 65535),
            ("log.retention.check.interval.ms", self.retention_check_interval_ms >= 1),
            ("log.cleaner.backoff.ms", self.cleaner_backoff_ms >= 0),
            ("log.flush.scheduler.interval.ms", self.flush_scheduler_interval_ms >= 1),
            (
                "log.flush.offset.checkpoint.interval.ms",
                self.flush_offset_checkpoint_interval_ms >= 1,
            ),
            (
                "group.consumer.min.session.timeout.ms",
                1
                <= self.group_consumer_min_session_timeout_ms
                <= self.group_consumer_max_session_timeout_ms,
            ),
            (
                "group.consumer.session.timeout.ms",
                self.group_consumer_min_session_timeout_ms
                <= self.group_consumer_session_timeout_ms
                <= self.group_consumer_max_session_timeout_ms,
            ),
            (
                "group.consumer.heartbeat.interval.ms",
                1
                <= self.group_consumer_heartbeat_interval_ms
                < self.group_consumer_min_session_timeout_ms,
            ),
            ("group.initial.rebalance.delay.ms", self.group_initial_rebalance_delay_ms >= 0),
            ("offsets.topic.num.partitions", 1 <= self.offsets_topic_num_partitions <= 1_000),
            ("offsets.topic.segment.bytes", self.offsets_topic_segment_bytes >= 1024),
            ("offset.metadata.max.bytes", 0 <= self.offset_metadata_max_bytes <= 0x7FFF),
            ("transaction.max.timeout.ms", self.transaction_max_timeout_ms >= 1),
            ("transactional.id.expiration.ms", self.transactional_id_expiration_ms >= 1),
            (
                "transaction.state.log.num.partitions",
                1 <= self.transaction_state_log_num_partitions <= 1_000,
            ),
            ("transaction.state.log.min.isr", self.transaction_state_log_min_isr >= 1),
            (
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                self.transaction_abort_timed_out_transaction_cleanup_interval_ms >= 1,
            ),
        ]
        for key, ok in checks:
            if not ok:
                raise ValueError(f"{key}: value out of range")
        if not self.listen_host:
            raise ValueError("listeners: empty host")

    # --- derived views ------------------------------------------------------------------

    @property
    def message_max_bytes(self) -> int:
        """``message.max.bytes``: the default ``max.message.bytes`` of every topic."""
        return self.log_defaults.max_message_bytes

    @property
    def listen_address(self) -> str:
        """``HOST:PORT`` as gRPC wants it (IPv6 hosts in brackets)."""
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"

    def advertised_endpoint(self, bound_port: int) -> tuple[str, int]:
        """``(host, port)`` other brokers and clients use to reach this one.

        ``advertised.listeners`` if set (its port 0 means the bound port), else the listen
        address, with a wildcard host (0.0.0.0, ::) advertised as 127.0.0.1: a wildcard is
        not an address anyone can dial, so a broker on one reachable from elsewhere must
        set ``advertised.listeners``, as in Kafka.
        """
        if self.advertised_listeners:
            host, port = parse_listen(self.advertised_listeners, "advertised.listeners")
            return host, port or bound_port
        host = self.listen_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return host, bound_port

    @property
    def effective_metrics_port(self) -> int:
        """The metrics port: ``metrics.port``, or the listen port plus 1000 when unset.

        Derived rather than fixed so that brokers started side by side with only
        ``--listen`` and ``--data-dir`` differing (the normal way to try a cluster on one
        machine) do not fight over one metrics port; +1000 rather than +1 so that
        brokers on consecutive ports do not take each other's. A broker listening on
        port 0, or above 64535, gets any free port (logged at start).
        """
        if self.metrics_port is not None:
            return self.metrics_port
        derived = self.listen_port + _METRICS_PORT_OFFSET
        return derived if self.listen_port and derived <= 65535 else 0

    @property
    def effective_metrics_host(self) -> str:
        """The address the metrics endpoint binds: ``metrics.host``, else 127.0.0.1.

        Loopback by default (issue 15): metrics name topics, clients and users, which is
        nobody else's business; a scraper elsewhere needs ``metrics.host`` set.
        """
        return self.metrics_host if self.metrics_host is not None else "127.0.0.1"

    def ignored_settings(self) -> tuple[str, ...]:
        """Warnings for settings given that the listener's protocol leaves without effect.

        The listener's scheme decides (Kafka's convention): ``ssl.*`` without TLS and
        ``sasl.*`` without SASL are ignored (``SecurityConfig.ignored_settings``). The
        authorizer is never ignored, but a listener that authenticates no one (PLAINTEXT,
        or SSL without client certificates) makes every caller ``User:ANONYMOUS``, which is
        rarely what ``authorizer.enabled=true`` meant, so that is said too. ``BrokerServer``
        logs each as a warning at start.
        """
        messages = list(self.security.ignored_settings())
        security = self.security
        anonymous = not security.sasl and not (security.tls and security.ssl_client_auth != "none")
        if self.authorizer_enabled and anonymous:
            messages.append(
                f"authorizer.enabled=true on a {security.protocol} listener that authenticates "
                "no one: every client is User:ANONYMOUS; set security.protocol=SASL_SSL (or "
                "listeners=SASL_SSL://HOST:PORT) to authorize users by name"
            )
        return tuple(messages)

    def limits_config(self) -> LimitsConfig:
        """The serving limits derived from these settings (``broker/core/limits.py``)."""
        return LimitsConfig(
            max_connections=self.max_connections,
            max_connections_per_ip=self.max_connections_per_ip,
            queued_max_requests=self.queued_max_requests,
            queued_max_request_bytes=self.queued_max_request_bytes,
        )

    def log_manager_config(self) -> LogManagerConfig:
        """The storage layer's configuration derived from these settings."""
        return LogManagerConfig(
            defaults=self.log_defaults,
            num_partitions=self.num_partitions,
            retention_check_interval_ms=self.retention_check_interval_ms,
            cleaner_enabled=self.cleaner_enabled,
            cleaner_backoff_ms=self.cleaner_backoff_ms,
            flush_scheduler_interval_ms=self.flush_scheduler_interval_ms,
            flush_offset_checkpoint_interval_ms=self.flush_offset_checkpoint_interval_ms,
            producer_id_expiration_ms=self.producer_id_expiration_ms,
            producer_id_expiration_check_interval_ms=(
                self.producer_id_expiration_check_interval_ms
            ),
        )

    def group_config(self) -> GroupConfig:
        """The group coordinator's configuration derived from these settings."""
        return GroupConfig(
            coordinator=CoordinatorConfig(
                heartbeat_interval_ms=self.group_consumer_heartbeat_interval_ms,
                session_timeout_ms=self.group_consumer_session_timeout_ms,
                min_session_timeout_ms=self.group_consumer_min_session_timeout_ms,
                max_session_timeout_ms=self.group_consumer_max_session_timeout_ms,
            ),
            offsets=OffsetStoreConfig(
                num_partitions=self.offsets_topic_num_partitions,
                segment_bytes=self.offsets_topic_segment_bytes,
            ),
            offset_metadata_max_bytes=self.offset_metadata_max_bytes,
            initial_rebalance_delay_ms=self.group_initial_rebalance_delay_ms,
        )

    # --- parsing ------------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, settings: Mapping[str, object]) -> BrokerConfig:
        """Build a config from Kafka-named settings on top of the embedded defaults.

        Values may be strings (from ``--set``) or TOML scalars.

        Raises:
            InvalidConfigError: an unknown key (the message lists the known ones), a
                removed key (the message says what replaced it) or a bad value (the message
                names the key).
        """
        removed = sorted(set(settings) & REMOVED_KEYS.keys())
        if removed:
            key = removed[0]
            raise InvalidConfigError(f"broker setting {key!r} was removed: {REMOVED_KEYS[key]}")
        unknown = sorted(set(settings) - broker_keys())
        if unknown:
            known = ", ".join(sorted(broker_keys()))
            raise InvalidConfigError(
                f"unknown broker setting {unknown[0]!r}; known settings: {known}"
            )
        changes: dict[str, Any] = {}
        for key, (name, parse) in BROKER_FIELDS.items():
            if key in settings:
                changes[name] = parse(key, settings[key])
        if "log.dirs" in settings and "log.dir" in settings:
            raise InvalidConfigError("give log.dirs or log.dir, not both")
        for key in ("log.dirs", "log.dir"):
            if key in settings:
                text = parse_str(key, settings[key])
                if "," in text:
                    raise InvalidConfigError(
                        f"{key}: exactly one data directory is supported, got {text!r}"
                    )
                changes["data_dir"] = Path(text)
        if "listeners" in settings:
            host, port = parse_listen(parse_str("listeners", settings["listeners"]))
            changes["listen_host"], changes["listen_port"] = host, port
        changes["log_defaults"] = _log_defaults(settings)
        protocol = None
        if "listeners" in settings:
            protocol = listener_protocol(parse_str("listeners", settings["listeners"]))
        changes["security"] = SecurityConfig.from_mapping(settings, protocol)
        changes["share"] = ShareSettings.from_mapping(settings)
        try:
            return dataclasses.replace(cls(), **changes)
        except ValueError as exc:
            raise InvalidConfigError(str(exc)) from None

    def to_mapping(self) -> dict[str, str]:
        """The effective settings as Kafka-named strings (topic defaults included)."""
        out = {"listeners": self.listen_address, "log.dirs": str(self.data_dir)}
        for key, (name, _) in BROKER_FIELDS.items():
            value = getattr(self, name)
            if value is not None:  # metrics.host/port unset: follow the listen address
                out[key] = str(value).lower() if isinstance(value, bool) else str(value)
        topic_values = self.log_defaults.to_mapping()
        for broker_key, topic_key in TOPIC_DEFAULT_KEYS.items():
            out[broker_key] = topic_values[topic_key]
        out["log.retention.ms"] = topic_values["retention.ms"]
        out["log.roll.ms"] = topic_values["segment.ms"]
        if self.security != SecurityConfig():
            out.update(self.security.to_mapping())
        if self.share != ShareSettings():
            out.update(self.share.to_mapping())
        return dict(sorted(out.items()))


def _log_defaults(settings: Mapping[str, object]) -> LogConfig:
    """Translate the broker's ``log.*`` defaults into a ``LogConfig``."""
    topic: dict[str, object] = {}
    for broker_key, topic_key in TOPIC_DEFAULT_KEYS.items():
        if broker_key in settings:
            topic[topic_key] = settings[broker_key]
    for broker_key, topic_key, unit_ms in TIME_UNIT_KEYS:
        if broker_key in settings and topic_key not in topic:
            value = parse_int(broker_key, settings[broker_key], -1)
            topic[topic_key] = value if value < 0 else value * unit_ms
    try:
        return LogConfig.from_mapping(topic)
    except InvalidConfigError as exc:
        # Name the broker key the user wrote, not the topic key it became.
        message = str(exc)
        for broker_key, topic_key in [
            *TOPIC_DEFAULT_KEYS.items(),
            *((b, t) for b, t, _ in TIME_UNIT_KEYS),
        ]:
            if broker_key in settings and message.startswith(f"{topic_key}:"):
                message = f"{broker_key}{message[len(topic_key) :]}"
                break
        raise InvalidConfigError(message) from None
