"""Spark benchmark: a streaming read of a topic against ``spark.read.parquet`` of the same rows.

::

    python benchmarks/spark_bench.py [--records 500000] [--partitions 2] [--quick]

One broker process (``python -m broker``, a temporary data directory, 127.0.0.1) and one
``local[2]`` SparkSession, in the same run:

1. load: ``--records`` records (16-byte unique key, 100-byte value) produced to a topic of
   ``--partitions`` partitions;
2. stream: ``spark.readStream.format("tidelog")`` from offset zero into the ``noop`` sink
   with ``Trigger.AvailableNow``: records per second over the query's wall time (start
   to termination), and over the batches' own ``triggerExecution`` time;
3. parquet: the same rows (key, value, topic, partition, offset, timestamp, timestampType,
   read once with ``spark.read.format("tidelog")``) written to local parquet, then
   ``spark.read.parquet`` of them into the ``noop`` sink: records per second;
4. a batch read ``spark.read.format("tidelog")`` into ``noop``, for reference;
5. the source's reader alone, outside Spark: ``spark_sink.reader.read_ranges`` over
   partition 0 in this process (what one Spark task does, minus Spark): records per
   second a partition;
6. the ceiling: a Python data source with the same schema yielding pre-built Arrow
   batches of the same rows (``benchmarks/spark_ceiling.py``: written by the reader to
   Arrow IPC files beforehand, memory-mapped; no broker, no decoding) read with
   ``spark.read`` into ``noop``: what Spark's Python data source machinery allows;
7. the streaming ceiling: the same source with ``spark.readStream`` and
   ``Trigger.AvailableNow`` (what Spark's Python streaming machinery allows, with
   nothing of Tidelog's in it).

The codec in use (the C extension, or the pure-Python one with ``TIDELOG_PURE_PYTHON=1``,
which the broker and Spark's Python workers inherit) is printed and in the JSON.

Each timed step runs once on a small warm-up topic first (Python workers, JIT). The
machine is shared and has 2 cores, which the broker, the Spark JVM and its Python workers
share. The last line is one JSON object, with ``stream_records_per_s``,
``batch_records_per_s``, ``ceiling_records_per_s``, ``parquet_records_per_s`` and the
ratios ``stream_over_ceiling``, ``batch_over_ceiling``, ``stream_over_parquet``; also
``stream_startup_s`` (``start()`` to the first trigger: Spark starting a fresh Python
process for the source's driver side), ``stream_trigger_s`` (summed ``triggerExecution``),
``stream_over_ceiling_trigger_time`` (the stream's rate over its trigger time against
the ceiling), ``stream_ceiling_records_per_s``, ``stream_ceiling_over_ceiling`` and
``stream_over_stream_ceiling``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tidelog.client import AdminClient, Producer  # noqa: E402
from tidelog.storage.native import NATIVE  # noqa: E402

KEY_BYTES = 16
VALUE_BYTES = 100


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_broker(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    address = f"127.0.0.1:{_free_port()}"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidelog.broker",
            "serve",
            "--listen",
            address,
            "--data-dir",
            str(data_dir),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with AdminClient(address, request_timeout_ms=1_000) as admin:
                admin.list_topics()
            return process, address
        except Exception:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.2)


def _load(address: str, topic: str, records: int, partitions: int) -> float:
    with AdminClient(address) as admin:
        admin.create_topic(topic, partitions)
    value = b"v" * VALUE_BYTES
    started = time.perf_counter()
    with Producer(address, acks=1) as producer:
        for i in range(records):
            producer.send(
                topic, value=value, key=i.to_bytes(KEY_BYTES, "big"), partition=i % partitions
            )
        producer.flush()
    return time.perf_counter() - started


def _spark() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tidelog-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _available_now(df: Any, checkpoint: Path) -> tuple[float, float, int, float]:
    """Run ``df`` into the ``noop`` sink with ``Trigger.AvailableNow``: wall seconds,
    summed ``triggerExecution`` seconds, rows read, and the seconds from ``start()`` to
    the first trigger."""
    started = time.perf_counter()
    started_at = time.time()
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    wall = time.perf_counter() - started
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    busy = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    first = (
        datetime.fromisoformat(progress[0]["timestamp"].replace("Z", "+00:00")).timestamp()
        if progress
        else started_at
    )
    return wall, busy, rows, max(first - started_at, 0.0)


def _stream(
    spark: Any, address: str, topic: str, checkpoint: Path
) -> tuple[float, float, int, float]:
    """Wall seconds, summed triggerExecution seconds, rows read, and the seconds from
    ``start()`` to the first trigger (the query's start-up: Spark launches a fresh Python
    process for the source's driver side, which imports pyspark and the source)."""
    df = (
        spark.readStream.format("tidelog")
        .option("bootstrap.servers", address)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    return _available_now(df, checkpoint)


def _batch_read(spark: Any, address: str, topic: str) -> float:
    started = time.perf_counter()
    (
        spark.read.format("tidelog")
        .option("bootstrap.servers", address)
        .option("subscribe", topic)
        .load()
        .write.format("noop")
        .mode("overwrite")
        .save()
    )
    return time.perf_counter() - started


def _parquet(spark: Any, address: str, topic: str, path: Path) -> float:
    (
        spark.read.format("tidelog")
        .option("bootstrap.servers", address)
        .option("subscribe", topic)
        .load()
        .write.mode("overwrite")
        .parquet(str(path))
    )
    started = time.perf_counter()
    spark.read.parquet(str(path)).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def _reader_alone(address: str, topic: str) -> tuple[float, int]:
    """``read_ranges`` over the whole of partition 0: (seconds, rows)."""
    from tidelog.client import AdminClient, TopicPartition
    from tidelog.spark_sink.offsets import OffsetRange
    from tidelog.spark_sink.options import ReadOptions
    from tidelog.spark_sink.reader import read_ranges

    with AdminClient(address) as admin:
        partitions = admin.describe_topic(topic).partitions
        end = next(p.log_end_offset for p in partitions if p.partition == 0)
    options = ReadOptions.from_mapping(
        {"bootstrap.servers": address, "subscribe": topic}, streaming=False
    )
    ranges = [OffsetRange(TopicPartition(topic, 0), 0, end)]
    started = time.perf_counter()
    rows = sum(batch.num_rows for batch in read_ranges(options, ranges, [0]))
    return time.perf_counter() - started, rows


def _ceiling(spark: Any, address: str, topic: str, partitions: int, work: Path) -> float:
    """Seconds for ``spark.read`` of the ceiling source over ``topic``'s rows."""
    from benchmarks.spark_ceiling import CeilingDataSource, write_partition_files
    from tidelog.client import TopicPartition
    from tidelog.spark_sink.offsets import OffsetRange
    from tidelog.spark_sink.options import ReadOptions
    from tidelog.spark_sink.reader import read_ranges

    options = ReadOptions.from_mapping(
        {"bootstrap.servers": address, "subscribe": topic}, streaming=False
    )
    with AdminClient(address) as admin:
        ends = {p.partition: p.log_end_offset for p in admin.describe_topic(topic).partitions}
    directory = work / f"ceiling-{topic}"
    directory.mkdir()
    paths = write_partition_files(
        [
            read_ranges(options, [OffsetRange(TopicPartition(topic, p), 0, ends[p])], [0])
            for p in range(partitions)
        ],
        directory,
    )
    spark.dataSource.register(CeilingDataSource)
    started = time.perf_counter()
    (
        spark.read.format("tidelog_ceiling")
        .option("paths", ",".join(paths))
        .load()
        .write.format("noop")
        .mode("overwrite")
        .save()
    )
    return time.perf_counter() - started


def _stream_ceiling(
    spark: Any, topic: str, work: Path, checkpoint: Path
) -> tuple[float, float, int]:
    """Wall seconds, seconds before the first trigger and rows of ``spark.readStream`` of the
    ceiling source over the files ``_ceiling`` wrote for ``topic``: Spark's streaming
    machinery with nothing of Tidelog's in it."""
    paths = sorted(str(p) for p in (work / f"ceiling-{topic}").glob("partition-*.arrow"))
    df = spark.readStream.format("tidelog_ceiling").option("paths", ",".join(paths)).load()
    wall, _busy, rows, startup = _available_now(df, checkpoint)
    return wall, startup, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="50,000 records")
    args = parser.parse_args()
    records = 50_000 if args.quick else args.records
    work = Path(tempfile.mkdtemp(prefix="tidelog-spark-bench-"))
    broker, address = _start_broker(work / "data")
    try:
        load_s = _load(address, "bench", records, args.partitions)
        _load(address, "warmup", 10_000, args.partitions)
        print(f"loaded {records} records in {load_s:.1f} s", flush=True)
        spark = _spark()
        _stream(spark, address, "warmup", work / "ck-warmup")
        _parquet(spark, address, "warmup", work / "warmup.parquet")
        _batch_read(spark, address, "warmup")
        _ceiling(spark, address, "warmup", args.partitions, work)
        _stream_ceiling(spark, "warmup", work, work / "ck-ceiling-warmup")

        wall, busy, rows, startup = _stream(spark, address, "bench", work / "ck-bench")
        assert rows == records, (rows, records)
        parquet_s = _parquet(spark, address, "bench", work / "bench.parquet")
        batch_s = _batch_read(spark, address, "bench")
        _reader_alone(address, "warmup")
        reader_s, reader_rows = _reader_alone(address, "bench")
        ceiling_s = _ceiling(spark, address, "bench", args.partitions, work)
        stream_ceiling_s, stream_ceiling_startup, ceiling_rows = _stream_ceiling(
            spark, "bench", work, work / "ck-ceiling-bench"
        )
        assert ceiling_rows == records, (ceiling_rows, records)
        stream_ceiling_rate = records / stream_ceiling_s
        stream_rate, batch_rate = records / wall, records / batch_s
        ceiling_rate, parquet_rate = records / ceiling_s, records / parquet_s
        result = {
            "records": records,
            "partitions": args.partitions,
            "codec": "C" if NATIVE else "pure-Python",
            "stream_records_per_s": round(stream_rate),
            "stream_records_per_s_trigger_time": round(records / busy) if busy else None,
            "stream_wall_s": round(wall, 2),
            "stream_startup_s": round(startup, 2),
            "stream_trigger_s": round(busy, 2),
            "parquet_records_per_s": round(records / parquet_s),
            "parquet_s": round(parquet_s, 2),
            "batch_read_records_per_s": round(records / batch_s),
            "stream_vs_parquet": round(parquet_s / wall, 3),
            "reader_alone_records_per_s_per_partition": round(reader_rows / reader_s),
            "batch_records_per_s": round(batch_rate),
            "ceiling_records_per_s": round(ceiling_rate),
            "stream_over_ceiling": round(stream_rate / ceiling_rate, 3),
            "batch_over_ceiling": round(batch_rate / ceiling_rate, 3),
            "stream_over_parquet": round(stream_rate / parquet_rate, 3),
            "stream_over_ceiling_trigger_time": round(records / busy / ceiling_rate, 3)
            if busy
            else None,
            "stream_ceiling_records_per_s": round(stream_ceiling_rate),
            "stream_ceiling_startup_s": round(stream_ceiling_startup, 2),
            "stream_ceiling_over_ceiling": round(stream_ceiling_rate / ceiling_rate, 3),
            "stream_over_stream_ceiling": round(stream_rate / stream_ceiling_rate, 3),
        }
        print(
            f"stream  {result['stream_records_per_s']:>10,} records/s  ({wall:.1f} s wall, "
            f"{busy:.1f} s in triggers, {startup:.1f} s before the first)\n"
            f"parquet {result['parquet_records_per_s']:>10,} records/s  ({parquet_s:.1f} s)\n"
            f"batch   {result['batch_read_records_per_s']:>10,} records/s  ({batch_s:.1f} s)\n"
            f"ceiling {result['ceiling_records_per_s']:>10,} records/s  ({ceiling_s:.1f} s: "
            "pre-built Arrow batches, no broker)\n"
            f"stream ceiling {result['stream_ceiling_records_per_s']:>10,} records/s  "
            f"({stream_ceiling_s:.1f} s; {stream_ceiling_startup:.1f} s before the first "
            "trigger: the same batches through readStream)\n"
            f"reader  {result['reader_alone_records_per_s_per_partition']:>10,} records/s "
            f"a partition, outside Spark\n"
            f"codec {result['codec']}: stream/ceiling {result['stream_over_ceiling']}, "
            f"batch/ceiling {result['batch_over_ceiling']}, "
            f"stream/parquet {result['stream_over_parquet']}"
        )
        spark.stop()
        print(json.dumps(result))
    finally:
        broker.terminate()
        broker.wait(30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
