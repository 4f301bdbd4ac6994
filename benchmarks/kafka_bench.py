"""Kafka listener benchmark: confluent-kafka through the Kafka listener against Tidelog's
own gRPC client, in the same run, against one broker process.

::

    python benchmarks/kafka_bench.py [--records 200000] [--latency-samples 1000] [--quick]

One broker process (``python -m broker``, a temporary data directory, 127.0.0.1, metrics
off, ``kafka.listen`` on a free port). This process then measures, one after the other:

1. ``kafka_produce_records_per_s``: confluent-kafka (librdkafka) produces ``--records``
   records (16-byte key, 100-byte value, ``acks=1``, ``linger.ms=5``) and flushes;
2. ``kafka_consume_records_per_s``: a confluent-kafka consumer reads them back by assign
   from offset zero;
3. ``kafka_p50_ms`` / ``kafka_p99_ms``: single-record produce latency through the Kafka
   listener (``acks=1``, ``linger.ms=0``, each record flushed before the next);
4. ``grpc_p50_ms`` / ``grpc_p99_ms``: the same with Tidelog's ``Producer`` over gRPC
   (``acks=1``, ``linger_ms=0``, each ``send`` waited for);
5. ``kafka_over_grpc_p50``: the ratio (the issue's target: at most 0.5).

The machine is shared and noisy: compare figures of one run only. The last line printed
is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import confluent_kafka  # noqa: E402 - after the path entry above

from tidelog import client  # noqa: E402

KEY_BYTES = 16
VALUE_BYTES = 100
TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_broker(
    work: Path, settings: Mapping[str, object] | None = None
) -> tuple[subprocess.Popen[str], str, str]:
    """The broker process, its gRPC address and its Kafka bootstrap address; ``settings``
    are more broker keys (``--set``)."""
    ready = work / "ready"
    kafka_port = _free_port()
    extra = [arg for key, value in (settings or {}).items() for arg in ("--set", f"{key}={value}")]
    process = subprocess.Popen(
        [
            sys.executable, "-m", "tidelog.broker", "--data-dir", str(work / "data"),
            "--listen", "127.0.0.1:0", "--ready-file", str(ready), "--log-level", "WARNING",
            "--set", "metrics.port=-1", "--set", f"kafka.listen=127.0.0.1:{kafka_port}", *extra,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the broker did not start")
        time.sleep(0.02)
    return process, ready.read_text().strip(), f"127.0.0.1:{kafka_port}"


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def kafka_produce(bootstrap: str, topic: str, records: int) -> float:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "enable.idempotence": False}
    )
    value = b"v" * VALUE_BYTES
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, key=i.to_bytes(KEY_BYTES, "big"), partition=0)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(TIMEOUT_S)
    elapsed = time.perf_counter() - started
    if left:
        raise RuntimeError(f"{left} records not delivered")
    return records / elapsed


def kafka_consume(bootstrap: str, topic: str, records: int) -> float:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        got = 0
        started = time.perf_counter()
        deadline = time.monotonic() + TIMEOUT_S
        while got < records and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is None:
                    got += 1
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if got < records:
        raise RuntimeError(f"read {got} of {records} records")
    return records / elapsed


def kafka_latency(bootstrap: str, topic: str, samples: int) -> list[float]:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0, "enable.idempotence": False}
    )
    producer.produce(topic, value=b"warm-up", partition=0)
    producer.flush(TIMEOUT_S)
    out = []
    for i in range(samples):
        started = time.perf_counter()
        producer.produce(topic, value=b"x" * VALUE_BYTES, key=i.to_bytes(KEY_BYTES, "big"),
                         partition=0)  # fmt: skip
        if producer.flush(TIMEOUT_S):
            raise RuntimeError("a record was not delivered")
        out.append((time.perf_counter() - started) * 1000)
    return out


def grpc_latency(address: str, topic: str, samples: int) -> list[float]:
    out = []
    with client.Producer(address, acks=1, linger_ms=0) as producer:
        producer.send(topic, b"warm-up", partition=0).result(TIMEOUT_S)
        for i in range(samples):
            started = time.perf_counter()
            producer.send(topic, b"x" * VALUE_BYTES, key=i.to_bytes(KEY_BYTES, "big"),
                          partition=0).result(TIMEOUT_S)  # fmt: skip
            out.append((time.perf_counter() - started) * 1000)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--latency-samples", type=int, default=1_000)
    parser.add_argument("--quick", action="store_true", help="20,000 records, 200 samples")
    args = parser.parse_args(argv)
    records = 20_000 if args.quick else args.records
    samples = 200 if args.quick else args.latency_samples
    work = Path(tempfile.mkdtemp(prefix="tidelog-kafka-bench-"))
    process, address, bootstrap = start_broker(work)
    try:
        with client.AdminClient(address) as admin:
            for topic in ("throughput", "latency-kafka", "latency-grpc"):
                admin.create_topic(topic, 1)
        results: dict[str, Any] = {"records": records, "latency_samples": samples}
        results["kafka_produce_records_per_s"] = round(kafka_produce(bootstrap, "throughput",
                                                                     records))  # fmt: skip
        results["kafka_consume_records_per_s"] = round(kafka_consume(bootstrap, "throughput",
                                                                     records))  # fmt: skip
        kafka = kafka_latency(bootstrap, "latency-kafka", samples)
        grpc = grpc_latency(address, "latency-grpc", samples)
        results["kafka_p50_ms"] = round(statistics.median(kafka), 3)
        results["kafka_p99_ms"] = round(_percentile(kafka, 0.99), 3)
        results["grpc_p50_ms"] = round(statistics.median(grpc), 3)
        results["grpc_p99_ms"] = round(_percentile(grpc, 0.99), 3)
        results["kafka_over_grpc_p50"] = round(results["kafka_p50_ms"] / results["grpc_p50_ms"], 3)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
