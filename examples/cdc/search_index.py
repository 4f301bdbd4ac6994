"""A search index kept in sync from a CDC topic: SQLite FTS5, effectively once on its own.

Run (a broker and a connector capturing ``public.products`` with ``--topic-prefix pg``)::

    python examples/cdc/search_index.py --bootstrap 127.0.0.1:7410 --topic pg.public.products \
        --db products.sqlite                       # index, forever (Ctrl-C stops)
    python examples/cdc/search_index.py --db products.sqlite --search lantern

The index is one SQLite file (standard library ``sqlite3``; FTS5 is compiled in):

- ``docs(key TEXT PRIMARY KEY, id, name, description)``: the latest row per primary key;
- ``docs_fts``: an FTS5 table over ``name`` and ``description`` sharing ``docs``'s rowid,
  with the ``trigram`` tokenizer, so a search is a case-insensitive substring match: the
  same question as PostgreSQL's ``name ILIKE '%term%' OR description ILIKE '%term%'``
  (terms of three characters or more; the test compares the two);
- ``positions(topic, partition, next_offset, records_applied)``: how far the index has read.

**Effectively once without the broker's help.** Each poll's records and the new positions
are written in *one* SQLite transaction, and on start the consumer seeks to the stored
positions (group offsets in the broker are not used at all). Killed anywhere, the index
either has a poll's rows and its positions or neither, so a restart neither loses a change
nor applies one twice; ``records_applied`` counts applied records so a test can see it.
(This is the consume side of Kafka's "store offsets outside Kafka" pattern, the one
``ConsumerRebalanceListener``'s documentation describes.) The consumer reads
``read_committed``: with the connector's transactional delivery it never indexes a change
that was rolled back, and a change repeated by an at-least-once connector is an upsert of
the same row, which leaves the index as it was.

Applying a change: a ``c``/``u``/``r`` record upserts ``docs`` and the FTS row; a ``d``
deletes them; tombstones change nothing (the ``d`` before them did). Not thread-safe: one
``SearchIndex`` per thread or process.
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tidelog import Consumer, TopicPartition  # noqa: E402

SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    rowid INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, id INTEGER,
    name TEXT NOT NULL, description TEXT NOT NULL);
CREATE VIRTUAL TABLE IF NOT EXISTS docs_fts USING fts5(
    name, description, content='docs', content_rowid='rowid', tokenize='trigram');
CREATE TABLE IF NOT EXISTS positions (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    records_applied INTEGER NOT NULL, PRIMARY KEY (topic, partition));
"""


def open_db(path: str) -> sqlite3.Connection:
    """The index's connection: WAL (readers while it writes), full durability per commit."""
    db = sqlite3.connect(path, isolation_level=None)  # transactions are explicit
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(SCHEMA)
    return db


def search(db: sqlite3.Connection, term: str) -> list[int]:
    """Ids of the documents whose name or description contains ``term`` (any case)."""
    if len(term) < 3:
        raise ValueError("the trigram index answers terms of three characters or more")
    phrase = '"' + term.replace('"', '""') + '"'
    rows = db.execute(
        "SELECT docs.id FROM docs_fts JOIN docs ON docs.rowid = docs_fts.rowid "
        "WHERE docs_fts MATCH ? ORDER BY docs.id",
        (phrase,),
    )
    return [int(r[0]) for r in rows]


class SearchIndex:
    """Consume ``topic`` (every partition) into the index at ``db_path``."""

    def __init__(self, db_path: str, bootstrap: str, topic: str, **consumer: Any) -> None:
        self.db = open_db(db_path)
        self.topic = topic
        self.consumer = Consumer(
            bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            **consumer,
        )
        tps = [TopicPartition(topic, p) for p in sorted(self.consumer.partitions_for_topic(topic))]
        self.consumer.assign(tps)
        stored = self.positions()
        for tp in tps:
            if tp.partition in stored:
                self.consumer.seek(tp, stored[tp.partition][0])
            else:
                self.consumer.seek_to_beginning(tp)
        self.partitions = tps

    def close(self) -> None:
        self.consumer.close(autocommit=False)
        self.db.close()

    def positions(self) -> dict[int, tuple[int, int]]:
        """partition -> (next offset, records applied so far)."""
        rows = self.db.execute(
            "SELECT partition, next_offset, records_applied FROM positions WHERE topic = ?",
            (self.topic,),
        )
        return {int(p): (int(n), int(a)) for p, n, a in rows}

    def poll_once(self, timeout_ms: int = 1_000, max_records: int = 500) -> int:
        """Apply one poll's records and their positions in one SQLite transaction;
        returns how many records it applied."""
        records = self.consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        if not records:
            return 0
        stored = self.positions()
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            moved: dict[int, tuple[int, int]] = {}
            for record in records:
                self._apply(record)
                _, applied = moved.get(record.partition, stored.get(record.partition, (0, 0)))
                moved[record.partition] = (record.offset + 1, applied + 1)
            db.executemany(
                "INSERT INTO positions VALUES (?, ?, ?, ?) ON CONFLICT (topic, partition) "
                "DO UPDATE SET next_offset = excluded.next_offset, "
                "records_applied = excluded.records_applied",
                [(self.topic, p, n, a) for p, (n, a) in moved.items()],
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return len(records)

    def caught_up(self) -> bool:
        """True when every record below each partition's end (its last stable offset,
        read_committed) is applied."""
        # The position moves only past records poll returned (each applied before the next
        # poll), and past transaction markers: at the end, everything below it is applied.
        ends = self.consumer.end_offsets(self.partitions)
        return all(self.consumer.position(tp) >= end for tp, end in ends.items())

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.poll_once()

    def _apply(self, record: Any) -> None:
        if record.value is None or record.key is None:
            return  # a tombstone: its delete came just before it
        event = json.loads(record.value)
        key = record.key.decode()
        db = self.db
        old = db.execute(
            "SELECT rowid, name, description FROM docs WHERE key = ?", (key,)
        ).fetchone()
        if old is not None:  # external-content FTS5: delete with the old values
            db.execute(
                "INSERT INTO docs_fts (docs_fts, rowid, name, description) "
                "VALUES ('delete', ?, ?, ?)",
                old,
            )
        if event["op"] == "d":
            db.execute("DELETE FROM docs WHERE key = ?", (key,))
            return
        after = event["after"]
        name, description = str(after.get("name") or ""), str(after.get("description") or "")
        if old is None:
            cursor = db.execute(
                "INSERT INTO docs (key, id, name, description) VALUES (?, ?, ?, ?)",
                (key, after.get("id"), name, description),
            )
            rowid = cursor.lastrowid
        else:
            rowid = old[0]
            db.execute(
                "UPDATE docs SET id = ?, name = ?, description = ? WHERE rowid = ?",
                (after.get("id"), name, description, rowid),
            )
        db.execute(
            "INSERT INTO docs_fts (rowid, name, description) VALUES (?, ?, ?)",
            (rowid, name, description),
        )


def index_until_caught_up(index: SearchIndex) -> None:
    """Poll until the stored positions reach the topic's end as it is now."""
    while not index.caught_up():
        index.poll_once(timeout_ms=200)


def documents(db: sqlite3.Connection) -> dict[int, tuple[str, str]]:
    return {int(i): (n, d) for i, n, d in db.execute("SELECT id, name, description FROM docs")}


def main(argv: Iterable[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="a SQLite FTS5 search index fed by a CDC topic")
    p.add_argument("--bootstrap", default="127.0.0.1:7410")
    p.add_argument("--topic", default="pg.public.products")
    p.add_argument("--db", required=True)
    p.add_argument("--max-records", type=int, default=500, help="records per transaction")
    p.add_argument("--search", help="print the ids matching this term and exit")
    args = p.parse_args(None if argv is None else list(argv))
    if args.search is not None:
        print(search(open_db(args.db), args.search))
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    index = SearchIndex(args.db, args.bootstrap, args.topic)
    try:
        while not stop.is_set():
            index.poll_once(max_records=args.max_records)
    finally:
        index.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
