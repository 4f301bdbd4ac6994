"""Phones with wrong clocks: event counts per minute by device time and by corrected time.

Run (a broker on 127.0.0.1:7410)::

    python examples/device_clocks.py

Six phones whose clocks are off by minutes to hours (one behind by two hours, one ahead by
four) record events over the last few minutes while offline, and send them all when they
come back online. Each record keeps three times (``DESIGN.md``, "Three timestamps per
record"): its own timestamp (the phone's clock when the event happened), the time the
phone sent it (the phone's clock) and the time the broker received it (the broker's
clock). The corrected time, ``timestamp + received - sent``, moves each event onto the
broker's clock: the phone's offset cancels out, the time it spent buffered stays.

A Spark batch job then counts events per 1-minute tumbling window twice, by the raw
``timestamp`` column and by ``correctedTimestamp``, and prints both tables side by side:
by raw time the events scatter over windows hours apart; by corrected time they fall in
the few minutes in which they really happened.
"""

from __future__ import annotations

import random
import time
from typing import Any

from _common import ensure_topics, parser, spark_session

from tidelog import Producer

TOPIC = "device-events"
MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
# Each phone's clock offset from true time.
SKEWS_MS = {
    "phone-a": -2 * HOUR_MS,
    "phone-b": -15 * MINUTE_MS,
    "phone-c": 0,
    "phone-d": 3 * MINUTE_MS,
    "phone-e": 45 * MINUTE_MS,
    "phone-f": 4 * HOUR_MS,
}


def send_events(bootstrap: str, events_per_phone: int = 40, seed: int = 7) -> int:
    """Each phone records ``events_per_phone`` events over the last five minutes (true
    time) while offline, then sends them; returns how many were sent."""
    rng = random.Random(seed)
    ensure_topics(bootstrap, [TOPIC], partitions=2)
    sent = 0
    for phone, skew_ms in SKEWS_MS.items():

        def phone_clock(skew_ms: int = skew_ms) -> int:
            return time.time_ns() // 1_000_000 + skew_ms

        with Producer(bootstrap, linger_ms=20, wall_clock=phone_clock) as producer:
            now_on_phone = phone_clock()
            # Buffered offline: each event happened some time ago, stamped by the phone.
            for _ in range(events_per_phone):
                happened = now_on_phone - rng.randrange(0, 5 * MINUTE_MS)
                producer.send(TOPIC, key=phone.encode(), value=b"tap", timestamp_ms=happened)
                sent += 1
            producer.flush(timeout_ms=30_000)
    return sent


def window_counts(spark: Any, bootstrap: str) -> tuple[list[Any], list[Any]]:
    """Counts per 1-minute window by raw and by corrected time (rows of start, count)."""
    from pyspark.sql import functions as f

    events = (
        spark.read.format("tidelog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", TOPIC)
        .load()
    )

    def per_minute(column: str) -> list[Any]:
        return (
            events.groupBy(f.window(column, "1 minute").alias("window"))
            .count()
            .select(f.col("window.start").alias("start"), "count")
            .orderBy("start")
            .collect()
        )

    return per_minute("timestamp"), per_minute("correctedTimestamp")


def side_by_side(raw: list[Any], corrected: list[Any]) -> str:
    """Both tables, one next to the other."""
    left = [f"{'window (raw device time)':<26}{'events':>7}"]
    left += [f"{row['start']:%Y-%m-%d %H:%M}{'':<10}{row['count']:>7}" for row in raw]
    right = [f"{'window (corrected time)':<26}{'events':>7}"]
    right += [f"{row['start']:%Y-%m-%d %H:%M}{'':<10}{row['count']:>7}" for row in corrected]
    height = max(len(left), len(right))
    left += [""] * (height - len(left))
    right += [""] * (height - len(right))
    return "\n".join(f"{a:<36}| {b}" for a, b in zip(left, right, strict=True))


def main(argv: list[str] | None = None) -> None:
    args = parser("Event counts per minute by device time and by corrected time.").parse_args(argv)
    count = send_events(args.bootstrap)
    print(f"sent {count} events from {len(SKEWS_MS)} phones")
    spark = spark_session(args.master, "tidelog-device-clocks")
    raw, corrected = window_counts(spark, args.bootstrap)
    print(side_by_side(raw, corrected))


if __name__ == "__main__":
    main()
