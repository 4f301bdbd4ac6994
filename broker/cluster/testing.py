"""A throwaway Apache ZooKeeper for tests: yours and ours.

::

    from tidelog.broker.cluster.testing import ZooKeeperServer

    with ZooKeeperServer() as zookeeper:      # 127.0.0.1, a free port, a temporary dir
        connect = zookeeper.connect_string     # "127.0.0.1:PORT", for zookeeper.connect
        ...
        zookeeper.restart()                    # same port and data: sessions may survive

``LocalCluster`` adds N real broker processes (``python -m broker``) in cluster mode on
127.0.0.1 ports, one data directory each, around such a ZooKeeper::

    from tidelog.broker.cluster.testing import LocalCluster

    with LocalCluster(brokers=3) as cluster:
        producer = Producer(cluster.bootstrap)      # "127.0.0.1:P1,127.0.0.1:P2,..."
        cluster.kill(2)                              # SIGKILL; cluster.start_broker(2) again
        ...

``LocalCluster(kafka=True)`` also gives each broker a Kafka listener
(``cluster.kafka_bootstrap`` for Kafka's clients).

It runs the real server from Debian's ``libzookeeper-java`` on the machine's Java
(``java -cp /usr/share/java/zookeeper.jar org.apache.zookeeper.server.ZooKeeperServerMain
zoo.cfg``), listening on ``127.0.0.1`` only, with a short tick (sessions can expire within
about a second, for failure tests), the Jetty admin server off and no fsync. ``stop`` (or
the end of the ``with`` block) ends the process and removes the temporary directory. The
JVM is started in its own process group and killed with it, so nothing outlives the test.

Each broker reaches ZooKeeper through a ``TcpProxy`` of its own, so a failure test can cut
one broker off from ZooKeeper while clients still reach it
(``cluster.cut_from_zookeeper(2)``, ``cluster.heal_zookeeper(2)``).

``zookeeper_available()`` tells whether the jar and ``java`` are there; ``make`` and
``.ci/run`` install the package (``apt-get install libzookeeper-java``).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Protocol

import grpc

from tidelog.proto.tidelog.v1 import broker_pb2, broker_pb2_grpc

__all__ = [
    "ZOOKEEPER_JAR",
    "BrokerNetwork",
    "LocalCluster",
    "TcpProxy",
    "ZooKeeperServer",
    "dying_with_parent",
    "free_port",
    "zookeeper_available",
]

log = logging.getLogger(__name__)

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0


def zookeeper_available() -> bool:
    """Whether Debian's ZooKeeper jar and a ``java`` are installed."""
    return ZOOKEEPER_JAR.is_file() and shutil.which("java") is not None


# Servers started for tests must stop by themselves, even when the test run is killed and
# never reaches its teardown: each child runs through this trampoline, which asks Linux to
# SIGKILL it when its parent dies (prctl PR_SET_PDEATHSIG, kept across exec) and then
# execs the real command. A trampoline rather than ``preexec_fn``: Python code between
# fork and exec in a process with threads (grpc's) is unsafe and was seen to crash.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)\n"
    "except OSError:\n"
    "    pass\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def dying_with_parent(command: list[str]) -> list[str]:
    """``command`` wrapped so that the kernel SIGKILLs it when the process that started
    it dies (Linux ``PR_SET_PDEATHSIG``): a killed test run leaves no server behind."""
    return [sys.executable, "-c", _DIE_WITH_PARENT, *command]


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range when it can be.

    A port the kernel handed out for ``bind(0)`` lies in the ephemeral range, where any
    outgoing connection (a client, a broker dialing ZooKeeper) may take it before the
    broker binds it, or while a killed broker is down before its restart on the same port:
    CI once saw a broker fail to start with "Address already in use". Ports below the
    range are never given to outgoing connections.
    """
    low = _ephemeral_range_start()
    candidates = list(range(max(1024, low - 16_000), low))
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ephemeral_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _is_serving(port: int, host: str = "127.0.0.1") -> bool:
    """ZooKeeper's ``srvr`` four-letter command answers once the server serves."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as connection:
            connection.sendall(b"srvr")
            return b"Zookeeper version" in connection.recv(4096)
    except OSError:
        return False


class ZooKeeperServer:
    """One standalone ZooKeeper on ``127.0.0.1``. Not thread-safe (one owner).

    Args:
        tick_ms: ZooKeeper's ``tickTime``; sessions may be as short as two ticks.
        max_session_timeout_ms: the largest session timeout a client may ask for.
        host, port: where it listens: ``127.0.0.1`` and a free port by default; a network
            namespace's address and a fixed port for partition tests (``tests/faults``).
        wrap: turns the server's command into the one to run (``ip netns exec NS ...``).
        directory: where the server keeps its files (``zoo.cfg``, ``data/``, its log),
            created if missing and kept by ``stop``, so a later server on the same
            directory serves the same data (``tidelog cluster up``); a temporary directory
            that ``stop`` removes by default.
    """

    def __init__(
        self,
        *,
        tick_ms: int = 500,
        max_session_timeout_ms: int = 30_000,
        host: str = "127.0.0.1",
        port: int = 0,
        wrap: Callable[[list[str]], list[str]] | None = None,
        directory: Path | None = None,
    ) -> None:
        self._tick_ms = tick_ms
        self._max_session_timeout_ms = max_session_timeout_ms
        self._directory: Path | None = directory
        self._keeps_directory = directory is not None
        self._process: subprocess.Popen[bytes] | None = None
        self.host = host
        self.port = port
        self._wrap = wrap or (lambda command: command)

    @property
    def connect_string(self) -> str:
        """``HOST:PORT``: the value for ``zookeeper.connect``."""
        return f"{self.host}:{self.port}"

    def start(self) -> ZooKeeperServer:
        """Start the server and wait until it answers. Raises ``RuntimeError`` if it cannot."""
        if not zookeeper_available():
            raise RuntimeError(
                f"ZooKeeper is not installed: {ZOOKEEPER_JAR} or java is missing "
                "(apt-get install libzookeeper-java; `make venv` does it as root)"
            )
        # A given directory gets its zoo.cfg written at every start: its port may differ.
        if self._directory is None or self._keeps_directory:
            if self._directory is None:
                self._directory = Path(tempfile.mkdtemp(prefix="tidelog-zk-"))
            self.port = self.port or free_port()
            (self._directory / "data").mkdir(parents=True, exist_ok=True)
            config = "\n".join(
                [
                    f"tickTime={self._tick_ms}",
                    f"dataDir={self._directory / 'data'}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={self.host}",
                    "maxClientCnxns=0",
                    f"minSessionTimeout={2 * self._tick_ms}",
                    f"maxSessionTimeout={self._max_session_timeout_ms}",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=srvr,ruok",
                    "forceSync=no",
                    "",
                ]
            )
            (self._directory / "zoo.cfg").write_text(config)
        log_file = open(self._directory / "zookeeper.log", "ab")  # noqa: SIM115  # the child's
        try:
            self._process = subprocess.Popen(
                self._wrap(
                    dying_with_parent(
                        [
                            "java",
                            "-Xmx256m",
                            "-Dzookeeper.admin.enableServer=false",
                            f"-Dzookeeper.log.dir={self._directory}",
                            "-cp",
                            str(ZOOKEEPER_JAR),
                            "org.apache.zookeeper.server.ZooKeeperServerMain",
                            str(self._directory / "zoo.cfg"),
                        ]
                    )
                ),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log_file.close()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _is_serving(self.port, self.host):
            if self._process.poll() is not None or time.monotonic() > deadline:
                output = self.output()
                self.stop()
                raise RuntimeError(f"ZooKeeper did not start:\n{output[-4000:]}")
            time.sleep(0.1)
        log.info("ZooKeeper serving on %s", self.connect_string)
        return self

    def output(self) -> str:
        """What the server logged so far."""
        if self._directory is None:
            return ""
        path = self._directory / "zookeeper.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """End the server process (SIGKILL to its group), keeping the data for ``start``."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait(_STOP_TIMEOUT_S)

    def restart(self) -> None:
        """Kill and start again on the same port with the same data."""
        self.kill()
        self.start()

    def stop(self) -> None:
        """End the server and remove its directory (unless given one). Idempotent."""
        self.kill()
        if self._directory is not None and not self._keeps_directory:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; ``cut`` drops every connection and
    refuses new ones until ``heal``. Threads, one pair per connection; for tests."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        threading.Thread(target=self._accept, name="tidelog-tcp-proxy", daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            doomed = list(self._sockets)
            self._sockets.clear()
        for sock in doomed:
            _close(sock)

    def heal(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refused = self._cut
            if refused:
                _close(client)
                continue
            try:
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._sockets.update((client, server))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with self._lock:
                    self._sockets.discard(sock)
                _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class BrokerNetwork(Protocol):
    """Where ``LocalCluster``'s brokers run when not on 127.0.0.1: each at an address of
    its own (a network namespace, ``tests/faults/netns.py``), reached directly by clients
    and by ZooKeeper's address (no ``TcpProxy``: the network itself is cut)."""

    def host(self, broker_id: int) -> str:
        """The address broker ``broker_id`` listens on and advertises."""
        ...

    def wrap(self, broker_id: int, command: list[str]) -> list[str]:
        """The command that runs ``command`` where broker ``broker_id`` lives."""
        ...


# Fixed ports of a broker on its own address (``BrokerNetwork``): nothing else binds there.
_NETWORK_PORT, _NETWORK_KAFKA_PORT, _NETWORK_METRICS_PORT = 7410, 9092, 7480


class LocalCluster:
    """ZooKeeper plus ``brokers`` broker processes on 127.0.0.1. Not thread-safe.

    Each broker keeps its port and data directory across ``kill``/``start_broker``, so a
    restarted broker is the same broker. Broker processes die with this process.

    Args:
        brokers: how many (ids 1..N).
        settings: extra broker settings for every broker (``--set KEY=VALUE``).
        broker_settings: settings of single brokers by id (``broker.rack``...), over
            ``settings``.
        broker_env: environment variables of single brokers' processes by id, over this
            process's (a test hook such as ``TIDELOG_DLQ_TEST_STOP_AT`` on one broker),
            at every start of that broker.
        session_timeout_ms: ``zookeeper.session.timeout.ms``: how soon a killed broker is
            noticed.
        metrics: serve each broker's Prometheus metrics on a port of its own
            (``metrics_address``), kept across restarts; off by default.
        kafka: give each broker a Kafka wire-protocol listener (``kafka.listen``) on a
            port of its own, kept across restarts (``kafka_address``,
            ``kafka_bootstrap``); off by default.
        zookeeper: the ZooKeeper to use (started and stopped with the cluster); a new
            one on 127.0.0.1 by default.
        network: run each broker at an address of its own (``BrokerNetwork``), on fixed
            ports, connected to ``zookeeper`` directly; 127.0.0.1 behind proxies by
            default.
        data_dirs: a data directory of the test's choosing per broker id (a small file
            system a fault test fills, say); it is created if missing and never removed
            by ``stop``. Brokers not named get one under the cluster's temporary
            directory, as by default.
    """

    def __init__(
        self,
        brokers: int = 3,
        *,
        settings: Mapping[str, object] | None = None,
        session_timeout_ms: int = 4_000,
        metrics: bool = False,
        kafka: bool = False,
        zookeeper: ZooKeeperServer | None = None,
        network: BrokerNetwork | None = None,
        data_dirs: Mapping[int, Path] | None = None,
        broker_settings: Mapping[int, Mapping[str, object]] | None = None,
        broker_env: Mapping[int, Mapping[str, str]] | None = None,
    ) -> None:
        self.zookeeper = zookeeper or ZooKeeperServer()
        self._data_dirs = dict(data_dirs or {})
        unknown = set(self._data_dirs) - set(range(1, brokers + 1))
        if unknown:
            raise ValueError(f"data_dirs names brokers that do not exist: {sorted(unknown)}")
        self._broker_settings = {b: dict(s) for b, s in (broker_settings or {}).items()}
        self._broker_env = {b: dict(e) for b, e in (broker_env or {}).items()}
        self._network = network
        self._ids = list(range(1, brokers + 1))
        self._settings = dict(settings or {})
        self._session_timeout_ms = session_timeout_ms
        self._directory: Path | None = None
        self.ports: dict[int, int] = {}
        self._metrics = metrics
        self.metrics_ports: dict[int, int] = {}
        self._kafka = kafka
        self.kafka_ports: dict[int, int] = {}
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._proxies: dict[int, TcpProxy] = {}

    @property
    def broker_ids(self) -> list[int]:
        return list(self._ids)

    def host(self, broker_id: int) -> str:
        """The address broker ``broker_id`` listens on."""
        return "127.0.0.1" if self._network is None else self._network.host(broker_id)

    def address(self, broker_id: int) -> str:
        return f"{self.host(broker_id)}:{self.ports[broker_id]}"

    def metrics_address(self, broker_id: int) -> str:
        """``HOST:PORT`` of broker ``broker_id``'s metrics (``metrics=True`` only)."""
        return f"{self.host(broker_id)}:{self.metrics_ports[broker_id]}"

    def kafka_address(self, broker_id: int) -> str:
        """``HOST:PORT`` of broker ``broker_id``'s Kafka listener (``kafka=True`` only)."""
        return f"{self.host(broker_id)}:{self.kafka_ports[broker_id]}"

    @property
    def bootstrap(self) -> str:
        """Every broker's address, comma-separated (a client's bootstrap list)."""
        return ",".join(self.address(i) for i in self._ids)

    @property
    def kafka_bootstrap(self) -> str:
        """Every broker's Kafka listener, comma-separated (``bootstrap.servers`` of a Kafka
        client; ``kafka=True`` only)."""
        return ",".join(self.kafka_address(i) for i in self._ids)

    def data_dir(self, broker_id: int) -> Path:
        """Broker ``broker_id``'s data directory (``data_dirs``, or the cluster's own),
        kept across restarts."""
        chosen = self._data_dirs.get(broker_id)
        if chosen is not None:
            return chosen
        assert self._directory is not None, "the cluster is not started"
        return self._directory / f"broker-{broker_id}"

    def start(self) -> LocalCluster:
        self.zookeeper.start()
        self._directory = Path(tempfile.mkdtemp(prefix="tidelog-cluster-"))
        on_own_address = self._network is not None
        for broker_id in self._ids:
            self.ports[broker_id] = _NETWORK_PORT if on_own_address else free_port()
            if self._metrics:
                port = _NETWORK_METRICS_PORT if on_own_address else free_port()
                self.metrics_ports[broker_id] = port
            if self._kafka:
                self.kafka_ports[broker_id] = _NETWORK_KAFKA_PORT if on_own_address else free_port()
        try:
            for broker_id in self._ids:
                self.start_broker(broker_id, wait=False)
            for broker_id in self._ids:
                self.wait_ready(broker_id)
            if self._settings.get("security.protocol", "PLAINTEXT") == "PLAINTEXT":
                self.wait_converged()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_converged(self, timeout_s: float = _START_TIMEOUT_S) -> None:
        """Block until every running broker's metadata lists every running broker and
        names a controller (plaintext listeners only).

        A broker serves once it has registered; the others learn of it from a ZooKeeper
        watch and a re-read of the cluster metadata, which on a loaded machine can take
        seconds (as in Kafka, where UpdateMetadata reaches brokers one by one). ``start``
        waits for this, so a test's first Metadata sees the whole cluster; a test that
        restarts a broker calls it when it wants the same.
        """
        running = {i for i in self._ids if self.is_running(i)}
        deadline = time.monotonic() + timeout_s
        for broker_id in sorted(running):
            with grpc.insecure_channel(self.address(broker_id)) as channel:
                stub = broker_pb2_grpc.BrokerStub(channel)
                while True:
                    seen: set[int] = set()
                    controller = -1
                    try:
                        answer = stub.Metadata(broker_pb2.MetadataRequest(), timeout=2.0)
                        seen = {b.id for b in answer.brokers}
                        controller = answer.controller_id
                    except grpc.RpcError:
                        pass
                    if seen == running and controller in running:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"broker {broker_id} sees brokers {sorted(seen)} and controller "
                            f"{controller}, not {sorted(running)}, after {timeout_s:.0f} s"
                        )
                    time.sleep(0.05)

    def start_broker(
        self, broker_id: int, *, wait: bool = True, timeout_s: float = _START_TIMEOUT_S
    ) -> None:
        """Start (or restart) broker ``broker_id`` on its port and data directory; with
        ``wait``, until it serves (``timeout_s``: a broker recovering a large log after an
        unclean stop, on a loaded machine, may need more than the default).

        Call it from a thread that lives as long as the broker should: the broker dies
        with the *thread* that started it (``dying_with_parent``: Linux's parent-death
        signal follows the thread), so one started from ``asyncio.to_thread`` or a pool
        is killed when that worker exits."""
        assert self._directory is not None
        if broker_id in self._processes and self._processes[broker_id].poll() is None:
            raise RuntimeError(f"broker {broker_id} is running")
        ready = self._directory / f"broker-{broker_id}.ready"
        ready.unlink(missing_ok=True)
        settings = {
            "broker.id": broker_id,
            "zookeeper.connect": f"{self._zookeeper_address(broker_id)}/tidelog",
            "zookeeper.session.timeout.ms": self._session_timeout_ms,
            "metrics.port": self.metrics_ports.get(broker_id, -1),
            "shutdown.grace.ms": 1_000,
            # As InProcessBroker: a classic group's first rebalance does not wait.
            "group.initial.rebalance.delay.ms": 0,
            **self._settings,
            **self._broker_settings.get(broker_id, {}),
        }
        if broker_id in self.kafka_ports:
            settings["kafka.listen"] = self.kafka_address(broker_id)
        command = [
            sys.executable,
            "-m",
            "tidelog.broker",
            "--listen",
            self.address(broker_id),
            "--data-dir",
            str(self.data_dir(broker_id)),
            "--ready-file",
            str(ready),
        ]
        for key, value in settings.items():
            command += ["--set", f"{key}={value}"]
        log_file = open(self._directory / f"broker-{broker_id}.log", "ab")  # noqa: SIM115
        try:
            if self._network is not None:
                command = self._network.wrap(broker_id, dying_with_parent(command))
            else:
                command = dying_with_parent(command)
            env = self._broker_env.get(broker_id)
            self._processes[broker_id] = subprocess.Popen(
                command,
                env=None if env is None else {**os.environ, **env},
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        finally:
            log_file.close()
        if wait:
            self.wait_ready(broker_id, timeout_s)

    def _zookeeper_address(self, broker_id: int) -> str:
        if self._network is not None:
            return self.zookeeper.connect_string
        return f"127.0.0.1:{self._proxy(broker_id).port}"

    def _proxy(self, broker_id: int) -> TcpProxy:
        proxy = self._proxies.get(broker_id)
        if proxy is None:
            host, port = self.zookeeper.connect_string.rsplit(":", 1)
            proxy = self._proxies[broker_id] = TcpProxy((host, int(port)))
        return proxy

    def cut_from_zookeeper(self, broker_id: int) -> None:
        """Drop broker ``broker_id``'s ZooKeeper connection and refuse new ones (clients
        and other brokers still reach it)."""
        self._proxy(broker_id).cut()

    def heal_zookeeper(self, broker_id: int) -> None:
        """Let broker ``broker_id`` reach ZooKeeper again."""
        self._proxy(broker_id).heal()

    def wait_ready(self, broker_id: int, timeout_s: float = _START_TIMEOUT_S) -> None:
        """Block until broker ``broker_id`` (started with ``wait=False``) serves."""
        assert self._directory is not None
        ready = self._directory / f"broker-{broker_id}.ready"
        process = self._processes[broker_id]
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"broker {broker_id} did not start:\n{self.output(broker_id)[-4000:]}"
                )
            time.sleep(0.05)

    def output(self, broker_id: int) -> str:
        """What broker ``broker_id`` logged so far (all its lives)."""
        if self._directory is None:
            return ""
        path = self._directory / f"broker-{broker_id}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def pid(self, broker_id: int) -> int:
        """Broker ``broker_id``'s process id (its current life): what a benchmark reads
        ``/proc/<pid>`` of, or signals itself without waiting."""
        return self._processes[broker_id].pid

    def is_running(self, broker_id: int) -> bool:
        process = self._processes.get(broker_id)
        return process is not None and process.poll() is None

    def kill(self, broker_id: int, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to broker ``broker_id`` and, for SIGKILL/SIGTERM, wait for it."""
        process = self._processes[broker_id]
        if process.poll() is None:
            process.send_signal(signum)
        if signum in (signal.SIGKILL, signal.SIGTERM):
            process.wait(_STOP_TIMEOUT_S * 2)

    def stop(self) -> None:
        """Kill every broker and ZooKeeper; remove the directories. Idempotent."""
        for process in self._processes.values():
            if process.poll() is None:
                process.kill()
            process.wait(_STOP_TIMEOUT_S)
        self._processes.clear()
        for proxy in self._proxies.values():
            proxy.close()
        self._proxies.clear()
        self.zookeeper.stop()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
