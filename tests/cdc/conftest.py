"""A real PostgreSQL 15 for the CDC tests, and a real broker.

``postgres`` (session scope) runs Debian's ``initdb`` and ``postgres`` in a temporary
directory with ``wal_level=logical``, listening on 127.0.0.1 on a free port; as root (CI,
these machines) both run as the ``postgres`` user the package creates, because PostgreSQL
refuses to run as root, in a directory that user owns. Start is bounded
(``_START_TIMEOUT_S``); the server is stopped (fast shutdown, then SIGKILL) and the
directory removed at the end. PostgreSQL missing is a failure (``make venv`` and
``.ci/run`` install it), never a skip.

``postgres.restart()`` stops the server (fast shutdown: sessions are cut) and starts it
again on the same port and data, for the tests of a restart under a running connector.

``database`` gives each test a fresh database (``dsn``), so slots and publications of one
test never meet another's; ``broker`` is one in-process broker per module. A failed test
that used a ``LocalCluster`` reports the end of every broker's log (the cluster tests'
hook, imported).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2
import pytest

from tests.broker.cluster.conftest import pytest_runtest_makereport  # noqa: F401 (the hook)
from tidelog.broker.testing import InProcessBroker

_START_TIMEOUT_S = 60
_STOP_TIMEOUT_S = 30
_databases = itertools.count()


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str
    restarter: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={dbname}"

    def restart(self) -> None:
        """Fast shutdown, then start again (same port, same data); returns once it
        accepts connections."""
        assert self.restarter is not None
        self.restarter()


def _binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        path = shutil.which("initdb")
        assert path is not None, (
            "PostgreSQL is not installed: apt-get install postgresql (make venv and .ci/run do)"
        )
        return Path(path).resolve().parent
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    bindir = _binaries()
    root = Path(tempfile.mkdtemp(prefix="tidelog-pg-"))
    user_kwargs: dict[str, object] = {}
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")  # created by Debian's postgresql package
        os.chown(root, account.pw_uid, account.pw_gid)
        user_kwargs = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
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
        timeout=_START_TIMEOUT_S,
        **user_kwargs,  # type: ignore[call-overload]
    )
    port = _free_port()
    settings = {
        "listen_addresses": "127.0.0.1",
        "port": str(port),
        "unix_socket_directories": str(root),
        "wal_level": "logical",
        "max_wal_senders": "20",
        "max_replication_slots": "20",
        # A test server: durability is not under test here, and fsync costs seconds.
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "shared_buffers": "32MB",
    }
    args = [str(bindir / "postgres"), "-D", str(data)]
    for name, value in settings.items():
        args += ["-c", f"{name}={value}"]
    log = open(root / "postgres.log", "ab")  # noqa: SIM115 (closed at the end)
    servers: list[subprocess.Popen[bytes]] = []
    plain = Postgres("127.0.0.1", port, "postgres")

    def start() -> None:
        server = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, **user_kwargs)  # type: ignore[call-overload]
        servers.append(server)
        deadline = time.monotonic() + _START_TIMEOUT_S
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
            server.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

    def restart() -> None:
        stop()
        start()

    try:
        start()
        yield Postgres("127.0.0.1", port, "postgres", restart)
    finally:
        if servers:
            stop()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def dsn(postgres: Postgres) -> Iterator[str]:
    """A fresh database's DSN; the database (and its slots) dropped after the test."""
    name = f"cdc_{os.getpid()}_{next(_databases)}"
    admin = psycopg2.connect(postgres.dsn())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    admin.close()
    try:
        yield postgres.dsn(name)
    finally:
        # A new session: the server may have been restarted meanwhile.
        admin = psycopg2.connect(postgres.dsn())
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE database = %s AND active_pid IS NOT NULL",
                (name,),
            )
            for _ in range(100):
                cur.execute(
                    "SELECT count(*) FROM pg_replication_slots WHERE database = %s AND active",
                    (name,),
                )
                row = cur.fetchone()
                if row is None or row[0] == 0:
                    break
                time.sleep(0.1)
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s",
                (name,),
            )
            with contextlib.suppress(psycopg2.Error):
                cur.execute(f"DROP DATABASE {name} WITH (FORCE)")
        admin.close()


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker() as running:
        yield running
