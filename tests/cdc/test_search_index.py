"""examples/cdc/search_index.py against a real PostgreSQL, the real connector and a broker:
the SQLite FTS5 index, SIGKILLed five times while it indexes and restarted, ends with the
same documents and the same number of applied records as an index that was never
interrupted (nothing lost, nothing applied twice), and its searches answer what a LIKE
query on PostgreSQL answers."""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.broker.cluster.waiting import eventually
from tests.cdc.views import EXAMPLES, examples, running_connector
from tidelog.broker.testing import InProcessBroker
from tidelog.client.cdc import ConnectorConfig

pytestmark = pytest.mark.timeout(300)

SLOT = "search"
TOPIC = "search.public.products"


def _applied(path: Path) -> int:
    """Records the index at ``path`` has applied (0 before its first transaction)."""
    try:
        db = sqlite3.connect(path)
        try:
            row = db.execute("SELECT coalesce(sum(records_applied), 0) FROM positions").fetchone()
        finally:
            db.close()
    except sqlite3.OperationalError:
        return 0  # not created yet
    return int(row[0])


def _like(dsn: str, term: str) -> list[int]:
    import psycopg2

    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "SELECT id FROM products WHERE name ILIKE %s OR description ILIKE %s ORDER BY id",
                (f"%{term}%", f"%{term}%"),
            )
            return [int(r[0]) for r in cur.fetchall()]
    finally:
        conn.close()


def test_search_index_killed_and_restarted_matches_postgres_like(
    dsn: str, broker: InProcessBroker, tmp_path: Path
) -> None:
    with examples("shop", "search_index") as modules:
        shop, search_index = modules["shop"], modules["search_index"]
        shop.create_schema(dsn)
        load = shop.ShopLoad(dsn, seed=7)
        load.seed(customers=0, orders=0, products=1_500)
        config = ConnectorConfig(
            dsn=dsn,
            bootstrap_servers=broker.address,
            tables=("public.products", "public.cdc_heartbeat"),
            slot=SLOT,
            topic_prefix=SLOT,
            offsets_topic=f"{SLOT}-offsets",
        )
        rng = random.Random(30)
        killed_db = tmp_path / "killed.sqlite"
        try:
            with running_connector(config):
                load.run(200, shop=False)
                shop.wait_captured(dsn, SLOT)
                for _ in range(5):
                    before = _applied(killed_db)
                    process = subprocess.Popen(
                        [
                            sys.executable,
                            str(EXAMPLES / "search_index.py"),
                            "--bootstrap",
                            broker.address,
                            "--topic",
                            TOPIC,
                            "--db",
                            str(killed_db),
                            "--max-records",
                            "37",
                        ]
                    )
                    try:
                        # Killed once it is indexing again, at a random moment after that.
                        eventually(lambda b=before: _applied(killed_db) > b, 60, interval_s=0.01)
                        time.sleep(rng.random() * 0.3)
                    finally:
                        process.kill()
                        process.wait(30)
                    load.run(40, shop=False)  # changes go on while it is down
                shop.wait_captured(dsn, SLOT)

            restarted = search_index.SearchIndex(str(killed_db), broker.address, TOPIC)
            fresh = search_index.SearchIndex(str(tmp_path / "fresh.sqlite"), broker.address, TOPIC)
            try:
                for index in (restarted, fresh):
                    search_index.index_until_caught_up(index)
                applied = sum(a for _, a in restarted.positions().values())
                assert applied == sum(a for _, a in fresh.positions().values())
                docs = search_index.documents(restarted.db)
                assert docs == search_index.documents(fresh.db)
                assert docs == _database_products(dsn)
                terms = [w.lower() for w in shop.WORDS] + ["ARB", "er Ye", "ink", "zzz"]
                for term in terms:
                    assert search_index.search(restarted.db, term) == _like(dsn, term), term
            finally:
                restarted.close()
                fresh.close()
        finally:
            load.close()


def _database_products(dsn: str) -> dict[int, tuple[str, str]]:
    import psycopg2

    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT id, name, description FROM products")
            return {int(i): (str(n), str(d)) for i, n, d in cur.fetchall()}
    finally:
        conn.close()
