"""Smoke test of ``benchmarks/kafka_bench.py`` at toy sizes: a broker process on 127.0.0.1
with a temporary data directory, every figure present and positive (structure, not speed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import kafka_bench  # noqa: E402  (ROOT must be on sys.path first)


@pytest.mark.timeout(120)
def test_the_benchmark_reports_every_figure() -> None:
    results = kafka_bench.main(["--records", "3000", "--latency-samples", "30"])
    for key in (
        "kafka_produce_records_per_s",
        "kafka_consume_records_per_s",
        "kafka_p50_ms",
        "kafka_p99_ms",
        "grpc_p50_ms",
        "grpc_p99_ms",
        "kafka_over_grpc_p50",
    ):
        assert results[key] > 0, key
    assert results["kafka_p50_ms"] <= results["kafka_p99_ms"]
