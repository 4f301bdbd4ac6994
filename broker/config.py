"""Broker configuration: ``BrokerConfig`` and its parsers, with Kafka's broker setting names.

Settings come from three places, later ones winning: a TOML file (``--config``), then
``--set KEY=VALUE`` pairs, then the dedicated flags ``--listen`` and ``--data-dir``. All three
arrive here as one flat mapping of Kafka-style names to values (``from_mapping``); a TOML file
may write the names as dotted keys (``log.retention.ms = 3600000``, which TOML reads as
nested tables) or quoted (``"log.retention.ms" = 3600000``), and ``load_toml`` flattens both.

Broker keys (Kafka's names where Kafka has one):

====================================  ===============  =============================================
key                                   default          meaning
====================================  ===============  =============================================
``listeners``                         127.0.0.1:7410   ``HOST:PORT`` or ``PROTOCOL://HOST:PORT``
                                                       (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
``log.dirs`` (or ``log.dir``)         ./tidelog-data   the data directory (exactly one)
``num.partitions``                    1                partitions of a topic created without a count
``message.max.bytes``                 1048588          default ``max.message.bytes`` of every topic
``socket.request.max.bytes``          104857600        largest gRPC message the broker receives
``fetch.max.bytes``                   57671680         cap on the bytes of one fetch answer
``fetch.max.wait.ms``                 30000            cap on a fetch's ``max_wait_ms`` (long poll)
``num.io.threads``                    64               storage threads (the listener's executor)
``max.connections``                   20000            connections served at once (``limits.py``)
``max.connections.per.ip``            20000            the same, per remote address
``queued.max.requests``               500              requests waiting for or on a storage thread
``queued.max.request.bytes``          268435456        produce bytes received and not yet answered
``max.request.partition.size.limit``  20000            entries (partitions, names...) of a request
``quota.window.num``                  11               samples of a client's quota rate
``quota.window.size.seconds``         1                the time each sample spans
``shutdown.grace.ms``                 5000             how long a clean stop lets calls finish
``connections.keepalive.time.ms``     30000            ping a connection idle this long (see below)
``connections.keepalive.timeout.ms``  20000            close it if the ping has no answer by then
``connections.max.idle.ms``           600000           close a connection without a call this long
``socket.connection.setup.timeout.ms`` 10000           close a connection still not set up by then
``producer.id.expiration.ms``         86400000         forget an idle producer id (epoch, sequences)
``producer.id.expiration.check.interval.ms`` 600000    how often idle producers are forgotten
``metrics.port``                      listen + 1000    Prometheus HTTP port; 0 any free port, -1 off
``metrics.host``                      127.0.0.1        address the metrics endpoint binds
``log.retention.check.interval.ms``   300000           how often retention runs
``log.cleaner.enable``                true             run the compaction thread
``log.batch.times.enable``            true             keep each batch's sent/received times
                                                       (``storage.batch_times``); false: none
                                                       are stored (readers get None), for
                                                       the benchmark's plain baseline
``log.cleaner.backoff.ms``            15000            cleaner sleep when there is nothing to do
``log.flush.scheduler.interval.ms``   1000             how often the flusher checks ``flush.ms``
``log.flush.offset.checkpoint.interval.ms`` 60000      how often recovery checkpoints are written
``group.consumer.heartbeat.interval.ms``  5000         heartbeat interval the coordinator dictates
``group.consumer.session.timeout.ms``     45000        session timeout when none is asked for
``group.consumer.min.session.timeout.ms`` 45000        smallest session timeout granted
``group.consumer.max.session.timeout.ms`` 60000        largest session timeout granted
``group.initial.rebalance.delay.ms``  3000             a new classic group's first rebalance
                                                       waits this long for more members
``offsets.topic.num.partitions``      5                partitions of the offsets topic (at creation)
``offsets.topic.segment.bytes``       104857600        its ``segment.bytes`` (at creation)
``offsets.topic.replication.factor``  3                its replicas (at most the brokers)
``offset.metadata.max.bytes``         4096             longest metadata string of a committed offset
``transaction.max.timeout.ms``        900000           longest ``transaction.timeout.ms`` granted
``transactional.id.expiration.ms``    604800000        an idle transactional id is removed after
``transaction.state.log.num.partitions`` 5             partitions of ``__transaction_state``
``transaction.state.log.min.isr``     2                its ``min.insync.replicas`` (cluster)
``transaction.state.log.replication.factor`` 3         its replicas (cluster; at most the brokers)
``transaction.abort.timed.out.transaction.cleanup.interval.ms`` 10000  timed-out
                                                       transactions are looked for this often
``group.share.*``, ``share.coordinator.*``  (Kafka's)  share groups: ``broker.share.settings``
``broker.id``                         0                this broker's id (unique in a cluster)
``broker.rack``                       (none)           rack (replicas spread over racks)
``follower.replication.throttled.rate`` 0              bytes/s an adding replica fetches (0: any)
``leader.replication.throttled.rate`` 0                bytes/s a leader serves adding replicas
``zookeeper.connect``                 (none)           ``HOST:PORT[,...][/chroot]``: cluster mode
``zookeeper.session.timeout.ms``      18000            ZooKeeper session: a dead broker's timeout
``zookeeper.connection.timeout.ms``   15000            how long to wait for ZooKeeper at start
``advertised.listeners``              (listen address) ``HOST:PORT`` other brokers and clients use
``kafka.listen``                      (off)            ``HOST:PORT`` of the Kafka protocol listener
``kafka.advertised.listen``           (kafka.listen)   ``HOST:PORT`` Kafka clients dial (Metadata)
``max.incremental.fetch.session.cache.slots`` 1000     Kafka fetch sessions kept (KIP-227; 0: none)
``min.incremental.fetch.session.eviction.ms`` 120000   idle time before a session may be evicted
``auto.create.topics.enable``         false            Kafka Metadata may create topics it names
``default.replication.factor``        1                replicas of a topic created without a factor
``unclean.leader.election.enable``    false            elect an out-of-ISR replica rather than none
``controlled.shutdown.enable``        true             move leadership away before a clean stop
``authorizer.enabled``                false            check every request against the ACLs
``super.users``                       (none)           ``User:A;User:B``: allowed everything
``allow.everyone.if.no.acl.found``    false            allow a resource no ACL names
``auto.leader.rebalance.enable``      true             give leadership back to preferred replicas
``leader.imbalance.check.interval.seconds`` 300        how often the controller does that
``min.insync.replicas``               1                in-sync replicas acks=all needs
``num.replica.fetchers``              1                fetcher threads per source broker
``replica.fetch.wait.max.ms``         500              a follower's fetch long-poll on the leader
``replica.fetch.max.bytes``           1048576          bytes per partition of a follower's fetch
``replica.fetch.backoff.ms``          1000             pause after a failed follower fetch
``replica.lag.time.max.ms``           30000            a follower behind this long leaves the ISR
====================================  ===============  =============================================

The two ``connections.keepalive`` settings have no Kafka equivalent. The broker pings a
connection that was quiet for the time and closes it if the answer takes longer than the
timeout, so a client whose host vanished without closing its connection is noticed within
time + timeout and its calls are cancelled, freeing their parked operations and the
connection's place in ``max.connections``.
Clients may ping as often as every 10 s, or every ``connections.keepalive.time.ms`` if
that is shorter (``broker/server.py``, ``docs/broker.md``).

The group settings keep Kafka's names and defaults, except ``offsets.topic.num.partitions``
(Kafka: 50; one broker needs few). A requested session timeout is clamped to [min, max]; the
heartbeat interval must be below the minimum session timeout.

Topic defaults, each the broker-wide default of the topic key in brackets (see
``storage/config.py``): ``log.segment.bytes`` [segment.bytes], ``log.roll.ms`` /
``log.roll.hours`` [segment.ms], ``log.index.size.max.bytes`` [segment.index.bytes],
``log.index.interval.bytes`` [index.interval.bytes], ``log.retention.ms`` /
``log.retention.minutes`` / ``log.retention.hours`` [retention.ms] (the finest unit given
wins, as in Kafka), ``log.retention.bytes`` [retention.bytes], ``log.cleanup.policy``
[cleanup.policy], ``log.cleaner.delete.retention.ms`` [delete.retention.ms],
``log.cleaner.min.compaction.lag.ms`` [min.compaction.lag.ms],
``log.cleaner.min.cleanable.ratio`` [min.cleanable.dirty.ratio],
``log.cleaner.max.compaction.lag.ms`` [max.compaction.lag.ms], ``message.max.bytes``
[max.message.bytes], ``log.message.timestamp.type`` [message.timestamp.type],
``compression.type`` [compression.type], ``log.message.timestamp.before.max.ms`` /
``log.message.timestamp.after.max.ms`` [message.timestamp.before/after.max.ms],
``log.flush.interval.messages`` [flush.messages], ``log.flush.interval.ms`` [flush.ms],
``log.segment.delete.delay.ms`` [file.delete.delay.ms].

Security settings (``security.protocol``, ``ssl.*``, ``sasl.*``, ``audit.log.file``,
``metrics.ssl.enable``, ``inter.broker.sasl.*``) are ``broker.security_config``'s; the
config holds them as ``security``.

Unknown keys and bad values raise ``InvalidConfigError`` naming the key. So does a removed
key (``_REMOVED_KEYS``), whatever its value, with a message that says why it went: a
setting that no longer does anything must not be accepted silently, and an unknown-key
error listing every setting would not tell the user what happened to theirs.
``server.io.model`` was removed (issue #26): the threaded serving model is gone and the
asynchronous one (``grpc.aio``, ``broker.grpc.listener``) is the only one, so even
``server.io.model=async`` is refused; delete the line.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidelog.broker.core.limits import LimitsConfig
from tidelog.broker.groups.coordinator import CoordinatorConfig
from tidelog.broker.groups.manager import GroupConfig
from tidelog.broker.groups.offset_store import OffsetStoreConfig
from tidelog.broker.security_config import PROTOCOLS, SECURITY_KEYS, SecurityConfig
from tidelog.broker.share.settings import SHARE_KEYS, ShareSettings
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

_HOUR_MS = 60 * 60 * 1000
_MINUTE_MS = 60 * 1000
_GRPC_INT_MAX = 2**31 - 1  # gRPC channel arguments are C ints

# Broker key -> topic key of the LogConfig default it sets, for the keys that map 1:1.
_TOPIC_DEFAULT_KEYS: dict[str, str] = {
    "log.segment.bytes": "segment.bytes",
    "log.index.size.max.bytes": "segment.index.bytes",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.retention.bytes": "retention.bytes",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "message.max.bytes": "max.message.bytes",
    "log.message.timestamp.type": "message.timestamp.type",
    "log.message.timestamp.before.max.ms": "message.timestamp.before.max.ms",
    "log.message.timestamp.after.max.ms": "message.timestamp.after.max.ms",
    "compression.type": "compression.type",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
    "min.insync.replicas": "min.insync.replicas",
}
# Keys in a time unit other than ms: (broker key, topic key, ms per unit), finest first so
# that the finest unit given wins (Kafka: log.retention.ms > .minutes > .hours).
_TIME_UNIT_KEYS: tuple[tuple[str, str, int], ...] = (
    ("log.retention.ms", "retention.ms", 1),
    ("log.retention.minutes", "retention.ms", _MINUTE_MS),
    ("log.retention.hours", "retention.ms", _HOUR_MS),
    ("log.roll.ms", "segment.ms", 1),
    ("log.roll.hours", "segment.ms", _HOUR_MS),
)


def _int(key: str, value: object, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidConfigError(f"{key}: expected an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise InvalidConfigError(f"{key}: expected an integer, got {value!r}") from None
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise InvalidConfigError(f"{key}: must be {bound}, got {number}")
    return number


def _bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidConfigError(f"{key}: expected true or false, got {value!r}")


def _str(key: str, value: object) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool) or str(value) == "":
        raise InvalidConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return str(value)


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
    return host, _int(key, port_text, 0, 65535)


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
                1 <= self.connections_keepalive_time_ms <= _GRPC_INT_MAX,
            ),
            (
                "connections.keepalive.timeout.ms",
                1 <= self.connections_keepalive_timeout_ms <= _GRPC_INT_MAX,
            ),
            ("connections.max.idle.ms", 1 <= self.connections_max_idle_ms <= _GRPC_INT_MAX),
            (
                "socket.connection.setup.timeout.ms",
                1 <= self.socket_connection_setup_timeout_ms <= _GRPC_INT_MAX,
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
        removed = sorted(set(settings) & _REMOVED_KEYS.keys())
        if removed:
            key = removed[0]
            raise InvalidConfigError(f"broker setting {key!r} was removed: {_REMOVED_KEYS[key]}")
        unknown = sorted(set(settings) - broker_keys())
        if unknown:
            known = ", ".join(sorted(broker_keys()))
            raise InvalidConfigError(
                f"unknown broker setting {unknown[0]!r}; known settings: {known}"
            )
        changes: dict[str, Any] = {}
        for key, (name, parse) in _BROKER_FIELDS.items():
            if key in settings:
                changes[name] = parse(key, settings[key])
        if "log.dirs" in settings and "log.dir" in settings:
            raise InvalidConfigError("give log.dirs or log.dir, not both")
        for key in ("log.dirs", "log.dir"):
            if key in settings:
                text = _str(key, settings[key])
                if "," in text:
                    raise InvalidConfigError(
                        f"{key}: exactly one data directory is supported, got {text!r}"
                    )
                changes["data_dir"] = Path(text)
        if "listeners" in settings:
            host, port = parse_listen(_str("listeners", settings["listeners"]))
            changes["listen_host"], changes["listen_port"] = host, port
        changes["log_defaults"] = _log_defaults(settings)
        protocol = None
        if "listeners" in settings:
            protocol = listener_protocol(_str("listeners", settings["listeners"]))
        changes["security"] = SecurityConfig.from_mapping(settings, protocol)
        changes["share"] = ShareSettings.from_mapping(settings)
        try:
            return dataclasses.replace(cls(), **changes)
        except ValueError as exc:
            raise InvalidConfigError(str(exc)) from None

    def to_mapping(self) -> dict[str, str]:
        """The effective settings as Kafka-named strings (topic defaults included)."""
        out = {"listeners": self.listen_address, "log.dirs": str(self.data_dir)}
        for key, (name, _) in _BROKER_FIELDS.items():
            value = getattr(self, name)
            if value is not None:  # metrics.host/port unset: follow the listen address
                out[key] = str(value).lower() if isinstance(value, bool) else str(value)
        topic_values = self.log_defaults.to_mapping()
        for broker_key, topic_key in _TOPIC_DEFAULT_KEYS.items():
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
    for broker_key, topic_key in _TOPIC_DEFAULT_KEYS.items():
        if broker_key in settings:
            topic[topic_key] = settings[broker_key]
    for broker_key, topic_key, unit_ms in _TIME_UNIT_KEYS:
        if broker_key in settings and topic_key not in topic:
            value = _int(broker_key, settings[broker_key], -1)
            topic[topic_key] = value if value < 0 else value * unit_ms
    try:
        return LogConfig.from_mapping(topic)
    except InvalidConfigError as exc:
        # Name the broker key the user wrote, not the topic key it became.
        message = str(exc)
        for broker_key, topic_key in [
            *_TOPIC_DEFAULT_KEYS.items(),
            *((b, t) for b, t, _ in _TIME_UNIT_KEYS),
        ]:
            if broker_key in settings and message.startswith(f"{topic_key}:"):
                message = f"{broker_key}{message[len(topic_key) :]}"
                break
        raise InvalidConfigError(message) from None


_Parser = Callable[[str, object], Any]

# Keys that were settings once -> why they went and what to do instead. Refused whatever
# their value (see the module docstring).
_REMOVED_KEYS: dict[str, str] = {
    "server.io.model": (
        "the threaded serving model was retired (issue #26) and the asyncio model "
        "(grpc.aio) is the only one; delete the setting"
    ),
}

# Broker key -> (BrokerConfig field, parser) for the plain one-to-one keys.
_BROKER_FIELDS: dict[str, tuple[str, _Parser]] = {
    "num.partitions": ("num_partitions", lambda k, v: _int(k, v, 1)),
    "socket.request.max.bytes": ("socket_request_max_bytes", lambda k, v: _int(k, v, 1024)),
    "fetch.max.bytes": ("fetch_max_bytes", lambda k, v: _int(k, v, 1)),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", lambda k, v: _int(k, v, 0)),
    "num.io.threads": ("num_io_threads", lambda k, v: _int(k, v, 1, 10_000)),
    "max.connections": ("max_connections", lambda k, v: _int(k, v, 1)),
    "max.connections.per.ip": ("max_connections_per_ip", lambda k, v: _int(k, v, 1)),
    "queued.max.requests": ("queued_max_requests", lambda k, v: _int(k, v, 1)),
    "queued.max.request.bytes": ("queued_max_request_bytes", lambda k, v: _int(k, v, 1)),
    "max.request.partition.size.limit": (
        "max_request_partition_size_limit",
        lambda k, v: _int(k, v, 1),
    ),
    "quota.window.num": ("quota_window_num", lambda k, v: _int(k, v, 2)),
    "quota.window.size.seconds": ("quota_window_size_seconds", lambda k, v: _int(k, v, 1)),
    "shutdown.grace.ms": ("shutdown_grace_ms", lambda k, v: _int(k, v, 0)),
    "connections.keepalive.time.ms": (
        "connections_keepalive_time_ms",
        lambda k, v: _int(k, v, 1, _GRPC_INT_MAX),
    ),
    "connections.keepalive.timeout.ms": (
        "connections_keepalive_timeout_ms",
        lambda k, v: _int(k, v, 1, _GRPC_INT_MAX),
    ),
    "connections.max.idle.ms": (
        "connections_max_idle_ms",
        lambda k, v: _int(k, v, 1, _GRPC_INT_MAX),
    ),
    "socket.connection.setup.timeout.ms": (
        "socket_connection_setup_timeout_ms",
        lambda k, v: _int(k, v, 1, _GRPC_INT_MAX),
    ),
    "producer.id.expiration.ms": ("producer_id_expiration_ms", lambda k, v: _int(k, v, 1)),
    "producer.id.expiration.check.interval.ms": (
        "producer_id_expiration_check_interval_ms",
        lambda k, v: _int(k, v, 1),
    ),
    "metrics.port": ("metrics_port", lambda k, v: _int(k, v, -1, 65535)),
    "metrics.host": ("metrics_host", _str),
    "log.retention.check.interval.ms": (
        "retention_check_interval_ms",
        lambda k, v: _int(k, v, 1),
    ),
    "log.cleaner.enable": ("cleaner_enabled", _bool),
    "log.batch.times.enable": ("batch_times_enabled", _bool),
    "log.cleaner.backoff.ms": ("cleaner_backoff_ms", lambda k, v: _int(k, v, 0)),
    "log.flush.scheduler.interval.ms": (
        "flush_scheduler_interval_ms",
        lambda k, v: _int(k, v, 1),
    ),
    "log.flush.offset.checkpoint.interval.ms": (
        "flush_offset_checkpoint_interval_ms",
        lambda k, v: _int(k, v, 1),
    ),
    "group.consumer.heartbeat.interval.ms": (
        "group_consumer_heartbeat_interval_ms",
        lambda k, v: _int(k, v, 1),
    ),
    "group.consumer.session.timeout.ms": (
        "group_consumer_session_timeout_ms",
        lambda k, v: _int(k, v, 1),
    ),
    "group.consumer.min.session.timeout.ms": (
        "group_consumer_min_session_timeout_ms",
        lambda k, v: _int(k, v, 1),
    ),
    "group.consumer.max.session.timeout.ms": (
        "group_consumer_max_session_timeout_ms",
        lambda k, v: _int(k, v, 1),
    ),
    "group.initial.rebalance.delay.ms": (
        "group_initial_rebalance_delay_ms",
        lambda k, v: _int(k, v, 0),
    ),
    "offsets.topic.num.partitions": (
        "offsets_topic_num_partitions",
        lambda k, v: _int(k, v, 1, 1_000),
    ),
    "offsets.topic.segment.bytes": ("offsets_topic_segment_bytes", lambda k, v: _int(k, v, 1024)),
    "offsets.topic.replication.factor": (
        "offsets_topic_replication_factor",
        lambda k, v: _int(k, v, 1, 32),
    ),
    "offset.metadata.max.bytes": ("offset_metadata_max_bytes", lambda k, v: _int(k, v, 0, 0x7FFF)),
    "transaction.max.timeout.ms": ("transaction_max_timeout_ms", lambda k, v: _int(k, v, 1)),
    "transactional.id.expiration.ms": (
        "transactional_id_expiration_ms",
        lambda k, v: _int(k, v, 1),
    ),
    "transaction.state.log.num.partitions": (
        "transaction_state_log_num_partitions",
        lambda k, v: _int(k, v, 1, 1_000),
    ),
    "transaction.state.log.min.isr": ("transaction_state_log_min_isr", lambda k, v: _int(k, v, 1)),
    "transaction.state.log.replication.factor": (
        "transaction_state_log_replication_factor",
        lambda k, v: _int(k, v, 1, 32),
    ),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (
        "transaction_abort_timed_out_transaction_cleanup_interval_ms",
        lambda k, v: _int(k, v, 1),
    ),
    "broker.id": ("broker_id", lambda k, v: _int(k, v, 0, 2**31 - 1)),
    "broker.rack": ("broker_rack", _str),
    "follower.replication.throttled.rate": (
        "follower_replication_throttled_rate",
        lambda k, v: _int(k, v, 0),
    ),
    "leader.replication.throttled.rate": (
        "leader_replication_throttled_rate",
        lambda k, v: _int(k, v, 0),
    ),
    "zookeeper.connect": ("zookeeper_connect", _str),
    "zookeeper.session.timeout.ms": ("zookeeper_session_timeout_ms", lambda k, v: _int(k, v, 1)),
    "zookeeper.connection.timeout.ms": (
        "zookeeper_connection_timeout_ms",
        lambda k, v: _int(k, v, 1),
    ),
    "advertised.listeners": ("advertised_listeners", _str),
    "kafka.listen": ("kafka_listen", _str),
    "kafka.advertised.listen": ("kafka_advertised_listen", _str),
    "max.incremental.fetch.session.cache.slots": (
        "max_incremental_fetch_session_cache_slots",
        lambda k, v: _int(k, v, 0),
    ),
    "min.incremental.fetch.session.eviction.ms": (
        "min_incremental_fetch_session_eviction_ms",
        lambda k, v: _int(k, v, 0),
    ),
    "auto.create.topics.enable": ("auto_create_topics_enable", _bool),
    "default.replication.factor": ("default_replication_factor", lambda k, v: _int(k, v, 1)),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", _bool),
    "controlled.shutdown.enable": ("controlled_shutdown_enable", _bool),
    "authorizer.enabled": ("authorizer_enabled", _bool),
    "super.users": ("super_users", _str),
    "allow.everyone.if.no.acl.found": ("allow_everyone_if_no_acl_found", _bool),
    "auto.leader.rebalance.enable": ("auto_leader_rebalance_enable", _bool),
    "leader.imbalance.check.interval.seconds": (
        "leader_imbalance_check_interval_seconds",
        lambda k, v: _int(k, v, 1),
    ),
    "num.replica.fetchers": ("num_replica_fetchers", lambda k, v: _int(k, v, 1, 64)),
    "replica.fetch.wait.max.ms": ("replica_fetch_wait_max_ms", lambda k, v: _int(k, v, 0)),
    "replica.fetch.max.bytes": ("replica_fetch_max_bytes", lambda k, v: _int(k, v, 1024)),
    "replica.fetch.backoff.ms": ("replica_fetch_backoff_ms", lambda k, v: _int(k, v, 0)),
    "replica.lag.time.max.ms": ("replica_lag_time_max_ms", lambda k, v: _int(k, v, 1)),
}


def broker_keys() -> frozenset[str]:
    """Every setting name ``BrokerConfig.from_mapping`` accepts."""
    return frozenset(
        {
            "listeners",
            "log.dirs",
            "log.dir",
            *_BROKER_FIELDS,
            *_TOPIC_DEFAULT_KEYS,
            *(key for key, _, _ in _TIME_UNIT_KEYS),
            *SECURITY_KEYS,
            *SHARE_KEYS,
        }
    )
