"""examples/cdc/orders_view.py against a real PostgreSQL, the real connector and a broker:
the orders-with-customers view, rebuilt from offset zero, equals the database's join at
the same LSN, row for row; the streaming job keeps it equal as changes go on.

One test (Spark is slow here): the PostgreSQL fixtures are tests/cdc's, the SparkSession
and the broker this directory's.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.cdc import conftest as cdc_fixtures
from tests.cdc.views import examples, running_connector
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient
from tidelog.client.cdc import ConnectorConfig

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

postgres = cdc_fixtures.postgres
dsn = cdc_fixtures.dsn

SLOT = "orders_view"
PREFIX = "cdcview"


def _rows(df: Any) -> set[tuple[Any, ...]]:
    return {tuple(row) for row in df.collect()}


def _database_join(shop: Any, dsn: str) -> set[tuple[Any, ...]]:
    conn = shop.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            return shop.join_rows(cur)  # type: ignore[no-any-return]
    finally:
        conn.close()


def _records(broker: InProcessBroker, view: Any, shop: Any) -> int:
    """How many offsets both joined topics hold now."""
    with AdminClient(broker.address) as admin:
        return sum(
            p.high_watermark
            for table in view.SIDES
            for p in admin.describe_topic(view.topic_of(PREFIX, table)).partitions
        )


def test_orders_view_from_offset_zero_equals_the_database_join_at_the_same_lsn(
    spark: Any, broker: InProcessBroker, dsn: str, tmp_path: Path
) -> None:
    with examples("shop", "orders_view") as modules:
        shop, view = modules["shop"], modules["orders_view"]
        shop.create_schema(dsn)
        load = shop.ShopLoad(dsn, seed=30)
        load.seed(customers=60, orders=300, products=0)
        config = ConnectorConfig(
            dsn=dsn,
            bootstrap_servers=broker.address,
            tables=shop.TABLES,
            slot=SLOT,
            topic_prefix=PREFIX,
            offsets_topic=f"{PREFIX}-offsets",
        )
        try:
            with running_connector(config):
                load.run(150, catalog=False)  # streamed after the snapshot
                # The database exactly at an LSN, taken while more transactions commit.
                writer = threading.Thread(target=load.run, args=(150,), kwargs={"catalog": False})
                writer.start()
                at_lsn, lsn = shop.join_at_consistent_point(dsn)
                writer.join()
                # The writer may have finished before the slot's consistent point; these
                # commit after it, so the view's LSN passes it and the two joins differ.
                load.run(20, catalog=False)
                shop.wait_captured(dsn, SLOT)

                # The streaming job from offset zero: the join as it is now.
                now = _database_join(shop, dsn)
                out, checkpoint = str(tmp_path / "view"), str(tmp_path / "checkpoint")
                query = view.start_view(spark, broker.address, PREFIX, out, checkpoint)
                try:
                    query.processAllAvailable()
                finally:
                    query.stop()
                assert _rows(view.read_view(spark, out)) == now
                assert (view.view_lsn(out) or 0) >= lsn

                # More changes; the job restarts from its checkpoint and merges only them.
                before = _records(broker, view, shop)
                load.run(100, catalog=False)
                shop.wait_captured(dsn, SLOT)
                added = _records(broker, view, shop) - before
                now = _database_join(shop, dsn)
                query = view.start_view(spark, broker.address, PREFIX, out, checkpoint)
                try:
                    query.processAllAvailable()
                    read = sum(p["numInputRows"] for p in query.recentProgress)
                finally:
                    query.stop()
                assert _rows(view.read_view(spark, out)) == now
                assert 0 < read <= added < before  # the new changes only, not the topics again

                # Rebuilt: a new output and checkpoint replay both topics from offset zero.
                rebuilt = str(tmp_path / "rebuilt")
                query = view.start_view(
                    spark, broker.address, PREFIX, rebuilt, str(tmp_path / "ck2"), availableNow=True
                )
                query.awaitTermination(300)
                assert _rows(view.read_view(spark, rebuilt)) == now

                # Replayed from offset zero, only what committed before the LSN taken
                # mid-load: the database's rows at that LSN, though the topics hold more.
                as_of = _rows(view.build_view(spark, broker.address, PREFIX, as_of_lsn=lsn))
                assert len(at_lsn) > 100
                assert at_lsn != now
                assert as_of == at_lsn

                # A micro-batch Spark runs again (same id, same rows) starts from the batch
                # before it, not from its own half-written output: the same view.
                records = (
                    spark.read.format("tidelog")
                    .option("bootstrap.servers", broker.address)
                    .option("subscribe", ",".join(view.topic_of(PREFIX, t) for t in view.SIDES))
                    .option("isolation.level", "read_committed")
                    .load()
                    .cache()
                )
                rerun = str(tmp_path / "rerun")
                first, second = records.where("offset < 400"), records.where("offset >= 400")
                view.update_batch(spark, PREFIX, rerun, first, 0)
                view.update_batch(spark, PREFIX, rerun, second, 1)
                view.update_batch(spark, PREFIX, rerun, second, 1)
                assert _rows(view.read_view(spark, rerun)) == now
                records.unpersist()
        finally:
            load.close()
