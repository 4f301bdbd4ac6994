"""How a broker is put together: one assembly function per mode, everything passed to
constructors.

``assemble_single_node`` and ``assemble_cluster`` build the whole object graph of one
broker (``BrokerParts``) and start it serving; ``broker.server.BrokerServer`` then owns
its lifecycle (stop, signals). Each collaborator is handed to the constructor of what
uses it; nothing is assigned onto an object after it was built (issue #26; the rule is
checked by ``tests/test_architecture.py``). What changes while a broker runs is the
state of one object made for it: ``broker.core.membership.Membership`` moves a cluster broker
from *joining* (lead nothing, administer nothing, no producer ids) to *joined* once
``ClusterNode.start`` has the cluster's view, and the ACL holder (``broker.core.acl_store.
Acls.use_store``) moves to ZooKeeper's ACLs at the same point.

The order, in both modes:

1. the TLS files are read (unreadable files: fail now) and the audit log opened;
2. the data directory is opened (recovering it if the last stop was not clean) and the
   broker's partitions built over it (``broker.core.facade.open_partitions``: the
   ``PartitionRegistry``, replicated in cluster mode, telling the purgatories of every
   move); the core is built on them (``BrokerCore.open``) with the mode's membership. A
   cluster broker's replica manager gets the same registry in step 6;
3. the admission limits and the metrics collectors;
4. the gRPC listener (``broker.grpc.listener.AsyncListener``), then the metrics endpoint;
5. the Kafka listener (``kafka.listen``), bound before a cluster broker registers: its
   registration carries that endpoint (Kafka registers a broker once every listener is
   bound);
6. a single node advertises its gRPC endpoint; a cluster broker joins
   (``ClusterNode.start``: register, watch, run a controller candidate, replicate) and
   its membership becomes the cluster's.

A failure at any step undoes the steps before it, in reverse.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tidelog.broker.config import BrokerConfig, parse_listen
from tidelog.broker.core.audit import configure_file as configure_audit_file
from tidelog.broker.core.configs import DEFAULT_ENTITY
from tidelog.broker.core.facade import BrokerCore, open_partitions
from tidelog.broker.core.limits import Admission, AdmissionCollector
from tidelog.broker.core.membership import Membership
from tidelog.broker.core.metrics import BrokerMetrics, MetricsServer
from tidelog.broker.core.quotas import QuotaCollector
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.broker.grpc.listener import AsyncListener
from tidelog.broker.kafka import KafkaListener, ListenerSettings
from tidelog.broker.loop_watchdog import LoopWatchdog
from tidelog.broker.security_config import SecurityConfig
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC, state_topic_config
from tidelog.broker.tls import ServerTls
from tidelog.broker.transactions.coordinator import txn_log_config
from tidelog.broker.transactions.txn_log import TRANSACTION_STATE_TOPIC, topic_config
from tidelog.storage.clock import Clock, SystemClock

if TYPE_CHECKING:
    from tidelog.broker.cluster.node import ClusterNode

__all__ = [
    "BrokerParts",
    "ListenError",
    "Listener",
    "assemble_cluster",
    "assemble_single_node",
]

log = logging.getLogger(__name__)

STOP_MARGIN_MS = 5_000  # beyond the grace period, for gRPC's own teardown
# Clients may ping this often (or as often as the broker pings, if that is more often):
# well under the client's 30 s, so timer slack never counts as a strike.
_MIN_CLIENT_PING_INTERVAL_MS = 10_000
_MAX_PING_STRIKES = 2  # gRPC's default: the third ping too early closes the connection


class ListenError(OSError):
    """The gRPC listen address could not be bound."""


class Listener(Protocol):
    """One network listener over the core (``AsyncListener``)."""

    port: int

    @property
    def watchdog(self) -> LoopWatchdog | None:
        """What watches its event loop (None: it has none)."""
        ...

    def enter_graceful_shutdown(self) -> None:
        """Health checks report ``NOT_SERVING`` from now on."""
        ...

    def stop(self, grace_ms: int, margin_ms: int) -> bool:
        """Stop accepting, let calls in flight finish within ``grace_ms``; False if it
        took longer than grace + margin."""
        ...


@dataclass(frozen=True, slots=True)
class BrokerParts:
    """One assembled, serving broker: what ``BrokerServer`` stops, in its order."""

    config: BrokerConfig
    core: BrokerCore
    listener: Listener
    admission: Admission
    metrics_server: MetricsServer | None
    node: ClusterNode | None  # cluster mode only
    tls: ServerTls | None  # the listener's reloadable certificates; None without TLS
    kafka: KafkaListener | None  # the Kafka wire-protocol listener; None if off


def assemble_single_node(config: BrokerConfig, clock: Clock | None = None) -> BrokerParts:
    """A broker without ``zookeeper.connect``: it leads every partition of its own data
    directory (``broker.core.placement.LocalPlacement``).

    Raises:
        StorageError: the data directory is unusable.
        ListenError: an address cannot be bound (the message names the setting).
    """
    if config.zookeeper_connect is not None:
        raise ValueError("assemble_single_node: zookeeper.connect is set; assemble_cluster")
    clock = clock or SystemClock()
    served = _Serving.start(config, clock, None)
    try:
        served.core.membership.advertise(*config.advertised_endpoint(served.listener.port))
    except BaseException:
        served.stop()
        raise
    return served.parts(None)


def assemble_cluster(config: BrokerConfig, clock: Clock | None = None) -> BrokerParts:
    """A broker of the cluster on ``zookeeper.connect``: it starts joining (until the
    cluster's view is in it leads nothing, administers no topic and hands out no producer
    id, so a client that connects early is never served as if by a single node), binds
    its listeners, then joins (``_join_cluster``).

    Raises:
        StorageError: the data directory is unusable.
        ListenError: an address cannot be bound.
        StoreError: ZooKeeper is unreachable or the broker id is taken.
        InvalidConfigError: the data directory belongs to another broker or cluster.
    """
    if config.zookeeper_connect is None:
        raise ValueError("assemble_cluster: zookeeper.connect is not set; assemble_single_node")
    clock = clock or SystemClock()
    membership = Membership.joining(config.broker_id)
    served = _Serving.start(config, clock, membership)
    node: ClusterNode | None = None
    try:
        endpoint = config.advertised_endpoint(served.listener.port)
        node = _join_cluster(config, served.core, membership, clock, endpoint, served.kafka)
    except BaseException:
        if node is not None:
            node.stop()
        served.stop()
        raise
    return served.parts(node)


class _Serving:
    """Steps 1-5 of the module docstring, shared by both modes; ``stop`` undoes them."""

    def __init__(
        self,
        config: BrokerConfig,
        core: BrokerCore,
        listener: Listener,
        admission: Admission,
        metrics_server: MetricsServer | None,
        tls: ServerTls | None,
        kafka: KafkaListener | None,
    ) -> None:
        self.config = config
        self.core = core
        self.listener = listener
        self.admission = admission
        self.metrics_server = metrics_server
        self.tls = tls
        self.kafka = kafka

    @classmethod
    def start(cls, config: BrokerConfig, clock: Clock, membership: Membership | None) -> _Serving:
        security = config.security
        tls = ServerTls.load(security) if security.tls else None  # unreadable files: fail now
        if security.audit_log_file:
            configure_audit_file(security.audit_log_file)
        metrics = BrokerMetrics()
        partitions, delayed = open_partitions(config, clock)
        # The core closes the log manager if it fails to open.
        core = BrokerCore.open(config, clock, metrics, membership, partitions, delayed)
        admission = Admission(config.limits_config())
        metrics.registry.register(AdmissionCollector(admission, core.parked_operations))
        metrics.registry.register(QuotaCollector(core.quotas))
        metrics_server: MetricsServer | None = None
        listener: Listener | None = None
        kafka: KafkaListener | None = None
        try:
            listener = AsyncListener.start(
                core,
                admission,
                address=config.listen_address,
                options=grpc_options(config),
                io_threads=config.num_io_threads,
                bind=_bind if tls is None else _secure_binder(tls),
            )
            metrics_port = config.effective_metrics_port
            if metrics_port >= 0:
                metrics_server = _start_metrics(
                    metrics, config.effective_metrics_host, metrics_port, security
                )
            if config.kafka_listen:
                kafka = _start_kafka(config, core, admission)
        except BaseException:
            if listener is not None:
                listener.stop(0, STOP_MARGIN_MS)
            if metrics_server is not None:
                metrics_server.stop()
            core.close()
            raise
        return cls(config, core, listener, admission, metrics_server, tls, kafka)

    def stop(self) -> None:
        """Undo ``start`` (a later step failed)."""
        if self.kafka is not None:
            self.kafka.stop()
        self.listener.stop(0, STOP_MARGIN_MS)
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self.core.close()

    def parts(self, node: ClusterNode | None) -> BrokerParts:
        return BrokerParts(
            self.config,
            self.core,
            self.listener,
            self.admission,
            self.metrics_server,
            node,
            self.tls,
            self.kafka,
        )


def _start_kafka(config: BrokerConfig, core: BrokerCore, admission: Admission) -> KafkaListener:
    """Start the Kafka listener on ``kafka.listen`` (``broker.kafka``).

    Raises:
        ListenError: the address cannot be bound.
    """
    assert config.kafka_listen is not None
    host, port = parse_listen(config.kafka_listen, "kafka.listen")
    advertised_host, advertised_port = host, 0
    if config.kafka_advertised_listen:
        advertised_host, advertised_port = parse_listen(
            config.kafka_advertised_listen, "kafka.advertised.listen"
        )
    if advertised_host in ("0.0.0.0", "::", ""):
        advertised_host = "127.0.0.1"
    security = config.security
    context = None
    if security.tls:
        # A context of its own: gRPC's needs ALPN h2, Kafka's protocol uses none.
        assert security.ssl_certfile is not None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(security.ssl_certfile, security.ssl_keyfile)
        if security.ssl_client_auth in ("required", "requested") and security.ssl_cafile:
            # Python's ssl can ask for a certificate without requiring one (CERT_OPTIONAL):
            # ``requested`` is honoured here, unlike on the gRPC listener.
            context.verify_mode = (
                ssl.CERT_REQUIRED if security.ssl_client_auth == "required" else ssl.CERT_OPTIONAL
            )
            context.load_verify_locations(security.ssl_cafile)
    settings = ListenerSettings(
        host=host,
        port=port,
        advertised_host=advertised_host,
        advertised_port=advertised_port,
        max_frame_bytes=config.socket_request_max_bytes,
        auto_create_topics=config.auto_create_topics_enable,
        io_threads=config.num_io_threads,
        ssl_context=context,
        sasl=security.sasl,
        fetch_session_slots=config.max_incremental_fetch_session_cache_slots,
        fetch_session_eviction_ms=config.min_incremental_fetch_session_eviction_ms,
        zero_copy_fetch=config.kafka_zero_copy_fetch,
    )
    try:
        return KafkaListener.start(core, settings, admission)
    except OSError as exc:
        raise ListenError(f"kafka.listen: cannot listen on {config.kafka_listen}: {exc}") from None


def grpc_options(config: BrokerConfig) -> list[tuple[str, int]]:
    """The gRPC server's channel arguments for ``config`` (keepalive: the docstring of
    ``broker.server``)."""
    keepalive_ms = config.connections_keepalive_time_ms
    timeout_ms = config.connections_keepalive_timeout_ms
    return [
        ("grpc.max_receive_message_length", config.socket_request_max_bytes),
        ("grpc.max_send_message_length", -1),
        # Never share a port with another process: a second broker must fail.
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        # grpcio 1.85 does not arm the keepalive timeout of its own: an unanswered ping is
        # caught by the general ping timeout (default 1 minute), so that one says it too
        # (tests/broker/test_keepalive.py fails without it).
        ("grpc.http2.ping_timeout_ms", timeout_ms),
        # Ping idle connections too, and accept pings on them (gRPC's default refuses a
        # client's pings on a connection without calls more often than every 2 hours).
        ("grpc.keepalive_permit_without_calls", 1),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            min(keepalive_ms, _MIN_CLIENT_PING_INTERVAL_MS),
        ),
        ("grpc.http2.max_ping_strikes", _MAX_PING_STRIKES),
        # Hostile input (docs/security.md): a connection that trickles its HTTP/2 preface
        # (slowloris) or never sends one is closed by the setup timeout (gRPC's default
        # is 120 s), one that holds no call by the idle time (gRPC's: never).
        ("grpc.server_handshake_timeout_ms", config.socket_connection_setup_timeout_ms),
        ("grpc.max_connection_idle_ms", config.connections_max_idle_ms),
    ]


def _bind(server: Any, address: str) -> int:
    try:
        port: int = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio raises on bind failure since 1.5x
        raise ListenError(f"listeners (--listen): cannot listen on {address}: {exc}") from None
    if port == 0:  # older grpcio returned 0 instead
        raise ListenError(f"listeners (--listen): cannot listen on {address}")
    return port


def _secure_binder(tls: ServerTls) -> Callable[[Any, str], int]:
    """``_bind`` for a TLS listener: the same errors, a secure port."""

    def bind(server: Any, address: str) -> int:
        try:
            port: int = server.add_secure_port(address, tls.server_credentials())
        except RuntimeError as exc:
            raise ListenError(f"listeners (--listen): cannot listen on {address}: {exc}") from None
        if port == 0:
            raise ListenError(f"listeners (--listen): cannot listen on {address}")
        return port

    return bind


def _start_metrics(
    metrics: BrokerMetrics, host: str, port: int, security: SecurityConfig
) -> MetricsServer:
    try:
        if security.metrics_ssl_enable:
            return MetricsServer.start(
                metrics.registry,
                host,
                port,
                certfile=security.ssl_certfile,
                keyfile=security.ssl_keyfile,
            )
        return MetricsServer.start(metrics.registry, host, port)
    except OSError as exc:
        shown = f"[{host}]" if ":" in host else host
        raise ListenError(
            f"metrics.port: cannot serve metrics on {shown}:{port}: {exc.strerror or exc} "
            "(set metrics.port to a free port, 0 for any, or -1 to turn metrics off)"
        ) from None


def _join_cluster(
    config: BrokerConfig,
    core: BrokerCore,
    membership: Membership,
    clock: Clock,
    endpoint: tuple[str, int],
    kafka: KafkaListener | None = None,
) -> ClusterNode:
    """Cluster mode: register (the gRPC endpoint, and the Kafka listener's if it runs),
    start the controller candidate (which creates the offsets topic and
    ``__transaction_state`` when missing), route by the cluster's view, draw producer ids
    from ZooKeeper (``broker.cluster.producer_ids``) and users from ZooKeeper's
    ``/config/users`` (``broker.core.users``), send transaction calls to other brokers
    (``broker.cluster.txn_peers``): ``membership`` joins.

    Raises ``StoreError`` (ZooKeeper unreachable, the broker id taken) or
    ``InvalidConfigError`` (the data directory belongs to another broker or cluster).
    """
    from tidelog.broker.cluster.acls import ZooKeeperAclStore
    from tidelog.broker.cluster.broker_configs import ZooKeeperBrokerConfigStore
    from tidelog.broker.cluster.node import ClusterNode  # kazoo is needed in cluster mode only
    from tidelog.broker.cluster.producer_ids import ZooKeeperProducerIds
    from tidelog.broker.cluster.znodes import KAFKA_LISTENER, ListenerEndpoint

    listeners = []
    if kafka is not None:
        kafka_host, kafka_port = kafka.advertised
        listeners.append(
            ListenerEndpoint(KAFKA_LISTENER, kafka_host, kafka_port, config.security.protocol)
        )

    offsets_config = {
        "cleanup.policy": "compact",
        "segment.bytes": str(config.offsets_topic_segment_bytes),
    }
    node = ClusterNode.start(
        config,
        core,
        clock,
        endpoint,
        internal_topics={
            OFFSETS_TOPIC: (config.offsets_topic_num_partitions, None, offsets_config),
            # Kafka's transaction.state.log.* (reference/transactions.md 2.1).
            TRANSACTION_STATE_TOPIC: (
                config.transaction_state_log_num_partitions,
                config.transaction_state_log_replication_factor,
                topic_config(txn_log_config(config), replicated=True),
            ),
            # Share groups' state (issue #32; Kafka's share.coordinator.state.topic.*).
            SHARE_STATE_TOPIC: (
                config.share.state_log.num_partitions,
                config.share.state_replication_factor,
                state_topic_config(config.share.state_log, replicated=True),
            ),
        },
        listeners=listeners,
    )
    # Ids unique across the cluster: blocks and keys in ZooKeeper, on the node's session.
    producer_ids = ZooKeeperProducerIds(
        node.store,
        config.broker_id,
        clock,
        config.producer_id_expiration_ms,
        sweep_interval_ms=config.producer_id_expiration_check_interval_ms,
    )
    membership.join(node.placement, node, producer_ids, node.store, node.txn_peers)
    # ACLs shared by the cluster: one watched document in ZooKeeper.
    core.acls.use_store(ZooKeeperAclStore.open(node.store))
    # Dynamic broker configs: /config/brokers/<default> and /config/brokers/<id>, watched.
    core.configs.use_store(
        ZooKeeperBrokerConfigStore.open(node.store, (DEFAULT_ENTITY, str(config.broker_id)))
    )
    # ... applied to the fetchers' throttle and the controller's elections as they change.
    core.configs.on_applied(node.apply_dynamic_configs)
    return node
