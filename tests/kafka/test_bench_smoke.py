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


@pytest.mark.timeout(180)
def test_the_peer_comparison_runs_the_kafka_listener_peer(tmp_path: Path) -> None:
    from benchmarks import run as harness  # (ROOT is on sys.path: see the top)

    settings = harness.parse_settings(
        [
            "--quick", "--no-install", "--peers", "tidelog-kafka", "--value-sizes", "100",
            "--records", "2000", "--samples", "20",
            "--workloads", "produce,consume,latency,end_to_end", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    doc = harness.run(settings)
    markdown = (tmp_path / "results.md").read_text()
    assert "Tidelog (Kafka listener)" in markdown
    assert not doc.get("errors"), doc.get("errors")
    measured = {r["workload"] for r in doc["results"] if r["peer"] == "tidelog-kafka"}
    assert measured == {"produce", "consume", "latency", "end_to_end"}


@pytest.mark.timeout(120)
def test_the_transactions_benchmark_reports_every_figure() -> None:
    from benchmarks import transactions_bench  # (ROOT is on sys.path: see the top)

    results = transactions_bench.main(["--records", "3000", "--txn-ms", "20", "--small", "10"])
    for key in (
        "idempotent_produce_records_per_s",
        "txn_produce_records_per_s",
        "txn_over_idempotent_produce",
        "read_uncommitted_consume_records_per_s",
        "read_committed_consume_records_per_s",
        "read_committed_over_uncommitted_consume",
        "txn_small_ms_1_partition",
        "txn_small_ms_6_partitions",
        "txn_small_6_over_1_partition",
    ):
        assert results[key] > 0, key
