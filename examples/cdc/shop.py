"""The shop database the CDC examples derive their views from, and a load to run on it.

Run (a PostgreSQL with ``wal_level=logical`` and a connector capturing ``TABLES``)::

    python examples/cdc/shop.py --dsn "host=127.0.0.1 dbname=shop user=postgres" \
        [--customers 200 --orders 1000 --products 500] [--rate 20] [--transactions N]

creates the schema if it is missing, seeds it, then commits random transactions (``--rate``
a second, forever or ``--transactions`` of them). docs/cdc.md "Derived views" tells the
whole story; the pieces:

- ``customers`` and ``orders``: the two tables ``orders_view.py`` joins. No foreign key on
  purpose: deleting a customer leaves its orders behind, and the join (an inner join, as
  ``JOIN_SQL``) drops them from the view until the customer comes back.
- ``products``: the table ``search_index.py`` indexes (a name and a description made of
  ``WORDS``, so substring searches have answers).
- ``cdc_heartbeat``: one row the load and the tests bump to learn how far the connector has
  got (Debezium's heartbeat action query, done by hand): ``fence`` updates it and returns
  the WAL insert position before its own commit; once the slot's ``confirmed_flush_lsn``
  passes that position, every transaction committed before the fence is in the topics
  (the connector confirms an LSN only after it is durably stored: docs/cdc.md).

``ShopLoad`` is seeded, so a test can replay the same story. Every kind of change the
connector can emit happens: inserts, updates, deletes, an order moving to another customer,
a primary key changed by an UPDATE (``d`` + tombstone + ``c``), and transactions that touch
both joined tables at once.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg2  # noqa: E402

SCHEMA = """
CREATE TABLE IF NOT EXISTS customers (
    id int PRIMARY KEY, name text NOT NULL, email text NOT NULL);
CREATE TABLE IF NOT EXISTS orders (
    id int PRIMARY KEY, customer_id int NOT NULL, total_cents bigint NOT NULL,
    status text NOT NULL);
CREATE TABLE IF NOT EXISTS products (
    id int PRIMARY KEY, name text NOT NULL, description text NOT NULL);
CREATE TABLE IF NOT EXISTS cdc_heartbeat (id int PRIMARY KEY, beats bigint NOT NULL);
INSERT INTO cdc_heartbeat VALUES (1, 0) ON CONFLICT DO NOTHING;
"""

TABLES = ("public.customers", "public.orders", "public.products", "public.cdc_heartbeat")

JOIN_SQL = (
    "SELECT o.id, o.customer_id, c.name, c.email, o.total_cents, o.status "
    "FROM orders o JOIN customers c ON c.id = o.customer_id"
)
"""The view ``orders_view.py`` maintains, as SQL: one row per order whose customer exists."""

JOIN_COLUMNS = ("order_id", "customer_id", "customer_name", "email", "total_cents", "status")

STATUSES = ("placed", "paid", "shipped", "delivered", "returned")

WORDS = (
    "Anchor",
    "Basalt",
    "Copper",
    "Driftwood",
    "Ember",
    "Fjord",
    "Granite",
    "Harbor",
    "Indigo",
    "Juniper",
    "Kelp",
    "Lantern",
    "Marble",
    "Nautilus",
    "Obsidian",
    "Pebble",
    "Quartz",
    "Reef",
    "Saltmarsh",
    "Tidepool",
    "Umber",
    "Velvet",
    "Walrus",
    "Yarrow",
    "Zephyr",
    "blue",
    "green",
    "amber",
    "kettle",
    "lamp",
    "rope",
    "sail",
    "compass",
    "mug",
    "blanket",
)
"""No word contains another, so searching a word finds exactly the rows that hold it."""


def connect(dsn: str) -> Any:
    return psycopg2.connect(dsn)


def create_schema(dsn: str) -> None:
    conn = connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(SCHEMA)
    finally:
        conn.close()


def fence(dsn: str) -> int:
    """Bump the heartbeat in a transaction of its own; return the WAL insert position taken
    inside it, before its commit: every transaction committed earlier ends at or before
    it, and the heartbeat's own commit ends after it. Wait for the slot's
    ``confirmed_flush_lsn`` to pass it (``wait_captured``)."""
    conn = connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("UPDATE cdc_heartbeat SET beats = beats + 1 WHERE id = 1")
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            row = cur.fetchone()
        assert row is not None
        high, _, low = str(row[0]).partition("/")
        return (int(high, 16) << 32) | int(low, 16)
    finally:
        conn.close()


def confirmed_lsn(dsn: str, slot: str) -> int:
    """The slot's ``confirmed_flush_lsn`` (0 before the first confirmation)."""
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            )
            row = cur.fetchone()
    finally:
        conn.close()
    if row is None or row[0] is None:
        return 0
    high, _, low = str(row[0]).partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def wait_captured(dsn: str, slot: str, timeout_s: float = 120.0) -> None:
    """Return once every transaction committed before this call is stored by the connector
    on ``slot`` (``fence``, then the slot's confirmed position past it)."""
    target = fence(dsn)
    deadline = time.monotonic() + timeout_s
    while confirmed_lsn(dsn, slot) <= target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"slot {slot} did not confirm past the fence in {timeout_s} s")
        time.sleep(0.2)


def join_rows(cur: Any) -> set[tuple[Any, ...]]:
    """``JOIN_SQL``'s rows on the cursor's transaction (whatever snapshot it has)."""
    cur.execute(JOIN_SQL)
    return {tuple(row) for row in cur.fetchall()}


def join_at_consistent_point(dsn: str) -> tuple[set[tuple[Any, ...]], int]:
    """``JOIN_SQL`` on the database exactly at an LSN, and that LSN.

    A temporary logical replication slot is created with ``EXPORT_SNAPSHOT``: PostgreSQL
    answers with its consistent point ``L`` and a snapshot that holds exactly the
    transactions committed before ``L`` (the same handoff the connector's own snapshot
    uses). A second session imports the snapshot and runs the join. Compare with
    ``orders_view.build_view(..., as_of_lsn=L)``. Writes may go on meanwhile."""
    import psycopg2.extras

    repl = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        cur = repl.cursor()
        slot = f"tidelog_join_check_{os.getpid()}_{time.monotonic_ns()}"
        cur.execute(f"CREATE_REPLICATION_SLOT {slot} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT")
        row = cur.fetchone()
        assert row is not None
        _, point, snapshot, _ = row
        conn = connect(dsn)
        try:
            conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
            with conn.cursor() as sql_cur:
                sql_cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
                rows = join_rows(sql_cur)
            conn.rollback()
        finally:
            conn.close()
    finally:
        repl.close()  # a temporary slot goes with its session
    high, _, low = str(point).partition("/")
    return rows, (int(high, 16) << 32) | int(low, 16)


def _description(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))


class ShopLoad:
    """Seeded random transactions on the shop tables (one connection, not thread-safe)."""

    def __init__(self, dsn: str, seed: int = 30) -> None:
        self.dsn = dsn
        self.rng = random.Random(seed)
        self._conn: Any = None
        self.customers: set[int] = set()
        self.orders: set[int] = set()
        self.products: set[int] = set()
        self._next = {"customers": 1, "orders": 1, "products": 1}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def open(self) -> None:
        """Connect and learn the ids already there (a load resumed on a seeded shop)."""
        self._cursor()

    def _cursor(self) -> Any:
        if self._conn is None:
            self._conn = connect(self.dsn)
            with self._conn, self._conn.cursor() as cur:
                for table, ids in (
                    ("customers", self.customers),
                    ("orders", self.orders),
                    ("products", self.products),
                ):
                    cur.execute(f"SELECT id FROM {table}")
                    ids.update(r[0] for r in cur.fetchall())
                    self._next[table] = max(ids, default=0) + 1
        return self._conn

    def _new_id(self, table: str) -> int:
        value = self._next[table]
        self._next[table] += 1
        return value

    def seed(self, customers: int, orders: int, products: int) -> None:
        """Bulk rows in one transaction (what the connector's snapshot will read)."""
        conn = self._cursor()
        with conn, conn.cursor() as cur:
            for _ in range(customers):
                self._add_customer(cur)
            for _ in range(orders):
                self._add_order(cur)
            for _ in range(products):
                self._add_product(cur)

    def run(self, transactions: int, *, shop: bool = True, catalog: bool = True) -> None:
        """``transactions`` random transactions of 1-4 changes each (orders/customers if
        ``shop``, products if ``catalog``)."""
        conn = self._cursor()
        kinds = [k for k, on in (("shop", shop), ("catalog", catalog)) if on]
        for _ in range(transactions):
            with conn, conn.cursor() as cur:
                for _ in range(self.rng.randint(1, 4)):
                    if self.rng.choice(kinds) == "shop":
                        self._shop_change(cur)
                    else:
                        self._catalog_change(cur)

    # --- one change each -----------------------------------------------------------------

    def _add_customer(self, cur: Any) -> int:
        cid = self._new_id("customers")
        name = f"{self.rng.choice(WORDS)} {cid}"
        cur.execute("INSERT INTO customers VALUES (%s, %s, %s)", (cid, name, f"c{cid}@shop.test"))
        self.customers.add(cid)
        return cid

    def _add_order(self, cur: Any, customer: int | None = None) -> None:
        oid = self._new_id("orders")
        if customer is None:
            # Mostly live customers; sometimes one that does not exist (yet, or any more).
            pool = sorted(self.customers) or [1]
            customer = self.rng.choice(pool) if self.rng.random() < 0.9 else self._next["customers"]
        cur.execute(
            "INSERT INTO orders VALUES (%s, %s, %s, %s)",
            (oid, customer, self.rng.randint(100, 50_000), STATUSES[0]),
        )
        self.orders.add(oid)

    def _add_product(self, cur: Any) -> None:
        pid = self._new_id("products")
        name = f"{self.rng.choice(WORDS)} {self.rng.choice(WORDS)}"
        cur.execute("INSERT INTO products VALUES (%s, %s, %s)", (pid, name, _description(self.rng)))
        self.products.add(pid)

    def _shop_change(self, cur: Any) -> None:
        rng = self.rng
        choice = rng.random()
        if choice < 0.15 or not self.customers:
            self._add_customer(cur)
        elif choice < 0.2:
            # Both joined tables in one transaction: a new customer and their first order.
            self._add_order(cur, self._add_customer(cur))
        elif choice < 0.3:
            cid = rng.choice(sorted(self.customers))
            cur.execute(
                "UPDATE customers SET name = %s WHERE id = %s", (f"{rng.choice(WORDS)} {cid}", cid)
            )
        elif choice < 0.35:
            cid = rng.choice(sorted(self.customers))
            cur.execute("DELETE FROM customers WHERE id = %s", (cid,))
            self.customers.discard(cid)
        elif choice < 0.55 or not self.orders:
            self._add_order(cur)
        elif choice < 0.8:
            oid = rng.choice(sorted(self.orders))
            cur.execute(
                "UPDATE orders SET status = %s, total_cents = total_cents + %s WHERE id = %s",
                (rng.choice(STATUSES), rng.randint(-50, 50), oid),
            )
        elif choice < 0.87:
            oid = rng.choice(sorted(self.orders))
            cid = rng.choice(sorted(self.customers))
            cur.execute("UPDATE orders SET customer_id = %s WHERE id = %s", (cid, oid))
        elif choice < 0.9:
            # The primary key changes: the connector emits d + tombstone, then c.
            oid = rng.choice(sorted(self.orders))
            new = self._new_id("orders")
            cur.execute("UPDATE orders SET id = %s WHERE id = %s", (new, oid))
            self.orders.discard(oid)
            self.orders.add(new)
        else:
            oid = rng.choice(sorted(self.orders))
            cur.execute("DELETE FROM orders WHERE id = %s", (oid,))
            self.orders.discard(oid)

    def _catalog_change(self, cur: Any) -> None:
        rng = self.rng
        choice = rng.random()
        if choice < 0.3 or not self.products:
            self._add_product(cur)
        elif choice < 0.8:
            pid = rng.choice(sorted(self.products))
            cur.execute(
                "UPDATE products SET description = %s WHERE id = %s", (_description(rng), pid)
            )
        else:
            pid = rng.choice(sorted(self.products))
            cur.execute("DELETE FROM products WHERE id = %s", (pid,))
            self.products.discard(pid)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="create, seed and load the CDC examples' shop")
    p.add_argument("--dsn", required=True)
    p.add_argument("--customers", type=int, default=200)
    p.add_argument("--orders", type=int, default=1_000)
    p.add_argument("--products", type=int, default=500)
    p.add_argument("--rate", type=float, default=20.0, help="transactions a second")
    p.add_argument("--transactions", type=int, default=None, help="stop after this many")
    p.add_argument("--seed", type=int, default=30)
    args = p.parse_args(argv)
    for attempt in range(60):  # the database may still be starting (docker-compose)
        try:
            create_schema(args.dsn)
            break
        except psycopg2.OperationalError:
            if attempt == 59:
                raise
            time.sleep(1)
    load = ShopLoad(args.dsn, args.seed)
    try:
        load.open()
        if not load.customers:
            load.seed(args.customers, args.orders, args.products)
            print(f"seeded {args.customers} customers, {args.orders} orders", flush=True)
        done = 0
        while args.transactions is None or done < args.transactions:
            load.run(1)
            done += 1
            time.sleep(1 / args.rate)
    finally:
        load.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
