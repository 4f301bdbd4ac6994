"""The broker process's lifecycle: start, serve, stop cleanly.

``BrokerServer.start`` opens the data directory (recovering it if the last stop was not
clean), then starts one synchronous gRPC server (a ``ThreadPoolExecutor`` of
``num.io.threads`` workers: measured here to be at least as fast as grpc's asyncio server)
carrying the ``tidelog.v1.Broker`` service, the standard health service and server
reflection, and the Prometheus endpoint if ``metrics.port`` is not -1.

``stop`` is the clean shutdown, in this order:

1. health reports ``NOT_SERVING`` (load balancers and health checks stop sending work);
2. the broker refuses new operations (``UNAVAILABLE``) and answers waiting long polls now;
3. gRPC stops accepting calls and gives those in flight ``shutdown.grace.ms`` to finish;
4. the storage closes once the last operation has left: flush, checkpoints, the
   clean-shutdown marker;
5. the metrics endpoint stops.

``run_until_signalled`` blocks until SIGTERM or SIGINT and then stops; a second signal
a second or more later exits at once (everything acknowledged with ``acks=all`` is on
disk already, so the next start recovers it).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import FrameType

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from broker.config import BrokerConfig
from broker.core import BrokerCore
from broker.metrics import BrokerMetrics, MetricsServer
from broker.service import BrokerService
from proto.tidelog.v1 import broker_pb2, broker_pb2_grpc
from storage.clock import Clock

__all__ = ["BROKER_SERVICE_NAME", "BrokerServer", "ListenError", "run_until_signalled"]

log = logging.getLogger(__name__)

BROKER_SERVICE_NAME = broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name
_HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
_STOP_MARGIN_MS = 5_000  # beyond the grace period, for gRPC's own teardown
_FORCE_AFTER_MS = 1_000  # a repeated signal sooner than this is the same request


class ListenError(OSError):
    """The gRPC listen address could not be bound."""


class BrokerServer:
    """One running broker. Thread-safe: ``stop`` may be called from any thread, repeatedly.

    Build with ``start``; the constructor only assigns.
    """

    def __init__(
        self,
        config: BrokerConfig,
        core: BrokerCore,
        server: grpc.Server,
        executor: ThreadPoolExecutor,
        health_servicer: health.HealthServicer,
        port: int,
        metrics_server: MetricsServer | None,
    ) -> None:
        self.config = config
        self.core = core
        self._server = server
        self._executor = executor
        self._health = health_servicer
        self._port = port
        self._metrics_server = metrics_server
        self._stop_lock = threading.Lock()
        self._stopped = threading.Event()

    @classmethod
    def start(cls, config: BrokerConfig, *, clock: Clock | None = None) -> BrokerServer:
        """Open the storage and start serving on ``config.listen_address``.

        Raises:
            StorageError: the data directory is unusable.
            ListenError: the gRPC address cannot be bound.
            OSError: the metrics address cannot be bound.
        """
        metrics = BrokerMetrics()
        core = BrokerCore.open(config, clock, metrics)
        executor = ThreadPoolExecutor(
            max_workers=config.num_io_threads, thread_name_prefix="tidelog-grpc"
        )
        server = grpc.server(
            executor,
            options=[
                ("grpc.max_receive_message_length", config.socket_request_max_bytes),
                ("grpc.max_send_message_length", -1),
                # Never share a port with another process: a second broker must fail.
                ("grpc.so_reuseport", 0),
            ],
        )
        health_servicer = health.HealthServicer()
        metrics_server: MetricsServer | None = None
        try:
            broker_pb2_grpc.add_BrokerServicer_to_server(BrokerService(core), server)
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            reflection.enable_server_reflection(
                (BROKER_SERVICE_NAME, _HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server
            )
            port = _bind(server, config.listen_address)
            if config.metrics_port >= 0:
                metrics_server = MetricsServer.start(
                    metrics.registry, config.effective_metrics_host, config.metrics_port
                )
            server.start()
        except BaseException:
            server.stop(None)
            executor.shutdown(wait=False)
            if metrics_server is not None:
                metrics_server.stop()
            core.close()
            raise
        for name in ("", BROKER_SERVICE_NAME):
            health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "tidelog broker serving on %s:%d, data in %s",
            config.listen_host,
            port,
            core.logs.data_dir,
        )
        return cls(config, core, server, executor, health_servicer, port, metrics_server)

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
    def metrics_port(self) -> int | None:
        """The bound metrics port, or None when metrics are off."""
        return self._metrics_server.port if self._metrics_server is not None else None

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
            self._health.enter_graceful_shutdown()
            self.core.begin_close()
            done = self._server.stop(grace / 1000.0)
            if not done.wait((grace + _STOP_MARGIN_MS) / 1000.0):
                log.warning("gRPC server did not stop within the grace period")
            self._executor.shutdown(wait=False)
            try:
                self.core.close()
            finally:
                if self._metrics_server is not None:
                    self._metrics_server.stop()
                self._stopped.set()
            log.info("stopped")


def _bind(server: grpc.Server, address: str) -> int:
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio raises on bind failure since 1.5x
        raise ListenError(f"cannot listen on {address}: {exc}") from None
    if port == 0:  # older grpcio returned 0 instead
        raise ListenError(f"cannot listen on {address}")
    return port


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

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        # Wait in slices: Event.wait without a timeout is not interrupted by signals on
        # every platform.
        while not received.wait(1.0) and not server.stopped:
            pass
        server.stop()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
