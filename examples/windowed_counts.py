"""Page views per user in tumbling and hopping windows of event time, with a watermark.

Run (a broker on 127.0.0.1:7410 and ``examples/demo_producer.py`` feeding it)::

    python examples/windowed_counts.py

Reads ``page-views`` (the record timestamp is the event time), drops events more than 30 s
late (watermark), counts per user in tumbling 1-minute windows and in hopping 1-minute
windows every 20 s, and writes each window's final count (append mode: once the
watermark passed the window's end) as JSON to ``page-view-counts-tumbling`` and
``page-view-counts-hopping``, keyed by user. The sink writes effectively once: a
micro-batch Spark re-runs after a failure adds no duplicate counts.
"""

from __future__ import annotations

from typing import Any

from _common import ensure_topics, parser, run, spark_session

OUTPUTS = ("page-view-counts-tumbling", "page-view-counts-hopping")


def start_queries(spark: Any, bootstrap: str, checkpoint_dir: str) -> list[Any]:
    from pyspark.sql import functions as f

    ensure_topics(bootstrap, OUTPUTS)
    views = (
        spark.readStream.format("tidelog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", "page-views")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "10000")
        .load()
        .withWatermark("timestamp", "30 seconds")
    )
    windows = {
        OUTPUTS[0]: f.window("timestamp", "1 minute"),
        OUTPUTS[1]: f.window("timestamp", "1 minute", "20 seconds"),
    }
    queries = []
    for topic, window in windows.items():
        counts = (
            views.groupBy(window.alias("window"), f.col("key"))
            .count()
            .select(
                f.col("key"),
                f.to_json(
                    f.struct(
                        f.col("key").cast("string").alias("user"),
                        f.col("window.start").alias("start"),
                        f.col("window.end").alias("end"),
                        "count",
                    )
                ).alias("value"),
            )
        )
        queries.append(
            counts.writeStream.format("tidelog")
            .option("bootstrap.servers", bootstrap)
            .option("topic", topic)
            .option("checkpointLocation", f"{checkpoint_dir}/{topic}")
            .outputMode("append")
            .start()
        )
    return queries


def main(argv: list[str] | None = None) -> None:
    args = parser("Windowed page-view counts per user.").parse_args(argv)
    spark = spark_session(args.master, "tidelog-windowed-counts")
    run(start_queries(spark, args.bootstrap, args.checkpoint_dir), args.run_seconds)


if __name__ == "__main__":
    main()
