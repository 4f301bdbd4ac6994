"""Reading what the connector wrote, and what the database holds, for the CDC tests."""

from __future__ import annotations

import json
from typing import Any

import psycopg2

from tidelog.client.consumer import Consumer
from tidelog.client.types import ConsumerRecord, TopicPartition


def read_topic(
    bootstrap: str, topic: str, isolation_level: str = "read_uncommitted"
) -> list[ConsumerRecord]:
    """Every record of ``topic`` (one partition) from its start to its end offset now
    (its last stable offset, read_committed)."""
    tp = TopicPartition(topic, 0)
    records: list[ConsumerRecord] = []
    with Consumer(
        bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
    ) as consumer:
        consumer.assign([tp])
        end = consumer.end_offsets([tp], timeout_ms=10_000)[tp]
        consumer.seek_to_beginning(tp)
        while consumer.position(tp, timeout_ms=10_000) < end:
            records.extend(r for r in consumer.poll(timeout_ms=1_000) if r.offset < end)
    return records


def latest_rows(records: list[ConsumerRecord]) -> dict[str, dict[str, Any]]:
    """The compacted view: each key's latest ``after`` (a tombstone drops the key)."""
    rows: dict[str, dict[str, Any]] = {}
    for record in records:
        assert record.key is not None
        key = record.key.decode()
        if record.value is None:
            rows.pop(key, None)
            continue
        event = json.loads(record.value)
        if event["op"] == "d":
            rows.pop(key, None)
        else:
            rows[key] = event["after"]
    return rows


def database_rows(dsn: str, table: str, key: str = "id") -> dict[str, dict[str, Any]]:
    """``SELECT * FROM table`` keyed as the connector keys it (``{"id": 7}``)."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table}")
        assert cur.description is not None
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    conn.close()
    return {json.dumps({key: row[key]}): row for row in rows}


def execute(dsn: str, *statements: str) -> None:
    """Run ``statements`` in one transaction."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


def current_wal_lsn(dsn: str) -> int:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            row = cur.fetchone()
            assert row is not None
            high, _, low = str(row[0]).partition("/")
            return (int(high, 16) << 32) | int(low, 16)
    finally:
        conn.close()


def wal_insert_lsn(dsn: str) -> int:
    """``pg_current_wal_insert_lsn()``: every transaction that commits from now on has a
    commit LSN above it (``pg_current_wal_lsn()``, the write position, can be behind
    commits already made when ``synchronous_commit`` is off, as in these tests)."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            row = cur.fetchone()
            assert row is not None
            high, _, low = str(row[0]).partition("/")
            return (int(high, 16) << 32) | int(low, 16)
    finally:
        conn.close()


def confirmed_flush_lsn(dsn: str, slot: str) -> int:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            )
            row = cur.fetchone()
            if row is None or row[0] is None:
                return 0
            high, _, low = str(row[0]).partition("/")
            return (int(high, 16) << 32) | int(low, 16)
    finally:
        conn.close()
