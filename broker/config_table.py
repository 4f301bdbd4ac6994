"""The broker's settings table: every key ``BrokerConfig.from_mapping`` accepts, its
default and meaning, and how its value is parsed.

``broker.config`` keeps ``BrokerConfig`` (its fields, range checks and derived views),
``from_mapping`` and ``to_mapping``, and the file and listener parsing; this module holds
the definitions they read: ``BROKER_FIELDS`` (Kafka key -> ``BrokerConfig`` field and
parser), ``TOPIC_DEFAULT_KEYS`` and ``TIME_UNIT_KEYS`` (the broker keys that set a topic
default), ``REMOVED_KEYS``, the value parsers (``parse_int``, ``parse_bool``,
``parse_str``) and ``broker_keys``. It is apart because the table is data that grows with
every setting, documented here next to where each key is defined, while the config's
logic does not change with it.

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
``kafka.zero.copy.fetch``             true             Fetch records sent with sendfile (plaintext)
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

Unknown keys and bad values raise ``InvalidConfigError`` naming the key. So does a removed
key (``REMOVED_KEYS``), whatever its value, with a message that says why it went: a
setting that no longer does anything must not be accepted silently, and an unknown-key
error listing every setting would not tell the user what happened to theirs.
``server.io.model`` was removed (issue #26): the threaded serving model is gone and the
asynchronous one (``grpc.aio``, ``broker.grpc.listener``) is the only one, so even
``server.io.model=async`` is refused; delete the line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidelog.broker.security_config import SECURITY_KEYS
from tidelog.broker.share.settings import SHARE_KEYS
from tidelog.storage.errors import InvalidConfigError

__all__ = [
    "BROKER_FIELDS",
    "GRPC_INT_MAX",
    "REMOVED_KEYS",
    "TIME_UNIT_KEYS",
    "TOPIC_DEFAULT_KEYS",
    "Parser",
    "broker_keys",
    "parse_bool",
    "parse_int",
    "parse_str",
]

_HOUR_MS = 60 * 60 * 1000
_MINUTE_MS = 60 * 1000
GRPC_INT_MAX = 2**31 - 1  # gRPC channel arguments are C ints

# Broker key -> topic key of the LogConfig default it sets, for the keys that map 1:1.
TOPIC_DEFAULT_KEYS: dict[str, str] = {
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
TIME_UNIT_KEYS: tuple[tuple[str, str, int], ...] = (
    ("log.retention.ms", "retention.ms", 1),
    ("log.retention.minutes", "retention.ms", _MINUTE_MS),
    ("log.retention.hours", "retention.ms", _HOUR_MS),
    ("log.roll.ms", "segment.ms", 1),
    ("log.roll.hours", "segment.ms", _HOUR_MS),
)


def parse_int(key: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """An integer setting (an int or its string) in ``[minimum, maximum]``; raises
    ``InvalidConfigError`` naming ``key``."""
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


def parse_bool(key: str, value: object) -> bool:
    """A boolean setting (a bool, or ``true``/``false`` in any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidConfigError(f"{key}: expected true or false, got {value!r}")


def parse_str(key: str, value: object) -> str:
    """A non-empty string setting (an int is taken as its string)."""
    if not isinstance(value, str | int) or isinstance(value, bool) or str(value) == "":
        raise InvalidConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return str(value)


# A value parser: (key, value) -> the parsed value, or InvalidConfigError naming the key.
Parser = Callable[[str, object], Any]

# Keys that were settings once -> why they went and what to do instead. Refused whatever
# their value (see the module docstring).
REMOVED_KEYS: dict[str, str] = {
    "server.io.model": (
        "the threaded serving model was retired (issue #26) and the asyncio model "
        "(grpc.aio) is the only one; delete the setting"
    ),
}

# Broker key -> (BrokerConfig field, parser) for the plain one-to-one keys.
BROKER_FIELDS: dict[str, tuple[str, Parser]] = {
    "num.partitions": ("num_partitions", lambda k, v: parse_int(k, v, 1)),
    "socket.request.max.bytes": ("socket_request_max_bytes", lambda k, v: parse_int(k, v, 1024)),
    "fetch.max.bytes": ("fetch_max_bytes", lambda k, v: parse_int(k, v, 1)),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", lambda k, v: parse_int(k, v, 0)),
    "num.io.threads": ("num_io_threads", lambda k, v: parse_int(k, v, 1, 10_000)),
    "max.connections": ("max_connections", lambda k, v: parse_int(k, v, 1)),
    "max.connections.per.ip": ("max_connections_per_ip", lambda k, v: parse_int(k, v, 1)),
    "queued.max.requests": ("queued_max_requests", lambda k, v: parse_int(k, v, 1)),
    "queued.max.request.bytes": ("queued_max_request_bytes", lambda k, v: parse_int(k, v, 1)),
    "max.request.partition.size.limit": (
        "max_request_partition_size_limit",
        lambda k, v: parse_int(k, v, 1),
    ),
    "quota.window.num": ("quota_window_num", lambda k, v: parse_int(k, v, 2)),
    "quota.window.size.seconds": ("quota_window_size_seconds", lambda k, v: parse_int(k, v, 1)),
    "shutdown.grace.ms": ("shutdown_grace_ms", lambda k, v: parse_int(k, v, 0)),
    "connections.keepalive.time.ms": (
        "connections_keepalive_time_ms",
        lambda k, v: parse_int(k, v, 1, GRPC_INT_MAX),
    ),
    "connections.keepalive.timeout.ms": (
        "connections_keepalive_timeout_ms",
        lambda k, v: parse_int(k, v, 1, GRPC_INT_MAX),
    ),
    "connections.max.idle.ms": (
        "connections_max_idle_ms",
        lambda k, v: parse_int(k, v, 1, GRPC_INT_MAX),
    ),
    "socket.connection.setup.timeout.ms": (
        "socket_connection_setup_timeout_ms",
        lambda k, v: parse_int(k, v, 1, GRPC_INT_MAX),
    ),
    "producer.id.expiration.ms": ("producer_id_expiration_ms", lambda k, v: parse_int(k, v, 1)),
    "producer.id.expiration.check.interval.ms": (
        "producer_id_expiration_check_interval_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "metrics.port": ("metrics_port", lambda k, v: parse_int(k, v, -1, 65535)),
    "metrics.host": ("metrics_host", parse_str),
    "log.retention.check.interval.ms": (
        "retention_check_interval_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "log.cleaner.enable": ("cleaner_enabled", parse_bool),
    "log.batch.times.enable": ("batch_times_enabled", parse_bool),
    "log.cleaner.backoff.ms": ("cleaner_backoff_ms", lambda k, v: parse_int(k, v, 0)),
    "log.flush.scheduler.interval.ms": (
        "flush_scheduler_interval_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "log.flush.offset.checkpoint.interval.ms": (
        "flush_offset_checkpoint_interval_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "group.consumer.heartbeat.interval.ms": (
        "group_consumer_heartbeat_interval_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "group.consumer.session.timeout.ms": (
        "group_consumer_session_timeout_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "group.consumer.min.session.timeout.ms": (
        "group_consumer_min_session_timeout_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "group.consumer.max.session.timeout.ms": (
        "group_consumer_max_session_timeout_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "group.initial.rebalance.delay.ms": (
        "group_initial_rebalance_delay_ms",
        lambda k, v: parse_int(k, v, 0),
    ),
    "offsets.topic.num.partitions": (
        "offsets_topic_num_partitions",
        lambda k, v: parse_int(k, v, 1, 1_000),
    ),
    "offsets.topic.segment.bytes": (
        "offsets_topic_segment_bytes",
        lambda k, v: parse_int(k, v, 1024),
    ),
    "offsets.topic.replication.factor": (
        "offsets_topic_replication_factor",
        lambda k, v: parse_int(k, v, 1, 32),
    ),
    "offset.metadata.max.bytes": (
        "offset_metadata_max_bytes",
        lambda k, v: parse_int(k, v, 0, 0x7FFF),
    ),
    "transaction.max.timeout.ms": ("transaction_max_timeout_ms", lambda k, v: parse_int(k, v, 1)),
    "transactional.id.expiration.ms": (
        "transactional_id_expiration_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "transaction.state.log.num.partitions": (
        "transaction_state_log_num_partitions",
        lambda k, v: parse_int(k, v, 1, 1_000),
    ),
    "transaction.state.log.min.isr": (
        "transaction_state_log_min_isr",
        lambda k, v: parse_int(k, v, 1),
    ),
    "transaction.state.log.replication.factor": (
        "transaction_state_log_replication_factor",
        lambda k, v: parse_int(k, v, 1, 32),
    ),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (
        "transaction_abort_timed_out_transaction_cleanup_interval_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "broker.id": ("broker_id", lambda k, v: parse_int(k, v, 0, 2**31 - 1)),
    "broker.rack": ("broker_rack", parse_str),
    "follower.replication.throttled.rate": (
        "follower_replication_throttled_rate",
        lambda k, v: parse_int(k, v, 0),
    ),
    "leader.replication.throttled.rate": (
        "leader_replication_throttled_rate",
        lambda k, v: parse_int(k, v, 0),
    ),
    "zookeeper.connect": ("zookeeper_connect", parse_str),
    "zookeeper.session.timeout.ms": (
        "zookeeper_session_timeout_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "zookeeper.connection.timeout.ms": (
        "zookeeper_connection_timeout_ms",
        lambda k, v: parse_int(k, v, 1),
    ),
    "advertised.listeners": ("advertised_listeners", parse_str),
    "kafka.listen": ("kafka_listen", parse_str),
    "kafka.advertised.listen": ("kafka_advertised_listen", parse_str),
    "kafka.zero.copy.fetch": ("kafka_zero_copy_fetch", parse_bool),
    "max.incremental.fetch.session.cache.slots": (
        "max_incremental_fetch_session_cache_slots",
        lambda k, v: parse_int(k, v, 0),
    ),
    "min.incremental.fetch.session.eviction.ms": (
        "min_incremental_fetch_session_eviction_ms",
        lambda k, v: parse_int(k, v, 0),
    ),
    "auto.create.topics.enable": ("auto_create_topics_enable", parse_bool),
    "default.replication.factor": ("default_replication_factor", lambda k, v: parse_int(k, v, 1)),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", parse_bool),
    "controlled.shutdown.enable": ("controlled_shutdown_enable", parse_bool),
    "authorizer.enabled": ("authorizer_enabled", parse_bool),
    "super.users": ("super_users", parse_str),
    "allow.everyone.if.no.acl.found": ("allow_everyone_if_no_acl_found", parse_bool),
    "auto.leader.rebalance.enable": ("auto_leader_rebalance_enable", parse_bool),
    "leader.imbalance.check.interval.seconds": (
        "leader_imbalance_check_interval_seconds",
        lambda k, v: parse_int(k, v, 1),
    ),
    "num.replica.fetchers": ("num_replica_fetchers", lambda k, v: parse_int(k, v, 1, 64)),
    "replica.fetch.wait.max.ms": ("replica_fetch_wait_max_ms", lambda k, v: parse_int(k, v, 0)),
    "replica.fetch.max.bytes": ("replica_fetch_max_bytes", lambda k, v: parse_int(k, v, 1024)),
    "replica.fetch.backoff.ms": ("replica_fetch_backoff_ms", lambda k, v: parse_int(k, v, 0)),
    "replica.lag.time.max.ms": ("replica_lag_time_max_ms", lambda k, v: parse_int(k, v, 1)),
}


def broker_keys() -> frozenset[str]:
    """Every setting name ``BrokerConfig.from_mapping`` accepts."""
    return frozenset(
        {
            "listeners",
            "log.dirs",
            "log.dir",
            *BROKER_FIELDS,
            *TOPIC_DEFAULT_KEYS,
            *(key for key, _, _ in TIME_UNIT_KEYS),
            *SECURITY_KEYS,
            *SHARE_KEYS,
        }
    )
