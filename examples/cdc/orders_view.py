"""A materialized view joining two CDC tables (orders with customers), kept by Spark.

Run (a broker, a PostgreSQL loaded by ``shop.py`` and ``tidelog cdc postgres --tables
public.customers,public.orders,... --topic-prefix pg`` feeding it)::

    python examples/cdc/orders_view.py --bootstrap 127.0.0.1:7410 --prefix pg \
        --out views/orders [--checkpoint-dir checkpoints]

The connector keeps one compacted topic per table (``pg.public.customers``,
``pg.public.orders``; key = the primary key as JSON, value = a Debezium-style change, a
tombstone after each delete: docs/cdc.md). This job reads both from offset zero with
``isolation.level=read_committed`` (never a row of an unfinished or aborted transaction)
and keeps, as parquet under ``--out``:

- the **table state** of each side: the latest row per key (a change record ``c``/``u``/
  ``r`` sets it, ``d`` removes it);
- the **view**: ``shop.JOIN_SQL`` on those states, an inner join (an order whose customer
  is deleted leaves the view; it comes back if the customer does).

Each micro-batch (``foreachBatch``) merges its changes into the previous batch's state:
per side, the newest change per key in the batch (highest partition offset; a key lives in
one partition) replaces the old row or removes it. The result goes to a directory of its
own, ``batches/<batchId>/{customers,orders,view}``, and a ``_DONE`` file (batch id, the
highest commit LSN folded in) written last marks it complete; readers take the highest
complete batch (``read_view``). Spark re-runs a failed batch with the same ``batchId`` and
the same offsets, and that run starts again from the previous complete batch and overwrites
its own directory, so a batch is applied once however often it runs. Older batches are
pruned; the checkpoint holds the stream's offsets.

Tombstones are ignored: the ``d`` before each one already removed the row, and compaction
keeps a key's records as a suffix (the latest), so a key whose only record left is a
tombstone was deleted and simply never appears. Rebuilding is replaying: a new ``--out``
and a new checkpoint read both topics from offset zero and arrive at the same view
(``build_view`` does it as one batch job).

``build_view(..., as_of_lsn=L)`` is the view *as of a PostgreSQL LSN*: only snapshot rows
and changes of transactions committed before ``L`` (``source.lsn`` is the commit LSN), which
is exactly what a database snapshot taken at ``L`` holds (a replication slot's exported
snapshot at its consistent point ``L``: the test compares the two). It needs the history
back to ``L`` still in the topics: compaction may have dropped a row's older versions.

No Python UDFs: every step is a Spark expression, so executors need nothing of this file.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # _common (the Spark examples' session and arguments)

from _common import parser, run, spark_session  # noqa: E402

SIDES = {
    "customers": "id INT, name STRING, email STRING",
    "orders": "id INT, customer_id INT, total_cents BIGINT, status STRING",
}
"""The columns of each joined table (as the connector writes them: ints as JSON numbers)."""

DONE = "_DONE"


def topic_of(prefix: str, table: str) -> str:
    return f"{prefix}.public.{table}"


def _lsn_number(text: Any) -> Any:
    """PostgreSQL's ``X/Y`` LSN spelling as a 64-bit number (a Spark expression)."""
    from pyspark.sql import functions as f

    parts = f.split(text, "/")
    high = f.conv(parts.getItem(0), 16, 10).cast("long")
    low = f.conv(parts.getItem(1), 16, 10).cast("long")
    return f.shiftleft(high, 32) + low


def changes(records: Any, table: str) -> Any:
    """The tidelog source's rows of one table's topic as changes: ``key``, ``op``, ``lsn``
    (a number), ``snapshot``, ``partition``, ``offset`` and the row's columns (null for a
    delete). Tombstones are left out (see the module docstring)."""
    from pyspark.sql import functions as f

    schema = (
        f"op STRING, after STRUCT<{_struct_fields(SIDES[table])}>, "
        "source STRUCT<lsn: STRING, snapshot: BOOLEAN>"
    )
    parsed = records.where("value IS NOT NULL").select(
        f.col("key").cast("string").alias("key"),
        f.col("partition"),
        f.col("offset"),
        f.from_json(f.col("value").cast("string"), schema).alias("e"),
    )
    columns = [name.split()[0] for name in SIDES[table].split(", ")]
    return parsed.select(
        "key",
        "partition",
        "offset",
        f.col("e.op").alias("op"),
        _lsn_number(f.col("e.source.lsn")).alias("lsn"),
        f.col("e.source.snapshot").alias("snapshot"),
        *[f.col(f"e.after.{c}").alias(c) for c in columns],
    )


def _struct_fields(columns: str) -> str:
    return ", ".join(": ".join(c.split(" ", 1)) for c in columns.split(", "))


def newest_per_key(change_rows: Any) -> Any:
    """The last change of every key (highest partition, then offset)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as f

    newest = Window.partitionBy("key").orderBy(f.col("partition").desc(), f.col("offset").desc())
    return change_rows.withColumn("_rank", f.row_number().over(newest)).where("_rank = 1")


def state_columns(table: str) -> list[str]:
    return ["key", *[name.split()[0] for name in SIDES[table].split(", ")]]


def merge(previous: Any, batch_changes: Any, table: str) -> Any:
    """``previous`` state (``key`` + columns) with the batch's changes applied: a key the
    batch touches takes its newest change (a delete removes it), other keys stay."""
    newest = newest_per_key(batch_changes)
    kept = previous.join(newest.select("key"), on="key", how="left_anti")
    return kept.unionByName(newest.where("op <> 'd'").select(*state_columns(table)))


def join_view(customers: Any, orders: Any) -> Any:
    """``shop.JOIN_SQL`` on two table states."""
    from pyspark.sql import functions as f

    o, c = orders.alias("o"), customers.alias("c")
    return o.join(c, f.col("o.customer_id") == f.col("c.id"), "inner").select(
        f.col("o.id").alias("order_id"),
        f.col("o.customer_id").alias("customer_id"),
        f.col("c.name").alias("customer_name"),
        f.col("c.email").alias("email"),
        f.col("o.total_cents").alias("total_cents"),
        f.col("o.status").alias("status"),
    )


def _read_options(reader: Any, bootstrap: str, topics: str) -> Any:
    return (
        reader.format("tidelog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topics)
        .option("startingOffsets", "earliest")
        .option("isolation.level", "read_committed")
    )


def build_view(spark: Any, bootstrap: str, prefix: str, as_of_lsn: int | None = None) -> Any:
    """The view rebuilt in one batch job from offset zero of both topics (to their last
    stable offsets now); with ``as_of_lsn`` only what was committed before that LSN."""
    states = {}
    for table in SIDES:
        rows = changes(_read_options(spark.read, bootstrap, topic_of(prefix, table)).load(), table)
        if as_of_lsn is not None:
            rows = rows.where(f"snapshot OR lsn < {int(as_of_lsn)}")
        empty = spark.createDataFrame([], f"key STRING, {SIDES[table]}")
        states[table] = merge(empty, rows, table)
    return join_view(states["customers"], states["orders"])


# --- the streaming job --------------------------------------------------------------------


def _complete_batches(out: Path) -> list[int]:
    batches = out / "batches"
    if not batches.is_dir():
        return []
    return sorted(int(d.name) for d in batches.iterdir() if (d / DONE).is_file())


def view_lsn(out: str) -> int | None:
    """The highest commit LSN folded into the newest complete batch (None before one)."""
    done = _complete_batches(Path(out))
    if not done:
        return None
    info = json.loads((Path(out) / "batches" / f"{done[-1]:012d}" / DONE).read_text())
    lsn: int | None = info["lsn"]
    return lsn


def read_view(spark: Any, out: str) -> Any:
    """The newest complete view under ``out`` (None before the first batch)."""
    done = _complete_batches(Path(out))
    if not done:
        return None
    return spark.read.parquet(str(Path(out) / "batches" / f"{done[-1]:012d}" / "view"))


def update_batch(spark: Any, prefix: str, out: str, batch: Any, batch_id: int) -> None:
    """One micro-batch: previous complete state + this batch's changes -> a new state and
    view in ``batches/<batch_id>``, ``_DONE`` last. Idempotent for a re-run ``batch_id``."""
    from pyspark.sql import functions as f

    root = Path(out)
    here = root / "batches" / f"{batch_id:012d}"
    earlier = [b for b in _complete_batches(root) if b < batch_id]
    previous = root / "batches" / f"{earlier[-1]:012d}" if earlier else None
    previous_lsn = 0
    if previous is not None:
        previous_lsn = json.loads((previous / DONE).read_text())["lsn"] or 0
    if (here / DONE).exists():
        (here / DONE).unlink()  # a re-run: rebuild this batch from the one before
    batch = batch.cache()
    try:
        highest = previous_lsn
        for table in SIDES:
            rows = changes(batch.where(f.col("topic") == topic_of(prefix, table)), table)
            if previous is None:
                old = spark.createDataFrame([], f"key STRING, {SIDES[table]}")
            else:
                old = spark.read.parquet(str(previous / table))
            merge(old, rows, table).write.mode("overwrite").parquet(str(here / table))
            top = rows.agg(f.max("lsn")).first()
            if top is not None and top[0] is not None:
                highest = max(highest, int(top[0]))
        view = join_view(
            spark.read.parquet(str(here / "customers")), spark.read.parquet(str(here / "orders"))
        )
        view.write.mode("overwrite").parquet(str(here / "view"))
    finally:
        batch.unpersist()
    tmp = here / (DONE + ".tmp")
    tmp.write_text(json.dumps({"batch_id": batch_id, "lsn": highest}))
    os.replace(tmp, here / DONE)
    for old_id in earlier[:-1]:  # keep the previous batch until this one is done
        shutil.rmtree(root / "batches" / f"{old_id:012d}", ignore_errors=True)


def start_view(
    spark: Any, bootstrap: str, prefix: str, out: str, checkpoint_dir: str, **trigger: Any
) -> Any:
    """Start the streaming job; returns the query. ``trigger``: e.g. ``availableNow=True``."""
    topics = ",".join(topic_of(prefix, table) for table in SIDES)
    stream = _read_options(spark.readStream, bootstrap, topics).load()
    writer = stream.writeStream.foreachBatch(
        lambda batch, batch_id: update_batch(spark, prefix, out, batch, batch_id)
    ).option("checkpointLocation", checkpoint_dir)
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()


def main(argv: list[str] | None = None) -> None:
    p = parser("the orders-with-customers view over the CDC topics, as parquet")
    p.add_argument("--prefix", default=os.environ.get("CDC_TOPIC_PREFIX", "pg"))
    p.add_argument("--out", default=os.environ.get("VIEW_DIR", "views/orders"))
    args = p.parse_args(argv)
    spark = spark_session(args.master, "tidelog-cdc-orders-view")
    query = start_view(
        spark, args.bootstrap, args.prefix, args.out, f"{args.checkpoint_dir}/orders-view"
    )
    run([query], args.run_seconds)


if __name__ == "__main__":
    main()
