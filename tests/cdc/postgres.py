"""A real PostgreSQL 15 in a temporary directory, for the CDC tests and ``benchmarks/cdc_bench.py``.

``running_postgres()`` runs Debian's ``initdb`` and ``postgres`` with ``wal_level=logical``,
listening on 127.0.0.1 on a free port; as root (CI, these machines) both run as the
``postgres`` user the package creates, because PostgreSQL refuses to run as root, in a
directory that user owns. Start is bounded (``START_TIMEOUT_S``); the server is stopped
(fast shutdown, then SIGKILL) and the directory removed when the context ends. PostgreSQL
missing is an ``AssertionError`` (``make venv`` and ``.ci/run`` install it), never a skip.

``Postgres.restart()`` stops the server (fast shutdown: sessions are cut) and starts it
again on the same port and data, for the tests of a restart under a running connector.

``settings`` override or extend the defaults (a test server: ``fsync`` off, because
durability is not under test and fsync costs seconds). ``bindir`` is where the server's
programs are (``pgbench``, ``pg_recvlogical`` live there too); ``run_as`` gives
``subprocess`` the keyword arguments that run a program as the server's user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30

DEFAULT_SETTINGS: Mapping[str, str] = {
    "listen_addresses": "127.0.0.1",
    "wal_level": "logical",
    "max_wal_senders": "20",
    "max_replication_slots": "20",
    # A test server: durability is not under test here, and fsync costs seconds.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
}


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str
    bindir: Path = field(default=Path("/usr/bin"), compare=False)
    root: Path = field(default=Path("/tmp"), compare=False)
    restarter: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={dbname}"

    def restart(self) -> None:
        """Fast shutdown, then start again (same port, same data); returns once it
        accepts connections."""
        assert self.restarter is not None
        self.restarter()


def binaries() -> Path:
    """The directory of PostgreSQL's server programs (the newest installed)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        path = shutil.which("initdb")
        assert path is not None, (
            "PostgreSQL is not installed: apt-get install postgresql (make venv and .ci/run do)"
        )
        return Path(path).resolve().parent
    return Path(found[-1]).parent


def run_as() -> dict[str, Any]:
    """``subprocess`` keyword arguments that run a program as ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return {}
    account = pwd.getpwnam("postgres")  # created by Debian's postgresql package
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def running_postgres(settings: Mapping[str, str] | None = None) -> Iterator[Postgres]:
    """A started server for the ``with`` block; stopped and removed after it."""
    bindir = binaries()
    root = Path(tempfile.mkdtemp(prefix="tidelog-pg-"))
    user_kwargs = run_as()
    if user_kwargs:
        os.chown(root, user_kwargs["user"], user_kwargs["group"])
    data = root / "data"
    subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        timeout=START_TIMEOUT_S,
        **user_kwargs,
    )
    port = free_port()
    merged = {
        **DEFAULT_SETTINGS,
        "port": str(port),
        "unix_socket_directories": str(root),
        **(settings or {}),
    }
    args = [str(bindir / "postgres"), "-D", str(data)]
    for name, value in merged.items():
        args += ["-c", f"{name}={value}"]
    log = open(root / "postgres.log", "ab")  # noqa: SIM115 (closed at the end)
    servers: list[subprocess.Popen[bytes]] = []
    plain = Postgres("127.0.0.1", port, "postgres")

    def start() -> None:
        # The server is started (and restarted, mid-test) from a process whose gRPC
        # clients and broker are busy: ``Popen(user=...)`` would fork() (CPython uses
        # vfork() only without a uid/gid change), running gRPC's fork handlers in the
        # child, which aborted it now and then ("ev_epoll1_linux.cc ... Check failed:
        # next_worker->state == KICKED": PostgreSQL never started). ``setpriv`` makes the
        # change after exec instead, so the child runs no Python or gRPC code at all.
        command = args
        if user_kwargs:
            command = [
                "setpriv",
                f"--reuid={user_kwargs['user']}",
                f"--regid={user_kwargs['group']}",
                "--clear-groups",
                *args,
            ]
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        servers.append(server)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                psycopg2.connect(plain.dsn(), connect_timeout=2).close()
                break
            except psycopg2.OperationalError:
                if server.poll() is not None or time.monotonic() > deadline:
                    tail = (root / "postgres.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"PostgreSQL did not start:\n{tail}") from None
                time.sleep(0.1)

    def stop() -> None:
        server = servers[-1]
        server.send_signal(signal.SIGINT)  # fast shutdown
        try:
            server.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

    def restart() -> None:
        stop()
        start()

    try:
        start()
        yield Postgres("127.0.0.1", port, "postgres", bindir, root, restart)
    finally:
        if servers:
            stop()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
