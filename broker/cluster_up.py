"""A local cluster to try cluster mode with: ZooKeeper and N brokers on 127.0.0.1, kept in
one data directory (``tidelog cluster up``, ``make cluster``).

What ``rpk container start -n 3`` is for Redpanda: one command, no ZooKeeper to find
first. ``broker.cli`` parses the command line, prints the addresses and waits for Ctrl-C
or SIGTERM; this module owns the processes.

Layout of the data directory ``D`` (everything the cluster has, nothing outside it)::

    D/zookeeper/          zoo.cfg, data/ (the cluster's metadata), zookeeper.log
    D/broker-1/ ...       broker 1's data directory (log.dirs), and so on
    D/logs/broker-1.log   what broker 1 printed, every run appended
    D/.lock               held (flock) while a ``cluster up`` runs on D

Broker ``i`` is always id ``i`` with data directory ``D/broker-i``, so a second ``cluster
up`` on the same ``D`` is the same cluster: same ZooKeeper data (cluster id, topics,
users, ACLs, configs), same broker ids, same logs. Without ``--brokers`` a directory that
holds brokers starts as many as it holds.

Ports (127.0.0.1 only), fixed so that addresses survive a restart, all in one block from
the base port ``B`` (``--base-port``, default 7400): ZooKeeper ``B``; broker ``i``'s gRPC
listener ``B + 10*i``, its Kafka listener ``B + 10*i + 1``, its metrics ``B + 10*i + 2``.
With the default, broker 1 serves gRPC on 7410 as a lone ``tidelog serve`` does. Topics
are created with ``min(3, N)`` replicas unless asked otherwise (``--set
default.replication.factor=1`` for Kafka's default). Every
port is checked free before anything starts (a second cluster on the same ports would
otherwise find the first one's ZooKeeper answering).

ZooKeeper is Debian's ``libzookeeper-java`` on the machine's Java, started as the tests'
``ZooKeeperServer`` (``broker.cluster.testing``, the library harness, not ``tests/``)
with a directory of its own kept across runs, ZooKeeper's default tick (2 s) and no fsync
(a cluster for trying things, not for keeping data through a power loss).

Every child runs in a session of its own (a terminal's Ctrl-C reaches only this process,
which then stops the children in order) and dies with this process if it is killed
(``dying_with_parent``); a start after such a kill works, ZooKeeper expiring the old
brokers' sessions first. Stopping: SIGTERM to every broker (each leaves the cluster with
a controlled shutdown), a SIGKILL for any still running after ``stop_timeout_ms``, then
ZooKeeper, last, since the brokers deregister through it.

Not thread-safe: one owner, the command's main thread.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import grpc

from tidelog.broker.cluster.testing import ZooKeeperServer, dying_with_parent
from tidelog.proto.tidelog.v1 import broker_pb2, broker_pb2_grpc

__all__ = [
    "DEFAULT_BASE_PORT",
    "DEFAULT_BROKERS",
    "BrokerAddresses",
    "ClusterUpError",
    "LocalClusterProcesses",
    "existing_broker_ids",
]

log = logging.getLogger(__name__)

DEFAULT_BASE_PORT = 7400
DEFAULT_BROKERS = 3
HOST = "127.0.0.1"
_PORT_STRIDE = 10
_BROKER_DIR = re.compile(r"broker-([1-9][0-9]*)")
_READY_TIMEOUT_S = 60.0
_STOP_TIMEOUT_MS = 30_000


class ClusterUpError(Exception):
    """The cluster cannot start: a port in use, a directory in use, ZooKeeper missing,
    a broker that did not come up. The message says which and what to do."""


@dataclass(frozen=True, slots=True)
class BrokerAddresses:
    """Where broker ``broker_id`` of a local cluster serves (``HOST:PORT`` each)."""

    broker_id: int
    grpc: str
    kafka: str
    metrics: str
    data_dir: Path
    log_file: Path


def existing_broker_ids(data_dir: Path) -> list[int]:
    """The broker ids that have a ``broker-N`` directory in ``data_dir``, sorted."""
    if not data_dir.is_dir():
        return []
    found = (_BROKER_DIR.fullmatch(p.name) for p in data_dir.iterdir() if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m is not None)


def _port_in_use(port: int) -> bool:
    with socket.socket() as probe:
        # As the servers bind (Java and grpc set SO_REUSEADDR): the connections of the
        # previous run, in TIME_WAIT for a minute, do not count as the port in use.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE or exc.errno == errno.EACCES
    return False


class LocalClusterProcesses:
    """ZooKeeper and brokers ``1..brokers`` as child processes over ``data_dir``.

    Args:
        data_dir: the cluster's directory (created if missing; see the module docstring).
        brokers: how many brokers (ids 1..N), at least 1.
        base_port: the first port of the block (ZooKeeper's); every port used must fit
            below 65536.
        settings: extra broker settings (``--set KEY=VALUE``) for every broker.
        stop_timeout_ms: how long ``stop`` waits for a broker's clean exit before SIGKILL.

    Raises:
        ValueError: ``brokers`` below 1, or ports past 65535.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        brokers: int = DEFAULT_BROKERS,
        base_port: int = DEFAULT_BASE_PORT,
        settings: dict[str, str] | None = None,
        stop_timeout_ms: int = _STOP_TIMEOUT_MS,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"brokers must be at least 1, got {brokers}")
        if base_port < 1024 or base_port + _PORT_STRIDE * brokers + 2 > 65_535:
            raise ValueError(
                f"base port {base_port} with {brokers} brokers needs ports "
                f"{base_port}..{base_port + _PORT_STRIDE * brokers + 2}: between 1024 and 65535"
            )
        self.data_dir = data_dir.resolve()
        self.broker_ids = list(range(1, brokers + 1))
        self.base_port = base_port
        self._settings = dict(settings or {})
        self._stop_timeout_ms = stop_timeout_ms
        self.zookeeper = ZooKeeperServer(
            tick_ms=2_000,
            max_session_timeout_ms=40_000,
            host=HOST,
            port=base_port,
            directory=self.data_dir / "zookeeper",
        )
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._lock_file: IO[bytes] | None = None

    @property
    def zookeeper_connect(self) -> str:
        """The brokers' ``zookeeper.connect`` (a ``/tidelog`` chroot)."""
        return f"{HOST}:{self.base_port}/tidelog"

    def addresses(self, broker_id: int) -> BrokerAddresses:
        """Broker ``broker_id``'s ports and paths (fixed by the base port and the id)."""
        port = self.base_port + _PORT_STRIDE * broker_id
        return BrokerAddresses(
            broker_id=broker_id,
            grpc=f"{HOST}:{port}",
            kafka=f"{HOST}:{port + 1}",
            metrics=f"{HOST}:{port + 2}",
            data_dir=self.data_dir / f"broker-{broker_id}",
            log_file=self.data_dir / "logs" / f"broker-{broker_id}.log",
        )

    @property
    def bootstrap(self) -> str:
        """Every broker's gRPC address, comma-separated (Tidelog's clients)."""
        return ",".join(self.addresses(i).grpc for i in self.broker_ids)

    @property
    def kafka_bootstrap(self) -> str:
        """Every broker's Kafka address, comma-separated (``bootstrap.servers``)."""
        return ",".join(self.addresses(i).kafka for i in self.broker_ids)

    def start(self) -> None:
        """Start ZooKeeper and every broker; return once each serves and sees the others.

        Raises:
            ClusterUpError: see the class; whatever was started is stopped again.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            self._check_ports()
            try:
                self.zookeeper.start()
            except RuntimeError as exc:
                raise ClusterUpError(str(exc)) from None
            (self.data_dir / "logs").mkdir(exist_ok=True)
            for broker_id in self.broker_ids:
                self._start_broker(broker_id)
            for broker_id in self.broker_ids:
                self._wait_ready(broker_id)
            if self._settings.get("security.protocol", "PLAINTEXT").upper() == "PLAINTEXT":
                self._wait_converged()  # a secured listener needs credentials to ask
        except BaseException:
            self.stop()
            raise

    def exited(self) -> dict[int, int]:
        """Brokers whose process ended by itself: id -> exit status."""
        return {
            broker_id: code
            for broker_id, process in self._processes.items()
            if (code := process.poll()) is not None
        }

    def stop(self) -> None:
        """Stop every broker (SIGTERM, SIGKILL after the timeout), then ZooKeeper; keeps
        the data. Idempotent."""
        for process in self._processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + self._stop_timeout_ms / 1000
        for broker_id, process in self._processes.items():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("broker %d did not stop in time: killing it", broker_id)
                process.kill()
                process.wait(10)
        self._processes.clear()
        self.zookeeper.stop()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None

    def _lock(self) -> None:
        lock_file = open(self.data_dir / ".lock", "ab")  # noqa: SIM115  # held while running
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock_file.close()
            raise ClusterUpError(
                f"{self.data_dir} is in use by another `tidelog cluster up`: stop it first"
            ) from None
        self._lock_file = lock_file

    def _check_ports(self) -> None:
        wanted = {self.base_port: "ZooKeeper"}
        for broker_id in self.broker_ids:
            addresses = self.addresses(broker_id)
            for name, address in (
                ("gRPC", addresses.grpc),
                ("Kafka", addresses.kafka),
                ("metrics", addresses.metrics),
            ):
                wanted[int(address.rsplit(":", 1)[1])] = f"broker {broker_id}'s {name}"
        busy = [f"{port} ({what})" for port, what in wanted.items() if _port_in_use(port)]
        if busy:
            raise ClusterUpError(
                f"ports in use on {HOST}: {', '.join(busy)}; stop what holds them or "
                "choose another --base-port"
            )

    def _start_broker(self, broker_id: int) -> None:
        addresses = self.addresses(broker_id)
        ready = self.data_dir / "logs" / f"broker-{broker_id}.ready"
        ready.unlink(missing_ok=True)
        settings = {
            "broker.id": str(broker_id),
            "zookeeper.connect": self.zookeeper_connect,
            "kafka.listen": addresses.kafka,
            "metrics.port": addresses.metrics.rsplit(":", 1)[1],
            # A cluster to try replication with: topics get up to three replicas.
            "default.replication.factor": str(min(3, len(self.broker_ids))),
            **self._settings,
        }
        command = [
            sys.executable,
            "-m",
            "tidelog.broker",
            "--listen",
            addresses.grpc,
            "--data-dir",
            str(addresses.data_dir),
            "--ready-file",
            str(ready),
        ]
        for key, value in settings.items():
            command += ["--set", f"{key}={value}"]
        with open(addresses.log_file, "ab") as log_file:
            # A session of its own: a terminal's Ctrl-C reaches only the command, which
            # stops the brokers before ZooKeeper.
            self._processes[broker_id] = subprocess.Popen(
                dying_with_parent(command),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _wait_ready(self, broker_id: int) -> None:
        ready = self.data_dir / "logs" / f"broker-{broker_id}.ready"
        process = self._processes[broker_id]
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                log_file = self.addresses(broker_id).log_file
                tail = log_file.read_text(errors="replace")[-3000:] if log_file.exists() else ""
                raise ClusterUpError(
                    f"broker {broker_id} did not start (its log: {log_file}):\n{tail}"
                )
            time.sleep(0.05)
        ready.unlink(missing_ok=True)

    def _wait_converged(self) -> None:
        """Until every broker's metadata lists every broker and names a controller, so
        the first request through the printed bootstrap sees the whole cluster."""
        everyone = set(self.broker_ids)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        for broker_id in self.broker_ids:
            with grpc.insecure_channel(self.addresses(broker_id).grpc) as channel:
                stub = broker_pb2_grpc.BrokerStub(channel)
                while True:
                    seen: set[int] = set()
                    controller = -1
                    try:
                        answer = stub.Metadata(broker_pb2.MetadataRequest(), timeout=2.0)
                        seen = {b.id for b in answer.brokers}
                        controller = answer.controller_id
                    except grpc.RpcError:
                        pass  # not answering yet
                    if seen == everyone and controller in everyone:
                        break
                    if time.monotonic() > deadline:
                        raise ClusterUpError(
                            f"broker {broker_id} sees brokers {sorted(seen)} and controller "
                            f"{controller}, not {sorted(everyone)}, after {_READY_TIMEOUT_S:.0f} s"
                        )
                    time.sleep(0.1)
