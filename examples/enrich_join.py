"""Enrich page views with user profiles from a compacted topic read from offset zero.

Run (a broker on 127.0.0.1:7410 and ``examples/demo_producer.py`` feeding it)::

    python examples/enrich_join.py

The table: ``users`` is a compacted topic (key = user, value = profile JSON). A batch
read from offset zero (``spark.read``, ``startingOffsets=earliest``) sees at most a few
versions per key, since compaction keeps the latest record of every key; the job keeps
the record with the highest offset per key and drops tombstones, which rebuilds the
current table whatever compaction has or has not done yet. The stream: ``page-views``.
Each view is joined with its user's profile (a stream-static join; the table is read
when the query starts, so restart the job to pick up profile changes) and written as
JSON to ``page-views-enriched``, keyed by user.
"""

from __future__ import annotations

from typing import Any

from _common import ensure_topics, parser, run, spark_session

OUTPUT = "page-views-enriched"


def user_table(spark: Any, bootstrap: str) -> Any:
    """The latest profile per user: the highest offset per key, tombstones dropped."""
    from pyspark.sql import Window
    from pyspark.sql import functions as f

    records = (
        spark.read.format("tidelog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", "users")
        .option("startingOffsets", "earliest")
        .load()
    )
    newest = Window.partitionBy("key").orderBy(f.col("partition").desc(), f.col("offset").desc())
    profile = "struct<user:string,country:string,plan:string>"
    return (
        records.withColumn("rank", f.row_number().over(newest))
        .where("rank = 1 AND value IS NOT NULL")
        .select(
            f.col("key").alias("user_key"),
            f.from_json(f.col("value").cast("string"), profile).alias("profile"),
        )
    )


def start_queries(spark: Any, bootstrap: str, checkpoint_dir: str) -> list[Any]:
    from pyspark.sql import functions as f

    ensure_topics(bootstrap, [OUTPUT])
    users = user_table(spark, bootstrap).cache()
    views = (
        spark.readStream.format("tidelog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", "page-views")
        .option("startingOffsets", "earliest")
        .load()
    )
    view = "struct<user:string,page:string,ms:long>"
    enriched = views.join(users, views.key == users.user_key, "left").select(
        f.col("key"),
        f.to_json(
            f.struct(
                f.from_json(f.col("value").cast("string"), view).alias("view"),
                f.col("profile"),
            )
        ).alias("value"),
    )
    query = (
        enriched.writeStream.format("tidelog")
        .option("bootstrap.servers", bootstrap)
        .option("topic", OUTPUT)
        .option("checkpointLocation", f"{checkpoint_dir}/{OUTPUT}")
        .start()
    )
    return [query]


def main(argv: list[str] | None = None) -> None:
    args = parser("Join page views with user profiles.").parse_args(argv)
    spark = spark_session(args.master, "tidelog-enrich-join")
    run(start_queries(spark, args.bootstrap, args.checkpoint_dir), args.run_seconds)


if __name__ == "__main__":
    main()
