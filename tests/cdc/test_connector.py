"""The connector against a real PostgreSQL 15 and a real broker: snapshot then stream,
the compacted topic equal to the table at the end, a graceful restart with no change
missing, and each edge case's defined outcome (docs/cdc.md)."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.broker.cluster.waiting import eventually
from tests.cdc.topics import (
    confirmed_flush_lsn,
    database_rows,
    execute,
    latest_rows,
    read_topic,
)
from tidelog.broker.testing import InProcessBroker
from tidelog.client.cdc import CdcError, ConnectorConfig, PostgresConnector
from tidelog.client.cdc.events import UNAVAILABLE_VALUE, parse_lsn

pytestmark = pytest.mark.timeout(120)


@contextmanager
def running(connector: PostgresConnector) -> Iterator[PostgresConnector]:
    """``connector.run`` on a thread; stopped (gracefully) and joined at the end; an error
    it raised is raised here (also when the body failed first, say waiting for progress
    the dead connector could not make: the body's error is its context)."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            connector.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="cdc-connector", daemon=True)
    thread.start()
    try:
        eventually(lambda: connector.streaming.is_set() or bool(errors), 60)
        assert not errors, errors
        yield connector
    finally:
        connector.stop()
        thread.join(60)
        assert not thread.is_alive(), "the connector did not stop"
        assert not errors, errors


def _config(dsn: str, broker: InProcessBroker, slot: str, *tables: str) -> ConnectorConfig:
    return ConnectorConfig(
        dsn=dsn,
        bootstrap_servers=broker.address,
        tables=tables,
        slot=slot,
        topic_prefix=slot,
        offsets_topic=f"{slot}-offsets",
        snapshot_chunk_rows=1_000,
    )


class Workload:
    """Seeded mixed transactions on ``t(id int primary key, v int, name text)``; every
    committed row version is remembered as (id, v) so the stream can be checked for
    gaps, and each key's changes in commit order as (op, v) in ``history``. ``v`` is
    unique across the run, so a version names one change."""

    def __init__(self, dsn: str, seed: int, ids: range) -> None:
        self.dsn = dsn
        self.random = random.Random(seed)
        self.live: list[int] = list(ids)  # random choice and removal in O(1)
        self._where = {row_id: i for i, row_id in enumerate(self.live)}
        self.changes = 0
        self.next_id = ids.stop
        self.next_v = 1_000_000
        self.versions: set[tuple[int, int]] = {(i, i) for i in ids}
        self.history: dict[int, list[tuple[str, int | None]]] = {}

    def run(self, transactions: int) -> None:
        import psycopg2

        conn = psycopg2.connect(self.dsn)
        try:
            for _ in range(transactions):
                with conn, conn.cursor() as cur:
                    for _ in range(self.random.randint(1, 6)):
                        self._one(cur)
        finally:
            conn.close()

    def _one(self, cur: object) -> None:
        execute_ = cur.execute  # type: ignore[attr-defined]
        choice = self.random.random()
        self.changes += 1
        self.next_v += 1
        v = self.next_v
        if choice < 0.35 or not self.live:
            row_id = self.next_id
            self.next_id += 1
            execute_("INSERT INTO t VALUES (%s, %s, %s)", (row_id, v, f"new-{row_id}"))
            self._where[row_id] = len(self.live)
            self.live.append(row_id)
            self.versions.add((row_id, v))
            self.history.setdefault(row_id, []).append(("c", v))
        elif choice < 0.8:
            row_id = self.random.choice(self.live)
            execute_("UPDATE t SET v = %s WHERE id = %s", (v, row_id))
            self.versions.add((row_id, v))
            self.history.setdefault(row_id, []).append(("u", v))
        else:
            row_id = self.random.choice(self.live)
            execute_("DELETE FROM t WHERE id = %s", (row_id,))
            self._drop(row_id)
            self.history.setdefault(row_id, []).append(("d", None))

    def _drop(self, row_id: int) -> None:
        """Take ``row_id`` out of ``live``: the last id moves into its place."""
        at = self._where.pop(row_id)
        last = self.live.pop()
        if last != row_id:
            self.live[at] = last
            self._where[last] = at


def _create_table(dsn: str, rows: int) -> None:
    execute(
        dsn,
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, name text)",
        f"INSERT INTO t SELECT i, i, 'row-' || i FROM generate_series(0, {rows - 1}) i",
    )


def _check_stream(records: list, workload: Workload) -> Counter[tuple[int, int]]:
    """Every committed version appears (as r, c or u); returns how often each did."""
    seen: Counter[tuple[int, int]] = Counter()
    for record in records:
        if record.value is None:
            continue
        event = json.loads(record.value)
        if event["after"] is not None:
            seen[(event["after"]["id"], event["after"]["v"])] += 1
    missing = workload.versions - set(seen)
    assert not missing, f"{len(missing)} committed versions missing, e.g. {sorted(missing)[:5]}"
    return seen


def test_snapshot_then_stream_then_restart_matches_the_table(
    dsn: str, broker: InProcessBroker
) -> None:
    _create_table(dsn, 10_000)
    progress: list[tuple[str, int, int]] = []
    workload = Workload(dsn, seed=30, ids=range(10_000))
    config = _config(dsn, broker, "main", "public.t")
    topic = "main.public.t"

    def matches() -> bool:
        return latest_rows(read_topic(broker.address, topic)) == database_rows(dsn, "t")

    connector = PostgresConnector(config, on_progress=lambda *p: progress.append(p))
    with running(connector):
        workload.run(2_000)  # about 7,000 changes while streaming
        eventually(matches, 60)
    # The snapshot read in chunks with progress.
    assert [p[1] for p in progress] == list(range(1_000, 10_001, 1_000))
    assert {p[0] for p in progress} == {"public.t"}

    workload.run(300)  # while the connector is down
    with running(PostgresConnector(config)):
        workload.run(800)
        eventually(matches, 60)
    assert workload.changes >= 10_000  # the 10,000 mixed changes

    records = read_topic(broker.address, topic)
    seen = _check_stream(records, workload)
    events = [json.loads(r.value) for r in records if r.value is not None]
    assert Counter(e["op"] for e in events if e["source"]["snapshot"]) == {"r": 10_000}
    # A graceful stop stored and confirmed everything: nothing was sent twice.
    assert max(seen.values()) == 1
    deletes = [r for r in records if r.value is not None and json.loads(r.value)["op"] == "d"]
    assert deletes, "the workload deletes"
    for record in deletes:
        following = records[records.index(record) + 1]
        assert following.key == record.key  # the tombstone
        assert following.value is None
    # Source fields: commit LSN, xid, commit time, schema and table.
    streamed = [e for e in events if not e["source"]["snapshot"]]
    assert all(e["source"]["txid"] > 0 and e["source"]["ts_ms"] > 0 for e in streamed)
    assert {(e["source"]["schema"], e["source"]["table"]) for e in events} == {("public", "t")}


def test_at_least_once_delivery_streams_and_restarts(dsn: str, broker: InProcessBroker) -> None:
    """``delivery="at-least-once"`` (``ProducerSink``): the topic equals the table after
    streaming and after a graceful restart, every committed version is there, and a
    graceful stop stored everything (nothing twice)."""
    _create_table(dsn, 2_000)
    workload = Workload(dsn, seed=31, ids=range(2_000))
    config = dataclasses.replace(_config(dsn, broker, "alo", "public.t"), delivery="at-least-once")
    topic = "alo.public.t"

    def matches() -> bool:
        return latest_rows(read_topic(broker.address, topic)) == database_rows(dsn, "t")

    with running(PostgresConnector(config)):
        workload.run(400)
        eventually(matches, 60)
    workload.run(100)  # while the connector is down
    with running(PostgresConnector(config)):
        workload.run(200)
        eventually(matches, 60)
    seen = _check_stream(read_topic(broker.address, topic), workload)
    assert max(seen.values()) == 1


def test_a_table_without_a_primary_key_is_refused(dsn: str, broker: InProcessBroker) -> None:
    execute(dsn, "CREATE TABLE nopk (a int, b text)")
    connector = PostgresConnector(_config(dsn, broker, "nopk", "public.nopk"))
    with pytest.raises(CdcError, match=r"public\.nopk has no primary key"):
        connector.run()


def test_schema_change_toast_key_change_and_delete(dsn: str, broker: InProcessBroker) -> None:
    execute(
        dsn,
        "CREATE TABLE doc (id int PRIMARY KEY, body text, n int)",
        "CREATE TABLE full_doc (id int PRIMARY KEY, body text, n int)",
        "ALTER TABLE full_doc REPLICA IDENTITY FULL",
        # Out of line and incompressible: a value pgoutput leaves out when unchanged.
        "INSERT INTO doc SELECT 1, string_agg(md5(i::text), '') FROM generate_series(1, 400) i",
        "INSERT INTO full_doc SELECT * FROM doc",
    )
    body = database_rows(dsn, "doc")['{"id": 1}']["body"]
    config = _config(dsn, broker, "edge", "public.doc", "public.full_doc")
    with running(PostgresConnector(config)):
        execute(dsn, "UPDATE doc SET n = 1", "UPDATE full_doc SET n = 1")
        execute(dsn, "ALTER TABLE doc ADD COLUMN tag text")
        execute(dsn, "INSERT INTO doc VALUES (2, 'short', 2, 'new-column')")
        execute(dsn, "UPDATE doc SET id = 3 WHERE id = 2")
        execute(dsn, "DELETE FROM doc WHERE id = 1")

        def doc_events() -> list:
            return read_topic(broker.address, "edge.public.doc")

        eventually(lambda: len(doc_events()) == 8, 30)
        full = read_topic(broker.address, "edge.public.full_doc")
    events = [(r.key, None if r.value is None else json.loads(r.value)) for r in doc_events()]
    ops = [(key.decode(), None if e is None else e["op"]) for key, e in events]
    assert ops == [
        ('{"id": 1}', "r"),
        ('{"id": 1}', "u"),
        ('{"id": 2}', "c"),
        ('{"id": 2}', "d"),  # the primary key changed: delete, tombstone, create
        ('{"id": 2}', None),
        ('{"id": 3}', "c"),
        ('{"id": 1}', "d"),
        ('{"id": 1}', None),
    ]
    update = events[1][1]
    assert update is not None
    # Default identity: no before image, and the unchanged TOASTed body is not sent.
    assert update["before"] is None
    assert update["after"] == {"id": 1, "body": UNAVAILABLE_VALUE, "n": 1}
    # The column added while streaming is in the rows after the ALTER.
    assert events[2][1] is not None
    assert events[2][1]["after"] == {"id": 2, "body": "short", "n": 2, "tag": "new-column"}
    # A delete with the default identity carries the key columns.
    delete = events[6][1]
    assert delete is not None
    assert delete["before"] == {"id": 1}
    assert delete["after"] is None
    # REPLICA IDENTITY FULL: the before image, and the unchanged body filled from it.
    full_update = json.loads(full[1].value)
    assert full_update["before"] == {"id": 1, "body": body, "n": None}
    assert full_update["after"] == {"id": 1, "body": body, "n": 1}


def test_status_shows_the_position_and_lag(
    dsn: str, broker: InProcessBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    from tidelog.client.cli import main

    execute(dsn, "CREATE TABLE s (id int PRIMARY KEY)", "INSERT INTO s VALUES (1)")
    with running(PostgresConnector(_config(dsn, broker, "stat", "public.s"))):
        execute(dsn, "INSERT INTO s VALUES (2)")
        eventually(lambda: len(read_topic(broker.address, "stat.public.s")) == 2, 30)
    capsys.readouterr()
    args = ["--bootstrap", broker.address, "cdc", "status", "--offsets-topic", "stat-offsets"]
    assert main([*args, "--dsn", dsn]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == [
        "CONNECTOR", "LSN", "SNAPSHOT", "LAG_BYTES", "LAG_MS", "WRITTEN_MS_AGO", "SLOT_LAG_BYTES"
    ]  # fmt: skip
    name, lsn, snapshot, *_ = row.split()
    assert (name, snapshot) == ("stat", "done")
    # The stored position is what PostgreSQL was told is flushed (or psycopg2 moved the
    # slot on past WAL with nothing to send, which it does only once all is flushed).
    assert 0 < parse_lsn(lsn) <= confirmed_flush_lsn(dsn, "stat")
