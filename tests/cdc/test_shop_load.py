"""examples/cdc/shop.py, the load docker-compose runs: creates and seeds the schema once,
resumes on a seeded database, and every transaction it reports is committed."""

from __future__ import annotations

import psycopg2

from tests.cdc.views import examples


def _counts(dsn: str) -> dict[str, int]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            counts = {}
            for table in ("customers", "orders", "products", "cdc_heartbeat"):
                cur.execute(f"SELECT count(*) FROM {table}")
                row = cur.fetchone()
                assert row is not None
                counts[table] = int(row[0])
            return counts
    finally:
        conn.close()


def test_shop_load_seeds_once_and_resumes(dsn: str) -> None:
    with examples("shop") as modules:
        shop = modules["shop"]
        args = ["--dsn", dsn, "--customers", "20", "--orders", "50", "--products", "30"]
        seeded = {"customers": 20, "orders": 50, "products": 30, "cdc_heartbeat": 1}
        assert shop.main([*args, "--transactions", "0"]) == 0
        assert _counts(dsn) == seeded
        assert shop.main([*args, "--transactions", "0"]) == 0  # seeded already: no more rows
        assert _counts(dsn) == seeded
        # A third start goes on with the load where the rows are.
        assert shop.main([*args, "--transactions", "40", "--rate", "100000"]) == 0
        assert _counts(dsn) != seeded
