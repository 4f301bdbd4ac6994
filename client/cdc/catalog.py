"""What the connector asks PostgreSQL's catalog over an ordinary SQL connection.

The publication (created or aligned from a table list), its tables' shapes (columns in
order, primary key), the slot's state, and the primary key of a relation named by a
Relation message. Every function takes an open psycopg2 connection in autocommit mode and
runs plain SQL; none keeps state. Not thread-safe (a connection is one session).

Decision: the primary key comes from the catalog (``pg_index.indisprimary``), not from a
Relation message's key flags: with REPLICA IDENTITY FULL every column is flagged, and with
USING INDEX the flagged columns are that index's. So the key is asked for when a Relation
message arrives; a PK changed while streaming takes effect from the next Relation message
(as Debezium, which reads it over JDBC; docs/cdc.md says to quiesce around PK changes).
"""

from __future__ import annotations

from typing import Any

from psycopg2 import sql

from tidelog.client.cdc.events import CdcError, TableShape

__all__ = [
    "SESSION_OPTIONS",
    "ensure_publication",
    "primary_key",
    "publication_tables",
    "slot_exists",
    "table_shape",
]

SESSION_OPTIONS = "-c DateStyle=ISO -c TimeZone=UTC -c extra_float_digits=3"
"""Every connector session's settings: the text output the events rely on
(``client.cdc.events``): ISO dates, UTC offsets, floats that round-trip."""

_Connection = Any  # psycopg2's connection (its stubs type cursors loosely)


def ensure_publication(conn: _Connection, name: str, tables: tuple[str, ...]) -> None:
    """Create publication ``name`` for ``tables`` (``schema.table``), or set its table
    list to exactly those if it exists."""
    table_list = sql.SQL(", ").join(sql.Identifier(*_split_table(table)) for table in tables)
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,))
        exists = cur.fetchone() is not None
        verb = (
            "ALTER PUBLICATION {} SET TABLE {}" if exists else "CREATE PUBLICATION {} FOR TABLE {}"
        )
        cur.execute(sql.SQL(verb).format(sql.Identifier(name), table_list))


def publication_tables(conn: _Connection, name: str) -> list[tuple[str, str]]:
    """The (schema, table) pairs publication ``name`` publishes, sorted.

    Raises:
        CdcError: the publication does not exist.
    """
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,))
        if cur.fetchone() is None:
            raise CdcError(f"publication {name!r} does not exist (give --tables to create it)")
        cur.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s "
            "ORDER BY 1, 2",
            (name,),
        )
        return [(str(s), str(t)) for s, t in cur.fetchall()]


def table_shape(conn: _Connection, schema: str, table: str) -> TableShape:
    """Columns (name, type OID, in attribute order) and primary key of ``schema.table``.

    Raises:
        CdcError: the table has no primary key (the connector refuses it: docs/cdc.md).
    """
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (schema, table),
        )
        row = cur.fetchone()
        if row is None:
            raise CdcError(f"table {schema}.{table} does not exist")
        oid = int(row[0])
        cur.execute(
            "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (oid,),
        )
        columns = tuple((str(n), int(t)) for n, t in cur.fetchall())
    return TableShape(schema, table, columns, primary_key(conn, oid, f"{schema}.{table}"))


def primary_key(conn: _Connection, relation_oid: int, what: str) -> tuple[str, ...]:
    """The primary-key columns of relation ``relation_oid``, in the key's order.

    Raises:
        CdcError: no primary key. The connector refuses such tables: their changes could
        not be keyed, so compaction could not keep one row per key.
    """
    with conn.cursor() as cur:
        cur.execute(
            "SELECT a.attname FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = %s AND i.indisprimary "
            "ORDER BY array_position(i.indkey::int2[], a.attnum)",
            (relation_oid,),
        )
        names = tuple(str(n) for (n,) in cur.fetchall())
    if not names:
        raise CdcError(
            f"table {what} has no primary key: add one (ALTER TABLE ... ADD PRIMARY KEY) "
            "or leave it out of the publication; the connector keys every change by it"
        )
    return names


def slot_exists(conn: _Connection, slot: str) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        return cur.fetchone() is not None


def _split_table(table: str) -> tuple[str, str]:
    schema, sep, name = table.partition(".")
    if not sep:
        return ("public", table)
    return (schema, name)
