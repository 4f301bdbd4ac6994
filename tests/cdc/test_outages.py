"""The connector's defined outcomes when what it talks to fails (docs/cdc.md, "Defined
behaviours"): PostgreSQL restarted under it (it reconnects and carries on, exactly once),
the broker restarted under it (it retries its commit, exactly once), its slot dropped
(a ``CdcError``, running or at start), and its lag as a metric while it runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg2
import pytest

from tests.broker.cluster.waiting import eventually
from tests.cdc.checks import Writer, check_exactly_once, compacted_matches
from tests.cdc.postgres import Postgres
from tests.cdc.test_connector import Workload, _config, _create_table, running
from tests.cdc.topics import current_wal_lsn, execute, read_topic
from tidelog.broker.testing import InProcessBroker
from tidelog.client.cdc import CdcError, ChangeUnit, PostgresConnector, TransactionalSink

pytestmark = pytest.mark.timeout(120)


def _drop_slot(dsn: str, slot: str) -> None:
    """Cut the slot's walsender and drop the slot, retrying while a connector takes it
    back in between."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:

            def dropped() -> bool:
                cur.execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                    "WHERE slot_name = %s AND active_pid IS NOT NULL",
                    (slot,),
                )
                try:
                    cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                except psycopg2.errors.ObjectInUse:
                    return False
                return True

            eventually(dropped, 30)
    finally:
        conn.close()


@pytest.fixture
def own_broker() -> Iterator[InProcessBroker]:
    """A broker of the test's own: it is restarted."""
    with InProcessBroker() as broker:
        yield broker


def test_postgres_restarted_while_streaming(
    postgres: Postgres, dsn: str, broker: InProcessBroker
) -> None:
    initial = range(200)
    _create_table(dsn, len(initial))
    workload = Workload(dsn, seed=11, ids=initial)
    connector = PostgresConnector(_config(dsn, broker, "pgrestart", "public.t"))
    topic = "pgrestart.public.t"
    with running(connector):
        workload.run(30)
        eventually(lambda: compacted_matches(broker.address, topic, dsn), 30)
        postgres.restart()
        workload.run(30)  # committed while the connector reconnects
        eventually(lambda: connector.metrics()["reconnects"] == 1, 60)
        workload.run(30)
        eventually(lambda: compacted_matches(broker.address, topic, dsn), 60)
    check_exactly_once(read_topic(broker.address, topic, "read_committed"), workload, initial)


def test_broker_restarted_while_streaming(dsn: str, own_broker: InProcessBroker) -> None:
    initial = range(200)
    _create_table(dsn, len(initial))
    workload = Workload(dsn, seed=12, ids=initial)
    writer = Writer(workload)
    connector = PostgresConnector(_config(dsn, own_broker, "brestart", "public.t"))
    topic = "brestart.public.t"
    with running(connector):
        writer.start()
        eventually(lambda: connector.metrics()["transactions"] >= 20, 30)
        own_broker.restart()
        before = connector.metrics()["transactions"]
        eventually(lambda: connector.metrics()["transactions"] >= before + 20, 60)
        writer.stop()
        eventually(lambda: compacted_matches(own_broker.address, topic, dsn), 60)
    check_exactly_once(read_topic(own_broker.address, topic, "read_committed"), workload, initial)


def test_a_dropped_slot_stops_the_connector(dsn: str, broker: InProcessBroker) -> None:
    execute(dsn, "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, name text)")
    config = _config(dsn, broker, "dropped", "public.t")
    connector = PostgresConnector(config)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            connector.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    eventually(connector.streaming.is_set, 60)
    _drop_slot(dsn, "dropped")
    thread.join(60)
    assert not thread.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], CdcError)
    assert "dropped while the connector ran" in str(errors[0])
    # And at the next start: the position says the snapshot was taken, the slot is gone.
    with pytest.raises(CdcError, match="is gone"):
        PostgresConnector(config).run()


class GatedSink:
    """A ``TransactionalSink`` whose ``write`` waits while the gate is closed: the
    connector holds a received transaction it cannot store."""

    def __init__(self, inner: TransactionalSink) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()

    def write(self, unit: ChangeUnit) -> None:
        if not self.gate.is_set():
            self.waiting.set()
            self.gate.wait(60)
        self.inner.write(unit)

    def durable_lsn(self) -> int | None:
        return self.inner.durable_lsn()

    def flush(self, timeout_ms: int) -> int | None:
        return self.inner.flush(timeout_ms)

    def close(self) -> None:
        self.inner.close()


def test_lag_is_a_metric_of_the_running_connector(dsn: str, broker: InProcessBroker) -> None:
    execute(dsn, "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, name text)")
    config = _config(dsn, broker, "lagging", "public.t")
    sink = GatedSink(
        TransactionalSink(broker.address, "lagging", config.offsets_topic, {}, lambda: 0)
    )
    connector = PostgresConnector(config, sink=sink)
    try:
        with running(connector):
            sink.gate.clear()
            execute(dsn, "INSERT INTO t SELECT i, i, 'x' FROM generate_series(1, 2000) i")
            written = current_wal_lsn(dsn)
            sink.waiting.wait(30)
            # Received, not stored: behind in bytes, and in ms since its commit.
            eventually(lambda: connector.metrics()["lag_ms"] >= 300, 30)
            metrics = connector.metrics()
            assert metrics["lag_bytes"] > 0
            assert metrics["durable_lsn"] < written <= metrics["server_lsn"]
            sink.gate.set()
            eventually(lambda: connector.metrics()["durable_lsn"] >= written, 30)
            assert connector.metrics()["lag_ms"] == 0
            assert connector.metrics()["transactions"] == 1
    finally:
        sink.gate.set()
        sink.close()
