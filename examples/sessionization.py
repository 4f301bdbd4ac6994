"""User sessions from page views: session windows of event time with a 30 s gap.

Run (a broker on 127.0.0.1:7410 and ``examples/demo_producer.py`` feeding it)::

    python examples/sessionization.py

A session is a run of one user's page views with gaps under 30 seconds
(``session_window``); once the watermark (1 minute) passes a session's end, its start,
end, duration and page count go to the topic ``user-sessions`` as JSON, keyed by user.
"""

from __future__ import annotations

from typing import Any

from _common import ensure_topics, parser, run, spark_session

OUTPUT = "user-sessions"


def start_queries(spark: Any, bootstrap: str, checkpoint_dir: str) -> list[Any]:
    from pyspark.sql import functions as f

    ensure_topics(bootstrap, [OUTPUT])
    views = (
        spark.readStream.format("tidelog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", "page-views")
        .option("startingOffsets", "earliest")
        .load()
        .withWatermark("timestamp", "1 minute")
    )
    sessions = (
        views.groupBy(f.session_window("timestamp", "30 seconds").alias("session"), "key")
        .agg(f.count("*").alias("pages"))
        .select(
            f.col("key"),
            f.to_json(
                f.struct(
                    f.col("key").cast("string").alias("user"),
                    f.col("session.start").alias("start"),
                    f.col("session.end").alias("end"),
                    (f.col("session.end").cast("long") - f.col("session.start").cast("long")).alias(
                        "seconds"
                    ),
                    "pages",
                )
            ).alias("value"),
        )
    )
    query = (
        sessions.writeStream.format("tidelog")
        .option("bootstrap.servers", bootstrap)
        .option("topic", OUTPUT)
        .option("checkpointLocation", f"{checkpoint_dir}/{OUTPUT}")
        .outputMode("append")
        .start()
    )
    return [query]


def main(argv: list[str] | None = None) -> None:
    args = parser("Sessionize page views per user.").parse_args(argv)
    spark = spark_session(args.master, "tidelog-sessionization")
    run(start_queries(spark, args.bootstrap, args.checkpoint_dir), args.run_seconds)


if __name__ == "__main__":
    main()
