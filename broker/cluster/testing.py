"""A throwaway Apache ZooKeeper for tests: yours and ours.

::

    from broker.cluster.testing import ZooKeeperServer

    with ZooKeeperServer() as zookeeper:      # 127.0.0.1, a free port, a temporary dir
        connect = zookeeper.connect_string     # "127.0.0.1:PORT", for zookeeper.connect
        ...
        zookeeper.restart()                    # same port and data: sessions may survive

It runs the real server from Debian's ``libzookeeper-java`` on the machine's Java
(``java -cp /usr/share/java/zookeeper.jar org.apache.zookeeper.server.ZooKeeperServerMain
zoo.cfg``), listening on ``127.0.0.1`` only, with a short tick (sessions can expire within
about a second, for failure tests), the Jetty admin server off and no fsync. ``stop`` (or
the end of the ``with`` block) ends the process and removes the temporary directory. The
JVM is started in its own process group and killed with it, so nothing outlives the test.

``zookeeper_available()`` tells whether the jar and ``java`` are there; ``make`` and
``.ci/run`` install the package (``apt-get install libzookeeper-java``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["ZOOKEEPER_JAR", "ZooKeeperServer", "zookeeper_available"]

log = logging.getLogger(__name__)

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0


def zookeeper_available() -> bool:
    """Whether Debian's ZooKeeper jar and a ``java`` are installed."""
    return ZOOKEEPER_JAR.is_file() and shutil.which("java") is not None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _is_serving(port: int) -> bool:
    """ZooKeeper's ``srvr`` four-letter command answers once the server serves."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as connection:
            connection.sendall(b"srvr")
            return b"Zookeeper version" in connection.recv(4096)
    except OSError:
        return False


class ZooKeeperServer:
    """One standalone ZooKeeper on ``127.0.0.1``. Not thread-safe (one owner).

    Args:
        tick_ms: ZooKeeper's ``tickTime``; sessions may be as short as two ticks.
        max_session_timeout_ms: the largest session timeout a client may ask for.
    """

    def __init__(self, *, tick_ms: int = 500, max_session_timeout_ms: int = 30_000) -> None:
        self._tick_ms = tick_ms
        self._max_session_timeout_ms = max_session_timeout_ms
        self._directory: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def connect_string(self) -> str:
        """``127.0.0.1:PORT``: the value for ``zookeeper.connect``."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> ZooKeeperServer:
        """Start the server and wait until it answers. Raises ``RuntimeError`` if it cannot."""
        if not zookeeper_available():
            raise RuntimeError(
                f"ZooKeeper is not installed: {ZOOKEEPER_JAR} or java is missing "
                "(apt-get install libzookeeper-java; `make venv` does it as root)"
            )
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="tidelog-zk-"))
            self.port = _free_port()
            (self._directory / "data").mkdir()
            config = "\n".join(
                [
                    f"tickTime={self._tick_ms}",
                    f"dataDir={self._directory / 'data'}",
                    f"clientPort={self.port}",
                    "clientPortAddress=127.0.0.1",
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
                [
                    "java",
                    "-Xmx256m",
                    "-Dzookeeper.admin.enableServer=false",
                    f"-Dzookeeper.log.dir={self._directory}",
                    "-cp",
                    str(ZOOKEEPER_JAR),
                    "org.apache.zookeeper.server.ZooKeeperServerMain",
                    str(self._directory / "zoo.cfg"),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log_file.close()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _is_serving(self.port):
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
        """End the server and remove its directory. Idempotent."""
        self.kill()
        if self._directory is not None:
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
