"""An in-process broker for tests: yours and ours.

::

    from tidelog.broker.testing import InProcessBroker

    with InProcessBroker() as broker:          # 127.0.0.1, a free port, a temporary dir
        producer = Producer(broker.address)
        ...
        broker.restart()                       # same port, same data: a clean restart

It runs the real daemon (``BrokerServer``: gRPC server, health, reflection, storage) inside
the test process, listens on ``127.0.0.1`` only, and stops by itself when the ``with``
block ends, removing the temporary data directory it made (a directory you pass in is
kept). Settings take Kafka's broker names, as ``--set`` does (``settings={"num.partitions":
3}``). Metrics are off unless ``metrics=True`` (then on a free port: ``metrics_port``).
Several instances can run at once: each has its own port, directory and metrics registry.
``clock=ManualClock()`` runs the broker on a clock the test moves (group session timeouts,
retention); the same clock object is kept across ``restart``. On a manual clock a long-poll
fetch that finds nothing waits until data arrives or the call's own deadline passes.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import grpc

from tidelog.broker.cluster.testing import free_port
from tidelog.broker.config import BrokerConfig
from tidelog.broker.server import BrokerServer
from tidelog.proto.tidelog.v1 import broker_pb2_grpc
from tidelog.storage.clock import Clock

__all__ = ["InProcessBroker"]

log = logging.getLogger(__name__)

# Faster shutdowns than the daemon's default; a test can override any of these. A classic
# group's first rebalance does not wait for more members (Kafka's own test harnesses set
# group.initial.rebalance.delay.ms to 0 too; the daemon keeps Kafka's 3 s).
_TEST_DEFAULTS: dict[str, object] = {
    "shutdown.grace.ms": 1_000,
    "num.io.threads": 32,
    "group.initial.rebalance.delay.ms": 0,
}


class InProcessBroker:
    """A real broker on ``127.0.0.1`` in this process. Not thread-safe (one owner).

    Args:
        data_dir: where to keep the data; a fresh temporary directory (removed on
            ``stop``) if None.
        settings: broker settings by Kafka name, over the embedded defaults.
        metrics: serve Prometheus metrics on a free port.
        port: the port to listen on; 0 picks a free one.
        clock: the broker's clock (the system clock if None).
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        settings: Mapping[str, object] | None = None,
        metrics: bool = False,
        port: int = 0,
        clock: Clock | None = None,
    ) -> None:
        self._own_dir = data_dir is None
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._settings = dict(settings or {})
        self._metrics = metrics
        self._port = port
        self._clock = clock
        self._server: BrokerServer | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> InProcessBroker:
        """Start serving; returns self. Raises whatever ``BrokerServer.start`` raises."""
        if self._server is not None:
            raise RuntimeError("the broker is already running")
        created = self._data_dir is None
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="tidelog-test-"))
        if self._port == 0:
            # Below the ephemeral range, so that a restart on the same port cannot find
            # it taken by an outgoing connection (free_port).
            self._port = free_port()
        settings: dict[str, object] = {
            **_TEST_DEFAULTS,
            "metrics.port": 0 if self._metrics else -1,
            **self._settings,
            "listeners": f"127.0.0.1:{self._port}",
            "log.dirs": str(self._data_dir),
        }
        try:
            self._server = BrokerServer.start(
                BrokerConfig.from_mapping(settings), clock=self._clock
            )
        except BaseException:
            if created:  # a directory made just now for nothing; a restart keeps its data
                shutil.rmtree(self._data_dir, ignore_errors=True)
                self._data_dir = None
            raise
        self._port = self._server.port  # a restart comes back on the same port
        return self

    def stop(self, grace_ms: int | None = None) -> None:
        """Stop cleanly and remove the temporary data directory. Idempotent."""
        self._shutdown(grace_ms)
        if self._own_dir and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None

    def restart(self, grace_ms: int | None = None) -> None:
        """Stop cleanly and start again on the same port with the same data."""
        self._shutdown(grace_ms)
        self.start()

    def _shutdown(self, grace_ms: int | None) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.stop(grace_ms)

    def __enter__(self) -> InProcessBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # --- what tests use -------------------------------------------------------------------

    @property
    def server(self) -> BrokerServer:
        """The running server. Raises ``RuntimeError`` when stopped."""
        if self._server is None:
            raise RuntimeError("the broker is not running")
        return self._server

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``: what a client dials."""
        return self.server.address

    @property
    def port(self) -> int:
        """The gRPC port."""
        return self.server.port

    @property
    def metrics_port(self) -> int | None:
        """The Prometheus port, or None when metrics are off."""
        return self.server.metrics_port

    @property
    def data_dir(self) -> Path:
        """The data directory (valid while running, and after ``stop`` if you passed it)."""
        if self._data_dir is None:
            raise RuntimeError("the broker has no data directory")
        return self._data_dir

    @property
    def config(self) -> BrokerConfig:
        """The running broker's effective configuration."""
        return self.server.config

    def channel(self) -> grpc.Channel:
        """A new insecure channel to the broker, accepting answers of any size.

        The caller closes it (``with broker.channel() as channel: ...``).
        """
        return grpc.insecure_channel(
            self.address, options=[("grpc.max_receive_message_length", -1)]
        )

    def stub(self, channel: grpc.Channel) -> broker_pb2_grpc.BrokerStub:
        """The generated ``tidelog.v1.Broker`` stub on ``channel``."""
        return broker_pb2_grpc.BrokerStub(channel)
