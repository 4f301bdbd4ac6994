"""A real PostgreSQL 15 for the CDC tests, and a real broker.

``postgres`` (session scope) is ``tests.cdc.postgres.running_postgres()``: Debian's
``initdb`` and ``postgres`` in a temporary directory with ``wal_level=logical``, on
127.0.0.1 on a free port, run as the ``postgres`` user when we are root. PostgreSQL
missing is a failure (``make venv`` and ``.ci/run`` install it), never a skip.

``postgres.restart()`` (``tests.cdc.postgres.Postgres.restart``) stops the server (fast
shutdown: sessions are cut) and starts it again on the same port and data, for the tests
of a restart under a running connector.

``database`` gives each test a fresh database (``dsn``), so slots and publications of one
test never meet another's; ``broker`` is one in-process broker per module. A failed test
that used a ``LocalCluster`` reports the end of every broker's log (the cluster tests'
hook, imported).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterator

import psycopg2
import pytest

from tests.broker.cluster.conftest import pytest_runtest_makereport  # noqa: F401 (the hook)
from tests.cdc.postgres import Postgres, running_postgres
from tidelog.broker.testing import InProcessBroker

_databases = itertools.count()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    with running_postgres() as server:
        yield server


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
