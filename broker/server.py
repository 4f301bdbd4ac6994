"""The broker process's lifecycle: start, serve, stop cleanly.

``BrokerServer.start`` raises the process's open-file limit to its hard limit (every
connection is a file descriptor; the value got is logged), opens the data directory
(recovering it if the last stop was not clean), then starts one gRPC listener carrying
the ``tidelog.v1.Broker`` service, the standard health service and server reflection, and
the Prometheus endpoint if ``metrics.port`` is not -1.

The gRPC listener is ``broker.grpc_async.AsyncListener``: ``grpc.aio`` on an event loop
thread, storage work on ``num.io.threads`` threads, waiting calls parked without a
thread, and the limits of ``broker.limits`` enforced. It is the only serving model: the
threaded one (``server.io.model=threads``, a worker per call for the call's whole life)
was retired in issue #26, with the measurement that decided it in ``docs/broker.md``
("One serving model"); the setting is refused by ``broker.config``.

Keepalive (``_grpc_options``): a stream whose client vanished without closing its
connection (host crash, cable pulled, a NAT that forgot the flow) would keep its parked
operation and its place in ``max.connections`` for good. The server therefore
pings every connection quiet for ``connections.keepalive.time.ms``, with
or without calls, and closes it when the ping is not answered within
``connections.keepalive.timeout.ms``; gRPC then cancels its calls and the handlers return.
It also accepts the clients' own pings (the Tidelog client sends one every 30 s, calls or
not) down to ``_MIN_CLIENT_PING_INTERVAL_MS`` apart, instead of gRPC's default of 5
minutes (more often than that gRPC answers GOAWAY "too_many_pings").

``stop`` is the clean shutdown, in this order:

1. health reports ``NOT_SERVING`` (load balancers and health checks stop sending work);
2. the broker refuses new operations (``UNAVAILABLE``) and answers waiting long polls now;
3. gRPC stops accepting calls and gives those in flight ``shutdown.grace.ms`` to finish;
4. the storage closes once the last operation has left: flush, checkpoints, the
   clean-shutdown marker;
5. the metrics endpoint stops.

``run_until_signalled`` blocks until SIGTERM or SIGINT and then stops; a second signal
a second or more later exits at once (everything acknowledged with ``acks=all`` is on
disk already, so the next start recovers it). SIGHUP reloads the TLS certificate files
(``reload_certificates``): new connections get the new certificate, established ones
are kept.

Security (``docs/security.md``): with ``security.protocol`` SSL or SASL_SSL the listener
serves TLS (``broker.tls``); every call goes through ``core.authenticator``
(``broker.auth``), which SASL_* listeners use to require a session; SCRAM users live in
the data directory, or in ZooKeeper in cluster mode (``broker.users``).
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import ssl
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from broker.audit import configure_file as configure_audit_file
from broker.auth import Authenticator
from broker.config import BrokerConfig, parse_listen
from broker.core import BrokerCore
from broker.groups.offset_store import OFFSETS_TOPIC
from broker.grpc_async import AsyncListener
from broker.kafka import KafkaListener, ListenerSettings
from broker.limits import Admission, AdmissionCollector
from broker.loop_watchdog import LoopWatchdog
from broker.metrics import BrokerMetrics, MetricsServer
from broker.placement import JoiningPlacement, JoiningTopicAdmin, LocalPlacement
from broker.producer_ids import UnavailableProducerIds
from broker.quotas import QuotaCollector
from broker.security_config import SecurityConfig
from broker.service import BROKER_SERVICE_NAME
from broker.tls import ServerTls
from broker.users import FileUserStore, ZooKeeperUserStore
from storage.clock import Clock, SystemClock

if TYPE_CHECKING:
    from broker.cluster.node import ClusterNode

__all__ = [
    "BROKER_SERVICE_NAME",
    "BrokerServer",
    "ListenError",
    "Listener",
    "raise_open_file_limit",
    "run_until_signalled",
]

log = logging.getLogger(__name__)

_STOP_MARGIN_MS = 5_000  # beyond the grace period, for gRPC's own teardown
_FORCE_AFTER_MS = 1_000  # a repeated signal sooner than this is the same request
# Clients may ping this often (or as often as the broker pings, if that is more often):
# well under the client's 30 s, so timer slack never counts as a strike.
_MIN_CLIENT_PING_INTERVAL_MS = 10_000
_MAX_PING_STRIKES = 2  # gRPC's default: the third ping too early closes the connection


class ListenError(OSError):
    """The gRPC listen address could not be bound."""


class Listener(Protocol):
    """One network listener over the core (``AsyncListener``; the Kafka listener later)."""

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


def raise_open_file_limit() -> tuple[int, int]:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; log and return
    (soft, hard) as they are now. Each client connection holds a file descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    log.info("open-file limit: %d (hard limit %d)", soft, hard)
    return soft, hard


class BrokerServer:
    """One running broker. Thread-safe: ``stop`` may be called from any thread, repeatedly.

    Build with ``start``; the constructor only assigns.
    """

    def __init__(
        self,
        config: BrokerConfig,
        core: BrokerCore,
        listener: Listener,
        admission: Admission,
        metrics_server: MetricsServer | None,
        node: ClusterNode | None = None,
        tls: ServerTls | None = None,
        kafka: KafkaListener | None = None,
    ) -> None:
        self.config = config
        self.tls = tls  # the listener's reloadable certificates; None without TLS
        self.core = core
        self.node = node  # cluster mode only
        self.admission = admission
        self._listener = listener
        self.kafka = kafka  # the Kafka wire-protocol listener (kafka.listen); None if off
        self._port = listener.port
        self._metrics_server = metrics_server
        self._stop_lock = threading.Lock()
        self._stopped = threading.Event()

    @classmethod
    def start(cls, config: BrokerConfig, *, clock: Clock | None = None) -> BrokerServer:
        """Open the storage and start serving on ``config.listen_address``.

        Raises:
            StorageError: the data directory is unusable.
            ListenError: the gRPC or the metrics address cannot be bound (the message
                names the setting and the address).
        """
        raise_open_file_limit()
        security = config.security
        tls = ServerTls.load(security) if security.tls else None  # unreadable files: fail now
        if security.audit_log_file:
            configure_audit_file(security.audit_log_file)
        metrics = BrokerMetrics()
        core = BrokerCore.open(config, clock, metrics)
        try:
            users = FileUserStore.open(config.data_dir)
        except BaseException:
            core.close()
            raise
        core.authenticator = Authenticator(security, users, clock or SystemClock())
        admission = Admission(config.limits_config())
        metrics.registry.register(AdmissionCollector(admission, core.parked_operations))
        metrics.registry.register(QuotaCollector(core.quotas))
        if config.zookeeper_connect is not None:
            # Until the cluster's view is in, lead nothing: a client that connects early
            # must not have a partition another broker leads written here.
            core.placement = JoiningPlacement(config.broker_id)
            # Nor coordinate groups or administer topics as if it were a single node.
            core.topic_admin = JoiningTopicAdmin(config.broker_id)
            # Nor hand out producer ids from the local file: they would collide with ids
            # other brokers draw from ZooKeeper.
            core.producer_ids = UnavailableProducerIds(config.broker_id)
        metrics_server: MetricsServer | None = None
        listener: Listener | None = None
        try:
            listener = AsyncListener.start(
                core,
                admission,
                address=config.listen_address,
                options=_grpc_options(config),
                io_threads=config.num_io_threads,
                bind=_bind if tls is None else _secure_binder(tls),
            )
            metrics_port = config.effective_metrics_port
            if metrics_port >= 0:
                metrics_server = _start_metrics(
                    metrics, config.effective_metrics_host, metrics_port, security
                )
        except BaseException:
            if listener is not None:
                listener.stop(0, _STOP_MARGIN_MS)
            core.close()
            raise
        endpoint = config.advertised_endpoint(listener.port)
        node: ClusterNode | None = None
        kafka: KafkaListener | None = None
        try:
            if config.kafka_listen:
                # Bound before joining a cluster: the registration carries its endpoint
                # (Kafka registers a broker once every listener is bound).
                kafka = _start_kafka(config, core, admission)
            if config.zookeeper_connect is None:
                if isinstance(core.placement, LocalPlacement):
                    core.placement.advertise(*endpoint)
            else:
                node = _join_cluster(config, core, clock or SystemClock(), endpoint, kafka)
                # Users are the cluster's: every broker reads /config/users (broker.users).
                core.authenticator.users = ZooKeeperUserStore(node.store, users)
                if kafka is not None:
                    kafka.cluster_brokers = _kafka_brokers(node)
        except BaseException:
            if node is not None:
                node.stop()
            if kafka is not None:
                kafka.stop()
            listener.stop(0, _STOP_MARGIN_MS)
            if metrics_server is not None:
                metrics_server.stop()
            core.close()
            raise
        for message in config.ignored_settings():
            log.warning("%s", message)
        log.info(
            "tidelog broker serving %s on %s:%d, data in %s",
            security.protocol,
            config.listen_host,
            listener.port,
            core.logs.data_dir,
        )
        return cls(config, core, listener, admission, metrics_server, node, tls, kafka)

    @property
    def port(self) -> int:
        """The bound gRPC port (useful when listening on port 0)."""
        return self._port

    @property
    def address(self) -> str:
        """``HOST:PORT`` a client on this machine can dial."""
        host = self.config.listen_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        return f"{host}:{self._port}"

    @property
    def loop_watchdog(self) -> LoopWatchdog | None:
        """What watches the gRPC listener's event loop (None: a listener without one)."""
        return self._listener.watchdog

    @property
    def kafka_port(self) -> int | None:
        """The bound Kafka listener port, or None when ``kafka.listen`` is off."""
        return self.kafka.port if self.kafka is not None else None

    @property
    def metrics_port(self) -> int | None:
        """The bound metrics port, or None when metrics are off."""
        return self._metrics_server.port if self._metrics_server is not None else None

    def reload_certificates(self) -> None:
        """Read the TLS files again for the next connections (SIGHUP); no-op without TLS."""
        if self.tls is not None:
            self.tls.request_reload()

    @property
    def stopped(self) -> bool:
        """Whether ``stop`` has finished."""
        return self._stopped.is_set()

    def wait(self, timeout_ms: int) -> bool:
        """Block until the server stopped or ``timeout_ms`` passed; True if stopped."""
        return self._stopped.wait(timeout_ms / 1000.0)

    def stop(self, grace_ms: int | None = None) -> None:
        """Clean shutdown (see the module docstring). Idempotent; blocks until done.

        Args:
            grace_ms: how long calls in flight may take to finish; ``shutdown.grace.ms``
                if None.
        """
        with self._stop_lock:
            if self._stopped.is_set():
                return
            grace = self.config.shutdown_grace_ms if grace_ms is None else grace_ms
            log.info("stopping (grace %d ms)", grace)
            if self.node is not None:
                # Leave the cluster first: leadership moves (controlled shutdown) while
                # this broker still answers, and the registration goes with the session.
                try:
                    self.node.stop()
                except Exception:
                    log.exception("leaving the cluster failed")
            self._listener.enter_graceful_shutdown()
            if self.kafka is not None:
                self.kafka.stop()
            self.core.begin_close()
            if not self._listener.stop(grace, _STOP_MARGIN_MS):
                log.warning("gRPC server did not stop within the grace period")
            try:
                self.core.close()
            finally:
                if self._metrics_server is not None:
                    self._metrics_server.stop()
                self._stopped.set()
            log.info("stopped")


def _kafka_brokers(node: ClusterNode) -> Callable[[], dict[int, tuple[str, int] | None]]:
    """The live brokers' Kafka endpoints from ``node``'s watched view (their registrations'
    ``KAFKA`` listener; None for a broker without one): the Kafka listener's broker list."""
    from broker.cluster.znodes import KAFKA_LISTENER

    def brokers() -> dict[int, tuple[str, int] | None]:
        found: dict[int, tuple[str, int] | None] = {}
        for broker_id, registration in node.metadata.brokers.items():
            kafka = registration.endpoint(KAFKA_LISTENER)
            found[broker_id] = None if kafka is None else (kafka.host, kafka.port)
        return found

    return brokers


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
    )
    try:
        return KafkaListener.start(core, settings, admission)
    except OSError as exc:
        raise ListenError(f"kafka.listen: cannot listen on {config.kafka_listen}: {exc}") from None


def _grpc_options(config: BrokerConfig) -> list[tuple[str, int]]:
    """The gRPC server's channel arguments for ``config`` (keepalive: module docstring)."""
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


def run_until_signalled(server: BrokerServer) -> None:
    """Serve until SIGTERM or SIGINT, then stop cleanly. Main thread only.

    A second signal during the shutdown, at least a second after the first, exits the
    process at once with status 1.
    """
    received = threading.Event()
    first_ms: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        now_ms = time.monotonic_ns() // 1_000_000
        if received.is_set():
            # A wrapper or a terminal often delivers the same stop twice at once (Ctrl-C
            # reaches the whole process group); only a deliberate second signal forces.
            if now_ms - first_ms[0] >= _FORCE_AFTER_MS:
                log.warning("second signal %d: exiting now", signum)
                os._exit(1)
            return
        log.info("signal %d: shutting down", signum)
        first_ms.append(now_ms)
        received.set()

    def on_hangup(signum: int, frame: FrameType | None) -> None:
        log.info("SIGHUP: reloading TLS certificates")
        server.reload_certificates()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hangup)
    try:
        # Wait in slices: Event.wait without a timeout is not interrupted by signals on
        # every platform.
        while not received.wait(1.0) and not server.stopped:
            pass
        server.stop()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _join_cluster(
    config: BrokerConfig,
    core: BrokerCore,
    clock: Clock,
    endpoint: tuple[str, int],
    kafka: KafkaListener | None = None,
) -> ClusterNode:
    """Cluster mode: register (the gRPC endpoint, and the Kafka listener's if it runs),
    start the controller candidate, route by the cluster's view, draw producer ids from
    ZooKeeper (``broker.cluster.producer_ids``).

    Raises ``StoreError`` (ZooKeeper unreachable, the broker id taken) or
    ``InvalidConfigError`` (the data directory belongs to another broker or cluster).
    """
    from broker.cluster.acls import ZooKeeperAclStore
    from broker.cluster.node import ClusterNode  # kazoo is needed in cluster mode only
    from broker.cluster.producer_ids import ZooKeeperProducerIds
    from broker.cluster.znodes import KAFKA_LISTENER, ListenerEndpoint

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
        internal_topics={OFFSETS_TOPIC: (config.offsets_topic_num_partitions, offsets_config)},
        listeners=listeners,
    )
    core.placement = node.placement
    core.topic_admin = node
    # Ids unique across the cluster: blocks and keys in ZooKeeper, on the node's session.
    core.producer_ids = ZooKeeperProducerIds(
        node.store,
        config.broker_id,
        clock,
        config.producer_id_expiration_ms,
        sweep_interval_ms=config.producer_id_expiration_check_interval_ms,
    )
    # ACLs shared by the cluster: one watched document in ZooKeeper.
    core.acls.use_store(ZooKeeperAclStore.open(node.store))
    return node
