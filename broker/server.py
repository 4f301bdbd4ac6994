"""The broker process's lifecycle: start, serve, stop cleanly.

``BrokerServer.start`` raises the process's open-file limit to its hard limit (every
connection is a file descriptor; the value got is logged), opens the data directory
(recovering it if the last stop was not clean), then starts one gRPC listener carrying
the ``tidelog.v1.Broker`` service, the standard health service and server reflection, and
the Prometheus endpoint if ``metrics.port`` is not -1.

The gRPC listener is ``broker.grpc.listener.AsyncListener``: ``grpc.aio`` on an event loop
thread, storage work on ``num.io.threads`` threads, waiting calls parked without a
thread, and the limits of ``broker.core.limits`` enforced. It is the only serving model: the
threaded one (``server.io.model=threads``, a worker per call for the call's whole life)
was retired in issue #26, with the measurement that decided it in ``docs/broker.md``
("One serving model"); the setting is refused by ``broker.config``.

Keepalive (``broker.assembly.grpc_options``): a stream whose client vanished without closing its
connection (host crash, cable pulled, a NAT that forgot the flow) would keep its parked
operation and its place in ``max.connections`` for good. The server therefore
pings every connection quiet for ``connections.keepalive.time.ms``, with
or without calls, and closes it when the ping is not answered within
``connections.keepalive.timeout.ms``; gRPC then cancels its calls and the handlers return.
It also accepts the clients' own pings (the Tidelog client sends one every 30 s, calls or
not) down to ``broker.assembly._MIN_CLIENT_PING_INTERVAL_MS`` apart, instead of gRPC's default of 5
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
(``broker.core.auth``), which SASL_* listeners use to require a session; SCRAM users live in
the data directory, or in ZooKeeper in cluster mode (``broker.core.users``).

How the parts are built and wired, per mode, is ``broker.assembly``; this module owns
the running broker's lifecycle.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING

from tidelog.broker.assembly import (
    STOP_MARGIN_MS,
    BrokerParts,
    Listener,
    ListenError,
    assemble_cluster,
    assemble_single_node,
)
from tidelog.broker.config import BrokerConfig
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.core.limits import Admission
from tidelog.broker.core.metrics import MetricsServer
from tidelog.broker.grpc.service import BROKER_SERVICE_NAME
from tidelog.broker.kafka import KafkaListener
from tidelog.broker.loop_watchdog import LoopWatchdog
from tidelog.broker.tls import ServerTls
from tidelog.storage.clock import Clock

if TYPE_CHECKING:
    from tidelog.broker.cluster.node import ClusterNode

__all__ = [
    "BROKER_SERVICE_NAME",
    "BrokerServer",
    "ListenError",
    "Listener",
    "raise_open_file_limit",
    "run_until_signalled",
]

log = logging.getLogger(__name__)

_STOP_MARGIN_MS = STOP_MARGIN_MS  # beyond the grace period, for gRPC's own teardown
_FORCE_AFTER_MS = 1_000  # a repeated signal sooner than this is the same request


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
        """Open the storage and start serving on ``config.listen_address``: the mode's
        assembly (``broker.assembly``), then the start-up log lines.

        Raises:
            StorageError: the data directory is unusable.
            ListenError: the gRPC or the metrics address cannot be bound (the message
                names the setting and the address).
        """
        raise_open_file_limit()
        if config.zookeeper_connect is None:
            parts = assemble_single_node(config, clock)
        else:
            parts = assemble_cluster(config, clock)
        for message in config.ignored_settings():
            log.warning("%s", message)
        log.info(
            "tidelog broker serving %s on %s:%d, data in %s",
            config.security.protocol,
            config.listen_host,
            parts.listener.port,
            parts.core.logs.data_dir,
        )
        return cls.from_parts(parts)

    @classmethod
    def from_parts(cls, parts: BrokerParts) -> BrokerServer:
        """The server over an assembled broker (``broker.assembly``)."""
        return cls(
            parts.config,
            parts.core,
            parts.listener,
            parts.admission,
            parts.metrics_server,
            parts.node,
            parts.tls,
            parts.kafka,
        )

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
